//! Following the upstream's rate-limit headers on Redis: `Limiter::align`
//! gives the same decisions on the memory store and on Redis (one manual
//! clock), and a fleet of two instances (each its own store on one
//! redis-server, two workers each) around an upstream whose limit its
//! policy does not know, and which drops mid-run, earns no 429 but for the
//! calls in flight when the limit drops. Real time.
use crate::common;

#[path = "../common/upstream_api.rs"]
mod upstream_api;

use std::sync::Arc;
use std::time::Duration;

use common::RedisServer;
use fleetgate::clock::ManualClock;
use fleetgate::rate_limit::UpstreamHeaders;
use fleetgate::{
    Algorithm, Decision, Key, Limit, Limiter, MemoryStore, Policy, Rate, RedisStore, TimeSource,
};
use upstream_api::{Style, UpstreamApi, run_fleet};

const S: Duration = Duration::from_secs(1);
const MS: Duration = Duration::from_millis(1);

/// The memory store and Redis, each on a manual clock at the same time,
/// give the same decisions around every kind of report: some left, none
/// left, plenty left, absurdly many left, with reservations in flight, on
/// a fresh key, on two limits; and a window policy is left alone.
#[tokio::test]
async fn align_gives_the_same_decisions_on_both_stores() {
    let server = RedisServer::start();
    let policy = Policy::builder("align")
        .limit(
            Limit::builder(Rate::per_second(10))
                .burst(5)
                .build()
                .unwrap(),
        )
        .limit(Limit::new(Rate::per_minute(120)).unwrap())
        .build()
        .unwrap();
    let windowed = Policy::builder("align-window")
        .algorithm(Algorithm::FixedWindow)
        .limit(Limit::new(Rate::per_second(10)).unwrap())
        .build()
        .unwrap();
    let start = Duration::from_secs(1_700_000_000);
    let mem_clock = ManualClock::new(start);
    let memory = MemoryStore::builder().clock(mem_clock.clone()).build();
    let redis_clock = ManualClock::new(start);
    let redis = RedisStore::builder(server.url())
        .time_source(TimeSource::Client(Arc::new(redis_clock.clone())))
        .timeout(2 * S)
        .connect()
        .await
        .unwrap();
    let mut logs: Vec<Vec<Decision>> = Vec::new();
    let stores: [(Arc<dyn fleetgate::Store>, &ManualClock); 2] = [
        (Arc::new(memory), &mem_clock),
        (Arc::new(redis), &redis_clock),
    ];
    for (store, clock) in stores {
        let limiter = Limiter::new(policy.clone(), store.clone());
        let k = Key::new("k");
        let mut log = Vec::new();
        let reserve = |key: &Key| limiter.reserve(key, 1, 60 * S);
        // 2 left until a reset in 3 s: two calls in the last 0.2 s before
        // it (the 10/s limit's rate), the third at it.
        limiter.align(&k, 2, 3 * S).await.unwrap();
        for _ in 0..3 {
            log.push(reserve(&k).await.unwrap());
        }
        // Plenty left: nothing changes (and no store is asked).
        limiter.align(&k, 1_000, 3 * S).await.unwrap();
        limiter.align(&k, u64::MAX, 600 * S).await.unwrap();
        log.push(limiter.check(&k, 1).await.unwrap());
        clock.advance(10 * S);
        // The burst of 5 and two slots after it, 0.1 s and 0.2 s away;
        // then a report that has not seen those two: 3 left until 2 s
        // from now. One more fits before the reset, then the reset.
        for _ in 0..7 {
            log.push(reserve(&k).await.unwrap());
        }
        limiter.align(&k, 3, 2 * S).await.unwrap();
        log.push(reserve(&k).await.unwrap());
        log.push(reserve(&k).await.unwrap());
        // A second later a report has seen the two: 1 left until the same
        // reset. The two reserved since the last report count against it,
        // so nothing moves.
        clock.advance(S);
        limiter.align(&k, 1, S).await.unwrap();
        log.push(limiter.check(&k, 1).await.unwrap());
        // None left: a pause, as defer.
        clock.advance(10 * S);
        limiter.align(&k, 0, 4 * S).await.unwrap();
        log.push(limiter.check(&k, 1).await.unwrap());
        // A fresh key told before its first call.
        let fresh = Key::new("fresh");
        limiter.align(&fresh, 1, 5 * S).await.unwrap();
        log.push(reserve(&fresh).await.unwrap());
        log.push(reserve(&fresh).await.unwrap());
        // A window policy is not held back.
        let windows = Limiter::new(windowed.clone(), store.clone());
        windows.align(&k, 0, 60 * S).await.unwrap();
        log.push(windows.check(&k, 1).await.unwrap());
        logs.push(log);
    }
    assert_eq!(logs[0], logs[1], "memory and Redis decided differently");
    let log = &logs[0];
    // 10/s is one call per 100 ms (burst 5, τ = 500 ms): the floor is
    // 3 s + 500 ms − 3 × 100 ms; 120/min (burst 120) is looser throughout.
    let waits: Vec<Duration> = log[..3].iter().map(Decision::wait).collect();
    assert_eq!(waits, [2_800 * MS, 2_900 * MS, 3 * S]);
    // 120/min's state: 3 calls at 500 ms past a floor 61.5 s out.
    assert_eq!(
        log[3].retry_after(),
        Some(3_500 * MS),
        "plenty left changed nothing"
    );
    assert_eq!(log[3].limit_index(), 1);
    let waits: Vec<Duration> = log[4..11].iter().map(Decision::wait).collect();
    assert_eq!(waits[..5], [Duration::ZERO; 5]);
    assert_eq!(waits[5..], [100 * MS, 200 * MS]);
    // 3 left, 2 of them in flight: one more before 2 s, then the reset.
    assert_eq!(log[11].wait(), 1_900 * MS);
    assert_eq!(log[12].wait(), 2 * S);
    // Unmoved: the next call after those two.
    assert_eq!(log[13].retry_after(), Some(1_100 * MS));
    assert!(!log[14].is_allowed());
    assert_eq!(
        log[14].retry_after(),
        Some(4 * S),
        "none left: paused to the reset"
    );
    assert_eq!(log[15].wait(), 4_900 * MS);
    assert_eq!(log[16].wait(), 5 * S);
    assert!(log[17].is_allowed(), "a window policy is left alone");
}

/// Two instances (two stores on one redis-server), two workers each, one
/// call at a time, around an upstream of 10 calls per 2 s that drops to 5
/// at 5 s, in the middle of a window; the clients' policy allows 100 a
/// second in bursts of 20. Both header styles run side by side, each with
/// its own policy name. Bound: no 429 but for the calls in flight when the
/// limit drops (at most the 4 workers), all in that window; with resets to
/// the millisecond, every window used from soon after its start.
#[tokio::test]
async fn a_fleet_of_two_instances_follows_the_upstreams_headers() {
    let server = RedisServer::start();
    let schedule = [(Duration::ZERO, 10), (5 * S, 5)];
    let run = |name: &'static str, style: Style| {
        let server_url = server.url();
        async move {
            let limit = Limit::builder(Rate::per_second(100))
                .burst(20)
                .build()
                .unwrap();
            let policy = Policy::single(name, limit).unwrap();
            let mut limiters = Vec::new();
            for _ in 0..2 {
                let store = RedisStore::builder(&server_url)
                    .timeout(2 * S)
                    .connect()
                    .await
                    .unwrap();
                limiters.push(Limiter::new(policy.clone(), store));
            }
            let api = UpstreamApi::new(2 * S, &schedule, style);
            // The store reads Redis' wall clock, the upstream tokio's
            // monotonic one: they drift apart by up to a millisecond or so
            // over the run (NTP slewing), as two machines' clocks would.
            // The margin is what any client of a real upstream needs.
            let headers = UpstreamHeaders::new().margin(5 * MS);
            let run = run_fleet(&api, &limiters, 2, 10 * S, headers).await;
            (api, run)
        }
    };
    let ((ms_api, ms_run), (secs_api, secs_run)) = tokio::join!(
        run("upstream-ms", Style::OpenAi),
        run("upstream-secs", Style::Ietf)
    );
    for (api, run, style) in [(&ms_api, ms_run, "ms"), (&secs_api, secs_run, "secs")] {
        assert_eq!(run.errors, Vec::<String>::new(), "{style}");
        let refused = api.refused();
        assert!(refused.len() <= 4, "{style}: {refused:?}");
        // Known limit, seen only on a loaded machine: when reports are
        // recorded late and out of order, one call can race a window's
        // reset and reach the upstream in the last few milliseconds before
        // it. At most one such call, within 25 ms of a reset, is allowed;
        // anything else outside the window the limit dropped in fails.
        let racing = |at: &Duration| {
            let into = at.as_millis() % 2000;
            into >= 1975
        };
        let outside: Vec<_> = refused
            .iter()
            .filter(|at| !(4 * S..6 * S).contains(*at))
            .collect();
        assert!(
            outside.len() <= 1 && outside.iter().all(|at| racing(at)),
            "{style}: 429s at {outside:?}, outside the window the limit dropped in"
        );
        assert!(run.calls >= 15, "{style}: only {} calls", run.calls);
    }
    // Resets to the millisecond: the fleet resumes at each reset, not up
    // to a second after it as whole seconds would have it. How many calls
    // fit in a window depends on how late a loaded machine wakes the
    // workers (slots in its last stretch slip into the next one), so what
    // is checked is the fleet's own wait: every window's first call comes
    // within a quarter of the window of its start; one late by a second's
    // rounding, or never, fails.
    let firsts = ms_api.first_calls();
    for w in 1..5 {
        let first = firsts.get(&w);
        assert!(
            first.is_some_and(|&late| late < 500 * MS),
            "ms: window {w} first used {first:?} after its start: {firsts:?}"
        );
    }
}
