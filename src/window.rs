//! The window algorithms over one or more windows at once: sliding log,
//! sliding-window counter and fixed window.
//!
//! This is their one definition: [`MemoryStore`] calls these functions and
//! `lua/sliding_log.lua`, `lua/sliding_counter.lua` and `lua/fixed_window.lua`
//! transcribe them for Redis. Times are integer microseconds. Every window
//! must admit the call or nothing is stored, and the decision names the
//! window that decided:
//!
//! - denied: the window asking for the longest retry;
//! - admitted: the window with the least remaining;
//! - on ties, the longest window, then the first: with "25 per 5 s and 300
//!   per minute", a client that has used up both is told about the minute.
//!
//! A window of length `W` holding `count`, for a call of cost `n` at `now`:
//!
//! ```text
//! sliding log      used = cost logged at times t > now − W
//!                  admit ⇔ used + n ≤ count
//!                  retry = t_k + W − now, t_k the k-th oldest logged time
//!                          in the window, k = used + n − count
//! fixed window     start = ⌊now / W⌋·W, used = cost admitted since start
//!                  admit ⇔ used + n ≤ count;  retry = reset = start + W − now
//! sliding counter  curr, prev = cost admitted in the current and previous
//!                  fixed windows; r = start + W − now (1 ..= W)
//!                  est = prev · (min(r, W) / W)           (a double)
//!                  admit ⇔ est ≤ count − curr − n
//! ```
//!
//! Cost known after the response ([`peek`], [`charge`], [`refund`]): a peek
//! is the decision with nothing stored; a charge stores `n` whatever the
//! windows hold, past their counts if need be, and reports the figures of
//! now for a call of cost 1; a refund takes `n` back, never below an empty
//! window. How an overdraft is repaid:
//!
//! ```text
//! fixed window     count > quota: nothing passes until the window ends;
//!                  the overdraft goes with the rest of the count
//! sliding counter  curr > quota: nothing passes in this window; in the
//!                  next, curr weighs as prev · (r / W), so the overdraft
//!                  fades as the sliding window leaves it, and a call fits
//!                  once prev · (W − e) / W ≤ quota − 1
//! sliding log      n entries at now (at most the largest quota: entries
//!                  logged together leave together); calls pass again as
//!                  entries leave each window, W after they were logged
//! refund           counters: current count − n, not below 0 (a count of
//!                  a window that has ended is left); log: drops up to n
//!                  of the newest entries inside the longest window (the
//!                  log keeps no per-call record, so not necessarily the
//!                  refunded call's own)
//! ```
//!
//! Unlike GCRA, a window repays no debt at a rate: a fixed window forgets
//! it at its end however large, and the counters and the log forget it
//! within one (sliding counter: two) windows.
//!
//! A stored fixed window's start never moves back. When it is later than
//! the window holding `now` (the Redis scripts with the callers' clocks,
//! one of them behind the one that wrote; or a clock stepped back), the
//! call is decided in the stored window: `start` is the stored one, its
//! counts apply in full (the sliding counter's `r` then exceeds `W` by the
//! lag, and `prev` weighs in full), and the reset and retry run to that
//! window's end on the caller's clock, longer than a window by the lag.
//!
//! The sliding counter's weighting is computed in IEEE doubles, in the same
//! order of operations as the Lua script, so that both stores give the same
//! answers bit for bit; every integer in it stays below 2^53 (window lengths
//! are at most 2^50 µs and counts at most one per microsecond of a window).
//! Costs above a window's count are refused before any store is asked (see
//! [`Limiter`]), so `n ≤ count` here.
//!
//! [`MemoryStore`]: crate::MemoryStore
//! [`Limiter`]: crate::Limiter

use std::collections::VecDeque;
use std::time::Duration;

use crate::decision::Decision;
use crate::limit::Limit;

/// One window: its length in microseconds and the cost it admits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Window {
    pub(crate) length: u64,
    pub(crate) count: u64,
}

impl Window {
    /// The window a limit stands for: its rate's period (rounded up to whole
    /// microseconds) and count. The builders keep the period at most 2^50 µs.
    pub(crate) fn of(limit: &Limit) -> Window {
        let rate = limit.rate();
        let length = rate.period().as_nanos().div_ceil(1000);
        Window {
            length: u64::try_from(length).unwrap_or(u64::MAX),
            count: rate.count(),
        }
    }
}

/// What one window says about a call. When it admits, `remaining` and
/// `reset` are those after the call; when it denies, those of now.
/// `before` is (remaining, reset) of now either way: what an admitting
/// window reports when another window denies the call, which then charges
/// nothing.
#[derive(Clone, Copy, Debug)]
struct Verdict {
    admits: bool,
    remaining: u64,
    reset: u64,
    retry: u64,
    before: (u64, u64),
}

/// All windows together: the decision, naming the window that decided and,
/// for several windows, reporting each.
fn combine(windows: &[Window], verdicts: &[Verdict]) -> Decision {
    let mut worst: Option<usize> = None;
    let mut tightest = 0;
    for (i, v) in verdicts.iter().enumerate() {
        let longer = |j: usize| windows[i].length > windows[j].length;
        if !v.admits {
            if worst.is_none_or(|w| {
                let w_retry = verdicts[w].retry;
                v.retry > w_retry || (v.retry == w_retry && longer(w))
            }) {
                worst = Some(i);
            }
        } else {
            let t = verdicts[tightest].remaining;
            if v.remaining < t || (v.remaining == t && longer(tightest)) {
                tightest = i;
            }
        }
    }
    let (limit, v) = match worst {
        Some(i) => (i, verdicts[i]),
        None => (tightest, verdicts[tightest]),
    };
    Decision {
        allowed: v.admits,
        limit,
        remaining: v.remaining,
        reset_us: v.reset,
        retry_us: (!v.admits).then_some(v.retry),
        wait_us: 0,
        each: (verdicts.len() > 1).then(|| {
            verdicts
                .iter()
                .map(|v| {
                    let (remaining, reset) = if worst.is_none() {
                        (v.remaining, v.reset)
                    } else {
                        v.before
                    };
                    (remaining, Duration::from_micros(reset))
                })
                .collect()
        }),
    }
}

/// Index of the first logged time inside a window of length `length`: the
/// first time `t > now − length`.
fn window_start(log: &VecDeque<u64>, now: u64, length: u64) -> usize {
    match now.checked_sub(length) {
        Some(cutoff) => log.partition_point(|&t| t <= cutoff),
        None => 0,
    }
}

/// Sliding log over `windows`, all sharing `log`: the times of admitted
/// calls in ascending order, one entry per unit of cost. An admitted call
/// drops what is older than the longest window and logs `cost` entries at
/// `now`; a denied call changes nothing. Returns the decision and, when
/// admitted, the time from which the log means nothing (every entry has
/// left every window).
pub(crate) fn sliding_log(
    windows: &[Window],
    log: &mut VecDeque<u64>,
    now: u64,
    cost: u64,
) -> (Decision, Option<u64>) {
    let verdicts = log_verdicts(windows, log, now, cost);
    let decision = combine(windows, &verdicts[..windows.len()]);
    if !decision.allowed {
        return (decision, None);
    }
    (decision, Some(log_store(windows, log, now, cost)))
}

/// What each window says about a call of `cost` on `log`, storing nothing.
fn log_verdicts(
    windows: &[Window],
    log: &VecDeque<u64>,
    now: u64,
    cost: u64,
) -> [Verdict; crate::limit::MAX_LIMITS_PER_POLICY] {
    let mut verdicts = [EMPTY; crate::limit::MAX_LIMITS_PER_POLICY];
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
fn log_store(windows: &[Window], log: &mut VecDeque<u64>, now: u64, cost: u64) -> u64 {
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

const EMPTY: Verdict = Verdict {
    admits: true,
    remaining: 0,
    reset: 0,
    retry: 0,
    before: (0, 0),
};

/// The counts of one window of the counter algorithms: the fixed window
/// starting at `start`, its cost so far, and the cost of the window before
/// it (sliding counter only).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Counter {
    pub(crate) start: u64,
    pub(crate) count: u64,
    pub(crate) prev: u64,
}

impl Counter {
    /// Start of the fixed window a call at `now` is decided in: the one
    /// holding `now`, or the stored one if that is later (a clock behind
    /// the one that wrote it). A stored start never moves back, so a
    /// lagging clock never reads a fresh window into a full one.
    fn window_at(&self, now: u64, length: u64) -> u64 {
        (now / length * length).max(self.start)
    }

    /// (current, previous) cost for the fixed window starting at `start`.
    fn counts(&self, start: u64, length: u64) -> (u64, u64) {
        if self.start == start {
            (self.count, self.prev)
        } else if start.checked_sub(length) == Some(self.start) {
            (0, self.count)
        } else {
            (0, 0)
        }
    }
}

/// Fixed windows aligned to the clock's epoch. `counters[i]` is window
/// `i`'s state; an admitted call updates every one. Returns the decision
/// and, when admitted, the time from which the state means nothing.
pub(crate) fn fixed_window(
    windows: &[Window],
    counters: &mut [Counter],
    now: u64,
    cost: u64,
) -> (Decision, Option<u64>) {
    let verdicts = fixed_verdicts(windows, counters, now, cost);
    let decision = combine(windows, &verdicts[..windows.len()]);
    if !decision.allowed {
        return (decision, None);
    }
    (decision, Some(fixed_store(windows, counters, now, cost)))
}

/// What each fixed window says about a call of `cost`, storing nothing.
fn fixed_verdicts(
    windows: &[Window],
    counters: &[Counter],
    now: u64,
    cost: u64,
) -> [Verdict; crate::limit::MAX_LIMITS_PER_POLICY] {
    let mut verdicts = [EMPTY; crate::limit::MAX_LIMITS_PER_POLICY];
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
fn fixed_store(windows: &[Window], counters: &mut [Counter], now: u64, cost: u64) -> u64 {
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

/// Sliding-window counters: each window's fixed-window count plus the
/// previous fixed window's, weighted by how much of it the sliding window
/// still covers. Returns the decision and, when admitted, the time from
/// which the state means nothing.
pub(crate) fn sliding_counter(
    windows: &[Window],
    counters: &mut [Counter],
    now: u64,
    cost: u64,
) -> (Decision, Option<u64>) {
    let verdicts = sliding_verdicts(windows, counters, now, cost);
    let decision = combine(windows, &verdicts[..windows.len()]);
    if !decision.allowed {
        return (decision, None);
    }
    (decision, Some(sliding_store(windows, counters, now, cost)))
}

/// What each sliding window says about a call of `cost`, storing nothing.
fn sliding_verdicts(
    windows: &[Window],
    counters: &[Counter],
    now: u64,
    cost: u64,
) -> [Verdict; crate::limit::MAX_LIMITS_PER_POLICY] {
    let mut verdicts = [EMPTY; crate::limit::MAX_LIMITS_PER_POLICY];
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
fn sliding_store(windows: &[Window], counters: &mut [Counter], now: u64, cost: u64) -> u64 {
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

/// The most a counter of the counter algorithms holds: charges
/// ([`charge`]) saturate there, so that every count stays exact in the Lua
/// scripts' doubles (a check never gets near it: a count is at most one
/// per microsecond of a window of at most 2^50 µs).
pub(crate) const MAX_COUNTED: u64 = 1 << 50;

/// The three window algorithms, for the operations that take the same
/// arguments under each: [`peek`], [`charge`] and [`refund`].
#[derive(Debug)]
pub(crate) enum State<'a> {
    Log(&'a mut VecDeque<u64>),
    Fixed(&'a mut [Counter]),
    Sliding(&'a mut [Counter]),
}

/// What a call of `cost` would be told now, storing nothing: the decision
/// of [`sliding_log`], [`fixed_window`] or [`sliding_counter`], with the
/// state left as it is.
pub(crate) fn peek(windows: &[Window], state: &State<'_>, now: u64, cost: u64) -> Decision {
    let verdicts = match state {
        State::Log(log) => log_verdicts(windows, log, now, cost),
        State::Fixed(counters) => fixed_verdicts(windows, counters, now, cost),
        State::Sliding(counters) => sliding_verdicts(windows, counters, now, cost),
    };
    combine(windows, &verdicts[..windows.len()])
}

/// Takes `cost` from every window whatever it holds, past its count if
/// need be, and says what is left. Returns the figures of now for a call
/// of cost 1 ([`standing`]) and the time from which the state means
/// nothing.
///
/// How an overdraft is repaid, by algorithm:
///
/// - fixed window: the count goes past the window's count; nothing passes
///   until the window ends, and then the overdraft is forgotten with the
///   rest of the count (a fixed window carries nothing over);
/// - sliding-window counter: the current window's count goes past the
///   count; it then weighs as the previous window over the next one,
///   less and less as the sliding window leaves it, so the overdraft fades
///   over one more window (the retry is the instant it weighs little
///   enough);
/// - sliding log: `cost` entries are logged at `now` (no more than the
///   largest window's count: every entry logged at one instant leaves a
///   window at the same time, so entries past that count would change no
///   decision, only memory); calls pass again once enough of them have
///   left each window, `length` after `now`.
///
/// Counters saturate at [`MAX_COUNTED`].
pub(crate) fn charge(
    windows: &[Window],
    state: &mut State<'_>,
    now: u64,
    cost: u64,
) -> (Decision, u64) {
    let idle_at = match state {
        State::Log(log) => {
            let largest = windows.iter().map(|w| w.count).max().unwrap_or(0);
            log_store(windows, log, now, cost.min(largest))
        }
        State::Fixed(counters) => fixed_store(windows, counters, now, cost),
        State::Sliding(counters) => sliding_store(windows, counters, now, cost),
    };
    let mut verdicts = match state {
        State::Log(log) => log_verdicts(windows, log, now, 1),
        State::Fixed(counters) => fixed_verdicts(windows, counters, now, 1),
        State::Sliding(counters) => sliding_verdicts(windows, counters, now, 1),
    };
    (standing(windows, &mut verdicts[..windows.len()]), idle_at)
}

/// The figures of now, from the verdicts on a call of cost 1: when every
/// window admits it, each window's remaining and reset before the call
/// (what is left: the call is not made); when one denies it, the denial,
/// whose figures are those of now already, with the retry of a call of
/// cost 1. A window's remaining before a call of cost 1 is its remaining
/// after it plus one under every algorithm, so the deciding window is the
/// same.
fn standing(windows: &[Window], verdicts: &mut [Verdict]) -> Decision {
    if verdicts.iter().all(|v| v.admits) {
        for v in verdicts.iter_mut() {
            (v.remaining, v.reset) = v.before;
        }
    }
    combine(windows, verdicts)
}

/// Gives `cost` back, never below a fresh state; returns how much was
/// given back.
///
/// - fixed window and sliding-window counter: the count of the window a
///   call now is decided in goes down by `cost`, not below 0; a count of a
///   window that has ended (the previous one of the sliding counter) is
///   left as it is;
/// - sliding log: up to `cost` of the newest entries still inside the
///   longest window are dropped. The log keeps no record of which call
///   logged which entry, so a refund cannot find "its" call's entries; the
///   newest are the ones a refund made soon after its charge most likely
///   matches, and taking them frees the room that leaves the windows last
///   (the most generous choice, never more than the cost given back).
pub(crate) fn refund(windows: &[Window], state: &mut State<'_>, now: u64, cost: u64) -> u64 {
    match state {
        State::Log(log) => {
            let longest = windows.iter().map(|w| w.length).max().unwrap_or(0);
            let first = window_start(log, now, longest);
            let back = ((log.len() - first) as u64).min(cost);
            log.truncate(log.len() - back as usize);
            back
        }
        State::Fixed(counters) | State::Sliding(counters) => {
            let mut back = 0;
            for (w, c) in windows.iter().zip(counters.iter_mut()) {
                if c.window_at(now, w.length) == c.start {
                    let less = c.count.min(cost);
                    c.count -= less;
                    back += less;
                }
            }
            back
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(super) const S: u64 = 1_000_000;

    pub(super) fn w(count: u64, secs: u64) -> Window {
        Window {
            length: secs * S,
            count,
        }
    }

    #[test]
    fn sliding_log_counts_exactly_and_denials_log_nothing() {
        let windows = [w(3, 10)];
        let mut log = VecDeque::new();
        let t0 = 100 * S;
        for (i, remaining) in [2, 1].into_iter().enumerate() {
            let (d, _) = sliding_log(&windows, &mut log, t0 + i as u64 * S, 1);
            assert!(d.allowed);
            assert_eq!(d.remaining, remaining);
        }
        let (d, idle) = sliding_log(&windows, &mut log, t0 + 2 * S, 1);
        assert!(d.allowed);
        assert_eq!(d.remaining, 0);
        assert_eq!(idle, Some(t0 + 12 * S));
        let (d, _) = sliding_log(&windows, &mut log, t0 + 5 * S, 1);
        assert!(!d.allowed);
        assert_eq!(d.retry_after(), Some(Duration::from_secs(5)));
        assert_eq!(log.len(), 3);
        // The first entry leaves exactly at t0 + 10 s, not a microsecond before.
        let (d, _) = sliding_log(&windows, &mut log, t0 + 10 * S - 1, 1);
        assert!(!d.allowed);
        assert_eq!(d.retry_after(), Some(Duration::from_micros(1)));
        let (d, _) = sliding_log(&windows, &mut log, t0 + 10 * S, 1);
        assert!(d.allowed);
        assert_eq!(log.len(), 3, "the stale entry was trimmed");
    }

    #[test]
    fn sliding_log_retry_for_a_costly_call() {
        let windows = [w(4, 10)];
        let mut log = VecDeque::new();
        for i in 0..4 {
            assert!(sliding_log(&windows, &mut log, i * S, 1).0.allowed);
        }
        // Cost 3 needs the three oldest entries gone: the third leaves at 12 s.
        let (d, _) = sliding_log(&windows, &mut log, 5 * S, 3);
        assert_eq!(d.retry_after(), Some(Duration::from_secs(7)));
    }

    #[test]
    fn fixed_window_resets_on_the_boundary() {
        let windows = [w(2, 10)];
        let mut c = [Counter::default()];
        let (d, _) = fixed_window(&windows, &mut c, 18 * S, 2);
        assert!(d.allowed);
        assert_eq!(d.reset(), Duration::from_secs(2));
        let (d, _) = fixed_window(&windows, &mut c, 20 * S - 1, 1);
        assert_eq!(d.retry_after(), Some(Duration::from_micros(1)));
        let (d, _) = fixed_window(&windows, &mut c, 20 * S, 2);
        assert!(d.allowed);
    }

    /// Waiting the retry a denial gives is enough, and a microsecond less
    /// is not (the sliding counter's doubles included, in these cases).
    #[test]
    fn retry_after_is_when_the_call_passes() {
        type Decide = fn(&[Window], &mut [Counter], u64, u64) -> (Decision, Option<u64>);
        let mut denials = 0;
        for decide in [fixed_window as Decide, sliding_counter] {
            for (count, secs) in [(7, 10), (100, 60), (3, 1), (5000, 3600)] {
                let windows = [w(count, secs)];
                let length = secs * S;
                for start in [0, length / 3, length - 1, 2 * length + 12_345] {
                    for cost in [1, count / 2 + 1, count] {
                        let mut c = [Counter::default()];
                        let mut now = start;
                        // Fill it up with a call every 1/count of a window.
                        let mut denial = None;
                        for _ in 0..3 * count {
                            let (d, _) = decide(&windows, &mut c, now, cost);
                            if !d.allowed {
                                denial = Some(d);
                                break;
                            }
                            now += length / count / 2;
                        }
                        let Some(d) = denial else { continue };
                        let retry = d.retry_us.unwrap();
                        assert!(retry > 0);
                        denials += 1;
                        let mut early = c;
                        let (d, _) = decide(&windows, &mut early, now + retry - 1, cost);
                        assert!(!d.allowed, "{count}/{secs}s cost {cost}: passed early");
                        let (d, _) = decide(&windows, &mut c, now + retry, cost);
                        assert!(
                            d.allowed,
                            "{count}/{secs}s start {start} cost {cost}: denied after retry {retry}: {d:?}"
                        );
                    }
                }
            }
        }
        assert!(denials > 50, "only {denials} denials exercised");
    }

    /// A clock that steps back into an earlier window is decided in the
    /// stored one, which keeps its start: no fresh count for it.
    #[test]
    fn a_stored_window_start_never_moves_back() {
        let windows = [w(2, 10)];
        let mut c = [Counter::default()];
        assert!(fixed_window(&windows, &mut c, 20 * S, 2).0.allowed);
        let (d, _) = fixed_window(&windows, &mut c, 20 * S - 1, 1);
        assert!(!d.allowed);
        assert_eq!(d.retry_after(), Some(Duration::from_micros(10 * S + 1)));
        assert_eq!(c[0].start, 20 * S);

        let mut c = [Counter::default()];
        assert!(sliding_counter(&windows, &mut c, 20 * S, 2).0.allowed);
        let (d, _) = sliding_counter(&windows, &mut c, 20 * S - 1, 1);
        assert!(!d.allowed);
        assert_eq!(
            c[0],
            Counter {
                start: 20 * S,
                count: 2,
                prev: 0
            }
        );
    }

    #[test]
    fn sliding_counter_weights_the_previous_window() {
        let windows = [w(10, 10)];
        let mut c = [Counter::default()];
        let (d, _) = sliding_counter(&windows, &mut c, 5 * S, 10);
        assert!(d.allowed);
        // 25% into the next window, 75% of the 10 still count: 7.5, so 2
        // calls fit (9.5 ≤ 10), the third does not.
        let now = 12 * S + S / 2;
        for remaining in [1, 0] {
            let (d, _) = sliding_counter(&windows, &mut c, now, 1);
            assert!(d.allowed);
            assert_eq!(d.remaining, remaining);
        }
        let (d, _) = sliding_counter(&windows, &mut c, now, 1);
        assert!(!d.allowed);
        // 7.5 must fall to 7: (r − d) / W · 10 ≤ 7 ⇒ d ≥ 0.5 s.
        assert_eq!(d.retry_after(), Some(Duration::from_millis(500)));
        let (d, _) = sliding_counter(&windows, &mut c, now + S / 2, 1);
        assert!(d.allowed);
    }
}

#[cfg(test)]
mod adjust_tests {
    use super::tests::{S, w};
    use super::*;

    #[test]
    fn a_fixed_window_forgets_its_overdraft_at_its_end() {
        let windows = [w(5, 10)];
        let mut c = [Counter::default()];
        let (d, idle) = charge(&windows, &mut State::Fixed(&mut c), 12 * S, 9);
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
        assert_eq!(refund(&windows, &mut State::Fixed(&mut c), 12 * S, 5), 5);
        let d = peek(&windows, &State::Fixed(&mut c), 12 * S, 1);
        assert!(d.allowed);
        assert_eq!(refund(&windows, &mut State::Fixed(&mut c), 12 * S, 50), 4);
        assert_eq!(c[0].count, 0);
        // The next window starts empty; the ended one gives nothing back.
        charge(&windows, &mut State::Fixed(&mut c), 12 * S, 9);
        assert_eq!(refund(&windows, &mut State::Fixed(&mut c), 20 * S, 3), 0);
        assert!(peek(&windows, &State::Fixed(&mut c), 20 * S, 5).allowed);
    }

    #[test]
    fn a_sliding_counter_overdraft_fades_over_the_next_window() {
        let windows = [w(10, 10)];
        let mut c = [Counter::default()];
        let (d, _) = charge(&windows, &mut State::Sliding(&mut c), 15 * S, 20);
        // 20 weighs ≤ 9 once (W − e)/W ≤ 9/20: e ≥ 5.5 s into [20, 30).
        assert_eq!(d.retry_us, Some(10 * S + S / 2));
        let (d, _) = sliding_counter(&windows, &mut c, 25 * S + S / 2 - 1, 1);
        assert!(!d.allowed);
        let (d, _) = sliding_counter(&windows, &mut c, 25 * S + S / 2, 1);
        assert!(d.allowed);
        // The refund takes from the current window only.
        assert_eq!(
            refund(&windows, &mut State::Sliding(&mut c), 25 * S + S / 2, 9),
            1
        );
        assert_eq!(
            c[0],
            Counter {
                start: 20 * S,
                count: 0,
                prev: 20
            }
        );
    }

    #[test]
    fn a_sliding_log_charge_is_capped_and_a_refund_takes_the_newest() {
        let windows = [w(3, 10), w(5, 60)];
        let mut log = VecDeque::new();
        sliding_log(&windows, &mut log, S, 1);
        let (d, idle) = charge(&windows, &mut State::Log(&mut log), 2 * S, 100);
        assert_eq!(log.len(), 1 + 5, "capped at the largest count");
        assert_eq!(idle, 62 * S);
        assert!(!d.allowed);
        // Both windows need entries of 2 s to leave: the short one at
        // 12 s, the minute's at 62 s, which decides.
        assert_eq!((d.limit, d.retry_us), (1, Some(60 * S)));
        assert_eq!(refund(&windows, &mut State::Log(&mut log), 2 * S, 4), 4);
        assert_eq!(log, [S, 2 * S]);
        let d = peek(&windows, &State::Log(&mut log), 2 * S, 1);
        assert!(d.allowed);
        assert_eq!(
            d.remaining, 0,
            "the short window has 1 left, after the call 0"
        );
        // Entries that have left the longest window are not refunded.
        assert_eq!(
            refund(&windows, &mut State::Log(&mut log), 61 * S + 1, 9),
            1
        );
        assert_eq!(log, [S]);
    }

    #[test]
    fn a_charge_within_the_quota_says_what_is_left() {
        for mut state in [
            State::Log(&mut VecDeque::new()),
            State::Fixed(&mut [Counter::default()]),
            State::Sliding(&mut [Counter::default()]),
        ] {
            let windows = [w(10, 10)];
            let (d, _) = charge(&windows, &mut state, 3 * S, 4);
            assert!(d.allowed, "{state:?}");
            assert_eq!(d.remaining, 6, "{state:?}");
            assert_eq!(d.retry_us, None, "{state:?}");
        }
    }
}
