//! The memory store's state for the window algorithms, beside (and apart
//! from) its GCRA state, so that the GCRA path is untouched.

use std::collections::{HashMap, VecDeque};
use std::hash::BuildHasher;

use super::{MIN_SWEEP, MemoryStore};
use crate::algorithm::Algorithm;
use crate::decision::Decision;
use crate::key::Key;
use crate::limit::MAX_LIMITS_PER_POLICY;
use crate::store::WindowCall;
use crate::window::{self, Counter, Window};

/// Window state, sharded like the GCRA state.
pub(super) struct Table {
    shards: Box<[std::sync::Mutex<Shard>]>,
}

#[derive(Default)]
struct Shard {
    map: HashMap<Key, Vec<Entry>>,
    entries: usize,
    sweep_at: usize,
}

/// One identity's state under one policy name and algorithm, as the Redis
/// keys `…:{key}:log`, `…:{key}:sw:<i>` and `…:{key}:fw:<i>` are distinct.
struct Entry {
    policy: std::sync::Arc<str>,
    algorithm: Algorithm,
    state: State,
    /// From then on the state means nothing.
    idle_at: u64,
}

enum State {
    /// Sliding log: admitted times, ascending, one per unit of cost.
    Log(VecDeque<u64>),
    /// Counter algorithms: one counter per window, by position.
    Counters(Box<[Counter]>),
}

impl Table {
    pub(super) fn new(shards: usize) -> Self {
        Table {
            shards: (0..shards)
                .map(|_| std::sync::Mutex::new(Shard::default()))
                .collect(),
        }
    }

    pub(super) fn len(&self) -> usize {
        self.shards.iter().map(|s| lock(s).entries).sum()
    }

    pub(super) fn sweep(&self, now: u64) {
        for shard in self.shards.iter() {
            lock(shard).sweep(now);
        }
    }
}

impl MemoryStore {
    pub(super) fn decide_window(&self, call: &WindowCall<'_>) -> Decision {
        let limits = call.policy.limits();
        let mut windows = [Window {
            length: 1,
            count: 0,
        }; MAX_LIMITS_PER_POLICY];
        for (w, limit) in windows.iter_mut().zip(limits) {
            *w = Window::of(limit);
        }
        let windows = &windows[..limits.len()];
        let algorithm = call.policy.algorithm();
        if !algorithm.is_window() {
            // Only reached through a GCRA policy handed to `window`: decide
            // it as what it is.
            return self.decide(&call.as_gcra());
        }
        let table = &self.inner.windows;
        let index = self.inner.hasher.hash_one(call.key) as usize % table.shards.len();
        let mut shard = lock(&table.shards[index]);
        let now = self.inner.clock.now_micros();
        let policy = call.policy.name();
        let existing = shard.map.get_mut(call.key).and_then(|slot| {
            slot.iter_mut()
                .find(|e| &*e.policy == policy && e.algorithm == algorithm)
        });
        if let Some(entry) = existing {
            let (decision, idle_at) = decide(algorithm, windows, &mut entry.state, now, call.cost);
            if let Some(idle_at) = idle_at {
                entry.idle_at = entry.idle_at.max(idle_at);
            }
            return decision;
        }
        let mut state = match algorithm {
            Algorithm::SlidingLog => State::Log(VecDeque::new()),
            _ => State::Counters(vec![Counter::default(); windows.len()].into_boxed_slice()),
        };
        let (decision, idle_at) = decide(algorithm, windows, &mut state, now, call.cost);
        if let Some(idle_at) = idle_at {
            let entry = Entry {
                policy: call.policy.name_arc(),
                algorithm,
                state,
                idle_at,
            };
            shard.insert(call.key, entry, now);
        }
        decision
    }
}

fn decide(
    algorithm: Algorithm,
    windows: &[Window],
    state: &mut State,
    now: u64,
    cost: u64,
) -> (Decision, Option<u64>) {
    match state {
        State::Log(log) => window::sliding_log(windows, log, now, cost),
        State::Counters(counters) => {
            if counters.len() < windows.len() {
                // A policy of the same name with more windows: keep each
                // window's state by position, as the Redis keys do.
                let mut grown = vec![Counter::default(); windows.len()];
                grown[..counters.len()].copy_from_slice(counters);
                *counters = grown.into_boxed_slice();
            }
            let counters = &mut counters[..windows.len()];
            if algorithm == Algorithm::FixedWindow {
                window::fixed_window(windows, counters, now, cost)
            } else {
                window::sliding_counter(windows, counters, now, cost)
            }
        }
    }
}

impl Shard {
    fn insert(&mut self, key: &Key, entry: Entry, now: u64) {
        if self.entries >= self.sweep_at.max(MIN_SWEEP) {
            self.sweep(now);
        }
        match self.map.get_mut(key) {
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
/// every state it holds is consistent between two decisions.
fn lock(shard: &std::sync::Mutex<Shard>) -> std::sync::MutexGuard<'_, Shard> {
    shard
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}
