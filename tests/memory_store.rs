//! The memory store keeps memory bounded under a key-cardinality attack,
//! follows tokio's paused clock, and finds a key's state by its text.
use std::time::Duration;

use fleetgate::clock::MonotonicClock;
use fleetgate::{Key, Limit, Limiter, MemoryStore, Policy, Rate};

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
    // Live state is at most one round; sweeping at doubling keeps the rest
    // within a small factor of it.
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
