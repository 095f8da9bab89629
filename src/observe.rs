//! What the layers of this process decided, as a plain value any
//! application can serve: [`snapshot`] now, or [`watch`] for one every
//! interval.
//!
//! It is fed by the same calls as [`metrics`](crate::metrics) and is always
//! on: each layer registers its counters once, when it is built, and a
//! decision costs one relaxed atomic add (a denial also offers its hashed
//! identity to a small table, skipped when another thread holds it). What
//! a snapshot holds:
//!
//! - per layer and policy, the decisions so far by outcome (cumulative:
//!   subtract two snapshots for a rate) and the identities most often
//!   denied recently, as hashes ([`identity`]), never as keys;
//! - per concurrency policy, the leases this process holds and the
//!   capacity of each identity; per fleet shedder, each tier's requests in
//!   flight here against the tier's share of the fleet;
//! - the Redis store's recent round-trip latency (p50, p99) and its calls
//!   and errors so far;
//! - how many instances share the store, as the heartbeats of
//!   [`LivePolicies`](crate::live::LivePolicies) last counted them.
//!
//! ```no_run
//! # #[tokio::main] async fn main() {
//! use std::time::Duration;
//!
//! let mut snapshots = fleetgate::observe::watch(Duration::from_secs(1));
//! while snapshots.changed().await.is_ok() {
//!     let now = snapshots.borrow_and_update().clone();
//!     for policy in &now.policies {
//!         println!("{} {}: {} denied", policy.layer, policy.policy, policy.decisions.denied);
//!     }
//! }
//! # }
//! ```
//!
//! With the `serde` feature every type here is `Serialize`.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::key::Key;
use crate::metrics::Outcome;
use crate::shed::ShedState;

/// How many identities [`PolicySnapshot::top_denied`] lists.
const TOP: usize = 10;
/// Identities each denial table keeps per period (space-saving: the most
/// denied survive whatever the number of identities).
const SLOTS: usize = 32;
/// How long each of the two denial tables (and latency histograms)
/// collects before the older is cleared: a snapshot covers the last one
/// to two periods.
const DENIAL_PERIOD: Duration = Duration::from_secs(30);
const LATENCY_PERIOD: Duration = Duration::from_secs(10);

/// What this process's layers have decided, at one instant.
#[derive(Clone, Debug, Default, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Snapshot {
    /// When it was taken: milliseconds since the Unix epoch.
    pub at_ms: u64,
    /// How many instances share the store (1 on a memory store, or before
    /// the first heartbeat).
    pub instances: u64,
    /// One entry per layer kind and policy name built so far, sorted by
    /// both.
    pub policies: Vec<PolicySnapshot>,
    /// The Redis store's round trips (zero on a memory store).
    pub store: StoreSnapshot,
}

/// One policy as the layers deciding it saw it (layers of the same kind
/// and policy name share their counters).
#[derive(Clone, Debug, Default, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct PolicySnapshot {
    /// `rate_limit`, `concurrency`, `fleet_shed` or `utilization_shed`.
    pub layer: &'static str,
    /// The policy's name.
    pub policy: String,
    /// Decisions so far, by outcome.
    pub decisions: Decisions,
    /// Rate limits: admitted with at most a tenth of the burst left.
    pub near_limit: u64,
    /// Rate limits: the identities denied most in the last 30 to 60 s (when
    /// snapshots come at least every 30 s; otherwise since the one before
    /// last), most denied first, at most ten.
    pub top_denied: Vec<Denials>,
    /// Concurrency limits: leases this process holds now (all identities).
    pub leases_in_use: Option<u64>,
    /// Concurrency limits: leases each identity may hold; fleet shedders:
    /// the fleet's capacity.
    pub capacity: Option<u64>,
    /// Load shedders: each tier, least important last.
    pub tiers: Vec<TierShare>,
}

/// Decisions by outcome (the `outcome` label of
/// [`metrics`](crate::metrics)).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[allow(missing_docs)] // Each is the metric label of the same name.
pub struct Decisions {
    pub allowed: u64,
    pub denied: u64,
    pub shadow_denied: u64,
    pub shed: u64,
    pub missing_key: u64,
    pub fail_open: u64,
    pub fail_closed: u64,
    pub fallback_allowed: u64,
    pub fallback_denied: u64,
}

/// How often one identity was denied.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Denials {
    /// The identity's hash ([`identity`]).
    pub identity: String,
    /// Denials counted (at least; an estimate once more identities are
    /// denied than the table holds).
    pub denials: u64,
}

/// One load-shedding tier.
#[derive(Clone, Debug, Default, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct TierShare {
    /// The tier's name.
    pub tier: String,
    /// Its requests in flight in this process.
    pub in_flight: u64,
    /// Fleet shedder: how many the whole fleet may have in flight when one
    /// of this tier is admitted (`None`: never shed).
    pub limit: Option<u64>,
    /// How much of the tier is shed now, 0 to 1
    /// ([`TierState::shed_fraction`](crate::shed::TierState::shed_fraction)).
    pub shed_fraction: f64,
}

/// The Redis store's round trips.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct StoreSnapshot {
    /// Round trips so far.
    pub calls: u64,
    /// Calls failed so far (timeouts included).
    pub errors: u64,
    /// Median latency of the last 10 to 20 s, in microseconds (to within
    /// a fifth); `None` without calls.
    pub p50_us: Option<u64>,
    /// 99th percentile of the same.
    pub p99_us: Option<u64>,
}

/// This process's decisions now.
pub fn snapshot() -> Snapshot {
    let at_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    let registered: Vec<Arc<PolicyStats>> = lock(&REGISTRY).clone();
    let mut policies = Vec::with_capacity(registered.len());
    for stats in &registered {
        let mut policy = PolicySnapshot {
            layer: stats.layer,
            policy: stats.policy.to_string(),
            ..PolicySnapshot::default()
        };
        stats.add_to(&mut policy);
        policies.push(policy);
    }
    policies.sort_by(|a, b| (a.layer, &a.policy).cmp(&(b.layer, &b.policy)));
    Snapshot {
        at_ms,
        instances: crate::share::fleet_size(),
        policies,
        store: STORE.snapshot(),
    }
}

/// A snapshot now and then one every `every` (at least 10 ms), for as long
/// as a receiver is kept, from a task spawned on the current Tokio runtime
/// (it ends at the first tick with no receiver left).
///
/// # Panics
///
/// Outside a Tokio runtime, as [`tokio::spawn`].
pub fn watch(every: Duration) -> tokio::sync::watch::Receiver<Arc<Snapshot>> {
    let (sender, receiver) = tokio::sync::watch::channel(Arc::new(snapshot()));
    tokio::spawn(async move {
        let mut ticks = tokio::time::interval(every.max(Duration::from_millis(10)));
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticks.tick().await;
        loop {
            ticks.tick().await;
            // Fails once every receiver is gone: the task ends a tick later.
            if sender.send(Arc::new(snapshot())).is_err() {
                return;
            }
        }
    });
    receiver
}

/// The hash `key` is listed by in [`PolicySnapshot::top_denied`]: 16 hex
/// digits, keyed by a secret chosen when the process starts, so that a
/// listed hash reveals nothing of the key (not even a guessable IP
/// address), and differs from one process to the next.
pub fn identity(key: &Key) -> String {
    hex(hash(key))
}

fn hash(key: &Key) -> u64 {
    static SECRET: OnceLock<RandomState> = OnceLock::new();
    SECRET
        .get_or_init(RandomState::new)
        .hash_one(key.hash_bytes())
}

fn hex(hash: u64) -> String {
    format!("{hash:016x}")
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The counters of every layer kind and policy name ever built, shared by
/// the layers of the same pair and kept for the life of the process (as a
/// metrics recorder keeps its series): bounded by the configuration, and
/// a layer rebuilt (axum may build one per request) keeps counting on.
static REGISTRY: Mutex<Vec<Arc<PolicyStats>>> = Mutex::new(Vec::new());

/// Where a policy's shedder state is read from, at snapshot time.
type ShedSource = Box<dyn Fn() -> ShedState + Send + Sync>;

/// The counters of one layer kind and policy name, registered when a
/// layer is built.
pub(crate) struct PolicyStats {
    layer: &'static str,
    policy: Arc<str>,
    outcomes: [AtomicU64; 9],
    near_limit: AtomicU64,
    denied: Mutex<DeniedTable>,
    leases_in_use: AtomicU64,
    capacity: OnceLock<u64>,
    leases: OnceLock<()>,
    shed: OnceLock<ShedSource>,
}

impl std::fmt::Debug for PolicyStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PolicyStats")
            .field("layer", &self.layer)
            .field("policy", &self.policy)
            .finish_non_exhaustive()
    }
}

impl PolicyStats {
    /// Counters for a layer of kind `layer` deciding `policy`, listed in
    /// every snapshot while they live.
    pub(crate) fn register(layer: &'static str, policy: Arc<str>) -> Arc<Self> {
        let mut registry = lock(&REGISTRY);
        if let Some(stats) = registry
            .iter()
            .find(|s| s.layer == layer && s.policy == policy)
        {
            return stats.clone();
        }
        let stats = Arc::new(PolicyStats {
            layer,
            policy,
            outcomes: Default::default(),
            near_limit: AtomicU64::new(0),
            denied: Mutex::new(DeniedTable::new(Instant::now())),
            leases_in_use: AtomicU64::new(0),
            capacity: OnceLock::new(),
            leases: OnceLock::new(),
            shed: OnceLock::new(),
        });
        registry.push(stats.clone());
        stats
    }

    #[inline]
    pub(crate) fn decided(&self, outcome: Outcome, near_limit: bool) {
        self.outcomes[outcome.index()].fetch_add(1, Ordering::Relaxed);
        if near_limit && outcome == Outcome::Allowed {
            self.near_limit.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Counts a denial of `key` in the table, unless another thread is
    /// counting one: a flood of denials never waits on this lock.
    pub(crate) fn denied(&self, key: &Key) {
        if let Ok(mut table) = self.denied.try_lock() {
            table.record(hash(key));
        }
    }

    /// A concurrency policy whose identities may each hold `capacity`.
    pub(crate) fn leases(&self, capacity: u64) {
        let _ = self.capacity.set(capacity);
        let _ = self.leases.set(());
    }

    /// A shedder whose tiers `state` reads, of fleet capacity `capacity`.
    pub(crate) fn shedder(&self, capacity: Option<u64>, state: ShedSource) {
        if let Some(capacity) = capacity {
            let _ = self.capacity.set(capacity);
        }
        let _ = self.shed.set(state);
    }

    /// One lease held until the returned token is dropped.
    pub(crate) fn hold(self: &Arc<Self>) -> Held {
        self.leases_in_use.fetch_add(1, Ordering::Relaxed);
        Held(self.clone())
    }

    fn add_to(&self, to: &mut PolicySnapshot) {
        let n = |o: Outcome| self.outcomes[o.index()].load(Ordering::Relaxed);
        to.decisions = Decisions {
            allowed: n(Outcome::Allowed),
            denied: n(Outcome::Denied),
            shadow_denied: n(Outcome::ShadowDenied),
            shed: n(Outcome::Shed),
            missing_key: n(Outcome::MissingKey),
            fail_open: n(Outcome::FailOpen),
            fail_closed: n(Outcome::FailClosed),
            fallback_allowed: n(Outcome::FallbackAllowed),
            fallback_denied: n(Outcome::FallbackDenied),
        };
        to.near_limit = self.near_limit.load(Ordering::Relaxed);
        if self.leases.get().is_some() {
            to.leases_in_use = Some(self.leases_in_use.load(Ordering::Relaxed));
        }
        to.capacity = self.capacity.get().copied();
        let mut denied = HashMap::new();
        lock(&self.denied).add_to(&mut denied, Instant::now());
        let mut top: Vec<(u64, u64)> = denied.into_iter().collect();
        top.sort_unstable_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        to.top_denied = top
            .into_iter()
            .take(TOP)
            .map(|(hash, denials)| Denials {
                identity: hex(hash),
                denials,
            })
            .collect();
        if let Some(state) = self.shed.get() {
            to.tiers = state()
                .tiers()
                .iter()
                .map(|t| TierShare {
                    tier: t.name().to_owned(),
                    in_flight: t.in_flight(),
                    limit: t.limit(),
                    shed_fraction: t.shed_fraction(),
                })
                .collect();
        }
    }
}

/// A lease counted in [`PolicySnapshot::leases_in_use`] while it lives.
#[derive(Debug)]
pub(crate) struct Held(Arc<PolicyStats>);

impl Drop for Held {
    fn drop(&mut self) {
        self.0.leases_in_use.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The identities denied most, per period: two space-saving tables, the
/// current one and the one before. They turn over when read, at most once
/// a period: read every second or so (as [`watch`] does), they hold the
/// last one to two periods; read rarely, what came since the read before.
struct DeniedTable {
    since: Instant,
    current: Vec<(u64, u64)>,
    previous: Vec<(u64, u64)>,
}

impl DeniedTable {
    fn new(now: Instant) -> Self {
        DeniedTable {
            since: now,
            current: Vec::with_capacity(SLOTS),
            previous: Vec::with_capacity(SLOTS),
        }
    }

    fn rotate(&mut self, now: Instant) {
        let age = now.saturating_duration_since(self.since);
        if age < DENIAL_PERIOD {
            return;
        }
        std::mem::swap(&mut self.current, &mut self.previous);
        self.current.clear();
        self.since = now;
    }

    /// Counts one denial in the current table. The tables turn over when
    /// a snapshot reads them, so that a denial reads no clock.
    fn record(&mut self, hash: u64) {
        if let Some(slot) = self.current.iter_mut().find(|(h, _)| *h == hash) {
            slot.1 += 1;
        } else if self.current.len() < SLOTS {
            self.current.push((hash, 1));
        } else if let Some(least) = self.current.iter_mut().min_by_key(|(_, n)| *n) {
            // Space-saving: the newcomer inherits the least count, so an
            // identity denied often climbs back whatever came between.
            *least = (hash, least.1 + 1);
        }
    }

    fn add_to(&mut self, to: &mut HashMap<u64, u64>, now: Instant) {
        self.rotate(now);
        for (hash, n) in self.current.iter().chain(&self.previous) {
            *to.entry(*hash).or_insert(0) += n;
        }
    }
}

/// The Redis store's round trips, for every store of the process.
static STORE: StoreStats = StoreStats::new();

/// Latency buckets: four per power of two of microseconds, up to 2^40 µs.
const BUCKETS: usize = 4 * 40;

struct StoreStats {
    calls: AtomicU64,
    errors: AtomicU64,
    /// Which histogram records now.
    current: AtomicUsize,
    histograms: [[AtomicU64; BUCKETS]; 2],
    rotated: Mutex<Option<Instant>>,
}

impl StoreStats {
    const fn new() -> Self {
        StoreStats {
            calls: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            current: AtomicUsize::new(0),
            histograms: [const { [const { AtomicU64::new(0) }; BUCKETS] }; 2],
            rotated: Mutex::new(None),
        }
    }

    fn snapshot(&self) -> StoreSnapshot {
        let now = Instant::now();
        {
            let mut rotated = lock(&self.rotated);
            match *rotated {
                None => *rotated = Some(now),
                Some(at) if now.saturating_duration_since(at) >= LATENCY_PERIOD => {
                    let next = 1 - (self.current.load(Ordering::Relaxed) & 1);
                    for bucket in &self.histograms[next] {
                        bucket.store(0, Ordering::Relaxed);
                    }
                    self.current.store(next, Ordering::Relaxed);
                    *rotated = Some(now);
                }
                Some(_) => {}
            }
        }
        let counts: Vec<u64> = (0..BUCKETS)
            .map(|i| {
                self.histograms[0][i].load(Ordering::Relaxed)
                    + self.histograms[1][i].load(Ordering::Relaxed)
            })
            .collect();
        StoreSnapshot {
            calls: self.calls.load(Ordering::Relaxed),
            errors: self.errors.load(Ordering::Relaxed),
            p50_us: quantile(&counts, 0.5),
            p99_us: quantile(&counts, 0.99),
        }
    }
}

/// Records one Redis round trip.
#[cfg(feature = "redis")]
#[inline]
pub(crate) fn store_timed(took: Duration) {
    let us = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
    let current = STORE.current.load(Ordering::Relaxed) & 1;
    STORE.histograms[current][bucket(us)].fetch_add(1, Ordering::Relaxed);
    STORE.calls.fetch_add(1, Ordering::Relaxed);
}

/// Counts one failed Redis call.
#[cfg(feature = "redis")]
pub(crate) fn store_failed() {
    STORE.errors.fetch_add(1, Ordering::Relaxed);
}

#[cfg_attr(not(feature = "redis"), allow(dead_code))]
/// The bucket of `us` microseconds: its power of two, and which quarter of
/// it.
fn bucket(us: u64) -> usize {
    let us = us.max(1);
    let octave = 63 - us.leading_zeros() as usize;
    let quarter = if octave >= 2 {
        ((us >> (octave - 2)) & 3) as usize
    } else {
        0
    };
    (octave * 4 + quarter).min(BUCKETS - 1)
}

/// The upper end of bucket `i`, in microseconds.
fn upper(i: usize) -> u64 {
    let (octave, quarter) = (i / 4, (i % 4) as u64);
    if octave < 2 {
        return 1 << (octave + 1);
    }
    (4 + quarter + 1) << (octave - 2)
}

fn quantile(counts: &[u64], q: f64) -> Option<u64> {
    let total: u64 = counts.iter().sum();
    if total == 0 {
        return None;
    }
    // The rank of the quantile, 1-based: at least the first sample.
    let rank = ((total as f64 * q).ceil() as u64).max(1);
    let mut seen = 0;
    for (i, n) in counts.iter().enumerate() {
        seen += n;
        if seen >= rank {
            return Some(upper(i));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_hold_their_values() {
        for us in [1, 2, 3, 4, 5, 7, 8, 100, 1000, 12_345, 1 << 30] {
            let i = bucket(us);
            assert!(upper(i) > us, "{us}: bucket {i} ends at {}", upper(i));
            assert!(i == 0 || upper(i - 1) <= us, "{us}: bucket {i} starts late");
        }
    }

    #[test]
    fn quantiles_read_the_buckets() {
        let mut counts = vec![0; BUCKETS];
        counts[bucket(100)] = 98;
        counts[bucket(5000)] = 2;
        assert_eq!(quantile(&counts, 0.5), Some(upper(bucket(100))));
        assert_eq!(quantile(&counts, 0.99), Some(upper(bucket(5000))));
        assert_eq!(quantile(&[0; BUCKETS], 0.5), None);
    }

    #[test]
    fn the_most_denied_survive_a_crowd() {
        let t0 = Instant::now();
        let mut table = DeniedTable::new(t0);
        // 500 denials of one identity among 5,000 of 5,000 others, each
        // denied once: more than the total over the slots (172), which
        // space-saving always keeps.
        for round in 0..100u64 {
            for _ in 0..5 {
                table.record(7);
            }
            for other in 0..50 {
                table.record(1000 + round * 100 + other);
            }
        }
        assert!(table.current.len() <= SLOTS);
        let mut counts = HashMap::new();
        table.add_to(&mut counts, t0);
        let top = counts.iter().max_by_key(|(_, n)| **n).map(|(h, _)| *h);
        assert_eq!(top, Some(7));
        assert!(counts[&7] >= 500);
    }

    #[test]
    fn denials_are_forgotten_two_readings_later() {
        let t0 = Instant::now();
        let mut table = DeniedTable::new(t0);
        table.record(1);
        let mut counts = HashMap::new();
        table.add_to(&mut counts, t0 + DENIAL_PERIOD);
        assert_eq!(counts.get(&1), Some(&1), "kept one period more");
        let mut counts = HashMap::new();
        table.add_to(&mut counts, t0 + DENIAL_PERIOD / 2 * 3);
        assert_eq!(counts.get(&1), Some(&1), "no turn within a period");
        let mut counts = HashMap::new();
        table.add_to(&mut counts, t0 + DENIAL_PERIOD * 2);
        assert!(counts.is_empty());
    }
}
