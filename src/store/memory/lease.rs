//! The memory store's leases: per key and limit name, a short vector of
//! `(id, expiry)`. Follows the rules in `src/store/lease.rs`, as the
//! `lua/lease_*.lua` scripts do for Redis.

use std::collections::HashMap;
use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use crate::key::Key;
use crate::store::{LeaseCall, LeaseGrant, LeaseId};

use super::MIN_CAPACITY;

pub(super) struct Leases {
    shards: Box<[Mutex<Shard>]>,
    hasher: RandomState,
}

struct Shard {
    map: HashMap<Key, Vec<Set>>,
    sets: usize,
    /// The most sets this shard holds: its part of the bound.
    cap: usize,
    /// No lease expires before then (a lease's expiry only moves later),
    /// so that a sweep before then has nothing to drop.
    earliest: u64,
}

/// What an acquire did.
pub(super) enum Acquired {
    /// Decided by the set's capacity.
    Grant(LeaseGrant),
    /// Refused without looking at a capacity: the call needed a new set in
    /// a shard full of held leases.
    Full(LeaseGrant),
}

/// The leases one key holds under one limit name.
struct Set {
    name: Box<str>,
    leases: Vec<(LeaseId, u64)>,
}

impl Leases {
    /// Leases in one shard per part of the bound in `caps`.
    pub(super) fn new(caps: &[usize]) -> Self {
        Leases {
            shards: caps
                .iter()
                .map(|&cap| {
                    Mutex::new(Shard {
                        map: HashMap::new(),
                        sets: 0,
                        cap,
                        earliest: u64::MAX,
                    })
                })
                .collect(),
            hasher: RandomState::new(),
        }
    }

    fn shard(&self, key: &Key) -> MutexGuard<'_, Shard> {
        let index = self.hasher.hash_one(key) as usize % self.shards.len();
        lock(&self.shards[index])
    }

    pub(super) fn acquire(&self, call: &LeaseCall<'_>, now: u64) -> Acquired {
        let mut shard = self.shard(call.key);
        let expiry = now.saturating_add(call.ttl_us());
        if let Some(set) = shard.find(call.key, call.name) {
            set.leases.retain(|(_, e)| *e > now);
            let held = set.leases.len() as u64;
            if held >= call.capacity {
                let oldest = set.leases.iter().map(|(_, e)| *e).min().unwrap_or(now);
                return Acquired::Grant(LeaseGrant {
                    acquired: false,
                    in_flight: held,
                    oldest_expires_in: Some(Duration::from_micros(oldest.saturating_sub(now))),
                });
            }
            set.leases.push((call.id.clone(), expiry));
            shard.earliest = shard.earliest.min(expiry);
            return Acquired::Grant(LeaseGrant {
                acquired: true,
                in_flight: held + 1,
                oldest_expires_in: None,
            });
        }
        if call.capacity == 0 {
            return Acquired::Grant(LeaseGrant {
                acquired: false,
                in_flight: 0,
                oldest_expires_in: Some(Duration::ZERO),
            });
        }
        if !shard.make_room(now) {
            // Every set here holds a live lease: evicting one would let its
            // key past its limit unnoticed, so the new key waits instead.
            return Acquired::Full(LeaseGrant {
                acquired: false,
                in_flight: 0,
                oldest_expires_in: Some(Duration::from_micros(shard.earliest.saturating_sub(now))),
            });
        }
        shard.insert(
            call.key,
            Set {
                name: call.name.into(),
                leases: vec![(call.id.clone(), expiry)],
            },
            expiry,
        );
        Acquired::Grant(LeaseGrant {
            acquired: true,
            in_flight: 1,
            oldest_expires_in: None,
        })
    }

    pub(super) fn release(&self, call: &LeaseCall<'_>) -> bool {
        let mut shard = self.shard(call.key);
        let Some(set) = shard.find(call.key, call.name) else {
            return false;
        };
        let before = set.leases.len();
        set.leases.retain(|(id, _)| id != call.id);
        let released = set.leases.len() < before;
        if set.leases.is_empty() {
            shard.remove(call.key, call.name);
        }
        released
    }

    pub(super) fn renew(&self, call: &LeaseCall<'_>, now: u64) -> bool {
        let mut shard = self.shard(call.key);
        let Some(set) = shard.find(call.key, call.name) else {
            return false;
        };
        let Some(pos) = set.leases.iter().position(|(id, _)| id == call.id) else {
            return false;
        };
        if set.leases[pos].1 <= now {
            // Expired: its slot may be someone else's by now.
            set.leases.swap_remove(pos);
            if set.leases.is_empty() {
                shard.remove(call.key, call.name);
            }
            return false;
        }
        set.leases[pos].1 = now.saturating_add(call.ttl_us());
        true
    }

    /// Drops every lease `key` holds under the limit `name`, and their
    /// set; returns how many leases went.
    pub(super) fn remove(&self, name: &str, key: &Key) -> usize {
        let mut shard = self.shard(key);
        let held = shard.find(key, name).map_or(0, |set| set.leases.len());
        shard.remove(key, name);
        held
    }

    /// Every lease recorded, expired ones included until they are dropped.
    pub(super) fn count(&self) -> usize {
        self.shards
            .iter()
            .map(|s| {
                lock(s)
                    .map
                    .values()
                    .flatten()
                    .map(|set| set.leases.len())
                    .sum::<usize>()
            })
            .sum()
    }

    /// Drops the expired leases of shard `index`; returns how many lease
    /// sets it looked at.
    pub(super) fn sweep_shard(&self, index: usize, now: u64) -> usize {
        self.shards
            .get(index)
            .map_or(0, |shard| lock(shard).sweep(now))
    }
}

impl Shard {
    fn find(&mut self, key: &Key, name: &str) -> Option<&mut Set> {
        self.map
            .get_mut(key)
            .and_then(|sets| sets.iter_mut().find(|s| &*s.name == name))
    }

    /// Whether the shard has room for one more set, after dropping expired
    /// leases if it was full.
    fn make_room(&mut self, now: u64) -> bool {
        if self.sets < self.cap {
            return true;
        }
        self.sweep(now);
        self.sets < self.cap
    }

    /// Adds a set holding one lease that expires at `expiry`.
    fn insert(&mut self, key: &Key, set: Set, expiry: u64) {
        self.earliest = self.earliest.min(expiry);
        match self.map.get_mut(key) {
            Some(sets) => sets.push(set),
            None => {
                self.map.insert(key.clone(), vec![set]);
            }
        }
        self.sets += 1;
    }

    fn remove(&mut self, key: &Key, name: &str) {
        if let Some(sets) = self.map.get_mut(key) {
            let before = sets.len();
            sets.retain(|s| &*s.name != name);
            self.sets -= before - sets.len();
            if sets.is_empty() {
                self.map.remove(key);
            }
        }
    }

    /// Drops expired leases, and the sets they leave empty: a crashed
    /// holder's leases do not outlive their TTL by much, even for keys
    /// never seen again.
    fn sweep(&mut self, now: u64) -> usize {
        if now < self.earliest {
            return 0;
        }
        let visited = self.sets;
        let mut earliest = u64::MAX;
        self.map.retain(|_, sets| {
            sets.retain_mut(|set| {
                set.leases.retain(|&(_, e)| {
                    let keep = e > now;
                    if keep {
                        earliest = earliest.min(e);
                    }
                    keep
                });
                !set.leases.is_empty()
            });
            !sets.is_empty()
        });
        self.sets = self.map.values().map(Vec::len).sum();
        self.earliest = earliest;
        let floor = (2 * self.map.len()).max(MIN_CAPACITY);
        if self.map.capacity() > 2 * floor {
            self.map.shrink_to(floor);
        }
        visited
    }
}

/// A poisoned shard only means another thread panicked while holding it;
/// each step above leaves the vectors consistent.
fn lock(shard: &Mutex<Shard>) -> MutexGuard<'_, Shard> {
    shard
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}
