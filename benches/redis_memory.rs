//! Redis memory per identity for each algorithm, on a private
//! `redis-server`: GCRA, sliding log, sliding-window counter and fixed
//! window.
//!
//! ```sh
//! cargo bench --bench redis_memory
//! ```
//!
//! For each algorithm, with one limit of 100 per day per identity: after
//! `FLUSHALL`, one admitted call for each of 100k identities (for the
//! sliding log, 10 calls each as well), then Redis' `used_memory` growth
//! per identity, the keys per identity, and `MEMORY USAGE` of one
//! identity's keys. `FLEETGATE_BENCH_KEYS` changes the 100k. Run without
//! `--bench` (as `cargo test --all-targets` does) it uses 1k identities.

#[path = "../tests/common/redis_server.rs"]
mod redis_server;

mod common;

use std::sync::Arc;
use std::time::Duration;

use fleetgate::{Algorithm, Key, Limit, Limiter, Policy, Rate, RedisStore};
use redis::aio::MultiplexedConnection;

use crate::common::{BoxError, info_field};
use crate::redis_server::RedisServer;

const CONCURRENCY: usize = 64;
const ALGORITHMS: [Algorithm; 4] = [
    Algorithm::Gcra,
    Algorithm::SlidingLog,
    Algorithm::SlidingWindow,
    Algorithm::FixedWindow,
];

fn main() -> Result<(), BoxError> {
    let identities = if common::measuring() {
        common::count("FLEETGATE_BENCH_KEYS", 100_000)
    } else {
        1_000
    };
    let server = RedisServer::start();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let result = runtime.block_on(run(&server, identities));
    drop(runtime);
    drop(server);
    result
}

/// Named as the demo's `/api/ping` policy for every algorithm (each runs
/// alone, after `FLUSHALL`): a key's length is part of what it costs, so
/// the figures are those of a key an operator would see.
fn policy(algorithm: Algorithm) -> Result<Policy, BoxError> {
    Ok(Policy::builder("ping")
        .algorithm(algorithm)
        .limit(Limit::new(Rate::per_day(100))?)
        .build()?)
}

async fn run(server: &RedisServer, identities: usize) -> Result<(), BoxError> {
    let mut admin = server.client().get_multiplexed_async_connection().await?;
    let version = common::redis_version(&mut admin).await?;
    println!(
        "\n### Redis memory per identity\n\n\
         redis-server {version} (private, loopback); one limit of 100 per day; \
         after {identities} identities\n"
    );
    let store = RedisStore::builder(server.url())
        .timeout(Duration::from_secs(1))
        .connect()
        .await?;
    println!(
        "| algorithm | calls per identity | used_memory growth / identity (bytes) | keys / identity | MEMORY USAGE of one identity's keys (bytes) |"
    );
    println!("|---|---:|---:|---:|---:|");
    let mut cases: Vec<(Algorithm, usize)> = ALGORITHMS.iter().map(|a| (*a, 1)).collect();
    let mut targets = Vec::new();
    cases.push((Algorithm::SlidingLog, 10));
    for (algorithm, calls) in cases {
        common::flush_all(&mut admin).await?;
        let before = used_memory(&mut admin).await?;
        let policy = policy(algorithm)?;
        let limiter = Limiter::new(policy.clone(), store.clone());
        let keys: Arc<Vec<Key>> = Arc::new(
            (0..identities)
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
        let mut usage = 0u64;
        for key in sample_keys(&store, &policy, &keys[0]) {
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
        let most = match (algorithm, calls) {
            (Algorithm::Gcra, _) => Some(80),
            (Algorithm::SlidingWindow, _) => Some(120),
            _ => None,
        };
        if let Some(most) = most {
            targets.push(common::target_row(
                &format!("redis memory: MEMORY USAGE of an identity's keys, {algorithm}"),
                &format!("≤ {most} B"),
                &format!("{usage} B"),
                usage <= most,
            ));
        }
    }
    println!("{}", common::targets_heading());
    for row in targets {
        println!("{row}");
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

async fn used_memory(admin: &mut MultiplexedConnection) -> Result<u64, BoxError> {
    let info: String = redis::cmd("INFO").arg("memory").query_async(admin).await?;
    info_field(&info, "used_memory")
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| "INFO memory without used_memory".into())
}
