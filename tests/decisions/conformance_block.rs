//! The penalty box (`LimitBuilder::block_for`) on every algorithm, with
//! the same exact decisions from both stores (the harness: `harness.rs`),
//! and what only Redis shows: the box's key, its expiry, a reset deleting
//! it, and calls batched behind a busy connection.
use crate::common;
use crate::conformance::{command_stats, reset_stats, server_store, stats, store_commands};
use crate::harness::{S, Sut, UNIX_NOW, allowed, conformance, denied, inspector};

use std::time::Duration;

use common::RedisServer;
use fleetgate::{Algorithm, Decision, Key, Limit, Limiter, Policy, Rate, RedisStore};

const MIN: Duration = Duration::from_secs(60);
const HOUR: Duration = Duration::from_secs(3600);

fn blocking(rate: Rate, block: Duration) -> Limit {
    Limit::builder(rate)
        .block_for(block)
        .build()
        .expect("valid limit")
}

/// The milliseconds `key` has left to live.
async fn pttl(conn: &mut redis::aio::MultiplexedConnection, key: &str) -> i64 {
    redis::cmd("PTTL").arg(key).query_async(conn).await.unwrap()
}

#[track_caller]
fn expect_blocked(s: &Sut, d: &Decision, limit: usize, left: Duration) {
    assert!(d.is_blocked(), "{}: not blocked: {d:?}", s.name);
    s.expect(d, denied(limit, 0, left, left));
}

/// The refusal that starts a block says so; the identity stays refused
/// for the block, though the limit refills, with the retry counting down;
/// at its end the limit decides again. A reset lifts a block.
async fn gcra_block(s: Sut) {
    let policy = Policy::single("gcra-block", blocking(Rate::per_minute(3), HOUR)).unwrap();
    let l = s.limiter(&policy);
    for left in [2, 1, 0] {
        let d = s.check(&l, "k", 1).await;
        assert!(d.is_allowed() && !d.is_blocked());
        assert_eq!(d.remaining(), left);
    }
    let d = s.check(&l, "k", 1).await;
    expect_blocked(&s, &d, 0, HOUR);
    s.advance(30 * MIN);
    let d = s.check(&l, "k", 1).await;
    expect_blocked(&s, &d, 0, 30 * MIN);
    // A peek is refused the same.
    let d = s.peek(&l, "k", 1).await;
    expect_blocked(&s, &d, 0, 30 * MIN);
    s.advance(30 * MIN - Duration::from_micros(1));
    let d = s.check(&l, "k", 1).await;
    expect_blocked(&s, &d, 0, Duration::from_micros(1));
    s.advance(Duration::from_micros(1));
    let d = s.check(&l, "k", 1).await;
    s.expect(&d, allowed(0, 2, 20 * S));
    // Another identity, blocked, then reset.
    for _ in 0..3 {
        assert!(s.check(&l, "other", 1).await.is_allowed());
    }
    assert!(s.check(&l, "other", 1).await.is_blocked());
    l.reset(&Key::new("other")).await.unwrap();
    let d = s.check(&l, "other", 1).await;
    s.expect(&d, allowed(0, 2, 20 * S));
}

/// Only a refusal by a limit with a block starts one, and the block names
/// that limit; a block shorter than the limit's own retry lasts the retry.
async fn gcra_block_by_one_limit(s: Sut) {
    let policy = Policy::builder("two")
        .limit(Limit::new(Rate::per_second(2)).unwrap())
        .limit(blocking(Rate::per_minute(3), 10 * MIN))
        .build()
        .unwrap();
    let l = s.limiter(&policy);
    for _ in 0..2 {
        assert!(s.check(&l, "k", 1).await.is_allowed());
    }
    // Refused by 2/s, which has no block.
    let d = s.check(&l, "k", 1).await;
    assert!(!d.is_blocked());
    s.expect(&d, denied(0, 0, S, S / 2));
    s.advance(S);
    assert!(s.check(&l, "k", 1).await.is_allowed());
    let d = s.check(&l, "k", 1).await;
    expect_blocked(&s, &d, 1, 10 * MIN);
    // Changed to fewer limits: the block holds, naming a limit the policy
    // still has; dropping the block lifts it.
    let fewer = Policy::single("two", blocking(Rate::per_minute(3), 10 * MIN)).unwrap();
    l.set_policy(fewer).unwrap();
    let d = s.check(&l, "k", 1).await;
    expect_blocked(&s, &d, 0, 10 * MIN);
    let unblocked = Policy::single("two", Limit::new(Rate::per_minute(30)).unwrap()).unwrap();
    l.set_policy(unblocked).unwrap();
    assert!(s.check(&l, "k", 1).await.is_allowed());

    let short = Policy::single("short", blocking(Rate::per_hour(1), MIN)).unwrap();
    let l = s.limiter(&short);
    assert!(s.check(&l, "k", 1).await.is_allowed());
    let d = s.check(&l, "k", 1).await;
    expect_blocked(&s, &d, 0, HOUR);
}

/// Cost known after the response: charges never block, a peek's refusal
/// does (how a `count_if` layer admits), and then checks are refused too.
async fn peek_starts_a_block(s: Sut) {
    let policy = Policy::single("logins", blocking(Rate::new(5, 15 * MIN), HOUR)).unwrap();
    let l = s.limiter(&policy);
    for _ in 0..5 {
        assert!(s.peek(&l, "k", 1).await.is_allowed());
        let d = s.charge(&l, "k", 1).await;
        assert!(!d.is_blocked());
    }
    let d = s.peek(&l, "k", 1).await;
    expect_blocked(&s, &d, 0, HOUR);
    s.advance(15 * MIN);
    let d = s.check(&l, "k", 1).await;
    expect_blocked(&s, &d, 0, 45 * MIN);
}

/// Every window algorithm: refused for the block once a window refuses;
/// a policy of several windows reports each window held by the block.
async fn windows_block(s: Sut) {
    for algorithm in [
        Algorithm::SlidingLog,
        Algorithm::SlidingWindow,
        Algorithm::FixedWindow,
    ] {
        let name = format!("w-{algorithm}");
        let policy = Policy::builder(name)
            .algorithm(algorithm)
            .limit(blocking(Rate::per_minute(2), HOUR))
            .limit(Limit::new(Rate::per_hour(100)).unwrap())
            .build()
            .unwrap();
        let l = s.limiter(&policy);
        for _ in 0..2 {
            let d = s.check(&l, "k", 1).await;
            assert!(d.is_allowed(), "{algorithm}: {d:?}");
        }
        let d = s.check(&l, "k", 1).await;
        expect_blocked(&s, &d, 0, HOUR);
        for i in 0..2 {
            assert_eq!(d.remaining_of(i), Some(0), "{algorithm}");
            assert_eq!(d.reset_of(i), Some(HOUR), "{algorithm}");
        }
        s.advance(10 * MIN);
        let d = s.check(&l, "k", 1).await;
        expect_blocked(&s, &d, 0, 50 * MIN);
    }
}

/// A calendar quota: refused until the day's end, when that is later than
/// the block. UNIX_NOW is 80,000 s into a UTC day.
async fn calendar_block(s: Sut) {
    let daily = Limit::calendar_builder(2, fleetgate::Calendar::daily())
        .block_for(HOUR)
        .build()
        .unwrap();
    let l = s.limiter(&Policy::single("daily", daily).unwrap());
    for _ in 0..2 {
        assert!(s.check(&l, "k", 1).await.is_allowed());
    }
    let d = s.check(&l, "k", 1).await;
    expect_blocked(&s, &d, 0, Duration::from_secs(86_400 - 80_000));
}

conformance! {
    prefix "block";
    gcra_block at UNIX_NOW;
    gcra_block_by_one_limit at UNIX_NOW;
    peek_starts_a_block at UNIX_NOW;
    windows_block at UNIX_NOW;
    calendar_block at UNIX_NOW;
}

/// On Redis, with its own clock: the box is one key beside the state,
/// expiring at the block's end; a reset deletes it; calls travelling
/// together in batches are decided in order, the first refusal starting
/// the block that refuses the rest.
#[tokio::test]
async fn redis_box_key_expires_and_batches_decide_in_order() {
    let server = RedisServer::start();
    let store = RedisStore::builder(server.url())
        .prefix("box")
        .connect()
        .await
        .unwrap();
    let policy = Policy::single("login", blocking(Rate::new(5, 15 * MIN), HOUR)).unwrap();
    let limiter = Limiter::new(policy, store.clone());
    let who = Key::new("mallory");
    let calls = (0..50).map(|_| limiter.check(&who, 1));
    let decisions = futures_util::future::join_all(calls).await;
    let decisions: Vec<Decision> = decisions.into_iter().map(Result::unwrap).collect();
    let admitted = decisions.iter().filter(|d| d.is_allowed()).count();
    assert_eq!(admitted, 5, "{decisions:?}");
    assert!(
        decisions
            .iter()
            .all(|d| d.is_allowed() || (d.is_blocked() && d.retry_after().unwrap() > 59 * MIN)),
        "{decisions:?}"
    );
    let mut conn = inspector(&server).await;
    let key = format!("{}:block", store.gcra_key(&limiter.policy(), &who, 0));
    let ttl = pttl(&mut conn, &key).await;
    assert!(ttl > 3_500_000 && ttl <= 3_600_000, "{key}: {ttl} ms");
    limiter.reset(&who).await.unwrap();
    let exists: i64 = redis::cmd("EXISTS")
        .arg(&key)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(exists, 0);
    assert!(limiter.check(&who, 1).await.unwrap().is_allowed());
}

/// One round trip per decision under a penalty box too: a check reads
/// the box with the state, a refusal writes the box instead of the state,
/// and a blocked call reads the box alone.
#[tokio::test]
async fn redis_one_round_trip_per_decision_with_a_penalty_box() {
    let server = RedisServer::start();
    let mut conn = inspector(&server).await;
    let store = server_store(&server, "fg-box-rt").await;
    let policy = Policy::single("rt-box", blocking(Rate::per_hour(3), HOUR)).unwrap();
    let limiter = Limiter::new(policy, store);
    let warm = limiter.check(&Key::new("warm-up"), 1).await.unwrap();
    assert!(warm.is_allowed());
    reset_stats(&mut conn).await;
    let who = Key::new("a");
    for i in 0..6 {
        let d = limiter.check(&who, 1).await.unwrap();
        assert_eq!(d.is_allowed(), i < 3, "{i}: {d:?}");
        assert_eq!(d.is_blocked(), i >= 3, "{i}: {d:?}");
    }
    // 6 scripts; box reads 6, state reads 4 (3 admitted, 1 refused), and
    // 3 state writes and 1 box write.
    let expected = stats(&[
        ("evalsha", 6, 0),
        ("time", 6, 0),
        ("get", 10, 0),
        ("set", 4, 0),
    ]);
    assert_eq!(store_commands(&command_stats(&mut conn).await), expected);
}

/// A box started by a peek (the `count_if` path) on the caller's clock,
/// running ten minutes behind Redis': kept for the whole block, as one
/// started by a check is (the expiry follows the caller's clock too).
#[tokio::test]
async fn redis_box_of_a_peek_on_a_late_client_clock_lasts_the_block() {
    use fleetgate::clock::ManualClock;
    use fleetgate::store::TimeSource;
    use std::sync::Arc;
    use std::time::{SystemTime, UNIX_EPOCH};
    let server = RedisServer::start();
    let late = SystemTime::now().duration_since(UNIX_EPOCH).unwrap() - 10 * MIN;
    let clock = ManualClock::new(late);
    let store = RedisStore::builder(server.url())
        .prefix("late")
        .time_source(TimeSource::Client(Arc::new(clock.clone())))
        .connect()
        .await
        .unwrap();
    let policy = Policy::single("logins", blocking(Rate::new(5, 15 * MIN), HOUR)).unwrap();
    let limiter = Limiter::new(policy, store.clone());
    let who = Key::new("mallory");
    for _ in 0..5 {
        assert!(limiter.peek(&who, 1).await.unwrap().is_allowed());
        limiter.charge(&who, 1).await.unwrap();
    }
    assert!(limiter.peek(&who, 1).await.unwrap().is_blocked());
    let mut conn = inspector(&server).await;
    let key = format!("{}:block", store.gcra_key(&limiter.policy(), &who, 0));
    let ttl = pttl(&mut conn, &key).await;
    assert!(ttl > 3_500_000, "{key}: {ttl} ms, not the hour");
    assert!(limiter.check(&who, 1).await.unwrap().is_blocked());
}
