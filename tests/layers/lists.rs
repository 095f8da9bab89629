//! Deny and allow lists on the memory store, as a service sees them: a
//! deny entry refuses its identity or network outright (403, or the
//! layer's status, with `Retry-After` to its end on a 429), on every
//! policy or one, without touching the identity's state; an allow entry
//! lets its identity through a policy unlimited and without headers; deny
//! beats allow; an entry ends when it says; shadow mode refuses nothing;
//! typed errors say `Denied`; each is counted in `observe`.
use std::convert::Infallible;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use axum::body::Body;
use fleetgate::RateLimitError;
use fleetgate::key::{IpNet, Key, key_fn};
use fleetgate::live::{List, LiveError, LivePolicies};
use fleetgate::spec::PolicySpec;
use fleetgate::{ConfigError, Limiter, MemoryStore, Policy, RateLimitLayer};
use http::{Request, Response, StatusCode};
use tower::util::BoxCloneService;
use tower::{Layer, Service, ServiceExt};

use crate::shadow::observed;

type App = BoxCloneService<Request<Body>, Response<Body>, Infallible>;

fn policy(name: &str, text: &str) -> Policy {
    text.parse::<PolicySpec>().unwrap().build(name).unwrap()
}

/// Requests keyed by `x-user` (`user:<name>`), or by `x-ip` as an IP key.
fn by_user_or_ip() -> impl fleetgate::key::KeyExtractor<Request<Body>> + Clone {
    key_fn(|req: &Request<Body>| {
        let header = |name: &str| req.headers().get(name)?.to_str().ok();
        if let Some(ip) = header("x-ip") {
            return Some(Key::from_ip(ip.parse::<IpAddr>().ok()?));
        }
        Some(Key::new(format!("user:{}", header("x-user")?)))
    })
}

fn app(layer: RateLimitLayer) -> App {
    let ok = tower::service_fn(|_: Request<Body>| async {
        Ok::<_, Infallible>(Response::new(Body::from("ok")))
    });
    BoxCloneService::new(layer.key(by_user_or_ip()).layer(ok))
}

fn request(header: &str, value: &str) -> Request<Body> {
    Request::get("/")
        .header(header, value)
        .body(Body::empty())
        .unwrap()
}

async fn send(app: &App, header: &str, value: &str) -> Response<Body> {
    app.clone().oneshot(request(header, value)).await.unwrap()
}

async fn status(app: &App, user: &str) -> StatusCode {
    send(app, "x-user", user).await.status()
}

async fn ip_status(app: &App, ip: &str) -> StatusCode {
    send(app, "x-ip", ip).await.status()
}

fn net(text: &str) -> IpNet {
    text.parse().unwrap()
}

/// A refusal's `Retry-After`, in seconds.
fn retry_after(response: &Response<Body>) -> u64 {
    response.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap()
}

#[tokio::test]
async fn a_deny_entry_refuses_outright_and_leaves_the_state_alone() {
    let live = LivePolicies::new(MemoryStore::new());
    let api = live.limiter(policy("lists-deny-api", "2/h"));
    let other = live.limiter(policy("lists-deny-other", "2/h"));
    let (api_app, other_app) = (
        app(RateLimitLayer::new(api.clone())),
        app(RateLimitLayer::new(other)),
    );
    let mallory = Key::new("user:mallory");

    // On one policy: refused there with 403 and no rate-limit headers,
    // still limited as usual by the other.
    live.deny(Some("lists-deny-api"), mallory.clone(), None)
        .await
        .unwrap();
    for _ in 0..5 {
        let response = send(&api_app, "x-user", "mallory").await;
        assert_eq!(response.status(), StatusCode::FORBIDDEN);
        assert!(response.headers().get("retry-after").is_none());
        assert!(response.headers().get("ratelimit-policy").is_none());
    }
    assert_eq!(status(&api_app, "alice").await, StatusCode::OK);
    assert_eq!(status(&other_app, "mallory").await, StatusCode::OK);

    // On every policy.
    live.deny(None, mallory.clone(), None).await.unwrap();
    assert_eq!(status(&other_app, "mallory").await, StatusCode::FORBIDDEN);

    // Taken off both: the refusals spent none of mallory's budget.
    live.unlist(List::Deny, None, mallory.clone())
        .await
        .unwrap();
    live.unlist(List::Deny, Some("lists-deny-api"), mallory.clone())
        .await
        .unwrap();
    assert!(live.lists().is_empty());
    assert_eq!(status(&api_app, "mallory").await, StatusCode::OK);
    assert_eq!(status(&api_app, "mallory").await, StatusCode::OK);
    assert_eq!(
        status(&api_app, "mallory").await,
        StatusCode::TOO_MANY_REQUESTS
    );
    let (denied, _) = counts("lists-deny-api");
    assert_eq!(denied, 5);
}

#[tokio::test]
async fn networks_cover_their_addresses_on_both_families() {
    let live = LivePolicies::new(MemoryStore::new());
    let api = app(RateLimitLayer::new(
        live.limiter(policy("lists-nets", "100/s")),
    ));
    live.deny(None, net("203.0.113.0/24"), None).await.unwrap();
    live.deny(Some("lists-nets"), net("2001:db8::/32"), None)
        .await
        .unwrap();
    for (ip, expected) in [
        ("203.0.113.1", StatusCode::FORBIDDEN),
        ("203.0.113.254", StatusCode::FORBIDDEN),
        ("::ffff:203.0.113.9", StatusCode::FORBIDDEN),
        ("2001:db8:ffff::1", StatusCode::FORBIDDEN),
        ("203.0.112.255", StatusCode::OK),
        ("2001:db9::1", StatusCode::OK),
    ] {
        assert_eq!(ip_status(&api, ip).await, expected, "{ip}");
    }
    // A host address with its host bits set is stored as its network.
    live.allow(None, net("198.51.100.77/24"), None)
        .await
        .unwrap();
    let entry = live
        .lists()
        .into_iter()
        .find(|e| e.list == List::Allow)
        .unwrap();
    assert_eq!(entry.listed.to_string(), "198.51.100.0/24");
}

#[tokio::test]
async fn an_allow_entry_exempts_its_identity_and_deny_beats_it() {
    let live = LivePolicies::new(MemoryStore::new());
    let api = app(RateLimitLayer::new(
        live.limiter(policy("lists-allow", "1/h")),
    ));
    live.allow(Some("lists-allow"), Key::new("ip:10.0.0.9"), None)
        .await
        .unwrap();
    live.allow(None, Key::new("user:partner"), None)
        .await
        .unwrap();
    for _ in 0..5 {
        let response = send(&api, "x-ip", "10.0.0.9").await;
        assert_eq!(response.status(), StatusCode::OK);
        assert!(response.headers().get("ratelimit-policy").is_none());
        assert_eq!(status(&api, "partner").await, StatusCode::OK);
    }
    assert_eq!(status(&api, "bob").await, StatusCode::OK);
    assert_eq!(status(&api, "bob").await, StatusCode::TOO_MANY_REQUESTS);

    live.deny(None, net("10.0.0.0/8"), None).await.unwrap();
    assert_eq!(ip_status(&api, "10.0.0.9").await, StatusCode::FORBIDDEN);
    assert_eq!(status(&api, "partner").await, StatusCode::OK);
    let (denied, allowed) = counts("lists-allow");
    assert_eq!((denied, allowed), (1, 11));
}

#[tokio::test]
async fn a_429_deny_counts_down_to_its_end_and_then_lets_the_identity_back() {
    let live = LivePolicies::new(MemoryStore::new());
    let layer = RateLimitLayer::new(live.limiter(policy("lists-429", "100/s")))
        .deny_status(StatusCode::TOO_MANY_REQUESTS)
        .unwrap();
    let api = app(layer);
    let hour = Duration::from_secs(3600);
    live.deny(None, Key::new("user:hour"), Some(hour))
        .await
        .unwrap();
    let response = send(&api, "x-user", "hour").await;
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    let secs = retry_after(&response);
    assert!((3590..=3600).contains(&secs), "{secs}");

    // An entry of 300 ms: refused until then, admitted once it ends,
    // measured from before the entry was written.
    let before = Instant::now();
    live.deny(
        None,
        Key::new("user:brief"),
        Some(Duration::from_millis(300)),
    )
    .await
    .unwrap();
    while status(&api, "brief").await != StatusCode::OK {
        assert!(before.elapsed() < Duration::from_secs(10), "never ended");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // The wall clock the end is kept by ticks in whole milliseconds.
    assert!(before.elapsed() >= Duration::from_millis(298));
    assert_eq!(live.lists().len(), 1, "the ended entry is not in force");
}

#[tokio::test]
async fn shadow_mode_refuses_nothing_and_typed_errors_say_denied() {
    let live = LivePolicies::new(MemoryStore::new());
    let shadow =
        app(RateLimitLayer::new(live.limiter(policy("lists-shadow", "100/s"))).shadow(true));
    live.deny(
        None,
        Key::new("user:mallory"),
        Some(Duration::from_secs(60)),
    )
    .await
    .unwrap();
    assert_eq!(status(&shadow, "mallory").await, StatusCode::OK);
    let snapshot = observed("rate_limit", "lists-shadow");
    assert_eq!(snapshot.decisions.shadow_denied, 1);
    assert_eq!(snapshot.decisions.deny_listed, 0);

    let limiter = live.limiter(policy("lists-typed", "100/s"));
    let mut client = RateLimitLayer::new(limiter)
        .key(by_user_or_ip())
        .typed_errors()
        .layer(tower::service_fn(|_: Request<Body>| async {
            Ok::<_, Infallible>("ok")
        }));
    let err = client
        .ready()
        .await
        .unwrap()
        .call(request("x-user", "mallory"))
        .await
        .unwrap_err();
    match err.downcast_ref::<RateLimitError>() {
        Some(RateLimitError::Denied {
            retry_after: Some(left),
        }) => assert!(*left > Duration::from_secs(50), "{left:?}"),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn refused_list_changes_change_nothing() {
    let live = LivePolicies::new(MemoryStore::new());
    let _api = live.limiter(policy("lists-refused", "1/s"));
    let who = Key::new("user:x");
    match live.deny(Some("nope"), who.clone(), None).await {
        Err(LiveError::Config(ConfigError::UnknownPolicy { name })) => assert_eq!(name, "nope"),
        other => panic!("{other:?}"),
    }
    for bad in [Duration::ZERO, Duration::from_secs(11 * 365 * 24 * 3600)] {
        match live.allow(None, who.clone(), Some(bad)).await {
            Err(LiveError::Config(ConfigError::ListExpiryOutOfRange { expires_in })) => {
                assert_eq!(expires_in, bad)
            }
            other => panic!("{other:?}"),
        }
    }
    assert!(live.lists().is_empty());
    assert!(
        RateLimitLayer::new(Limiter::new(
            policy("lists-status", "1/s"),
            MemoryStore::new()
        ))
        .deny_status(StatusCode::OK)
        .is_err()
    );
}

#[tokio::test]
async fn a_concurrency_limit_known_to_live_policies_checks_the_lists() {
    use fleetgate::concurrency::{
        Admission, ConcurrencyLimitLayer, ConcurrencyLimiter, ConcurrencyPolicy,
    };
    let live = LivePolicies::new(MemoryStore::new());
    let policy = ConcurrencyPolicy::builder("lists-slow", 1).build().unwrap();
    let limiter = live.concurrency(ConcurrencyLimiter::new(policy, MemoryStore::new()));
    let ok = tower::service_fn(|_: Request<Body>| async {
        Ok::<_, Infallible>(Response::new(Body::from("ok")))
    });
    let layer = ConcurrencyLimitLayer::new(limiter.clone())
        .key(by_user_or_ip())
        .deny_status(StatusCode::TOO_MANY_REQUESTS)
        .unwrap();
    let app: App = BoxCloneService::new(tower::util::MapResponse::new(
        layer.layer(ok),
        |r: Response<_>| r.map(Body::new),
    ));
    // Each of these identities already has its one call in flight.
    let mut held = Vec::new();
    for name in ["partner", "bob", "mallory"] {
        match limiter
            .acquire(&Key::new(format!("user:{name}")))
            .await
            .unwrap()
        {
            Admission::Acquired(guard) => held.push(guard),
            other => panic!("{other:?}"),
        }
    }
    live.allow(Some("lists-slow"), Key::new("user:partner"), None)
        .await
        .unwrap();
    live.deny(
        None,
        Key::new("user:mallory"),
        Some(Duration::from_secs(90)),
    )
    .await
    .unwrap();
    assert_eq!(status(&app, "partner").await, StatusCode::OK);
    assert_eq!(status(&app, "bob").await, StatusCode::TOO_MANY_REQUESTS);
    drop(held);
    let response = send(&app, "x-user", "mallory").await;
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    let secs = retry_after(&response);
    assert!((80..=90).contains(&secs), "{secs}");
    let snapshot = observed("concurrency", "lists-slow");
    assert_eq!(snapshot.decisions.deny_listed, 1);
    assert_eq!(snapshot.decisions.allow_listed, 1);
}

/// The `deny_listed` and `allow_listed` counts of rate policy `name`.
fn counts(name: &str) -> (u64, u64) {
    let snapshot = observed("rate_limit", name);
    (
        snapshot.decisions.deny_listed,
        snapshot.decisions.allow_listed,
    )
}
