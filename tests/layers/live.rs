//! Live policies on the memory store, as a service sees them: a change
//! applies to the next decision of every clone of the limiter and of the
//! layers built on it (headers included); refused changes (a broken text,
//! an unknown policy, a renamed one) change nothing; overrides, assigned
//! plans and the plan a request names decide only their identities, in
//! that order before the policy; state carries over a change of limits
//! but not of algorithm; a reset of one policy or all unblocks.
use std::convert::Infallible;

use axum::body::Body;
use fleetgate::concurrency::{Admission, ConcurrencyLimiter, ConcurrencyPolicy};
use fleetgate::key::{Key, key_fn};
use fleetgate::live::{LiveError, LivePolicies, Plan};
use fleetgate::spec::PolicySpec;
use fleetgate::{ConfigError, Limiter, MemoryStore, Policy, RateLimitLayer};
use http::{Request, Response, StatusCode};
use tower::util::BoxCloneService;
use tower::{Layer, ServiceExt};

fn policy(name: &str, text: &str) -> Policy {
    text.parse::<PolicySpec>().unwrap().build(name).unwrap()
}

fn user(name: &str) -> Key {
    Key::new(format!("user:{name}"))
}

/// A service limited by `limiter`, each request keyed by its `x-user`.
///
/// Built once, as a server builds its service: an axum `Router` called
/// directly, as tests do, layered its route anew for each request here,
/// which hid what the layer keeps between requests (a plan defined since
/// was missed by the first request naming it).
fn app(limiter: Limiter) -> App {
    let by_user = key_fn(|req: &Request<Body>| {
        let name = req.headers().get("x-user")?.to_str().ok()?;
        Some(user(name))
    });
    let ok = tower::service_fn(|_: Request<Body>| async {
        Ok::<_, Infallible>(Response::new(Body::from("ok")))
    });
    BoxCloneService::new(RateLimitLayer::new(limiter).key(by_user).layer(ok))
}

type App = BoxCloneService<Request<Body>, Response<Body>, Infallible>;

/// One request of `name`, naming `plan` if any: its status and the quota
/// its `RateLimit-Policy` header advertises (`q=`).
async fn call(app: &App, name: &str, plan: Option<&str>) -> (StatusCode, u64) {
    let mut req = Request::get("/")
        .header("x-user", name)
        .body(Body::empty())
        .unwrap();
    if let Some(plan) = plan {
        req.extensions_mut().insert(Plan::new(plan));
    }
    let response = app.clone().oneshot(req).await.unwrap();
    let header = response
        .headers()
        .get("ratelimit-policy")
        .unwrap_or_else(|| panic!("no RateLimit-Policy in {:?}", response.headers()))
        .to_str()
        .unwrap()
        .to_owned();
    let quota = header
        .split(";q=")
        .nth(1)
        .and_then(|v| v.split(';').next())
        .and_then(|q| q.parse().ok())
        .unwrap_or_else(|| panic!("no quota in {header:?}"));
    (response.status(), quota)
}

/// Requests of `name` admitted through `app` before the first refusal
/// (at most `max + 1` requests), each advertising `quota`.
async fn admitted_via(app: &App, name: &str, plan: Option<&str>, quota: u64, max: u64) -> u64 {
    for n in 0..=max {
        let (status, q) = call(app, name, plan).await;
        assert_eq!(q, quota, "{name} (plan {plan:?}): request {n}");
        if status == StatusCode::TOO_MANY_REQUESTS {
            return n;
        }
        assert_eq!(status, StatusCode::OK);
    }
    panic!("{name}: more than {max} admitted");
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

#[tokio::test]
async fn a_change_applies_to_every_clone_and_through_the_layer() {
    let live = LivePolicies::new(MemoryStore::new());
    let limiter = live.limiter(policy("api", "2/h"));
    let clone = limiter.clone();
    // Asking again by name gives the same limiter, whatever policy is given.
    let again = live.limiter(policy("api", "50/h"));
    let app = app(limiter.clone());
    live.start().await.unwrap();
    let bob = user("bob");

    assert_eq!(call(&app, "carol", None).await, (StatusCode::OK, 2));
    assert_eq!(admitted(&limiter, &bob, 5).await, 2);
    assert!(!clone.check(&bob, 1).await.unwrap().is_allowed());

    let now = live.set_policy("api", "2/h burst 5").await.unwrap();
    assert_eq!(now, policy("api", "2/h burst 5"));
    assert_eq!(live.policies()["api"], "2/h burst 5");
    for l in [&limiter, &clone, &again] {
        assert_eq!(l.policy(), policy("api", "2/h burst 5"));
    }
    // The next decision, on any clone: bob used 2 of 5 (GCRA: the
    // same rate, so the same count).
    assert!(clone.check(&bob, 1).await.unwrap().is_allowed());
    assert!(again.check(&bob, 1).await.unwrap().is_allowed());
    assert!(limiter.check(&bob, 1).await.unwrap().is_allowed());
    assert!(!clone.check(&bob, 1).await.unwrap().is_allowed());
    // The layer decides and advertises the new quota; carol used 1 of 5.
    assert_eq!(admitted_via(&app, "carol", None, 5, 10).await, 4);

    // And back to the default from code.
    assert_eq!(
        live.restore_policy("api").await.unwrap(),
        policy("api", "2/h")
    );
    assert_eq!(call(&app, "dave", None).await, (StatusCode::OK, 2));
}

/// `Limiter::set_policy` on a limiter of its own, no `LivePolicies`.
#[tokio::test]
async fn set_policy_reaches_clones_and_layers_and_refuses_a_rename() {
    let limiter = Limiter::in_memory(policy("api", "1/h"));
    let clone = limiter.clone();
    let app = app(limiter.clone());
    assert_eq!(admitted_via(&app, "bob", None, 1, 5).await, 1);

    limiter.set_policy(policy("api", "1/h burst 3")).unwrap();
    assert_eq!(clone.policy(), policy("api", "1/h burst 3"));
    assert_eq!(admitted_via(&app, "bob", None, 3, 5).await, 2);

    let err = clone.set_policy(policy("other", "100/h")).unwrap_err();
    assert!(
        matches!(&err, ConfigError::PolicyRenamed { name, new } if name == "api" && new == "other"),
        "{err:?}"
    );
    assert_eq!(limiter.policy(), policy("api", "1/h burst 3"));
    assert_eq!(call(&app, "carol", None).await, (StatusCode::OK, 3));
}

#[tokio::test]
async fn a_broken_text_or_an_unknown_policy_changes_nothing() {
    let live = LivePolicies::new(MemoryStore::new());
    let limiter = live.limiter(policy("api", "1/h"));
    live.define_plan("pro", policy("api", "3/h")).unwrap();
    live.start().await.unwrap();
    let app = app(limiter.clone());
    let bob = user("bob");
    assert_eq!(admitted(&limiter, &bob, 5).await, 1);

    for text in [
        "",
        "5/hx",
        "five per hour",
        "5/h burst",
        "5/h + ",
        "10/s fixed burst 5",
    ] {
        let err = live.set_policy("api", text).await.unwrap_err();
        assert!(
            matches!(err, LiveError::Parse(_) | LiveError::Config(_)),
            "{text:?}: {err:?}"
        );
        let err = live
            .set_override("api", &bob, Some(text))
            .await
            .unwrap_err();
        assert!(
            matches!(err, LiveError::Parse(_) | LiveError::Config(_)),
            "{text:?}: {err:?}"
        );
        let err = live.set_plan("pro", "api", Some(text)).await.unwrap_err();
        assert!(
            matches!(err, LiveError::Parse(_) | LiveError::Config(_)),
            "{text:?}: {err:?}"
        );
    }
    // A syntax error is a parse error, naming the offending text.
    match live.set_policy("api", "5/hx").await {
        Err(LiveError::Parse(err)) => assert_eq!(err.fragment(), "hx"),
        other => panic!("{other:?}"),
    }

    let unknown = |err: LiveError| match err {
        LiveError::Config(ConfigError::UnknownPolicy { name }) => assert_eq!(name, "nope"),
        other => panic!("{other:?}"),
    };
    unknown(live.set_policy("nope", "5/h").await.unwrap_err());
    unknown(live.restore_policy("nope").await.unwrap_err());
    unknown(
        live.set_override("nope", &bob, Some("5/h"))
            .await
            .unwrap_err(),
    );
    unknown(live.set_override("nope", &bob, None).await.unwrap_err());
    unknown(live.set_plan("pro", "nope", Some("5/h")).await.unwrap_err());
    unknown(live.set_plan("pro", "nope", None).await.unwrap_err());
    unknown(live.reset(&bob, Some("nope")).await.unwrap_err());
    match live.assign_plan(&bob, Some("platinum")).await.unwrap_err() {
        LiveError::Config(ConfigError::UnknownPlan { name }) => assert_eq!(name, "platinum"),
        other => panic!("{other:?}"),
    }

    // Nothing changed: the policy, bob's state, and the limits of others.
    assert_eq!(live.policies()["api"], "1/h");
    assert_eq!(limiter.policy(), policy("api", "1/h"));
    assert!(!limiter.check(&bob, 1).await.unwrap().is_allowed());
    assert_eq!(admitted_via(&app, "carol", None, 1, 5).await, 1);
    // The plan still has its limits from code.
    assert_eq!(admitted_via(&app, "dave", Some("pro"), 3, 5).await, 3);
}

#[tokio::test]
async fn an_override_and_an_assigned_plan_decide_that_identity_only() {
    let live = LivePolicies::new(MemoryStore::new());
    let api = live.limiter(policy("api", "1/h"));
    let search = live.limiter(policy("search", "1/h"));
    // The plan has limits for `api` only: `search` keeps its own.
    live.define_plan("pro", policy("api", "5/h")).unwrap();
    live.start().await.unwrap();
    let app = app(api.clone());
    let (alice, bob) = (user("alice"), user("bob"));

    live.set_override("api", &alice, Some("3/h")).await.unwrap();
    live.assign_plan(&bob, Some("pro")).await.unwrap();
    assert_eq!(admitted_via(&app, "alice", None, 3, 10).await, 3);
    assert_eq!(admitted_via(&app, "bob", None, 5, 10).await, 5);
    assert_eq!(admitted_via(&app, "carol", None, 1, 10).await, 1);
    assert_eq!(admitted(&api, &user("dave"), 10).await, 1);
    // Only `api`, where the override and the plan are.
    assert_eq!(admitted(&search, &alice, 10).await, 1);
    assert_eq!(admitted(&search, &bob, 10).await, 1);
    // The policy itself is untouched.
    assert_eq!(live.policies()["api"], "1/h");

    // Taken away: the policy decides again (their state kept, so denied).
    live.set_override("api", &alice, None).await.unwrap();
    live.assign_plan(&bob, None).await.unwrap();
    assert_eq!(admitted_via(&app, "alice", None, 1, 10).await, 0);
    assert_eq!(admitted_via(&app, "bob", None, 1, 10).await, 0);
    assert_eq!(admitted_via(&app, "erin", None, 1, 10).await, 1);

    // A plan defined at run time, assigned.
    live.set_plan("team", "api", Some("4/h")).await.unwrap();
    live.assign_plan(&user("frank"), Some("team"))
        .await
        .unwrap();
    assert_eq!(admitted_via(&app, "frank", None, 4, 10).await, 4);
}

#[tokio::test]
async fn a_request_naming_its_plan_gets_the_plans_limits() {
    let live = LivePolicies::new(MemoryStore::new());
    let api = live.limiter(policy("api", "1/h"));
    let app = app(api.clone());
    live.start().await.unwrap();

    // No plan defined for `api` yet: the request's plan is not looked at.
    assert_eq!(admitted_via(&app, "alice", Some("pro"), 1, 5).await, 1);

    live.define_plan("pro", policy("api", "4/h")).unwrap();
    assert_eq!(admitted_via(&app, "bob", Some("pro"), 4, 10).await, 4);
    assert_eq!(admitted_via(&app, "carol", None, 1, 10).await, 1);
    // A plan without limits here: the policy's.
    assert_eq!(admitted_via(&app, "dave", Some("gold"), 1, 10).await, 1);
    // A limiter called directly knows no request: the policy's limits.
    assert_eq!(admitted(&api, &user("erin"), 10).await, 1);

    // A plan changed at run time: the next request has its new limits.
    live.set_plan("pro", "api", Some("6/h")).await.unwrap();
    assert_eq!(admitted_via(&app, "frank", Some("pro"), 6, 10).await, 6);
    // Removed at run time: the one from code is back.
    live.set_plan("pro", "api", None).await.unwrap();
    assert_eq!(admitted_via(&app, "grace", Some("pro"), 4, 10).await, 4);
}

/// An override beats the assigned plan, which beats the request's plan,
/// which beats the policy: one identity for each step down.
#[tokio::test]
async fn override_beats_assigned_plan_beats_request_plan_beats_policy() {
    let live = LivePolicies::new(MemoryStore::new());
    let api = live.limiter(policy("api", "1/h"));
    live.define_plan("gold", policy("api", "6/h")).unwrap();
    live.define_plan("silver", policy("api", "4/h")).unwrap();
    let app = app(api);
    live.start().await.unwrap();
    for name in ["ann", "ben"] {
        live.assign_plan(&user(name), Some("gold")).await.unwrap();
    }
    live.set_override("api", &user("ann"), Some("2/h"))
        .await
        .unwrap();

    let silver = Some("silver");
    assert_eq!(admitted_via(&app, "ann", silver, 2, 10).await, 2);
    assert_eq!(admitted_via(&app, "ben", silver, 6, 10).await, 6);
    assert_eq!(admitted_via(&app, "cat", silver, 4, 10).await, 4);
    assert_eq!(admitted_via(&app, "dan", None, 1, 10).await, 1);
}

/// A change of limits keeps every identity's state, read under the new
/// limits; identities whose limits did not change decide as before.
#[tokio::test]
async fn state_carries_over_a_change_of_limits() {
    let live = LivePolicies::new(MemoryStore::new());
    let api = live.limiter(policy("api", "3/h"));
    let other = live.limiter(policy("other", "3/h"));
    live.start().await.unwrap();
    let (alice, bob) = (user("alice"), user("bob"));
    live.set_override("api", &alice, Some("2/h")).await.unwrap();
    assert_eq!(admitted(&api, &alice, 10).await, 2);
    assert_eq!(admitted(&other, &alice, 10).await, 3);
    assert!(api.check(&bob, 1).await.unwrap().is_allowed());
    assert!(api.check(&bob, 1).await.unwrap().is_allowed());

    live.set_policy("api", "3/h burst 6").await.unwrap();
    // alice's own limits did not change: still refused.
    assert!(!api.check(&alice, 1).await.unwrap().is_allowed());
    assert!(!other.check(&alice, 1).await.unwrap().is_allowed());
    // bob used 2: 4 more of the new 6, not a fresh 6.
    assert_eq!(admitted(&api, &bob, 10).await, 4);
}

/// A change of algorithm starts fresh state for the policy; each
/// algorithm keeps its own, so going back finds the old one.
#[tokio::test]
async fn a_change_of_algorithm_starts_fresh_state() {
    let live = LivePolicies::new(MemoryStore::new());
    let api = live.limiter(policy("api", "2/h"));
    live.start().await.unwrap();
    let bob = user("bob");
    assert_eq!(admitted(&api, &bob, 10).await, 2);
    for algorithm in ["sliding-log", "sliding-window", "fixed-window"] {
        live.set_policy("api", &format!("2/h {algorithm}"))
            .await
            .unwrap();
        assert_eq!(admitted(&api, &bob, 10).await, 2, "{algorithm}");
    }
    live.set_policy("api", "2/h").await.unwrap();
    assert_eq!(admitted(&api, &bob, 10).await, 0);
}

#[tokio::test]
async fn a_reset_of_one_policy_or_all_unblocks() {
    let store = MemoryStore::new();
    let live = LivePolicies::new(store.clone());
    let api = live.limiter(policy("api", "1/h"));
    let search = live.limiter(policy("search", "1/h"));
    let jobs = live.concurrency(ConcurrencyLimiter::new(
        ConcurrencyPolicy::new("jobs", 1).unwrap(),
        store.clone(),
    ));
    live.start().await.unwrap();
    let app = app(api.clone());
    let (bob, carol) = (user("bob"), user("carol"));
    for key in [&bob, &carol] {
        assert_eq!(admitted(&api, key, 5).await, 1);
        assert_eq!(admitted(&search, key, 5).await, 1);
    }
    let Admission::Acquired(_lease) = jobs.acquire(&bob).await.unwrap() else {
        panic!("the first lease is free");
    };
    assert!(matches!(
        jobs.acquire(&bob).await.unwrap(),
        Admission::Refused(_)
    ));

    live.reset(&bob, Some("api")).await.unwrap();
    assert_eq!(admitted_via(&app, "bob", None, 1, 5).await, 1);
    assert!(!search.check(&bob, 1).await.unwrap().is_allowed());
    assert!(matches!(
        jobs.acquire(&bob).await.unwrap(),
        Admission::Refused(_)
    ));
    assert!(!api.check(&carol, 1).await.unwrap().is_allowed());

    live.reset(&bob, None).await.unwrap();
    assert_eq!(admitted(&api, &bob, 5).await, 1);
    assert_eq!(admitted(&search, &bob, 5).await, 1);
    assert!(matches!(
        jobs.acquire(&bob).await.unwrap(),
        Admission::Acquired(_)
    ));
    assert!(!api.check(&carol, 1).await.unwrap().is_allowed());
    assert!(!search.check(&carol, 1).await.unwrap().is_allowed());

    // Reset by the concurrency policy's name alone.
    live.reset(&carol, Some("jobs")).await.unwrap();
    assert!(!api.check(&carol, 1).await.unwrap().is_allowed());
}

/// A policy file's route table, each policy live: a change to one policy
/// decides its routes' next requests, and the file's plans can be
/// assigned.
#[tokio::test]
async fn a_policy_files_routes_follow_live_changes_and_plans() {
    let file: fleetgate::spec::PolicyFile = toml::from_str(
        r#"
        default = "general"
        [policies]
        general = "1/h"
        login = "1/h"
        [[routes]]
        path = "/login"
        policy = "login"
        [plans.pro]
        general = "3/h"
        "#,
    )
    .unwrap();
    let live = LivePolicies::new(MemoryStore::new());
    let routes = live.routes(&file).unwrap();
    live.start().await.unwrap();
    let by_user = key_fn(|req: &Request<Body>| {
        let name = req.headers().get("x-user")?.to_str().ok()?;
        Some(user(name))
    });
    let app = axum::Router::new()
        .route("/login", axum::routing::post(|| async { "in" }))
        .route("/data", axum::routing::get(|| async { "data" }))
        .layer(RateLimitLayer::per_route(routes).unwrap().key(by_user));
    let statuses = |method: &'static str, path: &'static str, name: &'static str| {
        let app = app.clone();
        async move {
            let mut out = Vec::new();
            for _ in 0..4 {
                let req = Request::builder()
                    .method(method)
                    .uri(path)
                    .header("x-user", name)
                    .body(Body::empty())
                    .unwrap();
                out.push(app.clone().oneshot(req).await.unwrap().status().as_u16());
            }
            out
        }
    };
    assert_eq!(
        statuses("POST", "/login", "bob").await,
        [200, 429, 429, 429]
    );
    live.set_policy("login", "1/h burst 3").await.unwrap();
    assert_eq!(
        statuses("POST", "/login", "bob").await,
        [200, 200, 429, 429]
    );
    assert_eq!(statuses("GET", "/data", "bob").await, [200, 429, 429, 429]);

    live.assign_plan(&user("ann"), Some("pro")).await.unwrap();
    assert_eq!(statuses("GET", "/data", "ann").await, [200, 200, 200, 429]);
    // The plan has no limits for `login`: the policy's.
    assert_eq!(
        statuses("POST", "/login", "ann").await,
        [200, 200, 200, 429]
    );
    assert_eq!(
        statuses("POST", "/login", "cat").await,
        [200, 200, 200, 429]
    );
    assert_eq!(live.policies()["general"], "1/h");
}

/// An identity is its key as the extractor makes it: an override written
/// for `ip:<address>` decides the requests of that peer.
#[tokio::test]
async fn an_override_of_an_ip_key_decides_that_peer() {
    use axum::extract::ConnectInfo;
    use fleetgate::key::PeerIp;
    use std::net::SocketAddr;

    let live = LivePolicies::new(MemoryStore::new());
    let api = live.limiter(policy("api", "1/h"));
    live.start().await.unwrap();
    let ok = tower::service_fn(|_: Request<Body>| async {
        Ok::<_, Infallible>(Response::new(Body::from("ok")))
    });
    let app: App = BoxCloneService::new(RateLimitLayer::new(api).key(PeerIp).layer(ok));
    live.set_override("api", &Key::new("ip:192.0.2.7"), Some("3/h"))
        .await
        .unwrap();
    live.set_override("api", &Key::new("ip:2001:db8::7"), Some("2/h"))
        .await
        .unwrap();
    let statuses = |peer: &'static str| {
        let app = app.clone();
        async move {
            let mut out = Vec::new();
            for _ in 0..4 {
                let mut req = Request::get("/").body(Body::empty()).unwrap();
                let addr: SocketAddr = peer.parse().unwrap();
                req.extensions_mut().insert(ConnectInfo(addr));
                out.push(app.clone().oneshot(req).await.unwrap().status().as_u16());
            }
            out
        }
    };
    assert_eq!(statuses("192.0.2.7:1000").await, [200, 200, 200, 429]);
    assert_eq!(statuses("[2001:db8::7]:1000").await, [200, 200, 429, 429]);
    assert_eq!(statuses("192.0.2.8:1000").await, [200, 429, 429, 429]);
}
