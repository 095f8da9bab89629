use std::collections::hash_map::RandomState;
use std::fmt;
use std::hash::{BuildHasher, Hasher};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

mod defer;
mod lease;
mod slot;
mod window;

use super::{DeferCall, GcraCall, LeaseCall, LeaseGrant, Store, StoreFuture, WindowCall};
use crate::clock::{Clock, FastClock};
use crate::decision::Decision;
use crate::gcra;
use crate::key::Key;
use crate::limit::{Limit, MAX_LIMITS_PER_POLICY, Policy};
use slot::{Slot, SlotMap, Step, Tats};

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
/// Clones share the same state. Time comes from a [`Clock`]:
/// [`FastClock`] by default, the CPU's counter. For tests that drive time
/// with `tokio::time::pause`, build the store with
/// [`MonotonicClock`](crate::clock::MonotonicClock), which follows tokio's
/// clock (see [`MemoryStoreBuilder::clock`]).
#[derive(Clone)]
pub struct MemoryStore {
    inner: Arc<Inner>,
}

struct Inner {
    /// Deciding on a known key only reads its shard's map (the state itself
    /// is atomic), so threads share a shard; a new key takes it for writing.
    shards: Box<[RwLock<Shard>]>,
    hasher: RandomState,
    clock: Arc<dyn Clock>,
    windows: window::Table,
    leases: lease::Leases,
}

/// Aligned to two cache lines (what adjacent-line prefetching pairs), so
/// that neighbouring shards' locks never share a line, and a shard's own
/// lock word (written by every reader) sits apart from its map's header
/// (only read).
#[derive(Default)]
#[repr(align(128))]
struct Shard {
    map: SlotMap,
    sweep_at: usize,
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
            .map(|s| read(s).map.len())
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
            write(shard).sweep(now, &self.inner.hasher);
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
        let check = Check {
            cost: call.cost,
            max_wait: call.max_wait_us(),
        };
        self.with_tats(call.policy, call.key, &check)
    }

    /// Runs `step` on the GCRA state of `policy` for `key` (zeros when
    /// there is none) at the current time, and stores the state when the
    /// step says so.
    #[inline(always)]
    fn with_tats<S: Step>(&self, policy: &Policy, key: &Key, step: &S) -> S::Output {
        let limits = policy.limits();
        // Read first: the counter's read overlaps with the hashing.
        let now = self.inner.clock.now_micros();
        let hash = hash_key(&self.inner.hasher, key);
        let shard = &self.inner.shards[shard_index(hash, self.inner.shards.len())];
        {
            let map = read(shard);
            if let Some(slot) = map.map.find(hash, |slot| slot.is(key, policy)) {
                // A policy of the same name with more limits (edited, or two
                // limiters sharing a name) first needs its state grown.
                if slot.tats.len() >= limits.len() {
                    return slot.tats.update(limits, now, step);
                }
            }
        }
        self.insert_tats(shard, policy, key, hash, step)
    }

    /// [`with_tats`](Self::with_tats) for a key the shard does not hold yet
    /// (or holds with fewer limits): under the shard's write lock. Kept out
    /// of line, so that the common path stays small.
    #[inline(never)]
    fn insert_tats<S: Step>(
        &self,
        shard: &RwLock<Shard>,
        policy: &Policy,
        key: &Key,
        hash: u64,
        step: &S,
    ) -> S::Output {
        let limits = policy.limits();
        let mut shard = write(shard);
        let now = self.inner.clock.now_micros();
        if let Some(Slot { tats, .. }) = shard.map.find_mut(hash, |slot| slot.is(key, policy)) {
            // Keep each limit's state by position, as the Redis keys
            // `…:{key}:<i>` do: starting afresh instead would let two such
            // limiters reset each other on every call and admit everything.
            // Extra positions (a policy with fewer limits) keep their state
            // untouched, like Redis keys the script does not name.
            tats.grow(limits.len());
            return tats.update(limits, now, step);
        }
        let mut tats = [0u64; MAX_LIMITS_PER_POLICY];
        let tats = &mut tats[..limits.len()];
        let (result, store) = step.run(limits, tats, now);
        if store {
            let slot = Slot::new(key.clone(), policy.clone(), Tats::new(tats));
            shard.insert(hash, slot, now, &self.inner.hasher);
        }
        result
    }
}

/// A GCRA check (or reservation): stores the TATs when admitted.
struct Check {
    cost: u64,
    max_wait: u64,
}

impl Step for Check {
    type Output = Decision;

    #[inline(always)]
    fn run(&self, limits: &[Limit], tats: &mut [u64], now: u64) -> (Decision, bool) {
        let (decision, idle_at) = gcra::decide(limits, tats, now, self.cost, self.max_wait);
        (decision, idle_at.is_some())
    }
}

impl Shard {
    fn insert(&mut self, hash: u64, slot: Slot, now: u64, hasher: &RandomState) {
        if self.map.len() >= self.sweep_at.max(MIN_SWEEP) {
            self.sweep(now, hasher);
        }
        self.map
            .insert_unique(hash, slot, |slot| hash_key(hasher, slot.key()));
    }

    fn sweep(&mut self, now: u64, hasher: &RandomState) {
        self.map.retain(|slot| slot.tats.idle_at() > now);
        self.sweep_at = self.map.len().saturating_mul(2);
        if self.map.capacity() > self.sweep_at.max(MIN_SWEEP) * 2 {
            self.map.shrink_to(self.sweep_at.max(MIN_SWEEP), |slot| {
                hash_key(hasher, slot.key())
            });
        }
    }
}

/// A key's hash under the store's randomly keyed SipHash: its bytes (the
/// text, or an IP key's address) alone, without the terminator byte that
/// hashing a `str` adds (needed only where several values are hashed one
/// after another). About a quarter fewer instructions than
/// `hash_one(&str)`, and the same resistance to crafted collisions.
#[inline]
fn hash_key(hasher: &RandomState, key: &Key) -> u64 {
    let mut state = hasher.build_hasher();
    state.write(key.hash_bytes());
    state.finish()
}

/// The shard for a hash: 32 bits from below the top seven, scaled to the
/// shard count (a multiply and a shift, no division). The map inside the
/// shard picks a bucket with the lowest bits and tells entries apart within
/// a group of buckets by the top seven: were the shard taken from the top
/// bits too, every entry of a shard would share some of those seven, and a
/// lookup would compare many more keys than it needs to.
fn shard_index(hash: u64, shards: usize) -> usize {
    ((((hash << 7) >> 32) * shards as u64) >> 32) as usize
}

/// A poisoned shard only means another thread panicked while holding it;
/// its state is a set of plain numbers that are always consistent.
fn read(shard: &RwLock<Shard>) -> RwLockReadGuard<'_, Shard> {
    shard
        .read()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// See [`read`].
fn write(shard: &RwLock<Shard>) -> RwLockWriteGuard<'_, Shard> {
    shard
        .write()
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

    fn gcra_now(&self, call: GcraCall<'_>) -> Option<Decision> {
        Some(self.decide(&call))
    }

    fn window_now(&self, call: WindowCall<'_>) -> Option<Decision> {
        Some(self.decide_window(&call))
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

    /// The clock (default: [`FastClock`]).
    ///
    /// ```
    /// use fleetgate::MemoryStore;
    /// use fleetgate::clock::MonotonicClock;
    ///
    /// // Follows `tokio::time::pause` and `advance`, for tests.
    /// let store = MemoryStore::builder().clock(MonotonicClock::new()).build();
    /// # drop(store);
    /// ```
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
                shards: (0..shards).map(|_| RwLock::new(Shard::default())).collect(),
                hasher: RandomState::new(),
                clock: self.clock.unwrap_or_else(|| Arc::new(FastClock::new())),
                windows: window::Table::new(shards),
                leases: lease::Leases::new(shards),
            }),
        }
    }
}
