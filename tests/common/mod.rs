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

/// One `check` of the conformance suites, through both of `Limiter`'s
/// APIs: on the memory store (`store` is `"memory"`) every other call
/// (counted by `checks`) is decided with `check_now` (at once, no future),
/// the rest with `check`, so that every scenario's exact decisions hold
/// for both. On Redis, `check_now` must answer only a cost no limit could
/// admit, and then as `check` does.
pub async fn check_both_ways(
    store: &str,
    checks: &std::sync::atomic::AtomicUsize,
    limiter: &fleetgate::Limiter,
    key: &str,
    cost: u64,
) -> fleetgate::Decision {
    let key = fleetgate::Key::new(key);
    let at_once = checks.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % 2 == 1;
    if store == "memory" && at_once {
        return limiter
            .check_now(&key, cost)
            .expect("the memory store decides at once");
    }
    let now = (store == "redis").then(|| limiter.check_now(&key, cost));
    let decision = limiter
        .check(&key, cost)
        .await
        .unwrap_or_else(|err| panic!("{store}: store error: {err}"));
    if let Some(now) = now {
        let impossible = cost > limiter.policy().max_cost();
        assert_eq!(now, impossible.then(|| decision.clone()));
    }
    decision
}
