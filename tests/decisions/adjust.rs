//! Cost known after the response on the memory store: a peek stores
//! nothing, a charge goes into debt and holds the identity back exactly
//! as long as the algorithm says (its retry, not a microsecond less), a
//! refund never gives more than a fresh state has, a cost of 0 does
//! nothing, and concurrent charges never lose an update. The same
//! operations on Redis are held to the memory store's answers by
//! `conformance_adjust`.
use std::sync::Arc;
use std::time::Duration;

use fleetgate::clock::ManualClock;
use fleetgate::{Algorithm, Key, Limit, Limiter, MemoryStore, Policy, Rate};

const ALL: [Algorithm; 4] = [
    Algorithm::Gcra,
    Algorithm::SlidingLog,
    Algorithm::FixedWindow,
    Algorithm::SlidingWindow,
];

const US: Duration = Duration::from_micros(1);

/// A store on a manual clock at a realistic Unix time, a minute boundary.
fn store() -> (MemoryStore, ManualClock) {
    let clock = ManualClock::new(Duration::from_secs(1_699_999_980));
    (MemoryStore::builder().clock(clock.clone()).build(), clock)
}

fn policy(algorithm: Algorithm, rate: Rate) -> Policy {
    Policy::builder("api")
        .algorithm(algorithm)
        .limit(Limit::new(rate).unwrap())
        .build()
        .unwrap()
}

fn now<T>(f: fleetgate::store::StoreFuture<T>) -> T {
    let mut f = f;
    f.take_ready()
        .expect("the memory store answers at once")
        .expect("the memory store does not fail")
}

#[test]
fn a_peek_stores_nothing_under_every_algorithm() {
    for algorithm in ALL {
        let (store, _) = store();
        let limiter = Limiter::new(policy(algorithm, Rate::per_minute(3)), store.clone());
        let who = Key::new("user:1");
        for _ in 0..10 {
            let d = now(limiter.peek(&who, 3));
            assert!(d.is_allowed(), "{algorithm}");
            assert_eq!(d.remaining(), 0, "{algorithm}");
        }
        assert!(store.is_empty(), "{algorithm}: a peek made an entry");
        assert_eq!(now(limiter.check(&who, 1)).remaining(), 2, "{algorithm}");
        for _ in 0..10 {
            assert_eq!(now(limiter.peek(&who, 1)).remaining(), 1, "{algorithm}");
        }
        assert_eq!(now(limiter.check(&who, 2)).remaining(), 0, "{algorithm}");
        let d = now(limiter.peek(&who, 1));
        assert!(!d.is_allowed(), "{algorithm}");
        assert_eq!(d, now(limiter.check(&who, 1)), "{algorithm}: peek != check");
    }
}

#[test]
fn charges_and_refunds_of_nothing_do_nothing() {
    for algorithm in ALL {
        let (store, _) = store();
        let limiter = Limiter::new(policy(algorithm, Rate::per_minute(3)), store.clone());
        let who = Key::new("user:1");
        let d = now(limiter.charge(&who, 0));
        assert!(d.is_allowed(), "{algorithm}");
        now(limiter.refund(&who, 0));
        // A refund of an unknown key makes no entry either.
        now(limiter.refund(&who, 5));
        assert!(store.is_empty(), "{algorithm}: {} entries", store.len());
    }
}

/// After a charge of `cost` on a fresh key, a call of cost 1 is refused
/// until exactly the retry the charge gave, and passes then.
#[test]
fn a_debt_holds_the_key_back_exactly_until_the_retry_under_every_algorithm() {
    for algorithm in ALL {
        for (rate, cost) in [
            (Rate::new(3, Duration::from_secs(10)), 3),
            (Rate::new(3, Duration::from_secs(10)), 5),
            (Rate::per_minute(100), 250),
            (Rate::per_second(7), 1_000),
        ] {
            let (store, clock) = store();
            clock.advance(Duration::from_millis(1_234));
            let limiter = Limiter::new(policy(algorithm, rate), store);
            let who = Key::new("user:1");
            let charged = now(limiter.charge(&who, cost));
            assert!(!charged.is_allowed(), "{algorithm} {rate} {cost}");
            assert_eq!(charged.remaining(), 0, "{algorithm} {rate} {cost}");
            let retry = charged.retry_after().expect("a retry");
            assert_eq!(
                now(limiter.peek(&who, 1)),
                charged,
                "{algorithm} {rate} {cost}"
            );
            clock.advance(retry - US);
            let d = now(limiter.check(&who, 1));
            assert!(
                !d.is_allowed(),
                "{algorithm} {rate} {cost}: admitted 1 µs early"
            );
            assert_eq!(d.retry_after(), Some(US), "{algorithm} {rate} {cost}");
            clock.advance(US);
            let d = now(limiter.check(&who, 1));
            assert!(
                d.is_allowed(),
                "{algorithm} {rate} {cost}: refused at the retry"
            );
        }
    }
}

/// GCRA repays a debt at exactly the limit's rate: a charge of `cost`
/// from a fresh state with burst `b` and interval `T` admits the next call
/// of cost 1 after (cost − b + 1)·T, and a call every T from then on.
#[test]
fn a_gcra_debt_is_repaid_at_exactly_the_rate() {
    for (rate, burst, cost) in [
        (Rate::per_second(1), 1, 10),
        (Rate::per_minute(1000), 1000, 1200),
        (Rate::per_hour(36), 5, 40),
        (Rate::per_second(100), 20, 21),
    ] {
        let (store, clock) = store();
        let limit = Limit::builder(rate).burst(burst).build().unwrap();
        let limiter = Limiter::new(Policy::single("api", limit).unwrap(), store);
        let who = Key::new("user:1");
        let interval = rate.period() / u32::try_from(rate.count()).unwrap();
        let d = now(limiter.charge(&who, cost));
        let owed = interval * u32::try_from(cost - burst + 1).unwrap();
        assert_eq!(
            d.retry_after(),
            Some(owed),
            "{rate} burst {burst} cost {cost}"
        );
        clock.advance(owed - US);
        assert!(!now(limiter.peek(&who, 1)).is_allowed());
        clock.advance(US);
        for i in 0..5 {
            assert!(now(limiter.check(&who, 1)).is_allowed(), "call {i}");
            let d = now(limiter.check(&who, 1));
            assert_eq!(d.retry_after(), Some(interval), "call {i}: not at the rate");
            clock.advance(interval);
        }
    }
}

#[test]
fn a_refund_never_gives_more_than_a_fresh_state_under_every_algorithm() {
    for algorithm in ALL {
        let (store, clock) = store();
        let limiter = Limiter::new(policy(algorithm, Rate::per_hour(3)), store);
        let who = Key::new("user:1");
        assert!(now(limiter.check(&who, 2)).is_allowed());
        now(limiter.refund(&who, 1));
        assert_eq!(now(limiter.peek(&who, 1)).remaining(), 1, "{algorithm}");
        now(limiter.refund(&who, 1_000));
        clock.advance(Duration::from_secs(1));
        for remaining in [2, 1, 0] {
            let d = now(limiter.check(&who, 1));
            assert!(d.is_allowed(), "{algorithm}");
            assert_eq!(d.remaining(), remaining, "{algorithm}");
        }
        assert!(
            !now(limiter.check(&who, 1)).is_allowed(),
            "{algorithm}: credit"
        );
        // Into debt, then everything given back: a fresh state, no more.
        now(limiter.charge(&who, 10));
        now(limiter.refund(&who, u64::MAX));
        assert_eq!(now(limiter.peek(&who, 1)).remaining(), 2, "{algorithm}");
    }
}

#[test]
fn a_charge_says_what_is_left() {
    for algorithm in ALL {
        let (store, _) = store();
        let limiter = Limiter::new(policy(algorithm, Rate::per_hour(10)), store);
        let who = Key::new("user:1");
        let d = now(limiter.charge(&who, 4));
        assert!(d.is_allowed(), "{algorithm}");
        assert_eq!(d.remaining(), 6, "{algorithm}");
        let d = now(limiter.charge(&who, 6));
        assert!(!d.is_allowed(), "{algorithm}");
        assert_eq!(d.remaining(), 0, "{algorithm}");
        assert!(d.retry_after().is_some(), "{algorithm}");
    }
}

/// Many threads charging one key at once: every unit is counted.
#[test]
fn concurrent_charges_never_lose_an_update() {
    for algorithm in ALL {
        let (store, _) = store();
        let limiter = Limiter::new(policy(algorithm, Rate::per_hour(100_000)), store);
        let limiter = Arc::new(limiter);
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let limiter = limiter.clone();
                std::thread::spawn(move || {
                    for _ in 0..250 {
                        now(limiter.charge(&Key::new("hot"), 3));
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().unwrap();
        }
        let d = now(limiter.peek(&Key::new("hot"), 1));
        assert_eq!(d.remaining(), 100_000 - 8 * 250 * 3 - 1, "{algorithm}");
    }
}
