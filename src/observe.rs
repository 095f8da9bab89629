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
//!   denied in the last minute, as hashes ([`identity`]), never as keys;
//! - per concurrency policy, the leases this process holds and the
//!   capacity of each identity (the identities refused for being at it
//!   are its `top_denied`); per shedder, each tier's requests in flight
//!   here against the limit the fleet admits it under;
//! - the Redis store's recent round-trip latency (p50, p99) and its calls
//!   and errors so far;
//! - how many instances share the store, as the heartbeats of
//!   [`LivePolicies`](crate::live::LivePolicies) last counted them
//!   (unknown without them).
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

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use sha2::{Digest, Sha256};

use crate::key::Key;
use crate::outcome::Outcome;
use crate::shed::ShedState;

/// How many identities [`PolicySnapshot::top_denied`] lists.
const TOP: usize = 10;
/// Identities each denial table keeps per period (space-saving: the most
/// denied survive whatever the number of identities).
const SLOTS: usize = 32;
/// How long each denial table collects: a snapshot sums the tables of the
/// last [`DENIAL_WINDOW`], so it covers 60 to 70 s.
const DENIAL_PERIOD: Duration = Duration::from_secs(10);
const DENIAL_WINDOW: Duration = Duration::from_secs(60);
/// Denial tables kept: the window's, and the one being filled.
const DENIAL_TABLES: usize = 7;
/// How long each of the two latency histograms collects before the older
/// is cleared: a snapshot covers the last one to two periods.
const LATENCY_PERIOD: Duration = Duration::from_secs(10);

/// What this process's layers have decided, at one instant.
#[derive(Clone, Debug, Default, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct Snapshot {
    /// When it was taken: milliseconds since the Unix epoch.
    pub at_ms: u64,
    /// How many instances share the store, as the heartbeats of
    /// [`LivePolicies`](crate::live::LivePolicies) last counted them;
    /// `None` without them (a memory store, or before the first).
    pub instances: Option<u64>,
    /// One entry per layer kind and policy name built so far, sorted by
    /// both.
    pub policies: Vec<PolicySnapshot>,
    /// The Redis store's round trips (zero on a memory store).
    pub store: StoreSnapshot,
    /// Client-side adaptive throttles built so far, by name.
    pub throttles: Vec<ThrottleSnapshot>,
    /// Retry budgets built so far, by name.
    pub retry_budgets: Vec<RetryBudgetSnapshot>,
}

/// A client-side adaptive throttle
/// ([`AdaptiveThrottle`](crate::rate_limit::AdaptiveThrottle)): the
/// throttles of one name share these counters.
#[derive(Clone, Debug, Default, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct ThrottleSnapshot {
    /// The throttle's name.
    pub name: String,
    /// Calls passed on to the inner service so far.
    pub sent: u64,
    /// Calls the upstream accepted so far.
    pub accepted: u64,
    /// Calls refused locally so far.
    pub refused: u64,
    /// The probability a call is refused now (of the throttle built
    /// last).
    pub rejection_probability: f64,
    /// Accepts over requests in the throttle's window (of the throttle
    /// built last; requests count the refused calls too under
    /// `count_refused(true)`); `None` without requests in it.
    pub accept_ratio: Option<f64>,
}

/// A retry budget ([`RetryBudget`](crate::rate_limit::RetryBudget)), as
/// this process spent it: the budgets of one name share these counters.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct RetryBudgetSnapshot {
    /// The budget's name.
    pub name: String,
    /// First attempts deposited so far.
    pub first_attempts: u64,
    /// Retries allowed so far.
    pub retries: u64,
    /// Retries refused for want of a token so far.
    pub refused: u64,
    /// Calls to the store that failed so far.
    pub store_errors: u64,
}

/// One policy as the layers deciding it saw it (layers of the same kind
/// and policy name share their counters).
#[derive(Clone, Debug, Default, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct PolicySnapshot {
    /// `rate_limit`, `concurrency`, `fleet_shed` or `utilization_shed`.
    pub layer: &'static str,
    /// The policy's name.
    pub policy: String,
    /// Decisions so far, by outcome.
    pub decisions: Decisions,
    /// Rate limits: admitted with at most a tenth of the burst left.
    pub near_limit: u64,
    /// Rate and concurrency limits: the identities denied most in the last
    /// minute (60 to 70 s: tables of 10 s, which turn over when a snapshot
    /// reads them, so this holds when snapshots come at least every 10 s),
    /// most denied first, at most ten. For a concurrency limit, these are
    /// the identities refused for holding their capacity.
    pub top_denied: Vec<Denials>,
    /// Concurrency limits: leases this process holds now, all identities
    /// together.
    pub leases_in_use: Option<u64>,
    /// Concurrency limits: leases each identity may hold, fleet-wide;
    /// fleet shedders: the fleet's capacity (of the layer built last).
    pub capacity: Option<u64>,
    /// Load shedders: each tier, least important last.
    pub tiers: Vec<TierShare>,
    /// Adaptive concurrency limits: where the limit is (of the layer built
    /// last); `capacity` is then its current value.
    pub adaptive: Option<AdaptiveState>,
    /// Concurrency limits with a wait queue: its state (of the layer
    /// built last).
    pub queue: Option<QueueState>,
}

/// Where an adaptive concurrency limit is: see
/// [`ConcurrencyLimiter::adaptive_state`](crate::concurrency::ConcurrencyLimiter::adaptive_state).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct AdaptiveState {
    /// `gradient2` or `aimd`.
    pub algorithm: &'static str,
    /// The limit enforced now.
    pub limit: u64,
    /// Calls admitted and not yet answered.
    pub in_flight: u64,
    /// The minimum RTT in microseconds: measured by probing (Gradient2),
    /// the fastest success seen (AIMD); `None` until measured.
    pub min_rtt_us: Option<u64>,
    /// The last sampling window's gradient (Gradient2): below 1 the
    /// service queues, from 1 up it does not.
    pub gradient: Option<f64>,
    /// Whether the minimum RTT is being measured now (the limit is then at
    /// its minimum).
    pub probing: bool,
}

/// A concurrency limit's wait queue: see
/// [`ConcurrencyLimiter::queue_state`](crate::concurrency::ConcurrencyLimiter::queue_state).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct QueueState {
    /// Callers waiting now.
    pub waiting: usize,
    /// Callers that got a slot after waiting, so far.
    pub admitted: u64,
    /// Callers refused after waiting the longest wait, so far.
    pub timed_out: u64,
    /// Callers refused because the queue was full, so far: newcomers
    /// (FIFO) or the oldest callers they displaced (LIFO).
    pub overflowed: u64,
    /// The time the admitted callers waited, in all, in microseconds.
    pub waited_us: u64,
}

/// Where a concurrency limit's current state is read from, at snapshot
/// time (registered weakly, as a [`ShedSource`] is).
pub(crate) trait LimitSource: Send + Sync {
    /// The limit per identity now.
    fn limit(&self) -> u64;
    /// The adaptive limit's state, if it adapts.
    fn adaptive(&self) -> Option<AdaptiveState>;
    /// The wait queue's state, if there is one.
    fn queue(&self) -> Option<QueueState>;
}

/// Decisions by outcome (the `outcome` label of
/// [`metrics`](crate::metrics)).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[allow(missing_docs)] // Each is the metric label of the same name.
#[non_exhaustive]
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
    pub deny_listed: u64,
    pub allow_listed: u64,
}

/// How often one identity was denied.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct Denials {
    /// The identity's hash ([`identity`]).
    pub identity: String,
    /// Denials counted: an estimate, which may be high once more
    /// identities are denied than a table holds, and low under contention
    /// (a denial is skipped rather than waited for).
    pub denials: u64,
}

/// One load-shedding tier.
#[derive(Clone, Debug, Default, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct TierShare {
    /// The tier's name.
    pub tier: String,
    /// Its requests in flight in this process (through every live layer of
    /// the policy, its local fallback's included).
    pub in_flight: u64,
    /// Fleet shedder: how many the whole fleet may have in flight when one
    /// of this tier is admitted (`None`: never shed). Compare it with the
    /// fleet's in flight, about `in_flight` times
    /// [`Snapshot::instances`] when traffic is balanced.
    pub limit: Option<u64>,
    /// How much of the tier is shed now, 0 to 1
    /// ([`TierState::shed_fraction`](crate::shed::TierState::shed_fraction);
    /// the most of the live layers').
    pub shed_fraction: f64,
}

/// The Redis store's round trips.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct StoreSnapshot {
    /// Round trips so far (a batch of decisions is one).
    pub calls: u64,
    /// Decisions the store failed so far (timeouts included; each waiting
    /// decision of a failed batch counts, so this can exceed `calls`).
    pub errors: u64,
    /// Median latency of the last 10 to 20 s (when snapshots come at least
    /// every 10 s), in microseconds (to within a fifth); `None` without
    /// calls.
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
        instances: crate::share::counted_fleet_size(),
        policies,
        store: STORE.snapshot(),
        throttles: lock(&THROTTLES)
            .iter()
            .map(|stats| stats.throttle_snapshot())
            .collect(),
        retry_budgets: lock(&BUDGETS)
            .iter()
            .map(|stats| stats.budget_snapshot())
            .collect(),
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
/// digits of the SHA-256 of the secret set with [`set_identity_secret`]
/// and the key's text. The same on every instance and across restarts
/// (given the same secret), so that the views of a fleet can be merged,
/// and an operator can find a customer's hash by calling this with its
/// key. Without a secret, a hash of a guessable key (an IP address) can
/// be guessed: deployments that show these views set one.
pub fn identity(key: &Key) -> String {
    let mut digest = Sha256::new();
    let secret = SECRET.get().map_or(&[][..], Vec::as_slice);
    digest.update(
        u64::try_from(secret.len())
            .unwrap_or(u64::MAX)
            .to_be_bytes(),
    );
    digest.update(secret);
    digest.update(key.text().as_bytes());
    let digest = digest.finalize();
    let mut text = String::with_capacity(16);
    crate::key::push_hex(&mut text, &digest[..8]);
    text
}

/// Keys [`identity`] with `secret` for the life of the process: set it,
/// the same on every instance, before the first snapshot. Returns `false`
/// (and changes nothing) once a secret is set.
pub fn set_identity_secret(secret: impl Into<Vec<u8>>) -> bool {
    SECRET.set(secret.into()).is_ok()
}

static SECRET: OnceLock<Vec<u8>> = OnceLock::new();

/// The hash a denial table matches identities by: cheap, and private to
/// the process (the stable one, [`identity`], is taken at snapshot time).
fn hash(key: &Key) -> u64 {
    static STATE: OnceLock<RandomState> = OnceLock::new();
    STATE
        .get_or_init(RandomState::new)
        .hash_one(key.hash_bytes())
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

/// Where a policy's shedder state is read from, at snapshot time: the
/// settings of a live layer, registered weakly so that a layer dropped
/// (a router rebuilt) stops being read and keeps nothing alive.
pub(crate) trait ShedSource: Send + Sync {
    /// The shedder's tiers now.
    fn state(&self) -> ShedState;
    /// What tells shedders apart: clones of one shedder share their
    /// counters, and are read once.
    fn id(&self) -> usize;
    /// The fleet's capacity, for a fleet shedder's own settings (not its
    /// local fallback's).
    fn capacity(&self) -> Option<u64>;
}

/// The counters of one layer kind and policy name, registered when a
/// layer is built.
pub(crate) struct PolicyStats {
    layer: &'static str,
    policy: Arc<str>,
    outcomes: [AtomicU64; Outcome::ALL.len()],
    near_limit: AtomicU64,
    denied: Mutex<DeniedTable>,
    leases_in_use: AtomicU64,
    /// Per identity, of the concurrency layer built last; 0 until one is
    /// (a concurrency policy admits at least 1).
    capacity: AtomicU64,
    shed: Mutex<Vec<Weak<dyn ShedSource>>>,
    /// The concurrency layer built last, read at snapshot time.
    limit: Mutex<Option<Weak<dyn LimitSource>>>,
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
            capacity: AtomicU64::new(0),
            shed: Mutex::new(Vec::new()),
            limit: Mutex::new(None),
        });
        registry.push(stats.clone());
        stats
    }

    #[inline]
    pub(crate) fn decided(&self, outcome: Outcome, near_limit: bool) {
        // Built with `--cfg fleetgate_observe_off` (by scripts/bench.sh
        // only), the decision path does none of this: what it costs is the
        // difference.
        if cfg!(fleetgate_observe_off) {
            return;
        }
        self.outcomes[outcome.index()].fetch_add(1, Ordering::Relaxed);
        if near_limit && outcome == Outcome::Allowed {
            self.near_limit.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Counts a denial of `key` in the table, unless another thread is
    /// counting one: a flood of denials never waits on this lock.
    pub(crate) fn denied(&self, key: &Key) {
        if cfg!(fleetgate_observe_off) {
            return;
        }
        if let Ok(mut table) = self.denied.try_lock() {
            table.record(hash(key), key);
        }
    }

    /// A concurrency policy whose identities may each hold `capacity`.
    pub(crate) fn leases(&self, capacity: u64) {
        self.capacity.store(capacity, Ordering::Relaxed);
    }

    /// A concurrency layer's limit, read while it lives (the last built).
    pub(crate) fn limit_source(&self, source: Weak<dyn LimitSource>) {
        *lock(&self.limit) = Some(source);
    }

    /// A shedder layer's settings, read while they live (forgotten once
    /// dropped).
    pub(crate) fn shedder(&self, source: Weak<dyn ShedSource>) {
        let mut sources = lock(&self.shed);
        sources.retain(|s| s.strong_count() > 0);
        sources.push(source);
    }

    /// The tiers of every live shedder of the policy, each read once:
    /// requests in flight summed by tier, the fleet's limit and capacity
    /// of the layer built last, the most shed.
    fn shed_state(&self) -> Option<(Vec<TierShare>, Option<u64>)> {
        let live: Vec<_> = {
            let mut sources = lock(&self.shed);
            sources.retain(|s| s.strong_count() > 0);
            if sources.is_empty() {
                return None;
            }
            sources.iter().filter_map(Weak::upgrade).collect()
        };
        let mut seen = Vec::with_capacity(live.len());
        let mut tiers: Vec<TierShare> = Vec::new();
        let mut capacity = None;
        for source in &live {
            if seen.contains(&source.id()) {
                continue;
            }
            seen.push(source.id());
            let fleet = source.capacity();
            capacity = fleet.or(capacity);
            for t in source.state().tiers() {
                let at = match tiers.iter().position(|s| s.tier == t.name()) {
                    Some(at) => at,
                    None => {
                        tiers.push(TierShare {
                            tier: t.name().to_owned(),
                            ..TierShare::default()
                        });
                        tiers.len() - 1
                    }
                };
                let share = &mut tiers[at];
                share.in_flight += t.in_flight();
                // A local fallback's limits are its share, not the fleet's.
                if fleet.is_some() || share.limit.is_none() {
                    share.limit = t.limit().or(share.limit);
                }
                share.shed_fraction = share.shed_fraction.max(t.shed_fraction());
            }
        }
        Some((tiers, capacity))
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
            deny_listed: n(Outcome::DenyListed),
            allow_listed: n(Outcome::AllowListed),
        };
        to.near_limit = self.near_limit.load(Ordering::Relaxed);
        let capacity = self.capacity.load(Ordering::Relaxed);
        if capacity > 0 {
            to.leases_in_use = Some(self.leases_in_use.load(Ordering::Relaxed));
            to.capacity = Some(capacity);
        }
        let mut denied = HashMap::new();
        lock(&self.denied).add_to(&mut denied, Instant::now());
        // Hashed outside the lock: denials meanwhile are not skipped.
        let mut top: Vec<Denials> = denied
            .into_values()
            .map(|(key, denials)| Denials {
                identity: identity(&key),
                denials,
            })
            .collect();
        top.sort_unstable_by(|a, b| b.denials.cmp(&a.denials).then(a.identity.cmp(&b.identity)));
        top.truncate(TOP);
        to.top_denied = top;
        let source = lock(&self.limit).as_ref().and_then(Weak::upgrade);
        if let Some(source) = source {
            to.capacity = Some(source.limit());
            to.adaptive = source.adaptive();
            to.queue = source.queue();
        }
        if let Some((tiers, capacity)) = self.shed_state() {
            to.tiers = tiers;
            to.capacity = capacity;
        }
    }
}

/// Where a throttle's state now is read from, at snapshot time
/// (registered weakly, as a [`LimitSource`] is).
pub(crate) trait ThrottleSource: Send + Sync {
    /// The rejection probability and the accept ratio of the window.
    fn now(&self) -> (f64, Option<f64>);
}

/// The throttles and retry budgets ever built, by name, sorted by it
/// (bounded by the configuration, as [`REGISTRY`] is).
static THROTTLES: Mutex<Vec<Arc<OutboundStats>>> = Mutex::new(Vec::new());
static BUDGETS: Mutex<Vec<Arc<OutboundStats>>> = Mutex::new(Vec::new());

/// The counters of one throttle or retry budget name: a throttle's sent,
/// accepted and refused calls; a budget's first attempts, retries,
/// refusals and store errors.
pub(crate) struct OutboundStats {
    name: Arc<str>,
    counts: [AtomicU64; 4],
    live: Mutex<Option<Weak<dyn ThrottleSource>>>,
}

impl OutboundStats {
    pub(crate) const SENT: usize = 0;
    pub(crate) const ACCEPTED: usize = 1;
    pub(crate) const REFUSED: usize = 2;
    pub(crate) const FIRST: usize = 0;
    pub(crate) const RETRIES: usize = 1;
    pub(crate) const STORE_ERRORS: usize = 3;

    /// The counters of the throttles named `name`.
    pub(crate) fn throttle(name: &str) -> Arc<Self> {
        Self::register(&THROTTLES, name)
    }

    /// The counters of the retry budgets named `name`.
    pub(crate) fn budget(name: &str) -> Arc<Self> {
        Self::register(&BUDGETS, name)
    }

    fn register(registry: &Mutex<Vec<Arc<Self>>>, name: &str) -> Arc<Self> {
        let mut registry = lock(registry);
        match registry.binary_search_by(|s| (*s.name).cmp(name)) {
            Ok(at) => registry[at].clone(),
            Err(at) => {
                let stats = Arc::new(OutboundStats {
                    name: name.into(),
                    counts: Default::default(),
                    live: Mutex::new(None),
                });
                registry.insert(at, stats.clone());
                stats
            }
        }
    }

    #[inline]
    pub(crate) fn add(&self, counter: usize) {
        self.counts[counter].fetch_add(1, Ordering::Relaxed);
    }

    /// The throttle built last, read while it lives.
    pub(crate) fn live(&self, source: Weak<dyn ThrottleSource>) {
        *lock(&self.live) = Some(source);
    }

    fn count(&self, counter: usize) -> u64 {
        self.counts[counter].load(Ordering::Relaxed)
    }

    fn throttle_snapshot(&self) -> ThrottleSnapshot {
        let live = lock(&self.live).as_ref().and_then(Weak::upgrade);
        let (rejection_probability, accept_ratio) = live.map_or((0.0, None), |t| t.now());
        ThrottleSnapshot {
            name: self.name.to_string(),
            sent: self.count(Self::SENT),
            accepted: self.count(Self::ACCEPTED),
            refused: self.count(Self::REFUSED),
            rejection_probability,
            accept_ratio,
        }
    }

    fn budget_snapshot(&self) -> RetryBudgetSnapshot {
        RetryBudgetSnapshot {
            name: self.name.to_string(),
            first_attempts: self.count(Self::FIRST),
            retries: self.count(Self::RETRIES),
            refused: self.count(Self::REFUSED),
            store_errors: self.count(Self::STORE_ERRORS),
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

/// The identities denied most, per period of 10 s: space-saving tables,
/// the one being filled and those before it. They turn over when read, so
/// that a denial reads no clock: read at least every 10 s (as [`watch`]
/// every second does), they hold the last 60 to 70 s; read rarely, the
/// current table holds everything since the read before.
struct DeniedTable {
    /// When the current table began.
    since: Instant,
    /// The tables before, oldest first, each with the instant it ended.
    done: VecDeque<(Instant, Vec<Slot>)>,
    current: Vec<Slot>,
}

/// One identity in a table: its process-private hash (to match it by), the
/// key (to take its stable hash from when read), its count.
type Slot = (u64, Key, u64);

impl DeniedTable {
    fn new(now: Instant) -> Self {
        DeniedTable {
            since: now,
            done: VecDeque::with_capacity(DENIAL_TABLES),
            current: Vec::with_capacity(SLOTS),
        }
    }

    fn rotate(&mut self, now: Instant) {
        if now.saturating_duration_since(self.since) >= DENIAL_PERIOD {
            let full = std::mem::replace(&mut self.current, Vec::with_capacity(SLOTS));
            self.done.push_back((now, full));
            self.since = now;
        }
        // Tables that ended before the window began hold none of it.
        while let Some((ended, _)) = self.done.front() {
            if now.saturating_duration_since(*ended) > DENIAL_WINDOW
                || self.done.len() >= DENIAL_TABLES
            {
                self.done.pop_front();
            } else {
                break;
            }
        }
    }

    /// Counts one denial in the current table.
    fn record(&mut self, hash: u64, key: &Key) {
        if let Some(slot) = self.current.iter_mut().find(|(h, _, _)| *h == hash) {
            slot.2 += 1;
        } else if self.current.len() < SLOTS {
            self.current.push((hash, key.clone(), 1));
        } else if let Some(least) = self.current.iter_mut().min_by_key(|(_, _, n)| *n) {
            // Space-saving: the newcomer inherits the least count, so an
            // identity denied often climbs back whatever came between.
            *least = (hash, key.clone(), least.2 + 1);
        }
    }

    fn add_to(&mut self, to: &mut HashMap<u64, (Key, u64)>, now: Instant) {
        self.rotate(now);
        let tables = self.done.iter().map(|(_, t)| t).chain([&self.current]);
        for (hash, key, n) in tables.flatten() {
            to.entry(*hash).or_insert_with(|| (key.clone(), 0)).1 += n;
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
    if cfg!(fleetgate_observe_off) {
        return;
    }
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
        let key = Key::new("k");
        for round in 0..100u64 {
            for _ in 0..5 {
                table.record(7, &key);
            }
            for other in 0..50 {
                table.record(1000 + round * 100 + other, &key);
            }
        }
        assert!(table.current.len() <= SLOTS);
        let mut counts = HashMap::new();
        table.add_to(&mut counts, t0);
        let top = counts.iter().max_by_key(|(_, (_, n))| *n).map(|(h, _)| *h);
        assert_eq!(top, Some(7));
        assert!(counts[&7].1 >= 500);
    }

    #[test]
    fn denials_stay_for_a_minute_read_every_second() {
        let t0 = Instant::now();
        let mut table = DeniedTable::new(t0);
        table.record(1, &Key::new("k"));
        let second = Duration::from_secs(1);
        let mut last_seen = None;
        for s in 1..=80u32 {
            let mut counts = HashMap::new();
            table.add_to(&mut counts, t0 + second * s);
            if counts.get(&1).map(|(_, n)| *n) == Some(1) {
                last_seen = Some(s);
            }
            assert!(table.done.len() < DENIAL_TABLES);
        }
        assert!(
            last_seen.is_some_and(|s| (60..70).contains(&s)),
            "a denial at 0 s listed until {last_seen:?} s"
        );
    }

    #[test]
    fn identities_are_the_same_from_one_process_to_the_next() {
        // No secret is set in unit tests: SHA-256 of the secret's length
        // (0, as 8 bytes) and the key's text.
        let key = Key::new("tenant:42");
        let mut digest = Sha256::new();
        digest.update(0u64.to_be_bytes());
        digest.update(b"tenant:42");
        let expected: String = digest.finalize()[..8]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(identity(&key), expected);
        let ip = Key::from_ip([203, 0, 113, 7].into());
        assert_eq!(identity(&ip), identity(&Key::new("ip:203.0.113.7")));
        assert_ne!(identity(&key), identity(&Key::new("tenant:43")));
    }
}
