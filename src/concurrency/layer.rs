use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Response, StatusCode};
use tower_layer::Layer;

use super::{
    ConcurrencyLimit, ConcurrencyLimiter, ConcurrencyParts, ConcurrencyRejection,
    ConcurrencySettings, RejectFn,
};
use crate::error::ConfigError;
use crate::key::PeerIp;
use crate::layer::{FailurePolicy, OnMissingKey, error_status, mode};
use crate::metrics::LayerMetrics;
use crate::observe::LimitSource;
use crate::store::MemoryStore;

/// Caps the requests in flight per identity with a [`ConcurrencyLimiter`].
///
/// Defaults: key = [`PeerIp`], requests without a key refused with 400,
/// refusals `429` with `Retry-After: 1`, enforcing (not
/// [shadow](Self::shadow)), fail open when the store fails, HTTP responses
/// for rejections. Each is changed by one method; see the
/// [module docs](crate::concurrency) for an example.
#[must_use]
pub struct ConcurrencyLimitLayer<K = PeerIp, M = mode::Http> {
    limiter: ConcurrencyLimiter,
    key: K,
    on_missing: OnMissingKey,
    failure: FailurePolicy,
    /// Under [`FailurePolicy::Local`]: the local limiter, shared by every
    /// clone of the layer and every service it makes.
    local: Option<ConcurrencyLimiter>,
    status: StatusCode,
    deny_status: StatusCode,
    retry_after: Duration,
    rejection: Option<RejectFn>,
    grpc: bool,
    shadow: bool,
    _mode: PhantomData<fn() -> M>,
}

impl ConcurrencyLimitLayer {
    /// Limits requests with `limiter`, keyed by peer IP.
    pub fn new(limiter: ConcurrencyLimiter) -> Self {
        ConcurrencyLimitLayer {
            limiter,
            key: PeerIp,
            on_missing: OnMissingKey::default(),
            failure: FailurePolicy::default(),
            local: None,
            status: StatusCode::TOO_MANY_REQUESTS,
            deny_status: StatusCode::FORBIDDEN,
            retry_after: Duration::from_secs(1),
            rejection: None,
            grpc: false,
            shadow: false,
            _mode: PhantomData,
        }
    }
}

impl<K, M> ConcurrencyLimitLayer<K, M> {
    /// The limiter.
    pub fn limiter(&self) -> &ConcurrencyLimiter {
        &self.limiter
    }

    /// Who a request is: any [`KeyExtractor`](crate::key::KeyExtractor).
    pub fn key<K2>(self, key: K2) -> ConcurrencyLimitLayer<K2, M> {
        self.rebuild(|_| key)
    }

    /// What to do with requests that carry no key (default: refuse with 400).
    pub fn on_missing_key(mut self, action: OnMissingKey) -> Self {
        self.on_missing = action;
        self
    }

    /// Shadow mode: decide and count, but never refuse or queue, for
    /// trying a new cap on live traffic before enforcing it. A request
    /// with a free slot takes its lease and holds it as usual, so the
    /// counts in flight stay true; one the limit would refuse goes on at
    /// once without a lease (never into the limiter's
    /// [`WaitQueue`](super::WaitQueue)), counted as `shadow_denied` in
    /// [metrics](crate::metrics) and [`observe`](crate::observe) (and among
    /// the identities most denied), with a `debug` event named
    /// `shadow-denied`. Whatever [`on_missing_key`](Self::on_missing_key)
    /// and [`on_store_error`](Self::on_store_error) say, a request without
    /// a key goes on too (counted `shadow_denied`), and so does one the
    /// store failed on (`fail_open`; under [`FailurePolicy::Local`] it
    /// takes a local lease if the local limiter has room, and is
    /// `shadow_denied` if not).
    pub fn shadow(mut self, shadow: bool) -> Self {
        self.shadow = shadow;
        self
    }

    /// What to do when the store fails (default: let requests through,
    /// holding no lease).
    ///
    /// With [`FailurePolicy::Local`], a request the store failed on takes a
    /// lease from an in-memory limiter capped at the given share of the
    /// maximum in flight ([`ConcurrencyPolicy::scaled`](super::ConcurrencyPolicy::scaled));
    /// that lease is given back to the local limiter, never to the store.
    pub fn on_store_error(mut self, policy: FailurePolicy) -> Self {
        self.failure = policy;
        self.local = match policy {
            FailurePolicy::Local(share) => Some(ConcurrencyLimiter::new(
                self.limiter.policy().scaled(share),
                MemoryStore::new(),
            )),
            _ => None,
        };
        self
    }

    /// The status of a refusal for too many in flight (default 429);
    /// refused unless it is a 4xx or 5xx.
    pub fn status(mut self, status: StatusCode) -> Result<Self, ConfigError> {
        self.status = error_status(status)?;
        Ok(self)
    }

    /// The status a request named by a deny list entry is refused with
    /// (default 403), once the limiter is made known to
    /// [`LivePolicies::concurrency`](crate::live::LivePolicies::concurrency);
    /// refused unless it is a 4xx or 5xx. As
    /// [`RateLimitLayer::deny_status`](crate::RateLimitLayer::deny_status).
    pub fn deny_status(mut self, status: StatusCode) -> Result<Self, ConfigError> {
        self.deny_status = error_status(status)?;
        Ok(self)
    }

    /// The `Retry-After` of a refusal for too many in flight (default 1 s;
    /// sent in whole seconds, rounded up).
    pub fn retry_after(mut self, after: Duration) -> Self {
        self.retry_after = after;
        self
    }

    /// Replaces the rejection response. The function receives the reason
    /// and can start from [`ConcurrencyRejection::default_response`].
    pub fn rejection<F, B>(mut self, f: F) -> Self
    where
        F: Fn(&ConcurrencyRejection<'_>) -> Response<B> + Send + Sync + 'static,
        B: Into<Bytes>,
    {
        self.rejection = Some(Arc::new(move |rejection: &ConcurrencyRejection<'_>| {
            f(rejection).map(Into::into)
        }));
        self
    }

    /// gRPC mode, for tonic servers: a refusal is an HTTP 200
    /// trailers-only response with `grpc-status` `RESOURCE_EXHAUSTED`
    /// (`UNAVAILABLE` when the store is down and the layer fails closed)
    /// and the retry hints gRPC clients read; see
    /// [`ConcurrencyRejection::grpc_response`] and the
    /// [gRPC guide](crate::grpc). A streaming call holds its lease until
    /// its response stream ends or is dropped, as an HTTP body does. A
    /// custom [`rejection`](Self::rejection) still replaces the refusal.
    /// Give the layer only gRPC traffic: it does not look at
    /// `content-type`.
    pub fn grpc(mut self) -> Self {
        self.grpc = true;
        self
    }

    /// Refuse with a [`ConcurrencyLimitError`](super::ConcurrencyLimitError)
    /// instead of an HTTP response; works around any `tower::Service`. The
    /// lease is then held until the response future resolves.
    pub fn typed_errors(self) -> ConcurrencyLimitLayer<K, mode::TypedErrors> {
        self.rebuild(|key| key)
    }

    fn rebuild<K2, M2>(self, f: impl FnOnce(K) -> K2) -> ConcurrencyLimitLayer<K2, M2> {
        ConcurrencyLimitLayer {
            limiter: self.limiter,
            key: f(self.key),
            on_missing: self.on_missing,
            failure: self.failure,
            local: self.local,
            status: self.status,
            deny_status: self.deny_status,
            retry_after: self.retry_after,
            rejection: self.rejection,
            grpc: self.grpc,
            shadow: self.shadow,
            _mode: PhantomData,
        }
    }
}

impl<K: Clone, M> Clone for ConcurrencyLimitLayer<K, M> {
    fn clone(&self) -> Self {
        ConcurrencyLimitLayer {
            limiter: self.limiter.clone(),
            key: self.key.clone(),
            on_missing: self.on_missing.clone(),
            failure: self.failure,
            local: self.local.clone(),
            status: self.status,
            deny_status: self.deny_status,
            retry_after: self.retry_after,
            rejection: self.rejection.clone(),
            grpc: self.grpc,
            shadow: self.shadow,
            _mode: PhantomData,
        }
    }
}

impl<K, M> fmt::Debug for ConcurrencyLimitLayer<K, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConcurrencyLimitLayer")
            .field("limiter", &self.limiter)
            .field("on_missing", &self.on_missing)
            .field("failure", &self.failure)
            .field("status", &self.status)
            .field("deny_status", &self.deny_status)
            .field("retry_after", &self.retry_after)
            .field("grpc", &self.grpc)
            .field("shadow", &self.shadow)
            .finish_non_exhaustive()
    }
}

impl<K, M> ConcurrencyLimitLayer<K, M> {
    /// The settings deciding with `limiter`: the layer's own, with their
    /// `fallback` if any, or (`local`) those of a local fallback.
    fn settings(
        &self,
        limiter: ConcurrencyLimiter,
        metrics: LayerMetrics,
        fallback: Option<Arc<ConcurrencySettings>>,
        local: bool,
    ) -> Arc<ConcurrencySettings> {
        Arc::new(ConcurrencySettings {
            limiter,
            on_missing: self.on_missing.clone(),
            // The local limiter's memory store cannot fail; should it
            // ever, the request passes.
            failure: if local {
                FailurePolicy::Open
            } else {
                self.failure
            },
            status: self.status,
            deny_status: self.deny_status,
            retry_after: self.retry_after,
            rejection: self.rejection.clone(),
            grpc: self.grpc,
            shadow: self.shadow,
            metrics,
            fallback,
            local,
        })
    }
}

impl<S, K: Clone, M> Layer<S> for ConcurrencyLimitLayer<K, M> {
    type Service = ConcurrencyLimit<S, K, M>;

    fn layer(&self, inner: S) -> Self::Service {
        let metrics = LayerMetrics::new("concurrency", self.limiter.policy().name_arc());
        metrics
            .observed()
            .leases(self.limiter.policy().max_in_flight());
        let fallback = self
            .local
            .as_ref()
            .map(|local| self.settings(local.clone(), metrics.clone(), None, true));
        let settings = self.settings(self.limiter.clone(), metrics, fallback, false);
        let source: Arc<dyn LimitSource> = settings.clone();
        settings
            .metrics
            .observed()
            .limit_source(Arc::downgrade(&source));
        ConcurrencyLimit::new(
            inner,
            Arc::new(ConcurrencyParts {
                key: self.key.clone(),
                settings,
            }),
        )
    }
}
