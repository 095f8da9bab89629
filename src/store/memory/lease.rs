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

/// A shard sweeps expired leases once it holds this many sets, and after
/// that whenever their number has doubled since the last sweep.
const MIN_SWEEP: usize = 1024;

pub(super) struct Leases {
    shards: Box<[Mutex<Shard>]>,
    hasher: RandomState,
}

#[derive(Default)]
struct Shard {
    map: HashMap<Key, Vec<Set>>,
    sets: usize,
    sweep_at: usize,
}

/// The leases one key holds under one limit name.
struct Set {
    name: Box<str>,
    leases: Vec<(LeaseId, u64)>,
}

impl Leases {
    pub(super) fn new(shards: usize) -> Self {
        Leases {
            shards: (0..shards).map(|_| Mutex::new(Shard::default())).collect(),
            hasher: RandomState::new(),
        }
    }

    fn shard(&self, key: &Key) -> MutexGuard<'_, Shard> {
        let index = self.hasher.hash_one(key) as usize % self.shards.len();
        lock(&self.shards[index])
    }

    pub(super) fn acquire(&self, call: &LeaseCall<'_>, now: u64) -> LeaseGrant {
        let mut shard = self.shard(call.key);
        let expiry = now.saturating_add(call.ttl_us());
        if let Some(set) = shard.find(call.key, call.name) {
            set.leases.retain(|(_, e)| *e > now);
            let held = set.leases.len() as u64;
            if held >= call.capacity {
                let oldest = set.leases.iter().map(|(_, e)| *e).min().unwrap_or(now);
                return LeaseGrant {
                    acquired: false,
                    in_flight: held,
                    oldest_expires_in: Some(Duration::from_micros(oldest - now)),
                };
            }
            set.leases.push((call.id.clone(), expiry));
            return LeaseGrant {
                acquired: true,
                in_flight: held + 1,
                oldest_expires_in: None,
            };
        }
        if call.capacity == 0 {
            return LeaseGrant {
                acquired: false,
                in_flight: 0,
                oldest_expires_in: Some(Duration::ZERO),
            };
        }
        shard.insert(
            call.key,
            Set {
                name: call.name.into(),
                leases: vec![(call.id.clone(), expiry)],
            },
            now,
        );
        LeaseGrant {
            acquired: true,
            in_flight: 1,
            oldest_expires_in: None,
        }
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

    pub(super) fn sweep(&self, now: u64) {
        for shard in self.shards.iter() {
            lock(shard).sweep(now);
        }
    }
}

impl Shard {
    fn find(&mut self, key: &Key, name: &str) -> Option<&mut Set> {
        self.map
            .get_mut(key)
            .and_then(|sets| sets.iter_mut().find(|s| &*s.name == name))
    }

    fn insert(&mut self, key: &Key, set: Set, now: u64) {
        if self.sets >= self.sweep_at.max(MIN_SWEEP) {
            self.sweep(now);
        }
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
    fn sweep(&mut self, now: u64) {
        self.map.retain(|_, sets| {
            sets.retain_mut(|set| {
                set.leases.retain(|(_, e)| *e > now);
                !set.leases.is_empty()
            });
            !sets.is_empty()
        });
        self.sets = self.map.values().map(Vec::len).sum();
        self.sweep_at = self.sets.saturating_mul(2);
        if self.map.capacity() > self.sweep_at.max(MIN_SWEEP) * 2 {
            self.map.shrink_to(self.sweep_at.max(MIN_SWEEP));
        }
    }
}

/// A poisoned shard only means another thread panicked while holding it;
/// each step above leaves the vectors consistent.
fn lock(shard: &Mutex<Shard>) -> MutexGuard<'_, Shard> {
    shard
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}
