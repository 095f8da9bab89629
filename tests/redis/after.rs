//! Cost known after the response on Redis alone: a huge charge's key
//! expires with its debt. (The response-cost scenarios, on both stores:
//! tests/layers/after.rs; charges while Redis refuses writes:
//! refused_writes.rs; a charge that fails while Redis hangs:
//! tests/alone/charge_log.rs.)
use crate::common;

use std::time::{Duration, Instant};

use common::RedisServer;
use fleetgate::rate_limit::ResponseCost;
use fleetgate::{Limit, Limiter, Rate};
use http::StatusCode;
use tower::ServiceBuilder;

use crate::response_cost::*;

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
    // The burst's minute and the debt's hour, on the server's clock, to
    // the whole second after them.
    assert!((1..=3_661_000).contains(&ttl), "{ttl} ms");
}
