//! What the deny cache saves: a client far over its limit, against a
//! private `redis-server`, with the cache on and off.
//!
//! ```sh
//! cargo bench --bench deny_cache
//! ```
//!
//! Two measurements per setting:
//!
//! - **denied decision latency**: one task calling `check` back to back
//!   on a key that is over its limit (1 per hour), for a fixed time.
//! - **hammer**: two store instances (as two fleet instances) each send one
//!   request per millisecond at one key limited to 10 per second (burst
//!   10), about 100 times its limit, for a fixed time; Redis' own counters
//!   (`INFO commandstats`) say how many scripts reached it.
//!
//! `FLEETGATE_BENCH_SECS` sets the time per measurement (default 3). Run
//! without `--bench` (as `cargo test --all-targets` does) it only
//! smoke-tests each case for a moment.

#[path = "../tests/common/redis_server.rs"]
mod redis_server;
#[path = "../tests/common/stats.rs"]
mod stats;

use std::time::{Duration, Instant};

use fleetgate::{Key, Limit, Limiter, Policy, Rate, RedisStore};

use crate::redis_server::RedisServer;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

fn main() -> Result<(), BoxError> {
    let bench = std::env::args().any(|a| a == "--bench");
    let run = if bench {
        let secs = std::env::var("FLEETGATE_BENCH_SECS")
            .ok()
            .and_then(|s| s.parse::<f64>().ok())
            .filter(|s| *s > 0.0)
            .unwrap_or(3.0);
        Duration::from_secs_f64(secs)
    } else {
        Duration::from_millis(100)
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

async fn store(server: &RedisServer, cache: usize) -> Result<RedisStore, BoxError> {
    let store = RedisStore::builder(server.url())
        .prefix("bench-deny")
        .timeout(Duration::from_secs(1))
        .deny_cache(cache)
        .connect()
        .await?;
    // Load the script, so that every measured decision is one EVALSHA.
    let warm = Policy::single("warm", Limit::new(Rate::per_second(1))?)?;
    Limiter::new(warm, store.clone())
        .check(&Key::new("warm"), 1)
        .await?;
    Ok(store)
}

async fn measure(server: &RedisServer, run: Duration) -> Result<(), BoxError> {
    let mut admin = server.client().get_multiplexed_async_connection().await?;
    println!(
        "redis-server on {} (private, loopback); {run:?} per case\n",
        server.url()
    );
    println!(
        "| deny cache | denied decisions/s | p50 µs | p99 µs | hammer requests | admitted | scripts sent to Redis | per second |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    // 10,000: the default.
    for cache in [0, 10_000] {
        // Denied decisions, back to back, one task.
        let limiter = Limiter::new(
            Policy::single("deny", Limit::new(Rate::per_hour(1))?)?,
            store(server, cache).await?,
        );
        let key = Key::new(format!("over-{cache}"));
        limiter.check(&key, 1).await?;
        let mut latencies = Vec::new();
        let started = Instant::now();
        while started.elapsed() < run {
            let t = Instant::now();
            let d = limiter.check(&key, 1).await?;
            latencies.push(t.elapsed());
            assert!(!d.is_allowed());
        }
        let elapsed = started.elapsed();
        latencies.sort_unstable();
        let pct = |p: f64| {
            let i = ((p * latencies.len() as f64).ceil() as usize).clamp(1, latencies.len());
            latencies[i - 1].as_secs_f64() * 1e6
        };
        let rate = latencies.len() as f64 / elapsed.as_secs_f64();

        // The hammer: two instances, 1 request per ms each.
        let policy = Policy::single(
            "hammer",
            Limit::builder(Rate::per_second(10)).burst(10).build()?,
        )?;
        let stores = [store(server, cache).await?, store(server, cache).await?];
        stats::reset_stats(&mut admin).await;
        let started = Instant::now();
        let mut tasks = Vec::new();
        for store in stores {
            let limiter = Limiter::new(policy.clone(), store);
            let key = Key::new(format!("hammered-{cache}"));
            tasks.push(tokio::spawn(async move {
                let mut tick = tokio::time::interval(Duration::from_millis(1));
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
                let (mut sent, mut admitted) = (0u64, 0u64);
                while started.elapsed() < run {
                    tick.tick().await;
                    sent += 1;
                    if limiter.check(&key, 1).await.is_ok_and(|d| d.is_allowed()) {
                        admitted += 1;
                    }
                }
                (sent, admitted)
            }));
        }
        let (mut sent, mut admitted) = (0, 0);
        for task in tasks {
            let (s, a) = task.await?;
            sent += s;
            admitted += a;
        }
        let hammer_secs = started.elapsed().as_secs_f64();
        let calls = stats::script_calls(&mut admin).await;
        println!(
            "| {} | {rate:.0} | {:.1} | {:.1} | {sent} | {admitted} | {calls} | {:.1} |",
            if cache == 0 { "off" } else { "on (default)" },
            pct(0.50),
            pct(0.99),
            calls as f64 / hammer_secs,
        );
    }
    Ok(())
}
