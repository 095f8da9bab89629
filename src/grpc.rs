//! gRPC: the layers around tonic servers and clients, answering in gRPC's
//! own statuses and retry hints.
//!
//! Every layer wraps a tonic server (`Server::builder().layer(..)`) or a
//! client `Channel` as it wraps any tower service. Call `.grpc()` on it
//! ([`RateLimitLayer::grpc`](crate::RateLimitLayer::grpc),
//! [`ConcurrencyLimitLayer::grpc`](crate::ConcurrencyLimitLayer::grpc),
//! [`FleetShedLayer::grpc`](crate::FleetShedLayer::grpc),
//! [`UtilizationShedLayer::grpc`](crate::UtilizationShedLayer::grpc)) so
//! that a refusal is a gRPC status: an HTTP 429 or 503 reaches a gRPC
//! client as a broken transport (`UNAVAILABLE` or `UNKNOWN`, no retry
//! hint). The cargo feature `grpc` adds what needs tonic's types:
//! refusals in tonic's `Body` (what its services and `Channel` answer in)
//! and [`PeerIp`](crate::key::PeerIp) reading tonic's `TcpConnectInfo`.
//!
//! ```no_run
//! use fleetgate::key::{HeaderKey, PeerIp};
//! use fleetgate::spec::PolicySpec;
//! use fleetgate::{Limiter, MemoryStore, RateLimitLayer};
//! use tonic::service::Routes;
//! use tonic::transport::Server;
//!
//! async fn serve(routes: Routes) -> Result<(), Box<dyn std::error::Error>> {
//!     // 1 call a second per API key (hashed), bursts of 5; calls without
//!     // one share their peer address's budget.
//!     let policy = "1/s burst 5".parse::<PolicySpec>()?.build("greeter")?;
//!     let limit = RateLimitLayer::new(Limiter::new(policy, MemoryStore::new()))
//!         .key(HeaderKey::new("x-api-key").or(PeerIp))
//!         .grpc();
//!     Server::builder()
//!         .layer(limit)
//!         .add_routes(routes)
//!         .serve("127.0.0.1:50051".parse()?)
//!         .await?;
//!     Ok(())
//! }
//! ```
//!
//! `examples/grpc.rs` in the repository serves a greeter this way.
//!
//! # Refusals
//!
//! A refusal is trailers-only: HTTP 200, `content-type: application/grpc`,
//! the status in the headers and an empty body.
//!
//! | refused by | `grpc-status` | retry hints |
//! |---|---|---|
//! | a rate limit | `RESOURCE_EXHAUSTED` (8) | when the call can pass |
//! | a rate limit, cost above the burst | `RESOURCE_EXHAUSTED` | `grpc-retry-pushback-ms: -1` (never) |
//! | a concurrency limit | `RESOURCE_EXHAUSTED` | the layer's `retry_after` (1 s) |
//! | either shedder | `UNAVAILABLE` (14) | the layer's `retry_after` |
//! | the store, under `FailurePolicy::Closed` | `UNAVAILABLE` | 1 s |
//! | no key (`OnMissingKey::Reject`) | from its status: 400 `INVALID_ARGUMENT`, 401 `UNAUTHENTICATED`, 403 `PERMISSION_DENIED` | none |
//!
//! The retry hints are `grpc-retry-pushback-ms` (read by gRPC's retry
//! policy), `retry-after` in seconds (HTTP proxies), and
//! `grpc-status-details-bin`: a `google.rpc.Status` holding a
//! `google.rpc.RetryInfo`, as `tonic-types` and the other languages'
//! `errdetails` read it (a few protobuf fields written by hand: no
//! protobuf crate in the library). `grpc-message` (percent-encoded) names
//! the policy and the limit. A rate-limit refusal and every admitted call
//! carry the [`HeaderStyle`](crate::HeaderStyle) headers, which clients
//! read as metadata. Each rejection type's `grpc_response` (such as
//! [`Rejection::grpc_response`](crate::Rejection::grpc_response)) builds
//! the refusal; a custom `rejection` function can start from it.
//!
//! A layer in gRPC mode answers every request that way and never looks at
//! `content-type`: a refusal's shape does not depend on what a client
//! claims to be. On a server that mixes gRPC and HTTP, give each its own
//! layer.
//!
//! # Keys and methods
//!
//! Metadata is HTTP headers: [`HeaderKey::new("x-api-key")`](crate::key::HeaderKey)
//! and [`HeaderKey::bearer()`](crate::key::HeaderKey::bearer) (from
//! `authorization`) hash the value before it becomes a key. With the
//! `grpc` feature, [`PeerIp`](crate::key::PeerIp) reads the peer address
//! tonic's server puts in every call served over plain TCP
//! (`TcpConnectInfo`).
//!
//! Over TLS tonic stores a `TlsConnectInfo<TcpConnectInfo>` instead, which
//! fleetgate does not read (the type needs tonic's `tls-connect-info`
//! feature, and so tokio-rustls, which the `grpc` feature leaves off);
//! `PeerIp` then finds no peer, and every call it keys has no key.
//! Copy the address into a `SocketAddr` extension, which `PeerIp` reads,
//! with a layer added before the limit (not compiled here: it needs
//! tonic's `tls-ring` or `tls-aws-lc` feature, which a TLS server has):
//!
//! ```ignore
//! use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo};
//!
//! let peer = tower::util::MapRequestLayer::new(|mut req: http::Request<_>| {
//!     let addr = req
//!         .extensions()
//!         .get::<TlsConnectInfo<TcpConnectInfo>>()
//!         .and_then(|info| info.get_ref().remote_addr());
//!     if let Some(addr) = addr {
//!         req.extensions_mut().insert(addr);
//!     }
//!     req
//! });
//! Server::builder()
//!     .tls_config(tls)?
//!     .layer(peer) // the outer layer: runs first
//!     .layer(RateLimitLayer::new(limiter).key(PeerIp).grpc())
//!     .add_service(GreeterServer::new(greeter))
//! ```
//!
//! A gRPC method is the path `/package.Service/Method`, so
//! [`RoutePolicies`](crate::rate_limit::RoutePolicies) (in code or from a
//! policy file's `[[routes]]`) and [`RouteTiers`](crate::shed::RouteTiers)
//! (in code or from a policy file's `[[shed_routes]]`,
//! [`RouteTiers::from_file`](crate::shed::RouteTiers::from_file)) pick a
//! policy or a shedding tier per method, and a rule ending in `*`
//! (`/package.Service/*`) covers a whole service. Add such a layer with
//! `Server::builder().layer(..)`: inside an axum router's `route_layer`,
//! the matched route is tonic's `/package.Service/{*rest}`.
//!
//! A layer on `Server::builder()` sees every service of the server,
//! gRPC health checking (`/grpc.health.v1.Health/*`) and reflection
//! included: a load balancer's probes would spend a caller's budget (or,
//! keyed by [`PeerIp`](crate::key::PeerIp), the prober's). To exempt them,
//! limit by method with rules for your own services and no default: a
//! method no rule matches passes unlimited. For the shedders, give them a
//! rule to the `critical` tier, which is never shed.
//!
//! ```
//! use fleetgate::key::HeaderKey;
//! use fleetgate::rate_limit::RoutePolicies;
//! use fleetgate::shed::{RouteTiers, Tiers};
//! use fleetgate::spec::PolicySpec;
//! use fleetgate::{Limiter, MemoryStore, RateLimitLayer};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let policy = "100/s".parse::<PolicySpec>()?.build("greeter")?;
//! let limiter = Limiter::new(policy, MemoryStore::new());
//! // Only the greeter is limited; health checks and reflection are not.
//! let routes = RoutePolicies::new().route(None, "/fleetgate.demo.Greeter/*", limiter)?;
//! let layer = RateLimitLayer::per_route(routes)?
//!     .key(HeaderKey::new("x-api-key"))
//!     .grpc();
//! // Never shed health checks; the rest as the shedder's default tier.
//! let tiers = RouteTiers::new(&Tiers::default())
//!     .route(None, "/grpc.health.v1.Health/*", "critical")?;
//! # let _ = (layer, tiers);
//! # Ok(()) }
//! ```
//!
//! # Streaming calls
//!
//! [`ConcurrencyLimitLayer`](crate::ConcurrencyLimitLayer) and
//! [`FleetShedLayer`](crate::FleetShedLayer) hold a streaming call's lease
//! until its response stream ends or is dropped (the client cancelled, the
//! connection went away), renewing it while the stream runs, as for any
//! HTTP body. A rate limit counts a call once, when it starts. To limit
//! the messages of a stream, ask a [`Limiter`](crate::Limiter) for each
//! one in the handler, and end the call with the status a layer would
//! send:
//!
//! ```
//! use std::time::Duration;
//! use fleetgate::spec::PolicySpec;
//! use fleetgate::{Key, Limiter, MemoryStore};
//! use tonic::{Code, Status};
//!
//! /// Admits one message of `caller`'s stream, or the status ending the call.
//! async fn admit_message(limiter: &Limiter, caller: &Key) -> Result<(), Status> {
//!     let decision = limiter
//!         .check(caller, 1)
//!         .await
//!         .map_err(|err| Status::unavailable(format!("rate limiter unavailable: {err}")))?;
//!     if decision.is_allowed() {
//!         return Ok(());
//!     }
//!     let mut status = Status::resource_exhausted("too many messages on this stream");
//!     if let Some(after) = decision.retry_after() {
//!         let ms = u64::try_from(after.as_millis()).unwrap_or(u64::MAX);
//!         status.metadata_mut().insert("grpc-retry-pushback-ms", ms.into());
//!     }
//!     Err(status)
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // 10 messages a second per caller, bursts of 20.
//! let policy = "10/s burst 20".parse::<PolicySpec>()?.build("messages")?;
//! let limiter = Limiter::new(policy, MemoryStore::new());
//! let caller = Key::new("tenant-42");
//! // In a client-streaming handler: `while let Some(msg) = stream.message().await? {`
//! for _message in 0..20 {
//!     admit_message(&limiter, &caller).await?;
//! }
//! let status = admit_message(&limiter, &caller).await.unwrap_err();
//! assert_eq!(status.code(), Code::ResourceExhausted);
//! # Ok(()) }
//! ```
//!
//! A server-streaming handler that should slow down rather than fail can
//! [`reserve`](crate::Limiter::reserve) each message's slot and sleep
//! until it.
//!
//! # Clients
//!
//! Around a tonic `Channel`, [`wait_up_to`](crate::RateLimitLayer::wait_up_to)
//! makes calls wait for their slot, and
//! [`upstream_feedback(RetryAfter::new())`](crate::rate_limit::RetryAfter)
//! reads a server's `RESOURCE_EXHAUSTED` or `UNAVAILABLE` with
//! `grpc-retry-pushback-ms` and pauses that identity for every instance
//! sharing the store. A status in the response headers (a server that
//! refuses before answering: fleetgate's refusals, a tonic handler
//! returning an error) is recorded before the response is handed back;
//! one in the trailers after a streamed reply, when the trailers are read
//! (on Redis, by a task of its own). With `.grpc()`, a call waits no
//! longer than its deadline (`grpc-timeout`, which a tonic client sends
//! but does not enforce while the layer waits), and a call the client
//! layer itself refuses (its slot is past `max_wait` or the deadline)
//! fails at once, uncharged, with `RESOURCE_EXHAUSTED` as well.
//!
//! ```no_run
//! use std::time::Duration;
//! use fleetgate::key::GlobalKey;
//! use fleetgate::rate_limit::RetryAfter;
//! use fleetgate::spec::PolicySpec;
//! use fleetgate::{Limiter, MemoryStore, RateLimitLayer};
//! use tonic::transport::Channel;
//! use tower::ServiceBuilder;
//!
//! # async fn client() -> Result<(), Box<dyn std::error::Error>> {
//! let policy = "20/s".parse::<PolicySpec>()?.build("upstream")?;
//! let channel = Channel::from_static("http://127.0.0.1:50051").connect().await?;
//! let limited = ServiceBuilder::new()
//!     .layer(
//!         RateLimitLayer::new(Limiter::new(policy, MemoryStore::new()))
//!             .key(GlobalKey::new())
//!             .wait_up_to(Duration::from_secs(5))
//!             .upstream_feedback(RetryAfter::new())
//!             .grpc(),
//!     )
//!     .service(channel);
//! // Any generated client takes it: `GreeterClient::new(limited)`.
//! let _client = tonic::client::Grpc::new(limited);
//! # Ok(()) }
//! ```
//!
//! To retry failed calls without multiplying a failing server's load,
//! [`retry`] (feature `grpc`) runs a call through a fleet-wide
//! [`rate_limit::RetryBudget`](crate::rate_limit::RetryBudget), following the
//! server's pushback.

#[cfg(feature = "grpc")]
use std::future::Future;
#[cfg(feature = "grpc")]
use std::time::Duration;

#[cfg(feature = "grpc")]
use crate::rate_limit::RetryBudget;
#[cfg(feature = "grpc")]
use crate::rate_limit::budget::backoff;

/// The longest pushback [`retry`] waits for: a server that asks for more
/// is not asking for a retry.
#[cfg(feature = "grpc")]
const MOST_PUSHBACK: Duration = Duration::from_secs(10);

/// Makes a gRPC call with `call`, retrying it up to `max_retries` times
/// while `budget` allows, as gRPC's own retry policy (gRFC A6) would:
///
/// - `UNAVAILABLE` is retried, and `RESOURCE_EXHAUSTED` when the server
///   says when (`grpc-retry-pushback-ms`); other statuses are returned;
/// - a pushback of `N` ms waits `N` ms before the retry; a negative or
///   unreadable one, or one above 10 s, means "do not retry"; without
///   one, a random delay up to 50 ms, doubled at each retry;
/// - each first call deposits in the budget, and each retry withdraws a
///   token from it first ([`RetryBudget::withdraw`], which asks the store
///   when this instance holds none): without one, the last status is
///   returned.
///
/// Only retry calls that are safe to make twice.
///
/// ```no_run
/// use std::sync::Arc;
/// use fleetgate::MemoryStore;
/// use fleetgate::rate_limit::RetryBudget;
/// use tonic::transport::Channel;
///
/// # async fn client(channel: Channel) -> Result<(), Box<dyn std::error::Error>> {
/// let budget = RetryBudget::new(Arc::new(MemoryStore::new())).build("greeter")?;
/// let mut grpc = tonic::client::Grpc::new(channel);
/// let answer = fleetgate::grpc::retry(&budget, 3, || {
///     // A generated client's call: `client.say_hello(request.clone())`.
///     let mut grpc = grpc.clone();
///     async move {
///         grpc.ready().await.map_err(|e| tonic::Status::unavailable(e.to_string()))?;
///         Ok::<_, tonic::Status>(())
///     }
/// })
/// .await?;
/// # let _ = answer;
/// # Ok(()) }
/// ```
#[cfg(feature = "grpc")]
pub async fn retry<T, F, Fut>(
    budget: &RetryBudget,
    max_retries: u32,
    mut call: F,
) -> Result<T, tonic::Status>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, tonic::Status>>,
{
    budget.deposit();
    let mut retries = 0;
    loop {
        let status = match call().await {
            Ok(answer) => return Ok(answer),
            Err(status) => status,
        };
        if retries >= max_retries {
            return Err(status);
        }
        let pushback = status
            .metadata()
            .get("grpc-retry-pushback-ms")
            .map(|value| {
                value
                    .to_str()
                    .ok()
                    .and_then(|text| text.trim().parse::<i64>().ok())
            });
        use tonic::Code::{ResourceExhausted, Unavailable};
        let delay = match (status.code(), pushback) {
            (Unavailable | ResourceExhausted, Some(Some(ms))) if ms >= 0 => {
                Duration::from_millis(ms.unsigned_abs())
            }
            (Unavailable, None) => backoff(Duration::from_millis(50), retries),
            // Another status, RESOURCE_EXHAUSTED without a pushback, or a
            // negative or unreadable one: the server says not to retry.
            _ => return Err(status),
        };
        if delay > MOST_PUSHBACK || !budget.withdraw().await {
            return Err(status);
        }
        retries += 1;
        tokio::time::sleep(delay).await;
    }
}
