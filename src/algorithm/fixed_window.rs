//! Fixed windows over one or more windows at once: one counter per
//! window, aligned to the clock's epoch, reset when the window ends.
//!
//! The one definition of the algorithm, for every operation: [`check`],
//! [`peek`], [`charge`] and [`refund`], pure functions of (counters, now,
//! windows). [`MemoryStore`] runs them on its state; `lua/fixed_window.lua`
//! transcribes them function by function for Redis. How the windows of a
//! policy combine, and why a stored window's start never moves back, is
//! in the [window module](super::window).
//!
//! A window of length `W` holding `count`, for a call of cost `n` at `now`:
//!
//! ```text
//! start = ⌊now / W⌋·W, used = cost admitted since start
//! admit ⇔ used + n ≤ count;  retry = reset = start + W − now
//! ```
//!
//! A charge past the count lets nothing pass until the window ends, and
//! the overdraft goes with the rest of the count: a fixed window carries
//! nothing over.
//!
//! [`MemoryStore`]: crate::MemoryStore

use super::window::{
    Counter, EMPTY, MAX_COUNTED, Verdict, Verdicts, Window, admit, charged, combine,
};
use crate::decision::Decision;

/// Fixed windows aligned to the clock's epoch. `counters[i]` is window
/// `i`'s state; an admitted call updates every one. Returns the decision
/// and, when admitted, the time from which the state means nothing.
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

/// Takes `cost` from every window whatever it holds: the count goes past
/// the window's count if need be; nothing passes until the window ends,
/// and then the overdraft is forgotten with the rest of the count.
/// Counters saturate at [`MAX_COUNTED`]. Returns the figures of now for a
/// call of cost 1 (`standing` in the window module) and the time from which the state means
/// nothing.
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
/// goes down by `cost`, not below 0; a count of a
/// window that has ended is left as it is. Returns how much was given back.
pub(crate) fn refund(windows: &[Window], counters: &mut [Counter], now: u64, cost: u64) -> u64 {
    super::window::refund_counts(windows, counters, now, cost)
}

/// What each fixed window says about a call of `cost`, storing nothing.
fn verdicts(windows: &[Window], counters: &[Counter], now: u64, cost: u64) -> Verdicts {
    let mut verdicts = EMPTY;
    for ((v, w), c) in verdicts.iter_mut().zip(windows).zip(counters.iter()) {
        let start = c.window_at(now, w.length);
        let reset = start + w.length - now;
        let (used, _) = c.counts(start, w.length);
        *v = if used.saturating_add(cost) <= w.count {
            Verdict {
                admits: true,
                remaining: w.count - used - cost,
                reset,
                retry: 0,
                before: (w.count - used, reset),
            }
        } else {
            let remaining = w.count.saturating_sub(used);
            Verdict {
                admits: false,
                remaining,
                reset,
                retry: reset,
                before: (remaining, reset),
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
        let (used, _) = c.counts(start, w.length);
        *c = Counter {
            start,
            count: used.saturating_add(cost).min(MAX_COUNTED),
            prev: 0,
        };
        idle_at = idle_at.max(start + w.length);
    }
    idle_at
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::algorithm::window::tests::{S, w};

    #[test]
    fn fixed_window_resets_on_the_boundary() {
        let windows = [w(2, 10)];
        let mut c = [Counter::default()];
        let (d, _) = check(&windows, &mut c, 18 * S, 2);
        assert!(d.allowed);
        assert_eq!(d.reset(), Duration::from_secs(2));
        let (d, _) = check(&windows, &mut c, 20 * S - 1, 1);
        assert_eq!(d.retry_after(), Some(Duration::from_micros(1)));
        let (d, _) = check(&windows, &mut c, 20 * S, 2);
        assert!(d.allowed);
    }

    #[test]
    fn a_fixed_window_forgets_its_overdraft_at_its_end() {
        let windows = [w(5, 10)];
        let mut c = [Counter::default()];
        let (d, idle) = charge(&windows, &mut c, 12 * S, 9);
        assert_eq!(
            c[0],
            Counter {
                start: 10 * S,
                count: 9,
                prev: 0
            }
        );
        assert_eq!(idle, 20 * S);
        assert!(!d.allowed);
        assert_eq!((d.remaining, d.retry_us), (0, Some(8 * S)));
        assert_eq!(refund(&windows, &mut c, 12 * S, 5), 5);
        let d = peek(&windows, &c, 12 * S, 1);
        assert!(d.allowed);
        assert_eq!(refund(&windows, &mut c, 12 * S, 50), 4);
        assert_eq!(c[0].count, 0);
        // The next window starts empty; the ended one gives nothing back.
        charge(&windows, &mut c, 12 * S, 9);
        assert_eq!(refund(&windows, &mut c, 20 * S, 3), 0);
        assert!(peek(&windows, &c, 20 * S, 5).allowed);
    }
}
