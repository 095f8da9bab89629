use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use super::ConcurrencyPolicy;
use crate::error::StoreError;
use crate::key::Key;
use crate::lease::{LeaseGuard, Pending, Renewer, StoreLease};
use crate::limiter::IntoStore;
use crate::store::{self, LeaseGrant, Store, StoreFuture};

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
    pub fn acquire(&self, key: &Key) -> Acquire {
        self.acquire_up_to(key, self.policy.max_in_flight())
    }

    /// [`acquire`](Self::acquire) with a capacity other than the policy's:
    /// the fleet load shedder admits each tier up to its own share of one
    /// lease set.
    pub(crate) fn acquire_up_to(&self, key: &Key, capacity: u64) -> Acquire {
        let lease = StoreLease::new(
            self.store.clone(),
            self.policy.name_arc(),
            key.clone(),
            self.policy.lease_ttl(),
            self.pending.clone(),
        );
        let mut grant = store::lease_acquire(&*self.store, lease.call(capacity));
        // A store that decided at once has recorded the lease already.
        let sent = match grant.take_ready() {
            Some(result) => {
                grant = StoreFuture::ready(result);
                true
            }
            None => false,
        };
        Acquire {
            grant,
            guard: Some(LeaseGuard::new(lease)),
            sent,
            renewer: self.renewer.clone(),
        }
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

/// The future of [`ConcurrencyLimiter::acquire`]. Dropped before it
/// resolves, it releases the lease it may have taken.
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
}

impl Acquire {
    /// The outcome, if the store has decided already (the memory store
    /// always has); the future is then spent.
    pub fn take_ready(&mut self) -> Option<Result<Admission, StoreError>> {
        let result = self.grant.take_ready()?;
        Some(self.finish(result))
    }

    /// How long the store took to answer, once it has (see
    /// [`StoreFuture::latency`]).
    pub fn latency(&self) -> Option<Duration> {
        self.grant.latency()
    }

    fn finish(&mut self, result: Result<LeaseGrant, StoreError>) -> Result<Admission, StoreError> {
        let Some(guard) = self.guard.take() else {
            return Err(StoreError::UnexpectedReply(
                "acquire polled after completion".into(),
            ));
        };
        match result {
            Ok(grant) if grant.is_acquired() => Ok(Admission::Acquired(match &self.renewer {
                Some(renewer) => guard.renewed_by(renewer),
                None => guard,
            })),
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
        let result = ready!(Pin::new(&mut this.grant).poll(cx));
        Poll::Ready(this.finish(result))
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
