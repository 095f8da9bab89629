use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::runtime::Handle;
use tokio::time::Instant;

use super::{Lease, log_lost, log_renew_failure};

/// Renews many leases from one background task, so that a lease costs a
/// map insert and remove rather than a task of its own: the cheap choice
/// when most requests end long before their lease needs renewing.
///
/// Guards join it with [`LeaseGuard::renewed_by`](super::LeaseGuard::renewed_by).
/// The task wakes every quarter interval (at least every millisecond) and
/// renews each lease that would otherwise go longer than `every` without
/// renewal by the next wake-up: each lease is renewed every ¾ to 1
/// interval. It starts with the first lease and stops once no lease is
/// left. Clones share the same set.
pub struct Renewer<L: Lease> {
    shared: Arc<Renewals<L>>,
}

struct Renewals<L> {
    every: Duration,
    state: Mutex<State<L>>,
}

struct State<L> {
    leases: HashMap<u64, Entry<L>>,
    next: u64,
    running: bool,
}

struct Entry<L> {
    lease: Arc<L>,
    renewed_at: Instant,
}

impl<L: Lease> Renewer<L> {
    /// A renewer that renews each lease at least every `every` (which
    /// must be shorter than the leases' TTL).
    pub fn new(every: Duration) -> Self {
        Renewer {
            shared: Arc::new(Renewals {
                every,
                state: Mutex::new(State {
                    leases: HashMap::new(),
                    next: 0,
                    running: false,
                }),
            }),
        }
    }

    /// The longest a lease goes without renewal.
    pub fn every(&self) -> Duration {
        self.shared.every
    }

    /// How many leases it keeps alive.
    pub fn len(&self) -> usize {
        lock(&self.shared.state).leases.len()
    }

    /// Whether it keeps no lease alive.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The registrations of the leases `pick` picks, for
    /// [`forget`](Self::forget).
    pub(crate) fn registered(&self, pick: impl Fn(&L) -> bool) -> Vec<u64> {
        lock(&self.shared.state)
            .leases
            .iter()
            .filter(|(_, entry)| pick(&entry.lease))
            .map(|(&id, _)| id)
            .collect()
    }

    /// Stops renewing the leases of `ids`, as if their guards had left: for
    /// leases the store no longer holds (a reset dropped them), whose
    /// renewals would only find them gone. Their guards' registrations
    /// then remove nothing.
    pub(crate) fn forget(&self, ids: &[u64]) {
        let mut state = lock(&self.shared.state);
        for id in ids {
            state.leases.remove(id);
        }
    }

    /// Adds `lease` until the returned registration is dropped; `None`
    /// without a tokio runtime (nothing could renew it).
    pub(super) fn register(&self, lease: Arc<L>) -> Option<Registration<L>> {
        let runtime = Handle::try_current().ok()?;
        let mut state = lock(&self.shared.state);
        let id = state.next;
        state.next += 1;
        state.leases.insert(
            id,
            Entry {
                lease,
                renewed_at: Instant::now(),
            },
        );
        if !state.running {
            state.running = true;
            runtime.spawn(run(Running {
                shared: self.shared.clone(),
                stopped: false,
            }));
        }
        Some(Registration {
            shared: self.shared.clone(),
            id,
        })
    }
}

/// The renewal task's hold on the set; clears `running` however the task
/// ends (a runtime shutting down drops it), so that the next lease starts
/// a new one.
struct Running<L> {
    shared: Arc<Renewals<L>>,
    /// Set when the task cleared `running` itself: a new task may own the
    /// flag by the time this one is dropped.
    stopped: bool,
}

impl<L> Drop for Running<L> {
    fn drop(&mut self) {
        if !self.stopped {
            lock(&self.shared.state).running = false;
        }
    }
}

async fn run<L: Lease>(mut running: Running<L>) {
    let shared = running.shared.clone();
    let tick = (shared.every / 4).max(Duration::from_millis(1));
    let due_after = shared.every.saturating_sub(tick);
    loop {
        tokio::time::sleep(tick).await;
        let due: Vec<(u64, Arc<L>)> = {
            let mut state = lock(&shared.state);
            if state.leases.is_empty() {
                state.running = false;
                running.stopped = true;
                return;
            }
            let now = Instant::now();
            state
                .leases
                .iter_mut()
                .filter(|(_, e)| now.duration_since(e.renewed_at) >= due_after)
                .map(|(id, e)| {
                    e.renewed_at = now;
                    (*id, e.lease.clone())
                })
                .collect()
        };
        for (id, lease) in due {
            let shared = shared.clone();
            tokio::spawn(async move {
                match lease.renew().await {
                    Ok(true) => {}
                    Ok(false) => {
                        // Not if the lease left meanwhile (its guard
                        // dropped, or a reset dropped the lease on purpose).
                        if lock(&shared.state).leases.remove(&id).is_some() {
                            log_lost();
                        }
                    }
                    Err(err) => log_renew_failure(&err),
                }
            });
        }
    }
}

/// A lease's place in a [`Renewer`]; dropping it stops the renewals.
pub(super) struct Registration<L> {
    shared: Arc<Renewals<L>>,
    id: u64,
}

impl<L> Drop for Registration<L> {
    fn drop(&mut self) {
        lock(&self.shared.state).leases.remove(&self.id);
    }
}

impl<L: Lease> Clone for Renewer<L> {
    fn clone(&self) -> Self {
        Renewer {
            shared: self.shared.clone(),
        }
    }
}

impl<L: Lease> fmt::Debug for Renewer<L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Renewer")
            .field("every", &self.shared.every)
            .field("leases", &self.len())
            .finish()
    }
}

/// The state is a map and a flag, consistent after every step: a panic
/// elsewhere while it was held changes nothing.
fn lock<L>(state: &Mutex<State<L>>) -> MutexGuard<'_, State<L>> {
    state
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}
