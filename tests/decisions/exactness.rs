//! Exact under concurrency: 64 tasks on several independent store
//! instances (separate Redis connections, as separate fleet instances)
//! hammer one key, and never get more admitted than the limit allows.
//!
//! With a refill that is negligible during the test the count is exact;
//! with a fast limit it is bounded by `burst + rate × elapsed` over the
//! real time the test ran (plus one for the boundary), and must also come
//! near that bound, so that a limiter denying everything fails too.
use crate::common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::RedisServer;
use fleetgate::{Key, Limit, Limiter, MemoryStore, Policy, Rate, RedisStore};
use tokio::sync::Barrier;

const TASKS: usize = 64;
const INSTANCES: usize = 4;
/// How long the rate tests hammer.
const RUN: Duration = Duration::from_millis(1500);

/// How long each task keeps calling.
#[derive(Clone, Copy)]
enum Run {
    /// A fixed number of calls per task.
    Calls(usize),
    /// Until this much time has passed since the start.
    For(Duration),
}

struct Outcome {
    admitted: u64,
    denied: u64,
    /// From before the first call could start to after the last answer.
    elapsed: Duration,
}

/// `TASKS` tasks, spread over `limiters` round robin, all released at
/// once, calling `check(key, 1)`. Any store error fails the test. Every
/// denial must name `denying` (when given) and carry a retry time.
async fn hammer(limiters: &[Limiter], key: &str, run: Run, denying: Option<usize>) -> Outcome {
    let barrier = Arc::new(Barrier::new(TASKS + 1));
    let key = Key::new(key);
    let mut tasks = Vec::with_capacity(TASKS);
    for i in 0..TASKS {
        let limiter = limiters[i % limiters.len()].clone();
        let barrier = barrier.clone();
        let key = key.clone();
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            let start = Instant::now();
            let (mut admitted, mut denied, mut calls) = (0u64, 0u64, 0usize);
            loop {
                match run {
                    Run::Calls(n) if calls >= n => break,
                    Run::For(d) if calls > 0 && start.elapsed() >= d => break,
                    _ => {}
                }
                calls += 1;
                let decision = limiter
                    .check(&key, 1)
                    .await
                    .unwrap_or_else(|err| panic!("store error under load: {err}"));
                if decision.is_allowed() {
                    admitted += 1;
                } else {
                    denied += 1;
                    assert!(decision.retry_after().is_some(), "{decision:?}");
                    if let Some(limit) = denying {
                        assert_eq!(decision.limit_index(), limit, "{decision:?}");
                    }
                }
                // The memory store answers without awaiting anything: let
                // the other tasks on this worker run.
                tokio::task::yield_now().await;
            }
            (admitted, denied)
        }));
    }
    let start = Instant::now();
    barrier.wait().await;
    let (mut admitted, mut denied) = (0, 0);
    for task in tasks {
        let (a, d) = task.await.expect("a hammering task failed");
        admitted += a;
        denied += d;
    }
    Outcome {
        admitted,
        denied,
        elapsed: start.elapsed(),
    }
}

async fn fleet(server: &RedisServer, policy: &Policy) -> Vec<Limiter> {
    let mut limiters = Vec::with_capacity(INSTANCES);
    for _ in 0..INSTANCES {
        // Each connect opens its own connection: one fleet instance each.
        let store = RedisStore::builder(server.url())
            .prefix("exact")
            .timeout(Duration::from_secs(2))
            .connect()
            .await
            .expect("connect");
        limiters.push(Limiter::new(policy.clone(), store));
    }
    limiters
}

fn limit(rate: Rate, burst: u64, name: &str) -> Limit {
    Limit::builder(rate)
        .burst(burst)
        .name(name)
        .build()
        .unwrap()
}

/// 100 per hour, burst 100: refill over the test is negligible (one call
/// per 36 s).
fn slow_policy() -> Policy {
    Policy::single("slow", limit(Rate::per_hour(100), 100, "l")).unwrap()
}

/// 50 per second, burst 10.
fn fast_policy() -> Policy {
    Policy::single("fast", limit(Rate::per_second(50), 10, "l")).unwrap()
}

/// 50/s burst 5 and 20/s burst 30: the first binds at the start, the
/// second after about half a second.
fn fast_pair() -> Policy {
    Policy::builder("fast-pair")
        .limit(limit(Rate::per_second(50), 5, "quick"))
        .limit(limit(Rate::per_second(20), 30, "steady"))
        .build()
        .unwrap()
}

/// The most any GCRA limit can admit over `elapsed`, plus one for the
/// boundary.
fn bound(limit: &Limit, elapsed: Duration) -> u64 {
    let t = limit.emission_interval().as_micros();
    limit.burst() + u64::try_from(elapsed.as_micros() / t).unwrap() + 1
}

/// Checks a rate test: never above any limit's bound, and at least half of
/// the tightest bound (the tasks call far faster than the rate).
fn check_rate(policy: &Policy, out: &Outcome) {
    let upper = policy
        .limits()
        .iter()
        .map(|l| bound(l, out.elapsed))
        .min()
        .unwrap();
    assert!(
        out.admitted <= upper,
        "admitted {} in {:?}, at most {upper} allowed",
        out.admitted,
        out.elapsed
    );
    assert!(
        out.admitted >= upper / 2,
        "admitted only {} in {:?} (bound {upper}, {} denied)",
        out.admitted,
        out.elapsed,
        out.denied
    );
    assert!(out.denied > 0, "the limit was never reached");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_fleet_admits_exactly_the_burst() {
    let server = RedisServer::start();
    let policy = slow_policy();
    let limiters = fleet(&server, &policy).await;
    let out = hammer(&limiters, "one-key", Run::Calls(5), Some(0)).await;
    assert_eq!(out.admitted + out.denied, (TASKS * 5) as u64);
    assert_eq!(out.admitted, 100, "burst 100 with no refill");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_fleet_admits_exactly_the_smallest_burst_of_two_limits() {
    let server = RedisServer::start();
    // The second limit denies every refused call (checked in `hammer`);
    // limits decided apart, not atomically, would let more through.
    let policy = Policy::builder("slow-pair")
        .limit(limit(Rate::per_hour(100), 100, "a"))
        .limit(limit(Rate::per_hour(60), 60, "b"))
        .build()
        .unwrap();
    let limiters = fleet(&server, &policy).await;
    let out = hammer(&limiters, "one-key", Run::Calls(5), Some(1)).await;
    assert_eq!(out.admitted, 60);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_fleet_holds_a_fast_rate() {
    let server = RedisServer::start();
    let policy = fast_policy();
    let limiters = fleet(&server, &policy).await;
    let out = hammer(&limiters, "one-key", Run::For(RUN), Some(0)).await;
    check_rate(&policy, &out);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_fleet_holds_two_fast_limits() {
    let server = RedisServer::start();
    let policy = fast_pair();
    let limiters = fleet(&server, &policy).await;
    let out = hammer(&limiters, "one-key", Run::For(RUN), None).await;
    check_rate(&policy, &out);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_memory_store_admits_exactly_the_burst() {
    let store = MemoryStore::new();
    let limiters: Vec<_> = (0..INSTANCES)
        .map(|_| Limiter::new(slow_policy(), store.clone()))
        .collect();
    let out = hammer(&limiters, "one-key", Run::Calls(5), Some(0)).await;
    assert_eq!(out.admitted, 100);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_memory_store_holds_a_fast_rate_and_two_limits() {
    let store = MemoryStore::new();
    for policy in [fast_policy(), fast_pair()] {
        let limiters: Vec<_> = (0..INSTANCES)
            .map(|_| Limiter::new(policy.clone(), store.clone()))
            .collect();
        let out = hammer(&limiters, "one-key", Run::For(RUN), None).await;
        check_rate(&policy, &out);
    }
}

/// Threads racing on one key, outside any runtime: the memory store's
/// one-limit state is swapped atomically and its several-limit state is
/// locked, and neither may admit past the burst.
#[test]
fn memory_store_threads_racing_on_one_key_admit_exactly_the_burst() {
    let pair = Policy::builder("slow-pair")
        .limit(limit(Rate::per_hour(100), 100, "a"))
        .limit(limit(Rate::per_hour(60), 60, "b"))
        .build()
        .unwrap();
    for (policy, burst) in [(slow_policy(), 100), (pair, 60)] {
        let limiter = Limiter::new(policy, MemoryStore::new());
        let barrier = std::sync::Barrier::new(4);
        let admitted: u64 = std::thread::scope(|s| {
            let threads: Vec<_> = (0..4)
                .map(|_| {
                    s.spawn(|| {
                        barrier.wait();
                        let key = Key::new("one-key");
                        (0..200)
                            .filter(|_| {
                                let mut fut = limiter.check(&key, 1);
                                match fut.take_ready() {
                                    Some(Ok(d)) => d.is_allowed(),
                                    other => panic!("memory store answered {other:?}"),
                                }
                            })
                            .count() as u64
                    })
                })
                .collect();
            threads.into_iter().map(|t| t.join().unwrap()).sum()
        });
        assert_eq!(admitted, burst);
    }
}
