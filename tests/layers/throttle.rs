//! AdaptiveThrottleLayer around a tower client on paused time: an
//! upstream that fails every call soon gets only a trickle, the refused
//! calls fail at once with `RateLimitError::Throttled` without reaching
//! it, and an upstream that accepts is never throttled.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use fleetgate::RateLimitError;
use fleetgate::rate_limit::{AdaptiveThrottle, AdaptiveThrottleLayer};
use http::{Request, Response, StatusCode};
use tower::{Service, ServiceBuilder, ServiceExt, service_fn};

/// A client whose upstream answers `status`, counting what reaches it.
fn client(
    throttle: AdaptiveThrottle,
    status: StatusCode,
    reached: Arc<AtomicU64>,
) -> impl Service<Request<()>, Response = Response<()>, Error = fleetgate::BoxError> + Clone {
    ServiceBuilder::new()
        .layer(AdaptiveThrottleLayer::new(throttle))
        .service(service_fn(move |_req: Request<()>| {
            reached.fetch_add(1, Ordering::Relaxed);
            async move {
                let mut response = Response::new(());
                *response.status_mut() = status;
                Ok::<_, std::convert::Infallible>(response)
            }
        }))
}

/// Makes `n` calls a second for `secs` seconds; returns the calls
/// throttled locally.
async fn drive(
    client: &mut (
             impl Service<Request<()>, Response = Response<()>, Error = fleetgate::BoxError> + Clone
         ),
    n: u64,
    secs: u64,
) -> u64 {
    let mut throttled = 0;
    for _ in 0..secs {
        for _ in 0..n {
            match client.ready().await.unwrap().call(Request::new(())).await {
                Ok(_) => {}
                Err(e) => {
                    let e = e.downcast::<RateLimitError>().expect("a RateLimitError");
                    assert_eq!(*e, RateLimitError::Throttled);
                    throttled += 1;
                }
            }
        }
        tokio::time::advance(Duration::from_secs(1)).await;
    }
    throttled
}

#[tokio::test(start_paused = true)]
async fn a_failing_upstream_gets_a_trickle_and_refused_calls_never_reach_it() {
    let throttle = AdaptiveThrottle::builder().build().unwrap();
    let reached = Arc::new(AtomicU64::new(0));
    let mut failing = client(
        throttle.clone(),
        StatusCode::SERVICE_UNAVAILABLE,
        reached.clone(),
    );
    let throttled = drive(&mut failing, 50, 120).await;
    let sent = reached.load(Ordering::Relaxed);
    assert_eq!(
        sent + throttled,
        50 * 120,
        "every call either sent or throttled"
    );
    assert!(throttled > 50 * 120 / 2, "{throttled} throttled of 6000");
    assert!(throttle.rejection_probability() > 0.85);
}

#[tokio::test(start_paused = true)]
async fn an_upstream_that_accepts_is_never_throttled() {
    let throttle = AdaptiveThrottle::builder().build().unwrap();
    let reached = Arc::new(AtomicU64::new(0));
    // 404s are answers, not failures.
    let mut fine = client(throttle.clone(), StatusCode::NOT_FOUND, reached.clone());
    assert_eq!(drive(&mut fine, 50, 60).await, 0);
    assert_eq!(reached.load(Ordering::Relaxed), 50 * 60);
    assert_eq!(throttle.rejection_probability(), 0.0);
}
