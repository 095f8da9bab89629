//! The memory store keeps memory bounded under a key-cardinality attack
//! (at most `max_keys` entries, expired state given back after a flood),
//! follows tokio's paused clock, and finds a key's state by its text.
use std::time::Duration;

use fleetgate::clock::{ManualClock, MonotonicClock};
use fleetgate::concurrency::{Admission, ConcurrencyLimiter, ConcurrencyPolicy};
use fleetgate::{Algorithm, Key, Limit, Limiter, MemoryStore, Policy, Rate};

/// These tests drive time with `tokio::time::pause`: the store reads
/// tokio's clock.
fn paused_store() -> MemoryStore {
    MemoryStore::builder().clock(MonotonicClock::new()).build()
}

fn limiter(store: &MemoryStore) -> Limiter {
    let limit = Limit::builder(Rate::per_second(10))
        .burst(10)
        .build()
        .unwrap();
    Limiter::new(Policy::single("attack", limit).unwrap(), store.clone())
}

#[tokio::test(start_paused = true)]
async fn memory_stays_bounded_under_many_distinct_keys() {
    let store = MemoryStore::builder()
        .shards(8)
        .clock(MonotonicClock::new())
        .build();
    let limiter = limiter(&store);
    let per_round = 10_000;
    let mut peak = 0;
    // 400k distinct keys, 10k per second of (paused) time; each key's state
    // matters for one second only.
    for round in 0..40 {
        for i in 0..per_round {
            let key = Key::new(format!("ip:10.{round}.{}.{}", i / 256, i % 256));
            assert!(limiter.check(&key, 1).await.unwrap().is_allowed());
        }
        peak = peak.max(store.len());
        tokio::time::advance(Duration::from_millis(1500)).await;
    }
    // Live state is at most one round; the sweeps that calls drive (and a
    // full shard's own) keep the rest within a small factor of it.
    assert!(peak <= 4 * per_round, "store grew to {peak} entries");
    store.sweep();
    assert_eq!(store.len(), 0, "every entry had expired");
}

#[tokio::test(start_paused = true)]
async fn paused_clock_drives_refill() {
    let store = paused_store();
    let limiter = limiter(&store);
    let key = Key::new("user:1");
    for _ in 0..10 {
        assert!(limiter.check(&key, 1).await.unwrap().is_allowed());
    }
    let denied = limiter.check(&key, 1).await.unwrap();
    assert!(!denied.is_allowed());
    assert_eq!(denied.retry_after(), Some(Duration::from_millis(100)));
    tokio::time::advance(Duration::from_millis(99)).await;
    assert!(!limiter.check(&key, 1).await.unwrap().is_allowed());
    tokio::time::advance(Duration::from_millis(1)).await;
    assert!(limiter.check(&key, 1).await.unwrap().is_allowed());
    // Denied calls cost nothing: still exactly one per 100 ms.
    assert!(!limiter.check(&key, 1).await.unwrap().is_allowed());
    tokio::time::advance(Duration::from_millis(100)).await;
    assert!(limiter.check(&key, 1).await.unwrap().is_allowed());
}

#[tokio::test(start_paused = true)]
async fn clones_share_state_and_policies_are_namespaced() {
    let store = paused_store();
    let a = limiter(&store);
    let b = limiter(&store.clone());
    let key = Key::new("k");
    for _ in 0..5 {
        assert!(a.check(&key, 1).await.unwrap().is_allowed());
        assert!(b.check(&key, 1).await.unwrap().is_allowed());
    }
    assert!(!a.check(&key, 1).await.unwrap().is_allowed());
    // Another policy name is another namespace.
    let other = Limiter::new(
        Policy::single("other", Limit::new(Rate::per_second(1)).unwrap()).unwrap(),
        store,
    );
    assert!(other.check(&key, 1).await.unwrap().is_allowed());
}

#[tokio::test(start_paused = true)]
async fn a_sweep_keeps_live_state() {
    let store = paused_store();
    // One per hour, burst 2: a key that has spent its burst stays live
    // (not yet refilled) for two hours.
    let slow = Limit::builder(Rate::per_hour(1)).burst(2).build().unwrap();
    let limiter = Limiter::new(Policy::single("slow", slow).unwrap(), store.clone());
    let key = Key::new("busy");
    assert!(limiter.check(&key, 1).await.unwrap().is_allowed());
    assert!(limiter.check(&key, 1).await.unwrap().is_allowed());
    assert!(!limiter.check(&key, 1).await.unwrap().is_allowed());

    // An hour later the entry is half refilled: a sweep must keep it, or
    // the key would get a fresh burst of 2.
    tokio::time::advance(Duration::from_secs(3600)).await;
    store.sweep();
    assert_eq!(store.len(), 1, "live state was swept");
    assert!(limiter.check(&key, 1).await.unwrap().is_allowed());
    assert!(!limiter.check(&key, 1).await.unwrap().is_allowed());

    // Two idle hours after that it has fully refilled, and goes.
    tokio::time::advance(Duration::from_secs(2 * 3600)).await;
    store.sweep();
    assert_eq!(store.len(), 0);
}

#[tokio::test(start_paused = true)]
async fn two_policies_on_one_key_are_two_entries() {
    let store = paused_store();
    let one = limiter(&store);
    let two = Limiter::new(
        Policy::single("second", Limit::new(Rate::per_second(1)).unwrap()).unwrap(),
        store.clone(),
    );
    let key = Key::new("shared");
    assert!(one.check(&key, 1).await.unwrap().is_allowed());
    assert!(two.check(&key, 1).await.unwrap().is_allowed());
    assert_eq!(store.len(), 2);
    // Each keeps its own state: the second policy is spent, the first not.
    assert!(!two.check(&key, 1).await.unwrap().is_allowed());
    assert!(one.check(&key, 1).await.unwrap().is_allowed());
    assert_eq!(store.len(), 2);
}

/// A key's state is found by the key, whichever `Key` value carries it:
/// keys built separately (IPv4 and IPv6 keys made from the address or from
/// its text, and long ones, each with its own allocation) share one state,
/// and another key does not, even one hashed alike.
#[tokio::test(start_paused = true)]
async fn equal_keys_built_apart_share_one_state() {
    let store = paused_store();
    let one = Limit::builder(Rate::per_hour(1)).build().unwrap();
    let limiter = Limiter::new(Policy::single("once", one).unwrap(), store);
    let long = "tenant:a-rather-long-identity-kept-on-the-heap";
    let cases = [
        (
            Key::from_ip("192.0.2.7".parse().unwrap()),
            Key::new("ip:192.0.2.7"),
            Key::new("ip:192.0.2.8"),
        ),
        (
            Key::from_ip("2001:db8::7".parse().unwrap()),
            Key::new("ip:2001:db8::7"),
            Key::new("ip:2001:db8::8"),
        ),
        // An IP key and a text of the same bytes hash alike in the store;
        // they are still two identities.
        (
            Key::from_ip("97.98.99.100".parse().unwrap()),
            Key::new("ip:97.98.99.100"),
            Key::new("abcd"),
        ),
        (
            Key::new(long),
            Key::new(String::from(long)),
            Key::new(format!("{long}!")),
        ),
    ];
    for (first, same, other) in cases {
        assert!(limiter.check(&first, 1).await.unwrap().is_allowed());
        assert!(
            !limiter.check(&same, 1).await.unwrap().is_allowed(),
            "{} was not found by an equal key built apart",
            first
        );
        assert!(limiter.check(&other, 1).await.unwrap().is_allowed());
    }
}

// ---------------------------------------------------------------------------
// The bound: `max_keys`, eviction, and reclaiming expired state.

/// A one-limit policy of `algorithm`: `count` per `period`, burst `count`.
fn policy_of(name: &str, algorithm: Algorithm, count: u64, period: Duration) -> Policy {
    Policy::builder(name)
        .algorithm(algorithm)
        .limit(Limit::new(Rate::new(count, period)).unwrap())
        .build()
        .unwrap()
}

const ALL: [Algorithm; 4] = [
    Algorithm::Gcra,
    Algorithm::SlidingLog,
    Algorithm::FixedWindow,
    Algorithm::SlidingWindow,
];

fn bounded_store(max_keys: usize) -> MemoryStore {
    MemoryStore::builder()
        .shards(8)
        .max_keys(max_keys)
        .unwrap()
        .clock(MonotonicClock::new())
        .build()
}

/// The bound is refused past 100,000,000 (it once allocated a shard per
/// 4096 keys of any value up front: 1 GB idle at 10^10, an abort at
/// `usize::MAX`), with an error that names both figures; the largest it
/// takes builds a working store.
#[tokio::test]
async fn the_bound_has_a_maximum_and_the_maximum_works() {
    for too_many in [100_000_001, 1 << 40, usize::MAX] {
        let err = MemoryStore::builder().max_keys(too_many).unwrap_err();
        let text = err.to_string();
        assert!(text.contains(&too_many.to_string()), "{text}");
        assert!(text.contains("100000000"), "{text}");
    }
    let store = MemoryStore::builder()
        .max_keys(100_000_000)
        .unwrap()
        .build();
    let limiter = Limiter::new(
        policy_of("big", Algorithm::Gcra, 1, Duration::from_secs(60)),
        store,
    );
    let k = Key::new("k");
    assert!(limiter.check(&k, 1).await.unwrap().is_allowed());
    assert!(!limiter.check(&k, 1).await.unwrap().is_allowed());
}

/// Twenty times the bound in distinct identities, each with state that
/// matters for an hour: the store never holds more than the bound, and
/// every entry it had to let go is counted as an eviction.
#[tokio::test(start_paused = true)]
async fn the_bound_holds_under_a_flood_of_distinct_keys() {
    for algorithm in ALL {
        let store = bounded_store(1000);
        let limiter = Limiter::new(
            policy_of("flood", algorithm, 5, Duration::from_secs(3600)),
            store.clone(),
        );
        for i in 0..20_000 {
            let key = Key::new(format!("attacker:{i}"));
            let decision = limiter.check(&key, 1).await.unwrap();
            assert!(decision.is_allowed(), "{algorithm}: a fresh key was denied");
            assert!(
                store.len() <= 1000,
                "{algorithm}: {} entries after {} keys",
                store.len(),
                i + 1
            );
            tokio::time::advance(Duration::from_micros(10)).await;
        }
        // A full shard keeps seven eighths of its part at least.
        assert!(store.len() >= 800, "{algorithm}: only {} kept", store.len());
        assert_eq!(
            store.stats().evictions,
            20_000 - store.len() as u64,
            "{algorithm}: every live entry let go is an eviction"
        );
    }
}

/// Leases are never evicted while held: past the bound, a new identity's
/// acquire is refused (and counted), the identities holding leases keep
/// their limits, and once the held leases expire new identities get in.
#[test]
fn held_leases_stay_within_the_bound_and_are_never_evicted() {
    let clock = ManualClock::new(Duration::from_secs(1_000));
    let store = MemoryStore::builder()
        .shards(8)
        .max_keys(1000)
        .unwrap()
        .clock(clock.clone())
        .build();
    let policy = ConcurrencyPolicy::builder("slow", 1)
        .lease_ttl(Duration::from_secs(30))
        .no_renewal()
        .build()
        .unwrap();
    let limiter = ConcurrencyLimiter::new(policy, store.clone());
    let acquire = |key: &Key| match limiter.acquire(key).take_ready() {
        Some(Ok(Admission::Acquired(guard))) => Some(guard),
        Some(Ok(Admission::Refused(_))) => None,
        other => panic!("{other:?}"),
    };
    let mut held = Vec::new();
    for i in 0..20_000 {
        if let Some(guard) = acquire(&Key::new(format!("k{i}"))) {
            held.push((i, guard));
        }
        assert!(
            store.lease_count() <= 1000,
            "{} leases",
            store.lease_count()
        );
        clock.advance(Duration::from_micros(10));
    }
    assert_eq!(held.len(), 1000, "every part of the bound is used");
    assert_eq!(store.lease_count(), 1000);
    assert_eq!(store.stats().lease_refusals, 19_000);
    assert_eq!(store.stats().evictions, 0);
    // Each holder is still at its limit of one: nothing was evicted.
    for (i, _) in held.iter().take(100) {
        assert!(acquire(&Key::new(format!("k{i}"))).is_none());
    }
    // Released leases make room at once.
    let released: Vec<usize> = held.drain(..500).map(|(i, _)| i).collect();
    assert_eq!(store.lease_count(), 500);
    assert!(
        acquire(&Key::new(format!("k{}", released[0]))).is_some_and(|g| {
            drop(g);
            true
        })
    );
    // Leases whose holders vanished expire, and their room is reused.
    for (_, guard) in held.drain(..) {
        std::mem::forget(guard);
    }
    clock.advance(Duration::from_secs(30));
    let mut fresh = Vec::new();
    for i in 0..5000 {
        if let Some(guard) = acquire(&Key::new(format!("new{i}"))) {
            fresh.push(guard);
        }
    }
    assert_eq!(fresh.len(), 1000);
    assert_eq!(store.lease_count(), 1000);
}

/// After a flood ends, its state goes within about a second of expiring,
/// with no new identity arriving: the calls of one identity that keeps
/// calling sweep the store, a few shards per call.
#[tokio::test(start_paused = true)]
async fn expired_state_goes_after_the_flood_without_new_keys() {
    for algorithm in ALL {
        let store = MemoryStore::builder()
            .shards(8)
            .clock(MonotonicClock::new())
            .build();
        // Ten per second: a flood key's one call matters for a second at
        // most (two for the sliding counter).
        let limiter = Limiter::new(
            policy_of("window", algorithm, 10, Duration::from_secs(1)),
            store.clone(),
        );
        let regular = Key::new("regular");
        for i in 0..20_000 {
            limiter
                .check(&Key::new(format!("flood:{i}")), 1)
                .await
                .unwrap();
        }
        assert_eq!(store.len(), 20_000);
        // The flood is over: only the regular client calls, ten times a
        // second, for three seconds.
        for _ in 0..30 {
            limiter.check(&regular, 1).await.unwrap();
            tokio::time::advance(Duration::from_millis(100)).await;
        }
        assert_eq!(store.len(), 1, "{algorithm}: flood state was kept");
    }
}

/// Leases abandoned by holders that vanished go the same way.
#[test]
fn expired_leases_go_without_new_keys() {
    let clock = ManualClock::new(Duration::from_secs(1_000));
    let store = MemoryStore::builder()
        .shards(8)
        .clock(clock.clone())
        .build();
    let policy = ConcurrencyPolicy::builder("slow", 2)
        .lease_ttl(Duration::from_secs(1))
        .no_renewal()
        .build()
        .unwrap();
    let limiter = ConcurrencyLimiter::new(policy, store.clone());
    for i in 0..5000 {
        match limiter.acquire(&Key::new(format!("k{i}"))).take_ready() {
            Some(Ok(Admission::Acquired(guard))) => std::mem::forget(guard),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(store.lease_count(), 5000);
    let regular = Key::new("regular");
    for _ in 0..30 {
        match limiter.acquire(&regular).take_ready() {
            Some(Ok(Admission::Acquired(guard))) => drop(guard),
            other => panic!("{other:?}"),
        }
        clock.advance(Duration::from_millis(100));
    }
    assert_eq!(store.lease_count(), 0, "abandoned leases were kept");
}

/// A client that keeps calling through a flood of distinct identities far
/// above the bound gets exactly the decisions it would get alone: the
/// flood evicts its own entries, those closest to expiry, never the
/// client's live state.
#[tokio::test(start_paused = true)]
async fn a_client_that_keeps_calling_keeps_its_limit_during_a_flood() {
    for algorithm in ALL {
        let store = bounded_store(1000);
        let alone = MemoryStore::builder().clock(MonotonicClock::new()).build();
        let policy = policy_of("api", algorithm, 10, Duration::from_secs(1));
        let limiter = Limiter::new(policy.clone(), store.clone());
        let reference = Limiter::new(policy, alone);
        let hot = Key::new("hot");
        let mut admitted = 0;
        let mut flood = 0u64;
        // Every step the client calls once, above its rate, and a batch of
        // new identities call once each: over a second, far more of them
        // than the bound holds.
        for _ in 0..500 {
            let got = limiter.check(&hot, 1).await.unwrap().is_allowed();
            let want = reference.check(&hot, 1).await.unwrap().is_allowed();
            assert_eq!(got, want, "{algorithm}: the client's limit moved");
            admitted += u64::from(got);
            for _ in 0..200 {
                limiter
                    .check(&Key::new(format!("flood:{flood}")), 1)
                    .await
                    .unwrap();
                flood += 1;
            }
            assert!(store.len() <= 1000, "{algorithm}: {} entries", store.len());
            tokio::time::advance(Duration::from_millis(10)).await;
        }
        // Ten a second (the sliding counter's weighting a little less).
        assert!(
            (40..=60).contains(&admitted),
            "{algorithm}: {admitted} admitted"
        );
        assert!(
            store.stats().evictions > 90_000,
            "{algorithm}: {:?}",
            store.stats()
        );
    }
}

/// Across policies, ranks are compared as absolute times (see
/// `MemoryStore`): a client that keeps calling under one policy keeps its
/// state through a flood under another policy of the same period, and
/// loses it to a flood under a policy whose state matters longer, starting
/// afresh (more admitted than it would be alone).
#[tokio::test(start_paused = true)]
async fn a_flood_under_a_longer_policy_can_evict_a_calling_client() {
    for algorithm in ALL {
        for (flood_period, kept) in [
            (Duration::from_secs(1), true),
            (Duration::from_secs(60), false),
        ] {
            let store = bounded_store(1000);
            let alone = MemoryStore::builder().clock(MonotonicClock::new()).build();
            let policy = policy_of("api", algorithm, 10, Duration::from_secs(1));
            let limiter = Limiter::new(policy.clone(), store.clone());
            let reference = Limiter::new(policy, alone);
            let bulk = Limiter::new(
                policy_of("bulk", algorithm, 10, flood_period),
                store.clone(),
            );
            let hot = Key::new("hot");
            let (mut got, mut want) = (0, 0);
            let mut flood = 0u64;
            for _ in 0..50 {
                got += u64::from(limiter.check(&hot, 1).await.unwrap().is_allowed());
                want += u64::from(reference.check(&hot, 1).await.unwrap().is_allowed());
                for _ in 0..200 {
                    bulk.check(&Key::new(format!("flood:{flood}")), 1)
                        .await
                        .unwrap();
                    flood += 1;
                }
                tokio::time::advance(Duration::from_millis(1)).await;
            }
            assert!(store.stats().evictions > 0, "{algorithm}: no flood");
            if kept {
                assert_eq!(got, want, "{algorithm}: the client lost its state");
            } else {
                assert!(got > want, "{algorithm}: {got} admitted, {want} alone");
            }
        }
    }
}

/// Threads inserting distinct identities at once: the bound holds, and
/// every identity is either held or counted as evicted.
#[test]
fn the_bound_holds_across_threads() {
    let store = MemoryStore::builder()
        .shards(4)
        .max_keys(1000)
        .unwrap()
        .build();
    let limiter = Limiter::new(
        policy_of("flood", Algorithm::Gcra, 5, Duration::from_secs(3600)),
        store.clone(),
    );
    std::thread::scope(|s| {
        for t in 0..2 {
            let limiter = &limiter;
            s.spawn(move || {
                for i in 0..25_000 {
                    let key = Key::new(format!("t{t}:{i}"));
                    let decision = limiter.check_now(&key, 1).unwrap();
                    assert!(decision.is_allowed());
                }
            });
        }
    });
    assert!(store.len() <= 1000, "{} entries", store.len());
    assert_eq!(store.stats().evictions + store.len() as u64, 50_000);
}
