//! `RedisStore` on Redis Sentinel (`Topology::sentinel`), against real
//! processes: a master, a replica and three sentinels started for each test
//! (`tests/common/sentinel.rs`). The master killed under load, the master
//! demoted by hand (`READONLY`), one sentinel down, one never answering,
//! passwords. Where real sentinels cannot be made to disagree on demand (a
//! sentinel cut off with the old master, sentinels that see no master yet),
//! stand-ins answer in their place (`FakeSentinel`), naming real servers.
//!
//! The failover test bounds every call's latency, so these tests run in
//! the binary of tests that run one at a time; the others share its
//! helpers.
use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::RedisServer;
use common::sentinel::{
    FakeConfig, FakeSentinel, FreezingProxy, MASTER_NAME, Passwords, SentinelSet,
};
use fleetgate::concurrency::{Admission, ConcurrencyLimiter, ConcurrencyPolicy};
use fleetgate::key::Key;
use fleetgate::{Algorithm, Limit, Limiter, Policy, Rate, RedisStore, Topology};
use futures_util::FutureExt;
use tokio::sync::mpsc;

/// The store's timeout: short, yet long enough that a healthy Redis on a
/// loaded 2-core machine answers within it.
const TIMEOUT: Duration = Duration::from_millis(150);
/// What a loaded 2-core machine may add to it.
const MARGIN: Duration = Duration::from_millis(400);
/// How soon after the replica's promotion the store must decide on it:
/// the bound. Sentinel itself names the new master 0.4-0.9 s
/// after promotion (it reads the replica's INFO once a second).
const RESUME: Duration = Duration::from_secs(2);
const TASKS: usize = 16;
const PACE: Duration = Duration::from_millis(4);
/// The hot key's limit: 50 per second, burst 10.
const RATE: u64 = 50;
const BURST: u64 = 10;

fn hot_policy() -> Policy {
    Policy::single(
        "hot",
        Limit::builder(Rate::per_second(RATE))
            .burst(BURST)
            .build()
            .unwrap(),
    )
    .unwrap()
}

async fn store(set: &SentinelSet, poll: Duration) -> RedisStore {
    RedisStore::builder(Topology::sentinel(set.sentinel_urls(), MASTER_NAME))
        .prefix("sentinel")
        .timeout(TIMEOUT)
        // Every answer from Redis: a denial remembered locally would count
        // as a decision while no master is there.
        .deny_cache(0)
        .sentinel_poll(poll)
        .connect()
        .await
        .expect("connect through the sentinels")
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    Gcra,
    Lease,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Outcome {
    Allowed,
    Denied,
    Failed,
}

#[derive(Clone, Copy, Debug)]
struct Record {
    op: Op,
    started: Instant,
    ended: Instant,
    outcome: Outcome,
    /// For a failed GCRA call: what the local fallback (the same limit,
    /// in memory) answered.
    local_allowed: bool,
}

/// GCRA checks on one hot key and lease churn from [`TASKS`] tasks, every
/// answer reported as it comes.
struct Load {
    stop: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    records: mpsc::UnboundedReceiver<Record>,
    seen: Vec<Record>,
}

impl Load {
    fn start(store: &RedisStore) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, records) = mpsc::unbounded_channel();
        let limiter = Limiter::new(hot_policy(), store.clone());
        let local = Limiter::in_memory(hot_policy());
        let leases = ConcurrencyLimiter::new(
            ConcurrencyPolicy::builder("churn", 4)
                .lease_ttl(Duration::from_secs(2))
                .no_renewal()
                .build()
                .unwrap(),
            store.clone(),
        );
        let mut tasks = Vec::new();
        for task in 0..TASKS {
            let (stop, tx) = (stop.clone(), tx.clone());
            let (limiter, local, leases) = (limiter.clone(), local.clone(), leases.clone());
            tasks.push(tokio::spawn(async move {
                let hot = Key::new("hot");
                let churn = Key::new(format!("churn-{task}"));
                let mut tick = tokio::time::interval(PACE);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    tick.tick().await;
                    n += 1;
                    let started = Instant::now();
                    let record = if n.is_multiple_of(2) {
                        let result = limiter.check(&hot, 1).await;
                        let ended = Instant::now();
                        let (outcome, local_allowed) = match result {
                            Ok(d) if d.is_allowed() => (Outcome::Allowed, false),
                            Ok(_) => (Outcome::Denied, false),
                            Err(_) => {
                                let local =
                                    local.check(&hot, 1).await.is_ok_and(|d| d.is_allowed());
                                (Outcome::Failed, local)
                            }
                        };
                        Record {
                            op: Op::Gcra,
                            started,
                            ended,
                            outcome,
                            local_allowed,
                        }
                    } else {
                        let result = leases.acquire(&churn).await;
                        let ended = Instant::now();
                        let outcome = match result {
                            Ok(Admission::Acquired(guard)) => {
                                drop(guard);
                                Outcome::Allowed
                            }
                            Ok(Admission::Refused(_)) => Outcome::Denied,
                            Err(_) => Outcome::Failed,
                        };
                        Record {
                            op: Op::Lease,
                            started,
                            ended,
                            outcome,
                            local_allowed: false,
                        }
                    };
                    if tx.send(record).is_err() {
                        break;
                    }
                }
            }));
        }
        Load {
            stop,
            tasks,
            records,
            seen: Vec::new(),
        }
    }

    fn drain(&mut self) {
        while let Ok(record) = self.records.try_recv() {
            self.seen.push(record);
        }
    }

    /// Waits until a call that started after `after` was decided by Redis.
    async fn decided_after(&mut self, after: Instant, within: Duration) -> Option<Instant> {
        let deadline = Instant::now() + within;
        loop {
            self.drain();
            if let Some(r) = self
                .seen
                .iter()
                .filter(|r| r.started >= after && r.outcome != Outcome::Failed)
                .min_by_key(|r| r.ended)
            {
                return Some(r.ended);
            }
            if Instant::now() > deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    async fn stop(mut self) -> Vec<Record> {
        self.stop.store(true, Ordering::Relaxed);
        for task in self.tasks.drain(..) {
            task.await.expect("a load task panicked");
        }
        self.drain();
        self.seen
    }
}

/// Polls the replica's `ROLE` until it says master: the promotion's
/// instant, within a few milliseconds.
async fn promoted(set: &SentinelSet, port: u16, within: Duration) -> Instant {
    let deadline = Instant::now() + within;
    loop {
        if set.role(port).await.is_ok_and(|role| role == "master") {
            return Instant::now();
        }
        assert!(Instant::now() < deadline, "the replica was never promoted");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// `EVAL` and `EVALSHA` calls in `INFO commandstats` (rejected ones
/// apart).
fn script_calls(info: &str) -> u64 {
    info.lines()
        .filter(|l| l.starts_with("cmdstat_evalsha:") || l.starts_with("cmdstat_eval:"))
        .filter_map(|l| {
            l.split("calls=")
                .nth(1)?
                .split(',')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum()
}

async fn leases_held(conn: &mut redis::aio::MultiplexedConnection, pattern: &str) -> usize {
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(pattern)
        .query_async(conn)
        .await
        .unwrap();
    let mut total = 0;
    for key in keys {
        // Tombstones (scored below zero, lua/lease.lua) are no leases.
        let n: usize = redis::cmd("ZCOUNT")
            .arg(&key)
            .arg("(0")
            .arg("+inf")
            .query_async(conn)
            .await
            .unwrap();
        total += n;
    }
    total
}

/// kill -9 of the master under load: every call is answered within the
/// timeout plus a margin, the store decides on the promoted replica within
/// [`RESUME`] of its promotion, over-limit admissions stay within a burst
/// or two, and leases taken before the failover are on the new master (or
/// lost with the writes it had not replicated) and all gone once released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_master_killed_under_load() {
    let _alone = crate::one_at_a_time().await;
    let mut set = SentinelSet::start().await;
    let replica_port = set.replica.port();
    let store = store(&set, Duration::from_millis(500)).await;

    // Leases held across the failover.
    let held_limiter = ConcurrencyLimiter::new(
        ConcurrencyPolicy::builder("held", 100)
            .lease_ttl(Duration::from_secs(30))
            .no_renewal()
            .build()
            .unwrap(),
        store.clone(),
    );
    let mut held = Vec::new();
    for i in 0..8 {
        match held_limiter.acquire(&Key::new(format!("held-{i}"))).await {
            Ok(Admission::Acquired(guard)) => held.push(guard),
            other => panic!("a lease before the failover: {other:?}"),
        }
    }

    let mut load = Load::start(&store);
    let began = Instant::now();
    assert!(
        load.decided_after(began, Duration::from_secs(5))
            .await
            .is_some(),
        "no decision before the failover"
    );
    // A second of enforcement before the kill.
    tokio::time::sleep(Duration::from_secs(1)).await;

    // Nothing went to the replica while it was one.
    let mut replica = set.connect(replica_port).await;
    let stats: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut replica)
        .await
        .unwrap();
    assert_eq!(script_calls(&stats), 0, "scripts sent to the replica");

    let killed = Instant::now();
    set.master.take().expect("the master").stop();
    let promotion = promoted(&set, replica_port, Duration::from_secs(15)).await;
    let resumed = load
        .decided_after(killed, Duration::from_secs(20))
        .await
        .expect("the store never decided on the new master");
    // Enforcement for a while on the new master.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let records = load.stop().await;
    let ended = Instant::now();

    // Every call answered in time.
    let slowest = records.iter().map(|r| r.ended - r.started).max().unwrap();
    let failed_calls = records
        .iter()
        .filter(|r| r.outcome == Outcome::Failed)
        .count();
    let first_failure = records
        .iter()
        .filter(|r| r.outcome == Outcome::Failed)
        .map(|r| r.started)
        .min();
    let gap = first_failure.map_or(Duration::ZERO, |f| resumed.saturating_duration_since(f));

    // The hot key: what Redis admitted, and what open and local admitted.
    let gcra: Vec<_> = records.iter().filter(|r| r.op == Op::Gcra).collect();
    let redis_allowed = gcra
        .iter()
        .filter(|r| r.outcome == Outcome::Allowed)
        .count() as u64;
    let failed_gcra = gcra.iter().filter(|r| r.outcome == Outcome::Failed).count() as u64;
    let local_allowed = gcra.iter().filter(|r| r.local_allowed).count() as u64;
    let span = ended - began;
    let allowed_by_limit = BURST + (RATE as f64 * span.as_secs_f64()).ceil() as u64;
    let over = |admitted: u64| admitted.saturating_sub(allowed_by_limit);

    // Leases held across the failover, on the new master.
    let mut admin = set.connect(replica_port).await;
    let held_after = leases_held(&mut admin, "sentinel:held:*").await;
    drop(held);
    let settled =
        tokio::time::timeout(Duration::from_secs(10), held_limiter.releases_settled()).await;
    let held_released = leases_held(&mut admin, "sentinel:held:*").await;

    eprintln!(
        "sentinel failover under load: promotion {:?} after the kill; first decision on \
         the new master {:?} after the kill, {:?} after promotion; {failed_calls} failed \
         calls over {gap:?} without enforcement; slowest call {slowest:?}; hot key \
         ({RATE}/s burst {BURST}, {allowed_by_limit} allowed over {span:?}): Redis \
         admitted {redis_allowed} (over by {}), with open {} (over by {}), with local {} \
         (over by {}); held leases on the new master {held_after}/8, {held_released} \
         left after release; {:?}",
        promotion - killed,
        resumed - killed,
        resumed.saturating_duration_since(promotion),
        over(redis_allowed),
        redis_allowed + failed_gcra,
        over(redis_allowed + failed_gcra),
        redis_allowed + local_allowed,
        over(redis_allowed + local_allowed),
        store,
    );

    assert!(
        slowest <= TIMEOUT + MARGIN,
        "a call took {slowest:?}, over {TIMEOUT:?} + {MARGIN:?}"
    );
    assert!(
        resumed.saturating_duration_since(promotion) <= RESUME,
        "the store decided on the new master {:?} after its promotion",
        resumed.saturating_duration_since(promotion)
    );
    // Lost writes give back at most one burst; the local fallback, with
    // the whole limit, one more.
    assert!(
        over(redis_allowed) <= BURST,
        "Redis admitted {redis_allowed}"
    );
    assert!(
        over(redis_allowed + local_allowed) <= 2 * BURST,
        "with the local fallback {} were admitted",
        redis_allowed + local_allowed
    );
    // Leases taken a second before the kill had replicated; released
    // leases are gone from the new master.
    assert_eq!(held_after, 8, "leases held before the failover");
    assert!(settled.is_ok(), "releases did not settle");
    assert_eq!(held_released, 0, "leases left after release");
    // The load's churn leases too, once their releases have landed or
    // their 2 s TTL has passed.
    let deadline = Instant::now() + Duration::from_secs(4);
    loop {
        let churn_left = leases_held(&mut admin, "sentinel:churn:*").await;
        if churn_left == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{churn_left} churn leases left on the new master"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The master demoted by hand (`SENTINEL FAILOVER`, then `REPLICAOF` on the
/// old master, what Sentinel does some seconds later): the store's next
/// writes there answer `READONLY`, which makes it look the master up, and
/// decisions resume on the new one; the old node takes no more calls. The
/// periodic check is off, so that only `READONLY` can move the store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readonly_makes_the_store_look_the_master_up() {
    let _alone = crate::one_at_a_time().await;
    readonly_moves_the_store(hot_policy()).await;
}

/// The same with a window algorithm, whose script runs each call it
/// carries in a protected call: a server's `READONLY` must still fail the
/// script, not just the call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readonly_on_a_window_check_makes_the_store_look_the_master_up() {
    let _alone = crate::one_at_a_time().await;
    let policy = Policy::builder("hot")
        .algorithm(Algorithm::SlidingWindow)
        .limit(Limit::builder(Rate::per_second(RATE)).build().unwrap())
        .build()
        .unwrap();
    readonly_moves_the_store(policy).await;
}

async fn readonly_moves_the_store(policy: Policy) {
    let set = SentinelSet::start().await;
    let (old, new) = (set.master_port(), set.replica.port());
    let store = store(&set, Duration::from_secs(3600)).await;
    let limiter = Limiter::new(policy, store.clone());
    let key = Key::new("ro");
    assert!(limiter.check(&key, 1).await.is_ok());

    let _: String = set
        .sentinel_cmd(&["FAILOVER", MASTER_NAME])
        .await
        .expect("SENTINEL FAILOVER");
    promoted(&set, new, Duration::from_secs(15)).await;
    let mut old_conn = set.connect(old).await;
    let _: () = redis::cmd("REPLICAOF")
        .arg("127.0.0.1")
        .arg(new)
        .query_async(&mut old_conn)
        .await
        .expect("REPLICAOF on the old master");
    let demoted = Instant::now();
    // The sentinels must name the new master before a lookup can find it.
    set.wait_switched(new, Duration::from_secs(15)).await;

    // Decisions (writes: 1 per 20 ms is under the limit) resume.
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut failures = 0;
    let resumed = loop {
        match limiter.check(&key, 1).await {
            Ok(_) => break Instant::now(),
            Err(_) => failures += 1,
        }
        assert!(Instant::now() < deadline, "decisions never resumed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let before: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut old_conn)
        .await
        .unwrap();
    for _ in 0..50 {
        assert!(
            limiter.check(&key, 1).await.is_ok(),
            "a decision after the swap failed"
        );
    }
    let after: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut old_conn)
        .await
        .unwrap();
    eprintln!(
        "sentinel READONLY: decisions resumed {:?} after the demotion, {failures} failed; {store:?}",
        resumed - demoted
    );
    assert_eq!(
        script_calls(&before),
        script_calls(&after),
        "the old master still gets calls"
    );
    let role = set.role(old).await.unwrap();
    assert_eq!(role, "slave");
    // The new master holds the key's state.
    let mut new_conn = set.connect(new).await;
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("sentinel:hot:*")
        .query_async(&mut new_conn)
        .await
        .unwrap();
    assert!(!keys.is_empty(), "no limiter state on the new master");
}

/// One sentinel of three down: the store connects, and follows a failover,
/// with the two left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_sentinel_down_changes_nothing() {
    let _alone = crate::one_at_a_time().await;
    let mut set = SentinelSet::start().await;
    // The first one the store would ask.
    set.sentinels[0].kill();
    let store = store(&set, Duration::from_millis(200)).await;
    let limiter = Limiter::new(hot_policy(), store.clone());
    let key = Key::new("one-down");
    assert!(limiter.check(&key, 1).await.is_ok());

    let new = set.replica.port();
    let _: String = set
        .sentinel_cmd(&["FAILOVER", MASTER_NAME])
        .await
        .expect("SENTINEL FAILOVER");
    set.wait_switched(new, Duration::from_secs(15)).await;
    let switched = Instant::now();
    // Only the periodic check can tell: the old master still answers.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        assert!(limiter.check(&key, 1).await.is_ok());
        if format!("{store:?}").contains(&format!("127.0.0.1:{new}")) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the store stayed on the old master: {store:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    eprintln!(
        "sentinel, one of three down: the store moved {:?} after the sentinels named the new master",
        switched.elapsed()
    );
    let mut new_conn = set.connect(new).await;
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("sentinel:hot:*")
        .query_async(&mut new_conn)
        .await
        .unwrap();
    assert!(limiter.check(&key, 1).await.is_ok());
    let keys_after: Vec<String> = redis::cmd("KEYS")
        .arg("sentinel:hot:*")
        .query_async(&mut new_conn)
        .await
        .unwrap();
    assert!(
        !keys.is_empty() || !keys_after.is_empty(),
        "no GCRA state on the new master"
    );
}

/// Passwords on the sentinels and (another) on the servers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passwords_on_sentinels_and_master() {
    let _alone = crate::one_at_a_time().await;
    let set = SentinelSet::start_with(Some(Passwords {
        redis: "master-secret".into(),
        sentinel: "sentinel-secret".into(),
    }))
    .await;
    let without = RedisStore::builder(Topology::sentinel(set.sentinel_urls(), MASTER_NAME))
        .timeout(TIMEOUT)
        .connect()
        .await;
    assert!(
        without.is_err(),
        "connected to the master without its password"
    );
    let store = RedisStore::builder(Topology::sentinel(set.sentinel_urls(), MASTER_NAME))
        .prefix("sentinel")
        .timeout(Duration::from_secs(2))
        .sentinel_master(
            redis::sentinel::SentinelNodeConnectionInfo::default().set_redis_connection_info(
                redis::RedisConnectionInfo::default().set_password("master-secret"),
            ),
        )
        .connect()
        .await
        .expect("connect with passwords");
    let limiter = Limiter::new(hot_policy(), store);
    assert!(
        limiter
            .check(&Key::new("auth"), 1)
            .await
            .unwrap()
            .is_allowed()
    );
}

/// A lazy Sentinel store: it is built at once, decisions fail
/// until the master is found in the background, then Redis decides.
/// Outside a runtime it is refused, as the eager one is; an absurd poll
/// interval is clamped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lazy_store_finds_the_master_in_the_background() {
    let _alone = crate::one_at_a_time().await;
    let set = SentinelSet::start().await;
    let urls = set.sentinel_urls();
    let outside = std::thread::spawn({
        let urls = urls.clone();
        move || {
            RedisStore::builder(Topology::sentinel(urls, MASTER_NAME))
                .lazy()
                .connect()
                .now_or_never()
                .expect("refused at the first poll")
                .map(|_| ())
        }
    })
    .join()
    .unwrap();
    assert!(outside.is_err(), "a lazy store outside a runtime");
    // Nor the eager one: polled outside a runtime, it is refused at once
    // (no panic).
    let eager_outside = std::thread::spawn({
        let urls = urls.clone();
        move || {
            let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
            let mut connecting = std::pin::pin!(
                RedisStore::builder(Topology::sentinel(urls, MASTER_NAME)).connect()
            );
            matches!(
                std::future::Future::poll(connecting.as_mut(), &mut cx),
                std::task::Poll::Ready(Err(_))
            )
        }
    })
    .join()
    .expect("an eager store outside a runtime panicked");
    assert!(eager_outside, "an eager store outside a runtime");

    let store = RedisStore::builder(Topology::sentinel(urls, MASTER_NAME))
        .prefix("sentinel")
        .timeout(Duration::from_secs(2))
        // Absurdly long: taken as a day, no overflow.
        .sentinel_poll(Duration::MAX)
        .lazy()
        .connect()
        .await
        .expect("a lazy store");
    let limiter = Limiter::new(hot_policy(), store.clone());
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        if limiter.check(&Key::new("lazy"), 1).await.is_ok() {
            break;
        }
        assert!(Instant::now() < deadline, "no master found: {store:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let master = format!("127.0.0.1:{}", set.master_port());
    assert!(format!("{store:?}").contains(&master), "{store:?}");
}

/// A sentinel that takes connections and never answers (blackholed) is
/// the first of the list: the store connects through the others, and
/// follows a kill -9 of the master within [`RESUME`] of the promotion,
/// as with every sentinel up: the sentinels are asked at once, each
/// within the connect timeout, not one after the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_first_sentinel_delays_nothing() {
    let _alone = crate::one_at_a_time().await;
    let mut set = SentinelSet::start().await;
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let silent_port = silent.local_addr().unwrap().port();
    let held = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = silent.accept().await {
            held.push(socket);
        }
    });
    let mut urls = vec![format!("redis://127.0.0.1:{silent_port}")];
    urls.extend(set.sentinel_urls());
    let store = RedisStore::builder(Topology::sentinel(urls, MASTER_NAME))
        .prefix("sentinel")
        .timeout(TIMEOUT)
        .deny_cache(0)
        .sentinel_poll(Duration::from_millis(200))
        .connect()
        .await
        .expect("connect through the sentinels that answer");
    let limiter = Limiter::new(hot_policy(), store.clone());
    let key = Key::new("silent-first");
    assert!(limiter.check(&key, 1).await.is_ok());

    let new = set.replica.port();
    set.master.take().expect("the master").stop();
    let promotion = promoted(&set, new, Duration::from_secs(15)).await;
    let on_new = format!("127.0.0.1:{new}");
    let deadline = promotion + RESUME + MARGIN;
    let resumed = loop {
        let decided = limiter.check(&key, 1).await.is_ok();
        if decided && format!("{store:?}").contains(&on_new) {
            break Instant::now();
        }
        assert!(
            Instant::now() < deadline,
            "the store did not follow the failover: {store:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    eprintln!(
        "sentinel, first of four silent: first decision on the new master {:?} after promotion",
        resumed - promotion
    );
    assert!(
        resumed - promotion <= RESUME + MARGIN,
        "{:?} after promotion",
        resumed - promotion
    );
    held.abort();
}

/// Waits until `count` reaches `at_least` (within 10 s).
async fn reaches(mut count: tokio::sync::watch::Receiver<usize>, at_least: usize, what: &str) {
    let reached = tokio::time::timeout(Duration::from_secs(10), count.wait_for(|n| *n >= at_least))
        .await
        .is_ok_and(|r| r.is_ok());
    assert!(reached, "{what}: {} of {at_least}", *count.borrow());
}

/// A sentinel cut off with the old master, which still says `ROLE` master,
/// answers first; the two others name the new master. The store connects
/// to the master the majority names, and stays there: the periodic check,
/// which asks the cut-off sentinel first, starts one lookup that keeps the
/// connection, then asks the next sentinel. The old master gets nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_cut_off_with_the_old_master_does_not_move_the_store() {
    let _alone = crate::one_at_a_time().await;
    let old = RedisServer::start();
    let new = RedisServer::start();
    let cut_off = FakeSentinel::start(FakeConfig {
        master_port: old.port(),
        ..FakeConfig::default()
    })
    .await;
    let mut majority = Vec::new();
    for _ in 0..2 {
        majority.push(
            FakeSentinel::start(FakeConfig {
                master_port: new.port(),
                // After the cut-off one: the first answer names the old
                // master.
                after: Some(cut_off.lookups()),
                ..FakeConfig::default()
            })
            .await,
        );
    }
    let urls = vec![cut_off.url(), majority[0].url(), majority[1].url()];
    let store = RedisStore::builder(Topology::sentinel(urls, MASTER_NAME))
        .prefix("sentinel")
        .timeout(Duration::from_secs(2))
        .sentinel_poll(Duration::from_millis(50))
        .connect()
        .await
        .expect("connect through the sentinels");
    let on_new = format!("master: Some(\"127.0.0.1:{}\")", new.port());
    assert!(format!("{store:?}").contains(&on_new), "{store:?}");
    let limiter = Limiter::new(hot_policy(), store.clone());
    let key = Key::new("cut-off");
    assert!(limiter.check(&key, 1).await.is_ok());

    // The check asked the cut-off sentinel (the old master: a lookup),
    // then asks the next one, which names the master in use.
    reaches(cut_off.polls(), 1, "questions to the cut-off sentinel").await;
    reaches(majority[0].polls(), 4, "questions to the next sentinel").await;
    assert!(limiter.check(&key, 1).await.is_ok());
    let lookups = *majority[1].lookups().borrow();
    let debug = format!("{store:?}");
    eprintln!(
        "sentinel cut off with the old master: {lookups} lookups, cut-off sentinel asked \
         {} times by the check; {debug}",
        *cut_off.polls().borrow()
    );
    assert!(debug.contains(&on_new), "moved to the old master: {debug}");
    assert!(
        debug.contains("swaps: 1"),
        "swapped more than once: {debug}"
    );
    assert!(
        (2..=3).contains(&lookups),
        "{lookups} lookups: one to connect, one after the cut-off sentinel's answer"
    );
    assert_eq!(
        *cut_off.polls().borrow(),
        1,
        "the check kept asking the cut-off sentinel"
    );
    let mut old_conn = old.admin().await;
    let stats: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut old_conn)
        .await
        .unwrap();
    assert_eq!(script_calls(&stats), 0, "scripts sent to the old master");
    let keys: u64 = redis::cmd("DBSIZE")
        .query_async(&mut old_conn)
        .await
        .unwrap();
    assert_eq!(keys, 0, "keys written on the old master");
}

/// Two sentinels of three see the master down at first (a failover under
/// way: they flag it `o_down`), the third never answers. The lookup asks
/// the two again instead of giving up because most sentinels answered
/// without a master, and connects as soon as they name it (they are asked
/// again every 50 ms), not after the connect timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinels_that_saw_no_master_yet_are_asked_again() {
    let _alone = crate::one_at_a_time().await;
    let master = RedisServer::start();
    let mut fakes = Vec::new();
    for _ in 0..2 {
        fakes.push(
            FakeSentinel::start(FakeConfig {
                master_port: master.port(),
                down_first: 1,
                ..FakeConfig::default()
            })
            .await,
        );
    }
    let silent = FakeSentinel::start(FakeConfig {
        silent: true,
        ..FakeConfig::default()
    })
    .await;
    let urls = vec![fakes[0].url(), fakes[1].url(), silent.url()];
    let connect_timeout = Duration::from_secs(2);
    let started = Instant::now();
    let store = RedisStore::builder(Topology::sentinel(urls, MASTER_NAME))
        .prefix("sentinel")
        .timeout(Duration::from_secs(2))
        .connect_timeout(connect_timeout)
        .connect()
        .await
        .expect("connect once the sentinels name the master");
    let took = started.elapsed();
    eprintln!("sentinel, two saw no master at first, one silent: connected in {took:?}");
    assert!(
        format!("{store:?}").contains(&format!("127.0.0.1:{}", master.port())),
        "{store:?}"
    );
    assert!(
        *fakes[0].lookups().borrow() >= 2 && *fakes[1].lookups().borrow() >= 2,
        "not asked again"
    );
    assert!(
        took < connect_timeout,
        "the lookup waited for the silent sentinel: {took:?}"
    );
    let limiter = Limiter::new(hot_policy(), store);
    assert!(limiter.check(&Key::new("asked-again"), 1).await.is_ok());
}

/// The connection to the master goes half-open (its packets vanish, no
/// reset: a proxy in between freezes it) while the sentinels go on naming
/// the same address. The calls time out; the lookup that starts finds the
/// address unchanged, sends the connection a `PING`, which gets no answer
/// within half the connect timeout, and connects anew: decisions resume
/// without anyone restarting anything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_half_open_connection_is_replaced() {
    let _alone = crate::one_at_a_time().await;
    let master = RedisServer::start();
    let proxy = FreezingProxy::start(master.port()).await;
    let mut fakes = Vec::new();
    for _ in 0..3 {
        fakes.push(
            FakeSentinel::start(FakeConfig {
                master_port: proxy.port(),
                ..FakeConfig::default()
            })
            .await,
        );
    }
    let connect_timeout = Duration::from_secs(1);
    let store = RedisStore::builder(Topology::sentinel(
        fakes.iter().map(FakeSentinel::url),
        MASTER_NAME,
    ))
    .prefix("sentinel")
    .timeout(TIMEOUT)
    .connect_timeout(connect_timeout)
    .deny_cache(0)
    // Only the calls' failures start lookups.
    .sentinel_poll(Duration::from_secs(3600))
    .connect()
    .await
    .expect("connect through the sentinels");
    let limiter = Limiter::new(hot_policy(), store.clone());
    let key = Key::new("half-open");
    assert!(limiter.check(&key, 1).await.is_ok());
    assert!(format!("{store:?}").contains("swaps: 1"), "{store:?}");

    proxy.freeze();
    let frozen = Instant::now();
    // The first call times out, then calls fail until the PING has had
    // its half of the connect timeout and the new connection is in.
    let bound = TIMEOUT + connect_timeout / 2 + connect_timeout + MARGIN;
    let mut failures = 0;
    let resumed = loop {
        let started = Instant::now();
        let decided = limiter.check(&key, 1).await.is_ok();
        let took = started.elapsed();
        assert!(
            took <= TIMEOUT + MARGIN,
            "a call took {took:?} on the half-open connection"
        );
        if decided {
            break Instant::now();
        }
        failures += 1;
        assert!(
            frozen.elapsed() < bound,
            "no new connection after {:?}: {store:?}",
            frozen.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let debug = format!("{store:?}");
    eprintln!(
        "sentinel, half-open connection: decisions resumed {:?} after the freeze, {failures} \
         calls failed; {debug}",
        resumed - frozen
    );
    assert!(failures >= 1, "the frozen connection answered");
    assert!(debug.contains("swaps: 2"), "not reconnected: {debug}");
    assert!(
        debug.contains(&format!("127.0.0.1:{}", proxy.port())),
        "{debug}"
    );
}
