//! Cost known after the response (`RateLimitLayer::response_cost`), each
//! scenario run on a memory store and on a Redis store (a private
//! redis-server per test): a token budget charged from a header, a login
//! limit that counts only 401s, 5xx refunded, a debt repaid at exactly the
//! limit's rate, concurrent callers of each kind (on Redis, from two
//! instances), a body's bytes counted up to where the client dropped it,
//! and a layer without a response cost. (On Redis alone: a huge charge's
//! key TTL, tests/redis/after.rs; charges while Redis refuses writes,
//! tests/redis/refused_writes.rs; a charge that fails while Redis hangs,
//! tests/alone/charge_log.rs.)
use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use axum::body::Body;
use fleetgate::clock::ManualClock;
use fleetgate::key::HeaderKey;
use fleetgate::rate_limit::ResponseCost;
use fleetgate::{
    Decision, Key, Limit, Limiter, MemoryStore, Policy, Rate, RateLimitLayer, RedisStore, Store,
    TimeSource,
};
use http::{Request, Response, StatusCode};
use http_body_util::BodyExt;
use tower::{ServiceBuilder, ServiceExt};

use crate::common::{self, RedisServer};
use crate::response_cost::*;

/// The store a scenario runs on: the memory store, or Redis (the test's
/// own server, stopped when the test ends).
struct OnStore {
    redis: Option<RedisServer>,
}

impl OnStore {
    fn memory() -> OnStore {
        OnStore { redis: None }
    }

    fn redis() -> OnStore {
        OnStore {
            redis: Some(RedisServer::start()),
        }
    }

    /// A store on the real clock.
    async fn store(&self) -> Arc<dyn Store> {
        match &self.redis {
            None => Arc::new(MemoryStore::new()),
            Some(server) => Arc::new(common::redis_store(server).await),
        }
    }

    /// A store on `clock` (on Redis, its scripts read it).
    async fn on_clock(&self, clock: &ManualClock) -> Arc<dyn Store> {
        match &self.redis {
            None => Arc::new(MemoryStore::builder().clock(clock.clone()).build()),
            Some(server) => Arc::new(
                RedisStore::builder(server.url())
                    .time_source(TimeSource::Client(Arc::new(clock.clone())))
                    .timeout(Duration::from_secs(2))
                    .connect()
                    .await
                    .expect("connect to the test's redis-server"),
            ),
        }
    }

    /// The instances of a fleet sharing one budget: one memory store, or
    /// two Redis stores (a connection each) on one server.
    async fn instances(&self) -> Vec<Arc<dyn Store>> {
        let Some(server) = &self.redis else {
            return vec![self.store().await];
        };
        let mut stores: Vec<Arc<dyn Store>> = Vec::new();
        for _ in 0..2 {
            // A charge that times out is sent again before the key's next
            // peek, and one that had landed all the same then counts twice
            // (charges land at least once): the debt's exact figure needs
            // a timeout no loaded machine reaches.
            let store = RedisStore::builder(server.url())
                .timeout(Duration::from_secs(30))
                .connect()
                .await
                .expect("connect to the test's redis-server");
            stores.push(Arc::new(store));
        }
        stores
    }

    /// A store to read what `instances` left, past their deny caches (an
    /// instance's may still hold a denial it answered while the others
    /// refunded, until its retry time): on Redis a store of its own,
    /// with no deny cache either. Its reads poll until the refunds, sent
    /// on tasks after the responses, have landed; one that came first and
    /// cached its denial would answer every later one with it.
    async fn reader(&self, instances: &[Arc<dyn Store>]) -> Arc<dyn Store> {
        match &self.redis {
            None => instances[0].clone(),
            Some(server) => Arc::new(
                RedisStore::builder(server.url())
                    .timeout(Duration::from_secs(2))
                    .deny_cache(0)
                    .connect()
                    .await
                    .expect("connect to the test's redis-server"),
            ),
        }
    }

    /// How long a charge or refund may take to land once its response is
    /// made: none on the memory store, which answers at once; a Redis
    /// store's runs on a task of its own.
    fn landing(&self) -> Duration {
        match self.redis {
            None => Duration::ZERO,
            Some(_) => Duration::from_secs(5),
        }
    }

    /// How far the store's clock may be from this process's `Instant`:
    /// Redis reads the server's.
    fn clock_margin(&self) -> Duration {
        match self.redis {
            None => Duration::ZERO,
            Some(_) => Duration::from_millis(100),
        }
    }

    /// Waits until `api_key` has `left` calls of cost 1 left: the charges
    /// and refunds made so far have landed.
    async fn remaining(&self, limiter: &Limiter, api_key: &str, left: u64) {
        let what = format!("remaining {left}");
        self.settled(limiter, api_key, &what, |d| d.remaining() == left)
            .await;
    }

    /// Waits until a peek (cost 1) of `api_key` has `settled` (`what`),
    /// and returns it.
    async fn settled(
        &self,
        limiter: &Limiter,
        api_key: &str,
        what: &str,
        settled: impl Fn(&Decision) -> bool,
    ) -> Decision {
        wait_for_peek(limiter, &key_of(api_key), self.landing(), what, settled).await
    }
}

/// Runs each scenario (a function of this module taking an [`OnStore`])
/// as a test on the memory store (`memory::<scenario>`) and on Redis
/// (`redis::<scenario>`), under the test attribute given.
macro_rules! on_both_stores {
    ($(#[$test:meta] $scenario:ident;)*) => {
        mod memory {
            $(
                #[$test]
                async fn $scenario() {
                    super::$scenario(super::OnStore::memory()).await;
                }
            )*
        }
        mod redis {
            $(
                #[$test]
                async fn $scenario() {
                    super::$scenario(super::OnStore::redis()).await;
                }
            )*
        }
    };
}

on_both_stores! {
    #[tokio::test] token_budget_is_charged_from_the_header_and_refuses_in_debt;
    #[tokio::test] a_debt_is_repaid_at_exactly_the_limits_rate;
    #[tokio::test] only_failed_logins_count;
    #[tokio::test] failed_logins_block_the_identity;
    #[tokio::test] server_errors_are_refunded;
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    concurrent_charge_after_overshoots_by_the_costs_in_flight_refund_never;
    #[tokio::test] body_bytes_count_what_was_sent_before_the_client_left;
    #[tokio::test] without_a_response_cost_nothing_changes;
}

/// 1000 tokens a minute charged from `x-tokens-used`: three 400-token
/// calls pass, the fourth quick one gets 429 with `Retry-After` of 13 s
/// (the 200-token debt and one token, at 60 ms a token: 12.06 s).
async fn token_budget_is_charged_from_the_header_and_refuses_in_debt(on: OnStore) {
    let limiter = Limiter::new(
        policy("tokens", Limit::new(Rate::per_minute(1000)).unwrap()),
        on.store().await,
    );
    let handler = Handler::default();
    let svc = ServiceBuilder::new()
        .layer(layer(&limiter, ResponseCost::header("x-tokens-used")))
        .service(handler.service());
    for left in [599, 199, 0] {
        let res = call(&svc, "/complete?tokens=400", "k1").await;
        assert_eq!(res.status(), StatusCode::OK);
        on.remaining(&limiter, "k1", left).await;
    }
    let res = call(&svc, "/complete?tokens=400", "k1").await;
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!((12..=13).contains(&retry_after(&res)), "{res:?}");
    assert_eq!(handler.calls.load(Ordering::SeqCst), 3);
    // Another key has its own budget; a response without the header is
    // charged the request's cost (1).
    let res = call(&svc, "/complete", "k2").await;
    assert_eq!(res.status(), StatusCode::OK);
    on.remaining(&limiter, "k2", 998).await;
}

/// A debt is repaid at exactly the limit's rate (the store on a manual
/// clock): 1200 tokens charged against 1000 a minute refuse for 201 ×
/// 60 ms, to the millisecond. One response stating the largest cost holds
/// its identity back an hour (16 periods of the limit are less), not for
/// 35 years.
async fn a_debt_is_repaid_at_exactly_the_limits_rate(on: OnStore) {
    let clock = ManualClock::new(Duration::from_secs(1_699_999_980));
    let limiter = Limiter::new(
        policy("tokens", Limit::new(Rate::per_minute(1000)).unwrap()),
        on.on_clock(&clock).await,
    );
    let svc = ServiceBuilder::new()
        .layer(layer(&limiter, ResponseCost::header("x-tokens-used")))
        .service(Handler::default().service());
    for left in [599, 199, 0] {
        let res = call(&svc, "/complete?tokens=400", "k").await;
        assert_eq!(res.status(), StatusCode::OK);
        on.remaining(&limiter, "k", left).await;
    }
    let d = limiter.peek(&key_of("k"), 1).await.unwrap();
    assert_eq!(d.retry_after(), Some(Duration::from_millis(12_060)));
    clock.advance(Duration::from_millis(12_059));
    let res = call(&svc, "/complete?tokens=0", "k").await;
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(retry_after(&res), 1);
    clock.advance(Duration::from_millis(1));
    // Repaid: the call passes, and its cost of 0 charges nothing, so one
    // token is there for the next.
    let res = call(&svc, "/complete?tokens=0", "k").await;
    assert_eq!(res.status(), StatusCode::OK);
    let res = call(&svc, "/complete?tokens=2", "k").await;
    assert_eq!(res.status(), StatusCode::OK);
    // Two tokens charged with one left: one token in debt, and one more.
    let retry = Some(Duration::from_millis(120));
    let d = on
        .settled(&limiter, "k", "120 ms to wait", |d| {
            d.retry_after() == retry
        })
        .await;
    assert!(!d.is_allowed());
    // The debt's time and one token's more: exactly two tokens are there.
    clock.advance(Duration::from_millis(180));
    let res = call(&svc, "/complete?tokens=2", "k").await;
    assert_eq!(res.status(), StatusCode::OK);
    let retry = Some(Duration::from_millis(60));
    let d = on
        .settled(&limiter, "k", "60 ms to wait", |d| d.retry_after() == retry)
        .await;
    assert!(!d.is_allowed());

    let res = call(&svc, "/complete?tokens=18446744073709551615", "huge").await;
    assert_eq!(res.status(), StatusCode::OK);
    on.remaining(&limiter, "huge", 0).await;
    let res = call(&svc, "/complete?tokens=1", "huge").await;
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(retry_after(&res), 3601, "{res:?}");
    clock.advance(Duration::from_millis(3_600_060));
    let res = call(&svc, "/complete?tokens=1", "huge").await;
    assert_eq!(res.status(), StatusCode::OK);
}

/// Login, 5 per 15 minutes, counting only 401s (and 403s): twenty 200s
/// pass; after five 401s the next call is refused even though it would
/// succeed.
async fn only_failed_logins_count(on: OnStore) {
    let limiter = Limiter::new(
        policy(
            "login",
            Limit::new(Rate::new(5, Duration::from_secs(900))).unwrap(),
        ),
        on.store().await,
    );
    let handler = Handler::default();
    let svc = ServiceBuilder::new()
        .layer(layer(
            &limiter,
            ResponseCost::count_if(|head| {
                head.status == StatusCode::UNAUTHORIZED || head.status == StatusCode::FORBIDDEN
            }),
        ))
        .service(handler.service());
    for _ in 0..20 {
        assert_eq!(call(&svc, "/login", "u").await.status(), StatusCode::OK);
    }
    on.remaining(&limiter, "u", 4).await;
    for left in [3, 2, 1, 0, 0] {
        let res = call(&svc, "/login?status=401", "u").await;
        assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
        on.remaining(&limiter, "u", left).await;
    }
    let res = call(&svc, "/login", "u").await;
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(retry_after(&res) > 0);
    assert_eq!(handler.calls.load(Ordering::SeqCst), 25);
}

/// `5/15min block 1h`, counting only 401s: after five failed logins the
/// next login is refused though it would succeed, and blocks the identity
/// for an hour (`Retry-After`); other identities pass; a reset lifts it.
async fn failed_logins_block_the_identity(on: OnStore) {
    let login = Limit::builder(Rate::new(5, Duration::from_secs(900)))
        .block_for(Duration::from_secs(3600))
        .build()
        .unwrap();
    let limiter = Limiter::new(policy("login", login), on.store().await);
    let handler = Handler::default();
    let svc = ServiceBuilder::new()
        .layer(layer(
            &limiter,
            ResponseCost::count_if(|head| head.status == StatusCode::UNAUTHORIZED),
        ))
        .service(handler.service());
    for left in [3, 2, 1, 0, 0] {
        let res = call(&svc, "/login?status=401", "u").await;
        assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
        on.remaining(&limiter, "u", left).await;
    }
    for _ in 0..3 {
        let res = call(&svc, "/login", "u").await;
        assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
        let retry = retry_after(&res);
        assert!((3590..=3600).contains(&retry), "{res:?}");
    }
    assert_eq!(handler.calls.load(Ordering::SeqCst), 5);
    assert_eq!(call(&svc, "/login", "v").await.status(), StatusCode::OK);
    limiter.reset(&key_of("u")).await.unwrap();
    assert_eq!(call(&svc, "/login", "u").await.status(), StatusCode::OK);
}

/// 3 a minute, burst 3, 5xx refunded: ten 500s all reach the handler,
/// then three 200s pass and the fourth gets 429.
async fn server_errors_are_refunded(on: OnStore) {
    let limiter = Limiter::new(
        policy(
            "flaky",
            Limit::builder(Rate::per_minute(3))
                .burst(3)
                .build()
                .unwrap(),
        ),
        on.store().await,
    );
    let handler = Handler::default();
    let svc = ServiceBuilder::new()
        .layer(layer(&limiter, ResponseCost::refund_server_errors()))
        .service(handler.service());
    for _ in 0..10 {
        let res = call(&svc, "/flaky?status=500", "c").await;
        assert_eq!(res.status(), StatusCode::INTERNAL_SERVER_ERROR);
        // The refund has landed: the full burst is back.
        on.remaining(&limiter, "c", 2).await;
    }
    assert_eq!(handler.calls.load(Ordering::SeqCst), 10);
    for _ in 0..3 {
        assert_eq!(call(&svc, "/flaky", "c").await.status(), StatusCode::OK);
    }
    let res = call(&svc, "/flaky", "c").await;
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(handler.calls.load(Ordering::SeqCst), 13);
}

/// Eight clients on each instance (one on the memory store, two on Redis)
/// send 40 charge-after calls of 400 tokens each against 1000 an hour:
/// each is admitted by a peek, so together they overshoot, but only by
/// what was in flight when the last one was admitted (under 1000 + 400 a
/// client). Refund callers (3, burst 3, every response a 500) never have
/// more than the burst in flight.
async fn concurrent_charge_after_overshoots_by_the_costs_in_flight_refund_never(on: OnStore) {
    const CLIENTS: u64 = 8;
    let instances = on.instances().await;
    let clients_in_all = CLIENTS * instances.len() as u64;
    let tokens = policy("tokens", Limit::new(Rate::per_hour(1000)).unwrap());
    // Each script loaded first (on Redis a script's first call loads it:
    // two more round trips, which would let the first charges trail their
    // peeks).
    for store in &instances {
        let warm = Limiter::new(tokens.clone(), store.clone());
        warm.peek(&Key::new("warm"), 1).await.unwrap();
        warm.charge(&Key::new("warm"), 1).await.unwrap();
    }
    // The key's first charge, which starts its debt's clock, comes after
    // this instant: the debt left at any later moment is the whole debt
    // less at most the time since.
    let started = Instant::now();
    let admitted = fleet(
        &instances,
        CLIENTS,
        &tokens,
        || ResponseCost::header("x-tokens-used"),
        &Handler::default(),
        "/complete?tokens=400&yields=20",
    )
    .await;
    assert!(admitted >= 3, "{admitted}");
    assert!(
        admitted * 400 < 1000 + clients_in_all * 400,
        "{admitted} admitted: more than the costs in flight"
    );
    // Every admitted call was charged: the debt is all of it, repaid at
    // 3.6 s a token (less at most the time since the start).
    let limiter = Limiter::new(tokens, on.reader(&instances).await);
    let debt = admitted * 400 - 1000;
    let full = Duration::from_millis(3_600 * (debt + 1));
    let what = format!("the whole debt of {debt} ({full:?}) to wait");
    on.settled(&limiter, "hot", &what, |d| {
        let repaid = started.elapsed() + on.clock_margin();
        d.retry_after()
            .is_some_and(|r| r <= full && r + repaid >= full)
    })
    .await;

    let flaky = policy(
        "flaky",
        Limit::builder(Rate::per_hour(3)).burst(3).build().unwrap(),
    );
    let handler = Handler::default();
    fleet(
        &instances,
        CLIENTS,
        &flaky,
        ResponseCost::refund_server_errors,
        &handler,
        "/flaky?status=500&yields=20",
    )
    .await;
    let peak = handler.peak.load(Ordering::SeqCst);
    assert!((1..=3).contains(&peak), "{peak} in flight");
    // Every one refunded: the full burst is back.
    let limiter = Limiter::new(flaky, on.reader(&instances).await);
    on.remaining(&limiter, "hot", 2).await;
}

/// `clients_each` clients on each of `instances` (a layer charging `cost` over
/// `handler`), each making five calls to `uri` one after the other as the
/// key `hot`; how many were admitted in all.
async fn fleet(
    instances: &[Arc<dyn Store>],
    clients_each: u64,
    policy: &Policy,
    cost: impl Fn() -> ResponseCost,
    handler: &Handler,
    uri: &'static str,
) -> u64 {
    let mut tasks = Vec::new();
    for store in instances {
        let limiter = Limiter::new(policy.clone(), store.clone());
        let svc = ServiceBuilder::new()
            .layer(layer(&limiter, cost()))
            .service(handler.service());
        tasks.push(tokio::spawn(async move {
            clients(clients_each, 5, &svc, uri).await
        }));
    }
    let mut admitted = 0;
    for task in tasks {
        admitted += task.await.unwrap();
    }
    admitted
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
async fn body_bytes_count_what_was_sent_before_the_client_left(on: OnStore) {
    let limiter = Limiter::new(
        policy("bytes", Limit::new(Rate::per_hour(100_000)).unwrap()),
        on.store().await,
    );
    let svc = ServiceBuilder::new()
        .layer(layer(&limiter, ResponseCost::body_bytes()))
        .service(Handler::default().service());
    let res = call(&svc, "/download?chunks=10", "d").await;
    assert_eq!(res.status(), StatusCode::OK);
    // The head alone charges nothing yet.
    on.remaining(&limiter, "d", 99_999).await;
    let mut body = res.into_body();
    for _ in 0..3 {
        body.frame().await.unwrap().unwrap();
    }
    drop(body);
    on.remaining(&limiter, "d", 99_999 - 300).await;
    let res = call(&svc, "/download?chunks=10", "d").await;
    let all = res.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(all.len(), 1000);
    on.remaining(&limiter, "d", 99_999 - 1300).await;
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
    on.remaining(&limiter, "e", 99_999 - 100).await;
}

/// A layer without a response cost is unchanged: every call charged
/// before, nothing after.
async fn without_a_response_cost_nothing_changes(on: OnStore) {
    let limiter = Limiter::new(
        policy("plain", Limit::new(Rate::per_hour(10)).unwrap()),
        on.store().await,
    );
    let svc = ServiceBuilder::new()
        .layer(RateLimitLayer::new(limiter.clone()).key(HeaderKey::new("x-api-key")))
        .service(Handler::default().service());
    let res = call(&svc, "/complete?tokens=400&status=500", "p").await;
    assert_eq!(res.status(), StatusCode::INTERNAL_SERVER_ERROR);
    on.remaining(&limiter, "p", 8).await;
}
