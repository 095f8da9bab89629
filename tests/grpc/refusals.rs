//! What a gRPC client sees of a refusal: a status, never a transport
//! error, with the retry hints it reads.

use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use fleetgate::key::{HeaderKey, PeerIp};
use fleetgate::{
    ConcurrencyLimitLayer, ConcurrencyLimiter, ConcurrencyPolicy, FailurePolicy, FleetShedLayer,
    FleetShedPolicy, FleetShedder, RateLimitLayer,
};
use http_body_util::BodyExt;
use tonic::Code;
use tower::ServiceExt;

use crate::{
    Greeter, GreeterClient, channel, hello, on_both_stores, pushback_ms, retry_delay, serve,
};

on_both_stores!(rate_limit_refuses_with_resource_exhausted_and_pushback, store => {
    // Two calls a minute per API key: the third waits about 30 s.
    let layer = RateLimitLayer::new(store.limiter("greet", "2/min"))
        .key(HeaderKey::new("x-api-key").or(PeerIp))
        .grpc();
    let (greeter, _dropped) = Greeter::new();
    let addr = serve!(layer, greeter.clone());
    let mut client = GreeterClient::new(channel(addr).await);

    for _ in 0..2 {
        let reply = client.say_hello(hello("ada", Some("k1"))).await.expect("admitted");
        assert_eq!(reply.get_ref().message, "Hello ada!");
        // Admitted calls carry the rate-limit headers as metadata.
        assert!(reply.metadata().get("ratelimit").is_some(), "{:?}", reply.metadata());
    }
    let status = client.say_hello(hello("ada", Some("k1"))).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert!(status.message().contains("greet"), "{}", status.message());
    assert!(status.message().contains("2/min"), "names the limit: {}", status.message());
    let pushback = pushback_ms(&status);
    // At most the 30 s the store counted from; the calls before it took
    // a moment, even on a loaded machine not 20 s.
    assert!((10_000..=30_000).contains(&pushback), "{pushback}");
    let retry_after: u64 = status.metadata().get("retry-after").unwrap().to_str().unwrap().parse().unwrap();
    assert_eq!(retry_after, (pushback as u64).div_ceil(1000));
    let delay = retry_delay(&status).expect("RetryInfo in grpc-status-details-bin");
    assert!(delay <= Duration::from_millis(pushback as u64), "{delay:?}");
    assert!(delay > Duration::from_millis(pushback as u64 - 1), "{delay:?}");
    assert!(status.metadata().get("ratelimit").is_some(), "the refusal's headers");
    assert_eq!(greeter.calls(), 2, "the refused call never reached the service");

    // Another key has its own budget, and so has a call without one
    // (keyed by its peer's address).
    client.say_hello(hello("bob", Some("k2"))).await.expect("another key");
    client.say_hello(hello("cy", None)).await.expect("the peer's budget");
});

on_both_stores!(missing_key_is_invalid_argument, store => {
    let layer = RateLimitLayer::new(store.limiter("greet", "10/s"))
        .key(HeaderKey::new("x-api-key"))
        .grpc();
    let (greeter, _dropped) = Greeter::new();
    let addr = serve!(layer, greeter.clone());
    let mut client = GreeterClient::new(channel(addr).await);
    let status = client.say_hello(hello("ada", None)).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(status.metadata().get("grpc-retry-pushback-ms").is_none());
    assert_eq!(greeter.calls(), 0);
});

/// One `SayHello` call as HTTP/2 sees it, through a bare channel.
fn raw_call() -> http::Request<tonic::body::Body> {
    raw_call_to("/fleetgate.demo.Greeter/SayHello")
}

/// A call of the method at `path` (`/package.Service/Method`) with a
/// `HelloRequest`, as HTTP/2 sees it.
pub(crate) fn raw_call_to(path: &str) -> http::Request<tonic::body::Body> {
    // A gRPC message: uncompressed, its length, then `HelloRequest { name: "ada" }`.
    let message = [0x0a, 3, b'a', b'd', b'a'];
    let mut frame = BytesMut::new();
    frame.put_u8(0);
    frame.put_u32(message.len() as u32);
    frame.put_slice(&message);
    http::Request::post(path)
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(tonic::body::Body::new(http_body_util::Full::new(
            frame.freeze(),
        )))
        .unwrap()
}

on_both_stores!(refusal_is_http_200_and_trailers_only, store => {
    let layer = RateLimitLayer::new(store.limiter("greet", "1/min"))
        .key(PeerIp)
        .grpc();
    let (greeter, _dropped) = Greeter::new();
    let addr = serve!(layer, greeter.clone());
    let channel = channel(addr).await;

    let admitted = channel.clone().oneshot(raw_call()).await.unwrap();
    assert_eq!(admitted.status(), 200);
    let body = admitted.into_body().collect().await.unwrap();
    assert_eq!(body.trailers().unwrap()["grpc-status"], "0");

    let refused = channel.oneshot(raw_call()).await.unwrap();
    assert_eq!(refused.status(), 200, "never a 429: gRPC clients read it as a broken transport");
    let headers = refused.headers().clone();
    assert_eq!(headers["content-type"], "application/grpc");
    assert_eq!(headers["grpc-status"], "8");
    assert!(headers["grpc-message"].to_str().unwrap().contains("greet"));
    assert!(headers.contains_key("grpc-retry-pushback-ms"));
    assert!(headers.contains_key("grpc-status-details-bin"));
    // Trailers-only: the status travels with the headers, which end the
    // stream; no message, no trailers follow.
    let body = refused.into_body().collect().await.unwrap();
    assert!(body.trailers().is_none());
    assert_eq!(body.to_bytes(), Bytes::new());
});

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_down_and_failing_closed_is_unavailable() {
    let store = crate::common::unreachable_store(Duration::from_millis(200)).await;
    let policy = "10/s"
        .parse::<fleetgate::spec::PolicySpec>()
        .unwrap()
        .build("greet")
        .unwrap();
    let layer = RateLimitLayer::new(fleetgate::Limiter::new(policy, store))
        .key(PeerIp)
        .on_store_error(FailurePolicy::Closed)
        .grpc();
    let (greeter, _dropped) = Greeter::new();
    let addr = serve!(layer, greeter.clone());
    let mut client = GreeterClient::new(channel(addr).await);
    let status = client.say_hello(hello("ada", None)).await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert!(status.message().contains("greet"), "{}", status.message());
    assert_eq!(pushback_ms(&status), 1000);
    assert_eq!(retry_delay(&status), Some(Duration::from_secs(1)));
    assert_eq!(greeter.calls(), 0);
}

/// The concurrency limiter and the fleet shedder failing closed on a store
/// that is down: `UNAVAILABLE` too, never reaching the service.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrency_and_fleet_shed_failing_closed_are_unavailable() {
    let down = async || crate::common::unreachable_store(Duration::from_millis(200)).await;

    let policy = ConcurrencyPolicy::builder("in-flight", 4).build().unwrap();
    let layer = ConcurrencyLimitLayer::new(ConcurrencyLimiter::new(policy, down().await))
        .key(PeerIp)
        .on_store_error(FailurePolicy::Closed)
        .grpc();
    let (greeter, _dropped) = Greeter::new();
    let addr = serve!(layer, greeter.clone());
    let mut client = GreeterClient::new(channel(addr).await);
    let status = client.say_hello(hello("ada", None)).await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert!(
        status.message().contains("in-flight"),
        "{}",
        status.message()
    );
    assert_eq!(greeter.calls(), 0);

    let policy = FleetShedPolicy::builder("fleet", 4).build().unwrap();
    let layer = FleetShedLayer::new(FleetShedder::new(policy, down().await))
        .on_store_error(FailurePolicy::Closed)
        .grpc();
    let (greeter, _dropped) = Greeter::new();
    let addr = serve!(layer, greeter.clone());
    let mut client = GreeterClient::new(channel(addr).await);
    let status = client.say_hello(hello("ada", None)).await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert!(status.message().contains("fleet"), "{}", status.message());
    assert_eq!(greeter.calls(), 0);
}

/// A deny list entry: `PERMISSION_DENIED`, told not to retry; as a 429
/// with an end, `RESOURCE_EXHAUSTED` with the time left as pushback.
#[tokio::test]
async fn deny_listed_calls_are_permission_denied_or_exhausted() {
    use fleetgate::MemoryStore;
    use fleetgate::live::LivePolicies;
    let live = LivePolicies::new(MemoryStore::new());
    let policy = |name: &str| {
        "10/s"
            .parse::<fleetgate::spec::PolicySpec>()
            .unwrap()
            .build(name)
            .unwrap()
    };
    let forbidden = RateLimitLayer::new(live.limiter(policy("greet-deny")))
        .key(HeaderKey::new("x-api-key"))
        .grpc();
    let exhausted = RateLimitLayer::new(live.limiter(policy("greet-deny-429")))
        .key(HeaderKey::new("x-api-key"))
        .deny_status(http::StatusCode::TOO_MANY_REQUESTS)
        .unwrap()
        .grpc();
    let key = HeaderKey::new("x-api-key");
    let mallory = {
        use fleetgate::key::KeyExtractor;
        let req = http::Request::get("/")
            .header("x-api-key", "mallory")
            .body(())
            .unwrap();
        key.extract(&req).unwrap()
    };
    live.deny(None, mallory, Some(Duration::from_secs(120)))
        .await
        .unwrap();
    let (greeter, _dropped) = Greeter::new();
    let addr = serve!(forbidden, greeter.clone());
    let mut client = GreeterClient::new(channel(addr).await);
    let status = client
        .say_hello(hello("m", Some("mallory")))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
    assert_eq!(pushback_ms(&status), -1, "told not to retry");
    client
        .say_hello(hello("ada", Some("ada")))
        .await
        .expect("another key");

    let addr = serve!(exhausted, greeter.clone());
    let mut client = GreeterClient::new(channel(addr).await);
    let status = client
        .say_hello(hello("m", Some("mallory")))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    let pushback = pushback_ms(&status);
    assert!((100_000..=120_000).contains(&pushback), "{pushback}");
    assert_eq!(greeter.calls(), 1);
}
