//! `FailurePolicy::Local`: while Redis is gone, each instance decides on
//! its own with its share of every limit, answered like any decision; once
//! Redis is back, Redis decides again. A store that cannot fail (the
//! memory store) never falls back.
use crate::common;

use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::routing::get;
use common::RedisServer;
use common::redis_server::free_port;
use fleetgate::concurrency::{ConcurrencyLimitLayer, ConcurrencyLimiter, ConcurrencyPolicy};
use fleetgate::key::GlobalKey;
use fleetgate::{
    Algorithm, BoxError, ConcurrencyLimitError, FailurePolicy, Limit, Limiter, MemoryStore, Policy,
    Rate, RateLimitError, RateLimitLayer, RedisStore,
};
use http::{Request, StatusCode};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tower::util::BoxCloneService;
use tower::{ServiceBuilder, ServiceExt};

/// Long enough that a healthy Redis on a loaded machine always answers.
const TIMEOUT: Duration = Duration::from_millis(500);

async fn lazy_store(port: u16) -> RedisStore {
    RedisStore::builder(format!("redis://127.0.0.1:{port}"))
        .timeout(TIMEOUT)
        .lazy()
        .connect()
        .await
        .unwrap()
}

/// `GET /` limited fleet-wide to 8 per hour (burst 8); a quarter of that,
/// 2, per instance while the store fails.
fn rate_app(limiter: Limiter) -> Router {
    app_with(limiter, FailurePolicy::local(0.25).unwrap())
}

/// `GET /` limited by `limiter`, with `failure` when the store fails.
fn app_with(limiter: Limiter, failure: FailurePolicy) -> Router {
    Router::new()
        .route("/", get(|| async { "ok" }))
        .route_layer(
            RateLimitLayer::new(limiter)
                .key(GlobalKey::new())
                .on_store_error(failure),
        )
}

fn eight_per_hour() -> Policy {
    let limit = Limit::builder(Rate::per_hour(8)).burst(8).build().unwrap();
    Policy::single("local", limit).unwrap()
}

/// 8 per hour as a window of each algorithm.
fn eight_per_hour_window(algorithm: Algorithm) -> Policy {
    Policy::builder(format!("local-{algorithm}"))
        .algorithm(algorithm)
        .limit(Limit::new(Rate::per_hour(8)).unwrap())
        .build()
        .unwrap()
}

const WINDOWS: [Algorithm; 3] = [
    Algorithm::SlidingLog,
    Algorithm::SlidingWindow,
    Algorithm::FixedWindow,
];

/// The status and the quota the response advertises (`q=` of
/// `RateLimit-Policy`): 8 when Redis decided, 2 when the local fallback did.
async fn get_quota(app: &Router) -> (StatusCode, Option<u64>) {
    let response = app
        .clone()
        .oneshot(Request::get("/").body(Body::empty()).unwrap())
        .await
        .unwrap();
    if response.status() == StatusCode::TOO_MANY_REQUESTS {
        assert!(response.headers().contains_key("retry-after"));
    }
    let quota = response
        .headers()
        .get("ratelimit-policy")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(";q=").nth(1))
        .and_then(|v| v.split(';').next())
        .and_then(|q| q.parse().ok());
    (response.status(), quota)
}

#[tokio::test]
async fn rate_limit_falls_back_to_its_share_while_redis_is_down_then_redis_decides_again() {
    let server = RedisServer::start();
    let port = server.port();
    let store = RedisStore::builder(server.url())
        .timeout(TIMEOUT)
        .connect()
        .await
        .unwrap();
    let app = rate_app(Limiter::new(eight_per_hour(), store));
    assert_eq!(get_quota(&app).await, (StatusCode::OK, Some(8)));

    server.stop();
    let mut local = Vec::new();
    for _ in 0..5 {
        local.push(get_quota(&app).await);
    }
    let ok = (StatusCode::OK, Some(2));
    let limited = (StatusCode::TOO_MANY_REQUESTS, Some(2));
    assert_eq!(local, [ok, ok, limited, limited, limited]);

    // Back, empty: once it answers, Redis decides again, with the whole
    // fleet's burst of 8. Until then the local limiter goes on refusing.
    let _server = RedisServer::start_on(port).expect("redis back on its port");
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut redis_admitted = 0;
    loop {
        assert!(Instant::now() < deadline, "Redis never decided again");
        match get_quota(&app).await {
            (StatusCode::OK, Some(8)) => redis_admitted += 1,
            (StatusCode::TOO_MANY_REQUESTS, Some(8)) => break,
            other => assert_eq!(other, limited, "only the local limiter meanwhile"),
        }
    }
    // A call that timed out after Redis ran it was charged there but
    // answered locally: Redis may admit fewer than 8, never more.
    assert!((1..=8).contains(&redis_admitted), "{redis_admitted}");
}

/// Window policies follow the failure policy exactly as GCRA does. Closed:
/// while Redis is hung (SIGSTOP), every call answers 503 with
/// `Retry-After`, and Redis decides again once it resumes.
#[tokio::test]
async fn window_policies_fail_closed_while_redis_is_hung() {
    let server = RedisServer::start();
    let store = RedisStore::builder(server.url())
        .timeout(Duration::from_millis(200))
        .connect()
        .await
        .unwrap();
    let apps: Vec<Router> = WINDOWS
        .into_iter()
        .map(|a| {
            let limiter = Limiter::new(eight_per_hour_window(a), store.clone());
            app_with(limiter, FailurePolicy::Closed)
        })
        .collect();
    for app in &apps {
        assert_eq!(get_quota(app).await, (StatusCode::OK, Some(8)));
    }
    server.pause();
    for (app, algorithm) in apps.iter().zip(WINDOWS) {
        let response = app
            .clone()
            .oneshot(Request::get("/").body(Body::empty()).unwrap())
            .await
            .unwrap();
        assert_eq!(
            response.status(),
            StatusCode::SERVICE_UNAVAILABLE,
            "{algorithm}"
        );
        assert!(
            response.headers().contains_key("retry-after"),
            "{algorithm}"
        );
    }
    server.resume();
    for (app, algorithm) in apps.iter().zip(WINDOWS) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            assert!(
                Instant::now() < deadline,
                "{algorithm}: Redis never decided again"
            );
            match get_quota(app).await {
                (StatusCode::OK, Some(8)) => break,
                (StatusCode::SERVICE_UNAVAILABLE, _) => {}
                other => panic!("{algorithm}: {other:?}"),
            }
        }
    }
}

/// Local share: while Redis is gone, each window policy is decided in
/// process on the same algorithm with its share of the window (a quarter
/// of 8 per hour: 2), answered with that quota's headers and 429s.
#[tokio::test]
async fn window_policies_fall_back_to_their_share_while_redis_is_down() {
    let server = RedisServer::start();
    let store = RedisStore::builder(server.url())
        .timeout(TIMEOUT)
        .connect()
        .await
        .unwrap();
    let apps: Vec<Router> = WINDOWS
        .into_iter()
        .map(|a| rate_app(Limiter::new(eight_per_hour_window(a), store.clone())))
        .collect();
    for app in &apps {
        assert_eq!(get_quota(app).await, (StatusCode::OK, Some(8)));
    }
    server.stop();
    let ok = (StatusCode::OK, Some(2));
    let limited = (StatusCode::TOO_MANY_REQUESTS, Some(2));
    for (app, algorithm) in apps.iter().zip(WINDOWS) {
        let mut local = Vec::new();
        for _ in 0..4 {
            local.push(get_quota(app).await);
        }
        assert_eq!(local, [ok, ok, limited, limited], "{algorithm}");
    }
}

#[tokio::test]
async fn waiting_clients_reserve_local_slots_and_typed_errors_name_the_limit() {
    // 2 per second, burst 2, fleet-wide: 1 per second, burst 1, locally.
    let limit = Limit::builder(Rate::per_second(2))
        .burst(2)
        .build()
        .unwrap();
    let policy = Policy::single("local-wait", limit).unwrap();
    let layer = async |max_wait| {
        ServiceBuilder::new()
            .layer(
                RateLimitLayer::new(Limiter::new(
                    policy.clone(),
                    common::unreachable_store(TIMEOUT).await,
                ))
                .key(GlobalKey::new())
                .typed_errors()
                .wait_up_to(max_wait)
                .on_store_error(FailurePolicy::local(0.5).unwrap()),
            )
            .service_fn(|()| async { Ok::<_, BoxError>(Instant::now()) })
    };

    let waiting = layer(Duration::from_secs(5)).await;
    let started = Instant::now();
    waiting.clone().oneshot(()).await.unwrap();
    // The local burst is 1: the second call's slot is a second later.
    let called = waiting.clone().oneshot(()).await.unwrap();
    assert!(
        called - started >= Duration::from_millis(800),
        "called after {:?}",
        called - started
    );

    // A slot further than the wait allows is refused at once.
    let impatient = layer(Duration::from_millis(100)).await;
    impatient.clone().oneshot(()).await.unwrap();
    let err = impatient.oneshot(()).await.unwrap_err();
    match *err.downcast::<RateLimitError>().unwrap() {
        RateLimitError::WaitTooLong { limit, wait, .. } => {
            assert_eq!(limit, "2/s");
            assert!(wait > Duration::from_millis(100), "{wait:?}");
        }
        other => panic!("{other:?}"),
    }
}

/// A call that holds its lease until told to finish.
type Call = (oneshot::Sender<()>, oneshot::Receiver<()>);
type Calls = BoxCloneService<Call, (), BoxError>;

fn concurrency_service(limiter: ConcurrencyLimiter) -> Calls {
    let layer = ConcurrencyLimitLayer::new(limiter)
        .key(GlobalKey::new())
        .typed_errors()
        .on_store_error(FailurePolicy::local(0.5).unwrap());
    BoxCloneService::new(ServiceBuilder::new().layer(layer).service_fn(
        |(started, done): Call| async move {
            let _ = started.send(());
            let _ = done.await;
            Ok::<_, BoxError>(())
        },
    ))
}

struct Held {
    done: oneshot::Sender<()>,
    call: JoinHandle<Result<(), BoxError>>,
}

impl Held {
    /// Lets the call finish; its lease is given back before this returns.
    async fn finish(self) {
        drop(self.done);
        self.call.await.unwrap().unwrap();
    }
}

/// Starts a call and waits until it runs (holding a lease) or is refused.
async fn start(calls: &Calls) -> Result<Held, ConcurrencyLimitError> {
    let (started, running) = oneshot::channel();
    let (done, until) = oneshot::channel();
    let call = tokio::spawn(calls.clone().oneshot((started, until)));
    match running.await {
        Ok(()) => Ok(Held { done, call }),
        Err(_) => {
            let err = call.await.unwrap().unwrap_err();
            Err(*err.downcast::<ConcurrencyLimitError>().unwrap())
        }
    }
}

fn refused_at(max: u64) -> ConcurrencyLimitError {
    ConcurrencyLimitError::InFlight {
        limit: "local-slots".into(),
        max_in_flight: max,
    }
}

#[tokio::test]
async fn concurrency_falls_back_to_its_share_releases_locally_then_redis_decides_again() {
    let port = free_port();
    // 4 in flight fleet-wide; 2 per instance while Redis is down.
    let policy = ConcurrencyPolicy::new("local-slots", 4).unwrap();
    let limiter = ConcurrencyLimiter::new(policy, lazy_store(port).await);
    let calls = concurrency_service(limiter.clone());

    let a = start(&calls).await.expect("first local lease");
    let b = start(&calls).await.expect("second local lease");
    assert_eq!(start(&calls).await.err(), Some(refused_at(2)));
    // A release sent to Redis would fail, and the slot would stay taken
    // until the lease's TTL (30 s): the next call passes only if it went
    // to the local limiter.
    a.finish().await;
    let c = start(&calls).await.expect("the slot a freed");
    assert_eq!(start(&calls).await.err(), Some(refused_at(2)));
    b.finish().await;
    c.finish().await;

    let server = RedisServer::start_on(port).expect("redis on the chosen port");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        assert!(Instant::now() < deadline, "Redis never decided again");
        let held = start(&calls).await.expect("one call always fits");
        let in_redis = server.leases_held().await;
        held.finish().await;
        if in_redis == 1 {
            break;
        }
    }
    limiter.releases_settled().await;

    // Redis decides: the fleet's 4, all held there.
    let mut held = Vec::new();
    for _ in 0..4 {
        held.push(start(&calls).await.expect("a Redis lease"));
    }
    assert_eq!(start(&calls).await.err(), Some(refused_at(4)));
    assert_eq!(server.leases_held().await, 4);
    for call in held {
        call.finish().await;
    }
    limiter.releases_settled().await;
    assert_eq!(server.leases_held().await, 0);
}

#[tokio::test]
async fn a_store_that_cannot_fail_never_falls_back() {
    let app = rate_app(Limiter::new(eight_per_hour(), MemoryStore::new()));
    for _ in 0..8 {
        assert_eq!(get_quota(&app).await, (StatusCode::OK, Some(8)));
    }
    assert_eq!(
        get_quota(&app).await,
        (StatusCode::TOO_MANY_REQUESTS, Some(8))
    );

    let policy = ConcurrencyPolicy::new("local-slots", 4).unwrap();
    let calls = concurrency_service(ConcurrencyLimiter::new(policy, MemoryStore::new()));
    let mut held = Vec::new();
    for _ in 0..4 {
        held.push(start(&calls).await.expect("the memory store's full cap"));
    }
    assert_eq!(start(&calls).await.err(), Some(refused_at(4)));
    for call in held {
        call.finish().await;
    }
}
