//! Raw decisions, outside any HTTP stack: each store (`MemoryStore`,
//! `RedisStore` on a private `redis-server`) and each algorithm at
//! concurrency 1, 16 and 64, beside the floor for any Redis limiter: a
//! hand-written `EVALSHA` of the same `lua/gcra.lua` through one redis-rs
//! multiplexed connection, with the key and arguments built by hand, and
//! the bare round trip (`EVALSHA` of `return 1`). The Redis store runs
//! twice for GCRA: as built by default, where calls that find the store's
//! script slots all in flight go together in one script, and with
//! `max_in_flight(usize::MAX)`, one script per call.
//!
//! ```sh
//! cargo bench --bench decisions
//! ```
//!
//! Tasks on a two-worker tokio runtime share one limiter (for Redis, one
//! store and so one multiplexed connection) and call
//! `limiter.check(&key, 1).await` back to back over 10k identities, each
//! task starting at its own place, yielding every 64 calls so that the
//! memory store's tasks (whose calls never wait) take turns. Every policy
//! holds one limit of 1000 per 100 ms per identity, which no case comes
//! near, so every call is admitted (the table shows it). Latency is timed
//! on every call on Redis, and on every 8th call on the memory store,
//! whose decisions cost about as much as reading the clock twice.
//!
//! Redis' own counters (`INFO commandstats`, reset after each warm-up)
//! count the round trips (`EVALSHA` + `EVAL`) and the commands the scripts
//! ran, per decision. The list of cases runs `FLEETGATE_BENCH_ROUNDS`
//! times (default 3), one case after the other; each row is the case's
//! median round by decisions/s (on this 2-CPU machine, a single task's
//! round trip swings by 2x with where the scheduler puts it).
//! `FLEETGATE_BENCH_SECS` sets the measured time per round (default 0.5),
//! `FLEETGATE_BENCH_WARMUP` the warm-up (default 0.2). Run without
//! `--bench` (as `cargo test --all-targets` does) each case runs once for
//! a moment only.

#[path = "../tests/common/redis_server.rs"]
mod redis_server;
#[path = "../tests/common/stats.rs"]
mod stats;

mod common;

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use fleetgate::{Algorithm, Key, Limit, Limiter, MemoryStore, Policy, Rate, RedisStore};
use redis::aio::{ConnectionManager, MultiplexedConnection};

use crate::common::{BoxError, micros, percentile, target_row};
use crate::redis_server::RedisServer;

const KEYS: usize = 10_000;
const CONCURRENCY: [usize; 3] = [1, 16, 64];
const ALGORITHMS: [Algorithm; 4] = [
    Algorithm::Gcra,
    Algorithm::SlidingLog,
    Algorithm::SlidingWindow,
    Algorithm::FixedWindow,
];
// Built from the same parts as the store's (src/store/redis.rs).
const GCRA_LUA: &str = concat!(
    include_str!("../lua/common/clock.lua"),
    include_str!("../lua/common/idiv.lua"),
    include_str!("../lua/gcra.lua"),
    include_str!("../lua/gcra_store.lua"),
);

/// The Redis store with `max_in_flight(usize::MAX)`: one script per call.
const UNBATCHED: &str = "redis, one script per call";

struct Plan {
    warm_up: Duration,
    measure: Duration,
    rounds: usize,
}

fn main() -> Result<(), BoxError> {
    let plan = if common::measuring() {
        Plan {
            warm_up: common::secs("FLEETGATE_BENCH_WARMUP", 0.2),
            measure: common::secs("FLEETGATE_BENCH_SECS", 0.5),
            rounds: common::count("FLEETGATE_BENCH_ROUNDS", 3),
        }
    } else {
        Plan {
            warm_up: Duration::from_millis(10),
            measure: Duration::from_millis(30),
            rounds: 1,
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

#[derive(Clone, Copy, PartialEq, Eq)]
enum Subject {
    Store(&'static str, Algorithm),
    /// The hand-written `EVALSHA` of gcra.lua.
    Floor,
    /// `EVALSHA` of `return 1`.
    RoundTrip,
}

impl Subject {
    fn label(self) -> (String, String) {
        match self {
            Subject::Store(store, algorithm) => (store.to_owned(), algorithm.name().to_owned()),
            Subject::Floor => ("hand-written EVALSHA".into(), "gcra".into()),
            Subject::RoundTrip => ("hand-written EVALSHA".into(), "`return 1`".into()),
        }
    }
}

/// What one case measured.
struct Row {
    subject: Subject,
    concurrency: usize,
    decisions: u64,
    allowed: u64,
    errors: u64,
    elapsed: Duration,
    latencies: Vec<Duration>,
    commands: HashMap<String, u64>,
}

impl Row {
    fn per_sec(&self) -> f64 {
        self.decisions as f64 / self.elapsed.as_secs_f64()
    }
}

fn policy(algorithm: Algorithm) -> Result<Policy, BoxError> {
    Ok(Policy::builder(format!("bench-{algorithm}"))
        .algorithm(algorithm)
        .limit(Limit::new(Rate::new(1000, Duration::from_millis(100)))?)
        .build()?)
}

async fn run(server: &RedisServer, plan: &Plan) -> Result<(), BoxError> {
    let client = server.client();
    let mut admin = client.get_multiplexed_async_connection().await?;
    let version = common::redis_version(&mut admin).await?;
    let redis_store = RedisStore::builder()
        .timeout(Duration::from_secs(1))
        .connect(&server.url())
        .await?;
    // The same store with every call its own script, to show what calls
    // travelling together (the default) change.
    let unbatched_store = RedisStore::builder()
        .timeout(Duration::from_secs(1))
        .max_in_flight(usize::MAX)
        .connect(&server.url())
        .await?;
    let memory_store = MemoryStore::new();
    let keys: Arc<Vec<Key>> = Arc::new(
        (0..KEYS)
            .map(|i| Key::new(format!("ip:10.0.{}.{}", i / 256, i % 256)))
            .collect(),
    );
    let conn = ConnectionManager::new(client).await?;
    let mut load = conn.clone();
    let return_one: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg("return 1")
        .query_async(&mut load)
        .await?;
    let gcra: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(GCRA_LUA)
        .query_async(&mut load)
        .await?;
    // The floor's arguments, as the store sends them for the bench's limit
    // (T = 100 µs, tolerance 100 ms).
    let limit = Limit::new(Rate::new(1000, Duration::from_millis(100)))?;
    let emission = limit.emission_interval().as_micros().to_string();
    let tolerance = (limit.emission_interval() * 1000).as_micros().to_string();
    // now = server clock, 1 call: 1 limit, cost 1, no wait, T, tolerance.
    let floor_args: Arc<[String; 7]> = Arc::new([
        String::new(),
        "1".into(),
        "1".into(),
        "1".into(),
        "0".into(),
        emission,
        tolerance,
    ]);

    let mut rounds: Vec<Vec<Row>> = Vec::new();
    for _ in 0..plan.rounds {
        let mut rows = Vec::new();
        for concurrency in CONCURRENCY {
            for (store_name, store) in [
                (
                    "memory",
                    Arc::new(memory_store.clone()) as Arc<dyn fleetgate::Store>,
                ),
                ("redis", Arc::new(redis_store.clone())),
                (UNBATCHED, Arc::new(unbatched_store.clone())),
            ] {
                for algorithm in ALGORITHMS {
                    // Only GCRA calls travel together.
                    if store_name == UNBATCHED && algorithm != Algorithm::Gcra {
                        continue;
                    }
                    common::flush_all(&mut admin).await?;
                    let limiter = Limiter::new(policy(algorithm)?, store.clone());
                    let keys = keys.clone();
                    let op = move |task: usize, n: usize| {
                        let decision = limiter.check(&keys[(task * 157 + n) % keys.len()], 1);
                        async move { decision.await.map(|d| d.is_allowed()) }
                    };
                    let every = if store_name == "memory" { 8 } else { 1 };
                    let subject = Subject::Store(store_name, algorithm);
                    rows.push(case(&mut admin, subject, concurrency, every, plan, op).await?);
                }
            }
            common::flush_all(&mut admin).await?;
            let (c, sha, keys, args) = (
                conn.clone(),
                Arc::new(gcra.clone()),
                keys.clone(),
                floor_args.clone(),
            );
            let op = move |task: usize, n: usize| {
                let (mut conn, sha, args) = (c.clone(), sha.clone(), args.clone());
                let key = format!(
                    "floor:bench:{{{}}}:0",
                    keys[(task * 157 + n) % keys.len()].text()
                );
                async move {
                    redis::cmd("EVALSHA")
                        .arg(sha.as_str())
                        .arg(1)
                        .arg(key)
                        .arg(&args[..])
                        .query_async::<Vec<Vec<i64>>>(&mut conn)
                        .await
                        .map(|v| v.first().and_then(|r| r.first()) == Some(&1))
                }
            };
            rows.push(case(&mut admin, Subject::Floor, concurrency, 1, plan, op).await?);
            let (c, sha) = (conn.clone(), Arc::new(return_one.clone()));
            let op = move |_task: usize, _n: usize| {
                let (mut conn, sha) = (c.clone(), sha.clone());
                async move {
                    redis::cmd("EVALSHA")
                        .arg(sha.as_str())
                        .arg(0)
                        .query_async::<i64>(&mut conn)
                        .await
                        .map(|v| v == 1)
                }
            };
            rows.push(case(&mut admin, Subject::RoundTrip, concurrency, 1, plan, op).await?);
        }
        rounds.push(rows);
    }
    let mut by_case: Vec<Vec<Row>> = Vec::new();
    for rows in rounds {
        for (i, row) in rows.into_iter().enumerate() {
            match by_case.get_mut(i) {
                Some(case) => case.push(row),
                None => by_case.push(vec![row]),
            }
        }
    }
    let rows: Vec<Row> = by_case.into_iter().map(median).collect();
    print_tables(&rows, plan, &version);
    Ok(())
}

/// The median of a case's rounds by decisions/s.
fn median(mut rounds: Vec<Row>) -> Row {
    rounds.sort_by(|a, b| a.per_sec().total_cmp(&b.per_sec()));
    let middle = rounds.len() / 2;
    rounds.swap_remove(middle)
}

/// Runs `op` from `concurrency` tasks: a warm-up, then the measured phase
/// between Redis' counter reset and read.
async fn case<F, Fut, E>(
    admin: &mut MultiplexedConnection,
    subject: Subject,
    concurrency: usize,
    every: usize,
    plan: &Plan,
    op: F,
) -> Result<Row, BoxError>
where
    F: Fn(usize, usize) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = Result<bool, E>> + Send + 'static,
    E: std::fmt::Display + Send + 'static,
{
    phase(concurrency, every, plan.warm_up, op.clone()).await?;
    stats::reset_stats(admin).await;
    let start = Instant::now();
    let tasks = phase(concurrency, every, plan.measure, op).await?;
    let elapsed = start.elapsed();
    let commands = stats::command_calls(admin).await;
    let mut row = Row {
        subject,
        concurrency,
        decisions: 0,
        allowed: 0,
        errors: 0,
        elapsed,
        latencies: Vec::new(),
        commands,
    };
    let mut first_error = None;
    for task in tasks {
        row.decisions += task.decisions;
        row.errors += task.errors;
        row.allowed += task.allowed;
        row.latencies.extend(task.latencies);
        first_error = first_error.or(task.first_error);
    }
    row.latencies.sort_unstable();
    let (store, algorithm) = subject.label();
    eprintln!(
        "{store} {algorithm} @ {concurrency}: {:.0} decisions/s, p99 {:.1} µs",
        row.per_sec(),
        micros(percentile(&row.latencies, 0.99))
    );
    if let Some(err) = first_error {
        eprintln!("  {} errors, first: {err}", row.errors);
    }
    Ok(row)
}

struct TaskStats {
    decisions: u64,
    latencies: Vec<Duration>,
    allowed: u64,
    errors: u64,
    first_error: Option<String>,
}

/// `concurrency` tasks calling `op` back to back until `duration` has
/// passed, timing every `every`-th call; every call started is awaited, so
/// none is in flight afterwards.
async fn phase<F, Fut, E>(
    concurrency: usize,
    every: usize,
    duration: Duration,
    op: F,
) -> Result<Vec<TaskStats>, BoxError>
where
    F: Fn(usize, usize) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = Result<bool, E>> + Send + 'static,
    E: std::fmt::Display + Send + 'static,
{
    let deadline = Instant::now() + duration;
    let handles: Vec<_> = (0..concurrency)
        .map(|task| {
            let op = op.clone();
            tokio::spawn(async move {
                let mut stats = TaskStats {
                    decisions: 0,
                    latencies: Vec::with_capacity(1 << 14),
                    allowed: 0,
                    errors: 0,
                    first_error: None,
                };
                let mut n = 0;
                while Instant::now() < deadline {
                    for _ in 0..64 {
                        let timed = n % every == 0;
                        let start = timed.then(Instant::now);
                        let result = op(task, n).await;
                        if let Some(start) = start {
                            stats.latencies.push(start.elapsed());
                        }
                        n += 1;
                        match result {
                            Ok(allowed) => stats.allowed += u64::from(allowed),
                            Err(err) => {
                                stats.errors += 1;
                                stats.first_error.get_or_insert_with(|| err.to_string());
                            }
                        }
                    }
                    tokio::task::yield_now().await;
                }
                stats.decisions = n as u64;
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

fn print_tables(rows: &[Row], plan: &Plan, version: &str) {
    println!(
        "\n### Raw decisions: each store and algorithm\n\n\
         10k identities, one limit of 1000 per 100 ms each; tasks on a two-worker runtime; \
         {:?} warm-up, {:?} measured per round, median of {} rounds; redis-server {version} \
         (private, loopback, sharing the 2 CPUs). \"x floor\": decisions/s over the \
         hand-written EVALSHA of gcra.lua at the same concurrency.\n",
        plan.warm_up, plan.measure, plan.rounds
    );
    println!(
        "| store | algorithm | concurrency | decisions/s | x floor | p50 µs | p99 µs | admitted | errors | round trips / decision | in-script commands / decision |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let floor = |c: usize| {
        rows.iter()
            .find(|r| r.subject == Subject::Floor && r.concurrency == c)
            .map_or(0.0, Row::per_sec)
    };
    for row in rows {
        let (store, algorithm) = row.subject.label();
        let decisions = row.decisions.max(1) as f64;
        let trips = stats::scripts_in(&row.commands);
        let total: u64 = row.commands.values().sum();
        let floor = floor(row.concurrency);
        println!(
            "| {store} | {algorithm} | {} | {:.0} | {} | {:.1} | {:.1} | {:.1}% | {} | {:.3} | {:.2} |",
            row.concurrency,
            row.per_sec(),
            if floor > 0.0 {
                format!("{:.2}", row.per_sec() / floor)
            } else {
                "-".into()
            },
            micros(percentile(&row.latencies, 0.50)),
            micros(percentile(&row.latencies, 0.99)),
            100.0 * row.allowed as f64 / decisions,
            row.errors,
            trips as f64 / decisions,
            (total - trips) as f64 / decisions,
        );
    }
    println!("\nRedis commands per case (measured phase, `INFO commandstats`):\n");
    for row in rows.iter().filter(|r| r.concurrency == 64) {
        let (store, algorithm) = row.subject.label();
        if store == "memory" {
            continue;
        }
        let mut calls: Vec<String> = row
            .commands
            .iter()
            .map(|(name, calls)| format!("{name}={calls}"))
            .collect();
        calls.sort();
        println!(
            "- {store} {algorithm} @ 64: {} decisions; {}",
            row.decisions,
            calls.join(", ")
        );
    }
    println!("{}", common::targets_heading());
    for algorithm in ALGORITHMS {
        let trips: Vec<f64> = rows
            .iter()
            .filter(|r| r.subject == Subject::Store("redis", algorithm))
            .map(|r| stats::scripts_in(&r.commands) as f64 / r.decisions.max(1) as f64)
            .collect();
        // Never more than one; below one where GCRA calls queued behind
        // the store's busy slots went together.
        let exact = !trips.is_empty() && trips.iter().all(|t| *t > 0.0 && *t <= 1.0);
        let shown: Vec<String> = trips.iter().map(|t| format!("{t:.3}")).collect();
        println!(
            "{}",
            target_row(
                &format!("raw: Redis round trips per decision, {algorithm} (c = 1, 16, 64)"),
                "≤ 1 (counted)",
                &shown.join(" / "),
                exact,
            )
        );
    }
}
