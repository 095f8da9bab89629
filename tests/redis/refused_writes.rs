//! Redis answers reads but refuses writes: a read-only replica (`READONLY`:
//! a demoted master, a client pointed at a replica) or a master past
//! `maxmemory` with `noeviction` (`OOM`). Limits still hold: a route
//! charged after the response falls under the failure policy once a charge
//! fails (closed refuses until a charge lands again, local decides on the
//! local limiter that took the charges), and every writing operation fails
//! alike on every algorithm and on leases, leaving no key behind.
use crate::common;

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use common::RedisServer;
use fleetgate::concurrency::{ConcurrencyLimiter, ConcurrencyPolicy};
use fleetgate::key::HeaderKey;
use fleetgate::live::LivePolicies;
use fleetgate::rate_limit::ResponseCost;
use fleetgate::{Algorithm, FailurePolicy, Key, Limit, Limiter, Policy, Rate, RateLimitLayer};
use http::StatusCode;
use tower::ServiceBuilder;

use crate::response_cost::*;

/// How the server refuses writes.
#[derive(Clone, Copy, Debug)]
enum Refusal {
    /// `REPLICAOF` a port where nothing listens: the server keeps its data
    /// and answers reads, and refuses every write with `READONLY`.
    ReadOnly,
    /// `maxmemory 1` with `noeviction`: every write that takes memory is
    /// refused with `OOM`; deletes still pass.
    OutOfMemory,
}

async fn refuse_writes(server: &RedisServer, how: Refusal) {
    let mut admin = server.admin().await;
    match how {
        Refusal::ReadOnly => {
            // Port 1: nothing listens there, nor will (a free port could
            // be taken by another test's server, and this one would then
            // sync from it).
            let _: () = redis::cmd("REPLICAOF")
                .arg("127.0.0.1")
                .arg(1)
                .query_async(&mut admin)
                .await
                .unwrap();
        }
        Refusal::OutOfMemory => {
            let _: () = redis::cmd("CONFIG")
                .arg(&["SET", "maxmemory-policy", "noeviction"])
                .query_async(&mut admin)
                .await
                .unwrap();
            let _: () = redis::cmd("CONFIG")
                .arg(&["SET", "maxmemory", "1"])
                .query_async(&mut admin)
                .await
                .unwrap();
        }
    }
}

async fn take_writes_again(server: &RedisServer, how: Refusal) {
    let mut admin = server.admin().await;
    let mut cmd = match how {
        Refusal::ReadOnly => redis::cmd("REPLICAOF"),
        Refusal::OutOfMemory => redis::cmd("CONFIG"),
    };
    match how {
        Refusal::ReadOnly => cmd.arg(&["NO", "ONE"]),
        Refusal::OutOfMemory => cmd.arg(&["SET", "maxmemory", "0"]),
    };
    let _: () = cmd.query_async(&mut admin).await.unwrap();
}

async fn keys_in(server: &RedisServer) -> Vec<String> {
    let mut admin = server.admin().await;
    let mut keys: Vec<String> = redis::cmd("KEYS")
        .arg("*")
        .query_async(&mut admin)
        .await
        .unwrap();
    keys.sort();
    keys
}

/// Waits (within 5 s) until `key`'s charge has failed: a peek then sends
/// it again and fails too. (The charge runs after the response, off its
/// path: the next call could otherwise come before its failure.)
async fn wait_until_owed(limiter: &Limiter, key: &Key) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while limiter.peek(key, 1).await.is_ok() {
        assert!(Instant::now() < deadline, "the charge never failed");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// 1000 tokens an hour: a token refills every 3.6 s, long enough for a
/// loaded machine to read the figures a charge left before they move.
fn tokens() -> Policy {
    policy("tokens", Limit::new(Rate::per_hour(1000)).unwrap())
}

fn tokens_layer(limiter: &Limiter, failure: FailurePolicy) -> RateLimitLayer<HeaderKey> {
    RateLimitLayer::new(limiter.clone())
        .key(HeaderKey::new("x-api-key"))
        .response_cost(ResponseCost::header("x-tokens-used"))
        .on_store_error(failure)
}

/// Fails closed, 1000 tokens an hour, 400 a call. The first call's charge
/// fails; every call after it is refused with 503 and `Retry-After` until
/// Redis takes writes again; then the owed 400 land first and the budget
/// runs out after three calls in all, as on a healthy Redis.
async fn closed_refuses_until_a_charge_lands(how: Refusal) {
    let server = RedisServer::start();
    let limiter = Limiter::new(tokens(), common::redis_store(&server).await);
    let handler = Handler::default();
    let svc = ServiceBuilder::new()
        .layer(tokens_layer(&limiter, FailurePolicy::Closed))
        .service(handler.service());
    let k = key_of("k");
    refuse_writes(&server, how).await;
    assert_eq!(
        call(&svc, "/complete?tokens=400", "k").await.status(),
        StatusCode::OK
    );
    wait_until_owed(&limiter, &k).await;
    for _ in 0..5 {
        let res = call(&svc, "/complete?tokens=400", "k").await;
        assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE, "{how:?}");
        assert_eq!(retry_after(&res), 1);
    }
    assert_eq!(handler.calls.load(Ordering::SeqCst), 1);
    take_writes_again(&server, how).await;
    for left in [199, 0] {
        let res = call(&svc, "/complete?tokens=400", "k").await;
        assert_eq!(res.status(), StatusCode::OK, "{how:?}");
        wait_for_remaining(&limiter, &k, left).await;
    }
    let res = call(&svc, "/complete?tokens=400", "k").await;
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(handler.calls.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn a_read_only_replica_fails_closed_until_a_charge_lands() {
    closed_refuses_until_a_charge_lands(Refusal::ReadOnly).await;
}

#[tokio::test]
async fn an_out_of_memory_master_fails_closed_until_a_charge_lands() {
    closed_refuses_until_a_charge_lands(Refusal::OutOfMemory).await;
}

/// Falls back to half of each limit locally (500 tokens): the first call
/// passes on Redis' peek and its failed charge goes to the local limiter;
/// the second passes there (100 left) and the third is refused by it.
#[tokio::test]
async fn local_decides_on_the_local_limiter_that_holds_the_charges() {
    let server = RedisServer::start();
    let limiter = Limiter::new(tokens(), common::redis_store(&server).await);
    let handler = Handler::default();
    let svc = ServiceBuilder::new()
        .layer(tokens_layer(&limiter, FailurePolicy::local(0.5).unwrap()))
        .service(handler.service());
    refuse_writes(&server, Refusal::ReadOnly).await;
    let statuses = async || {
        let mut out = Vec::new();
        for _ in 0..4 {
            out.push(call(&svc, "/complete?tokens=400", "k").await.status());
            wait_until_owed(&limiter, &key_of("k")).await;
        }
        out
    };
    let statuses = statuses().await;
    assert_eq!(
        statuses,
        [200, 200, 429, 429].map(|s| StatusCode::from_u16(s).unwrap())
    );
    assert_eq!(handler.calls.load(Ordering::SeqCst), 2);
}

/// Only failed logins count, 5 per 15 minutes, failing closed on a
/// read-only replica: the first 401's charge fails, and the next call is
/// refused (503) rather than let a brute force run unlimited.
#[tokio::test]
async fn a_login_limit_holds_on_a_read_only_replica() {
    let server = RedisServer::start();
    let limiter = Limiter::new(
        policy(
            "login",
            Limit::new(Rate::new(5, Duration::from_secs(900))).unwrap(),
        ),
        common::redis_store(&server).await,
    );
    let handler = Handler::default();
    let svc = ServiceBuilder::new()
        .layer(
            RateLimitLayer::new(limiter.clone())
                .key(HeaderKey::new("x-api-key"))
                .response_cost(ResponseCost::count_if(|head| head.status == 401))
                .on_store_error(FailurePolicy::Closed),
        )
        .service(handler.service());
    refuse_writes(&server, Refusal::ReadOnly).await;
    // Good logins charge nothing: nothing is owed.
    for _ in 0..3 {
        assert_eq!(call(&svc, "/login", "u").await.status(), StatusCode::OK);
    }
    let res = call(&svc, "/login?status=401", "u").await;
    assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
    wait_until_owed(&limiter, &key_of("u")).await;
    for _ in 0..10 {
        let res = call(&svc, "/login?status=401", "u").await;
        assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    }
    assert_eq!(handler.calls.load(Ordering::SeqCst), 4);
}

/// Every algorithm's check of a new identity fails on both kinds of
/// refusal and creates no key (a sliding log's trim used to come first and
/// let its entries in past `maxmemory`); leases too. A denied check writes
/// nothing and is answered as usual.
#[tokio::test]
async fn every_writing_operation_fails_alike_and_leaves_no_key() {
    for how in [Refusal::ReadOnly, Refusal::OutOfMemory] {
        let server = RedisServer::start();
        let store = common::redis_store(&server).await;
        let algorithms = [
            Algorithm::Gcra,
            Algorithm::SlidingLog,
            Algorithm::SlidingWindow,
            Algorithm::FixedWindow,
        ];
        let limiters: Vec<Limiter> = algorithms
            .iter()
            .map(|&algorithm| {
                let policy = Policy::builder(format!("{algorithm:?}"))
                    .algorithm(algorithm)
                    .limit(Limit::new(Rate::per_minute(10)).unwrap())
                    .build()
                    .unwrap();
                Limiter::new(policy, store.clone())
            })
            .collect();
        let leases = ConcurrencyLimiter::new(
            ConcurrencyPolicy::builder("slots", 2).build().unwrap(),
            store.clone(),
        );
        // A spent key, for the denial (and the scripts loaded).
        let spent = Key::new("spent");
        for limiter in &limiters {
            assert!(limiter.check(&spent, 10).await.unwrap().is_allowed());
        }
        let before = keys_in(&server).await;
        assert!(!before.is_empty());
        refuse_writes(&server, how).await;
        let fresh = Key::new("fresh");
        for limiter in &limiters {
            let name = limiter.policy().name().to_owned();
            let err = limiter.check(&fresh, 1).await;
            assert!(err.is_err(), "{how:?} {name}: {err:?}");
            let denied = limiter.check(&spent, 1).await.unwrap();
            assert!(!denied.is_allowed(), "{how:?} {name}");
            assert!(limiter.charge(&fresh, 1).await.is_err(), "{how:?} {name}");
        }
        let acquired = leases.acquire(&fresh).await;
        assert!(acquired.is_err(), "{how:?} lease: {acquired:?}");
        // A pause and a refund write; a refund of the log only deletes,
        // which an OOM master takes.
        let gcra = &limiters[0];
        assert!(gcra.defer(&fresh, Duration::from_secs(5)).await.is_err());
        for limiter in &limiters {
            let refund = limiter.refund(&spent, 1).await;
            let deletes = matches!(how, Refusal::OutOfMemory)
                && limiter.policy().algorithm() == Algorithm::SlidingLog;
            assert_eq!(refund.is_ok(), deletes, "{how:?} {refund:?}");
        }
        let live = LivePolicies::new(store.clone());
        let _tokens = live.limiter(tokens());
        let changed = live.set_policy("tokens", "5/s").await;
        assert!(changed.is_err(), "{how:?}: {changed:?}");
        let mut after = keys_in(&server).await;
        // The refunded log entry is the one key that changed.
        after.retain(|k| !k.contains("SlidingLog"));
        let mut before = before.clone();
        before.retain(|k| !k.contains("SlidingLog"));
        assert_eq!(after, before, "{how:?}");
    }
}

/// A reset lifts what a key owes: on a read-only replica failing closed,
/// a key refused for its failed charge is admitted again once reset (and
/// owes its next charge in turn).
#[tokio::test]
async fn a_reset_forgets_an_owed_charge() {
    let server = RedisServer::start();
    let limiter = Limiter::new(tokens(), common::redis_store(&server).await);
    let svc = ServiceBuilder::new()
        .layer(tokens_layer(&limiter, FailurePolicy::Closed))
        .service(Handler::default().service());
    let k = key_of("k");
    refuse_writes(&server, Refusal::OutOfMemory).await;
    assert_eq!(call(&svc, "/complete?tokens=400", "k").await.status(), 200);
    wait_until_owed(&limiter, &k).await;
    assert_eq!(call(&svc, "/complete?tokens=400", "k").await.status(), 503);
    limiter.reset(&k).await.unwrap();
    assert_eq!(call(&svc, "/complete?tokens=400", "k").await.status(), 200);
}

/// On a master past `maxmemory`, an acquire queued in a batch before a
/// release fails alone: the release behind it (a delete, which such a
/// master takes) still lands, as it would sent by itself, and frees its
/// slot at once rather than after the lease's TTL.
#[tokio::test]
async fn a_release_batched_behind_a_refused_acquire_still_lands() {
    use std::future::Future;
    use std::task::{Context, Waker};

    let server = RedisServer::start();
    let store = fleetgate::RedisStore::builder(server.url())
        .timeout(Duration::from_secs(5))
        .max_in_flight(1)
        .connect()
        .await
        .unwrap();
    let leases = ConcurrencyLimiter::new(
        ConcurrencyPolicy::builder("slots", 5)
            .lease_ttl(Duration::from_secs(120))
            .no_renewal()
            .build()
            .unwrap(),
        store,
    );
    // Both lease scripts loaded (alone and batched), and one lease held.
    let mut warm: Vec<_> = (0..3)
        .map(|_| Box::pin(leases.acquire(&Key::new("held"))))
        .collect();
    let mut held = Vec::new();
    for acquire in &mut warm {
        held.push(acquire.as_mut().await);
    }
    let guard = held.pop().unwrap().unwrap();
    drop(held);
    leases.releases_settled().await;
    assert_eq!(server.leases_held().await, 1);

    refuse_writes(&server, Refusal::OutOfMemory).await;
    // The first goes alone; the second queues, and the release behind it.
    let mut cx = Context::from_waker(Waker::noop());
    let mut alone = Box::pin(leases.acquire(&Key::new("a")));
    let mut queued = Box::pin(leases.acquire(&Key::new("b")));
    assert!(alone.as_mut().poll(&mut cx).is_pending());
    assert!(queued.as_mut().poll(&mut cx).is_pending());
    drop(guard);
    assert!(alone.await.is_err());
    assert!(queued.await.is_err());
    tokio::time::timeout(Duration::from_secs(20), leases.releases_settled())
        .await
        .expect("the release settles");
    assert_eq!(server.leases_held().await, 0, "the release was lost");
}
