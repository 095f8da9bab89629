//! The calls a limiter makes of its store: borrowed, so that deciding in
//! memory copies nothing. Not nameable outside the crate: the store's
//! operations are sealed.

use std::time::Duration;

use super::{Store, StoreFuture};
use crate::decision::Decision;
use crate::key::Key;
use crate::limit::Policy;

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
    match call(policy, key, cost, max_wait) {
        Call::Never => StoreFuture::ready(Ok(never(policy))),
        Call::Gcra(call) => store.gcra(call),
        Call::Window(call) => store.window(call),
    }
}

/// One call to decide: which policy, for whom, at what cost. Borrowed, so
/// that deciding in memory copies nothing.
#[derive(Clone, Copy, Debug)]
pub struct GcraCall<'a> {
    pub(crate) policy: &'a Policy,
    pub(crate) key: &'a Key,
    pub(crate) cost: u64,
    pub(crate) max_wait: Duration,
}

impl GcraCall<'_> {
    pub(crate) fn max_wait_us(&self) -> u64 {
        u64::try_from(self.max_wait.as_micros()).unwrap_or(u64::MAX)
    }
}

/// One call to decide with a window algorithm: which policy, for whom, at
/// what cost. Borrowed, like [`GcraCall`].
#[derive(Clone, Copy, Debug)]
pub struct WindowCall<'a> {
    pub(crate) policy: &'a Policy,
    pub(crate) key: &'a Key,
    pub(crate) cost: u64,
}

impl WindowCall<'_> {
    /// The same call as an ordinary GCRA check.
    pub(crate) fn as_gcra(&self) -> GcraCall<'_> {
        GcraCall {
            policy: self.policy,
            key: self.key,
            cost: self.cost,
            max_wait: Duration::ZERO,
        }
    }
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
    match call(policy, key, cost, Duration::ZERO) {
        Call::Never => Some(never(policy)),
        Call::Gcra(call) => store.gcra_now(call),
        Call::Window(call) => store.window_now(call),
    }
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

/// What deciding `cost` for `key` under `policy` asks of the store,
/// whether it is to answer at once or with a future.
#[inline]
fn call<'a>(policy: &'a Policy, key: &'a Key, cost: u64, max_wait: Duration) -> Call<'a> {
    if cost > policy.max_cost() {
        // No amount of waiting admits this: answered without the store.
        return Call::Never;
    }
    if policy.algorithm().is_window() {
        return Call::Window(WindowCall { policy, key, cost });
    }
    Call::Gcra(GcraCall {
        policy,
        key,
        cost,
        max_wait,
    })
}

/// The store call a decision takes, if any: see [`call`].
enum Call<'a> {
    /// A cost above what any limit could admit: refused without the store.
    Never,
    Gcra(GcraCall<'a>),
    Window(WindowCall<'a>),
}
