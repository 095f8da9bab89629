//! [`RateLimitLayer`]: limits requests per key with a [`Limiter`].
//!
//! ```
//! use axum::{routing::get, Router};
//! use fleetgate::key::{ExtensionKey, PeerIp};
//! use fleetgate::{Limit, Limiter, MemoryStore, Policy, Rate, RateLimitLayer};
//!
//! /// Put in the request by your authentication layer, never by a client.
//! #[derive(Clone)]
//! struct Account(u64);
//! impl std::fmt::Display for Account {
//!     fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result { self.0.fmt(f) }
//! }
//!
//! # fn main() -> Result<(), fleetgate::ConfigError> {
//! let policy = Policy::single("api", Limit::builder(Rate::per_second(10)).burst(20).build()?)?;
//! let app: Router = Router::new()
//!     .route("/api/orders", get(|| async { "orders" }))
//!     .layer(
//!         RateLimitLayer::new(Limiter::new(policy, MemoryStore::new()))
//!             // per verified account, else one budget per client address
//!             .key(ExtensionKey::<Account>::new("account").or(PeerIp)),
//!     );
//! # Ok(()) }
//! ```
//!
//! `Router::layer` limits every request that reaches the router, unknown
//! paths included; `Router::route_layer` limits only requests that match a
//! route, so 404s cost nothing. The layer's state lives in the store, not in
//! the service, so the clones axum makes per request all share one limit.
//! [`PeerIp`](crate::key::PeerIp) needs the server started with
//! `into_make_service_with_connect_info::<SocketAddr>()`: without it
//! `PeerIp` finds no address, and a request it had to key counts as one
//! without a key ([`OnMissingKey`]: 400 by default).
//!
//! Around services that are not HTTP (or when you would rather have an
//! error than a 429 response), call [`RateLimitLayer::typed_errors`]: the
//! service then fails with a [`RateLimitError`](crate::RateLimitError).
//!
//! # What happens to a request
//!
//! | situation | what happens |
//! |---|---|
//! | limit exceeded | `429 Too Many Requests`, `Retry-After` in whole seconds (rounded up), rate-limit headers ([`HeaderStyle`](crate::HeaderStyle)), a one-line body; replace it with [`RateLimitLayer::rejection`] |
//! | request allowed | the inner response, plus the rate-limit headers |
//! | no key in the request | `400 Bad Request` by default; [`OnMissingKey`]`::Reject(status)`, `Fallback(key)` or `Allow` |
//! | the store is slow or down | the layer's [`FailurePolicy`] (open by default); see the crate docs' failure policy table |
//! | shadow mode ([`RateLimitLayer::shadow`]) | decided and logged (`shadow-denied` at `debug`), never refused (not over a limit, not for a missing key, not when the store fails), no headers sent |
//! | stacked layers | each adds its limits to the `RateLimit`/`RateLimit-Policy` lists; the innermost layer's `X-RateLimit-*` and `Retry-After` stay |
//! | a service that is not HTTP | [`RateLimitLayer::typed_errors`]: `RateLimitError::{Limited, MissingKey, Unavailable}` |
//! | cost known after the response: [`RateLimitLayer::response_cost`] with [`ResponseCost::header`], [`from_parts`](ResponseCost::from_parts) or [`body_bytes`](ResponseCost::body_bytes) | admitted while the identity's budget is not exhausted (a peek, nothing stored); the cost the response states is charged when its head arrives (body bytes: when the body ends or is dropped), debt allowed, off the response's path; in debt, `429` with `Retry-After` until the debt is repaid at the limit's rate |
//! | count only what matches: [`ResponseCost::count_if`] (a login's 401s) | admitted while the budget is not exhausted; only responses that match are charged (the request's cost), off the response's path |
//! | refund: [`ResponseCost::refund_server_errors`] or [`refund_if`](ResponseCost::refund_if) | checked and charged before the call as usual; the request's cost is given back when the response matches, off the response's path |
//! | a charge or refund after the response fails | the response goes out untouched; logged at `warn` (at most once a second) and counted as a store error; under [`FailurePolicy::Local`] applied to the local limiter |
//! | tests with `tokio::time::pause` | the [`MemoryStore`](crate::MemoryStore) reads the CPU's counter ([`FastClock`](crate::clock::FastClock)), which paused time does not stop: build it with `MemoryStore::builder().clock(clock::MonotonicClock::new())`, which follows tokio's clock, or drive it by hand with [`ManualClock`](crate::clock::ManualClock) |
//!
//! # Response bodies
//!
//! The layer answers a refusal in the inner service's own body type
//! (axum's `Body`, `String`, `http_body_util::Full`, `BoxBody`, the bodies
//! of this crate's other layers: any type that implements
//! [`RefusalBody`](crate::response::RefusalBody)), so responses that pass
//! go out untouched, and axum does not box their body a second time. Each
//! `Router::layer` call hands the next one axum's `Body`, so layers added
//! to a router one by one stack in any order. Around a service whose body
//! cannot be built from bytes (hyper's `Incoming`, `Empty`) or is another
//! crate's wrapper (tower-http's, stacked inside one `ServiceBuilder`), add
//! [`RateLimitLayer::any_body`]: every response then carries a
//! [`ResponseBody`](crate::response::ResponseBody).
//!
//! # Waiting for a slot: outbound clients
//!
//! Around a client of someone else's rate-limited API, refusing is rarely
//! what a background job wants: it would rather wait its turn.
//! [`RateLimitLayer::wait_up_to`] makes the layer reserve the call's slot
//! (GCRA reserve mode, every limit of the policy in one round trip), sleep
//! exactly until that slot, then call the inner service. Slots are handed
//! out in the order calls reach the store, so the fleet is served oldest
//! first, and nobody polls. A call whose slot is further away than the
//! maximum wait fails at once with
//! [`RateLimitError::WaitTooLong`](crate::RateLimitError::WaitTooLong),
//! which says how long it would have waited, and reserves nothing.
//!
//! ```
//! use std::time::Duration;
//! use fleetgate::key::HeaderKey;
//! use fleetgate::rate_limit::{within_window, RetryAfter};
//! use fleetgate::{Limiter, MemoryStore, Policy, RateLimitLayer};
//! use tower::{service_fn, ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), fleetgate::BoxError> {
//! // The upstream allows 25 calls per 5 s and 300 per minute, per token.
//! let margin = Duration::from_millis(100);
//! let upstream = Policy::builder("upstream")
//!     .limit(within_window(25, Duration::from_secs(5), margin)?)
//!     .limit(within_window(300, Duration::from_secs(60), margin)?)
//!     .build()?;
//! let client = ServiceBuilder::new()
//!     .layer(
//!         RateLimitLayer::new(Limiter::new(upstream, MemoryStore::new()))
//!             // One layer, many upstream accounts: keyed by access token (hashed).
//!             .key(HeaderKey::bearer())
//!             .typed_errors()
//!             .wait_up_to(Duration::from_secs(30))
//!             // A 429 or 503 with Retry-After pauses that token fleet-wide.
//!             .upstream_feedback(RetryAfter::new()),
//!     )
//!     .service(service_fn(|_req: http::Request<()>| async {
//!         Ok::<_, std::convert::Infallible>(http::Response::new(()))
//!     }));
//!
//! let req = http::Request::get("https://api.example.com/items")
//!     .header("authorization", "Bearer token-1")
//!     .body(())?;
//! let response = client.oneshot(req).await?;
//! assert_eq!(response.status(), 200);
//! # Ok(()) }
//! ```
//!
//! When the upstream's limit is unknown or changes, let its own headers
//! steer the fleet: [`UpstreamHeaders`] reads `RateLimit` (IETF),
//! `X-RateLimit-Remaining`/`-Reset` (GitHub and many others) and OpenAI's
//! `x-ratelimit-*-requests` on every response, and records what is left
//! ([`Limiter::align`](crate::Limiter::align)), so that the fleet admits at
//! most that many more calls before the upstream's reset:
//!
//! ```
//! use std::time::Duration;
//! use fleetgate::clock::MonotonicClock;
//! use fleetgate::key::GlobalKey;
//! use fleetgate::rate_limit::UpstreamHeaders;
//! use fleetgate::{Limit, Limiter, MemoryStore, Policy, Rate, RateLimitLayer};
//! use tower::{service_fn, Layer, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), fleetgate::BoxError> {
//! // Configured generously; the upstream will say what it really allows.
//! let policy = Policy::single("api", Limit::builder(Rate::per_second(100)).burst(20).build()?)?;
//! let store = MemoryStore::builder().clock(MonotonicClock::new()).build();
//! let client = RateLimitLayer::new(Limiter::new(policy, store))
//!     .key(GlobalKey::new())
//!     .typed_errors()
//!     .wait_up_to(Duration::from_secs(30))
//!     .upstream_feedback(UpstreamHeaders::new())
//!     .layer(service_fn(|_req: http::Request<()>| async {
//!         // Nothing left until the upstream's window resets in 2 s.
//!         let res = http::Response::builder()
//!             .header("x-ratelimit-remaining", "0")
//!             .header("x-ratelimit-reset", "2")
//!             .body(())?;
//!         Ok::<_, http::Error>(res)
//!     }));
//! let start = tokio::time::Instant::now();
//! client.clone().oneshot(http::Request::new(())).await?;
//! // The next call waits for the reset, on every instance sharing the store.
//! client.oneshot(http::Request::new(())).await?;
//! assert_eq!(start.elapsed(), Duration::from_secs(2));
//! # Ok(()) }
//! ```
//!
//! See `docs/outbound.md` for what "in line" means and the bound on 429s.
//!
//! Configure the limits with [`within_window`] when the upstream publishes
//! windows ("25 per 5 s"): it explains why GCRA mirrors them with a burst
//! of 1 and a small margin. A cancelled call (its future dropped while it
//! waits) never reaches the inner service, but its slot stays used: later
//! slots were already handed out behind it. A Redis failure while
//! reserving follows the layer's [`FailurePolicy`]; for clients that must
//! never earn a 429, consider [`FailurePolicy::Closed`], or
//! [`FailurePolicy::Local`] with this instance's share of the upstream's
//! limits: the call then reserves a slot on the local limiter and waits
//! for it.

mod after;
pub(crate) mod budget;
mod cost;
mod feedback;
mod future;
mod layer;
mod live;
mod quota;
#[cfg(feature = "retry")]
mod retry;
mod retry_after;
mod routes;
mod service;
mod throttle;
mod trailers;
mod upstream;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::Response;

pub use self::after::ResponseCost;
pub use self::budget::{RetryBudget, RetryBudgetBuilder, RetryBudgetStats};
pub use self::feedback::{RetryAfter, UpstreamFeedback, UpstreamHeaders};
pub use self::layer::RateLimitLayer;
pub use self::quota::UpstreamQuota;
#[cfg(feature = "retry")]
pub use self::retry::RetryPolicy;
pub use self::routes::RoutePolicies;
pub use self::service::RateLimit;
pub use self::throttle::{
    Accepts, AdaptiveThrottle, AdaptiveThrottleBuilder, AdaptiveThrottleLayer, HttpAccepts,
    Throttled, ThrottledFuture,
};
pub use self::upstream::within_window;

pub(crate) use self::cost::Cost;
pub(crate) use self::feedback::NoFeedback;
use self::future::ResponseFuture;
pub(crate) use self::live::{LiveSettings, Recipe};

use crate::decision::Decision;
use crate::error::StoreError;
use crate::key::Key;
use crate::layer::{FailurePolicy, OnMissingKey, fall_back_locally, log_store_failure, mode};
use crate::limiter::Limiter;
use crate::lists::Verdict;
use crate::log::{decision_span, warn_missing_key};
use crate::metrics::{LayerMetrics, near_limit};
use crate::outcome::Outcome;
use crate::policy::{MAX_TOLERANCE_MICROS, Policy};
use crate::response::{PolicyHeaders, Rejection, RejectionKind};
use crate::route::{self, RouteRule};
use crate::store::StoreFuture;

pub(crate) type RejectFn = Arc<dyn Fn(&Rejection<'_>) -> Response<Bytes> + Send + Sync>;

/// Settings every clone of a service and every response future shares.
pub(crate) struct RateSettings {
    /// Decides with `policy` alone: the live limiter's rules were resolved
    /// when these settings were chosen ([`LiveSettings`]).
    pub(crate) limiter: Limiter,
    /// The policy `headers` and rejections describe.
    pub(crate) policy: Policy,
    pub(crate) headers: PolicyHeaders,
    pub(crate) on_missing: OnMissingKey,
    pub(crate) shadow: bool,
    pub(crate) failure: FailurePolicy,
    pub(crate) rejection: Option<RejectFn>,
    /// Waiting mode: reserve a slot up to this far ahead and sleep until it.
    pub(crate) max_wait: Option<Duration>,
    pub(crate) metrics: LayerMetrics,
    /// With [`FailurePolicy::Local`]: the settings of the local limiter
    /// that decides the calls the store failed on.
    pub(crate) fallback: Option<Arc<RateSettings>>,
    /// Whether these are a local fallback's settings: outcomes are counted
    /// as `fallback_*`.
    pub(crate) local: bool,
    /// Cost known after the response: what to charge or refund once the
    /// inner service has answered. `None` (the usual case) costs one
    /// branch.
    pub(crate) after: Option<ResponseCost>,
    /// Refusals are gRPC statuses ([`RateLimitLayer::grpc`]).
    pub(crate) grpc: bool,
    /// The status of a refusal by a deny list entry.
    pub(crate) deny_status: http::StatusCode,
}

impl RateSettings {
    /// Asks the store to decide `cost` for `key`: a check, or in waiting
    /// mode a reservation within `max_wait` and the call's `deadline` (a
    /// gRPC call's `grpc-timeout`, read only in waiting mode): a slot
    /// further away is refused, reserving nothing.
    #[inline(always)]
    pub(crate) fn ask(
        &self,
        key: &Key,
        cost: u64,
        deadline: Option<Duration>,
    ) -> StoreFuture<Decision> {
        // The policy these settings were chosen for: the limiter's rules
        // were read once, when the settings were.
        if let Some(after) = &self.after {
            return self.ask_before_response(after, key, cost);
        }
        let max_wait = self.max_wait.map(|wait| {
            let wait = deadline.map_or(wait, |deadline| wait.min(deadline));
            wait.min(Duration::from_micros(MAX_TOLERANCE_MICROS))
        });
        self.limiter.decide_as(&self.policy, key, cost, max_wait)
    }

    /// With a cost known after the response: a peek (the call is charged
    /// once its response is known), or for refunds the usual check.
    #[cold]
    #[inline(never)]
    fn ask_before_response(
        &self,
        after: &ResponseCost,
        key: &Key,
        cost: u64,
    ) -> StoreFuture<Decision> {
        if after.peeks() {
            return self.limiter.peek(key, cost);
        }
        self.limiter.decide_as(&self.policy, key, cost, None)
    }

    /// Under [`FailurePolicy::Local`], decides a call the store failed on
    /// with the local limiter, whose settings then answer the request
    /// (headers, rejection, outcome): `settings` is replaced by them. Any
    /// other result is passed on. `key` is kept by the caller whenever a
    /// fallback is configured.
    #[inline]
    pub(crate) fn fall_back(
        settings: &mut Arc<RateSettings>,
        result: Result<Decision, StoreError>,
        key: Option<&Key>,
        cost: u64,
    ) -> Result<Decision, StoreError> {
        let Some(key) = key else {
            return result;
        };
        fall_back_locally(
            settings,
            result,
            |c| c.fallback.as_ref(),
            RateSettings::log_failure,
            |local| local.ask(key, cost, None).take_ready(),
        )
    }

    fn log_failure(&self, err: &StoreError) {
        let policy = self.limiter.name();
        log_store_failure(
            "rate-limit",
            policy,
            self.limiter.store(),
            err,
            self.failure,
        );
    }

    /// What to do with the store's answer: pass (with the decision whose
    /// headers to send, if any) or refuse. Shadow mode and the failure
    /// policy are applied here.
    ///
    /// `latency` is the store's, when it did I/O; `key` the request's,
    /// counted in [`observe`](crate::observe) when it is refused.
    pub(crate) fn judge(
        &self,
        result: Result<Decision, StoreError>,
        latency: Option<Duration>,
        key: Option<&Key>,
    ) -> Result<Option<Decision>, RejectionKind> {
        let policy = &self.policy;
        let span = decision_span("rate_limit", policy.name(), None, latency);
        let _entered = span.enter();
        let record = |outcome: Outcome| {
            span.record("outcome", outcome.as_str());
        };
        let refusal = match result {
            Ok(d) if d.is_allowed() => {
                let burst = policy
                    .limits()
                    .get(d.limit_index())
                    .map_or(0, |l| l.burst());
                let outcome = Outcome::Allowed.by_fallback(self.local);
                self.metrics
                    .decided(outcome, near_limit(d.remaining(), burst));
                record(outcome);
                return Ok(Some(d));
            }
            Ok(d) => {
                if let Some(key) = key {
                    self.metrics.denied(key);
                }
                RejectionKind::Limited(d)
            }
            Err(err) => {
                self.log_failure(&err);
                match self.failure {
                    FailurePolicy::Closed => RejectionKind::Unavailable(err),
                    // `Local` reaches here only if its own store failed.
                    FailurePolicy::Open | FailurePolicy::Local(_) => {
                        self.metrics.decided(Outcome::FailOpen, false);
                        record(Outcome::FailOpen);
                        return Ok(None);
                    }
                }
            }
        };
        match self.refuse(refusal) {
            Some(kind) => Err(kind),
            None => Ok(None),
        }
    }

    /// A request without a key, refused with `status` (or, in shadow mode,
    /// let through: `None`), in a decision span of its own.
    pub(crate) fn missing_key(&self, status: http::StatusCode) -> Option<RejectionKind> {
        let span = decision_span("rate_limit", self.limiter.name(), None, None);
        let _entered = span.enter();
        self.refuse(RejectionKind::MissingKey(status))
    }

    /// A request whose key a list entry names, decided without the store:
    /// a deny entry (ending in `retry_after`) refuses with the layer's deny
    /// status, or in shadow mode lets it through (`None`), in a decision
    /// span of its own; an allow entry lets it through, counted.
    #[inline(never)]
    pub(crate) fn listed(&self, verdict: Verdict) -> Option<RejectionKind> {
        let Verdict::Deny(retry_after) = verdict else {
            self.metrics.decided(Outcome::AllowListed, false);
            return None;
        };
        let span = decision_span("rate_limit", self.limiter.name(), None, None);
        let _entered = span.enter();
        self.refuse(RejectionKind::DenyListed {
            status: self.deny_status,
            retry_after,
        })
    }

    /// The rejection to send, or `None` in shadow mode, where the would-be
    /// rejection is only logged and the request goes through. Counts the
    /// outcome.
    pub(crate) fn refuse(&self, kind: RejectionKind) -> Option<RejectionKind> {
        let policy = self.limiter.name();
        if let RejectionKind::MissingKey(_) = kind {
            warn_missing_key("rate-limit", policy);
        }
        let outcome = match (&kind, self.shadow) {
            (RejectionKind::Unavailable(_), true) => Outcome::FailOpen,
            (_, true) => Outcome::ShadowDenied,
            (RejectionKind::Limited(_), false) => Outcome::Denied.by_fallback(self.local),
            (RejectionKind::MissingKey(_), false) => Outcome::MissingKey,
            (RejectionKind::Unavailable(_), false) => Outcome::FailClosed,
            (RejectionKind::DenyListed { .. }, false) => Outcome::DenyListed,
        };
        self.metrics.decided(outcome, false);
        tracing::Span::current().record("outcome", outcome.as_str());
        if self.shadow {
            tracing::debug!(policy, reason = ?kind, "shadow-denied");
            return None;
        }
        if let RejectionKind::Limited(d) = &kind {
            let blocked = d.is_blocked();
            tracing::debug!(policy, retry_after = ?d.retry_after(), blocked, "denied");
        }
        Some(kind)
    }

    /// In waiting mode, how long an admitted call must sleep before it may
    /// go; `None` to call now. Shadow mode reserves but never sleeps.
    pub(crate) fn wait_for(&self, decision: Option<&Decision>) -> Option<Duration> {
        // Without waiting mode (the usual case) there is nothing to read.
        self.max_wait?;
        let wait = decision?.wait();
        if wait.is_zero() {
            return None;
        }
        if self.shadow {
            tracing::debug!(policy = self.limiter.name(), ?wait, "shadow-wait");
            return None;
        }
        Some(wait)
    }

    pub(crate) fn rejection(&self, kind: RejectionKind) -> Response<Bytes> {
        let rejection = Rejection {
            kind,
            policy: &self.policy,
            headers: &self.headers,
        };
        match &self.rejection {
            Some(custom) => custom(&rejection),
            None if self.grpc => rejection.grpc_response(),
            None => rejection.default_response(),
        }
    }
}

/// What a service's clones share: the key extractor, the cost, the
/// upstream feedback and the settings.
pub(crate) struct RateLimitParts<K, C, F> {
    pub(crate) key: K,
    pub(crate) cost: C,
    pub(crate) feedback: F,
    pub(crate) settings: LiveSettings,
    /// With per-route policies: the settings of each route.
    pub(crate) routes: Option<Routes>,
}

impl<K, C, F> RateLimitParts<K, C, F> {
    /// The settings `which` names.
    #[inline]
    pub(crate) fn live(&self, which: Which) -> &LiveSettings {
        match (which, &self.routes) {
            (Which::Rule(i), Some(routes)) => {
                routes.rules.get(i).map_or(&self.settings, |r| &r.value)
            }
            (Which::Default, Some(routes)) => routes.default.as_ref().unwrap_or(&self.settings),
            _ => &self.settings,
        }
    }
}

/// Which settings decide a request: the layer's, a route rule's or the
/// route table's default. An index rather than a reference, so that the
/// service can be borrowed mutably while it decides.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Which {
    Layer,
    Rule(usize),
    Default,
}

/// The per-route table, each rule with its own settings.
pub(crate) struct Routes {
    pub(crate) rules: Vec<RouteRule<LiveSettings>>,
    pub(crate) default: Option<LiveSettings>,
}

impl Routes {
    /// The settings deciding `req`, or `None` when no route or default
    /// applies (the request is not limited).
    pub(crate) fn select<B>(&self, req: &http::Request<B>) -> Option<Which> {
        match route::position(&self.rules, req.method(), route::route_path(req)) {
            Some(i) => Some(Which::Rule(i)),
            None => self.default.as_ref().map(|_| Which::Default),
        }
    }
}
