//! AIMD: additive increase, multiplicative decrease, as TCP does.
//!
//! - A call that failed (see [`Verdict::Failed`]) or took longer than
//!   `timeout` multiplies the limit by `backoff` (0.9), unless it was
//!   admitted before the last backoff: the calls of one bad moment back
//!   off once, as TCP backs off once per window, and the calls admitted
//!   under the lowered limit say whether it is low enough.
//! - A call that succeeded within `timeout` adds `1 / limit`: the limit
//!   grows by one per limit's worth of good calls (one per round trip
//!   when the limit is in use), but only while at least half of it was in
//!   use when the call started.

use std::time::{Duration, Instant};

use super::{Sample, Verdict};

/// AIMD's settings, checked by the builder.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct AimdConfig {
    pub(super) backoff: f64,
    pub(super) timeout: Duration,
}

#[derive(Debug)]
pub(super) struct Aimd {
    config: AimdConfig,
    min: f64,
    max: f64,
    limit: f64,
    last_backoff: Option<Instant>,
    /// The fastest success seen: failures faster than it are fast
    /// failures, not samples.
    min_rtt: Option<Duration>,
}

impl Aimd {
    pub(super) fn new(config: AimdConfig, min: u64, max: u64, initial: u64) -> Self {
        Aimd {
            config,
            min: min as f64,
            max: max as f64,
            limit: initial as f64,
            last_backoff: None,
            min_rtt: None,
        }
    }

    pub(super) fn limit(&self) -> f64 {
        self.limit
    }

    pub(super) fn min_rtt(&self) -> Option<Duration> {
        self.min_rtt
    }

    /// Takes one call's sample; returns whether the limit backed off.
    pub(super) fn sample(&mut self, sample: &Sample, now: Instant) -> bool {
        let bad = match sample.verdict {
            Verdict::Ignore => return false,
            Verdict::Failed => true,
            Verdict::Succeeded => sample.rtt > self.config.timeout,
        };
        if bad {
            if self.last_backoff.is_some_and(|at| sample.started < at) {
                return false;
            }
            self.last_backoff = Some(now);
            self.limit = (self.limit * self.config.backoff).max(self.min);
            return true;
        }
        self.min_rtt = Some(self.min_rtt.map_or(sample.rtt, |min| min.min(sample.rtt)));
        if (sample.in_flight as f64) * 2.0 >= self.limit {
            self.limit = (self.limit + 1.0 / self.limit).min(self.max);
        }
        false
    }
}
