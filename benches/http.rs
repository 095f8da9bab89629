//! Whole-request cost of a limiter, side by side in one run: an axum
//! hello-world bare, behind `RateLimitLayer` on the memory store, behind
//! tower_governor with the same limit, behind `RateLimitLayer` on Redis,
//! and behind a minimal hand-written middleware that does one `EVALSHA` of
//! the same GCRA script per request (the floor for any Redis limiter). Each
//! limiter runs mostly admitting and mostly rejecting.
//!
//! ```sh
//! cargo bench --bench http
//! ```
//!
//! The server runs on a single-threaded runtime pinned to CPU 0; the load
//! generator (64 keep-alive HTTP/1.1 connections, one request in flight on
//! each) and the private `redis-server` share CPU 1. Every client comes
//! from 127.0.0.1, so peer-IP keying puts all load on one key: "admitted"
//! uses a limit far above the load, "rejected" a limit of one per hour.
//! `FLEETGATE_BENCH_SECS` sets the measured time per case (default 3),
//! `FLEETGATE_BENCH_CONNS` the connections (default 64). Without `--bench`
//! (as `cargo test --all-targets` runs it) each case runs for a moment only.

#[path = "../tests/common/redis_server.rs"]
mod redis_server;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::{ConnectInfo, Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use fleetgate::{Limit, Limiter, MemoryStore, Policy, Rate, RateLimitLayer, RedisStore};
use http::StatusCode;
use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use redis::aio::ConnectionManager;
use tower_governor::GovernorLayer;
use tower_governor::governor::GovernorConfigBuilder;

use crate::redis_server::RedisServer;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const GCRA_LUA: &str = include_str!("../lua/gcra.lua");

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Variant {
    Bare,
    Memory,
    Governor,
    Redis,
    Evalsha,
}

impl Variant {
    fn name(self) -> &'static str {
        match self {
            Variant::Bare => "bare axum",
            Variant::Memory => "RateLimitLayer, memory",
            Variant::Governor => "tower_governor",
            Variant::Redis => "RateLimitLayer, Redis",
            Variant::Evalsha => "hand-written EVALSHA middleware",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Load {
    Admitted,
    Rejected,
}

struct Plan {
    warm_up: Duration,
    measure: Duration,
    connections: usize,
}

struct Row {
    variant: Variant,
    load: Option<Load>,
    per_sec: f64,
    p50: Duration,
    p99: Duration,
    ok: u64,
    limited: u64,
    other: u64,
}

fn main() -> Result<(), BoxError> {
    let bench = std::env::args().any(|a| a == "--bench");
    let env_num = |name: &str| std::env::var(name).ok().and_then(|s| s.parse::<f64>().ok());
    let plan = if bench {
        Plan {
            warm_up: Duration::from_millis(500),
            measure: Duration::from_secs_f64(env_num("FLEETGATE_BENCH_SECS").unwrap_or(3.0)),
            connections: env_num("FLEETGATE_BENCH_CONNS").map_or(64, |n| n.max(1.0) as usize),
        }
    } else {
        Plan {
            warm_up: Duration::from_millis(10),
            measure: Duration::from_millis(100),
            connections: 4,
        }
    };
    let server = RedisServer::start();
    let cases = [
        (Variant::Bare, None),
        (Variant::Memory, Some(Load::Admitted)),
        (Variant::Memory, Some(Load::Rejected)),
        (Variant::Governor, Some(Load::Admitted)),
        (Variant::Governor, Some(Load::Rejected)),
        (Variant::Redis, Some(Load::Admitted)),
        (Variant::Redis, Some(Load::Rejected)),
        (Variant::Evalsha, Some(Load::Admitted)),
        (Variant::Evalsha, Some(Load::Rejected)),
    ];
    let mut rows = Vec::new();
    for (i, (variant, load)) in cases.into_iter().enumerate() {
        let row = run_case(&server, &plan, variant, load, i)?;
        eprintln!(
            "{:<34} {:<9} {:>9.0} req/s  p50 {:>6} µs  p99 {:>6} µs",
            variant.name(),
            load.map_or("-", load_name),
            row.per_sec,
            row.p50.as_micros(),
            row.p99.as_micros()
        );
        rows.push(row);
    }
    print_table(&rows, &plan);
    Ok(())
}

fn load_name(load: Load) -> &'static str {
    match load {
        Load::Admitted => "admitted",
        Load::Rejected => "rejected",
    }
}

/// Pins the calling thread to `cpu`, if the machine has it; a no-op where
/// affinity cannot be set.
fn pin(cpu: usize) {
    let mut set = nix::sched::CpuSet::new();
    if set.set(cpu).is_ok() {
        let _ = nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set);
    }
}

fn run_case(
    redis: &RedisServer,
    plan: &Plan,
    variant: Variant,
    load: Option<Load>,
    index: usize,
) -> Result<Row, BoxError> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    listener.set_nonblocking(true)?;
    let addr = listener.local_addr()?;
    let url = redis.url();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Result<(), String>>();
    let server = std::thread::spawn(move || -> Result<(), String> {
        pin(0);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        rt.block_on(async move {
            let app = match app(variant, load, &url, index).await {
                Ok(app) => app,
                Err(e) => {
                    let _ = ready_tx.send(Err(e.to_string()));
                    return Ok(());
                }
            };
            let listener =
                tokio::net::TcpListener::from_std(listener).map_err(|e| e.to_string())?;
            let _ = ready_tx.send(Ok(()));
            axum::serve(
                listener,
                app.into_make_service_with_connect_info::<SocketAddr>(),
            )
            .with_graceful_shutdown(async {
                let _ = stop_rx.await;
            })
            .await
            .map_err(|e| e.to_string())
        })
    });
    ready_rx.recv()??;

    pin(1);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let result = rt.block_on(generate(addr, plan));
    let _ = stop_tx.send(());
    // Open connections end when the runtime that drives them is dropped.
    drop(rt);
    server.join().map_err(|_| "server thread panicked")??;
    let (mut latencies, ok, limited, other, took) = result?;
    latencies.sort_unstable();
    let requests = latencies.len() as f64;
    Ok(Row {
        variant,
        load,
        per_sec: requests / took.as_secs_f64(),
        p50: percentile(&latencies, 0.50),
        p99: percentile(&latencies, 0.99),
        ok,
        limited,
        other,
    })
}

async fn app(
    variant: Variant,
    load: Option<Load>,
    redis_url: &str,
    index: usize,
) -> Result<Router, BoxError> {
    let router = Router::new().route("/", get(|| async { "hello, world" }));
    let rejected = load == Some(Load::Rejected);
    // Admitted: far above any load this machine can make. Rejected: one
    // per hour, so all but the first request are refused.
    let limit = if rejected {
        Limit::builder(Rate::per_hour(1)).burst(1).build()?
    } else {
        Limit::builder(Rate::per_second(1_000_000))
            .burst(1_000_000_000)
            .build()?
    };
    let policy = Policy::single(format!("bench{index}"), limit.clone())?;
    Ok(match variant {
        Variant::Bare => router,
        Variant::Memory => router.layer(RateLimitLayer::new(Limiter::new(
            policy,
            MemoryStore::new(),
        ))),
        Variant::Redis => {
            let store = RedisStore::builder()
                .prefix("bench")
                .timeout(Duration::from_secs(1))
                .connect(redis_url)
                .await?;
            router.layer(RateLimitLayer::new(Limiter::new(policy, store)))
        }
        Variant::Governor => {
            let mut builder = GovernorConfigBuilder::default();
            if rejected {
                builder.per_second(3600).burst_size(1);
            } else {
                builder.per_nanosecond(1).burst_size(1_000_000_000);
            }
            let config = builder.finish().ok_or("governor config")?;
            router.layer(GovernorLayer::new(Arc::new(config)))
        }
        Variant::Evalsha => {
            let conn = ConnectionManager::new(redis::Client::open(redis_url)?).await?;
            let script = Arc::new(Baseline {
                sha: redis::Script::new(GCRA_LUA).get_hash().to_owned(),
                emission: limit_emission_us(&limit).to_string(),
                tolerance: (limit_emission_us(&limit) * limit.burst()).to_string(),
                prefix: format!("baseline{index}"),
            });
            // Load the script once, so the middleware can send EVALSHA only.
            let mut c = conn.clone();
            redis::cmd("SCRIPT")
                .arg("LOAD")
                .arg(GCRA_LUA)
                .query_async::<String>(&mut c)
                .await?;
            router.layer(axum::middleware::from_fn_with_state(
                (conn, script),
                evalsha_middleware,
            ))
        }
    })
}

fn limit_emission_us(limit: &Limit) -> u64 {
    u64::try_from(limit.emission_interval().as_micros()).unwrap_or(u64::MAX)
}

struct Baseline {
    sha: String,
    emission: String,
    tolerance: String,
    prefix: String,
}

/// The floor: key from the peer address, one EVALSHA of the GCRA script,
/// 429 or the handler. No headers, no configuration, no fallbacks.
async fn evalsha_middleware(
    State((mut conn, script)): State<(ConnectionManager, Arc<Baseline>)>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    req: Request,
    next: Next,
) -> Response {
    let key = format!("{}:{{{}}}:0", script.prefix, peer.ip());
    let reply: Result<Vec<i64>, _> = redis::cmd("EVALSHA")
        .arg(&script.sha)
        .arg(1)
        .arg(key)
        .arg("")
        .arg(1)
        .arg(0)
        .arg(&script.emission)
        .arg(&script.tolerance)
        .query_async(&mut conn)
        .await;
    match reply {
        Ok(r) if r.first() == Some(&1) => next.run(req).await,
        Ok(_) => StatusCode::TOO_MANY_REQUESTS.into_response(),
        Err(_) => next.run(req).await,
    }
}

type Outcome = (Vec<Duration>, u64, u64, u64, Duration);

async fn generate(addr: SocketAddr, plan: &Plan) -> Result<Outcome, BoxError> {
    let start = Instant::now();
    let measure_from = start + plan.warm_up;
    let end = measure_from + plan.measure;
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..plan.connections {
        tasks.spawn(async move { connection(addr, measure_from, end).await });
    }
    let mut latencies = Vec::new();
    let (mut ok, mut limited, mut other) = (0, 0, 0);
    while let Some(joined) = tasks.join_next().await {
        let (lat, o, l, x) = joined.map_err(|e| e.to_string())??;
        latencies.extend(lat);
        ok += o;
        limited += l;
        other += x;
    }
    Ok((latencies, ok, limited, other, plan.measure))
}

type ConnResult = Result<(Vec<Duration>, u64, u64, u64), BoxError>;

async fn connection(addr: SocketAddr, measure_from: Instant, end: Instant) -> ConnResult {
    let stream = tokio::net::TcpStream::connect(addr).await?;
    stream.set_nodelay(true)?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(conn);
    let mut latencies = Vec::with_capacity(1 << 16);
    let (mut ok, mut limited, mut other) = (0, 0, 0);
    loop {
        let sent = Instant::now();
        if sent >= end {
            break;
        }
        sender.ready().await?;
        let req = http::Request::builder()
            .uri("/")
            .header(http::header::HOST, "bench")
            .body(Empty::<Bytes>::new())?;
        let resp = sender.send_request(req).await?;
        let status = resp.status();
        resp.into_body().collect().await?;
        if sent >= measure_from {
            latencies.push(sent.elapsed());
            match status {
                StatusCode::OK => ok += 1,
                StatusCode::TOO_MANY_REQUESTS => limited += 1,
                _ => other += 1,
            }
        }
    }
    Ok((latencies, ok, limited, other))
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn print_table(rows: &[Row], plan: &Plan) {
    let find = |v: Variant, l: Option<Load>| rows.iter().find(|r| r.variant == v && r.load == l);
    let bare = find(Variant::Bare, None).map_or(0.0, |r| r.per_sec);
    println!(
        "\n{} connections, {:?} per case; server pinned to CPU 0, load and Redis on CPU 1\n",
        plan.connections, plan.measure
    );
    println!("| case | load | req/s | x bare | p50 µs | p99 µs | 200 | 429 | other |");
    println!("|---|---|---:|---:|---:|---:|---:|---:|---:|");
    for r in rows {
        println!(
            "| {} | {} | {:.0} | {:.2} | {} | {} | {} | {} | {} |",
            r.variant.name(),
            r.load.map_or("-", load_name),
            r.per_sec,
            if bare > 0.0 { r.per_sec / bare } else { 0.0 },
            r.p50.as_micros(),
            r.p99.as_micros(),
            r.ok,
            r.limited,
            r.other
        );
    }
    let ratio = |a: Option<&Row>, b: Option<&Row>| match (a, b) {
        (Some(a), Some(b)) if b.per_sec > 0.0 => format!("{:.2}", a.per_sec / b.per_sec),
        _ => "n/a".into(),
    };
    let a = Some(Load::Admitted);
    let r = Some(Load::Rejected);
    println!("\n| ratio (same run) | target | measured |");
    println!("|---|---:|---:|");
    println!(
        "| memory layer / bare, admitted | ≥ 0.95 | {} |",
        ratio(find(Variant::Memory, a), find(Variant::Bare, None))
    );
    println!(
        "| memory layer / tower_governor, admitted | ≥ 1.0 | {} |",
        ratio(find(Variant::Memory, a), find(Variant::Governor, a))
    );
    println!(
        "| memory layer / tower_governor, rejected | ≥ 1.0 | {} |",
        ratio(find(Variant::Memory, r), find(Variant::Governor, r))
    );
    println!(
        "| Redis layer / EVALSHA middleware, admitted | ≥ 1.0 | {} |",
        ratio(find(Variant::Redis, a), find(Variant::Evalsha, a))
    );
    println!(
        "| Redis layer / EVALSHA middleware, rejected | ≥ 1.0 | {} |",
        ratio(find(Variant::Redis, r), find(Variant::Evalsha, r))
    );
    for v in [
        Variant::Memory,
        Variant::Governor,
        Variant::Redis,
        Variant::Evalsha,
    ] {
        println!(
            "| {}: rejected / admitted | ≥ 0.9 | {} |",
            v.name(),
            ratio(find(v, r), find(v, a))
        );
    }
}
