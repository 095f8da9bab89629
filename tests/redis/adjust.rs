//! Peek, charge and refund on Redis: concurrent charges from several
//! instances never lose an update; a charge's keys are the decision's and
//! live as long as its debt; the deny cache remembers a charge's debt and
//! forgets it on a refund; a Redis that is hung or gone fails each
//! operation within the store's timeout.
use crate::common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::RedisServer;
use fleetgate::clock::ManualClock;
use fleetgate::{Algorithm, Key, Limit, Limiter, Policy, Rate, RedisStore, StoreError, TimeSource};

const ALL: [Algorithm; 4] = [
    Algorithm::Gcra,
    Algorithm::SlidingLog,
    Algorithm::FixedWindow,
    Algorithm::SlidingWindow,
];

fn policy(name: &str, algorithm: Algorithm, rate: Rate) -> Policy {
    Policy::builder(name)
        .algorithm(algorithm)
        .limit(Limit::new(rate).unwrap())
        .build()
        .unwrap()
}

/// Four instances (each its own store and connection) of 25 tasks each
/// charge one key 20 times 3 units, under every algorithm; their clock
/// stands still, so that nothing refills: every unit is counted.
#[tokio::test]
async fn concurrent_charges_from_several_instances_never_lose_an_update() {
    let server = RedisServer::start();
    let clock = ManualClock::new(Duration::from_secs(1_699_999_980));
    let mut stores = Vec::new();
    for _ in 0..4 {
        let store = RedisStore::builder(server.url())
            .time_source(TimeSource::Client(Arc::new(clock.clone())))
            .timeout(Duration::from_secs(5))
            .connect()
            .await
            .unwrap();
        stores.push(store);
    }
    for algorithm in ALL {
        let policy = policy(
            &format!("hot-{algorithm}"),
            algorithm,
            Rate::per_hour(100_000),
        );
        let mut tasks = Vec::new();
        for store in &stores {
            for _ in 0..25 {
                let limiter = Limiter::new(policy.clone(), store.clone());
                tasks.push(tokio::spawn(async move {
                    for _ in 0..20 {
                        limiter.charge(&Key::new("hot"), 3).await.unwrap();
                    }
                }));
            }
        }
        for task in tasks {
            task.await.unwrap();
        }
        let limiter = Limiter::new(policy, stores[0].clone());
        let d = limiter.peek(&Key::new("hot"), 1).await.unwrap();
        assert_eq!(
            d.remaining(),
            100_000 - 4 * 25 * 20 * 3 - 1,
            "{algorithm}: lost updates"
        );
    }
}

/// A charge writes the keys a check of the same policy writes, and a
/// GCRA debt's key lives as long as the debt.
#[tokio::test]
async fn a_charge_uses_the_decision_keys_and_they_outlive_the_debt() {
    let server = RedisServer::start();
    let store = common::redis_store(&server).await;
    let mut conn = server.admin().await;
    for algorithm in ALL {
        let policy = policy(&format!("keys-{algorithm}"), algorithm, Rate::per_second(1));
        let limiter = Limiter::new(policy.clone(), store.clone());
        let (charged, checked) = (Key::new("charged"), Key::new("checked"));
        limiter.charge(&charged, 100).await.unwrap();
        limiter.check(&checked, 1).await.unwrap();
        let keys_of = |key: &Key| -> Vec<String> {
            match algorithm {
                Algorithm::Gcra => vec![store.gcra_key(&policy, key, 0)],
                _ => store.window_keys(&policy, key),
            }
        };
        for (charged_key, checked_key) in keys_of(&charged).iter().zip(keys_of(&checked)) {
            let exists: (bool, bool) = redis::pipe()
                .exists(charged_key)
                .exists(&checked_key)
                .query_async(&mut conn)
                .await
                .unwrap();
            assert_eq!(exists, (true, true), "{algorithm}: {charged_key}");
        }
        if algorithm == Algorithm::Gcra {
            let ttl: i64 = redis::cmd("PTTL")
                .arg(store.gcra_key(&policy, &charged, 0))
                .query_async(&mut conn)
                .await
                .unwrap();
            // 100 s of debt at 1/s, to the whole second after it.
            assert!((95_000..=101_000).contains(&ttl), "PTTL {ttl} ms");
        }
    }
}

/// The deny cache remembers a charge that leaves the key in debt (the
/// next peeks cost Redis nothing) and forgets it on a refund.
#[tokio::test]
async fn the_deny_cache_remembers_a_debt_and_forgets_it_on_a_refund() {
    let server = RedisServer::start();
    for algorithm in ALL {
        let store = RedisStore::builder(server.url())
            .timeout(Duration::from_secs(2))
            .deny_cache(1_000)
            .connect()
            .await
            .unwrap();
        let limiter = Limiter::new(
            policy(&format!("deny-{algorithm}"), algorithm, Rate::per_hour(3)),
            store.clone(),
        );
        let who = Key::new("user:1");
        let d = limiter.charge(&who, 5).await.unwrap();
        assert!(!d.is_allowed(), "{algorithm}");
        let hits = store.deny_cache_stats().hits;
        let again = limiter.peek(&who, 1).await.unwrap();
        assert!(!again.is_allowed(), "{algorithm}");
        assert_eq!(
            store.deny_cache_stats().hits,
            hits + 1,
            "{algorithm}: not answered locally"
        );
        limiter.refund(&who, 5).await.unwrap();
        let d = limiter.peek(&who, 1).await.unwrap();
        assert!(d.is_allowed(), "{algorithm}: the cache still denies");
        assert_eq!(store.deny_cache_stats().hits, hits + 1, "{algorithm}");
    }
}

/// Hung (SIGSTOP), each operation gives up after the store's timeout;
/// gone, each fails; back, each works again.
#[tokio::test]
async fn each_operation_fails_within_the_timeout_when_redis_is_down() {
    let server = RedisServer::start();
    let timeout = Duration::from_millis(100);
    let store = RedisStore::builder(server.url())
        .timeout(timeout)
        .connect()
        .await
        .unwrap();
    let limiters: Vec<Limiter> = ALL
        .iter()
        .map(|&a| {
            Limiter::new(
                policy(&format!("down-{a}"), a, Rate::per_hour(5)),
                store.clone(),
            )
        })
        .collect();
    let key = Key::new("k");
    for limiter in &limiters {
        limiter.charge(&key, 1).await.unwrap();
    }

    server.pause();
    for limiter in &limiters {
        let algorithm = limiter.policy().algorithm();
        let started = Instant::now();
        let peek = limiter.peek(&key, 1).await;
        let charge = limiter.charge(&key, 1).await;
        let refund = limiter.refund(&key, 1).await;
        let took = started.elapsed();
        assert!(
            matches!(peek, Err(StoreError::Timeout(t)) if t == timeout),
            "{algorithm}: {peek:?}"
        );
        assert!(
            matches!(charge, Err(StoreError::Timeout(t)) if t == timeout),
            "{algorithm}: {charge:?}"
        );
        assert!(
            matches!(refund, Err(StoreError::Timeout(t)) if t == timeout),
            "{algorithm}: {refund:?}"
        );
        // Three timeouts (generous margin for a loaded machine).
        assert!(
            took < 3 * timeout + Duration::from_secs(1),
            "{algorithm}: {took:?}"
        );
    }
    server.resume();
    for limiter in &limiters {
        let deadline = Instant::now() + Duration::from_secs(10);
        while limiter.peek(&key, 1).await.is_err() {
            assert!(Instant::now() < deadline, "no recovery");
        }
        limiter.charge(&key, 1).await.unwrap();
        limiter.refund(&key, 1).await.unwrap();
    }

    server.stop();
    for limiter in &limiters {
        let started = Instant::now();
        assert!(limiter.peek(&key, 1).await.is_err());
        assert!(limiter.charge(&key, 1).await.is_err());
        assert!(limiter.refund(&key, 1).await.is_err());
        assert!(started.elapsed() < 3 * timeout + Duration::from_secs(1));
    }
}
