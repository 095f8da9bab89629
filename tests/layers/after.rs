//! Cost known after the response (`RateLimitLayer::response_cost`) on the
//! memory store: a token budget charged from a header, a login limit that
//! counts only 401s, 5xx refunded, a debt repaid at exactly the limit's
//! rate, concurrent callers of each kind, and a body's bytes counted up to
//! where the client dropped it. (The same on Redis: tests/redis/after.rs.)
use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::body::Body;
use fleetgate::key::HeaderKey;
use fleetgate::rate_limit::ResponseCost;
use fleetgate::{Limit, Limiter, Rate, RateLimitLayer};
use http::{Request, Response, StatusCode};
use http_body_util::BodyExt;
use tower::{ServiceBuilder, ServiceExt};

use crate::paused_memory_store;

/// A body of `chunks` frames of 100 bytes each.
#[path = "../common/response_cost.rs"]
mod response_cost;
use response_cost::*;

/// Waits (polling, within 5 s) until `key`'s budget under `limiter` has
/// `left` calls of cost 1 left: a charge made off the response's path
/// has landed.
async fn wait_for_remaining(limiter: &Limiter, key: &str, left: u64) {
    // Real time: a test with paused time would never reach it.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let d = limiter.peek(&key_of(key), 1).await.unwrap();
        if d.remaining() == left {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "remaining {} never became {left}",
            d.remaining()
        );
        tokio::task::yield_now().await;
    }
}

/// 1000 tokens a minute charged from `x-tokens-used`: three 400-token
/// calls pass, the fourth quick one gets 429 with `Retry-After` of 13 s
/// (the 200-token debt and one token, at 60 ms a token: 12.06 s).
#[tokio::test(start_paused = true)]
async fn token_budget_is_charged_from_the_header_and_refuses_in_debt() {
    let limiter = Limiter::new(
        policy("tokens", Limit::new(Rate::per_minute(1000)).unwrap()),
        paused_memory_store(),
    );
    let handler = Handler::default();
    let svc = ServiceBuilder::new()
        .layer(
            RateLimitLayer::new(limiter.clone())
                .key(HeaderKey::new("x-api-key"))
                .response_cost(ResponseCost::header("x-tokens-used")),
        )
        .service(handler.service());
    for left in [600, 200, 0] {
        let res = call(&svc, "/complete?tokens=400", "k1").await;
        assert_eq!(res.status(), StatusCode::OK);
        wait_for_remaining(&limiter, "k1", left.max(1) - 1).await;
    }
    let res = call(&svc, "/complete?tokens=400", "k1").await;
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!((12..=13).contains(&retry_after(&res)), "{res:?}");
    assert_eq!(handler.calls.load(Ordering::SeqCst), 3);
    // Another key has its own budget; a response without the header is
    // charged the request's cost (1).
    let res = call(&svc, "/complete", "k2").await;
    assert_eq!(res.status(), StatusCode::OK);
    wait_for_remaining(&limiter, "k2", 998).await;
}

/// A debt is repaid at exactly the limit's rate: 1200 tokens charged
/// against 1000 a minute refuse for 201 × 60 ms, to the millisecond. One
/// response stating the largest cost holds its identity back an hour (16
/// periods of the limit are less), not for 35 years.
#[tokio::test(start_paused = true)]
async fn a_debt_is_repaid_at_exactly_the_limits_rate() {
    let limiter = Limiter::new(
        policy("tokens", Limit::new(Rate::per_minute(1000)).unwrap()),
        paused_memory_store(),
    );
    let svc = ServiceBuilder::new()
        .layer(
            RateLimitLayer::new(limiter.clone())
                .key(HeaderKey::new("x-api-key"))
                .response_cost(ResponseCost::header("x-tokens-used")),
        )
        .service(Handler::default().service());
    for _ in 0..3 {
        let res = call(&svc, "/complete?tokens=400", "k").await;
        assert_eq!(res.status(), StatusCode::OK);
    }
    let d = limiter.peek(&key_of("k"), 1).await.unwrap();
    assert_eq!(d.retry_after(), Some(Duration::from_millis(12_060)));
    tokio::time::advance(Duration::from_millis(12_059)).await;
    let res = call(&svc, "/complete?tokens=0", "k").await;
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(retry_after(&res), 1);
    tokio::time::advance(Duration::from_millis(1)).await;
    // Repaid: the call passes, and its cost of 0 charges nothing.
    let res = call(&svc, "/complete?tokens=0", "k").await;
    assert_eq!(res.status(), StatusCode::OK);
    // One token's time later, exactly one more token is there.
    tokio::time::advance(Duration::from_millis(60)).await;
    let res = call(&svc, "/complete?tokens=2", "k").await;
    assert_eq!(res.status(), StatusCode::OK);
    let d = limiter.peek(&key_of("k"), 1).await.unwrap();
    assert!(!d.is_allowed());
    assert_eq!(d.retry_after(), Some(Duration::from_millis(60)));

    let res = call(&svc, "/complete?tokens=18446744073709551615", "huge").await;
    assert_eq!(res.status(), StatusCode::OK);
    let res = call(&svc, "/complete?tokens=1", "huge").await;
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(retry_after(&res), 3601, "{res:?}");
    tokio::time::advance(Duration::from_millis(3_600_060)).await;
    let res = call(&svc, "/complete?tokens=1", "huge").await;
    assert_eq!(res.status(), StatusCode::OK);
}

/// Login, 5 per 15 minutes, counting only 401s: twenty 200s pass; after
/// five 401s the next call is refused even though it would succeed.
#[tokio::test]
async fn only_failed_logins_count() {
    let limiter = Limiter::new(
        policy(
            "login",
            Limit::new(Rate::new(5, Duration::from_secs(900))).unwrap(),
        ),
        fleetgate::MemoryStore::new(),
    );
    let handler = Handler::default();
    let svc = ServiceBuilder::new()
        .layer(
            RateLimitLayer::new(limiter.clone())
                .key(HeaderKey::new("x-api-key"))
                .response_cost(ResponseCost::count_if(|head| {
                    head.status == StatusCode::UNAUTHORIZED || head.status == StatusCode::FORBIDDEN
                })),
        )
        .service(handler.service());
    for _ in 0..20 {
        assert_eq!(call(&svc, "/login", "u").await.status(), StatusCode::OK);
    }
    wait_for_remaining(&limiter, "u", 4).await;
    for left in (0..5).rev() {
        let res = call(&svc, "/login?status=401", "u").await;
        assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
        wait_for_remaining(&limiter, "u", left.max(1) - 1).await;
    }
    let res = call(&svc, "/login", "u").await;
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(retry_after(&res) > 0);
    assert_eq!(handler.calls.load(Ordering::SeqCst), 25);
}

/// 3 a minute, burst 3, 5xx refunded: ten 500s all reach the handler,
/// then three 200s pass and the fourth gets 429.
#[tokio::test]
async fn server_errors_are_refunded() {
    let limiter = Limiter::new(
        policy(
            "flaky",
            Limit::builder(Rate::per_minute(3))
                .burst(3)
                .build()
                .unwrap(),
        ),
        fleetgate::MemoryStore::new(),
    );
    let handler = Handler::default();
    let svc = ServiceBuilder::new()
        .layer(
            RateLimitLayer::new(limiter.clone())
                .key(HeaderKey::new("x-api-key"))
                .response_cost(ResponseCost::refund_server_errors()),
        )
        .service(handler.service());
    for _ in 0..10 {
        let res = call(&svc, "/flaky?status=500", "c").await;
        assert_eq!(res.status(), StatusCode::INTERNAL_SERVER_ERROR);
        wait_for_remaining(&limiter, "c", 2).await;
    }
    assert_eq!(handler.calls.load(Ordering::SeqCst), 10);
    for _ in 0..3 {
        assert_eq!(call(&svc, "/flaky", "c").await.status(), StatusCode::OK);
    }
    let res = call(&svc, "/flaky", "c").await;
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(handler.calls.load(Ordering::SeqCst), 13);
}

/// Eight clients send 40 charge-after calls of 400 tokens against 1000
/// an hour: each is admitted by a peek, so together they overshoot, but
/// only by what was in flight when the last one was admitted (under
/// 1000 + 8 × 400 tokens in all). Refund callers (3, burst 3, every
/// response a 500) never have more than the burst in flight.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_charge_after_overshoots_by_the_costs_in_flight_refund_never() {
    const CLIENTS: u64 = 8;
    let limiter = Limiter::new(
        policy("tokens", Limit::new(Rate::per_hour(1000)).unwrap()),
        fleetgate::MemoryStore::new(),
    );
    let svc = ServiceBuilder::new()
        .layer(
            RateLimitLayer::new(limiter.clone())
                .key(HeaderKey::new("x-api-key"))
                .response_cost(ResponseCost::header("x-tokens-used")),
        )
        .service(Handler::default().service());
    // Before the first charge, which starts the debt's clock.
    let started = std::time::Instant::now();
    let admitted = clients(CLIENTS, 5, &svc, "/complete?tokens=400&yields=20").await;
    assert!(admitted >= 3, "{admitted}");
    assert!(
        admitted * 400 < 1000 + CLIENTS * 400,
        "{admitted} admitted: more than the costs in flight"
    );
    // Every admitted call was charged: the debt is all of it, repaid at
    // 3.6 s a token (less at most the test's time so far).
    let debt = admitted * 400 - 1000;
    let d = limiter.peek(&key_of("hot"), 1).await.unwrap();
    let retry = d.retry_after().unwrap();
    let full = Duration::from_millis(3_600 * (debt + 1));
    assert!(
        retry <= full && retry + started.elapsed() >= full,
        "{retry:?} for {debt} after {:?}",
        started.elapsed()
    );

    let limiter = Limiter::new(
        policy(
            "flaky",
            Limit::builder(Rate::per_hour(3)).burst(3).build().unwrap(),
        ),
        fleetgate::MemoryStore::new(),
    );
    let handler = Handler::default();
    let svc = ServiceBuilder::new()
        .layer(
            RateLimitLayer::new(limiter.clone())
                .key(HeaderKey::new("x-api-key"))
                .response_cost(ResponseCost::refund_server_errors()),
        )
        .service(handler.service());
    clients(CLIENTS, 5, &svc, "/flaky?status=500&yields=20").await;
    let peak = handler.peak.load(Ordering::SeqCst);
    assert!((1..=3).contains(&peak), "{peak} in flight");
    // Every one refunded: the full burst is back.
    wait_for_remaining(&limiter, "hot", 2).await;
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
/// away is charged 300; one that reads all is charged 1000.
#[tokio::test]
async fn body_bytes_count_what_was_sent_before_the_client_left() {
    let limiter = Limiter::new(
        policy("bytes", Limit::new(Rate::per_hour(100_000)).unwrap()),
        fleetgate::MemoryStore::new(),
    );
    let svc = ServiceBuilder::new()
        .layer(
            RateLimitLayer::new(limiter.clone())
                .key(HeaderKey::new("x-api-key"))
                .response_cost(ResponseCost::body_bytes()),
        )
        .service(Handler::default().service());
    let res = call(&svc, "/download?chunks=10", "d").await;
    assert_eq!(res.status(), StatusCode::OK);
    // The head alone charges nothing yet.
    wait_for_remaining(&limiter, "d", 99_999).await;
    let mut body = res.into_body();
    for _ in 0..3 {
        body.frame().await.unwrap().unwrap();
    }
    drop(body);
    wait_for_remaining(&limiter, "d", 99_999 - 300).await;
    let res = call(&svc, "/download?chunks=10", "d").await;
    let all = res.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(all.len(), 1000);
    wait_for_remaining(&limiter, "d", 99_999 - 1300).await;
    // In the any_body mode too.
    let svc = ServiceBuilder::new()
        .layer(
            RateLimitLayer::new(limiter.clone())
                .key(HeaderKey::new("x-api-key"))
                .any_body()
                .response_cost(ResponseCost::body_bytes()),
        )
        .service(Handler::default().service());
    let res = svc
        .clone()
        .oneshot(request("/download?chunks=10", "e"))
        .await
        .unwrap();
    let mut body = res.into_body();
    body.frame().await.unwrap().unwrap();
    drop(body);
    wait_for_remaining(&limiter, "e", 99_999 - 100).await;
}

/// A layer without a response cost is unchanged: every call charged
/// before, nothing after.
#[tokio::test]
async fn without_a_response_cost_nothing_changes() {
    let limiter = Limiter::new(
        policy("plain", Limit::new(Rate::per_hour(10)).unwrap()),
        fleetgate::MemoryStore::new(),
    );
    let svc = ServiceBuilder::new()
        .layer(RateLimitLayer::new(limiter.clone()).key(HeaderKey::new("x-api-key")))
        .service(Handler::default().service());
    let res = call(&svc, "/complete?tokens=400&status=500", "p").await;
    assert_eq!(res.status(), StatusCode::INTERNAL_SERVER_ERROR);
    wait_for_remaining(&limiter, "p", 8).await;
}
