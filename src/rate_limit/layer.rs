use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::Response;
use tower_layer::Layer;

use super::routes::RoutePolicies;
use super::{FailurePolicy, NoFeedback, OnMissingKey, RateLimit, RateLimitParts, mode};
use super::{LiveSettings, Recipe, ResponseCost, Routes};
use crate::error::ConfigError;
use crate::key::PeerIp;
use crate::limiter::Limiter;
use crate::response::{HeaderStyle, Rejection};
use crate::store::MemoryStore;

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
///
/// Around a client, [`wait_up_to`](Self::wait_up_to) makes the layer wait
/// for a slot instead of refusing, and
/// [`upstream_feedback`](Self::upstream_feedback) lets the upstream's own
/// 429s pause the fleet; see [Waiting for a slot](crate::rate_limit#waiting-for-a-slot-outbound-clients).
#[must_use]
pub struct RateLimitLayer<K = PeerIp, C = u64, M = mode::Http, F = NoFeedback> {
    limiter: Limiter,
    key: K,
    cost: C,
    /// Every other setting, in the one value each limiter's settings are
    /// made from (and rebuilt from on a live change).
    recipe: Recipe,
    feedback: F,
    routes: Option<Arc<RoutePolicies>>,
    _mode: PhantomData<fn() -> M>,
}

impl RateLimitLayer {
    /// Limits requests with `limiter`, keyed by peer IP.
    pub fn new(limiter: Limiter) -> Self {
        RateLimitLayer {
            limiter,
            key: PeerIp,
            cost: 1,
            recipe: Recipe::default(),
            feedback: NoFeedback,
            routes: None,
            _mode: PhantomData,
        }
    }

    /// Limits each route of a router by its own policy (see
    /// [`RoutePolicies`]), keyed by peer IP; every other setting applies to
    /// all of them. Refused when the table has neither rules nor a default.
    pub fn per_route(routes: RoutePolicies) -> Result<Self, ConfigError> {
        let Some(first) = routes.limiters().next().cloned() else {
            return Err(ConfigError::EmptyRoutes);
        };
        let mut layer = RateLimitLayer::new(first);
        layer.routes = Some(Arc::new(routes));
        Ok(layer)
    }
}

impl<K, C, M, Fb> RateLimitLayer<K, C, M, Fb> {
    /// The limiter (with [`per_route`](RateLimitLayer::per_route), the
    /// first of the table).
    pub fn limiter(&self) -> &Limiter {
        &self.limiter
    }

    /// Who a request is: any [`KeyExtractor`](crate::key::KeyExtractor).
    pub fn key<K2>(self, key: K2) -> RateLimitLayer<K2, C, M, Fb> {
        self.rebuild(|_, cost, feedback| (key, cost, feedback))
    }

    /// How much a request costs: a fixed `u64`, or a closure
    /// `Fn(&Req) -> u64` that weighs each request. A cost above the
    /// policy's smallest burst can never pass: such requests are refused
    /// without a store round trip and without `Retry-After`.
    pub fn cost<C2>(self, cost: C2) -> RateLimitLayer<K, C2, M, Fb> {
        self.rebuild(|key, _, feedback| (key, cost, feedback))
    }

    /// A fixed cost per request, refused if no request of that cost could
    /// ever pass the policy.
    pub fn fixed_cost(self, cost: u64) -> Result<RateLimitLayer<K, u64, M, Fb>, ConfigError> {
        let max = match &self.routes {
            Some(routes) => routes
                .limiters()
                .map(|l| l.policy().max_cost())
                .min()
                .unwrap_or(0),
            None => self.limiter.policy().max_cost(),
        };
        if cost > max {
            return Err(ConfigError::CostAboveBurst { cost, max });
        }
        Ok(self.cost(cost))
    }

    /// What to do with requests that carry no key (default: refuse with 400).
    pub fn on_missing_key(mut self, action: OnMissingKey) -> Self {
        self.recipe.on_missing = action;
        self
    }

    /// Which rate-limit headers to send (default: the IETF draft pair).
    pub fn headers(mut self, style: HeaderStyle) -> Self {
        self.recipe.headers = style;
        self
    }

    /// Shadow mode: decide and record (a `debug` event named
    /// `shadow-denied`), but never refuse (not over a limit, not for a
    /// missing key or a deny list entry, not when the store fails), and
    /// send no rate-limit headers. For trying a new limit on live traffic
    /// before enforcing it. A penalty box's blocks are the store's and
    /// still start ([`LimitBuilder::block_for`](crate::LimitBuilder::block_for)
    /// says what that means).
    pub fn shadow(mut self, shadow: bool) -> Self {
        self.recipe.shadow = shadow;
        self
    }

    /// The status a request named by a deny list entry
    /// ([`LivePolicies::deny`](crate::live::LivePolicies::deny)) is
    /// refused with: 403 by default, or 429 to look rate limited (with
    /// `Retry-After` counting down to the entry's end, if it has one);
    /// refused unless it is a 4xx or 5xx. In gRPC mode it is mapped as a
    /// missing key's status is (403 is `PERMISSION_DENIED`, 429
    /// `RESOURCE_EXHAUSTED`).
    pub fn deny_status(mut self, status: http::StatusCode) -> Result<Self, ConfigError> {
        self.recipe.deny_status = Some(crate::layer::error_status(status)?);
        Ok(self)
    }

    /// What to do when the store fails (default: let requests through).
    ///
    /// With [`FailurePolicy::Local`], a call the store failed on is decided
    /// by an in-memory limiter holding the given share of each limit
    /// ([`Policy::scaled`](crate::Policy::scaled)), with the layer's other
    /// settings: the same key, cost and headers style; in waiting mode it
    /// reserves a local slot and sleeps until it; in shadow mode its
    /// denials are only counted. A denial held in a Redis store's deny
    /// cache is still answered from there: only calls that reached the
    /// store and failed are decided locally. Upstream feedback on such a
    /// call pauses the key in the local limiter.
    pub fn on_store_error(mut self, policy: FailurePolicy) -> Self {
        self.recipe.failure = policy;
        self.recipe.local = match policy {
            FailurePolicy::Local(_) => Some(MemoryStore::new()),
            _ => None,
        };
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
        self.recipe.rejection = Some(Arc::new(move |rejection: &Rejection<'_>| {
            f(rejection).map(Into::into)
        }));
        self
    }

    /// gRPC mode, for tonic servers (and clients): refusals are gRPC
    /// statuses, not 429 or 503 responses, which gRPC clients take for a
    /// broken transport. A refusal is an HTTP 200 trailers-only response
    /// with `grpc-status` `RESOURCE_EXHAUSTED` when a limit denied
    /// (`UNAVAILABLE` when the store is down and the layer fails closed),
    /// `grpc-retry-pushback-ms` and a `google.rpc.RetryInfo`; see
    /// [`Rejection::grpc_response`] and the [gRPC guide](crate::grpc).
    /// Calls that pass keep their rate-limit headers, which gRPC clients
    /// read as response metadata. A custom [`rejection`](Self::rejection)
    /// still replaces the refusal (it can start from
    /// [`Rejection::grpc_response`]); in typed-error mode there is no
    /// response and this changes nothing.
    ///
    /// Every request the layer sees is answered this way: give it only
    /// gRPC traffic (a tonic `Server::builder().layer(..)`, or the gRPC
    /// routes of a mixed router). It does not look at `content-type`, so
    /// a refusal's shape never depends on what a client claims to be.
    pub fn grpc(mut self) -> Self {
        self.recipe.grpc = true;
        self
    }

    /// Refuse with an HTTP response wrapped in a
    /// [`ResponseBody`](crate::response::ResponseBody), for inner services
    /// whose body type cannot carry a refusal (hyper's `Incoming`, `Empty`,
    /// another crate's body wrapper). By default the layer answers in the
    /// inner service's own body type, which must implement
    /// [`RefusalBody`](crate::response::RefusalBody) (axum's `Body`,
    /// `String`, `http_body_util::Full` and boxed bodies do), so that a
    /// response that passes is handed on unwrapped.
    pub fn any_body(self) -> RateLimitLayer<K, C, mode::AnyBody, Fb> {
        self.rebuild(|key, cost, feedback| (key, cost, feedback))
    }

    /// Refuse with a [`RateLimitError`](crate::RateLimitError) instead of an
    /// HTTP response; works around any `tower::Service`.
    ///
    /// Not on an axum `Router` as it is: axum takes only services that
    /// never fail, so `Router::layer` refuses one whose error is a
    /// [`BoxError`](crate::BoxError), with "the trait bound `Infallible:
    /// From<Box<dyn std::error::Error + Send + Sync>>` is not satisfied".
    /// In a router, leave `typed_errors()` out (refusals are then 429, 400
    /// or 503 responses), or turn the error into a response in front of
    /// it with axum's `HandleErrorLayer`.
    ///
    /// ```compile_fail,E0277
    /// use axum::{routing::get, Router};
    /// use fleetgate::{Limit, Limiter, MemoryStore, Policy, Rate, RateLimitLayer};
    ///
    /// let policy = Policy::single("api", Limit::new(Rate::per_second(10)).unwrap()).unwrap();
    /// let layer = RateLimitLayer::new(Limiter::new(policy, MemoryStore::new()));
    /// let app: Router = Router::new()
    ///     .route("/", get(|| async { "ok" }))
    ///     // error[E0277]: `Infallible: From<Box<dyn Error + Send + Sync>>`
    ///     .layer(layer.typed_errors());
    /// ```
    ///
    /// With `HandleErrorLayer`:
    ///
    /// ```
    /// use axum::{error_handling::HandleErrorLayer, http::StatusCode, routing::get, Router};
    /// use fleetgate::{BoxError, Limit, Limiter, MemoryStore, Policy, Rate, RateLimitLayer};
    /// use tower::ServiceBuilder;
    ///
    /// let policy = Policy::single("api", Limit::new(Rate::per_second(10)).unwrap()).unwrap();
    /// let layer = RateLimitLayer::new(Limiter::new(policy, MemoryStore::new()));
    /// let app: Router = Router::new()
    ///     .route("/", get(|| async { "ok" }))
    ///     .layer(
    ///         ServiceBuilder::new()
    ///             .layer(HandleErrorLayer::new(|err: BoxError| async move {
    ///                 (StatusCode::TOO_MANY_REQUESTS, err.to_string())
    ///             }))
    ///             .layer(layer.typed_errors()),
    ///     );
    /// ```
    ///
    /// A [`response_cost`](RateLimitLayer::response_cost) set before is
    /// dropped: the layer cannot read the responses of any service.
    pub fn typed_errors(mut self) -> RateLimitLayer<K, C, mode::TypedErrors, Fb> {
        self.recipe.after = None;
        self.rebuild(|key, cost, feedback| (key, cost, feedback))
    }

    /// Waiting mode, for clients: instead of refusing a call over the
    /// limit, reserve its slot (all limits of the policy, one round trip)
    /// and sleep until it, then call the inner service. Calls are served in
    /// the order they reach the store. A call whose slot is more than
    /// `max_wait` away is refused at once, reserving nothing:
    /// [`RateLimitError::WaitTooLong`](crate::RateLimitError::WaitTooLong)
    /// in typed-error mode, a 429 with `Retry-After` otherwise.
    ///
    /// In [`grpc`](Self::grpc) mode a call also waits no longer than its
    /// deadline (its `grpc-timeout` header; one the gRPC spec would not
    /// accept is ignored): a slot past it is refused at once, uncharged,
    /// with `RESOURCE_EXHAUSTED` and the pushback to the slot.
    ///
    /// A call of a cost above the burst can never pass and is refused
    /// without waiting. In shadow mode the layer reserves but never sleeps.
    /// `max_wait` is capped at about 35 years
    /// ([`Limiter::reserve`](crate::Limiter::reserve)). Waiting uses tokio's
    /// timer: call and poll the service within a tokio runtime (with time
    /// enabled), as `tower`'s own timeout layer requires too.
    pub fn wait_up_to(mut self, max_wait: Duration) -> Self {
        self.recipe.max_wait = Some(max_wait);
        self
    }

    /// Upstream feedback: reads each response of the inner service with
    /// `feedback` ([`RetryAfter`](super::RetryAfter) for `http::Response`,
    /// or for responses of other types a closure
    /// `Fn(&Res) -> Option<Duration> + Clone` giving how long from now the
    /// identity should pause), and when it asks for a pause, records it for the
    /// request's key in the store before returning the response, so that
    /// every instance holds that identity back
    /// ([`Limiter::defer`](crate::Limiter::defer)). Off by default.
    ///
    /// [`UpstreamHeaders`](super::UpstreamHeaders) also reads the
    /// upstream's rate-limit headers (`RateLimit`, `X-RateLimit-*`) on every
    /// response and records what they say is left
    /// ([`Limiter::align`](crate::Limiter::align)): the fleet then admits at
    /// most that many more calls of the identity before the upstream's
    /// reset. That record is one more round trip before the response is
    /// returned, none when the policy alone is already tighter.
    ///
    /// Slots already reserved by waiting calls keep their times; the pause
    /// holds back the calls that reserve after it is recorded. If recording
    /// fails, the failure is logged and the response returned as is.
    pub fn upstream_feedback<Fb2>(self, feedback: Fb2) -> RateLimitLayer<K, C, M, Fb2> {
        self.rebuild(|key, cost, _| (key, cost, feedback))
    }

    /// The same settings with another key, cost, feedback or mode type.
    fn rebuild<K2, C2, M2, Fb2>(
        self,
        f: impl FnOnce(K, C, Fb) -> (K2, C2, Fb2),
    ) -> RateLimitLayer<K2, C2, M2, Fb2> {
        let (key, cost, feedback) = f(self.key, self.cost, self.feedback);
        RateLimitLayer {
            limiter: self.limiter,
            key,
            cost,
            recipe: self.recipe,
            feedback,
            routes: self.routes,
            _mode: PhantomData,
        }
    }
}

impl<K, C, Fb> RateLimitLayer<K, C, mode::Http, Fb> {
    /// Cost known after the response: charge what the response says it
    /// cost, count only the responses that match, or give the cost of
    /// failed calls back; see [`ResponseCost`]. Off by default: a layer
    /// without it decides as before, at no extra cost.
    ///
    /// ```
    /// use std::time::Duration;
    /// use fleetgate::key::GlobalKey;
    /// use fleetgate::rate_limit::ResponseCost;
    /// use fleetgate::{Limit, Limiter, MemoryStore, Policy, Rate, RateLimitLayer};
    /// use http::{Request, Response};
    /// use tower::{service_fn, ServiceExt};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// // 1000 tokens a minute, charged from each completion's own count.
    /// let policy = Policy::single("tokens", Limit::new(Rate::per_minute(1000))?)?;
    /// let layer = RateLimitLayer::new(Limiter::new(policy, MemoryStore::new()))
    ///     .key(GlobalKey::new())
    ///     .response_cost(ResponseCost::header("x-tokens-used"));
    /// let app = tower::ServiceBuilder::new().layer(layer).service(service_fn(
    ///     |_: Request<String>| async {
    ///         let res = Response::builder().header("x-tokens-used", "400").body(String::new());
    ///         Ok::<_, http::Error>(res?)
    ///     },
    /// ));
    /// let call = || app.clone().oneshot(Request::new(String::new()));
    /// // Admitted while the budget is not exhausted: 400, 800, 1200 tokens.
    /// for _ in 0..3 {
    ///     assert_eq!(call().await?.status(), 200);
    /// }
    /// // 200 tokens in debt: refused until they (and one more) are repaid.
    /// let refused = call().await?;
    /// assert_eq!(refused.status(), 429);
    /// assert_eq!(refused.headers()["retry-after"], "13");
    /// # Ok(()) }
    /// ```
    pub fn response_cost(mut self, cost: ResponseCost) -> Self {
        self.recipe.after = Some(cost);
        self
    }
}

impl<K, C, Fb> RateLimitLayer<K, C, mode::AnyBody, Fb> {
    /// Cost known after the response: see [`ResponseCost`] and the
    /// default mode's [`response_cost`](RateLimitLayer::response_cost).
    pub fn response_cost(mut self, cost: ResponseCost) -> Self {
        self.recipe.after = Some(cost);
        self
    }
}

impl<K: Clone, C: Clone, M, F: Clone> Clone for RateLimitLayer<K, C, M, F> {
    fn clone(&self) -> Self {
        RateLimitLayer {
            limiter: self.limiter.clone(),
            key: self.key.clone(),
            cost: self.cost.clone(),
            recipe: self.recipe.clone(),
            feedback: self.feedback.clone(),
            routes: self.routes.clone(),
            _mode: PhantomData,
        }
    }
}

impl<K, C, M, F> fmt::Debug for RateLimitLayer<K, C, M, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let r = &self.recipe;
        f.debug_struct("RateLimitLayer")
            .field("limiter", &self.limiter)
            .field("on_missing", &r.on_missing)
            .field("headers", &r.headers)
            .field("shadow", &r.shadow)
            .field("failure", &r.failure)
            .field("max_wait", &r.max_wait)
            .field("response_cost", &r.after)
            .field("grpc", &r.grpc)
            .finish_non_exhaustive()
    }
}

impl<S, K: Clone, C: Clone, M, F: Clone> Layer<S> for RateLimitLayer<K, C, M, F> {
    type Service = RateLimit<S, K, C, M, F>;

    fn layer(&self, inner: S) -> Self::Service {
        let recipe = &self.recipe;
        let live = |limiter: &Limiter| LiveSettings::new(limiter, recipe.clone());
        let routes = self.routes.as_ref().map(|table| Routes {
            rules: table
                .rules
                .iter()
                .map(|rule| rule.with_value(live(&rule.value)))
                .collect(),
            default: table.default.as_ref().map(live),
        });
        RateLimit::new(
            inner,
            Arc::new(RateLimitParts {
                key: self.key.clone(),
                cost: self.cost.clone(),
                feedback: self.feedback.clone(),
                settings: live(&self.limiter),
                routes,
            }),
        )
    }
}
