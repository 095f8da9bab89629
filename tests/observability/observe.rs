//! `fleetgate::observe`: the snapshot fed by the layers' decisions. Its
//! registry is the process's, so each test reads only its own policies.
use crate::common;

use std::time::{Duration, Instant};

use axum::Router;
use axum::routing::get;
use common::RedisServer;
use fleetgate::concurrency::{ConcurrencyLimitLayer, ConcurrencyLimiter, ConcurrencyPolicy};
use fleetgate::key::{HeaderKey, Key};
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
    let store = RedisStore::builder(server.url())
        .prefix("observe-up")
        .connect()
        .await
        .unwrap();
    let app = router(
        RateLimitLayer::new(Limiter::new(policy("o-redis", 2), store))
            .key(HeaderKey::new("x-api-key")),
    );
    let before = observe::snapshot().store;
    let mut slowest = Duration::ZERO;
    for _ in 0..4 {
        let sent = Instant::now();
        status(&app, Some("timed")).await;
        slowest = slowest.max(sent.elapsed());
    }
    let after = observe::snapshot().store;
    // Other tests may add their own round trips: at least ours.
    assert!(after.calls >= before.calls + 3, "{before:?} -> {after:?}");
    // A round trip is timed within its request: the median cannot pass
    // the slowest request (a bucket's upper end is within a fifth above),
    // unless most round trips of the window were other tests' and slower.
    let p50 = after.p50_us.unwrap();
    let bound = u64::try_from(slowest.as_micros()).unwrap() * 5 / 4 + 1;
    assert!(p50 <= bound, "p50 {p50} µs, slowest request {slowest:?}");
    let seen = find("rate_limit", "o-redis");
    assert_eq!((seen.decisions.allowed, seen.decisions.denied), (2, 2));
    assert_eq!(seen.top_denied.len(), 1, "the store's refusals count too");
}

#[tokio::test]
async fn store_errors_are_counted_once_redis_is_gone() {
    let server = RedisServer::start();
    let store = RedisStore::builder(server.url())
        .prefix("observe-down")
        .timeout(Duration::from_millis(500))
        .connect()
        .await
        .unwrap();
    let app = router(
        RateLimitLayer::new(Limiter::new(policy("o-down", 5), store))
            .key(HeaderKey::new("x-api-key")),
    );
    assert_eq!(status(&app, Some("up")).await, StatusCode::OK);
    let before = observe::snapshot().store;
    server.stop();
    // Fails open (the default): passed, and counted as a store error.
    assert_eq!(status(&app, Some("down")).await, StatusCode::OK);
    let after = observe::snapshot().store;
    assert!(after.errors > before.errors, "{before:?} -> {after:?}");
    assert_eq!(find("rate_limit", "o-down").decisions.fail_open, 1);
}

#[tokio::test]
async fn concurrency_refusals_list_the_identity() {
    let policy = ConcurrencyPolicy::new("o-busy", 1).unwrap();
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .route_layer(
            ConcurrencyLimitLayer::new(ConcurrencyLimiter::new(policy, MemoryStore::new()))
                .key(HeaderKey::new("x-api-key").unhashed()),
        );
    let held = respond(&app, "busy").await;
    let other = respond(&app, "calm").await;
    for _ in 0..3 {
        let refused = respond(&app, "busy").await.status();
        assert_eq!(refused, StatusCode::TOO_MANY_REQUESTS);
    }
    let seen = find("concurrency", "o-busy");
    assert_eq!(seen.decisions.denied, 3);
    assert_eq!(seen.leases_in_use, Some(2));
    let listed: Vec<(&str, u64)> = seen
        .top_denied
        .iter()
        .map(|d| (d.identity.as_str(), d.denials))
        .collect();
    let busy = observe::identity(&Key::new("hv:busy"));
    assert_eq!(listed, [(busy.as_str(), 3)]);
    drop((held, other));
}

#[tokio::test]
async fn ten_thousand_identities_keep_the_snapshot_small() {
    let app = router(
        RateLimitLayer::new(Limiter::new(policy("o-crowd", 1), MemoryStore::new()))
            .key(HeaderKey::new("x-api-key")),
    );
    let size = || {
        let seen = find("rate_limit", "o-crowd");
        (format!("{seen:?}").len(), seen)
    };
    let (empty, _) = size();
    // Each identity is admitted once, then denied once; one is denied 50
    // times more.
    for i in 0..10_000 {
        let who = format!("crowd-{i}");
        status(&app, Some(&who)).await;
        status(&app, Some(&who)).await;
    }
    for _ in 0..50 {
        status(&app, Some("crowd-7")).await;
    }
    let (crowded, seen) = size();
    assert_eq!(seen.decisions.denied, 10_050);
    assert_eq!(seen.top_denied.len(), 10);
    assert!(seen.top_denied[0].denials >= 51, "{:?}", seen.top_denied);
    // Ten identities of 16 hex digits and their counts: the same size
    // whatever the crowd (`Debug` stands for the JSON the demo sends).
    assert!(crowded <= empty + 10 * 64, "{empty} -> {crowded} bytes");
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

#[tokio::test]
async fn a_rebuilt_shedder_is_read_and_the_dropped_one_forgotten() {
    use fleetgate::shed::{FleetShedLayer, FleetShedPolicy, FleetShedder, HeaderTier};
    use http::{HeaderName, Request};
    use tower::ServiceExt;

    let app = |capacity: u64| {
        let policy = FleetShedPolicy::builder("o-rebuilt", capacity)
            .share("low", 0.5)
            .build()
            .unwrap();
        Router::new()
            .route("/", get(|| async { "ok" }))
            .route_layer(
                FleetShedLayer::new(FleetShedder::new(policy, MemoryStore::new()))
                    .classify(HeaderTier::new(HeaderName::from_static("x-priority"))),
            )
    };
    let call = |app: &Router| {
        let req = Request::get("/")
            .header("x-priority", "low")
            .body(axum::body::Body::empty())
            .unwrap();
        app.clone().oneshot(req)
    };
    let low = |seen: &PolicySnapshot| {
        let tier = seen.tiers.iter().find(|t| t.tier == "low").cloned();
        (seen.capacity, tier.map(|t| t.in_flight))
    };
    let first = app(10);
    let held = call(&first).await.unwrap();
    assert_eq!(low(&find("fleet_shed", "o-rebuilt")), (Some(10), Some(1)));
    // The router is rebuilt with a new shedder under the same name; the
    // old one's response ends.
    drop(first);
    drop(held);
    let second = app(20);
    let (a, b) = (call(&second).await.unwrap(), call(&second).await.unwrap());
    assert_eq!(low(&find("fleet_shed", "o-rebuilt")), (Some(20), Some(2)));
    drop(second);
    drop((a, b));
    // No layer left: no tiers, nothing kept alive.
    assert_eq!(low(&find("fleet_shed", "o-rebuilt")).1, None);
}
