//! GCRA calls that find every script slot of a Redis store in flight wait,
//! and go together in the next script (`RedisStoreBuilder::max_in_flight`).
//! A batch decides exactly what the same calls one after the other would,
//! costs Redis one script and one `GET`/`SET` per identity, and no slot is
//! ever lost to a cancelled, timed-out or failed call.
mod common;

use std::time::Duration;

use common::RedisServer;
use common::stats::{command_calls, reset_stats, scripts_in};
use fleetgate::{
    Decision, Key, Limit, Limiter, MemoryStore, Policy, Rate, RedisStore, StoreError, TimeSource,
};

fn limit(rate: Rate, burst: u64) -> Limit {
    Limit::builder(rate).burst(burst).build().unwrap()
}

/// A store with one script slot, so that every call made while one is in
/// flight is queued; its script already cached in Redis.
async fn one_slot_store(server: &RedisServer, time: TimeSource) -> RedisStore {
    let store = RedisStore::builder()
        .prefix("batch")
        .timeout(Duration::from_secs(2))
        .time_source(time)
        .max_in_flight(1)
        .connect(&server.url())
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

/// Awaits the calls in the order they were made.
async fn all<F: std::future::Future<Output = Result<Decision, StoreError>>>(
    calls: Vec<F>,
) -> Vec<Decision> {
    let mut decisions = Vec::with_capacity(calls.len());
    for call in calls {
        decisions.push(call.await.expect("decided"));
    }
    decisions
}

/// 200 calls at once on one hot identity with a burst of 50: exactly 50
/// pass, each with its own remaining count, in far fewer scripts than
/// calls, each reading and writing the identity once. On both time sources
/// (with the caller's clock, the batch carries one "now").
#[tokio::test]
async fn a_hot_identity_is_decided_exactly_in_few_scripts() {
    let server = RedisServer::start();
    let mut admin = server
        .client()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
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
        let decisions = all(calls).await;

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
        // All 200 were made before the first was sent: it goes alone, the
        // 199 queued behind it in batches of at most 64.
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
/// limits, costs above 1, reserve mode) queued together are decided as the
/// memory store decides the same calls one after the other.
#[tokio::test]
async fn a_mixed_batch_decides_as_calls_one_by_one() {
    let server = RedisServer::start();
    let store = one_slot_store(&server, TimeSource::Server).await;
    let policies = [
        Policy::single("one", limit(Rate::per_hour(5), 5)).unwrap(),
        Policy::builder("two")
            .limit(limit(Rate::per_hour(4), 4))
            .limit(limit(Rate::per_hour(100), 2))
            .build()
            .unwrap(),
    ];
    let memory = MemoryStore::new();
    let on_redis: Vec<Limiter> = policies
        .iter()
        .map(|p| Limiter::new(p.clone(), store.clone()))
        .collect();
    let in_memory: Vec<Limiter> = policies
        .iter()
        .map(|p| Limiter::new(p.clone(), memory.clone()))
        .collect();
    let plan: Vec<(usize, Key, u64, bool)> = (0..120)
        .map(|i| {
            let policy = i % 2;
            let key = Key::new(format!("id-{}", i % 7));
            let cost = 1 + (i % 3) as u64 / 2;
            (policy, key, cost, i % 11 == 0)
        })
        .collect();
    let decide = |limiters: &[Limiter], (p, key, cost, reserve): &(usize, Key, u64, bool)| {
        if *reserve {
            limiters[*p].reserve(key, *cost, Duration::from_secs(36_000))
        } else {
            limiters[*p].check(key, *cost)
        }
    };
    let batched = all(plan.iter().map(|c| decide(&on_redis, c)).collect()).await;
    let mut one_by_one = Vec::new();
    for call in &plan {
        one_by_one.push(decide(&in_memory, call).await.unwrap());
    }
    let summary = |d: &Decision| {
        (
            d.is_allowed(),
            d.limit_index(),
            d.remaining(),
            d.wait() > Duration::ZERO,
        )
    };
    let (batched, one_by_one): (Vec<_>, Vec<_>) = (
        batched.iter().map(summary).collect(),
        one_by_one.iter().map(summary).collect(),
    );
    assert_eq!(batched, one_by_one);
    assert!(batched.iter().any(|d| d.0) && batched.iter().any(|d| !d.0));
}

/// While Redis hangs, the call in flight and every queued call time out
/// (the queue wait counts toward the timeout), and queued calls whose
/// callers gave up are dropped; once Redis answers again the store decides
/// as before: no slot was lost.
#[tokio::test]
async fn no_slot_is_lost_to_timeouts_or_cancellations() {
    let server = RedisServer::start();
    let store = RedisStore::builder()
        .prefix("batch")
        .timeout(Duration::from_millis(300))
        .max_in_flight(1)
        .deny_cache(0)
        .connect(&server.url())
        .await
        .expect("connect");
    let limiter = Limiter::new(
        Policy::single("lost", limit(Rate::per_hour(1000), 1000)).unwrap(),
        store,
    );
    assert!(limiter.check(&Key::new("a"), 1).await.unwrap().is_allowed());

    server.pause();
    let waiting: Vec<_> = (0..20).map(|_| limiter.check(&Key::new("a"), 1)).collect();
    // Made and dropped unpolled: the callers gave up while queued (and the
    // first of the next batch would otherwise go alone).
    let abandoned: Vec<_> = (0..20).map(|_| limiter.check(&Key::new("a"), 1)).collect();
    drop(abandoned);
    for call in waiting {
        match call.await {
            Err(StoreError::Timeout(t)) => assert_eq!(t, Duration::from_millis(300)),
            other => panic!("expected a timeout while Redis hangs, got {other:?}"),
        }
    }
    server.resume();

    // With the one slot lost, every call would now queue and time out.
    let calls: Vec<_> = (0..50).map(|_| limiter.check(&Key::new("b"), 1)).collect();
    let decisions = all(calls).await;
    assert!(decisions.iter().all(Decision::is_allowed));
    assert_eq!(decisions.last().map(Decision::remaining), Some(950));
}

/// Without batching (`max_in_flight(usize::MAX)`) every call is its own
/// script, however many are in flight.
#[tokio::test]
async fn unbounded_in_flight_sends_one_script_per_call() {
    let server = RedisServer::start();
    let store = RedisStore::builder()
        .prefix("batch")
        .max_in_flight(usize::MAX)
        .deny_cache(0)
        .connect(&server.url())
        .await
        .expect("connect");
    let limiter = Limiter::new(
        Policy::single("each", limit(Rate::per_hour(10), 10)).unwrap(),
        store,
    );
    limiter.check(&Key::new("warm-up"), 1).await.unwrap();
    let mut admin = server
        .client()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    reset_stats(&mut admin).await;
    let calls: Vec<_> = (0..40).map(|_| limiter.check(&Key::new("k"), 1)).collect();
    let decisions = all(calls).await;
    assert_eq!(decisions.iter().filter(|d| d.is_allowed()).count(), 10);
    let calls = command_calls(&mut admin).await;
    assert_eq!(scripts_in(&calls), 40, "{calls:?}");
}
