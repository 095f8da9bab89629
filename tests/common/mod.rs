//! Helpers shared by the integration tests.

/// Log lines of the current thread, captured.
pub mod logs;
/// A throwaway Redis Cluster (`tests/redis/cluster.rs`, `tests/alone`).
#[cfg(feature = "cluster")]
pub mod redis_cluster;
pub mod redis_server;
pub mod sentinel;

pub use redis_server::RedisServer;
pub mod stats;
/// Certificates and TLS-only servers (`tests/redis/tls.rs`).
#[cfg(feature = "tls-rustls")]
pub mod tls;

use std::time::Duration;

/// A store whose Redis is never there: port 1 of loopback, where nothing
/// listens. (A free port is no good: another test of the binary may start
/// its server there.) Calls fail at once, or within `timeout`.
#[allow(dead_code)] // not every test binary fails its store
pub async fn unreachable_store(timeout: Duration) -> fleetgate::RedisStore {
    fleetgate::RedisStore::builder("redis://127.0.0.1:1")
        .timeout(timeout)
        .lazy()
        .connect()
        .await
        .expect("a lazy store inside a runtime")
}

/// A store on the test's own server, with a timeout generous enough for a
/// loaded machine.
#[allow(dead_code)] // not every test binary needs a plain store
pub async fn redis_store(server: &RedisServer) -> fleetgate::RedisStore {
    fleetgate::RedisStore::builder(server.url())
        .timeout(Duration::from_secs(2))
        .connect()
        .await
        .expect("connect to the test's redis-server")
}
