//! [`RateLimitLayer`]: limits requests per key with a [`Limiter`].
//!
//! ```
//! use axum::{routing::get, Router};
//! use fleetgate::key::{HeaderKey, PeerIp};
//! use fleetgate::{Limit, Limiter, MemoryStore, Policy, Rate, RateLimitLayer};
//!
//! # fn main() -> Result<(), fleetgate::ConfigError> {
//! let policy = Policy::single("api", Limit::builder(Rate::per_second(10)).burst(20).build()?)?;
//! let app: Router = Router::new()
//!     .route("/api/orders", get(|| async { "orders" }))
//!     .layer(
//!         RateLimitLayer::new(Limiter::new(policy, MemoryStore::new()))
//!             // per API key, falling back to the client address
//!             .key(HeaderKey::new("x-api-key").or(PeerIp)),
//!     );
//! # Ok(()) }
//! ```
//!
//! `Router::layer` limits every request that reaches the router, unknown
//! paths included; `Router::route_layer` limits only requests that match a
//! route, so 404s cost nothing. The layer's state lives in the store, not in
//! the service, so the clones axum makes per request all share one limit.
//!
//! Around services that are not HTTP (or when you would rather have an
//! error than a 429 response), call [`RateLimitLayer::typed_errors`]: the
//! service then fails with a [`RateLimitError`](crate::RateLimitError).

mod future;
mod layer;
mod service;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use bytes::Bytes;
use http::{Response, StatusCode};

pub use self::future::ResponseFuture;
pub use self::layer::RateLimitLayer;
pub use self::service::RateLimit;

use crate::decision::Decision;
use crate::error::StoreError;
use crate::key::Key;
use crate::limiter::Limiter;
use crate::response::{PolicyHeaders, Rejection, RejectionKind};

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
    /// Refuse it: `503 Service Unavailable` with `Retry-After: 1`, or
    /// [`RateLimitError::Unavailable`](crate::RateLimitError::Unavailable).
    Closed,
}

/// How much of the limit a request uses. A plain `u64` is a fixed cost; a
/// closure `Fn(&Req) -> u64` weighs each request.
///
/// A cost above the policy's smallest burst can never pass: such requests
/// are refused without a store round trip and without `Retry-After`.
pub trait Cost<Req>: Send + Sync + 'static {
    /// The cost of `req`.
    fn cost(&self, req: &Req) -> u64;
}

impl<Req> Cost<Req> for u64 {
    fn cost(&self, _req: &Req) -> u64 {
        *self
    }
}

impl<Req, F> Cost<Req> for F
where
    F: Fn(&Req) -> u64 + Send + Sync + 'static,
{
    fn cost(&self, req: &Req) -> u64 {
        self(req)
    }
}

/// Marker types choosing how a [`RateLimitLayer`] refuses requests.
pub mod mode {
    /// Refuse with an HTTP response (429, 503 or the missing-key status).
    #[derive(Clone, Copy, Debug, Default)]
    pub struct Http;

    /// Refuse with a [`RateLimitError`](crate::RateLimitError), for
    /// services that are not HTTP or callers that want an error.
    #[derive(Clone, Copy, Debug, Default)]
    pub struct TypedErrors;
}

pub(crate) type RejectFn = Arc<dyn Fn(&Rejection<'_>) -> Response<Bytes> + Send + Sync>;

/// Settings every clone of a service and every response future shares.
pub(crate) struct Common {
    pub(crate) limiter: Limiter,
    pub(crate) headers: PolicyHeaders,
    pub(crate) on_missing: OnMissingKey,
    pub(crate) shadow: bool,
    pub(crate) failure: FailurePolicy,
    pub(crate) rejection: Option<RejectFn>,
}

/// Store failures are logged at most once a second per process.
pub(crate) static STORE_WARNINGS: LogGate = LogGate::new();
/// Requests without a key likewise.
pub(crate) static KEY_WARNINGS: LogGate = LogGate::new();

impl Common {
    /// What to do with the store's answer: pass (with the decision whose
    /// headers to send, if any) or refuse. Shadow mode and the failure
    /// policy are applied here.
    pub(crate) fn judge(
        &self,
        result: Result<Decision, StoreError>,
    ) -> Result<Option<Decision>, RejectionKind> {
        let refusal = match result {
            Ok(d) if d.is_allowed() => return Ok(Some(d)),
            Ok(d) => RejectionKind::Limited(d),
            Err(err) => {
                if STORE_WARNINGS.allow() {
                    tracing::warn!(
                        policy = self.limiter.policy().name(),
                        store = self.limiter.store().kind(),
                        error = %err,
                        failure_policy = ?self.failure,
                        "rate-limit store failed"
                    );
                }
                match self.failure {
                    FailurePolicy::Closed => RejectionKind::Unavailable(err),
                    FailurePolicy::Open => return Ok(None),
                }
            }
        };
        match self.refuse(refusal) {
            Some(kind) => Err(kind),
            None => Ok(None),
        }
    }

    /// The rejection to send, or `None` in shadow mode, where the would-be
    /// rejection is only logged and the request goes through.
    pub(crate) fn refuse(&self, kind: RejectionKind) -> Option<RejectionKind> {
        let policy = self.limiter.policy().name();
        if let RejectionKind::MissingKey(_) = kind {
            if KEY_WARNINGS.allow() {
                tracing::warn!(
                    policy,
                    "no rate-limit key in the request; when keying by peer IP, serve with \
                     into_make_service_with_connect_info::<SocketAddr>()"
                );
            }
        }
        if self.shadow {
            tracing::debug!(policy, reason = ?kind, "shadow-denied");
            return None;
        }
        if let RejectionKind::Limited(d) = &kind {
            tracing::debug!(policy, retry_after = ?d.retry_after(), "denied");
        }
        Some(kind)
    }

    pub(crate) fn rejection(&self, kind: RejectionKind) -> Response<Bytes> {
        let rejection = Rejection {
            kind,
            policy: self.limiter.policy(),
            headers: &self.headers,
        };
        match &self.rejection {
            Some(custom) => custom(&rejection),
            None => rejection.default_response(),
        }
    }
}

/// Lets one log line through per second, so that a failing store cannot
/// flood the logs.
#[derive(Debug)]
pub(crate) struct LogGate {
    last_ms: AtomicU64,
}

impl LogGate {
    pub(crate) const fn new() -> Self {
        LogGate {
            last_ms: AtomicU64::new(0),
        }
    }

    pub(crate) fn allow(&self) -> bool {
        static START: OnceLock<Instant> = OnceLock::new();
        let now_ms = u64::try_from(START.get_or_init(Instant::now).elapsed().as_millis())
            .unwrap_or(u64::MAX)
            .saturating_add(1000);
        let last = self.last_ms.load(Ordering::Relaxed);
        now_ms.saturating_sub(last) >= 1000
            && self
                .last_ms
                .compare_exchange(last, now_ms, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
    }
}

/// What a service's clones share: the key extractor, the cost and the
/// settings.
pub(crate) struct Shared<K, C> {
    pub(crate) key: K,
    pub(crate) cost: C,
    pub(crate) common: Arc<Common>,
}
