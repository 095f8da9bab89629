//! Checks (GCRA and window algorithms) that find every script slot of a
//! Redis store in flight
//! queue, and go together in one script at the end of the runtime's turn
//! (`RedisStoreBuilder::max_in_flight`), without waiting for a slot.
//! A batch decides exactly what the same calls one after the other would,
//! in the order they were first polled, costs Redis one script and one
//! `GET`/`SET` per identity, fails only the calls whose key is unreadable,
//! and no slot is ever lost to a cancelled, timed-out or failed call.
use crate::common;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Waker};
use std::time::Duration;

use common::RedisServer;
use common::stats::{command_calls, reset_stats, scripts_in};
use fleetgate::clock::ManualClock;
use fleetgate::concurrency::{ConcurrencyLimiter, ConcurrencyPolicy};
use fleetgate::store::StoreFuture;
use fleetgate::{
    Algorithm, Decision, Key, Limit, Limiter, MemoryStore, Policy, Rate, RedisStore, StoreError,
    TimeSource,
};

fn limit(rate: Rate, burst: u64) -> Limit {
    Limit::builder(rate).burst(burst).build().unwrap()
}

/// A store with one script slot, so that every call made while one is in
/// flight is queued; its script already cached in Redis.
async fn one_slot_store(server: &RedisServer, time: TimeSource) -> RedisStore {
    let store = RedisStore::builder(server.url())
        .prefix("batch")
        .timeout(Duration::from_secs(2))
        .time_source(time)
        .max_in_flight(1)
        .connect()
        .await
        .expect("connect");
    Limiter::new(
        Policy::single("warm-up", limit(Rate::per_second(1), 1)).unwrap(),
        store.clone(),
    )
    .check(&Key::new("warm-up"), 1)
    .await
    .expect("warm-up decision");
    store
}

/// A store without a deny cache, so that every call reaches Redis.
async fn uncached_store(
    server: &RedisServer,
    max_in_flight: usize,
    timeout: Duration,
) -> RedisStore {
    RedisStore::builder(server.url())
        .prefix("batch")
        .timeout(timeout)
        .max_in_flight(max_in_flight)
        .deny_cache(0)
        .connect()
        .await
        .expect("connect")
}

/// Polls a call once, as a caller that goes on to other work would: the
/// call takes its script slot (and is sent) or its place in the queue now.
fn start(mut call: StoreFuture<Decision>) -> StoreFuture<Decision> {
    let first = Pin::new(&mut call).poll(&mut Context::from_waker(Waker::noop()));
    assert!(
        first.is_pending(),
        "a Redis call is not answered within its first poll"
    );
    call
}

/// Starts the calls in the order given, then awaits them all.
async fn all(calls: Vec<StoreFuture<Decision>>) -> Vec<Result<Decision, StoreError>> {
    let started: Vec<_> = calls.into_iter().map(start).collect();
    let mut decisions = Vec::with_capacity(started.len());
    for call in started {
        decisions.push(call.await);
    }
    decisions
}

/// [`all`], every call decided.
async fn decided(calls: Vec<StoreFuture<Decision>>) -> Vec<Decision> {
    all(calls)
        .await
        .into_iter()
        .map(|d| d.expect("decided"))
        .collect()
}

/// Every figure of a decision (with those of the first two limits), to
/// compare two stores' decisions.
type Figures = (
    bool,
    usize,
    u64,
    Duration,
    Option<Duration>,
    Duration,
    Vec<(Option<u64>, Option<Duration>)>,
);

fn figures(d: &Decision) -> Figures {
    let each = (0..2).map(|i| (d.remaining_of(i), d.reset_of(i))).collect();
    (
        d.is_allowed(),
        d.limit_index(),
        d.remaining(),
        d.reset(),
        d.retry_after(),
        d.wait(),
        each,
    )
}

/// 200 calls at once on one hot identity with a burst of 50: exactly 50
/// pass, each with its own remaining count, in far fewer scripts than
/// calls, each reading and writing the identity once. On both time sources
/// (with the caller's clock, the batch carries one "now").
#[tokio::test]
async fn a_hot_identity_is_decided_exactly_in_few_scripts() {
    let server = RedisServer::start();
    let mut admin = server.admin().await;
    for (name, time) in [
        ("server", TimeSource::Server),
        ("client", TimeSource::system_clock()),
    ] {
        let store = one_slot_store(&server, time).await;
        let limiter = Limiter::new(
            Policy::single(format!("hot-{name}"), limit(Rate::per_hour(50), 50)).unwrap(),
            store,
        );
        reset_stats(&mut admin).await;
        let key = Key::new("hot");
        let calls: Vec<_> = (0..200).map(|_| limiter.check(&key, 1)).collect();
        let decisions = decided(calls).await;

        let admitted: Vec<u64> = decisions
            .iter()
            .filter(|d| d.is_allowed())
            .map(Decision::remaining)
            .collect();
        assert_eq!(
            admitted,
            (0..50).rev().collect::<Vec<_>>(),
            "{name}: the first 50 calls pass, in order, each with one fewer left"
        );
        assert!(
            decisions[50..]
                .iter()
                .all(|d| !d.is_allowed() && d.retry_after().is_some()),
            "{name}: every later call is refused with a retry time"
        );

        let calls = command_calls(&mut admin).await;
        let scripts = scripts_in(&calls);
        // All 200 were started before the first was answered: it went
        // alone, the 199 queued behind it in batches of at most 64.
        assert_eq!(scripts, 5, "{name}: {calls:?}");
        assert_eq!(
            calls.get("get").copied(),
            Some(scripts),
            "{name}: one GET per script for one identity: {calls:?}"
        );
        assert!(
            calls.get("set").copied().unwrap_or(0) <= scripts,
            "{name}: at most one SET per script for one identity: {calls:?}"
        );
    }
}

/// Calls for many identities under several policies (one limit, two
/// limits, two policies of the same limits, which a script carries once,
/// costs above 1, reserve mode admitted and refused) queued
/// together are decided exactly as the memory store decides the same calls
/// one after the other at the same instant: every figure of every decision.
#[tokio::test]
async fn a_mixed_batch_decides_as_calls_one_by_one() {
    let server = RedisServer::start();
    let clock = ManualClock::new(Duration::from_secs(1_000_000));
    let store = one_slot_store(&server, TimeSource::Client(Arc::new(clock.clone()))).await;
    let memory = MemoryStore::builder().clock(clock.clone()).build();
    let policies = [
        Policy::single("one", limit(Rate::per_hour(5), 5)).unwrap(),
        Policy::builder("two")
            .limit(limit(Rate::per_hour(4), 4))
            .limit(limit(Rate::per_minute(100), 2))
            .build()
            .unwrap(),
        Policy::single("twin", limit(Rate::per_hour(5), 5)).unwrap(),
    ];
    let limiters = |store: &dyn Fn(Policy) -> Limiter| -> Vec<Limiter> {
        policies.iter().map(|p| store(p.clone())).collect()
    };
    let on_redis = limiters(&|p| Limiter::new(p, store.clone()));
    let in_memory = limiters(&|p| Limiter::new(p, memory.clone()));
    // (policy, identity, cost, longest wait: none, a second, ten hours)
    let plan: Vec<(usize, Key, u64, Duration)> = (0..150)
        .map(|i| {
            let wait = [
                Duration::ZERO,
                Duration::ZERO,
                Duration::from_secs(1),
                Duration::from_secs(36_000),
            ];
            (
                (i / 5) % 3,
                Key::new(format!("id-{}", i % 7)),
                1 + (i % 3) as u64 / 2,
                wait[i % 4],
            )
        })
        .collect();
    let decide = |limiters: &[Limiter], (p, key, cost, wait): &(usize, Key, u64, Duration)| {
        if wait.is_zero() {
            limiters[*p].check(key, *cost)
        } else {
            limiters[*p].reserve(key, *cost, *wait)
        }
    };
    let batched = decided(plan.iter().map(|c| decide(&on_redis, c)).collect()).await;
    let mut one_by_one = Vec::new();
    for call in &plan {
        one_by_one.push(decide(&in_memory, call).await.unwrap());
    }
    for (i, (b, m)) in batched.iter().zip(&one_by_one).enumerate() {
        assert_eq!(figures(b), figures(m), "call {i}: {:?}", plan[i]);
    }
    let (admitted, waiting) = (
        batched.iter().filter(|d| d.is_allowed()).count(),
        batched
            .iter()
            .filter(|d| d.is_allowed() && !d.wait().is_zero())
            .count(),
    );
    assert!(
        admitted > 0 && admitted < batched.len() && waiting > 0,
        "{admitted} {waiting}"
    );
    assert!(
        batched
            .iter()
            .zip(&plan)
            .any(|(d, c)| !d.is_allowed() && c.3 == Duration::from_secs(1)),
        "some reserve call was refused for a wait above its longest"
    );
}

/// Reserve-mode calls queued behind a busy slot keep the order in which
/// they were first polled: each one's slot comes one emission interval
/// after the one before.
#[tokio::test]
async fn queued_reservations_keep_their_order() {
    let server = RedisServer::start();
    let store = one_slot_store(&server, TimeSource::Server).await;
    let limiter = Limiter::new(
        Policy::single("fifo", limit(Rate::per_second(10), 1)).unwrap(),
        store,
    );
    let key = Key::new("fifo");
    let calls: Vec<_> = (0..40)
        .map(|_| limiter.reserve(&key, 1, Duration::from_secs(60)))
        .collect();
    let waits: Vec<Duration> = decided(calls).await.iter().map(Decision::wait).collect();
    for (i, pair) in waits.windows(2).enumerate() {
        // 100 ms apart, less the time between the scripts that decided them.
        let gap = pair[1].saturating_sub(pair[0]);
        assert!(
            gap > Duration::from_millis(50) && gap <= Duration::from_millis(100),
            "call {} waits {:?}, call {} {:?}",
            i,
            pair[0],
            i + 1,
            pair[1]
        );
    }
}

/// A call whose key holds another type fails alone, whether it goes alone
/// or in a batch, and on any of its limits' keys; the calls it travelled
/// with are decided.
#[tokio::test]
async fn an_unreadable_key_fails_only_its_own_call() {
    let server = RedisServer::start();
    let store = one_slot_store(&server, TimeSource::Server).await;
    let limiter = Limiter::new(
        Policy::single("types", limit(Rate::per_hour(3), 3)).unwrap(),
        store.clone(),
    );
    // Two limits, the second's key unreadable for `bad`.
    let both = Limiter::new(
        Policy::builder("types-two")
            .limit(limit(Rate::per_hour(3), 3))
            .limit(limit(Rate::per_hour(2), 2))
            .build()
            .unwrap(),
        store.clone(),
    );
    let mut admin = server.admin().await;
    let bad = Key::new("bad");
    for key in [
        store.gcra_key(&limiter.policy(), &bad, 0),
        store.gcra_key(&both.policy(), &bad, 1),
    ] {
        let () = redis::cmd("LPUSH")
            .arg(key)
            .arg("x")
            .query_async(&mut admin)
            .await
            .unwrap();
    }
    // The first goes alone; the rest queue behind it, one script.
    let keys = ["bad", "a", "bad", "b", "bad", "a", "b"].map(Key::new);
    let calls: Vec<_> = keys
        .iter()
        .enumerate()
        .map(|(i, k)| {
            if i == 4 || i == 6 {
                both.check(k, 1)
            } else {
                limiter.check(k, 1)
            }
        })
        .collect();
    let results = all(calls).await;
    for (key, result) in keys.iter().zip(&results) {
        match (&*key.text(), result) {
            ("bad", Err(StoreError::Redis(text))) => assert!(text.contains("WRONGTYPE"), "{text}"),
            ("bad", other) => panic!("the list key was read as a limit: {other:?}"),
            (_, Ok(d)) => assert!(d.is_allowed()),
            (_, Err(err)) => panic!("{key:?} failed with the bad key's batch: {err}"),
        }
    }
    assert_eq!(
        results[5].as_ref().map(Decision::remaining).ok(),
        Some(1),
        "the second call on `a` saw the first"
    );
    assert_eq!(
        results[6].as_ref().map(Decision::remaining).ok(),
        Some(1),
        "`b` under two limits is decided after the failed call: its tighter limit's remaining"
    );
}

/// While Redis hangs, the call in flight and every queued call time out
/// (the time queued counts toward the timeout). Calls queued and then
/// cancelled are not sent, and calls made but never polled take no place
/// at all. Once Redis answers again the store decides as before: no slot
/// was lost.
#[tokio::test]
async fn no_slot_is_lost_to_timeouts_or_cancellations() {
    let server = RedisServer::start();
    let store = uncached_store(&server, 1, Duration::from_millis(300)).await;
    let limiter = Limiter::new(
        Policy::single("lost", limit(Rate::per_hour(1000), 1000)).unwrap(),
        store,
    );
    let a = Key::new("a");
    assert_eq!(limiter.check(&a, 1).await.unwrap().remaining(), 999);

    server.pause();
    let waiting: Vec<_> = (0..20).map(|_| start(limiter.check(&a, 1))).collect();
    // Queued, then given up on.
    let cancelled: Vec<_> = (0..20).map(|_| start(limiter.check(&a, 1))).collect();
    drop(cancelled);
    // Made and dropped without a poll.
    let never_polled: Vec<_> = (0..20).map(|_| limiter.check(&a, 1)).collect();
    drop(never_polled);
    for call in waiting {
        match call.await {
            Err(StoreError::Timeout(t)) => assert_eq!(t, Duration::from_millis(300)),
            other => panic!("expected a timeout while Redis hangs, got {other:?}"),
        }
    }
    server.resume();

    // With the one slot lost, every call would now queue and time out.
    let decisions = decided((0..50).map(|_| limiter.check(&Key::new("b"), 1)).collect()).await;
    assert!(decisions.iter().all(Decision::is_allowed));
    assert_eq!(decisions.last().map(Decision::remaining), Some(950));
    // `a` was charged for its first call and the 20 that timed out (they
    // reached Redis once it woke), not for the cancelled or unpolled ones.
    assert_eq!(limiter.check(&a, 1).await.unwrap().remaining(), 1000 - 22);
}

/// Queued calls go at the end of the runtime's turn, not when a script in
/// flight comes back: with the one slot taken by a call Redis has not
/// answered (it is stopped), a call queued in one turn and another queued
/// in a later turn go in two scripts of their own, not together behind
/// the first call's answer.
#[tokio::test]
async fn queued_calls_do_not_wait_for_the_script_in_flight() {
    let server = RedisServer::start();
    let store = uncached_store(&server, 1, Duration::from_secs(5)).await;
    let limiter = Limiter::new(
        Policy::single("turns", limit(Rate::per_hour(100), 100)).unwrap(),
        store,
    );
    // The script cached, so that each call below is one `EVALSHA`.
    limiter.check(&Key::new("warm-up"), 1).await.unwrap();
    let mut admin = server.admin().await;
    reset_stats(&mut admin).await;

    server.pause();
    let first = start(limiter.check(&Key::new("a"), 1));
    let second = start(limiter.check(&Key::new("b"), 1));
    // Turns of this current-thread runtime: the task that sends the queue
    // runs in them, while the first call still waits for its answer.
    for _ in 0..8 {
        tokio::task::yield_now().await;
    }
    let third = start(limiter.check(&Key::new("c"), 1));
    for _ in 0..8 {
        tokio::task::yield_now().await;
    }
    server.resume();
    for call in [first, second, third] {
        assert!(call.await.expect("decided").is_allowed());
    }
    let calls = command_calls(&mut admin).await;
    // Waiting for the first call's answer, the second and third would
    // have gone together: two scripts.
    assert_eq!(scripts_in(&calls), 3, "{calls:?}");
}

/// Without batching (`max_in_flight(usize::MAX)`) every call is its own
/// script, however many are in flight.
#[tokio::test]
async fn unbounded_in_flight_sends_one_script_per_call() {
    let server = RedisServer::start();
    let store = uncached_store(&server, usize::MAX, Duration::from_secs(2)).await;
    let limiter = Limiter::new(
        Policy::single("each", limit(Rate::per_hour(10), 10)).unwrap(),
        store,
    );
    limiter.check(&Key::new("warm-up"), 1).await.unwrap();
    let mut admin = server.admin().await;
    reset_stats(&mut admin).await;
    let calls: Vec<_> = (0..40).map(|_| limiter.check(&Key::new("k"), 1)).collect();
    let decisions = decided(calls).await;
    assert_eq!(decisions.iter().filter(|d| d.is_allowed()).count(), 10);
    let calls = command_calls(&mut admin).await;
    assert_eq!(scripts_in(&calls), 40, "{calls:?}");
}

/// The first calls after a start all find their script missing from
/// Redis' cache at once. They load it once between them (`SCRIPT LOAD`),
/// not each with its own `EVAL` of the whole source: per script (GCRA, a
/// window, a lease), one load, then every call by SHA.
#[tokio::test]
async fn calls_that_find_their_script_missing_load_it_once() {
    let server = RedisServer::start();
    // One script per call, so that every call is in flight at once.
    let store = uncached_store(&server, usize::MAX, Duration::from_secs(5)).await;
    let mut admin = server.admin().await;
    let gcra = Limiter::new(
        Policy::single("gcra", limit(Rate::per_hour(10), 10)).unwrap(),
        store.clone(),
    );
    let window = Limiter::new(
        Policy::builder("window")
            .algorithm(Algorithm::SlidingLog)
            .limit(Limit::builder(Rate::per_hour(10)).build().unwrap())
            .build()
            .unwrap(),
        store.clone(),
    );
    let leases = ConcurrencyLimiter::new(
        ConcurrencyPolicy::builder("leases", 100)
            .no_renewal()
            .build()
            .unwrap(),
        store,
    );
    let calls = 30;
    let mut checks = Vec::new();
    for i in 0..calls {
        let key = Key::new(format!("k{i}"));
        checks.push(gcra.check(&key, 1));
        checks.push(window.check(&key, 1));
    }
    let mut acquires: Vec<_> = (0..calls).map(|_| leases.acquire(&Key::new("k"))).collect();
    // Every call is sent before any answer is read.
    let checks: Vec<_> = checks.into_iter().map(start).collect();
    for acquire in &mut acquires {
        let first = Pin::new(acquire).poll(&mut Context::from_waker(Waker::noop()));
        assert!(first.is_pending());
    }
    for check in checks {
        assert!(check.await.expect("decided").is_allowed());
    }
    let mut guards = Vec::new();
    for acquire in acquires {
        guards.push(acquire.await.expect("acquired"));
    }
    let counts = command_calls(&mut admin).await;
    assert_eq!(counts.get("eval"), None, "{counts:?}");
    assert_eq!(counts.get("script|load"), Some(&3), "{counts:?}");
    // Each call run once by SHA, after at most one `NOSCRIPT`.
    let by_sha = counts.get("evalsha").copied().unwrap_or(0);
    assert!((3 * calls..=2 * 3 * calls).contains(&by_sha), "{counts:?}");
    drop(guards);
    leases.releases_settled().await;
}

/// A long queue while Redis refuses connections: every batch fails at
/// once, and the slot goes on to the next one, however many there are,
/// without the stack growing with the queue.
#[tokio::test]
async fn a_long_queue_drains_while_redis_refuses() {
    let store = RedisStore::builder("redis://127.0.0.1:1")
        .timeout(Duration::from_secs(20))
        .max_in_flight(1)
        .max_batch(1)
        .lazy()
        .connect()
        .await
        .unwrap();
    let limiter = Limiter::new(
        Policy::single("long", limit(Rate::per_hour(1), 1)).unwrap(),
        store,
    );
    const CALLS: usize = 50_000;
    // On the test's one thread: the first call takes the slot and waits on
    // its connection attempt while every other one queues behind it.
    let mut calls = tokio::task::JoinSet::new();
    for i in 0..CALLS {
        let limiter = limiter.clone();
        calls.spawn(async move { limiter.check(&Key::new(format!("k{i}")), 1).await });
    }
    let mut failed = 0;
    while let Some(result) = calls.join_next().await {
        assert!(matches!(result.unwrap(), Err(StoreError::Redis(_))));
        failed += 1;
    }
    assert_eq!(failed, CALLS);
}

/// Window checks queue and travel together as GCRA's do: for each window
/// algorithm, calls for many identities under a policy of one window and
/// one of two, with costs above 1, queued together, are decided exactly
/// as the memory store decides them one after the other at the same
/// instant (every figure of every decision), in far fewer scripts than
/// calls.
#[tokio::test]
async fn window_checks_travel_together_and_decide_as_one_by_one() {
    let server = RedisServer::start();
    let mut admin = server.admin().await;
    let clock = ManualClock::new(Duration::from_secs(1_000_000));
    let store = one_slot_store(&server, TimeSource::Client(Arc::new(clock.clone()))).await;
    let memory = MemoryStore::builder().clock(clock.clone()).build();
    for algorithm in [
        Algorithm::SlidingLog,
        Algorithm::SlidingWindow,
        Algorithm::FixedWindow,
    ] {
        let policies = [
            Policy::builder(format!("one-{algorithm:?}"))
                .algorithm(algorithm)
                .limit(limit(Rate::per_hour(5), 5))
                .build()
                .unwrap(),
            Policy::builder(format!("two-{algorithm:?}"))
                .algorithm(algorithm)
                .limit(limit(Rate::per_hour(4), 4))
                .limit(limit(Rate::per_minute(3), 3))
                .build()
                .unwrap(),
        ];
        let on_redis: Vec<_> = policies
            .iter()
            .map(|p| Limiter::new(p.clone(), store.clone()))
            .collect();
        let in_memory: Vec<_> = policies
            .iter()
            .map(|p| Limiter::new(p.clone(), memory.clone()))
            .collect();
        let plan: Vec<(usize, Key, u64)> = (0..120)
            .map(|i| {
                (
                    i % 2,
                    Key::new(format!("id-{}", i % 7)),
                    1 + (i % 3) as u64 / 2,
                )
            })
            .collect();
        // The algorithm's script cached in Redis, so that none is sent twice.
        on_redis[0].check(&Key::new("warm-up"), 1).await.unwrap();
        reset_stats(&mut admin).await;
        let batched = decided(
            plan.iter()
                .map(|(p, key, cost)| on_redis[*p].check(key, *cost))
                .collect(),
        )
        .await;
        let scripts = scripts_in(&command_calls(&mut admin).await);
        let mut one_by_one = Vec::new();
        for (p, key, cost) in &plan {
            one_by_one.push(in_memory[*p].check(key, *cost).await.unwrap());
        }
        for (i, (b, m)) in batched.iter().zip(&one_by_one).enumerate() {
            assert_eq!(
                figures(b),
                figures(m),
                "{algorithm:?}, call {i}: {:?}",
                plan[i]
            );
        }
        let admitted = batched.iter().filter(|d| d.is_allowed()).count();
        assert!(
            admitted > 0 && admitted < batched.len(),
            "{algorithm:?}: {admitted} of {} admitted",
            batched.len()
        );
        // The first went alone; the rest queued behind it, 64 a script.
        assert_eq!(
            scripts,
            3,
            "{algorithm:?}: {scripts} scripts for {} calls",
            plan.len()
        );
    }
}

/// On the server's clock a batch of window checks reads `TIME` once, as
/// GCRA's does: every call it carries is decided at that one instant.
#[tokio::test]
async fn a_window_batch_reads_the_server_clock_once() {
    let server = RedisServer::start();
    let mut admin = server.admin().await;
    let store = one_slot_store(&server, TimeSource::Server).await;
    for algorithm in [
        Algorithm::SlidingLog,
        Algorithm::SlidingWindow,
        Algorithm::FixedWindow,
    ] {
        let policy = Policy::builder(format!("clock-{algorithm:?}"))
            .algorithm(algorithm)
            .limit(limit(Rate::per_hour(100), 100))
            .build()
            .unwrap();
        let limiter = Limiter::new(policy, store.clone());
        limiter.check(&Key::new("warm-up"), 1).await.unwrap();
        reset_stats(&mut admin).await;
        let batched = decided(
            (0..40)
                .map(|i| limiter.check(&Key::new(format!("id-{}", i % 5)), 1))
                .collect(),
        )
        .await;
        // Each identity's 8 calls counted one after the other (the
        // sliding log's entries of one instant each kept).
        for id in 0..5 {
            let remaining: Vec<u64> = batched
                .iter()
                .skip(id)
                .step_by(5)
                .map(|d| {
                    assert!(d.is_allowed(), "{d:?}");
                    d.remaining()
                })
                .collect();
            assert_eq!(
                remaining,
                (92..100).rev().collect::<Vec<u64>>(),
                "{algorithm:?}, id-{id}"
            );
        }
        let calls = command_calls(&mut admin).await;
        let scripts = scripts_in(&calls);
        // The first went alone, the rest together.
        assert_eq!(scripts, 2, "{algorithm:?}: {calls:?}");
        assert_eq!(
            calls.get("time").copied(),
            Some(scripts),
            "{algorithm:?}: one TIME a script, {calls:?}"
        );
    }
}

/// A window check whose key holds another type, or a string that is not
/// window state, fails alone; the calls it travelled with are decided. GCRA
/// and window checks queued together each go in their own algorithm's
/// script, and are decided right.
#[tokio::test]
async fn a_window_check_with_an_unreadable_key_fails_alone() {
    let server = RedisServer::start();
    let store = one_slot_store(&server, TimeSource::Server).await;
    let mut admin = server.admin().await;
    let windows = Limiter::new(
        Policy::builder("types-sw")
            .algorithm(Algorithm::SlidingWindow)
            .limit(limit(Rate::per_hour(3), 3))
            .build()
            .unwrap(),
        store.clone(),
    );
    let gcra = Limiter::new(
        Policy::single("types-gcra", limit(Rate::per_hour(3), 3)).unwrap(),
        store.clone(),
    );
    let (list, garbage) = (Key::new("list"), Key::new("garbage"));
    let () = redis::cmd("LPUSH")
        .arg(&store.window_keys(&windows.policy(), &list)[0])
        .arg("x")
        .query_async(&mut admin)
        .await
        .unwrap();
    let () = redis::cmd("SET")
        .arg(&store.window_keys(&windows.policy(), &garbage)[0])
        .arg("not a window")
        .query_async(&mut admin)
        .await
        .unwrap();
    windows.check(&Key::new("warm-up"), 1).await.unwrap();
    reset_stats(&mut admin).await;
    let keys = ["a", "list", "b", "garbage", "a"].map(Key::new);
    let mut calls = Vec::new();
    for key in &keys {
        calls.push(windows.check(key, 1));
        calls.push(gcra.check(key, 1));
    }
    let results = all(calls).await;
    let scripts = scripts_in(&command_calls(&mut admin).await);
    for (i, result) in results.iter().enumerate() {
        let (key, window) = (&keys[i / 2], i % 2 == 0);
        match (&*key.text(), window, result) {
            ("list", true, Err(StoreError::Redis(text))) => {
                assert!(text.contains("WRONGTYPE"), "{text}")
            }
            ("garbage", true, Err(StoreError::Redis(text))) => {
                assert!(text.contains("unreadable window state"), "{text}")
            }
            (_, true, Ok(d)) if !["list", "garbage"].contains(&&*key.text()) => {
                assert!(d.is_allowed())
            }
            (_, false, Ok(d)) => assert!(d.is_allowed(), "GCRA on {key:?}"),
            (_, _, other) => panic!("{key:?}, window {window}: {other:?}"),
        }
    }
    for (i, left) in [(8, 1), (9, 1)] {
        assert_eq!(
            results[i].as_ref().map(Decision::remaining).ok(),
            Some(left),
            "the second call on `a` saw the first"
        );
    }
    // The first call alone; the nine queued behind it: one script for the
    // windows' and one for GCRA's.
    assert_eq!(scripts, 3);
}
