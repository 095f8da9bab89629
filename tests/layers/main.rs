//! The tower layers as a service sees them: rate limiting over HTTP (per
//! route, outbound), concurrency limiting, load shedding (by tier and by
//! utilization), shadow mode on each, and the lease guard that holds a
//! slot until a response's body ends; on the memory store, and for some
//! scenarios (response cost, leases, shadow mode) on both stores, Redis on
//! a private redis-server.
#[path = "../common/mod.rs"]
mod common;
/// The app behind the response-cost tests (after).
#[path = "../common/response_cost.rs"]
mod response_cost;

mod adaptive;
mod after;
mod concurrency;
mod handlers;
mod http;
mod lease_guard;
mod lists;
mod live;
mod outbound;
mod per_route;
mod shadow;
mod shedding;
mod throttle;
mod upstream_headers;
mod utilization_shedding;
mod wait_queue;

/// A memory store on tokio's clock, for tests with paused time: the
/// default clock (the CPU's counter) does not follow `tokio::time::pause`.
fn paused_memory_store() -> fleetgate::MemoryStore {
    fleetgate::MemoryStore::builder()
        .clock(fleetgate::clock::MonotonicClock::new())
        .build()
}
