//! One layer over a whole router, each route decided by its own policy,
//! from code and from a policy file.
use std::net::SocketAddr;

use axum::Router;
use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::routing::{get, post};
use fleetgate::key::HeaderKey;
use fleetgate::rate_limit::RoutePolicies;
use fleetgate::spec::{PolicyFile, PolicySpec};
use fleetgate::{ConfigError, Limiter, MemoryStore, RateLimitLayer};
use http::{Method, Request};
use tower::ServiceExt;

fn router() -> Router {
    Router::new()
        .route("/api/login", post(|| async { "in" }))
        .route("/api/login", get(|| async { "form" }))
        .route("/api/search/{q}", get(|| async { "found" }))
        .route("/users/{id}", get(|| async { "user" }))
        .route("/health", get(|| async { "ok" }))
}

/// Sends `n` requests and returns their statuses, with the last response's
/// `RateLimit` header.
async fn statuses(app: &Router, method: Method, path: &str, n: usize) -> (Vec<u16>, String) {
    let mut out = Vec::new();
    let mut policy = String::new();
    for _ in 0..n {
        let mut req = Request::builder()
            .method(method.clone())
            .uri(path)
            .header("x-api-key", "same-client")
            .body(Body::empty())
            .unwrap();
        req.extensions_mut()
            .insert(ConnectInfo("192.0.2.1:1".parse::<SocketAddr>().unwrap()));
        let resp = app.clone().oneshot(req).await.unwrap();
        out.push(resp.status().as_u16());
        policy = resp
            .headers()
            .get("ratelimit")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned();
    }
    (out, policy)
}

fn limiter(store: &MemoryStore, name: &str, text: &str) -> Limiter {
    let policy = text.parse::<PolicySpec>().unwrap().build(name).unwrap();
    Limiter::new(policy, store.clone())
}

#[tokio::test]
async fn each_route_has_its_own_policy() {
    let store = MemoryStore::new();
    let routes = RoutePolicies::new()
        .route(
            Some(Method::POST),
            "/api/login",
            limiter(&store, "login", "2/h"),
        )
        .unwrap()
        .route(None, "/api/search/*", limiter(&store, "search", "3/h"))
        .unwrap()
        .default_policy(limiter(&store, "general", "4/h"));
    let app = router().layer(
        RateLimitLayer::per_route(routes)
            .unwrap()
            .key(HeaderKey::new("x-api-key")),
    );
    let (login, header) = statuses(&app, Method::POST, "/api/login", 3).await;
    assert_eq!(login, [200, 200, 429]);
    // Headers name the deciding limit.
    assert!(header.contains("\"2/h\""), "{header}");
    // GET /api/login is not the POST rule: the default decides.
    let (form, header) = statuses(&app, Method::GET, "/api/login", 1).await;
    assert_eq!(form, [200]);
    assert!(header.contains("\"4/h\""), "{header}");
    // The search rule matches the route pattern, whatever the query.
    let (a, _) = statuses(&app, Method::GET, "/api/search/rust", 2).await;
    let (b, header) = statuses(&app, Method::GET, "/api/search/redis", 2).await;
    assert_eq!([a, b].concat(), [200, 200, 200, 429]);
    assert!(header.contains("\"3/h\""), "{header}");
    // Everything else shares the default: 1 used by GET /api/login.
    let (rest, _) = statuses(&app, Method::GET, "/users/1", 4).await;
    assert_eq!(rest, [200, 200, 200, 429]);
}

#[tokio::test]
async fn without_a_default_unmatched_routes_are_not_limited() {
    let store = MemoryStore::new();
    let routes = RoutePolicies::new()
        .route(None, "/users/{id}", limiter(&store, "users", "1/h"))
        .unwrap();
    let app = router().layer(
        RateLimitLayer::per_route(routes)
            .unwrap()
            .key(HeaderKey::new("x-api-key")),
    );
    // /users/1 and /users/2 are one route: one policy, one budget.
    let (users, _) = statuses(&app, Method::GET, "/users/1", 1).await;
    let (more, _) = statuses(&app, Method::GET, "/users/2", 1).await;
    assert_eq!([users, more].concat(), [200, 429]);
    let (health, header) = statuses(&app, Method::GET, "/health", 10).await;
    assert_eq!(health, [200; 10]);
    assert_eq!(header, "", "an unlimited route sends no rate-limit headers");
}

#[tokio::test]
async fn a_policy_file_drives_the_table() {
    let file: PolicyFile = toml::from_str(
        r#"
        default = "general"
        [policies]
        general = "3/h"
        login = "1/h"
        window = "2/h sliding"
        [[routes]]
        path = "/api/login"
        method = "POST"
        policy = "login"
        [[routes]]
        path = "/users/{id}"
        policy = "window"
        "#,
    )
    .unwrap();
    let routes = RoutePolicies::from_file(&file, MemoryStore::new()).unwrap();
    let app = router().layer(
        RateLimitLayer::per_route(routes)
            .unwrap()
            .key(HeaderKey::new("x-api-key")),
    );
    assert_eq!(
        statuses(&app, Method::POST, "/api/login", 2).await.0,
        [200, 429]
    );
    assert_eq!(
        statuses(&app, Method::GET, "/users/7", 3).await.0,
        [200, 200, 429]
    );
    assert_eq!(
        statuses(&app, Method::GET, "/health", 4).await.0,
        [200, 200, 200, 429]
    );
}

#[test]
fn empty_tables_and_bad_routes_are_refused() {
    assert_eq!(
        RateLimitLayer::per_route(RoutePolicies::new()).unwrap_err(),
        ConfigError::EmptyRoutes
    );
    let store = MemoryStore::new();
    assert!(matches!(
        RoutePolicies::new().route(None, "users", limiter(&store, "u", "1/s")),
        Err(ConfigError::InvalidRoute { .. })
    ));
    let file: PolicyFile =
        toml::from_str("[policies]\na = \"1/s\"\n[[routes]]\npath = \"/x\"\npolicy = \"b\"")
            .unwrap();
    assert!(matches!(
        RoutePolicies::from_file(&file, store),
        Err(ConfigError::UnknownPolicy { name }) if name == "b"
    ));
}
