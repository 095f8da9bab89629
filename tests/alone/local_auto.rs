//! `FailurePolicy::local_auto()`: the share each instance enforces while
//! Redis is gone follows the fleet its heartbeats count (the rest of the
//! live policies on Redis: tests/redis/live.rs).
use crate::common;

use std::convert::Infallible;
use std::time::{Duration, Instant};

use axum::body::Body;
use common::RedisServer;
use fleetgate::key::GlobalKey;
use fleetgate::live::LivePolicies;
use fleetgate::spec::PolicySpec;
use fleetgate::{FailurePolicy, LocalShare, Policy, RateLimitLayer, RedisStore};
use http::{Request, StatusCode};
use tower::util::BoxCloneService;
use tower::{Layer, ServiceExt};

fn policy(name: &str, text: &str) -> Policy {
    text.parse::<PolicySpec>().unwrap().build(name).unwrap()
}

/// A store of an instance of its own on the test's server.
async fn store(server: &RedisServer, timeout: Duration) -> RedisStore {
    RedisStore::builder(server.url())
        .prefix("svc")
        .timeout(timeout)
        .connect()
        .await
        .unwrap()
}

/// Waits until `done`, within `within`.
async fn until(within: Duration, what: &str, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < within, "{what}: not within {within:?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// `FailurePolicy::local_auto()` with two live instances: while Redis is
/// gone, each enforces half of every limit. In this binary, one at a
/// time: the fleet's size is the process's, and other tests' instances
/// would count too.
#[tokio::test]
async fn local_auto_enforces_the_instances_share_while_redis_is_gone() {
    let _alone = crate::one_at_a_time().await;
    let server = RedisServer::start();
    let timeout = Duration::from_millis(500);
    let a = LivePolicies::new(store(&server, timeout).await);
    let b = LivePolicies::new(store(&server, timeout).await);
    let api = a.limiter(policy("local-auto", "8/h"));
    b.limiter(policy("local-auto", "8/h"));
    // The service is built, and decides once, while a counts itself alone:
    // its local fallback then holds the whole limit, and must follow the
    // fleet's size when b comes.
    a.start().await.unwrap();
    assert_eq!(a.instance_count(), 1);
    assert_eq!(LocalShare::auto().scale(8), 8);
    let ok = tower::service_fn(|_: Request<Body>| async {
        Ok::<_, Infallible>(http::Response::new(Body::from("ok")))
    });
    let app = BoxCloneService::new(
        RateLimitLayer::new(api)
            .key(GlobalKey::new())
            .on_store_error(FailurePolicy::local_auto())
            .layer(ok),
    );
    let quota = |response: &http::Response<Body>| {
        let header = response.headers().get("ratelimit-policy").unwrap();
        let header = header.to_str().unwrap().to_owned();
        header
            .split(";q=")
            .nth(1)
            .and_then(|v| v.split(';').next())
            .and_then(|q| q.parse::<u64>().ok())
            .unwrap()
    };
    let get = || Request::get("/").body(Body::empty()).unwrap();
    let response = app.clone().oneshot(get()).await.unwrap();
    assert_eq!((response.status(), quota(&response)), (StatusCode::OK, 8));

    b.start().await.unwrap();
    until(Duration::from_secs(5), "two instances", || {
        a.instance_count() == 2 && b.instance_count() == 2
    })
    .await;
    assert_eq!(LocalShare::auto().scale(8), 4);

    server.stop();
    let mut got = Vec::new();
    for _ in 0..6 {
        let response = app.clone().oneshot(get()).await.unwrap();
        got.push((response.status().as_u16(), quota(&response)));
    }
    assert_eq!(
        got,
        [(200, 4), (200, 4), (200, 4), (200, 4), (429, 4), (429, 4)]
    );
    // The heartbeats fail meanwhile: the count they last saw holds.
    assert_eq!(a.instance_count(), 2);
}
