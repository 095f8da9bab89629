//! The GCRA state map's keys: (identity, policy name) with the identity's
//! hash carried along, so that one hash per call picks both the shard and
//! the bucket, and a lookup borrows the caller's key and policy instead of
//! building a map key.

use std::borrow::Borrow;
use std::hash::{BuildHasherDefault, Hash, Hasher};
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::key::Key;
use crate::limit::Limit;

/// The map of one shard.
pub(super) type SlotMap = std::collections::HashMap<SlotKey, Tats, BuildHasherDefault<Prehashed>>;

/// A stored key: the identity, its hash and the policy's name.
pub(super) struct SlotKey {
    hash: u64,
    key: Key,
    policy: Arc<str>,
}

impl SlotKey {
    pub(super) fn new(hash: u64, key: Key, policy: Arc<str>) -> Self {
        SlotKey { hash, key, policy }
    }
}

/// A lookup: the caller's identity and policy name, borrowed.
pub(super) struct Probe<'a> {
    pub(super) hash: u64,
    pub(super) key: &'a str,
    pub(super) policy: &'a str,
}

/// What stored keys and probes have in common, so that the map can be
/// searched with a [`Probe`] (`HashMap::get` needs `SlotKey: Borrow<Q>`).
pub(super) trait Lookup {
    fn parts(&self) -> (u64, &str, &str);
}

impl Lookup for SlotKey {
    fn parts(&self) -> (u64, &str, &str) {
        (self.hash, self.key.as_str(), &self.policy)
    }
}

impl Lookup for Probe<'_> {
    fn parts(&self) -> (u64, &str, &str) {
        (self.hash, self.key, self.policy)
    }
}

impl<'a> Borrow<dyn Lookup + 'a> for SlotKey {
    fn borrow(&self) -> &(dyn Lookup + 'a) {
        self
    }
}

impl Hash for dyn Lookup + '_ {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.parts().0);
    }
}

impl PartialEq for dyn Lookup + '_ {
    fn eq(&self, other: &Self) -> bool {
        let (hash, key, policy) = self.parts();
        let (other_hash, other_key, other_policy) = other.parts();
        // A limiter's calls all pass the same policy name: equal pointers
        // spare reading the stored copy.
        hash == other_hash
            && key == other_key
            && (std::ptr::eq(policy, other_policy) || policy == other_policy)
    }
}

impl Eq for dyn Lookup + '_ {}

impl Hash for SlotKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        (self as &dyn Lookup).hash(state);
    }
}

impl PartialEq for SlotKey {
    fn eq(&self, other: &Self) -> bool {
        (self as &dyn Lookup) == (other as &dyn Lookup)
    }
}

impl Eq for SlotKey {}

/// The map's hasher: the keys arrive hashed already (with the store's
/// randomly seeded SipHash), so it passes that hash on.
#[derive(Default)]
pub(super) struct Prehashed(u64);

impl Hasher for Prehashed {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Not reached by `SlotKey`, which writes one u64; kept correct.
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n;
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
                // One limit, known as such here, so that the algorithm's
                // loops unroll.
                let one = limits.get(..1).unwrap_or(limits);
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
