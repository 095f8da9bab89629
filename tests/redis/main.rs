//! The Redis store under trouble and at scale: Redis down or slow,
//! batching of calls on one connection, Redis Cluster, concurrency leases
//! through faults, and the local fallback while Redis is gone. Every test
//! starts its own private redis-server on a free loopback port.
#[path = "../common/mod.rs"]
mod common;

mod batching;
mod cluster;
mod leases;
mod local_fallback;
mod private_server;
#[cfg(feature = "cluster")]
mod redis_cluster;
mod redis_down;
