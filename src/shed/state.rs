//! What the shedders know about each tier, kept in this process: requests
//! in flight, admitted and shed so far, and how much of the tier is being
//! shed now. Read with `state()` on either shedder, and (feature `metrics`)
//! published as gauges and counters.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use super::tier::{Tier, Tiers};
use crate::clock::Clock;
use crate::lease::{Lease, LeaseGuard};
use crate::store::StoreFuture;

/// The fleet shedder's shed fraction weighs each decision by
/// `e^(−age/RECENT)`: about the last ten seconds count.
const RECENT: Duration = Duration::from_secs(10);

/// One tier as a shedder sees it; see
/// [`FleetShedder::state`](super::FleetShedder::state) and
/// [`UtilizationShedder::state`](super::UtilizationShedder::state).
#[derive(Clone, Debug, PartialEq)]
pub struct TierState {
    tier: Tier,
    name: Arc<str>,
    in_flight: u64,
    admitted: u64,
    shed: u64,
    shed_fraction: f64,
    limit: Option<u64>,
}

impl TierState {
    /// The tier.
    pub fn tier(&self) -> Tier {
        self.tier
    }

    /// The tier's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Requests of the tier in flight through this layer in this process:
    /// from the moment the layer sees them until their response body ends
    /// (for the fleet shedder, the wait for the store's answer included).
    pub fn in_flight(&self) -> u64 {
        self.in_flight
    }

    /// Requests of the tier admitted so far by this process.
    pub fn admitted(&self) -> u64 {
        self.admitted
    }

    /// Requests of the tier shed so far by this process.
    pub fn shed(&self) -> u64 {
        self.shed
    }

    /// How much of the tier is being shed now, from 0 to 1.
    ///
    /// - Worker-utilization shedder: the probability its requests are
    ///   dropped with, as of the last sample.
    /// - Fleet shedder: the share of the tier's requests that this process
    ///   shed recently: shed ÷ decided, each decision weighing
    ///   `e^(−age / 10 s)`, so that the last ten seconds or so count. It
    ///   moves only when requests of the tier are decided, and holds its
    ///   value while none come. 0 before the first.
    pub fn shed_fraction(&self) -> f64 {
        self.shed_fraction
    }

    /// The fleet shedder's limit for the tier (how many requests the whole
    /// fleet may have in flight when one of this tier is admitted); `None`
    /// for the most important tier, which it never sheds, and for the
    /// worker-utilization shedder.
    pub fn limit(&self) -> Option<u64> {
        self.limit
    }
}

/// The per-tier counters of one shedder, shared by its clones.
pub(crate) struct TierCounters {
    tiers: Tiers,
    per_tier: Box<[Counters]>,
    in_flight: AtomicU64,
    clock: Arc<dyn Clock>,
    busy: Option<Mutex<Busy>>,
    metrics: TierMetrics,
}

#[derive(Default)]
struct Counters {
    in_flight: AtomicU64,
    admitted: AtomicU64,
    shed: AtomicU64,
    /// Set, and published, under its lock: the gauge ends at the value
    /// computed last.
    fraction: Mutex<Fraction>,
}

/// A tier's shed fraction, and for the fleet shedder what it comes from.
#[derive(Default)]
struct Fraction {
    value: f64,
    /// Decisions, and those that shed, each weighing `e^(−age/RECENT)` as
    /// of `at_us`.
    decided: f64,
    shed: f64,
    at_us: u64,
}

impl Fraction {
    /// Ages the weights to `now_us` (never backwards), then counts one
    /// decision.
    fn decide(&mut self, now_us: u64, shed: bool) {
        let age = now_us.saturating_sub(self.at_us) as f64;
        let keep = (-age / RECENT.as_micros() as f64).exp();
        self.at_us = self.at_us.max(now_us);
        self.decided = self.decided * keep + 1.0;
        self.shed = self.shed * keep + if shed { 1.0 } else { 0.0 };
        self.value = self.shed / self.decided;
    }
}

impl TierCounters {
    /// Counters for every tier of `tiers`, labelled `layer` and `policy` in
    /// metrics, timed by `clock`.
    pub(crate) fn new(
        tiers: &Tiers,
        layer: &'static str,
        policy: Arc<str>,
        clock: Arc<dyn Clock>,
    ) -> Self {
        TierCounters {
            per_tier: tiers.iter().map(|_| Counters::default()).collect(),
            metrics: TierMetrics::new(layer, policy, tiers),
            tiers: tiers.clone(),
            in_flight: AtomicU64::new(0),
            clock,
            busy: None,
        }
    }

    /// Also integrates the requests in flight over time, for
    /// [`average_in_flight`](Self::average_in_flight).
    pub(crate) fn with_busy_time(mut self) -> Self {
        let since = self.clock.now_micros();
        self.busy = Some(Mutex::new(Busy {
            in_flight: 0,
            since,
            window_start: since,
            area: 0.0,
        }));
        self
    }

    /// The average number of requests in flight from the last call to
    /// `now_us`: the count now if no time has passed, or without busy time.
    pub(crate) fn average_in_flight(&self, now_us: u64) -> f64 {
        let Some(busy) = &self.busy else {
            return self.in_flight() as f64;
        };
        let mut b = lock(busy);
        b.advance(now_us);
        let window = b.since.saturating_sub(b.window_start);
        let average = if window == 0 {
            b.in_flight as f64
        } else {
            b.area / window as f64
        };
        b.window_start = b.since;
        b.area = 0.0;
        average
    }

    fn busy_change(&self, delta: i8) {
        if let Some(busy) = &self.busy {
            let now = self.clock.now_micros();
            let mut b = lock(busy);
            b.advance(now);
            b.in_flight = match delta {
                1 => b.in_flight.saturating_add(1),
                _ => b.in_flight.saturating_sub(1),
            };
        }
    }

    pub(crate) fn tiers(&self) -> &Tiers {
        &self.tiers
    }

    fn get(&self, tier: Tier) -> Option<&Counters> {
        self.per_tier.get(tier.rank())
    }

    /// Counts a request of `tier` in flight until the returned guard drops.
    pub(crate) fn enter(self: &Arc<Self>, tier: Tier) -> LeaseGuard<TierSlot> {
        let tier = self.tiers.clamp(tier);
        if let Some(c) = self.get(tier) {
            c.in_flight.fetch_add(1, Ordering::Relaxed);
        }
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        self.busy_change(1);
        self.metrics.in_flight(tier, 1.0);
        LeaseGuard::new(TierSlot {
            counters: self.clone(),
            tier,
        })
    }

    fn leave(&self, tier: Tier) {
        if let Some(c) = self.get(tier) {
            c.in_flight.fetch_sub(1, Ordering::Relaxed);
        }
        self.in_flight.fetch_sub(1, Ordering::Relaxed);
        self.busy_change(-1);
        self.metrics.in_flight(tier, -1.0);
    }

    /// Every request in flight, all tiers together.
    pub(crate) fn in_flight(&self) -> u64 {
        self.in_flight.load(Ordering::Relaxed)
    }

    pub(crate) fn admitted(&self, tier: Tier) {
        if let Some(c) = self.get(tier) {
            c.admitted.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub(crate) fn shed(&self, tier: Tier) {
        if let Some(c) = self.get(tier) {
            c.shed.fetch_add(1, Ordering::Relaxed);
        }
        self.metrics.shed(tier);
    }

    /// Worker-utilization shedder: the tier's drop probability.
    pub(crate) fn set_fraction(&self, tier: Tier, fraction: f64) {
        if let Some(c) = self.get(tier) {
            let mut f = lock(&c.fraction);
            if f.value != fraction {
                f.value = fraction;
                self.metrics.fraction(tier, fraction);
            }
        }
    }

    /// Fleet shedder: counts a request of `tier` admitted or shed, and
    /// moves the tier's shed fraction (see [`TierState::shed_fraction`]).
    pub(crate) fn decided(&self, tier: Tier, shed: bool) {
        if shed {
            self.shed(tier);
        } else {
            self.admitted(tier);
        }
        if let Some(c) = self.get(tier) {
            let mut f = lock(&c.fraction);
            f.decide(self.clock.now_micros(), shed);
            self.metrics.fraction(tier, f.value);
        }
    }

    /// Every tier's state; `limit` gives the fleet shedder's limits.
    pub(crate) fn snapshot(&self, limit: impl Fn(Tier) -> Option<u64>) -> Vec<TierState> {
        self.tiers
            .iter()
            .zip(self.per_tier.iter())
            .map(|(tier, c)| TierState {
                tier,
                name: Arc::from(self.tiers.name(tier)),
                in_flight: c.in_flight.load(Ordering::Relaxed),
                admitted: c.admitted.load(Ordering::Relaxed),
                shed: c.shed.load(Ordering::Relaxed),
                shed_fraction: lock(&c.fraction).value,
                limit: limit(tier),
            })
            .collect()
    }
}

impl fmt::Debug for TierCounters {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TierCounters")
            .field("in_flight", &self.in_flight())
            .finish_non_exhaustive()
    }
}

/// The shedders' state is numbers consistent after every step: a panic
/// elsewhere while a lock was held changes nothing.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Requests in flight integrated over time: utilization is the busy share
/// of the time between samples, not the count at the instants requests
/// happen to arrive (which waves of requests arriving together would bias).
struct Busy {
    in_flight: u64,
    /// When `area` was last brought up to date.
    since: u64,
    /// When the current averaging window started.
    window_start: u64,
    /// Request-microseconds in flight since `window_start`.
    area: f64,
}

impl Busy {
    fn advance(&mut self, now: u64) {
        self.area += self.in_flight as f64 * now.saturating_sub(self.since) as f64;
        self.since = self.since.max(now);
    }
}

/// A request's place in its tier's in-flight count, given back when the
/// request ends: held by the response body, like a concurrency lease, so
/// that a streaming response counts until its last byte.
pub struct TierSlot {
    counters: Arc<TierCounters>,
    tier: Tier,
}

impl TierSlot {
    /// The tier counted.
    pub fn tier(&self) -> Tier {
        self.tier
    }
}

impl Lease for TierSlot {
    fn release(&self) -> StoreFuture<bool> {
        self.counters.leave(self.tier);
        StoreFuture::ready(Ok(true))
    }

    /// Nothing expires in this process.
    fn renew(&self) -> StoreFuture<bool> {
        StoreFuture::ready(Ok(true))
    }
}

impl fmt::Debug for TierSlot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TierSlot")
            .field("tier", &self.tier)
            .finish()
    }
}

/// The per-tier metrics: `fleetgate_shed_in_flight` and
/// `fleetgate_shed_fraction` (gauges), `fleetgate_shed_total` (counter),
/// labelled `layer`, `policy`, `tier`.
#[cfg(feature = "metrics")]
struct TierMetrics {
    layer: &'static str,
    policy: Arc<str>,
    names: Vec<Arc<str>>,
    handles: std::sync::OnceLock<Vec<TierHandles>>,
}

#[cfg(feature = "metrics")]
struct TierHandles {
    in_flight: ::metrics::Gauge,
    fraction: ::metrics::Gauge,
    shed: ::metrics::Counter,
}

#[cfg(feature = "metrics")]
impl TierMetrics {
    fn new(layer: &'static str, policy: Arc<str>, tiers: &Tiers) -> Self {
        TierMetrics {
            layer,
            policy,
            names: tiers.iter().map(|t| Arc::from(tiers.name(t))).collect(),
            handles: std::sync::OnceLock::new(),
        }
    }

    /// Resolved on first use, like the decision counters.
    fn handle(&self, tier: Tier) -> Option<&TierHandles> {
        self.handles
            .get_or_init(|| {
                self.names
                    .iter()
                    .map(|name| {
                        let (layer, policy) = (self.layer, &self.policy);
                        TierHandles {
                            in_flight: ::metrics::gauge!(
                                "fleetgate_shed_in_flight",
                                "layer" => layer, "policy" => policy.clone(), "tier" => name.clone(),
                            ),
                            fraction: ::metrics::gauge!(
                                "fleetgate_shed_fraction",
                                "layer" => layer, "policy" => policy.clone(), "tier" => name.clone(),
                            ),
                            shed: ::metrics::counter!(
                                "fleetgate_shed_total",
                                "layer" => layer, "policy" => policy.clone(), "tier" => name.clone(),
                            ),
                        }
                    })
                    .collect()
            })
            .get(tier.rank())
    }

    fn in_flight(&self, tier: Tier, delta: f64) {
        if let Some(h) = self.handle(tier) {
            h.in_flight.increment(delta);
        }
    }

    fn shed(&self, tier: Tier) {
        if let Some(h) = self.handle(tier) {
            h.shed.increment(1);
        }
    }

    fn fraction(&self, tier: Tier, fraction: f64) {
        if let Some(h) = self.handle(tier) {
            h.fraction.set(fraction);
        }
    }
}

/// Without the `metrics` feature, nothing is recorded.
#[cfg(not(feature = "metrics"))]
struct TierMetrics;

#[cfg(not(feature = "metrics"))]
impl TierMetrics {
    fn new(_layer: &'static str, _policy: Arc<str>, _tiers: &Tiers) -> Self {
        TierMetrics
    }

    fn in_flight(&self, _tier: Tier, _delta: f64) {}

    fn shed(&self, _tier: Tier) {}

    fn fraction(&self, _tier: Tier, _fraction: f64) {}
}

/// A shedder's state: every tier, most important first, and what the
/// shedder measures.
#[derive(Clone, Debug, PartialEq)]
pub struct ShedState {
    pub(crate) tiers: Vec<TierState>,
    pub(crate) in_flight: u64,
    pub(crate) utilization: Option<f64>,
    pub(crate) amount: Option<f64>,
}

impl ShedState {
    /// Every tier, most important first.
    pub fn tiers(&self) -> &[TierState] {
        &self.tiers
    }

    /// The tier called `name`.
    pub fn tier(&self, name: &str) -> Option<&TierState> {
        self.tiers.iter().find(|t| t.name() == name)
    }

    /// Requests in flight through the layer in this process, all tiers.
    pub fn in_flight(&self) -> u64 {
        self.in_flight
    }

    /// Worker-utilization shedder: the utilization last sampled (0 = idle,
    /// 1 = every worker busy).
    pub fn utilization(&self) -> Option<f64> {
        self.utilization
    }

    /// Worker-utilization shedder: the shed amount, from its resting value
    /// (below 0: nothing shed, and that long to go before anything is) to
    /// 1 (every tier but the most important shed).
    pub fn amount(&self) -> Option<f64> {
        self.amount
    }
}
