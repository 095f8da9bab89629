//! What every layer shares: what it does with a request that has no key
//! ([`OnMissingKey`]), what it does when its store cannot decide
//! ([`FailurePolicy`], with the local fallback), and how it refuses
//! ([`mode`]).

use std::sync::Arc;

use http::StatusCode;

use crate::error::{ConfigError, StoreError};
use crate::key::Key;
use crate::log::STORE_WARNINGS;
use crate::share::LocalShare;
use crate::store::Store;

/// What a layer does with a request from which no key can be extracted.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum OnMissingKey {
    /// Refuse it with this status (default: `400 Bad Request`). A typed-error
    /// layer fails with [`RateLimitError::MissingKey`](crate::RateLimitError::MissingKey).
    Reject(StatusCode),
    /// Limit it under this key, shared by every such request.
    Fallback(Key),
    /// Let it through unlimited.
    Allow,
}

impl Default for OnMissingKey {
    fn default() -> Self {
        OnMissingKey::Reject(StatusCode::BAD_REQUEST)
    }
}

/// What a layer does when its store cannot decide (Redis down, slow, or
/// answering nonsense). Every failure is logged at `warn`, at most once per
/// second per process.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum FailurePolicy {
    /// Let the request through without limiting it (default): the limiter
    /// must never be what takes the service down.
    #[default]
    Open,
    /// Refuse it: `503 Service Unavailable` with `Retry-After: 1` (in
    /// [gRPC](crate::grpc) mode `UNAVAILABLE` with a 1 s pushback), or
    /// [`RateLimitError::Unavailable`](crate::RateLimitError::Unavailable).
    Closed,
    /// Decide it in this process, on an in-memory limiter holding this
    /// share of each limit ([`Policy::scaled`](crate::Policy::scaled); for
    /// concurrency, [`ConcurrencyPolicy::scaled`](crate::ConcurrencyPolicy::scaled)).
    /// Only calls the store failed on go there; the local decision is
    /// answered like any other (rate-limit headers from the scaled policy,
    /// 429 when it denies) and counted as `fallback_allowed` or
    /// `fallback_denied`. Its state is kept per layer (the layer's clones
    /// and routes share it) in a [`MemoryStore`](crate::MemoryStore), so it
    /// stays bounded. Build it with [`FailurePolicy::local`].
    ///
    /// A window policy is decided locally on the same algorithm, each
    /// window as long as before and holding its share of the count. For
    /// every algorithm, the local state knows only the calls decided locally: what Redis admitted
    /// earlier in a window is not counted against the local share, and what
    /// the local limiter admitted is not counted in Redis once it is back.
    Local(LocalShare),
}

impl FailurePolicy {
    /// [`FailurePolicy::Local`] with `share` of each limit; refused unless
    /// `1e-6 <= share <= 1` (see [`LocalShare`]).
    ///
    /// ```
    /// use fleetgate::FailurePolicy;
    ///
    /// // Four instances: each enforces a quarter of the limit while Redis is down.
    /// let policy = FailurePolicy::local(0.25)?;
    /// assert!(FailurePolicy::local(0.0).is_err());
    /// // So small that it would decide nothing: refused, naming the share.
    /// let err = FailurePolicy::local(1e-300).unwrap_err();
    /// assert!(err.to_string().contains("1e-300"));
    /// # Ok::<(), fleetgate::ConfigError>(())
    /// ```
    pub fn local(share: f64) -> Result<Self, ConfigError> {
        LocalShare::new(share).map(FailurePolicy::Local)
    }

    /// [`FailurePolicy::Local`] with one equal share of the fleet as its
    /// heartbeats count it ([`LocalShare::auto`]): with 8 instances seen,
    /// each enforces an eighth of every limit while the store is down.
    pub fn local_auto() -> Self {
        FailurePolicy::Local(LocalShare::auto())
    }
}

/// Marker types choosing how a layer refuses requests: with an HTTP
/// response (the default), or with a typed error. Each layer's docs say
/// which body its HTTP refusals carry.
pub mod mode {
    /// Refuse with an HTTP response (429, 503 or the missing-key status).
    /// The default. A [`RateLimitLayer`](crate::RateLimitLayer) answers in
    /// the inner service's own body type, which must implement
    /// [`RefusalBody`](crate::response::RefusalBody) (axum's `Body`,
    /// `String`, `http_body_util::Full`, ...): responses that pass go out
    /// unwrapped, so axum does not box them again.
    #[derive(Clone, Copy, Debug, Default)]
    pub struct Http;

    /// Refuse with an HTTP response, around inner services whose body
    /// cannot carry a refusal (hyper's `Incoming`, `Empty`):
    /// every response carries a [`ResponseBody`](crate::response::ResponseBody),
    /// the inner body or the refusal's text. Chosen with
    /// [`RateLimitLayer::any_body`](crate::RateLimitLayer::any_body).
    #[derive(Clone, Copy, Debug, Default)]
    pub struct AnyBody;

    /// Refuse with a typed error (the layer's own: [`RateLimitError`](crate::RateLimitError),
    /// [`ConcurrencyLimitError`](crate::ConcurrencyLimitError),
    /// [`ShedError`](crate::shed::ShedError)), for services that are not
    /// HTTP or callers that want an error.
    #[derive(Clone, Copy, Debug, Default)]
    pub struct TypedErrors;
}

/// `status` if it is an error status (4xx or 5xx), as a layer's refusal
/// must be.
pub(crate) fn error_status(status: StatusCode) -> Result<StatusCode, ConfigError> {
    if status.is_client_error() || status.is_server_error() {
        Ok(status)
    } else {
        Err(ConfigError::RejectionStatus { status })
    }
}

/// Logs a store failure at `warn`, at most once a second per process:
/// `<what> store failed`, with the policy, store, error and failure policy.
pub(crate) fn log_store_failure(
    what: &str,
    policy: &str,
    store: &Arc<dyn Store>,
    err: &StoreError,
    failure: FailurePolicy,
) {
    if STORE_WARNINGS.allow() {
        tracing::warn!(
            policy,
            store = store.kind(),
            error = %err,
            failure_policy = ?failure,
            "{what} store failed"
        );
    }
}

/// Under [`FailurePolicy::Local`], shared by every layer: a call the store
/// failed on (`result`) is logged by `log` and decided by `decide` on the
/// local settings `fallback(settings)`, whose memory store answers at once;
/// those settings then answer the request (`settings` is replaced by them).
/// Any other result, or no fallback, passes on unchanged.
pub(crate) fn fall_back_locally<S, T>(
    settings: &mut Arc<S>,
    result: Result<T, StoreError>,
    fallback: impl FnOnce(&S) -> Option<&Arc<S>>,
    log: impl FnOnce(&S, &StoreError),
    decide: impl FnOnce(&S) -> Option<Result<T, StoreError>>,
) -> Result<T, StoreError> {
    let Err(err) = &result else {
        return result;
    };
    let Some(local) = fallback(settings).cloned() else {
        return result;
    };
    log(settings, err);
    let decided = decide(&local).unwrap_or_else(|| {
        Err(StoreError::UnexpectedReply(
            "the local limiter did not decide at once".into(),
        ))
    });
    *settings = local;
    decided
}
