//! Mirroring an upstream API's published limits with GCRA.

use std::time::Duration;

use crate::error::ConfigError;
use crate::policy::{Limit, Rate};

/// A limit that admits at most `count` calls in any window of length
/// `window`, as an upstream that counts calls in (sliding or fixed) windows
/// sees them: GCRA at `count` per `window + margin` with a burst of 1,
/// named after the upstream's limit (`25/5s`).
///
/// Why burst 1: GCRA at rate `R` per `W` with burst `B` can admit
/// `R + B − 1` calls within one window of length `W` (a full burst, then
/// the rate), so mirroring "at most `N` per `W`" needs `R + B − 1 ≤ N`.
/// Burst 1 at `N` per `W` gives a waiting fleet the whole rate; to allow
/// bursts of `B`, build `Limit::builder(Rate::new(N − B + 1, W)).burst(B)`
/// yourself and accept the lower rate.
///
/// Why a margin: slots are spaced exactly on the store's clock, but calls
/// reach the upstream a little later, each by a different amount (timer
/// wake-up, scheduling, network). Two calls can then arrive closer together
/// than their slots were; over one window the margin absorbs up to `margin`
/// of such jitter in total. 2% of the window, or the worst latency spread
/// you expect, whichever is larger, is a sound start; the rate given up is
/// `margin / (window + margin)`.
///
/// ```
/// use std::time::Duration;
/// use fleetgate::Policy;
/// use fleetgate::rate_limit::within_window;
///
/// // The upstream publishes "25 per 5 s and 300 per minute".
/// let margin = Duration::from_millis(100);
/// let upstream = Policy::builder("upstream")
///     .limit(within_window(25, Duration::from_secs(5), margin)?)
///     .limit(within_window(300, Duration::from_secs(60), margin)?)
///     .build()?;
/// assert_eq!(upstream.limits()[0].name(), "25/5s");
/// assert_eq!(upstream.limits()[0].emission_interval(), Duration::from_millis(204));
/// # Ok::<(), fleetgate::ConfigError>(())
/// ```
pub fn within_window(count: u64, window: Duration, margin: Duration) -> Result<Limit, ConfigError> {
    if window.is_zero() {
        return Err(ConfigError::ZeroPeriod);
    }
    Limit::builder(Rate::new(count, window.saturating_add(margin)))
        .burst(1)
        .name(Rate::new(count, window).to_string())
        .build()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::gcra::{Params, check as decide};

    /// Reserves slots back to back (the worst case: everyone waiting) and
    /// checks every window of the upstream's length, with the calls
    /// arriving up to `margin` late each.
    #[test]
    fn never_more_than_count_in_any_window_despite_jitter() {
        let window = Duration::from_secs(5);
        let margin = Duration::from_millis(100);
        let limit = within_window(25, window, margin).unwrap();
        let p = [Params {
            emission: limit.emission_us(),
            tolerance: limit.tolerance_us(),
        }];
        let mut tat = [0];
        let now = 1_000_000_000u64;
        let mut slots = Vec::new();
        for _ in 0..200 {
            let (d, _) = decide(&p, &mut tat, now, 1, u64::MAX);
            assert!(d.allowed);
            slots.push(now + d.wait_us);
        }
        // Alternate the jitter: on time, then as late as the margin allows
        // in total, the most compressing pattern for a window.
        let w = window.as_micros() as u64;
        let m = margin.as_micros() as u64;
        for jitter_first in [0, m] {
            let arrivals: Vec<u64> = slots
                .iter()
                .enumerate()
                .map(|(i, s)| s + if i % 25 == 0 { jitter_first } else { 0 })
                .collect();
            for (i, &t) in arrivals.iter().enumerate() {
                let in_window = arrivals[i..].iter().filter(|&&a| a < t + w).count();
                assert!(
                    in_window <= 25,
                    "{in_window} calls within 5 s from call {i}"
                );
            }
        }
        assert!(within_window(0, window, margin).is_err());
        assert!(within_window(5, Duration::ZERO, margin).is_err());
    }
}
