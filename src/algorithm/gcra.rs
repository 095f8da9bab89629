//! GCRA (the generic cell rate algorithm) over one or more limits at once.
//!
//! This is the one definition of the algorithm, for every operation:
//! [`check`], [`peek`], [`charge`], [`refund`] and [`defer`], each a pure
//! function of (state, now, parameters). [`MemoryStore`] runs them on its
//! state; `lua/gcra.lua` transcribes them function by function for Redis.
//! Both stores run through the same conformance suite.
//!
//! State per limit is one number, the theoretical arrival time (TAT), in
//! microseconds. With emission interval `T`, tolerance `τ = burst·T` and cost
//! `n`:
//!
//! ```text
//! tat      = max(stored, now)
//! new_tat  = tat + n·T
//! allow_at = new_tat − τ
//! allowed  ⇔ allow_at ≤ now + max_wait      (max_wait = 0 outside reserve mode)
//! ```
//!
//! All limits must allow, or nothing is stored. Costs above a limit's burst
//! are refused before any store is asked (see [`Limiter`]), so `n·T ≤ τ` and
//! no sum here can overflow.
//!
//! Cost known after the response ([`charge`], [`refund`]; a [`peek`] is
//! [`check`] with nothing stored):
//!
//! ```text
//! charge   tat = min(max(stored, now) + n·T, now + τ + D)   no test, no
//!          cap at τ; never below stored; D = max(16·P, 1 h)
//! refund   tat = max(now, tat − n·T)   where tat > now     never below now
//! ```
//!
//! A charge may leave `tat > now + τ`: a debt of `(tat − now − τ)/T` units,
//! at most what the limit refills in `D`, 16 periods `P` of its rate or an
//! hour if longer, so that even a huge charge holds an identity back for
//! `D` at most and its key lives no longer than `τ + D`.
//! A call of cost 1 passes again from `tat + T − τ` on, so the debt is
//! repaid at exactly the limit's rate, one unit per `T`, and the identity
//! then gets one call per `T` until it is idle long enough to rebuild its
//! burst: a debt is the same state as a burst spent early, further out.
//! The key lives until its TAT has passed, so its TTL covers the debt. A
//! refund never moves the TAT before now, so it never gives more than a
//! fresh state (the full burst): a refund for a call charged long ago,
//! whose cost has already refilled, gives nothing.
//!
//! [`MemoryStore`]: crate::MemoryStore
//! [`Limiter`]: crate::Limiter

use super::MAX_LIMITS_PER_POLICY;
use crate::decision::Decision;

/// The parameters of one limit, in microseconds.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Params {
    pub(crate) emission: u64,
    pub(crate) tolerance: u64,
}

/// Anything holding a limit's parameters: [`Params`], or a policy's
/// [`Limit`](crate::Limit)s read in place, so that deciding copies nothing.
pub(crate) trait AsParams {
    fn params(&self) -> Params;

    /// The furthest past now a [`charge`] may move the TAT, in
    /// microseconds: [`MAX_DEBT`] for bare parameters.
    fn debt_horizon(&self) -> u64 {
        MAX_DEBT
    }
}

impl AsParams for Params {
    fn params(&self) -> Params {
        *self
    }
}

/// How far past now a charge may move the TAT of a limit of tolerance
/// `tolerance` whose rate's period is `period` (both in microseconds): the
/// tolerance and [`DEBT_PERIODS`] periods, or [an hour](MIN_DEBT_US) if
/// that is longer, so that a debt is at most what the limit refills in
/// that time (the same for `per_second(1000)` as for `per_minute(60_000)`
/// below an hour). Both stores' charges cut at it.
pub(crate) fn debt_horizon(tolerance: u64, period: u64) -> u64 {
    let debt = period.saturating_mul(DEBT_PERIODS).max(MIN_DEBT_US);
    tolerance.saturating_add(debt).min(MAX_DEBT)
}

/// Decides one call against every limit. `tats[i]` is the stored TAT of
/// limit `i` (0 when absent) and is overwritten with the new TAT when the
/// call is admitted. Returns the decision and, when admitted, the time at
/// which the state becomes idle again (the largest new TAT).
#[inline(always)]
pub(crate) fn check<P: AsParams>(
    params: &[P],
    tats: &mut [u64],
    now: u64,
    cost: u64,
    max_wait: u64,
) -> (Decision, Option<u64>) {
    debug_assert_eq!(params.len(), tats.len());
    // Denied: the limit with the longest retry. Allowed: the limit with the
    // least remaining.
    let mut worst: Option<(usize, u64)> = None;
    let mut tightest = (0usize, u64::MAX);
    let mut wait = 0u64;
    for (i, (p, &stored)) in params.iter().zip(tats.iter()).enumerate() {
        let p = p.params();
        let tat = stored.max(now);
        let new_tat = tat.saturating_add(cost.saturating_mul(p.emission));
        // `allow_at = new_tat − τ` may lie before time zero of a young
        // clock: compare `new_tat` with `now + τ` instead of subtracting.
        let horizon = now.saturating_add(p.tolerance);
        if new_tat > horizon {
            let delay = new_tat - horizon;
            if delay > max_wait {
                if worst.is_none_or(|(_, d)| delay > d) {
                    worst = Some((i, delay));
                }
                continue;
            }
            wait = wait.max(delay);
            if tightest.1 > 0 {
                tightest = (i, 0);
            }
        } else {
            let remaining = (horizon - new_tat) / p.emission;
            if remaining < tightest.1 {
                tightest = (i, remaining);
            }
        }
    }
    if let Some((i, retry)) = worst {
        let p = params[i].params();
        let tat = tats[i].max(now);
        // Whole calls of cost 1 that would pass now.
        let remaining = now.saturating_add(p.tolerance).saturating_sub(tat) / p.emission;
        let decision = Decision {
            allowed: false,
            limit: i,
            remaining,
            reset_us: tat - now,
            retry_us: Some(retry),
            wait_us: 0,
            each: None,
            blocked: false,
        };
        return (decision, None);
    }
    let mut idle_at = now;
    for (p, tat) in params.iter().zip(tats.iter_mut()) {
        *tat = (*tat)
            .max(now)
            .saturating_add(cost.saturating_mul(p.params().emission));
        idle_at = idle_at.max(*tat);
    }
    let (i, remaining) = tightest;
    let decision = Decision {
        allowed: true,
        limit: i,
        remaining,
        reset_us: tats[i] - now,
        retry_us: None,
        wait_us: wait,
        each: None,
        blocked: false,
    };
    (decision, Some(idle_at))
}

/// What [`check`] would answer for a call of `cost` now, storing nothing:
/// its decision on a copy of the TATs. A denied check stores nothing
/// either, so a peek's denial is exactly the check's.
pub(crate) fn peek<P: AsParams>(params: &[P], tats: &[u64], now: u64, cost: u64) -> Decision {
    let mut copy = [0u64; MAX_LIMITS_PER_POLICY];
    let copy = &mut copy[..tats.len()];
    copy.copy_from_slice(tats);
    check(params, copy, now, cost, 0).0
}

/// The furthest any charge moves a TAT past now: 2^50 µs (about 35
/// years), so that every stored time stays exact in the Lua scripts'
/// doubles. A limit's own horizon, `τ + D`, is at most this.
pub(crate) const MAX_DEBT: u64 = 1 << 50;

/// How many periods of its rate a limit's debt may reach past its burst:
/// enough that honest costs in flight together are charged in full (each
/// was admitted while the budget lasted), few enough that one absurd
/// charge (a response claiming 2^64 tokens) locks its identity out for
/// minutes or hours, not decades, and its key expires with it.
pub(crate) const DEBT_PERIODS: u64 = 16;

/// The least debt a limit may reach past its burst, whatever its period:
/// an hour, so that a budget written per second holds costs as large as
/// one written per minute.
pub(crate) const MIN_DEBT_US: u64 = 3_600_000_000;

/// Cost after the fact: takes `cost` from every limit unconditionally,
/// with no admission test and no cap at the burst, and returns the figures
/// of now for a call of cost 1 with the time at which the state becomes
/// idle again. `lua/gcra_charge.lua` transcribes this.
///
/// ```text
/// tat = max(stored, min(max(stored, now) + n·T, now + τ + D))   D = max(16·P, 1 h)
/// ```
///
/// The cut bounds a debt to what the limit refills in [`DEBT_PERIODS`]
/// periods `P` of its rate, or in [an hour](MIN_DEBT_US) if that is
/// longer: a charge, however large, holds the identity back that long at
/// most, and its state lives `τ + D` at most.
///
/// A charge may take a limit into debt: its TAT then lies more than the
/// tolerance `τ` past now, and a call of cost 1 passes again from
/// `tat + T − τ` on. The debt is repaid at exactly the limit's rate: every
/// `T` that passes brings that moment one unit of cost nearer, as for any
/// other TAT, so a debt of `d` units past a spent burst is repaid in `d·T`.
///
/// The figures are those of now, after the charge: when a call of cost 1
/// would pass, `allowed`, the limit with the least room, and its remaining
/// (whole calls of cost 1 that would pass now: what is left) and reset
/// (until it is back to its full burst); when it would not, the limit
/// whose next call comes last, with remaining 0 and the retry of that
/// call.
pub(crate) fn charge<P: AsParams>(
    params: &[P],
    tats: &mut [u64],
    now: u64,
    cost: u64,
) -> (Decision, u64) {
    debug_assert_eq!(params.len(), tats.len());
    let mut idle_at = now;
    for (limit, tat) in params.iter().zip(tats.iter_mut()) {
        let (p, horizon) = (limit.params(), limit.debt_horizon());
        let charged = (*tat)
            .max(now)
            .saturating_add(cost.saturating_mul(p.emission));
        // Never back: a TAT past the horizon (a policy since shortened)
        // stays where it is.
        *tat = charged.min(now.saturating_add(horizon)).max(*tat);
        idle_at = idle_at.max(*tat);
    }
    // The figures of now for a call of cost 1: denied, the limit with the
    // longest retry; allowed, the limit with the least remaining.
    let mut worst: Option<(usize, u64)> = None;
    let mut tightest = (0usize, u64::MAX);
    for (i, (p, &tat)) in params.iter().zip(tats.iter()).enumerate() {
        let p = p.params();
        let next = tat.saturating_add(p.emission);
        let horizon = now.saturating_add(p.tolerance);
        if next > horizon {
            let retry = next - horizon;
            if worst.is_none_or(|(_, r)| retry > r) {
                worst = Some((i, retry));
            }
        } else {
            let remaining = (horizon - tat) / p.emission;
            if remaining < tightest.1 {
                tightest = (i, remaining);
            }
        }
    }
    let decision = match worst {
        Some((i, retry)) => Decision {
            allowed: false,
            limit: i,
            remaining: 0,
            reset_us: tats[i] - now,
            retry_us: Some(retry),
            wait_us: 0,
            each: None,
            blocked: false,
        },
        None => Decision {
            allowed: true,
            limit: tightest.0,
            remaining: tightest.1,
            reset_us: tats[tightest.0] - now,
            retry_us: None,
            wait_us: 0,
            each: None,
            blocked: false,
        },
    };
    (decision, idle_at)
}

/// Gives `cost` back to every limit: `tat = max(now, tat − n·T)` where
/// `tat > now`, and nothing where the limit is already full. Never below
/// now, so a refund never gives more than a fresh state has (the full
/// burst). Returns whether any TAT moved. `lua/gcra_refund.lua`
/// transcribes this.
pub(crate) fn refund<P: AsParams>(params: &[P], tats: &mut [u64], now: u64, cost: u64) -> bool {
    debug_assert_eq!(params.len(), tats.len());
    let mut moved = false;
    for (p, tat) in params.iter().zip(tats.iter_mut()) {
        if *tat > now {
            let back = cost.saturating_mul(p.params().emission);
            *tat = tat.saturating_sub(back).max(now);
            moved = true;
        }
    }
    moved
}

/// Upstream feedback: holds every limit back so that at most `remaining`
/// calls of cost 1 are admitted before `now + pause` (none when
/// `remaining` is 0: the next call comes no earlier than `now + pause`),
/// and returns the time at which the state becomes idle again.
///
/// From a TAT `tat₀`, the `k`-th call of cost 1 passes from
/// `tat₀ + k·T − τ` on, so the calls admitted before `now + pause` number
/// `#{k ≥ 1 : tat₀ + k·T − τ < now + pause}`, which is at most `remaining`
/// exactly when `tat₀ ≥ now + pause + τ − (remaining + 1)·T`.
///
/// The upstream counts the calls it has seen, not those the fleet has
/// admitted and not yet made: slots reserved since the last hold that lie
/// after the report was written. The report is `age` old: it left the
/// upstream no earlier than the call it answers was sent, and slots that
/// came due since then (calls sent while the response travelled, or while
/// a loaded machine got round to recording it) may be missing from it, so
/// they count as not yet made. `holds[i]` is the TAT the last hold that
/// moved limit `i` left (0 when none); the TAT's advance past both it and
/// `now − age + τ`, `pending = tat − max(now − age + τ, hold)`, is those
/// slots, and with
/// `remaining > 0` the floor is raised by it, so that they count against
/// what is left, and the hold set to the new TAT. With `remaining` 0 they
/// cannot be helped (the floor holds back only the calls after them) and
/// stay pending: the hold is set that far before the new TAT, so that the
/// next report counts them. Each TAT is raised to the floor, never
/// lowered.
///
/// With `remaining` 0 this is a pause: after it the limit resumes at its
/// rate, one call at a time, not with a full burst, so that an upstream
/// that has just asked for a pause is not then hit by the whole fleet at
/// once. `lua/gcra_defer.lua` transcribes this, in doubles: the arithmetic
/// here is signed and unclamped to match it.
pub(crate) fn defer<P: AsParams>(
    params: &[P],
    tats: &mut [u64],
    holds: &mut [u64],
    now: u64,
    pause: u64,
    remaining: u64,
    age: u64,
) -> u64 {
    debug_assert_eq!(params.len(), tats.len());
    debug_assert_eq!(params.len(), holds.len());
    let until = now.saturating_add(pause);
    let mut idle_at = now;
    for ((p, tat), hold) in params.iter().zip(tats.iter_mut()).zip(holds.iter_mut()) {
        let p = p.params();
        let mut floor = hold_floor(p, until, remaining);
        let base = now
            .saturating_sub(age)
            .saturating_add(p.tolerance)
            .max(*hold);
        let pending = i128::from(tat.saturating_sub(base));
        // With some left, the pending slots count against it and are
        // settled: the new hold is the new TAT. With none left they are
        // not in the floor, and stay pending for the next report.
        let settled = if remaining > 0 {
            floor += pending;
            0
        } else {
            pending
        };
        if floor > i128::from(now) && floor > i128::from(*tat) {
            *tat = u64::try_from(floor).unwrap_or(u64::MAX);
            *hold = u64::try_from(floor - settled).unwrap_or(0);
        }
        idle_at = idle_at.max(*tat);
    }
    idle_at
}

/// `until + τ − (remaining + 1)·T`, signed: the lowest TAT that admits at
/// most `remaining` calls of cost 1 before `until`.
pub(crate) fn hold_floor(p: Params, until: u64, remaining: u64) -> i128 {
    let credit = (i128::from(remaining) + 1) * i128::from(p.emission);
    i128::from(until) + i128::from(p.tolerance) - credit
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const S: u64 = 1_000_000;

    fn one(emission: u64, burst: u64) -> [Params; 1] {
        [Params {
            emission,
            tolerance: emission * burst,
        }]
    }

    #[test]
    fn burst_then_rate() {
        let p = one(S, 3);
        let mut tat = [0];
        let now = 100 * S;
        for expected_remaining in [2, 1, 0] {
            let (d, _) = check(&p, &mut tat, now, 1, 0);
            assert!(d.allowed);
            assert_eq!(d.remaining, expected_remaining);
        }
        let (d, _) = check(&p, &mut tat, now, 1, 0);
        assert!(!d.allowed);
        assert_eq!(d.retry_after(), Some(Duration::from_secs(1)));
        // Exactly on time passes.
        let (d, _) = check(&p, &mut tat, now + S, 1, 0);
        assert!(d.allowed);
    }

    #[test]
    fn young_clock_counts_remaining_exactly() {
        // now < τ: allow_at would be negative.
        let p = one(S, 3);
        let mut tat = [0];
        let (d, _) = check(&p, &mut tat, S / 2, 1, 0);
        assert!(d.allowed);
        assert_eq!(d.remaining, 2);
    }

    #[test]
    fn reserve_mode_waits() {
        let p = one(S, 1);
        let mut tat = [0];
        let (d, _) = check(&p, &mut tat, 10 * S, 1, 0);
        assert!(d.allowed);
        let (d, _) = check(&p, &mut tat, 10 * S, 1, 5 * S);
        assert!(d.allowed);
        assert_eq!(d.wait(), Duration::from_secs(1));
        let (d, _) = check(&p, &mut tat, 10 * S, 1, 5 * S);
        assert_eq!(d.wait(), Duration::from_secs(2));
    }

    #[test]
    fn defer_holds_the_next_slot_back_then_resumes_at_the_rate() {
        // Burst 3 at 1/s, untouched: a pause of 5 s, then one call at a time.
        let p = [Params {
            emission: S,
            tolerance: 3 * S,
        }];
        let mut tat = [0];
        let now = 100 * S;
        let idle = defer(&p, &mut tat, &mut [0], now, 5 * S, 0, 0);
        assert_eq!(idle, now + 7 * S);
        let (d, _) = check(&p, &mut tat, now + 5 * S - 1, 1, 0);
        assert!(!d.allowed);
        assert_eq!(d.retry_after(), Some(Duration::from_micros(1)));
        let (d, _) = check(&p, &mut tat, now + 5 * S, 1, 0);
        assert!(d.allowed);
        let (d, _) = check(&p, &mut tat, now + 5 * S, 1, 0);
        assert!(!d.allowed, "no burst right after a pause");
        // A state already further out is left alone.
        let before = tat;
        defer(&p, &mut tat, &mut [0], now, S, 0, 0);
        assert_eq!(tat, before);
    }

    #[test]
    fn defer_saturates() {
        let p = [Params {
            emission: S,
            tolerance: S,
        }];
        let mut tat = [0];
        // The pause saturates at the end of time; the TAT is clamped there.
        let idle = defer(&p, &mut tat, &mut [0], u64::MAX - 1, u64::MAX, 0, 0);
        assert_eq!(tat, [u64::MAX]);
        assert_eq!(idle, u64::MAX);
        // Any remaining, however large, never wraps.
        let mut tat = [0];
        let mut hold = [u64::MAX];
        let idle = defer(&p, &mut tat, &mut hold, u64::MAX - 1, u64::MAX, u64::MAX, 0);
        assert_eq!((tat, idle), ([0], u64::MAX - 1));
    }

    /// "R calls left until S": from any state, whatever calls come, at
    /// most R are admitted before S; the (R+1)-th exactly at S, when the
    /// floor binds.
    #[test]
    fn at_most_remaining_before_the_reset() {
        for (burst, remaining, reset) in [(1, 0, 5), (3, 2, 5), (5, 2, 10), (2, 9, 4), (10, 3, 2)] {
            let p = [Params {
                emission: S,
                tolerance: burst * S,
            }];
            let now = 100 * S;
            let mut tat = [0];
            defer(&p, &mut tat, &mut [0], now, reset * S, remaining, 0);
            let mut admitted = 0;
            let mut t = now;
            while t < now + reset * S {
                if check(&p, &mut tat, t, 1, 0).0.allowed {
                    admitted += 1;
                } else {
                    t += S / 10;
                }
            }
            let bound = remaining.min(burst + reset - 1);
            assert!(admitted <= remaining, "{admitted} > {remaining}");
            // The local limit alone would have admitted more: the floor
            // binds, and admits exactly the remaining calls.
            if burst + reset - 1 > remaining {
                assert_eq!(admitted, bound, "burst {burst} remaining {remaining}");
                assert!(check(&p, &mut tat, now + reset * S, 1, 0).0.allowed);
            }
        }
        // Plenty left: nothing is stored.
        let p = [Params {
            emission: S,
            tolerance: S,
        }];
        let mut tat = [0];
        assert_eq!(defer(&p, &mut tat, &mut [0], 100 * S, 2 * S, 5, 0), 100 * S);
        assert_eq!(tat, [0]);
    }

    /// A report recorded late: the upstream answered call A, then call B
    /// went out (its slot came due) before the report reached the store.
    /// The report has not seen B, and B is no longer in the future: only
    /// the report's age tells that B may be missing from it.
    #[test]
    fn slots_due_since_the_report_was_written_count_against_it() {
        let ms = S / 1_000;
        // 100 calls a second, one at a time; the upstream allows 5 until
        // 1 s from the start, and has seen none.
        let p = [Params {
            emission: 10 * ms,
            tolerance: 10 * ms,
        }];
        let start = 100 * S;
        let reset = start + S;
        let admitted_before_reset = |age_known: bool| {
            let mut tat = [0];
            let mut hold = [0];
            let mut slots = Vec::new();
            for _ in 0..3 {
                let (d, _) = check(&p, &mut tat, start, 1, u64::MAX);
                slots.push(start + d.wait_us);
            }
            let (a, b) = (slots[0], slots[1]);
            assert!(a < b, "{slots:?}");
            // A's answer: 4 left. Recorded 1 ms after B was sent.
            let now = b + ms;
            let age = if age_known { now - a } else { 0 };
            defer(&p, &mut tat, &mut hold, now, reset - now, 4, age);
            loop {
                let (d, _) = check(&p, &mut tat, now, 1, u64::MAX);
                let slot = now + d.wait_us;
                if slot >= reset {
                    return slots.len();
                }
                slots.push(slot);
            }
        };
        assert_eq!(admitted_before_reset(true), 5);
        // Taken as written when recorded, the report lets B (and C, due
        // less than a slot after the recording) through on top of the 4.
        assert!(admitted_before_reset(false) > 5);
    }

    #[test]
    fn a_charge_goes_into_debt_and_is_repaid_at_the_rate() {
        // 1/s, burst 3: a charge of 5 leaves a debt of 2 past the burst.
        let p = one(S, 3);
        let mut tat = [0];
        let now = 100 * S;
        let (d, idle) = charge(&p, &mut tat, now, 5);
        assert_eq!(tat, [now + 5 * S]);
        assert_eq!(idle, now + 5 * S);
        assert!(!d.allowed);
        assert_eq!(d.remaining, 0);
        assert_eq!(d.reset(), Duration::from_secs(5));
        // The next call of cost 1 passes once 2 + 1 units have refilled.
        assert_eq!(d.retry_after(), Some(Duration::from_secs(3)));
        let (d, _) = check(&p, &mut tat, now + 3 * S - 1, 1, 0);
        assert!(!d.allowed);
        assert_eq!(d.retry_after(), Some(Duration::from_micros(1)));
        let (d, _) = check(&p, &mut tat, now + 3 * S, 1, 0);
        assert!(d.allowed);
    }

    #[test]
    fn a_charge_within_the_burst_says_what_is_left() {
        let p = one(S, 10);
        let mut tat = [0];
        let (d, _) = charge(&p, &mut tat, 100 * S, 4);
        assert!(d.allowed);
        assert_eq!(d.remaining, 6);
        assert_eq!(d.reset(), Duration::from_secs(4));
        assert_eq!(d.retry_after(), None);
        // Exactly spent: nothing left, the next call in one interval.
        let (d, _) = charge(&p, &mut tat, 100 * S, 6);
        assert!(!d.allowed);
        assert_eq!(d.remaining, 0);
        assert_eq!(d.retry_after(), Some(Duration::from_secs(1)));
    }

    #[test]
    fn a_debt_is_capped_and_saturates() {
        let p = one(S, 1);
        let mut tat = [0];
        let (_, idle) = charge(&p, &mut tat, 100 * S, u64::MAX);
        assert_eq!(tat, [100 * S + MAX_DEBT]);
        assert_eq!(idle, 100 * S + MAX_DEBT);
        charge(&p, &mut tat, 100 * S, 7);
        assert_eq!(tat, [100 * S + MAX_DEBT]);
    }

    #[test]
    fn a_limits_debt_is_cut_at_16_periods_or_an_hour_and_never_moves_back() {
        /// A limit's parameters with its own horizon, as a policy's limit
        /// gives them.
        struct Horizoned(Params, u64);
        impl AsParams for Horizoned {
            fn params(&self) -> Params {
                self.0
            }
            fn debt_horizon(&self) -> u64 {
                self.1
            }
        }
        let limit = |count: u64, period: u64| {
            let emission = period / count;
            let tolerance = emission * count;
            [Horizoned(
                Params {
                    emission,
                    tolerance,
                },
                debt_horizon(tolerance, period),
            )]
        };
        // 1000 a minute, burst 1000: τ = 60 s; 16 periods are less than
        // the hour.
        let per_minute = limit(1000, 60 * S);
        let mut tat = [0];
        let (d, idle) = charge(&per_minute, &mut tat, 100 * S, u64::MAX);
        assert_eq!(tat, [(100 + 60 + 3600) * S]);
        assert_eq!(idle, tat[0]);
        // A call of cost 1 passes again an hour (and one token) later.
        assert_eq!(
            d.retry_after(),
            Some(Duration::from_micros(3600 * S + 60_000))
        );
        // A TAT already past the horizon is left where it is.
        let mut tat = [5000 * S];
        charge(&per_minute, &mut tat, 100 * S, 1);
        assert_eq!(tat, [5000 * S]);
        // 10 an hour, burst 10: 16 hours, past the hour.
        let per_hour = limit(10, 3600 * S);
        let mut tat = [0];
        charge(&per_hour, &mut tat, 100 * S, u64::MAX);
        assert_eq!(tat, [(100 + 3600 + 16 * 3600) * S]);
    }

    #[test]
    fn a_refund_never_gives_more_than_a_fresh_state() {
        let p = one(S, 3);
        let mut tat = [0];
        let now = 100 * S;
        assert!(!refund(&p, &mut tat, now, 5), "nothing to give back");
        assert_eq!(tat, [0]);
        check(&p, &mut tat, now, 2, 0);
        assert!(refund(&p, &mut tat, now, 1));
        assert_eq!(tat, [now + S]);
        assert!(refund(&p, &mut tat, now, 1_000));
        assert_eq!(tat, [now]);
        // A full burst, and no more.
        for _ in 0..3 {
            assert!(check(&p, &mut tat, now, 1, 0).0.allowed);
        }
        assert!(!check(&p, &mut tat, now, 1, 0).0.allowed);
    }
}
