//! Requests per second through `ConcurrencyLimitLayer` (acquire, call,
//! read the body, release), on the memory store and on a private
//! `redis-server`, next to the same service without the layer; and, from
//! Redis' own counters, the round trips each request costs.
//!
//! ```sh
//! cargo bench --bench concurrency
//! ```
//!
//! Each case runs 0.3 s of warm-up, then `FLEETGATE_BENCH_SECS` (default 2)
//! measured, at concurrency 1 and 64 (tasks sharing one service, so one
//! store and one multiplexed connection) on a two-worker runtime, and
//! prints a markdown table. Run without `--bench` (as `cargo test
//! --all-targets` does) it only smoke-tests each case for a moment.

#[path = "../tests/common/redis_server.rs"]
mod redis_server;
#[path = "../tests/common/stats.rs"]
mod stats;

mod common;

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use fleetgate::concurrency::{ConcurrencyLimitLayer, ConcurrencyLimiter, ConcurrencyPolicy};
use fleetgate::key::GlobalKey;
use fleetgate::{MemoryStore, RedisStore, Store};
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use redis::aio::MultiplexedConnection;
use tower::util::BoxCloneSyncService;
use tower::{Layer, ServiceExt, service_fn};

use crate::common::percentile;
use crate::redis_server::RedisServer;

type BoxError = Box<dyn std::error::Error + Send + Sync>;
/// Any of the services under test: the bare handler or the layered one.
type Svc = BoxCloneSyncService<Request<()>, StatusCode, Infallible>;

const CONCURRENCY: [usize; 2] = [1, 64];

struct Plan {
    warm_up: Duration,
    measure: Duration,
}

fn main() -> Result<(), BoxError> {
    let bench = std::env::args().any(|a| a == "--bench");
    let plan = if bench {
        let secs = std::env::var("FLEETGATE_BENCH_SECS")
            .ok()
            .and_then(|s| s.parse::<f64>().ok())
            .filter(|s| *s > 0.0)
            .unwrap_or(2.0);
        Plan {
            warm_up: Duration::from_millis(300),
            measure: Duration::from_secs_f64(secs),
        }
    } else {
        Plan {
            warm_up: Duration::from_millis(10),
            measure: Duration::from_millis(50),
        }
    };
    let server = RedisServer::start();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let result = runtime.block_on(run(&server, &plan));
    drop(runtime);
    drop(server);
    result
}

/// The handler: a short fixed body.
fn handler() -> impl tower::Service<
    Request<()>,
    Response = Response<Full<Bytes>>,
    Error = Infallible,
    Future = impl Send,
> + Clone
+ Send
+ Sync
+ 'static {
    service_fn(|_req: Request<()>| async {
        Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"ok"))))
    })
}

/// A service that answers with the status once the body has been read to
/// its end (which, through the layer, releases the lease).
fn finish<S, B>(svc: S) -> Svc
where
    S: tower::Service<Request<()>, Response = Response<B>, Error = Infallible>
        + Clone
        + Send
        + Sync
        + 'static,
    S::Future: Send + 'static,
    B: http_body::Body + Send + 'static,
    B::Data: Send,
    B::Error: std::fmt::Debug,
{
    BoxCloneSyncService::new(svc.and_then(|response: Response<B>| async move {
        let status = response.status();
        let _ = response.into_body().collect().await;
        Ok(status)
    }))
}

fn layered(store: Arc<dyn Store>, renew: bool) -> Result<(Svc, ConcurrencyLimiter), BoxError> {
    // A cap no bench reaches, so that every request is admitted and the
    // figures are the cost of acquire + release.
    let policy = ConcurrencyPolicy::builder("bench", 100_000).lease_ttl(Duration::from_secs(30));
    let policy = if renew { policy } else { policy.no_renewal() }.build()?;
    let limiter = ConcurrencyLimiter::new(policy, store);
    let layer = ConcurrencyLimitLayer::new(limiter.clone()).key(GlobalKey::new());
    Ok((finish(layer.layer(handler())), limiter))
}

struct Row {
    name: String,
    concurrency: usize,
    requests: u64,
    admitted: u64,
    elapsed: Duration,
    latencies: Vec<Duration>,
    commands: BTreeMap<String, u64>,
}

async fn run(server: &RedisServer, plan: &Plan) -> Result<(), BoxError> {
    let mut admin = server.client().get_multiplexed_async_connection().await?;
    println!(
        "private redis-server on {}; {:?} warm-up, {:?} measured per case\n",
        server.url(),
        plan.warm_up,
        plan.measure
    );
    let redis: Arc<dyn Store> = Arc::new(
        RedisStore::builder(server.url())
            .timeout(Duration::from_secs(1))
            .connect()
            .await?,
    );
    let memory: Arc<dyn Store> = Arc::new(MemoryStore::new());

    let mut rows = Vec::new();
    for concurrency in CONCURRENCY {
        let bare = finish(handler());
        rows.push(
            case(
                &mut admin,
                "no layer (baseline)",
                concurrency,
                plan,
                bare,
                None,
            )
            .await?,
        );
        for (store_name, store) in [("memory", &memory), ("redis", &redis)] {
            for renew in [false, true] {
                let (svc, limiter) = layered(store.clone(), renew)?;
                let name = format!(
                    "layer, {store_name} store, {}",
                    if renew {
                        "renewal on (default)"
                    } else {
                        "no renewal"
                    }
                );
                rows.push(case(&mut admin, &name, concurrency, plan, svc, Some(limiter)).await?);
            }
        }
    }
    print_table(&rows);
    Ok(())
}

/// A warm-up, then the measured phase between `CONFIG RESETSTAT` and
/// `INFO commandstats`, counting every release (they finish on spawned
/// tasks: the counters are read once all of them have reached Redis).
async fn case(
    admin: &mut MultiplexedConnection,
    name: &str,
    concurrency: usize,
    plan: &Plan,
    svc: Svc,
    limiter: Option<ConcurrencyLimiter>,
) -> Result<Row, BoxError> {
    phase(concurrency, plan.warm_up, svc.clone()).await?;
    if let Some(l) = &limiter {
        l.releases_settled().await;
    }
    stats::reset_stats(admin).await;
    let start = Instant::now();
    let tasks = phase(concurrency, plan.measure, svc).await?;
    let elapsed = start.elapsed();
    if let Some(l) = &limiter {
        l.releases_settled().await;
    }
    let commands = stats::command_calls(admin).await.into_iter().collect();
    let mut row = Row {
        name: name.to_owned(),
        concurrency,
        requests: 0,
        admitted: 0,
        elapsed,
        latencies: Vec::new(),
        commands,
    };
    for (latencies, admitted) in tasks {
        row.requests += latencies.len() as u64;
        row.admitted += admitted;
        row.latencies.extend(latencies);
    }
    row.latencies.sort_unstable();
    Ok(row)
}

/// `concurrency` tasks sending requests back to back until `duration` has
/// passed; returns each task's latencies and how many got 200.
async fn phase(
    concurrency: usize,
    duration: Duration,
    svc: Svc,
) -> Result<Vec<(Vec<Duration>, u64)>, BoxError> {
    let deadline = tokio::time::Instant::now() + duration;
    let handles: Vec<_> = (0..concurrency)
        .map(|_| {
            let svc = svc.clone();
            tokio::spawn(async move {
                let mut latencies = Vec::with_capacity(1 << 14);
                let mut admitted = 0;
                while tokio::time::Instant::now() < deadline {
                    let start = Instant::now();
                    let status = svc.clone().oneshot(Request::new(())).await;
                    latencies.push(start.elapsed());
                    admitted += u64::from(status == Ok(StatusCode::OK));
                }
                (latencies, admitted)
            })
        })
        .collect();
    let mut tasks = Vec::with_capacity(concurrency);
    for handle in handles {
        tasks.push(handle.await?);
    }
    Ok(tasks)
}

fn micros(d: Duration) -> String {
    format!("{:.1}", d.as_secs_f64() * 1e6)
}

fn print_table(rows: &[Row]) {
    println!(
        "| case | concurrency | requests | requests/s | p50 µs | p99 µs | admitted | round trips / request | in-script commands / request |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for row in rows {
        let requests = row.requests.max(1) as f64;
        let sent: u64 = ["evalsha", "eval"]
            .iter()
            .filter_map(|c| row.commands.get(*c))
            .sum();
        let total: u64 = row.commands.values().sum();
        println!(
            "| {} | {} | {} | {:.0} | {} | {} | {:.1}% | {:.3} | {:.3} |",
            row.name,
            row.concurrency,
            row.requests,
            row.requests as f64 / row.elapsed.as_secs_f64(),
            micros(percentile(&row.latencies, 0.50)),
            micros(percentile(&row.latencies, 0.99)),
            100.0 * row.admitted as f64 / requests,
            sent as f64 / requests,
            (total - sent) as f64 / requests,
        );
    }
    println!("\nINFO commandstats calls per case (measured phase only):\n");
    for row in rows {
        let calls: Vec<String> = row
            .commands
            .iter()
            .map(|(name, calls)| format!("{name}={calls}"))
            .collect();
        println!(
            "- {} @ {}: {} requests; {}",
            row.name,
            row.concurrency,
            row.requests,
            calls.join(", ")
        );
    }
}
