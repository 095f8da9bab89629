//! Resetting one identity's state on the memory store: the next call is
//! decided as if the identity were new, for GCRA, every window algorithm
//! and concurrency leases; the entries go (memory is freed, not zeroed);
//! other identities and other policies keep theirs.
use std::time::Duration;

use fleetgate::clock::MonotonicClock;
use fleetgate::concurrency::{Admission, ConcurrencyLimiter, ConcurrencyPolicy};
use fleetgate::{Algorithm, Key, Limit, Limiter, MemoryStore, Policy, Rate};

fn paused_store() -> MemoryStore {
    MemoryStore::builder().clock(MonotonicClock::new()).build()
}

/// `count` an hour under `algorithm`, and for GCRA a second limit too
/// (several limits keep their state apart from one).
fn policy(name: &str, algorithm: Algorithm, count: u64) -> Policy {
    let hourly = Limit::new(Rate::per_hour(count)).unwrap();
    let builder = Policy::builder(name).algorithm(algorithm).limit(hourly);
    let builder = if algorithm == Algorithm::Gcra {
        builder.limit(Limit::new(Rate::per_day(10 * count)).unwrap())
    } else {
        builder
    };
    builder.build().unwrap()
}

const ALL: [Algorithm; 4] = [
    Algorithm::Gcra,
    Algorithm::SlidingLog,
    Algorithm::FixedWindow,
    Algorithm::SlidingWindow,
];

async fn exhaust(limiter: &Limiter, key: &Key, count: u64) {
    for i in 0..count {
        let d = limiter.check(key, 1).await.unwrap();
        assert!(d.is_allowed(), "call {i} of {count} was denied");
    }
    assert!(!limiter.check(key, 1).await.unwrap().is_allowed());
}

#[tokio::test(start_paused = true)]
async fn a_reset_key_is_admitted_as_new_under_every_algorithm() {
    for algorithm in ALL {
        let store = paused_store();
        let limiter = Limiter::new(policy("api", algorithm, 3), store.clone());
        let other_policy = Limiter::new(policy("other", algorithm, 3), store.clone());
        let (who, bystander) = (Key::new("user:1"), Key::new("user:2"));
        exhaust(&limiter, &who, 3).await;
        exhaust(&limiter, &bystander, 3).await;
        exhaust(&other_policy, &who, 3).await;
        assert_eq!(store.len(), 3, "{algorithm}");

        limiter.reset(&who).await.unwrap();
        assert_eq!(store.len(), 2, "{algorithm}: the entry was not removed");
        // As new: its whole quota, then denied again.
        let first = limiter.check(&who, 1).await.unwrap();
        assert!(first.is_allowed(), "{algorithm}: denied after reset");
        assert_eq!(first.remaining(), 2, "{algorithm}: not a fresh quota");
        assert!(limiter.check(&who, 1).await.unwrap().is_allowed());
        assert!(limiter.check(&who, 1).await.unwrap().is_allowed());
        assert!(!limiter.check(&who, 1).await.unwrap().is_allowed());
        // Nobody else was reset.
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

/// A reset clears the state of the name whatever algorithm wrote it: a
/// policy changed from one algorithm to another leaves nothing behind.
#[tokio::test(start_paused = true)]
async fn a_reset_clears_the_state_of_every_algorithm_under_the_name() {
    let store = paused_store();
    let who = Key::new("user:1");
    for algorithm in ALL {
        let limiter = Limiter::new(policy("api", algorithm, 3), store.clone());
        assert!(limiter.check(&who, 1).await.unwrap().is_allowed());
    }
    assert_eq!(store.len(), 4);
    Limiter::new(policy("api", Algorithm::Gcra, 3), store.clone())
        .reset(&who)
        .await
        .unwrap();
    assert!(store.is_empty(), "{} entries left", store.len());
}

#[tokio::test(start_paused = true)]
async fn resetting_an_unknown_key_does_nothing() {
    let store = paused_store();
    let limiter = Limiter::new(policy("api", Algorithm::Gcra, 3), store.clone());
    limiter.reset(&Key::new("nobody")).await.unwrap();
    assert!(store.is_empty());
    assert!(
        limiter
            .check(&Key::new("nobody"), 1)
            .await
            .unwrap()
            .is_allowed()
    );
}

fn concurrency(store: &MemoryStore, name: &str, renewal: bool) -> ConcurrencyLimiter {
    let builder = ConcurrencyPolicy::builder(name, 1).lease_ttl(Duration::from_secs(10));
    let builder = if renewal {
        builder.renew_every(Duration::from_secs(1))
    } else {
        builder.no_renewal()
    };
    ConcurrencyLimiter::new(builder.build().unwrap(), store.clone())
}

async fn acquired(limiter: &ConcurrencyLimiter, key: &Key) -> Option<Admission> {
    match limiter.acquire(key).await.unwrap() {
        admission @ Admission::Acquired(_) => Some(admission),
        Admission::Refused(_) => None,
    }
}

/// The key's leases go; a guard still held releases nothing when dropped,
/// and in particular not the lease taken after the reset.
#[tokio::test(start_paused = true)]
async fn a_reset_drops_the_leases_and_old_guards_release_nothing() {
    let store = paused_store();
    let limiter = concurrency(&store, "jobs", false);
    let other = concurrency(&store, "exports", false);
    let (who, bystander) = (Key::new("tenant:a"), Key::new("tenant:b"));
    let stuck = acquired(&limiter, &who).await.expect("the first lease");
    let _held = acquired(&limiter, &bystander).await.expect("a lease");
    let _other = acquired(&other, &who).await.expect("a lease");
    assert!(acquired(&limiter, &who).await.is_none());
    assert_eq!(store.lease_count(), 3);

    limiter.reset(&who).await.unwrap();
    assert_eq!(store.lease_count(), 2);
    let fresh = acquired(&limiter, &who)
        .await
        .expect("admitted after reset");
    drop(stuck);
    // The old guard's release found nothing: the fresh lease still holds.
    assert_eq!(store.lease_count(), 3);
    assert!(acquired(&limiter, &who).await.is_none());
    // Nobody else's leases went.
    assert!(acquired(&limiter, &bystander).await.is_none());
    assert!(acquired(&other, &who).await.is_none());
    drop(fresh);
    assert!(acquired(&limiter, &who).await.is_some());
}

/// Renewals of a lease dropped by a reset find it gone and stop: they do
/// not bring it back, and nothing fails.
#[tokio::test(start_paused = true)]
async fn renewals_of_a_reset_lease_stop_without_bringing_it_back() {
    let store = paused_store();
    let limiter = concurrency(&store, "jobs", true);
    let who = Key::new("tenant:a");
    let stuck = acquired(&limiter, &who).await.expect("the first lease");
    limiter.reset(&who).await.unwrap();
    assert_eq!(store.lease_count(), 0);
    // Several renewal periods: each renewal, if any ran, found nothing.
    for _ in 0..5 {
        tokio::time::advance(Duration::from_secs(1)).await;
        tokio::task::yield_now().await;
    }
    assert_eq!(store.lease_count(), 0, "a renewal brought the lease back");
    drop(stuck);
    assert_eq!(store.lease_count(), 0);
    assert!(acquired(&limiter, &who).await.is_some());
}
