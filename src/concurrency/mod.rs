//! [`ConcurrencyLimitLayer`]: at most N requests in flight per identity,
//! across the whole fleet.
//!
//! Each admitted request holds a lease in the store (a Redis sorted set per
//! identity, or the in-process [`MemoryStore`](crate::MemoryStore)): one
//! script to take it, one to give it back, which under load go together
//! with other requests' in one script (see
//! [`RedisStoreBuilder::max_in_flight`](crate::RedisStoreBuilder::max_in_flight)). The lease is held until the
//! response body has been sent to its end or dropped, not merely until the
//! handler returns, so a streaming response counts for as long as it
//! streams. It is also given back when the request future is dropped (the
//! client went away, a timeout layer outside gave up) and when the handler
//! panics. Long responses renew their lease before it expires; a lease
//! whose instance crashed frees its slot after the lease TTL.
//!
//! ```
//! use std::time::Duration;
//! use axum::{routing::get, Router};
//! use fleetgate::concurrency::{ConcurrencyLimitLayer, ConcurrencyLimiter, ConcurrencyPolicy};
//! use fleetgate::key::{ExtensionKey, PeerIp};
//! use fleetgate::MemoryStore;
//!
//! /// Put in the request by your authentication layer.
//! #[derive(Clone)]
//! struct Account(u64);
//! impl std::fmt::Display for Account {
//!     fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result { self.0.fmt(f) }
//! }
//!
//! # fn main() -> Result<(), fleetgate::ConfigError> {
//! // Two reports per account at a time (per client IP without one),
//! // fleet-wide with a RedisStore.
//! let policy = ConcurrencyPolicy::builder("reports", 2)
//!     .lease_ttl(Duration::from_secs(30))
//!     .build()?;
//! let app: Router = Router::new()
//!     .route("/api/report", get(|| async { "report" }))
//!     .route_layer(
//!         ConcurrencyLimitLayer::new(ConcurrencyLimiter::new(policy, MemoryStore::new()))
//!             .key(ExtensionKey::<Account>::new("account").or(PeerIp)),
//!     );
//! # Ok(()) }
//! ```
//!
//! Refusals are `429 Too Many Requests` with `Retry-After: 1` (both
//! configurable); [`ConcurrencyLimitLayer::typed_errors`] turns them into a
//! [`ConcurrencyLimitError`] for services that are not HTTP, where the
//! lease is held until the response future resolves (there is no body to
//! follow). Key extraction, missing keys and store failures work as in
//! [`RateLimitLayer`](crate::RateLimitLayer): the same extractors,
//! [`OnMissingKey`] and [`FailurePolicy`]. Under
//! [`FailurePolicy::Local`], a request the store failed on takes a lease
//! from an in-process limiter capped at that share of the maximum (rounded
//! down, at least 1), and gives it back there.
//!
//! | situation | what happens |
//! |---|---|
//! | a slot is free | a lease (unique id, expiry = now + TTL) is recorded in one round trip and held until the response body has been sent to its end or dropped |
//! | too many in flight | `429` ([`.status(..)`](ConcurrencyLimitLayer::status) to change it) with `Retry-After: 1` ([`.retry_after(..)`](ConcurrencyLimitLayer::retry_after)); [`.typed_errors()`](ConcurrencyLimitLayer::typed_errors) gives [`ConcurrencyLimitError::InFlight`] instead |
//! | client disconnects, timeout layer outside, handler panics | the request future or body is dropped and the lease released |
//! | long response (stream, SSE) | the lease is renewed every TTL/3 ([`ConcurrencyPolicyBuilder::renew_every`], [`ConcurrencyPolicyBuilder::no_renewal`]) until the body ends |
//! | instance crashes | its leases expire after the TTL (default 30 s) |
//! | shadow mode ([`.shadow(true)`](ConcurrencyLimitLayer::shadow)) | nothing is refused or queued: an admitted request takes its lease as above, one that would be refused goes on without one, counted as `shadow_denied` (metrics, [`observe`](crate::observe)) |
//! | Redis slow or down at release, connection reset | the release is sent when the body ends and awaited on a spawned task, never delaying the response; a failed release is retried until it lands or the lease's TTL passes (see [`lease`](crate::lease)); [`ConcurrencyLimiter::releases_settled`] waits for pending releases (on shutdown) |
//!
//! # Adaptive limits and waiting for a slot
//!
//! [`ConcurrencyLimiter::adaptive`] replaces the fixed maximum by an
//! [`AdaptiveLimit`] that finds what the service behind the layer can
//! take from the latency of its calls (Gradient2 or AIMD; this process's
//! own limit, no store round trip); see the [`AdaptiveLimit`] docs for
//! what counts as a sample. [`ConcurrencyLimiter::queue`] lets a call that
//! finds every slot taken wait for one, on fixed and adaptive limits
//! alike ([`WaitQueue`]: FIFO or LIFO, a bounded length and wait; a caller
//! that waits it out gets the layer's refusal and `Retry-After`, one
//! whose request is dropped leaves at once). The shedders can follow an
//! adaptive limit: [`UtilizationShedder::limit`](crate::shed::UtilizationShedder::limit)
//! for this process, [`FleetShedder::capacity_from`](crate::shed::FleetShedder::capacity_from)
//! with [`LivePolicies::fleet_limit`](crate::live::LivePolicies::fleet_limit)
//! for the fleet.
//!
//! ```
//! use std::time::Duration;
//! use axum::{routing::get, Router};
//! use fleetgate::concurrency::{AdaptiveLimit, ConcurrencyLimitLayer, ConcurrencyLimiter, WaitQueue};
//! use fleetgate::key::GlobalKey;
//! use http::StatusCode;
//!
//! # fn main() -> Result<(), fleetgate::ConfigError> {
//! // One limit for the whole route, between 2 and 200 in flight; under
//! // overload the newest 16 callers wait up to 20 ms, the rest get 503.
//! let limit = AdaptiveLimit::gradient2().min(2).max(200).build()?;
//! let limiter = ConcurrencyLimiter::adaptive("backend", limit)?
//!     .queue(WaitQueue::lifo(16, Duration::from_millis(20))?);
//! let app: Router = Router::new()
//!     .route("/api/search", get(|| async { "results" }))
//!     .route_layer(
//!         ConcurrencyLimitLayer::new(limiter)
//!             .key(GlobalKey::new())
//!             .status(StatusCode::SERVICE_UNAVAILABLE)?,
//!     );
//! # Ok(()) }
//! ```
//!
//! In Redis, leases live in a sorted set per identity,
//! `fleetgate:<policy>:{<identity>}:lease` (member = lease id, score =
//! expiry in microseconds, Redis server time); the set expires with its
//! last lease. The building blocks ([`LeaseGuard`],
//! [`GuardedBody`]) work with anything that can
//! be released and renewed.
//!
//! Use `Router::route_layer` to limit only matched routes and
//! `Router::layer` to limit everything that reaches the router. Every
//! service clone axum makes shares one limit: the state is in the store.

mod adaptive;
mod admit;
mod error;
mod fleet_limit;
mod future;
mod layer;
mod limiter;
mod policy;
mod queue;
mod rejection;
mod service;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Response, StatusCode};

pub use self::adaptive::{AdaptiveLimit, AdaptiveLimitBuilder, AdaptiveState};
pub use self::error::ConcurrencyLimitError;
pub use self::fleet_limit::FleetLimit;
pub use self::layer::ConcurrencyLimitLayer;
pub use self::limiter::{Admission, ConcurrencyLimiter};
pub use self::policy::{ConcurrencyPolicy, ConcurrencyPolicyBuilder};
pub use self::queue::{QueueOrder, QueueState, WaitQueue};
pub use self::rejection::{ConcurrencyRejection, ConcurrencyRejectionKind};
pub use self::service::ConcurrencyLimit;

pub(crate) use self::admit::{Admitting, Gate};
use self::future::ResponseFuture;
pub(crate) use self::limiter::Acquire;

use crate::error::StoreError;
use crate::key::Key;
use crate::layer::{FailurePolicy, OnMissingKey, fall_back_locally, log_store_failure};
use crate::lease::{GuardedBody, LeaseGuard, StoreLease};
use crate::lists::Verdict as ListVerdict;
use crate::log::{decision_span, warn_missing_key};
use crate::metrics::LayerMetrics;
use crate::observe::LimitSource;
use crate::outcome::Outcome;
use crate::response::ResponseBody;

/// The response body of a [`ConcurrencyLimit`] service: the inner body
/// holding the request's lease until it ends, or a rejection's text.
pub(crate) type ConcurrencyBody<B> = GuardedBody<ResponseBody<B>, StoreLease>;

pub(crate) type RejectFn = Arc<dyn Fn(&ConcurrencyRejection<'_>) -> Response<Bytes> + Send + Sync>;

/// Settings every clone of a service and every response future shares.
pub(crate) struct ConcurrencySettings {
    pub(crate) limiter: ConcurrencyLimiter,
    pub(crate) on_missing: OnMissingKey,
    pub(crate) failure: FailurePolicy,
    pub(crate) status: StatusCode,
    /// The status of a refusal by a deny list entry.
    pub(crate) deny_status: StatusCode,
    pub(crate) retry_after: Duration,
    pub(crate) rejection: Option<RejectFn>,
    /// Refusals are gRPC statuses ([`ConcurrencyLimitLayer::grpc`]).
    pub(crate) grpc: bool,
    /// Shadow mode ([`ConcurrencyLimitLayer::shadow`]): a request the
    /// limit refuses goes on without a lease, only counted.
    pub(crate) shadow: bool,
    pub(crate) metrics: LayerMetrics,
    /// With [`FailurePolicy::Local`]: the settings of the local limiter
    /// that decides the requests the store failed on.
    pub(crate) fallback: Option<Arc<ConcurrencySettings>>,
    /// Whether these are a local fallback's settings: outcomes are counted
    /// as `fallback_*`.
    pub(crate) local: bool,
}

/// What a service's clones share: the key extractor and the settings.
pub(crate) struct ConcurrencyParts<K> {
    pub(crate) key: K,
    pub(crate) settings: Arc<ConcurrencySettings>,
}

impl ConcurrencySettings {
    /// Under [`FailurePolicy::Local`], takes a local lease for a request
    /// the store failed on (released to the local store when the request
    /// ends); the local settings then answer the request: `settings` is
    /// replaced by them. Any other result is passed on. `key` is kept by
    /// the caller whenever a fallback is configured.
    pub(crate) fn fall_back(
        settings: &mut Arc<ConcurrencySettings>,
        result: Result<Admission, StoreError>,
        key: Option<&Key>,
    ) -> Result<Admission, StoreError> {
        let Some(key) = key else {
            return result;
        };
        fall_back_locally(
            settings,
            result,
            |c| c.fallback.as_ref(),
            ConcurrencySettings::log_failure,
            |local| local.limiter.acquire(key).take_ready(),
        )
    }

    fn log_failure(&self, err: &StoreError) {
        let policy = self.limiter.policy().name();
        let store = self.limiter.store();
        log_store_failure("concurrency-limit", policy, store, err, self.failure);
    }

    /// What to do with the store's answer: pass (holding the lease, if one
    /// was taken) or refuse. In shadow mode nothing is refused: a request
    /// the limit refuses, or the store failed on, passes without a lease.
    /// `latency` is the store's, when it did I/O; a refusal is counted
    /// against `key` in `observe`'s most denied.
    pub(crate) fn judge(
        &self,
        result: Result<Admission, StoreError>,
        latency: Option<Duration>,
        key: Option<&Key>,
    ) -> Result<Option<LeaseGuard<StoreLease>>, ConcurrencyRejectionKind> {
        let span = decision_span("concurrency", self.limiter.policy().name(), None, latency);
        let _entered = span.enter();
        let (outcome, verdict) = match result {
            Ok(Admission::Acquired(guard)) => {
                if let Some(lease) = guard.lease() {
                    lease.count_in(self.metrics.observed());
                }
                let outcome = Outcome::Allowed.by_fallback(self.local);
                self.metrics.decided(outcome, false);
                span.record("outcome", outcome.as_str());
                return Ok(Some(guard));
            }
            Ok(Admission::Refused(grant)) => {
                if let Some(key) = key {
                    self.metrics.denied(key);
                }
                let policy = self.limiter.policy().name();
                let in_flight = grant.in_flight();
                if self.shadow {
                    tracing::debug!(policy, in_flight, "shadow-denied");
                    (Outcome::ShadowDenied, Ok(None))
                } else {
                    tracing::debug!(policy, in_flight, "too many in flight");
                    let outcome = Outcome::Denied.by_fallback(self.local);
                    (outcome, Err(ConcurrencyRejectionKind::InFlight(grant)))
                }
            }
            Err(err) => {
                self.log_failure(&err);
                match self.failure {
                    FailurePolicy::Closed if !self.shadow => (
                        Outcome::FailClosed,
                        Err(ConcurrencyRejectionKind::Unavailable(err)),
                    ),
                    // `Local` reaches here only if its own store failed;
                    // shadow mode fails open whatever the policy.
                    _ => (Outcome::FailOpen, Ok(None)),
                }
            }
        };
        self.metrics.decided(outcome, false);
        span.record("outcome", outcome.as_str());
        verdict
    }

    /// A request without a key, refused with `status` (or, in shadow mode,
    /// let through without a lease: `None`), in a decision span of its own.
    pub(crate) fn missing_key(&self, status: StatusCode) -> Option<ConcurrencyRejectionKind> {
        let kind = ConcurrencyRejectionKind::MissingKey(status);
        self.refuse_undecided(kind, Outcome::MissingKey)
    }

    /// A request whose key a list entry names, decided without a lease: a
    /// deny entry refuses with the deny status, or in shadow mode lets it
    /// on (`None`); an allow entry lets it on, counted.
    #[inline(never)]
    pub(crate) fn listed(&self, verdict: ListVerdict) -> Option<ConcurrencyRejectionKind> {
        let ListVerdict::Deny(retry_after) = verdict else {
            self.metrics.decided(Outcome::AllowListed, false);
            return None;
        };
        let kind = ConcurrencyRejectionKind::DenyListed {
            status: self.deny_status,
            retry_after,
        };
        self.refuse_undecided(kind, Outcome::DenyListed)
    }

    /// A refusal made without the limiter (`kind`, counted as `outcome`),
    /// in a decision span of its own: the rejection, or in shadow mode
    /// `None`, counted `shadow_denied`.
    fn refuse_undecided(
        &self,
        kind: ConcurrencyRejectionKind,
        outcome: Outcome,
    ) -> Option<ConcurrencyRejectionKind> {
        let policy = self.limiter.policy().name();
        let span = decision_span("concurrency", policy, None, None);
        let _entered = span.enter();
        if let ConcurrencyRejectionKind::MissingKey(_) = kind {
            warn_missing_key("concurrency-limit", policy);
        }
        let outcome = if self.shadow {
            Outcome::ShadowDenied
        } else {
            outcome
        };
        span.record("outcome", outcome.as_str());
        self.metrics.decided(outcome, false);
        if self.shadow {
            tracing::debug!(policy, reason = ?kind, "shadow-denied");
            return None;
        }
        Some(kind)
    }

    pub(crate) fn rejection(&self, kind: ConcurrencyRejectionKind) -> Response<Bytes> {
        let rejection = ConcurrencyRejection {
            kind,
            policy: self.limiter.policy(),
            status: self.status,
            retry_after: self.retry_after,
        };
        match &self.rejection {
            Some(custom) => custom(&rejection),
            None if self.grpc => rejection.grpc_response(),
            None => rejection.default_response(),
        }
    }

    pub(crate) fn error(&self, kind: ConcurrencyRejectionKind) -> ConcurrencyLimitError {
        match kind {
            ConcurrencyRejectionKind::InFlight(_) => ConcurrencyLimitError::InFlight {
                limit: self.limiter.policy().name().to_owned(),
                max_in_flight: self.limiter.policy().max_in_flight(),
            },
            ConcurrencyRejectionKind::MissingKey(_) => ConcurrencyLimitError::MissingKey,
            ConcurrencyRejectionKind::DenyListed { retry_after, .. } => {
                ConcurrencyLimitError::Denied { retry_after }
            }
            ConcurrencyRejectionKind::Unavailable(err) => {
                ConcurrencyLimitError::Unavailable(err.to_string())
            }
        }
    }
}

impl LimitSource for ConcurrencySettings {
    fn limit(&self) -> u64 {
        self.limiter.limit()
    }

    fn adaptive(&self) -> Option<AdaptiveState> {
        self.limiter.adaptive_state()
    }

    fn queue(&self) -> Option<QueueState> {
        self.limiter.queue_state()
    }
}
