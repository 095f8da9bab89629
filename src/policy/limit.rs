//! Limits as plain values: a [`Rate`], a [`Limit`] (rate plus burst) and a
//! [`Policy`] (one or more limits decided together).
//!
//! Everything here is checked when it is built: nonsense such as a zero rate
//! or a burst the algorithm cannot represent is a [`ConfigError`], never a
//! limiter that silently allows or denies everything.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use super::rate::{DurationText, Rate};
pub(crate) use crate::algorithm::MAX_LIMITS_PER_POLICY;
use crate::algorithm::calendar::Calendar;
use crate::algorithm::window::Window;
use crate::algorithm::{Algorithm, gcra};
use crate::error::ConfigError;
use crate::share::LocalShare;

/// The longest tolerance (burst × emission interval) a limit may have, in
/// microseconds: 2^50 µs, about 35 years.
///
/// Redis evaluates scripts with Lua doubles, which hold integers exactly only
/// up to 2^53; with Unix time in microseconds (about 2^51 today) this bound
/// keeps every intermediate value of the GCRA script exact.
pub(crate) const MAX_TOLERANCE_MICROS: u64 = 1 << 50;

/// One limit: a [`Rate`] with a burst, decided with GCRA.
///
/// The burst is how many events may pass at once after an idle spell; the
/// rate is how fast that allowance refills. `Limit::new(Rate::per_second(100))`
/// has a burst of 100; use [`Limit::builder`] to choose another.
///
/// ```
/// use fleetgate::{Limit, Rate};
/// use std::time::Duration;
///
/// let api = Limit::builder(Rate::per_second(100)).burst(500).build()?;
/// assert_eq!(api.burst(), 500);
/// assert_eq!(api.emission_interval(), Duration::from_millis(10));
///
/// // A zero rate is refused, not turned into "deny everything".
/// assert!(Limit::new(Rate::per_second(0)).is_err());
/// # Ok::<(), fleetgate::ConfigError>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Limit {
    rate: Rate,
    burst: u64,
    name: Arc<str>,
    emission_us: u64,
    tolerance_us: u64,
    /// A calendar quota's calendar; `None` for every other algorithm.
    calendar: Option<Calendar>,
    /// How long a refusal by this limit blocks the identity, in
    /// microseconds (its penalty box, see [`LimitBuilder::block_for`]); 0
    /// for none.
    block_us: u64,
}

impl Limit {
    /// A limit at `rate` whose burst equals the rate's count.
    pub fn new(rate: Rate) -> Result<Self, ConfigError> {
        Limit::builder(rate).build()
    }

    /// Starts building a limit at `rate`.
    pub fn builder(rate: Rate) -> LimitBuilder {
        LimitBuilder {
            rate,
            burst: None,
            name: None,
            calendar: None,
            block: None,
        }
    }

    /// A calendar quota: `count` per calendar day or month in `calendar`'s
    /// time zone, counted from zero again at each period's start (see
    /// [`Algorithm::Calendar`]). Its rate is `count` per the period's
    /// nominal length (a day, or 30 days for a month), which is what
    /// `RateLimit-Policy` advertises; its name is `count/day` or
    /// `count/month`. The policy text writes it `10000/month`,
    /// `500/day tz=Europe/Paris` or `500/day tz=+02:00`.
    ///
    /// ```
    /// use fleetgate::{Algorithm, Calendar, Limit, Policy};
    ///
    /// let plan = Policy::single("pro", Limit::calendar(10_000, Calendar::monthly())?)?;
    /// assert_eq!(plan.algorithm(), Algorithm::Calendar);
    /// let paris = Limit::calendar(500, Calendar::daily().zone("Europe/Paris")?)?;
    /// assert_eq!(paris.name(), "500/day");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn calendar(count: u64, calendar: Calendar) -> Result<Self, ConfigError> {
        Limit::calendar_builder(count, calendar).build()
    }

    /// Starts building a calendar quota ([`Limit::calendar`]), to give it
    /// a name of its own.
    pub fn calendar_builder(count: u64, calendar: Calendar) -> LimitBuilder {
        LimitBuilder {
            rate: Rate::new(count, calendar.nominal()),
            burst: None,
            name: None,
            calendar: Some(calendar),
            block: None,
        }
    }

    /// A calendar quota's calendar; `None` for a limit of another
    /// algorithm.
    pub fn calendar_of(&self) -> Option<&Calendar> {
        self.calendar.as_ref()
    }

    /// How long a refusal by this limit blocks the identity (its penalty
    /// box, [`LimitBuilder::block_for`]); `None` for a limit without one.
    pub fn block_for(&self) -> Option<Duration> {
        (self.block_us > 0).then(|| Duration::from_micros(self.block_us))
    }

    pub(crate) fn block_us(&self) -> u64 {
        self.block_us
    }

    /// The long-run rate.
    pub fn rate(&self) -> Rate {
        self.rate
    }

    /// How many events may pass at once.
    pub fn burst(&self) -> u64 {
        self.burst
    }

    /// The limit's name, used in rejections, headers and logs. Defaults to
    /// the rate, such as `25/5s`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The time one event "costs": `period / count`, rounded up to whole
    /// microseconds so that rounding can never admit more than the rate.
    pub fn emission_interval(&self) -> Duration {
        Duration::from_micros(self.emission_us)
    }

    /// How long a full burst takes to refill from empty: `burst × period /
    /// count`. A key's state lives at most this long (give or take the
    /// microsecond rounding of the emission interval).
    pub fn window(&self) -> Duration {
        let nanos = self
            .rate
            .period()
            .as_nanos()
            .saturating_mul(u128::from(self.burst))
            .div_ceil(u128::from(self.rate.count()));
        Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
    }

    /// This limit cut to `share` of itself, for one instance deciding
    /// alone: count and burst scaled by [`LocalShare::scale`] (rounded
    /// down, at least 1), same period and name. The interval is rounded up
    /// to whole microseconds as for any limit, which can only make the
    /// scaled rate stricter, so the 1% check is not needed; a burst whose
    /// refill would exceed [`MAX_TOLERANCE_MICROS`] is cut to fit.
    pub(crate) fn scaled(&self, share: LocalShare) -> Limit {
        let count = share.scale(self.rate.count());
        let emission_us = u64::try_from(
            self.rate
                .period()
                .as_nanos()
                .div_ceil(u128::from(count) * 1000),
        )
        .unwrap_or(u64::MAX)
        // Only an interval beyond ~35 years is held there.
        .min(MAX_TOLERANCE_MICROS);
        let burst = share
            .scale(self.burst)
            .min(MAX_TOLERANCE_MICROS / emission_us);
        Limit {
            rate: Rate::new(count, self.rate.period()),
            burst,
            name: self.name.clone(),
            emission_us,
            tolerance_us: emission_us * burst,
            calendar: self.calendar.clone(),
            block_us: self.block_us,
        }
    }

    pub(crate) fn emission_us(&self) -> u64 {
        self.emission_us
    }

    pub(crate) fn tolerance_us(&self) -> u64 {
        self.tolerance_us
    }

    /// This limit under a window algorithm: its rate's period (rounded up
    /// to whole microseconds) and count. The builders keep the period at
    /// most 2^50 µs.
    pub(crate) fn as_window(&self) -> Window {
        let length = self.rate.period().as_nanos().div_ceil(1000);
        Window {
            length: u64::try_from(length).unwrap_or(u64::MAX),
            count: self.rate.count(),
        }
    }

    /// How far past now a GCRA charge may move this limit's TAT
    /// ([`gcra::debt_horizon`]), in microseconds.
    pub(crate) fn debt_horizon_us(&self) -> u64 {
        let period = u64::try_from(self.rate.period().as_micros()).unwrap_or(u64::MAX);
        gcra::debt_horizon(self.tolerance_us, period)
    }
}

/// A policy's limits are read in place by GCRA, so that deciding copies
/// nothing.
impl gcra::AsParams for Limit {
    fn params(&self) -> gcra::Params {
        gcra::Params {
            emission: self.emission_us,
            tolerance: self.tolerance_us,
        }
    }

    fn debt_horizon(&self) -> u64 {
        self.debt_horizon_us()
    }
}

impl fmt::Display for Limit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.calendar {
            Some(calendar) => write!(f, "{}/{calendar}", self.rate.count())?,
            None => write!(f, "{} burst {}", self.rate, self.burst)?,
        }
        match self.block_for() {
            Some(block) => write!(f, " block {}", DurationText(block)),
            None => Ok(()),
        }
    }
}

/// Builds a [`Limit`]; see [`Limit::builder`].
#[derive(Clone, Debug)]
#[must_use]
pub struct LimitBuilder {
    rate: Rate,
    burst: Option<u64>,
    name: Option<String>,
    calendar: Option<Calendar>,
    block: Option<Duration>,
}

impl LimitBuilder {
    /// How many events may pass at once (default: the rate's count).
    pub fn burst(mut self, burst: u64) -> Self {
        self.burst = Some(burst);
        self
    }

    /// A name for this limit (default: the rate, such as `25/5s`).
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// A penalty box: once a call is refused by this limit, the identity
    /// is refused by its policy for `block` (or until the limit would
    /// admit the call, if that is later), on every instance sharing the
    /// store, with `Retry-After` counting down to the block's end. Written
    /// `5/15min block 1h` in a policy text.
    ///
    /// What starts a block is a refusal: of a check, or of a peek (how a
    /// layer with a [`ResponseCost`](crate::rate_limit::ResponseCost)
    /// admits), never a charge or a refund. So with
    /// [`count_if`](crate::rate_limit::ResponseCost::count_if) counting
    /// failed logins under `5/15min block 1h`, the attempt after the fifth
    /// failure is refused and blocks the identity for an hour, even with
    /// good credentials. A reset ([`Limiter::reset`](crate::Limiter::reset),
    /// [`LivePolicies::reset`](crate::live::LivePolicies::reset), the admin
    /// API's `POST /reset/...`) lifts the block. On Redis the block is one
    /// more key of the identity (`…:block`), read and written by the same
    /// script as the decision: no extra round trip. Works with every
    /// algorithm. A block ends up to 16 µs before its exact end (the
    /// deciding limit is kept in the same number). A live change of the
    /// policy ([`LivePolicies::set_policy`](crate::live::LivePolicies::set_policy))
    /// that drops the block lifts every block of it at once: the boxes are
    /// no longer read.
    ///
    /// The box is the store's, not the layer's: a layer in shadow mode
    /// ([`RateLimitLayer::shadow`](crate::RateLimitLayer::shadow)) refuses
    /// nothing but still starts real blocks, which an enforcing layer on
    /// the same policy (or the same layer, once it enforces) then honours
    /// until they end. Try a blocking policy in shadow under a name of its
    /// own, and reset it before enforcing.
    ///
    /// Refused by the builder: a block under a millisecond, and one longer
    /// than about 35 years ([`ConfigError::BlockOutOfRange`]).
    ///
    /// ```
    /// use std::time::Duration;
    /// use fleetgate::{Key, Limit, Limiter, MemoryStore, Policy, Rate};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let login = Limit::builder(Rate::new(5, Duration::from_secs(15 * 60)))
    ///     .block_for(Duration::from_secs(3600))
    ///     .build()?;
    /// let limiter = Limiter::new(Policy::single("login", login)?, MemoryStore::new());
    /// let who = Key::new("user:mallory");
    /// for _ in 0..5 {
    ///     assert!(limiter.check(&who, 1).await?.is_allowed());
    /// }
    /// let refused = limiter.check(&who, 1).await?;
    /// assert!(refused.is_blocked());
    /// assert!(refused.retry_after().unwrap() > Duration::from_secs(3599));
    /// // Lifted by a reset.
    /// limiter.reset(&who).await?;
    /// assert!(limiter.check(&who, 1).await?.is_allowed());
    /// # Ok(()) }
    /// ```
    pub fn block_for(mut self, block: Duration) -> Self {
        self.block = Some(block);
        self
    }

    /// Checks the limit and builds it.
    pub fn build(self) -> Result<Limit, ConfigError> {
        let block_us = match self.block {
            None => 0,
            Some(block) => match u64::try_from(block.as_micros()) {
                Ok(us) if (1000..=MAX_TOLERANCE_MICROS).contains(&us) => us,
                _ => return Err(ConfigError::BlockOutOfRange { block }),
            },
        };
        let (count, period) = (self.rate.count(), self.rate.period());
        if count == 0 {
            return Err(ConfigError::ZeroRate);
        }
        if period.is_zero() {
            return Err(ConfigError::ZeroPeriod);
        }
        let burst = self.burst.unwrap_or(count);
        if burst == 0 {
            return Err(ConfigError::ZeroBurst);
        }
        let period_ns = period.as_nanos();
        let count = u128::from(count);
        // Ceiling division: a rounded-down interval would admit slightly more
        // than the rate over a long run.
        let emission_us = period_ns.div_ceil(count * 1000);
        if emission_us > u128::from(MAX_TOLERANCE_MICROS) {
            return Err(ConfigError::PeriodTooLong { period });
        }
        // Rounding up to whole microseconds must not slow the rate by more
        // than 1% (it cannot for rates up to 10,000 per second).
        if (emission_us * count * 1000 - period_ns) * 100 > period_ns {
            return Err(ConfigError::RateTooFine { rate: self.rate });
        }
        let tolerance_us = emission_us.saturating_mul(u128::from(burst));
        if tolerance_us > u128::from(MAX_TOLERANCE_MICROS) {
            return Err(ConfigError::BurstTooLarge {
                burst,
                window: Duration::from_micros(u64::try_from(tolerance_us).unwrap_or(u64::MAX)),
            });
        }
        // Both fit in u64: they are at most MAX_TOLERANCE_MICROS.
        let emission_us = emission_us as u64;
        let tolerance_us = tolerance_us as u64;
        let name = match self.name {
            Some(name) => {
                check_name(&name)?;
                Arc::from(name)
            }
            None => match &self.calendar {
                Some(calendar) => Arc::from(format!("{}/{}", self.rate.count(), calendar.unit())),
                None => Arc::from(self.rate.to_string()),
            },
        };
        Ok(Limit {
            rate: self.rate,
            burst,
            name,
            emission_us,
            tolerance_us,
            calendar: self.calendar,
            block_us,
        })
    }
}

/// A window admits its rate's count: a limit with another burst is refused
/// rather than silently given a different meaning.
fn check_window_limits(algorithm: Algorithm, limits: &[Limit]) -> Result<(), ConfigError> {
    if !algorithm.is_window() {
        return Ok(());
    }
    match limits.iter().find(|l| l.burst() != l.rate().count()) {
        Some(l) => Err(ConfigError::WindowBurst {
            name: l.name().to_owned(),
            burst: l.burst(),
            count: l.rate().count(),
        }),
        None => Ok(()),
    }
}

/// Names end up in Redis keys, headers and metrics labels: keep them short
/// and free of characters that would need quoting or break hash tags.
pub(crate) fn check_name(name: &str) -> Result<(), ConfigError> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_./:".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(ConfigError::InvalidName {
            name: name.to_owned(),
        })
    }
}

/// One or more limits under a name, decided together: a call passes only if
/// every limit admits it, and a call that any limit denies charges none.
///
/// ```
/// use fleetgate::{Limit, Policy, Rate};
/// use std::time::Duration;
///
/// // An upstream API's published limits: 25 per 5 s and 300 per minute.
/// let upstream = Policy::builder("upstream")
///     .limit(Limit::new(Rate::new(25, Duration::from_secs(5)))?)
///     .limit(Limit::new(Rate::per_minute(300))?)
///     .build()?;
/// assert_eq!(upstream.limits().len(), 2);
/// # Ok::<(), fleetgate::ConfigError>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Policy {
    inner: Arc<PolicyInner>,
}

#[derive(Debug, PartialEq, Eq, Hash)]
struct PolicyInner {
    name: Arc<str>,
    limits: Box<[Limit]>,
    max_cost: u64,
    algorithm: Algorithm,
    /// For a policy with a penalty box: where the memory store keeps the
    /// box of each identity (see [`Policy::penalty_box`]).
    penalty: Option<Policy>,
}

impl PolicyInner {
    fn new(name: Arc<str>, limits: Box<[Limit]>, algorithm: Algorithm) -> Self {
        let penalty = limits.iter().find(|l| l.block_us > 0).map(|limit| Policy {
            inner: Arc::new(PolicyInner {
                name: Arc::from(Policy::penalty_box_name(&name)),
                limits: Box::new([limit.clone()]),
                max_cost: 0,
                algorithm,
                penalty: None,
            }),
        });
        PolicyInner {
            max_cost: limits.iter().map(|l| l.burst).min().unwrap_or(0),
            name,
            limits,
            algorithm,
            penalty,
        }
    }
}

impl Policy {
    /// This policy with every limit twice, under the same name: the memory
    /// store keeps upstream feedback's holds (see `gcra::defer`) in the
    /// second half of an identity's state, where decisions, which read the
    /// first `limits().len()` only, never look.
    pub(crate) fn doubled(&self) -> Policy {
        let limits: Vec<Limit> = self
            .inner
            .limits
            .iter()
            .chain(self.inner.limits.iter())
            .cloned()
            .collect();
        Policy {
            inner: Arc::new(PolicyInner::new(
                self.inner.name.clone(),
                limits.into_boxed_slice(),
                self.inner.algorithm,
            )),
        }
    }

    /// A policy named `name` holding a single limit.
    pub fn single(name: impl Into<String>, limit: Limit) -> Result<Self, ConfigError> {
        Policy::builder(name).limit(limit).build()
    }

    /// Starts building a policy named `name`. The name becomes part of
    /// storage keys: `[A-Za-z0-9-_./:]`, at most 64 bytes.
    pub fn builder(name: impl Into<String>) -> PolicyBuilder {
        PolicyBuilder {
            name: name.into(),
            limits: Vec::new(),
            algorithm: None,
        }
    }

    /// The policy's name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    pub(crate) fn name_arc(&self) -> Arc<str> {
        self.inner.name.clone()
    }

    /// The address of the shared value: equal for clones of one policy.
    pub(crate) fn as_ptr(&self) -> *const () {
        Arc::as_ptr(&self.inner).cast()
    }

    /// Whether both are the same policy value (clones of one another).
    pub(crate) fn same_as(&self, other: &Policy) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// The limits, in the order they were added.
    pub fn limits(&self) -> &[Limit] {
        &self.inner.limits
    }

    /// The largest cost a single call can ever be admitted with: the
    /// smallest burst among the limits.
    pub fn max_cost(&self) -> u64 {
        self.inner.max_cost
    }

    /// The algorithm that decides the policy's limits.
    pub fn algorithm(&self) -> Algorithm {
        self.inner.algorithm
    }

    /// Whether a limit of the policy has a penalty box
    /// ([`LimitBuilder::block_for`]).
    pub(crate) fn blocks(&self) -> bool {
        self.inner.penalty.is_some()
    }

    /// Where the memory store keeps an identity's penalty box for this
    /// policy: a policy of one limit under a name no policy can have (it
    /// holds a space), whose one state is the box's value (see
    /// `algorithm::block`). `None` without a penalty box.
    pub(crate) fn penalty_box(&self) -> Option<&Policy> {
        self.inner.penalty.as_ref()
    }

    /// The name of [`penalty_box`](Self::penalty_box) of a policy named
    /// `name`, to reset it by name.
    pub(crate) fn penalty_box_name(name: &str) -> String {
        format!("{name} block")
    }

    /// The policy one instance enforces alone under
    /// [`FailurePolicy::Local`](crate::FailurePolicy::Local): same name,
    /// algorithm, limit names and periods, each limit's count and burst
    /// scaled by `share` (rounded down, at least 1; see
    /// [`LocalShare::scale`]).
    ///
    /// ```
    /// use fleetgate::{Limit, LocalShare, Policy, Rate};
    ///
    /// let api = Policy::single("api", Limit::builder(Rate::per_second(100)).burst(500).build()?)?;
    /// let local = api.scaled(LocalShare::new(0.25)?);
    /// assert_eq!(local.limits()[0].rate(), Rate::per_second(25));
    /// assert_eq!(local.limits()[0].burst(), 125);
    /// assert_eq!(local.limits()[0].name(), "100/s");
    /// # Ok::<(), fleetgate::ConfigError>(())
    /// ```
    pub fn scaled(&self, share: LocalShare) -> Policy {
        let limits: Box<[Limit]> = self.limits().iter().map(|l| l.scaled(share)).collect();
        Policy {
            inner: Arc::new(PolicyInner::new(
                self.inner.name.clone(),
                limits,
                self.inner.algorithm,
            )),
        }
    }
}

/// Builds a [`Policy`]; see [`Policy::builder`].
#[derive(Clone, Debug)]
#[must_use]
pub struct PolicyBuilder {
    name: String,
    limits: Vec<Limit>,
    /// `None`: GCRA, or the calendar for calendar quotas.
    algorithm: Option<Algorithm>,
}

impl PolicyBuilder {
    /// Adds a limit.
    pub fn limit(mut self, limit: Limit) -> Self {
        self.limits.push(limit);
        self
    }

    /// Decides the limits with `algorithm` (default: [`Algorithm::Gcra`],
    /// or [`Algorithm::Calendar`] for calendar quotas). Under a window
    /// algorithm each limit is a window of its rate's count per its rate's
    /// period; see [`Algorithm`].
    pub fn algorithm(mut self, algorithm: Algorithm) -> Self {
        self.algorithm = Some(algorithm);
        self
    }

    /// Checks the policy and builds it.
    pub fn build(self) -> Result<Policy, ConfigError> {
        check_name(&self.name)?;
        let algorithm = policy_algorithm(self.algorithm, &self.limits)?;
        check_window_limits(algorithm, &self.limits)?;
        if self.limits.is_empty() {
            return Err(ConfigError::EmptyPolicy);
        }
        if self.limits.len() > MAX_LIMITS_PER_POLICY {
            return Err(ConfigError::TooManyLimits {
                count: self.limits.len(),
                max: MAX_LIMITS_PER_POLICY,
            });
        }
        for (i, limit) in self.limits.iter().enumerate() {
            if self.limits[..i].iter().any(|l| l.name == limit.name) {
                return Err(ConfigError::DuplicateLimit {
                    name: limit.name.to_string(),
                });
            }
        }
        Ok(Policy {
            inner: Arc::new(PolicyInner::new(
                Arc::from(self.name),
                self.limits.into_boxed_slice(),
                algorithm,
            )),
        })
    }
}

/// The algorithm a policy of `limits` decides with: the one asked for
/// (GCRA when none was), or the calendar for calendar quotas; one
/// algorithm for all, or a [`ConfigError::CalendarMix`].
fn policy_algorithm(asked: Option<Algorithm>, limits: &[Limit]) -> Result<Algorithm, ConfigError> {
    let calendars = limits.iter().any(|l| l.calendar.is_some());
    let algorithm = asked.unwrap_or(if calendars {
        Algorithm::Calendar
    } else {
        Algorithm::Gcra
    });
    let calendar = algorithm == Algorithm::Calendar;
    match limits.iter().find(|l| l.calendar.is_some() != calendar) {
        Some(l) => Err(ConfigError::CalendarMix {
            name: l.name().to_owned(),
            algorithm,
        }),
        None => Ok(algorithm),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn emission_interval_rounds_up() {
        let l = Limit::new(Rate::per_second(3)).unwrap();
        assert_eq!(l.emission_us(), 333_334);
        assert_eq!(l.tolerance_us(), 1_000_002);
    }

    #[test]
    fn scaled_policies_keep_names_algorithm_and_window_quotas() {
        let share = LocalShare::new(0.3).unwrap();
        let windows = Policy::builder("w")
            .algorithm(Algorithm::SlidingLog)
            .limit(Limit::new(Rate::new(25, Duration::from_secs(5))).unwrap())
            .limit(Limit::new(Rate::per_minute(300)).unwrap())
            .build()
            .unwrap();
        let local = windows.scaled(share);
        assert_eq!(local.name(), "w");
        assert_eq!(local.algorithm(), Algorithm::SlidingLog);
        let got: Vec<(&str, u64, u64)> = local
            .limits()
            .iter()
            .map(|l| (l.name(), l.rate().count(), l.burst()))
            .collect();
        assert_eq!(got, [("25/5s", 7, 7), ("300/min", 90, 90)]);
        assert_eq!(local.max_cost(), 7);
        // A window's quota is its count: the scaled policy stays valid.
        check_window_limits(local.algorithm(), local.limits()).unwrap();

        let gcra = Limit::builder(Rate::per_second(3))
            .burst(10)
            .build()
            .unwrap();
        let half = gcra.scaled(LocalShare::new(0.5).unwrap());
        assert_eq!((half.rate().count(), half.burst()), (1, 5));
        assert_eq!(half.emission_us(), 1_000_000);
        assert_eq!(half.tolerance_us(), 5_000_000);
        // The whole share is the limit itself.
        assert_eq!(gcra.scaled(LocalShare::new(1.0).unwrap()), gcra);
    }

    #[test]
    fn display_names() {
        assert_eq!(Rate::new(25, Duration::from_secs(5)).to_string(), "25/5s");
        assert_eq!(Rate::per_minute(300).to_string(), "300/min");
        assert_eq!(Rate::per_hour(5000).to_string(), "5000/h");
        assert_eq!(
            Rate::new(1, Duration::from_millis(250)).to_string(),
            "1/250ms"
        );
    }
}
