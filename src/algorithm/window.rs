//! What the window algorithms share: a policy's limits as windows, the
//! verdict each window gives on a call, and how the windows of a policy
//! decide together. The algorithms themselves are
//! [`sliding_log`](super::sliding_log), [`sliding_window`](super::sliding_window)
//! (the sliding-window counter) and [`fixed_window`](super::fixed_window).
//!
//! Times are integer microseconds. Every window must admit the call or
//! nothing is stored, and the decision names the window that decided:
//!
//! - denied: the window asking for the longest retry;
//! - admitted: the window with the least remaining;
//! - on ties, the longest window, then the first: with "25 per 5 s and 300
//!   per minute", a client that has used up both is told about the minute.
//!
//! Cost known after the response: a peek is the decision with nothing
//! stored; a charge stores `n` whatever the windows hold, past their counts
//! if need be, and reports the figures of now for a call of cost 1
//! ([`standing`]); a refund takes `n` back, never below an empty window.
//! Unlike GCRA, a window repays no debt at a rate: a fixed window forgets
//! it at its end however large, and the counters and the log forget it
//! within one (sliding counter: two) windows.
//!
//! A stored counter window's start never moves back. When it is later than
//! the window holding `now` (the Redis scripts with the callers' clocks,
//! one of them behind the one that wrote; or a clock stepped back), the
//! call is decided in the stored window: `start` is the stored one, its
//! counts apply in full (the sliding counter's `r` then exceeds `W` by the
//! lag, and `prev` weighs in full), and the reset and retry run to that
//! window's end on the caller's clock, longer than a window by the lag.
//!
//! Costs above a window's count are refused before any store is asked (see
//! [`Limiter`]), so `n ≤ count` in every algorithm.
//!
//! [`Limiter`]: crate::Limiter

use std::time::Duration;

use super::MAX_LIMITS_PER_POLICY;
use crate::decision::Decision;

/// One window: its length in microseconds and the cost it admits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Window {
    pub(crate) length: u64,
    pub(crate) count: u64,
}

/// What one window says about a call. When it admits, `remaining` and
/// `reset` are those after the call; when it denies, those of now.
/// `before` is (remaining, reset) of now either way: what an admitting
/// window reports when another window denies the call, which then charges
/// nothing.
#[derive(Clone, Copy, Debug)]
pub(super) struct Verdict {
    pub(super) admits: bool,
    pub(super) remaining: u64,
    pub(super) reset: u64,
    pub(super) retry: u64,
    pub(super) before: (u64, u64),
}

/// All windows together: the decision, naming the window that decided and,
/// for several windows, reporting each.
pub(super) fn combine(windows: &[Window], verdicts: &[Verdict]) -> Decision {
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
        blocked: false,
    }
}

/// The figures of now, from the verdicts on a call of cost 1: when every
/// window admits it, each window's remaining and reset before the call
/// (what is left: the call is not made); when one denies it, the denial,
/// whose figures are those of now already, with the retry of a call of
/// cost 1. A window's remaining before a call of cost 1 is its remaining
/// after it plus one under every algorithm, so the deciding window is the
/// same.
pub(super) fn standing(windows: &[Window], verdicts: &mut [Verdict]) -> Decision {
    if verdicts.iter().all(|v| v.admits) {
        for v in verdicts.iter_mut() {
            (v.remaining, v.reset) = v.before;
        }
    }
    combine(windows, verdicts)
}

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
    pub(super) fn window_at(&self, now: u64, length: u64) -> u64 {
        (now / length * length).max(self.start)
    }

    /// (current, previous) cost for the fixed window starting at `start`.
    pub(super) fn counts(&self, start: u64, length: u64) -> (u64, u64) {
        if self.start == start {
            (self.count, self.prev)
        } else if start.checked_sub(length) == Some(self.start) {
            (0, self.count)
        } else {
            (0, 0)
        }
    }
}

/// The most a counter of the counter algorithms holds: charges
/// ([`charge`]) saturate there, so that every count stays exact in the Lua
/// scripts' doubles (a check never gets near it: a count is at most one
/// per microsecond of a window of at most 2^50 µs).
pub(crate) const MAX_COUNTED: u64 = 1 << 50;

/// What each window says about a call, one per window of the policy (the
/// entries past its windows mean nothing).
pub(super) type Verdicts = [Verdict; MAX_LIMITS_PER_POLICY];

/// Verdicts to fill in, one per window.
pub(super) const EMPTY: Verdicts = [Verdict {
    admits: true,
    remaining: 0,
    reset: 0,
    retry: 0,
    before: (0, 0),
}; MAX_LIMITS_PER_POLICY];

/// A check from its two steps: `verdicts` on the call, then, when every
/// window admits it, `store` of it, which says from when the state means
/// nothing. Returns the decision and, when admitted, that time.
pub(super) fn admit(
    windows: &[Window],
    verdicts: &Verdicts,
    store: impl FnOnce() -> u64,
) -> (Decision, Option<u64>) {
    let decision = combine(windows, &verdicts[..windows.len()]);
    if !decision.allowed {
        return (decision, None);
    }
    (decision, Some(store()))
}

/// A charge's answer: the figures of now ([`standing`]) from the verdicts
/// on a call of cost 1 on the charged state, and from when that state
/// means nothing.
pub(super) fn charged(windows: &[Window], mut verdicts: Verdicts, idle_at: u64) -> (Decision, u64) {
    (standing(windows, &mut verdicts[..windows.len()]), idle_at)
}

/// The counter algorithms' refund: the count of the window a call now is
/// decided in goes down by `cost`, not below 0, in every window; a count
/// of a window that has ended is left. Returns how much was given back.
pub(super) fn refund_counts(
    windows: &[Window],
    counters: &mut [Counter],
    now: u64,
    cost: u64,
) -> u64 {
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

#[cfg(test)]
pub(super) mod tests {
    use std::collections::VecDeque;

    use super::*;
    use crate::algorithm::{fixed_window, sliding_log, sliding_window};

    pub(crate) const S: u64 = 1_000_000;

    pub(crate) fn w(count: u64, secs: u64) -> Window {
        Window {
            length: secs * S,
            count,
        }
    }

    /// Waiting the retry a denial gives is enough, and a microsecond less
    /// is not (the sliding counter's doubles included, in these cases).
    #[test]
    fn retry_after_is_when_the_call_passes() {
        type Decide = fn(&[Window], &mut [Counter], u64, u64) -> (Decision, Option<u64>);
        let mut denials = 0;
        for decide in [fixed_window::check as Decide, sliding_window::check] {
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
        assert!(fixed_window::check(&windows, &mut c, 20 * S, 2).0.allowed);
        let (d, _) = fixed_window::check(&windows, &mut c, 20 * S - 1, 1);
        assert!(!d.allowed);
        assert_eq!(d.retry_after(), Some(Duration::from_micros(10 * S + 1)));
        assert_eq!(c[0].start, 20 * S);

        let mut c = [Counter::default()];
        assert!(sliding_window::check(&windows, &mut c, 20 * S, 2).0.allowed);
        let (d, _) = sliding_window::check(&windows, &mut c, 20 * S - 1, 1);
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
    fn a_charge_within_the_quota_says_what_is_left() {
        let windows = [w(10, 10)];
        let decisions = [
            sliding_log::charge(&windows, &mut VecDeque::new(), 3 * S, 4).0,
            fixed_window::charge(&windows, &mut [Counter::default()], 3 * S, 4).0,
            sliding_window::charge(&windows, &mut [Counter::default()], 3 * S, 4).0,
        ];
        for d in decisions {
            assert!(d.allowed, "{d:?}");
            assert_eq!(d.remaining, 6, "{d:?}");
            assert_eq!(d.retry_us, None, "{d:?}");
        }
    }
}
