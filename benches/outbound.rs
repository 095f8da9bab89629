//! Outbound clients: what waiting mode costs per call, and how close a
//! fleet of waiting workers gets to an upstream's rate without a 429.
//!
//! ```sh
//! cargo bench --bench outbound
//! ```
//!
//! Part 1, on a private `redis-server`: `Limiter::check`, `Limiter::reserve`
//! (whose slot is always now, so it measures the round trip, not a sleep)
//! and `Limiter::defer`, back to back from 1 and 64 tasks sharing one
//! store, with Redis' own command counters per call.
//!
//! Part 2: 32 workers on 4 store handles (on Redis, 4 connections) calling,
//! through the waiting layer, an in-process upstream that allows 100 calls
//! in any 1 s window; the limiter mirrors it with `within_window(100, 1 s,
//! 20 ms)`. Reports the calls, the upstream's 429s, the achieved rate, the
//! most calls the upstream saw in any 1 s window and the closest two calls
//! came.
//!
//! `FLEETGATE_BENCH_SECS` changes the measured time per case (default 3).
//! Run without `--bench` (as `cargo test --all-targets` does) it only
//! smoke-tests each case for a moment.

#[path = "../tests/common/redis_server.rs"]
mod redis_server;
#[path = "../tests/common/stats.rs"]
mod stats;

mod common;

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use fleetgate::key::GlobalKey;
use fleetgate::rate_limit::within_window;
use fleetgate::{
    FailurePolicy, Key, Limit, Limiter, MemoryStore, Policy, Rate, RateLimitLayer, RedisStore,
    Store,
};
use redis::aio::MultiplexedConnection;
use tower::{Layer, Service, ServiceExt};

use crate::common::percentile;
use crate::redis_server::RedisServer;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const TIMEOUT: Duration = Duration::from_secs(1);

fn main() -> Result<(), BoxError> {
    let bench = std::env::args().any(|a| a == "--bench");
    let measure = if bench {
        let secs = std::env::var("FLEETGATE_BENCH_SECS")
            .ok()
            .and_then(|s| s.parse::<f64>().ok())
            .filter(|s| *s > 0.0)
            .unwrap_or(3.0);
        Duration::from_secs_f64(secs)
    } else {
        Duration::from_millis(50)
    };
    let warm_up = if bench {
        Duration::from_millis(500)
    } else {
        Duration::from_millis(10)
    };
    let server = RedisServer::start();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let result = runtime.block_on(async {
        round_trips(&server, warm_up, measure).await?;
        fleets(&server, measure.max(Duration::from_millis(500))).await
    });
    drop(runtime);
    drop(server);
    result
}

// ---------------------------------------------------------------------------
// Part 1: one call's cost.

async fn round_trips(
    server: &RedisServer,
    warm_up: Duration,
    measure: Duration,
) -> Result<(), BoxError> {
    let mut admin = server.client().get_multiplexed_async_connection().await?;
    let store = RedisStore::builder(server.url())
        .timeout(TIMEOUT)
        .connect()
        .await?;
    let limit = Limit::builder(Rate::per_second(1_000_000))
        .burst(1_000_000)
        .build()?;
    let limiter = Limiter::new(Policy::single("bench", limit)?, store);
    println!("| call | tasks | calls/s | p50 µs | p99 µs | errors | EVALSHA+EVAL / call |");
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for tasks in [1, 64] {
        for op in ["check", "reserve", "defer"] {
            let run = |duration| {
                let limiter = limiter.clone();
                phase(tasks, duration, move || {
                    let limiter = limiter.clone();
                    async move {
                        match op {
                            "check" => limiter.check(&hot(), 1).await.map(|d| d.is_allowed()),
                            // Never waits: the limit is far from full.
                            "reserve" => limiter
                                .reserve(&hot(), 1, Duration::from_secs(10))
                                .await
                                .map(|d| d.is_allowed() && d.wait().is_zero()),
                            // Its own key, so that the pauses do not touch
                            // the other cases' state.
                            _ => limiter
                                .defer(&Key::new("paused"), Duration::from_millis(1))
                                .await
                                .map(|()| true),
                        }
                    }
                })
            };
            run(warm_up).await?;
            stats::reset_stats(&mut admin).await;
            let start = Instant::now();
            let (mut latencies, errors) = run(measure).await?;
            let elapsed = start.elapsed();
            let commands = stats::command_calls(&mut admin).await;
            latencies.sort_unstable();
            let calls = latencies.len().max(1) as f64;
            let sent = stats::scripts_in(&commands);
            println!(
                "| {op} | {tasks} | {:.0} | {:.0} | {:.0} | {errors} | {:.3} |",
                latencies.len() as f64 / elapsed.as_secs_f64(),
                percentile(&latencies, 0.5).as_secs_f64() * 1e6,
                percentile(&latencies, 0.99).as_secs_f64() * 1e6,
                sent as f64 / calls,
            );
        }
    }
    Ok(())
}

fn hot() -> Key {
    Key::new("ip:192.0.2.1")
}

/// `tasks` tasks calling `op` back to back for `duration`; the latencies of
/// every call and the number of errors (or of "reserve had to wait").
async fn phase<F, Fut>(
    tasks: usize,
    duration: Duration,
    op: F,
) -> Result<(Vec<Duration>, u64), BoxError>
where
    F: Fn() -> Fut + Clone + Send + 'static,
    Fut: Future<Output = Result<bool, fleetgate::StoreError>> + Send + 'static,
{
    let deadline = Instant::now() + duration;
    let mut handles = Vec::new();
    for _ in 0..tasks {
        let op = op.clone();
        handles.push(tokio::spawn(async move {
            let mut latencies = Vec::with_capacity(1 << 14);
            let mut errors = 0u64;
            while Instant::now() < deadline {
                let start = Instant::now();
                let ok = op().await;
                latencies.push(start.elapsed());
                if !matches!(ok, Ok(true)) {
                    errors += 1;
                }
            }
            (latencies, errors)
        }));
    }
    let mut all = Vec::new();
    let mut errors = 0;
    for handle in handles {
        let (latencies, e) = handle.await?;
        all.extend(latencies);
        errors += e;
    }
    Ok((all, errors))
}

// ---------------------------------------------------------------------------
// Part 2: a fleet of waiting workers against an upstream that counts.

const WORKERS: usize = 32;
const HANDLES: usize = 4;
const UPSTREAM_COUNT: u64 = 100;
const UPSTREAM_WINDOW: Duration = Duration::from_secs(1);
const MARGIN: Duration = Duration::from_millis(20);

async fn fleets(server: &RedisServer, measure: Duration) -> Result<(), BoxError> {
    println!(
        "\n{WORKERS} workers on {HANDLES} store handles; upstream allows {UPSTREAM_COUNT} per {UPSTREAM_WINDOW:?}; limiter within_window(.., {MARGIN:?}); {measure:?} per store\n"
    );
    println!(
        "| store | calls | upstream 429 | achieved/s | allowed/s | share | most in any window | closest gap ms | EVALSHA / call |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    let memory: Arc<dyn Store> = Arc::new(MemoryStore::new());
    fleet("memory", vec![memory; HANDLES], measure, None).await?;
    let mut stores: Vec<Arc<dyn Store>> = Vec::new();
    for _ in 0..HANDLES {
        stores.push(Arc::new(
            RedisStore::builder(server.url())
                .timeout(TIMEOUT)
                .connect()
                .await?,
        ));
    }
    let mut admin = server.client().get_multiplexed_async_connection().await?;
    fleet("redis", stores, measure, Some(&mut admin)).await
}

async fn fleet(
    name: &str,
    stores: Vec<Arc<dyn Store>>,
    measure: Duration,
    admin: Option<&mut MultiplexedConnection>,
) -> Result<(), BoxError> {
    let policy = Policy::single(
        "fleet",
        within_window(UPSTREAM_COUNT, UPSTREAM_WINDOW, MARGIN)?,
    )?;
    let upstream = Upstream::default();
    let stop = Arc::new(AtomicBool::new(false));
    let mut admin = admin;
    if let Some(admin) = admin.as_deref_mut() {
        stats::reset_stats(admin).await;
    }
    let mut tasks = tokio::task::JoinSet::new();
    for worker in 0..WORKERS {
        let store = stores[worker % stores.len()].clone();
        let mut client = RateLimitLayer::new(Limiter::new(policy.clone(), store))
            .key(GlobalKey::new())
            .typed_errors()
            .wait_up_to(Duration::from_secs(30))
            .on_store_error(FailurePolicy::Closed)
            .layer(upstream.clone());
        let stop = stop.clone();
        tasks.spawn(async move {
            let mut errors = 0u64;
            while !stop.load(Ordering::Relaxed) {
                match client.ready().await {
                    Ok(ready) => {
                        if ready.call(()).await.is_err() {
                            errors += 1;
                        }
                    }
                    Err(_) => errors += 1,
                }
            }
            errors
        });
    }
    tokio::time::sleep(measure).await;
    stop.store(true, Ordering::Relaxed);
    let mut errors = 0;
    while let Some(joined) = tasks.join_next().await {
        errors += joined?;
    }
    let evalsha = match admin {
        Some(admin) => {
            let commands = stats::command_calls(admin).await;
            Some(commands.get("evalsha").copied().unwrap_or(0))
        }
        None => None,
    };
    let log = upstream.0.lock().map_err(|_| "poisoned")?;
    let accepted: Vec<Instant> = log.accepted.clone();
    let achieved = if accepted.len() > 1 {
        (accepted.len() - 1) as f64 / (accepted[accepted.len() - 1] - accepted[0]).as_secs_f64()
    } else {
        0.0
    };
    let allowed = UPSTREAM_COUNT as f64 / UPSTREAM_WINDOW.as_secs_f64();
    let most = (0..accepted.len())
        .map(|i| {
            accepted[i..]
                .iter()
                .take_while(|&&t| t - accepted[i] < UPSTREAM_WINDOW)
                .count()
        })
        .max()
        .unwrap_or(0);
    let closest = accepted
        .windows(2)
        .map(|w| w[1] - w[0])
        .min()
        .unwrap_or_default();
    let calls = log.calls;
    println!(
        "| {name} | {calls} | {} | {achieved:.1} | {allowed:.1} | {:.1}% | {most} | {:.1} | {} |",
        log.refused,
        100.0 * achieved / allowed,
        closest.as_secs_f64() * 1e3,
        evalsha.map_or("-".to_owned(), |n| format!(
            "{:.3}",
            n as f64 / calls.max(1) as f64
        )),
    );
    if errors > 0 {
        println!("  ({errors} calls failed in the layer)");
    }
    Ok(())
}

/// An upstream that allows `UPSTREAM_COUNT` calls in any `UPSTREAM_WINDOW`.
#[derive(Clone, Default)]
struct Upstream(Arc<Mutex<UpstreamLog>>);

#[derive(Default)]
struct UpstreamLog {
    accepted: Vec<Instant>,
    calls: u64,
    refused: u64,
}

impl Service<()> for Upstream {
    type Response = bool;
    type Error = Infallible;
    type Future = std::future::Ready<Result<bool, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, (): ()) -> Self::Future {
        let now = Instant::now();
        let mut log = self.0.lock().unwrap_or_else(|e| e.into_inner());
        log.calls += 1;
        let inside = log
            .accepted
            .iter()
            .rev()
            .take_while(|&&t| now - t < UPSTREAM_WINDOW)
            .count() as u64;
        let ok = inside < UPSTREAM_COUNT;
        if ok {
            log.accepted.push(now);
        } else {
            log.refused += 1;
        }
        std::future::ready(Ok(ok))
    }
}

// ---------------------------------------------------------------------------
// Redis counters.
