//! Gradient2: the limit follows the ratio of the service's minimum round
//! trip time to its current one. The formulas and the rules of the
//! minimum are the users' docs, on `AdaptiveLimit::gradient2`; here, why
//! they are so.
//!
//! - While calls take no longer than the minimum (the service queues
//!   nothing), the gradient is above 1 and the limit grows by the
//!   headroom; once the service queues, the window RTT grows with the
//!   queue and the gradient pulls the limit back to about
//!   `(1 + TOLERANCE)` times what the service holds.
//! - The headroom fades out as the gradient falls to 1: a headroom that
//!   jumped in at 1 would lift the limit past where it settles every
//!   time noise tipped a window's mean below it.
//! - A window closes after its time and `WINDOW_SAMPLES` calls: the mean
//!   of fewer is noise the limit would follow.
//! - The limit does not grow while the calls in flight (averaged over
//!   the window's calls: their maximum rises with every burst of a
//!   traffic well below the limit) stayed below half of it: the traffic,
//!   not the service, set the pace.
//! - The minimum is measured by probes at `min`. A service that got
//!   faster shows a window mean below the minimum, taken at once. One
//!   that got slower (a slower dependency, a busier CPU) keeps the
//!   gradient below 1 however far the limit falls; when the limit falls
//!   because of a queue the RTT falls with it, so a limit down by a fifth
//!   (or to `min`, where it can fall no further) under an RTT that did
//!   not fall by a twentieth means the minimum moved: a probe measures it
//!   again.
//! - A probe ends after `PROBE_WINDOWS` windows even if its calls did not
//!   come (long calls holding the `min` slots), on what it measured.

use std::time::{Duration, Instant};

use super::{Sample, Verdict};

/// How many calls admitted during a probe measure the minimum RTT.
const PROBE_SAMPLES: u32 = 40;
/// The room a window's mean RTT is given over the minimum before the
/// limit shrinks: noise in the mean, not a queue.
const TOLERANCE: f64 = 0.1;
/// The shortest RTT taken: 1 µs.
const SHORTEST_RTT: f64 = 1e-6;
/// The longest a probe lasts, in sampling windows, if its calls do not
/// come.
const PROBE_WINDOWS: u32 = 10;
/// The fewest calls a sampling window takes: a mean over fewer is
/// noise the limit would follow.
const WINDOW_SAMPLES: u32 = 80;

/// Gradient2's settings, checked by the builder.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct GradientConfig {
    pub(super) smoothing: f64,
    pub(super) window: Duration,
    pub(super) probe_every: Duration,
}

#[derive(Debug)]
pub(super) struct Gradient {
    config: GradientConfig,
    min: f64,
    max: f64,
    limit: f64,
    min_rtt: Option<f64>,
    probe: Option<Probe>,
    next_probe: Instant,
    window: Window,
    /// While the gradient is below 1: the limit and the window RTT when
    /// the RTT last fell with the limit.
    shrinking: Option<(f64, f64)>,
    rng: fastrand::Rng,
}

/// A minimum-RTT probe under way.
#[derive(Debug)]
struct Probe {
    started: Instant,
    /// The limit to return to.
    resume: f64,
    sum: f64,
    count: u32,
}

#[derive(Debug)]
struct Window {
    started: Instant,
    sum: f64,
    count: u32,
    in_flight: u64,
}

impl Window {
    fn new(started: Instant) -> Self {
        Window {
            started,
            sum: 0.0,
            count: 0,
            in_flight: 0,
        }
    }
}

impl Gradient {
    pub(super) fn new(
        config: GradientConfig,
        min: u64,
        max: u64,
        initial: u64,
        now: Instant,
    ) -> Self {
        let mut gradient = Gradient {
            config,
            min: min as f64,
            max: max as f64,
            limit: initial as f64,
            min_rtt: None,
            probe: None,
            next_probe: now,
            window: Window::new(now),
            shrinking: None,
            rng: fastrand::Rng::new(),
        };
        gradient.start_probe(now);
        gradient
    }

    /// The limit to enforce now.
    pub(super) fn limit(&self) -> f64 {
        if self.probe.is_some() {
            self.min
        } else {
            self.limit
        }
    }

    pub(super) fn min_rtt(&self) -> Option<Duration> {
        self.min_rtt.map(Duration::from_secs_f64)
    }

    pub(super) fn probing(&self) -> bool {
        self.probe.is_some()
    }

    fn start_probe(&mut self, now: Instant) {
        self.shrinking = None;
        self.probe = Some(Probe {
            started: now,
            resume: self.limit,
            sum: 0.0,
            count: 0,
        });
    }

    /// Ends the probe: `measured` (if any) is the new minimum, the limit
    /// goes back to `resume`, and the next probe is due in `probe_every`,
    /// jittered.
    fn end_probe(&mut self, measured: Option<f64>, resume: f64, now: Instant) {
        self.min_rtt = measured.or(self.min_rtt);
        self.limit = resume;
        self.probe = None;
        let every = self.config.probe_every.as_secs_f64();
        let jitter = every * (self.rng.f64() - 0.5) / 2.0;
        self.next_probe = now + Duration::from_secs_f64(every + jitter);
        self.window = Window::new(now);
    }

    /// Takes one call's sample; returns the gradient when a window closed.
    pub(super) fn sample(&mut self, sample: &Sample, now: Instant) -> Option<f64> {
        if sample.verdict == Verdict::Ignore {
            return None;
        }
        // A call answered in no measurable time (a clock that did not
        // move) would make a minimum of 0 and every gradient NaN.
        let rtt = sample.rtt.as_secs_f64().max(SHORTEST_RTT);
        if let Some(probe) = &mut self.probe {
            // Only calls admitted under the probe's limit, which queue
            // nothing, measure the minimum.
            let counts = sample.started >= probe.started && sample.in_flight <= self.min as u64;
            if counts {
                probe.sum += rtt;
                probe.count += 1;
            }
            // Calls that hold their slots (long streams) can keep the
            // probe's calls from coming: past its longest, a probe ends
            // on what it measured, or keeps the minimum it had.
            let overdue =
                now.saturating_duration_since(probe.started) >= self.config.window * PROBE_WINDOWS;
            let measured = (probe.count > 0).then(|| probe.sum / f64::from(probe.count));
            if probe.count >= PROBE_SAMPLES || overdue && measured.or(self.min_rtt).is_some() {
                let resume = probe.resume;
                self.end_probe(measured, resume, now);
            }
            return None;
        }
        // Due on any call, not only when a window closes: a window of a
        // slow traffic can take far longer than `probe_every`.
        if now >= self.next_probe {
            self.start_probe(now);
            return None;
        }
        // Calls admitted before the window began (during a probe, say)
        // say nothing about the limit of this one.
        if sample.started < self.window.started {
            return None;
        }
        let window = &mut self.window;
        window.sum += rtt;
        window.count += 1;
        window.in_flight += sample.in_flight;
        if now.saturating_duration_since(window.started) < self.config.window
            || window.count < WINDOW_SAMPLES
        {
            return None;
        }
        let mean = window.sum / f64::from(window.count);
        if self.min_rtt.is_some_and(|min| mean < min) {
            self.min_rtt = Some(mean);
        }
        let min_rtt = self.min_rtt?;
        let gradient = ((1.0 + TOLERANCE) * min_rtt / mean).clamp(0.5, 2.0);
        let in_flight = window.in_flight as f64 / f64::from(window.count);
        let app_limited = in_flight * 2.0 < self.limit;
        // All the headroom with no queue, none at the tolerance.
        let fade = ((gradient - 1.0) / TOLERANCE).clamp(0.0, 1.0);
        let target = if gradient >= 1.0 && app_limited {
            self.limit
        } else {
            gradient * self.limit + fade * self.limit.sqrt()
        };
        let s = self.config.smoothing;
        self.limit = ((1.0 - s) * self.limit + s * target).clamp(self.min, self.max);
        self.window = Window::new(now);
        self.shrinking = match self.shrinking {
            // Back above where it began to shrink: the run is over.
            Some((limit, _)) if self.limit > limit => None,
            // The RTT fell with the limit: a queue is draining.
            Some((_, rtt)) if mean < 0.95 * rtt => Some((self.limit, mean)),
            Some(since) => Some(since),
            None if gradient < 1.0 => Some((self.limit, mean)),
            None => None,
        };
        // At `min` the limit can fall no further: there, a gradient below
        // 1 is the sign (and a probe at `min` costs nothing).
        let moved = self
            .shrinking
            .is_some_and(|(limit, _)| self.limit <= (0.8 * limit).max(self.min));
        if moved {
            self.start_probe(now);
        }
        Some(gradient)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> GradientConfig {
        GradientConfig {
            smoothing: 0.2,
            window: Duration::from_millis(250),
            probe_every: Duration::from_secs(60),
        }
    }

    /// Feeds the controller one call a millisecond for `ms` milliseconds,
    /// each taking `rtt_ms` with `in_flight` in flight (at most what the
    /// limit allows), from `at` on; returns the time after the last.
    fn run(g: &mut Gradient, at: Instant, ms: u64, rtt_ms: u64, in_flight: u64) -> Instant {
        let rtt = Duration::from_millis(rtt_ms);
        for i in 0..ms {
            let ended = at + Duration::from_millis(i);
            let sample = Sample {
                started: ended - rtt,
                rtt,
                in_flight: in_flight.min(g.limit() as u64).max(1),
                verdict: Verdict::Succeeded,
            };
            g.sample(&sample, ended);
        }
        at + Duration::from_millis(ms)
    }

    /// A controller past its first probe, at a minimum RTT of 20 ms.
    fn measured(initial: u64) -> (Gradient, Instant) {
        let start = Instant::now();
        let mut g = Gradient::new(config(), 2, 100, initial, start);
        assert!(g.probing());
        assert_eq!(g.limit(), 2.0, "a probe runs at min");
        // Calls that started before the probe do not count.
        let at = run(&mut g, start + Duration::from_millis(20), 5, 30, 1);
        assert!(g.probing());
        let at = run(
            &mut g,
            at + Duration::from_millis(20),
            PROBE_SAMPLES.into(),
            20,
            1,
        );
        assert!(!g.probing());
        assert_eq!(g.min_rtt(), Some(Duration::from_millis(20)));
        assert_eq!(g.limit(), initial as f64, "back where it was");
        (g, at)
    }

    #[test]
    fn it_grows_while_the_service_queues_nothing_and_is_in_use() {
        let (mut g, at) = measured(10);
        run(&mut g, at, 5_000, 20, 100);
        assert!(g.limit() > 30.0, "limit {}", g.limit());
    }

    #[test]
    fn it_does_not_grow_while_the_traffic_leaves_most_of_it_unused() {
        let (mut g, at) = measured(10);
        run(&mut g, at, 2_000, 20, 3);
        assert_eq!(g.limit(), 10.0);
    }

    #[test]
    fn a_queue_pulls_it_back() {
        // A service that holds 20: past that, calls queue, and the RTT
        // grows with the limit.
        let (mut g, mut at) = measured(40);
        for _ in 0..40 {
            let rtt = 20.0 * (g.limit() / 20.0).max(1.0);
            at = run(&mut g, at, 100, rtt.round() as u64, 100);
        }
        assert!((20.0..=24.0).contains(&g.limit()), "limit {}", g.limit());
        assert!(!g.probing(), "a draining queue is no moved minimum");
    }

    #[test]
    fn a_slower_service_is_measured_again_rather_than_followed_down() {
        let (mut g, at) = measured(40);
        // Every call takes 30 ms however far the limit falls: no queue is
        // draining, the minimum moved.
        let mut at = at;
        let mut probed = false;
        for _ in 0..40 {
            at = run(&mut g, at, 100, 30, 100);
            if g.probing() {
                probed = true;
                break;
            }
        }
        assert!(probed, "no probe; limit {}", g.limit());
        // The probe measures the new minimum, and the limit comes back to
        // where it was when the probe began (a fifth down, no lower).
        run(
            &mut g,
            at + Duration::from_millis(30),
            PROBE_SAMPLES.into(),
            30,
            1,
        );
        assert_eq!(g.min_rtt(), Some(Duration::from_millis(30)));
        assert!(g.limit() >= 40.0 * 0.7, "limit {}", g.limit());
    }

    #[test]
    fn a_faster_window_lowers_the_minimum_at_once() {
        let (mut g, at) = measured(10);
        run(&mut g, at, 300, 15, 10);
        assert_eq!(g.min_rtt(), Some(Duration::from_millis(15)));
    }

    #[test]
    fn ignored_calls_are_no_samples() {
        let (mut g, at) = measured(10);
        let rtt = Duration::from_millis(200);
        for i in 0..1_000 {
            let ended = at + Duration::from_millis(i);
            let sample = Sample {
                started: ended - rtt,
                rtt,
                in_flight: 10,
                verdict: Verdict::Ignore,
            };
            assert_eq!(g.sample(&sample, ended), None);
        }
        assert_eq!(g.limit(), 10.0);
    }

    #[test]
    fn calls_answered_in_no_time_leave_the_limit_a_number() {
        let (mut g, at) = measured(10);
        let at = run(&mut g, at, 1_000, 0, 10);
        assert!(g.limit().is_finite(), "limit {}", g.limit());
        let at = run(&mut g, at, 5_000, 20, 10);
        assert!(
            g.limit().is_finite() && g.limit() >= 2.0,
            "limit {}",
            g.limit()
        );
        assert!(!g.probing() || g.min_rtt().is_some_and(|m| m > Duration::ZERO));
        let _ = at;
    }

    #[test]
    fn a_probe_whose_calls_do_not_come_ends() {
        let (mut g, at) = measured(10);
        // 80 s on, past the periodic probe's time: the next call starts
        // it; then only calls admitted before it end (long streams).
        let at = run(&mut g, at + Duration::from_secs(80), 1, 20, 10);
        assert!(g.probing());
        let rtt = Duration::from_secs(100);
        let mut ended = at;
        for _ in 0..30 {
            ended += Duration::from_millis(100);
            let old = Sample {
                started: ended - rtt,
                rtt,
                in_flight: 10,
                verdict: Verdict::Succeeded,
            };
            g.sample(&old, ended);
        }
        assert!(!g.probing(), "a probe stalls on long calls");
        assert_eq!(g.min_rtt(), Some(Duration::from_millis(20)), "kept");
        assert!(g.limit() > 2.0);
    }

    #[test]
    fn a_slower_service_at_min_is_measured_again() {
        let start = Instant::now();
        let mut g = Gradient::new(config(), 4, 100, 5, start);
        let at = run(
            &mut g,
            start + Duration::from_millis(20),
            PROBE_SAMPLES.into(),
            20,
            1,
        );
        assert_eq!(g.min_rtt(), Some(Duration::from_millis(20)));
        // 30 % slower: the limit falls to min and cannot fall a fifth.
        let mut at = at;
        let mut probed = false;
        for _ in 0..100 {
            at = run(&mut g, at, 100, 26, 100);
            probed |= g.probing();
        }
        assert!(probed, "limit {}", g.limit());
        assert_eq!(g.min_rtt(), Some(Duration::from_millis(26)));
    }

    #[test]
    fn the_headroom_fades_near_the_tolerance() {
        // Calls a tenth over the minimum, at the tolerance: a gradient of
        // 1 and no headroom. With all of it the limit would grow by about
        // √limit / 5 a window.
        let (mut g, at) = measured(20);
        run(&mut g, at, 2_500, 22, 100);
        assert!(g.limit() < 20.5, "limit {}", g.limit());
    }

    #[test]
    fn bursts_over_a_traffic_well_below_the_limit_do_not_grow_it() {
        let (mut g, at) = measured(10);
        let rtt = Duration::from_millis(20);
        for i in 0..5_000u64 {
            let ended = at + Duration::from_millis(i);
            let sample = Sample {
                started: ended - rtt,
                rtt,
                // Mostly 2 in flight, 10 in a burst now and then.
                in_flight: if i % 50 == 0 { 10 } else { 2 },
                verdict: Verdict::Succeeded,
            };
            g.sample(&sample, ended);
        }
        assert_eq!(g.limit(), 10.0);
    }

    #[test]
    fn a_slow_traffic_is_probed_on_time() {
        // One call a second: a window of 80 calls takes 80 s, longer than
        // the latest periodic probe (75 s).
        let (mut g, mut at) = measured(10);
        let started = at;
        let mut probed_at = None;
        for _ in 0..100 {
            at = run(&mut g, at, 1, 20, 10) + Duration::from_millis(999);
            if g.probing() {
                probed_at = Some(at - started);
                break;
            }
        }
        let probed_at = probed_at.expect("no periodic probe in 100 s");
        assert!(
            probed_at <= Duration::from_secs(76),
            "probed after {probed_at:?}"
        );
    }
}
