//! Load shedding: under overload, drop the least important traffic first so
//! that critical traffic keeps working.
//!
//! Requests are put into priority [`Tiers`], ordered most important first
//! ([`Tiers::default`]: `critical`, `high`, `normal`, `low`; `Tiers::new`
//! for your own, 2 to 16). A classifier puts each request in a tier: a
//! [`RouteTiers`] table (method and matched path, `*` for prefixes), a
//! [`HeaderTier`] reading a tier name that an upstream gateway sets (only
//! behind a gateway that overwrites it), or any closure
//! `Fn(&Request, &Tiers) -> Option<Tier>`; unclassified requests fall into
//! the set's default tier (`normal` in the default set; `.default_tier(..)`
//! to change it). Two layers shed:
//! [`FleetShedLayer`] gives each tier a share of the fleet's capacity, and
//! [`UtilizationShedLayer`] sheds when this process has been busy a while.
//!
//! | | [`FleetShedLayer`] | [`UtilizationShedLayer`] |
//! |---|---|---|
//! | measures | requests in flight across the fleet: one lease set in Redis (`fleetgate:<policy>:{shed:fleet}:lease`, apart from any concurrency limit's), or the [`MemoryStore`](crate::MemoryStore) for one instance | this process's utilization: its own requests in flight (averaged over the second between samples) over `workers(n)`, or a `gauge(f)` you supply |
//! | sheds a request when | the fleet has at least its tier's limit in flight: `floor(share × capacity)`, by default evenly from 5/6 (`high`) to 1/2 (`low`) | its tier's drop probability says so. Above 0.8 utilization the least important tier is dropped with rising probability, then the next, at a speed proportional to how far above: at 1, nothing for 28 s, then 120 s from nothing to everything sheddable; at 0.9 twice as long (56 s, 240 s); at 0.85 four times (112 s, 480 s). 0.7–0.8 holds. Below 0.7 it recovers as proportionally: idle, 120 s from everything to nothing |
//! | most important tier | always admitted, and counted so the tiers below see the room it takes | never shed |
//! | cost | one round trip to admit, one to release (the concurrency limiter's leases: held until the body ends, released on cancel or panic, expiring after the TTL if an instance crashes) | none: a few atomics, no I/O |
//! | answer | `503`, `Retry-After: 1` (`.retry_after(..)`, `.rejection(..)`, `.typed_errors()` for [`ShedError`]) | `503`, `Retry-After: 5` (same settings) |
//! | store down | its [`FailurePolicy`](crate::FailurePolicy): open (default), closed, or `local(share)`, an in-memory shedder of this process with that share of the capacity and of each tier's limit; the most important tier passes whatever the policy | not involved |
//! | shadow mode (`.shadow(true)`) | nothing is shed: a request that would be is let through without a lease, counted `shadow_denied`, not `shed` | nothing is shed: a request that would be is let through, counted `shadow_denied`; the drop probability moves as ever (see [`UtilizationShedLayer::shadow`]) |
//! | configured by | [`FleetShedPolicy::builder`]`(name, capacity).share(tier, f).lease_ttl(..)` | [`UtilizationShedder::workers`]`(n)` or `::gauge(f)`, then `.thresholds(0.7, 0.8).delay(..).ramp(..)`, `.sample_every(..)`, `.clock(..)`, `.random(..)`, `.build()?` |
//!
//! `share(tier, f)` sets one tier's share; the tiers you leave out keep
//! their defaults only as far as the order allows, so `.share("low", 0.9)`
//! alone also raises `normal` (default 2/3) to 0.9.
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
//! same); in shadow mode ([`FleetShedLayer::shadow`],
//! [`UtilizationShedLayer::shadow`]) what they would shed is let through
//! and counts as `shadow_denied` instead, never as shed.
//! [`FleetShedLayer::typed_errors`] and
//! [`UtilizationShedLayer::typed_errors`] refuse with a [`ShedError`] for
//! services that are not HTTP.
//!
//! Where a type must be written: `FleetShedLayer` has no classifier
//! (`()`), `FleetShedLayer<RouteTiers>` classifies by route, and
//! `.typed_errors()` makes it `FleetShedLayer<C, mode::TypedErrors>`
//! ([`mode`](crate::mode)); the same for [`UtilizationShedLayer`]. The
//! services' response futures and bodies have no names of their own:
//! `<FleetShed<S, C, M> as Service<Req>>::Future` and `::Response` name
//! them.
//!
//! Use `Router::route_layer` to shed only matched routes ([`RouteTiers`]
//! then sees axum's matched path, such as `/users/{id}`), or
//! `Router::layer` to shed everything that reaches the router (it then
//! matches the URI path). Every service clone axum makes shares one
//! shedder: the state is in the store, or behind an `Arc`.

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
    FleetShed, FleetShedLayer, FleetShedPolicy, FleetShedPolicyBuilder, FleetShedder,
};
pub use self::rejection::{ShedRejection, ShedRejectionKind};
pub use self::state::{ShedState, TierState};
pub use self::tier::{HeaderTier, RouteTiers, Tier, Tiers};
pub use self::utilization::{
    UtilizationShed, UtilizationShedLayer, UtilizationShedder, UtilizationShedderBuilder,
};
