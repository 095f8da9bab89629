//! A client's layer around a tonic channel: a server's `RESOURCE_EXHAUSTED`
//! with `grpc-retry-pushback-ms` (trailers-only, or in the trailers after a
//! streamed reply) pauses the identity for the whole fleet of clients, as
//! an HTTP `Retry-After` does.

use std::time::Duration;

use fleetgate::key::GlobalKey;
use fleetgate::rate_limit::RetryAfter;
use fleetgate::{Key, RateLimitLayer};
use tonic::Code;
use tower::ServiceBuilder;

use crate::{Greeter, GreeterClient, TestStore, channel, hello, on_both_stores, serve};

on_both_stores!(server_pushback_pauses_every_client, store => {
    // The server: one call a minute, refused with a pushback of up to 60 s.
    let server_store = TestStore::memory();
    let layer = RateLimitLayer::new(server_store.limiter("server", "1/min"))
        .key(GlobalKey::new())
        .grpc();
    let (greeter, _dropped) = Greeter::new();
    let addr = serve!(layer, greeter.clone());

    // Two client instances sharing `store`; their own policy is generous.
    let client_layer = || {
        RateLimitLayer::new(store.limiter("client", "100/s"))
            .key(GlobalKey::new())
            .wait_up_to(Duration::from_secs(2))
            .upstream_feedback(RetryAfter::new())
            .grpc()
    };
    let mut first = GreeterClient::new(
        ServiceBuilder::new().layer(client_layer()).service(channel(addr).await),
    );
    first.say_hello(hello("a", None)).await.expect("the server's one call");
    let refused = first.say_hello(hello("a", None)).await.unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted);
    assert!(refused.message().contains("policy server"), "{}", refused.message());
    let pushback: u64 = crate::meta(&refused, "grpc-retry-pushback-ms").parse().unwrap();
    assert_eq!(greeter.calls(), 1);

    // The pause is recorded for the identity in the shared store: the
    // other instance's next slot is about `pushback` away, past its
    // 2 s wait, so it refuses at once without calling the server.
    let mut second = GreeterClient::new(
        ServiceBuilder::new().layer(client_layer()).service(channel(addr).await),
    );
    let held = second.say_hello(hello("a", None)).await.unwrap_err();
    assert_eq!(held.code(), Code::ResourceExhausted, "{held:?}");
    assert!(held.message().contains("policy client"), "held by the client: {}", held.message());
    let wait: u64 = crate::meta(&held, "grpc-retry-pushback-ms").parse().unwrap();
    // Recorded from the pushback (counted from the server's refusal) and
    // read a moment later: at most that long, and not much less.
    assert!(wait <= pushback + 10 && wait + 10_000 >= pushback, "{wait} vs {pushback}");
    assert_eq!(greeter.calls(), 1, "the paused call never reached the server");

    // The same pause, as the store sees it.
    let decision = store
        .limiter("client", "100/s")
        .check(&Key::new("global"), 1)
        .await
        .unwrap();
    assert!(!decision.is_allowed());
    assert!(decision.retry_after().unwrap() > Duration::from_secs(2));
});

on_both_stores!(pushback_in_trailers_pauses_every_client, store => {
    // No limit on the server: its stream sends a reply, then ends with
    // RESOURCE_EXHAUSTED and a pushback of 60 s in the trailers.
    let (greeter, _dropped) = Greeter::new();
    let addr = serve!(tower::layer::util::Identity::new(), greeter.clone());
    let client_layer = || {
        RateLimitLayer::new(store.limiter("client", "100/s"))
            .key(GlobalKey::new())
            .wait_up_to(Duration::from_secs(2))
            .upstream_feedback(RetryAfter::new())
            .grpc()
    };
    let mut first = GreeterClient::new(
        ServiceBuilder::new().layer(client_layer()).service(channel(addr).await),
    );
    let mut stream = first.say_hello_stream(hello("exhaust", None)).await.expect("admitted").into_inner();
    stream.message().await.expect("a reply").expect("one reply");
    let ended = stream.message().await.unwrap_err();
    assert_eq!(ended.code(), Code::ResourceExhausted, "{ended:?}");
    assert_eq!(crate::pushback_ms(&ended), 60_000);

    // Recorded as the trailers were read: on Redis by a task of its own,
    // so wait (boundedly) until the store holds the pause.
    let limiter = store.limiter("client", "100/s");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let decision = loop {
        let decision = limiter.peek(&Key::new("global"), 1).await.unwrap();
        if !decision.is_allowed() || std::time::Instant::now() > deadline {
            break decision;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(!decision.is_allowed(), "the pause was never recorded");
    let after = decision.retry_after().unwrap();
    assert!(after > Duration::from_secs(50) && after <= Duration::from_secs(60), "{after:?}");

    let mut second = GreeterClient::new(
        ServiceBuilder::new().layer(client_layer()).service(channel(addr).await),
    );
    let held = second.say_hello(hello("a", None)).await.unwrap_err();
    assert_eq!(held.code(), Code::ResourceExhausted, "{held:?}");
    assert!(held.message().contains("policy client"), "{}", held.message());
    assert_eq!(greeter.calls(), 1, "the paused call never reached the server");
});

on_both_stores!(waiting_stops_at_the_calls_deadline, store => {
    let (greeter, _dropped) = Greeter::new();
    let addr = serve!(tower::layer::util::Identity::new(), greeter.clone());
    // One call a minute, and the client would wait up to two for its slot.
    let layer = RateLimitLayer::new(store.limiter("client", "1/min"))
        .key(GlobalKey::new())
        .wait_up_to(Duration::from_secs(120))
        .grpc();
    let mut client =
        GreeterClient::new(ServiceBuilder::new().layer(layer).service(channel(addr).await));
    client.say_hello(hello("a", None)).await.expect("the minute's call");

    // The next slot is a minute away, past this call's 200 ms deadline
    // (`grpc-timeout: 200m`): refused at once, not after a minute.
    let mut call = hello("b", None);
    call.set_timeout(Duration::from_millis(200));
    let refused = tokio::time::timeout(Duration::from_secs(30), client.say_hello(call))
        .await
        .expect("refused at once, not after waiting for the slot")
        .unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert!(refused.message().contains("policy client"), "{}", refused.message());
    let pushback = crate::pushback_ms(&refused);
    assert!((1..=60_000).contains(&pushback), "{pushback}");
    assert_eq!(greeter.calls(), 1);

    // Uncharged: the next slot is still the one a minute after the first
    // call (a reservation would have pushed it to two minutes).
    let decision = store
        .limiter("client", "1/min")
        .check(&Key::new("global"), 1)
        .await
        .unwrap();
    assert!(!decision.is_allowed());
    assert!(decision.retry_after().unwrap() <= Duration::from_secs(60), "{decision:?}");
});
