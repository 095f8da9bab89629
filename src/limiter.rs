//! [`Limiter`]: a policy bound to a store, callable from any code.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::decision::Decision;
use crate::error::ConfigError;
use crate::key::Key;
use crate::limit::{MAX_TOLERANCE_MICROS, Policy};
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
#[derive(Clone)]
pub struct Limiter {
    policy: Policy,
    store: Arc<dyn Store>,
}

impl Limiter {
    /// Binds `policy` to `store`.
    pub fn new(policy: Policy, store: impl IntoStore) -> Self {
        Limiter {
            policy,
            store: store.into_store(),
        }
    }

    /// Binds `policy` to a fresh [`MemoryStore`].
    pub fn in_memory(policy: Policy) -> Self {
        Limiter::new(policy, MemoryStore::new())
    }

    /// The policy.
    pub fn policy(&self) -> &Policy {
        &self.policy
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
        self.decide(key, cost, Duration::ZERO)
    }

    /// [`check`](Self::check) at once, in the calling thread, when no I/O
    /// is needed: always on the [`MemoryStore`], so code without an async
    /// runtime can limit in process; on a store doing I/O (Redis), only a
    /// cost no limit could ever admit, and `None` otherwise (call `check`
    /// there). The decision is the one `check` would give, and is charged
    /// the same way.
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
        match self.call(key, cost, Duration::ZERO) {
            Call::Never => Some(self.never()),
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
        let algorithm = self.policy.algorithm();
        if algorithm.is_window() {
            return StoreFuture::ready(Err(ConfigError::ReserveNeedsGcra { algorithm }.into()));
        }
        let cap = Duration::from_micros(MAX_TOLERANCE_MICROS);
        self.decide(key, cost, max_wait.min(cap))
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
        self.store().gcra_defer(DeferCall {
            policy: self.policy(),
            key,
            pause: pause.min(cap),
        })
    }

    /// The refusal of a cost above what any limit could admit (no amount
    /// of waiting admits it), answered without asking the store.
    fn never(&self) -> Decision {
        let i = self
            .policy
            .limits()
            .iter()
            .enumerate()
            .min_by_key(|(_, l)| l.burst())
            .map_or(0, |(i, _)| i);
        Decision::never(i)
    }

    fn decide(&self, key: &Key, cost: u64, max_wait: Duration) -> StoreFuture<Decision> {
        match self.call(key, cost, max_wait) {
            Call::Never => StoreFuture::ready(Ok(self.never())),
            Call::Gcra(call) => self.store.gcra(call),
            Call::Window(call) => self.store.window(call),
        }
    }

    /// What deciding `cost` for `key` asks of the store, whether it is to
    /// answer at once or with a future.
    #[inline]
    fn call<'a>(&'a self, key: &'a Key, cost: u64, max_wait: Duration) -> Call<'a> {
        if cost > self.policy.max_cost() {
            // No amount of waiting admits this: answered without the store.
            return Call::Never;
        }
        if self.policy.algorithm().is_window() {
            return Call::Window(WindowCall {
                policy: &self.policy,
                key,
                cost,
            });
        }
        Call::Gcra(GcraCall {
            policy: &self.policy,
            key,
            cost,
            max_wait,
        })
    }
}

/// The store call a decision takes, if any: see [`Limiter::call`].
enum Call<'a> {
    /// A cost above what any limit could admit: refused without the store.
    Never,
    Gcra(GcraCall<'a>),
    Window(WindowCall<'a>),
}

impl fmt::Debug for Limiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Limiter")
            .field("policy", &self.policy.name())
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
        self.store.reset(self.policy.name(), key)
    }
}
