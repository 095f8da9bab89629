//! What cost known after the response costs per request, beside a plain
//! decision: `check` alone, then `peek`, `charge` and `refund` alone, then
//! the two patterns a request pays for, charge-after (`peek` before the
//! call, `charge` after) and refund (`check` before, `refund` after, here
//! for every request: the worst case, every response failing), on the
//! memory store and on a private `redis-server`.
//!
//! ```sh
//! cargo bench --bench adjust
//! ```
//!
//! Per case: one task back to back (latency: p50 and p99 of a request's
//! store calls, requests/s), then 50 tasks at once over 10,000 keys
//! (requests/s), and for Redis the scripts Redis ran per request (its own
//! `INFO commandstats`). All calls are admitted (a limit of a million a
//! second). `FLEETGATE_BENCH_SECS` sets the time per measurement (default
//! 2). Run without `--bench` (as `cargo test --all-targets` does) it only
//! smoke-tests each case for a moment.

mod common;
#[path = "../tests/common/redis_server.rs"]
mod redis_server;
#[path = "../tests/common/stats.rs"]
mod stats;

use std::sync::Arc;
use std::time::{Duration, Instant};

use fleetgate::{Key, Limit, Limiter, MemoryStore, Policy, Rate, RedisStore, Store};

use crate::common::{BoxError, measuring, micros, percentile, secs};
use crate::redis_server::RedisServer;

const KEYS: usize = 10_000;
const IN_FLIGHT: usize = 50;

#[derive(Clone, Copy, Debug)]
enum Case {
    Check,
    Peek,
    Charge,
    Refund,
    /// `peek(1)` before the call, `charge(cost)` after.
    ChargeAfter,
    /// `check(cost)` before the call, `refund(cost)` after.
    CheckRefund,
}

impl Case {
    const ALL: [Case; 6] = [
        Case::Check,
        Case::Peek,
        Case::Charge,
        Case::Refund,
        Case::ChargeAfter,
        Case::CheckRefund,
    ];

    fn name(self) -> &'static str {
        match self {
            Case::Check => "check (plain decision)",
            Case::Peek => "peek",
            Case::Charge => "charge",
            Case::Refund => "refund",
            Case::ChargeAfter => "charge after: peek + charge",
            Case::CheckRefund => "refund: check + refund",
        }
    }

    /// One request's store calls.
    async fn run(self, limiter: &Limiter, key: &Key) -> Result<(), BoxError> {
        match self {
            Case::Check => drop(limiter.check(key, 1).await?),
            Case::Peek => drop(limiter.peek(key, 1).await?),
            Case::Charge => drop(limiter.charge(key, 3).await?),
            Case::Refund => limiter.refund(key, 1).await?,
            Case::ChargeAfter => {
                limiter.peek(key, 1).await?;
                limiter.charge(key, 3).await?;
            }
            Case::CheckRefund => {
                limiter.check(key, 1).await?;
                limiter.refund(key, 1).await?;
            }
        }
        Ok(())
    }
}

fn main() -> Result<(), BoxError> {
    let run = if measuring() {
        secs("FLEETGATE_BENCH_SECS", 2.0)
    } else {
        Duration::from_millis(50)
    };
    let server = RedisServer::start();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let result = runtime.block_on(measure(&server, run));
    drop(runtime);
    drop(server);
    result
}

async fn measure(server: &RedisServer, run: Duration) -> Result<(), BoxError> {
    let mut admin = server.client().get_multiplexed_async_connection().await?;
    println!(
        "redis-server on {} (private, loopback); {run:?} per measurement\n",
        server.url()
    );
    println!(
        "| store | case | p50 µs | p99 µs | requests/s, 1 task | requests/s, {IN_FLIGHT} tasks | Redis scripts / request |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|");
    let redis: Arc<dyn Store> = Arc::new(
        RedisStore::builder(server.url())
            .prefix("bench-adjust")
            .timeout(Duration::from_secs(1))
            .connect()
            .await?,
    );
    let memory: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let limit = Limit::builder(Rate::per_second(1_000_000))
        .burst(1_000_000)
        .build()?;
    let policy = Policy::single("adjust", limit)?;
    let keys: Arc<[Key]> = (0..KEYS).map(|i| Key::new(format!("k{i}"))).collect();
    for (name, store) in [("memory", memory), ("Redis", redis)] {
        let limiter = Limiter::new(policy.clone(), store);
        // Load every script, so that each measured call is one EVALSHA.
        for case in Case::ALL {
            case.run(&limiter, &keys[0]).await?;
        }
        for case in Case::ALL {
            // One task, back to back.
            let mut latencies = Vec::new();
            let started = Instant::now();
            let mut i = 0;
            while started.elapsed() < run {
                let t = Instant::now();
                case.run(&limiter, &keys[i % KEYS]).await?;
                latencies.push(t.elapsed());
                i += 1;
            }
            let one = latencies.len() as f64 / started.elapsed().as_secs_f64();
            latencies.sort_unstable();

            // Many tasks at once, Redis' script counter around them.
            stats::reset_stats(&mut admin).await;
            let started = Instant::now();
            let mut tasks = Vec::new();
            for t in 0..IN_FLIGHT {
                let (limiter, keys) = (limiter.clone(), keys.clone());
                tasks.push(tokio::spawn(async move {
                    let mut done = 0usize;
                    while started.elapsed() < run {
                        let key = &keys[(t * 7919 + done * 31) % KEYS];
                        case.run(&limiter, key).await?;
                        done += 1;
                    }
                    Ok::<usize, BoxError>(done)
                }));
            }
            let mut requests = 0;
            for task in tasks {
                requests += task.await??;
            }
            let many = requests as f64 / started.elapsed().as_secs_f64();
            let scripts = stats::script_calls(&mut admin).await;
            let per_request = if name == "Redis" {
                format!("{:.2}", scripts as f64 / requests as f64)
            } else {
                "0".to_owned()
            };
            println!(
                "| {name} | {} | {:.1} | {:.1} | {one:.0} | {many:.0} | {per_request} |",
                case.name(),
                micros(percentile(&latencies, 0.50)),
                micros(percentile(&latencies, 0.99)),
            );
        }
    }
    Ok(())
}
