//! Cost known after the response (`RateLimitLayer::response_cost`) on a
//! real Redis: the token budget, the login limit and the refunded 5xx; a
//! debt repaid at exactly the limit's rate (the store on a manual clock);
//! concurrent callers from two instances; body bytes up to where the
//! client went away (a charge that fails while Redis hangs:
//! tests/alone/charge_log.rs). (The same on the memory store:
//! tests/layers/after.rs.)
use crate::common;

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use axum::body::Body;
use common::RedisServer;
use fleetgate::clock::ManualClock;
use fleetgate::key::HeaderKey;
use fleetgate::rate_limit::ResponseCost;
use fleetgate::{Key, Limit, Limiter, Rate, RateLimitLayer, RedisStore, TimeSource};
use http::{Request, Response, StatusCode};
use http_body_util::BodyExt;
use tower::ServiceBuilder;

use crate::response_cost::*;

fn layer(limiter: &Limiter, cost: ResponseCost) -> RateLimitLayer<HeaderKey> {
    RateLimitLayer::new(limiter.clone())
        .key(HeaderKey::new("x-api-key"))
        .response_cost(cost)
}

/// 1000 tokens a minute from `x-tokens-used`: three 400-token calls pass,
/// the fourth quick one gets 429 with `Retry-After` 12-13 s.
#[tokio::test]
async fn token_budget_is_charged_from_the_header_and_refuses_in_debt() {
    let server = RedisServer::start();
    let store = common::redis_store(&server).await;
    let limiter = Limiter::new(
        policy("tokens", Limit::new(Rate::per_minute(1000)).unwrap()),
        store,
    );
    let handler = Handler::default();
    let svc = ServiceBuilder::new()
        .layer(layer(&limiter, ResponseCost::header("x-tokens-used")))
        .service(handler.service());
    for left in [599, 199, 0] {
        let res = call(&svc, "/complete?tokens=400", "k1").await;
        assert_eq!(res.status(), StatusCode::OK);
        wait_for_remaining(&limiter, &key_of("k1"), left).await;
    }
    let res = call(&svc, "/complete?tokens=400", "k1").await;
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!((12..=13).contains(&retry_after(&res)), "{res:?}");
    assert_eq!(handler.calls.load(Ordering::SeqCst), 3);
}

/// Login, 5 per 15 minutes, only 401s count: twenty 200s pass; after five
/// 401s the next call is refused even though it would succeed.
#[tokio::test]
async fn only_failed_logins_count() {
    let server = RedisServer::start();
    let store = common::redis_store(&server).await;
    let limiter = Limiter::new(
        policy(
            "login",
            Limit::new(Rate::new(5, Duration::from_secs(900))).unwrap(),
        ),
        store,
    );
    let handler = Handler::default();
    let svc = ServiceBuilder::new()
        .layer(layer(
            &limiter,
            ResponseCost::count_if(|head| head.status == StatusCode::UNAUTHORIZED),
        ))
        .service(handler.service());
    for _ in 0..20 {
        assert_eq!(call(&svc, "/login", "u").await.status(), StatusCode::OK);
    }
    wait_for_remaining(&limiter, &key_of("u"), 4).await;
    for left in [3, 2, 1, 0, 0] {
        let res = call(&svc, "/login?status=401", "u").await;
        assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
        wait_for_remaining(&limiter, &key_of("u"), left).await;
    }
    let res = call(&svc, "/login", "u").await;
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(handler.calls.load(Ordering::SeqCst), 25);
}

/// 3 a minute, burst 3, 5xx refunded: ten 500s all reach the handler,
/// then three 200s pass and the fourth gets 429.
#[tokio::test]
async fn server_errors_are_refunded() {
    let server = RedisServer::start();
    let store = common::redis_store(&server).await;
    let limiter = Limiter::new(
        policy(
            "flaky",
            Limit::builder(Rate::per_minute(3))
                .burst(3)
                .build()
                .unwrap(),
        ),
        store,
    );
    let handler = Handler::default();
    let svc = ServiceBuilder::new()
        .layer(layer(&limiter, ResponseCost::refund_server_errors()))
        .service(handler.service());
    for _ in 0..10 {
        let res = call(&svc, "/flaky?status=500", "c").await;
        assert_eq!(res.status(), StatusCode::INTERNAL_SERVER_ERROR);
        // The refund has landed: the full burst is back.
        wait_for_remaining(&limiter, &key_of("c"), 2).await;
    }
    assert_eq!(handler.calls.load(Ordering::SeqCst), 10);
    for _ in 0..3 {
        assert_eq!(call(&svc, "/flaky", "c").await.status(), StatusCode::OK);
    }
    let res = call(&svc, "/flaky", "c").await;
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(handler.calls.load(Ordering::SeqCst), 13);
}

/// A debt is repaid at exactly the limit's rate: the store on a manual
/// clock, 1200 tokens against 1000 a minute refuse for 201 × 60 ms.
#[tokio::test]
async fn a_debt_is_repaid_at_exactly_the_limits_rate() {
    let server = RedisServer::start();
    let clock = ManualClock::new(Duration::from_secs(1_699_999_980));
    let store = RedisStore::builder(server.url())
        .time_source(TimeSource::Client(Arc::new(clock.clone())))
        .timeout(Duration::from_secs(2))
        .connect()
        .await
        .unwrap();
    let limiter = Limiter::new(
        policy("tokens", Limit::new(Rate::per_minute(1000)).unwrap()),
        store,
    );
    let svc = ServiceBuilder::new()
        .layer(layer(&limiter, ResponseCost::header("x-tokens-used")))
        .service(Handler::default().service());
    for left in [599, 199, 0] {
        let res = call(&svc, "/complete?tokens=400", "k").await;
        assert_eq!(res.status(), StatusCode::OK);
        wait_for_remaining(&limiter, &key_of("k"), left).await;
    }
    let d = limiter.peek(&key_of("k"), 1).await.unwrap();
    assert_eq!(d.retry_after(), Some(Duration::from_millis(12_060)));
    clock.advance(Duration::from_millis(12_059));
    let res = call(&svc, "/complete?tokens=0", "k").await;
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(retry_after(&res), 1);
    clock.advance(Duration::from_millis(1));
    let res = call(&svc, "/complete?tokens=2", "k").await;
    assert_eq!(res.status(), StatusCode::OK);
    // Two tokens charged with one left: one token in debt, and one more.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let d = limiter.peek(&key_of("k"), 1).await.unwrap();
        if d.retry_after() == Some(Duration::from_millis(120)) {
            break;
        }
        assert!(Instant::now() < deadline, "{d:?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// One response stating the largest cost: refused for an hour (16
/// periods of the limit are less), and the key expires with it rather
/// than in 35 years.
#[tokio::test]
async fn a_huge_charge_holds_back_an_hour_and_its_key_expires_with_it() {
    let server = RedisServer::start();
    let limiter = Limiter::new(
        policy("tokens", Limit::new(Rate::per_minute(1000)).unwrap()),
        common::redis_store(&server).await,
    );
    let svc = ServiceBuilder::new()
        .layer(layer(&limiter, ResponseCost::header("x-tokens-used")))
        .service(Handler::default().service());
    let res = call(&svc, "/complete?tokens=18446744073709551615", "k").await;
    assert_eq!(res.status(), StatusCode::OK);
    let deadline = Instant::now() + Duration::from_secs(5);
    let res = loop {
        let res = call(&svc, "/complete?tokens=1", "k").await;
        if res.status() != StatusCode::OK {
            break res;
        }
        assert!(Instant::now() < deadline, "the charge never landed");
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!((3595..=3601).contains(&retry_after(&res)), "{res:?}");
    let mut admin = server.admin().await;
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("*")
        .query_async(&mut admin)
        .await
        .unwrap();
    assert_eq!(keys.len(), 1, "{keys:?}");
    let ttl: i64 = redis::cmd("PTTL")
        .arg(&keys[0])
        .query_async(&mut admin)
        .await
        .unwrap();
    // The burst's minute and the debt's hour, on the server's clock.
    assert!((1..=3_660_000).contains(&ttl), "{ttl} ms");
}

/// Two instances (a store each), eight clients each, 400-token calls
/// against 1000 an hour: together they overshoot by less than the costs
/// of the sixteen clients in flight. Refund callers (burst 3, every
/// response a 500) never have more than 3 in flight.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_charge_after_overshoots_by_the_costs_in_flight_refund_never() {
    const CLIENTS: u64 = 8;
    let server = RedisServer::start();
    // A charge that times out is sent again before the key's next peek,
    // and one that had landed all the same then counts twice (charges
    // land at least once): the debt's exact figure needs a timeout no
    // loaded machine reaches.
    let store = async || {
        RedisStore::builder(server.url())
            .timeout(Duration::from_secs(30))
            .connect()
            .await
            .unwrap()
    };
    let stores = [store().await, store().await];
    let tokens = policy("tokens", Limit::new(Rate::per_hour(1000)).unwrap());
    // Each script loaded first (a script's first call loads it: two more
    // round trips, which would let the first charges trail their peeks).
    for store in &stores {
        let warm = Limiter::new(tokens.clone(), store.clone());
        warm.peek(&Key::new("warm"), 1).await.unwrap();
        warm.charge(&Key::new("warm"), 1).await.unwrap();
    }
    // The key's first charge, which starts its debt's clock, comes after
    // this instant: the debt left at any later moment is the whole debt
    // less at most the time since.
    let started = Instant::now();
    let mut tasks = Vec::new();
    for store in &stores {
        let limiter = Limiter::new(tokens.clone(), store.clone());
        let svc = ServiceBuilder::new()
            .layer(layer(&limiter, ResponseCost::header("x-tokens-used")))
            .service(Handler::default().service());
        tasks.push(tokio::spawn(async move {
            clients(CLIENTS, 5, &svc, "/complete?tokens=400&yields=20").await
        }));
    }
    let mut admitted = 0;
    for task in tasks {
        admitted += task.await.unwrap();
    }
    assert!(admitted >= 3, "{admitted}");
    assert!(
        admitted * 400 < 1000 + 2 * CLIENTS * 400,
        "{admitted} admitted: more than the costs in flight"
    );
    // Read through a store of its own, past the instances' deny caches.
    let limiter = Limiter::new(tokens, common::redis_store(&server).await);
    let debt = admitted * 400 - 1000;
    let full = Duration::from_millis(3_600 * (debt + 1));
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        // Every admitted call's charge lands: the debt is all of them.
        let retry = limiter.peek(&key_of("hot"), 1).await.unwrap().retry_after();
        // Repaid meanwhile: at most the time since the start (and a
        // margin for Redis' clock against this one).
        let repaid = started.elapsed() + Duration::from_millis(100);
        if retry.is_some_and(|r| r <= full && r + repaid >= full) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{retry:?} for a debt of {debt} ({full:?}) after {:?}",
            started.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }

    let flaky = policy(
        "flaky",
        Limit::builder(Rate::per_hour(3)).burst(3).build().unwrap(),
    );
    let handler = Handler::default();
    let mut tasks = Vec::new();
    for store in &stores {
        let limiter = Limiter::new(flaky.clone(), store.clone());
        let svc = ServiceBuilder::new()
            .layer(layer(&limiter, ResponseCost::refund_server_errors()))
            .service(handler.service());
        tasks.push(tokio::spawn(async move {
            clients(CLIENTS, 5, &svc, "/flaky?status=500&yields=20").await
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let peak = handler.peak.load(Ordering::SeqCst);
    assert!((1..=3).contains(&peak), "{peak} in flight");
    // Every one refunded: the full burst is back. (Read through a store
    // of its own: an instance's deny cache may still hold a denial it
    // answered while the others refunded, until its retry time.)
    let limiter = Limiter::new(flaky, common::redis_store(&server).await);
    wait_for_remaining(&limiter, &key_of("hot"), 2).await;
}

/// `clients` tasks each make `calls` calls to `uri` one after the other,
/// as the key `hot`; how many were admitted (not 429).
async fn clients<S>(clients: u64, calls: u64, svc: &S, uri: &'static str) -> u64
where
    S: tower::Service<Request<Body>, Response = Response<Body>, Error = Infallible>
        + Clone
        + Send
        + Sync
        + 'static,
    S::Future: Send,
{
    let tasks: Vec<_> = (0..clients)
        .map(|_| {
            let svc = svc.clone();
            tokio::spawn(async move {
                let mut admitted = 0;
                for _ in 0..calls {
                    if call(&svc, uri, "hot").await.status() != StatusCode::TOO_MANY_REQUESTS {
                        admitted += 1;
                    }
                }
                admitted
            })
        })
        .collect();
    let mut admitted = 0;
    for task in tasks {
        admitted += task.await.unwrap();
    }
    admitted
}

/// Body bytes: a client that reads three 100-byte frames of ten and goes
/// away is charged 300 on Redis.
#[tokio::test]
async fn body_bytes_count_what_was_sent_before_the_client_left() {
    let server = RedisServer::start();
    let store = common::redis_store(&server).await;
    let limiter = Limiter::new(
        policy("bytes", Limit::new(Rate::per_hour(100_000)).unwrap()),
        store,
    );
    let svc = ServiceBuilder::new()
        .layer(layer(&limiter, ResponseCost::body_bytes()))
        .service(Handler::default().service());
    let res = call(&svc, "/download?chunks=10", "d").await;
    assert_eq!(res.status(), StatusCode::OK);
    let mut body = res.into_body();
    for _ in 0..3 {
        body.frame().await.unwrap().unwrap();
    }
    drop(body);
    wait_for_remaining(&limiter, &key_of("d"), 99_999 - 300).await;
    let res = call(&svc, "/download?chunks=10", "d").await;
    let all = res.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(all.len(), 1000);
    wait_for_remaining(&limiter, &key_of("d"), 99_999 - 1300).await;
}
