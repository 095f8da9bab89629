use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio::sync::Notify;

use super::Lease;
use crate::error::StoreError;
use crate::key::Key;
use crate::observe::{Held, PolicyStats};
use crate::store::{self, LeaseCall, LeaseId, LeaseOp, Store, StoreFuture};

/// A concurrency lease held in a [`Store`]: the set of `key` under the
/// limit `name`, member `id`.
pub struct StoreLease {
    store: Arc<dyn Store>,
    name: Arc<str>,
    key: Key,
    id: LeaseId,
    ttl: Duration,
    pending: Arc<Pending>,
    /// Counts the lease in [`observe`](crate::observe) while it is held.
    held: OnceLock<Held>,
    /// Told once a release that may have freed a slot has reached the
    /// store: wakes the callers queued for a slot of this key.
    on_release: Option<OnRelease>,
    /// The store answered that it holds the lease: its release undoes no
    /// acquire still on its way ([`LeaseCall::undo`]).
    granted: AtomicBool,
}

/// What a lease tells its limiter once released.
pub(crate) type OnRelease = Arc<dyn Fn(&Key) + Send + Sync>;

/// Whether a release may have freed a slot: not when the store says the
/// lease was not held (never taken, as a queued caller's, or expired);
/// when unsure (a store error), yes, as a wasted retry costs less than a
/// waiter left asleep.
fn freed(release: &Result<bool, StoreError>) -> bool {
    !matches!(release, Ok(false))
}

impl StoreLease {
    pub(crate) fn new(
        store: Arc<dyn Store>,
        name: Arc<str>,
        key: Key,
        ttl: Duration,
        pending: Arc<Pending>,
    ) -> Self {
        StoreLease {
            store,
            name,
            key,
            id: LeaseId::generate(),
            ttl,
            pending,
            held: OnceLock::new(),
            on_release: None,
            granted: AtomicBool::new(false),
        }
    }

    /// Records that the store answered it holds the lease.
    pub(crate) fn granted(&self) {
        self.granted.store(true, Ordering::Relaxed);
    }

    /// Tells `on_release` once this lease's release has reached the store.
    pub(crate) fn on_release(mut self, on_release: Option<OnRelease>) -> Self {
        self.on_release = on_release;
        self
    }

    /// Counts the lease as held in `stats` until it is dropped (its
    /// release begun).
    pub(crate) fn count_in(&self, stats: &Arc<PolicyStats>) {
        if self.held.get().is_none() {
            let _ = self.held.set(stats.hold());
        }
    }

    /// The name of the limit.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The identity holding the lease.
    pub fn key(&self) -> &Key {
        &self.key
    }

    /// The lease's id.
    pub fn id(&self) -> &LeaseId {
        &self.id
    }

    pub(crate) fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    pub(crate) fn ttl(&self) -> Duration {
        self.ttl
    }

    pub(crate) fn call(&self, capacity: u64) -> LeaseCall<'_> {
        self.call_waiting(capacity, None)
    }

    /// An acquire by a caller that waits up to `wait` in a queue if it is
    /// refused (see [`LeaseCall::wait`]).
    pub(crate) fn call_waiting(&self, capacity: u64, wait: Option<Duration>) -> LeaseCall<'_> {
        LeaseCall {
            name: &self.name,
            key: &self.key,
            id: &self.id,
            capacity,
            ttl: self.ttl,
            wait,
            undo: !self.granted.load(Ordering::Relaxed),
        }
    }
}

impl Lease for StoreLease {
    fn release(&self) -> StoreFuture<bool> {
        let mut release = store::lease_held(&*self.store, self.call(0), LeaseOp::Release);
        if let Some(done) = release.take_ready() {
            if let Some(tell) = self.on_release.as_ref().filter(|_| freed(&done)) {
                tell(&self.key);
            }
            return StoreFuture::ready(done);
        }
        // Counted until it is done, so that shutdown (and tests) can wait
        // for every release to reach the store.
        let token = self.pending.begin();
        let told = self.on_release.clone().map(|tell| (tell, self.key.clone()));
        StoreFuture::pending(async move {
            let _token = token;
            let result = release.await;
            if let Some((tell, key)) = told.filter(|_| freed(&result)) {
                tell(&key);
            }
            result
        })
    }

    fn renew(&self) -> StoreFuture<bool> {
        store::lease_held(&*self.store, self.call(0), LeaseOp::Renew)
    }
}

impl fmt::Debug for StoreLease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StoreLease")
            .field("name", &self.name)
            .field("key", &self.key)
            .field("id", &self.id)
            .field("ttl", &self.ttl)
            .finish()
    }
}

/// Releases on their way to the store, counted so that someone can wait
/// for all of them to finish.
#[derive(Debug, Default)]
pub(crate) struct Pending {
    count: AtomicUsize,
    idle: Notify,
}

impl Pending {
    fn begin(self: &Arc<Self>) -> PendingToken {
        self.count.fetch_add(1, Ordering::SeqCst);
        PendingToken(self.clone())
    }

    pub(crate) fn count(&self) -> usize {
        self.count.load(Ordering::SeqCst)
    }

    /// Resolves once no release is pending.
    pub(crate) async fn settled(&self) {
        loop {
            let mut idle = std::pin::pin!(self.idle.notified());
            idle.as_mut().enable();
            if self.count() == 0 {
                return;
            }
            idle.await;
        }
    }
}

/// Counts one pending release until dropped (done, failed, or abandoned
/// with its runtime).
struct PendingToken(Arc<Pending>);

impl Drop for PendingToken {
    fn drop(&mut self) {
        if self.0.count.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}
