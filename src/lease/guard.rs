use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio::runtime::Handle;
use tokio::sync::oneshot;

use super::renewer::{Registration, Renewer};
use super::{Lease, log_lost, log_release_failure, log_renew_failure};

/// Releases a [`Lease`] when dropped, and can keep it alive meanwhile.
///
/// Dropping never waits: a release that the store has not finished at once
/// (any Redis release) is sent at once and its answer awaited on a spawned
/// tokio task, so it reaches Redis ahead of the holder's next acquire on
/// the same connection. Without a tokio
/// runtime, or when the store gives that release up (see the
/// [module docs](crate::lease) for when a Redis store retries), the lease
/// stays until its TTL runs out. Dropping during a panic's unwinding
/// releases too.
#[must_use = "dropping the guard releases the lease at once"]
pub struct LeaseGuard<L: Lease> {
    lease: Option<Arc<L>>,
    renewal: Renewal<L>,
}

/// How the lease is kept alive; dropping this stops it.
enum Renewal<L> {
    None,
    /// Its own task, stopped when the sender drops.
    Task {
        _stop: oneshot::Sender<()>,
    },
    /// A shared [`Renewer`], left when the registration drops.
    Shared {
        _registration: Registration<L>,
    },
}

impl<L: Lease> LeaseGuard<L> {
    /// Guards `lease`, without renewing it.
    pub fn new(lease: L) -> Self {
        LeaseGuard {
            lease: Some(Arc::new(lease)),
            renewal: Renewal::None,
        }
    }

    /// Renews the lease every `every` until the guard is dropped, on a
    /// spawned tokio task (a runtime with time enabled is needed; without a
    /// runtime nothing is renewed). Renewal stops by itself if the lease is
    /// found lost; failures are logged at `warn`, at most once a second,
    /// and retried at the next tick.
    pub fn renew_every(mut self, every: Duration) -> Self {
        let (Some(lease), Ok(runtime)) = (&self.lease, Handle::try_current()) else {
            return self;
        };
        let (stop, stopped) = oneshot::channel();
        runtime.spawn(renew_loop(lease.clone(), every, stopped));
        self.renewal = Renewal::Task { _stop: stop };
        self
    }

    /// Has `renewer` keep the lease alive until the guard is dropped: one
    /// background task for many leases (see [`Renewer`]). Without a tokio
    /// runtime nothing is renewed.
    pub fn renewed_by(mut self, renewer: &Renewer<L>) -> Self {
        if let Some(registration) = self
            .lease
            .as_ref()
            .and_then(|l| renewer.register(l.clone()))
        {
            self.renewal = Renewal::Shared {
                _registration: registration,
            };
        }
        self
    }

    /// The guarded lease.
    pub fn lease(&self) -> Option<&L> {
        self.lease.as_deref()
    }

    /// Releases the lease now; the same as dropping the guard.
    pub fn release(self) {}

    /// Lets go of the lease without releasing it: for a lease known not to
    /// be held (its acquire was refused).
    pub(crate) fn disarm(mut self) {
        self.renewal = Renewal::None;
        self.lease = None;
    }
}

async fn renew_loop<L: Lease>(lease: Arc<L>, every: Duration, mut stopped: oneshot::Receiver<()>) {
    loop {
        if tokio::time::timeout(every, &mut stopped).await.is_ok() {
            // The guard is gone (the sender was dropped).
            return;
        }
        match lease.renew().await {
            Ok(true) => {}
            Ok(false) => {
                log_lost();
                return;
            }
            Err(err) => log_renew_failure(&err),
        }
    }
}

impl<L: Lease> Drop for LeaseGuard<L> {
    fn drop(&mut self) {
        self.renewal = Renewal::None;
        let Some(lease) = self.lease.take() else {
            return;
        };
        let mut release = lease.release();
        let result = match release.take_ready() {
            Some(result) => result,
            None => {
                let Ok(runtime) = Handle::try_current() else {
                    tracing::debug!(
                        "no tokio runtime to release a lease; it expires after its TTL"
                    );
                    return;
                };
                // Started now, before the task it is handed to runs: the
                // release goes out ahead of the holder's next acquire on
                // the same connection, so a caller that calls again as
                // soon as its response ends does not find its own slot
                // still taken.
                match release.start() {
                    Some(result) => result,
                    None => {
                        runtime.spawn(async move {
                            if let Err(err) = release.await {
                                log_release_failure(&err);
                            }
                        });
                        return;
                    }
                }
            }
        };
        if let Err(err) = result {
            log_release_failure(&err);
        }
    }
}

impl<L: Lease + fmt::Debug> fmt::Debug for LeaseGuard<L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeaseGuard")
            .field("lease", &self.lease)
            .field("renewing", &!matches!(self.renewal, Renewal::None))
            .finish()
    }
}
