//! The Redis store under trouble and at scale: Redis down or slow,
//! batching of calls on one connection, Redis Cluster, concurrency leases
//! through faults, the local fallback while Redis is gone, and an axum
//! router under load while Redis is hung, killed, paused or stripped of its
//! scripts (`faults`). Every test starts its own private redis-server on a
//! free loopback port.
//!
//! The `faults` tests bound every request's latency, so they need the
//! machine to themselves: each holds `machine::alone()` for its whole run,
//! as does a test that waits for a store warning through the process's
//! once-a-second gate; every other test holds `machine::shared()` (the
//! check below makes sure).
#[path = "../common/mod.rs"]
mod common;
/// The app behind the response-cost tests (after, refused_writes).
#[path = "../common/response_cost.rs"]
mod response_cost;

mod adjust;
mod after;
mod batching;
mod cluster;
#[cfg(feature = "cluster")]
mod cluster_failover;
mod faults;
mod hot_keys;
mod leases;
mod live;
mod local_fallback;
mod private_server;
#[cfg(feature = "cluster")]
mod redis_cluster;
mod redis_down;
mod refused_writes;
mod reset;
#[cfg(feature = "sentinel")]
mod sentinel;
#[cfg(feature = "tls-rustls")]
mod tls;
mod upstream_headers;

/// Turns at the machine. Tests of this binary run side by side, each
/// holding a shared turn, except a `faults` test, which waits until no
/// other test runs and keeps the others waiting until it ends. (Fair: a
/// `faults` test waiting is not overtaken by shared turns asked after it.)
/// Sharing the binary untouched, a `faults` test starved by its
/// neighbours sent under half of its requests.
mod machine {
    use tokio::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

    static MACHINE: RwLock<()> = RwLock::const_new(());

    /// A turn shared with the binary's other tests, held until dropped:
    /// the first line of every test but the `faults` ones.
    pub async fn shared() -> RwLockReadGuard<'static, ()> {
        MACHINE.read().await
    }

    /// [`shared`] for a test without a runtime.
    pub fn shared_blocking() -> RwLockReadGuard<'static, ()> {
        MACHINE.blocking_read()
    }

    /// The machine to this test alone, held until dropped: the first line
    /// of every `faults` test and of the few others that need it (each
    /// says why).
    pub async fn alone() -> RwLockWriteGuard<'static, ()> {
        MACHINE.write().await
    }
}

/// Every test of the binary's modules takes its turn at the machine first
/// thing: a test forgetting it would run beside the `faults` tests and
/// skew their latencies.
#[test]
fn every_test_takes_its_turn_at_the_machine() {
    let _shared = machine::shared_blocking();
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/redis");
    let mut tests = 0;
    for entry in std::fs::read_dir(&dir).expect("tests/redis") {
        let path = entry.expect("a directory entry").path();
        if path.extension().is_none_or(|ext| ext != "rs") || path.ends_with("main.rs") {
            continue;
        }
        let source = std::fs::read_to_string(&path).expect("a test module");
        for test in source
            .split("\n#[tokio::test")
            .skip(1)
            .chain(source.split("\n#[test]").skip(1))
        {
            // The attribute, the signature, then the body's first statement.
            let mut lines = test.lines().skip_while(|line| !line.ends_with('{'));
            let first = lines.nth(1).unwrap_or_default().trim();
            let turn = [
                "let _shared = crate::machine::shared().await;",
                "let _shared = crate::machine::shared_blocking();",
                "let _alone = crate::machine::alone().await;",
            ];
            assert!(
                turn.contains(&first),
                "a test in {} starts with `{first}`, not its turn at the machine:\n{test}",
                path.display()
            );
            tests += 1;
        }
    }
    assert!(tests >= 42, "found only {tests} tests in {}", dir.display());
}
