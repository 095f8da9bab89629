//! Streaming calls hold their concurrency lease (and their place in the
//! fleet shedder) until the response stream ends or the client cancels it;
//! shedding tiers by method.

use std::time::{Duration, Instant};

use std::sync::atomic::{AtomicUsize, Ordering};

use fleetgate::clock::{Clock, ManualClock};
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

/// Two in flight for the fleet; streams are `low` (by `routes`, over the
/// default tiers) and may use one; the rest of the service is `critical`.
async fn shed_by_method(store: crate::TestStore, routes: impl FnOnce(&Tiers) -> RouteTiers) {
    let tiers = Tiers::default();
    let policy = FleetShedPolicy::builder("fleet", 2)
        .share("low", 0.5)
        .lease_ttl(Duration::from_secs(120))
        .build()
        .unwrap();
    let shedder = FleetShedder::new(policy, std::sync::Arc::clone(&store.store));
    let layer = FleetShedLayer::new(shedder).classify(routes(&tiers)).grpc();
    let (greeter, mut dropped) = Greeter::new();
    let addr = serve!(layer, greeter.clone());
    let mut client = GreeterClient::new(channel(addr).await);

    let mut stream = client
        .say_hello_stream(hello("ada", None))
        .await
        .expect("admitted")
        .into_inner();
    stream.message().await.expect("a reply").expect("one reply");

    let status = client
        .say_hello_stream(hello("bob", None))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert!(status.message().contains("low"), "{}", status.message());
    assert!(status.message().contains("fleet"), "{}", status.message());
    assert_eq!(crate::meta(&status, "grpc-retry-pushback-ms"), "1000");
    assert_eq!(crate::meta(&status, "retry-after"), "1");
    // Critical calls are never shed.
    client
        .say_hello(hello("cy", None))
        .await
        .expect("critical passes");

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
}

on_both_stores!(shed_tier_by_method_while_streams_run, store => {
    shed_by_method(store, |tiers| {
        RouteTiers::new(tiers)
            .route(None, "/fleetgate.demo.Greeter/SayHelloStream", "low")
            .unwrap()
            .route(None, "/fleetgate.demo.Greeter/*", "critical")
            .unwrap()
    })
    .await;
});

on_both_stores!(shed_tier_by_method_from_a_policy_file, store => {
    let file: fleetgate::spec::PolicyFile = toml::from_str(
        r#"
        [policies]

        [[shed_routes]]
        path = "/fleetgate.demo.Greeter/SayHelloStream"
        tier = "low"

        [[shed_routes]]
        path = "/fleetgate.demo.Greeter/*"
        method = "POST"
        tier = "critical"
        "#,
    )
    .unwrap();
    shed_by_method(store, |tiers| RouteTiers::from_file(&file, tiers).unwrap()).await;
    // A tier the shedder does not have is an error, as in code.
    let unknown: fleetgate::spec::PolicyFile =
        toml::from_str("[policies]\n[[shed_routes]]\npath = \"/a/*\"\ntier = \"gold\"\n").unwrap();
    assert!(RouteTiers::from_file(&unknown, &Tiers::default()).is_err());
});

/// A manual clock that counts its reads: the memory store reads it once
/// per operation, so once a lease is held and no call is made, a read is a
/// renewal on its way (the signal the memory test waits on).
#[derive(Clone, Debug)]
struct CountingClock {
    clock: ManualClock,
    reads: std::sync::Arc<AtomicUsize>,
}

impl Clock for CountingClock {
    fn now_micros(&self) -> u64 {
        self.reads.fetch_add(1, Ordering::SeqCst);
        self.clock.now_micros()
    }
}

impl CountingClock {
    /// Waits until the store has read the clock `n` more times.
    async fn reads_after(&self, n: usize) {
        let target = self.reads.load(Ordering::SeqCst) + n;
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.reads.load(Ordering::SeqCst) < target {
            assert!(Instant::now() < deadline, "the lease was never renewed");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// The expiry Redis stores for the single lease it holds (its score in the
/// lease set, in the server's milliseconds).
async fn lease_expiry(server: &crate::common::RedisServer) -> f64 {
    let mut conn = server.admin().await;
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("*:lease")
        .query_async(&mut conn)
        .await
        .expect("KEYS");
    assert_eq!(keys.len(), 1, "one lease set: {keys:?}");
    let scores: Vec<(String, f64)> = redis::cmd("ZRANGE")
        .arg(&keys[0])
        .arg(0)
        .arg(-1)
        .arg("WITHSCORES")
        .query_async(&mut conn)
        .await
        .expect("ZRANGE");
    assert_eq!(scores.len(), 1, "one lease: {scores:?}");
    scores[0].1
}

/// A stream keeps its lease past the TTL it was taken with. No timing
/// margin: on Redis the lease's stored expiry must move forward; on the
/// memory store a manual clock is moved by 0.9 TTL at a time, each step
/// only once the renewer has been (its clock reads), until it stands
/// 4.5 TTLs past the acquire.
mod stream_lease_is_renewed_while_it_runs {
    use super::*;

    async fn serve_stream(
        store: std::sync::Arc<dyn fleetgate::Store>,
        ttl: Duration,
    ) -> (
        GreeterClient<tonic::transport::Channel>,
        tonic::Streaming<crate::HelloReply>,
        UnboundedReceiver<()>,
    ) {
        let policy = ConcurrencyPolicy::builder("renewed", 1)
            .lease_ttl(ttl)
            .build()
            .unwrap();
        let limiter = ConcurrencyLimiter::new(policy, store);
        let layer = ConcurrencyLimitLayer::new(limiter)
            .key(GlobalKey::new())
            .grpc();
        let (greeter, dropped) = Greeter::new();
        let addr = serve!(layer, greeter.clone());
        let mut client = GreeterClient::new(channel(addr).await);
        let mut stream = client
            .say_hello_stream(hello("ada", None))
            .await
            .expect("admitted")
            .into_inner();
        stream.message().await.expect("a reply").expect("one reply");
        (client, stream, dropped)
    }

    async fn still_held_then_released(
        mut client: GreeterClient<tonic::transport::Channel>,
        stream: tonic::Streaming<crate::HelloReply>,
        mut dropped: UnboundedReceiver<()>,
    ) {
        let status = client.say_hello(hello("bob", None)).await.unwrap_err();
        assert_eq!(
            status.code(),
            Code::ResourceExhausted,
            "the lease lapsed: {status:?}"
        );
        drop(stream);
        stream_dropped(&mut dropped).await;
        admitted_again(&mut client).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn memory() {
        let clock = CountingClock {
            clock: ManualClock::new(Duration::from_secs(1)),
            reads: std::sync::Arc::new(AtomicUsize::new(0)),
        };
        let store = fleetgate::MemoryStore::builder()
            .clock(clock.clone())
            .build();
        let ttl = Duration::from_secs(1);
        let (client, stream, dropped) = serve_stream(std::sync::Arc::new(store), ttl).await;
        for _ in 0..5 {
            clock.clock.advance(ttl * 9 / 10);
            // Two reads: the first renewal after the step has read the
            // clock, and (renewals of a lease being sequential) finished.
            clock.reads_after(2).await;
        }
        still_held_then_released(client, stream, dropped).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn redis() {
        let store = crate::TestStore::redis().await;
        let server = store.server.as_ref().expect("a redis-server");
        let (client, stream, dropped) =
            serve_stream(std::sync::Arc::clone(&store.store), Duration::from_secs(3)).await;
        let taken = lease_expiry(server).await;
        let deadline = Instant::now() + Duration::from_secs(30);
        while lease_expiry(server).await <= taken {
            assert!(Instant::now() < deadline, "the lease's expiry never moved");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // Just renewed: a TTL (3 s) of headroom for the refused call.
        still_held_then_released(client, stream, dropped).await;
    }
}

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
