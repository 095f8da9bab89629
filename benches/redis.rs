//! `RedisStore` decisions against a private `redis-server`, next to the
//! floor: a hand-written `EVALSHA` through one redis-rs multiplexed
//! connection.
//!
//! ```sh
//! cargo bench --bench redis
//! ```
//!
//! Each case runs for a fixed time after a short warm-up, at concurrency 1
//! and 64 (tasks sharing one store, hence one multiplexed connection, on a
//! two-worker runtime), and prints a markdown table. Redis' own command
//! counters (`INFO commandstats`, reset before each case) give the commands
//! per decision. `FLEETGATE_BENCH_SECS` changes the measured time per case
//! (default 3). Run without `--bench` (as `cargo test --all-targets` does)
//! it only smoke-tests each case for a moment.

#[path = "../tests/common/redis_server.rs"]
mod redis_server;

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use fleetgate::{Key, Limit, Limiter, Policy, Rate, RedisStore};
use redis::AsyncConnectionConfig;
use redis::aio::MultiplexedConnection;

use crate::redis_server::RedisServer;

const KEYS: usize = 10_000;
const CONCURRENCY: [usize; 2] = [1, 64];
const TIMEOUT: Duration = Duration::from_secs(1);
const GCRA_LUA: &str = include_str!("../lua/gcra.lua");

type BoxError = Box<dyn std::error::Error + Send + Sync>;

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
            .unwrap_or(3.0);
        Plan {
            warm_up: Duration::from_millis(500),
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

/// What one case measured.
struct Row {
    name: String,
    concurrency: usize,
    decisions: u64,
    errors: u64,
    allowed: u64,
    elapsed: Duration,
    latencies: Vec<Duration>,
    commands: BTreeMap<String, u64>,
}

async fn run(server: &RedisServer, plan: &Plan) -> Result<(), BoxError> {
    let client = server.client();
    let mut admin = client.get_multiplexed_async_connection().await?;
    let info: String = redis::cmd("INFO")
        .arg("server")
        .query_async(&mut admin)
        .await?;
    let version = info_field(&info, "redis_version").unwrap_or("?");
    println!(
        "redis-server {version} on {} (private, loopback); {:?} warm-up, {:?} measured per case\n",
        server.url(),
        plan.warm_up,
        plan.measure
    );

    let store = RedisStore::builder()
        .timeout(TIMEOUT)
        .connect(&server.url())
        .await?;
    let limit = Limit::builder(Rate::per_second(1_000_000))
        .burst(1_000_000)
        .build()?;
    let limiter = Limiter::new(Policy::single("bench", limit)?, store);
    let hot = Arc::new(vec![Key::new("ip:192.0.2.1")]);
    let spread: Arc<Vec<Key>> = Arc::new(
        (0..KEYS)
            .map(|i| Key::new(format!("ip:10.0.{}.{}", i / 256, i % 256)))
            .collect(),
    );

    let config = AsyncConnectionConfig::new().set_response_timeout(Some(TIMEOUT));
    let conn = client
        .get_multiplexed_async_connection_with_config(&config)
        .await?;
    let return_one: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg("return 1")
        .query_async(&mut admin)
        .await?;
    let gcra: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(GCRA_LUA)
        .query_async(&mut admin)
        .await?;

    let mut rows = Vec::new();
    for concurrency in CONCURRENCY {
        for (name, keys) in [
            ("RedisStore, 1 hot key", &hot),
            ("RedisStore, 10k keys", &spread),
        ] {
            let limiter = limiter.clone();
            let keys = keys.clone();
            // What a caller writes: `limiter.check(&key, 1).await`; tasks
            // start at different keys and walk them round-robin.
            let op = move |task: usize, n: usize| {
                let decision = limiter.check(&keys[(task * 157 + n) % keys.len()], 1);
                async move { decision.await.map(|d| d.is_allowed()) }
            };
            rows.push(case(&mut admin, name, concurrency, plan, op).await?);
        }
        let sha = Arc::new(return_one.clone());
        let c = conn.clone();
        let op = move |_task: usize, _n: usize| {
            let mut conn = c.clone();
            let sha = sha.clone();
            async move {
                redis::cmd("EVALSHA")
                    .arg(sha.as_str())
                    .arg(0)
                    .query_async::<i64>(&mut conn)
                    .await
                    .map(|v| v == 1)
            }
        };
        rows.push(
            case(
                &mut admin,
                "baseline: EVALSHA `return 1`",
                concurrency,
                plan,
                op,
            )
            .await?,
        );
        let sha = Arc::new(gcra.clone());
        let c = conn.clone();
        let op = move |_task: usize, _n: usize| {
            let mut conn = c.clone();
            let sha = sha.clone();
            async move {
                // The store's script and arguments, hand-built: server time,
                // cost 1, no wait, T = 1 us, tolerance 1 s.
                redis::cmd("EVALSHA")
                    .arg(sha.as_str())
                    .arg(1)
                    .arg("raw:bench:{ip:192.0.2.1}:0")
                    .arg(&["", "1", "0", "1", "1000000"])
                    .query_async::<Vec<i64>>(&mut conn)
                    .await
                    .map(|v| v.first() == Some(&1))
            }
        };
        rows.push(
            case(
                &mut admin,
                "baseline: EVALSHA gcra.lua, 1 hot key",
                concurrency,
                plan,
                op,
            )
            .await?,
        );
    }
    print_table(&rows);
    print_commands(&rows);
    Ok(())
}

/// Runs `op` from `concurrency` tasks: a warm-up, then the measured phase
/// between a `CONFIG RESETSTAT` and an `INFO commandstats`.
async fn case<F, Fut, E>(
    admin: &mut MultiplexedConnection,
    name: &str,
    concurrency: usize,
    plan: &Plan,
    op: F,
) -> Result<Row, BoxError>
where
    F: Fn(usize, usize) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = Result<bool, E>> + Send + 'static,
    E: std::fmt::Display + Send + 'static,
{
    phase(concurrency, plan.warm_up, op.clone()).await?;
    redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async::<()>(admin)
        .await?;
    let start = Instant::now();
    let tasks = phase(concurrency, plan.measure, op).await?;
    let elapsed = start.elapsed();
    let stats: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(admin)
        .await?;
    let mut row = Row {
        name: name.to_owned(),
        concurrency,
        decisions: 0,
        errors: 0,
        allowed: 0,
        elapsed,
        latencies: Vec::new(),
        commands: command_calls(&stats),
    };
    let mut first_error = None;
    for task in tasks {
        row.decisions += task.latencies.len() as u64;
        row.errors += task.errors;
        row.allowed += task.allowed;
        row.latencies.extend(task.latencies);
        first_error = first_error.or(task.first_error);
    }
    row.latencies.sort_unstable();
    if let Some(err) = first_error {
        eprintln!(
            "{name} @ {concurrency}: {} errors, first: {err}",
            row.errors
        );
    }
    Ok(row)
}

struct TaskStats {
    latencies: Vec<Duration>,
    allowed: u64,
    errors: u64,
    first_error: Option<String>,
}

/// `concurrency` tasks calling `op` back to back until `duration` has
/// passed; every call started is awaited, so none is in flight afterwards.
async fn phase<F, Fut, E>(
    concurrency: usize,
    duration: Duration,
    op: F,
) -> Result<Vec<TaskStats>, BoxError>
where
    F: Fn(usize, usize) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = Result<bool, E>> + Send + 'static,
    E: std::fmt::Display + Send + 'static,
{
    let deadline = tokio::time::Instant::now() + duration;
    let handles: Vec<_> = (0..concurrency)
        .map(|task| {
            let op = op.clone();
            tokio::spawn(async move {
                let mut stats = TaskStats {
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
    let mut tasks = Vec::with_capacity(concurrency);
    for handle in handles {
        tasks.push(handle.await?);
    }
    Ok(tasks)
}

fn info_field<'a>(info: &'a str, field: &str) -> Option<&'a str> {
    info.lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
        .map(str::trim)
}

/// `cmdstat_evalsha:calls=123,usec=...` lines into name -> calls, leaving
/// out the bench's own `CONFIG RESETSTAT`.
fn command_calls(info: &str) -> BTreeMap<String, u64> {
    info.lines()
        .filter_map(|line| {
            let (name, rest) = line.strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = rest.split(',').find_map(|kv| kv.strip_prefix("calls="))?;
            Some((name.to_owned(), calls.trim().parse().ok()?))
        })
        .filter(|(name, _)| name != "config|resetstat")
        .collect()
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

fn micros(d: Duration) -> String {
    format!("{:.0}", d.as_secs_f64() * 1e6)
}

/// Commands sent by the client (`EVALSHA`, `EVAL`) and commands run inside
/// scripts (`TIME`, `GET`, `SET`), per decision.
fn per_decision(row: &Row) -> (f64, f64) {
    let decisions = row.decisions.max(1) as f64;
    let sent: u64 = ["evalsha", "eval"]
        .iter()
        .filter_map(|c| row.commands.get(*c))
        .sum();
    let total: u64 = row.commands.values().sum();
    (sent as f64 / decisions, (total - sent) as f64 / decisions)
}

fn print_table(rows: &[Row]) {
    println!(
        "| case | concurrency | decisions | decisions/s | p50 µs | p99 µs | max µs | admitted | errors | EVALSHA+EVAL / decision | in-script commands / decision |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for row in rows {
        let rate = row.decisions as f64 / row.elapsed.as_secs_f64();
        let (sent, inner) = per_decision(row);
        println!(
            "| {} | {} | {} | {:.0} | {} | {} | {} | {:.1}% | {} | {:.3} | {:.3} |",
            row.name,
            row.concurrency,
            row.decisions,
            rate,
            micros(percentile(&row.latencies, 0.50)),
            micros(percentile(&row.latencies, 0.99)),
            micros(row.latencies.last().copied().unwrap_or_default()),
            100.0 * row.allowed as f64 / row.decisions.max(1) as f64,
            row.errors,
            sent,
            inner,
        );
    }
}

fn print_commands(rows: &[Row]) {
    println!("\nINFO commandstats calls per case (measured phase only):\n");
    for row in rows {
        let calls: Vec<String> = row
            .commands
            .iter()
            .map(|(name, calls)| format!("{name}={calls}"))
            .collect();
        println!(
            "- {} @ {}: {} decisions; {}",
            row.name,
            row.concurrency,
            row.decisions,
            calls.join(", ")
        );
    }
}
