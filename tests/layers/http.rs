//! RateLimitLayer through real axum routers: statuses, headers, keys,
//! shadow mode, failure policies, typed errors, and two instances sharing
//! one Redis.
use crate::common;

use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::routing::get;
use bytes::Bytes;
use common::RedisServer;
use fleetgate::key::{GlobalKey, HeaderKey, PeerIp, key_fn};
use fleetgate::response::{HeaderStyle, RejectionKind};
use fleetgate::{
    FailurePolicy, Key, Limit, Limiter, MemoryStore, OnMissingKey, Policy, Rate, RateLimitError,
    RateLimitLayer, RedisStore,
};
use http::{Request, Response, StatusCode};
use http_body_util::BodyExt;
use tower::{Layer, ServiceBuilder, ServiceExt, service_fn};

fn policy(burst: u64, per_second: u64) -> Policy {
    Policy::single(
        "ping",
        Limit::builder(Rate::per_second(per_second))
            .burst(burst)
            .build()
            .unwrap(),
    )
    .unwrap()
}

/// A slow refill so that nothing refills during a test.
fn slow_policy(burst: u64) -> Policy {
    Policy::single(
        "ping",
        Limit::builder(Rate::per_hour(burst))
            .burst(burst)
            .build()
            .unwrap(),
    )
    .unwrap()
}

fn app<L>(layer: L) -> Router
where
    L: tower::Layer<axum::routing::Route> + Clone + Send + Sync + 'static,
    L::Service: tower::Service<Request<Body>, Error = std::convert::Infallible>
        + Clone
        + Send
        + Sync
        + 'static,
    <L::Service as tower::Service<Request<Body>>>::Response: axum::response::IntoResponse + 'static,
    <L::Service as tower::Service<Request<Body>>>::Future: Send + 'static,
{
    Router::new()
        .route("/api/ping", get(|| async { "pong" }))
        .route_layer(layer)
}

fn request(ip: &str, api_key: Option<&str>) -> Request<Body> {
    let mut builder = Request::get("/api/ping");
    if let Some(key) = api_key {
        builder = builder.header("x-api-key", key);
    }
    let mut req = builder.body(Body::empty()).unwrap();
    let addr: SocketAddr = format!("{ip}:40000").parse().unwrap();
    req.extensions_mut().insert(ConnectInfo(addr));
    req
}

async fn send(app: &Router, req: Request<Body>) -> Response<Body> {
    app.clone().oneshot(req).await.unwrap()
}

fn header<'a>(res: &'a Response<Body>, name: &str) -> Option<&'a str> {
    res.headers().get(name).and_then(|v| v.to_str().ok())
}

async fn body_text(res: Response<Body>) -> String {
    let bytes = res.into_body().collect().await.unwrap().to_bytes();
    String::from_utf8(bytes.to_vec()).unwrap()
}

#[tokio::test]
async fn burst_then_429_with_retry_after_and_draft_headers() {
    let limiter = Limiter::new(policy(3, 1), MemoryStore::new());
    let app = app(RateLimitLayer::new(limiter));

    for remaining in [2, 1, 0] {
        let res = send(&app, request("203.0.113.1", None)).await;
        assert_eq!(res.status(), StatusCode::OK);
        assert_eq!(header(&res, "ratelimit-policy"), Some("\"1/s\";q=3;w=3"));
        let expected = format!("\"1/s\";r={remaining};t=");
        assert!(
            header(&res, "ratelimit").unwrap().starts_with(&expected),
            "{:?}",
            header(&res, "ratelimit")
        );
        assert!(header(&res, "retry-after").is_none());
    }
    let res = send(&app, request("203.0.113.1", None)).await;
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&res, "retry-after"), Some("1"));
    assert_eq!(header(&res, "ratelimit"), Some("\"1/s\";r=0;t=3"));
    assert!(body_text(res).await.contains("1/s"));

    // Another client is unaffected.
    let res = send(&app, request("203.0.113.2", None)).await;
    assert_eq!(res.status(), StatusCode::OK);
}

#[tokio::test]
async fn retry_after_rounds_up_to_whole_seconds() {
    // One per 2.5 s: after the burst the retry is 2.5 s, sent as 3.
    let limit = Limit::builder(Rate::new(2, Duration::from_secs(5)))
        .burst(1)
        .build()
        .unwrap();
    let limiter = Limiter::new(Policy::single("slow", limit).unwrap(), MemoryStore::new());
    let app = app(RateLimitLayer::new(limiter));
    assert_eq!(
        send(&app, request("198.51.100.1", None)).await.status(),
        StatusCode::OK
    );
    let res = send(&app, request("198.51.100.1", None)).await;
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&res, "retry-after"), Some("3"));
}

#[tokio::test]
async fn header_styles() {
    for (style, draft, legacy) in [
        (HeaderStyle::Draft, true, false),
        (HeaderStyle::Legacy, false, true),
        (HeaderStyle::Both, true, true),
        (HeaderStyle::None, false, false),
    ] {
        let limiter = Limiter::new(slow_policy(2), MemoryStore::new());
        let app = app(RateLimitLayer::new(limiter).headers(style));
        let ok = send(&app, request("192.0.2.1", None)).await;
        assert_eq!(header(&ok, "ratelimit").is_some(), draft, "{style:?}");
        assert_eq!(
            header(&ok, "ratelimit-policy").is_some(),
            draft,
            "{style:?}"
        );
        assert_eq!(
            header(&ok, "x-ratelimit-limit"),
            legacy.then_some("2"),
            "{style:?}"
        );
        assert_eq!(
            header(&ok, "x-ratelimit-remaining"),
            legacy.then_some("1"),
            "{style:?}"
        );
        send(&app, request("192.0.2.1", None)).await;
        let denied = send(&app, request("192.0.2.1", None)).await;
        assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
        // Retry-After whatever the style.
        assert!(header(&denied, "retry-after").is_some(), "{style:?}");
        assert_eq!(
            header(&denied, "x-ratelimit-remaining"),
            legacy.then_some("0"),
            "{style:?}"
        );
    }
}

#[tokio::test]
async fn api_key_falls_back_to_peer_ip() {
    let limiter = Limiter::new(slow_policy(2), MemoryStore::new());
    let app = app(RateLimitLayer::new(limiter).key(HeaderKey::new("x-api-key").or(PeerIp)));
    // Same key from two addresses shares one limit.
    assert_eq!(
        send(&app, request("10.0.0.1", Some("k1"))).await.status(),
        StatusCode::OK
    );
    assert_eq!(
        send(&app, request("10.0.0.2", Some("k1"))).await.status(),
        StatusCode::OK
    );
    assert_eq!(
        send(&app, request("10.0.0.3", Some("k1"))).await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    // Another key, and a keyless client by its address, are unaffected.
    assert_eq!(
        send(&app, request("10.0.0.1", Some("k2"))).await.status(),
        StatusCode::OK
    );
    assert_eq!(
        send(&app, request("10.0.0.1", None)).await.status(),
        StatusCode::OK
    );
}

#[tokio::test]
async fn missing_key_policies() {
    let no_key = || {
        let mut req = Request::get("/api/ping").body(Body::empty()).unwrap();
        req.extensions_mut().insert(());
        req
    };
    // Default: 400.
    let limiter = Limiter::new(slow_policy(1), MemoryStore::new());
    let app1 = app(RateLimitLayer::new(limiter.clone()).key(HeaderKey::new("x-api-key")));
    let res = send(&app1, no_key()).await;
    assert_eq!(res.status(), StatusCode::BAD_REQUEST);

    // A configured status.
    let app2 = app(RateLimitLayer::new(limiter.clone())
        .key(HeaderKey::new("x-api-key"))
        .on_missing_key(OnMissingKey::Reject(StatusCode::UNAUTHORIZED)));
    assert_eq!(
        send(&app2, no_key()).await.status(),
        StatusCode::UNAUTHORIZED
    );

    // A shared fallback key: the second keyless request is limited.
    let app3 = app(RateLimitLayer::new(limiter.clone())
        .key(HeaderKey::new("x-api-key"))
        .on_missing_key(OnMissingKey::Fallback(Key::new("anonymous"))));
    assert_eq!(send(&app3, no_key()).await.status(), StatusCode::OK);
    assert_eq!(
        send(&app3, no_key()).await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );

    // Pass through: never limited.
    let app4 = app(RateLimitLayer::new(limiter)
        .key(HeaderKey::new("x-api-key"))
        .on_missing_key(OnMissingKey::Allow));
    for _ in 0..3 {
        let res = send(&app4, no_key()).await;
        assert_eq!(res.status(), StatusCode::OK);
        assert!(header(&res, "ratelimit").is_none());
    }
}

#[tokio::test]
async fn route_layer_does_not_count_unmatched_paths() {
    let limiter = Limiter::new(slow_policy(1), MemoryStore::new());
    let app = app(RateLimitLayer::new(limiter).key(GlobalKey::new()));
    for _ in 0..3 {
        let mut req = Request::get("/nowhere").body(Body::empty()).unwrap();
        req.extensions_mut()
            .insert(ConnectInfo(SocketAddr::from(([127, 0, 0, 1], 1))));
        assert_eq!(send(&app, req).await.status(), StatusCode::NOT_FOUND);
    }
    assert_eq!(
        send(&app, request("127.0.0.1", None)).await.status(),
        StatusCode::OK
    );
}

#[tokio::test]
async fn router_layer_and_service_builder_compose() {
    let limiter = Limiter::new(slow_policy(1), MemoryStore::new());
    let app = Router::new()
        .route("/api/ping", get(|| async { "pong" }))
        .layer(ServiceBuilder::new().layer(RateLimitLayer::new(limiter).key(GlobalKey::new())));
    assert_eq!(
        send(&app, request("127.0.0.1", None)).await.status(),
        StatusCode::OK
    );
    let res = send(&app, request("127.0.0.2", None)).await;
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    // `Router::layer` limits unknown paths too.
    let mut req = Request::get("/nowhere").body(Body::empty()).unwrap();
    req.extensions_mut()
        .insert(ConnectInfo(SocketAddr::from(([127, 0, 0, 1], 1))));
    assert_eq!(
        send(&app, req).await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
}

#[tokio::test]
async fn shadow_mode_never_rejects_but_decides() {
    let limiter = Limiter::new(slow_policy(1), MemoryStore::new());
    let app = app(RateLimitLayer::new(limiter.clone()).shadow(true));
    for _ in 0..5 {
        let res = send(&app, request("192.0.2.9", None)).await;
        assert_eq!(res.status(), StatusCode::OK);
        assert!(header(&res, "ratelimit").is_none());
    }
    // It did decide: the state is used up.
    let d = limiter
        .check(&Key::from_ip("192.0.2.9".parse().unwrap()), 1)
        .await
        .unwrap();
    assert!(!d.is_allowed());
}

#[tokio::test]
async fn custom_rejection_response() {
    let limiter = Limiter::new(slow_policy(1), MemoryStore::new());
    let app = app(RateLimitLayer::new(limiter).rejection(|rejection| {
        let mut res = rejection.default_response();
        if let RejectionKind::Limited(_) = rejection.kind() {
            *res.body_mut() = Bytes::from(format!(
                "{{\"error\":\"slow down\",\"limit\":\"{}\"}}",
                rejection.limit_name().unwrap_or_default()
            ));
        }
        res
    }));
    send(&app, request("192.0.2.3", None)).await;
    let res = send(&app, request("192.0.2.3", None)).await;
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(header(&res, "retry-after").is_some());
    assert_eq!(
        body_text(res).await,
        "{\"error\":\"slow down\",\"limit\":\"1/h\"}"
    );
}

#[tokio::test]
async fn weighted_requests_and_impossible_costs() {
    let limiter = Limiter::new(slow_policy(10), MemoryStore::new());
    let cost = |req: &Request<Body>| {
        req.headers()
            .get("x-cost")
            .and_then(|v| v.to_str().ok()?.parse().ok())
            .unwrap_or(1)
    };
    let app = app(RateLimitLayer::new(limiter)
        .key(GlobalKey::new())
        .cost(cost));
    let with_cost = |n: &str| {
        let mut req = request("192.0.2.4", None);
        req.headers_mut().insert("x-cost", n.parse().unwrap());
        req
    };
    let res = send(&app, with_cost("7")).await;
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(header(&res, "ratelimit"), Some("\"10/h\";r=3;t=2520"));
    assert_eq!(
        send(&app, with_cost("4")).await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(send(&app, with_cost("3")).await.status(), StatusCode::OK);
    // Above the burst: refused, and no Retry-After since waiting cannot help.
    let res = send(&app, with_cost("11")).await;
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(header(&res, "retry-after").is_none());
    assert!(body_text(res).await.contains("never"));
}

/// A response's status and body text, whatever its body type.
async fn status_and_text<B>(res: Response<B>) -> (StatusCode, String)
where
    B: http_body::Body,
    B::Error: std::fmt::Debug,
{
    let status = res.status();
    let bytes = res.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8(bytes.to_vec()).unwrap())
}

/// Calls `svc`, whose limit admits one call, twice: the first passes with
/// the inner service's body `passed`, the second is refused with the
/// layer's text. `B` names the response's body type: a call stops
/// compiling if the layer answers in another.
async fn passes_then_refuses<B, S>(svc: S, passed: &str)
where
    S: tower::Service<Request<()>, Response = Response<B>> + Clone,
    S::Error: std::fmt::Debug,
    B: http_body::Body,
    B::Error: std::fmt::Debug,
{
    let res = svc.clone().oneshot(Request::new(())).await.unwrap();
    assert_eq!(status_and_text(res).await, (StatusCode::OK, passed.into()));
    let res = svc.oneshot(Request::new(())).await.unwrap();
    let (status, text) = status_and_text(res).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert!(text.contains("rate limit"), "{text}");
}

/// The layer answers in the inner service's own body type, so a passing
/// response is handed on as it is (axum does not box it again), and a
/// refusal is built in that type; `any_body` wraps every response instead.
#[tokio::test]
async fn refusals_come_in_the_inner_body_type_unless_any_body() {
    use http_body_util::combinators::{BoxBody, UnsyncBoxBody};
    use http_body_util::{Empty, Full};
    type Never = std::convert::Infallible;

    let layer = || {
        RateLimitLayer::new(Limiter::new(slow_policy(1), MemoryStore::new())).key(GlobalKey::new())
    };
    passes_then_refuses::<Body, _>(
        layer().layer(service_fn(|_: Request<()>| async {
            Ok::<_, Never>(Response::new(Body::from("axum")))
        })),
        "axum",
    )
    .await;
    passes_then_refuses::<String, _>(
        layer().layer(service_fn(|_: Request<()>| async {
            Ok::<_, Never>(Response::new(String::from("text")))
        })),
        "text",
    )
    .await;
    passes_then_refuses::<Full<Bytes>, _>(
        layer().layer(service_fn(|_: Request<()>| async {
            Ok::<_, Never>(Response::new(Full::new(Bytes::from_static(b"full"))))
        })),
        "full",
    )
    .await;
    passes_then_refuses::<BoxBody<Bytes, Never>, _>(
        layer().layer(service_fn(|_: Request<()>| async {
            Ok::<_, Never>(Response::new(BoxBody::new(Full::new(Bytes::from_static(
                b"boxed",
            )))))
        })),
        "boxed",
    )
    .await;
    passes_then_refuses::<UnsyncBoxBody<Bytes, Never>, _>(
        layer().layer(service_fn(|_: Request<()>| async {
            Ok::<_, Never>(Response::new(UnsyncBoxBody::new(Full::new(
                Bytes::from_static(b"unsync"),
            ))))
        })),
        "unsync",
    )
    .await;
    // `Empty` cannot carry a refusal's text: `any_body` wraps it.
    passes_then_refuses::<fleetgate::response::ResponseBody<Empty<Bytes>>, _>(
        layer().any_body().layer(service_fn(|_: Request<()>| async {
            Ok::<_, Never>(Response::new(Empty::<Bytes>::new()))
        })),
        "",
    )
    .await;
}

/// The default layer stacks over this crate's other layers: over an
/// `any_body` rate limit (its `ResponseBody`) and over a concurrency limit
/// (its `GuardedBody`), refusing in their body types; the inner layer's
/// own refusal passes through.
#[tokio::test]
async fn default_layer_stacks_over_the_crates_other_layers() {
    use fleetgate::concurrency::{ConcurrencyLimitLayer, ConcurrencyLimiter};
    use fleetgate::response::ResponseBody;

    let handler = || {
        service_fn(|_: Request<()>| async {
            Ok::<_, std::convert::Infallible>(Response::new(http_body_util::Empty::<Bytes>::new()))
        })
    };

    // Outer: 1 per hour. Inner (`any_body`): 2 per hour, so it never
    // refuses before the outer one does.
    let outer =
        RateLimitLayer::new(Limiter::new(slow_policy(1), MemoryStore::new())).key(GlobalKey::new());
    let inner = RateLimitLayer::new(Limiter::new(slow_policy(2), MemoryStore::new()))
        .key(GlobalKey::new())
        .any_body();
    let svc = ServiceBuilder::new()
        .layer(outer)
        .layer(inner)
        .service(handler());
    let res: Response<ResponseBody<http_body_util::Empty<Bytes>>> =
        svc.clone().oneshot(Request::new(())).await.unwrap();
    assert_eq!(status_and_text(res).await, (StatusCode::OK, String::new()));
    let (status, body) = status_and_text(svc.oneshot(Request::new(())).await.unwrap()).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert!(
        body.contains("rate limit 1/h"),
        "the outer layer refuses: {body}"
    );

    // Over a concurrency limit of one: the rate limit refuses in its body
    // type, holding no lease.
    let policy = fleetgate::ConcurrencyPolicy::new("cap", 1).unwrap();
    let svc = ServiceBuilder::new()
        .layer(
            RateLimitLayer::new(Limiter::new(slow_policy(1), MemoryStore::new()))
                .key(GlobalKey::new()),
        )
        .layer(
            ConcurrencyLimitLayer::new(ConcurrencyLimiter::new(policy, MemoryStore::new()))
                .key(GlobalKey::new()),
        )
        .service(handler());
    let res = svc.clone().oneshot(Request::new(())).await.unwrap();
    assert!(
        res.body().holds_lease(),
        "a passing response holds its lease"
    );
    assert_eq!(status_and_text(res).await.0, StatusCode::OK);
    let res = svc.oneshot(Request::new(())).await.unwrap();
    assert!(!res.body().holds_lease());
    let (status, body) = status_and_text(res).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert!(body.contains("rate limit 1/h"), "{body}");
}

#[tokio::test]
async fn typed_errors_around_a_plain_service() {
    let limiter = Limiter::new(slow_policy(2), MemoryStore::new());
    let svc = ServiceBuilder::new()
        .layer(
            RateLimitLayer::new(limiter)
                .key(key_fn(|tenant: &&str| Some(Key::new(*tenant))))
                .typed_errors(),
        )
        .service(service_fn(|tenant: &'static str| async move {
            Ok::<_, std::convert::Infallible>(tenant.len())
        }));
    assert_eq!(svc.clone().oneshot("acme").await.unwrap(), 4);
    assert_eq!(svc.clone().oneshot("acme").await.unwrap(), 4);
    let err = svc.clone().oneshot("acme").await.unwrap_err();
    let err = err.downcast::<RateLimitError>().unwrap();
    match *err {
        RateLimitError::Limited { limit, retry_after } => {
            assert_eq!(limit, "2/h");
            assert!(retry_after.unwrap() > Duration::from_secs(1700));
        }
        other => panic!("unexpected {other:?}"),
    }
    assert_eq!(svc.oneshot("other").await.unwrap(), 5);
}

#[tokio::test]
async fn store_failure_follows_the_failure_policy() {
    let server = RedisServer::start();
    let store = RedisStore::builder(server.url())
        .timeout(Duration::from_millis(300))
        .connect()
        .await
        .unwrap();
    server.stop();
    let limiter = Limiter::new(slow_policy(1), store);

    let open = app(RateLimitLayer::new(limiter.clone()));
    for _ in 0..3 {
        let res = send(&open, request("192.0.2.5", None)).await;
        assert_eq!(res.status(), StatusCode::OK);
        assert!(header(&res, "ratelimit").is_none());
    }

    let closed = app(RateLimitLayer::new(limiter.clone()).on_store_error(FailurePolicy::Closed));
    let res = send(&closed, request("192.0.2.5", None)).await;
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(header(&res, "retry-after"), Some("1"));

    let typed = ServiceBuilder::new()
        .layer(
            RateLimitLayer::new(limiter)
                .key(GlobalKey::new())
                .on_store_error(FailurePolicy::Closed)
                .typed_errors(),
        )
        .service(service_fn(|_: ()| async {
            Ok::<_, std::convert::Infallible>(())
        }));
    let err = typed.oneshot(()).await.unwrap_err();
    assert!(matches!(
        *err.downcast::<RateLimitError>().unwrap(),
        RateLimitError::Unavailable(_)
    ));
}

#[tokio::test]
async fn two_instances_share_one_redis() {
    let server = RedisServer::start();
    let instance = || async {
        let store = RedisStore::builder(server.url())
            .timeout(Duration::from_secs(2))
            .connect()
            .await
            .unwrap();
        app(RateLimitLayer::new(Limiter::new(slow_policy(4), store))
            .key(HeaderKey::new("x-api-key").or(PeerIp)))
    };
    let a = instance().await;
    let b = instance().await;
    let mut statuses = Vec::new();
    for i in 0..6 {
        let app = if i % 2 == 0 { &a } else { &b };
        statuses.push(
            send(app, request("10.1.1.1", Some("shared")))
                .await
                .status(),
        );
    }
    let ok = statuses.iter().filter(|s| **s == StatusCode::OK).count();
    assert_eq!(ok, 4, "{statuses:?}");
    assert_eq!(statuses[4], StatusCode::TOO_MANY_REQUESTS);

    // The raw API key never reaches Redis.
    let mut conn = server
        .client()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("*")
        .query_async(&mut conn)
        .await
        .unwrap();
    // One key, the identity in it a 12-character digest.
    assert_eq!(keys.len(), 1, "{keys:?}");
    let tag = keys[0]
        .strip_prefix("fleetgate:ping:{")
        .and_then(|rest| rest.strip_suffix('}'));
    assert_eq!(tag.map(str::len), Some(12), "{keys:?}");
    assert!(!keys[0].contains("shared"));
}

#[tokio::test]
async fn real_server_keys_by_connection_address() {
    let limiter = Limiter::new(slow_policy(2), MemoryStore::new());
    let app = app(RateLimitLayer::new(limiter));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
    });
    let mut statuses = Vec::new();
    for _ in 0..3 {
        statuses.push(raw_get(addr, "/api/ping").await);
    }
    assert_eq!(statuses, ["200", "200", "429"]);
    server.abort();
}

/// One HTTP/1.1 GET over a fresh connection; returns the status code.
async fn raw_get(addr: SocketAddr, path: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req = format!("GET {path} HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\n\r\n");
    stream.write_all(req.as_bytes()).await.unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    response.split(' ').nth(1).unwrap_or_default().to_owned()
}

#[tokio::test]
async fn shadow_mode_lets_keyless_requests_and_store_failures_through() {
    let limiter = Limiter::new(slow_policy(1), MemoryStore::new());
    let app1 = app(RateLimitLayer::new(limiter)
        .key(HeaderKey::new("x-api-key"))
        .shadow(true));
    let mut req = Request::get("/api/ping").body(Body::empty()).unwrap();
    req.extensions_mut().insert(());
    assert_eq!(send(&app1, req).await.status(), StatusCode::OK);

    let server = RedisServer::start();
    let store = RedisStore::builder(server.url())
        .timeout(Duration::from_millis(300))
        .connect()
        .await
        .unwrap();
    server.stop();
    let app2 = app(RateLimitLayer::new(Limiter::new(slow_policy(1), store))
        .on_store_error(FailurePolicy::Closed)
        .shadow(true));
    assert_eq!(
        send(&app2, request("192.0.2.6", None)).await.status(),
        StatusCode::OK
    );
}

#[tokio::test]
async fn stacked_layers_list_every_limit_and_keep_the_inner_rejection() {
    let per_key = Limiter::new(slow_policy(1), MemoryStore::new());
    let global = Limiter::new(
        Policy::single("global", Limit::new(Rate::per_second(100)).unwrap()).unwrap(),
        MemoryStore::new(),
    );
    let app = Router::new()
        .route("/api/ping", get(|| async { "pong" }))
        .layer(RateLimitLayer::new(per_key).headers(HeaderStyle::Both))
        .layer(
            RateLimitLayer::new(global)
                .key(GlobalKey::new())
                .headers(HeaderStyle::Both),
        );
    let ok = send(&app, request("192.0.2.7", None)).await;
    assert_eq!(ok.status(), StatusCode::OK);
    assert_eq!(
        header(&ok, "ratelimit-policy"),
        Some("\"1/h\";q=1;w=3600, \"100/s\";q=100;w=1")
    );
    let denied = send(&app, request("192.0.2.7", None)).await;
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    let draft = header(&denied, "ratelimit").unwrap();
    assert!(draft.starts_with("\"1/h\";r=0;t="), "{draft}");
    assert!(draft.contains(", \"100/s\";r=98;t=1"), "{draft}");
    // The inner (per-key) layer's legacy headers and Retry-After stand.
    assert_eq!(header(&denied, "x-ratelimit-limit"), Some("1"));
    assert_eq!(header(&denied, "x-ratelimit-remaining"), Some("0"));
    assert!(
        header(&denied, "retry-after")
            .unwrap()
            .parse::<u64>()
            .unwrap()
            > 3000
    );
}

#[tokio::test]
async fn policy_window_is_exact_for_uneven_rates() {
    let limiter = Limiter::new(
        Policy::single("p", Limit::new(Rate::per_second(3)).unwrap()).unwrap(),
        MemoryStore::new(),
    );
    let app = app(RateLimitLayer::new(limiter));
    let res = send(&app, request("192.0.2.8", None)).await;
    assert_eq!(header(&res, "ratelimit-policy"), Some("\"3/s\";q=3;w=1"));
}

#[tokio::test]
async fn forwarded_client_ip_through_the_layer() {
    let limiter = Limiter::new(slow_policy(1), MemoryStore::new());
    let fwd = fleetgate::key::ForwardedIp::new(["10.0.0.0/8"]).unwrap();
    let app = app(RateLimitLayer::new(limiter).key(fwd));
    let via_proxy = |client: &str, spoof: &str| {
        let mut req = request("10.0.0.1", None);
        req.headers_mut()
            .insert("forwarded", format!("for={spoof}").parse().unwrap());
        req.headers_mut().insert(
            "x-forwarded-for",
            format!("{spoof}, {client}").parse().unwrap(),
        );
        req
    };
    assert_eq!(
        send(&app, via_proxy("198.51.100.1", "1.1.1.1"))
            .await
            .status(),
        StatusCode::OK
    );
    // The same client cannot escape its limit by changing what it sends.
    assert_eq!(
        send(&app, via_proxy("198.51.100.1", "2.2.2.2"))
            .await
            .status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(
        send(&app, via_proxy("198.51.100.2", "2.2.2.2"))
            .await
            .status(),
        StatusCode::OK
    );
    // A direct client's header is ignored: it is keyed by its own address.
    let mut direct = request("203.0.113.50", None);
    direct
        .headers_mut()
        .insert("x-forwarded-for", "198.51.100.3".parse().unwrap());
    assert_eq!(send(&app, direct).await.status(), StatusCode::OK);
    let mut again = request("203.0.113.50", None);
    again
        .headers_mut()
        .insert("x-forwarded-for", "198.51.100.4".parse().unwrap());
    assert_eq!(
        send(&app, again).await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
}

#[tokio::test]
async fn zero_cost_requests_pass_without_charging() {
    let limiter = Limiter::new(slow_policy(1), MemoryStore::new());
    let app = app(RateLimitLayer::new(limiter).cost(0));
    for _ in 0..3 {
        let res = send(&app, request("192.0.2.10", None)).await;
        assert_eq!(res.status(), StatusCode::OK);
        assert_eq!(header(&res, "ratelimit"), Some("\"1/h\";r=1;t=0"));
    }
}

#[tokio::test]
async fn polling_after_completion_does_not_panic() {
    use std::future::Future;
    use std::task::{Context, Poll, Waker};
    use tower::Service;

    let server = RedisServer::start();
    let redis = RedisStore::builder(server.url())
        .timeout(Duration::from_secs(2))
        .connect()
        .await
        .unwrap();
    for limiter in [
        Limiter::new(slow_policy(1), MemoryStore::new()),
        Limiter::new(slow_policy(1), redis),
    ] {
        let mut svc = RateLimitLayer::new(limiter)
            .key(GlobalKey::new())
            .typed_errors()
            .layer(service_fn(|_: ()| async {
                Ok::<_, std::convert::Infallible>("done")
            }));
        for expect_ok in [true, false] {
            std::future::poll_fn(|cx| svc.poll_ready(cx)).await.unwrap();
            let mut fut = std::pin::pin!(svc.call(()));
            assert_eq!(fut.as_mut().await.is_ok(), expect_ok);
            let Poll::Ready(again) = fut.as_mut().poll(&mut Context::from_waker(Waker::noop()))
            else {
                panic!("a finished future stays finished");
            };
            assert!(again.is_err());
        }
    }
}

#[tokio::test]
async fn inner_readiness_is_respected() {
    use std::future::Future;
    use std::task::{Context, Waker};
    use tower::Service;

    let server = RedisServer::start();
    let redis = RedisStore::builder(server.url())
        .timeout(Duration::from_secs(2))
        .connect()
        .await
        .unwrap();
    // Memory decides inside `call`; Redis decides in the response future.
    for limiter in [
        Limiter::new(slow_policy(10), MemoryStore::new()),
        Limiter::new(slow_policy(10), redis),
    ] {
        // The inner service admits one call at a time; its permit travels
        // with the call, so the layer's service is not ready until that call
        // ends.
        let (release, released) = tokio::sync::oneshot::channel::<()>();
        let released = std::sync::Arc::new(tokio::sync::Mutex::new(Some(released)));
        let handler = service_fn(move |_: ()| {
            let released = released.clone();
            async move {
                if let Some(rx) = released.lock().await.take() {
                    let _ = rx.await;
                }
                Ok::<_, std::convert::Infallible>(())
            }
        });
        let mut svc = ServiceBuilder::new()
            .layer(
                RateLimitLayer::new(limiter)
                    .key(GlobalKey::new())
                    .typed_errors(),
            )
            .concurrency_limit(1)
            .service(handler);
        svc.ready().await.unwrap();
        let first = tokio::spawn(svc.call(()));
        {
            let mut ready = std::pin::pin!(std::future::poll_fn(|cx| svc.poll_ready(cx)));
            let mut cx = Context::from_waker(Waker::noop());
            assert!(
                ready.as_mut().poll(&mut cx).is_pending(),
                "inner permit is in use"
            );
            release.send(()).unwrap();
            first.await.unwrap().unwrap();
            ready.await.unwrap();
        }
        svc.call(()).await.unwrap();
    }
}
