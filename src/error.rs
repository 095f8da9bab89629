//! Error types: configuration mistakes, store failures and rejections.

use std::time::Duration;

use crate::policy::Rate;

/// The error type of services in typed-error mode.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A limit, policy or layer that makes no sense, refused when it is built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The rate's count is zero: nothing could ever pass.
    #[error("rate must allow at least one event per period")]
    ZeroRate,
    /// The rate's period is zero.
    #[error("rate period must be longer than zero")]
    ZeroPeriod,
    /// The burst is zero: nothing could ever pass.
    #[error("burst must be at least 1")]
    ZeroBurst,
    /// The rate cannot be kept at the stores' microsecond resolution: the
    /// interval between events, rounded up to whole microseconds, would slow
    /// it by more than 1%. Every rate up to 10,000 per second is fine, and so
    /// is any rate whose interval is a whole number of microseconds.
    #[error(
        "rate {rate} cannot be kept within 1% at microsecond resolution; use at most 10000 per second or a whole number of microseconds between events"
    )]
    RateTooFine {
        /// The offending rate.
        rate: Rate,
    },
    /// The interval between events is too long to represent.
    #[error("period {period:?} is too long to represent (at most about 35 years between events)")]
    PeriodTooLong {
        /// The offending period.
        period: Duration,
    },
    /// The burst takes too long to refill to be represented exactly.
    #[error(
        "burst {burst} takes {window:?} to refill, too long to represent (at most about 35 years)"
    )]
    BurstTooLarge {
        /// The offending burst.
        burst: u64,
        /// How long it would take to refill.
        window: Duration,
    },
    /// A penalty box ([`LimitBuilder::block_for`](crate::LimitBuilder::block_for))
    /// under a millisecond, or longer than can be represented (about 35
    /// years).
    #[error("a block of {block:?} is out of range: at least 1 ms and at most about 35 years")]
    BlockOutOfRange {
        /// The offending duration.
        block: Duration,
    },
    /// A policy without limits.
    #[error("a policy needs at least one limit")]
    EmptyPolicy,
    /// A policy with more limits than one script call takes.
    #[error("a policy holds at most {max} limits, got {count}")]
    TooManyLimits {
        /// How many limits were given.
        count: usize,
        /// How many one policy holds at most.
        max: usize,
    },
    /// Two limits of one policy share a name.
    #[error("two limits are named {name:?}; give them distinct names")]
    DuplicateLimit {
        /// The repeated name.
        name: String,
    },
    /// A policy, limit or key-prefix name with characters outside
    /// `[A-Za-z0-9-_./:]`, empty, or longer than 64 bytes.
    #[error("invalid name {name:?}: use 1 to 64 characters from [A-Za-z0-9-_./:]")]
    InvalidName {
        /// The offending name.
        name: String,
    },
    /// A fixed cost above what the policy's smallest burst can ever admit.
    #[error(
        "cost {cost} exceeds the smallest burst of the policy ({max}); such a call could never pass"
    )]
    CostAboveBurst {
        /// The cost.
        cost: u64,
        /// The largest admissible cost.
        max: u64,
    },
    /// A proxy network such as `10.0.0.0/8` that does not parse.
    #[error("invalid network {text:?}: expected an address or address/prefix such as 10.0.0.0/8")]
    InvalidNetwork {
        /// The offending text.
        text: String,
    },
    /// A timeout of zero.
    #[error("timeout must be longer than zero")]
    ZeroTimeout,
    /// A per-route table with neither rules nor a default.
    #[error("a per-route table needs at least one route or a default policy")]
    EmptyRoutes,
    /// A route or default refers to a policy that is not defined.
    #[error("no policy named {name:?} is defined")]
    UnknownPolicy {
        /// The missing name.
        name: String,
    },
    /// An HTTP method that does not parse.
    #[error("invalid HTTP method {method:?}")]
    InvalidMethod {
        /// The offending text.
        method: String,
    },
    /// A route path that does not start with `/`.
    #[error("invalid route {path:?}: a route starts with `/`")]
    InvalidRoute {
        /// The offending path.
        path: String,
    },
    /// A tier set with a repeated name.
    #[error("two tiers are named {name:?}")]
    DuplicateTier {
        /// The repeated name.
        name: String,
    },
    /// A tier set with fewer than two or more than sixteen tiers.
    #[error("{count} tiers: a tier set needs 2 to 16 (one never shed, at least one sheddable)")]
    TierCount {
        /// How many were given.
        count: usize,
    },
    /// A tier name that is not in the set.
    #[error("no tier named {name:?}")]
    UnknownTier {
        /// The missing name.
        name: String,
    },
    /// Utilization thresholds outside `0 < good <= bad < 1`.
    #[error("invalid utilization thresholds ({detail}): need 0 < good <= bad < 1")]
    InvalidThresholds {
        /// The values given.
        detail: String,
    },
    /// A tier's share of the fleet capacity that is not a number in
    /// `(0, 1]`, leaves the tier no capacity at all, lets a tier use more
    /// than a more important one, or is set for the most important tier
    /// (which is never shed).
    #[error("share of tier {tier:?}: {detail}")]
    TierShare {
        /// The tier.
        tier: String,
        /// What is wrong with it.
        detail: String,
    },
    /// A worker capacity of zero: utilization would be undefined.
    #[error("a worker-utilization shedder needs at least one worker")]
    ZeroWorkers,
    /// A worker-utilization ramp of zero: shedding would jump from nothing
    /// to everything at once.
    #[error("the worker-utilization ramp must be longer than zero")]
    ZeroRamp,
    /// Something that starts background tasks was built outside a tokio
    /// runtime.
    #[error("{what} must be called within a tokio runtime")]
    NoRuntime {
        /// What was called.
        what: &'static str,
    },
    /// A limit of a window policy with a burst other than its rate's count:
    /// a window admits its count, and has no separate burst.
    #[error(
        "limit {name} has burst {burst}, but a window admits its rate's count ({count}); drop the burst or use GCRA"
    )]
    WindowBurst {
        /// The limit's name.
        name: String,
        /// The burst it was given.
        burst: u64,
        /// The rate's count, the window's quota.
        count: u64,
    },
    /// A policy mixing calendar quotas ([`Limit::calendar`](crate::Limit::calendar))
    /// with limits of another algorithm, or naming an algorithm other than
    /// [`Algorithm::Calendar`](crate::Algorithm::Calendar) for calendar
    /// quotas, or that algorithm without them: one policy has one algorithm.
    #[error(
        "limit {name} does not fit a policy decided by {algorithm}: a policy's limits are all calendar quotas (the calendar algorithm) or none is"
    )]
    CalendarMix {
        /// The limit that does not fit.
        name: String,
        /// The algorithm it does not fit.
        algorithm: crate::algorithm::Algorithm,
    },
    /// A calendar quota's time zone or period that is not known.
    #[error(transparent)]
    Calendar(#[from] crate::algorithm::calendar::CalendarError),
    /// Reserve mode (waiting for a slot) on a policy decided by a window
    /// algorithm: only GCRA can hand out future slots.
    #[error("reserve mode needs a GCRA policy; this policy uses {algorithm}")]
    ReserveNeedsGcra {
        /// The policy's algorithm.
        algorithm: crate::algorithm::Algorithm,
    },
    /// A live policy replaced by one of another name: the name is part of
    /// every stored key, so a policy keeps it for life.
    #[error("policy {name:?} cannot be replaced by a policy named {new:?}")]
    PolicyRenamed {
        /// The policy's name.
        name: String,
        /// The name of the policy offered in its place.
        new: String,
    },
    /// More identities with limits of their own than live policies keep.
    #[error("at most {max} identities may have limits of their own")]
    TooManyIdentities {
        /// The bound.
        max: usize,
    },
    /// More deny and allow entries than live policies keep.
    #[error("at most {max} deny and allow entries may be in force")]
    TooManyListed {
        /// The bound.
        max: usize,
    },
    /// A deny or allow entry given an end that is zero or more than ten
    /// years away (leave it without one instead).
    #[error(
        "a list entry lasting {expires_in:?} is out of range: at least 1 ms and at most 10 years"
    )]
    ListExpiryOutOfRange {
        /// The offending duration.
        expires_in: Duration,
    },
    /// A plan that was never defined.
    #[error("no plan is named {name:?}")]
    UnknownPlan {
        /// The name given.
        name: String,
    },
    /// An [`AdaptiveLimit`](crate::concurrency::AdaptiveLimit) whose
    /// settings make no sense.
    #[error("invalid adaptive limit: {detail}")]
    AdaptiveLimit {
        /// What is wrong.
        detail: String,
    },
    /// An [`AdaptiveThrottle`](crate::rate_limit::AdaptiveThrottle) whose
    /// settings make no sense.
    #[error("invalid adaptive throttle: {detail}")]
    AdaptiveThrottle {
        /// What is wrong.
        detail: String,
    },
    /// A [`RetryBudget`](crate::rate_limit::RetryBudget) whose settings
    /// make no sense.
    #[error("invalid retry budget {name:?}: {detail}")]
    RetryBudget {
        /// The budget's name.
        name: String,
        /// What is wrong.
        detail: String,
    },
    /// A [`WaitQueue`](crate::concurrency::WaitQueue) of no room or no
    /// time, or past its bounds.
    #[error("invalid wait queue: {detail}")]
    WaitQueue {
        /// What is wrong.
        detail: String,
    },
    /// A concurrency limit of zero requests in flight: nothing could pass.
    #[error("a concurrency limit must allow at least one request in flight")]
    ZeroInFlight,
    /// A lease TTL outside 1 ms ..= 1 day.
    #[error("lease TTL {ttl:?} is outside 1 ms ..= 1 day")]
    LeaseTtl {
        /// The offending TTL.
        ttl: Duration,
    },
    /// A renewal interval of zero, or not shorter than the lease TTL (the
    /// lease would expire before it is renewed).
    #[error("leases must be renewed more often than their TTL ({ttl:?}), and not every {every:?}")]
    RenewInterval {
        /// The offending interval.
        every: Duration,
        /// The lease TTL.
        ttl: Duration,
    },
    /// A rejection status that is not an error status (4xx or 5xx).
    #[error("rejection status {status} is not an error status (4xx or 5xx)")]
    RejectionStatus {
        /// The offending status.
        status: http::StatusCode,
    },
    /// A Redis store told to keep no script in flight, or to put no call in
    /// a script.
    #[error("{setting} must be at least 1")]
    ZeroBatch {
        /// `max_in_flight` or `max_batch`.
        setting: &'static str,
    },
    /// A [`MemoryStore`](crate::MemoryStore) bound of zero entries.
    #[error("a memory store's max_keys must be at least 1")]
    ZeroMaxKeys,
    /// A [`MemoryStore`](crate::MemoryStore) bound above the largest it
    /// takes.
    #[error("a memory store's max_keys must be at most {most}, not {max_keys}")]
    TooManyMaxKeys {
        /// The bound asked for.
        max_keys: usize,
        /// The largest bound a memory store takes.
        most: usize,
    },
    /// A [`LocalShare`](crate::LocalShare) outside `1e-6 <= share <= 1`
    /// (not a number, zero or less, more than the whole, or less than a
    /// millionth).
    #[error("local share {share} is outside 1e-6 <= share <= 1")]
    InvalidShare {
        /// The offending share, as given.
        share: String,
    },
    /// Hot keys ([`Limiter::hot_keys`](crate::Limiter::hot_keys)) asked
    /// of a policy whose algorithm cannot lend tokens.
    #[error(
        "hot keys need GCRA or the sliding window (counter), not {algorithm}: a lease is tested on those two only"
    )]
    HotKeysUnsupported {
        /// The policy's algorithm.
        algorithm: crate::Algorithm,
    },
    /// Hot keys with a lease time of zero or above
    /// [`HotKeys::MAX_LEASE_TIME`](crate::HotKeys::MAX_LEASE_TIME), or a
    /// threshold of zero calls per second.
    #[error("hot keys need a lease time above zero and at most 60 s, and a threshold above zero")]
    HotKeysOutOfRange,
    /// A Redis address (of a `Topology`) that does not parse: not a
    /// `redis://`, `rediss://` or `redis+unix://` URL, or `rediss://`
    /// without the `tls-rustls` feature.
    #[error(
        "invalid Redis address: {reason} (expected redis://[user:password@]host:port[/db], rediss://... for TLS, or redis+unix:///path)"
    )]
    InvalidRedisAddress {
        /// Which address, and what is wrong with it (never the address
        /// itself, which may hold a password).
        reason: String,
    },
    /// A Redis Cluster without nodes, or Redis Sentinel without sentinels.
    #[error("{topology} needs at least one address")]
    NoRedisAddresses {
        /// `a Redis Cluster` or `Redis Sentinel`.
        topology: &'static str,
    },
    /// Redis Sentinel asked for a master of an empty name.
    #[error("the name of the Sentinel master is empty")]
    EmptyMasterName,
}

/// A store could not decide: Redis unreachable, too slow, or answering
/// something unexpected.
///
/// What the layers do then is their failure policy
/// ([`FailurePolicy`](crate::FailurePolicy)); callers of
/// [`Limiter::check`](crate::Limiter::check) decide for themselves.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The store's own settings are invalid (a bad key prefix, a zero
    /// timeout); reported before any connection is attempted.
    #[error("invalid store settings: {0}")]
    Config(#[from] ConfigError),
    /// The store did not answer within its timeout.
    #[error("store did not answer within {0:?}")]
    Timeout(Duration),
    /// Redis answered with an error, or the connection failed.
    #[error("redis: {0}")]
    Redis(String),
    /// Redis answered something the script cannot have returned.
    #[error("unexpected reply from store: {0}")]
    UnexpectedReply(String),
}

#[cfg(feature = "redis")]
impl From<redis::RedisError> for StoreError {
    fn from(err: redis::RedisError) -> Self {
        StoreError::Redis(err.to_string())
    }
}

/// Why a call was refused, for services that are not HTTP (the layer's
/// error mode): the typed counterpart of a 429 response.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RateLimitError {
    /// A limit denied the call.
    #[error("rate limited by {limit}{}", retry_after.map(|d| format!("; retry after {d:?}")).unwrap_or_default())]
    Limited {
        /// The name of the limit that denied.
        limit: String,
        /// When a retry may pass; `None` when this call can never pass
        /// (its cost is above the burst).
        retry_after: Option<Duration>,
    },
    /// No key could be extracted from the request and the layer was told to
    /// reject such requests.
    #[error("no rate-limit key could be extracted from the request")]
    MissingKey,
    /// The store failed and the layer fails closed.
    #[error("rate limiter unavailable: {0}")]
    Unavailable(String),
    /// A deny list entry names the call's key
    /// ([`LivePolicies::deny`](crate::live::LivePolicies::deny)).
    #[error("denied by a deny list entry{}", retry_after.map(|d| format!(" ending in {d:?}")).unwrap_or_default())]
    Denied {
        /// When the entry ends; `None` if it has no end.
        retry_after: Option<Duration>,
    },
    /// An [`AdaptiveThrottleLayer`](crate::rate_limit::AdaptiveThrottleLayer)
    /// refused the call locally, without sending it: the upstream has
    /// been refusing or failing most calls.
    /// [`AdaptiveThrottle::rejection_probability`](crate::rate_limit::AdaptiveThrottle::rejection_probability)
    /// says how likely that is now.
    #[error("throttled locally: the upstream has accepted too few of this client's calls")]
    Throttled,
    /// A waiting layer ([`RateLimitLayer::wait_up_to`](crate::RateLimitLayer::wait_up_to))
    /// refused the call at once because its slot was further away than the
    /// layer may wait; nothing was reserved.
    #[error(
        "rate limited by {limit}: the next slot is {wait:?} away, longer than the {max_wait:?} this call may wait"
    )]
    WaitTooLong {
        /// The name of the limit whose slot was too far away.
        limit: String,
        /// How long the call would have had to wait.
        wait: Duration,
        /// The longest the layer waits.
        max_wait: Duration,
    },
}

/// Whether `err` is one of fleetgate's own refusals ([`RateLimitError`]),
/// bare or boxed: a call that never reached the upstream.
pub(crate) fn is_refusal<E: 'static>(err: &E) -> bool {
    let any = err as &dyn std::any::Any;
    any.is::<RateLimitError>()
        || any
            .downcast_ref::<BoxError>()
            .is_some_and(|boxed| boxed.is::<RateLimitError>())
}
