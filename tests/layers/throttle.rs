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

#[tokio::test(start_paused = true)]
async fn a_throttled_call_never_waits_for_a_slot() {
    use fleetgate::key::GlobalKey;
    use fleetgate::{Limit, Limiter, MemoryStore, Policy, Rate, RateLimitLayer};
    use futures_util::FutureExt;

    // In front of a waiting layer of one call a second: once the
    // throttle refuses, a refused call fails at the first poll, taking no
    // slot, while a sent one waits its turn.
    let throttle = AdaptiveThrottle::builder().build().unwrap();
    let clock = fleetgate::clock::MonotonicClock::new();
    let store = MemoryStore::builder().clock(clock).build();
    let policy = Policy::single("upstream", Limit::new(Rate::per_second(1)).unwrap()).unwrap();
    let reached = Arc::new(AtomicU64::new(0));
    let counted = reached.clone();
    let mut client = ServiceBuilder::new()
        .layer(AdaptiveThrottleLayer::new(throttle.clone()))
        .layer(
            RateLimitLayer::new(Limiter::new(policy, store))
                .key(GlobalKey::new())
                .typed_errors()
                .wait_up_to(Duration::from_secs(3600)),
        )
        .service(service_fn(move |_req: Request<()>| {
            counted.fetch_add(1, Ordering::Relaxed);
            async {
                let mut response = Response::new(());
                *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
                Ok::<_, std::convert::Infallible>(response)
            }
        }));
    let (mut refused, mut waited) = (0, 0);
    for _ in 0..200 {
        let call = client.ready().await.unwrap().call(Request::new(()));
        match call.now_or_never() {
            Some(Err(e)) => {
                let e = e.downcast::<RateLimitError>().expect("a RateLimitError");
                assert_eq!(*e, RateLimitError::Throttled);
                refused += 1;
            }
            Some(Ok(_)) => {}
            None => waited += 1,
        }
    }
    // Pending calls were dropped: the waiting layer never called the
    // upstream for them. Only the first call went at once.
    assert!(refused > 0, "nothing throttled");
    assert_eq!(refused + waited + reached.load(Ordering::Relaxed), 200);
    assert!(throttle.rejection_probability() > 0.0);
}
