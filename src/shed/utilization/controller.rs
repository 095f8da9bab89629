//! The worker-utilization controller: how much to shed, from how busy this
//! process has been, moving slowly on purpose.
//!
//! Utilization `u` (0 = idle, 1 = every worker busy) pushes a shed amount
//! `a` up or down, at a speed proportional to how far `u` is past a
//! threshold:
//!
//! - `u ≥ bad` (0.8): `a` rises at `(u − bad)/(1 − bad)` of full speed;
//! - `good ≤ u < bad` (0.7–0.8): a dead zone, `a` stays;
//! - `u < good` (0.7): `a` falls at `1 − u/good` of full speed.
//!
//! At full speed `a` moves by 1 per `ramp` (120 s). It rests at
//! `−delay/ramp` rather than 0, so that nothing is shed until utilization
//! has been bad for a while: `delay` (28 s) at full saturation, longer below
//! it (at 0.9, half speed: 56 s, then 240 s to shed everything; at 0.85, a
//! quarter: 112 s and 480 s). Recovery is as proportional: idle, `a` falls
//! from everything shed to nothing in `ramp`, then back to rest in `delay`.
//!
//! Time between observations counts in full, with one exception: a reading
//! taken at an instant (a gauge) says nothing about a silence before it, so
//! upward a gap counts for at most `max(delay, sample_every, 1 s)`, and one
//! bad reading after a quiet hour cannot jump to full shedding. Downward,
//! and for the shedder's own in-flight count (averaged over the whole gap),
//! every second counts: an idle hour is an hour of recovery.
//!
//! The positive part of `a` sweeps the tiers that may be shed, least
//! important first: with `k` of them, the one at position `i` from the
//! bottom is dropped with probability `clamp(a·k − i, 0, 1)`. The most
//! important tier is never dropped.

use std::time::Duration;

use crate::error::ConfigError;
use crate::shed::tier::{Tier, Tiers};

/// The numbers of the worker-utilization shedder, set on its builder; the
/// defaults are those of the design (0.7, 0.8, 28 s, 120 s).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct UtilizationConfig {
    good_below: f64,
    bad_above: f64,
    delay: Duration,
    ramp: Duration,
}

impl Default for UtilizationConfig {
    fn default() -> Self {
        UtilizationConfig {
            good_below: 0.7,
            bad_above: 0.8,
            delay: Duration::from_secs(28),
            ramp: Duration::from_secs(120),
        }
    }
}

impl UtilizationConfig {
    /// The dead zone: below `good` shedding relaxes, from `bad` on it
    /// rises. [`check`](Self::check) needs `0 < good ≤ bad < 1`.
    pub(crate) fn thresholds(mut self, good: f64, bad: f64) -> Self {
        self.good_below = good;
        self.bad_above = bad;
        self
    }

    /// How long utilization must be fully bad before anything is shed.
    pub(crate) fn delay(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self
    }

    /// How long from shedding nothing to shedding everything, at full
    /// speed. [`check`](Self::check) needs it longer than zero.
    pub(crate) fn ramp(mut self, ramp: Duration) -> Self {
        self.ramp = ramp;
        self
    }

    /// The numbers, if they make sense: `0 < good ≤ bad < 1` and a ramp
    /// longer than zero.
    pub(crate) fn check(self) -> Result<Self, ConfigError> {
        let (good, bad) = (self.good_below, self.bad_above);
        if !(good > 0.0 && good <= bad && bad < 1.0) {
            return Err(ConfigError::InvalidThresholds {
                detail: format!("good {good}, bad {bad}"),
            });
        }
        if self.ramp.is_zero() {
            return Err(ConfigError::ZeroRamp);
        }
        Ok(self)
    }

    fn resting(&self) -> f64 {
        -(self.delay.as_secs_f64() / self.ramp.as_secs_f64())
    }

    /// The push on the amount, from −1 (idle) to 1 (saturated).
    fn push(&self, utilization: f64) -> f64 {
        let u = if utilization.is_nan() {
            0.0
        } else {
            utilization.clamp(0.0, 1.0)
        };
        if u < self.good_below {
            u / self.good_below - 1.0
        } else if u < self.bad_above {
            0.0
        } else {
            (u - self.bad_above) / (1.0 - self.bad_above)
        }
    }
}

/// The controller's state: the shed amount and when it last moved.
#[derive(Clone, Debug)]
pub(crate) struct Controller {
    config: UtilizationConfig,
    /// For readings taken at an instant: the longest gap between
    /// observations that counts in full while the amount rises.
    rise_cap: Option<Duration>,
    amount: f64,
    last_us: Option<u64>,
}

/// The shortest cap on a rising gap, so that a zero delay sampled on every
/// request still moves.
const MIN_RISE_CAP: Duration = Duration::from_secs(1);

impl Controller {
    /// A controller observed about every `sample_every`. `instant` says
    /// whether each observation is a reading at an instant (a gauge), whose
    /// rising gaps are capped, rather than an average over the time since
    /// the previous one.
    pub(crate) fn new(config: UtilizationConfig, sample_every: Duration, instant: bool) -> Self {
        Controller {
            amount: config.resting(),
            rise_cap: instant.then(|| config.delay.max(sample_every).max(MIN_RISE_CAP)),
            config,
            last_us: None,
        }
    }

    pub(crate) fn config(&self) -> &UtilizationConfig {
        &self.config
    }

    /// Moves the amount for the time since the last observation, at the
    /// speed `utilization` asks for. A time before the last observation's
    /// counts as no time at all: time never runs backwards.
    pub(crate) fn observe(&mut self, now_us: u64, utilization: f64) {
        let Some(last) = self.last_us.filter(|last| *last < now_us) else {
            self.last_us = self.last_us.max(Some(now_us));
            return;
        };
        self.last_us = Some(now_us);
        let push = self.config.push(utilization);
        let mut elapsed = Duration::from_micros(now_us - last);
        if let Some(cap) = self.rise_cap.filter(|_| push > 0.0) {
            elapsed = elapsed.min(cap);
        }
        let speed = push / self.config.ramp.as_secs_f64();
        self.amount =
            (self.amount + speed * elapsed.as_secs_f64()).clamp(self.config.resting(), 1.0);
    }

    /// The shed amount, from the resting value (below 0) to 1.
    pub(crate) fn amount(&self) -> f64 {
        self.amount
    }
}

/// The probability of dropping a request of `tier` at shed amount `amount`.
pub(crate) fn drop_probability(amount: f64, tier: Tier, tiers: &Tiers) -> f64 {
    let sheddable = tiers.len().saturating_sub(1);
    if tier.rank() == 0 || sheddable == 0 || amount <= 0.0 {
        return 0.0;
    }
    // Position from the bottom: the least important tier is 0.
    let from_bottom = tiers.len().saturating_sub(1 + tier.rank()) as f64;
    (amount * sheddable as f64 - from_bottom).clamp(0.0, 1.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000;
    const SECOND: Duration = Duration::from_secs(1);

    /// Feeds one observation a second from `from` to `to` (seconds) at
    /// utilization `u`.
    fn run(c: &mut Controller, from: u64, to: u64, u: f64) {
        for t in from..=to {
            c.observe(t * S, u);
        }
    }

    fn probabilities(c: &Controller, tiers: &Tiers) -> Vec<f64> {
        tiers
            .iter()
            .map(|t| drop_probability(c.amount(), t, tiers))
            .collect()
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    #[test]
    fn saturation_ramps_after_the_delay_lowest_tier_first() {
        let tiers = Tiers::default(); // critical, high, normal, low
        let mut c = Controller::new(UtilizationConfig::default(), SECOND, true);
        run(&mut c, 0, 28, 1.0);
        // 28 s of full saturation: only now at the edge of shedding.
        assert!(close(c.amount(), 0.0), "{}", c.amount());
        assert_eq!(probabilities(&c, &tiers), [0.0; 4]);
        run(&mut c, 29, 48, 1.0);
        // 20 s in: a = 1/6, low is dropped half the time, nothing else.
        let p = probabilities(&c, &tiers);
        assert!(
            close(p[3], 0.5) && p[2] == 0.0 && p[1] == 0.0 && p[0] == 0.0,
            "{p:?}"
        );
        run(&mut c, 49, 88, 1.0);
        // 60 s in: low gone, normal half.
        let p = probabilities(&c, &tiers);
        assert!(close(p[3], 1.0) && close(p[2], 0.5) && p[1] == 0.0, "{p:?}");
        run(&mut c, 89, 300, 1.0);
        // Everything sheddable is shed; critical never.
        assert_eq!(probabilities(&c, &tiers), [0.0, 1.0, 1.0, 1.0]);
    }

    #[test]
    fn the_dead_zone_holds_and_recovery_is_as_slow() {
        let tiers = Tiers::default();
        let mut c = Controller::new(UtilizationConfig::default(), SECOND, true);
        run(&mut c, 0, 28 + 120, 1.0);
        assert!(close(c.amount(), 1.0));
        // 0.75 is in the dead zone: nothing moves.
        run(&mut c, 149, 400, 0.75);
        assert!(close(c.amount(), 1.0));
        // Idle: a falls at 1/120 per second, so 60 s later it is 0.5.
        run(&mut c, 401, 460, 0.0);
        assert!(close(c.amount(), 0.5), "{}", c.amount());
        let p = probabilities(&c, &tiers);
        assert!(close(p[3], 1.0) && close(p[2], 0.5) && p[1] == 0.0, "{p:?}");
        // And it rests below zero again, so the next overload waits again.
        run(&mut c, 461, 1000, 0.0);
        assert!(close(c.amount(), -28.0 / 120.0));
    }

    #[test]
    fn partial_overload_moves_proportionally_and_gaps_are_capped() {
        let mut c = Controller::new(UtilizationConfig::default(), SECOND, true);
        // u = 0.9 pushes at half speed: the delay doubles to 56 s.
        run(&mut c, 0, 55, 0.9);
        assert!(c.amount() < 0.0);
        run(&mut c, 56, 57, 0.9);
        assert!(c.amount() > 0.0);
        // A gauge silent for an hour counts as 28 s at most, rising.
        let mut c = Controller::new(UtilizationConfig::default(), SECOND, true);
        c.observe(0, 1.0);
        c.observe(3600 * S, 1.0);
        assert!(close(c.amount(), 0.0));
        // Odd gauges are clamped, NaN counts as idle.
        let mut c = Controller::new(UtilizationConfig::default(), SECOND, true);
        c.observe(0, f64::NAN);
        c.observe(10 * S, f64::INFINITY);
        assert!(close(c.amount(), -28.0 / 120.0 + 10.0 / 120.0));
        c.observe(20 * S, f64::NAN);
        assert!(close(c.amount(), -28.0 / 120.0));
    }

    #[test]
    fn a_zero_delay_sheds_at_once_and_still_moves() {
        let config = UtilizationConfig::default().delay(Duration::ZERO);
        let mut c = Controller::new(config, SECOND, true);
        run(&mut c, 0, 12, 1.0);
        // No delay: 12 s of saturation shed a tenth; a long gap counts as
        // one sampling interval.
        assert!(close(c.amount(), 0.1), "{}", c.amount());
        c.observe(3600 * S, 1.0);
        assert!(close(c.amount(), 0.1 + 1.0 / 120.0), "{}", c.amount());
    }

    #[test]
    fn a_zero_delay_sampled_on_every_request_still_sheds() {
        let config = UtilizationConfig::default().delay(Duration::ZERO);
        for instant in [true, false] {
            let mut c = Controller::new(config, Duration::ZERO, instant);
            run(&mut c, 0, 12, 1.0);
            assert!(close(c.amount(), 0.1), "{instant}: {}", c.amount());
        }
    }

    #[test]
    fn an_idle_hour_is_an_hour_of_recovery() {
        for instant in [true, false] {
            let mut c = Controller::new(UtilizationConfig::default(), SECOND, instant);
            run(&mut c, 0, 28 + 120, 1.0);
            assert!(close(c.amount(), 1.0));
            // Nobody came for an hour; the first request back finds the
            // process idle: the whole hour counts, and it rests again.
            c.observe(3748 * S, 0.0);
            assert!(
                close(c.amount(), -28.0 / 120.0),
                "{instant}: {}",
                c.amount()
            );
            // Sixty seconds idle take half the shedding away, no more.
            run(&mut c, 3749, 3749 + 148, 1.0);
            c.observe((3749 + 148 + 60) * S, 0.0);
            assert!(close(c.amount(), 0.5), "{instant}: {}", c.amount());
        }
    }

    #[test]
    fn an_average_over_a_long_gap_counts_in_full() {
        // The shedder's own in-flight count is averaged over the gap: a
        // minute of saturation between two samples is a minute.
        let mut c = Controller::new(UtilizationConfig::default(), SECOND, false);
        c.observe(0, 1.0);
        c.observe(60 * S, 1.0);
        assert!(close(c.amount(), 32.0 / 120.0), "{}", c.amount());
    }

    #[test]
    fn time_never_runs_backwards() {
        let mut c = Controller::new(UtilizationConfig::default(), SECOND, true);
        run(&mut c, 0, 40, 1.0);
        assert!(close(c.amount(), 0.1));
        // A late observation from before the last one moves nothing, and
        // the next counts from the latest time seen, not from the late one.
        c.observe(35 * S, 1.0);
        assert!(close(c.amount(), 0.1));
        c.observe(41 * S, 1.0);
        assert!(close(c.amount(), 0.1 + 1.0 / 120.0), "{}", c.amount());
    }

    #[test]
    fn config_is_checked() {
        let c = UtilizationConfig::default();
        assert_eq!(c.check(), Ok(c));
        assert!(c.thresholds(0.9, 0.8).check().is_err());
        assert!(c.thresholds(0.0, 0.8).check().is_err());
        assert!(c.thresholds(0.5, 1.0).check().is_err());
        assert!(c.thresholds(f64::NAN, 0.8).check().is_err());
        assert!(c.thresholds(0.6, 0.6).check().is_ok());
        assert_eq!(c.ramp(Duration::ZERO).check(), Err(ConfigError::ZeroRamp));
    }
}
