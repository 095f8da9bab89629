//! Fleet-wide rate limiting for [tower] and [axum], decided atomically in
//! Redis (one Lua script, one round trip), or in process when there is no
//! Redis.
//!
//! - Limits are values, checked when built: [`Rate`], [`Limit`], [`Policy`].
//! - A [`Limiter`] binds a policy to a store: [`MemoryStore`] (embedded
//!   default) or [`RedisStore`] (shared by every instance of the fleet).
//! - [`RateLimitLayer`] applies a limiter to an axum router or any tower
//!   service; [`key`] extractors say who a request is.
//! - Around a client of someone else's API, [`RateLimitLayer::wait_up_to`]
//!   waits for the call's slot instead of refusing, oldest first across
//!   the fleet; see [waiting for a slot](rate_limit#waiting-for-a-slot-outbound-clients).
//! - [`ConcurrencyLimitLayer`] caps the requests in flight per identity
//!   across the fleet with leases held until the response body ends
//!   ([`concurrency`]); [`lease`] holds the reusable release-on-drop pieces.
//! - [`live`] changes limits while the fleet runs (no restart, no round
//!   trip per request): per-identity limits and plans, resetting an
//!   identity, policy files re-read when they change, and deny and allow
//!   lists of identities and networks, checked before the limiter.
//! - For an incident: a penalty box in a policy (`"5/15min block 1h"`,
//!   [`LimitBuilder::block_for`]) refuses an identity for the block once
//!   a limit refuses it, on every instance; and shadow mode on every layer
//!   (`.shadow(true)`) tries a new limit, cap or threshold on live traffic,
//!   refusing nothing.
//! - Under overload, [`shed`] drops the least important traffic first:
//!   [`FleetShedLayer`] gives each priority tier a share of the fleet's
//!   capacity and answers 503 beyond it, never to critical traffic;
//!   [`UtilizationShedLayer`] sheds, slowly, when this process has been
//!   busy for a while.
//! - Around tonic servers and clients, [`grpc`]: `.grpc()` on every layer
//!   answers refusals as gRPC statuses with gRPC's retry hints.
//!
//! # An axum server
//!
// The example needs `RedisStore`: tested with the `redis` feature only.
#![cfg_attr(feature = "redis", doc = "```no_run")]
#![cfg_attr(not(feature = "redis"), doc = "```ignore")]
//! use std::net::SocketAddr;
//! use axum::{routing::get, Router};
//! use fleetgate::key::{ExtensionKey, PeerIp};
//! use fleetgate::{Limit, Limiter, Policy, Rate, RateLimitLayer, RedisStore};
//!
//! /// Put in the request by your authentication layer.
//! #[derive(Clone)]
//! struct Account(u64);
//! impl std::fmt::Display for Account {
//!     fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result { self.0.fmt(f) }
//! }
//!
//! #[tokio::main]
//! async fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     // 100 per second per account, bursts of 500; calls without a
//!     // verified account share one budget per client IP.
//!     let policy = Policy::single("api", Limit::builder(Rate::per_second(100)).burst(500).build()?)?;
//!     let store = RedisStore::connect("redis://127.0.0.1:6379").await?;
//!     let app = Router::new()
//!         .route("/api/ping", get(|| async { "pong" }))
//!         .route_layer(
//!             RateLimitLayer::new(Limiter::new(policy, store))
//!                 .key(ExtensionKey::<Account>::new("account").or(PeerIp)),
//!         );
//!     let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
//!     // Connect info gives PeerIp the client's address.
//!     axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>()).await?;
//!     Ok(())
//! }
//! ```
//!
//! Key by what a client cannot choose: a header such as `x-api-key` keyed
//! as it comes ([`HeaderKey`](key::HeaderKey)) gives every made-up key a
//! budget of its own; see [`key`] for the safe pattern.
//!
//! # A rate-limited client
//!
//! Around a client of someone else's API, refuse calls with an error
//! instead of earning a 429 from them:
//!
//! ```
//! use std::time::Duration;
//! use fleetgate::key::GlobalKey;
//! use fleetgate::{Limit, Limiter, MemoryStore, Policy, Rate, RateLimitError, RateLimitLayer};
//! use tower::{service_fn, Service, ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! // The upstream allows 25 calls per 5 s and 300 per minute.
//! let upstream = Policy::builder("upstream")
//!     .limit(Limit::new(Rate::new(25, Duration::from_secs(5)))?)
//!     .limit(Limit::new(Rate::per_minute(300))?)
//!     .build()?;
//! let mut client = ServiceBuilder::new()
//!     .layer(
//!         RateLimitLayer::new(Limiter::new(upstream, MemoryStore::new()))
//!             .key(GlobalKey::new())
//!             .typed_errors(),
//!     )
//!     .service(service_fn(|call: &'static str| async move {
//!         Ok::<_, std::convert::Infallible>(format!("called {call}"))
//!     }));
//!
//! for _ in 0..25 {
//!     client.ready().await?.call("GET /items").await?;
//! }
//! let err = client.ready().await?.call("GET /items").await.unwrap_err();
//! let err = err.downcast::<RateLimitError>().unwrap();
//! assert!(matches!(*err, RateLimitError::Limited { ref limit, .. } if limit == "25/5s"));
//! # Ok(()) }
//! ```
//!
//! # Failure policy
//!
//! Every Redis call has a timeout (50 ms by default, [`RedisStoreBuilder::timeout`]).
//! When the store fails or times out, a layer follows its [`FailurePolicy`]:
//!
//! | the store... | `FailurePolicy::Open` (default) | `FailurePolicy::Closed` | `FailurePolicy::local(share)` |
//! |---|---|---|---|
//! | answers in time | the decision stands | the decision stands | the decision stands |
//! | times out, refuses the connection, or answers nonsense | the request passes, without rate-limit headers (outcome `fail_open`) | `503 Service Unavailable`, `Retry-After: 1` (outcome `fail_closed`) | decided in this process by a [`MemoryStore`] holding `share` of each limit ([`Policy::scaled`]): 200 or 429 with that limit's headers (outcomes `fallback_allowed`, `fallback_denied`) |
//! | has denied this key recently ([deny cache](RedisStoreBuilder::deny_cache)) | denied locally, no round trip | denied locally, no round trip | denied locally, no round trip |
//!
//! Failures are logged at `warn` at most once a second per process and
//! counted ([`metrics`]). The connection reconnects by itself, and scripts
//! lost by a Redis restart are sent again.
//!
//! # Limits
//!
//! | you write | means |
//! |---|---|
//! | `Limit::new(Rate::per_second(100))` | 100 per second, burst 100 |
//! | `Limit::builder(Rate::per_second(100)).burst(500).build()` | 100 per second, up to 500 at once after an idle spell |
//! | `Limit::new(Rate::new(25, Duration::from_secs(5)))` | 25 per 5 s |
//! | `Limit::new(Rate::per_hour(5000))` | 5000 per hour |
//! | `Policy::builder("upstream").limit(a).limit(b).build()` | both limits, decided together: a call either passes both or charges neither |
//!
//! The builders refuse nonsense with a [`ConfigError`]: a zero rate, period
//! or burst, a rate that microsecond resolution would slow by more than 1%
//! (any rate up to 10,000/s is fine, and any whole number of microseconds
//! between events, e.g. 500,000/s), a window too long to hold exactly (over
//! ~35 years), an empty policy, more than 16 limits,
//! duplicate limit names, and (with [`RateLimitLayer::fixed_cost`]) a cost
//! no request could ever pay. A per-request cost above the burst is refused
//! with 429 and no `Retry-After`, without asking the store.
//!
//! Without tower, a [`Limiter`] decides calls from any code:
//! [`Limiter::check`] on any store, or [`Limiter::check_now`], which on the
//! [`MemoryStore`] decides at once in the calling thread.
//!
//! GCRA is the default algorithm; one line on the policy
//! ([`PolicyBuilder::algorithm`]) picks a window algorithm instead. The
//! table of what each keeps, how exact it is and when to choose it is on
//! [`Algorithm`].
//!
//! # Operating it
//!
//! - Limits as text or files: [`spec`] parses `"25/5s + 300/min"`,
//!   `"100/s burst 500"` or `"5000/h sliding"` and (feature `serde`) reads
//!   TOML/YAML/JSON policy files; [`rate_limit::RoutePolicies`] gives each
//!   route of a router its own policy.
//! - Limits changed while running, fleet-wide: [`live::LivePolicies`];
//!   an HTTP admin API for it (feature `admin`): [`live::AdminApi`].
//! - Metrics (feature `metrics`): decisions by layer, policy and outcome,
//!   near-limit counts, Redis latency and errors per script; see [`metrics`].
//! - Tracing: one `debug` span per decision (`fleetgate.decision`, with the
//!   layer, policy, outcome, tier when shedding, and `store_latency_us` for
//!   Redis); denials at `debug`; store failures at `warn`.
//! - Headers: [`HeaderStyle`] picks the IETF draft `RateLimit`/`RateLimit-Policy`
//!   pair (default), `X-RateLimit-*`, both or none; 429 and 503 always
//!   carry `Retry-After`. What they mean for each algorithm is tabled in
//!   [`Algorithm`].
//!
//! Timeouts, reconnecting, the deny cache, Redis Cluster and what to watch
//! in production are in `docs/operating.md` in the repository. A few busy
//! identities on a high limit can be decided in process from leases of
//! their Redis budget, with a bounded overshoot: [`HotKeys`].
//!
//! [tower]: https://docs.rs/tower
//! [axum]: https://docs.rs/axum

#![forbid(unsafe_code)]
#![deny(missing_docs)]
#![deny(unreachable_pub)]
// Without `redis`, the docs' links to `RedisStore` and its kin lead
// nowhere; every other link is checked by the `--all-features` docs.
#![cfg_attr(not(feature = "redis"), allow(rustdoc::broken_intra_doc_links))]

mod algorithm;
pub mod clock;
pub mod concurrency;
mod decision;
mod error;
pub mod grpc;
mod hot;
pub mod key;
mod layer;
pub mod lease;
mod limiter;
mod lists;
pub mod live;
mod log;
pub mod metrics;
pub mod observe;
mod outcome;
mod policy;
pub mod rate_limit;
pub mod response;
mod route;
mod rules;
mod share;
pub mod shed;
pub use crate::policy::spec;
pub mod store;
mod text;

#[cfg(test)]
mod proptests;

pub use crate::algorithm::Algorithm;
pub use crate::algorithm::calendar::{Calendar, CalendarError, CalendarPeriod};
pub use crate::decision::Decision;
pub use crate::error::{BoxError, ConfigError, RateLimitError, StoreError};
pub use crate::hot::HotKeys;
pub use crate::key::Key;
pub use crate::layer::{FailurePolicy, OnMissingKey, mode};
pub use crate::limiter::Limiter;
pub use crate::policy::{Limit, LimitBuilder, Policy, PolicyBuilder, Rate};
pub use crate::rate_limit::{RateLimit, RateLimitLayer};
pub use crate::response::{HeaderStyle, Rejection, RejectionKind};
pub use crate::share::LocalShare;
pub use crate::store::{MemoryStore, Store};
#[cfg(feature = "redis")]
pub use crate::store::{RedisStore, RedisStoreBuilder, TimeSource, Topology};

pub use crate::concurrency::{
    ConcurrencyLimit, ConcurrencyLimitError, ConcurrencyLimitLayer, ConcurrencyLimiter,
    ConcurrencyPolicy,
};

pub use crate::shed::{
    FleetShedLayer, FleetShedPolicy, FleetShedder, UtilizationShedLayer, UtilizationShedder,
};

/// Compiles the README's examples as doc tests, so they stay true (they
/// use `RedisStore`: with the `redis` feature).
#[cfg(all(doctest, feature = "redis"))]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

/// Compiles the examples of docs/outbound.md as doc tests (they use
/// `RetryPolicy`: with the `retry` feature).
#[cfg(all(doctest, feature = "retry"))]
#[doc = include_str!("../docs/outbound.md")]
pub struct OutboundDoctests;
