//! The penalty box across a fleet: two `LivePolicies`, each on a
//! `RedisStore` of its own connected to the test's server, as two
//! instances would be. A block started through one refuses on the other,
//! counting down; a reset through either lifts it on both, the other's
//! deny cache forgetting it within a poll.
use crate::common;

use std::time::{Duration, Instant};

use common::RedisServer;
use fleetgate::live::LivePolicies;
use fleetgate::spec::PolicySpec;
use fleetgate::{Key, RedisStore};

/// What the fleet is given to see a reset: twice the target of 1 s, for
/// a loaded machine.
const PROPAGATION: Duration = Duration::from_secs(2);

async fn instance(server: &RedisServer) -> LivePolicies {
    let store = RedisStore::builder(server.url())
        .prefix("boxed")
        .connect()
        .await
        .unwrap();
    LivePolicies::new(store)
}

#[tokio::test]
async fn a_block_is_the_fleets_and_a_reset_through_either_lifts_it() {
    let server = RedisServer::start();
    let (a, b) = (instance(&server).await, instance(&server).await);
    let login = "5/15min block 1h".parse::<PolicySpec>().unwrap();
    let login_a = a.limiter(login.build("login").unwrap());
    let login_b = b.limiter(login.build("login").unwrap());
    a.start().await.unwrap();
    b.start().await.unwrap();
    let mallory = Key::new("user:mallory");
    for _ in 0..5 {
        assert!(login_a.check(&mallory, 1).await.unwrap().is_allowed());
    }
    let started = login_a.check(&mallory, 1).await.unwrap();
    assert!(started.is_blocked(), "{started:?}");
    // On b, the block counts down from when a started it; a's own deny
    // cache answers it from then on.
    for limiter in [&login_b, &login_a, &login_b] {
        let d = limiter.check(&mallory, 1).await.unwrap();
        assert!(d.is_blocked(), "{d:?}");
        let left = d.retry_after().unwrap();
        assert!(left <= started.retry_after().unwrap() && left > Duration::from_secs(3590));
    }
    assert!(
        login_b
            .check(&Key::new("user:alice"), 1)
            .await
            .unwrap()
            .is_allowed()
    );

    // A reset through b: b decides afresh at once; a within a poll.
    b.reset(&mallory, Some("login")).await.unwrap();
    assert!(login_b.check(&mallory, 1).await.unwrap().is_allowed());
    let start = Instant::now();
    loop {
        let d = login_a.check(&mallory, 1).await.unwrap();
        if d.is_allowed() {
            break;
        }
        assert!(d.is_blocked(), "{d:?}");
        assert!(
            start.elapsed() < PROPAGATION,
            "a still blocks after a reset through b"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A reset through a bare `Limiter` on another instance (no live policies
/// to tell the fleet) lifts a block that this instance's deny cache
/// holds: the cache keeps a block a second at a time.
#[tokio::test]
async fn a_limiter_reset_elsewhere_lifts_a_cached_block() {
    let server = RedisServer::start();
    let store = || async {
        RedisStore::builder(server.url())
            .prefix("boxed-bare")
            .connect()
            .await
            .unwrap()
    };
    let login = "5/15min block 1h"
        .parse::<PolicySpec>()
        .unwrap()
        .build("login")
        .unwrap();
    let a = fleetgate::Limiter::new(login.clone(), store().await);
    let b = fleetgate::Limiter::new(login, store().await);
    let mallory = Key::new("user:mallory");
    for _ in 0..5 {
        assert!(a.check(&mallory, 1).await.unwrap().is_allowed());
    }
    for _ in 0..3 {
        assert!(a.check(&mallory, 1).await.unwrap().is_blocked());
    }
    b.reset(&mallory).await.unwrap();
    let start = Instant::now();
    loop {
        let d = a.check(&mallory, 1).await.unwrap();
        if d.is_allowed() {
            break;
        }
        // The cache's second, and a loaded machine's share.
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "a still blocks after a reset through b"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
