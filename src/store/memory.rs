use std::collections::HashMap;
use std::collections::hash_map::RandomState;
use std::fmt;
use std::hash::BuildHasher;
use std::sync::{Arc, Mutex, MutexGuard};

mod defer;
mod lease;
mod window;

use super::{DeferCall, GcraCall, LeaseCall, LeaseGrant, Store, StoreFuture, WindowCall};
use crate::clock::{Clock, MonotonicClock};
use crate::decision::Decision;
use crate::gcra::{self, Params};
use crate::key::Key;
use crate::limit::MAX_LIMITS_PER_POLICY;

/// A shard sweeps expired state once it holds this many entries, and after
/// that whenever it has doubled since the last sweep.
const MIN_SWEEP: usize = 1024;

/// Limiter state in this process: the embedded default.
///
/// A sharded map from (policy, key) to GCRA state. Nothing lives longer than
/// it matters: an entry whose every limit has refilled is equivalent to no
/// entry, and such entries are swept whenever a shard has doubled in size,
/// so memory stays proportional to the keys active within one burst window,
/// whatever the number of distinct keys thrown at it.
///
/// Clones share the same state. Time comes from a [`Clock`]
/// ([`MonotonicClock`] by default, which follows `tokio::time::pause`).
#[derive(Clone)]
pub struct MemoryStore {
    inner: Arc<Inner>,
}

struct Inner {
    shards: Box<[Mutex<Shard>]>,
    hasher: RandomState,
    clock: Arc<dyn Clock>,
    windows: window::Table,
    leases: lease::Leases,
}

/// Keyed by identity alone, so that a lookup borrows the caller's key and
/// touches no shared reference count; the few policies that limit one
/// identity sit side by side in its slot.
#[derive(Default)]
struct Shard {
    map: HashMap<Key, Vec<Entry>>,
    entries: usize,
    sweep_at: usize,
}

struct Entry {
    policy: Arc<str>,
    tats: Box<[u64]>,
    /// When every limit has refilled: from then on the entry means nothing.
    idle_at: u64,
}

impl MemoryStore {
    /// A store with the default clock and shard count.
    pub fn new() -> Self {
        MemoryStore::builder().build()
    }

    /// Configures a store.
    pub fn builder() -> MemoryStoreBuilder {
        MemoryStoreBuilder {
            shards: None,
            clock: None,
        }
    }

    /// How many entries the store holds, expired ones included until they
    /// are swept.
    pub fn len(&self) -> usize {
        self.inner
            .shards
            .iter()
            .map(|s| lock(s).entries)
            .sum::<usize>()
            + self.inner.windows.len()
    }

    /// Whether the store holds no entries.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Drops every entry that no longer matters. This also happens by
    /// itself as shards grow; call it to reclaim memory eagerly.
    pub fn sweep(&self) {
        let now = self.inner.clock.now_micros();
        for shard in self.inner.shards.iter() {
            lock(shard).sweep(now);
        }
        self.inner.windows.sweep(now);
        self.inner.leases.sweep(now);
    }

    /// How many concurrency leases the store holds, expired ones included
    /// until an acquire on their key or a sweep drops them.
    pub fn lease_count(&self) -> usize {
        self.inner.leases.count()
    }

    fn decide(&self, call: &GcraCall<'_>) -> Decision {
        let limits = call.policy.limits();
        let mut params = [Params {
            emission: 1,
            tolerance: 0,
        }; MAX_LIMITS_PER_POLICY];
        for (p, limit) in params.iter_mut().zip(limits) {
            *p = Params {
                emission: limit.emission_us(),
                tolerance: limit.tolerance_us(),
            };
        }
        let params = &params[..limits.len()];
        let shard_index =
            self.inner.hasher.hash_one(call.key.as_str()) as usize % self.inner.shards.len();
        let mut shard = lock(&self.inner.shards[shard_index]);
        let now = self.inner.clock.now_micros();
        let max_wait = call.max_wait_us();
        let policy = call.policy.name();
        let existing = shard
            .map
            .get_mut(call.key.as_str())
            .and_then(|slot| slot.iter_mut().find(|e| &*e.policy == policy));
        if let Some(entry) = existing {
            if entry.tats.len() < params.len() {
                // A policy of the same name with more limits (edited, or two
                // limiters sharing a name): keep each limit's state by
                // position, as the Redis keys `…:{key}:<i>` do. Starting
                // afresh instead would let two such limiters reset each
                // other on every call and admit everything.
                let mut tats = vec![0u64; params.len()].into_boxed_slice();
                tats[..entry.tats.len()].copy_from_slice(&entry.tats);
                entry.tats = tats;
            }
            // Extra positions (a policy with fewer limits) keep their state
            // untouched, like Redis keys the script does not name.
            let (decision, idle_at) = gcra::decide(
                params,
                &mut entry.tats[..params.len()],
                now,
                call.cost,
                max_wait,
            );
            if let Some(idle_at) = idle_at {
                entry.idle_at = entry.idle_at.max(idle_at);
            }
            return decision;
        }
        let mut tats = vec![0u64; params.len()].into_boxed_slice();
        let (decision, idle_at) = gcra::decide(params, &mut tats, now, call.cost, max_wait);
        if let Some(idle_at) = idle_at {
            let entry = Entry {
                policy: call.policy.name_arc(),
                tats,
                idle_at,
            };
            shard.insert(call.key, entry, now);
        }
        decision
    }
}

impl Shard {
    fn insert(&mut self, key: &Key, entry: Entry, now: u64) {
        if self.entries >= self.sweep_at.max(MIN_SWEEP) {
            self.sweep(now);
        }
        match self.map.get_mut(key.as_str()) {
            Some(slot) => slot.push(entry),
            None => {
                self.map.insert(key.clone(), vec![entry]);
            }
        }
        self.entries += 1;
    }

    fn sweep(&mut self, now: u64) {
        self.map.retain(|_, slot| {
            slot.retain(|entry| entry.idle_at > now);
            !slot.is_empty()
        });
        self.entries = self.map.values().map(Vec::len).sum();
        self.sweep_at = self.entries.saturating_mul(2);
        if self.map.capacity() > self.sweep_at.max(MIN_SWEEP) * 2 {
            self.map.shrink_to(self.sweep_at.max(MIN_SWEEP));
        }
    }
}

/// A poisoned shard only means another thread panicked while holding it;
/// its state is a set of plain numbers that are always consistent.
fn lock(shard: &Mutex<Shard>) -> MutexGuard<'_, Shard> {
    shard
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Default for MemoryStore {
    fn default() -> Self {
        MemoryStore::new()
    }
}

impl fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryStore")
            .field("shards", &self.inner.shards.len())
            .field("clock", &self.inner.clock)
            .finish()
    }
}

impl Store for MemoryStore {
    fn gcra(&self, call: GcraCall<'_>) -> StoreFuture<Decision> {
        StoreFuture::ready(Ok(self.decide(&call)))
    }

    fn window(&self, call: WindowCall<'_>) -> StoreFuture<Decision> {
        StoreFuture::ready(Ok(self.decide_window(&call)))
    }

    fn kind(&self) -> &'static str {
        "memory"
    }

    fn gcra_defer(&self, call: DeferCall<'_>) -> StoreFuture<()> {
        self.defer(&call);
        StoreFuture::ready(Ok(()))
    }

    fn lease_acquire(&self, call: LeaseCall<'_>) -> StoreFuture<LeaseGrant> {
        let now = self.inner.clock.now_micros();
        StoreFuture::ready(Ok(self.inner.leases.acquire(&call, now)))
    }

    fn lease_release(&self, call: LeaseCall<'_>) -> StoreFuture<bool> {
        StoreFuture::ready(Ok(self.inner.leases.release(&call)))
    }

    fn lease_renew(&self, call: LeaseCall<'_>) -> StoreFuture<bool> {
        let now = self.inner.clock.now_micros();
        StoreFuture::ready(Ok(self.inner.leases.renew(&call, now)))
    }
}

/// Configures a [`MemoryStore`]; see [`MemoryStore::builder`].
#[derive(Debug)]
#[must_use]
pub struct MemoryStoreBuilder {
    shards: Option<usize>,
    clock: Option<Arc<dyn Clock>>,
}

impl MemoryStoreBuilder {
    /// The number of shards (default: 16 per available core, at least 16).
    pub fn shards(mut self, shards: usize) -> Self {
        self.shards = Some(shards.max(1));
        self
    }

    /// The clock (default: [`MonotonicClock`]).
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Some(Arc::new(clock));
        self
    }

    /// Builds the store.
    pub fn build(self) -> MemoryStore {
        let shards = self.shards.unwrap_or_else(|| {
            let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
            (cores * 16).max(16)
        });
        MemoryStore {
            inner: Arc::new(Inner {
                shards: (0..shards).map(|_| Mutex::new(Shard::default())).collect(),
                hasher: RandomState::new(),
                clock: self
                    .clock
                    .unwrap_or_else(|| Arc::new(MonotonicClock::new())),
                windows: window::Table::new(shards),
                leases: lease::Leases::new(shards),
            }),
        }
    }
}
