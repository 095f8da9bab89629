//! The penalty box ([`LimitBuilder::block_for`](crate::LimitBuilder::block_for)),
//! around every algorithm: once a check or a peek is refused by a limit
//! with a block, the identity is refused by its policy until the block's
//! end, without asking the algorithm. Pure functions of (the box's value,
//! now); `lua/prelude.lua` transcribes them (`blocked`, `block`).
//!
//! A box is one number: the block's end in microseconds, rounded down to
//! a multiple of 16 (so that a block of an hour reports `Retry-After:
//! 3600`, not 3601; a block is at least a millisecond), plus the index of the limit that started it (a policy
//! holds at most 16 limits), so that each store keeps it in one value (the
//! memory store in one atomic, Redis in one string key that expires at
//! the end). 0, or an end already past, is no block.
//!
//! The end is `now + max(block, retry)`: the block, or the time the
//! refusing limit would still refuse the call, if that is longer, so that
//! `Retry-After` counts down to the first moment the call could pass.

use super::MAX_LIMITS_PER_POLICY;
use crate::decision::Decision;
use crate::policy::Policy;

/// Ends are multiples of this; the limit index fills the rest.
const SLOTS: u64 = MAX_LIMITS_PER_POLICY as u64;

/// The block a box of `value` holds at `now`: its end and limit.
pub(crate) fn held(value: u64, now: u64) -> Option<(u64, usize)> {
    let end = value - value % SLOTS;
    (end > now).then_some((end, (value % SLOTS) as usize))
}

/// The refusal of a call of `policy` while blocked until `end` by limit
/// `limit`: nothing remains of any limit until the end, which is the
/// reset and the retry. A window policy of several limits reports each
/// one so.
pub(crate) fn refusal(policy: &Policy, end: u64, limit: usize, now: u64) -> Decision {
    let left = end.saturating_sub(now);
    let n = policy.limits().len();
    let each = (policy.algorithm().is_window() && n > 1)
        .then(|| vec![(0, std::time::Duration::from_micros(left)); n].into());
    Decision {
        allowed: false,
        limit: limit.min(n.saturating_sub(1)),
        remaining: 0,
        reset_us: left,
        retry_us: Some(left),
        wait_us: 0,
        each,
        blocked: true,
    }
}

/// After `decision` of `policy` at `now` (a check's or a peek's): the box
/// to store when a limit with a block refused it, with the refusal to
/// answer instead. A cost no wait admits (no retry) starts none.
pub(crate) fn start(policy: &Policy, decision: &Decision, now: u64) -> Option<(u64, Decision)> {
    if decision.allowed || decision.blocked {
        return None;
    }
    let retry = decision.retry_us?;
    let block = policy.limits().get(decision.limit)?.block_us();
    if block == 0 {
        return None;
    }
    // The block's end rounds down (an hour says 3600 s, not 3601), but the
    // limit's own retry, when later, rounds up: a caller retrying at the
    // time it was told must not meet the limit again and start a new box.
    let by_block = now.saturating_add(block) / SLOTS * SLOTS;
    let by_retry = now
        .saturating_add(retry)
        .div_ceil(SLOTS)
        .saturating_mul(SLOTS);
    let end = by_block.max(by_retry);
    let value = end + decision.limit as u64;
    Some((value, refusal(policy, end, decision.limit, now)))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::{Limit, Rate};

    fn login() -> Policy {
        let limit = Limit::builder(Rate::new(5, Duration::from_secs(900)))
            .block_for(Duration::from_secs(3600))
            .build()
            .unwrap();
        Policy::builder("login")
            .limit(Limit::new(Rate::per_second(100)).unwrap())
            .limit(limit)
            .build()
            .unwrap()
    }

    fn denied(limit: usize, retry: u64) -> Decision {
        Decision {
            retry_us: Some(retry),
            ..Decision::never(limit)
        }
    }

    #[test]
    fn a_refusal_by_a_blocking_limit_starts_a_block() {
        let policy = login();
        let now = 1_000_000_001;
        let (value, refusal) = start(&policy, &denied(1, 180_000_000), now).unwrap();
        let (end, limit) = held(value, now).unwrap();
        assert_eq!(limit, 1);
        assert!(end <= now + 3_600_000_000 && end > now + 3_600_000_000 - SLOTS);
        assert!(refusal.is_blocked() && !refusal.is_allowed());
        assert_eq!(refusal.retry_us, Some(end - now));
        assert_eq!(refusal.reset_us, end - now);
        assert_eq!(held(value, end - 1).map(|h| h.1), Some(1));
        assert_eq!(held(value, end), None);
        assert_eq!(held(0, now), None);
        // A refusal longer than the block blocks that long, and not a
        // microsecond less.
        let (value, refusal) = start(&policy, &denied(1, 7_200_000_000), now).unwrap();
        let (end, _) = held(value, now).unwrap();
        assert!(end >= now + 7_200_000_000 && end < now + 7_200_000_000 + SLOTS);
        assert!(refusal.retry_us.unwrap() >= 7_200_000_000);
    }

    #[test]
    fn other_refusals_start_none() {
        let policy = login();
        // By a limit without a block, of a cost no wait admits, or admitted.
        assert!(start(&policy, &denied(0, 10_000), 5).is_none());
        assert!(start(&policy, &Decision::never(1), 5).is_none());
        let mut allowed = denied(1, 0);
        allowed.allowed = true;
        assert!(start(&policy, &allowed, 5).is_none());
    }
}
