//! Sliding-window log over one or more windows at once: the exact count
//! of the last window length, from the times of admitted calls.
//!
//! The one definition of the algorithm, for every operation: [`check`],
//! [`peek`], [`charge`] and [`refund`], pure functions of (log, now,
//! windows). [`MemoryStore`] runs them on its state; `lua/sliding_log.lua`
//! transcribes them function by function for Redis. How the windows of a
//! policy combine is in the [window module](super::window).
//!
//! A window of length `W` holding `count`, for a call of cost `n` at `now`:
//!
//! ```text
//! used  = cost logged at times t > now − W
//! admit ⇔ used + n ≤ count
//! retry = t_k + W − now, t_k the k-th oldest logged time in the window,
//!         k = used + n − count
//! ```
//!
//! A charge logs `n` entries at now (at most the largest count: entries
//! logged together leave together), and calls pass again as entries leave
//! each window, `W` after they were logged; a refund drops up to `n` of the
//! newest entries inside the longest window (the log keeps no per-call
//! record, so not necessarily the refunded call's own).
//!
//! [`MemoryStore`]: crate::MemoryStore

use std::collections::VecDeque;

use super::window::{EMPTY, Verdict, Verdicts, Window, admit, charged, combine};
use crate::decision::Decision;

/// Sliding log over `windows`, all sharing `log`: the times of admitted
/// calls in ascending order, one entry per unit of cost. An admitted call
/// drops what is older than the longest window and logs `cost` entries at
/// `now`; a denied call changes nothing. Returns the decision and, when
/// admitted, the time from which the log means nothing (every entry has
/// left every window).
pub(crate) fn check(
    windows: &[Window],
    log: &mut VecDeque<u64>,
    now: u64,
    cost: u64,
) -> (Decision, Option<u64>) {
    let verdicts = verdicts(windows, log, now, cost);
    admit(windows, &verdicts, || store(windows, log, now, cost))
}

/// What [`check`] would answer for a call of `cost` now, storing nothing.
pub(crate) fn peek(windows: &[Window], log: &VecDeque<u64>, now: u64, cost: u64) -> Decision {
    combine(windows, &verdicts(windows, log, now, cost)[..windows.len()])
}

/// Takes `cost` from every window whatever it holds: `cost` entries are
/// logged at `now`, no more than the largest window's count (every entry
/// logged at one instant leaves a window at the same time, so entries past
/// that count would change no decision, only memory); calls pass again
/// once enough of them have left each window, `length` after `now`.
/// Returns the figures of now for a call of cost 1 (`standing` in the window module) and the
/// time from which the log means nothing.
pub(crate) fn charge(
    windows: &[Window],
    log: &mut VecDeque<u64>,
    now: u64,
    cost: u64,
) -> (Decision, u64) {
    let largest = windows.iter().map(|w| w.count).max().unwrap_or(0);
    let idle_at = store(windows, log, now, cost.min(largest));
    charged(windows, verdicts(windows, log, now, 1), idle_at)
}

/// Gives `cost` back: up to `cost` of the newest entries still inside the
/// longest window are dropped. The log keeps no record of which call
/// logged which entry, so a refund cannot find "its" call's entries; the
/// newest are the ones a refund made soon after its charge most likely
/// matches, and taking them frees the room that leaves the windows last
/// (the most generous choice, never more than the cost given back).
/// Returns how much was given back.
pub(crate) fn refund(windows: &[Window], log: &mut VecDeque<u64>, now: u64, cost: u64) -> u64 {
    let longest = windows.iter().map(|w| w.length).max().unwrap_or(0);
    let first = window_start(log, now, longest);
    let back = ((log.len() - first) as u64).min(cost);
    log.truncate(log.len() - back as usize);
    back
}

/// What each window says about a call of `cost` on `log`, storing nothing.
fn verdicts(windows: &[Window], log: &VecDeque<u64>, now: u64, cost: u64) -> Verdicts {
    let mut verdicts = EMPTY;
    let newest = log.back().copied();
    for (v, w) in verdicts.iter_mut().zip(windows) {
        let first = window_start(log, now, w.length);
        let used = (log.len() - first) as u64;
        *v = if used.saturating_add(cost) <= w.count {
            Verdict {
                admits: true,
                remaining: w.count - used - cost,
                reset: newest.unwrap_or(0).max(now) + w.length - now,
                retry: 0,
                before: (
                    w.count - used,
                    newest.map_or(0, |t| (t + w.length).saturating_sub(now)),
                ),
            }
        } else {
            // used + cost > count ≥ cost, so 1 ≤ k ≤ used: entry k exists.
            let k = (used + cost - w.count) as usize;
            let leaves = log[first + k - 1] + w.length;
            let remaining = w.count.saturating_sub(used);
            // Denied, so the window holds entries: the newest is one.
            let reset = newest.unwrap_or(now) + w.length - now;
            Verdict {
                admits: false,
                remaining,
                reset,
                retry: leaves - now,
                before: (remaining, reset),
            }
        };
    }
    verdicts
}

/// Logs `cost` entries at `now`, after dropping what is older than the
/// longest window; returns the time from which the log means nothing.
fn store(windows: &[Window], log: &mut VecDeque<u64>, now: u64, cost: u64) -> u64 {
    let longest = windows.iter().map(|w| w.length).max().unwrap_or(0);
    let stale = window_start(log, now, longest);
    log.drain(..stale);
    let at = log.partition_point(|&t| t <= now);
    for _ in 0..cost {
        log.insert(at, now);
    }
    let newest = log.back().copied().unwrap_or(now);
    newest + longest
}

/// Index of the first logged time inside a window of length `length`: the
/// first time `t > now − length`.
fn window_start(log: &VecDeque<u64>, now: u64, length: u64) -> usize {
    match now.checked_sub(length) {
        Some(cutoff) => log.partition_point(|&t| t <= cutoff),
        None => 0,
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::algorithm::window::tests::{S, w};

    #[test]
    fn sliding_log_counts_exactly_and_denials_log_nothing() {
        let windows = [w(3, 10)];
        let mut log = VecDeque::new();
        let t0 = 100 * S;
        for (i, remaining) in [2, 1].into_iter().enumerate() {
            let (d, _) = check(&windows, &mut log, t0 + i as u64 * S, 1);
            assert!(d.allowed);
            assert_eq!(d.remaining, remaining);
        }
        let (d, idle) = check(&windows, &mut log, t0 + 2 * S, 1);
        assert!(d.allowed);
        assert_eq!(d.remaining, 0);
        assert_eq!(idle, Some(t0 + 12 * S));
        let (d, _) = check(&windows, &mut log, t0 + 5 * S, 1);
        assert!(!d.allowed);
        assert_eq!(d.retry_after(), Some(Duration::from_secs(5)));
        assert_eq!(log.len(), 3);
        // The first entry leaves exactly at t0 + 10 s, not a microsecond before.
        let (d, _) = check(&windows, &mut log, t0 + 10 * S - 1, 1);
        assert!(!d.allowed);
        assert_eq!(d.retry_after(), Some(Duration::from_micros(1)));
        let (d, _) = check(&windows, &mut log, t0 + 10 * S, 1);
        assert!(d.allowed);
        assert_eq!(log.len(), 3, "the stale entry was trimmed");
    }

    #[test]
    fn sliding_log_retry_for_a_costly_call() {
        let windows = [w(4, 10)];
        let mut log = VecDeque::new();
        for i in 0..4 {
            assert!(check(&windows, &mut log, i * S, 1).0.allowed);
        }
        // Cost 3 needs the three oldest entries gone: the third leaves at 12 s.
        let (d, _) = check(&windows, &mut log, 5 * S, 3);
        assert_eq!(d.retry_after(), Some(Duration::from_secs(7)));
    }

    #[test]
    fn a_sliding_log_charge_is_capped_and_a_refund_takes_the_newest() {
        let windows = [w(3, 10), w(5, 60)];
        let mut log = VecDeque::new();
        check(&windows, &mut log, S, 1);
        let (d, idle) = charge(&windows, &mut log, 2 * S, 100);
        assert_eq!(log.len(), 1 + 5, "capped at the largest count");
        assert_eq!(idle, 62 * S);
        assert!(!d.allowed);
        // Both windows need entries of 2 s to leave: the short one at
        // 12 s, the minute's at 62 s, which decides.
        assert_eq!((d.limit, d.retry_us), (1, Some(60 * S)));
        assert_eq!(refund(&windows, &mut log, 2 * S, 4), 4);
        assert_eq!(log, [S, 2 * S]);
        let d = peek(&windows, &log, 2 * S, 1);
        assert!(d.allowed);
        assert_eq!(
            d.remaining, 0,
            "the short window has 1 left, after the call 0"
        );
        // Entries that have left the longest window are not refunded.
        assert_eq!(refund(&windows, &mut log, 61 * S + 1, 9), 1);
        assert_eq!(log, [S]);
    }
}
