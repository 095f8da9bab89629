//! Concurrency leases in both stores: the same decisions for the same calls
//! and times, one script per operation in Redis alone and one for many
//! under load, and no lease outliving its TTL when its holder vanished.
use crate::common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::RedisServer;
use common::stats::{command_calls, reset_stats, scripts_in};
use fleetgate::clock::ManualClock;
use fleetgate::concurrency::{Admission, ConcurrencyLimiter, ConcurrencyPolicy};
use fleetgate::lease::{Lease, LeaseGuard, StoreLease};
use fleetgate::store::LeaseGrant;
use fleetgate::{Key, MemoryStore, RedisStore, Store, StoreError, TimeSource};
use futures_util::future::join_all;

const S: Duration = Duration::from_secs(1);
const UNIX_NOW: Duration = Duration::from_secs(1_700_000_000);

/// A store with a manual clock and the log of what it answered.
#[derive(Clone)]
struct Sut {
    name: &'static str,
    clock: ManualClock,
    store: Arc<dyn Store>,
    log: Arc<Mutex<Vec<String>>>,
}

impl Sut {
    fn memory() -> Sut {
        let clock = ManualClock::new(UNIX_NOW);
        let store = MemoryStore::builder().clock(clock.clone()).build();
        Sut {
            name: "memory",
            clock,
            store: Arc::new(store),
            log: Arc::default(),
        }
    }

    async fn redis(server: &RedisServer) -> Sut {
        let clock = ManualClock::new(UNIX_NOW);
        let store = RedisStore::builder(server.url())
            .time_source(TimeSource::Client(Arc::new(clock.clone())))
            .timeout(Duration::from_secs(2))
            .connect()
            .await
            .expect("connect to the test's redis-server");
        Sut {
            name: "redis",
            clock,
            store: Arc::new(store),
            log: Arc::default(),
        }
    }

    fn limiter(&self, name: &str, max: u64, ttl: Duration) -> ConcurrencyLimiter {
        let policy = ConcurrencyPolicy::builder(name, max)
            .lease_ttl(ttl)
            .no_renewal()
            .build()
            .unwrap();
        ConcurrencyLimiter::new(policy, self.store.clone())
    }

    fn record(&self, entry: String) {
        self.log.lock().unwrap().push(entry);
    }

    /// Acquires; records the grant (or refusal) in the log.
    async fn acquire(&self, l: &ConcurrencyLimiter, key: &str) -> Result<Guard, LeaseGrant> {
        match l.acquire(&Key::new(key)).await {
            Ok(Admission::Acquired(guard)) => {
                self.record(format!("{key}: acquired"));
                Ok(guard)
            }
            Ok(Admission::Refused(grant)) => {
                self.record(format!("{key}: refused {grant:?}"));
                Err(grant)
            }
            Err(err) => panic!("{}: store error: {err}", self.name),
        }
    }

    async fn renew(&self, guard: &Guard) -> bool {
        let renewed = lease(guard).renew().await.unwrap();
        self.record(format!("renew {renewed}"));
        renewed
    }

    async fn release(&self, guard: &Guard) -> bool {
        let released = lease(guard).release().await.unwrap();
        self.record(format!("release {released}"));
        released
    }
}

/// A concurrency limiter whose leases are never renewed, so that a test
/// decides when they end.
fn unrenewed(name: &str, max: u64, ttl: Duration, store: impl Store) -> ConcurrencyLimiter {
    let policy = ConcurrencyPolicy::builder(name, max)
        .lease_ttl(ttl)
        .no_renewal()
        .build()
        .unwrap();
    ConcurrencyLimiter::new(policy, store)
}

/// A store on the test's server whose calls time out after `timeout`.
async fn store_timing_out_after(server: &RedisServer, timeout: Duration) -> RedisStore {
    RedisStore::builder(server.url())
        .timeout(timeout)
        .connect()
        .await
        .unwrap()
}

type Guard = LeaseGuard<StoreLease>;

fn lease(guard: &Guard) -> &StoreLease {
    guard.lease().expect("an armed guard")
}

#[track_caller]
fn refused(result: Result<Guard, LeaseGrant>, in_flight: u64, oldest: Duration) {
    match result {
        Ok(_) => panic!("acquired past the limit"),
        Err(grant) => {
            assert!(!grant.is_acquired());
            assert_eq!(grant.in_flight(), in_flight);
            assert_eq!(grant.oldest_expires_in(), Some(oldest));
        }
    }
}

/// The whole life of leases, step by step, with exact answers.
async fn lifecycle(s: Sut) {
    let l = s.limiter("life", 2, 10 * S);
    let a = s.acquire(&l, "k").await.expect("first lease");
    s.clock.advance(S);
    let b = s.acquire(&l, "k").await.expect("second lease");
    refused(s.acquire(&l, "k").await, 2, 9 * S);
    // Other keys and other limit names are counted apart.
    let other_key = s.acquire(&l, "other").await.expect("other key");
    let other_name = s.acquire(&s.limiter("life2", 1, 10 * S), "k").await;
    assert!(other_name.is_ok(), "{}: names share a set", s.name);

    s.clock.advance(2 * S);
    refused(s.acquire(&l, "k").await, 2, 7 * S);
    assert!(s.release(&a).await, "{}", s.name);
    assert!(!s.release(&a).await, "{}: released twice", s.name);
    a.release();
    let c = s.acquire(&l, "k").await.expect("a released slot is free");

    // Renewal moves b's expiry from 11 s to 13 s (now 3 s + 10 s).
    assert!(s.renew(&b).await, "{}", s.name);
    s.clock.advance(9 * S);
    // Now 12 s: b and c expire at 13 s.
    refused(s.acquire(&l, "k").await, 2, S);
    s.clock.advance(S);
    // Exactly at expiry the leases are gone, and never revived.
    let d = s
        .acquire(&l, "k")
        .await
        .expect("expired leases free their slots");
    assert!(!s.renew(&b).await, "{}: an expired lease renewed", s.name);
    assert!(!s.renew(&c).await, "{}: an expired lease renewed", s.name);
    let e = s.acquire(&l, "k").await.expect("second slot");
    refused(s.acquire(&l, "k").await, 2, 10 * S);
    drop((b, c, d, e, other_key, other_name));
}

#[tokio::test]
async fn both_stores_agree_on_the_lease_lifecycle() {
    let memory = Sut::memory();
    lifecycle(memory.clone()).await;
    let server = RedisServer::start();
    let redis = Sut::redis(&server).await;
    lifecycle(redis.clone()).await;
    let (memory, redis) = (
        memory.log.lock().unwrap().clone(),
        redis.log.lock().unwrap().clone(),
    );
    assert!(memory.len() > 10);
    assert_eq!(memory, redis, "the stores answered differently");
}

/// With the caller's clock, a lease set outlives real time running ahead
/// of that clock (a lagging instance, a test clock standing still): the
/// lease still holds its slot by the caller's clock after its TTL has
/// passed in real time.
#[tokio::test]
async fn a_lease_outlives_a_client_clock_that_falls_behind() {
    let server = RedisServer::start();
    let s = Sut::redis(&server).await;
    let l = s.limiter("behind", 1, Duration::from_millis(20));
    let _held = s.acquire(&l, "k").await.expect("the first lease");
    let taken = Instant::now();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(taken.elapsed() >= Duration::from_millis(200));
    s.clock.advance(Duration::from_millis(1));
    refused(s.acquire(&l, "k").await, 1, Duration::from_millis(19));
}

/// A crashed instance (a lease taken and never released, nor renewed)
/// holds its slot until the TTL, then frees it: on a manual clock for both
/// stores, exactly at the TTL.
#[tokio::test]
async fn a_vanished_holder_frees_its_slot_after_the_ttl() {
    let server = RedisServer::start();
    for s in [Sut::memory(), Sut::redis(&server).await] {
        let l = s.limiter("crash", 2, 5 * S);
        for _ in 0..2 {
            let guard = s.acquire(&l, "k").await.expect("free slot");
            // The instance dies: no release, no renewal, ever.
            std::mem::forget(guard);
        }
        refused(s.acquire(&l, "k").await, 2, 5 * S);
        s.clock.advance(5 * S - Duration::from_micros(1));
        refused(s.acquire(&l, "k").await, 2, Duration::from_micros(1));
        s.clock.advance(Duration::from_micros(1));
        let guard = s.acquire(&l, "k").await;
        assert!(guard.is_ok(), "{}: slot not freed after the TTL", s.name);
    }
}

/// The same with Redis' own clock and real time: the slot frees after the
/// TTL and not before, and the sorted set itself expires.
#[tokio::test]
async fn a_vanished_holder_frees_its_slot_on_redis_time() {
    let server = RedisServer::start();
    let store = store_timing_out_after(&server, Duration::from_secs(2)).await;
    let ttl = Duration::from_millis(300);
    let policy = ConcurrencyPolicy::builder("crash", 1)
        .lease_ttl(ttl)
        .no_renewal()
        .build()
        .unwrap();
    let key = Key::new("k");
    let crashed = ConcurrencyLimiter::new(policy.clone(), store.clone());
    // Redis counts the TTL from the moment the script runs, which is after
    // this: the slot cannot be free before `sent + ttl`.
    let sent = Instant::now();
    let Admission::Acquired(guard) = crashed.acquire(&key).await.unwrap() else {
        panic!("first lease refused");
    };
    std::mem::forget(guard);

    let survivor = ConcurrencyLimiter::new(policy, store.clone());
    let mut conn = server
        .client()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let lease_key = store.lease_key("crash", &key);
    let pttl: i64 = redis::cmd("PTTL")
        .arg(&lease_key)
        .query_async(&mut conn)
        .await
        .unwrap();
    // Gone already (-2) only if the whole TTL has passed on a slow machine.
    assert!(
        (1..=300).contains(&pttl) || (pttl == -2 && sent.elapsed() >= ttl),
        "lease set PTTL {pttl}"
    );
    let deadline = sent + Duration::from_secs(10);
    loop {
        let admitted = matches!(
            survivor.acquire(&key).await.unwrap(),
            Admission::Acquired(_)
        );
        if admitted {
            break;
        }
        assert!(Instant::now() < deadline, "slot never freed");
        // Waiting for Redis' clock to pass the TTL: there is no event to
        // await, so check again a little later.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        sent.elapsed() >= ttl,
        "freed before the TTL: {:?}",
        sent.elapsed()
    );
    // The admitted lease was released when its guard dropped; once that
    // is done nothing is left.
    survivor.releases_settled().await;
    let exists: i64 = redis::cmd("EXISTS")
        .arg(&lease_key)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(exists, 0);
}

/// Acquire and release are one `EVALSHA` each, and the lease set shares the
/// identity's hash tag.
#[tokio::test]
async fn one_round_trip_per_acquire_and_per_release() {
    let server = RedisServer::start();
    let store = store_timing_out_after(&server, Duration::from_secs(2)).await;
    let policy = ConcurrencyPolicy::builder("trips", 5)
        .no_renewal()
        .build()
        .unwrap();
    let limiter = ConcurrencyLimiter::new(policy, store.clone());
    let key = Key::new("user:7");
    let lease_key = store.lease_key("trips", &key);
    assert!(
        lease_key.starts_with("fleetgate:trips:{") && lease_key.ends_with("}:lease"),
        "{lease_key}"
    );
    let mut conn = server
        .client()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    // Load the scripts so that no NOSCRIPT fallback muddies the count.
    for _ in 0..2 {
        let _ = limiter.acquire(&key).await.unwrap();
        limiter.releases_settled().await;
    }
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(&mut conn)
        .await
        .unwrap();
    for _ in 0..10 {
        let Admission::Acquired(guard) = limiter.acquire(&key).await.unwrap() else {
            panic!("refused");
        };
        drop(guard);
        limiter.releases_settled().await;
    }
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut conn)
        .await
        .unwrap();
    let calls = |cmd: &str| -> u64 {
        info.lines()
            .find_map(|l| l.strip_prefix(&format!("cmdstat_{cmd}:calls=")))
            .and_then(|rest| rest.split(',').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    };
    assert_eq!(calls("evalsha"), 20, "{info}");
    assert_eq!(calls("eval"), 0, "{info}");
    assert_eq!(calls("time"), 10, "acquire reads Redis' clock: {info}");
}

/// A release never waits for Redis: with Redis hung, dropping the guard
/// returns at once and hands the release to a task. Releases that time out
/// are retried while the lease lives, and land once Redis answers again:
/// the slots are free long before the TTL, and a release that timed out
/// after it had landed is no failure.
#[tokio::test]
async fn release_does_not_wait_for_a_hung_redis() {
    let server = RedisServer::start();
    let timeout = Duration::from_millis(100);
    let store = store_timing_out_after(&server, timeout).await;
    let limiter = unrenewed("hung", 2, Duration::from_secs(60), store.clone());
    let key = Key::new("k");
    let mut guards = Vec::new();
    for _ in 0..2 {
        let Admission::Acquired(guard) = limiter.acquire(&key).await.unwrap() else {
            panic!("refused");
        };
        guards.push(guard);
    }
    let kept = guards.pop().unwrap();
    server.pause();
    drop(guards);
    assert_eq!(limiter.pending_releases(), 1, "release not handed off");
    let released = tokio::spawn(lease(&kept).release());
    // Many timeouts later, the releases still wait for Redis.
    let hung = tokio::time::timeout(10 * timeout, limiter.releases_settled()).await;
    assert!(hung.is_err(), "releases given up while their leases live");
    assert_eq!(limiter.pending_releases(), 2);
    server.resume();
    tokio::time::timeout(Duration::from_secs(20), limiter.releases_settled())
        .await
        .expect("the releases land once Redis answers");
    let outcome = released.await.unwrap();
    assert!(outcome.is_ok(), "{outcome:?}");
    assert_eq!(server.leases_held().await, 0);
    for _ in 0..2 {
        let admitted = limiter.acquire(&key).await.unwrap();
        assert!(
            matches!(admitted, Admission::Acquired(_)),
            "slot still taken"
        );
        std::mem::forget(admitted);
    }
    std::mem::forget(kept);
}

/// Retrying stops once the lease has expired anyway: with Redis hung for
/// longer than the TTL, the release is given up, and reported as failed.
#[tokio::test]
async fn a_release_is_given_up_once_its_lease_has_expired() {
    let server = RedisServer::start();
    let store = store_timing_out_after(&server, Duration::from_millis(100)).await;
    let limiter = unrenewed("expired", 1, Duration::from_millis(300), store.clone());
    let Admission::Acquired(guard) = limiter.acquire(&Key::new("k")).await.unwrap() else {
        panic!("refused");
    };
    server.pause();
    let outcome = tokio::time::timeout(Duration::from_secs(20), lease(&guard).release()).await;
    server.resume();
    let outcome = outcome.expect("the release is given up while Redis hangs");
    assert!(outcome.is_err(), "{outcome:?}");
    std::mem::forget(guard);
}

/// A guard dropped where there is no tokio runtime cannot release: the
/// lease stays, and expires after its TTL.
#[tokio::test]
async fn without_a_runtime_the_lease_expires_after_its_ttl() {
    let server = RedisServer::start();
    let store = store_timing_out_after(&server, Duration::from_secs(2)).await;
    let ttl = Duration::from_millis(300);
    let limiter = unrenewed("nort", 1, ttl, store.clone());
    let key = Key::new("k");
    // Before the acquire is sent: Redis counts the TTL from later.
    let sent = Instant::now();
    let Admission::Acquired(guard) = limiter.acquire(&key).await.unwrap() else {
        panic!("refused");
    };
    std::thread::spawn(move || drop(guard)).join().unwrap();
    assert_eq!(limiter.pending_releases(), 0);
    let mut conn = server
        .client()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let held: i64 = redis::cmd("ZCARD")
        .arg(store.lease_key("nort", &key))
        .query_async(&mut conn)
        .await
        .unwrap();
    // Expired leases are only trimmed by the next acquire, so the entry is
    // there however long this took, unless something released it.
    assert_eq!(held, 1, "released without a runtime?");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Admission::Acquired(_) = limiter.acquire(&key).await.unwrap() {
            break;
        }
        assert!(Instant::now() < deadline, "lease never expired");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        sent.elapsed() >= ttl,
        "freed before the TTL: {:?}",
        sent.elapsed()
    );
}

/// Leases of keys never seen again do not pile up in the memory store:
/// expired ones are swept.
#[test]
fn the_memory_store_sweeps_expired_leases() {
    let clock = ManualClock::new(UNIX_NOW);
    let store = MemoryStore::builder()
        .clock(clock.clone())
        .shards(1)
        .build();
    let limiter = unrenewed("sweep", 1, S, store.clone());
    for i in 0..3000 {
        let mut acquire = limiter.acquire(&Key::new(format!("k{i}")));
        match acquire.take_ready() {
            Some(Ok(Admission::Acquired(guard))) => std::mem::forget(guard),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(store.lease_count(), 3000);
    clock.advance(S);
    // New keys (held by crashed holders too) trigger a sweep once the
    // shard has doubled since its last one: the expired leases go.
    for i in 0..3000 {
        let mut acquire = limiter.acquire(&Key::new(format!("new{i}")));
        match acquire.take_ready() {
            Some(Ok(Admission::Acquired(guard))) => std::mem::forget(guard),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(store.lease_count(), 3000, "expired leases were kept");
    clock.advance(S);
    store.sweep();
    assert_eq!(store.lease_count(), 0);
}

/// A store on the test's server with one script slot: every lease
/// operation made while one is in flight is queued for a batch. Its
/// scripts are loaded, alone and batched, so that no NOSCRIPT fallback
/// muddies a count of scripts.
async fn one_slot_store(server: &RedisServer) -> RedisStore {
    let store = RedisStore::builder(server.url())
        .timeout(Duration::from_secs(5))
        .max_in_flight(1)
        .connect()
        .await
        .unwrap();
    let limiter = unrenewed("warm-up", 2, Duration::from_secs(60), store.clone());
    let key = Key::new("warm-up");
    drop(join_all([limiter.acquire(&key), limiter.acquire(&key)]).await);
    limiter.releases_settled().await;
    store
}

/// Acquires and releases that find the store's script slots taken go
/// together, in the order they were made, and decide as one by one: of 20
/// acquires at once on a capacity of 5, exactly the first 5 are granted,
/// in two scripts; 5 releases and 5 acquires made together then cost two
/// scripts, and every acquire finds the slot a release before it freed.
#[tokio::test]
async fn lease_operations_travel_together_and_decide_in_order() {
    let server = RedisServer::start();
    let store = one_slot_store(&server).await;
    let limiter = unrenewed("together", 5, Duration::from_secs(60), store.clone());
    let key = Key::new("k");
    let mut admin = server.admin().await;
    reset_stats(&mut admin).await;

    let admissions = join_all((0..20).map(|_| limiter.acquire(&key))).await;
    let granted: Vec<usize> = admissions
        .iter()
        .enumerate()
        .filter(|(_, a)| matches!(a, Ok(Admission::Acquired(_))))
        .map(|(i, _)| i)
        .collect();
    assert_eq!(granted, [0, 1, 2, 3, 4], "{admissions:?}");
    for refused in &admissions[5..] {
        let Ok(Admission::Refused(grant)) = refused else {
            panic!("{refused:?}");
        };
        assert_eq!(grant.in_flight(), 5);
    }
    let calls = command_calls(&mut admin).await;
    assert_eq!(scripts_in(&calls), 2, "one alone, 19 together: {calls:?}");

    reset_stats(&mut admin).await;
    // Dropped here, before the acquires below are made: their releases
    // are queued first.
    drop(admissions);
    let again = join_all((0..5).map(|_| limiter.acquire(&key))).await;
    assert!(
        again
            .iter()
            .all(|a| matches!(a, Ok(Admission::Acquired(_)))),
        "{again:?}"
    );
    let calls = command_calls(&mut admin).await;
    assert_eq!(scripts_in(&calls), 2, "one alone, 9 together: {calls:?}");
    assert_eq!(server.leases_held().await, 5);
    drop(again);
    limiter.releases_settled().await;
    assert_eq!(server.leases_held().await, 0);
}

/// In a batch, a lease set of another type fails its own operation only:
/// the acquires beside it are granted.
#[tokio::test]
async fn a_lease_set_of_another_type_fails_only_its_own_batched_call() {
    let server = RedisServer::start();
    let store = one_slot_store(&server).await;
    let limiter = unrenewed("typed", 1, Duration::from_secs(60), store.clone());
    let bad = Key::new("bad");
    let mut admin = server.admin().await;
    let () = redis::cmd("SET")
        .arg(store.lease_key("typed", &bad))
        .arg("not a lease set")
        .query_async(&mut admin)
        .await
        .unwrap();
    reset_stats(&mut admin).await;
    let keys = [Key::new("a"), bad, Key::new("c"), Key::new("d")];
    let admissions = join_all(keys.iter().map(|key| limiter.acquire(key))).await;
    assert!(matches!(admissions[0], Ok(Admission::Acquired(_))));
    let Err(error) = &admissions[1] else {
        panic!("{:?}", admissions[1]);
    };
    assert!(
        matches!(error, StoreError::Redis(text) if text.contains("WRONGTYPE")),
        "{error:?}"
    );
    assert!(matches!(admissions[2], Ok(Admission::Acquired(_))));
    assert!(matches!(admissions[3], Ok(Admission::Acquired(_))));
    // The first alone, the others together, and the release of the lease
    // the failed acquire may have taken.
    limiter.releases_settled().await;
    let calls = command_calls(&mut admin).await;
    assert_eq!(scripts_in(&calls), 3, "{calls:?}");
}

/// A release cut off by a reset of the store's connection (Redis staying
/// up) still reaches Redis once the store has reconnected: the slot is free
/// again long before the lease's TTL. Alone, and three releases of which
/// two went together in one script.
#[tokio::test]
async fn a_release_on_a_killed_connection_still_frees_the_slot() {
    let server = RedisServer::start();
    for held in [1, 3] {
        // Made here: the kill below ends every connection open then.
        let store = match held {
            1 => store_timing_out_after(&server, Duration::from_secs(5)).await,
            _ => one_slot_store(&server).await,
        };
        let limiter = unrenewed("killed", held, Duration::from_secs(60), store.clone());
        let key = Key::new("k");
        let mut admin = server.admin().await;
        let guards = join_all((0..held).map(|_| limiter.acquire(&key))).await;
        assert!(
            guards
                .iter()
                .all(|a| matches!(a, Ok(Admission::Acquired(_)))),
            "{guards:?}"
        );
        // Writes are held at the server while it is paused for them: the
        // releases are sent and wait there, on the connection about to die.
        let () = redis::cmd("CLIENT")
            .arg(&["PAUSE", "60000", "WRITE"])
            .query_async(&mut admin)
            .await
            .unwrap();
        drop(guards);
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let clients: String = redis::cmd("CLIENT")
                .arg("LIST")
                .query_async(&mut admin)
                .await
                .unwrap();
            if clients.lines().any(|c| c.contains(" flags=b ")) {
                break;
            }
            assert!(Instant::now() < deadline, "release never reached Redis");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // Every connection but the admin's own.
        let killed: u64 = redis::cmd("CLIENT")
            .arg(&["KILL", "TYPE", "normal"])
            .query_async(&mut admin)
            .await
            .unwrap();
        assert!(killed >= 1);
        let () = redis::cmd("CLIENT")
            .arg("UNPAUSE")
            .query_async(&mut admin)
            .await
            .unwrap();
        let killed_at = Instant::now();
        tokio::time::timeout(Duration::from_secs(20), limiter.releases_settled())
            .await
            .expect("the releases settle");
        let settled = killed_at.elapsed();
        assert_eq!(
            server.leases_held().await,
            0,
            "{held}: a release was lost with its connection"
        );
        let again = join_all((0..held).map(|_| limiter.acquire(&key))).await;
        assert!(
            again
                .iter()
                .all(|a| matches!(a, Ok(Admission::Acquired(_)))),
            "{held}: slot still taken: {again:?}"
        );
        drop(again);
        limiter.releases_settled().await;
        eprintln!("{held} releases landed {settled:?} after the connection was killed");
    }
}

/// A release that Redis answers with an error of the call's own (here the
/// lease set replaced by a string: `WRONGTYPE`) cannot succeed when sent
/// again: it is given up at once, not retried until the lease's TTL.
#[tokio::test]
async fn a_release_redis_refuses_is_given_up_at_once() {
    let server = RedisServer::start();
    let store = common::redis_store(&server).await;
    let ttl = Duration::from_secs(120);
    let limiter = unrenewed("wrongtype", 1, ttl, store.clone());
    let key = Key::new("k");
    let Admission::Acquired(guard) = limiter.acquire(&key).await.unwrap() else {
        panic!("refused");
    };
    let mut admin = server.admin().await;
    let () = redis::cmd("SET")
        .arg(store.lease_key("wrongtype", &key))
        .arg("not a lease set")
        .query_async(&mut admin)
        .await
        .unwrap();
    drop(guard);
    // Far below the TTL, however loaded the machine.
    tokio::time::timeout(Duration::from_secs(20), limiter.releases_settled())
        .await
        .expect("the release is retried though Redis refuses it");
    assert_eq!(limiter.pending_releases(), 0);
}

/// A user who may not load scripts (`SCRIPT` denied by an ACL): the first
/// calls find their script missing, loading it fails, and they are
/// answered with the script's source (`EVAL`) within their timeout. One
/// load is tried for all the calls that found a script missing together,
/// not one per call.
#[tokio::test]
async fn calls_are_answered_when_the_script_cannot_be_loaded() {
    let server = RedisServer::start();
    let mut admin = server.admin().await;
    let () = redis::cmd("ACL")
        .arg(&[
            "SETUSER", "noscript", "on", ">secret", "~*", "+@all", "-script",
        ])
        .query_async(&mut admin)
        .await
        .unwrap();
    let store = RedisStore::builder(format!(
        "redis://noscript:secret@127.0.0.1:{}",
        server.port()
    ))
    .timeout(Duration::from_secs(5))
    .connect()
    .await
    .unwrap();
    let limiter = unrenewed("noload", 1, Duration::from_secs(60), store.clone());
    const CALLS: usize = 20;
    // On the test's one thread, each call is sent before any reply is read.
    let mut calls = tokio::task::JoinSet::new();
    for i in 0..CALLS {
        let limiter = limiter.clone();
        calls.spawn(async move { limiter.acquire(&Key::new(format!("k{i}"))).await });
    }
    while let Some(admission) = calls.join_next().await {
        match admission.unwrap() {
            Ok(Admission::Acquired(guard)) => std::mem::forget(guard),
            other => panic!("{other:?}"),
        }
    }
    let stats: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut admin)
        .await
        .unwrap();
    let loads = stats
        .lines()
        .find(|l| l.starts_with("cmdstat_script|load:"))
        .and_then(|l| l.split(',').find_map(|f| f.strip_prefix("rejected_calls=")))
        .and_then(|n| n.parse::<usize>().ok())
        .unwrap_or_else(|| panic!("no rejected SCRIPT LOAD in {stats}"));
    // One for the 8 calls sent alone (the store's script slots), one for
    // the 12 queued behind them, which went together in another script.
    assert_eq!(
        loads, 2,
        "SCRIPT LOAD tried {loads} times for {CALLS} calls"
    );
}

/// Many releases cut off by a hung Redis (their first attempts time out)
/// all land once it answers again, long before their leases' TTL.
#[tokio::test]
async fn releases_queued_during_an_outage_all_land_after_it() {
    let server = RedisServer::start();
    let timeout = Duration::from_millis(100);
    let store = store_timing_out_after(&server, timeout).await;
    let limiter = unrenewed("outage", 1, Duration::from_secs(120), store.clone());
    const LEASES: usize = 40;
    let mut guards = Vec::new();
    for i in 0..LEASES {
        match limiter.acquire(&Key::new(format!("k{i}"))).await.unwrap() {
            Admission::Acquired(guard) => guards.push(guard),
            Admission::Refused(grant) => panic!("{grant:?}"),
        }
    }
    server.pause();
    drop(guards);
    // A call sent after the releases, with the same timeout: once it has
    // timed out, so have their first attempts.
    let probe = limiter.acquire(&Key::new("probe")).await;
    assert!(probe.is_err(), "{probe:?}");
    server.resume();
    tokio::time::timeout(Duration::from_secs(30), limiter.releases_settled())
        .await
        .expect("the releases settle");
    assert_eq!(server.leases_held().await, 0, "a release was lost");
}

/// Two clients calling back to back against a limit of 2 in flight on
/// Redis are never refused: a release is on its way to Redis before the
/// response's body has ended for the caller, ahead of the caller's next
/// acquire on the same connection. (It was handed to a spawned task,
/// which on this one-thread runtime ran only after the next acquire had
/// gone out.)
#[tokio::test(flavor = "current_thread")]
async fn back_to_back_callers_never_find_their_own_released_slot_taken() {
    use axum::{Router, body::Body, routing::get};
    use fleetgate::ConcurrencyLimitLayer;
    use fleetgate::key::GlobalKey;
    use http::{Request, StatusCode};
    use http_body_util::BodyExt;
    use tower::ServiceExt;
    let server = RedisServer::start();
    let limiter = ConcurrencyLimiter::new(
        ConcurrencyPolicy::builder("slow", 2).build().unwrap(),
        common::redis_store(&server).await,
    );
    // The scripts loaded first: a script's first call takes a second
    // round trip to load it, which the next acquire may overtake.
    let warm = limiter.acquire(&Key::new("warm")).await.unwrap();
    drop(warm);
    limiter.releases_settled().await;
    let app = Router::new()
        .route("/slow", get(|| async { "done" }))
        .route_layer(ConcurrencyLimitLayer::new(limiter).key(GlobalKey::new()));
    let client = async |app: Router| {
        let mut refused = 0;
        for _ in 0..200 {
            let res = app
                .clone()
                .oneshot(Request::get("/slow").body(Body::empty()).unwrap())
                .await
                .unwrap();
            if res.status() == StatusCode::TOO_MANY_REQUESTS {
                refused += 1;
            }
            res.into_body().collect().await.unwrap();
        }
        refused
    };
    let (a, b) = tokio::join!(client(app.clone()), client(app));
    assert_eq!((a, b), (0, 0), "calls refused");
    assert_eq!(server.leases_held().await, 0);
}
