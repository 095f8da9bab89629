//! [`Limiter`]: a policy bound to a store, callable from any code.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::decision::Decision;
use crate::error::ConfigError;
use crate::hot::{HotKeys, HotTable};
use crate::key::Key;
use crate::limit::{MAX_TOLERANCE_MICROS, Policy};
use crate::live::Cell;
use crate::store::{DeferCall, GcraCall, MemoryStore, Store, StoreFuture, WindowCall};

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

    /// Decides the identities that are hot on this instance from leases
    /// of their tokens, spent in process: see [`HotKeys`] for when an
    /// identity is hot, how leases are sized and the bound on what the
    /// fleet may admit beyond the limit. [`check`](Self::check) and every
    /// layer built on this limiter use it; reserve mode, charges, refunds
    /// and peeks do not. Refused for a policy on the sliding log or fixed
    /// window ([`ConfigError::HotKeysUnsupported`]), and for a zero lease
    /// time or threshold.
    ///
    /// ```
    /// use fleetgate::{ConfigError, HotKeys, Limit, Limiter, Policy, Rate};
    /// use fleetgate::Algorithm;
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let log = Policy::builder("api")
    ///     .algorithm(Algorithm::SlidingLog)
    ///     .limit(Limit::new(Rate::per_second(1000))?)
    ///     .build()?;
    /// let err = Limiter::in_memory(log).hot_keys(HotKeys::new()).unwrap_err();
    /// assert!(matches!(err, ConfigError::HotKeysUnsupported { .. }));
    /// # Ok(()) }
    /// ```
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

    /// Replaces the policy from the next decision on, for every clone of
    /// this limiter and every layer built on it. `policy` must have the
    /// same name (the name is part of every stored key).
    ///
    /// Stored state carries over: an identity's state is kept and read
    /// under the new limits (a GCRA identity that used its burst under
    /// `10/s burst 20` and is now under `10/s burst 5` waits until it is
    /// back within 5). A policy whose algorithm changes starts fresh, for
    /// each algorithm keeps its state apart; the old state expires on its
    /// own.
    ///
    /// ```
    /// use fleetgate::{Key, Limit, Limiter, Policy, Rate};
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let limiter = Limiter::in_memory(Policy::single("api", Limit::new(Rate::per_hour(1))?)?);
    /// let who = Key::new("user:1");
    /// assert!(limiter.check_now(&who, 1).ok_or("memory")?.is_allowed());
    /// assert!(!limiter.check_now(&who, 1).ok_or("memory")?.is_allowed());
    /// limiter.set_policy(Policy::single("api", Limit::builder(Rate::per_hour(1)).burst(2).build()?)?)?;
    /// assert!(limiter.check_now(&who, 1).ok_or("memory")?.is_allowed());
    /// # Ok(()) }
    /// ```
    pub fn set_policy(&self, policy: Policy) -> Result<(), ConfigError> {
        if policy.name() != self.name() {
            return Err(ConfigError::PolicyRenamed {
                name: self.name().to_owned(),
                new: policy.name().to_owned(),
            });
        }
        let rules = self.cell.rules();
        self.cell.set(crate::live::Rules {
            base: policy,
            by_key: rules.by_key.clone(),
            by_plan: rules.by_plan.clone(),
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
        match call(policy, key, cost, Duration::ZERO) {
            Call::Never => Some(never(policy)),
            Call::Gcra(call) => self.store.gcra_now(call),
            Call::Window(call) => self.store.window_now(call),
        }
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

    /// Records that the upstream asked `key` to hold off for `pause`: the
    /// key's next call (under every limit of the policy) is admitted no
    /// earlier than `pause` from now, for every instance sharing the store,
    /// and calls then resume at the policy's rate, one at a time rather
    /// than with a full burst. One round trip; a state already further out
    /// is left as it is. `pause` is capped at 2^50 µs (about 35 years).
    ///
    /// Slots already handed out by [`reserve`](Self::reserve) keep their
    /// times: the pause holds back reservations made after it is recorded.
    ///
    /// ```
    /// use std::time::Duration;
    /// use fleetgate::clock::MonotonicClock;
    /// use fleetgate::{Key, Limit, Limiter, MemoryStore, Policy, Rate};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// // Paused time, and a store on tokio's clock: time stands still.
    /// let store = MemoryStore::builder().clock(MonotonicClock::new()).build();
    /// let limiter = Limiter::new(Policy::single("api", Limit::new(Rate::per_second(10))?)?, store);
    /// let token = Key::new("token:1");
    /// // The upstream answered 429 with `Retry-After: 30`.
    /// limiter.defer(&token, Duration::from_secs(30)).await?;
    /// let d = limiter.check(&token, 1).await?;
    /// assert_eq!(d.retry_after(), Some(Duration::from_secs(30)));
    /// # Ok(()) }
    /// ```
    pub fn defer(&self, key: &Key, pause: Duration) -> StoreFuture<()> {
        let cap = Duration::from_micros(MAX_TOLERANCE_MICROS);
        let rules = self.cell.rules();
        self.store().gcra_defer(DeferCall {
            policy: rules.resolve(key, None),
            key,
            pause: pause.min(cap),
            remaining: 0,
            age: Duration::ZERO,
        })
    }

    /// Records that the upstream said `key` has `remaining` calls left
    /// until its limit resets in `reset`: from now on, every instance
    /// sharing the store admits at most `remaining` more calls of cost 1
    /// for `key` before `reset` from now (under every limit of the
    /// policy), and with `remaining` 0 none, as [`defer`](Self::defer)
    /// does. Budgets already tighter than that are left as they are: this
    /// only ever holds calls back. `reset` is capped at 2^50 µs.
    ///
    /// GCRA, as in reserve mode: the TAT of each limit (emission interval
    /// `T`, tolerance `τ`) is raised to `now + reset + τ − (remaining + 1)·T`,
    /// the lowest state that admits at most `remaining` calls before the
    /// reset. The calls left are therefore admitted at the limit's own rate
    /// in the last stretch before the reset, not at once: a limit that
    /// refills during that time could not otherwise promise to stay under.
    /// Under a window algorithm this does nothing (outbound clients reserve,
    /// which only GCRA can; see [`reserve`](Self::reserve)).
    ///
    /// The upstream counts the calls it has seen, not those the fleet has
    /// admitted and not yet made: slots handed out by
    /// [`reserve`](Self::reserve) since the last report that lie in the
    /// future count against `remaining` (the store keeps, beside each TAT,
    /// the TAT the last report left). Slots already handed out keep their
    /// times. Calls admitted to go at once but not yet seen by the upstream
    /// when it answered (the network's round trip) cannot be told apart:
    /// they are the bound on what a fleet can still overshoot. This takes
    /// the report as written now; the layer's
    /// [`upstream_feedback`](crate::RateLimitLayer::upstream_feedback)
    /// also counts the slots that came due between sending the call and
    /// recording its answer, which a loaded machine can make long.
    ///
    /// One round trip, none when the local limits alone already admit no
    /// more than `remaining` before `reset` (`(remaining + 1)·T ≥ reset + τ`
    /// for every limit).
    ///
    /// ```
    /// use std::time::Duration;
    /// use fleetgate::clock::MonotonicClock;
    /// use fleetgate::{Key, Limit, Limiter, MemoryStore, Policy, Rate};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let store = MemoryStore::builder().clock(MonotonicClock::new()).build();
    /// // Configured generously: 10 calls a second, in bursts of 10.
    /// let limit = Limit::builder(Rate::per_second(10)).burst(10).build()?;
    /// let limiter = Limiter::new(Policy::single("api", limit)?, store);
    /// let token = Key::new("token:1");
    /// // The upstream answered `x-ratelimit-remaining: 2`, reset in 5 s.
    /// limiter.align(&token, 2, Duration::from_secs(5)).await?;
    /// let wait_of = |d: fleetgate::Decision| d.wait();
    /// let max_wait = Duration::from_secs(60);
    /// // Two calls before the reset, the third exactly at it.
    /// assert_eq!(wait_of(limiter.reserve(&token, 1, max_wait).await?), Duration::from_millis(4_800));
    /// assert_eq!(wait_of(limiter.reserve(&token, 1, max_wait).await?), Duration::from_millis(4_900));
    /// assert_eq!(wait_of(limiter.reserve(&token, 1, max_wait).await?), Duration::from_secs(5));
    /// # Ok(()) }
    /// ```
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
        self.store().gcra_defer(DeferCall {
            policy,
            key,
            pause: reset,
            remaining,
            age,
        })
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
            && let Some(decided) = hot.decide(self, policy, key, cost, false)
        {
            return decided;
        }
        self.decide_in_store(policy, key, cost, max_wait.unwrap_or(Duration::ZERO))
    }

    /// A check of `cost` under `policy` in the store, whether the identity
    /// is hot or not: also how hot-key mode takes a lease.
    #[inline]
    pub(crate) fn decide_in_store(
        &self,
        policy: &Policy,
        key: &Key,
        cost: u64,
        max_wait: Duration,
    ) -> StoreFuture<Decision> {
        match call(policy, key, cost, max_wait) {
            Call::Never => StoreFuture::ready(Ok(never(policy))),
            Call::Gcra(call) => self.store.gcra(call),
            Call::Window(call) => self.store.window(call),
        }
    }
}

/// Whether "at most `remaining` calls before `reset`" holds any limit of
/// `policy` back: whether, for some limit, the floor of
/// [`gcra::defer`](crate::gcra::defer) lies after now, whatever now is.
fn holds_back(policy: &Policy, remaining: u64, reset: Duration) -> bool {
    let reset_us = u64::try_from(reset.as_micros()).unwrap_or(u64::MAX);
    policy.limits().iter().any(|limit| {
        let p = crate::gcra::Params {
            emission: limit.emission_us(),
            tolerance: limit.tolerance_us(),
        };
        crate::gcra::hold_floor(p, reset_us, remaining) > 0
    })
}

/// The refusal of a cost above what any limit could admit (no amount of
/// waiting admits it), answered without asking the store.
fn never(policy: &Policy) -> Decision {
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
    /// Clears `key`'s state under this limiter's policy (every limit, and
    /// whatever algorithm wrote it): its next call is decided as if the
    /// identity were new, by every instance sharing the store. One round
    /// trip on Redis, within the store's timeout; a failure is a
    /// [`StoreError`](crate::StoreError), as for a decision. The state is
    /// found by the policy's name, so a limiter of another policy of the
    /// same name resets the same state. The memory store frees the
    /// identity's entries at once.
    ///
    /// With [hot keys](Self::hot_keys), this instance drops its lease of
    /// `key` and what it remembers of it.
    ///
    /// On Redis this instance forgets its cached denials of `key` (see
    /// [`RedisStoreBuilder::deny_cache`](crate::RedisStoreBuilder::deny_cache));
    /// other instances' caches may still refuse it locally until the retry
    /// time they were told, at most.
    ///
    /// ```
    /// use fleetgate::{Key, Limit, Limiter, MemoryStore, Policy, Rate};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let policy = Policy::single("login", Limit::builder(Rate::per_hour(3)).build()?)?;
    /// let limiter = Limiter::new(policy, MemoryStore::new());
    /// let who = Key::new("user:42");
    /// for _ in 0..3 {
    ///     assert!(limiter.check(&who, 1).await?.is_allowed());
    /// }
    /// assert!(!limiter.check(&who, 1).await?.is_allowed());
    /// // An operator unblocks the user.
    /// limiter.reset(&who).await?;
    /// assert!(limiter.check(&who, 1).await?.is_allowed());
    /// # Ok(()) }
    /// ```
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
    /// What [`check`](Self::check) of `cost` would answer now, storing
    /// nothing: to admit a call "while the budget is not exhausted"
    /// (`peek(key, 1)`) and charge its cost once it is known. A cost above
    /// what any limit could admit is refused without asking the store, as
    /// by `check`.
    ///
    /// Calls admitted by peeks are not counted until they are charged, so
    /// callers that peek together can together overshoot the budget by
    /// what they charge later; the debt then holds the identity back until
    /// it is repaid (see [`charge`](Self::charge)). Where that must not
    /// happen, check before the call and [`refund`](Self::refund) after.
    ///
    /// ```
    /// use fleetgate::{Key, Limit, Limiter, MemoryStore, Policy, Rate};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// // A login limit that counts failed attempts only.
    /// let policy = Policy::single("login", Limit::new(Rate::per_hour(5))?)?;
    /// let logins = Limiter::new(policy, MemoryStore::new());
    /// let user = Key::new("user:42");
    /// for _ in 0..20 {
    ///     // Twenty successful logins: each is peeked at, none charged.
    ///     assert!(logins.peek(&user, 1).await?.is_allowed());
    /// }
    /// for _ in 0..5 {
    ///     assert!(logins.peek(&user, 1).await?.is_allowed());
    ///     // The password was wrong: this attempt counts.
    ///     logins.charge(&user, 1).await?;
    /// }
    /// // Refused now, even with the right password.
    /// let d = logins.peek(&user, 1).await?;
    /// assert!(!d.is_allowed());
    /// assert!(d.retry_after().is_some());
    /// # Ok(()) }
    /// ```
    pub fn peek(&self, key: &Key, cost: u64) -> StoreFuture<Decision> {
        let rules = self.cell.rules();
        let policy = rules.resolve(key, None);
        if cost > policy.max_cost() {
            return StoreFuture::ready(Ok(never(policy)));
        }
        self.store
            .peek(crate::store::AdjustCall { policy, key, cost })
    }

    /// Takes `cost` from every limit of `key`'s policy unconditionally,
    /// going into debt if need be, and says what is left: the figures of
    /// now for a call of cost 1. [`is_allowed`](Decision::is_allowed) says
    /// whether such a call would pass now; [`remaining`](Decision::remaining)
    /// is how many would (what is left of the budget: 0 once it is spent or
    /// in debt); when none would, [`retry_after`](Decision::retry_after) is
    /// when the next one will. A cost of 0 charges nothing and asks no
    /// store: the answer is then allowed and reports nothing (remaining
    /// and reset 0).
    ///
    /// A debt is repaid at the limit's rate, after which calls pass again:
    ///
    /// - GCRA: exactly at the rate. A debt of `d` units past the burst
    ///   holds calls back for `d` emission intervals, plus one for the next
    ///   call (no cap at the burst). The debt is cut at what the limit
    ///   refills in 16 periods of its rate or in an hour, whichever is
    ///   longer (an hour for `1000/min`), so that however large a charge,
    ///   the key lives `burst·T` and that long at most;
    /// - fixed window: the count goes past the window's count, and calls
    ///   pass again when the window ends (an overdraft is forgotten with
    ///   the rest of the count);
    /// - sliding-window counter: likewise on the current window, whose
    ///   overdraft then fades as the sliding window leaves it, over the
    ///   next window;
    /// - sliding log: `cost` entries are logged now (at most the largest
    ///   window's count: entries logged together leave together, so more
    ///   would change no decision), and calls pass again as they leave.
    ///
    /// On Redis, a charge that leaves `key` unable to pass a call of cost 1
    /// is remembered by this instance's deny cache, if it has one, so that
    /// the calls it refuses cost Redis nothing. A charge that fails (Redis
    /// refusing writes, a timeout) is kept by the store as owed by `key`
    /// and sent again before the key's next [`peek`](Self::peek) or charge,
    /// which fail while it cannot land: do not send it again yourself. A
    /// charge that timed out may have run, so it lands at least once.
    ///
    /// ```
    /// use std::time::Duration;
    /// use fleetgate::clock::MonotonicClock;
    /// use fleetgate::{Key, Limit, Limiter, MemoryStore, Policy, Rate};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// // Paused time, and a store on tokio's clock: exact figures.
    /// let store = MemoryStore::builder().clock(MonotonicClock::new()).build();
    /// let policy = Policy::single("tokens", Limit::new(Rate::per_minute(1000))?)?;
    /// let budget = Limiter::new(policy, store);
    /// let caller = Key::new("api-key:7");
    /// for left in [600, 200] {
    ///     assert!(budget.peek(&caller, 1).await?.is_allowed());
    ///     // The completion used 400 tokens: known once it has ended.
    ///     assert_eq!(budget.charge(&caller, 400).await?.remaining(), left);
    /// }
    /// assert!(budget.peek(&caller, 1).await?.is_allowed());
    /// let after = budget.charge(&caller, 400).await?;
    /// // 1200 of 1000 spent: 200 tokens in debt, repaid at 1000 a minute,
    /// // then one more for the next call: 201 × 60 ms.
    /// assert!(!after.is_allowed());
    /// assert_eq!(after.retry_after(), Some(Duration::from_millis(12_060)));
    /// tokio::time::advance(Duration::from_millis(12_059)).await;
    /// assert!(!budget.peek(&caller, 1).await?.is_allowed());
    /// tokio::time::advance(Duration::from_millis(1)).await;
    /// assert!(budget.peek(&caller, 1).await?.is_allowed());
    /// # Ok(()) }
    /// ```
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
            }));
        }
        self.store
            .charge(crate::store::AdjustCall { policy, key, cost })
    }

    /// Gives `cost` back to every limit of `key`'s policy: for a call that
    /// was checked (and charged) before it ran and should not count, such
    /// as one the upstream failed. Never beyond a fresh state: a refund
    /// brings the key back to its full burst at most, not past it. A cost
    /// of 0 does nothing and asks no store.
    ///
    /// - GCRA: the TAT moves back by `cost` emission intervals, not before
    ///   now;
    /// - fixed window and sliding-window counter: the count of the current
    ///   window goes down by `cost`, not below 0 (a window that has ended
    ///   keeps its count);
    /// - sliding log: up to `cost` of the newest entries still in the
    ///   longest window are dropped. The log keeps no record of which call
    ///   logged which entry, so a refund takes the newest, not necessarily
    ///   its own call's.
    ///
    /// On Redis this instance forgets its cached denials of `key` under the
    /// policy; other instances' deny caches may still refuse it locally
    /// until the retry time they were told, at most.
    ///
    /// ```
    /// use fleetgate::{Key, Limit, Limiter, MemoryStore, Policy, Rate};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let policy = Policy::single("flaky", Limit::new(Rate::per_minute(3))?)?;
    /// let limiter = Limiter::new(policy, MemoryStore::new());
    /// let who = Key::new("client:9");
    /// assert_eq!(limiter.check(&who, 1).await?.remaining(), 2);
    /// // The upstream answered 503: the call gives its unit back.
    /// limiter.refund(&who, 1).await?;
    /// assert_eq!(limiter.check(&who, 1).await?.remaining(), 2);
    /// // Never more than a fresh state has.
    /// limiter.refund(&who, 100).await?;
    /// assert_eq!(limiter.check(&who, 1).await?.remaining(), 2);
    /// # Ok(()) }
    /// ```
    pub fn refund(&self, key: &Key, cost: u64) -> StoreFuture<()> {
        if cost == 0 {
            return StoreFuture::ready(Ok(()));
        }
        let rules = self.cell.rules();
        let policy = rules.resolve(key, None);
        self.store
            .refund(crate::store::AdjustCall { policy, key, cost })
    }
}
