//! The memory store's state for the window algorithms, beside (and apart
//! from) its GCRA state, so that the GCRA path is untouched.

use std::collections::{HashMap, VecDeque};
use std::hash::BuildHasher;

use super::{MIN_CAPACITY, MemoryStore, eviction_cut, keep_after_eviction};
use crate::algorithm::Algorithm;
use crate::algorithm::calendar::{self, Quota, Tally};
use crate::algorithm::window::{Counter, Window};
use crate::decision::Decision;
use crate::key::Key;
use crate::policy::MAX_LIMITS_PER_POLICY;
use crate::store::{Answer, Call, Op};

/// Window state, sharded like the GCRA state.
pub(super) struct Table {
    shards: Box<[std::sync::Mutex<Shard>]>,
}

struct Shard {
    map: HashMap<Key, Vec<Entry>>,
    entries: usize,
    /// The most entries this shard holds: its part of the bound.
    cap: usize,
    /// No entry expires before then (an entry's `idle_at` only moves
    /// later), so that a sweep before then has nothing to drop.
    earliest: u64,
}

/// One identity's state under one policy name and algorithm, as the Redis
/// keys `…:{key}:log`, `…:{key}:sw:<i>` and `…:{key}:fw:<i>` are distinct.
struct Entry {
    policy: std::sync::Arc<str>,
    algorithm: Algorithm,
    state: State,
    /// From then on the state means nothing.
    idle_at: u64,
    /// Its place in the eviction order, lowest first: the later of
    /// `idle_at` and how long a call can matter (one longest window, two
    /// for the sliding counter) after the identity's last call, so that an
    /// identity that keeps calling (even denied) keeps its state.
    rank: u64,
}

enum State {
    /// Sliding log: admitted times, ascending, one per unit of cost.
    Log(VecDeque<u64>),
    /// Counter algorithms: one counter per window, by position.
    Counters(Box<[Counter]>),
    /// Calendar quotas: one tally per quota, by position, in Unix time.
    Tallies(Box<[Tally]>),
}

/// What a call runs with, beside its state: the policy's algorithm and
/// its limits as windows (calendar quotas: as periods too, resolved for
/// now), and the clock's reading and its Unix epoch.
struct Limits<'a> {
    algorithm: Algorithm,
    windows: &'a [Window],
    quotas: &'a [Quota],
    now: u64,
    epoch: u64,
}

impl Table {
    /// A table of one shard per part of the bound in `caps`.
    pub(super) fn new(caps: &[usize]) -> Self {
        Table {
            shards: caps
                .iter()
                .map(|&cap| {
                    std::sync::Mutex::new(Shard {
                        map: HashMap::new(),
                        entries: 0,
                        cap,
                        earliest: u64::MAX,
                    })
                })
                .collect(),
        }
    }

    pub(super) fn len(&self) -> usize {
        self.shards.iter().map(|s| lock(s).entries).sum()
    }

    /// How many entries the shards' maps have room for.
    #[cfg(test)]
    pub(super) fn capacity(&self) -> usize {
        self.shards.iter().map(|s| lock(s).map.capacity()).sum()
    }

    /// Drops every entry of `key` under the policy named `name`, whatever
    /// its algorithm; returns how many went.
    pub(super) fn remove(&self, hasher: &impl BuildHasher, name: &str, key: &Key) -> usize {
        let index = hasher.hash_one(key) as usize % self.shards.len();
        let mut shard = lock(&self.shards[index]);
        let Some(slot) = shard.map.get_mut(key) else {
            return 0;
        };
        let before = slot.len();
        slot.retain(|e| &*e.policy != name);
        let removed = before - slot.len();
        if slot.is_empty() {
            shard.map.remove(key);
        }
        shard.entries -= removed;
        removed
    }

    /// Drops the expired entries of shard `index`; returns how many
    /// entries it looked at.
    pub(super) fn sweep_shard(&self, index: usize, now: u64) -> usize {
        self.shards
            .get(index)
            .map_or(0, |shard| lock(shard).sweep(now))
    }
}

impl MemoryStore {
    /// Runs `op` on the window state of `call`'s policy (a window
    /// algorithm's) for its key.
    pub(super) fn window_op(&self, call: &Call<'_>, op: Op) -> Answer {
        let limits = call.policy.limits();
        let mut windows = [Window {
            length: 1,
            count: 0,
        }; MAX_LIMITS_PER_POLICY];
        for (w, limit) in windows.iter_mut().zip(limits) {
            *w = limit.as_window();
        }
        let windows = &windows[..limits.len()];
        let algorithm = call.policy.algorithm();
        let mut quotas = [Quota {
            count: 0,
            start: 0,
            end: 0,
            nominal: 0,
        }; MAX_LIMITS_PER_POLICY];
        let epoch = self.inner.clock.unix_epoch_micros();
        if algorithm == Algorithm::Calendar {
            // Resolved before the lock: the calendar's arithmetic is the
            // slow part, and a period it ends a hair early or late at a
            // boundary changes nothing but which side of it the call is.
            let unix = self.inner.clock.now_micros().saturating_add(epoch);
            for (q, limit) in quotas.iter_mut().zip(limits) {
                if let Some(calendar) = limit.calendar_of() {
                    let (start, end) = calendar.period(unix);
                    *q = Quota {
                        count: limit.rate().count(),
                        start,
                        end,
                        nominal: limit.as_window().length,
                    };
                }
            }
        }
        let quotas = &quotas[..limits.len()];
        // How long one call's count can matter: a window, or two for the
        // sliding counter (the previous window's count weighs in).
        let longest = windows.iter().map(|w| w.length).max().unwrap_or(0);
        let horizon = if algorithm == Algorithm::SlidingWindow {
            longest.saturating_mul(2)
        } else {
            longest
        };
        let table = &self.inner.windows;
        let index = self.inner.hasher.hash_one(call.key) as usize % table.shards.len();
        let mut shard = lock(&table.shards[index]);
        // Read under the lock: a key's calls then see time in order, as
        // the sliding log (kept ascending) needs.
        let now = self.inner.clock.now_micros();
        let run = Limits {
            algorithm,
            windows,
            quotas,
            now,
            epoch,
        };
        let (decision, evicted) = shard.decide(call, op, &run, horizon);
        drop(shard);
        self.inner.evicted(evicted, "window");
        self.inner.tick(now);
        decision.map_or(Answer::Done, Answer::Decision)
    }
}

impl Shard {
    /// Runs `op` for `call` on its entry in this shard, made if the op
    /// stores something; returns the decision and how many live entries
    /// making it evicted.
    fn decide(
        &mut self,
        call: &Call<'_>,
        op: Op,
        run: &Limits<'_>,
        horizon: u64,
    ) -> (Option<Decision>, u64) {
        let (algorithm, windows, now) = (run.algorithm, run.windows, run.now);
        let policy = call.policy.name();
        let existing = self.map.get_mut(call.key).and_then(|slot| {
            slot.iter_mut()
                .find(|e| &*e.policy == policy && e.algorithm == algorithm)
        });
        if let Some(entry) = existing {
            let (decision, idle_at) = apply(op, run, &mut entry.state, call.cost);
            if let Some(idle_at) = idle_at {
                entry.idle_at = entry.idle_at.max(idle_at);
            }
            if op != Op::Peek {
                entry.rank = entry
                    .rank
                    .max(entry.idle_at)
                    .max(now.saturating_add(horizon));
            }
            return (decision, 0);
        }
        if !matches!(op, Op::Check { .. } | Op::Peek | Op::Charge) {
            // Nothing to give back.
            return (None, 0);
        }
        let mut state = match algorithm {
            Algorithm::SlidingLog => State::Log(VecDeque::new()),
            Algorithm::Calendar => {
                State::Tallies(vec![Tally::default(); windows.len()].into_boxed_slice())
            }
            _ => State::Counters(vec![Counter::default(); windows.len()].into_boxed_slice()),
        };
        let (decision, idle_at) = apply(op, run, &mut state, call.cost);
        let Some(idle_at) = idle_at else {
            return (decision, 0);
        };
        let entry = Entry {
            policy: call.policy.name_arc(),
            algorithm,
            state,
            idle_at,
            rank: idle_at.max(now.saturating_add(horizon)),
        };
        (decision, self.insert(call.key, entry, now))
    }
}

/// Runs `op` on one entry's state: the decision (none for a refund) and,
/// when the op stored something that matters until then, the time from
/// which the state means nothing. A defer holds GCRA limits back only: it
/// leaves a window state alone.
fn apply(
    op: Op,
    run: &Limits<'_>,
    state: &mut State,
    cost: u64,
) -> (Option<Decision>, Option<u64>) {
    use crate::algorithm::{fixed_window, sliding_log, sliding_window};
    let (algorithm, windows, now) = (run.algorithm, run.windows, run.now);
    let counters = match state {
        State::Tallies(tallies) => return apply_calendar(op, run, tallies, cost),
        State::Log(log) => {
            return match op {
                Op::Check { .. } => {
                    let (decision, idle_at) = sliding_log::check(windows, log, now, cost);
                    (Some(decision), idle_at)
                }
                Op::Peek => (Some(sliding_log::peek(windows, log, now, cost)), None),
                Op::Charge => {
                    let (decision, idle_at) = sliding_log::charge(windows, log, now, cost);
                    (Some(decision), Some(idle_at))
                }
                Op::Refund => {
                    sliding_log::refund(windows, log, now, cost);
                    (None, None)
                }
                Op::Defer { .. } => (None, None),
            };
        }
        State::Counters(counters) => counters,
    };
    if counters.len() < windows.len() {
        // A policy of the same name with more windows: keep each
        // window's state by position, as the Redis keys do.
        let mut grown = vec![Counter::default(); windows.len()];
        grown[..counters.len()].copy_from_slice(counters);
        *counters = grown.into_boxed_slice();
    }
    let c = &mut counters[..windows.len()];
    let fixed = algorithm == Algorithm::FixedWindow;
    match op {
        Op::Check { .. } => {
            let (decision, idle_at) = if fixed {
                fixed_window::check(windows, c, now, cost)
            } else {
                sliding_window::check(windows, c, now, cost)
            };
            (Some(decision), idle_at)
        }
        Op::Peek if fixed => (Some(fixed_window::peek(windows, c, now, cost)), None),
        Op::Peek => (Some(sliding_window::peek(windows, c, now, cost)), None),
        Op::Charge => {
            let (decision, idle_at) = if fixed {
                fixed_window::charge(windows, c, now, cost)
            } else {
                sliding_window::charge(windows, c, now, cost)
            };
            (Some(decision), Some(idle_at))
        }
        Op::Refund => {
            if fixed {
                fixed_window::refund(windows, c, now, cost);
            } else {
                sliding_window::refund(windows, c, now, cost);
            }
            (None, None)
        }
        Op::Defer { .. } => (None, None),
    }
}

/// [`apply`] for calendar quotas, which count in Unix time.
fn apply_calendar(
    op: Op,
    run: &Limits<'_>,
    tallies: &mut Box<[Tally]>,
    cost: u64,
) -> (Option<Decision>, Option<u64>) {
    if tallies.len() < run.quotas.len() {
        // A policy of the same name with more quotas: keep each quota's
        // state by position, as the Redis keys do.
        let mut grown = vec![Tally::default(); run.quotas.len()];
        grown[..tallies.len()].copy_from_slice(tallies);
        *tallies = grown.into_boxed_slice();
    }
    let t = &mut tallies[..run.quotas.len()];
    let (quotas, unix) = (run.quotas, run.now.saturating_add(run.epoch));
    // Back from Unix time to the clock's, for the sweeps.
    let idle = |at: u64| at.saturating_sub(run.epoch);
    match op {
        Op::Check { .. } => {
            let (decision, idle_at) = calendar::check(quotas, t, unix, cost);
            (Some(decision), idle_at.map(idle))
        }
        Op::Peek => (Some(calendar::peek(quotas, t, unix, cost)), None),
        Op::Charge => {
            let (decision, idle_at) = calendar::charge(quotas, t, unix, cost);
            (Some(decision), Some(idle(idle_at)))
        }
        Op::Refund => {
            calendar::refund(quotas, t, unix, cost);
            (None, None)
        }
        Op::Defer { .. } => (None, None),
    }
}

impl Shard {
    /// Adds an entry, making room first in a full shard; returns how many
    /// live entries that evicted.
    fn insert(&mut self, key: &Key, entry: Entry, now: u64) -> u64 {
        let evicted = self.make_room(now);
        self.earliest = self.earliest.min(entry.idle_at);
        match self.map.get_mut(key) {
            Some(slot) => slot.push(entry),
            None => {
                self.map.insert(key.clone(), vec![entry]);
            }
        }
        self.entries += 1;
        evicted
    }

    /// Makes room for one more entry in a full shard: drops expired
    /// entries, then, if that left more than seven eighths, the live ones
    /// ranked lowest. Returns how many live entries went.
    fn make_room(&mut self, now: u64) -> u64 {
        if self.entries < self.cap {
            return 0;
        }
        self.sweep(now);
        let keep = keep_after_eviction(self.cap);
        if self.entries <= keep {
            return 0;
        }
        let mut ranks: Vec<u64> = self.map.values().flatten().map(|e| e.rank).collect();
        let (cut, mut ties) = eviction_cut(&mut ranks, keep);
        let before = self.entries;
        self.retain(|e| {
            e.rank > cut
                || (e.rank == cut
                    && (ties == 0 || {
                        ties -= 1;
                        false
                    }))
        });
        (before - self.entries) as u64
    }

    /// Drops the entries whose windows have all passed, and shrinks the
    /// map when it has become mostly empty. Returns how many entries it
    /// looked at.
    fn sweep(&mut self, now: u64) -> usize {
        if now < self.earliest {
            return 0;
        }
        let visited = self.entries;
        self.retain(|e| e.idle_at > now);
        let floor = (2 * self.map.len()).max(MIN_CAPACITY);
        if self.map.capacity() > 2 * floor {
            self.map.shrink_to(floor);
        }
        visited
    }

    /// Keeps the entries `keep` says to keep, and counts them again.
    fn retain(&mut self, mut keep: impl FnMut(&Entry) -> bool) {
        let mut earliest = u64::MAX;
        self.map.retain(|_, slot| {
            slot.retain(|e| {
                let kept = keep(e);
                if kept {
                    earliest = earliest.min(e.idle_at);
                }
                kept
            });
            !slot.is_empty()
        });
        self.entries = self.map.values().map(Vec::len).sum();
        self.earliest = earliest;
    }
}

/// A poisoned shard only means another thread panicked while holding it;
/// every state it holds is consistent between two decisions.
fn lock(shard: &std::sync::Mutex<Shard>) -> std::sync::MutexGuard<'_, Shard> {
    shard
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}
