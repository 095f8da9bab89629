//! The layers around a real tonic server and client over loopback, on both
//! stores (memory, and a private redis-server): gRPC refusals and their
//! retry hints (`refusals`), keys from metadata and the peer, per-method
//! policies and tiers (`methods`), stream leases (`streams`), and a
//! client's pause on a server's pushback (`outbound`).
#[path = "../common/mod.rs"]
mod common;

mod methods;
mod outbound;
mod refusals;
mod retry;
mod streams;

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};

use fleetgate::Limiter;
use fleetgate::spec::PolicySpec;
use tokio::sync::mpsc;
use tonic::codegen::tokio_stream::Stream;
use tonic::transport::Channel;
use tonic::{Request, Response, Status};

use common::RedisServer;

#[allow(dead_code)]
mod pb {
    include!("../../proto/fleetgate.demo.rs");
}

pub(crate) use pb::greeter_client::GreeterClient;
pub(crate) use pb::greeter_server::GreeterServer;
pub(crate) use pb::{HelloReply, HelloRequest};

/// A store for one test: the memory store, or a store on the test's own
/// redis-server (stopped when this is dropped).
pub(crate) struct TestStore {
    pub(crate) store: Arc<dyn fleetgate::Store>,
    pub(crate) server: Option<RedisServer>,
}

impl TestStore {
    pub(crate) fn memory() -> TestStore {
        TestStore {
            store: Arc::new(fleetgate::MemoryStore::new()),
            server: None,
        }
    }

    pub(crate) async fn redis() -> TestStore {
        let server = RedisServer::start();
        let store = common::redis_store(&server).await;
        TestStore {
            store: Arc::new(store),
            server: Some(server),
        }
    }

    /// A limiter of `spec` (`"5/s"`, `"1/min burst 2"`) named `name`.
    pub(crate) fn limiter(&self, name: &str, spec: &str) -> Limiter {
        let policy = spec
            .parse::<PolicySpec>()
            .expect("a valid spec")
            .build(name)
            .expect("a valid policy");
        Limiter::new(policy, Arc::clone(&self.store))
    }
}

/// Runs a test body (`async fn run(store: TestStore)` in a module named
/// after the test) once on each store: `<name>::memory`, `<name>::redis`.
macro_rules! on_both_stores {
    ($name:ident, $store:ident => $body:block) => {
        mod $name {
            #[allow(unused_imports)]
            use super::*;

            async fn run($store: crate::TestStore) $body

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn memory() {
                run(crate::TestStore::memory()).await
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn redis() {
                run(crate::TestStore::redis().await).await
            }
        }
    };
}
pub(crate) use on_both_stores;

/// The greeter the tests serve: counts the calls that reach it, and tells
/// when a reply stream it handed out is dropped.
#[derive(Clone)]
pub(crate) struct Greeter {
    pub(crate) calls: Arc<AtomicUsize>,
    dropped: mpsc::UnboundedSender<()>,
}

impl Greeter {
    /// A greeter, and the receiver of one message per dropped stream.
    pub(crate) fn new() -> (Greeter, mpsc::UnboundedReceiver<()>) {
        let (dropped, rx) = mpsc::unbounded_channel();
        let greeter = Greeter {
            calls: Arc::new(AtomicUsize::new(0)),
            dropped,
        };
        (greeter, rx)
    }

    pub(crate) fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }
}

/// A reply stream that sends one reply, then ends with `then` if set (a
/// status in the trailers), else stays open until the client cancels it;
/// dropping it sends on `dropped`.
pub(crate) struct HeldStream {
    first: Option<HelloReply>,
    then: Option<Status>,
    dropped: mpsc::UnboundedSender<()>,
}

impl Stream for HeldStream {
    type Item = Result<HelloReply, Status>;

    fn poll_next(mut self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if let Some(reply) = self.first.take() {
            return Poll::Ready(Some(Ok(reply)));
        }
        match self.then.take() {
            Some(status) => Poll::Ready(Some(Err(status))),
            None => Poll::Pending,
        }
    }
}

impl Drop for HeldStream {
    fn drop(&mut self) {
        let _ = self.dropped.send(());
    }
}

#[tonic::async_trait]
impl pb::greeter_server::Greeter for Greeter {
    async fn say_hello(
        &self,
        request: Request<HelloRequest>,
    ) -> Result<Response<HelloReply>, Status> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let message = format!("Hello {}!", request.into_inner().name);
        Ok(Response::new(HelloReply { message }))
    }

    type SayHelloStreamStream = HeldStream;

    async fn say_hello_stream(
        &self,
        request: Request<HelloRequest>,
    ) -> Result<Response<HeldStream>, Status> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let name = request.into_inner().name;
        // `exhaust`: one reply, then RESOURCE_EXHAUSTED with a pushback of
        // a minute, sent in the trailers.
        let then = (name == "exhaust").then(|| {
            let mut status = Status::resource_exhausted("slow down");
            status
                .metadata_mut()
                .insert("grpc-retry-pushback-ms", 60_000.into());
            status
        });
        Ok(Response::new(HeldStream {
            first: Some(HelloReply {
                message: format!("Hello {name}!"),
            }),
            then,
            dropped: self.dropped.clone(),
        }))
    }
}

/// Serves `greeter` behind `layer` on a free loopback port, in a task that
/// ends with the test's runtime, and returns its address.
macro_rules! serve {
    ($layer:expr, $greeter:expr) => {{
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind a loopback port");
        let addr = listener.local_addr().expect("the bound address");
        let server = tonic::transport::Server::builder()
            .layer($layer)
            .add_service(crate::GreeterServer::new($greeter));
        tokio::spawn(
            server.serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener)),
        );
        addr
    }};
}
pub(crate) use serve;

/// A channel to the server at `addr`.
pub(crate) async fn channel(addr: SocketAddr) -> Channel {
    Channel::from_shared(format!("http://{addr}"))
        .expect("a valid URI")
        .connect()
        .await
        .expect("connect to the test's server")
}

/// A `SayHello` call carrying `x-api-key: api_key`, if given.
pub(crate) fn hello(name: &str, api_key: Option<&str>) -> Request<HelloRequest> {
    let mut request = Request::new(HelloRequest {
        name: name.to_owned(),
    });
    if let Some(key) = api_key {
        request
            .metadata_mut()
            .insert("x-api-key", key.parse().expect("ASCII metadata"));
    }
    request
}

/// The text of metadata `name` of a refused call's status.
pub(crate) fn meta<'a>(status: &'a Status, name: &str) -> &'a str {
    status
        .metadata()
        .get(name)
        .unwrap_or_else(|| panic!("no {name} in {status:?}"))
        .to_str()
        .expect("ASCII metadata")
}

/// `grpc-retry-pushback-ms` of a refused call.
pub(crate) fn pushback_ms(status: &Status) -> i64 {
    meta(status, "grpc-retry-pushback-ms")
        .parse()
        .expect("an integer pushback")
}

/// The `google.rpc.RetryInfo` delay in a status's details
/// (`grpc-status-details-bin`), decoded with prost: an independent reading
/// of what the layer wrote by hand.
pub(crate) fn retry_delay(status: &Status) -> Option<std::time::Duration> {
    use prost::Message;

    #[derive(Clone, PartialEq, prost::Message)]
    struct RpcStatus {
        #[prost(int32, tag = "1")]
        code: i32,
        #[prost(string, tag = "2")]
        message: String,
        #[prost(message, repeated, tag = "3")]
        details: Vec<prost_types_any::Any>,
    }
    mod prost_types_any {
        #[derive(Clone, PartialEq, prost::Message)]
        pub struct Any {
            #[prost(string, tag = "1")]
            pub type_url: String,
            #[prost(bytes = "vec", tag = "2")]
            pub value: Vec<u8>,
        }
    }
    #[derive(Clone, PartialEq, prost::Message)]
    struct RetryInfo {
        #[prost(message, optional, tag = "1")]
        retry_delay: Option<ProtoDuration>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    struct ProtoDuration {
        #[prost(int64, tag = "1")]
        seconds: i64,
        #[prost(int32, tag = "2")]
        nanos: i32,
    }

    let decoded = RpcStatus::decode(status.details()).ok()?;
    assert_eq!(
        decoded.code,
        status.code() as i32,
        "details repeat the code"
    );
    assert_eq!(
        decoded.message,
        status.message(),
        "details repeat the message"
    );
    let any = decoded.details.first()?;
    assert_eq!(any.type_url, "type.googleapis.com/google.rpc.RetryInfo");
    let delay = RetryInfo::decode(&any.value[..]).ok()?.retry_delay?;
    Some(
        std::time::Duration::from_secs(u64::try_from(delay.seconds).ok()?)
            + std::time::Duration::from_nanos(u64::try_from(delay.nanos).ok()?),
    )
}
