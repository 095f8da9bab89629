//! A charge after the response that fails while Redis hangs: logged at
//! `warn`, never delaying the response (the rest of the response-cost
//! tests: tests/layers/after.rs, on both stores; tests/redis/after.rs).
use crate::common;

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use common::RedisServer;
use common::logs::Logs;
use fleetgate::rate_limit::ResponseCost;
use fleetgate::{Limit, Limiter, Rate, RedisStore};
use http::{Request, Response, StatusCode};
use tower::{ServiceBuilder, service_fn};

use crate::response_cost::*;

/// Redis hangs while the handler runs: the peek passed, the charge cannot
/// land. The response is not delayed by the store's 1 s timeout, and the
/// failed charge is logged at `warn` once it times out. The warning gate
/// (one store warning a second) is the process's: the test runs in this
/// binary, one at a time, so that the store failures of tests beside it
/// cannot take every second's warning (on a busy machine they did, for
/// 20 s), and a call is retried until one warning gets through.
#[tokio::test(flavor = "current_thread")]
async fn a_failing_charge_is_logged_and_never_delays_the_response() {
    let _alone = crate::one_at_a_time().await;
    let (logs, _logging) = Logs::capture();
    let server = Arc::new(RedisServer::start());
    let store = RedisStore::builder(server.url())
        .timeout(Duration::from_secs(1))
        .connect()
        .await
        .unwrap();
    let limiter = Limiter::new(
        policy("tokens", Limit::new(Rate::per_minute(1000)).unwrap()),
        store,
    );
    let hang = server.clone();
    let svc = ServiceBuilder::new()
        .layer(layer(&limiter, ResponseCost::header("x-tokens-used")))
        .service(service_fn(move |_req: Request<Body>| {
            // Redis stops answering while the call runs.
            hang.pause();
            std::future::ready(Ok::<_, Infallible>(
                Response::builder()
                    .header("x-tokens-used", "400")
                    .body(Body::empty())
                    .unwrap(),
            ))
        }));
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        server.resume();
        let started = Instant::now();
        let res = call(&svc, "/complete", "k").await;
        let took = started.elapsed();
        assert_eq!(res.status(), StatusCode::OK);
        // The peek was answered before the pause; the charge, which
        // waits up to 1 s, is not on the response's path.
        assert!(
            took < Duration::from_millis(500),
            "the response took {took:?}"
        );
        let logged = Instant::now() + Duration::from_secs(3);
        while Instant::now() < logged && !logs.text().contains("charge after the response") {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        if logs.text().contains("charge after the response") {
            break;
        }
        assert!(Instant::now() < deadline, "never logged: {}", logs.text());
    }
    let text = logs.text();
    assert!(text.contains("WARN"), "{text}");
    assert!(
        text.contains("policy=\"tokens\"") || text.contains("policy=tokens"),
        "{text}"
    );
    server.resume();
}
