//! The algorithms side by side on a private `redis-server`: GCRA, sliding
//! log, sliding-window counter and fixed window.
//!
//! ```sh
//! cargo bench --bench windows
//! ```
//!
//! For each algorithm, with one limit of 100 per day per identity:
//!
//! - **throughput**: 64 tasks share one `RedisStore` (one multiplexed
//!   connection, a two-worker runtime) and call `limiter.check(&key, 1)`
//!   back to back over 10k identities, 0.5 s of warm-up, then 3 s measured
//!   (`FLEETGATE_BENCH_SECS` changes it);
//! - **memory**: after `FLUSHALL`, one admitted call for each of 100k
//!   identities (and, for the sliding log, 10 calls each as well), then
//!   Redis' `used_memory` growth per identity, the keys per identity, and
//!   `MEMORY USAGE` of one identity's keys.
//!
//! Run without `--bench` (as `cargo test --all-targets` does) it only
//! smoke-tests each case, with 1k identities.

#[path = "../tests/common/redis_server.rs"]
mod redis_server;

use std::sync::Arc;
use std::time::{Duration, Instant};

use fleetgate::{Algorithm, Key, Limit, Limiter, Policy, Rate, RedisStore};
use redis::aio::MultiplexedConnection;

use crate::redis_server::RedisServer;

const CONCURRENCY: usize = 64;
const SPREAD_KEYS: usize = 10_000;
const ALGORITHMS: [Algorithm; 4] = [
    Algorithm::Gcra,
    Algorithm::SlidingLog,
    Algorithm::SlidingWindow,
    Algorithm::FixedWindow,
];

type BoxError = Box<dyn std::error::Error + Send + Sync>;

struct Plan {
    warm_up: Duration,
    measure: Duration,
    memory_keys: usize,
}

fn main() -> Result<(), BoxError> {
    let bench = std::env::args().any(|a| a == "--bench");
    let plan = if bench {
        let secs = std::env::var("FLEETGATE_BENCH_SECS")
            .ok()
            .and_then(|s| s.parse::<f64>().ok())
            .filter(|s| *s > 0.0)
            .unwrap_or(3.0);
        Plan {
            warm_up: Duration::from_millis(500),
            measure: Duration::from_secs_f64(secs),
            memory_keys: 100_000,
        }
    } else {
        Plan {
            warm_up: Duration::from_millis(10),
            measure: Duration::from_millis(50),
            memory_keys: 1_000,
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

fn policy(algorithm: Algorithm) -> Result<Policy, BoxError> {
    Ok(Policy::builder(format!("bench-{algorithm}"))
        .algorithm(algorithm)
        .limit(Limit::new(Rate::per_day(100))?)
        .build()?)
}

async fn run(server: &RedisServer, plan: &Plan) -> Result<(), BoxError> {
    let mut admin = server.client().get_multiplexed_async_connection().await?;
    let info: String = redis::cmd("INFO")
        .arg("server")
        .query_async(&mut admin)
        .await?;
    println!(
        "redis-server {} (private, loopback); concurrency {CONCURRENCY}; {:?} warm-up, {:?} measured; \
         memory after {} identities\n",
        info_field(&info, "redis_version").unwrap_or("?"),
        plan.warm_up,
        plan.measure,
        plan.memory_keys,
    );
    let store = RedisStore::builder()
        .timeout(Duration::from_secs(1))
        .connect(&server.url())
        .await?;
    let spread: Arc<Vec<Key>> = Arc::new(
        (0..SPREAD_KEYS)
            .map(|i| Key::new(format!("ip:10.0.{}.{}", i / 256, i % 256)))
            .collect(),
    );

    println!(
        "| algorithm | decisions/s | p50 µs | p99 µs | admitted | errors | EVALSHA / decision |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for algorithm in ALGORITHMS {
        flush(&mut admin).await?;
        let limiter = Limiter::new(policy(algorithm)?, store.clone());
        let op = {
            let (limiter, keys) = (limiter.clone(), spread.clone());
            move |task: usize, n: usize| {
                let decision = limiter.check(&keys[(task * 157 + n) % keys.len()], 1);
                async move { decision.await.map(|d| d.is_allowed()) }
            }
        };
        phase(plan.warm_up, op.clone()).await?;
        redis::cmd("CONFIG")
            .arg("RESETSTAT")
            .query_async::<()>(&mut admin)
            .await?;
        let start = Instant::now();
        let stats = phase(plan.measure, op).await?;
        let elapsed = start.elapsed();
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(&mut admin)
            .await?;
        let evalsha = info
            .lines()
            .find_map(|l| l.strip_prefix("cmdstat_evalsha:calls="))
            .and_then(|rest| rest.split(',').next())
            .and_then(|n| n.parse::<u64>().ok())
            .unwrap_or(0);
        let decisions = stats.latencies.len() as f64;
        println!(
            "| {algorithm} | {:.0} | {:.0} | {:.0} | {:.1}% | {} | {:.3} |",
            decisions / elapsed.as_secs_f64(),
            micros(percentile(&stats.latencies, 0.50)),
            micros(percentile(&stats.latencies, 0.99)),
            100.0 * stats.allowed as f64 / decisions.max(1.0),
            stats.errors,
            evalsha as f64 / decisions.max(1.0),
        );
        if let Some(err) = stats.first_error {
            eprintln!("{algorithm}: first error: {err}");
        }
    }

    println!(
        "\n| algorithm | calls per identity | used_memory growth / identity (bytes) | keys / identity | MEMORY USAGE of one identity's keys (bytes) |"
    );
    println!("|---|---:|---:|---:|---:|");
    let mut cases: Vec<(Algorithm, usize)> = ALGORITHMS.iter().map(|a| (*a, 1)).collect();
    cases.push((Algorithm::SlidingLog, 10));
    for (algorithm, calls) in cases {
        flush(&mut admin).await?;
        let before = used_memory(&mut admin).await?;
        let policy = policy(algorithm)?;
        let limiter = Limiter::new(policy.clone(), store.clone());
        let keys: Arc<Vec<Key>> = Arc::new(
            (0..plan.memory_keys)
                .map(|i| Key::new(format!("user:{i:06}")))
                .collect(),
        );
        let total = keys.len() * calls;
        let per_task = total.div_ceil(CONCURRENCY);
        let mut tasks = Vec::new();
        for task in 0..CONCURRENCY {
            let (limiter, keys) = (limiter.clone(), keys.clone());
            tasks.push(tokio::spawn(async move {
                let mut admitted = 0usize;
                for n in task * per_task..((task + 1) * per_task).min(total) {
                    let d = limiter.check(&keys[n % keys.len()], 1).await?;
                    admitted += usize::from(d.is_allowed());
                }
                Ok::<_, fleetgate::StoreError>(admitted)
            }));
        }
        let mut admitted = 0;
        for task in tasks {
            admitted += task.await??;
        }
        let after = used_memory(&mut admin).await?;
        let dbsize: u64 = redis::cmd("DBSIZE").query_async(&mut admin).await?;
        let sample = sample_keys(&store, &policy, &keys[0]);
        let mut usage = 0u64;
        for key in &sample {
            let bytes: Option<u64> = redis::cmd("MEMORY")
                .arg("USAGE")
                .arg(key)
                .arg("SAMPLES")
                .arg(0)
                .query_async(&mut admin)
                .await?;
            usage += bytes.unwrap_or(0);
        }
        let n = keys.len() as f64;
        println!(
            "| {algorithm} | {calls} | {:.0} | {:.2} | {usage} |",
            after.saturating_sub(before) as f64 / n,
            dbsize as f64 / n,
        );
        if admitted != total {
            eprintln!("{algorithm}: only {admitted} of {total} calls admitted");
        }
    }
    Ok(())
}

/// The Redis keys one identity uses under `policy`.
fn sample_keys(store: &RedisStore, policy: &Policy, key: &Key) -> Vec<String> {
    if policy.algorithm().is_window() {
        store.window_keys(policy, key)
    } else {
        (0..policy.limits().len())
            .map(|i| store.gcra_key(policy, key, i))
            .collect()
    }
}

async fn flush(admin: &mut MultiplexedConnection) -> Result<(), BoxError> {
    redis::cmd("FLUSHALL")
        .arg("SYNC")
        .query_async::<()>(admin)
        .await?;
    Ok(())
}

async fn used_memory(admin: &mut MultiplexedConnection) -> Result<u64, BoxError> {
    let info: String = redis::cmd("INFO").arg("memory").query_async(admin).await?;
    info_field(&info, "used_memory")
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| "INFO memory without used_memory".into())
}

struct Stats {
    latencies: Vec<Duration>,
    allowed: u64,
    errors: u64,
    first_error: Option<String>,
}

/// `CONCURRENCY` tasks calling `op` back to back for `duration`.
async fn phase<F, Fut, E>(duration: Duration, op: F) -> Result<Stats, BoxError>
where
    F: Fn(usize, usize) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = Result<bool, E>> + Send + 'static,
    E: std::fmt::Display + Send + 'static,
{
    let deadline = tokio::time::Instant::now() + duration;
    let handles: Vec<_> = (0..CONCURRENCY)
        .map(|task| {
            let op = op.clone();
            tokio::spawn(async move {
                let mut stats = Stats {
                    latencies: Vec::with_capacity(1 << 14),
                    allowed: 0,
                    errors: 0,
                    first_error: None,
                };
                let mut n = 0;
                while tokio::time::Instant::now() < deadline {
                    let start = Instant::now();
                    let result = op(task, n).await;
                    stats.latencies.push(start.elapsed());
                    n += 1;
                    match result {
                        Ok(allowed) => stats.allowed += u64::from(allowed),
                        Err(err) => {
                            stats.errors += 1;
                            stats.first_error.get_or_insert_with(|| err.to_string());
                        }
                    }
                }
                stats
            })
        })
        .collect();
    let mut all = Stats {
        latencies: Vec::new(),
        allowed: 0,
        errors: 0,
        first_error: None,
    };
    for handle in handles {
        let stats = handle.await?;
        all.latencies.extend(stats.latencies);
        all.allowed += stats.allowed;
        all.errors += stats.errors;
        all.first_error = all.first_error.or(stats.first_error);
    }
    all.latencies.sort_unstable();
    Ok(all)
}

fn info_field<'a>(info: &'a str, field: &str) -> Option<&'a str> {
    info.lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
        .map(str::trim)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}
