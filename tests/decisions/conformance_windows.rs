//! The conformance suite for the window algorithms (sliding log,
//! sliding-window counter, fixed window), run against every store.
//!
//! As in `conformance` (the GCRA suite; both use `harness.rs`), each
//! scenario runs on a `MemoryStore` and on a `RedisStore` whose scripts read the same `ManualClock`
//! (`TimeSource::Client`); every decision is asserted exactly, and the two
//! stores' decision sequences must be equal. The tests after the scenarios
//! check what only Redis has (key names, TTLs, round trips, unique log
//! members from many connections at once) and the layer's view (errors,
//! headers, a 429 naming the window).
use crate::common;
use crate::harness::{
    S, Sut, UNIX_NOW, US, allowed, client_clock_store, conformance, denied, inspector,
};

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::RedisServer;
use fleetgate::clock::ManualClock;
use fleetgate::key::GlobalKey;
use fleetgate::{
    Algorithm, ConfigError, Key, Limit, Limiter, MemoryStore, Policy, Rate, RateLimitError,
    RateLimitLayer, RedisStore, StoreError,
};
use redis::aio::MultiplexedConnection;
use tower::{Service, ServiceExt, service_fn};

/// A Unix time on a minute boundary (so also on 5 s and 10 s boundaries),
/// where fixed windows start.
const ALIGNED: Duration = Duration::from_secs(1_699_999_980);

fn policy(name: &str, algorithm: Algorithm, limits: &[Rate]) -> Policy {
    limits
        .iter()
        .fold(
            Policy::builder(name).algorithm(algorithm),
            |builder, rate| builder.limit(Limit::new(*rate).expect("valid limit")),
        )
        .build()
        .expect("valid policy")
}

/// The upstream limits of the issue: 25 per 5 s and 300 per minute.
fn dual(algorithm: Algorithm) -> Policy {
    policy(
        "dual",
        algorithm,
        &[Rate::new(25, 5 * S), Rate::per_minute(300)],
    )
}

// ---------------------------------------------------------------------------
// Scenarios.

/// Sliding log, one window of 5 per 10 s: exact counts, a retry that ends
/// exactly when the oldest entry leaves the window, denied calls logged
/// nowhere, weighted calls, impossible costs.
async fn sliding_log_window(s: Sut) {
    let l = s.limiter(&policy(
        "log",
        Algorithm::SlidingLog,
        &[Rate::new(5, 10 * S)],
    ));
    // One call a second: t0 .. t0+4.
    for k in 1..=5u64 {
        let d = s.check(&l, "k", 1).await;
        s.expect(&d, allowed(0, 5 - k, 10 * S));
        s.advance(S);
    }
    // t0+5: full; the entry of t0 leaves at t0+10. Denials log nothing, so
    // they are all alike.
    for _ in 0..4 {
        let d = s.check(&l, "k", 1).await;
        s.expect(&d, denied(0, 0, 9 * S, 5 * S));
    }
    s.advance(5 * S - US);
    let d = s.check(&l, "k", 1).await;
    s.expect(&d, denied(0, 0, 4 * S + US, US));
    // t0+10: the oldest entry is out, exactly now.
    s.advance(US);
    let d = s.check(&l, "k", 1).await;
    s.expect(&d, allowed(0, 0, 10 * S));
    let d = s.check(&l, "k", 1).await;
    s.expect(&d, denied(0, 0, 10 * S, S));
    // t0+13: in the window t0+4 and t0+10; cost 3 fills it.
    s.advance(3 * S);
    let d = s.check(&l, "k", 3).await;
    s.expect(&d, allowed(0, 0, 10 * S));
    // Cost 2 waits for the two oldest (t0+4, t0+10): the second leaves at
    // t0+20.
    let d = s.check(&l, "k", 2).await;
    s.expect(&d, denied(0, 0, 10 * S, 7 * S));
    // Above the window's count: refused without asking the store.
    let d = s.check(&l, "k", 6).await;
    assert!(!d.is_allowed() && d.retry_after().is_none(), "{d:?}");
}

/// Large weighted calls on the sliding log: one entry per unit of cost
/// (written in batches by the script), all counted.
async fn sliding_log_big_cost(s: Sut) {
    let l = s.limiter(&policy(
        "big",
        Algorithm::SlidingLog,
        &[Rate::per_minute(2000)],
    ));
    let d = s.check(&l, "k", 1200).await;
    s.expect(&d, allowed(0, 800, 60 * S));
    s.advance(S);
    let d = s.check(&l, "k", 801).await;
    s.expect(&d, denied(0, 800, 59 * S, 59 * S));
    let d = s.check(&l, "k", 800).await;
    s.expect(&d, allowed(0, 0, 60 * S));
    let d = s.check(&l, "k", 1).await;
    s.expect(&d, denied(0, 0, 60 * S, 59 * S));
    // The 1200 leave together; the 800 a second later.
    s.advance(59 * S);
    let d = s.check(&l, "k", 1200).await;
    s.expect(&d, allowed(0, 0, 60 * S));
    let d = s.check(&l, "k", 1).await;
    s.expect(&d, denied(0, 0, 60 * S, S));
}

/// 25 per 5 s and 300 per minute on one sorted set: the 26th call of a
/// burst is denied by the short window and charges neither; after twelve
/// bursts, one every 5 s, the 301st call is denied with both windows full,
/// and the minute is named (equal retries name the longer window).
async fn dual_window(s: Sut, algorithm: Algorithm) {
    let l = s.limiter(&dual(algorithm));
    for round in 0..12u64 {
        for k in 1..=25u64 {
            let d = s.check(&l, "k", 1).await;
            let long_left = 300 - 25 * round - k;
            // Both windows are reported, whichever decided.
            assert_eq!(d.remaining_of(0), Some(25 - k), "{}", s.name);
            assert_eq!(d.remaining_of(1), Some(long_left), "{}", s.name);
            assert_eq!(d.remaining_of(2), None);
            if long_left > 25 - k {
                s.expect(&d, allowed(0, 25 - k, 5 * S));
            } else {
                // The last burst: both windows equally tight; the minute.
                let reset = match algorithm {
                    Algorithm::SlidingLog => 60 * S,
                    _ => 5 * S,
                };
                s.expect(&d, allowed(1, long_left, reset));
            }
        }
        // The 26th, and more: denied by the short window alone until the
        // last burst, and never charged to the long one (else the last
        // burst could not pass).
        for _ in 0..5 {
            let d = s.check(&l, "k", 1).await;
            assert_eq!(d.remaining_of(0), Some(0), "{}", s.name);
            assert_eq!(d.remaining_of(1), Some(300 - 25 * (round + 1)));
            if round < 11 {
                s.expect(&d, denied(0, 0, 5 * S, 5 * S));
            } else {
                let reset = match algorithm {
                    Algorithm::SlidingLog => 60 * S,
                    _ => 5 * S,
                };
                s.expect(&d, denied(1, 0, reset, 5 * S));
            }
        }
        s.advance(5 * S);
    }
    // A minute after the first burst, its 25 have left the long window.
    for k in 1..=25u64 {
        let d = s.check(&l, "k", 1).await;
        assert!(d.is_allowed(), "{}: call {k} of the 13th burst", s.name);
    }
}

async fn dual_sliding_log(s: Sut) {
    dual_window(s, Algorithm::SlidingLog).await;
}

async fn dual_fixed_window(s: Sut) {
    dual_window(s, Algorithm::FixedWindow).await;
}

/// Fixed window of 5 per 10 s, aligned to the epoch: the count resets on
/// the boundary, exactly; up to twice the count can pass around it.
async fn fixed_window(s: Sut) {
    let l = s.limiter(&policy(
        "fixed",
        Algorithm::FixedWindow,
        &[Rate::new(5, 10 * S)],
    ));
    s.advance(2 * S);
    for k in 1..=5u64 {
        let d = s.check(&l, "k", 1).await;
        s.expect(&d, allowed(0, 5 - k, 8 * S));
    }
    for _ in 0..3 {
        let d = s.check(&l, "k", 1).await;
        s.expect(&d, denied(0, 0, 8 * S, 8 * S));
    }
    s.advance(8 * S - US);
    let d = s.check(&l, "k", 1).await;
    s.expect(&d, denied(0, 0, US, US));
    s.advance(US);
    for k in 1..=5u64 {
        let d = s.check(&l, "k", 1).await;
        s.expect(&d, allowed(0, 5 - k, 10 * S));
    }
    let d = s.check(&l, "k", 1).await;
    s.expect(&d, denied(0, 0, 10 * S, 10 * S));
    // The boundary: 5 at t0+29 and 5 more at t0+30.
    s.advance(19 * S);
    for k in 1..=5u64 {
        let d = s.check(&l, "k", 1).await;
        s.expect(&d, allowed(0, 5 - k, S));
    }
    s.advance(S);
    for k in 1..=5u64 {
        let d = s.check(&l, "k", 1).await;
        s.expect(&d, allowed(0, 5 - k, 10 * S));
    }
    // Weighted calls at t0+40.
    s.advance(10 * S);
    let d = s.check(&l, "k", 3).await;
    s.expect(&d, allowed(0, 2, 10 * S));
    let d = s.check(&l, "k", 3).await;
    s.expect(&d, denied(0, 2, 10 * S, 10 * S));
    let d = s.check(&l, "k", 2).await;
    s.expect(&d, allowed(0, 0, 10 * S));
}

/// Sliding-window counter of 10 per 10 s: the previous fixed window
/// weighs in proportion to how much of it the sliding window still covers.
async fn sliding_counter(s: Sut) {
    let l = s.limiter(&policy(
        "counter",
        Algorithm::SlidingWindow,
        &[Rate::new(10, 10 * S)],
    ));
    // t0+5, window [t0, t0+10): reset when this window's calls have
    // decayed, at the end of the next one.
    s.advance(5 * S);
    for k in 1..=10u64 {
        let d = s.check(&l, "k", 1).await;
        s.expect(&d, allowed(0, 10 - k, 15 * S));
    }
    // Full. In the next window these 10 weigh 10·(1 − e/W); one more fits
    // once that is at most 9, at e = 1 s: 5 s + 1 s from now.
    for _ in 0..3 {
        let d = s.check(&l, "k", 1).await;
        s.expect(&d, denied(0, 0, 15 * S, 6 * S));
    }
    s.advance(6 * S);
    // t0+11: est 9, room 9.
    let d = s.check(&l, "k", 1).await;
    s.expect(&d, allowed(0, 0, 19 * S));
    // est 9, room 8: wait until est is 8, 1 s.
    let d = s.check(&l, "k", 1).await;
    s.expect(&d, denied(0, 0, 19 * S, S));
    s.advance(S);
    let d = s.check(&l, "k", 1).await;
    s.expect(&d, allowed(0, 0, 18 * S));
    // t0+25, window [t0+20, t0+30): the previous window held 2, weighing
    // 1 at half-time.
    s.advance(13 * S);
    let d = s.check(&l, "k", 1).await;
    s.expect(&d, allowed(0, 8, 15 * S));
    // t0+50: idle for two windows, fresh.
    s.advance(25 * S);
    let d = s.check(&l, "k", 1).await;
    s.expect(&d, allowed(0, 9, 20 * S));
    let d = s.check(&l, "k", 11).await;
    assert!(!d.is_allowed() && d.retry_after().is_none(), "{d:?}");
}

/// Several windows decided together on the counter algorithms too: a call
/// denied by one charges none.
async fn counters_all_or_nothing(s: Sut) {
    for algorithm in [Algorithm::FixedWindow, Algorithm::SlidingWindow] {
        let name = format!("aon-{algorithm}");
        let l = s.limiter(&policy(
            &name,
            algorithm,
            &[Rate::new(2, 10 * S), Rate::per_minute(3)],
        ));
        let d = s.check(&l, "k", 1).await;
        assert!(d.is_allowed());
        let d = s.check(&l, "k", 1).await;
        assert_eq!((d.is_allowed(), d.limit_index()), (true, 0), "{d:?}");
        // The short window is full: denials charge the long one nothing.
        for _ in 0..5 {
            let d = s.check(&l, "k", 1).await;
            assert_eq!((d.is_allowed(), d.limit_index()), (false, 0), "{d:?}");
            // The long window reports its room of now: 1 of 3 left.
            assert_eq!(d.remaining_of(1), Some(1), "{d:?}");
        }
        // Two windows later the short one is empty (and the sliding one's
        // previous window too); the long one still holds 2 of its 3.
        s.advance(20 * S);
        let d = s.check(&l, "k", 1).await;
        s.expect(
            &d,
            match algorithm {
                Algorithm::FixedWindow => allowed(1, 0, 40 * S),
                _ => allowed(1, 0, 100 * S),
            },
        );
        let d = s.check(&l, "k", 1).await;
        assert_eq!((d.is_allowed(), d.limit_index()), (false, 1), "{d:?}");
        // On to the next minute boundary for the next algorithm.
        s.advance(40 * S);
    }
}

/// An identity idle for as long as its state matters behaves exactly like
/// a fresh one, on every algorithm; 1 µs earlier it does not (on the
/// exact algorithms: the sliding counter's old count decays continuously
/// and weighs next to nothing by then).
async fn idle_keys_expire(s: Sut) {
    for algorithm in [
        Algorithm::SlidingLog,
        Algorithm::SlidingWindow,
        Algorithm::FixedWindow,
    ] {
        let l = s.limiter(&policy(
            &format!("idle-{algorithm}"),
            algorithm,
            &[Rate::new(3, 10 * S), Rate::new(4, 20 * S)],
        ));
        for _ in 0..3 {
            assert!(s.check(&l, "used", 1).await.is_allowed());
        }
        assert!(!s.check(&l, "used", 1).await.is_allowed());
        // How long the state matters: the longest window for the log, to
        // the end of the window for fixed windows (these start on one), and
        // to the end of the next window for the sliding counter.
        let idle = match algorithm {
            Algorithm::SlidingWindow => 40 * S,
            _ => 20 * S,
        };
        s.advance(idle - US);
        if algorithm != Algorithm::SlidingWindow {
            // The long window still holds 3 of 4: a call of 3 is denied
            // (and, denied, changes nothing).
            let d = s.check(&l, "used", 3).await;
            assert_eq!(
                (d.is_allowed(), d.limit_index()),
                (false, 1),
                "{}/{algorithm}: state forgotten early: {d:?}",
                s.name
            );
        }
        s.advance(US);
        let mut seqs = Vec::new();
        for key in ["used", "never-used"] {
            let mut seq = Vec::new();
            for _ in 0..4 {
                seq.push(s.check(&l, key, 1).await);
            }
            seqs.push(seq);
        }
        assert_eq!(seqs[0], seqs[1], "{}/{algorithm}", s.name);
        assert!(seqs[0][2].is_allowed() && !seqs[0][3].is_allowed());
    }
}

conformance! {
    prefix "win";
    sliding_log_window at UNIX_NOW;
    sliding_log_big_cost at UNIX_NOW;
    dual_sliding_log at UNIX_NOW;
    dual_fixed_window at ALIGNED;
    fixed_window at ALIGNED;
    sliding_counter at ALIGNED;
    counters_all_or_nothing at ALIGNED;
    idle_keys_expire at ALIGNED;
}

// ---------------------------------------------------------------------------
// Configuration.

#[tokio::test]
async fn window_policies_refuse_a_burst_and_reserve_mode() {
    let err = Policy::builder("w")
        .algorithm(Algorithm::SlidingLog)
        .limit(
            Limit::builder(Rate::per_second(10))
                .burst(20)
                .build()
                .unwrap(),
        )
        .build()
        .unwrap_err();
    assert_eq!(
        err,
        ConfigError::WindowBurst {
            name: "10/s".into(),
            burst: 20,
            count: 10
        }
    );
    assert!(err.to_string().contains("burst"), "{err}");
    // The same limit is fine under GCRA.
    assert!(
        Policy::builder("g")
            .limit(
                Limit::builder(Rate::per_second(10))
                    .burst(20)
                    .build()
                    .unwrap()
            )
            .build()
            .is_ok()
    );
    assert_eq!(
        Policy::single("g", Limit::new(Rate::per_second(1)).unwrap())
            .unwrap()
            .algorithm(),
        Algorithm::Gcra,
        "GCRA stays the default"
    );
    let limiter = Limiter::in_memory(dual(Algorithm::FixedWindow));
    let err = limiter
        .reserve(&Key::new("k"), 1, Duration::from_secs(10))
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            StoreError::Config(ConfigError::ReserveNeedsGcra {
                algorithm: Algorithm::FixedWindow
            })
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("GCRA"), "{err}");
}

// ---------------------------------------------------------------------------
// Through the layer.

/// The upstream, around a plain tower service in typed-error mode,
/// on both stores: the error of the 26th quick call names the 5 s window,
/// that of the 301st within a minute the minute.
#[tokio::test]
async fn typed_errors_name_the_window_that_denied() {
    let server = RedisServer::start();
    let memory = Sut::memory(UNIX_NOW);
    let redis = Sut::redis(&server, "win", UNIX_NOW).await;
    for s in [memory, redis] {
        let layer = RateLimitLayer::new(s.limiter(&dual(Algorithm::SlidingLog)))
            .key(GlobalKey::new())
            .typed_errors();
        let mut svc = tower::Layer::layer(
            &layer,
            service_fn(|_: ()| async { Ok::<_, std::convert::Infallible>("ok") }),
        );
        let mut denials = Vec::new();
        for _round in 0..12 {
            for _ in 0..25 {
                svc.ready().await.unwrap().call(()).await.unwrap();
            }
            let err = svc.ready().await.unwrap().call(()).await.unwrap_err();
            denials.push(*err.downcast::<RateLimitError>().unwrap());
            s.advance(5 * S);
        }
        let limited = |limit: &str| RateLimitError::Limited {
            limit: limit.into(),
            retry_after: Some(5 * S),
        };
        assert_eq!(denials[0], limited("25/5s"), "{}: the 26th call", s.name);
        assert!(denials[..11].iter().all(|e| *e == limited("25/5s")));
        assert_eq!(
            denials[11],
            limited("300/min"),
            "{}: the 301st call",
            s.name
        );
        assert!(denials[11].to_string().contains("300/min"));
    }
}

/// Headers for a window policy: the quota is the window's count and the
/// window its length; `RateLimit` reports every window, the `X-RateLimit-*`
/// headers the deciding one; the 429 names it, with `Retry-After`.
#[tokio::test]
async fn http_headers_and_429_for_windows() {
    use axum::Router;
    use axum::body::Body;
    use axum::routing::get;
    use fleetgate::HeaderStyle;
    use http::{Request, StatusCode};
    use http_body_util::BodyExt;

    let clock = ManualClock::new(UNIX_NOW);
    let store = MemoryStore::builder().clock(clock.clone()).build();
    let app = Router::new()
        .route("/api/window", get(|| async { "ok" }))
        .layer(
            RateLimitLayer::new(Limiter::new(dual(Algorithm::SlidingLog), store))
                .key(GlobalKey::new())
                .headers(HeaderStyle::Both),
        );
    let get = || Request::get("/api/window").body(Body::empty()).unwrap();
    let res = app.clone().oneshot(get()).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let h = |name: &str| res.headers()[name].to_str().unwrap().to_owned();
    assert_eq!(
        h("ratelimit-policy"),
        "\"25/5s\";q=25;w=5, \"300/min\";q=300;w=60"
    );
    // Every window, in the policy's order.
    assert_eq!(h("ratelimit"), "\"25/5s\";r=24;t=5, \"300/min\";r=299;t=60");
    assert_eq!(h("x-ratelimit-limit"), "25");
    assert_eq!(h("x-ratelimit-remaining"), "24");
    assert_eq!(h("x-ratelimit-reset"), "5");
    clock.advance(2 * S);
    for _ in 0..24 {
        assert_eq!(app.clone().oneshot(get()).await.unwrap().status(), 200);
    }
    let res = app.clone().oneshot(get()).await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    // The first call leaves the window 3 s from now; the newest, 5 s.
    assert_eq!(res.headers()["retry-after"], "3");
    assert_eq!(
        res.headers()["ratelimit"],
        "\"25/5s\";r=0;t=5, \"300/min\";r=275;t=60"
    );
    let body = res.into_body().collect().await.unwrap().to_bytes();
    let body = String::from_utf8_lossy(&body);
    assert!(body.contains("25/5s"), "{body}");
}

// ---------------------------------------------------------------------------
// Redis only.

/// The reply to one command (`args[0]` and its arguments), for the tests
/// that read Redis as an operator would.
pub(super) async fn query<T: redis::FromRedisValue>(
    conn: &mut MultiplexedConnection,
    args: &[&str],
) -> T {
    let mut cmd = redis::cmd(args[0]);
    for arg in &args[1..] {
        cmd.arg(*arg);
    }
    cmd.query_async(conn).await.unwrap()
}

async fn server_clock_store(server: &RedisServer) -> RedisStore {
    RedisStore::builder(server.url())
        .prefix("win")
        .timeout(Duration::from_secs(2))
        .connect()
        .await
        .expect("connect")
}

/// Key names share the identity's hash tag; keys carry a TTL as long as
/// their state matters; the sliding log holds one member per unit of cost,
/// named `<time>-<seq>`; a denied call writes nothing.
#[tokio::test]
async fn redis_window_keys_names_and_ttls() {
    let server = RedisServer::start();
    let mut conn = inspector(&server).await;
    // A frozen clock: no window boundary can pass between two calls.
    let store = client_clock_store(&server, "win", &ManualClock::new(UNIX_NOW)).await;
    let who = Key::new("user:1");

    let log = Limiter::new(dual(Algorithm::SlidingLog), store.clone());
    // The identity hashed, never itself: 12 characters of base64 in the
    // hash tag.
    let names = store.window_keys(&log.policy(), &who);
    assert_eq!(names.len(), 1);
    let key = names[0].as_str();
    let tag = key
        .strip_prefix("win:dual:{")
        .and_then(|rest| rest.strip_suffix("}:log"))
        .unwrap_or_else(|| panic!("{key}"));
    assert_eq!(tag.len(), 12, "{key}");
    assert!(!key.contains("user"), "{key}");
    assert!(log.check(&who, 2).await.unwrap().is_allowed());
    let members: Vec<(String, f64)> = redis::cmd("ZRANGE")
        .arg(key)
        .arg(0)
        .arg(-1)
        .arg("WITHSCORES")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(members.len(), 2, "{members:?}");
    for (i, (member, score)) in members.iter().enumerate() {
        assert_eq!(*member, format!("{}-{i}", *score as u64), "{members:?}");
    }
    // With the caller's clock every key lives a minute longer than its
    // state matters (see `TimeSource::Client`).
    let slack = 60_000;
    let ttl: i64 = query(&mut conn, &["PTTL", key]).await;
    assert!(
        (slack + 58_000..=slack + 60_000).contains(&ttl),
        "log PTTL {ttl}"
    );

    for (algorithm, tag, max_ttl) in [
        (Algorithm::FixedWindow, "fw", [5_000, 60_000]),
        (Algorithm::SlidingWindow, "sw", [10_000, 120_000]),
    ] {
        let p = policy(
            &format!("p-{tag}"),
            algorithm,
            &[Rate::new(2, 5 * S), Rate::per_minute(300)],
        );
        let l = Limiter::new(p.clone(), store.clone());
        let keys = store.window_keys(&p, &who);
        // One identity's keys share its hashed tag.
        let base = key
            .strip_suffix(":log")
            .unwrap()
            .replacen("dual", &format!("p-{tag}"), 1);
        assert_eq!(keys, [format!("{base}:{tag}:0"), format!("{base}:{tag}:1")]);
        assert!(l.check(&who, 2).await.unwrap().is_allowed());
        let mut values = Vec::new();
        for (key, max) in keys.iter().zip(max_ttl) {
            let ttl: i64 = query(&mut conn, &["PTTL", key]).await;
            assert!(
                (slack + 1..=slack + max).contains(&ttl),
                "{key}: PTTL {ttl}"
            );
            let value: String = query(&mut conn, &["GET", key]).await;
            values.push(value);
        }
        assert!(!l.check(&who, 1).await.unwrap().is_allowed());
        for (key, value) in keys.iter().zip(&values) {
            let now: String = query(&mut conn, &["GET", key]).await;
            assert_eq!(&now, value, "{key}: a denied call wrote");
        }
    }
}

/// Short windows' keys are gone from Redis (server clock, real time) once
/// their state no longer matters, on every algorithm.
#[tokio::test]
async fn redis_idle_window_keys_expire() {
    let server = RedisServer::start();
    let mut conn = inspector(&server).await;
    let store = server_clock_store(&server).await;
    let mut keys = Vec::new();
    for algorithm in [
        Algorithm::SlidingLog,
        Algorithm::SlidingWindow,
        Algorithm::FixedWindow,
    ] {
        let p = policy(
            &format!("exp-{algorithm}"),
            algorithm,
            &[Rate::new(2, Duration::from_millis(100))],
        );
        let l = Limiter::new(p.clone(), store.clone());
        let sent = Instant::now();
        let d = l.check(&Key::new("k"), 1).await.unwrap();
        assert!(d.is_allowed());
        // The key lives at least the reset of the admitted call from when
        // Redis decided (a fixed window's can be a millisecond): gone
        // sooner, it was never written.
        for key in store.window_keys(&p, &Key::new("k")) {
            let exists: i64 = query(&mut conn, &["EXISTS", &key]).await;
            assert!(
                exists == 1 || sent.elapsed() >= d.reset(),
                "{key} was not written"
            );
            keys.push(key);
        }
    }
    let mut live = keys.len();
    // Expiry has no signal to wait for: poll, bounded.
    let deadline = Instant::now() + Duration::from_secs(5);
    while live > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
        live = 0;
        for key in &keys {
            live += query::<i64>(&mut conn, &["EXISTS", key]).await as usize;
        }
    }
    assert_eq!(live, 0, "window keys still in Redis 5 s after 200 ms");
}

/// With the caller's clock, keys still expire on Redis' clock: a caller's
/// clock that falls behind Redis' real time (a test's manual clock on a
/// slow machine, an instance whose clock lags another's) must not find its
/// state expired while it still matters. Here the manual clock stands still
/// while real time runs far past every window (20 ms): each algorithm's
/// state is still there and the next call is denied.
#[tokio::test]
async fn state_outlives_a_client_clock_that_falls_behind() {
    let server = RedisServer::start();
    let s = Sut::redis(&server, "win", UNIX_NOW).await;
    let window = Duration::from_millis(20);
    let limiters: Vec<Limiter> = [
        Algorithm::SlidingLog,
        Algorithm::SlidingWindow,
        Algorithm::FixedWindow,
    ]
    .into_iter()
    .map(|a| s.limiter(&policy(&format!("behind-{a}"), a, &[Rate::new(2, window)])))
    .collect();
    for l in &limiters {
        for _ in 0..2 {
            assert!(s.check(l, "k", 1).await.is_allowed());
        }
    }
    let written = Instant::now();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(written.elapsed() >= 10 * window);
    s.advance(US);
    for l in &limiters {
        let d = s.check(l, "k", 1).await;
        assert!(
            !d.is_allowed(),
            "{}: state expired early: {d:?}",
            l.policy().name()
        );
    }
}

/// Two instances on one server whose clocks (`TimeSource::Client`) are a
/// few milliseconds apart, straddling a window boundary. `b` fills its
/// window at its start and moves to just before its end;
/// `a` is just past that end, in the next. Alternating calls from both
/// (`rounds` of each) return how many each admitted.
async fn straddle(server: &RedisServer, policy: &Policy, fill: u64, rounds: usize) -> (u64, u64) {
    let lag = Duration::from_millis(2);
    let b = Sut::redis(server, "win", ALIGNED).await;
    let a = Sut::redis(server, "win", ALIGNED + S + lag).await;
    let (la, lb) = (a.limiter(policy), b.limiter(policy));
    let d = b.check(&lb, "k", fill).await;
    assert!(d.is_allowed(), "the fill: {d:?}");
    b.advance(S - lag);
    let (mut by_a, mut by_b) = (0, 0);
    for _ in 0..rounds {
        by_a += u64::from(a.check(&la, "k", 1).await.is_allowed());
        by_b += u64::from(b.check(&lb, "k", 1).await.is_allowed());
    }
    (by_a, by_b)
}

/// A fixed window's stored start never moves back: the lagging instance
/// counts the window the other has begun, and together they admit that
/// window's count, not a fresh window at every call.
#[tokio::test]
async fn fixed_window_clocks_straddling_a_boundary_admit_the_count() {
    let server = RedisServer::start();
    let policy = policy("straddle-fixed", Algorithm::FixedWindow, &[Rate::new(5, S)]);
    let (by_a, by_b) = straddle(&server, &policy, 5, 20).await;
    assert_eq!(
        by_a + by_b,
        5,
        "admitted {by_a} + {by_b} in one window of 5"
    );
    // The lagging instance is told the later window's end, on its clock.
    let b = Sut::redis(&server, "win", ALIGNED + S - Duration::from_millis(2)).await;
    let d = b.check(&b.limiter(&policy), "k", 1).await;
    assert!(!d.is_allowed());
    assert_eq!(d.retry_after(), Some(S + Duration::from_millis(2)));
}

/// The same for the sliding counter: the lagging instance's window is full
/// (the fill), and the other's weighs all of it but the lag, so at most
/// the share of the fill that has left it is admitted.
#[tokio::test]
async fn sliding_counter_clocks_straddling_a_boundary_admit_the_count() {
    let server = RedisServer::start();
    let policy = policy(
        "straddle-counter",
        Algorithm::SlidingWindow,
        &[Rate::new(1000, S)],
    );
    let (by_a, by_b) = straddle(&server, &policy, 1000, 20).await;
    assert_eq!(by_b, 0, "the lagging instance's window is full");
    assert!(by_a <= 2, "admitted {by_a} past a full window");
}

/// With the callers' clocks, an instance whose clock runs ahead trims the
/// log only past the client-clock slack: entries that have left its window
/// but are still inside a lagging instance's stay, and still count there.
#[tokio::test]
async fn sliding_log_clock_ahead_keeps_a_lagging_window() {
    let server = RedisServer::start();
    let policy = policy("straddle-log", Algorithm::SlidingLog, &[Rate::new(5, S)]);
    let (by_a, by_b) = straddle(&server, &policy, 5, 20).await;
    // `b`'s window still holds the fill; `a`'s, a little later, none of it.
    assert_eq!(by_b, 0, "the lagging instance's window is full");
    assert_eq!(by_a, 5);
}

/// One `EVALSHA` per decision on every window algorithm, whatever the
/// number of windows, and nothing else from the client; a repeated denial
/// costs none (the deny cache answers it).
#[tokio::test]
async fn redis_one_round_trip_per_window_decision() {
    let server = RedisServer::start();
    let mut conn = inspector(&server).await;
    let store = client_clock_store(&server, "win", &ManualClock::new(UNIX_NOW)).await;
    let limiters: Vec<Limiter> = [
        Algorithm::SlidingLog,
        Algorithm::SlidingWindow,
        Algorithm::FixedWindow,
    ]
    .into_iter()
    .map(|a| Limiter::new(dual(a), store.clone()))
    .collect();
    for l in &limiters {
        // Loads the script.
        l.check(&Key::new("warm-up"), 1).await.unwrap();
    }
    let () = query(&mut conn, &["CONFIG", "RESETSTAT"]).await;
    let mut decisions = 0;
    for l in &limiters {
        for i in 0..30 {
            let d = l.check(&Key::new("k"), 1).await.unwrap();
            assert_eq!(d.is_allowed(), i < 25, "{d:?}");
            decisions += 1;
        }
    }
    let info: String = query(&mut conn, &["INFO", "commandstats"]).await;
    let calls = |name: &str| {
        info.lines()
            .find_map(|l| l.strip_prefix(&format!("cmdstat_{name}:calls=")))
            .and_then(|rest| rest.split(',').next())
            .map_or(0, |n| n.parse::<u64>().unwrap())
    };
    // Per algorithm, the first denial reaches Redis and the next four are
    // answered locally (the clock stands still, short of every retry).
    let hits = store.deny_cache_stats().hits;
    assert_eq!(hits, 3 * 4);
    assert_eq!(calls("evalsha") + hits, decisions, "{info}");
    assert_eq!(calls("eval"), 0, "{info}");
    let client_side: Vec<&str> = info
        .lines()
        .filter_map(|l| l.strip_prefix("cmdstat_"))
        .filter_map(|l| l.split(':').next())
        .filter(|name| {
            !["evalsha", "info", "config|resetstat"].contains(name)
                // Commands the scripts run.
                && !["get", "set", "zrange", "zcount", "zrangebyscore", "zremrangebyscore", "zadd", "pexpire"]
                    .contains(name)
        })
        .collect();
    assert!(client_side.is_empty(), "other commands: {client_side:?}");
}

/// Many clients on separate connections (a fleet), all at the same
/// microsecond (a frozen client clock): every admitted call is its own
/// log member, and exactly the window's count is admitted. Likewise on the
/// server's clock, and for the counter algorithms.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unique_members_and_exact_counts_under_concurrency() {
    const TASKS: usize = 64;
    const CALLS: usize = 12;
    const COUNT: u64 = 500;
    let server = RedisServer::start();
    let mut conn = inspector(&server).await;
    let frozen = ManualClock::new(UNIX_NOW);
    for (round, algorithm) in [
        Algorithm::SlidingLog,
        Algorithm::SlidingLog,
        Algorithm::SlidingWindow,
        Algorithm::FixedWindow,
    ]
    .into_iter()
    .enumerate()
    {
        let p = policy(
            &format!("conc-{round}"),
            algorithm,
            &[Rate::per_hour(COUNT)],
        );
        let mut limiters = Vec::new();
        let mut log_key = None;
        for _ in 0..4 {
            let store = if round == 1 {
                server_clock_store(&server).await
            } else {
                client_clock_store(&server, "win", &frozen).await
            };
            log_key.get_or_insert_with(|| store.window_keys(&p, &Key::new("shared")));
            limiters.push(Limiter::new(p.clone(), store));
        }
        let barrier = Arc::new(tokio::sync::Barrier::new(TASKS));
        let mut tasks = Vec::new();
        for t in 0..TASKS {
            let l = limiters[t % limiters.len()].clone();
            let barrier = barrier.clone();
            tasks.push(tokio::spawn(async move {
                barrier.wait().await;
                let mut remaining = Vec::new();
                for _ in 0..CALLS {
                    let d = l.check(&Key::new("shared"), 1).await.unwrap();
                    if d.is_allowed() {
                        remaining.push(d.remaining());
                    }
                }
                remaining
            }));
        }
        let mut remaining = Vec::new();
        for task in tasks {
            remaining.extend(task.await.unwrap());
        }
        assert_eq!(remaining.len() as u64, COUNT, "{algorithm} round {round}");
        // Each admitted call saw a count of its own.
        remaining.sort_unstable();
        assert_eq!(remaining, (0..COUNT).collect::<Vec<_>>(), "{algorithm}");
        if algorithm == Algorithm::SlidingLog {
            let key = log_key.as_ref().and_then(|keys| keys.first()).unwrap();
            let members: u64 = query(&mut conn, &["ZCARD", key]).await;
            assert_eq!(members, COUNT, "log members lost or duplicated");
        }
    }
}

/// The memory store forgets window state once it no longer matters, so
/// memory stays bounded however many identities come and go.
#[tokio::test]
async fn memory_store_sweeps_idle_window_state() {
    let clock = ManualClock::new(ALIGNED);
    let store = MemoryStore::builder().clock(clock.clone()).build();
    // State matters for 10 s (log, fixed) or 20 s (sliding counter).
    for algorithm in [
        Algorithm::SlidingLog,
        Algorithm::SlidingWindow,
        Algorithm::FixedWindow,
    ] {
        let l = Limiter::new(
            policy(
                &format!("sweep-{algorithm}"),
                algorithm,
                &[Rate::new(5, 10 * S)],
            ),
            store.clone(),
        );
        for i in 0..100 {
            let d = l.check(&Key::new(format!("k{i}")), 1).await.unwrap();
            assert!(d.is_allowed());
        }
    }
    assert_eq!(store.len(), 300);
    clock.advance(10 * S - US);
    store.sweep();
    assert_eq!(store.len(), 300, "swept state that still matters");
    clock.advance(US);
    store.sweep();
    assert_eq!(store.len(), 100, "only the sliding counters still matter");
    clock.advance(10 * S);
    store.sweep();
    assert!(store.is_empty(), "{} entries left", store.len());
}
