//! Error types: configuration mistakes, store failures and rejections.

use std::time::Duration;

use crate::limit::Rate;

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
    /// The rate is finer than one event per microsecond, the resolution of
    /// every store's clock.
    #[error("rate {rate} is finer than one event per microsecond; use a longer period")]
    RateTooFine {
        /// The offending rate.
        rate: Rate,
    },
    /// The period is too long to represent exactly.
    #[error("period {period:?} is too long to represent (at most about 35 years)")]
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
    /// A policy without limits.
    #[error("a policy needs at least one limit")]
    EmptyPolicy,
    /// A policy with more limits than one script call takes.
    #[error("a policy holds at most {max} limits, got {count}", max = crate::limit::MAX_LIMITS_PER_POLICY)]
    TooManyLimits {
        /// How many limits were given.
        count: usize,
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
}
