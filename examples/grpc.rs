//! The gRPC demo: a tonic server whose calls are rate limited by fleetgate.
//!
//! ```text
//! cargo run --example grpc                                  # in-process store
//! REDIS_URL=redis://127.0.0.1:6379 cargo run --example grpc # shared through Redis
//! cargo run --example grpc_client                           # 8 quick calls
//! ```
//!
//! It serves `fleetgate.demo.Greeter` (`proto/greeter.proto`; the Rust
//! generated from it is committed beside it) and gRPC health checking
//! (`grpc.health.v1.Health`). Each Greeter call is limited per `x-api-key`
//! metadata (hashed), or per peer IP without one, to a burst of 5
//! refilling 1 per second: the sixth quick call gets `RESOURCE_EXHAUSTED`
//! with `grpc-retry-pushback-ms`, the wait before a call would pass.
//! Health checks are never limited. Any `x-api-key` value is an identity
//! here, so a client could multiply its budget by inventing keys: a real
//! server keys by the identity its authentication verified (README, "Key
//! by what a client cannot choose").
//!
//! Environment:
//! - `FLEETGATE_GRPC_ADDR`: listen address (default `127.0.0.1:50051`).
//! - `REDIS_URL`: when set, limits live in that Redis, so every instance
//!   pointed at it shares the same counts (the demo starts while Redis is
//!   down and connects in the background; calls pass unlimited meanwhile).
//! - `RUST_LOG`: log filter (default `info`; `fleetgate=debug` shows denials).
//!
//! On SIGTERM or SIGINT (Ctrl-C) it stops accepting calls, lets those in
//! flight finish and exits with status 0.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use fleetgate::key::{HeaderKey, PeerIp};
use fleetgate::rate_limit::RoutePolicies;
use fleetgate::{Limit, Limiter, MemoryStore, Policy, Rate, RateLimitLayer, RedisStore, Store};
use tonic::codegen::tokio_stream;
use tonic::transport::Server;
use tonic::transport::server::TcpIncoming;
use tonic::{Request, Response, Status};
use tracing_subscriber::EnvFilter;

#[path = "common/shutdown.rs"]
mod shutdown;

#[allow(dead_code)] // the client half of the generated code is the client example's
mod pb {
    include!("../proto/fleetgate.demo.rs");
}
use pb::greeter_server::{Greeter, GreeterServer};
use pb::{HelloReply, HelloRequest};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Replies to `SayHelloStream` calls: enough to show a stream, few enough
/// to read.
const STREAM_REPLIES: usize = 3;

#[derive(Default)]
struct Greetings;

#[tonic::async_trait]
impl Greeter for Greetings {
    async fn say_hello(
        &self,
        request: Request<HelloRequest>,
    ) -> Result<Response<HelloReply>, Status> {
        Ok(Response::new(HelloReply {
            message: greeting(&request.into_inner().name),
        }))
    }

    type SayHelloStreamStream = tokio_stream::Iter<std::vec::IntoIter<Result<HelloReply, Status>>>;

    async fn say_hello_stream(
        &self,
        request: Request<HelloRequest>,
    ) -> Result<Response<Self::SayHelloStreamStream>, Status> {
        let greeting = greeting(&request.into_inner().name);
        let replies = (1..=STREAM_REPLIES)
            .map(|i| {
                Ok(HelloReply {
                    message: format!("{greeting} ({i}/{STREAM_REPLIES})"),
                })
            })
            .collect::<Vec<_>>();
        Ok(Response::new(tokio_stream::iter(replies)))
    }
}

fn greeting(name: &str) -> String {
    // The name is the caller's: a bounded echo of it, whatever it sent.
    let name: String = name.chars().take(64).collect();
    if name.is_empty() {
        "Hello!".to_owned()
    } else {
        format!("Hello, {name}!")
    }
}

/// Errors are printed as their messages, and the exit status says whether
/// the demo failed.
fn main() -> ExitCode {
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("Error: tokio runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("Error: {err}");
            ExitCode::FAILURE
        }
    }
}

async fn run() -> Result<(), BoxError> {
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .init();

    let addr: SocketAddr = std::env::var("FLEETGATE_GRPC_ADDR")
        .unwrap_or_else(|_| "127.0.0.1:50051".into())
        .parse()
        .map_err(|err| format!("FLEETGATE_GRPC_ADDR: {err}"))?;

    let (store, store_name): (Arc<dyn Store>, String) = match std::env::var("REDIS_URL") {
        Ok(url) if !url.is_empty() => {
            // Lazy: the demo serves while Redis is down, and connects (and
            // reconnects) in the background.
            let store = RedisStore::builder(&url)
                .prefix("fleetgate-grpc-demo")
                .timeout(Duration::from_millis(50))
                .lazy()
                .connect()
                .await
                .map_err(|err| format!("REDIS_URL: {err}"))?;
            (Arc::new(store), "redis".to_owned())
        }
        _ => (Arc::new(MemoryStore::new()), "memory".to_owned()),
    };

    let hello = Policy::single(
        "hello",
        Limit::builder(Rate::per_second(1)).burst(5).build()?,
    )?;
    // Every Greeter method shares one budget per caller; health checks and
    // reflection match no rule, so they are never limited.
    let routes = RoutePolicies::new().route(
        None,
        "/fleetgate.demo.Greeter/*",
        Limiter::new(hello, store),
    )?;
    let limit = RateLimitLayer::per_route(routes)?
        .key(HeaderKey::new("x-api-key").or(PeerIp))
        .grpc();

    let (health, health_service) = tonic_health::server::health_reporter();
    health.set_serving::<GreeterServer<Greetings>>().await;

    let incoming =
        TcpIncoming::bind(addr).map_err(|err| format!("FLEETGATE_GRPC_ADDR {addr}: {err}"))?;
    let bound = incoming.local_addr()?;
    println!("fleetgate gRPC demo listening on {bound} (store: {store_name})");
    Server::builder()
        .layer(limit)
        .add_service(health_service)
        .add_service(GreeterServer::new(Greetings))
        .serve_with_incoming_shutdown(incoming, async {
            let signal = shutdown::shutdown_signal().await;
            println!("{signal}: draining in-flight calls");
        })
        .await?;
    println!("fleetgate gRPC demo stopped");
    Ok(())
}
