//! Streaming calls hold their concurrency lease (and their place in the
//! fleet shedder) until the response stream ends or the client cancels it;
//! shedding tiers by method.

use std::time::{Duration, Instant};

use fleetgate::clock::ManualClock;
use fleetgate::key::GlobalKey;
use fleetgate::shed::{RouteTiers, Tiers, UtilizationShedLayer, UtilizationShedder};
use fleetgate::{
    ConcurrencyLimitLayer, ConcurrencyLimiter, ConcurrencyPolicy, FleetShedLayer, FleetShedPolicy,
    FleetShedder,
};
use tokio::sync::mpsc::UnboundedReceiver;
use tonic::Code;

use crate::{Greeter, GreeterClient, channel, hello, on_both_stores, serve};

/// Calls `SayHello` until it passes: after a stream was dropped its lease
/// is released, at once on the memory store and by a spawned round trip
/// on Redis. Fails if that takes 10 s (the lease's TTL is far longer, so
/// an expired lease cannot pass for a released one).
async fn admitted_again(client: &mut GreeterClient<tonic::transport::Channel>) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match client.say_hello(hello("ada", None)).await {
            Ok(_) => return,
            Err(status) if Instant::now() < deadline => {
                assert_ne!(status.code(), Code::Ok);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(status) => panic!("the lease was never released: {status:?}"),
        }
    }
}

/// Waits for the server to drop the stream it served.
async fn stream_dropped(dropped: &mut UnboundedReceiver<()>) {
    tokio::time::timeout(Duration::from_secs(10), dropped.recv())
        .await
        .expect("the server dropped the cancelled stream")
        .expect("the greeter is alive");
}

on_both_stores!(stream_holds_its_lease_until_cancelled, store => {
    let policy = ConcurrencyPolicy::builder("one-at-a-time", 1)
        .lease_ttl(Duration::from_secs(120))
        .build()
        .unwrap();
    let limiter = ConcurrencyLimiter::new(policy, std::sync::Arc::clone(&store.store));
    let layer = ConcurrencyLimitLayer::new(limiter).key(GlobalKey::new()).grpc();
    let (greeter, mut dropped) = Greeter::new();
    let addr = serve!(layer, greeter.clone());
    let mut client = GreeterClient::new(channel(addr).await);

    let mut stream = client
        .say_hello_stream(hello("ada", None))
        .await
        .expect("admitted")
        .into_inner();
    let first = stream.message().await.expect("a reply").expect("one reply");
    assert_eq!(first.message, "Hello ada!");

    // The handler has returned long ago; the stream still holds the lease.
    let status = client.say_hello(hello("bob", None)).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert!(status.message().contains("one-at-a-time"), "{}", status.message());
    assert!(status.message().contains("at most 1"), "{}", status.message());
    assert_eq!(crate::meta(&status, "grpc-retry-pushback-ms"), "1000");
    if let Some(server) = &store.server {
        assert_eq!(server.leases_held().await, 1);
    }

    drop(stream);
    stream_dropped(&mut dropped).await;
    admitted_again(&mut client).await;
});

on_both_stores!(shed_tier_by_method_while_streams_run, store => {
    // Two in flight for the fleet; streams are `low` and may use one.
    let tiers = Tiers::default();
    let policy = FleetShedPolicy::builder("fleet", 2)
        .share("low", 0.5)
        .lease_ttl(Duration::from_secs(120))
        .build()
        .unwrap();
    let shedder = FleetShedder::new(policy, std::sync::Arc::clone(&store.store));
    let routes = RouteTiers::new(&tiers)
        .route(None, "/fleetgate.demo.Greeter/SayHelloStream", "low")
        .unwrap()
        .route(None, "/fleetgate.demo.Greeter/*", "critical")
        .unwrap();
    let layer = FleetShedLayer::new(shedder).classify(routes).grpc();
    let (greeter, mut dropped) = Greeter::new();
    let addr = serve!(layer, greeter.clone());
    let mut client = GreeterClient::new(channel(addr).await);

    let mut stream = client.say_hello_stream(hello("ada", None)).await.expect("admitted").into_inner();
    stream.message().await.expect("a reply").expect("one reply");

    let status = client.say_hello_stream(hello("bob", None)).await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert!(status.message().contains("low"), "{}", status.message());
    assert!(status.message().contains("fleet"), "{}", status.message());
    assert_eq!(crate::meta(&status, "grpc-retry-pushback-ms"), "1000");
    assert_eq!(crate::meta(&status, "retry-after"), "1");
    // Critical calls are never shed.
    client.say_hello(hello("cy", None)).await.expect("critical passes");

    drop(stream);
    stream_dropped(&mut dropped).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match client.say_hello_stream(hello("dee", None)).await {
            Ok(_) => break,
            Err(status) if Instant::now() < deadline => {
                assert_eq!(status.code(), Code::Unavailable, "{status:?}");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(status) => panic!("the stream's place was never given back: {status:?}"),
        }
    }
});

on_both_stores!(stream_lease_is_renewed_while_it_runs, store => {
    // A lease of 1 s, renewed every third of it: a stream open for 3 s
    // must still hold its slot (time is the subject: measured from when
    // the lease was taken, with two thirds of the TTL to spare for a late
    // renewal on a loaded machine).
    let policy = ConcurrencyPolicy::builder("renewed", 1)
        .lease_ttl(Duration::from_secs(1))
        .build()
        .unwrap();
    let limiter = ConcurrencyLimiter::new(policy, std::sync::Arc::clone(&store.store));
    let layer = ConcurrencyLimitLayer::new(limiter).key(GlobalKey::new()).grpc();
    let (greeter, mut dropped) = Greeter::new();
    let addr = serve!(layer, greeter.clone());
    let mut client = GreeterClient::new(channel(addr).await);

    let mut stream = client.say_hello_stream(hello("ada", None)).await.expect("admitted").into_inner();
    stream.message().await.expect("a reply").expect("one reply");
    tokio::time::sleep(Duration::from_secs(3)).await;
    let status = client.say_hello(hello("bob", None)).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted, "the lease lapsed: {status:?}");

    drop(stream);
    stream_dropped(&mut dropped).await;
    admitted_again(&mut client).await;
});

/// The worker-utilization shedder is local to the process (no store):
/// once saturated, its gRPC refusal is `UNAVAILABLE` with its retry hint.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn utilization_shed_is_unavailable() {
    let clock = ManualClock::new(Duration::from_secs(1));
    let shedder = UtilizationShedder::gauge(|| 1.0)
        .delay(Duration::ZERO)
        .ramp(Duration::from_secs(1))
        .clock(clock.clone())
        .build()
        .unwrap();
    let critical = shedder.tiers().critical();
    drop(shedder.admit(critical).expect("critical is never shed"));
    clock.advance(Duration::from_secs(2));
    drop(shedder.admit(critical).expect("critical is never shed"));
    assert_eq!(shedder.state().amount(), Some(1.0), "sheds all it may");

    let routes = RouteTiers::new(shedder.tiers())
        .route(None, "/fleetgate.demo.Greeter/SayHello", "low")
        .unwrap();
    let layer = UtilizationShedLayer::new(shedder)
        .classify(routes)
        .retry_after(Duration::from_millis(2500))
        .grpc();
    let (greeter, _dropped) = Greeter::new();
    let addr = serve!(layer, greeter.clone());
    let mut client = GreeterClient::new(channel(addr).await);
    let status = client.say_hello(hello("ada", None)).await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert!(status.message().contains("low"), "{}", status.message());
    assert_eq!(crate::pushback_ms(&status), 2500);
    assert_eq!(crate::meta(&status, "retry-after"), "3");
    assert_eq!(greeter.calls(), 0);
}
