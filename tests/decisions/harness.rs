//! The harness of both conformance suites (`conformance`, GCRA;
//! `conformance_windows`, the window algorithms).
//!
//! Each scenario is a function over a [`Sut`] (store under test): a store
//! whose clock is a [`ManualClock`] the scenario sets by hand. It is run on a
//! `MemoryStore` and on a `RedisStore` whose script reads the same manual
//! clock (`TimeSource::Client`), so both see exactly the same times. Every
//! scenario asserts exact decisions, and the full decision sequences of the
//! two stores must be equal ([`on_both_stores`], or the `conformance!`
//! macro for a list of scenarios).

use std::future::Future;
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fleetgate::clock::ManualClock;
use fleetgate::{Decision, Key, Limiter, MemoryStore, Policy, RedisStore, Store, TimeSource};
use redis::aio::MultiplexedConnection;

use crate::common::RedisServer;

pub const S: Duration = Duration::from_secs(1);
pub const US: Duration = Duration::from_micros(1);
/// A realistic Unix time in the manual clock, so that the Lua script works
/// with numbers near 2^51 µs as it does in production.
pub const UNIX_NOW: Duration = Duration::from_secs(1_700_000_000);

// ---------------------------------------------------------------------------
// The store under test.

/// A store with a manual clock, and the log of every decision it made.
#[derive(Clone)]
pub struct Sut {
    pub name: &'static str,
    clock: ManualClock,
    store: Arc<dyn Store>,
    log: Arc<Mutex<Vec<Decision>>>,
    /// Calls of `check` so far, which alternate between the two APIs.
    checks: Arc<AtomicUsize>,
}

impl Sut {
    pub fn memory(start: Duration) -> Sut {
        let clock = ManualClock::new(start);
        let store = MemoryStore::builder().clock(clock.clone()).build();
        Sut {
            name: "memory",
            clock,
            store: Arc::new(store),
            log: Arc::default(),
            checks: Arc::default(),
        }
    }

    pub async fn redis(server: &RedisServer, prefix: &str, start: Duration) -> Sut {
        let clock = ManualClock::new(start);
        let store = client_clock_store(server, prefix, &clock).await;
        Sut {
            name: "redis",
            clock,
            store: Arc::new(store),
            log: Arc::default(),
            checks: Arc::default(),
        }
    }

    pub fn limiter(&self, policy: &Policy) -> Limiter {
        Limiter::new(policy.clone(), self.store.clone())
    }

    pub fn advance(&self, by: Duration) {
        self.clock.advance(by);
    }

    /// Decided through `check` and `check_now` in turn
    /// ([`check_both_ways`]).
    pub async fn check(&self, limiter: &Limiter, key: &str, cost: u64) -> Decision {
        let decision = check_both_ways(self.name, &self.checks, limiter, key, cost).await;
        self.log.lock().unwrap().push(decision.clone());
        decision
    }

    pub async fn reserve(
        &self,
        limiter: &Limiter,
        key: &str,
        cost: u64,
        max_wait: Duration,
    ) -> Decision {
        let decision = limiter
            .reserve(&Key::new(key), cost, max_wait)
            .await
            .unwrap_or_else(|err| panic!("{}: store error: {err}", self.name));
        self.log.lock().unwrap().push(decision.clone());
        decision
    }

    /// `Limiter::peek`, logged as a decision.
    pub async fn peek(&self, limiter: &Limiter, key: &str, cost: u64) -> Decision {
        let decision = limiter
            .peek(&Key::new(key), cost)
            .await
            .unwrap_or_else(|err| panic!("{}: store error: {err}", self.name));
        self.log.lock().unwrap().push(decision.clone());
        decision
    }

    /// `Limiter::charge`, its answer logged as a decision.
    pub async fn charge(&self, limiter: &Limiter, key: &str, cost: u64) -> Decision {
        let decision = limiter
            .charge(&Key::new(key), cost)
            .await
            .unwrap_or_else(|err| panic!("{}: store error: {err}", self.name));
        self.log.lock().unwrap().push(decision.clone());
        decision
    }

    /// `Limiter::refund`, which answers nothing to log.
    pub async fn refund(&self, limiter: &Limiter, key: &str, cost: u64) {
        limiter
            .refund(&Key::new(key), cost)
            .await
            .unwrap_or_else(|err| panic!("{}: store error: {err}", self.name));
    }

    pub fn log(&self) -> Vec<Decision> {
        self.log.lock().unwrap().clone()
    }
}

/// What a decision should be, field by field.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Want {
    allowed: bool,
    limit: usize,
    remaining: u64,
    reset: Duration,
    retry_after: Option<Duration>,
    wait: Duration,
}

pub fn allowed(limit: usize, remaining: u64, reset: Duration) -> Want {
    Want {
        allowed: true,
        limit,
        remaining,
        reset,
        retry_after: None,
        wait: Duration::ZERO,
    }
}

pub fn reserved(limit: usize, remaining: u64, reset: Duration, wait: Duration) -> Want {
    Want {
        wait,
        ..allowed(limit, remaining, reset)
    }
}

pub fn denied(limit: usize, remaining: u64, reset: Duration, retry_after: Duration) -> Want {
    Want {
        allowed: false,
        limit,
        remaining,
        reset,
        retry_after: Some(retry_after),
        wait: Duration::ZERO,
    }
}

impl Sut {
    #[track_caller]
    pub fn expect(&self, d: &Decision, want: Want) {
        let got = Want {
            allowed: d.is_allowed(),
            limit: d.limit_index(),
            remaining: d.remaining(),
            reset: d.reset(),
            retry_after: d.retry_after(),
            wait: d.wait(),
        };
        assert_eq!(got, want, "{} store decided differently", self.name);
    }

    /// A call whose cost no limit could ever admit: refused at once, with
    /// no retry time, naming the limit with the smallest burst.
    #[track_caller]
    pub fn expect_never(&self, d: &Decision, limit: usize) {
        assert!(!d.is_allowed(), "{}: impossible cost admitted", self.name);
        assert_eq!(d.retry_after(), None, "{}: retry for a never", self.name);
        assert_eq!(d.limit_index(), limit, "{}", self.name);
        assert_eq!(d.remaining(), 0, "{}", self.name);
        assert_eq!(d.wait(), Duration::ZERO, "{}", self.name);
    }
}

/// Runs `scenario` on a memory store and on a Redis store (private server,
/// keys under `prefix`), both starting at `start`, and compares their
/// decisions.
pub async fn on_both_stores<F, Fut>(prefix: &str, start: Duration, scenario: F)
where
    F: Fn(Sut) -> Fut,
    Fut: Future<Output = ()>,
{
    let memory = Sut::memory(start);
    scenario(memory.clone()).await;

    let server = RedisServer::start();
    let redis = Sut::redis(&server, prefix, start).await;
    // The manual clock stands still between a scenario's steps while Redis'
    // clock, on which keys expire, runs on: it falls behind by at most the
    // real time the scenario takes. With the caller's clock every key lives
    // a minute past the moment its state stops mattering
    // (`TimeSource::Client`), so none can expire under the scenario unless
    // it takes that long; this makes sure it did not come near.
    let started = Instant::now();
    scenario(redis.clone()).await;
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(30),
        "the Redis run took {took:?}: its keys may have expired under the manual clock"
    );

    let (memory, redis) = (memory.log(), redis.log());
    assert!(!memory.is_empty(), "the scenario decided nothing");
    assert_eq!(
        memory, redis,
        "memory and Redis stores gave different decision sequences"
    );
}

/// A Redis store on the test's server whose scripts read `clock`, with
/// keys under `prefix`.
pub async fn client_clock_store(
    server: &RedisServer,
    prefix: &str,
    clock: &ManualClock,
) -> RedisStore {
    RedisStore::builder(server.url())
        .time_source(TimeSource::Client(Arc::new(clock.clone())))
        .prefix(prefix)
        .timeout(Duration::from_secs(2))
        .connect()
        .await
        .expect("connect to the test's redis-server")
}

/// Runs each scenario (a function of the calling module) as a test on both
/// stores, from its start time, with Redis keys under `prefix`.
macro_rules! conformance {
    (prefix $prefix:expr; $($scenario:ident at $start:expr;)*) => {
        mod suite {
            #[allow(unused_imports)]
            use super::*;
            $(
                #[tokio::test]
                async fn $scenario() {
                    $crate::harness::on_both_stores(&$prefix, $start, super::$scenario).await;
                }
            )*
        }
    };
}
pub(crate) use conformance;

/// A plain connection to the test's server, to look at what the store
/// wrote.
pub async fn inspector(server: &RedisServer) -> MultiplexedConnection {
    server
        .client()
        .get_multiplexed_async_connection()
        .await
        .expect("inspection connection")
}

/// One `check` of the conformance suites, through both of `Limiter`'s
/// APIs: on the memory store (`store` is `"memory"`) every other call
/// (counted by `checks`) is decided with `check_now` (at once, no future),
/// the rest with `check`, so that every scenario's exact decisions hold
/// for both. On Redis, `check_now` must answer only a cost no limit could
/// admit, and then as `check` does.
pub async fn check_both_ways(
    store: &str,
    checks: &std::sync::atomic::AtomicUsize,
    limiter: &fleetgate::Limiter,
    key: &str,
    cost: u64,
) -> fleetgate::Decision {
    let key = fleetgate::Key::new(key);
    let at_once = checks.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % 2 == 1;
    if store == "memory" && at_once {
        return limiter
            .check_now(&key, cost)
            .expect("the memory store decides at once");
    }
    let now = (store == "redis").then(|| limiter.check_now(&key, cost));
    let decision = limiter
        .check(&key, cost)
        .await
        .unwrap_or_else(|err| panic!("{store}: store error: {err}"));
    if let Some(now) = now {
        let impossible = cost > limiter.policy().max_cost();
        assert_eq!(now, impossible.then(|| decision.clone()));
    }
    decision
}
