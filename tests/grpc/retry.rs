//! `fleetgate::grpc::retry` against a real tonic server that answers
//! `UNAVAILABLE`: retries wait the server's pushback, stop when it says
//! never, and stop when the budget is spent.
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use fleetgate::MemoryStore;
use fleetgate::clock::ManualClock;
use fleetgate::rate_limit::RetryBudget;
use tonic::{Code, Request, Response, Status};

use crate::pb::greeter_server::Greeter;
use crate::{GreeterClient, GreeterServer, HeldStream, HelloReply, HelloRequest, channel, hello};

/// Answers `UNAVAILABLE` with a pushback of `pushback_ms` (none when
/// `i64::MIN`) to the first `failures` calls, then greets.
#[derive(Clone)]
struct Flaky {
    failures: usize,
    pushback_ms: Arc<AtomicI64>,
    calls: Arc<AtomicUsize>,
}

#[tonic::async_trait]
impl Greeter for Flaky {
    async fn say_hello(
        &self,
        request: Request<HelloRequest>,
    ) -> Result<Response<HelloReply>, Status> {
        if self.calls.fetch_add(1, Ordering::SeqCst) < self.failures {
            let mut status = Status::unavailable("overloaded");
            let ms = self.pushback_ms.load(Ordering::SeqCst);
            if ms != i64::MIN {
                status
                    .metadata_mut()
                    .insert("grpc-retry-pushback-ms", ms.to_string().parse().unwrap());
            }
            return Err(status);
        }
        let message = format!("Hello {}!", request.into_inner().name);
        Ok(Response::new(HelloReply { message }))
    }

    type SayHelloStreamStream = HeldStream;

    async fn say_hello_stream(
        &self,
        _: Request<HelloRequest>,
    ) -> Result<Response<HeldStream>, Status> {
        Err(Status::unimplemented("not here"))
    }
}

async fn flaky(
    failures: usize,
    pushback_ms: i64,
) -> (GreeterClient<tonic::transport::Channel>, Flaky) {
    let server = Flaky {
        failures,
        pushback_ms: Arc::new(AtomicI64::new(pushback_ms)),
        calls: Arc::new(AtomicUsize::new(0)),
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let router =
        tonic::transport::Server::builder().add_service(GreeterServer::new(server.clone()));
    tokio::spawn(router.serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener)));
    (GreeterClient::new(channel(addr).await), server)
}

/// A budget of `min_per_second` retries and no more: its store's clock
/// stands still.
fn budget_of(min_per_second: u32) -> RetryBudget {
    let clock = ManualClock::new(Duration::from_secs(1000));
    RetryBudget::new(Arc::new(MemoryStore::builder().clock(clock).build()))
        .ratio(0.0)
        .min_per_second(min_per_second)
        .build("greeter")
        .unwrap()
}

#[tokio::test]
async fn unavailable_is_retried_after_the_servers_pushback() {
    let (client, server) = flaky(2, 150).await;
    let budget = budget_of(10);
    let started = Instant::now();
    let reply = fleetgate::grpc::retry(&budget, 3, || {
        let mut client = client.clone();
        async move { client.say_hello(hello("a", None)).await }
    })
    .await
    .expect("the third call succeeds");
    assert_eq!(reply.into_inner().message, "Hello a!");
    assert_eq!(server.calls.load(Ordering::SeqCst), 3);
    // Two pushbacks of 150 ms waited.
    assert!(
        started.elapsed() >= Duration::from_millis(300),
        "{:?}",
        started.elapsed()
    );
    let stats = budget.stats();
    assert_eq!((stats.first_attempts, stats.retries), (1, 2));
}

#[tokio::test]
async fn a_negative_pushback_or_an_empty_budget_stops_the_retries() {
    // The server says never: one call, no token spent.
    let (client, server) = flaky(5, -1).await;
    let budget = budget_of(10);
    let status = fleetgate::grpc::retry(&budget, 3, || {
        let mut client = client.clone();
        async move { client.say_hello(hello("a", None)).await }
    })
    .await
    .unwrap_err();
    assert_eq!(status.code(), Code::Unavailable);
    assert_eq!(server.calls.load(Ordering::SeqCst), 1);
    assert_eq!(budget.stats().retries, 0);

    // No pushback, a budget of 2 retries: three calls, then the status.
    let (client, server) = flaky(10, i64::MIN).await;
    let budget = budget_of(2);
    let status = fleetgate::grpc::retry(&budget, 5, || {
        let mut client = client.clone();
        async move { client.say_hello(hello("a", None)).await }
    })
    .await
    .unwrap_err();
    assert_eq!(status.code(), Code::Unavailable);
    assert_eq!(server.calls.load(Ordering::SeqCst), 3);
    let stats = budget.stats();
    assert_eq!((stats.retries, stats.refused), (2, 1));
}
