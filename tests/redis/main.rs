//! The Redis store under trouble and at scale: Redis down or slow or
//! refusing writes, batching of calls on one connection, Redis Cluster,
//! concurrency leases through faults, the local fallback while Redis is
//! gone, live policies, hot keys, TLS. Every test starts its own private
//! redis-server on a free loopback port. (Tests whose bounds are latencies
//! or whose state is the process's run one at a time in tests/alone.)
#[path = "../common/mod.rs"]
mod common;
/// The app behind the response-cost tests (after, refused_writes; the
/// scenarios on both stores are in tests/layers/after.rs).
#[path = "../common/response_cost.rs"]
mod response_cost;

mod adjust;
mod after;
mod batching;
mod budget;
mod cluster;
mod hot_keys;
mod leases;
mod lists;
mod live;
mod local_fallback;
mod outbound_fleet;
mod penalty_box;
mod private_server;
mod redis_down;
mod refused_writes;
mod release_watch;
mod reset;
#[cfg(feature = "tls-rustls")]
mod tls;
mod upstream_headers;
