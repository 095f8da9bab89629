//! [`Limiter`]: a policy bound to a store, callable from any code.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::decision::Decision;
use crate::error::ConfigError;
use crate::hot::{HotKeys, HotTable};
use crate::key::Key;
use crate::policy::{MAX_TOLERANCE_MICROS, Policy};
use crate::rules::{Cell, Rules};
use crate::store::{self, MemoryStore, Op, Store, StoreFuture};

/// A [`Policy`] bound to a [`Store`]: the part of every layer that decides.
///
/// Usable on its own, outside tower:
///
/// ```
/// use fleetgate::{Key, Limit, Limiter, MemoryStore, Policy, Rate};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let policy = Policy::single("login", Limit::builder(Rate::per_minute(5)).burst(3).build()?)?;
/// let limiter = Limiter::new(policy, MemoryStore::new());
/// let who = Key::new("user:42");
/// for _ in 0..3 {
///     assert!(limiter.check(&who, 1).await?.is_allowed());
/// }
/// let denied = limiter.check(&who, 1).await?;
/// assert!(!denied.is_allowed());
/// assert!(denied.retry_after().is_some());
/// # Ok(()) }
/// ```
///
/// The policy is live: [`set_policy`](Self::set_policy) replaces it for
/// every clone of the limiter (and every layer built on it) from the next
/// decision on. For limits changed across a fleet, per-identity limits and
/// plans, see [`LivePolicies`](crate::live::LivePolicies).
#[derive(Clone)]
pub struct Limiter {
    cell: Arc<Cell>,
    store: Arc<dyn Store>,
    /// Hot-key mode's table, when set ([`Limiter::hot_keys`]).
    pub(crate) hot: Option<Arc<HotTable>>,
}

impl Limiter {
    /// Binds `policy` to `store`.
    pub fn new(policy: Policy, store: impl IntoStore) -> Self {
        Limiter::from_cell(Arc::new(Cell::new(policy)), store.into_store())
    }

    pub(crate) fn from_cell(cell: Arc<Cell>, store: Arc<dyn Store>) -> Self {
        Limiter {
            cell,
            store,
            hot: None,
        }
    }

    #[doc = include_str!("docs/limiter/hot_keys.md")]
    pub fn hot_keys(mut self, hot: HotKeys) -> Result<Self, ConfigError> {
        hot.check(&self.policy())?;
        self.hot = Some(Arc::new(HotTable::new(hot, Arc::clone(&self.store))));
        Ok(self)
    }

    /// A limiter of `policy` on this one's store, sharing its hot keys:
    /// what a layer decides each of its policies with.
    pub(crate) fn bound_to(&self, policy: Policy) -> Limiter {
        Limiter {
            cell: Arc::new(Cell::new(policy)),
            store: Arc::clone(&self.store),
            hot: self.hot.clone(),
        }
    }

    pub(crate) fn cell(&self) -> &Arc<Cell> {
        &self.cell
    }

    /// Binds `policy` to a fresh [`MemoryStore`].
    pub fn in_memory(policy: Policy) -> Self {
        Limiter::new(policy, MemoryStore::new())
    }

    /// The policy (of every identity without limits of its own), as it is
    /// now.
    pub fn policy(&self) -> Policy {
        self.cell.rules().base.clone()
    }

    /// The policy's name, which never changes.
    pub(crate) fn name(&self) -> &str {
        self.cell.name()
    }

    #[doc = include_str!("docs/limiter/set_policy.md")]
    pub fn set_policy(&self, policy: Policy) -> Result<(), ConfigError> {
        if policy.name() != self.name() {
            return Err(ConfigError::PolicyRenamed {
                name: self.name().to_owned(),
                new: policy.name().to_owned(),
            });
        }
        let rules = self.cell.rules();
        self.cell.set(Rules {
            base: policy,
            by_key: rules.by_key.clone(),
            by_plan: rules.by_plan.clone(),
            lists: rules.lists.clone(),
        });
        Ok(())
    }

    /// The store.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// Decides one call of `cost` for `key`: one round trip to the store,
    /// none at all when the cost is above what any limit could admit.
    ///
    /// The memory store decides at once, when this is called; a store that
    /// does I/O decides when the returned future is first polled, so
    /// dropping it unpolled charges nothing there.
    pub fn check(&self, key: &Key, cost: u64) -> StoreFuture<Decision> {
        self.decide(key, cost, None)
    }

    /// [`check`](Self::check) at once, in the calling thread, when no I/O
    /// is needed: always on the [`MemoryStore`], so code without an async
    /// runtime can limit in process; on a store doing I/O (Redis), only a
    /// cost no limit could ever admit, and `None` otherwise (call `check`
    /// there). The decision is the one `check` would give, and is charged
    /// the same way, except under [`hot_keys`](Self::hot_keys): this
    /// always decides in the store, leaving leases held here untouched.
    ///
    /// ```
    /// use fleetgate::{Key, Limit, Limiter, Policy, Rate};
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let policy = Policy::single("export", Limit::builder(Rate::per_hour(2)).build()?)?;
    /// let limiter = Limiter::in_memory(policy);
    /// let who = Key::new("user:7");
    /// let first = limiter.check_now(&who, 1).ok_or("the memory store decides at once")?;
    /// assert!(first.is_allowed());
    /// # Ok(()) }
    /// ```
    pub fn check_now(&self, key: &Key, cost: u64) -> Option<Decision> {
        let rules = self.cell.rules();
        let policy = rules.resolve(key, None);
        store::decide_now(&*self.store, policy, key, cost)
    }

    /// Reserve mode: admits the call if its slot comes within `max_wait`
    /// and reports in [`Decision::wait`] how long to wait before using it.
    /// The slot is taken (and charged) at once, so callers are served in
    /// the order they reach the store. `max_wait` is capped at 2^50 µs
    /// (about 35 years), which keeps every stored time exact in Redis.
    ///
    /// Only GCRA policies can reserve: under a window algorithm this fails
    /// with [`ConfigError::ReserveNeedsGcra`](crate::ConfigError::ReserveNeedsGcra)
    /// (as [`StoreError::Config`](crate::StoreError::Config)).
    pub fn reserve(&self, key: &Key, cost: u64, max_wait: Duration) -> StoreFuture<Decision> {
        let cap = Duration::from_micros(MAX_TOLERANCE_MICROS);
        self.decide(key, cost, Some(max_wait.min(cap)))
    }

    #[doc = include_str!("docs/limiter/defer.md")]
    pub fn defer(&self, key: &Key, pause: Duration) -> StoreFuture<()> {
        let cap = Duration::from_micros(MAX_TOLERANCE_MICROS);
        let rules = self.cell.rules();
        let op = Op::Defer {
            pause: pause.min(cap),
            remaining: 0,
            age: Duration::ZERO,
        };
        store::adjust(&*self.store, rules.resolve(key, None), key, 0, op)
    }

    #[doc = include_str!("docs/limiter/align.md")]
    pub fn align(&self, key: &Key, remaining: u64, reset: Duration) -> StoreFuture<()> {
        self.align_written(key, remaining, reset, Duration::ZERO)
    }

    /// [`align`](Self::align) for a report written no earlier than `age`
    /// before now (the call it answers was sent then): slots that came due
    /// since may be missing from it, and count against `remaining`.
    pub(crate) fn align_written(
        &self,
        key: &Key,
        remaining: u64,
        reset: Duration,
        age: Duration,
    ) -> StoreFuture<()> {
        let cap = Duration::from_micros(MAX_TOLERANCE_MICROS);
        let reset = reset.min(cap);
        let rules = self.cell.rules();
        let policy = rules.resolve(key, None);
        if policy.algorithm().is_window() || !holds_back(policy, remaining, reset) {
            return StoreFuture::ready(Ok(()));
        }
        let op = Op::Defer {
            pause: reset,
            remaining,
            age,
        };
        store::adjust(&*self.store, policy, key, 0, op)
    }

    /// Decides with the policy of `key` (its own, or the base); with a
    /// `max_wait`, reserves, which only GCRA can.
    #[inline]
    fn decide(&self, key: &Key, cost: u64, max_wait: Option<Duration>) -> StoreFuture<Decision> {
        let rules = self.cell.rules();
        self.decide_as(rules.resolve(key, None), key, cost, max_wait)
    }

    /// Decides with `policy`, resolved by the caller: a layer's settings
    /// hold the policy they were chosen for, and read no rules again.
    /// `max_wait` must be capped as [`reserve`](Self::reserve) caps it.
    #[inline]
    pub(crate) fn decide_as(
        &self,
        policy: &Policy,
        key: &Key,
        cost: u64,
        max_wait: Option<Duration>,
    ) -> StoreFuture<Decision> {
        let algorithm = policy.algorithm();
        if max_wait.is_some() && algorithm.is_window() {
            return StoreFuture::ready(Err(ConfigError::ReserveNeedsGcra { algorithm }.into()));
        }
        if max_wait.is_none()
            && let Some(hot) = &self.hot
            && let Some(decided) = hot.decide(policy, key, cost, false)
        {
            return decided;
        }
        let max_wait = max_wait.unwrap_or(Duration::ZERO);
        store::decide(&*self.store, policy, key, cost, max_wait)
    }
}

/// Whether "at most `remaining` calls before `reset`" holds any limit of
/// `policy` back: whether, for some limit, the floor of
/// [`gcra::defer`](crate::algorithm::gcra::defer) lies after now, whatever now is.
fn holds_back(policy: &Policy, remaining: u64, reset: Duration) -> bool {
    let reset_us = u64::try_from(reset.as_micros()).unwrap_or(u64::MAX);
    policy.limits().iter().any(|limit| {
        let p = crate::algorithm::gcra::Params {
            emission: limit.emission_us(),
            tolerance: limit.tolerance_us(),
        };
        crate::algorithm::gcra::hold_floor(p, reset_us, remaining) > 0
    })
}

impl fmt::Debug for Limiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Limiter")
            .field("policy", &self.name())
            .field("store", &self.store)
            .finish()
    }
}

/// Anything that can serve as a limiter's store: a [`MemoryStore`], a
/// [`RedisStore`](crate::RedisStore), or an `Arc<dyn Store>` chosen at run
/// time.
pub trait IntoStore {
    /// Converts into a shared store.
    fn into_store(self) -> Arc<dyn Store>;
}

impl<S: Store> IntoStore for S {
    fn into_store(self) -> Arc<dyn Store> {
        Arc::new(self)
    }
}

impl IntoStore for Arc<dyn Store> {
    fn into_store(self) -> Arc<dyn Store> {
        self
    }
}

impl Limiter {
    #[doc = include_str!("docs/limiter/reset.md")]
    pub fn reset(&self, key: &Key) -> StoreFuture<()> {
        if let Some(hot) = &self.hot {
            // The identity starts afresh here too: tokens leased from the
            // state being cleared are dropped, not given back to it.
            hot.forget(key);
        }
        self.store.reset(self.name(), key)
    }
}

/// Cost known after the response: [`peek`](Limiter::peek),
/// [`charge`](Limiter::charge) and [`refund`](Limiter::refund). Each is one
/// atomic step on the state the decision uses (the same Redis keys), one
/// round trip on Redis within the store's timeout, under the key's policy
/// resolved as [`check`](Limiter::check) resolves it; a failure is a
/// [`StoreError`](crate::StoreError), as for a decision.
impl Limiter {
    #[doc = include_str!("docs/limiter/peek.md")]
    pub fn peek(&self, key: &Key, cost: u64) -> StoreFuture<Decision> {
        let rules = self.cell.rules();
        let policy = rules.resolve(key, None);
        if cost > policy.max_cost() {
            return StoreFuture::ready(Ok(store::never(policy)));
        }
        store::decision(&*self.store, policy, key, cost, Op::Peek)
    }

    #[doc = include_str!("docs/limiter/charge.md")]
    pub fn charge(&self, key: &Key, cost: u64) -> StoreFuture<Decision> {
        let rules = self.cell.rules();
        let policy = rules.resolve(key, None);
        if cost == 0 {
            return StoreFuture::ready(Ok(Decision {
                allowed: true,
                limit: 0,
                remaining: 0,
                reset_us: 0,
                retry_us: None,
                wait_us: 0,
                each: None,
                blocked: false,
            }));
        }
        store::decision(&*self.store, policy, key, cost, Op::Charge)
    }

    #[doc = include_str!("docs/limiter/refund.md")]
    pub fn refund(&self, key: &Key, cost: u64) -> StoreFuture<()> {
        if cost == 0 {
            return StoreFuture::ready(Ok(()));
        }
        let rules = self.cell.rules();
        let policy = rules.resolve(key, None);
        store::adjust(&*self.store, policy, key, cost, Op::Refund)
    }
}
