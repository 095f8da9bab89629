//! Redis hung or gone: decisions give up after the store's timeout, the
//! failure policy applies, and enforcement resumes when Redis is back.
use crate::common;

use std::time::{Duration, Instant};

use common::RedisServer;
use fleetgate::{Key, Limit, Limiter, Policy, Rate, RedisStore, StoreError};
use futures_util::FutureExt;

#[tokio::test]
async fn hung_redis_times_out_then_recovers() {
    let server = RedisServer::start();
    let timeout = Duration::from_millis(100);
    let store = RedisStore::builder(server.url())
        .timeout(timeout)
        .connect()
        .await
        .unwrap();
    let limit = Limit::builder(Rate::per_hour(2)).burst(2).build().unwrap();
    let limiter = Limiter::new(Policy::single("hang", limit).unwrap(), store);
    let key = Key::new("k");
    assert!(limiter.check(&key, 1).await.unwrap().is_allowed());

    // SIGSTOP: the server accepts nothing and answers nothing.
    server.pause();
    for _ in 0..3 {
        let started = Instant::now();
        let result = limiter.check(&key, 1).await;
        let took = started.elapsed();
        assert!(
            matches!(result, Err(StoreError::Timeout(t)) if t == timeout),
            "{result:?}"
        );
        // The timeout bounds the wait (generous margin for a loaded machine).
        assert!(took < timeout + Duration::from_secs(1), "waited {took:?}");
    }
    server.resume();

    // Back: the limit is enforced again. Calls that timed out may still
    // have reached Redis and been charged (a timeout cannot take back what
    // was sent), so at most the one remaining slot is granted before the
    // first denial.
    let mut allowed = 0;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        assert!(
            Instant::now() < deadline,
            "limit not enforced after recovery"
        );
        match limiter.check(&key, 1).await {
            Ok(d) if d.is_allowed() => allowed += 1,
            Ok(_) => break,
            Err(_) => {}
        }
    }
    assert!(allowed <= 1, "{allowed} admitted past a burst of 2");
}

#[tokio::test]
async fn lazy_store_starts_without_redis_and_enforces_once_it_appears() {
    // A free port with nothing listening yet.
    let port = common::redis_server::free_port();
    let store = RedisStore::builder(format!("redis://127.0.0.1:{port}"))
        .timeout(Duration::from_millis(200))
        .lazy()
        .connect()
        .await
        .unwrap();
    let limit = Limit::builder(Rate::per_hour(1)).burst(1).build().unwrap();
    let limiter = Limiter::new(Policy::single("lazy", limit).unwrap(), store);
    let key = Key::new("k");
    assert!(limiter.check(&key, 1).await.is_err(), "no Redis yet");

    let _server = RedisServer::start_on(port).expect("redis on the chosen port");
    let mut outcomes = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while outcomes.len() < 2 {
        assert!(Instant::now() < deadline, "never reconnected: {outcomes:?}");
        if let Ok(d) = limiter.check(&key, 1).await {
            outcomes.push(d.is_allowed());
        }
    }
    assert_eq!(outcomes, [true, false]);
}

#[test]
fn lazy_store_outside_a_runtime_is_an_error_not_a_panic() {
    let err = RedisStore::builder("redis://127.0.0.1:1")
        .lazy()
        .connect()
        .now_or_never()
        .expect("refused at the first poll")
        .unwrap_err();
    assert!(
        matches!(
            err,
            StoreError::Config(fleetgate::ConfigError::NoRuntime { .. })
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("tokio runtime"), "{err}");
}

/// Nothing listens where Redis should be: calls fail at once with a store
/// error, rather than waiting out the store's timeout (or a reconnection's
/// backoff), while the store keeps trying to connect in the background
/// (see the lazy store's test above for the reconnection).
#[tokio::test]
async fn a_refused_connection_fails_at_once() {
    let timeout = Duration::from_secs(5);
    let store = common::unreachable_store(timeout).await;
    let limit = Limit::builder(Rate::per_hour(1)).burst(1).build().unwrap();
    let limiter = Limiter::new(Policy::single("refused", limit).unwrap(), store);
    let started = Instant::now();
    for i in 0..40 {
        let result = limiter.check(&Key::new(format!("k{i}")), 1).await;
        assert!(matches!(result, Err(StoreError::Redis(_))), "{result:?}");
    }
    // Far below one timeout for all of them, however loaded the machine.
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(1),
        "40 refused calls took {took:?}"
    );
}

/// While Redis refuses connections, the store does not knock on it once
/// per call: calls fail without reaching the connection, and about one per
/// refusal window goes through to try again. A call
/// that went through fails with the connection's own error; the others
/// with the store's "refused" error.
#[tokio::test]
async fn a_refusing_server_is_tried_about_once_per_window() {
    let store = common::unreachable_store(Duration::from_secs(5)).await;
    let limit = Limit::builder(Rate::per_hour(1)).burst(1).build().unwrap();
    let limiter = Limiter::new(Policy::single("knock", limit).unwrap(), store);
    let started = Instant::now();
    let (mut calls, mut tried) = (0u64, 0u64);
    while started.elapsed() < Duration::from_millis(600) {
        match limiter.check(&Key::new("k"), 1).await {
            Err(StoreError::Redis(text)) if text.contains("reconnecting in the background") => {}
            Err(StoreError::Redis(_)) => tried += 1,
            other => panic!("{other:?}"),
        }
        calls += 1;
        // Let the connection's own tasks run.
        tokio::task::yield_now().await;
    }
    let windows = started.elapsed().as_millis() as u64 / 100;
    assert!(
        calls > 4 * (windows + 2),
        "only {calls} calls: too few to tell"
    );
    assert!(
        tried <= windows + 2,
        "{tried} of {calls} calls went to a refusing server in {windows} windows"
    );
}
