//! Sliding-window counters over one or more windows at once: each
//! window's fixed-window count plus the previous fixed window's, weighted
//! by how much of it the sliding window still covers. O(1) memory,
//! approximate.
//!
//! The one definition of the algorithm, for every operation: [`check`],
//! [`peek`], [`charge`] and [`refund`], pure functions of (counters, now,
//! windows). [`MemoryStore`] runs them on its state;
//! `lua/sliding_window.lua` transcribes them function by function for
//! Redis. How the windows of a policy combine is in the [window
//! module](super::window).
//!
//! A window of length `W` holding `count`, for a call of cost `n` at `now`:
//!
//! ```text
//! curr, prev = cost admitted in the current and previous fixed windows
//! r          = start + W − now (1 ..= W)
//! est        = prev · (min(r, W) / W)           (a double)
//! admit      ⇔ est ≤ count − curr − n
//! ```
//!
//! The weighting is computed in IEEE doubles, in the same order of
//! operations as the Lua script, so that both stores give the same answers
//! bit for bit; every integer in it stays below 2^53 (window lengths are
//! at most 2^50 µs and counts at most one per microsecond of a window).
//!
//! A charge past the count lets nothing pass in this window; in the next,
//! the count weighs as `prev · (r / W)`, so the overdraft fades as the
//! sliding window leaves it, and a call fits once `prev · (W − e) / W ≤
//! count − 1`.
//!
//! [`MemoryStore`]: crate::MemoryStore

use super::window::{
    Counter, EMPTY, MAX_COUNTED, Verdict, Verdicts, Window, admit, charged, combine,
};
use crate::decision::Decision;

/// Sliding-window counters: each window's fixed-window count plus the
/// previous fixed window's, weighted by how much of it the sliding window
/// still covers. Returns the decision and, when admitted, the time from
/// which the state means nothing.
pub(crate) fn check(
    windows: &[Window],
    counters: &mut [Counter],
    now: u64,
    cost: u64,
) -> (Decision, Option<u64>) {
    let verdicts = verdicts(windows, counters, now, cost);
    admit(windows, &verdicts, || store(windows, counters, now, cost))
}

/// What [`check`] would answer for a call of `cost` now, storing nothing.
pub(crate) fn peek(windows: &[Window], counters: &[Counter], now: u64, cost: u64) -> Decision {
    combine(
        windows,
        &verdicts(windows, counters, now, cost)[..windows.len()],
    )
}

/// Takes `cost` from every window whatever it holds: the current
/// window's count goes past the count if need be; it then weighs as the
/// previous window over the next one, less and less as the sliding window
/// leaves it, so the overdraft fades over one more window (the retry is
/// the instant it weighs little enough). Counters saturate at
/// [`MAX_COUNTED`]. Returns the figures of now for a call of cost 1
/// (`standing` in the window module) and the time from which the state means nothing.
pub(crate) fn charge(
    windows: &[Window],
    counters: &mut [Counter],
    now: u64,
    cost: u64,
) -> (Decision, u64) {
    let idle_at = store(windows, counters, now, cost);
    charged(windows, verdicts(windows, counters, now, 1), idle_at)
}

/// Gives `cost` back: the count of the window a call now is decided in
/// goes down by `cost`, not below 0; the previous window's count is left, and so is a count of a
/// window that has ended is left as it is. Returns how much was given back.
pub(crate) fn refund(windows: &[Window], counters: &mut [Counter], now: u64, cost: u64) -> u64 {
    super::window::refund_counts(windows, counters, now, cost)
}

/// What each sliding window says about a call of `cost`, storing nothing.
fn verdicts(windows: &[Window], counters: &[Counter], now: u64, cost: u64) -> Verdicts {
    let mut verdicts = EMPTY;
    for ((v, w), c) in verdicts.iter_mut().zip(windows).zip(counters.iter()) {
        let start = c.window_at(now, w.length);
        let end = start + w.length;
        let (curr, prev) = c.counts(start, w.length);
        // The share of the previous window still inside the sliding one:
        // all of it while `now` lags behind the stored window.
        let r = end - now;
        let weight = r.min(w.length) as f64 / w.length as f64;
        let est = prev as f64 * weight;
        let room = w.count as f64 - curr as f64 - cost as f64;
        // Remaining and reset of now, before the call.
        let remaining_now = (w.count as f64 - curr as f64 - est).floor().max(0.0) as u64;
        let reset_now = if curr > 0 {
            end + w.length - now
        } else if prev > 0 {
            r
        } else {
            0
        };
        *v = if est <= room {
            Verdict {
                admits: true,
                remaining: (room - est).floor() as u64,
                reset: end + w.length - now,
                retry: 0,
                before: (remaining_now, reset_now),
            }
        } else {
            let retry = if room >= 0.0 {
                // Wait in this window until the previous one weighs little
                // enough: prev · (r − d) / W ≤ room.
                let x = room * w.length as f64 / prev as f64;
                (r as f64 - x).ceil()
            } else {
                // Wait for the next window, where this one's count becomes
                // the previous one: curr · (W − e) / W ≤ count − n.
                let room = w.count as f64 - cost as f64;
                if curr as f64 <= room {
                    r as f64
                } else {
                    let x = room * w.length as f64 / curr as f64;
                    r as f64 + (w.length as f64 - x).ceil()
                }
            };
            Verdict {
                admits: false,
                remaining: remaining_now,
                reset: reset_now,
                retry: (retry as u64).max(1),
                before: (remaining_now, reset_now),
            }
        };
    }
    verdicts
}

/// Adds `cost` to every window's current count (saturating at
/// [`MAX_COUNTED`]); returns the time from which the state means nothing.
fn store(windows: &[Window], counters: &mut [Counter], now: u64, cost: u64) -> u64 {
    let mut idle_at = now;
    for (w, c) in windows.iter().zip(counters.iter_mut()) {
        let start = c.window_at(now, w.length);
        let (curr, prev) = c.counts(start, w.length);
        *c = Counter {
            start,
            count: curr.saturating_add(cost).min(MAX_COUNTED),
            prev,
        };
        idle_at = idle_at.max(start + 2 * w.length);
    }
    idle_at
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::algorithm::window::tests::{S, w};

    #[test]
    fn sliding_counter_weights_the_previous_window() {
        let windows = [w(10, 10)];
        let mut c = [Counter::default()];
        let (d, _) = check(&windows, &mut c, 5 * S, 10);
        assert!(d.allowed);
        // 25% into the next window, 75% of the 10 still count: 7.5, so 2
        // calls fit (9.5 ≤ 10), the third does not.
        let now = 12 * S + S / 2;
        for remaining in [1, 0] {
            let (d, _) = check(&windows, &mut c, now, 1);
            assert!(d.allowed);
            assert_eq!(d.remaining, remaining);
        }
        let (d, _) = check(&windows, &mut c, now, 1);
        assert!(!d.allowed);
        // 7.5 must fall to 7: (r − d) / W · 10 ≤ 7 ⇒ d ≥ 0.5 s.
        assert_eq!(d.retry_after(), Some(Duration::from_millis(500)));
        let (d, _) = check(&windows, &mut c, now + S / 2, 1);
        assert!(d.allowed);
    }

    #[test]
    fn a_sliding_counter_overdraft_fades_over_the_next_window() {
        let windows = [w(10, 10)];
        let mut c = [Counter::default()];
        let (d, _) = charge(&windows, &mut c, 15 * S, 20);
        // 20 weighs ≤ 9 once (W − e)/W ≤ 9/20: e ≥ 5.5 s into [20, 30).
        assert_eq!(d.retry_us, Some(10 * S + S / 2));
        let (d, _) = check(&windows, &mut c, 25 * S + S / 2 - 1, 1);
        assert!(!d.allowed);
        let (d, _) = check(&windows, &mut c, 25 * S + S / 2, 1);
        assert!(d.allowed);
        // The refund takes from the current window only.
        assert_eq!(refund(&windows, &mut c, 25 * S + S / 2, 9), 1);
        assert_eq!(
            c[0],
            Counter {
                start: 20 * S,
                count: 0,
                prev: 20
            }
        );
    }
}
