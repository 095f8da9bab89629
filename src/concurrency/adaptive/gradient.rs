//! Gradient2: the limit follows the ratio of the service's minimum round
//! trip time to its current one.
//!
//! Every `window` (a sampling window, 250 ms by default) the mean RTT of
//! the calls that ended in it is compared with the minimum RTT:
//!
//! ```text
//! gradient  = clamp((1 + tolerance) · min_rtt / window_rtt, 0.5, 2)
//! target    = gradient · limit + (gradient ≥ 1 ? headroom : 0),  headroom = √limit
//! limit     = clamp((1 − smoothing) · limit + smoothing · target, min, max)
//! ```
//!
//! While calls take no longer than the minimum (the service queues
//! nothing), the gradient is at least 1 and the limit grows by the
//! headroom; once the service queues, the window RTT grows with the
//! queue and the gradient pulls the limit back to about
//! `(1 + tolerance)` times what the service holds. The limit does not
//! grow while the calls in flight stayed below half of it (the traffic,
//! not the service, set the pace: nothing was learned about a higher
//! limit).
//!
//! The minimum RTT is measured, not configured: at the start, and again
//! every `probe_every` (60 s, moved by up to ±25 % at random so that a
//! fleet's instances do not probe together), the limit drops to `min` for
//! as long as `probe_samples` calls admitted under it take; their mean
//! RTT is the new minimum, and the limit returns to where it was. A
//! service whose latency rose for good is seen anew at the next probe.

use std::time::{Duration, Instant};

use super::{Sample, Verdict};

/// How many calls admitted during a probe measure the minimum RTT.
const PROBE_SAMPLES: u32 = 20;
/// The room a window's mean RTT is given over the minimum before the
/// limit shrinks: noise in the mean, not a queue.
const TOLERANCE: f64 = 0.1;

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
    most_in_flight: u64,
}

impl Window {
    fn new(started: Instant) -> Self {
        Window {
            started,
            sum: 0.0,
            count: 0,
            most_in_flight: 0,
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
        self.probe = Some(Probe {
            started: now,
            resume: self.limit,
            sum: 0.0,
            count: 0,
        });
    }

    /// Takes one call's sample; returns the gradient when a window closed.
    pub(super) fn sample(&mut self, sample: &Sample, now: Instant) -> Option<f64> {
        if sample.verdict == Verdict::Ignore {
            return None;
        }
        let rtt = sample.rtt.as_secs_f64();
        if let Some(probe) = &mut self.probe {
            // Only calls admitted under the probe's limit, which queue
            // nothing, measure the minimum.
            if sample.started < probe.started || sample.in_flight > self.min as u64 {
                return None;
            }
            probe.sum += rtt;
            probe.count += 1;
            if probe.count >= PROBE_SAMPLES {
                self.min_rtt = Some(probe.sum / f64::from(probe.count));
                self.limit = probe.resume;
                self.probe = None;
                let every = self.config.probe_every.as_secs_f64();
                let jitter = every * (self.rng.f64() - 0.5) / 2.0;
                self.next_probe = now + Duration::from_secs_f64(every + jitter);
                self.window = Window::new(now);
            }
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
        window.most_in_flight = window.most_in_flight.max(sample.in_flight);
        if now.saturating_duration_since(window.started) < self.config.window {
            return None;
        }
        let min_rtt = self.min_rtt?;
        let mean = window.sum / f64::from(window.count);
        let gradient = ((1.0 + TOLERANCE) * min_rtt / mean).clamp(0.5, 2.0);
        let app_limited = (window.most_in_flight as f64) * 2.0 < self.limit;
        let target = if gradient >= 1.0 {
            if app_limited {
                self.limit
            } else {
                gradient * self.limit + self.limit.sqrt()
            }
        } else {
            gradient * self.limit
        };
        let s = self.config.smoothing;
        self.limit = ((1.0 - s) * self.limit + s * target).clamp(self.min, self.max);
        self.window = Window::new(now);
        if now >= self.next_probe {
            self.start_probe(now);
        }
        Some(gradient)
    }
}
