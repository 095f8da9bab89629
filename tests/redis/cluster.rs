//! The Redis store on a real Redis Cluster (3 masters, a replica each)
//! that the test starts itself: the same decisions as the memory store, exact under concurrency
//! with keys of many identities spread over all masters, and undisturbed
//! by slots moving (`ASK`, `MOVED`) or scripts vanishing (`NOSCRIPT` per
//! node) mid-run.
#![cfg(feature = "cluster")]
use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use crate::common::redis_cluster::RedisCluster;
use fleetgate::clock::ManualClock;
use fleetgate::{
    Decision, Key, Limit, Limiter, MemoryStore, Policy, Rate, RedisStore, Store, TimeSource,
    Topology,
};
use tokio::sync::Barrier;

fn limit(rate: Rate, burst: u64, name: &str) -> Limit {
    Limit::builder(rate)
        .burst(burst)
        .name(name)
        .build()
        .unwrap()
}

async fn cluster_store(cluster: &RedisCluster, time: TimeSource) -> RedisStore {
    RedisStore::builder(Topology::cluster(cluster.urls()))
        .prefix("cl")
        .timeout(Duration::from_secs(2))
        .time_source(time)
        .connect()
        .await
        .expect("connect to the cluster")
}

/// Keys on each master (`DBSIZE`).
async fn keys_per_node(cluster: &RedisCluster) -> Vec<u64> {
    let mut sizes = Vec::new();
    for node in cluster.masters() {
        let mut conn = node.admin().await;
        sizes.push(redis::cmd("DBSIZE").query_async(&mut conn).await.unwrap());
    }
    sizes
}

/// Keys matching `pattern` on each master.
async fn matching_per_node(cluster: &RedisCluster, pattern: &str) -> Vec<usize> {
    let mut counts = Vec::new();
    for node in cluster.masters() {
        let mut conn = node.admin().await;
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg(pattern)
            .query_async(&mut conn)
            .await
            .unwrap();
        counts.push(keys.len());
    }
    counts
}

/// A small deterministic generator (no dependency needed for this).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self, below: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) % below
    }
}

/// The same 1500 pseudo-random calls (three policies, one to three limits,
/// 120 identities, costs 1 to 3, checks and reservations, time steps) on a
/// memory store and on the cluster, both reading one manual clock: the
/// decision sequences are equal, and the identities' keys sit on all three
/// masters.
#[tokio::test]
async fn cluster_decides_like_the_memory_store() {
    let cluster = RedisCluster::start();
    let start = Duration::from_secs(1_700_000_000);
    let policies = [
        Policy::single("one", limit(Rate::new(1, Duration::from_secs(10)), 3, "a")).unwrap(),
        Policy::builder("two")
            .limit(limit(Rate::new(1, Duration::from_secs(10)), 3, "a"))
            .limit(limit(Rate::per_minute(1), 5, "b"))
            .build()
            .unwrap(),
        Policy::builder("three")
            .limit(limit(Rate::per_second(5), 2, "a"))
            .limit(limit(Rate::per_minute(20), 6, "b"))
            .limit(limit(Rate::per_hour(100), 9, "c"))
            .build()
            .unwrap(),
    ];
    let mut logs: Vec<Vec<Decision>> = Vec::new();
    for node in cluster.masters() {
        let mut conn = node.admin().await;
        common::stats::reset_stats(&mut conn).await;
    }
    for on_cluster in [false, true] {
        let clock = ManualClock::new(start);
        let store: Arc<dyn Store> = if on_cluster {
            Arc::new(cluster_store(&cluster, TimeSource::Client(Arc::new(clock.clone()))).await)
        } else {
            Arc::new(MemoryStore::builder().clock(clock.clone()).build())
        };
        let limiters: Vec<Limiter> = policies
            .iter()
            .map(|p| Limiter::new(p.clone(), store.clone()))
            .collect();
        let mut rng = Lcg(7);
        let mut log = Vec::new();
        for _ in 0..1500 {
            let limiter = &limiters[rng.next(3) as usize];
            let key = Key::new(format!("user:{}", rng.next(120)));
            let cost = 1 + rng.next(3);
            let decision = if rng.next(5) == 0 {
                let max_wait = Duration::from_millis(rng.next(30_000));
                limiter.reserve(&key, cost, max_wait).await
            } else {
                limiter.check(&key, cost).await
            };
            log.push(decision.expect("store error"));
            if rng.next(4) == 0 {
                clock.advance(Duration::from_micros(rng.next(3_000_000)));
            }
        }
        logs.push(log);
    }
    let allowed = logs[1].iter().filter(|d| d.is_allowed()).count();
    assert!(allowed > 100 && allowed < 1400, "{allowed} of 1500 allowed");
    for (i, (memory, cluster)) in logs[0].iter().zip(&logs[1]).enumerate() {
        assert_eq!(memory, cluster, "call {i}: memory and cluster differ");
    }
    let sizes = keys_per_node(&cluster).await;
    assert!(sizes.iter().all(|&n| n > 0), "keys per master: {sizes:?}");
    // One script a decision at most, on the one master that owns the
    // identity's slot, however many limits its policy has (the deny cache
    // answers some denials with none): the scale sheet in BENCHMARKS.md.
    let mut scripts = 0;
    for node in cluster.masters() {
        let mut conn = node.admin().await;
        scripts += common::stats::scripts_in(&common::stats::command_calls(&mut conn).await);
    }
    assert!(
        (allowed as u64..=1500).contains(&scripts),
        "{scripts} scripts for 1500 decisions"
    );
}

/// 4 store instances (separate cluster connections), 32 tasks, 24
/// identities spread over the masters, a two-limit policy: each identity
/// gets exactly the smaller burst, never more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_fleet_is_exact_per_identity() {
    let cluster = RedisCluster::start();
    let policy = Policy::builder("exact")
        .limit(limit(Rate::per_hour(30), 30, "a"))
        .limit(limit(Rate::per_hour(20), 20, "b"))
        .build()
        .unwrap();
    let mut limiters = Vec::new();
    for _ in 0..4 {
        let store = cluster_store(&cluster, TimeSource::Server).await;
        limiters.push(Limiter::new(policy.clone(), store));
    }
    const IDS: u64 = 24;
    let admitted: Arc<Vec<AtomicU64>> = Arc::new((0..IDS).map(|_| AtomicU64::new(0)).collect());
    let barrier = Arc::new(Barrier::new(32));
    let mut tasks = Vec::new();
    for task in 0..32u64 {
        let limiter = limiters[task as usize % 4].clone();
        let (admitted, barrier) = (admitted.clone(), barrier.clone());
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            for n in 0..40u64 {
                let id = (task + n) % IDS;
                let d = limiter
                    .check(&Key::new(format!("tenant:{id}")), 1)
                    .await
                    .unwrap_or_else(|err| panic!("store error: {err}"));
                if d.is_allowed() {
                    admitted[id as usize].fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    for task in tasks {
        task.await.expect("a task panicked");
    }
    // 32 × 40 = 1280 calls over 24 identities: over 50 each, burst 20.
    let counts: Vec<u64> = admitted.iter().map(|a| a.load(Ordering::Relaxed)).collect();
    assert!(
        counts.iter().all(|&c| c == 20),
        "admitted per identity: {counts:?}"
    );
    let sizes = keys_per_node(&cluster).await;
    assert!(sizes.iter().all(|&n| n > 0), "keys per master: {sizes:?}");
}

/// With the servers' clocks: slots move between masters (`ASK` during the
/// move, `MOVED` after it) and every node's script cache is flushed while
/// calls keep coming; no call fails, and the counts carried over with the
/// keys are exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_survives_resharding_and_script_flush() {
    let cluster = Arc::new(RedisCluster::start());
    let store = cluster_store(&cluster, TimeSource::Server).await;
    let policy = Policy::single("moving", limit(Rate::per_hour(50), 50, "a")).unwrap();
    let limiter = Limiter::new(policy, store.clone());
    const IDS: usize = 100;
    let key = |i: usize| Key::new(format!("acct:{i}"));
    for i in 0..IDS {
        for _ in 0..20 {
            assert!(limiter.check(&key(i), 1).await.unwrap().is_allowed());
        }
    }

    // Background traffic on other identities while the cluster changes.
    let stop = Arc::new(AtomicBool::new(false));
    let errors = Arc::new(AtomicU64::new(0));
    let background = {
        let limiter = Limiter::new(
            Policy::single("busy", limit(Rate::per_second(1000), 1000, "a")).unwrap(),
            store.clone(),
        );
        let (stop, errors) = (stop.clone(), errors.clone());
        tokio::spawn(async move {
            let mut calls = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let k = Key::new(format!("bg:{}", calls % 500));
                if let Err(err) = limiter.check(&k, 1).await {
                    errors.fetch_add(1, Ordering::Relaxed);
                    eprintln!("background call failed: {err}");
                }
                calls += 1;
            }
            calls
        })
    };
    for node in cluster.nodes() {
        let mut conn = node.admin().await;
        let () = redis::cmd("SCRIPT")
            .arg("FLUSH")
            .query_async(&mut conn)
            .await
            .unwrap();
    }
    let before = matching_per_node(&cluster, "cl:moving:*").await;
    let moving = cluster.clone();
    tokio::task::spawn_blocking(move || moving.reshard(0, 1, 3000))
        .await
        .expect("reshard");
    let after = matching_per_node(&cluster, "cl:moving:*").await;
    stop.store(true, Ordering::Relaxed);
    let calls = background.await.expect("background task panicked");
    assert!(calls > 100, "only {calls} background calls");
    assert_eq!(
        errors.load(Ordering::Relaxed),
        0,
        "calls failed mid-reshard"
    );
    assert!(
        after[0] < before[0] && after[1] > before[1],
        "keys did not move: {before:?} -> {after:?}"
    );

    // Each master answered NOSCRIPT, and was sent the script's source.
    for node in cluster.masters() {
        let mut conn = node.admin().await;
        let calls = common::stats::command_calls(&mut conn).await;
        assert!(calls.get("eval").copied().unwrap_or(0) >= 1, "{calls:?}");
    }

    // Every identity has exactly 30 calls left, wherever its slot went.
    for i in 0..IDS {
        let mut allowed = 0;
        for _ in 0..35 {
            allowed += u64::from(limiter.check(&key(i), 1).await.unwrap().is_allowed());
        }
        assert_eq!(allowed, 30, "identity {i}");
    }
}

/// One master hangs (SIGSTOP, shorter than the cluster's node timeout, so
/// no failover): identities on the other masters are decided as usual,
/// those on the hung one fail within the store's timeout, and all are
/// decided again once it resumes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_node_hang_is_bounded_and_local_to_its_slots() {
    let cluster = RedisCluster::start();
    let timeout = Duration::from_millis(200);
    let store = RedisStore::builder(Topology::cluster(cluster.urls()))
        .prefix("cl")
        .timeout(timeout)
        .connect()
        .await
        .expect("connect to the cluster");
    let policy = Policy::single("hang", limit(Rate::per_second(1000), 1000, "a")).unwrap();
    let limiter = Limiter::new(policy, store);
    let keys: Vec<Key> = (0..30).map(|i| Key::new(format!("site:{i}"))).collect();
    for key in &keys {
        assert!(limiter.check(key, 1).await.unwrap().is_allowed());
    }

    cluster.masters()[0].pause();
    let (mut decided, mut failed) = (0, 0);
    for key in &keys {
        let started = std::time::Instant::now();
        let result = limiter.check(key, 1).await;
        let took = started.elapsed();
        assert!(
            took < timeout + Duration::from_millis(400),
            "waited {took:?} on a hung node"
        );
        match result {
            Ok(d) => {
                assert!(d.is_allowed());
                decided += 1;
            }
            Err(_) => failed += 1,
        }
    }
    cluster.masters()[0].resume();
    // A third of the slots hang, the rest answer.
    assert!(
        decided >= 5 && failed >= 5,
        "{decided} decided, {failed} failed"
    );

    let deadline = std::time::Instant::now() + Duration::from_secs(3);
    'keys: for key in &keys {
        loop {
            if limiter.check(key, 1).await.is_ok() {
                continue 'keys;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "not decided 3 s after the node resumed"
            );
        }
    }
}

/// A script missing on a fresh cluster while one master hangs: every call
/// whose slot lives on another master is still decided, its script sent
/// with its source to its own master; loading it on every node would wait
/// on the hung one and fail the calls that found it missing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_node_does_not_keep_scripts_from_the_others() {
    let cluster = RedisCluster::start();
    // Long enough for any answer on a loaded machine; each call on the
    // hung master waits it out.
    let timeout = Duration::from_secs(1);
    let store = RedisStore::builder(Topology::cluster(cluster.urls()))
        .prefix("cl")
        .timeout(timeout)
        .connect()
        .await
        .expect("connect to the cluster");
    let policy = Policy::single("noscript", limit(Rate::per_second(1000), 1000, "a")).unwrap();
    let limiter = Limiter::new(policy.clone(), store.clone());
    let keys: Vec<Key> = (0..12).map(|i| Key::new(format!("site:{i}"))).collect();
    // Which keys the master about to hang owns, asked of another master.
    let hung = i64::from(cluster.masters()[0].port());
    let mut admin = cluster.masters()[1]
        .client()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    // Each range: start, end, its master (address, port, id), replicas.
    let ranges: Vec<redis::Value> = redis::cmd("CLUSTER")
        .arg("SLOTS")
        .query_async(&mut admin)
        .await
        .unwrap();
    let slots: Vec<(i64, i64, i64)> = ranges
        .iter()
        .map(|range| match range {
            redis::Value::Array(items) => match items.as_slice() {
                [
                    redis::Value::Int(start),
                    redis::Value::Int(end),
                    redis::Value::Array(master),
                    ..,
                ] => match master.get(1) {
                    Some(redis::Value::Int(port)) => (*start, *end, *port),
                    other => panic!("{other:?}"),
                },
                other => panic!("{other:?}"),
            },
            other => panic!("{other:?}"),
        })
        .collect();
    let mut on_hung = Vec::new();
    for key in &keys {
        let slot: i64 = redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(store.gcra_key(&policy, key, 0))
            .query_async(&mut admin)
            .await
            .unwrap();
        let owner = slots
            .iter()
            .find(|(start, end, _)| (*start..=*end).contains(&slot))
            .map(|&(.., port)| port)
            .expect("every slot is served");
        on_hung.push(owner == hung);
    }

    cluster.masters()[0].pause();
    let mut failed_elsewhere = Vec::new();
    for (key, &on_hung) in keys.iter().zip(&on_hung) {
        match limiter.check(key, 1).await {
            Ok(d) => assert!(d.is_allowed()),
            Err(err) if !on_hung => failed_elsewhere.push(format!("{key:?}: {err}")),
            Err(_) => {}
        }
    }
    cluster.masters()[0].resume();
    assert!(
        on_hung.iter().any(|&h| h) && on_hung.iter().any(|&h| !h),
        "the keys do not spread over the masters"
    );
    assert!(failed_elsewhere.is_empty(), "{failed_elsewhere:?}");
}

/// A lazy store on a cluster is built while no node answers (every one
/// paused, each connection attempt waiting out the connect timeout): its
/// calls fail within the store's timeout until the nodes answer again,
/// then it decides, a burst of 2 admitting 2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lazy_store_connects_to_the_cluster_once_it_answers() {
    let cluster = RedisCluster::start();
    for node in cluster.nodes() {
        node.pause();
    }
    let timeout = Duration::from_millis(500);
    let store = RedisStore::builder(Topology::cluster(cluster.urls()))
        .prefix("lazy")
        .timeout(timeout)
        .connect_timeout(Duration::from_millis(300))
        .lazy()
        .connect()
        .await
        .expect("a lazy store with no node answering");
    let policy = Policy::single("lazy", limit(Rate::per_hour(2), 2, "a")).unwrap();
    let limiter = Limiter::new(policy, store);
    for _ in 0..2 {
        let started = std::time::Instant::now();
        let result = limiter.check(&Key::new("early"), 1).await;
        assert!(
            result.is_err(),
            "decided with every node paused: {result:?}"
        );
        assert!(
            started.elapsed() < timeout + Duration::from_secs(1),
            "waited {:?}",
            started.elapsed()
        );
    }
    for node in cluster.nodes() {
        node.resume();
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while limiter.check(&Key::new("probe"), 1).await.is_err() {
        assert!(
            std::time::Instant::now() < deadline,
            "never connected to the cluster"
        );
    }
    let key = Key::new("late");
    let mut outcomes = Vec::new();
    for _ in 0..3 {
        let decision = limiter.check(&key, 1).await.expect("a decision");
        outcomes.push(decision.is_allowed());
    }
    assert_eq!(outcomes, [true, true, false]);
}
