//! Retry budgets on Redis: `lua/budget.lua` decides as the memory store
//! does, three instances on one Redis share one budget within its bound
//! with no round trip per retry, and a Redis that is gone allows no retry.
use crate::common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::RedisServer;
use fleetgate::clock::ManualClock;
use fleetgate::rate_limit::RetryBudget;
use fleetgate::{MemoryStore, RedisStore, Store, TimeSource};

/// The results of one scenario of deposits, withdrawals (up to `most` a
/// step) and clock steps on `budget`, its store's clock `clock`.
async fn scenario(budget: &RetryBudget, clock: &ManualClock, seed: u64, most: u32) -> Vec<bool> {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut results = Vec::new();
    for step in 0..60 {
        for _ in 0..rng.u32(0..30) {
            budget.deposit();
        }
        for _ in 0..rng.u32(0..most) {
            results.push(budget.withdraw().await);
        }
        // Slots are 6 minutes (ttl 1 h): some steps stay in one, some
        // cross several, a few pass them all.
        let by = if step % 17 == 16 {
            4000
        } else {
            rng.u64(0..500)
        };
        clock.advance(Duration::from_secs(by));
    }
    results
}

#[tokio::test]
async fn lua_decides_as_the_memory_store() {
    let server = RedisServer::start();
    // A minimum of 1 a second is 360 tokens a slot: more withdrawals.
    for (seed, ratio, min, most) in [(1, 0.3, 0, 20), (2, 0.1, 1, 400), (3, 1.5, 0, 60)] {
        let start = Duration::from_secs(1_700_000_000);
        let build = |store: Arc<dyn Store>| {
            // One token leased at a time, and reports only with a lease
            // (a slot of 6 minutes): each withdrawal is one call to the
            // store, in order, as on the memory store.
            RetryBudget::new(store)
                .ratio(ratio)
                .min_per_second(min)
                .ttl(Duration::from_secs(3600))
                .lease(1)
                .build("conformance")
                .unwrap()
        };
        let clock = ManualClock::new(start);
        let memory = build(Arc::new(
            MemoryStore::builder().clock(clock.clone()).build(),
        ));
        let expected = scenario(&memory, &clock, seed, most).await;

        let clock = ManualClock::new(start);
        let redis = RedisStore::builder(server.url())
            .prefix(format!("conformance{seed}"))
            .timeout(Duration::from_secs(2))
            .time_source(TimeSource::Client(Arc::new(clock.clone())))
            .connect()
            .await
            .unwrap();
        let redis = build(Arc::new(redis));
        let got = scenario(&redis, &clock, seed, most).await;
        assert_eq!(got, expected, "seed {seed}");
        let granted = expected.iter().filter(|&&g| g).count();
        assert!(
            granted > 20 && granted < expected.len() - 20,
            "seed {seed}: {granted} of {}: the scenario should both grant and refuse",
            expected.len()
        );
        assert_eq!(redis.stats().retries, granted as u64);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_instances_share_one_budget_within_its_bound() {
    let server = RedisServer::start();
    let mut budgets = Vec::new();
    for _ in 0..3 {
        // Its own connection, as another process would have.
        let store = common::redis_store(&server).await;
        let budget = RetryBudget::new(Arc::new(store))
            .ratio(0.1)
            .min_per_second(5)
            .build("upstream")
            .unwrap();
        budgets.push(budget);
    }
    let mut admin = server.admin().await;
    let scripts_before = evalsha_calls(&mut admin).await;

    // Every call fails: each is retried up to 3 times, while the budget
    // lets it, for 3 seconds.
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for budget in budgets.clone() {
        tasks.spawn(async move {
            let (mut first, mut retries) = (0u64, 0u64);
            let mut tick = tokio::time::interval(Duration::from_millis(2));
            while started.elapsed() < Duration::from_secs(3) {
                tick.tick().await;
                budget.deposit();
                first += 1;
                for _ in 0..3 {
                    if !budget.try_withdraw() {
                        break;
                    }
                    retries += 1;
                }
            }
            (first, retries)
        });
    }
    let (mut first, mut retries) = (0, 0);
    while let Some(counts) = tasks.join_next().await {
        let (f, r) = counts.unwrap();
        first += f;
        retries += r;
    }
    let seconds = started.elapsed().as_secs_f64();
    let scripts = evalsha_calls(&mut admin).await - scripts_before;

    eprintln!("{first} first attempts, {retries} retries, {scripts} scripts in {seconds:.1} s");
    // The bound: ratio × first attempts + minimum × (seconds + two slots).
    let bound = 0.1 * first as f64 + 5.0 * (seconds + 2.0);
    assert!(
        (retries as f64) <= bound,
        "{retries} retries of {first} first attempts in {seconds:.1} s: above {bound:.0}"
    );
    // Most of what the budget held was spent: the first attempts were
    // reported and leased on.
    assert!(
        retries as f64 >= 0.5 * 0.1 * first as f64,
        "{retries} retries of {first} first attempts"
    );
    // Leased in batches: no script per retry. Scripts come with time (a
    // report a slot, a lease at most every quarter slot while the budget
    // is short), retries with the first attempts.
    let most = retries as f64 / 2.0 + 3.0 * 6.0 * (seconds + 1.0);
    assert!(
        (scripts as f64) < most && scripts < retries,
        "{scripts} scripts for {retries} retries in {seconds:.1} s"
    );
    let stats: u64 = budgets.iter().map(|b| b.stats().retries).sum();
    assert_eq!(stats, retries);
}

#[tokio::test]
async fn a_redis_that_is_gone_allows_no_retry() {
    let store = common::unreachable_store(Duration::from_millis(200)).await;
    let budget = RetryBudget::new(Arc::new(store)).build("upstream").unwrap();
    budget.deposit();
    assert!(!budget.withdraw().await);
    assert!(!budget.try_withdraw());
    let stats = budget.stats();
    assert!(stats.store_errors >= 1, "{stats:?}");
    assert_eq!(stats.retries, 0);
}

/// EVALSHA calls Redis has run, from `INFO commandstats`.
async fn evalsha_calls(admin: &mut redis::aio::MultiplexedConnection) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(admin)
        .await
        .unwrap();
    info.lines()
        .find_map(|line| line.strip_prefix("cmdstat_evalsha:calls="))
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

#[tokio::test]
async fn leased_tokens_outlive_a_slot() {
    let server = RedisServer::start();
    let store = common::redis_store(&server).await;
    // Slots of a second; first attempts credit 0.1 each.
    let budget = RetryBudget::new(Arc::new(store))
        .ratio(0.1)
        .min_per_second(0)
        .build("spaced")
        .unwrap();
    for _ in 0..100 {
        budget.deposit();
    }
    // Leases 10 tokens, spends one.
    assert!(budget.withdraw().await);
    // Time is the subject: retries further apart than a slot still find
    // the tokens leased, which live a ttl (10 s).
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(1200)).await;
        assert!(budget.try_withdraw(), "{:?}", budget.stats());
    }
    assert_eq!(budget.stats().retries, 4);
}

#[test]
fn a_lease_dropped_with_its_runtime_does_not_stop_the_budget() {
    let main = tokio::runtime::Runtime::new().unwrap();
    let server = RedisServer::start();
    let budget = main.block_on(async {
        let store = common::redis_store(&server).await;
        RetryBudget::new(Arc::new(store))
            .min_per_second(100)
            .build("dropped")
            .unwrap()
    });
    // A retry on a short-lived runtime: the lease it asks for is a task
    // of that runtime, dropped with it.
    let short = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    short.block_on(async { assert!(!budget.try_withdraw()) });
    drop(short);
    // The budget still leases on the main runtime.
    let allowed = main.block_on(async {
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if budget.try_withdraw() {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        false
    });
    assert!(
        allowed,
        "no retry after the dropped lease: {:?}",
        budget.stats()
    );
}
