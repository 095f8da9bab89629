//! Denied keys are answered locally until their retry time passes: a client
//! hammering past its limit costs Redis about the admitted rate plus one
//! call per instance and retry period, and the local answers are the ones
//! Redis would give, headers included. GCRA and the window algorithms
//! alike.
use crate::common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::routing::get;
use common::RedisServer;
use common::stats::{reset_stats, script_calls};
use fleetgate::clock::ManualClock;
use fleetgate::{
    Algorithm, Key, Limit, Limiter, Policy, Rate, RateLimitLayer, RedisStore, TimeSource,
};
use http::{Request, StatusCode};
use tower::ServiceExt;

fn policy(name: &str, rate: Rate, burst: u64) -> Policy {
    Policy::single(name, Limit::builder(rate).burst(burst).build().unwrap()).unwrap()
}

/// A store whose script is already cached in Redis, so that every later
/// decision is exactly one `EVALSHA`.
async fn store(server: &RedisServer, deny_cache: usize) -> RedisStore {
    let store = RedisStore::builder(server.url())
        .prefix("deny")
        .timeout(Duration::from_secs(2))
        .deny_cache(deny_cache)
        .connect()
        .await
        .expect("connect");
    Limiter::new(policy("warm-up", Rate::per_second(1), 1), store.clone())
        .check(&Key::new("warm-up"), 1)
        .await
        .expect("warm-up decision");
    store
}

/// Two instances each send one request per millisecond for 1.5 s at a key
/// limited to 10 per second (burst 10): about 100 times the limit. Redis
/// sees the admitted calls, plus at most about one denied call per
/// instance per emission interval (100 ms), not 3000 calls.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hammering_one_key_costs_redis_the_rate_not_the_requests() {
    let server = RedisServer::start();
    let mut admin = server
        .client()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let policy = policy("hammer", Rate::per_second(10), 10);
    let stores = [store(&server, 1000).await, store(&server, 1000).await];
    reset_stats(&mut admin).await;
    let run = Duration::from_millis(1500);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for store in &stores {
        let limiter = Limiter::new(policy.clone(), store.clone());
        tasks.push(tokio::spawn(async move {
            let key = Key::new("ip:198.51.100.9");
            let mut tick = tokio::time::interval(Duration::from_millis(1));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
            let (mut sent, mut admitted) = (0u64, 0u64);
            let until = tokio::time::Instant::now() + run;
            while tokio::time::Instant::now() < until {
                tick.tick().await;
                sent += 1;
                let decision = limiter.check(&key, 1).await.expect("store error");
                admitted += u64::from(decision.is_allowed());
            }
            (sent, admitted)
        }));
    }
    let (mut sent, mut admitted) = (0, 0);
    for task in tasks {
        let (s, a) = task.await.unwrap();
        sent += s;
        admitted += a;
    }
    let elapsed = started.elapsed();
    let calls = script_calls(&mut admin).await;
    let hits: u64 = stores.iter().map(|s| s.deny_cache_stats().hits).sum();
    let periods = elapsed.as_millis() as u64 / 100 + 1;
    // Burst 10 plus 10/s; the limit is exact, whatever the cache does.
    assert!(admitted <= 10 + periods + 1, "{admitted} admitted");
    assert!(admitted >= 10, "{admitted} admitted");
    assert!(sent >= 1000, "only {sent} requests sent in {elapsed:?}");
    let budget = admitted + 2 * (periods + 1) + 4;
    assert!(
        calls <= budget,
        "{calls} script calls for {sent} requests ({admitted} admitted, {hits} cached) in \
         {elapsed:?}; at most {budget} expected"
    );
    assert_eq!(calls + hits, sent, "every request is a call or a hit");
    println!(
        "hammer: {sent} requests in {elapsed:?}, {admitted} admitted, {calls} reached Redis, \
         {hits} denied locally"
    );
}

/// The same run without the cache sends every request to Redis: the
/// measurement above is the cache's doing.
#[tokio::test]
async fn without_the_cache_every_denial_is_a_round_trip() {
    let server = RedisServer::start();
    let mut admin = server
        .client()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let limiter = Limiter::new(policy("off", Rate::per_hour(2), 2), store(&server, 0).await);
    reset_stats(&mut admin).await;
    let key = Key::new("k");
    for i in 0..50 {
        assert_eq!(limiter.check(&key, 1).await.unwrap().is_allowed(), i < 2);
    }
    assert_eq!(script_calls(&mut admin).await, 50);
}

/// With the caller's clock, local denials match Redis' answers field by
/// field as time passes, and end exactly when the retry time has passed;
/// another cost, or a reserve wait covering the retry, asks Redis.
#[tokio::test]
async fn local_denials_equal_redis_denials() {
    let server = RedisServer::start();
    let mut admin = server
        .client()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let clock = ManualClock::new(Duration::from_secs(1_700_000_000));
    let url = server.url();
    let build = |cache: usize| {
        RedisStore::builder(&url)
            .prefix("deny-eq")
            .time_source(TimeSource::Client(Arc::new(clock.clone())))
            .timeout(Duration::from_secs(2))
            .deny_cache(cache)
            .connect()
    };
    let (cached, direct) = (build(100).await.unwrap(), build(0).await.unwrap());
    // Two limits: 1 per 10 s burst 3, 1 per minute burst 5.
    let policy = Policy::builder("eq")
        .limit(
            Limit::builder(Rate::new(1, Duration::from_secs(10)))
                .burst(3)
                .build()
                .unwrap(),
        )
        .limit(
            Limit::builder(Rate::per_minute(1))
                .burst(5)
                .build()
                .unwrap(),
        )
        .build()
        .unwrap();
    let (a, b) = (
        Limiter::new(policy.clone(), cached.clone()),
        Limiter::new(policy, direct),
    );
    let key = Key::new("user:7");
    for _ in 0..3 {
        assert!(a.check(&key, 1).await.unwrap().is_allowed());
    }
    let first = a.check(&key, 1).await.unwrap();
    assert!(!first.is_allowed());
    reset_stats(&mut admin).await;
    let mut compared = 0;
    for step in [0u64, 1, 2_500_000, 4_000_000, 3_499_998] {
        clock.advance(Duration::from_micros(step));
        let local = a.check(&key, 1).await.unwrap();
        let remote = b.check(&key, 1).await.unwrap();
        assert_eq!(local, remote, "after +{step} µs");
        assert!(!local.is_allowed());
        compared += 1;
    }
    // Only the direct store's calls reached Redis.
    assert_eq!(script_calls(&mut admin).await, compared);
    assert_eq!(cached.deny_cache_stats().hits, compared);

    // Cost 2 has another retry time: Redis answers (and is now cached).
    reset_stats(&mut admin).await;
    let two = a.check(&key, 2).await.unwrap();
    assert_eq!(two, b.check(&key, 2).await.unwrap());
    assert_eq!(script_calls(&mut admin).await, 2);
    // A reserve wait that covers the retry goes to Redis and is admitted.
    let retry = two.retry_after().unwrap();
    let reserved = a.reserve(&key, 2, retry).await.unwrap();
    assert!(reserved.is_allowed());
    assert_eq!(reserved.wait(), retry);
    assert_eq!(script_calls(&mut admin).await, 3);
}

/// Through an axum router: the 429 answered locally carries the same
/// status, `Retry-After` and rate-limit headers as the one Redis decided.
#[tokio::test]
async fn local_429s_carry_the_same_headers() {
    let server = RedisServer::start();
    let mut admin = server
        .client()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let limiter = Limiter::new(
        policy("http", Rate::per_hour(2), 2),
        store(&server, 100).await,
    );
    let app = Router::new()
        .route("/api/ping", get(|| async { "pong" }))
        .route_layer(RateLimitLayer::new(limiter).headers(fleetgate::HeaderStyle::Both));
    for _ in 0..2 {
        assert_eq!(
            send(&app, "/api/ping", "192.0.2.44").await.status(),
            StatusCode::OK
        );
    }
    second_429_is_local_and_alike(&app, "/api/ping", "192.0.2.44", &mut admin, "gcra").await;
}

/// GET `path` through `app`, from `peer`.
async fn send(app: &Router, path: &str, peer: &str) -> http::Response<Body> {
    let mut req = Request::get(path).body(Body::empty()).unwrap();
    let addr = SocketAddr::new(peer.parse().unwrap(), 5000);
    req.extensions_mut().insert(ConnectInfo(addr));
    app.clone().oneshot(req).await.unwrap()
}

/// Two 429s in a row for a client past its limit: the first decided by
/// Redis (one script), the second locally (none), alike in status,
/// `Retry-After` and every rate-limit header.
async fn second_429_is_local_and_alike(
    app: &Router,
    path: &str,
    peer: &str,
    admin: &mut redis::aio::MultiplexedConnection,
    label: &str,
) {
    reset_stats(admin).await;
    let from_redis = send(app, path, peer).await;
    assert_eq!(script_calls(admin).await, 1, "{label}");
    let local = send(app, path, peer).await;
    assert_eq!(
        script_calls(admin).await,
        1,
        "{label}: the second 429 was local"
    );
    assert_eq!(from_redis.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(local.status(), StatusCode::TOO_MANY_REQUESTS);
    for name in [
        "retry-after",
        "ratelimit",
        "ratelimit-policy",
        "x-ratelimit-limit",
        "x-ratelimit-remaining",
        "x-ratelimit-reset",
    ] {
        assert!(
            from_redis.headers().contains_key(name),
            "{label}: {name} missing"
        );
        assert_eq!(
            from_redis.headers().get(name),
            local.headers().get(name),
            "{label}: {name}"
        );
    }
}

/// A denial of `key` from Redis with at least `min_retry` to wait (a fixed
/// window denied just before its end is tried again in the next one), and
/// the instants just before the call was sent and just after its answer.
async fn denial(
    limiter: &Limiter,
    key: &Key,
    min_retry: Duration,
) -> (fleetgate::Decision, Instant, Instant) {
    let count = limiter.policy().limits()[0].rate().count();
    for _ in 0..20 {
        let mut admitted = 0;
        loop {
            let sent = Instant::now();
            let d = limiter.check(key, 1).await.expect("store error");
            let answered = Instant::now();
            if d.is_allowed() {
                admitted += 1;
                assert!(admitted <= 2 * count, "never denied: {d:?}");
                continue;
            }
            let retry = d.retry_after().expect("a retry time");
            if retry >= min_retry {
                return (d, sent, answered);
            }
            tokio::time::sleep_until((answered + retry).into()).await;
            break;
        }
    }
    panic!("no denial with {min_retry:?} to wait");
}

/// Every window algorithm, on Redis' clock: once Redis has denied a call,
/// the same call is denied locally (no script reaches Redis) until the
/// retry time Redis gave, counted from before the call was sent; the
/// first call after it, counted from when the answer came, goes to Redis
/// and is admitted.
#[tokio::test]
async fn window_denials_are_local_until_the_retry_then_redis_admits() {
    let server = RedisServer::start();
    let mut admin = server.admin().await;
    let store = store(&server, 100).await;
    for algorithm in [
        Algorithm::SlidingLog,
        Algorithm::SlidingWindow,
        Algorithm::FixedWindow,
    ] {
        let policy = Policy::builder(format!("{algorithm:?}").to_lowercase())
            .algorithm(algorithm)
            .limit(Limit::new(Rate::new(3, Duration::from_millis(600))).unwrap())
            .build()
            .unwrap();
        let limiter = Limiter::new(policy, store.clone());
        let key = Key::new("ip:203.0.113.7");
        let (first, sent, answered) = denial(&limiter, &key, Duration::from_millis(150)).await;
        let retry = first.retry_after().unwrap();
        reset_stats(&mut admin).await;
        let hits = store.deny_cache_stats().hits;
        // A fixed number of calls, each answered locally if it came
        // before the retry time; a stall past it ends them early.
        const CALLS: u64 = 10;
        let mut local = 0u64;
        // The call that found the retry time passed: whether it ran a script.
        let mut late = None;
        // Whether that call was admitted: it then took the slot the retry
        // time promised, and the call after it may rightly be refused.
        let mut late_admitted = false;
        for _ in 0..CALLS {
            let before = store.deny_cache_stats().hits;
            let d = limiter.check(&key, 1).await.unwrap();
            if Instant::now() >= sent + retry {
                // This call may have been looked up after the retry time:
                // it proves nothing either way, but may have run a script.
                late = Some(1 - (store.deny_cache_stats().hits - before));
                late_admitted = d.is_allowed();
                break;
            }
            assert!(!d.is_allowed(), "{algorithm:?}: admitted before the retry");
            assert_eq!(
                store.deny_cache_stats().hits,
                before + 1,
                "{algorithm:?}: a denial before the retry went to Redis"
            );
            local += 1;
        }
        assert!(
            local == CALLS || late.is_some(),
            "{algorithm:?}: only {local} local denials"
        );
        let late = late.unwrap_or(0);
        assert_eq!(
            script_calls(&mut admin).await,
            late,
            "{algorithm:?}: {local} denials before the retry, scripts run"
        );
        let looked_up_late = u64::from(local < CALLS) * (1 - late);
        assert_eq!(store.deny_cache_stats().hits, hits + local + looked_up_late);
        if late_admitted {
            // A stall carried the calls past the retry, and Redis admitted
            // the first call there: what the check below would show.
            continue;
        }

        // Past the retry time as Redis counted it: Redis decides, and admits.
        tokio::time::sleep_until((answered + retry + Duration::from_millis(5)).into()).await;
        reset_stats(&mut admin).await;
        let hits = store.deny_cache_stats().hits;
        let d = limiter.check(&key, 1).await.unwrap();
        assert!(
            d.is_allowed(),
            "{algorithm:?}: denied after the retry: {d:?}"
        );
        assert_eq!(script_calls(&mut admin).await, 1, "{algorithm:?}");
        assert_eq!(store.deny_cache_stats().hits, hits, "{algorithm:?}");
    }
}

/// A small deterministic generator of steps (no dependency, no seed file).
struct Steps(u64);

impl Steps {
    fn next(&mut self, below: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) % below
    }
}

/// With the caller's clock, every window algorithm's local denials equal,
/// field by field (every window's figures included), what Redis answers a
/// store without the cache at the same instants, over a long run of calls
/// of cost 1 and 2 at irregular times on a policy of two windows; and the
/// cache answers a good part of the denials (fewer where the longer
/// window's figures keep moving: the sliding counter's).
#[tokio::test]
async fn local_window_denials_equal_redis_denials() {
    let server = RedisServer::start();
    let clock = ManualClock::new(Duration::from_secs(1_700_000_000));
    let url = server.url();
    let build = |prefix: &'static str, cache: usize| {
        RedisStore::builder(&url)
            .prefix(prefix)
            .time_source(TimeSource::Client(Arc::new(clock.clone())))
            .timeout(Duration::from_secs(2))
            .deny_cache(cache)
            .connect()
    };
    let (cached, direct) = (
        build("cached", 100).await.unwrap(),
        build("direct", 0).await.unwrap(),
    );
    for algorithm in [
        Algorithm::SlidingLog,
        Algorithm::SlidingWindow,
        Algorithm::FixedWindow,
    ] {
        let policy = Policy::builder("eq")
            .algorithm(algorithm)
            .limit(Limit::new(Rate::new(4, Duration::from_secs(1))).unwrap())
            .limit(Limit::new(Rate::new(10, Duration::from_secs(5))).unwrap())
            .build()
            .unwrap();
        let (a, b) = (
            Limiter::new(policy.clone(), cached.clone()),
            Limiter::new(policy, direct.clone()),
        );
        let key = Key::new(format!("user:{algorithm:?}"));
        let hits = cached.deny_cache_stats().hits;
        let mut steps = Steps(7);
        let mut denials = 0;
        for i in 0..600 {
            // Mostly short steps (a client hammering), some long ones.
            let step = match steps.next(10) {
                0 => steps.next(3_000_000),
                _ => steps.next(60_000),
            };
            clock.advance(Duration::from_micros(step));
            let cost = 1 + steps.next(4) / 3;
            let local = a.check(&key, cost).await.unwrap();
            let remote = b.check(&key, cost).await.unwrap();
            assert_eq!(local, remote, "{algorithm:?}: call {i}, cost {cost}");
            denials += u64::from(!remote.is_allowed());
        }
        let hits = cached.deny_cache_stats().hits - hits;
        println!("{algorithm:?}: {hits} of {denials} denials answered locally");
        assert!(
            denials > 200 && hits * 3 > denials,
            "{algorithm:?}: {hits} of {denials} denials answered locally"
        );
    }
}

/// Through an axum router, for every window algorithm on a policy of two
/// windows (the caller's clock, so that both answers come at the same
/// instant): a 429 answered locally carries the same status,
/// `Retry-After` and rate-limit headers (every window's) as the one Redis
/// decided, and costs no script.
#[tokio::test]
async fn local_window_429s_carry_the_same_headers() {
    let server = RedisServer::start();
    let mut admin = server.admin().await;
    let clock = ManualClock::new(Duration::from_secs(1_700_000_000));
    let store = RedisStore::builder(server.url())
        .prefix("deny-http")
        .time_source(TimeSource::Client(Arc::new(clock.clone())))
        .timeout(Duration::from_secs(2))
        .connect()
        .await
        .unwrap();
    for (hour, algorithm) in [
        Algorithm::SlidingLog,
        Algorithm::SlidingWindow,
        Algorithm::FixedWindow,
    ]
    .into_iter()
    .enumerate()
    {
        // The start of an hour (so of a minute), where fixed windows start.
        clock.set(Duration::from_secs(1_699_999_200 + 3600 * hour as u64));
        let policy = Policy::builder(format!("http-{algorithm}"))
            .algorithm(algorithm)
            .limit(Limit::new(Rate::per_minute(2)).unwrap())
            .limit(Limit::new(Rate::per_hour(5)).unwrap())
            .build()
            .unwrap();
        let app = Router::new()
            .route("/api/window", get(|| async { "ok" }))
            .route_layer(
                RateLimitLayer::new(Limiter::new(policy, store.clone()))
                    .headers(fleetgate::HeaderStyle::Both),
            );
        for _ in 0..2 {
            assert_eq!(
                send(&app, "/api/window", "192.0.2.45").await.status(),
                StatusCode::OK
            );
            clock.advance(Duration::from_secs(7));
        }
        second_429_is_local_and_alike(
            &app,
            "/api/window",
            "192.0.2.45",
            &mut admin,
            &algorithm.to_string(),
        )
        .await;
    }
}
