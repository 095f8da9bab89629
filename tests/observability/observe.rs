//! `fleetgate::observe`: the snapshot fed by the layers' decisions. Its
//! registry is the process's, so each test reads only its own policies.
use crate::common;

use std::time::Duration;

use axum::Router;
use axum::routing::get;
use common::RedisServer;
use fleetgate::concurrency::{ConcurrencyLimitLayer, ConcurrencyLimiter, ConcurrencyPolicy};
use fleetgate::key::HeaderKey;
use fleetgate::observe::{self, PolicySnapshot};
use fleetgate::{Limiter, MemoryStore, RateLimitLayer, RedisStore};
use http::StatusCode;

use crate::metrics::{policy, respond, router, status};

fn find(layer: &str, name: &str) -> PolicySnapshot {
    observe::snapshot()
        .policies
        .into_iter()
        .find(|p| p.layer == layer && p.policy == name)
        .unwrap_or_else(|| panic!("{layer} {name} not in the snapshot"))
}

#[tokio::test]
async fn decisions_and_the_most_denied_identities_are_listed() {
    let app = router(
        RateLimitLayer::new(Limiter::new(policy("o-top", 2), MemoryStore::new()))
            .key(HeaderKey::new("x-api-key")),
    );
    for _ in 0..2 {
        assert_eq!(status(&app, Some("noisy")).await, StatusCode::OK);
        assert_eq!(status(&app, Some("quiet")).await, StatusCode::OK);
    }
    for _ in 0..5 {
        let refused = status(&app, Some("noisy")).await;
        assert_eq!(refused, StatusCode::TOO_MANY_REQUESTS);
    }
    assert_eq!(
        status(&app, Some("quiet")).await,
        StatusCode::TOO_MANY_REQUESTS
    );
    let seen = find("rate_limit", "o-top");
    assert_eq!(seen.decisions.allowed, 4);
    assert_eq!(seen.decisions.denied, 6);
    let counts: Vec<u64> = seen.top_denied.iter().map(|d| d.denials).collect();
    assert_eq!(counts, [5, 1], "{:?}", seen.top_denied);
    for listed in &seen.top_denied {
        assert_eq!(listed.identity.len(), 16);
        assert!(!listed.identity.contains("noisy") && !listed.identity.contains("quiet"));
    }
}

#[tokio::test]
async fn leases_in_use_are_counted_while_held() {
    let policy = ConcurrencyPolicy::new("o-leases", 3).unwrap();
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .route_layer(
            ConcurrencyLimitLayer::new(ConcurrencyLimiter::new(policy, MemoryStore::new()))
                .key(HeaderKey::new("x-api-key")),
        );
    let before = find("concurrency", "o-leases");
    assert_eq!(before.leases_in_use, Some(0));
    assert_eq!(before.capacity, Some(3));
    // Each response holds its lease until its body is dropped.
    let first = respond(&app, "a").await;
    let second = respond(&app, "b").await;
    assert_eq!(find("concurrency", "o-leases").leases_in_use, Some(2));
    drop(first);
    drop(second);
    assert_eq!(find("concurrency", "o-leases").leases_in_use, Some(0));
}

#[tokio::test]
async fn redis_round_trips_and_their_latency_are_listed() {
    let server = RedisServer::start();
    let store = RedisStore::builder()
        .prefix("observe-up")
        .connect(&server.url())
        .await
        .unwrap();
    let app = router(
        RateLimitLayer::new(Limiter::new(policy("o-redis", 2), store))
            .key(HeaderKey::new("x-api-key")),
    );
    let before = observe::snapshot().store;
    for _ in 0..4 {
        status(&app, Some("timed")).await;
    }
    let after = observe::snapshot().store;
    // Other tests may add their own round trips: at least ours.
    assert!(after.calls >= before.calls + 3, "{before:?} -> {after:?}");
    let (p50, p99) = (after.p50_us.unwrap(), after.p99_us.unwrap());
    assert!(p50 > 0 && p50 <= p99, "{after:?}");
    let seen = find("rate_limit", "o-redis");
    assert_eq!((seen.decisions.allowed, seen.decisions.denied), (2, 2));
    assert_eq!(seen.top_denied.len(), 1, "the store's refusals count too");
}

#[tokio::test]
async fn a_watch_sends_fresh_snapshots() {
    let app = router(
        RateLimitLayer::new(Limiter::new(policy("o-watch", 5), MemoryStore::new()))
            .key(HeaderKey::new("x-api-key")),
    );
    let mut snapshots = observe::watch(Duration::from_millis(20));
    let first = snapshots.borrow_and_update().clone();
    status(&app, Some("w")).await;
    // Waits on the next snapshot that saw the decision (a generous bound
    // for a busy machine, not a pace).
    let seen = tokio::time::timeout(
        Duration::from_secs(30),
        snapshots.wait_for(|s| {
            s.policies
                .iter()
                .any(|p| p.policy == "o-watch" && p.decisions.allowed == 1)
        }),
    )
    .await
    .expect("a snapshot within 30 s")
    .expect("the watch runs")
    .clone();
    assert!(seen.at_ms >= first.at_ms);
    // No LivePolicies heartbeat in this binary: the fleet is not counted.
    assert_eq!(seen.instances, None);
}
