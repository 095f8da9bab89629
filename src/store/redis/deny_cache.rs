//! The local deny cache of [`RedisStore`](super::RedisStore): once Redis has
//! denied a call, the same call is denied here, without a round trip, until
//! its retry time has passed.
//!
//! With the server's clock
//! ([`TimeSource::Server`](crate::TimeSource::Server), the default) this
//! is exact, not an approximation, for every algorithm. A denial stores
//! nothing (GCRA and the three window scripts all return before their
//! first write when they deny), and every write to a key, by this instance
//! or any other, only spends more of the limit:
//!
//! - GCRA: a write only moves the TAT later;
//! - sliding log: a write adds entries at its own now, and trims only
//!   entries that have left every window; the entries that made Redis deny
//!   stay in the window until the retry time it gave;
//! - fixed window and sliding counter: a write adds to the current fixed
//!   window's count; the counts that made Redis deny stay until the retry
//!   time (the sliding counter's previous window weighs less and less, and
//!   the retry is the instant it weighs little enough).
//!
//! So until the cached retry time the script would deny the same call
//! again, naming the same limit or window (the one with the longest retry
//! still has it). Only a wipe of the key's state (a Redis restart without
//! persistence, `FLUSHALL`, a hand-made `DEL`, a reset) or a refund
//! ([`Limiter::refund`](crate::Limiter::refund), the one write that gives
//! back) makes Redis admit sooner: a client denied just before waits out
//! the retry time it was already told. A charge only spends more, like a
//! check; one that leaves the key unable to pass a call of cost 1 is
//! cached as that call's denial. A refund through the instance that holds
//! the entry drops it, after the refund's round trip. A reset through the instance that holds the entry drops
//! it (`forget`), after the reset's round trip; a denial whose reply
//! crosses the reset on its way may still be cached, for its retry time
//! at most.
//!
//! With the callers' clocks
//! ([`TimeSource::Client`](crate::TimeSource::Client)) the instances
//! agree only as far as their clocks do, and the cache is conservative
//! rather than exact: an instance whose clock runs ahead moves a GCRA TAT
//! from its own now, begins the next fixed window, weighs the previous one
//! less or sees log entries leave before this one would, so Redis may
//! admit this instance's call before the cached retry time; the cache
//! still denies until then. It only ever denies, so it never admits what
//! Redis would deny.
//!
//! The figures of a local denial are those Redis would give if nobody else
//! had written since: the retry and the resets count down from Redis'
//! answer; GCRA's remaining is recomputed from the cached TAT. A window's
//! remaining only grows with time (an entry leaves the log, the previous
//! window weighs less, a fixed window ends); each window script therefore
//! also says how long every figure of its denial stays true (`hold_us`),
//! and the cache answers locally only that long (the sliding counter's to
//! the microsecond its doubles round to, as its retry is), which is the
//! whole retry time for the usual case (one window, cost 1) and shorter
//! where another window's figures move first: then Redis is asked again,
//! and its newer denial is cached. With the server's clock, other
//! instances' calls in between can only make Redis' answer stricter than
//! the cached one (less remaining, a later reset or retry, or another limit
//! naming a later retry), never admit sooner; and times are counted on
//! this instance's clock from the moment the call was sent, so a local
//! answer runs ahead of Redis' by the call's one-way latency at most: it
//! ends that much early, never late.
//!
//! A penalty box ([`LimitBuilder::block_for`](crate::LimitBuilder::block_for))
//! is cached as any denial, until the block's end: only a reset lifts it,
//! and every instance forgets its cached denials at the poll after a
//! reset of [`LivePolicies`](crate::live::LivePolicies). Under such a
//! policy no other refusal is cached (a charge's), so that the refusal
//! that starts a block reaches the script.
//!
//! What is cached is one entry per (policy, identity): the cost that was
//! denied, when it will pass, and the deciding limit's state (every
//! window's, for a policy of several windows). Only calls of exactly that
//! cost are answered from it (another cost has another retry time); any
//! other answer from Redis for the same policy and identity replaces or
//! removes the entry.
//!
//! Bounded: the cache holds at most its capacity, split over shards. When a
//! shard is full, its expired entries are dropped; if that frees less than a
//! quarter of it, the quarter of entries that expire soonest are dropped too
//! (they would have gone back to Redis soonest anyway). A dropped entry only
//! costs one more round trip.

use std::collections::HashMap;
use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use crate::clock::Clock;
use crate::decision::Decision;
use crate::key::Key;
use crate::policy::Policy;

/// Shards of the cache; each holds `capacity / SHARDS` entries (at least 1).
const SHARDS: usize = 16;

/// How long a penalty box's block is answered here before Redis is asked
/// again, in microseconds.
const BLOCK_HOLD_US: u64 = 1_000_000;

/// The process' real monotonic clock, for caches of stores that read
/// Redis' `TIME`: Redis' clock runs in real time even when a test pauses
/// tokio's.
#[derive(Debug)]
pub(crate) struct RealClock {
    start: std::time::Instant,
}

impl RealClock {
    pub(crate) fn new() -> Self {
        RealClock {
            start: std::time::Instant::now(),
        }
    }
}

impl Clock for RealClock {
    fn now_micros(&self) -> u64 {
        // Counted from one second, so that zero never means "now".
        u64::try_from(self.start.elapsed().as_micros())
            .unwrap_or(u64::MAX)
            .saturating_add(1_000_000)
    }
}

/// Counters of a [`RedisStore`](super::RedisStore)'s deny cache, read with
/// [`RedisStore::deny_cache_stats`](super::RedisStore::deny_cache_stats).
///
/// Available with the `redis` feature (on by default).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct DenyCacheStats {
    /// Calls denied locally, without a Redis round trip.
    pub hits: u64,
    /// Denials from Redis that were recorded.
    pub inserts: u64,
    /// Live entries dropped because their shard was full.
    pub evictions: u64,
    /// Entries held now, expired ones included until they are swept.
    pub entries: u64,
}

pub(crate) struct DenyCache {
    shards: Box<[Mutex<Shard>]>,
    /// Entries in all shards. While it is zero (nobody is being denied),
    /// lookups and admissions skip the shards, their hashing and locks.
    held: AtomicUsize,
    per_shard: usize,
    hasher: RandomState,
    clock: Arc<dyn Clock>,
    hits: AtomicU64,
    inserts: AtomicU64,
    evictions: AtomicU64,
}

#[derive(Default)]
struct Shard {
    map: HashMap<Key, Vec<Entry>>,
    entries: usize,
    /// No entry expires before this: a sweep earlier would free nothing.
    earliest: u64,
}

struct Entry {
    policy: Policy,
    cost: u64,
    /// Local time (µs) at which the denied call would pass.
    until: u64,
    /// Local time (µs) from which the entry answers nothing: `until`, or
    /// earlier where a window's figures change first.
    expires: u64,
    limit: usize,
    figures: Figures,
    /// A refusal by the penalty box.
    blocked: bool,
}

/// What a cached denial reports, by algorithm.
enum Figures {
    /// The local time (µs) of the deciding limit's theoretical arrival
    /// time, from which its remaining and reset follow.
    Gcra { tat: u64 },
    /// The deciding window's remaining and the local time (µs) its reset
    /// counts down to, and the same of every window for a policy of several.
    Window {
        remaining: u64,
        reset_at: u64,
        each: Option<Box<[(u64, u64)]>>,
    },
}

impl DenyCache {
    /// A cache of at most `capacity` entries (`capacity > 0`), on `clock`.
    pub(crate) fn new(capacity: usize, clock: Arc<dyn Clock>) -> Self {
        let shards = SHARDS.min(capacity).max(1);
        DenyCache {
            shards: (0..shards).map(|_| Mutex::new(Shard::default())).collect(),
            held: AtomicUsize::new(0),
            per_shard: (capacity / shards).max(1),
            hasher: RandomState::new(),
            clock,
            hits: AtomicU64::new(0),
            inserts: AtomicU64::new(0),
            evictions: AtomicU64::new(0),
        }
    }

    /// The local clock, read before a call is sent so that a cached entry
    /// expires no later than Redis' own state.
    pub(crate) fn now(&self) -> u64 {
        self.clock.now_micros()
    }

    fn shard(&self, key: &Key) -> MutexGuard<'_, Shard> {
        let i = self.hasher.hash_one(key) as usize % self.shards.len();
        self.shards[i]
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The denial Redis would give now, if a cached one still holds.
    pub(crate) fn lookup(
        &self,
        policy: &Policy,
        key: &Key,
        cost: u64,
        max_wait: Duration,
    ) -> Option<Decision> {
        if self.held.load(Ordering::Relaxed) == 0 {
            return None;
        }
        let now = self.now();
        let shard = self.shard(key);
        let entry = shard.map.get(key)?.iter().find(|e| e.policy == *policy)?;
        let max_wait = u64::try_from(max_wait.as_micros()).unwrap_or(u64::MAX);
        if entry.cost != cost || now >= entry.expires || entry.until.saturating_sub(now) <= max_wait
        {
            return None;
        }
        let (remaining, reset, each) = match &entry.figures {
            Figures::Gcra { tat } => {
                let limit = policy.limits().get(entry.limit)?;
                // As the script computes it: whole calls of cost 1 that fit now.
                let reset = tat.saturating_sub(now);
                let remaining =
                    limit.tolerance_us().saturating_sub(reset) / limit.emission_us().max(1);
                (remaining, reset, None)
            }
            Figures::Window {
                remaining,
                reset_at,
                each,
            } => {
                let each = each.as_ref().map(|each| {
                    each.iter()
                        .map(|&(remaining, reset_at)| {
                            (
                                remaining,
                                Duration::from_micros(reset_at.saturating_sub(now)),
                            )
                        })
                        .collect()
                });
                (*remaining, reset_at.saturating_sub(now), each)
            }
        };
        let decision = Decision {
            allowed: false,
            limit: entry.limit,
            remaining,
            reset_us: reset,
            retry_us: Some(entry.until - now),
            wait_us: 0,
            each,
            blocked: entry.blocked,
        };
        drop(shard);
        self.hits.fetch_add(1, Ordering::Relaxed);
        Some(decision)
    }

    /// Records Redis' answer to a GCRA call sent at local time `sent_at`: a
    /// denial is cached, anything else forgets what was cached.
    pub(crate) fn record(
        &self,
        policy: &Policy,
        key: &Key,
        cost: u64,
        sent_at: u64,
        decision: &Decision,
    ) {
        self.record_held(policy, key, cost, sent_at, decision, u64::MAX);
    }

    /// [`record`](Self::record), for an answer whose figures hold for
    /// `hold_us` from `sent_at` at most (a window script's `hold_us`): a
    /// denial is answered locally until its retry time or that, whichever
    /// comes first.
    pub(crate) fn record_held(
        &self,
        policy: &Policy,
        key: &Key,
        cost: u64,
        sent_at: u64,
        decision: &Decision,
        hold_us: u64,
    ) {
        // Under a penalty box only blocks are cached: any other refusal
        // (a charge's figures) must reach the script, which starts the
        // block.
        let denial = match decision.retry_us {
            Some(retry)
                if !decision.allowed
                    && retry > 0
                    && hold_us > 0
                    && (decision.blocked || !policy.blocks()) =>
            {
                Some(retry)
            }
            _ => None,
        };
        if denial.is_none() && self.held.load(Ordering::Relaxed) == 0 {
            return;
        }
        let mut shard = self.shard(key);
        let before = shard.entries;
        match denial {
            Some(denial) => {
                // A block's figures count down as a window's do.
                let figures = if policy.algorithm().is_window() || decision.blocked {
                    Figures::Window {
                        remaining: decision.remaining,
                        reset_at: sent_at.saturating_add(decision.reset_us),
                        each: decision.each.as_ref().map(|each| {
                            each.iter()
                                .map(|&(remaining, reset)| {
                                    let reset =
                                        u64::try_from(reset.as_micros()).unwrap_or(u64::MAX);
                                    (remaining, sent_at.saturating_add(reset))
                                })
                                .collect()
                        }),
                    }
                } else {
                    Figures::Gcra {
                        tat: sent_at.saturating_add(decision.reset_us),
                    }
                };
                let until = sent_at.saturating_add(denial);
                // A block outlasts any poll: held here a second at a time,
                // so that a reset through another instance (which only
                // its own cache hears of) lifts it within that.
                let hold_us = if decision.blocked {
                    hold_us.min(BLOCK_HOLD_US)
                } else {
                    hold_us
                };
                let entry = Entry {
                    policy: policy.clone(),
                    cost,
                    until,
                    expires: sent_at.saturating_add(hold_us).min(until),
                    limit: decision.limit,
                    figures,
                    blocked: decision.blocked,
                };
                self.insert(&mut shard, key, entry);
            }
            None => shard.remove(policy, key),
        }
        let after = shard.entries;
        drop(shard);
        if after > before {
            self.held.fetch_add(after - before, Ordering::Relaxed);
        } else {
            self.held.fetch_sub(before - after, Ordering::Relaxed);
        }
    }

    /// Caches a denial in `shard`, making room when it is full.
    fn insert(&self, shard: &mut Shard, key: &Key, entry: Entry) {
        let now = self.now();
        if let Some(slot) = shard.map.get_mut(key)
            && let Some(existing) = slot.iter_mut().find(|e| e.policy == entry.policy)
        {
            let expires = entry.expires;
            *existing = entry;
            shard.earliest = shard.earliest.min(expires);
            return;
        }
        if shard.entries >= self.per_shard {
            let evicted = shard.make_room(now, self.per_shard);
            self.evictions.fetch_add(evicted, Ordering::Relaxed);
        }
        shard.earliest = if shard.entries == 0 {
            entry.expires
        } else {
            shard.earliest.min(entry.expires)
        };
        shard.map.entry(key.clone()).or_default().push(entry);
        shard.entries += 1;
        self.inserts.fetch_add(1, Ordering::Relaxed);
    }

    /// Forgets every denial of `key` under a policy named `name`: after a
    /// reset of its state, the next call goes to Redis.
    pub(crate) fn forget(&self, name: &str, key: &Key) {
        if self.held.load(Ordering::Relaxed) == 0 {
            return;
        }
        let mut shard = self.shard(key);
        let Some(slot) = shard.map.get_mut(key) else {
            return;
        };
        let before = slot.len();
        slot.retain(|e| e.policy.name() != name);
        let removed = before - slot.len();
        if slot.is_empty() {
            shard.map.remove(key);
        }
        shard.entries -= removed;
        drop(shard);
        self.held.fetch_sub(removed, Ordering::Relaxed);
    }

    /// Forgets every denial: the next call of every identity goes to Redis.
    pub(crate) fn clear(&self) {
        for shard in &self.shards {
            let mut shard = shard
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            let removed = shard.entries;
            shard.map = HashMap::new();
            shard.entries = 0;
            shard.earliest = u64::MAX;
            drop(shard);
            self.held.fetch_sub(removed, Ordering::Relaxed);
        }
    }

    pub(crate) fn stats(&self) -> DenyCacheStats {
        let entries = self
            .shards
            .iter()
            .map(|s| {
                s.lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner())
                    .entries as u64
            })
            .sum();
        DenyCacheStats {
            hits: self.hits.load(Ordering::Relaxed),
            inserts: self.inserts.load(Ordering::Relaxed),
            evictions: self.evictions.load(Ordering::Relaxed),
            entries,
        }
    }
}

impl Shard {
    fn remove(&mut self, policy: &Policy, key: &Key) {
        let Some(slot) = self.map.get_mut(key) else {
            return;
        };
        let before = slot.len();
        slot.retain(|e| e.policy != *policy);
        self.entries -= before - slot.len();
        if slot.is_empty() {
            self.map.remove(key);
        }
    }

    /// Frees at least one slot of a full shard; returns how many live
    /// entries had to go. Every sweep frees a quarter of the shard or more,
    /// so the cost of sweeping is constant per insert on average.
    fn make_room(&mut self, now: u64, capacity: usize) -> u64 {
        if now >= self.earliest {
            self.retain(|e| e.expires > now);
        }
        // Keep at most three quarters, and always leave room for one.
        let keep = capacity - (capacity / 4).max(1);
        if self.entries <= keep {
            return 0;
        }
        let mut expiries: Vec<u64> = self.map.values().flatten().map(|e| e.expires).collect();
        let excess = self.entries - keep;
        let (_, &mut cut, _) = expiries.select_nth_unstable(excess - 1);
        let before = self.entries;
        self.retain(|e| e.expires > cut);
        (before - self.entries) as u64
    }

    fn retain(&mut self, keep: impl Fn(&Entry) -> bool) {
        self.map.retain(|_, slot| {
            slot.retain(&keep);
            !slot.is_empty()
        });
        self.entries = self.map.values().map(Vec::len).sum();
        self.earliest = self
            .map
            .values()
            .flatten()
            .map(|e| e.expires)
            .min()
            .unwrap_or(u64::MAX);
        if self.map.capacity() > 4 * self.map.len().max(64) {
            self.map.shrink_to_fit();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use crate::policy::{Limit, Rate};

    const S: u64 = 1_000_000;

    fn policy() -> Policy {
        // T = 1 s, burst 4.
        Policy::single(
            "p",
            Limit::builder(Rate::per_second(1))
                .burst(4)
                .build()
                .unwrap(),
        )
        .unwrap()
    }

    fn denied(retry: u64, reset: u64) -> Decision {
        Decision {
            allowed: false,
            limit: 0,
            remaining: 0,
            reset_us: reset,
            retry_us: Some(retry),
            wait_us: 0,
            each: None,
            blocked: false,
        }
    }

    #[test]
    fn denies_the_same_call_until_the_retry_passes() {
        let clock = ManualClock::new(Duration::from_secs(100));
        let cache = DenyCache::new(100, Arc::new(clock.clone()));
        let (p, k) = (policy(), Key::new("k"));
        let sent = cache.now();
        cache.record(&p, &k, 1, sent, &denied(S, 4 * S));
        let d = cache.lookup(&p, &k, 1, Duration::ZERO).unwrap();
        assert_eq!(d, denied(S, 4 * S));
        // Another cost, or a wait that covers the retry: ask Redis.
        assert!(cache.lookup(&p, &k, 2, Duration::ZERO).is_none());
        assert!(cache.lookup(&p, &k, 1, Duration::from_secs(1)).is_none());
        clock.advance(Duration::from_micros(S / 2));
        let d = cache.lookup(&p, &k, 1, Duration::ZERO).unwrap();
        assert_eq!(d.retry_after(), Some(Duration::from_micros(S / 2)));
        assert_eq!(d.reset(), Duration::from_micros(4 * S - S / 2));
        assert_eq!(d.remaining(), 0);
        clock.advance(Duration::from_micros(S / 2));
        assert!(cache.lookup(&p, &k, 1, Duration::ZERO).is_none());
        // An admitted call forgets the entry.
        cache.record(&p, &k, 1, cache.now(), &denied(S, 4 * S));
        let allowed = Decision {
            allowed: true,
            retry_us: None,
            ..denied(0, 0)
        };
        cache.record(&p, &k, 1, cache.now(), &allowed);
        assert!(cache.lookup(&p, &k, 1, Duration::ZERO).is_none());
        assert_eq!(cache.stats().entries, 0);
        assert_eq!(cache.stats().hits, 2);
    }

    /// A window denial is answered until its hold, which may end before
    /// its retry; the resets count down, each window's included.
    #[test]
    fn window_denials_hold_as_long_as_their_figures() {
        let clock = ManualClock::new(Duration::from_secs(100));
        let cache = DenyCache::new(100, Arc::new(clock.clone()));
        let p = Policy::builder("w")
            .algorithm(crate::Algorithm::SlidingLog)
            .limit(Limit::new(Rate::per_second(2)).unwrap())
            .limit(Limit::new(Rate::per_minute(5)).unwrap())
            .build()
            .unwrap();
        let k = Key::new("k");
        let each: Arc<[(u64, Duration)]> =
            Arc::from([(0, Duration::from_micros(S)), (3, Duration::ZERO)]);
        let d = Decision {
            each: Some(each),
            ..denied(S / 2, S)
        };
        cache.record_held(&p, &k, 1, cache.now(), &d, S / 4);
        assert_eq!(cache.lookup(&p, &k, 1, Duration::ZERO), Some(d));
        clock.advance(Duration::from_micros(S / 4 - 1));
        let later = cache.lookup(&p, &k, 1, Duration::ZERO).unwrap();
        assert_eq!(later.retry_after(), Some(Duration::from_micros(S / 4 + 1)));
        assert_eq!(later.reset(), Duration::from_micros(3 * S / 4 + 1));
        assert_eq!(
            later.reset_of(0),
            Some(Duration::from_micros(3 * S / 4 + 1))
        );
        assert_eq!(later.remaining_of(1), Some(3));
        assert_eq!(later.reset_of(1), Some(Duration::ZERO));
        // The hold has passed, the retry not yet: Redis is asked.
        clock.advance(Duration::from_micros(1));
        assert!(cache.lookup(&p, &k, 1, Duration::ZERO).is_none());
        // A denial that holds for nothing is not cached.
        cache.record_held(&p, &k, 1, cache.now(), &denied(S, S), 0);
        assert_eq!(cache.stats().entries, 0);
    }

    #[test]
    fn other_policies_and_keys_are_apart() {
        let clock = ManualClock::new(Duration::from_secs(100));
        let cache = DenyCache::new(100, Arc::new(clock));
        let (p, k) = (policy(), Key::new("k"));
        let other = Policy::single("q", p.limits()[0].clone()).unwrap();
        cache.record(&p, &k, 1, cache.now(), &denied(S, 4 * S));
        assert!(cache.lookup(&other, &k, 1, Duration::ZERO).is_none());
        assert!(
            cache
                .lookup(&p, &Key::new("j"), 1, Duration::ZERO)
                .is_none()
        );
    }

    /// Forgetting one identity under one name leaves the others; clearing
    /// leaves nothing, and the cache goes on recording afterwards.
    #[test]
    fn forgetting_and_clearing_drop_denials() {
        let clock = ManualClock::new(Duration::from_secs(100));
        let cache = DenyCache::new(100, Arc::new(clock));
        let (p, k, j) = (policy(), Key::new("k"), Key::new("j"));
        let other = Policy::single("q", p.limits()[0].clone()).unwrap();
        for (policy, key) in [(&p, &k), (&other, &k), (&p, &j)] {
            cache.record(policy, key, 1, cache.now(), &denied(S, 4 * S));
        }
        assert_eq!(cache.stats().entries, 3);
        cache.forget("p", &k);
        assert!(cache.lookup(&p, &k, 1, Duration::ZERO).is_none());
        assert!(cache.lookup(&other, &k, 1, Duration::ZERO).is_some());
        assert!(cache.lookup(&p, &j, 1, Duration::ZERO).is_some());
        assert_eq!(cache.stats().entries, 2);
        cache.forget("p", &Key::new("nobody"));
        assert_eq!(cache.stats().entries, 2);
        cache.clear();
        assert_eq!(cache.stats().entries, 0);
        assert_eq!(cache.held.load(Ordering::Relaxed), 0);
        assert!(cache.lookup(&other, &k, 1, Duration::ZERO).is_none());
        assert!(cache.lookup(&p, &j, 1, Duration::ZERO).is_none());
        cache.record(&p, &k, 1, cache.now(), &denied(S, 4 * S));
        assert!(cache.lookup(&p, &k, 1, Duration::ZERO).is_some());
        assert_eq!(cache.held.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn a_full_cache_stays_within_its_capacity() {
        let clock = ManualClock::new(Duration::from_secs(100));
        let cache = DenyCache::new(64, Arc::new(clock.clone()));
        let p = policy();
        for i in 0..10_000u64 {
            let sent = cache.now();
            cache.record(
                &p,
                &Key::new(format!("k{i}")),
                1,
                sent,
                &denied(S + i, 4 * S),
            );
            assert!(cache.stats().entries <= 64);
            clock.advance(Duration::from_micros(10));
        }
        let stats = cache.stats();
        assert_eq!(stats.inserts, 10_000);
        assert!(stats.evictions > 0);
        // The newest denial is still answered locally.
        assert!(
            cache
                .lookup(&p, &Key::new("k9999"), 1, Duration::ZERO)
                .is_some()
        );
        // Once everything has expired, a sweep empties a shard it touches.
        clock.advance(Duration::from_secs(60));
        for i in 0..1000u64 {
            let sent = cache.now();
            cache.record(&p, &Key::new(format!("n{i}")), 1, sent, &denied(S, 4 * S));
        }
        assert!(cache.stats().entries <= 64);
        assert!(
            cache
                .lookup(&p, &Key::new("k9999"), 1, Duration::ZERO)
                .is_none()
        );
    }
}
