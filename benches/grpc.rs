//! Whole unary gRPC calls through tonic, side by side in one run: the
//! demo's Greeter (`SayHello`) bare, and behind `RateLimitLayer` in gRPC
//! mode on the memory store and on Redis, each limiter mostly admitting
//! and mostly refusing (`RESOURCE_EXHAUSTED`, trailers-only).
//!
//! ```sh
//! cargo bench --bench grpc
//! ```
//!
//! The server runs on a single-threaded runtime pinned to CPU 0; the load
//! generator (tonic clients on one single-threaded runtime) and the
//! bench's private `redis-server` are pinned to CPU 1, the same for every
//! case. The load is `FLEETGATE_BENCH_GRPC_CONNS` HTTP/2 connections
//! (default 4), each with `FLEETGATE_BENCH_GRPC_STREAMS` calls in flight
//! (default 16), every call with the same `x-api-key`, which the layer
//! keys by: "admitted" uses a limit far above the load, "rejected" a limit
//! of one per hour.
//!
//! Each case starts a fresh server, warms up, checks with one call that it
//! answers as the case says (OK or `RESOURCE_EXHAUSTED`), then measures.
//! The CPU time of the server's thread and of the loader's over the
//! measured phase (Linux `/proc`, 10 ms ticks), divided by its calls, says
//! what a call cost each side, whichever was the bottleneck.
//! The list of cases runs `FLEETGATE_BENCH_ROUNDS` times (default 5), one
//! case after the other, so that load from elsewhere hits one round of
//! every case rather than all rounds of one; each row is the case's median
//! round by calls/s, and "x bare" is paired: the median over the rounds of
//! the case's calls/s over bare's in the same round. `FLEETGATE_BENCH_SECS`
//! and `FLEETGATE_BENCH_WARMUP` set the measured and warm-up time per round
//! (default 2 and 1 s). Without `--bench` (as `cargo test --all-targets`
//! runs it) each case runs once for a moment.

#[path = "../tests/common/redis_server.rs"]
mod redis_server;
#[path = "../tests/common/stats.rs"]
mod stats;

mod common;
#[allow(dead_code)] // only the limits: the routers are the HTTP benches'
#[path = "common/routers.rs"]
mod routers;

#[allow(dead_code)] // the bench uses a part of the generated client and server
mod pb {
    include!("../proto/fleetgate.demo.rs");
}

use std::sync::Arc;
use std::time::{Duration, Instant};

use fleetgate::key::HeaderKey;
use fleetgate::{Limiter, MemoryStore, Policy, RateLimitLayer, RedisStore, Store};
use redis::aio::MultiplexedConnection;
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Channel, Endpoint, Server};
use tonic::{Code, Request, Response, Status};

use crate::common::{BoxError, micros, percentile, pin};
use crate::pb::greeter_client::GreeterClient;
use crate::pb::greeter_server::{Greeter, GreeterServer};
use crate::pb::{HelloReply, HelloRequest};
use crate::redis_server::RedisServer;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Variant {
    Bare,
    Memory,
    Redis,
}

impl Variant {
    fn name(self) -> &'static str {
        match self {
            Variant::Bare => "bare tonic",
            Variant::Memory => "RateLimitLayer, memory",
            Variant::Redis => "RateLimitLayer, Redis",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Load {
    Admitted,
    Rejected,
}

impl Load {
    fn name(self) -> &'static str {
        match self {
            Load::Admitted => "admitted",
            Load::Rejected => "rejected",
        }
    }

    fn code(self) -> Code {
        match self {
            Load::Admitted => Code::Ok,
            Load::Rejected => Code::ResourceExhausted,
        }
    }
}

const CASES: [(Variant, Load); 5] = [
    (Variant::Bare, Load::Admitted),
    (Variant::Memory, Load::Admitted),
    (Variant::Memory, Load::Rejected),
    (Variant::Redis, Load::Admitted),
    (Variant::Redis, Load::Rejected),
];

/// The server thread's name, to find its CPU time in `/proc/self/task`
/// (at most 15 bytes: Linux cuts longer names).
const SERVER_THREAD: &str = "grpc-bench-srv";

struct Plan {
    warm_up: Duration,
    measure: Duration,
    connections: usize,
    streams: usize,
    rounds: usize,
}

/// What one round of one case measured.
#[derive(Clone, Debug)]
struct Round {
    calls: u64,
    per_sec: f64,
    p50: Duration,
    p99: Duration,
    /// Calls answered `RESOURCE_EXHAUSTED`.
    refused: u64,
    /// Calls that failed any other way (expected 0).
    failed: u64,
    /// `EVALSHA` + `EVAL` Redis ran during the measured phase.
    scripts: u64,
    /// CPU time of the server's thread during the measured phase (Linux).
    server_cpu: Option<Duration>,
    /// CPU time of the load generator's thread during the measured phase.
    loader_cpu: Option<Duration>,
}

struct Row {
    variant: Variant,
    load: Load,
    median: Round,
    /// Calls/s of each round, in the order the rounds ran.
    rounds: Vec<f64>,
    server_cpu: Option<Duration>,
    loader_cpu: Option<Duration>,
}

#[derive(Default)]
struct Greetings;

#[tonic::async_trait]
impl Greeter for Greetings {
    async fn say_hello(
        &self,
        request: Request<HelloRequest>,
    ) -> Result<Response<HelloReply>, Status> {
        Ok(Response::new(HelloReply {
            message: format!("Hello, {}!", request.into_inner().name),
        }))
    }

    type SayHelloStreamStream = tonic::codegen::tokio_stream::Empty<Result<HelloReply, Status>>;

    async fn say_hello_stream(
        &self,
        _request: Request<HelloRequest>,
    ) -> Result<Response<Self::SayHelloStreamStream>, Status> {
        Ok(Response::new(tonic::codegen::tokio_stream::empty()))
    }
}

fn main() -> Result<(), BoxError> {
    let plan = if common::measuring() {
        Plan {
            warm_up: common::secs("FLEETGATE_BENCH_WARMUP", 1.0),
            measure: common::secs("FLEETGATE_BENCH_SECS", 2.0),
            connections: common::count("FLEETGATE_BENCH_GRPC_CONNS", 4),
            streams: common::count("FLEETGATE_BENCH_GRPC_STREAMS", 16),
            rounds: common::count("FLEETGATE_BENCH_ROUNDS", 5),
        }
    } else {
        Plan {
            warm_up: Duration::from_millis(10),
            measure: Duration::from_millis(100),
            connections: 1,
            streams: 4,
            rounds: 1,
        }
    };
    // Redis and the loader on CPU 1; the server pins its own thread to 0.
    pin(1);
    let server = RedisServer::start();
    let admin_rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let mut admin = admin_rt.block_on(server.client().get_multiplexed_async_connection())?;
    let version = admin_rt.block_on(common::redis_version(&mut admin))?;

    let mut rounds: Vec<Vec<Round>> = vec![Vec::new(); CASES.len()];
    for round in 0..plan.rounds {
        for (i, &(variant, load)) in CASES.iter().enumerate() {
            let measured = run_case(&server, &admin_rt, &mut admin, &plan, variant, load, i)?;
            eprintln!(
                "round {}: {:<24} {:<8} {:>8.0} calls/s  p50 {:>6.0} µs  p99 {:>6.0} µs  refused {}  failed {}  scripts {}",
                round + 1,
                variant.name(),
                load.name(),
                measured.per_sec,
                micros(measured.p50),
                micros(measured.p99),
                measured.refused,
                measured.failed,
                measured.scripts,
            );
            rounds[i].push(measured);
        }
    }
    let rows: Vec<Row> = CASES
        .into_iter()
        .zip(rounds)
        .map(|((variant, load), mut rounds)| {
            let median_cpu = |cpu: fn(&Round) -> Option<Duration>| {
                let mut per_call: Vec<Duration> =
                    rounds.iter().filter_map(|r| per_call(r, cpu(r))).collect();
                per_call.sort_unstable();
                per_call.get(per_call.len() / 2).copied()
            };
            let server_cpu = median_cpu(|r| r.server_cpu);
            let loader_cpu = median_cpu(|r| r.loader_cpu);
            let per_round = rounds.iter().map(|r| r.per_sec).collect();
            rounds.sort_by(|a, b| a.per_sec.total_cmp(&b.per_sec));
            Row {
                variant,
                load,
                median: rounds[rounds.len() / 2].clone(),
                rounds: per_round,
                server_cpu,
                loader_cpu,
            }
        })
        .collect();
    print_table(&rows, &plan, &version);
    Ok(())
}

fn per_call(round: &Round, cpu: Option<Duration>) -> Option<Duration> {
    let calls = u32::try_from(round.calls.max(1)).unwrap_or(u32::MAX);
    cpu.map(|cpu| cpu / calls)
}

fn run_case(
    redis: &RedisServer,
    admin_rt: &tokio::runtime::Runtime,
    admin: &mut MultiplexedConnection,
    plan: &Plan,
    variant: Variant,
    load: Load,
    index: usize,
) -> Result<Round, BoxError> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    listener.set_nonblocking(true)?;
    let addr = listener.local_addr()?;
    let url = redis.url();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Result<(), String>>();
    let server = std::thread::Builder::new()
        .name(SERVER_THREAD.into())
        .spawn(move || -> Result<(), String> {
            pin(0);
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| e.to_string())?;
            rt.block_on(async move {
                let listener =
                    tokio::net::TcpListener::from_std(listener).map_err(|e| e.to_string())?;
                let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
                let stopped = async {
                    let _ = stop_rx.await;
                };
                let greeter = GreeterServer::new(Greetings);
                let served = if variant == Variant::Bare {
                    let _ = ready_tx.send(Ok(()));
                    Server::builder()
                        .add_service(greeter)
                        .serve_with_incoming_shutdown(incoming, stopped)
                        .await
                } else {
                    let layer = match layer(variant, load, &url, index).await {
                        Ok(layer) => layer,
                        Err(e) => {
                            let _ = ready_tx.send(Err(e.to_string()));
                            return Ok(());
                        }
                    };
                    let _ = ready_tx.send(Ok(()));
                    Server::builder()
                        .layer(layer)
                        .add_service(greeter)
                        .serve_with_incoming_shutdown(incoming, stopped)
                        .await
                };
                served.map_err(|e| e.to_string())
            })
        })?;
    ready_rx.recv()??;

    let result = measure_case(admin_rt, admin, plan, addr, load);
    let _ = stop_tx.send(());
    server.join().map_err(|_| "server thread panicked")??;
    result
}

/// The layer of a limited case: keyed by `x-api-key`, gRPC refusals, the
/// limit of the HTTP bench's cases.
async fn layer(
    variant: Variant,
    load: Load,
    redis_url: &str,
    index: usize,
) -> Result<RateLimitLayer<HeaderKey>, BoxError> {
    let policy = Policy::single(
        format!("grpc-bench{index}"),
        routers::limit(load == Load::Rejected)?,
    )?;
    let store: Arc<dyn Store> = match variant {
        Variant::Redis => Arc::new(
            RedisStore::builder(redis_url)
                .prefix("grpc-bench")
                .timeout(Duration::from_secs(1))
                .connect()
                .await?,
        ),
        _ => Arc::new(MemoryStore::new()),
    };
    Ok(RateLimitLayer::new(Limiter::new(policy, store))
        .key(HeaderKey::new("x-api-key"))
        .grpc())
}

/// Warm-up, one call checked for the case's status, then the measured
/// load between Redis' counter reset and read. The load runs on a runtime
/// of its own, dropped at the end, which closes its connections (the
/// server's graceful shutdown waits for them).
fn measure_case(
    admin_rt: &tokio::runtime::Runtime,
    admin: &mut MultiplexedConnection,
    plan: &Plan,
    addr: std::net::SocketAddr,
    load: Load,
) -> Result<Round, BoxError> {
    let loader_rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let channels = loader_rt.block_on(connect(addr, plan.connections))?;
    loader_rt.block_on(generate(&channels, plan.streams, plan.warm_up))?;
    let mut probe = GreeterClient::new(channels[0].clone());
    let code = match loader_rt.block_on(probe.say_hello(call())) {
        Ok(_) => Code::Ok,
        Err(status) => status.code(),
    };
    if code != load.code() {
        return Err(format!("expected {:?} after the warm-up, got {code:?}", load.code()).into());
    }
    admin_rt.block_on(stats::reset_stats(admin));
    let server_before = common::thread_cpu_time(SERVER_THREAD);
    let loader_before = common::own_thread_cpu_time();
    let mut round = loader_rt.block_on(generate(&channels, plan.streams, plan.measure))?;
    round.server_cpu = common::cpu_delta(server_before, common::thread_cpu_time(SERVER_THREAD));
    round.loader_cpu = common::cpu_delta(loader_before, common::own_thread_cpu_time());
    round.scripts = admin_rt.block_on(stats::script_calls(admin));
    Ok(round)
}

/// `count` HTTP/2 connections to the server.
async fn connect(addr: std::net::SocketAddr, count: usize) -> Result<Vec<Channel>, BoxError> {
    let endpoint = Endpoint::from_shared(format!("http://{addr}"))?.tcp_nodelay(true);
    let mut channels = Vec::with_capacity(count);
    for _ in 0..count {
        channels.push(endpoint.connect().await?);
    }
    Ok(channels)
}

/// Every call: the same name and API key.
fn call() -> Request<HelloRequest> {
    let mut request = Request::new(HelloRequest {
        name: "bench".into(),
    });
    request.metadata_mut().insert(
        "x-api-key",
        tonic::metadata::MetadataValue::from_static("bench"),
    );
    request
}

/// `streams` calls in flight on each channel, one after the other on each
/// stream, for `duration`.
async fn generate(
    channels: &[Channel],
    streams: usize,
    duration: Duration,
) -> Result<Round, BoxError> {
    let start = Instant::now();
    let end = start + duration;
    let mut tasks = tokio::task::JoinSet::new();
    for channel in channels {
        for _ in 0..streams {
            let mut client = GreeterClient::new(channel.clone());
            tasks.spawn(async move {
                let mut latencies = Vec::with_capacity(1 << 14);
                let (mut refused, mut failed) = (0u64, 0u64);
                loop {
                    let sent = Instant::now();
                    if sent >= end {
                        break;
                    }
                    match client.say_hello(call()).await {
                        Ok(_) => {}
                        Err(status) if status.code() == Code::ResourceExhausted => refused += 1,
                        Err(_) => failed += 1,
                    }
                    latencies.push(sent.elapsed());
                }
                (latencies, refused, failed)
            });
        }
    }
    let mut latencies = Vec::new();
    let (mut refused, mut failed) = (0, 0);
    while let Some(joined) = tasks.join_next().await {
        let (lat, r, f) = joined.map_err(|e| e.to_string())?;
        latencies.extend(lat);
        refused += r;
        failed += f;
    }
    let took = start.elapsed();
    latencies.sort_unstable();
    Ok(Round {
        calls: latencies.len() as u64,
        per_sec: latencies.len() as f64 / took.as_secs_f64(),
        p50: percentile(&latencies, 0.50),
        p99: percentile(&latencies, 0.99),
        refused,
        failed,
        scripts: 0,
        server_cpu: None,
        loader_cpu: None,
    })
}

/// The median of `a[i] / b[i]` over the rounds: the two cases of a round
/// ran seconds apart, under the same load from elsewhere.
fn paired(a: &[f64], b: &[f64]) -> f64 {
    let mut ratios: Vec<f64> = a
        .iter()
        .zip(b)
        .filter(|(_, b)| **b > 0.0)
        .map(|(a, b)| a / b)
        .collect();
    ratios.sort_by(f64::total_cmp);
    ratios.get(ratios.len() / 2).copied().unwrap_or(0.0)
}

fn print_table(rows: &[Row], plan: &Plan, redis_version: &str) {
    let bare = rows
        .iter()
        .find(|r| r.variant == Variant::Bare)
        .map_or(&[][..], |r| &r.rounds[..]);
    println!(
        "\n### gRPC: unary calls through tonic\n\n\
         The bench's tonic load generator, {} HTTP/2 connections x {} calls in flight; \
         {:?} warm-up and {:?} measured per round, {} rounds (each row: the median round \
         by calls/s; x bare: paired, the median of the rounds' ratios); server pinned to \
         CPU 0, load and redis-server {redis_version} to CPU 1.\n",
        plan.connections, plan.streams, plan.warm_up, plan.measure, plan.rounds,
    );
    println!(
        "| case | load | calls/s | x bare | p50 µs | p99 µs | server CPU µs / call | loader CPU µs / call | calls | refused | failed | Redis scripts / call | calls/s of each round |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|");
    for r in rows {
        let m = &r.median;
        let each: Vec<String> = r.rounds.iter().map(|x| format!("{x:.0}")).collect();
        println!(
            "| {} | {} | {:.0} | {:.2} | {:.0} | {:.0} | {} | {} | {} | {} | {} | {:.3} | {} |",
            r.variant.name(),
            r.load.name(),
            m.per_sec,
            paired(&r.rounds, bare),
            micros(m.p50),
            micros(m.p99),
            cpu_cell(r.server_cpu),
            cpu_cell(r.loader_cpu),
            m.calls,
            m.refused,
            m.failed,
            m.scripts as f64 / m.calls.max(1) as f64,
            each.join(", "),
        );
    }
}

fn cpu_cell(cpu: Option<Duration>) -> String {
    cpu.map_or("-".to_owned(), |cpu| format!("{:.1}", micros(cpu)))
}
