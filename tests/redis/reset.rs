//! Resetting one identity's state on Redis: one round trip deletes every
//! key the identity holds under the name (whatever the algorithm and the
//! number of limits that wrote them), its leases included; the next call
//! is admitted as new, past this instance's deny cache too; other
//! identities and policies keep theirs; a Redis that is gone fails the
//! reset within the store's timeout.
use crate::common;

use std::time::{Duration, Instant};

use common::RedisServer;
use fleetgate::concurrency::{Admission, ConcurrencyLimiter, ConcurrencyPolicy};
use fleetgate::{
    Algorithm, Calendar, Key, Limit, Limiter, Policy, Rate, RedisStore, StoreError, Topology,
};

const ALL: [Algorithm; 5] = [
    Algorithm::Gcra,
    Algorithm::SlidingLog,
    Algorithm::FixedWindow,
    Algorithm::SlidingWindow,
    Algorithm::Calendar,
];

/// `count` an hour, plus `extra` more limits (a day each, ten times as
/// many), under `algorithm`.
fn policy(name: &str, algorithm: Algorithm, count: u64, extra: usize) -> Policy {
    if algorithm == Algorithm::Calendar {
        // `count` a day, and the extra limits a month each.
        let mut builder =
            Policy::builder(name).limit(Limit::calendar(count, Calendar::daily()).unwrap());
        for i in 0..extra {
            let quota = Limit::calendar(10 * count + i as u64, Calendar::monthly()).unwrap();
            builder = builder.limit(quota);
        }
        return builder.build().unwrap();
    }
    let mut builder = Policy::builder(name)
        .algorithm(algorithm)
        .limit(Limit::new(Rate::per_hour(count)).unwrap());
    for i in 0..extra {
        let rate = Rate::new(10 * count + i as u64, Duration::from_secs(86_400));
        builder = builder.limit(Limit::new(rate).unwrap());
    }
    builder.build().unwrap()
}

async fn exhaust(limiter: &Limiter, key: &Key, count: u64) {
    for i in 0..count {
        let d = limiter.check(key, 1).await.unwrap();
        assert!(d.is_allowed(), "call {i} of {count} was denied");
    }
    assert!(!limiter.check(key, 1).await.unwrap().is_allowed());
}

/// The keys in the server that belong to `key` under the policy `name`
/// (the store's default prefix), sorted.
async fn keys_of(server: &RedisServer, name: &str, key: &str) -> Vec<String> {
    let mut conn = server.admin().await;
    // Every key of the identity starts with its first GCRA key (the
    // identity's hashed tag), whatever the algorithm.
    let namer = RedisStore::builder(server.url())
        .lazy()
        .connect()
        .await
        .unwrap();
    let base = namer.gcra_key(&policy(name, Algorithm::Gcra, 1, 0), &Key::new(key), 0);
    let mut keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{base}*"))
        .query_async(&mut conn)
        .await
        .expect("KEYS");
    keys.sort();
    keys
}

#[tokio::test]
async fn reset_admits_a_key_as_new_and_leaves_no_key_behind() {
    let server = RedisServer::start();
    let store = common::redis_store(&server).await;
    for algorithm in ALL {
        let name = format!("api-{algorithm}");
        let other_name = format!("other-{algorithm}");
        let limiter = Limiter::new(policy(&name, algorithm, 3, 1), store.clone());
        let other_policy = Limiter::new(policy(&other_name, algorithm, 3, 1), store.clone());
        let (who, bystander) = (Key::new("user:1"), Key::new("user:2"));
        exhaust(&limiter, &who, 3).await;
        exhaust(&limiter, &bystander, 3).await;
        exhaust(&other_policy, &who, 3).await;
        assert!(!keys_of(&server, &name, "user:1").await.is_empty());
        let bystander_keys = keys_of(&server, &name, "user:2").await;
        let other_keys = keys_of(&server, &other_name, "user:1").await;

        limiter.reset(&who).await.unwrap();
        assert_eq!(
            keys_of(&server, &name, "user:1").await,
            Vec::<String>::new(),
            "{algorithm}: keys left after reset"
        );
        assert_eq!(keys_of(&server, &name, "user:2").await, bystander_keys);
        assert_eq!(keys_of(&server, &other_name, "user:1").await, other_keys);

        // As new: its whole quota, then denied again.
        let first = limiter.check(&who, 1).await.unwrap();
        assert!(first.is_allowed(), "{algorithm}: denied after reset");
        assert_eq!(first.remaining(), 2, "{algorithm}: not a fresh quota");
        assert!(limiter.check(&who, 1).await.unwrap().is_allowed());
        assert!(limiter.check(&who, 1).await.unwrap().is_allowed());
        assert!(!limiter.check(&who, 1).await.unwrap().is_allowed());
        assert!(
            !limiter.check(&bystander, 1).await.unwrap().is_allowed(),
            "{algorithm}: another identity was reset"
        );
        assert!(
            !other_policy.check(&who, 1).await.unwrap().is_allowed(),
            "{algorithm}: another policy was reset"
        );
    }
}

/// State written under more limits than the policy has now (it was
/// edited since), and by every algorithm the name has had: a reset leaves
/// none of it.
#[tokio::test]
async fn reset_clears_state_of_more_limits_and_every_algorithm() {
    let server = RedisServer::start();
    let store = common::redis_store(&server).await;
    let who = Key::new("user:1");
    for algorithm in ALL {
        // 16 limits: as many as a policy may hold.
        let limiter = Limiter::new(policy("api", algorithm, 3, 15), store.clone());
        assert!(limiter.check(&who, 1).await.unwrap().is_allowed());
    }
    let mut conn = server.admin().await;
    // Leases under the same name, as a concurrency policy named alike.
    let leases = ConcurrencyLimiter::new(
        ConcurrencyPolicy::builder("api", 2)
            .lease_ttl(Duration::from_secs(60))
            .no_renewal()
            .build()
            .unwrap(),
        store.clone(),
    );
    let Admission::Acquired(guard) = leases.acquire(&who).await.unwrap() else {
        panic!("the first lease is free");
    };
    // 16 GCRA keys, the log, 16 + 16 counters, 16 quotas, the lease set.
    let before = keys_of(&server, "api", "user:1").await;
    assert_eq!(before.len(), 16 + 1 + 16 + 16 + 16 + 1, "{before:?}");

    // Reset through a one-limit policy of the name.
    Limiter::new(policy("api", Algorithm::Gcra, 3, 0), store.clone())
        .reset(&who)
        .await
        .unwrap();
    assert_eq!(
        keys_of(&server, "api", "user:1").await,
        Vec::<String>::new()
    );
    drop(guard);
    leases.releases_settled().await;
    let dbsize: usize = redis::cmd("DBSIZE").query_async(&mut conn).await.unwrap();
    assert_eq!(dbsize, 0, "the old guard's release wrote something");
}

/// This instance's deny cache refused the key locally; after the reset it
/// asks Redis again, and is admitted.
#[tokio::test]
async fn reset_makes_the_deny_cache_forget_the_key() {
    let server = RedisServer::start();
    let store = common::redis_store(&server).await;
    for algorithm in ALL {
        let name = format!("cached-{algorithm}");
        let limiter = Limiter::new(policy(&name, algorithm, 2, 0), store.clone());
        let other = Limiter::new(policy(&format!("x-{name}"), algorithm, 2, 0), store.clone());
        let who = Key::new("user:1");
        exhaust(&limiter, &who, 2).await;
        exhaust(&other, &who, 2).await;
        // The denial is cached: the next refusal costs no round trip.
        let hits = store.deny_cache_stats().hits;
        assert!(!limiter.check(&who, 1).await.unwrap().is_allowed());
        assert_eq!(store.deny_cache_stats().hits, hits + 1, "{algorithm}");
        let entries = store.deny_cache_stats().entries;

        limiter.reset(&who).await.unwrap();
        assert_eq!(store.deny_cache_stats().entries, entries - 1, "{algorithm}");
        assert!(
            limiter.check(&who, 1).await.unwrap().is_allowed(),
            "{algorithm}: the deny cache still refused after reset"
        );
        // The other policy's cached denial stays.
        let hits = store.deny_cache_stats().hits;
        assert!(!other.check(&who, 1).await.unwrap().is_allowed());
        assert_eq!(store.deny_cache_stats().hits, hits + 1, "{algorithm}");
    }
}

fn concurrency(store: &RedisStore, name: &str, max: u64) -> ConcurrencyLimiter {
    let policy = ConcurrencyPolicy::builder(name, max)
        .lease_ttl(Duration::from_secs(60))
        .no_renewal()
        .build()
        .unwrap();
    ConcurrencyLimiter::new(policy, store.clone())
}

async fn acquired(limiter: &ConcurrencyLimiter, key: &Key) -> Option<Admission> {
    match limiter.acquire(key).await.unwrap() {
        admission @ Admission::Acquired(_) => Some(admission),
        Admission::Refused(_) => None,
    }
}

/// The key's leases go, fleet-wide; guards still held release nothing
/// (not the lease taken since) and fail nothing.
#[tokio::test]
async fn reset_drops_leases_and_old_guards_release_nothing() {
    let server = RedisServer::start();
    let store = common::redis_store(&server).await;
    // Another instance sharing the server.
    let elsewhere = common::redis_store(&server).await;
    let limiter = concurrency(&store, "jobs", 2);
    let remote = concurrency(&elsewhere, "jobs", 2);
    let other = concurrency(&store, "exports", 1);
    let (who, bystander) = (Key::new("tenant:a"), Key::new("tenant:b"));
    let stuck = [
        acquired(&limiter, &who).await.expect("a lease"),
        acquired(&remote, &who).await.expect("a lease"),
    ];
    let _held = acquired(&limiter, &bystander).await.expect("a lease");
    let _other = acquired(&other, &who).await.expect("a lease");
    assert!(acquired(&limiter, &who).await.is_none());
    assert_eq!(server.leases_held().await, 4);

    limiter.reset(&who).await.unwrap();
    assert_eq!(server.leases_held().await, 2);
    let fresh = acquired(&remote, &who).await.expect("admitted after reset");
    drop(stuck);
    limiter.releases_settled().await;
    remote.releases_settled().await;
    // The old guards' releases found nothing: the fresh lease still holds.
    assert_eq!(server.leases_held().await, 3);
    // Held while the next is asked for: a dropped guard's release goes out
    // at once, ahead of the next acquire.
    let second = acquired(&limiter, &who).await;
    assert!(second.is_some());
    assert!(acquired(&limiter, &who).await.is_none());
    assert!(acquired(&limiter, &bystander).await.is_some());
    assert!(acquired(&other, &who).await.is_none());
    drop((fresh, second));
}

/// A reset is one round trip: one script, nothing else.
#[tokio::test]
async fn reset_is_one_script() {
    let server = RedisServer::start();
    let store = common::redis_store(&server).await;
    let limiter = Limiter::new(policy("api", Algorithm::Gcra, 3, 0), store.clone());
    let who = Key::new("user:1");
    exhaust(&limiter, &who, 3).await;
    // Loaded once already, so that the count is of the call alone.
    limiter.reset(&who).await.unwrap();
    let mut conn = server.admin().await;
    common::stats::reset_stats(&mut conn).await;
    limiter.reset(&who).await.unwrap();
    let calls = common::stats::command_calls(&mut conn).await;
    let total: u64 = calls
        .iter()
        .filter(|(name, _)| !matches!(name.as_str(), "info" | "config|resetstat"))
        .map(|(_, n)| n)
        .sum();
    assert_eq!(common::stats::scripts_in(&calls), 1, "{calls:?}");
    // The script's own DEL is counted too.
    assert_eq!(total, 2, "{calls:?}");
}

#[tokio::test]
async fn reset_against_a_stopped_redis_fails_within_the_timeout() {
    let server = RedisServer::start();
    let timeout = Duration::from_millis(200);
    let store = RedisStore::builder(server.url())
        .timeout(timeout)
        .connect()
        .await
        .unwrap();
    let limiter = Limiter::new(policy("api", Algorithm::Gcra, 3, 0), store.clone());
    let leases = concurrency(&store, "jobs", 1);
    let who = Key::new("user:1");
    assert!(limiter.check(&who, 1).await.unwrap().is_allowed());

    server.stop();
    for _ in 0..3 {
        let started = Instant::now();
        let result = limiter.reset(&who).await;
        let took = started.elapsed();
        assert!(result.is_err(), "{result:?}");
        // Generous margin for a loaded machine.
        assert!(took < timeout + Duration::from_secs(1), "waited {took:?}");
        let started = Instant::now();
        assert!(leases.reset(&who).await.is_err());
        assert!(started.elapsed() < timeout + Duration::from_secs(1));
    }
}

#[tokio::test]
async fn reset_against_a_hung_redis_times_out() {
    let server = RedisServer::start();
    let timeout = Duration::from_millis(100);
    let store = RedisStore::builder(server.url())
        .timeout(timeout)
        .connect()
        .await
        .unwrap();
    let limiter = Limiter::new(policy("api", Algorithm::Gcra, 3, 0), store);
    let who = Key::new("user:1");
    assert!(limiter.check(&who, 1).await.unwrap().is_allowed());
    server.pause();
    let started = Instant::now();
    let result = limiter.reset(&who).await;
    let took = started.elapsed();
    server.resume();
    assert!(
        matches!(result, Err(StoreError::Timeout(t)) if t == timeout),
        "{result:?}"
    );
    assert!(took < timeout + Duration::from_secs(1), "waited {took:?}");
}

/// On a Redis Cluster: each identity's keys share its hash tag, so one
/// script resets them on the master that owns them, whichever it is.
#[cfg(feature = "cluster")]
#[tokio::test]
async fn reset_on_a_cluster_clears_every_identity_on_its_own_master() {
    let cluster = crate::common::redis_cluster::RedisCluster::start();
    let store = RedisStore::builder(Topology::cluster(cluster.urls()))
        .timeout(Duration::from_secs(2))
        .connect()
        .await
        .expect("connect to the cluster");
    let gcra = Limiter::new(policy("api", Algorithm::Gcra, 2, 2), store.clone());
    let log = Limiter::new(policy("api", Algorithm::SlidingLog, 2, 0), store.clone());
    let leases = concurrency(&store, "api", 1);
    // Enough identities to land on every master.
    let keys: Vec<Key> = (0..12).map(|i| Key::new(format!("user:{i}"))).collect();
    let mut guards = Vec::new();
    for key in &keys {
        exhaust(&gcra, key, 2).await;
        exhaust(&log, key, 2).await;
        guards.push(acquired(&leases, key).await.expect("a lease"));
    }
    let mut per_node = Vec::new();
    for node in cluster.masters() {
        let mut conn = node.admin().await;
        let n: usize = redis::cmd("DBSIZE").query_async(&mut conn).await.unwrap();
        per_node.push(n);
    }
    assert!(per_node.iter().all(|&n| n > 0), "{per_node:?}");
    assert_eq!(per_node.iter().sum::<usize>(), keys.len() * (3 + 1 + 1));

    for key in &keys {
        gcra.reset(key).await.unwrap();
    }
    for node in cluster.masters() {
        let mut conn = node.admin().await;
        let n: usize = redis::cmd("DBSIZE").query_async(&mut conn).await.unwrap();
        assert_eq!(n, 0, "keys left on a master after the resets");
    }
    for key in &keys {
        assert!(gcra.check(key, 1).await.unwrap().is_allowed());
        assert!(log.check(key, 1).await.unwrap().is_allowed());
        assert!(acquired(&leases, key).await.is_some());
    }
    drop(guards);
}
