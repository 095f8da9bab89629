//! Live policies across a fleet: two `LivePolicies`, each on a
//! `RedisStore` of its own connected to the test's server, as two
//! instances would be. A change through one is enforced by the other
//! within a second (measured: run with `--nocapture` to see the figures);
//! overrides and plans are the fleet's; a reset unblocks on both (the
//! other's deny cache forgets); a restarted instance starts with the
//! changes; broken texts change nothing, and a stored text that no longer
//! parses is skipped with the previous limits kept; heartbeats list the
//! instances and size the local share while Redis is gone; a change while
//! Redis is gone fails within the timeout and changes nothing.
use crate::common;

use std::collections::BTreeSet;
use std::time::{Duration, Instant, SystemTime};

use common::RedisServer;
use fleetgate::concurrency::{Admission, ConcurrencyLimiter, ConcurrencyPolicy};
use fleetgate::live::{LiveError, LivePolicies};
use fleetgate::spec::PolicySpec;
use fleetgate::{Key, Limiter, Policy, RedisStore};
use redis::AsyncCommands;

/// The stores' prefix: the fleet's changes live under it.
const PREFIX: &str = "svc";

/// What the fleet is given to see a change: twice the target of 1 s, for
/// a loaded machine.
const PROPAGATION: Duration = Duration::from_secs(2);

fn policy(name: &str, text: &str) -> Policy {
    text.parse::<PolicySpec>().unwrap().build(name).unwrap()
}

fn user(name: &str) -> Key {
    Key::new(format!("user:{name}"))
}

/// A store of an instance of its own on the test's server.
async fn store(server: &RedisServer, timeout: Duration) -> RedisStore {
    RedisStore::builder(server.url())
        .prefix(PREFIX)
        .timeout(timeout)
        .connect()
        .await
        .unwrap()
}

/// An instance: live policies on a store of its own.
async fn instance(server: &RedisServer) -> LivePolicies {
    LivePolicies::new(store(server, Duration::from_secs(2)).await)
}

/// Polls `done` every 5 ms until it holds: how long that took. Fails once
/// `within` has passed.
async fn until(within: Duration, what: &str, mut done: impl FnMut() -> bool) -> Duration {
    let start = Instant::now();
    loop {
        if done() {
            return start.elapsed();
        }
        assert!(start.elapsed() < within, "{what}: not within {within:?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Calls of `key` admitted by `limiter` before the first denial (at most
/// `max + 1` calls).
async fn admitted(limiter: &Limiter, key: &Key, max: u64) -> u64 {
    for n in 0..=max {
        if !limiter.check(key, 1).await.unwrap().is_allowed() {
            return n;
        }
    }
    panic!("{key:?}: more than {max} admitted");
}

/// Through `live`, sets the policy `marker` (which every instance of the
/// test has) to `text`, and waits until `marker` (another instance's
/// limiter of it) has it: that instance has then read every change made
/// before (it reads them all at once).
async fn barrier(live: &LivePolicies, marker: &Limiter, text: &str) -> Duration {
    let start = Instant::now();
    live.set_policy("marker", text).await.unwrap();
    let want = policy("marker", text);
    until(PROPAGATION, "the marker change", || marker.policy() == want).await;
    start.elapsed()
}

/// The fleet's changes as stored: the version, and the policies table.
async fn stored(server: &RedisServer) -> (Option<u64>, Vec<(String, String)>) {
    let mut conn = server.admin().await;
    let version: Option<u64> = conn
        .get(format!("{PREFIX}:{{live}}:version"))
        .await
        .unwrap();
    let mut policies: Vec<(String, String)> = conn
        .hgetall(format!("{PREFIX}:{{live}}:policies"))
        .await
        .unwrap();
    policies.sort();
    (version, policies)
}

#[tokio::test]
async fn a_change_through_one_instance_is_enforced_by_the_other_within_a_second() {
    let server = RedisServer::start();
    let (a, b) = (instance(&server).await, instance(&server).await);
    let api_a = a.limiter(policy("api", "1/h"));
    let api_b = b.limiter(policy("api", "1/h"));
    a.start().await.unwrap();
    b.start().await.unwrap();
    let bob = user("bob");
    assert!(api_b.check(&bob, 1).await.unwrap().is_allowed());
    // Denied, and remembered in b's deny cache.
    assert!(!api_b.check(&bob, 1).await.unwrap().is_allowed());

    let mut took = Vec::new();
    for burst in 2..=8 {
        let text = format!("1/h burst {burst}");
        let want = policy("api", &text);
        let start = Instant::now();
        assert_eq!(a.set_policy("api", &text).await.unwrap(), want);
        // The writer has it when the call returns.
        assert_eq!(api_a.policy(), want);
        until(PROPAGATION, &text, || api_b.policy() == want).await;
        took.push(start.elapsed());
        // Enforced by b at once: bob used burst - 1, so one more call,
        // past the denial b had cached under the old limits.
        assert!(api_b.check(&bob, 1).await.unwrap().is_allowed(), "{text}");
        assert!(!api_b.check(&bob, 1).await.unwrap().is_allowed(), "{text}");
        assert!(!api_a.check(&bob, 1).await.unwrap().is_allowed(), "{text}");
    }
    took.sort();
    let ms: Vec<u128> = took.iter().map(Duration::as_millis).collect();
    println!(
        "live propagation a -> b (poll 250 ms), ms sorted: {ms:?}; median {} ms, max {} ms",
        ms[ms.len() / 2],
        ms[ms.len() - 1]
    );
    assert!(took.iter().all(|t| *t <= PROPAGATION), "{took:?}");
    assert_eq!(b.policies()["api"], "1/h burst 8");
}

#[tokio::test]
async fn overrides_and_plans_are_the_fleets_and_decide_their_identities_only() {
    let server = RedisServer::start();
    let (a, b) = (instance(&server).await, instance(&server).await);
    let mut limiters = Vec::new();
    for live in [&a, &b] {
        let api = live.limiter(policy("api", "1/h"));
        let marker = live.limiter(policy("marker", "1/h"));
        // The same plan in both instances' code.
        live.define_plan("pro", policy("api", "5/h")).unwrap();
        live.start().await.unwrap();
        limiters.push((api, marker));
    }
    let [(api_a, _), (api_b, marker_b)] = &limiters[..] else {
        unreachable!()
    };
    let (alice, bob, carol, dave) = (user("alice"), user("bob"), user("carol"), user("dave"));
    a.set_override("api", &alice, Some("3/h")).await.unwrap();
    a.assign_plan(&bob, Some("pro")).await.unwrap();
    // A plan b never heard of, defined at run time.
    a.set_plan("team", "api", Some("4/h")).await.unwrap();
    a.assign_plan(&dave, Some("team")).await.unwrap();
    let took = barrier(&a, marker_b, "2/h").await;
    println!("overrides and plans a -> b: {} ms", took.as_millis());

    assert_eq!(admitted(api_b, &alice, 10).await, 3);
    assert_eq!(admitted(api_b, &bob, 10).await, 5);
    assert_eq!(admitted(api_b, &dave, 10).await, 4);
    assert_eq!(admitted(api_b, &carol, 10).await, 1);
    assert_eq!(admitted(api_b, &user("erin"), 10).await, 1);
    // The state is the fleet's: a has nothing left for them either.
    for key in [&alice, &bob, &dave, &carol] {
        assert!(!api_a.check(key, 1).await.unwrap().is_allowed(), "{key:?}");
    }
    assert_eq!(b.policies()["api"], "1/h");

    // Taken away through b, seen by a.
    b.set_override("api", &alice, None).await.unwrap();
    b.assign_plan(&bob, None).await.unwrap();
    a.set_override("api", &user("frank"), Some("2/h"))
        .await
        .unwrap();
    barrier(&b, &limiters[0].1, "3/h").await;
    assert_eq!(admitted(api_a, &user("frank"), 10).await, 2);
    // Back under the policy, with their state: refused.
    assert_eq!(admitted(api_a, &alice, 10).await, 0);
    assert_eq!(admitted(api_a, &bob, 10).await, 0);
}

#[tokio::test]
async fn a_reset_unblocks_on_every_instance_past_their_deny_caches() {
    let server = RedisServer::start();
    let store_b = store(&server, Duration::from_secs(2)).await;
    let a = instance(&server).await;
    let b = LivePolicies::new(store_b.clone());
    let (api_a, search_a) = (
        a.limiter(policy("api", "2/h")),
        a.limiter(policy("search", "1/h")),
    );
    let (api_b, search_b) = (
        b.limiter(policy("api", "2/h")),
        b.limiter(policy("search", "1/h")),
    );
    // One lease at a time per identity, fleet-wide.
    let jobs = |live: &LivePolicies, store: RedisStore| {
        let policy = ConcurrencyPolicy::builder("jobs", 1)
            .lease_ttl(Duration::from_secs(60))
            .build()
            .unwrap();
        live.concurrency(ConcurrencyLimiter::new(policy, store))
    };
    let jobs_a = jobs(&a, store(&server, Duration::from_secs(2)).await);
    let jobs_b = jobs(&b, store_b.clone());
    a.start().await.unwrap();
    b.start().await.unwrap();
    let (bob, carol) = (user("bob"), user("carol"));
    let Admission::Acquired(held) = jobs_b.acquire(&bob).await.unwrap() else {
        panic!("the first lease is free");
    };
    assert!(matches!(
        jobs_a.acquire(&bob).await.unwrap(),
        Admission::Refused(_)
    ));
    for key in [&bob, &carol] {
        assert_eq!(admitted(&api_b, key, 5).await, 2);
        assert_eq!(admitted(&search_b, key, 5).await, 1);
        assert!(!api_a.check(key, 1).await.unwrap().is_allowed());
    }
    // b refuses bob from its deny cache, without asking Redis.
    let hits = store_b.deny_cache_stats().hits;
    assert!(!api_b.check(&bob, 1).await.unwrap().is_allowed());
    assert_eq!(store_b.deny_cache_stats().hits, hits + 1);

    // One policy, through a.
    a.reset(&bob, Some("api")).await.unwrap();
    assert!(api_a.check(&bob, 1).await.unwrap().is_allowed());
    let start = Instant::now();
    loop {
        if api_b.check(&bob, 1).await.unwrap().is_allowed() {
            break;
        }
        assert!(start.elapsed() < PROPAGATION, "b kept refusing bob");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    println!("reset a -> b: {} ms", start.elapsed().as_millis());
    // One call each: bob's 2 are used again, fleet-wide.
    assert!(!api_a.check(&bob, 1).await.unwrap().is_allowed());
    assert!(!api_b.check(&bob, 1).await.unwrap().is_allowed());
    assert!(!search_a.check(&bob, 1).await.unwrap().is_allowed());
    assert!(!search_b.check(&bob, 1).await.unwrap().is_allowed());
    assert!(!api_b.check(&carol, 1).await.unwrap().is_allowed());
    assert!(matches!(
        jobs_a.acquire(&bob).await.unwrap(),
        Admission::Refused(_)
    ));

    // Every policy, through b: a forgets its cached denials too.
    let hits = store_b.deny_cache_stats().hits;
    assert!(!api_b.check(&bob, 1).await.unwrap().is_allowed());
    assert_eq!(store_b.deny_cache_stats().hits, hits + 1);
    b.reset(&bob, None).await.unwrap();
    let start = Instant::now();
    loop {
        if search_a.check(&bob, 1).await.unwrap().is_allowed() {
            break;
        }
        assert!(start.elapsed() < PROPAGATION, "a kept refusing bob");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(admitted(&api_a, &bob, 5).await, 2);
    assert!(!search_b.check(&bob, 1).await.unwrap().is_allowed());
    // b's lease is gone: a takes the one slot, and b's guard, dropped,
    // frees nothing of it.
    assert_eq!(server.leases_held().await, 0);
    let Admission::Acquired(_taken) = jobs_a.acquire(&bob).await.unwrap() else {
        panic!("bob's lease was not dropped");
    };
    drop(held);
    jobs_b.releases_settled().await;
    assert_eq!(server.leases_held().await, 1);
    assert!(matches!(
        jobs_b.acquire(&bob).await.unwrap(),
        Admission::Refused(_)
    ));
    assert!(!api_a.check(&carol, 1).await.unwrap().is_allowed());
    assert!(!search_a.check(&carol, 1).await.unwrap().is_allowed());
}

#[tokio::test]
async fn a_restarted_instance_starts_with_the_fleets_changes() {
    let server = RedisServer::start();
    let (a, b) = (instance(&server).await, instance(&server).await);
    for live in [&a, &b] {
        live.limiter(policy("api", "1/h"));
        live.start().await.unwrap();
    }
    a.set_policy("api", "3/h").await.unwrap();
    a.set_plan("pro", "api", Some("5/h")).await.unwrap();
    a.set_override("api", &user("alice"), Some("2/h"))
        .await
        .unwrap();
    a.assign_plan(&user("bob"), Some("pro")).await.unwrap();
    // Stored under the store's prefix.
    let (version, policies) = stored(&server).await;
    assert_eq!(version, Some(4));
    assert_eq!(policies, [("api".to_owned(), "3/h".to_owned())]);
    drop(b);

    // b again, new: its code says 1/h, the fleet says 3/h.
    let b = instance(&server).await;
    let api = b.limiter(policy("api", "1/h"));
    assert_eq!(api.policy(), policy("api", "1/h"));
    b.start().await.unwrap();
    // Read before `start` returns, not at the first poll.
    assert_eq!(api.policy(), policy("api", "3/h"));
    assert_eq!(admitted(&api, &user("alice"), 10).await, 2);
    assert_eq!(admitted(&api, &user("bob"), 10).await, 5);
    assert_eq!(admitted(&api, &user("carol"), 10).await, 3);
}

#[tokio::test]
async fn a_broken_text_changes_nothing_in_the_fleet() {
    let server = RedisServer::start();
    let (a, b) = (instance(&server).await, instance(&server).await);
    let api_a = a.limiter(policy("api", "1/h"));
    let api_b = b.limiter(policy("api", "1/h"));
    a.start().await.unwrap();
    b.start().await.unwrap();
    a.set_policy("api", "2/h").await.unwrap();
    until(PROPAGATION, "2/h", || {
        api_b.policy() == policy("api", "2/h")
    })
    .await;
    let before = stored(&server).await;
    let bob = user("bob");

    for text in ["", "2/hx", "lots", "2/h burst", "10/s fixed burst 5"] {
        let err = a.set_policy("api", text).await.unwrap_err();
        assert!(
            matches!(err, LiveError::Parse(_) | LiveError::Config(_)),
            "{text:?}: {err:?}"
        );
        let err = b.set_override("api", &bob, Some(text)).await.unwrap_err();
        assert!(
            matches!(err, LiveError::Parse(_) | LiveError::Config(_)),
            "{text:?}: {err:?}"
        );
        let err = b.set_plan("pro", "api", Some(text)).await.unwrap_err();
        assert!(
            matches!(err, LiveError::Parse(_) | LiveError::Config(_)),
            "{text:?}: {err:?}"
        );
    }
    // Nothing written (not even the version moved), nothing applied.
    assert_eq!(stored(&server).await, before);
    let mut conn = server.admin().await;
    let tables: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{PREFIX}:{{live}}:*"))
        .query_async(&mut conn)
        .await
        .unwrap();
    let tables: BTreeSet<String> = tables.into_iter().collect();
    let want: BTreeSet<String> = ["version", "policies", "instances"]
        .iter()
        .map(|t| format!("{PREFIX}:{{live}}:{t}"))
        .collect();
    assert_eq!(tables, want);
    assert_eq!(api_a.policy(), policy("api", "2/h"));
    assert_eq!(api_b.policy(), policy("api", "2/h"));
    assert_eq!(admitted(&api_b, &bob, 5).await, 2);
}

/// A text in Redis that no longer parses (written by an operator's tool,
/// or a newer version): skipped, the previous limits kept, no panic; the
/// next valid change applies as usual.
#[tokio::test]
async fn a_stored_text_that_no_longer_parses_keeps_the_previous_limits() {
    let server = RedisServer::start();
    let (a, b) = (instance(&server).await, instance(&server).await);
    let mut limiters = Vec::new();
    for live in [&a, &b] {
        limiters.push((
            live.limiter(policy("api", "1/h")),
            live.limiter(policy("marker", "1/h")),
        ));
        live.start().await.unwrap();
    }
    let [(api_a, _), (api_b, marker_b)] = &limiters[..] else {
        unreachable!()
    };
    let (alice, bob) = (user("alice"), user("bob"));
    a.set_policy("api", "1/h burst 2").await.unwrap();
    a.set_override("api", &alice, Some("1/h burst 4"))
        .await
        .unwrap();
    a.set_plan("pro", "api", Some("1/h burst 3")).await.unwrap();
    a.assign_plan(&bob, Some("pro")).await.unwrap();
    barrier(&a, marker_b, "2/h").await;

    let mut conn = server.admin().await;
    let table = |t: &str| format!("{PREFIX}:{{live}}:{t}");
    let _: () = conn
        .hset(table("policies"), "api", "2/h burst many")
        .await
        .unwrap();
    let _: () = conn
        .hset(table("overrides"), "api user:alice", "\u{0}\u{ff}garbage")
        .await
        .unwrap();
    let _: () = conn.hset(table("plans"), "pro api", "3/zz").await.unwrap();
    let _: () = conn
        .hset(table("overrides"), "nospace", "1/h")
        .await
        .unwrap();
    // And a valid change alongside, to know when b has read it all.
    let _: () = conn.hset(table("policies"), "marker", "3/h").await.unwrap();
    let _: u64 = conn.incr(table("version"), 1).await.unwrap();
    let want = policy("marker", "3/h");
    until(PROPAGATION, "the operator's change", || {
        marker_b.policy() == want
    })
    .await;

    for (api, live) in [(api_b, &b), (api_a, &a)] {
        live.refresh().await.unwrap();
        assert_eq!(api.policy(), policy("api", "1/h burst 2"));
    }
    assert_eq!(admitted(api_b, &user("carol"), 10).await, 2);
    assert_eq!(admitted(api_b, &alice, 10).await, 4);
    assert_eq!(admitted(api_b, &bob, 10).await, 3);

    // Still following: the next valid change applies.
    a.set_policy("api", "1/h burst 6").await.unwrap();
    until(PROPAGATION, "the next change", || {
        api_b.policy() == policy("api", "1/h burst 6")
    })
    .await;
    assert_eq!(admitted(api_b, &user("dave"), 10).await, 6);

    // An instance starting now has no previous limits: its own.
    let c = instance(&server).await;
    let (api_c, marker_c) = (
        c.limiter(policy("api", "1/h")),
        c.limiter(policy("marker", "1/h")),
    );
    let _: () = conn
        .hset(table("policies"), "api", "2/h burst many")
        .await
        .unwrap();
    c.start().await.unwrap();
    assert_eq!(api_c.policy(), policy("api", "1/h"));
    assert_eq!(marker_c.policy(), policy("marker", "3/h"));
}

#[tokio::test]
async fn instances_are_listed_from_their_heartbeats() {
    let server = RedisServer::start();
    let a = instance(&server).await.address("10.0.0.1:8080");
    let b = instance(&server).await.address("10.0.0.2:8080");
    let before = SystemTime::now();
    a.start().await.unwrap();
    b.start().await.unwrap();
    // b saw a at once; a sees b at its next heartbeat (every second).
    until(Duration::from_secs(5), "two instances", || {
        a.instances().len() == 2 && b.instances().len() == 2
    })
    .await;
    let (seen_a, seen_b) = (a.instances(), b.instances());
    let ids: BTreeSet<&str> = seen_a.iter().map(|i| i.id.as_str()).collect();
    assert_eq!(ids.len(), 2, "{seen_a:?}");
    assert!(ids.iter().all(|id| !id.is_empty()));
    assert_eq!(
        ids,
        seen_b
            .iter()
            .map(|i| i.id.as_str())
            .collect::<BTreeSet<_>>()
    );
    let addresses: BTreeSet<&str> = seen_a.iter().map(|i| i.address.as_str()).collect();
    assert_eq!(
        addresses,
        BTreeSet::from(["10.0.0.1:8080", "10.0.0.2:8080"])
    );
    let slack = Duration::from_secs(5);
    for i in &seen_a {
        assert!(i.started + slack >= before, "{i:?}");
        assert!(i.started <= i.last_seen + slack, "{i:?}");
        assert!(i.last_seen <= SystemTime::now() + slack, "{i:?}");
    }
    assert_eq!(a.instance_count(), 2);

    // b goes: a stops counting it within the live window (3 s).
    drop(b);
    until(Duration::from_secs(10), "b forgotten", || {
        a.instances().len() == 1
    })
    .await;
    assert_eq!(a.instances()[0].address, "10.0.0.1:8080");
    assert_eq!(a.instance_count(), 1);
}

/// Each instance publishes its concurrency limit with its heartbeat: a
/// fleet shedder following the fleet's limit sees the sum of the live
/// instances' (3 + 5), its tiers' limits scale with it, and it falls back
/// to this instance's own once the other is gone.
#[tokio::test]
async fn a_fleet_limit_is_the_sum_of_the_live_instances_limits() {
    use fleetgate::shed::{FleetShedPolicy, FleetShedder, Tiers};

    let server = RedisServer::start();
    let (a, b) = (instance(&server).await, instance(&server).await);
    let limiter = |n| {
        ConcurrencyLimiter::new(
            ConcurrencyPolicy::new("backend", n).unwrap(),
            fleetgate::MemoryStore::new(),
        )
    };
    let (own_a, own_b) = (limiter(3), limiter(5));
    let (fleet_a, fleet_b) = (a.fleet_limit(&own_a), b.fleet_limit(&own_b));
    let shedder = FleetShedder::new(
        FleetShedPolicy::new("fleet", 100).unwrap(),
        store(&server, Duration::from_secs(2)).await,
    )
    .capacity_from(fleet_a.clone());
    assert_eq!(shedder.capacity(), 3, "alone before any heartbeat");
    a.start().await.unwrap();
    b.start().await.unwrap();
    until(Duration::from_secs(5), "3 + 5", || {
        fleet_a.get() == 8 && fleet_b.get() == 8
    })
    .await;
    assert_eq!((fleet_a.own(), fleet_b.own()), (3, 5));
    assert_eq!(shedder.capacity(), 8);
    let low = Tiers::default().get("low").unwrap();
    let state = shedder.state();
    assert_eq!(
        state.tier("low").and_then(|t| t.limit()),
        Some(4),
        "half of 8"
    );
    assert_eq!(shedder.policy().limit_at(low, 8), Some(4));

    drop(b);
    until(Duration::from_secs(10), "b forgotten", || {
        fleet_a.get() == 3
    })
    .await;
    assert_eq!(shedder.capacity(), 3);
}

/// Redis gone (hung, then not there at all): every change fails with a
/// store error within the store's timeout, and nothing changes locally.
/// (Timing-bound, but with a generous bound: shared.)
#[tokio::test]
async fn a_change_while_redis_is_gone_fails_within_the_timeout_and_changes_nothing() {
    let server = RedisServer::start();
    let timeout = Duration::from_millis(500);
    let a = LivePolicies::new(store(&server, timeout).await);
    let api = a.limiter(policy("api", "1/h"));
    a.define_plan("pro", policy("api", "5/h")).unwrap();
    a.start().await.unwrap();
    let (alice, bob) = (user("alice"), user("bob"));
    a.set_override("api", &alice, Some("3/h")).await.unwrap();
    let before = a.policies();

    server.pause();
    let bound = timeout + Duration::from_millis(1500);
    let store_error = |what: &str, start: Instant, result: Result<(), LiveError>| {
        let took = start.elapsed();
        assert!(
            matches!(result, Err(LiveError::Store(_))),
            "{what}: {result:?}"
        );
        assert!(took <= bound, "{what}: {took:?}");
    };
    let t = Instant::now();
    store_error("set_policy", t, a.set_policy("api", "9/h").await.map(drop));
    let t = Instant::now();
    store_error("restore_policy", t, a.restore_policy("api").await.map(drop));
    let t = Instant::now();
    let result = a.set_override("api", &alice, Some("7/h")).await;
    store_error("set_override", t, result);
    let t = Instant::now();
    store_error(
        "remove override",
        t,
        a.set_override("api", &alice, None).await,
    );
    let t = Instant::now();
    store_error("assign_plan", t, a.assign_plan(&bob, Some("pro")).await);
    let t = Instant::now();
    let result = a.set_plan("pro", "api", Some("6/h")).await;
    store_error("set_plan", t, result);
    let t = Instant::now();
    store_error("reset", t, a.reset(&alice, None).await);
    assert_eq!(a.policies(), before);
    assert_eq!(api.policy(), policy("api", "1/h"));
    // Nor later: the poll fails too while Redis hangs.
    let poll = Instant::now();
    while poll.elapsed() < Duration::from_secs(1) {
        assert_eq!(a.policies(), before);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Not resumed: a hung Redis that wakes runs the writes it was sent
    // (a timed-out write is ambiguous, as any timed-out call).
    server.stop();

    // A store whose Redis is not there at all.
    let gone = LivePolicies::new(common::unreachable_store(timeout).await);
    let api = gone.limiter(policy("api", "1/h"));
    assert!(gone.start().await.is_err());
    let t = Instant::now();
    store_error(
        "set_policy",
        t,
        gone.set_policy("api", "9/h").await.map(drop),
    );
    assert_eq!(api.policy(), policy("api", "1/h"));
    assert_eq!(gone.policies()["api"], "1/h");
}

/// An instance started while Redis is down keeps trying, and follows the
/// fleet's changes once Redis is there.
#[tokio::test]
async fn an_instance_started_while_redis_is_down_follows_once_it_is_back() {
    let port = common::redis_server::free_port();
    let early = LivePolicies::new(
        RedisStore::builder(format!("redis://127.0.0.1:{port}"))
            .prefix(PREFIX)
            .timeout(Duration::from_millis(500))
            .lazy()
            .connect()
            .await
            .unwrap(),
    );
    let api = early.limiter(policy("api", "1/h"));
    assert!(early.start().await.is_err());
    assert_eq!(api.policy(), policy("api", "1/h"));

    let server = RedisServer::start_on(port).expect("a server on the free port");
    let other = instance(&server).await;
    other.limiter(policy("api", "1/h"));
    other.start().await.unwrap();
    other.set_policy("api", "4/h").await.unwrap();
    let want = policy("api", "4/h");
    until(
        Duration::from_secs(10),
        "the change, once Redis is back",
        || api.policy() == want,
    )
    .await;
    until(Duration::from_secs(10), "both heartbeats", || {
        early.instance_count() == 2
    })
    .await;
}

/// A version that is not a number (written by hand): changes fail with a
/// store error and the limits stay, no panic; once it is a number again,
/// changes flow.
#[tokio::test]
async fn a_hand_written_version_that_is_not_a_number_stops_nothing_else() {
    let server = RedisServer::start();
    let (a, b) = (instance(&server).await, instance(&server).await);
    let api_a = a.limiter(policy("api", "1/h"));
    let api_b = b.limiter(policy("api", "1/h"));
    a.start().await.unwrap();
    b.start().await.unwrap();
    a.set_policy("api", "2/h").await.unwrap();
    until(PROPAGATION, "2/h", || {
        api_b.policy() == policy("api", "2/h")
    })
    .await;

    let mut conn = server.admin().await;
    let version = format!("{PREFIX}:{{live}}:version");
    let _: () = conn.set(&version, "not a number").await.unwrap();
    let err = a.set_policy("api", "3/h").await.unwrap_err();
    assert!(matches!(err, LiveError::Store(_)), "{err:?}");
    assert!(b.refresh().await.is_err());
    assert_eq!(api_a.policy(), policy("api", "2/h"));
    assert_eq!(api_b.policy(), policy("api", "2/h"));
    assert_eq!(admitted(&api_b, &user("bob"), 5).await, 2);

    let _: () = conn.set(&version, 100).await.unwrap();
    a.set_policy("api", "3/h").await.unwrap();
    until(PROPAGATION, "3/h", || {
        api_b.policy() == policy("api", "3/h")
    })
    .await;
}

/// Writers racing on one instance: once they all returned, the instance
/// has what Redis has (with no poll to mend it later). Each write reads
/// the changes back; a snapshot read earlier was applied over a later one
/// in 0 to 3 rounds of 1000 (2 runs of 3 failed) before refreshes took
/// turns.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_writers_leave_the_instance_with_the_last_change() {
    let server = RedisServer::start();
    let a = LivePolicies::new(store(&server, Duration::from_secs(2)).await)
        .poll_every(Duration::from_secs(3600));
    let api = a.limiter(policy("api", "1/h"));
    a.start().await.unwrap();
    let mut conn = server.admin().await;
    let mut stale = 0;
    for round in 0..2000u64 {
        let writers: Vec<_> = (0..4u64)
            .map(|w| {
                let a = a.clone();
                let text = format!("1/h burst {}", (round * 4 + w) % 50 + 2);
                tokio::spawn(async move { a.set_policy("api", &text).await.map(drop) })
            })
            .collect();
        for writer in writers {
            writer.await.unwrap().unwrap();
        }
        let stored: String = conn
            .hget(format!("{PREFIX}:{{live}}:policies"), "api")
            .await
            .unwrap();
        if api.policy() != policy("api", &stored) {
            stale += 1;
        }
    }
    assert_eq!(stale, 0, "rounds left with a stale policy");
}
