//! Raw decisions, outside any HTTP stack: each store (`MemoryStore`,
//! `RedisStore` on a private `redis-server`) and each algorithm at
//! concurrency 1, 16 and 64, beside the floor for any Redis limiter: a
//! plain redis-rs loop of one `EVALSHA` of the same `lua/gcra.lua` per
//! decision, as lean as a user would write it (a `redis::Script` loaded
//! once, `script.key(..).arg(..).invoke_async(..)` on a clone of one
//! `ConnectionManager`, no string building beyond the key), and the bare
//! round trip (`EVALSHA` of `return 1`). The Redis store runs
//! twice: as built by default, where calls that find the store's script
//! slots all in flight go together in one script, and with
//! `max_in_flight(usize::MAX)`, one script per call.
//!
//! ```sh
//! cargo bench --bench decisions
//! ```
//!
//! The client runs on a current-thread tokio runtime pinned to CPU 0, the
//! private `redis-server` on CPU 1. Tasks share one limiter (for Redis, one
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
//! After each concurrency's cases, `Limiter::check` on GCRA and the loop
//! run again in turn, in short slices (see `paired`): the targets that
//! compare the two use these, which a load swinging between cases spares.
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
    // redis-server (a child: it inherits the mask) on CPU 1, the client on
    // CPU 0: one core each.
    common::pin(1);
    let server = RedisServer::start();
    common::pin(0);
    let runtime = tokio::runtime::Builder::new_current_thread()
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
    /// The plain redis-rs `EVALSHA` loop of gcra.lua.
    Floor,
    /// `EVALSHA` of `return 1`.
    RoundTrip,
    /// Another project's limiter, run as a child process (see [`Peer`]).
    Peer(&'static str, &'static str),
}

impl Subject {
    fn label(self) -> (String, String) {
        match self {
            Subject::Store(store, algorithm) => (store.to_owned(), algorithm.name().to_owned()),
            Subject::Floor => ("plain redis-rs EVALSHA loop".into(), "gcra".into()),
            Subject::RoundTrip => ("plain redis-rs EVALSHA loop".into(), "`return 1`".into()),
            Subject::Peer(name, algorithm) => (name.into(), algorithm.into()),
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
    /// p50 and p99 as a peer's process reported them (it keeps its
    /// latencies to itself).
    reported: Option<(Duration, Duration)>,
    /// Decisions while Redis counted: all of a peer's (warm-up included),
    /// the measured ones otherwise.
    counted: u64,
    commands: HashMap<String, u64>,
    /// CPU time the client (this process's one runtime thread, or a peer's
    /// process) and redis-server used over the measured phase: what a
    /// decision costs each side, which a loaded machine disturbs far less
    /// than the decisions per second.
    client_cpu: Option<Duration>,
    redis_cpu: Option<Duration>,
}

impl Row {
    fn per_sec(&self) -> f64 {
        self.decisions as f64 / self.elapsed.as_secs_f64()
    }

    /// Redis CPU per decision counted, in µs.
    fn redis_cpu_us(&self) -> Option<f64> {
        self.redis_cpu
            .map(|cpu| micros(cpu) / self.counted.max(1) as f64)
    }

    fn p50(&self) -> Duration {
        self.reported
            .map_or_else(|| percentile(&self.latencies, 0.50), |(p50, _)| p50)
    }

    fn p99(&self) -> Duration {
        self.reported
            .map_or_else(|| percentile(&self.latencies, 0.99), |(_, p99)| p99)
    }
}

/// A peer: another project's limiter on its own private `redis-server`,
/// driven by a script in `benches/peers/` from a runtime installed by
/// `scripts/peers-install.sh` into `target/peers`.
struct Peer {
    subject: Subject,
    server: RedisServer,
    admin: MultiplexedConnection,
    program: std::path::PathBuf,
    script: &'static str,
    /// `NODE_PATH` for node.
    env: Option<(&'static str, std::path::PathBuf)>,
    /// The script takes a concurrency (node, asynchronous), or runs one
    /// call at a time (Python's blocking client), only at concurrency 1.
    concurrent: bool,
}

/// The peers whose runtime and packages are installed; a line on stderr
/// and in the report for each that is not.
async fn peers(skipped: &mut Vec<String>) -> Result<Vec<Peer>, BoxError> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = root.join("target/peers");
    let mut found = Vec::new();
    let modules = dir.join("node/node_modules");
    let node = which("node");
    match node {
        Some(node) if modules.join("rate-limiter-flexible").is_dir() => found.push((
            Subject::Peer("node rate-limiter-flexible (ioredis)", "fixed window"),
            node,
            "benches/peers/rate_limiter_flexible.js",
            Some(("NODE_PATH", modules)),
            true,
        )),
        Some(_) => skipped.push(format!(
            "node rate-limiter-flexible: not installed in {} (run scripts/peers-install.sh)",
            modules.display()
        )),
        None => skipped.push("node rate-limiter-flexible: no node on the PATH".into()),
    }
    let python = dir.join("py/bin/python");
    if python.is_file() {
        found.push((
            Subject::Peer("Python limits (redis-py)", "moving window"),
            python,
            "benches/peers/limits_moving_window.py",
            None,
            false,
        ));
    } else {
        skipped.push(format!(
            "Python limits: no virtualenv at {} (run scripts/peers-install.sh)",
            python.display()
        ));
    }
    let mut peers = Vec::new();
    for (subject, program, script, env, concurrent) in found {
        // Each on its own server, on CPU 1 as the store's.
        common::pin(1);
        let server = RedisServer::start();
        common::pin(0);
        let admin = server.client().get_multiplexed_async_connection().await?;
        peers.push(Peer {
            subject,
            server,
            admin,
            program,
            script,
            env,
            concurrent,
        });
    }
    Ok(peers)
}

fn which(program: &str) -> Option<std::path::PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join(program))
            .find(|path| path.is_file())
    })
}

/// One round of a peer at `concurrency`: its process runs its own warm-up
/// and measured phase (on CPU 0, as this process) and prints one JSON line.
async fn peer_case(peer: &mut Peer, concurrency: usize, plan: &Plan) -> Result<Row, BoxError> {
    common::flush_all(&mut peer.admin).await?;
    stats::reset_stats(&mut peer.admin).await;
    let root = env!("CARGO_MANIFEST_DIR");
    let mut command = tokio::process::Command::new(&peer.program);
    command
        .current_dir(root)
        .arg(peer.script)
        .arg(peer.server.port().to_string());
    if peer.concurrent {
        command.arg(concurrency.to_string());
    }
    command
        .arg(plan.warm_up.as_secs_f64().to_string())
        .arg(plan.measure.as_secs_f64().to_string());
    if let Some((name, value)) = &peer.env {
        command.env(name, value);
    }
    let redis_pid = peer.server.pid().to_string();
    let cpu_before = (common::children_cpu_time(), common::leader_cpu(&redis_pid));
    let output = command.output().await?;
    let client_cpu = common::cpu_delta(cpu_before.0, common::children_cpu_time());
    let redis_cpu = common::cpu_delta(cpu_before.1, common::leader_cpu(&redis_pid));
    if !output.status.success() {
        return Err(format!(
            "{} failed: {}",
            peer.script,
            String::from_utf8_lossy(&output.stderr)
        )
        .into());
    }
    let text = String::from_utf8_lossy(&output.stdout);
    let line = text.lines().last().ok_or("no output from the peer")?;
    let v: serde_json::Value = serde_json::from_str(line)?;
    let number = |field: &str| v[field].as_f64().ok_or(format!("no {field} in {line}"));
    let micros = |x: f64| Duration::from_nanos((x * 1000.0) as u64);
    let row = Row {
        subject: peer.subject,
        concurrency,
        decisions: number("decisions")? as u64,
        allowed: number("admitted")? as u64,
        errors: number("errors")? as u64,
        elapsed: Duration::from_secs_f64(number("secs")?),
        latencies: Vec::new(),
        reported: Some((micros(number("p50_us")?), micros(number("p99_us")?))),
        counted: number("all_decisions")? as u64,
        commands: stats::command_calls(&mut peer.admin).await,
        // Over its warm-up and its start too: all of its decisions.
        client_cpu,
        redis_cpu,
    };
    let (name, algorithm) = peer.subject.label();
    eprintln!(
        "{name} {algorithm} @ {concurrency}: {:.0} decisions/s, p99 {:.1} µs",
        row.per_sec(),
        crate::common::micros(row.p99())
    );
    Ok(row)
}

fn policy(algorithm: Algorithm) -> Result<Policy, BoxError> {
    Ok(Policy::builder(format!("bench-{algorithm}"))
        .algorithm(algorithm)
        .limit(Limit::new(Rate::new(1000, Duration::from_millis(100)))?)
        .build()?)
}

async fn run(server: &RedisServer, plan: &Plan) -> Result<(), BoxError> {
    let redis_pid = server.pid();
    let client = server.client();
    let mut admin = client.get_multiplexed_async_connection().await?;
    let version = common::redis_version(&mut admin).await?;
    let redis_store = RedisStore::builder(server.url())
        .timeout(Duration::from_secs(1))
        .connect()
        .await?;
    // The same store with every call its own script, to show what calls
    // travelling together (the default) change.
    let unbatched_store = RedisStore::builder(server.url())
        .timeout(Duration::from_secs(1))
        .max_in_flight(usize::MAX)
        .connect()
        .await?;
    let memory_store = MemoryStore::new();
    let keys: Arc<Vec<Key>> = Arc::new(
        (0..KEYS)
            .map(|i| Key::new(format!("ip:10.0.{}.{}", i / 256, i % 256)))
            .collect(),
    );
    let conn = ConnectionManager::new(client).await?;
    let return_one = Arc::new(redis::Script::new("return 1"));
    let gcra = Arc::new(redis::Script::new(&common::gcra_check_lua()));
    for script in [&return_one, &gcra] {
        script
            .prepare_invoke()
            .load_async(&mut conn.clone())
            .await?;
    }
    // The floor's arguments, as the store sends them for the bench's limit
    // (T = 100 µs, tolerance 100 ms).
    let limit = Limit::new(Rate::new(1000, Duration::from_millis(100)))?;
    let emission = u64::try_from(limit.emission_interval().as_micros())?;
    let tolerance = emission * 1000;

    let mut skipped = Vec::new();
    let mut peers = peers(&mut skipped).await?;
    for reason in &skipped {
        eprintln!("peer skipped: {reason}");
    }

    let mut rounds: Vec<Vec<Row>> = Vec::new();
    // Limiter::check on GCRA and the floor in interleaved slices, per
    // concurrency, summed over the rounds (see [`paired`]).
    let mut pairs: HashMap<usize, [Side; 2]> = HashMap::new();
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
                    common::flush_all(&mut admin).await?;
                    let limiter = Limiter::new(policy(algorithm)?, store.clone());
                    let keys = keys.clone();
                    let op = move |task: usize, n: usize| {
                        let decision = limiter.check(&keys[(task * 157 + n) % keys.len()], 1);
                        async move { decision.await.map(|d| d.is_allowed()) }
                    };
                    let every = if store_name == "memory" { 8 } else { 1 };
                    let subject = Subject::Store(store_name, algorithm);
                    rows.push(
                        case(&mut admin, redis_pid, subject, concurrency, every, plan, op).await?,
                    );
                }
            }
            common::flush_all(&mut admin).await?;
            let (c, script, keys_floor) = (conn.clone(), gcra.clone(), keys.clone());
            let floor_op = move |task: usize, n: usize| {
                let (mut conn, script) = (c.clone(), script.clone());
                let key = format!(
                    "floor:bench:{{{}}}:0",
                    keys_floor[(task * 157 + n) % keys_floor.len()].text()
                );
                async move {
                    // now = server clock; 1 set of 1 limit: T, tolerance;
                    // 1 call: of set 1, cost 1, no wait.
                    script
                        .key(key)
                        .arg("")
                        .arg(1)
                        .arg(1)
                        .arg(emission)
                        .arg(tolerance)
                        .arg(1)
                        .arg(1)
                        .arg(0)
                        .invoke_async::<Vec<i64>>(&mut conn)
                        .await
                        .map(|v| v.first() == Some(&1))
                }
            };
            rows.push(
                case(
                    &mut admin,
                    redis_pid,
                    Subject::Floor,
                    concurrency,
                    1,
                    plan,
                    floor_op.clone(),
                )
                .await?,
            );
            let limiter = Limiter::new(
                policy(Algorithm::Gcra)?,
                Arc::new(redis_store.clone()) as Arc<dyn fleetgate::Store>,
            );
            let keys_check = keys.clone();
            let check_op = move |task: usize, n: usize| {
                let decision = limiter.check(&keys_check[(task * 157 + n) % keys_check.len()], 1);
                async move { decision.await.map(|d| d.is_allowed()) }
            };
            let [check, floor] = paired(concurrency, plan, check_op, floor_op).await?;
            let sums = pairs.entry(concurrency).or_default();
            sums[0].add(check);
            sums[1].add(floor);
            let (c, script) = (conn.clone(), return_one.clone());
            let op = move |_task: usize, _n: usize| {
                let (mut conn, script) = (c.clone(), script.clone());
                async move {
                    script
                        .invoke_async::<_, i64>(&mut conn)
                        .await
                        .map(|v| v == 1)
                }
            };
            rows.push(
                case(
                    &mut admin,
                    redis_pid,
                    Subject::RoundTrip,
                    concurrency,
                    1,
                    plan,
                    op,
                )
                .await?,
            );
            for peer in &mut peers {
                if peer.concurrent || concurrency == 1 {
                    rows.push(peer_case(peer, concurrency, plan).await?);
                }
            }
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
    print_tables(&rows, &pairs, plan, &version, &skipped);
    Ok(())
}

/// The median of a case's rounds by decisions/s.
fn median(mut rounds: Vec<Row>) -> Row {
    rounds.sort_by(|a, b| a.per_sec().total_cmp(&b.per_sec()));
    let middle = rounds.len() / 2;
    rounds.swap_remove(middle)
}

/// One side of [`paired`]: its slices' decisions, time and latencies.
#[derive(Default)]
struct Side {
    decisions: u64,
    elapsed: Duration,
    latencies: Vec<Duration>,
}

impl Side {
    fn add(&mut self, other: Side) {
        self.decisions += other.decisions;
        self.elapsed += other.elapsed;
        self.latencies.extend(other.latencies);
    }

    fn per_sec(&self) -> f64 {
        self.decisions as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    fn p99(&mut self) -> Duration {
        self.latencies.sort_unstable();
        percentile(&self.latencies, 0.99)
    }
}

/// Slices per side in [`paired`].
const SLICES: u32 = 10;

/// `a` and `b` at `concurrency`, each for the measured time, in
/// [`SLICES`] slices taken in turn (a b, b a, a b, ...): on a machine
/// whose load swings from one second to the next (other jobs on both
/// cores), cases run one after the other compare moments as much as
/// clients, while slices a few tens of milliseconds apart see the same
/// load. The targets comparing `Limiter::check` with the floor use these.
async fn paired<FA, FutA, EA, FB, FutB, EB>(
    concurrency: usize,
    plan: &Plan,
    a: FA,
    b: FB,
) -> Result<[Side; 2], BoxError>
where
    FA: Fn(usize, usize) -> FutA + Clone + Send + 'static,
    FutA: Future<Output = Result<bool, EA>> + Send + 'static,
    EA: std::fmt::Display + Send + 'static,
    FB: Fn(usize, usize) -> FutB + Clone + Send + 'static,
    FutB: Future<Output = Result<bool, EB>> + Send + 'static,
    EB: std::fmt::Display + Send + 'static,
{
    phase(concurrency, 1, plan.warm_up / 2, a.clone()).await?;
    phase(concurrency, 1, plan.warm_up / 2, b.clone()).await?;
    let slice = plan.measure / SLICES;
    let mut sides = [Side::default(), Side::default()];
    for i in 0..2 * SLICES {
        let first_a = (i / 2) % 2 == 0;
        let side = usize::from((i % 2 == 0) != first_a);
        let start = Instant::now();
        let tasks = if side == 0 {
            phase(concurrency, 1, slice, a.clone()).await?
        } else {
            phase(concurrency, 1, slice, b.clone()).await?
        };
        let elapsed = start.elapsed();
        let sum = &mut sides[side];
        sum.elapsed += elapsed;
        for task in tasks {
            sum.decisions += task.decisions;
            sum.latencies.extend(task.latencies);
        }
    }
    Ok(sides)
}

/// Runs `op` from `concurrency` tasks: a warm-up, then the measured phase
/// between Redis' counter reset and read.
async fn case<F, Fut, E>(
    admin: &mut MultiplexedConnection,
    redis_pid: u32,
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
    let redis_pid = redis_pid.to_string();
    let cpu_before = (common::leader_cpu("self"), common::leader_cpu(&redis_pid));
    let start = Instant::now();
    let tasks = phase(concurrency, every, plan.measure, op).await?;
    let elapsed = start.elapsed();
    let client_cpu = common::cpu_delta(cpu_before.0, common::leader_cpu("self"));
    let redis_cpu = common::cpu_delta(cpu_before.1, common::leader_cpu(&redis_pid));
    let commands = stats::command_calls(admin).await;
    let mut row = Row {
        subject,
        concurrency,
        decisions: 0,
        allowed: 0,
        errors: 0,
        elapsed,
        latencies: Vec::new(),
        reported: None,
        counted: 0,
        commands,
        client_cpu,
        redis_cpu,
    };
    let mut first_error = None;
    for task in tasks {
        row.decisions += task.decisions;
        row.errors += task.errors;
        row.allowed += task.allowed;
        row.latencies.extend(task.latencies);
        first_error = first_error.or(task.first_error);
    }
    row.counted = row.decisions;
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
/// passed, timing every `every`-th call and starting none after the
/// deadline once a timed call sees it; every call started is awaited, so
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
                'run: loop {
                    for _ in 0..64 {
                        // The deadline is read with each timed call's start,
                        // so that no task goes on past it for more than
                        // `every` calls (as the peers' loops check it before
                        // each call): checked once per 64 calls, the last
                        // calls of a phase ran at a dwindling concurrency,
                        // up to 64 round trips past the end.
                        let timed = n % every == 0;
                        let start = if timed {
                            let now = Instant::now();
                            if now >= deadline {
                                break 'run;
                            }
                            Some(now)
                        } else {
                            None
                        };
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
                    // A store that never waits (memory) would otherwise
                    // hold the thread until the deadline.
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

fn per_decision(cpu: Option<Duration>, decisions: f64) -> String {
    cpu.map_or("-".into(), |cpu| format!("{:.2}", micros(cpu) / decisions))
}

fn print_tables(
    rows: &[Row],
    pairs: &HashMap<usize, [Side; 2]>,
    plan: &Plan,
    version: &str,
    skipped: &[String],
) {
    println!(
        "\n### Raw decisions: each store and algorithm\n\n\
         10k identities, one limit of 1000 per 100 ms each; tasks on a current-thread runtime \
         on CPU 0, redis-server on CPU 1; \
         {:?} warm-up, {:?} measured per round, median of {} rounds; redis-server {version} \
         (private, loopback). \"x floor\": decisions/s over the plain \
         redis-rs EVALSHA loop of gcra.lua at the same concurrency. Peers: each on its own \
         redis-server on CPU 1, its process on CPU 0; scripts / decision count `EVALSHA` + \
         `EVAL` over its warm-up and measured phase.\n",
        plan.warm_up, plan.measure, plan.rounds
    );
    for reason in skipped {
        println!("Peer skipped: {reason}.\n");
    }
    println!(
        "| store | algorithm | concurrency | decisions/s | x floor | p50 µs | p99 µs | admitted | errors | scripts / decision | other commands / decision | client CPU µs / decision | Redis CPU µs / decision |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let floor = |c: usize| {
        rows.iter()
            .find(|r| r.subject == Subject::Floor && r.concurrency == c)
            .map_or(0.0, Row::per_sec)
    };
    for row in rows {
        let (store, algorithm) = row.subject.label();
        let decisions = row.decisions.max(1) as f64;
        let counted = row.counted.max(1) as f64;
        let trips = stats::scripts_in(&row.commands);
        let total: u64 = row.commands.values().sum();
        let floor = floor(row.concurrency);
        println!(
            "| {store} | {algorithm} | {} | {:.0} | {} | {:.1} | {:.1} | {:.1}% | {} | {:.3} | {:.2} | {} | {} |",
            row.concurrency,
            row.per_sec(),
            if floor > 0.0 {
                format!("{:.2}", row.per_sec() / floor)
            } else {
                "-".into()
            },
            micros(row.p50()),
            micros(row.p99()),
            100.0 * row.allowed as f64 / decisions,
            row.errors,
            trips as f64 / counted,
            (total - trips) as f64 / counted,
            per_decision(row.client_cpu, counted),
            per_decision(row.redis_cpu, counted),
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
    let at = |subject: Subject, c: usize| {
        rows.iter()
            .find(|r| r.subject == subject && r.concurrency == c)
    };
    let peer_target = |ours: Algorithm, c: usize, peer: &str, min: f64| {
        let theirs = rows
            .iter()
            .filter(|r| matches!(r.subject, Subject::Peer(name, _) if name == peer))
            .max_by(|a, b| a.per_sec().total_cmp(&b.per_sec()));
        if let (Some(ours_row), Some(theirs)) = (at(Subject::Store("redis", ours), c), theirs) {
            let ratio = ours_row.per_sec() / theirs.per_sec().max(1e-9);
            let (_, algorithm) = theirs.subject.label();
            println!(
                "{}",
                target_row(
                    &format!(
                        "peers: Limiter::check {ours} at c = {c} / {peer} {algorithm} at its best (c = {})",
                        theirs.concurrency
                    ),
                    &format!("≥ {min:.1}x decisions/s"),
                    &format!(
                        "{ratio:.2} ({:.0} vs {:.0})",
                        ours_row.per_sec(),
                        theirs.per_sec()
                    ),
                    (ratio * 100.0).round() / 100.0 >= min,
                )
            );
        }
    };
    peer_target(
        Algorithm::Gcra,
        64,
        "node rate-limiter-flexible (ioredis)",
        1.5,
    );
    peer_target(Algorithm::SlidingLog, 64, "Python limits (redis-py)", 5.0);
    // Redis CPU per decision at 64 in flight, the cost a fleet shares. The
    // bounds were set as microseconds on a host where the plain loop cost
    // Redis 7.0 µs a decision (GCRA 3.5, fixed window and sliding-window
    // counter 4, sliding log 7); hosts of this kind differ in speed from
    // day to day, so each bound is that share of this run's loop.
    let redis_cpu = |subject: Subject| at(subject, 64).and_then(Row::redis_cpu_us);
    if let Some(floor) = redis_cpu(Subject::Floor) {
        for (algorithm, share) in [
            (Algorithm::Gcra, 3.5 / 7.0),
            (Algorithm::FixedWindow, 4.0 / 7.0),
            (Algorithm::SlidingWindow, 4.0 / 7.0),
            (Algorithm::SlidingLog, 1.0),
        ] {
            if let Some(ours) = redis_cpu(Subject::Store("redis", algorithm)) {
                println!(
                    "{}",
                    target_row(
                        &format!("raw: Redis CPU per decision, {algorithm}, c = 64"),
                        &format!("≤ {share:.2}x the loop's ({:.2} µs)", floor * share),
                        &format!("{ours:.2} µs ({:.2}x)", ours / floor),
                        ours <= floor * share,
                    )
                );
            }
        }
    }
    let peer = rows.iter().filter(|r| r.concurrency == 64).find(
        |r| matches!(r.subject, Subject::Peer(name, _) if name.contains("rate-limiter-flexible")),
    );
    if let (Some(ours), Some(theirs)) = (
        redis_cpu(Subject::Store("redis", Algorithm::Gcra)),
        peer.and_then(Row::redis_cpu_us),
    ) {
        let ratio = theirs / ours;
        println!(
            "{}",
            target_row(
                "peers: decisions per Redis core, Limiter::check gcra / rate-limiter-flexible, c = 64",
                "≥ 2.0x",
                &format!("{ratio:.2} ({ours:.2} vs {theirs:.2} µs)"),
                ratio >= 2.0,
            )
        );
    }
    for c in CONCURRENCY {
        let Some([ours, floor]) = pairs.get(&c) else {
            continue;
        };
        let (mut ours, mut floor) = (
            Side {
                latencies: ours.latencies.clone(),
                ..*ours
            },
            Side {
                latencies: floor.latencies.clone(),
                ..*floor
            },
        );
        let ratio = ours.per_sec() / floor.per_sec().max(1e-9);
        println!(
            "{}",
            target_row(
                &format!(
                    "raw, interleaved: Limiter::check GCRA on Redis / plain EVALSHA loop, c = {c}"
                ),
                "≥ 1.00x decisions/s",
                &format!(
                    "{ratio:.2} ({:.0} vs {:.0})",
                    ours.per_sec(),
                    floor.per_sec()
                ),
                (ratio * 100.0).round() / 100.0 >= 1.0,
            )
        );
        let (ours_p99, floor_p99) = (ours.p99(), floor.p99());
        println!(
            "{}",
            target_row(
                &format!(
                    "raw, interleaved: Limiter::check GCRA on Redis p99 vs plain EVALSHA loop, c = {c}"
                ),
                "p99 ≤ the loop's",
                &format!("{:.0} vs {:.0} µs", micros(ours_p99), micros(floor_p99)),
                ours_p99 <= floor_p99,
            )
        );
    }
}
