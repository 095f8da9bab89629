use std::collections::HashMap;
use std::collections::hash_map::RandomState;
use std::fmt;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard, TryLockError};

mod lease;
mod run;
mod slot;
mod window;

use super::{
    Answer, BudgetCall, BudgetTake, Call, LeaseAnswer, LeaseCall, LeaseOp, Store, StoreFuture,
    StoreOps,
};
use crate::algorithm::budget;
use crate::clock::{Clock, FastClock};
use crate::error::ConfigError;
use crate::key::Key;
use crate::policy::{MAX_LIMITS_PER_POLICY, Policy};
use slot::{Slot, SlotMap, Step, Tats};

/// The default bound of [`MemoryStoreBuilder::max_keys`]: entries of each
/// kind of state (GCRA, window algorithms, concurrency leases).
pub(crate) const DEFAULT_MAX_KEYS: usize = 1_000_000;

/// A swept table keeps at least this many buckets per shard, so that a
/// shard whose traffic comes and goes is not shrunk and regrown each time.
const MIN_CAPACITY: usize = 256;

/// Every shard is swept about once per this many microseconds, so that
/// expired state goes within about this long of expiring (given calls).
const SWEEP_PERIOD: u64 = 1_000_000;

/// A call sweeps at most this many shards (of each table), so that no
/// call pays for more than a small part of the store after an idle spell.
const SWEEP_PER_CALL: usize = 64;

/// A call sweeps no further shard once its sweeps have looked at this
/// many entries: with [`MAX_SHARD_ENTRIES`], no call looks at more than
/// this plus one shard of each table.
const SWEEP_BUDGET: usize = 4096;

/// The largest bound [`MemoryStoreBuilder::max_keys`] takes.
const MAX_MAX_KEYS: usize = 100_000_000;

/// The most entries a shard of any table holds: the store has at least
/// one shard per this many entries of its bound, so that a sweep or an
/// eviction, which handles a whole shard under its lock, stays short
/// however large the bound.
pub(crate) const MAX_SHARD_ENTRIES: usize = 4096;

/// Limiter state in this process: the embedded default.
///
/// A sharded map from (policy, identity) to the state of its algorithm:
/// GCRA's theoretical arrival times, a sliding log's admitted times, the
/// counters of the window algorithms, and concurrency leases. Clones share
/// the same state.
///
/// # Bounded memory
///
/// The store holds at most [`max_keys`](MemoryStoreBuilder::max_keys)
/// entries of each kind of state (1,000,000 by default): GCRA
/// entries, window entries (one per identity, policy and algorithm), and
/// lease sets (one per identity and concurrency limit). The bound is split
/// evenly over the shards, so it holds at every moment, whatever the number
/// of distinct identities thrown at the store. There are enough shards that
/// none holds more than 4096 entries of a kind (more than
/// [`shards`](MemoryStoreBuilder::shards) asks for, if need be): sweeping
/// or evicting, which handles one shard under its lock, stays that short.
///
/// Nothing lives longer than it matters: an entry whose every limit has
/// refilled (or whose every window has passed, or whose every lease has
/// expired) is equivalent to no entry. Such expired state is dropped as
/// calls come: the shards fall due for a sweep in turn, a round over all
/// of them a second, and a call sweeps those that are due, stopping once
/// it has looked at 4096 entries (or swept 64 shards). So expired state
/// goes within about a second of expiring even when no new identity
/// arrives, given calls (a store holding many entries and seeing few calls
/// catches up over several calls, 4096 entries each), and the tables
/// shrink after a flood so that the memory can go back to the allocator.
/// No call looks at more than 4096 entries plus one shard of each kind. No
/// background task runs: a store nobody calls sweeps nothing until its
/// next call (or [`sweep`](MemoryStore::sweep)).
///
/// When a shard is full, a new entry first makes room by dropping expired
/// state. If that frees less than an eighth of the shard, the live entries
/// closest to expiry are evicted down to seven eighths, so that evicting
/// costs a constant amount per new entry on average. Each evicted live
/// entry is counted ([`MemoryStore::stats`], and the
/// `fleetgate_memory_evictions_total` metric). What eviction means:
///
/// - **GCRA**: an entry ranks by when its limits have fully refilled, so
///   the entries evicted first are those that remember least; an evicted
///   identity starts afresh with its full burst. An identity that keeps
///   calling past its limit (of burst 2 or more) ranks above every
///   identity of the same policy that has made one call since, and keeps
///   its state. With burst 1 it ranks by its last admitted call, and a
///   flood of more than the bound's worth of new identities within one
///   emission interval can evict it: it is then admitted once more.
/// - **Window algorithms**: an entry ranks by the later of when its windows
///   have passed and how long its last call (admitted or not) can matter:
///   one longest window, two for the sliding-window counter. An identity
///   that keeps calling keeps its state against a flood of its own policy.
///   An evicted identity forgets its counts; an evicted sliding-log
///   identity forgets its whole history, and is admitted its full quota
///   again.
/// - **Across policies** the ranks are absolute times, compared as they
///   are: all GCRA policies share one table, all window policies another.
///   An identity that keeps calling under one policy keeps its state
///   against a flood of new identities under another only while each of
///   those ranks below it. A flood under a policy whose state matters
///   longer (a longer refill, or longer windows) outranks it, and once the
///   flood fills the calling identity's shard, that identity's state can
///   be evicted: it starts afresh, admitted up to its limit again. Where one policy must not lose its clients' state to
///   another's flood, give the two policies separate stores, or a bound
///   above what a flood can fill.
/// - **Leases** are never evicted while they are held: an acquire that
///   would need a new lease set in a shard full of held leases is refused
///   (counted in [`MemoryStoreStats::lease_refusals`]), as if the limit were
///   reached, with the time until the shard's soonest lease expires. Held
///   leases are bounded by the requests in flight, not by the identities
///   seen. The bound is per shard, like the others: a new key whose shard
///   is full of held leases is refused even while other shards have room,
///   so refusals can begin before the store as a whole holds
///   [`max_keys`](MemoryStoreBuilder::max_keys) lease sets: keys land on
///   shards by hash, unevenly, the more so the smaller each shard's share.
///
/// Time comes from a [`Clock`]: [`FastClock`] by default, the CPU's
/// counter. For tests that drive time with `tokio::time::pause`, build the
/// store with [`MonotonicClock`](crate::clock::MonotonicClock), which
/// follows tokio's clock (see [`MemoryStoreBuilder::clock`]).
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
    sweeper: Sweeper,
    /// The bound of each kind of state, as configured.
    max_keys: usize,
    /// Live entries evicted to stay within the bound.
    evictions: AtomicU64,
    /// Lease acquires refused because their shard was full of held leases.
    lease_refusals: AtomicU64,
    /// Each retry budget's state, by name: as many as the program builds
    /// budgets, a few (names are the program's, never a caller's).
    budgets: Mutex<HashMap<String, budget::State>>,
}

/// Which shard is swept next, and when.
struct Sweeper {
    /// The clock's time after which the next shard is due.
    next: AtomicU64,
    /// The next shard's index; held by the one call sweeping.
    cursor: Mutex<usize>,
    /// Between two shards' sweeps: a round over all shards takes
    /// [`SWEEP_PERIOD`].
    step: u64,
}

/// Aligned to two cache lines (what adjacent-line prefetching pairs), so
/// that neighbouring shards' locks never share a line, and a shard's own
/// lock word (written by every reader) sits apart from its map's header
/// (only read).
#[repr(align(128))]
struct Shard {
    map: SlotMap,
    /// The most entries this shard holds: its part of the bound.
    cap: usize,
    /// No entry expires before then (every entry's state only moves
    /// later), so that a sweep before then has nothing to drop.
    earliest: u64,
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
            max_keys: DEFAULT_MAX_KEYS,
        }
    }

    /// How many GCRA and window entries the store holds, expired ones
    /// included until they are swept.
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

    /// Drops every entry that no longer matters, in every shard. This also
    /// happens by itself, a few shards per call; call it to reclaim memory
    /// at once.
    pub fn sweep(&self) {
        let now = self.inner.clock.now_micros();
        for index in 0..self.inner.shards.len() {
            self.inner.sweep_shard(index, now);
        }
    }

    /// What the store's bound has cost so far: live entries evicted, and
    /// lease acquires refused.
    pub fn stats(&self) -> MemoryStoreStats {
        MemoryStoreStats {
            evictions: self.inner.evictions.load(Ordering::Relaxed),
            lease_refusals: self.inner.lease_refusals.load(Ordering::Relaxed),
        }
    }

    /// How many concurrency leases the store holds, expired ones included
    /// until an acquire on their key or a sweep drops them.
    pub fn lease_count(&self) -> usize {
        self.inner.leases.count()
    }

    /// Removes every state of `key` under `name`: its GCRA entry, its
    /// window entries and its lease set, so that their memory is freed.
    fn remove(&self, name: &str, key: &Key) {
        let hash = hash_key(&self.inner.hasher, key);
        let shard = &self.inner.shards[shard_index(hash, self.inner.shards.len())];
        if let Ok(entry) = write(shard)
            .map
            .find_entry(hash, |slot| slot.is_named(key, name))
        {
            entry.remove();
        }
        self.inner.windows.remove(&self.inner.hasher, name, key);
        self.inner.leases.remove(name, key);
    }

    /// Runs `step` on the GCRA state of `policy` for `key` (zeros when
    /// there is none) at the current time, and stores the state when the
    /// step says so.
    #[inline(always)]
    fn with_tats<S: Step>(&self, policy: &Policy, key: &Key, step: &S) -> S::Output {
        let limits = policy.limits();
        // Read first: the counter's read overlaps with the hashing.
        let now = self.inner.clock.now_micros();
        self.inner.tick(now);
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
            let mut slot = Slot::new(key.clone(), policy.clone(), Tats::new(tats));
            let evicted = shard.make_room(now, &self.inner.hasher);
            shard.earliest = shard.earliest.min(slot.tats.idle_at());
            shard
                .map
                .insert_unique(hash, slot, |slot| hash_key(&self.inner.hasher, slot.key()));
            drop(shard);
            self.inner.evicted(evicted, "gcra");
        }
        result
    }
}

impl Inner {
    /// Sweeps the shards that are due, if any: a load and a compare on
    /// most calls.
    #[inline(always)]
    fn tick(&self, now: u64) {
        if now > self.sweeper.next.load(Ordering::Relaxed) {
            self.sweep_due(now);
        }
    }

    /// Sweeps the shards that are due, one after another, in turn: up to
    /// [`SWEEP_PER_CALL`] of them, and none more once [`SWEEP_BUDGET`]
    /// entries have been looked at. One call at a time: the others go on
    /// at once. Returns how many entries the sweeps looked at.
    #[cold]
    #[inline(never)]
    fn sweep_due(&self, now: u64) -> usize {
        let mut cursor = match self.sweeper.cursor.try_lock() {
            Ok(cursor) => cursor,
            Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
            Err(TryLockError::WouldBlock) => return 0,
        };
        // However long the store sat idle, it owes one round at most.
        let mut next = self
            .sweeper
            .next
            .load(Ordering::Relaxed)
            .max(now.saturating_sub(SWEEP_PERIOD));
        let mut swept = 0;
        let mut visited = 0;
        while now > next && swept < SWEEP_PER_CALL && visited < SWEEP_BUDGET {
            visited += self.sweep_shard(*cursor, now);
            *cursor = (*cursor + 1) % self.shards.len();
            next = next.saturating_add(self.sweeper.step);
            swept += 1;
        }
        self.sweeper.next.store(next, Ordering::Relaxed);
        visited
    }

    /// Drops the expired state of shard `index` of every table; one lock
    /// at a time. Returns how many entries it looked at.
    fn sweep_shard(&self, index: usize, now: u64) -> usize {
        let mut visited = 0;
        if let Some(shard) = self.shards.get(index) {
            visited += write(shard).sweep(now, &self.hasher);
        }
        visited += self.windows.sweep_shard(index, now);
        visited + self.leases.sweep_shard(index, now)
    }

    /// Counts `count` live entries of `kind` evicted.
    fn evicted(&self, count: u64, kind: &'static str) {
        if count > 0 {
            self.evictions.fetch_add(count, Ordering::Relaxed);
            crate::metrics::memory_evicted(kind, count);
        }
    }

    /// Counts one lease acquire refused for want of room.
    fn lease_refused(&self) {
        self.lease_refusals.fetch_add(1, Ordering::Relaxed);
        crate::metrics::memory_lease_refused();
    }
}

/// How many entries shard `index` of `shards` may hold: `max_keys` split
/// as evenly as whole numbers allow, summing to `max_keys`.
fn shard_cap(max_keys: usize, shards: usize, index: usize) -> usize {
    max_keys / shards + usize::from(index < max_keys % shards)
}

/// How many entries a full shard keeps after evicting live ones: seven
/// eighths, and room for one more at least.
fn keep_after_eviction(cap: usize) -> usize {
    cap - (cap / 8).max(1)
}

/// The entries to evict from a shard holding `ranks.len()` entries so that
/// `keep` stay: those ranked lowest. Returns the rank below which every
/// entry goes, and how many entries ranked exactly there go too (ties
/// split exactly, so that no more than needed are evicted).
fn eviction_cut(ranks: &mut [u64], keep: usize) -> (u64, usize) {
    let excess = ranks.len().saturating_sub(keep);
    if excess == 0 {
        return (0, 0);
    }
    let (below, &mut cut, _) = ranks.select_nth_unstable(excess - 1);
    let strictly_below = below.iter().filter(|&&r| r < cut).count();
    (cut, excess - strictly_below)
}

impl Shard {
    fn new(cap: usize) -> Self {
        Shard {
            map: SlotMap::new(),
            cap,
            earliest: u64::MAX,
        }
    }

    /// Makes room for one more entry in a full shard: drops expired
    /// entries, then, if that left more than seven eighths, the live ones
    /// that refill soonest. Returns how many live entries went.
    fn make_room(&mut self, now: u64, hasher: &RandomState) -> u64 {
        if self.map.len() < self.cap {
            return 0;
        }
        self.sweep(now, hasher);
        let keep = keep_after_eviction(self.cap);
        if self.map.len() <= keep {
            return 0;
        }
        let mut ranks: Vec<u64> = self.map.iter_mut().map(|s| s.tats.idle_at()).collect();
        let (cut, mut ties) = eviction_cut(&mut ranks, keep);
        let before = self.map.len();
        let mut earliest = u64::MAX;
        self.map.retain(|slot| {
            let rank = slot.tats.idle_at();
            let evict = rank < cut
                || (rank == cut && ties > 0 && {
                    ties -= 1;
                    true
                });
            if !evict {
                earliest = earliest.min(rank);
            }
            !evict
        });
        self.earliest = earliest;
        (before - self.map.len()) as u64
    }

    /// Drops the entries whose limits have all refilled, and shrinks the
    /// table when it has become mostly empty. Returns how many entries it
    /// looked at.
    fn sweep(&mut self, now: u64, hasher: &RandomState) -> usize {
        if now < self.earliest {
            return 0;
        }
        let visited = self.map.len();
        let mut earliest = u64::MAX;
        self.map.retain(|slot| {
            let idle_at = slot.tats.idle_at();
            let keep = idle_at > now;
            if keep {
                earliest = earliest.min(idle_at);
            }
            keep
        });
        self.earliest = earliest;
        let floor = (2 * self.map.len()).max(MIN_CAPACITY);
        if self.map.capacity() > 2 * floor {
            self.map
                .shrink_to(floor, |slot| hash_key(hasher, slot.key()));
        }
        visited
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
            .field("max_keys", &self.inner.max_keys)
            .field("clock", &self.inner.clock)
            .finish()
    }
}

impl Store for MemoryStore {
    fn kind(&self) -> &'static str {
        "memory"
    }
}

impl StoreOps for MemoryStore {
    fn run(&self, call: Call<'_>) -> StoreFuture<Answer> {
        StoreFuture::ready(Ok(self.run_call(&call)))
    }

    fn run_now(&self, call: Call<'_>) -> Option<Answer> {
        Some(self.run_call(&call))
    }

    fn lease(&self, call: LeaseCall<'_>, op: LeaseOp) -> StoreFuture<LeaseAnswer> {
        let leases = &self.inner.leases;
        let answer = match op {
            LeaseOp::Acquire => {
                let now = self.inner.clock.now_micros();
                self.inner.tick(now);
                LeaseAnswer::Grant(match leases.acquire(&call, now) {
                    lease::Acquired::Grant(grant) => grant,
                    lease::Acquired::Full(grant) => {
                        self.inner.lease_refused();
                        grant
                    }
                })
            }
            LeaseOp::Release => LeaseAnswer::Held(leases.release(&call)),
            LeaseOp::Renew => {
                let now = self.inner.clock.now_micros();
                self.inner.tick(now);
                LeaseAnswer::Held(leases.renew(&call, now))
            }
        };
        StoreFuture::ready(Ok(answer))
    }

    fn reset(&self, name: &str, key: &Key) -> StoreFuture<()> {
        self.remove(name, key);
        self.remove(&Policy::penalty_box_name(name), key);
        StoreFuture::ready(Ok(()))
    }

    fn budget(&self, call: BudgetCall<'_>) -> StoreFuture<BudgetTake> {
        let now = self.inner.clock.now_micros();
        let mut budgets = self.inner.budgets.lock().unwrap_or_else(|e| e.into_inner());
        let state = budgets.get(call.name).copied();
        let (state, granted, left) =
            budget::take(state, now, call.params, call.deposits, call.want);
        match budgets.get_mut(call.name) {
            Some(stored) => *stored = state,
            None => {
                budgets.insert(call.name.to_owned(), state);
            }
        }
        StoreFuture::ready(Ok(BudgetTake { granted, left }))
    }
}

/// What a [`MemoryStore`]'s bound has cost, read with
/// [`MemoryStore::stats`]. Counted since the store was built.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct MemoryStoreStats {
    /// Live entries (GCRA or window state that still mattered) evicted
    /// because their shard was full; each such identity starts afresh.
    pub evictions: u64,
    /// Lease acquires refused because they needed a new lease set in a
    /// shard full of held leases.
    pub lease_refusals: u64,
}

/// Configures a [`MemoryStore`]; see [`MemoryStore::builder`].
#[derive(Debug)]
#[must_use]
pub struct MemoryStoreBuilder {
    shards: Option<usize>,
    clock: Option<Arc<dyn Clock>>,
    max_keys: usize,
}

impl MemoryStoreBuilder {
    /// The number of shards (default: 16 per available core, at least 16),
    /// raised to one per 4096 entries of [`max_keys`](Self::max_keys) when
    /// it is fewer.
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

    /// The most entries the store holds of each kind of state (default
    /// 1,000,000): GCRA entries, window entries and lease sets,
    /// each counted apart. An entry is one identity's state under one
    /// policy (or concurrency limit); see [`MemoryStore`] for what happens
    /// at the bound. Refuses `0` and anything above 100,000,000: the store
    /// makes one shard per 4096 entries of the bound when it is built
    /// (about 10 MB at the maximum), and a hundred million identities'
    /// state would outgrow most machines anyway.
    ///
    /// ```
    /// use fleetgate::MemoryStore;
    ///
    /// let store = MemoryStore::builder().max_keys(100_000)?.build();
    /// # drop(store);
    /// assert!(MemoryStore::builder().max_keys(0).is_err());
    /// assert!(MemoryStore::builder().max_keys(100_000_001).is_err());
    /// # Ok::<(), fleetgate::ConfigError>(())
    /// ```
    pub fn max_keys(mut self, max_keys: usize) -> Result<Self, ConfigError> {
        if max_keys == 0 {
            return Err(ConfigError::ZeroMaxKeys);
        }
        if max_keys > MAX_MAX_KEYS {
            return Err(ConfigError::TooManyMaxKeys {
                max_keys,
                most: MAX_MAX_KEYS,
            });
        }
        self.max_keys = max_keys;
        Ok(self)
    }

    /// Builds the store.
    pub fn build(self) -> MemoryStore {
        let shards = self.shards.unwrap_or_else(|| {
            let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
            (cores * 16).max(16)
        });
        // Every shard holds one entry at least, so that the bound is the
        // sum of the shards' parts, and at most MAX_SHARD_ENTRIES.
        let max_keys = self.max_keys.max(1);
        let shards = shards
            .max(max_keys.div_ceil(MAX_SHARD_ENTRIES))
            .min(max_keys);
        let caps: Vec<usize> = (0..shards)
            .map(|i| shard_cap(max_keys, shards, i))
            .collect();
        MemoryStore {
            inner: Arc::new(Inner {
                shards: caps
                    .iter()
                    .map(|&cap| RwLock::new(Shard::new(cap)))
                    .collect(),
                hasher: RandomState::new(),
                clock: self.clock.unwrap_or_else(|| Arc::new(FastClock::new())),
                windows: window::Table::new(&caps),
                leases: lease::Leases::new(&caps),
                sweeper: Sweeper {
                    next: AtomicU64::new(0),
                    cursor: Mutex::new(0),
                    step: (SWEEP_PERIOD / shards as u64).max(1),
                },
                max_keys,
                evictions: AtomicU64::new(0),
                lease_refusals: AtomicU64::new(0),
                budgets: Mutex::new(HashMap::new()),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use crate::decision::Decision;
    use crate::policy::{Limit, Rate};
    use crate::store::{LeaseId, decide_now};
    use std::time::Duration;

    fn store(max_keys: usize, shards: usize, clock: &ManualClock) -> MemoryStore {
        MemoryStore::builder()
            .shards(shards)
            .max_keys(max_keys)
            .unwrap()
            .clock(clock.clone())
            .build()
    }

    /// One call a second, burst 2: one call's state matters for a second.
    fn per_second() -> Policy {
        let limit = Limit::builder(Rate::per_second(1))
            .burst(2)
            .build()
            .unwrap();
        Policy::single("p", limit).unwrap()
    }

    fn check(store: &MemoryStore, policy: &Policy, key: &Key) -> Decision {
        decide_now(store, policy, key, 1).unwrap()
    }

    fn caps(store: &MemoryStore) -> Vec<usize> {
        store.inner.shards.iter().map(|s| read(s).cap).collect()
    }

    #[test]
    fn a_bound_of_zero_is_refused() {
        assert_eq!(
            MemoryStore::builder().max_keys(0).err(),
            Some(ConfigError::ZeroMaxKeys)
        );
    }

    /// The shards' parts add up to the bound, however it divides; a bound
    /// below the shard count makes fewer shards, of one entry each.
    #[test]
    fn the_bound_is_split_over_the_shards() {
        let clock = ManualClock::new(Duration::from_secs(1));
        for (max_keys, shards) in [(1000, 8), (1003, 8), (5, 8), (1, 64), (100_000, 32)] {
            let caps = caps(&store(max_keys, shards, &clock));
            assert_eq!(caps.len(), shards.min(max_keys));
            assert_eq!(caps.iter().sum::<usize>(), max_keys);
            let (min, max) = (caps.iter().min().unwrap(), caps.iter().max().unwrap());
            assert!(*min >= 1 && max - min <= 1, "{caps:?}");
        }
        // Too few shards for the bound: raised to hold at most
        // MAX_SHARD_ENTRIES each.
        for (max_keys, shards) in [(1_000_000, 4), (4097, 1), (40_000, 1)] {
            let caps = caps(&store(max_keys, shards, &clock));
            assert_eq!(caps.len(), max_keys.div_ceil(MAX_SHARD_ENTRIES));
            assert!(caps.iter().all(|&c| c <= MAX_SHARD_ENTRIES), "{caps:?}");
            assert_eq!(caps.iter().sum::<usize>(), max_keys);
            let (min, max) = (caps.iter().min().unwrap(), caps.iter().max().unwrap());
            assert!(*min >= 1 && max - min <= 1, "{caps:?}");
        }
        assert_eq!(
            caps(&MemoryStore::builder().shards(4).build())
                .iter()
                .sum::<usize>(),
            DEFAULT_MAX_KEYS
        );
    }

    /// Ties at the cut are split exactly: no more entries go than needed.
    #[test]
    fn the_eviction_cut_splits_ties() {
        let mut ranks = [5, 1, 5, 5, 3, 5, 9];
        // Keep 4 of 7: 1, 3 and one of the four 5s go.
        assert_eq!(eviction_cut(&mut ranks, 4), (5, 1));
        let mut ranks = [7; 10];
        assert_eq!(eviction_cut(&mut ranks, 8), (7, 2));
        let mut ranks = [1, 2];
        assert_eq!(eviction_cut(&mut ranks, 2), (0, 0));
    }

    /// A full shard evicts the entries that refill soonest, down to seven
    /// eighths, and counts them; the entry that refills last stays.
    #[test]
    fn a_full_shard_evicts_the_soonest_refilled() {
        let clock = ManualClock::new(Duration::from_secs(1));
        let store = store(16, 1, &clock);
        let policy = per_second();
        let kept = Key::new("kept");
        // Two calls: refilled two seconds from now, later than any other.
        assert!(check(&store, &policy, &kept).allowed);
        assert!(check(&store, &policy, &kept).allowed);
        for i in 0..15 {
            clock.advance(Duration::from_millis(1));
            assert!(check(&store, &policy, &Key::new(format!("k{i}"))).allowed);
        }
        assert_eq!(store.len(), 16);
        assert_eq!(store.stats().evictions, 0);
        clock.advance(Duration::from_millis(1));
        assert!(check(&store, &policy, &Key::new("new")).allowed);
        // 16 full: evict 2 (an eighth), the two oldest one-call keys.
        assert_eq!(store.len(), 15);
        assert_eq!(store.stats().evictions, 2);
        assert!(!check(&store, &policy, &kept).allowed, "kept was evicted");
        // k2 was not evicted: its second call is its last.
        assert!(check(&store, &policy, &Key::new("k2")).allowed);
        assert!(!check(&store, &policy, &Key::new("k2")).allowed);
        // k0 was: it starts afresh with its burst of 2.
        assert!(check(&store, &policy, &Key::new("k0")).allowed);
        assert!(check(&store, &policy, &Key::new("k0")).allowed);
    }

    /// Expired entries are dropped before any live one is evicted.
    #[test]
    fn expired_entries_go_before_live_ones() {
        let clock = ManualClock::new(Duration::from_secs(1));
        let store = store(16, 1, &clock);
        let policy = per_second();
        for i in 0..16 {
            check(&store, &policy, &Key::new(format!("old{i}")));
        }
        clock.advance(Duration::from_secs(1));
        for i in 0..16 {
            check(&store, &policy, &Key::new(format!("new{i}")));
        }
        assert_eq!(store.len(), 16);
        assert_eq!(store.stats().evictions, 0, "a live entry was evicted");
    }

    /// After a flood, the sweep shrinks the tables, not only empties them.
    #[test]
    fn sweeping_after_a_flood_shrinks_the_tables() {
        let clock = ManualClock::new(Duration::from_secs(1));
        let store = store(1_000_000, 4, &clock);
        let policy = per_second();
        let window = Policy::builder("w")
            .algorithm(crate::Algorithm::SlidingLog)
            .limit(Limit::new(Rate::per_second(5)).unwrap())
            .build()
            .unwrap();
        for i in 0..100_000 {
            let key = Key::new(format!("k{i}"));
            check(&store, &policy, &key);
            decide_now(&store, &window, &key, 1);
        }
        let capacity = |store: &MemoryStore| {
            let gcra: usize = store
                .inner
                .shards
                .iter()
                .map(|s| read(s).map.capacity())
                .sum();
            (gcra, store.inner.windows.capacity())
        };
        let (gcra, windows) = capacity(&store);
        assert!(gcra >= 100_000 && windows >= 100_000, "{gcra}, {windows}");
        clock.advance(Duration::from_secs(2));
        // One regular caller's calls sweep every shard, at least one each.
        let shards = store.inner.shards.len();
        for _ in 0..shards {
            check(&store, &policy, &Key::new("regular"));
        }
        assert_eq!(store.len(), 1);
        let (gcra, windows) = capacity(&store);
        assert!(
            gcra <= shards * 2 * MIN_CAPACITY && windows <= shards * 2 * MIN_CAPACITY,
            "{gcra}, {windows}"
        );
    }

    /// A call's sweep looks at no more than its budget and one more
    /// shard's entries, however large the bound and however few shards
    /// were asked for.
    #[test]
    fn a_sweep_step_is_bounded() {
        let clock = ManualClock::new(Duration::from_secs(1));
        let store = store(40_000, 1, &clock);
        let policy = per_second();
        for i in 0..30_000 {
            check(&store, &policy, &Key::new(format!("k{i}")));
        }
        assert_eq!(store.len(), 30_000);
        clock.advance(Duration::from_secs(3));
        let now = clock.now_micros();
        let mut visited = 0;
        let mut calls = 0;
        while !store.is_empty() {
            let step = store.inner.sweep_due(now);
            assert!(
                step < SWEEP_BUDGET + MAX_SHARD_ENTRIES,
                "one call looked at {step} entries"
            );
            visited += step;
            calls += 1;
            assert!(calls <= store.inner.shards.len(), "a round is one second");
        }
        assert_eq!(visited, 30_000);
    }

    /// Evictions and lease refusals reach the metrics too.
    #[cfg(feature = "metrics")]
    #[test]
    fn evictions_are_counted_in_metrics() {
        use metrics_util::debugging::{DebugValue, DebuggingRecorder};

        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        let clock = ManualClock::new(Duration::from_secs(1));
        let store = store(64, 2, &clock);
        metrics::with_local_recorder(&recorder, || {
            let policy = per_second();
            for i in 0..1000 {
                check(&store, &policy, &Key::new(format!("k{i}")));
            }
            for i in 0..1000 {
                let id = LeaseId::generate();
                let call = LeaseCall {
                    name: "slow",
                    key: &Key::new(format!("k{i}")),
                    id: &id,
                    capacity: 1,
                    ttl: Duration::from_secs(30),
                    wait: None,
                    undo: false,
                };
                let _ = store.lease(call, LeaseOp::Acquire).take_ready();
            }
        });
        let stats = store.stats();
        assert!(stats.evictions >= 1000 - 64, "{stats:?}");
        assert_eq!(stats.lease_refusals, 1000 - 64, "{stats:?}");
        let mut counted: Vec<_> = snapshotter
            .snapshot()
            .into_vec()
            .into_iter()
            .filter(|(key, ..)| key.key().name().starts_with("fleetgate_memory_"))
            .map(|(key, _, _, value)| {
                let labels: Vec<_> = key
                    .key()
                    .labels()
                    .map(|l| format!("{}={}", l.key(), l.value()))
                    .collect();
                (key.key().name().to_owned(), labels, value)
            })
            .collect();
        counted.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(
            counted,
            [
                (
                    "fleetgate_memory_evictions_total".to_owned(),
                    vec!["state=gcra".to_owned()],
                    DebugValue::Counter(stats.evictions)
                ),
                (
                    "fleetgate_memory_lease_refusals_total".to_owned(),
                    vec![],
                    DebugValue::Counter(stats.lease_refusals)
                ),
            ]
        );
    }
}
