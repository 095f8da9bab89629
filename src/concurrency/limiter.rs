use std::fmt;

use arc_swap::ArcSwap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use super::ConcurrencyPolicy;
use super::adaptive::{Adaptive, AdaptiveCall, AdaptiveLimit, AdaptiveState, Verdict};
use super::queue::{QueueState, Ticket, WaitQueue, Waiters, Wake};
use crate::error::{ConfigError, StoreError};
use crate::key::Key;
use crate::lease::{LeaseGuard, OnRelease, Pending, Renewer, StoreLease};
use crate::limiter::IntoStore;
use crate::lists::{Lists, Verdict as ListVerdict};
use crate::metrics::LimitMetrics;
use crate::store::{self, LeaseCall, LeaseGrant, LeaseId, MemoryStore, Store, StoreFuture};

/// A [`ConcurrencyPolicy`] bound to a [`Store`]: takes leases, one store
/// round trip each, and hands them out in [`LeaseGuard`]s that give them
/// back when dropped. Clones share everything.
///
/// Usable on its own, outside tower; see the [`lease`](crate::lease)
/// module for an example.
#[derive(Clone)]
pub struct ConcurrencyLimiter {
    policy: ConcurrencyPolicy,
    store: Arc<dyn Store>,
    pending: Arc<Pending>,
    renewer: Option<Renewer<StoreLease>>,
    /// An adaptive limit in place of the policy's maximum.
    adaptive: Option<Arc<Adaptive>>,
    /// Callers waiting for a slot, and what a release tells them.
    queue: Option<(Arc<Waiters>, OnRelease)>,
    /// The deny and allow entries for this policy, set by
    /// [`LivePolicies`](crate::live::LivePolicies) once the limiter is
    /// made known to it; shared by every clone.
    lists: Arc<ArcSwap<Lists>>,
}

/// The outcome of [`ConcurrencyLimiter::acquire`].
#[derive(Debug)]
#[must_use = "dropping an acquired guard releases its lease at once"]
pub enum Admission {
    /// A lease was taken; it is held until the guard is dropped.
    Acquired(LeaseGuard<StoreLease>),
    /// The identity already has the maximum in flight.
    Refused(LeaseGrant),
}

impl ConcurrencyLimiter {
    /// Binds `policy` to `store`.
    pub fn new(policy: ConcurrencyPolicy, store: impl IntoStore) -> Self {
        ConcurrencyLimiter {
            renewer: policy.renew_every().map(Renewer::new),
            policy,
            store: store.into_store(),
            pending: Arc::default(),
            adaptive: None,
            queue: None,
            lists: Arc::default(),
        }
    }

    /// What the deny and allow lists say of `key` now (one branch when
    /// they are empty).
    #[inline]
    pub(crate) fn listed(&self, key: &Key) -> Option<ListVerdict> {
        self.lists.load().check(key)
    }

    /// Replaces the deny and allow entries the layers on this limiter
    /// check.
    pub(crate) fn set_lists(&self, lists: Lists) {
        self.lists.store(Arc::new(lists));
    }

    /// An adaptive limit named `name` (part of metric labels and storage
    /// keys: `[A-Za-z0-9-_./:]`, at most 64 bytes): the maximum in flight
    /// follows the latency of the calls it admits, between the limit's
    /// `min` and `max` (see [`AdaptiveLimit`]). It is this process's own
    /// (an in-process store, no round trip per call), and caps each key
    /// at the current limit; leases live 30 s unless renewed, renewed
    /// every 10 s, as [`ConcurrencyPolicy::new`]'s do.
    ///
    /// ```
    /// use fleetgate::concurrency::{AdaptiveLimit, ConcurrencyLimiter};
    ///
    /// let limit = AdaptiveLimit::gradient2().min(2).max(100).initial(8).build()?;
    /// let limiter = ConcurrencyLimiter::adaptive("backend", limit)?;
    /// assert_eq!(limiter.limit(), 2); // measuring the minimum RTT first
    /// # Ok::<(), fleetgate::ConfigError>(())
    /// ```
    pub fn adaptive(name: impl Into<String>, limit: AdaptiveLimit) -> Result<Self, ConfigError> {
        let policy = ConcurrencyPolicy::new(name, limit.max())?;
        let mut limiter = ConcurrencyLimiter::new(policy, MemoryStore::new());
        let metrics = LimitMetrics::new(limiter.policy.name_arc());
        limiter.adaptive = Some(Adaptive::new(limit, metrics));
        Ok(limiter)
    }

    /// Lets a call that finds every slot taken wait for one, as `queue`
    /// says ([`WaitQueue`]: order, length, longest wait). Waiting needs a
    /// tokio runtime with timers.
    ///
    /// ```
    /// use std::time::Duration;
    /// use fleetgate::concurrency::{Admission, ConcurrencyLimiter, ConcurrencyPolicy, WaitQueue};
    /// use fleetgate::{Key, MemoryStore};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let policy = ConcurrencyPolicy::new("jobs", 1)?;
    /// let limiter = ConcurrencyLimiter::new(policy, MemoryStore::new())
    ///     .queue(WaitQueue::fifo(8, Duration::from_secs(5))?);
    /// let who = Key::new("tenant:acme");
    /// let Admission::Acquired(first) = limiter.acquire(&who).await? else { unreachable!() };
    /// let second = tokio::spawn({
    ///     let (limiter, who) = (limiter.clone(), who.clone());
    ///     async move { limiter.acquire(&who).await }
    /// });
    /// drop(first); // the waiting call gets the slot
    /// assert!(matches!(second.await??, Admission::Acquired(_)));
    /// # Ok(()) }
    /// ```
    pub fn queue(mut self, queue: WaitQueue) -> Self {
        let waiters = Waiters::new(queue, LimitMetrics::new(self.policy.name_arc()));
        let told = waiters.clone();
        self.queue = Some((waiters, Arc::new(move |key: &Key| told.released(key))));
        self
    }

    /// The maximum in flight per key now: the adaptive limit's current
    /// value, or the policy's maximum.
    pub fn limit(&self) -> u64 {
        match &self.adaptive {
            Some(adaptive) => adaptive.limit(),
            None => self.policy.max_in_flight(),
        }
    }

    /// Where the adaptive limit is (`None` for a fixed limit).
    pub fn adaptive_state(&self) -> Option<AdaptiveState> {
        self.adaptive.as_ref().map(|a| a.state())
    }

    /// The queue's state (`None` without one).
    pub fn queue_state(&self) -> Option<QueueState> {
        self.queue.as_ref().map(|(w, _)| w.state())
    }

    /// Starts measuring a call admitted under an adaptive limit (`None`
    /// for a fixed one).
    pub(crate) fn measure(&self) -> Option<AdaptiveCall> {
        self.adaptive.as_ref().map(|a| a.start())
    }

    /// A measured call was answered: takes its sample, and wakes as many
    /// queued callers as the limit rose by.
    pub(crate) fn measured(&self, call: AdaptiveCall, verdict: Verdict) {
        let rose = call.finish(verdict);
        if rose > 0
            && let Some((waiters, _)) = &self.queue
        {
            waiters.raised(rose);
        }
    }

    /// The policy.
    pub fn policy(&self) -> &ConcurrencyPolicy {
        &self.policy
    }

    /// The store.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// Takes a lease for `key` if it has fewer than the policy's maximum in
    /// flight. An acquired lease is renewed in the background (if the
    /// policy renews) until its guard is dropped, by one task per limiter
    /// that renews every lease due.
    ///
    /// The lease id is chosen before the store is asked, so that if the
    /// returned future is dropped mid-way or the store fails after the
    /// request was sent, the lease that may have been recorded is released
    /// again rather than held until its TTL.
    ///
    /// With a [`queue`](Self::queue), a call refused for want of a slot
    /// waits in it for one (see [`WaitQueue`]) before it resolves.
    pub fn acquire(&self, key: &Key) -> Acquire {
        self.acquire_with(key, self.capacity(), true)
    }

    /// [`acquire`](Self::acquire) that never waits in the queue: refused
    /// at once when every slot is taken (a layer in shadow mode, which
    /// queues nothing).
    pub(crate) fn acquire_now(&self, key: &Key) -> Acquire {
        self.acquire_with(key, self.capacity(), false)
    }

    /// [`acquire`](Self::acquire) with a capacity other than the policy's:
    /// the fleet load shedder admits each tier up to its own share of one
    /// lease set.
    pub(crate) fn acquire_up_to(&self, key: &Key, capacity: u64) -> Acquire {
        self.acquire_with(key, Capacity::Fixed(capacity), true)
    }

    fn capacity(&self) -> Capacity {
        match &self.adaptive {
            Some(adaptive) => Capacity::Adaptive(adaptive.clone()),
            None => Capacity::Fixed(self.policy.max_in_flight()),
        }
    }

    /// Takes a lease up to `capacity`; refused, waits in the queue (if
    /// any) only when `queued`.
    fn acquire_with(&self, key: &Key, capacity: Capacity, queued: bool) -> Acquire {
        let lease = StoreLease::new(
            self.store.clone(),
            self.policy.name_arc(),
            key.clone(),
            self.policy.lease_ttl(),
            self.pending.clone(),
        )
        .on_release(self.queue.as_ref().map(|(_, told)| told.clone()));
        // Asking for no room is asking how many are in flight: it never
        // waits.
        let queue = match &self.queue {
            Some((waiters, _)) if queued && capacity.get() > 0 => Some(waiters.clone()),
            _ => None,
        };
        let wait = queue.as_ref().map(|w| w.config().max_wait());
        let mut grant =
            store::lease_acquire(&*self.store, lease.call_waiting(capacity.get(), wait));
        // A store that decided at once has recorded the lease already.
        let ready = grant.take_ready();
        let mut acquire = Acquire {
            grant,
            guard: Some(LeaseGuard::new(lease)),
            sent: ready.is_some(),
            renewer: self.renewer.clone(),
            queue: queue.map(|waiters| (waiters, capacity)),
            waiting: None,
        };
        match ready {
            // Refused at once (the memory store): the wait starts now, and
            // `take_ready` answers only when it is over.
            Some(Ok(grant)) if !grant.is_acquired() && acquire.queue.is_some() => {
                acquire.wait_for_slot(grant);
            }
            Some(result) => acquire.grant = StoreFuture::ready(result),
            None => {}
        }
        acquire
    }

    /// Drops every lease `key` holds under this limiter's policy, fleet-wide
    /// on Redis (one round trip, within the store's timeout; a failure is a
    /// [`StoreError`]): its next acquire is decided as if it held none.
    ///
    /// Guards still held for those leases stay harmless: dropping one
    /// releases nothing (the store answers that the lease was not held,
    /// which is not an error). Once the reset has succeeded, this limiter
    /// (and its clones) stops renewing the leases it renewed for `key` when
    /// `reset` was called, quietly. Other instances' renewals find their
    /// leases gone and stop too, logging the lease as lost (at `warn`, at
    /// most once a second), as does a renewal of this instance already on
    /// its way when the reset lands. Their requests still run to their end,
    /// so until they do the key may have more in flight than the policy
    /// allows.
    ///
    /// ```
    /// use std::time::Duration;
    /// use fleetgate::concurrency::{Admission, ConcurrencyLimiter, ConcurrencyPolicy};
    /// use fleetgate::{Key, MemoryStore};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let policy = ConcurrencyPolicy::builder("jobs", 1)
    ///     .lease_ttl(Duration::from_secs(60))
    ///     .build()?;
    /// let limiter = ConcurrencyLimiter::new(policy, MemoryStore::new());
    /// let who = Key::new("tenant:acme");
    /// let stuck = limiter.acquire(&who).await?;
    /// assert!(matches!(limiter.acquire(&who).await?, Admission::Refused(_)));
    /// limiter.reset(&who).await?;
    /// assert!(matches!(limiter.acquire(&who).await?, Admission::Acquired(_)));
    /// drop(stuck); // releases nothing
    /// # Ok(()) }
    /// ```
    pub fn reset(&self, key: &Key) -> StoreFuture<()> {
        let mut reset = self.store.reset(self.policy.name(), key);
        let Some(renewer) = self.renewer.clone() else {
            return reset;
        };
        // Once the leases are gone, this limiter's renewer stops renewing
        // them rather than find them gone and warn of a lost lease: those
        // it renews now, not leases taken while the reset is on its way.
        let name = self.policy.name();
        let held = renewer.registered(|lease| lease.name() == name && lease.key() == key);
        let forget = move |result: &Result<(), StoreError>| {
            if result.is_ok() {
                renewer.forget(&held);
            }
        };
        if let Some(result) = reset.take_ready() {
            forget(&result);
            return StoreFuture::ready(result);
        }
        StoreFuture::pending(async move {
            let result = reset.await;
            forget(&result);
            result
        })
    }

    /// How many releases this limiter's leases have handed to spawned tasks
    /// that have not reached the store yet.
    pub fn pending_releases(&self) -> usize {
        self.pending.count()
    }

    /// Resolves once every release handed to a spawned task has reached the
    /// store (or failed): call it on shutdown so that no lease outlives the
    /// process until its TTL. A release a Redis store retries is pending
    /// until it lands or its lease's TTL passes (see [`lease`](crate::lease)),
    /// so bound this wait with a timeout.
    pub async fn releases_settled(&self) {
        self.pending.settled().await;
    }
}

impl fmt::Debug for ConcurrencyLimiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConcurrencyLimiter")
            .field("policy", &self.policy)
            .field("store", &self.store)
            .finish()
    }
}

/// What a queued acquire asks for: the current adaptive limit, or a
/// fixed number.
#[derive(Clone, Debug)]
enum Capacity {
    Fixed(u64),
    Adaptive(Arc<Adaptive>),
}

impl Capacity {
    fn get(&self) -> u64 {
        match self {
            Capacity::Fixed(n) => *n,
            Capacity::Adaptive(adaptive) => adaptive.limit(),
        }
    }
}

type Waiting = Pin<Box<dyn Future<Output = Result<LeaseGrant, StoreError>> + Send>>;

/// The future of [`ConcurrencyLimiter::acquire`]. Dropped before it
/// resolves, it releases the lease it may have taken, and leaves the
/// queue it waits in.
#[must_use = "futures do nothing unless polled"]
pub struct Acquire {
    grant: StoreFuture<LeaseGrant>,
    /// Holds the tentative lease: released on drop unless the store
    /// refused it or it was handed out.
    guard: Option<LeaseGuard<StoreLease>>,
    /// Whether the store may have recorded the lease: at once for the
    /// memory store; once polled for a store doing I/O, which sends nothing
    /// before that.
    sent: bool,
    renewer: Option<Renewer<StoreLease>>,
    /// With a queue: where to wait if refused, and for how much room.
    queue: Option<(Arc<Waiters>, Capacity)>,
    /// Refused, waiting in the queue for a slot.
    waiting: Option<Waiting>,
}

impl Acquire {
    /// The outcome, if the store has decided already (the memory store
    /// always has, unless the call waits in a queue); the future is then
    /// spent.
    pub fn take_ready(&mut self) -> Option<Result<Admission, StoreError>> {
        if self.waiting.is_some() {
            return None;
        }
        let result = self.grant.take_ready()?;
        Some(self.finish(result))
    }

    /// How long the store took to answer its first call, once it has
    /// (see [`StoreFuture::latency`]): a wait in the queue is not the
    /// store's.
    pub fn latency(&self) -> Option<Duration> {
        self.grant.latency()
    }

    /// Refused: waits in the queue for a slot, if there is one.
    fn wait_for_slot(&mut self, first: LeaseGrant) {
        let (Some((waiters, capacity)), Some(lease)) = (
            self.queue.take(),
            self.guard.as_ref().and_then(|g| g.lease()),
        ) else {
            self.grant = StoreFuture::ready(Ok(first));
            return;
        };
        let attempt = Attempt {
            store: lease.store().clone(),
            name: Arc::from(lease.name()),
            key: lease.key().clone(),
            id: lease.id().clone(),
            ttl: lease.ttl(),
            capacity,
            wait: waiters.config().max_wait(),
        };
        self.waiting = Some(Box::pin(attempt.queued(waiters, first)));
    }

    fn finish(&mut self, result: Result<LeaseGrant, StoreError>) -> Result<Admission, StoreError> {
        let Some(guard) = self.guard.take() else {
            return Err(StoreError::UnexpectedReply(
                "acquire polled after completion".into(),
            ));
        };
        match result {
            Ok(grant) if grant.is_acquired() => {
                if let Some(lease) = guard.lease() {
                    lease.granted();
                }
                Ok(Admission::Acquired(match &self.renewer {
                    Some(renewer) => guard.renewed_by(renewer),
                    None => guard,
                }))
            }
            Ok(grant) => {
                guard.disarm();
                Ok(Admission::Refused(grant))
            }
            // The script may have run before the failure (a timeout): the
            // guard drops here and releases that lease, if any.
            Err(err) => Err(err),
        }
    }
}

impl Future for Acquire {
    type Output = Result<Admission, StoreError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        this.sent = true;
        loop {
            if let Some(waiting) = &mut this.waiting {
                let result = ready!(waiting.as_mut().poll(cx));
                this.waiting = None;
                return Poll::Ready(this.finish(result));
            }
            let result = ready!(Pin::new(&mut this.grant).poll(cx));
            match result {
                Ok(grant) if !grant.is_acquired() && this.queue.is_some() => {
                    this.wait_for_slot(grant);
                }
                result => return Poll::Ready(this.finish(result)),
            }
        }
    }
}

impl Drop for Acquire {
    fn drop(&mut self) {
        if !self.sent
            && let Some(guard) = self.guard.take()
        {
            guard.disarm();
        }
    }
}

/// One caller's acquires while it waits in a queue: the same lease id
/// each time (a refused acquire records nothing).
struct Attempt {
    store: Arc<dyn Store>,
    name: Arc<str>,
    key: Key,
    id: LeaseId,
    ttl: Duration,
    capacity: Capacity,
    /// The longest wait.
    wait: Duration,
}

impl Attempt {
    /// One acquire by a caller that may wait `wait` more.
    async fn once(&self, wait: Duration) -> Result<LeaseGrant, StoreError> {
        let call = LeaseCall {
            name: &self.name,
            key: &self.key,
            id: &self.id,
            capacity: self.capacity.get(),
            ttl: self.ttl,
            wait: Some(wait),
            undo: false,
        };
        store::lease_acquire(&*self.store, call).await
    }

    /// Watches the releases of other instances, bounded by `deadline`;
    /// `None` when the store cannot (the caller still hears its own
    /// process's releases and the oldest lease's expiry).
    async fn watch(&self, deadline: tokio::time::Instant) -> Option<store::ReleaseWatch> {
        let watch = self.store.watch_releases(&self.name, &self.key)?;
        tokio::time::timeout_at(deadline, watch).await.ok()?.ok()
    }

    /// Waits in `waiters` for a slot, having been refused `first`: tries
    /// again whenever one may have freed up, until the longest wait has
    /// passed. Resolves with the last grant: acquired, or refused.
    async fn queued(
        self,
        waiters: Arc<Waiters>,
        first: LeaseGrant,
    ) -> Result<LeaseGrant, StoreError> {
        let started = tokio::time::Instant::now();
        let deadline = started + self.wait;
        let Some(ticket) = waiters.enter(&self.key) else {
            return Ok(first);
        };
        let mut watch = self.watch(deadline).await;
        loop {
            // Once right after joining the queue: a release between the
            // refusal and now told nobody. The store is told how long the
            // caller may still wait, no longer.
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let grant = self.once(left.max(Duration::from_millis(1))).await?;
            if grant.is_acquired() {
                ticket.admitted(started.elapsed());
                return Ok(grant);
            }
            let now = tokio::time::Instant::now();
            if now >= deadline {
                ticket.timed_out();
                return Ok(grant);
            }
            // A lease whose holder vanished frees its slot when it expires.
            let retry_at = grant
                .oldest_expires_in()
                .map_or(deadline, |after| (now + after).min(deadline));
            if woken(&ticket, watch.as_ref(), retry_at).await == Wake::Displaced {
                return Ok(grant);
            }
            // A watch the store could not give (Redis was away) is asked
            // for again: it may be back.
            if watch.is_none() {
                watch = self.watch(deadline).await;
            }
        }
    }
}

/// Resolves when the queue says so, a release elsewhere is announced, or
/// at `at`.
async fn woken(
    ticket: &Ticket,
    watch: Option<&store::ReleaseWatch>,
    at: tokio::time::Instant,
) -> Wake {
    let sleep = tokio::time::sleep_until(at);
    let released = async {
        match watch {
            Some(watch) => watch.released().await,
            None => std::future::pending().await,
        }
    };
    let mut sleep = std::pin::pin!(sleep);
    let mut released = std::pin::pin!(released);
    std::future::poll_fn(|cx| {
        if let Poll::Ready(wake) = ticket.poll_wake(cx) {
            return Poll::Ready(wake);
        }
        if released.as_mut().poll(cx).is_ready() || sleep.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Wake::Retry);
        }
        Poll::Pending
    })
    .await
}

impl fmt::Debug for Acquire {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Acquire")
            .field("grant", &self.grant)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemoryStore;
    use crate::clock::MonotonicClock;

    fn renewing(store: impl IntoStore) -> ConcurrencyLimiter {
        let policy = ConcurrencyPolicy::builder("jobs", 2)
            .lease_ttl(Duration::from_secs(10))
            .renew_every(Duration::from_secs(1))
            .build()
            .unwrap();
        ConcurrencyLimiter::new(policy, store)
    }

    fn renewed(limiter: &ConcurrencyLimiter) -> usize {
        limiter.renewer.as_ref().map_or(0, Renewer::len)
    }

    async fn acquire(limiter: &ConcurrencyLimiter, key: &Key) -> LeaseGuard<StoreLease> {
        match limiter.acquire(key).await.unwrap() {
            Admission::Acquired(guard) => guard,
            Admission::Refused(grant) => panic!("refused: {grant:?}"),
        }
    }

    /// The reset key's leases leave the renewer at once (no renewal will
    /// find them gone and warn); other keys' stay, and leases taken after
    /// the reset are renewed as usual.
    #[tokio::test(start_paused = true)]
    async fn a_reset_stops_renewing_the_keys_leases() {
        let store = MemoryStore::builder().clock(MonotonicClock::new()).build();
        let limiter = renewing(store.clone());
        let (who, other) = (Key::new("a"), Key::new("b"));
        let stuck = [acquire(&limiter, &who).await, acquire(&limiter, &who).await];
        let _kept = acquire(&limiter, &other).await;
        assert_eq!(renewed(&limiter), 3);
        limiter.reset(&who).await.unwrap();
        assert_eq!(renewed(&limiter), 1);
        let fresh = acquire(&limiter, &who).await;
        assert_eq!(renewed(&limiter), 2);
        drop(stuck);
        assert_eq!(
            renewed(&limiter),
            2,
            "an old guard left the new lease's place"
        );
        tokio::time::advance(Duration::from_secs(3)).await;
        tokio::task::yield_now().await;
        assert_eq!(renewed(&limiter), 2);
        assert_eq!(store.lease_count(), 2);
        drop(fresh);
        assert_eq!(renewed(&limiter), 1);
    }

    /// A reset that failed changed nothing: the leases are still renewed.
    #[cfg(feature = "redis")]
    #[tokio::test]
    async fn a_failed_reset_keeps_renewing() {
        let store = crate::RedisStore::builder("redis://127.0.0.1:1")
            .timeout(Duration::from_millis(100))
            .lazy()
            .connect()
            .await
            .unwrap();
        let limiter = renewing(store);
        let lease = StoreLease::new(
            limiter.store.clone(),
            limiter.policy.name_arc(),
            Key::new("a"),
            limiter.policy.lease_ttl(),
            limiter.pending.clone(),
        );
        let renewer = limiter.renewer.clone().unwrap();
        let guard = LeaseGuard::new(lease).renewed_by(&renewer);
        assert_eq!(renewed(&limiter), 1);
        assert!(limiter.reset(&Key::new("a")).await.is_err());
        assert_eq!(renewed(&limiter), 1);
        guard.disarm();
    }
}
