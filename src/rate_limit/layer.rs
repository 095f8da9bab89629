use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;

use bytes::Bytes;
use http::Response;
use tower_layer::Layer;

use super::{Common, FailurePolicy, OnMissingKey, RateLimit, RejectFn, Shared, mode};
use crate::error::ConfigError;
use crate::key::PeerIp;
use crate::limiter::Limiter;
use crate::response::{HeaderStyle, PolicyHeaders, Rejection};

/// Applies a [`Limiter`] to every request of the wrapped service.
///
/// Defaults: key = [`PeerIp`], cost = 1, requests without a key refused
/// with 400, IETF draft headers, enforcing (not shadow), fail open when the
/// store fails, HTTP responses for rejections. Each is changed by one
/// method; see the [module docs](crate::rate_limit) for an example.
///
/// [`PeerIp`] needs the connection's address: serve axum with
/// `into_make_service_with_connect_info::<SocketAddr>()` (or add
/// `MockConnectInfo` in tests), or every request lacks a key and is refused
/// with 400 (logged at `warn`, at most once a second).
#[must_use]
pub struct RateLimitLayer<K = PeerIp, C = u64, M = mode::Http> {
    limiter: Limiter,
    key: K,
    cost: C,
    on_missing: OnMissingKey,
    headers: HeaderStyle,
    shadow: bool,
    failure: FailurePolicy,
    rejection: Option<RejectFn>,
    _mode: PhantomData<fn() -> M>,
}

impl RateLimitLayer {
    /// Limits requests with `limiter`, keyed by peer IP.
    pub fn new(limiter: Limiter) -> Self {
        RateLimitLayer {
            limiter,
            key: PeerIp,
            cost: 1,
            on_missing: OnMissingKey::default(),
            headers: HeaderStyle::default(),
            shadow: false,
            failure: FailurePolicy::default(),
            rejection: None,
            _mode: PhantomData,
        }
    }
}

impl<K, C, M> RateLimitLayer<K, C, M> {
    /// The limiter.
    pub fn limiter(&self) -> &Limiter {
        &self.limiter
    }

    /// Who a request is: any [`KeyExtractor`](crate::key::KeyExtractor).
    pub fn key<K2>(self, key: K2) -> RateLimitLayer<K2, C, M> {
        self.rebuild(|_, cost| (key, cost))
    }

    /// How much a request costs: any [`Cost`](super::Cost), such as a
    /// closure over the request.
    pub fn cost<C2>(self, cost: C2) -> RateLimitLayer<K, C2, M> {
        self.rebuild(|key, _| (key, cost))
    }

    /// A fixed cost per request, refused if no request of that cost could
    /// ever pass the policy.
    pub fn fixed_cost(self, cost: u64) -> Result<RateLimitLayer<K, u64, M>, ConfigError> {
        let max = self.limiter.policy().max_cost();
        if cost > max {
            return Err(ConfigError::CostAboveBurst { cost, max });
        }
        Ok(self.cost(cost))
    }

    /// What to do with requests that carry no key (default: refuse with 400).
    pub fn on_missing_key(mut self, action: OnMissingKey) -> Self {
        self.on_missing = action;
        self
    }

    /// Which rate-limit headers to send (default: the IETF draft pair).
    pub fn headers(mut self, style: HeaderStyle) -> Self {
        self.headers = style;
        self
    }

    /// Shadow mode: decide and record (a `debug` event named
    /// `shadow-denied`), but never refuse (not over a limit, not for a
    /// missing key, not when the store fails), and send no rate-limit
    /// headers. For trying a new limit on live traffic before enforcing it.
    pub fn shadow(mut self, shadow: bool) -> Self {
        self.shadow = shadow;
        self
    }

    /// What to do when the store fails (default: let requests through).
    pub fn on_store_error(mut self, policy: FailurePolicy) -> Self {
        self.failure = policy;
        self
    }

    /// Replaces the rejection response. The function receives the reason
    /// and can start from [`Rejection::default_response`]; its body can be
    /// anything that turns into `Bytes` (`String`, `&'static str`,
    /// `Vec<u8>`, ...).
    pub fn rejection<F, B>(mut self, f: F) -> Self
    where
        F: Fn(&Rejection<'_>) -> Response<B> + Send + Sync + 'static,
        B: Into<Bytes>,
    {
        self.rejection = Some(Arc::new(move |rejection: &Rejection<'_>| {
            f(rejection).map(Into::into)
        }));
        self
    }

    /// Refuse with a [`RateLimitError`](crate::RateLimitError) instead of an
    /// HTTP response; works around any `tower::Service`.
    pub fn typed_errors(self) -> RateLimitLayer<K, C, mode::TypedErrors> {
        self.rebuild(|key, cost| (key, cost))
    }

    /// The same settings with another key, cost or mode type.
    fn rebuild<K2, C2, M2>(self, f: impl FnOnce(K, C) -> (K2, C2)) -> RateLimitLayer<K2, C2, M2> {
        let (key, cost) = f(self.key, self.cost);
        RateLimitLayer {
            limiter: self.limiter,
            key,
            cost,
            on_missing: self.on_missing,
            headers: self.headers,
            shadow: self.shadow,
            failure: self.failure,
            rejection: self.rejection,
            _mode: PhantomData,
        }
    }
}

impl<K: Clone, C: Clone, M> Clone for RateLimitLayer<K, C, M> {
    fn clone(&self) -> Self {
        RateLimitLayer {
            limiter: self.limiter.clone(),
            key: self.key.clone(),
            cost: self.cost.clone(),
            on_missing: self.on_missing.clone(),
            headers: self.headers,
            shadow: self.shadow,
            failure: self.failure,
            rejection: self.rejection.clone(),
            _mode: PhantomData,
        }
    }
}

impl<K, C, M> fmt::Debug for RateLimitLayer<K, C, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitLayer")
            .field("limiter", &self.limiter)
            .field("on_missing", &self.on_missing)
            .field("headers", &self.headers)
            .field("shadow", &self.shadow)
            .field("failure", &self.failure)
            .finish_non_exhaustive()
    }
}

impl<S, K: Clone, C: Clone, M> Layer<S> for RateLimitLayer<K, C, M> {
    type Service = RateLimit<S, K, C, M>;

    fn layer(&self, inner: S) -> Self::Service {
        let common = Common {
            limiter: self.limiter.clone(),
            headers: PolicyHeaders::new(self.limiter.policy(), self.headers),
            on_missing: self.on_missing.clone(),
            shadow: self.shadow,
            failure: self.failure,
            rejection: self.rejection.clone(),
        };
        RateLimit::new(
            inner,
            Arc::new(Shared {
                key: self.key.clone(),
                cost: self.cost.clone(),
                common: Arc::new(common),
            }),
        )
    }
}
