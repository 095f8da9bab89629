//! Load shedding: under overload, drop the least important traffic first so
//! that critical traffic keeps working.
//!
//! Requests are put into priority [`Tiers`] by a classifier
//! ([`RouteTiers`], [`HeaderTier`] or any closure); unclassified requests
//! fall into the set's default tier (`normal` in the default set). The most
//! important tier is never shed. Two layers shed, both with
//! `503 Service Unavailable` and `Retry-After`:
//!
//! - [`FleetShedLayer`]: one count of requests in flight for the whole
//!   fleet (a lease set in Redis, or the in-process
//!   [`MemoryStore`](crate::MemoryStore) for one instance), with a fleet
//!   capacity of which each tier may use only its share
//!   ([`FleetShedPolicy`]). A request is admitted while fewer requests
//!   than its tier's limit are in flight; the most important tier is always
//!   admitted, and counted, so the tiers below see the room it takes. One
//!   round trip to admit, one to release, with the concurrency limiter's
//!   leases: held until the response body ends, given back when the
//!   client goes away or the handler panics, expiring after their TTL if
//!   the instance crashes.
//! - [`UtilizationShedLayer`]: local to the process. It watches
//!   utilization (its own requests in flight over a worker capacity, or a
//!   gauge you supply); above 0.8 it drops the least important tier with
//!   rising probability, then the next, at a speed proportional to how far
//!   above: fully saturated, after 28 s, then 120 s from shedding nothing
//!   to shedding everything sheddable; at 0.9 twice as long (56 s, 240 s),
//!   at 0.85 four times (112 s, 480 s). Below 0.7 it recovers as
//!   proportionally: idle, in 120 s ([`UtilizationConfig`]). Its clock and
//!   coin are injectable.
//!
//! ```
//! use std::time::Duration;
//! use axum::{routing::{get, post}, Router};
//! use fleetgate::shed::{
//!     FleetShedLayer, FleetShedPolicy, FleetShedder, RouteTiers, Tiers, UtilizationShedLayer,
//!     UtilizationShedder,
//! };
//! use fleetgate::MemoryStore;
//! use http::Method;
//!
//! # fn main() -> Result<(), fleetgate::ConfigError> {
//! let tiers = Tiers::default(); // critical, high, normal, low
//! let routes = RouteTiers::new(&tiers)
//!     .route(Some(Method::POST), "/api/charge", "critical")?
//!     .route(None, "/api/report", "low")?;
//! // 200 in flight across the fleet (a RedisStore shares the count), of
//! // which reports may use a quarter.
//! let policy = FleetShedPolicy::builder("api", 200).share("low", 0.25).build()?;
//! let fleet = FleetShedder::new(policy, MemoryStore::new());
//! // This process has 64 workers.
//! let local = UtilizationShedder::workers(64).build()?;
//! let app: Router = Router::new()
//!     .route("/api/charge", post(|| async { "charged" }))
//!     .route("/api/report", get(|| async { "report" }))
//!     .route_layer(FleetShedLayer::new(fleet.clone()).classify(routes.clone()))
//!     .route_layer(UtilizationShedLayer::new(local.clone()).classify(routes));
//! // For dashboards: per tier, in flight and shed so far.
//! let low = fleet.state().tier("low").map(|t| t.shed());
//! # assert_eq!(low, Some(0));
//! # Ok(()) }
//! ```
//!
//! Both shedders expose their state per tier ([`FleetShedder::state`],
//! [`UtilizationShedder::state`]: in flight here, admitted and shed so far,
//! how much of the tier is being shed now: the drop probability, or for
//! the fleet shedder the share of the tier's recent requests it shed, see
//! [`TierState::shed_fraction`]) and, with the `metrics` feature, publish
//! it as `fleetgate_shed_in_flight`, `fleetgate_shed_fraction` and
//! `fleetgate_shed_total` by layer, policy and tier; their decisions count
//! in `fleetgate_decisions_total` with the outcome `shed` (or, for requests
//! the fleet shedder's local fallback decided while the store was down,
//! `fallback_denied`; its sheds count in `fleetgate_shed_total` all the
//! same). [`FleetShedLayer::typed_errors`] and
//! [`UtilizationShedLayer::typed_errors`] refuse with a [`ShedError`] for
//! services that are not HTTP.
//!
//! Use `Router::route_layer` to shed only matched routes ([`RouteTiers`]
//! then sees axum's matched path, such as `/users/{id}`), or
//! `Router::layer` to shed everything that reaches the router (it then
//! matches the URI path). Every service clone axum makes shares one
//! shedder: the state is in the store, or behind an `Arc`.
//!
//! A store failure in the fleet shedder follows its
//! [`FailurePolicy`](crate::FailurePolicy) (open by default; `Local` sheds
//! on an in-memory shedder with a share of the capacity and of each
//! tier's limit), except that the most important tier passes whatever the
//! policy.

mod error;
mod fleet;
mod layer;
mod random;
mod rejection;
mod state;
mod tier;
mod utilization;

pub use self::error::ShedError;
pub use self::fleet::{
    FleetShed, FleetShedBody, FleetShedLayer, FleetShedPolicy, FleetShedPolicyBuilder,
    FleetShedder, ResponseFuture as FleetShedFuture,
};
pub use self::layer::{ShedLayer, Shedder};
pub use self::random::{Random, ThreadRandom};
pub use self::rejection::{ShedRejection, ShedRejectionKind};
pub use self::state::{ShedState, TierSlot, TierState};
pub use self::tier::{Classify, HeaderTier, MAX_TIERS, RouteTiers, Tier, Tiers, Unclassified};
pub use self::utilization::{
    ResponseFuture as UtilizationShedFuture, UtilizationConfig, UtilizationShed,
    UtilizationShedBody, UtilizationShedLayer, UtilizationShedder, UtilizationShedderBuilder,
};
