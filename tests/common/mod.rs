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

use std::path::PathBuf;
use std::time::Duration;

/// A new directory for the config files of cluster nodes and sentinels,
/// on tmpfs (`/dev/shm`) where there is one. Both `fsync` their config
/// file in their main thread on every failover vote and epoch change: on
/// a disk busy with a build's writeback that stalls every master at once
/// for hundreds of milliseconds (measured: 16 to 48 calls on the healthy
/// masters' slots timed out during one promotion), which would test the
/// disk, not the client. On tmpfs the `fsync` returns at once.
#[allow(dead_code)] // only the cluster and Sentinel tests keep files
pub fn config_dir(name: &str) -> PathBuf {
    use std::hash::BuildHasher;
    let shm = std::path::Path::new("/dev/shm");
    let base = if shm.is_dir() {
        shm.to_path_buf()
    } else {
        std::env::temp_dir()
    };
    let unique = std::collections::hash_map::RandomState::new().hash_one(std::time::Instant::now())
        % 1_000_000;
    let dir = base.join(format!("fleetgate-{name}-{}-{unique}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a directory for the servers' config files");
    dir
}

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
