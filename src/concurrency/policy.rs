use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::error::ConfigError;
use crate::policy::check_name;
use crate::share::LocalShare;

/// The longest lease TTL a [`ConcurrencyPolicy`] accepts: one day. A lease
/// whose holder crashed keeps its slot this long at most.
pub(crate) const MAX_LEASE_TTL: Duration = Duration::from_secs(86_400);

/// The shortest lease TTL: one millisecond, the resolution of Redis key
/// expiry.
pub(crate) const MIN_LEASE_TTL: Duration = Duration::from_millis(1);

/// At most `max_in_flight` requests per identity at once, each holding a
/// lease that lives `lease_ttl` unless renewed.
///
/// The TTL is how long a crashed instance's requests keep their slots; a
/// request that runs longer keeps its lease by renewing it every
/// `renew_every` (default: a third of the TTL) until its response body
/// ends.
///
/// ```
/// use std::time::Duration;
/// use fleetgate::concurrency::ConcurrencyPolicy;
///
/// let slow = ConcurrencyPolicy::builder("slow", 2)
///     .lease_ttl(Duration::from_secs(30))
///     .build()?;
/// assert_eq!(slow.max_in_flight(), 2);
/// assert_eq!(slow.renew_every(), Some(Duration::from_secs(10)));
///
/// // Nonsense is refused, not turned into "deny everything".
/// assert!(ConcurrencyPolicy::builder("slow", 0).build().is_err());
/// # Ok::<(), fleetgate::ConfigError>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ConcurrencyPolicy {
    name: Arc<str>,
    max_in_flight: u64,
    lease_ttl: Duration,
    renew_every: Option<Duration>,
}

impl ConcurrencyPolicy {
    /// `max_in_flight` per identity with the default lease TTL (30 s),
    /// renewed every 10 s.
    pub fn new(name: impl Into<String>, max_in_flight: u64) -> Result<Self, ConfigError> {
        ConcurrencyPolicy::builder(name, max_in_flight).build()
    }

    /// Starts building a policy named `name` (part of storage keys:
    /// `[A-Za-z0-9-_./:]`, at most 64 bytes).
    pub fn builder(name: impl Into<String>, max_in_flight: u64) -> ConcurrencyPolicyBuilder {
        ConcurrencyPolicyBuilder {
            name: name.into(),
            max_in_flight,
            lease_ttl: Duration::from_secs(30),
            renew_every: Renewal::Default,
        }
    }

    /// The policy's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    pub(crate) fn name_arc(&self) -> Arc<str> {
        self.name.clone()
    }

    /// How many requests of one identity may be in flight at once.
    pub fn max_in_flight(&self) -> u64 {
        self.max_in_flight
    }

    /// How long a lease lives unless renewed or released.
    pub fn lease_ttl(&self) -> Duration {
        self.lease_ttl
    }

    /// How often a held lease is renewed; `None` when renewal is off.
    pub fn renew_every(&self) -> Option<Duration> {
        self.renew_every
    }

    /// The policy one instance enforces alone under
    /// [`FailurePolicy::Local`](crate::FailurePolicy::Local): the maximum
    /// in flight scaled by `share` (rounded down, at least 1; see
    /// [`LocalShare::scale`]), everything else the same.
    ///
    /// ```
    /// use fleetgate::LocalShare;
    /// use fleetgate::concurrency::ConcurrencyPolicy;
    ///
    /// let reports = ConcurrencyPolicy::new("reports", 10)?;
    /// assert_eq!(reports.scaled(LocalShare::new(0.25)?).max_in_flight(), 2);
    /// assert_eq!(reports.scaled(LocalShare::one_of(20)?).max_in_flight(), 1);
    /// # Ok::<(), fleetgate::ConfigError>(())
    /// ```
    pub fn scaled(&self, share: LocalShare) -> ConcurrencyPolicy {
        ConcurrencyPolicy {
            max_in_flight: share.scale(self.max_in_flight),
            ..self.clone()
        }
    }
}

impl fmt::Display for ConcurrencyPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} in flight", self.max_in_flight)
    }
}

#[derive(Clone, Copy, Debug)]
enum Renewal {
    Default,
    Every(Duration),
    Off,
}

/// Builds a [`ConcurrencyPolicy`]; see [`ConcurrencyPolicy::builder`].
#[derive(Clone, Debug)]
#[must_use]
pub struct ConcurrencyPolicyBuilder {
    name: String,
    max_in_flight: u64,
    lease_ttl: Duration,
    renew_every: Renewal,
}

impl ConcurrencyPolicyBuilder {
    /// How long a lease lives unless renewed or released (default 30 s,
    /// from 1 ms to 24 hours).
    pub fn lease_ttl(mut self, ttl: Duration) -> Self {
        self.lease_ttl = ttl;
        self
    }

    /// Renews held leases this often (default: a third of the TTL); must
    /// be shorter than the TTL.
    pub fn renew_every(mut self, every: Duration) -> Self {
        self.renew_every = Renewal::Every(every);
        self
    }

    /// Never renews: a request that outlives the TTL loses its slot.
    pub fn no_renewal(mut self) -> Self {
        self.renew_every = Renewal::Off;
        self
    }

    /// Checks the policy and builds it.
    pub fn build(self) -> Result<ConcurrencyPolicy, ConfigError> {
        check_name(&self.name)?;
        if self.max_in_flight == 0 {
            return Err(ConfigError::ZeroInFlight);
        }
        let ttl = self.lease_ttl;
        if !(MIN_LEASE_TTL..=MAX_LEASE_TTL).contains(&ttl) {
            return Err(ConfigError::LeaseTtl { ttl });
        }
        let renew_every = match self.renew_every {
            Renewal::Default => Some(ttl / 3),
            Renewal::Every(every) if !every.is_zero() && every < ttl => Some(every),
            Renewal::Every(every) => return Err(ConfigError::RenewInterval { every, ttl }),
            Renewal::Off => None,
        };
        Ok(ConcurrencyPolicy {
            name: Arc::from(self.name),
            max_in_flight: self.max_in_flight,
            lease_ttl: ttl,
            renew_every,
        })
    }
}
