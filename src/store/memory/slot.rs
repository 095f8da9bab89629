//! The GCRA state map of one shard: entries of (identity, policy name,
//! TATs) in a hash table searched with the caller's borrowed key and policy
//! name, so that a lookup builds nothing and compares in place, and one
//! hash per call picks both the shard and the bucket.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use hashbrown::HashTable;

use crate::key::Key;
use crate::policy::{Limit, Policy};

/// The map of one shard. Entries keep no hash: the table keeps a few bits
/// of each, and the store's hasher recomputes the rest when the table
/// grows or shrinks.
pub(super) type SlotMap = HashTable<Slot>;

/// One identity's state under one policy.
pub(super) struct Slot {
    /// The identity, inline when an IP key or a short text, so that
    /// comparing it reads no other memory.
    key: Key,
    /// The policy the state was made for, held for its name: a thin
    /// pointer, which keeps a slot at 48 bytes.
    policy: Policy,
    pub(super) tats: Tats,
}

impl Slot {
    pub(super) fn new(key: Key, policy: Policy, tats: Tats) -> Self {
        Slot { key, policy, tats }
    }

    /// The identity, for rehashing.
    pub(super) fn key(&self) -> &Key {
        &self.key
    }

    /// Whether this is `key`'s state under the policy named `name`.
    pub(super) fn is_named(&self, key: &Key, name: &str) -> bool {
        self.key == *key && self.policy.name() == name
    }

    /// Whether this is `key`'s state under a policy of `policy`'s name.
    #[inline(always)]
    pub(super) fn is(&self, key: &Key, policy: &Policy) -> bool {
        // Keys compared as keys, not as `str`s: two inline keys compare
        // their fixed-size buffers in a few instructions, where comparing
        // the texts calls `memcmp`. A limiter's calls all pass the same
        // policy: equal pointers spare reading the stored name.
        self.key == *key && (self.policy.same_as(policy) || self.policy.name() == policy.name())
    }
}

/// A computation on one key's TATs: GCRA's decision, or upstream
/// feedback's deferral. Pure, for it may run more than once; a trait
/// rather than a closure so that it is inlined on the hot path.
pub(super) trait Step {
    type Output;

    /// The result and whether to store the TATs as `run` left them.
    fn run(&self, limits: &[Limit], tats: &mut [u64], now: u64) -> (Self::Output, bool);
}

/// One policy's TATs for one identity. A one-limit policy (the common
/// case) keeps its TAT in an atomic, updated with compare-and-swap, so that
/// calls on one hot key from several threads never wait for each other and
/// a denial writes nothing; several limits, decided all-or-nothing, share
/// a small mutex, boxed so that the map's buckets stay small.
pub(super) enum Tats {
    One(AtomicU64),
    Many(Box<Mutex<Box<[u64]>>>),
}

impl Tats {
    /// Fresh state for `len` limits.
    pub(super) fn new(tats: &[u64]) -> Self {
        match tats {
            [one] => Tats::One(AtomicU64::new(*one)),
            _ => Tats::Many(Box::new(Mutex::new(tats.into()))),
        }
    }

    /// How many limits the state holds.
    pub(super) fn len(&self) -> usize {
        match self {
            Tats::One(_) => 1,
            Tats::Many(tats) => lock(tats).len(),
        }
    }

    /// Runs `step` on the limits and their TATs (the first `limits.len()`,
    /// no more than [`Tats::len`]) and stores what it wrote when it says
    /// so. A step may run more than once (when another thread changed the
    /// state in between).
    #[inline(always)]
    pub(super) fn update<S: Step>(&self, limits: &[Limit], now: u64, step: &S) -> S::Output {
        match self {
            Tats::One(tat) => {
                // One limit, known as such here (a slice of length one
                // made from a reference), so that the algorithm's loops
                // disappear.
                let Some(first) = limits.first() else {
                    return step.run(limits, &mut [], now).0;
                };
                let one = std::slice::from_ref(first);
                let mut current = tat.load(Ordering::Acquire);
                loop {
                    let mut next = [current];
                    let (result, write) = step.run(one, &mut next, now);
                    if !write || next[0] == current {
                        return result;
                    }
                    match tat.compare_exchange_weak(
                        current,
                        next[0],
                        Ordering::AcqRel,
                        Ordering::Acquire,
                    ) {
                        Ok(_) => return result,
                        Err(actual) => current = actual,
                    }
                }
            }
            Tats::Many(tats) => update_many(tats, limits, now, step),
        }
    }

    /// Grows the state to `len` limits, keeping each limit's TAT by
    /// position (as the Redis keys `…:{key}:<i>` do).
    pub(super) fn grow(&mut self, len: usize) {
        if self.len() >= len {
            return;
        }
        let mut tats = vec![0u64; len];
        match self {
            Tats::One(tat) => tats[0] = *tat.get_mut(),
            Tats::Many(old) => {
                let old = old.get_mut().unwrap_or_else(|p| p.into_inner());
                tats[..old.len()].copy_from_slice(old);
            }
        }
        *self = Tats::Many(Box::new(Mutex::new(tats.into_boxed_slice())));
    }

    /// When every limit has refilled: from then on the state means nothing.
    pub(super) fn idle_at(&mut self) -> u64 {
        match self {
            Tats::One(tat) => *tat.get_mut(),
            Tats::Many(tats) => tats
                .get_mut()
                .unwrap_or_else(|p| p.into_inner())
                .iter()
                .copied()
                .max()
                .unwrap_or(0),
        }
    }
}

/// [`Tats::update`] for several limits, under their mutex. Kept out of
/// line, so that the one-limit path stays small.
#[inline(never)]
fn update_many<S: Step>(
    tats: &Mutex<Box<[u64]>>,
    limits: &[Limit],
    now: u64,
    step: &S,
) -> S::Output {
    let mut tats = lock(tats);
    let end = limits.len().min(tats.len());
    step.run(&limits[..end], &mut tats[..end], now).0
}

/// A poisoned lock only means another thread panicked while holding it;
/// the TATs are plain numbers that are always consistent.
fn lock(tats: &Mutex<Box<[u64]>>) -> std::sync::MutexGuard<'_, Box<[u64]>> {
    tats.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}
