use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::controller::{Controller, UtilizationConfig, drop_probability};
use crate::clock::{Clock, MonotonicClock};
use crate::concurrency::ConcurrencyLimiter;
use crate::error::ConfigError;
use crate::lease::LeaseGuard;
use crate::policy::check_name;
use crate::shed::random::{Random, SharedRandom, ThreadRandom};
use crate::shed::state::{ShedState, TierCounters, TierSlot, lock};
use crate::shed::tier::{Tier, Tiers};

/// Where utilization comes from.
#[derive(Clone)]
enum Source {
    /// This shedder's own in-flight requests over this many workers.
    Workers(u64),
    /// A gauge the user reads.
    Gauge(Arc<dyn Fn() -> f64 + Send + Sync>),
    /// This shedder's own in-flight requests over a concurrency limiter's
    /// current limit.
    Limit(ConcurrencyLimiter),
}

/// Sheds requests when this process has been too busy for too long: the
/// worker-utilization load shedder, local to one process.
///
/// It samples utilization (its own requests in flight, averaged over the
/// time since the last sample, over a worker capacity; or a gauge you
/// supply) at most every `sample_every` (default 1 s), on the requests that
/// come through, and moves a shed amount by the numbers set on its builder
/// ([`thresholds`](UtilizationShedderBuilder::thresholds),
/// [`delay`](UtilizationShedderBuilder::delay),
/// [`ramp`](UtilizationShedderBuilder::ramp)); with the defaults: past
/// 0.8 the amount rises at a speed proportional to how far
/// past: fully saturated, nothing is shed for 28 s, then the least
/// important tier is dropped with rising probability, then the next, 120 s
/// from shedding nothing to shedding everything but the most important
/// tier; at 0.9 each takes twice as long (56 s, 240 s), at 0.85 four times
/// (112 s, 480 s). Below 0.7 it recovers at a speed proportional to how far
/// below: idle, 120 s from everything shed to nothing. Clones share
/// everything.
///
/// ```
/// use std::time::Duration;
/// use fleetgate::shed::{Tiers, UtilizationShedder};
///
/// # fn main() -> Result<(), fleetgate::ConfigError> {
/// // 64 workers; shed sooner than the defaults.
/// let shedder = UtilizationShedder::workers(64)
///     .delay(Duration::from_secs(10))
///     .build()?;
/// let low = Tiers::default().get("low").unwrap();
/// // Idle: nothing is shed, and the guard counts the request in flight.
/// let guard = shedder.admit(low).expect("not shed while idle");
/// assert_eq!(shedder.state().in_flight(), 1);
/// drop(guard);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct UtilizationShedder {
    inner: Arc<Inner>,
}

struct Inner {
    name: Arc<str>,
    source: Source,
    clock: Arc<dyn Clock>,
    random: SharedRandom,
    sample_every_us: u64,
    /// When the next sample is due; claimed by one request at a time.
    next_sample_us: AtomicU64,
    controller: Mutex<Controller>,
    /// The shed amount and the utilization last sampled, as `f64` bits.
    amount: AtomicU64,
    utilization: AtomicU64,
    counters: Arc<TierCounters>,
}

impl UtilizationShedder {
    /// Utilization = this shedder's requests in flight (from admission to
    /// the end of the response body, every tier), averaged over the time
    /// since the last sample, over `workers`.
    pub fn workers(workers: u64) -> UtilizationShedderBuilder {
        UtilizationShedderBuilder::new(Source::Workers(workers))
    }

    /// Utilization = this shedder's requests in flight (averaged as
    /// [`workers`](Self::workers) does) over `limiter`'s current limit
    /// ([`ConcurrencyLimiter::limit`]): with an
    /// [adaptive](ConcurrencyLimiter::adaptive) limiter, the capacity the
    /// service was measured to have, so that as it falls the least
    /// important tier is shed first (the most important never is). Put
    /// the shedder in front of the limit's layer, over the same requests.
    ///
    /// ```
    /// use fleetgate::concurrency::{AdaptiveLimit, ConcurrencyLimiter};
    /// use fleetgate::shed::UtilizationShedder;
    ///
    /// # fn main() -> Result<(), fleetgate::ConfigError> {
    /// let limit = AdaptiveLimit::gradient2().max(64).build()?;
    /// let backend = ConcurrencyLimiter::adaptive("backend", limit)?;
    /// let shedder = UtilizationShedder::limit(&backend).build()?;
    /// # let _ = shedder;
    /// # Ok(()) }
    /// ```
    pub fn limit(limiter: &ConcurrencyLimiter) -> UtilizationShedderBuilder {
        UtilizationShedderBuilder::new(Source::Limit(limiter.clone()))
    }

    /// Utilization read from `gauge` (0 = idle, 1 = saturated; clamped,
    /// NaN counts as idle): CPU load, busy worker threads, a queue's
    /// fill, whatever measures this process's distress. It is read once a
    /// sample, by the request that takes it, under the shedder's lock: keep
    /// it quick. A reading is taken for an instant, so after a silence it
    /// moves the amount up by at most `max(delay, sample_every, 1 s)` worth
    /// (see [`delay`](UtilizationShedderBuilder::delay)).
    pub fn gauge<F>(gauge: F) -> UtilizationShedderBuilder
    where
        F: Fn() -> f64 + Send + Sync + 'static,
    {
        UtilizationShedderBuilder::new(Source::Gauge(Arc::new(gauge)))
    }

    /// The name the shedder's metrics carry.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The tiers.
    pub fn tiers(&self) -> &Tiers {
        self.inner.counters.tiers()
    }

    /// Decides a request of `tier` (a tier of another set counts as the
    /// default tier): samples utilization if a sample is due, then drops
    /// the request with its tier's current probability (always at 1, never
    /// at 0, whatever the coin says). Admitted, it returns a guard that
    /// counts the request in flight until dropped; shed, the probability
    /// its tier is dropped with.
    pub fn admit(&self, tier: Tier) -> Result<LeaseGuard<TierSlot>, f64> {
        let tier = self.tiers().clamp(tier);
        match self.would_drop(tier) {
            Some(p) => {
                self.shed(tier);
                Err(p)
            }
            None => Ok(self.enter(tier)),
        }
    }

    /// Samples utilization if a sample is due, then flips the coin for a
    /// request of `tier` (of this shedder's set): the probability its tier
    /// is dropped with if the request is to be dropped, `None` if not.
    /// Counts nothing: [`admit`](Self::admit) does.
    pub(crate) fn would_drop(&self, tier: Tier) -> Option<f64> {
        let inner = &self.inner;
        self.sample(inner.clock.now_micros());
        let amount = f64::from_bits(inner.amount.load(Ordering::Relaxed));
        let p = drop_probability(amount, tier, self.tiers());
        // A coin outside [0, 1), or NaN, cannot admit at full shedding.
        if p >= 1.0 || (p > 0.0 && inner.random.next_f64() < p) {
            return Some(p);
        }
        None
    }

    /// Counts a request of `tier` (of this shedder's set) admitted, and in
    /// flight until the returned guard drops.
    pub(crate) fn enter(&self, tier: Tier) -> LeaseGuard<TierSlot> {
        self.inner.counters.admitted(tier);
        self.inner.counters.enter(tier)
    }

    /// Counts a request of `tier` shed.
    pub(crate) fn shed(&self, tier: Tier) {
        self.inner.counters.shed(tier);
    }

    /// Samples utilization and moves the amount, if a sample is due at
    /// `now`: one request per interval claims it.
    fn sample(&self, now: u64) {
        let inner = &self.inner;
        let due = inner.next_sample_us.load(Ordering::Relaxed);
        let next = now.saturating_add(inner.sample_every_us);
        if now < due
            || inner
                .next_sample_us
                .compare_exchange(due, next, Ordering::AcqRel, Ordering::Relaxed)
                .is_err()
        {
            return;
        }
        // Everything under the lock, the clock read included: samples reach
        // the controller in the order of their times, and what is
        // published is the latest sample's.
        let mut controller = lock(&inner.controller);
        let now = inner.clock.now_micros();
        let utilization = match &inner.source {
            Source::Workers(workers) => inner.counters.average_in_flight(now) / *workers as f64,
            Source::Gauge(gauge) => gauge(),
            Source::Limit(limiter) => {
                inner.counters.average_in_flight(now) / limiter.limit().max(1) as f64
            }
        };
        controller.observe(now, utilization);
        let amount = controller.amount();
        inner.amount.store(amount.to_bits(), Ordering::Relaxed);
        inner
            .utilization
            .store(utilization.to_bits(), Ordering::Relaxed);
        let tiers = self.tiers();
        for tier in tiers.iter() {
            inner
                .counters
                .set_fraction(tier, drop_probability(amount, tier, tiers));
        }
    }

    /// What tells shedders apart: its clones share it.
    pub(crate) fn id(&self) -> usize {
        Arc::as_ptr(&self.inner) as usize
    }

    /// Per tier: in flight, admitted, shed, and the current drop
    /// probability; with the utilization last sampled and the shed amount.
    pub fn state(&self) -> ShedState {
        let inner = &self.inner;
        ShedState {
            tiers: inner.counters.snapshot(|_| None),
            in_flight: inner.counters.in_flight(),
            utilization: Some(f64::from_bits(inner.utilization.load(Ordering::Relaxed))),
            amount: Some(f64::from_bits(inner.amount.load(Ordering::Relaxed))),
        }
    }
}

impl fmt::Debug for UtilizationShedder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let source = match &self.inner.source {
            Source::Workers(n) => format!("{n} workers"),
            Source::Gauge(_) => "gauge".to_owned(),
            Source::Limit(limiter) => format!("the limit of {}", limiter.policy().name()),
        };
        f.debug_struct("UtilizationShedder")
            .field("name", &self.inner.name)
            .field("source", &source)
            .field("config", lock(&self.inner.controller).config())
            .finish_non_exhaustive()
    }
}

/// Builds a [`UtilizationShedder`]; see [`UtilizationShedder::workers`]
/// and [`UtilizationShedder::gauge`]. Every setting has a default: the
/// numbers are those of the design (thresholds 0.7 and 0.8, a 28 s delay,
/// a 120 s ramp), checked by [`build`](Self::build).
///
/// ```
/// use std::time::Duration;
/// use fleetgate::shed::UtilizationShedder;
///
/// # fn main() -> Result<(), fleetgate::ConfigError> {
/// // Relax below 0.6, shed from 0.75 on: after 10 s of saturation, then
/// // everything sheddable within a minute.
/// let shedder = UtilizationShedder::workers(64)
///     .thresholds(0.6, 0.75)
///     .delay(Duration::from_secs(10))
///     .ramp(Duration::from_secs(60))
///     .build()?;
/// # drop(shedder);
/// // Nonsense is refused when built.
/// assert!(UtilizationShedder::workers(64).thresholds(0.8, 0.7).build().is_err());
/// # Ok(()) }
/// ```
#[must_use]
pub struct UtilizationShedderBuilder {
    name: String,
    source: Source,
    config: UtilizationConfig,
    tiers: Tiers,
    clock: Option<Arc<dyn Clock>>,
    random: SharedRandom,
    sample_every: Duration,
}

impl UtilizationShedderBuilder {
    fn new(source: Source) -> Self {
        UtilizationShedderBuilder {
            name: "utilization".to_owned(),
            source,
            config: UtilizationConfig::default(),
            tiers: Tiers::default(),
            clock: None,
            random: Arc::new(ThreadRandom),
            sample_every: Duration::from_secs(1),
        }
    }

    /// The name its metrics carry (default `utilization`).
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// The dead zone (default 0.7 and 0.8): below `good` utilization
    /// shedding relaxes, from `bad` on it rises, in between it holds.
    /// [`build`](Self::build) needs `0 < good ≤ bad < 1`.
    pub fn thresholds(mut self, good: f64, bad: f64) -> Self {
        self.config = self.config.thresholds(good, bad);
        self
    }

    /// How long utilization must be fully bad (1) before anything is shed
    /// (default 28 s); less bad, it takes proportionally longer: at
    /// utilization `u` past `bad`, `delay × (1 − bad)/(u − bad)`.
    pub fn delay(mut self, delay: Duration) -> Self {
        self.config = self.config.delay(delay);
        self
    }

    /// How long, at full speed (utilization 1 rising, 0 falling), from
    /// shedding nothing to shedding everything that may be shed, and back
    /// (default 120 s); proportionally longer at lower speeds, as for
    /// [`delay`](Self::delay). [`build`](Self::build) needs it longer than
    /// zero.
    pub fn ramp(mut self, ramp: Duration) -> Self {
        self.config = self.config.ramp(ramp);
        self
    }

    /// The tiers (default: `critical`, `high`, `normal`, `low`).
    pub fn tiers(mut self, tiers: Tiers) -> Self {
        self.tiers = tiers;
        self
    }

    /// How often utilization is sampled at most (default 1 s; zero samples
    /// on every request). Samples are taken by requests: with none coming,
    /// the next one counts the time since the last sample.
    pub fn sample_every(mut self, every: Duration) -> Self {
        self.sample_every = every;
        self
    }

    /// The clock (default: tokio's monotonic clock, which
    /// `tokio::time::pause` stops and `advance` moves).
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Some(Arc::new(clock));
        self
    }

    /// The coin: a closure `Fn() -> f64` giving uniform numbers in
    /// `[0, 1)` (default: a fast xorshift generator seeded per thread,
    /// fine for coin flips); a fixed sequence makes tests deterministic.
    pub fn random(mut self, random: impl Random) -> Self {
        self.random = Arc::new(random);
        self
    }

    /// Checks the settings and builds the shedder: the thresholds
    /// ([`ConfigError::InvalidThresholds`]), the ramp
    /// ([`ConfigError::ZeroRamp`]), the name, and the workers
    /// ([`ConfigError::ZeroWorkers`]).
    pub fn build(self) -> Result<UtilizationShedder, ConfigError> {
        let config = self.config.check()?;
        check_name(&self.name)?;
        if let Source::Workers(0) = self.source {
            return Err(ConfigError::ZeroWorkers);
        }
        let instant = matches!(self.source, Source::Gauge(_));
        let controller = Controller::new(config, self.sample_every, instant);
        let name: Arc<str> = Arc::from(self.name);
        let clock = self
            .clock
            .unwrap_or_else(|| Arc::new(MonotonicClock::new()));
        let mut counters =
            TierCounters::new(&self.tiers, "utilization_shed", name.clone(), clock.clone());
        if let Source::Workers(_) | Source::Limit(_) = self.source {
            counters = counters.with_busy_time();
        }
        Ok(UtilizationShedder {
            inner: Arc::new(Inner {
                counters: Arc::new(counters),
                name,
                source: self.source,
                clock,
                random: self.random,
                sample_every_us: u64::try_from(self.sample_every.as_micros()).unwrap_or(u64::MAX),
                next_sample_us: AtomicU64::new(0),
                amount: AtomicU64::new(controller.amount().to_bits()),
                utilization: AtomicU64::new(0.0f64.to_bits()),
                controller: Mutex::new(controller),
            }),
        })
    }
}

impl fmt::Debug for UtilizationShedderBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UtilizationShedderBuilder")
            .field("name", &self.name)
            .field("config", &self.config)
            .field("tiers", &self.tiers)
            .field("sample_every", &self.sample_every)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_builder_checks_its_numbers_when_built() {
        let workers = || UtilizationShedder::workers(4);
        assert!(matches!(
            workers().thresholds(0.9, 0.8).build(),
            Err(ConfigError::InvalidThresholds { .. })
        ));
        assert!(matches!(
            workers().ramp(Duration::ZERO).build(),
            Err(ConfigError::ZeroRamp)
        ));
        assert!(matches!(
            UtilizationShedder::workers(0).build(),
            Err(ConfigError::ZeroWorkers)
        ));
        assert!(workers().name("bad name").build().is_err());
        // The last setting counts.
        let shedder = workers()
            .thresholds(0.9, 0.8)
            .thresholds(0.6, 0.6)
            .ramp(Duration::ZERO)
            .ramp(Duration::from_secs(1))
            .build();
        assert!(shedder.is_ok());
        let gauge = UtilizationShedder::gauge(|| 0.5).delay(Duration::ZERO);
        assert!(gauge.build().is_ok());
    }
}
