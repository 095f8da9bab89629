//! Metrics recorded for each outcome, read back through a test recorder.
//!
//! One recorder is installed for the whole test binary; each test uses its
//! own policy names, and readings accumulate under a lock (the debugging
//! recorder's snapshots drain counters), so tests running in parallel do
//! not disturb each other.
use crate::common;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::routing::get;
use common::RedisServer;
use fleetgate::concurrency::{ConcurrencyLimitLayer, ConcurrencyLimiter, ConcurrencyPolicy};
use fleetgate::key::HeaderKey;
use fleetgate::{
    FailurePolicy, Key, Limit, Limiter, MemoryStore, OnMissingKey, Policy, Rate, RateLimitLayer,
    RedisStore, StoreError,
};
use http::{Request, StatusCode};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use tower::ServiceExt;

struct Readings {
    snapshotter: Snapshotter,
    counters: HashMap<String, u64>,
    histograms: HashMap<String, usize>,
    gauges: HashMap<String, f64>,
}

fn readings() -> &'static Mutex<Readings> {
    static READINGS: OnceLock<Mutex<Readings>> = OnceLock::new();
    READINGS.get_or_init(|| {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        recorder
            .install()
            .expect("the only recorder of this binary");
        Mutex::new(Readings {
            snapshotter,
            counters: HashMap::new(),
            histograms: HashMap::new(),
            gauges: HashMap::new(),
        })
    })
}

/// `name{k=v,...}` with labels sorted, as the readings are keyed.
fn series(name: &str, labels: &[(&str, &str)]) -> String {
    let mut labels: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
    labels.sort();
    format!("{name}{{{}}}", labels.join(","))
}

fn take() -> std::sync::MutexGuard<'static, Readings> {
    let mut r = readings().lock().unwrap_or_else(|e| e.into_inner());
    for (key, _, _, value) in r.snapshotter.snapshot().into_vec() {
        let key = key.key();
        let labels: Vec<(&str, &str)> = key.labels().map(|l| (l.key(), l.value())).collect();
        let id = series(key.name(), &labels);
        match value {
            DebugValue::Counter(n) => *r.counters.entry(id).or_default() += n,
            DebugValue::Histogram(v) => *r.histograms.entry(id).or_default() += v.len(),
            // Snapshots drain gauges too: increments add up again here; a
            // gauge that is set reads right if set once between readings.
            DebugValue::Gauge(v) => *r.gauges.entry(id).or_default() += v.into_inner(),
        }
    }
    r
}

fn decisions(layer: &str, policy: &str, outcome: &str) -> u64 {
    let id = series(
        "fleetgate_decisions_total",
        &[("layer", layer), ("policy", policy), ("outcome", outcome)],
    );
    take().counters.get(&id).copied().unwrap_or(0)
}

fn near_limit(policy: &str) -> u64 {
    let id = series(
        "fleetgate_near_limit_total",
        &[("layer", "rate_limit"), ("policy", policy)],
    );
    take().counters.get(&id).copied().unwrap_or(0)
}

pub(crate) fn router<L>(layer: L) -> Router
where
    L: tower::Layer<axum::routing::Route> + Clone + Send + Sync + 'static,
    L::Service: tower::Service<Request<Body>, Error = std::convert::Infallible>
        + Clone
        + Send
        + Sync
        + 'static,
    <L::Service as tower::Service<Request<Body>>>::Response: axum::response::IntoResponse + 'static,
    <L::Service as tower::Service<Request<Body>>>::Future: Send + 'static,
{
    Router::new()
        .route("/", get(|| async { "ok" }))
        .route_layer(layer)
}

/// The response to one request, its body not read yet.
pub(crate) async fn respond(app: &Router, api_key: &str) -> http::Response<Body> {
    let mut req = Request::get("/")
        .header("x-api-key", api_key)
        .body(Body::empty())
        .unwrap();
    req.extensions_mut()
        .insert(ConnectInfo("192.0.2.1:1".parse::<SocketAddr>().unwrap()));
    app.clone().oneshot(req).await.unwrap()
}

pub(crate) async fn status(app: &Router, api_key: Option<&str>) -> StatusCode {
    let mut builder = Request::get("/");
    if let Some(key) = api_key {
        builder = builder.header("x-api-key", key);
    }
    let mut req = builder.body(Body::empty()).unwrap();
    let addr: SocketAddr = "192.0.2.1:4000".parse().unwrap();
    req.extensions_mut().insert(ConnectInfo(addr));
    app.clone().oneshot(req).await.unwrap().status()
}

pub(crate) fn policy(name: &str, burst: u64) -> Policy {
    Policy::single(
        name,
        Limit::builder(Rate::per_hour(burst))
            .burst(burst)
            .build()
            .unwrap(),
    )
    .unwrap()
}

#[tokio::test]
async fn allowed_denied_and_near_limit_are_counted() {
    // Handles are resolved on the first decision: install first.
    readings();
    let app = router(
        RateLimitLayer::new(Limiter::new(policy("m-basic", 10), MemoryStore::new()))
            .key(HeaderKey::new("x-api-key")),
    );
    for _ in 0..10 {
        assert_eq!(status(&app, Some("k")).await, StatusCode::OK);
    }
    for _ in 0..3 {
        assert_eq!(status(&app, Some("k")).await, StatusCode::TOO_MANY_REQUESTS);
    }
    assert_eq!(
        status(&app, None).await,
        StatusCode::BAD_REQUEST,
        "no key: refused"
    );
    assert_eq!(decisions("rate_limit", "m-basic", "allowed"), 10);
    assert_eq!(decisions("rate_limit", "m-basic", "denied"), 3);
    assert_eq!(decisions("rate_limit", "m-basic", "missing_key"), 1);
    // Remaining 1 and 0 are within a tenth of a burst of 10.
    assert_eq!(near_limit("m-basic"), 2);
}

#[tokio::test]
async fn shadow_denials_are_counted_apart() {
    // Handles are resolved on the first decision: install first.
    readings();
    let app = router(
        RateLimitLayer::new(Limiter::new(policy("m-shadow", 1), MemoryStore::new()))
            .key(HeaderKey::new("x-api-key"))
            .shadow(true),
    );
    for _ in 0..4 {
        assert_eq!(status(&app, Some("k")).await, StatusCode::OK);
    }
    assert_eq!(decisions("rate_limit", "m-shadow", "allowed"), 1);
    assert_eq!(decisions("rate_limit", "m-shadow", "shadow_denied"), 3);
    assert_eq!(decisions("rate_limit", "m-shadow", "denied"), 0);
}

/// A store on a port with nothing listening: every call fails.
/// Held by the tests whose GCRA calls fail, so that one of them can count
/// exactly the failures it caused.
static GCRA_FAILURES: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn unreachable_store() -> RedisStore {
    common::unreachable_store(Duration::from_millis(100)).await
}

#[tokio::test]
async fn store_failures_count_per_policy_and_per_script() {
    let _failing = GCRA_FAILURES.lock().await;
    // Handles are resolved on the first decision: install first.
    readings();
    let store = unreachable_store().await;
    let open = router(
        RateLimitLayer::new(Limiter::new(policy("m-open", 5), store.clone()))
            .key(HeaderKey::new("x-api-key")),
    );
    let closed = router(
        RateLimitLayer::new(Limiter::new(policy("m-closed", 5), store))
            .key(HeaderKey::new("x-api-key"))
            .on_store_error(FailurePolicy::Closed),
    );
    for _ in 0..2 {
        assert_eq!(status(&open, Some("k")).await, StatusCode::OK);
        assert_eq!(
            status(&closed, Some("k")).await,
            StatusCode::SERVICE_UNAVAILABLE
        );
    }
    assert_eq!(decisions("rate_limit", "m-open", "fail_open"), 2);
    assert_eq!(decisions("rate_limit", "m-closed", "fail_closed"), 2);
    let r = take();
    let errors = |op: &str| -> u64 {
        r.counters
            .iter()
            .filter(|(k, _)| {
                k.starts_with("fleetgate_store_errors_total{") && k.contains(&format!("op={op},"))
            })
            .map(|(_, n)| *n)
            .sum()
    };
    assert!(errors("gcra") >= 4, "{:?}", r.counters);
}

/// Calls queued behind a busy script slot that time out count one failure
/// each, whether their own timer or their batch's failure ends them, and
/// never twice.
#[tokio::test]
async fn queued_calls_that_fail_count_once_each() {
    let _failing = GCRA_FAILURES.lock().await;
    readings();
    let server = RedisServer::start();
    let store = RedisStore::builder(server.url())
        .prefix("m-queue")
        .timeout(Duration::from_millis(200))
        .max_in_flight(1)
        .deny_cache(0)
        .connect()
        .await
        .unwrap();
    let limiter = Limiter::new(policy("m-queue", 100), store);
    limiter.check(&Key::new("warm-up"), 1).await.unwrap();
    let timeouts = || {
        let id = series(
            "fleetgate_store_errors_total",
            &[("store", "redis"), ("op", "gcra"), ("error", "timeout")],
        );
        take().counters.get(&id).copied().unwrap_or(0)
    };
    // Round trips ended, failed or not: timed when they end.
    let ended = || {
        let id = series(
            "fleetgate_store_duration_seconds",
            &[("store", "redis"), ("op", "gcra")],
        );
        take().histograms.get(&id).copied().unwrap_or(0)
    };
    let (before, ended_before) = (timeouts(), ended());
    server.pause();
    // Spawned in order on this single-threaded runtime: the first call
    // takes the one slot, the other four queue behind it.
    let calls: Vec<_> = (0..5)
        .map(|_| tokio::spawn(limiter.check(&Key::new("q"), 1)))
        .collect();
    for call in calls {
        let result = call.await.unwrap();
        assert!(matches!(result, Err(StoreError::Timeout(_))), "{result:?}");
    }
    // The queued calls gave up on their own timers; the batch that carried
    // them may still be out. Wait until it has ended too (two round trips:
    // the first call's and the batch's), so that a second count of the
    // same calls would show.
    let mut waited = 0;
    while ended() < ended_before + 2 && waited < 500 {
        tokio::time::sleep(Duration::from_millis(10)).await;
        waited += 1;
    }
    server.resume();
    assert_eq!(timeouts() - before, 5, "one per call that timed out");
}

#[tokio::test]
async fn concurrency_store_failures_follow_and_count_the_policy() {
    // Handles are resolved on the first decision: install first.
    readings();
    let store = unreachable_store().await;
    let layer = |name: &str, failure: FailurePolicy| {
        ConcurrencyLimitLayer::new(ConcurrencyLimiter::new(
            ConcurrencyPolicy::new(name, 1).unwrap(),
            store.clone(),
        ))
        .key(HeaderKey::new("x-api-key"))
        .on_store_error(failure)
    };
    let open = Router::new()
        .route("/", get(|| async { "ok" }))
        .route_layer(layer("m-conc-open", FailurePolicy::Open));
    let closed = Router::new()
        .route("/", get(|| async { "ok" }))
        .route_layer(layer("m-conc-closed", FailurePolicy::Closed));
    for _ in 0..2 {
        assert_eq!(status(&open, Some("k")).await, StatusCode::OK);
        assert_eq!(
            status(&closed, Some("k")).await,
            StatusCode::SERVICE_UNAVAILABLE
        );
    }
    assert_eq!(decisions("concurrency", "m-conc-open", "fail_open"), 2);
    assert_eq!(decisions("concurrency", "m-conc-closed", "fail_closed"), 2);
    let r = take();
    let errors: u64 = r
        .counters
        .iter()
        .filter(|(k, _)| {
            k.starts_with("fleetgate_store_errors_total{") && k.contains("op=lease_acquire,")
        })
        .map(|(_, n)| *n)
        .sum();
    assert!(errors >= 4, "{:?}", r.counters);
}

#[tokio::test]
async fn lease_round_trips_are_timed() {
    // Handles are resolved on the first decision: install first.
    readings();
    let server = RedisServer::start();
    let store = RedisStore::builder(server.url())
        .prefix("metrics-lease")
        .connect()
        .await
        .unwrap();
    let limiter = ConcurrencyLimiter::new(ConcurrencyPolicy::new("m-lease", 2).unwrap(), store);
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .route_layer(ConcurrencyLimitLayer::new(limiter.clone()).key(HeaderKey::new("x-api-key")));
    let timed = |op: &str| {
        take()
            .histograms
            .get(&series(
                "fleetgate_store_duration_seconds",
                &[("store", "redis"), ("op", op)],
            ))
            .copied()
            .unwrap_or(0)
    };
    let (acquired, released) = (timed("lease_acquire"), timed("lease_release"));
    for _ in 0..3 {
        assert_eq!(status(&app, Some("timed")).await, StatusCode::OK);
        // Releases run on a task of their own: the next request may come
        // before one lands.
        limiter.releases_settled().await;
    }
    // Other tests may add their own round trips.
    assert!(timed("lease_acquire") - acquired >= 3);
    assert!(timed("lease_release") - released >= 3);
    assert_eq!(decisions("concurrency", "m-lease", "allowed"), 3);
}

#[tokio::test]
async fn redis_round_trips_are_timed() {
    // Handles are resolved on the first decision: install first.
    readings();
    let server = RedisServer::start();
    // A loaded machine's round trip can outlast the default 50 ms, and a
    // timed-out call would count as an error, not a denial.
    let store = RedisStore::builder(server.url())
        .prefix("metrics-up")
        .timeout(std::time::Duration::from_secs(5))
        .connect()
        .await
        .unwrap();
    let app = router(
        RateLimitLayer::new(Limiter::new(policy("m-redis", 3), store))
            .key(HeaderKey::new("x-api-key")),
    );
    let before = take()
        .histograms
        .get(&series(
            "fleetgate_store_duration_seconds",
            &[("store", "redis"), ("op", "gcra")],
        ))
        .copied()
        .unwrap_or(0);
    for _ in 0..5 {
        status(&app, Some("timed")).await;
    }
    let after = take()
        .histograms
        .get(&series(
            "fleetgate_store_duration_seconds",
            &[("store", "redis"), ("op", "gcra")],
        ))
        .copied()
        .unwrap_or(0);
    // Three admitted and the first denial reach Redis; the deny cache
    // answers the fifth. Other tests may add their own round trips.
    assert!(after - before >= 4, "{before} -> {after}");
    assert_eq!(decisions("rate_limit", "m-redis", "allowed"), 3);
    assert_eq!(decisions("rate_limit", "m-redis", "denied"), 2);
}

#[tokio::test]
async fn shed_outcomes_and_tier_state_are_published() {
    use fleetgate::shed::{FleetShedLayer, FleetShedPolicy, FleetShedder, HeaderTier};
    use http::HeaderName;

    readings();
    let policy = FleetShedPolicy::builder("m-shed", 2)
        .share("low", 0.5)
        .build()
        .unwrap();
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .route_layer(
            FleetShedLayer::new(FleetShedder::new(policy, MemoryStore::new()))
                .classify(HeaderTier::new(HeaderName::from_static("x-priority"))),
        );
    let call = |tier: &str| {
        let req = Request::get("/")
            .header("x-priority", tier)
            .body(Body::empty())
            .unwrap();
        app.clone().oneshot(req)
    };
    // One low response held (unread): the next low one is shed.
    let held = call("low").await.unwrap();
    assert_eq!(
        call("low").await.unwrap().status(),
        StatusCode::SERVICE_UNAVAILABLE
    );
    assert_eq!(call("critical").await.unwrap().status(), StatusCode::OK);
    let tier = |name: &str, tier: &str| {
        series(
            name,
            &[
                ("layer", "fleet_shed"),
                ("policy", "m-shed"),
                ("tier", tier),
            ],
        )
    };
    {
        let r = take();
        assert_eq!(
            r.gauges.get(&tier("fleetgate_shed_in_flight", "low")),
            Some(&1.0)
        );
        // One low request admitted, one shed, moments apart: half of the
        // tier's recent requests were shed; critical never is.
        let low = r.gauges.get(&tier("fleetgate_shed_fraction", "low"));
        assert!(low.is_some_and(|f| (f - 0.5).abs() < 0.01), "{low:?}");
        assert_eq!(
            r.gauges.get(&tier("fleetgate_shed_fraction", "critical")),
            Some(&0.0)
        );
        assert_eq!(
            r.counters.get(&tier("fleetgate_shed_total", "low")),
            Some(&1)
        );
    }
    drop(held);
    assert_eq!(
        take().gauges.get(&tier("fleetgate_shed_in_flight", "low")),
        Some(&0.0)
    );
    assert_eq!(decisions("fleet_shed", "m-shed", "allowed"), 2);
    assert_eq!(decisions("fleet_shed", "m-shed", "shed"), 1);
}

#[tokio::test]
async fn concurrency_outcomes_are_counted() {
    // Handles are resolved on the first decision: install first.
    readings();
    let policy = ConcurrencyPolicy::new("m-conc", 1).unwrap();
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .route_layer(
            ConcurrencyLimitLayer::new(ConcurrencyLimiter::new(policy, MemoryStore::new()))
                .key(HeaderKey::new("x-api-key"))
                .on_missing_key(OnMissingKey::Reject(StatusCode::BAD_REQUEST)),
        );
    // Hold one response (and so its lease) while a second request comes.
    let held = respond(&app, "c").await;
    assert_eq!(held.status(), StatusCode::OK);
    assert_eq!(status(&app, Some("c")).await, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(status(&app, None).await, StatusCode::BAD_REQUEST);
    drop(held);
    assert_eq!(decisions("concurrency", "m-conc", "allowed"), 1);
    assert_eq!(decisions("concurrency", "m-conc", "denied"), 1);
    assert_eq!(decisions("concurrency", "m-conc", "missing_key"), 1);
}

#[tokio::test]
async fn local_fallback_decisions_are_counted_apart() {
    let _failing = GCRA_FAILURES.lock().await;
    // Handles are resolved on the first decision: install first.
    readings();
    let store = unreachable_store().await;
    let half = FailurePolicy::local(0.5).unwrap();
    // Burst 4 fleet-wide, 2 locally.
    let enforcing = router(
        RateLimitLayer::new(Limiter::new(policy("m-local", 4), store.clone()))
            .key(HeaderKey::new("x-api-key"))
            .on_store_error(half),
    );
    let shadow = router(
        RateLimitLayer::new(Limiter::new(policy("m-local-shadow", 4), store.clone()))
            .key(HeaderKey::new("x-api-key"))
            .on_store_error(half)
            .shadow(true),
    );
    let conc = ConcurrencyPolicy::new("m-local-conc", 2).unwrap();
    let slots = router(
        ConcurrencyLimitLayer::new(ConcurrencyLimiter::new(conc, store))
            .key(HeaderKey::new("x-api-key"))
            .on_store_error(half),
    );
    for expected in [200, 200, 429, 429] {
        assert_eq!(status(&enforcing, Some("k")).await, expected);
        assert_eq!(status(&shadow, Some("k")).await, StatusCode::OK);
    }
    assert_eq!(decisions("rate_limit", "m-local", "fallback_allowed"), 2);
    assert_eq!(decisions("rate_limit", "m-local", "fallback_denied"), 2);
    assert_eq!(decisions("rate_limit", "m-local", "fail_open"), 0);
    assert_eq!(
        decisions("rate_limit", "m-local-shadow", "fallback_allowed"),
        2
    );
    assert_eq!(
        decisions("rate_limit", "m-local-shadow", "shadow_denied"),
        2
    );

    // One slot locally: a held response takes it.
    let held = respond(&slots, "c").await;
    assert_eq!(held.status(), StatusCode::OK);
    assert_eq!(
        status(&slots, Some("c")).await,
        StatusCode::TOO_MANY_REQUESTS
    );
    drop(held);
    assert_eq!(status(&slots, Some("c")).await, StatusCode::OK);
    assert_eq!(
        decisions("concurrency", "m-local-conc", "fallback_allowed"),
        2
    );
    assert_eq!(
        decisions("concurrency", "m-local-conc", "fallback_denied"),
        1
    );

    // The fleet shedder's fallback: 2 of 4 for low fleet-wide, 1 locally.
    // Its sheds are `fallback_denied` decisions, and count as shed for
    // the tier.
    let shed = fleetgate::shed::FleetShedPolicy::builder("m-local-shed", 4)
        .share("low", 0.5)
        .build()
        .unwrap();
    let shedder = fleetgate::shed::FleetShedder::new(shed, unreachable_store().await);
    let reports = router(
        fleetgate::shed::FleetShedLayer::new(shedder.clone())
            .classify(|_: &Request<Body>, tiers: &fleetgate::shed::Tiers| tiers.get("low"))
            .on_store_error(half),
    );
    let held = respond(&reports, "r").await;
    assert_eq!(held.status(), StatusCode::OK);
    assert_eq!(
        status(&reports, Some("r")).await,
        StatusCode::SERVICE_UNAVAILABLE
    );
    drop(held);
    assert_eq!(
        decisions("fleet_shed", "m-local-shed", "fallback_allowed"),
        1
    );
    assert_eq!(
        decisions("fleet_shed", "m-local-shed", "fallback_denied"),
        1
    );
    assert_eq!(decisions("fleet_shed", "m-local-shed", "shed"), 0);
    let low = series(
        "fleetgate_shed_total",
        &[
            ("layer", "fleet_shed"),
            ("policy", "m-local-shed"),
            ("tier", "low"),
        ],
    );
    assert_eq!(take().counters.get(&low), Some(&1));
    assert_eq!(shedder.state().tier("low").unwrap().shed(), 1);
}

#[tokio::test]
async fn throttles_and_retry_budgets_are_counted_and_observed() {
    use std::sync::Arc;

    use fleetgate::clock::ManualClock;
    use fleetgate::rate_limit::{AdaptiveThrottle, AdaptiveThrottleLayer, RetryBudget};
    use tower::{Layer, Service};

    drop(take()); // the recorder, installed before the first call
    // An upstream that fails everything, behind a throttle.
    let throttle = AdaptiveThrottle::builder()
        .name("m-throttle")
        .build()
        .unwrap();
    let mut client = AdaptiveThrottleLayer::new(throttle.clone()).layer(tower::service_fn(
        |_req: Request<()>| async {
            let res = http::Response::builder().status(503).body(()).unwrap();
            Ok::<_, std::convert::Infallible>(res)
        },
    ));
    let mut refused = 0;
    for _ in 0..40 {
        if client.call(Request::new(())).await.is_err() {
            refused += 1;
        }
    }
    assert!(refused > 0, "the throttle refused nothing");
    let calls = |result: &str| {
        let id = series(
            "fleetgate_throttle_calls_total",
            &[("throttle", "m-throttle"), ("result", result)],
        );
        take().counters.get(&id).copied().unwrap_or(0)
    };
    assert_eq!(calls("refused"), refused);
    assert_eq!(calls("sent"), 40 - refused);
    assert_eq!(calls("accepted"), 0);
    let p = series(
        "fleetgate_throttle_rejection_probability",
        &[("throttle", "m-throttle")],
    );
    assert!(take().gauges.get(&p).is_some_and(|&p| p > 0.5), "{p}");

    let snapshot = fleetgate::observe::snapshot();
    let seen = snapshot
        .throttles
        .iter()
        .find(|t| t.name == "m-throttle")
        .expect("the throttle in the snapshot");
    assert_eq!(
        (seen.sent, seen.refused, seen.accepted),
        (40 - refused, refused, 0)
    );
    assert_eq!(seen.accept_ratio, Some(0.0));
    assert_eq!(seen.rejection_probability, throttle.rejection_probability());

    // A budget of 2 retries (its clock stands still) for 5 first attempts.
    let clock = ManualClock::new(Duration::from_secs(100));
    let store = MemoryStore::builder().clock(clock).build();
    let budget = RetryBudget::new(Arc::new(store))
        .ratio(0.0)
        .min_per_second(2)
        .build("m-budget")
        .unwrap();
    for _ in 0..5 {
        budget.deposit();
    }
    while budget.try_withdraw() {}
    let spent = |result: &str| {
        let id = series(
            "fleetgate_retry_budget_total",
            &[("budget", "m-budget"), ("result", result)],
        );
        take().counters.get(&id).copied().unwrap_or(0)
    };
    assert_eq!(
        (spent("first_attempt"), spent("retry"), spent("refused")),
        (5, 2, 1)
    );
    let snapshot = fleetgate::observe::snapshot();
    let seen = snapshot
        .retry_budgets
        .iter()
        .find(|b| b.name == "m-budget")
        .expect("the budget in the snapshot");
    assert_eq!(
        (
            seen.first_attempts,
            seen.retries,
            seen.refused,
            seen.store_errors
        ),
        (5, 2, 1, 0)
    );
}
