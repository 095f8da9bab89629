//! What a penalty box costs Redis: the CPU redis-server spends per
//! decision of a policy with `block 1h` beside the same policy without
//! it, for each algorithm, on the admitted path (10,000 identities, all
//! under their limit) and on a blocked identity's refusals (deny cache
//! off, so that each refusal reaches Redis).
//!
//! ```sh
//! cargo bench --bench penalty_box
//! ```
//!
//! One task, one decision in flight: each decision is one `EVALSHA`.
//! redis-server is pinned to CPU 1 and the client to CPU 0; its CPU is
//! read from `/proc/<pid>/schedstat` over each measured phase. Rounds
//! alternate the two policies; rows are medians. `FLEETGATE_BENCH_SECS`
//! (default 1) and `FLEETGATE_BENCH_ROUNDS` (default 5) set the time per
//! phase and the rounds. Run without `--bench` (as `cargo test
//! --all-targets` does) it only smoke-tests each case for a moment.

#[path = "../tests/common/redis_server.rs"]
mod redis_server;

mod common;

use std::time::{Duration, Instant};

use fleetgate::spec::PolicySpec;
use fleetgate::{Algorithm, Key, Limiter, RedisStore};

use crate::common::{BoxError, micros};
use crate::redis_server::RedisServer;

const KEYS: usize = 10_000;

fn main() -> Result<(), BoxError> {
    let (run, rounds) = if common::measuring() {
        (
            common::secs("FLEETGATE_BENCH_SECS", 1.0),
            common::count("FLEETGATE_BENCH_ROUNDS", 5),
        )
    } else {
        (Duration::from_millis(30), 1)
    };
    common::pin(1);
    let server = RedisServer::start();
    common::pin(0);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let result = runtime.block_on(measure(&server, run, rounds));
    drop(runtime);
    drop(server);
    result
}

/// Decisions for `run` on `keys` in turn: Redis CPU µs per decision, and
/// how many were admitted and made.
async fn phase(
    limiter: &Limiter,
    keys: &[Key],
    run: Duration,
    pid: u32,
) -> Result<(f64, u64, u64), BoxError> {
    let pid = pid.to_string();
    let cpu = common::leader_cpu(&pid);
    let started = Instant::now();
    let (mut made, mut allowed) = (0u64, 0u64);
    while started.elapsed() < run {
        for _ in 0..64 {
            let key = &keys[made as usize % keys.len()];
            allowed += u64::from(limiter.check(key, 1).await?.is_allowed());
            made += 1;
        }
    }
    let used = common::cpu_delta(cpu, common::leader_cpu(&pid)).unwrap_or_default();
    Ok((micros(used) / made.max(1) as f64, allowed, made))
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(0.0)
}

async fn measure(server: &RedisServer, run: Duration, rounds: usize) -> Result<(), BoxError> {
    let pid = server.pid();
    let store = RedisStore::builder(server.url())
        .prefix("bench-box")
        .timeout(Duration::from_secs(1))
        .deny_cache(0)
        .connect()
        .await?;
    let keys: Vec<Key> = (0..KEYS).map(|i| Key::new(format!("user:{i}"))).collect();
    println!(
        "redis-server on {} (private, loopback, CPU 1); {run:?} per phase, {rounds} rounds, one decision in flight\n",
        server.url()
    );
    println!(
        "| algorithm | admitted: Redis CPU µs / decision, plain | with `block 1h` | x | blocked refusals: µs / decision |"
    );
    println!("|---|---:|---:|---:|---:|");
    for algorithm in [
        Algorithm::Gcra,
        Algorithm::SlidingLog,
        Algorithm::SlidingWindow,
        Algorithm::FixedWindow,
    ] {
        let name = algorithm.name();
        let limiter = |block: &str| -> Result<Limiter, BoxError> {
            let text = format!("100000/h {block} {name}");
            let policy = text
                .parse::<PolicySpec>()?
                .build(format!("box-{name}-{}", block.is_empty()))?;
            Ok(Limiter::new(policy, store.clone()))
        };
        let (plain, boxed) = (limiter("")?, limiter("block 1h")?);
        let (mut a, mut b) = (Vec::new(), Vec::new());
        for _ in 0..rounds {
            let (us, allowed, made) = phase(&plain, &keys, run, pid).await?;
            assert_eq!(allowed, made, "{name}: plain refused");
            a.push(us);
            let (us, allowed, made) = phase(&boxed, &keys, run, pid).await?;
            assert_eq!(allowed, made, "{name}: boxed refused");
            b.push(us);
        }
        // A blocked identity: refused by its box on every decision.
        let tight = format!("1/h block 1h {name}")
            .parse::<PolicySpec>()?
            .build(format!("box-tight-{name}"))?;
        let tight = Limiter::new(tight, store.clone());
        let mallory = [Key::new(format!("mallory-{name}"))];
        tight.check(&mallory[0], 1).await?;
        let started = tight.check(&mallory[0], 1).await?;
        assert!(started.is_blocked(), "{name}: {started:?}");
        let mut blocked = Vec::new();
        for _ in 0..rounds {
            let (us, allowed, _) = phase(&tight, &mallory, run, pid).await?;
            assert_eq!(allowed, 0, "{name}: a blocked identity was admitted");
            blocked.push(us);
        }
        let (a, b) = (median(a), median(b));
        println!(
            "| {name} | {a:.2} | {b:.2} | {:.2} | {:.2} |",
            b / a.max(f64::MIN_POSITIVE),
            median(blocked)
        );
    }
    Ok(())
}
