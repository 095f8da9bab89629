//! Helpers shared by the integration tests.
#![allow(dead_code)]

pub mod handlers;
pub mod redis_server;

pub use redis_server::RedisServer;
pub mod redis_cluster;
pub mod stats;

use std::time::Duration;

/// A memory store on tokio's clock, for tests with paused time: the
/// default clock (the CPU's counter) does not follow `tokio::time::pause`.
pub fn paused_memory_store() -> fleetgate::MemoryStore {
    fleetgate::MemoryStore::builder()
        .clock(fleetgate::clock::MonotonicClock::new())
        .build()
}

/// A store whose Redis is never there: port 1 of loopback, where nothing
/// listens. (A free port is no good: another test of the binary may start
/// its server there.) Calls fail at once, or within `timeout`.
pub fn unreachable_store(timeout: Duration) -> fleetgate::RedisStore {
    fleetgate::RedisStore::builder()
        .timeout(timeout)
        .connect_lazy("redis://127.0.0.1:1")
        .expect("a lazy store inside a runtime")
}

/// A store on the test's own server, with a timeout generous enough for a
/// loaded machine.
pub async fn redis_store(server: &RedisServer) -> fleetgate::RedisStore {
    fleetgate::RedisStore::builder()
        .timeout(Duration::from_secs(2))
        .connect(&server.url())
        .await
        .expect("connect to the test's redis-server")
}
