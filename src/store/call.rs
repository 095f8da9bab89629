//! The operations a limiter asks of its store, one [`Call`] each, and the
//! typed helpers the rest of the crate calls them through. Borrowed, so
//! that deciding in memory copies nothing; not nameable outside the crate
//! (the store's operations are sealed).

use std::time::Duration;

use super::{LeaseCall, LeaseGrant, Store, StoreFuture};
use crate::algorithm::budget;
use crate::decision::Decision;
use crate::error::StoreError;
use crate::key::Key;
use crate::policy::Policy;

/// One operation of `policy`'s algorithm for `key`: what a store runs.
#[derive(Clone, Copy, Debug)]
pub struct Call<'a> {
    pub(crate) policy: &'a Policy,
    pub(crate) key: &'a Key,
    /// The cost checked, peeked, charged or refunded (unused by a defer).
    pub(crate) cost: u64,
    pub(crate) op: Op,
}

/// What a [`Call`] does. Each is one atomic step on the key's state (one
/// round trip in Redis), defined once per algorithm in `src/algorithm/`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Op {
    /// Admits the cost and stores it, or denies it and stores nothing; in
    /// reserve mode (GCRA only) admits a call that waits at most
    /// `max_wait` for its slot.
    Check {
        /// Zero outside reserve mode.
        max_wait: Duration,
    },
    /// What a check would answer now, storing nothing.
    Peek,
    /// Takes the cost unconditionally, into debt if need be, and answers
    /// the figures of now for a call of cost 1.
    Charge,
    /// Gives the cost back, never beyond a fresh state.
    Refund,
    /// Upstream feedback: holds every GCRA limit of the policy back so
    /// that at most `remaining` calls of the key are admitted before
    /// `pause` from the store's "now" (see `gcra::defer`).
    Defer {
        pause: Duration,
        remaining: u64,
        /// How long before now the report was written, at the earliest.
        age: Duration,
    },
}

/// What a store answers a [`Call`]: a decision for a check, a peek and a
/// charge; nothing for a refund and a defer.
#[derive(Clone, Debug)]
pub enum Answer {
    Decision(Decision),
    Done,
}

impl Answer {
    /// The decision of a check, a peek or a charge.
    pub(crate) fn decision(self) -> Result<Decision, StoreError> {
        match self {
            Answer::Decision(decision) => Ok(decision),
            Answer::Done => Err(StoreError::UnexpectedReply(
                "a store answered a decision with nothing".into(),
            )),
        }
    }

    fn done(self) -> Result<(), StoreError> {
        Ok(())
    }
}

/// An operation on a key's leases (see [`LeaseCall`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeaseOp {
    Acquire,
    Release,
    Renew,
}

/// What a store answers a [`LeaseOp`]: the grant of an acquire; whether
/// the lease was held, for a release or a renewal.
#[derive(Clone, Debug)]
pub enum LeaseAnswer {
    Grant(LeaseGrant),
    Held(bool),
}

impl LeaseAnswer {
    fn grant(self) -> Result<LeaseGrant, StoreError> {
        match self {
            LeaseAnswer::Grant(grant) => Ok(grant),
            LeaseAnswer::Held(_) => Err(StoreError::UnexpectedReply(
                "a store answered a lease acquire with no grant".into(),
            )),
        }
    }

    fn held(self) -> Result<bool, StoreError> {
        match self {
            LeaseAnswer::Held(held) => Ok(held),
            LeaseAnswer::Grant(_) => Err(StoreError::UnexpectedReply(
                "a store answered a lease release or renewal with a grant".into(),
            )),
        }
    }
}

/// A retry budget's one operation (see `src/algorithm/budget.rs`):
/// report `deposits` first attempts of the budget `name` and take up to
/// `want` tokens. One round trip in Redis.
#[derive(Clone, Copy, Debug)]
pub struct BudgetCall<'a> {
    pub(crate) name: &'a str,
    pub(crate) params: budget::Params,
    pub(crate) deposits: u64,
    pub(crate) want: u64,
}

/// What a store answers a [`BudgetCall`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BudgetTake {
    /// Tokens granted, at most those wanted.
    pub(crate) granted: u64,
    /// Whole tokens the budget holds after the call.
    pub(crate) left: u64,
}

// Read by the stores that send a call's figures (Redis).
#[cfg(feature = "redis")]
impl Call<'_> {
    /// How long a checked call may wait for its slot (reserve mode).
    pub(crate) fn max_wait(&self) -> Duration {
        match self.op {
            Op::Check { max_wait } => max_wait,
            _ => Duration::ZERO,
        }
    }

    pub(crate) fn max_wait_us(&self) -> u64 {
        micros(self.max_wait())
    }
}

/// A duration in whole microseconds, saturating.
pub(crate) fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// Decides `cost` for `key` under `policy` in `store`: what a limiter's
/// check asks, and how hot-key mode takes a lease. A cost above what any
/// limit could admit is refused at once, without the store.
#[inline]
pub(crate) fn decide(
    store: &dyn Store,
    policy: &Policy,
    key: &Key,
    cost: u64,
    max_wait: Duration,
) -> StoreFuture<Decision> {
    if cost > policy.max_cost() {
        // No amount of waiting admits this: answered without the store.
        return StoreFuture::ready(Ok(never(policy)));
    }
    let op = Op::Check { max_wait };
    run(store, policy, key, cost, op).map(Answer::decision)
}

/// [`decide`] at once, without I/O: `None` from a store that cannot (any
/// Redis store).
#[inline]
pub(crate) fn decide_now(
    store: &dyn Store,
    policy: &Policy,
    key: &Key,
    cost: u64,
) -> Option<Decision> {
    if cost > policy.max_cost() {
        return Some(never(policy));
    }
    let op = Op::Check {
        max_wait: Duration::ZERO,
    };
    match store.run_now(Call {
        policy,
        key,
        cost,
        op,
    })? {
        Answer::Decision(decision) => Some(decision),
        Answer::Done => None,
    }
}

/// A peek or a charge: the store's decision.
pub(crate) fn decision(
    store: &dyn Store,
    policy: &Policy,
    key: &Key,
    cost: u64,
    op: Op,
) -> StoreFuture<Decision> {
    run(store, policy, key, cost, op).map(Answer::decision)
}

/// A refund or a defer: done once the store has answered.
pub(crate) fn adjust(
    store: &dyn Store,
    policy: &Policy,
    key: &Key,
    cost: u64,
    op: Op,
) -> StoreFuture<()> {
    run(store, policy, key, cost, op).map(Answer::done)
}

#[inline]
fn run(store: &dyn Store, policy: &Policy, key: &Key, cost: u64, op: Op) -> StoreFuture<Answer> {
    store.run(Call {
        policy,
        key,
        cost,
        op,
    })
}

/// Takes a lease (see [`LeaseCall`]).
pub(crate) fn lease_acquire(store: &dyn Store, call: LeaseCall<'_>) -> StoreFuture<LeaseGrant> {
    store.lease(call, LeaseOp::Acquire).map(LeaseAnswer::grant)
}

/// Gives a lease back, or renews it: whether it was held.
pub(crate) fn lease_held(store: &dyn Store, call: LeaseCall<'_>, op: LeaseOp) -> StoreFuture<bool> {
    store.lease(call, op).map(LeaseAnswer::held)
}

/// The refusal of a cost above what any limit could admit (no amount of
/// waiting admits it), answered without asking the store.
pub(crate) fn never(policy: &Policy) -> Decision {
    let i = policy
        .limits()
        .iter()
        .enumerate()
        .min_by_key(|(_, l)| l.burst())
        .map_or(0, |(i, _)| i);
    Decision::never(i)
}
