//! One GCRA conformance suite, run against every store: each scenario
//! runs on a `MemoryStore` and on a `RedisStore` reading the same manual
//! clock, asserts exact decisions, and the two stores' decision sequences
//! must be equal (the harness: `harness.rs`).
//!
//! The tests at the end check what only Redis has, with its own clock and
//! real time: key names, expiry, the script cache, and one round trip per
//! decision.
use crate::common;
use crate::conformance_windows::query;
use crate::harness::{S, Sut, UNIX_NOW, US, allowed, conformance, denied, inspector, reserved};

use std::collections::HashMap;
use std::time::{Duration, Instant};

use common::RedisServer;
use fleetgate::clock::ManualClock;
use fleetgate::{Key, Limit, Limiter, MemoryStore, Policy, Rate, RedisStore};
use redis::aio::MultiplexedConnection;

fn limit(rate: Rate, burst: u64, name: &str) -> Limit {
    Limit::builder(rate)
        .burst(burst)
        .name(name)
        .build()
        .expect("valid limit")
}

fn single(name: &str, rate: Rate, burst: u64) -> Policy {
    Policy::single(name, limit(rate, burst, "l")).expect("valid policy")
}

// ---------------------------------------------------------------------------
// Scenarios.

/// Exactly `burst` calls pass at one instant; the next are denied and cost
/// nothing.
async fn burst(s: Sut) {
    // T = 10 s, burst 5.
    let t = 10 * S;
    let l = s.limiter(&single("burst", Rate::per_minute(6), 5));
    for k in 1..=5u32 {
        let d = s.check(&l, "k", 1).await;
        s.expect(&d, allowed(0, 5 - u64::from(k), k * t));
    }
    for _ in 0..3 {
        let d = s.check(&l, "k", 1).await;
        s.expect(&d, denied(0, 0, 5 * t, t));
    }
    // Half an interval later: still denied, the retry has shrunk.
    s.advance(t / 2);
    let d = s.check(&l, "k", 1).await;
    s.expect(&d, denied(0, 0, 5 * t - t / 2, t / 2));
}

/// After the burst, one call passes per emission interval, exactly on
/// time and not 1 µs early; idle time refills at most the burst.
async fn steady_rate(s: Sut) {
    // 3 per 10 s: T = ceil(10 s / 3) = 3_333_334 µs, τ = 10_000_002 µs.
    let l = s.limiter(&single("steady", Rate::new(3, 10 * S), 3));
    let t = Duration::from_micros(3_333_334);
    assert_eq!(l.policy().limits()[0].emission_interval(), t);
    for k in 1..=3u32 {
        let d = s.check(&l, "k", 1).await;
        s.expect(&d, allowed(0, 3 - u64::from(k), k * t));
    }
    let d = s.check(&l, "k", 1).await;
    s.expect(&d, denied(0, 0, 3 * t, t));
    for _ in 0..5 {
        s.advance(t - US);
        let d = s.check(&l, "k", 1).await;
        s.expect(&d, denied(0, 0, 2 * t + US, US));
        s.advance(US);
        let d = s.check(&l, "k", 1).await;
        s.expect(&d, allowed(0, 0, 3 * t));
        let d = s.check(&l, "k", 1).await;
        s.expect(&d, denied(0, 0, 3 * t, t));
    }
    // Two intervals of idle time: two calls.
    s.advance(2 * t);
    let d = s.check(&l, "k", 1).await;
    s.expect(&d, allowed(0, 1, 2 * t));
    let d = s.check(&l, "k", 1).await;
    s.expect(&d, allowed(0, 0, 3 * t));
    let d = s.check(&l, "k", 1).await;
    s.expect(&d, denied(0, 0, 3 * t, t));
    // A long idle spell refills the burst, not more.
    s.advance(100 * t);
    for k in 1..=3u32 {
        let d = s.check(&l, "k", 1).await;
        s.expect(&d, allowed(0, 3 - u64::from(k), k * t));
    }
    let d = s.check(&l, "k", 1).await;
    s.expect(&d, denied(0, 0, 3 * t, t));
}

/// Two limits decided together, all or nothing, in both orders.
///
/// "short" is 1 per 10 s with burst 3, "long" 1 per minute with burst 4.
/// A call denied by one limit charges neither. Repeated denials are
/// identical, which they could not be if the other limit were charged (its
/// retry would soon exceed the denying limit's and it would be named
/// instead), and the other limit's remaining and reset, read when it
/// becomes the tightest, are those of the admitted calls alone.
async fn multi_limit(s: Sut) {
    let short = limit(Rate::new(1, 10 * S), 3, "short");
    let long = limit(Rate::per_minute(1), 4, "long");
    let ab = Policy::builder("multi-ab")
        .limit(short.clone())
        .limit(long.clone())
        .build()
        .unwrap();
    let ba = Policy::builder("multi-ba")
        .limit(long)
        .limit(short)
        .build()
        .unwrap();
    for (policy, sh, lo) in [(ab, 0, 1), (ba, 1, 0)] {
        let l = s.limiter(&policy);
        // Three calls: short goes from 2 to 0 remaining, long from 3 to 1.
        for k in 1..=3u32 {
            let d = s.check(&l, "k", 1).await;
            s.expect(&d, allowed(sh, 3 - u64::from(k), k * 10 * S));
        }
        // Short denies; long would admit. Nothing is charged.
        for _ in 0..6 {
            let d = s.check(&l, "k", 1).await;
            s.expect(&d, denied(sh, 0, 30 * S, 10 * S));
        }
        // Short has refilled; long is the tightest and shows its state:
        // three calls charged (TAT t0+180 s), so 0 left after this one and
        // a reset of 240 s − 30 s. Had the denials charged it, this call
        // would be denied.
        s.advance(30 * S);
        let d = s.check(&l, "k", 1).await;
        s.expect(&d, allowed(lo, 0, 210 * S));
        // Now long denies (retry 30 s) while short would admit.
        for _ in 0..6 {
            let d = s.check(&l, "k", 1).await;
            s.expect(&d, denied(lo, 0, 210 * S, 30 * S));
        }
        // Both deny a call of cost 3: short asks 10 s, long 150 s. The
        // longest wait is reported, whichever position it holds.
        let d = s.check(&l, "k", 3).await;
        s.expect(&d, denied(lo, 0, 210 * S, 150 * S));
        // Cost 4 is above short's burst: refused without a store call,
        // naming the limit with the smallest burst.
        let d = s.check(&l, "k", 4).await;
        s.expect_never(&d, sh);
        // 30 s later long has exactly one call of room again: none of the
        // denials above charged it.
        s.advance(30 * S);
        let d = s.check(&l, "k", 1).await;
        s.expect(&d, allowed(lo, 0, 240 * S));
        let d = s.check(&l, "k", 1).await;
        s.expect(&d, denied(lo, 0, 240 * S, 60 * S));
    }
}

/// Weighted calls: cost 3 uses 3; a cost above the burst is refused at
/// once, never retried, and touches no state.
async fn cost(s: Sut) {
    // T = 10 s, burst 5.
    let t = 10 * S;
    let l = s.limiter(&single("cost", Rate::new(1, t), 5));
    // Impossible costs on a fresh key, in both modes.
    for c in [6, 7, 1_000, u64::MAX / 2, u64::MAX] {
        let d = s.check(&l, "fresh", c).await;
        s.expect_never(&d, 0);
        let d = s.reserve(&l, "fresh", c, Duration::from_secs(86_400)).await;
        s.expect_never(&d, 0);
    }
    // ...which left it fresh: the full burst is there.
    for k in 1..=5u32 {
        let d = s.check(&l, "fresh", 1).await;
        s.expect(&d, allowed(0, 5 - u64::from(k), k * t));
    }
    let d = s.check(&l, "fresh", 1).await;
    s.expect(&d, denied(0, 0, 5 * t, t));

    let d = s.check(&l, "w", 3).await;
    s.expect(&d, allowed(0, 2, 3 * t));
    // 3 more would need 1 more interval; nothing is charged.
    let d = s.check(&l, "w", 3).await;
    s.expect(&d, denied(0, 2, 3 * t, t));
    let d = s.check(&l, "w", 2).await;
    s.expect(&d, allowed(0, 0, 5 * t));
    let d = s.check(&l, "w", 1).await;
    s.expect(&d, denied(0, 0, 5 * t, t));
    let d = s.check(&l, "w", 5).await;
    s.expect(&d, denied(0, 0, 5 * t, 5 * t));
    s.advance(3 * t);
    let d = s.check(&l, "w", 3).await;
    s.expect(&d, allowed(0, 0, 5 * t));
    // A full-burst call after a full refill.
    s.advance(5 * t);
    let d = s.check(&l, "w", 5).await;
    s.expect(&d, allowed(0, 0, 5 * t));
}

/// Reserve mode: waits handed out in order 0, T, 2T, ...; a wait beyond
/// `max_wait` is refused and charges nothing.
async fn reserve(s: Sut) {
    let t = 10 * S;
    let l = s.limiter(&single("reserve", Rate::new(1, t), 1));
    let max_wait = 35 * S;
    for k in 0..4u32 {
        let d = s.reserve(&l, "k", 1, max_wait).await;
        s.expect(&d, reserved(0, 0, (k + 1) * t, k * t));
    }
    // The next slot is 40 s away: refused, with that retry, for both modes.
    for _ in 0..3 {
        let d = s.reserve(&l, "k", 1, max_wait).await;
        s.expect(&d, denied(0, 0, 4 * t, 4 * t));
        let d = s.check(&l, "k", 1).await;
        s.expect(&d, denied(0, 0, 4 * t, 4 * t));
    }
    // The refusals took nothing: a longer wait gets exactly the next slot.
    let d = s.reserve(&l, "k", 1, 4 * t).await;
    s.expect(&d, reserved(0, 0, 5 * t, 4 * t));
    // Waiting exactly max_wait is admitted, 1 µs more is not.
    s.advance(t + US);
    let d = s.reserve(&l, "k", 1, max_wait).await;
    s.expect(&d, denied(0, 0, 4 * t - US, 4 * t - US));
    s.advance(5 * S - US);
    let d = s.reserve(&l, "k", 1, max_wait).await;
    s.expect(&d, reserved(0, 0, 45 * S, max_wait));

    // Several limits: the wait is the longest of them. Among limits with
    // no room left, the first is named (here "fast", while "slow" sets the
    // wait).
    let two = Policy::builder("reserve-two")
        .limit(limit(Rate::new(1, 4 * S), 2, "fast"))
        .limit(limit(Rate::new(1, t), 1, "slow"))
        .build()
        .unwrap();
    let l = s.limiter(&two);
    let d = s.reserve(&l, "k", 1, max_wait).await;
    s.expect(&d, reserved(1, 0, t, Duration::ZERO));
    let d = s.reserve(&l, "k", 1, max_wait).await;
    s.expect(&d, reserved(0, 0, 8 * S, t));
    let d = s.reserve(&l, "k", 1, max_wait).await;
    s.expect(&d, reserved(0, 0, 12 * S, 2 * t));
    // The 5th slot of "slow" is 40 s away: refused, nothing charged.
    let d = s.reserve(&l, "k", 1, max_wait).await;
    s.expect(&d, reserved(0, 0, 16 * S, 3 * t));
    let d = s.reserve(&l, "k", 1, max_wait).await;
    s.expect(&d, denied(1, 0, 4 * t, 4 * t));
    let d = s.reserve(&l, "k", 1, 4 * t).await;
    s.expect(&d, reserved(0, 0, 20 * S, 4 * t));
}

/// After `burst × T` of idle time a key behaves exactly like a fresh one;
/// 1 µs earlier it does not.
async fn expiry(s: Sut) {
    // T = 10 s, burst 4: window 40 s.
    let t = 10 * S;
    let l = s.limiter(&single("expiry", Rate::new(1, t), 4));
    assert_eq!(l.policy().limits()[0].window(), 4 * t);
    for key in ["early", "on-time"] {
        for _ in 0..4 {
            assert!(s.check(&l, key, 1).await.is_allowed());
        }
        let d = s.check(&l, key, 1).await;
        s.expect(&d, denied(0, 0, 4 * t, t));
    }
    s.advance(4 * t - US);
    // Not yet fresh: one call less than a full burst.
    let d = s.check(&l, "early", 1).await;
    s.expect(&d, allowed(0, 2, t + US));
    s.advance(US);
    let mut seqs = Vec::new();
    for key in ["on-time", "never-used"] {
        let mut seq = Vec::new();
        for _ in 0..5 {
            seq.push(s.check(&l, key, 1).await);
        }
        s.expect(&seq[0], allowed(0, 3, t));
        s.expect(&seq[3], allowed(0, 0, 4 * t));
        s.expect(&seq[4], denied(0, 0, 4 * t, t));
        seqs.push(seq);
    }
    assert_eq!(
        seqs[0], seqs[1],
        "{}: expired key differs from a fresh one",
        s.name
    );
}

/// A clock that starts at zero (`allow_at` lies before its epoch).
async fn young_clock(s: Sut) {
    let t = 10 * S;
    let l = s.limiter(&single("young", Rate::new(1, t), 3));
    for k in 1..=3u32 {
        let d = s.check(&l, "k", 1).await;
        s.expect(&d, allowed(0, 3 - u64::from(k), k * t));
    }
    let d = s.check(&l, "k", 1).await;
    s.expect(&d, denied(0, 0, 3 * t, t));
    s.advance(5 * S);
    let d = s.check(&l, "k", 1).await;
    s.expect(&d, denied(0, 0, 3 * t - 5 * S, 5 * S));
    s.advance(5 * S);
    let d = s.check(&l, "k", 1).await;
    s.expect(&d, allowed(0, 0, 3 * t));
}

/// Ties between limits go to the first: equal room when admitted, equal
/// retry when denied.
async fn ties(s: Sut) {
    let t = 10 * S;
    let twins = Policy::builder("ties")
        .limit(limit(Rate::new(1, t), 2, "a"))
        .limit(limit(Rate::new(1, t), 2, "b"))
        .build()
        .unwrap();
    let l = s.limiter(&twins);
    let d = s.check(&l, "k", 1).await;
    s.expect(&d, allowed(0, 1, t));
    let d = s.check(&l, "k", 1).await;
    s.expect(&d, allowed(0, 0, 2 * t));
    let d = s.check(&l, "k", 1).await;
    s.expect(&d, denied(0, 0, 2 * t, t));
    let d = s.reserve(&l, "k", 1, t).await;
    s.expect(&d, reserved(0, 0, 3 * t, t));
    let d = s.reserve(&l, "k", 1, t).await;
    s.expect(&d, denied(0, 0, 3 * t, 2 * t));
}

/// Keys and policies do not share state.
async fn isolation(s: Sut) {
    let t = 10 * S;
    let p1 = s.limiter(&single("iso-1", Rate::new(1, t), 2));
    let p2 = s.limiter(&single("iso-2", Rate::new(1, t), 2));
    for _ in 0..2 {
        assert!(s.check(&p1, "a", 1).await.is_allowed());
    }
    let d = s.check(&p1, "a", 1).await;
    s.expect(&d, denied(0, 0, 2 * t, t));
    let d = s.check(&p1, "b", 1).await;
    s.expect(&d, allowed(0, 1, t));
    let d = s.check(&p2, "a", 1).await;
    s.expect(&d, allowed(0, 1, t));
}

/// Two limiters with the same policy name but different limits, on one
/// store (a policy edited under the same name, or two limiters that clash
/// by mistake): state is kept per limit position, as the Redis keys are,
/// so alternating between them cannot reset the count.
async fn same_name_other_shape(s: Sut) {
    let t = 10 * S;
    let first = limit(Rate::new(1, t), 2, "first");
    let one = s.limiter(&Policy::single("shape", first.clone()).unwrap());
    let two = s.limiter(
        &Policy::builder("shape")
            .limit(first)
            .limit(limit(Rate::per_minute(1), 10, "second"))
            .build()
            .unwrap(),
    );
    let d = s.check(&one, "k", 1).await;
    s.expect(&d, allowed(0, 1, t));
    let d = s.check(&two, "k", 1).await;
    s.expect(&d, allowed(0, 0, 2 * t));
    for _ in 0..3 {
        let d = s.check(&one, "k", 1).await;
        s.expect(&d, denied(0, 0, 2 * t, t));
        let d = s.check(&two, "k", 1).await;
        s.expect(&d, denied(0, 0, 2 * t, t));
    }
}

conformance! {
    prefix format!("conf-{}", std::process::id());
    burst at UNIX_NOW;
    steady_rate at UNIX_NOW;
    multi_limit at UNIX_NOW;
    cost at UNIX_NOW;
    reserve at UNIX_NOW;
    expiry at UNIX_NOW;
    young_clock at Duration::ZERO;
    ties at UNIX_NOW;
    isolation at UNIX_NOW;
    same_name_other_shape at UNIX_NOW;
}

/// With the caller's clock, keys still expire on Redis' clock: a caller's
/// clock that falls behind Redis' real time (a test's manual clock on a
/// slow machine, an instance whose clock lags another's) must not find its
/// state expired while it still matters. Here the manual clock stands still
/// while real time runs far past the key's state (20 ms): the state is
/// still there and the next call is denied, as the memory store would.
#[tokio::test]
async fn state_outlives_a_client_clock_that_falls_behind() {
    let server = RedisServer::start();
    let s = Sut::redis(&server, "behind", UNIX_NOW).await;
    // T = 10 ms, burst 2: the state matters for 20 ms after two calls.
    let l = s.limiter(&single(
        "behind",
        Rate::new(2, Duration::from_millis(20)),
        2,
    ));
    let t = Duration::from_millis(10);
    let d = s.check(&l, "k", 1).await;
    s.expect(&d, allowed(0, 1, t));
    let d = s.check(&l, "k", 1).await;
    s.expect(&d, allowed(0, 0, 2 * t));
    let written = Instant::now();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(written.elapsed() >= 10 * 2 * t);
    s.advance(US);
    let d = s.check(&l, "k", 1).await;
    s.expect(&d, denied(0, 0, 2 * t - US, t - US));
}

/// The memory store forgets expired state: it holds nothing once every
/// window has passed.
#[tokio::test]
async fn memory_store_sweeps_expired_state() {
    let clock = ManualClock::new(UNIX_NOW);
    let store = MemoryStore::builder().clock(clock.clone()).build();
    let l = Limiter::new(single("sweep", Rate::new(1, 10 * S), 4), store.clone());
    for i in 0..100 {
        assert!(
            l.check(&Key::new(format!("k{i}")), 1)
                .await
                .unwrap()
                .is_allowed()
        );
    }
    assert!(!l.check(&Key::new("k0"), 4).await.unwrap().is_allowed());
    assert_eq!(store.len(), 100);
    clock.advance(10 * S - US);
    store.sweep();
    assert_eq!(store.len(), 100, "swept state that still matters");
    clock.advance(US);
    store.sweep();
    assert!(store.is_empty(), "{} entries left", store.len());
}

// ---------------------------------------------------------------------------
// Redis only, with the server's clock and real time.

pub(crate) async fn server_store(server: &RedisServer, prefix: &str) -> RedisStore {
    RedisStore::builder(server.url())
        .prefix(prefix)
        .timeout(Duration::from_secs(2))
        // These tests count what reaches Redis: every decision must.
        .deny_cache(0)
        .connect()
        .await
        .expect("connect")
}

async fn keys(conn: &mut MultiplexedConnection, pattern: &str) -> Vec<String> {
    let mut keys: Vec<String> = redis::cmd("KEYS")
        .arg(pattern)
        .query_async(conn)
        .await
        .unwrap();
    keys.sort();
    keys
}

async fn pttl(conn: &mut MultiplexedConnection, key: &str) -> i64 {
    redis::cmd("PTTL").arg(key).query_async(conn).await.unwrap()
}

async fn get(conn: &mut MultiplexedConnection, key: &str) -> Option<String> {
    redis::cmd("GET").arg(key).query_async(conn).await.unwrap()
}

/// Keys are `prefix:policy:{tag}` (then `:limit` past the first), the tag
/// being the identity hashed; they live as long as the state matters (`new
/// TAT − now`, at most burst × T, rounded up to the whole second), and a
/// denied call writes nothing.
#[tokio::test]
async fn redis_keys_are_named_and_carry_a_ttl() {
    let server = RedisServer::start();
    let mut conn = inspector(&server).await;
    let store = server_store(&server, "fg-keys").await;
    // T = 10 s, burst 3: window 30 s.
    let l = Limiter::new(single("ttl", Rate::new(1, 10 * S), 3), store.clone());
    let who = Key::new("user:1");
    assert!(l.check(&who, 1).await.unwrap().is_allowed());
    // The identity hashed into 12 characters, never itself.
    let key = store.gcra_key(&l.policy(), &who, 0);
    let tag = key
        .strip_prefix("fg-keys:ttl:{")
        .and_then(|k| k.strip_suffix('}'));
    assert_eq!(tag.map(str::len), Some(12), "{key}");
    let key = key.as_str();
    assert_eq!(keys(&mut conn, "*").await, [key]);
    // Until the TAT, rounded up to the whole second (lua/gcra.lua).
    let ttl = pttl(&mut conn, key).await;
    assert!(
        (8_000..=11_000).contains(&ttl),
        "PTTL after one call: {ttl}"
    );

    assert!(l.check(&who, 1).await.unwrap().is_allowed());
    assert!(l.check(&who, 1).await.unwrap().is_allowed());
    let ttl = pttl(&mut conn, key).await;
    assert!(
        (27_000..=31_000).contains(&ttl),
        "PTTL after a full burst should be close to burst × T = 30 s: {ttl}"
    );
    let tat = get(&mut conn, key).await.expect("state stored");
    assert!(tat.bytes().all(|b| b.is_ascii_digit()), "TAT {tat:?}");
    assert!(!l.check(&who, 1).await.unwrap().is_allowed());
    assert_eq!(
        get(&mut conn, key).await.as_deref(),
        Some(&*tat),
        "denied call wrote"
    );

    // Several limits: one key per limit, one hash tag per identity.
    let two = Policy::builder("two")
        .limit(limit(Rate::new(1, 10 * S), 3, "a"))
        .limit(limit(Rate::per_minute(1), 5, "b"))
        .build()
        .unwrap();
    let l = Limiter::new(two, store.clone());
    assert!(l.check(&Key::new("u2"), 2).await.unwrap().is_allowed());
    let names = keys(&mut conn, "fg-keys:two:*").await;
    let first = store.gcra_key(&l.policy(), &Key::new("u2"), 0);
    assert_eq!(names, [first.clone(), format!("{first}:1")]);
    let ttl = pttl(&mut conn, &names[0]).await;
    assert!((18_000..=21_000).contains(&ttl), "limit a: {ttl}");
    let ttl = pttl(&mut conn, &names[1]).await;
    assert!((117_000..=121_000).contains(&ttl), "limit b: {ttl}");
}

/// With the server's clock a key expires at the whole second after its
/// TAT, and a write whose TAT stays in the same second keeps the key's
/// expiry instead of setting one (lua/gcra.lua): an expiry moved by hand
/// survives such a write, and is set anew by one that moves the second.
#[tokio::test]
async fn redis_keys_keep_their_expiry_within_a_second() {
    let server = RedisServer::start();
    let mut conn = inspector(&server).await;
    let store = server_store(&server, "fg-keep").await;
    // T = 1 ms: a call moves the TAT by a millisecond.
    let l = Limiter::new(single("keep", Rate::per_second(1000), 1000), store.clone());
    let who = Key::new("k");
    let key = store.gcra_key(&l.policy(), &who, 0);
    let until_ms = |tat: u64| (tat / 1_000_000 + 1) * 1000;
    assert!(l.check(&who, 1).await.unwrap().is_allowed());
    let mut tat: u64 = get(&mut conn, &key).await.unwrap().parse().unwrap();
    let at: u64 = query(&mut conn, &["PEXPIRETIME", &key]).await;
    assert_eq!(at, until_ms(tat), "the first write: TAT {tat}");
    let (mut kept, mut moved) = (0, 0);
    for _ in 0..200 {
        // A later expiry than the rule's, set by hand.
        let by_hand = until_ms(tat) + 5000;
        let _: i64 = query(&mut conn, &["PEXPIREAT", &key, &by_hand.to_string()]).await;
        assert!(l.check(&who, 1).await.unwrap().is_allowed());
        let next: u64 = get(&mut conn, &key).await.unwrap().parse().unwrap();
        let at: u64 = query(&mut conn, &["PEXPIRETIME", &key]).await;
        if until_ms(next) == until_ms(tat) {
            assert_eq!(at, by_hand, "kept: TAT {tat} then {next}");
            kept += 1;
        } else {
            assert_eq!(at, until_ms(next), "moved: TAT {tat} then {next}");
            moved += 1;
        }
        tat = next;
    }
    assert!(kept > 0, "no write kept its expiry ({moved} moved)");
}

/// A short window's key is gone from Redis once the window has passed, and
/// the identity is then fresh.
#[tokio::test]
async fn redis_keys_expire_after_their_window() {
    let server = RedisServer::start();
    let mut conn = inspector(&server).await;
    let store = server_store(&server, "fg-exp").await;
    // 2 per 200 ms, burst 2: T = 100 ms, window 200 ms.
    let l = Limiter::new(
        single("short", Rate::new(2, Duration::from_millis(200)), 2),
        store.clone(),
    );
    let who = Key::new("k");
    assert!(l.check(&who, 1).await.unwrap().is_allowed());
    assert!(l.check(&who, 1).await.unwrap().is_allowed());
    let key = store.gcra_key(&l.policy(), &who, 0);
    let key = key.as_str();
    let ttl = pttl(&mut conn, key).await;
    assert!((1..=1_200).contains(&ttl), "PTTL {ttl}");
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut exists = 1;
    while Instant::now() < deadline {
        exists = redis::cmd("EXISTS")
            .arg(key)
            .query_async(&mut conn)
            .await
            .unwrap();
        if exists == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(exists, 0, "key still in Redis 5 s after a 200 ms window");
    let d = l.check(&who, 1).await.unwrap();
    assert!(d.is_allowed());
    assert_eq!(
        d.remaining(),
        1,
        "an expired identity starts with a full burst"
    );
}

/// `INFO commandstats` as command name → (calls, failed calls).
pub(crate) async fn command_stats(conn: &mut MultiplexedConnection) -> HashMap<String, (u64, u64)> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .unwrap();
    let mut stats = HashMap::new();
    for line in info.lines() {
        let Some((name, fields)) = line
            .strip_prefix("cmdstat_")
            .and_then(|l| l.split_once(':'))
        else {
            continue;
        };
        let field = |key: &str| {
            fields
                .split(',')
                .find_map(|f| f.strip_prefix(key)?.strip_prefix('='))
                .map_or(0, |v| v.parse::<u64>().unwrap())
        };
        stats.insert(name.to_owned(), (field("calls"), field("failed_calls")));
    }
    stats
}

pub(crate) async fn reset_stats(conn: &mut MultiplexedConnection) {
    let () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(conn)
        .await
        .unwrap();
}

/// Commands the store caused: everything but the inspector's own. Redis
/// counts the commands a script runs too (`time`, `get`, `set`).
pub(crate) fn store_commands(stats: &HashMap<String, (u64, u64)>) -> HashMap<String, (u64, u64)> {
    stats
        .iter()
        .filter(|(name, _)| {
            !["info", "config", "script"]
                .iter()
                .any(|own| name.split('|').next() == Some(own))
        })
        .map(|(name, v)| (name.clone(), *v))
        .collect()
}

pub(crate) fn stats(entries: &[(&str, u64, u64)]) -> HashMap<String, (u64, u64)> {
    entries
        .iter()
        .map(|&(name, calls, failed)| (name.to_owned(), (calls, failed)))
        .collect()
}

/// One round trip per decision: N decisions are N `EVALSHA` calls and no
/// other command from the client, several limits and reserve mode
/// included, and impossible costs cost none. Inside the script: one `TIME`,
/// one `GET` per limit, one `SET` per limit of an admitted call and none for
/// a denied one. After `SCRIPT FLUSH` the next decision still works,
/// through one extra `EVAL`.
#[tokio::test]
async fn redis_one_round_trip_per_decision_and_noscript_fallback() {
    let server = RedisServer::start();
    let mut conn = inspector(&server).await;
    let store = server_store(&server, "fg-rt").await;
    let single = Limiter::new(single("rt", Rate::per_hour(5), 5), store.clone());
    let two = Limiter::new(
        Policy::builder("rt2")
            .limit(limit(Rate::per_hour(3), 3, "a"))
            .limit(limit(Rate::per_hour(10), 10, "b"))
            .build()
            .unwrap(),
        store.clone(),
    );
    // The first decision on a fresh server loads the script.
    assert!(
        single
            .check(&Key::new("warm-up"), 1)
            .await
            .unwrap()
            .is_allowed()
    );

    reset_stats(&mut conn).await;
    let (mut decisions, mut gets, mut sets) = (0u64, 0u64, 0u64);
    for i in 0..8 {
        // 5 allowed then 3 denied.
        let d = single.check(&Key::new("a"), 1).await.unwrap();
        assert_eq!(d.is_allowed(), i < 5);
        decisions += 1;
        gets += 1;
        sets += u64::from(d.is_allowed());
        let d = two.check(&Key::new("a"), 1).await.unwrap();
        assert_eq!(d.is_allowed(), i < 3);
        decisions += 1;
        gets += 2;
        sets += 2 * u64::from(d.is_allowed());
        let d = two
            .reserve(&Key::new("r"), 1, Duration::from_secs(36_000))
            .await
            .unwrap();
        assert!(d.is_allowed());
        decisions += 1;
        gets += 2;
        sets += 2;
        // Above the smallest burst: decided without Redis.
        assert_eq!(
            two.check(&Key::new("a"), 4).await.unwrap().retry_after(),
            None
        );
    }
    let expected = stats(&[
        ("evalsha", decisions, 0),
        ("time", decisions, 0),
        ("get", gets, 0),
        ("set", sets, 0),
    ]);
    assert_eq!(
        store_commands(&command_stats(&mut conn).await),
        expected,
        "commands for {decisions} decisions"
    );

    let () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut conn)
        .await
        .unwrap();
    reset_stats(&mut conn).await;
    let d = single.check(&Key::new("b"), 1).await.unwrap();
    assert!(d.is_allowed(), "first decision after SCRIPT FLUSH");
    assert_eq!(d.remaining(), 4);
    for k in (0..4).rev() {
        let d = single.check(&Key::new("b"), 1).await.unwrap();
        assert!(d.is_allowed());
        assert_eq!(d.remaining(), k);
    }
    assert!(!single.check(&Key::new("b"), 1).await.unwrap().is_allowed());
    // Six decisions: seven EVALSHA, the first refused with NOSCRIPT, then
    // one SCRIPT LOAD and the first one again; five admitted calls wrote.
    let expected = stats(&[
        ("evalsha", 7, 1),
        ("time", 6, 0),
        ("get", 6, 0),
        ("set", 5, 0),
    ]);
    let commands = command_stats(&mut conn).await;
    assert_eq!(
        store_commands(&commands),
        expected,
        "commands after SCRIPT FLUSH"
    );
    assert_eq!(commands.get("script|load"), Some(&(1, 0)), "{commands:?}");
}
