//! ConcurrencyLimitLayer through real axum routers, on the memory store and
//! on a private Redis: the cap holds under many callers on several
//! connections, no lease is lost however a request ends, renewal keeps a
//! slow stream admitted, and refusals look as configured.
use crate::common;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use crate::handlers::{self, EndlessBody, InFlight, Started, quiet_deliberate_panics};
use axum::Router;
use axum::body::Body;
use axum::routing::get;
use bytes::Bytes;
use common::{RedisServer, redis_store};
use fleetgate::concurrency::{ConcurrencyLimitError, ConcurrencyLimitLayer, ConcurrencyLimiter};
use fleetgate::key::{GlobalKey, HeaderKey, Key, key_fn};
use fleetgate::{ConcurrencyPolicy, ConfigError, FailurePolicy, MemoryStore, OnMissingKey};
use http::{Request, Response, StatusCode};
use http_body::Frame;
use http_body_util::BodyExt;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinSet;
use tower::{Service, ServiceBuilder, ServiceExt, service_fn};

// ---------------------------------------------------------------------------
// Helpers.

/// A body that yields `left` chunks, one every `every`.
struct SlowBody {
    every: Duration,
    left: u32,
    sleep: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl http_body::Body for SlowBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if self.left == 0 {
            return Poll::Ready(None);
        }
        let every = self.every;
        let sleep = self
            .sleep
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(every)));
        ready!(sleep.as_mut().poll(cx));
        self.sleep = None;
        self.left -= 1;
        Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(b"tick\n")))))
    }

    fn is_end_stream(&self) -> bool {
        self.left == 0
    }
}

/// Keyed by the `x-api-key` header, unhashed, so that tests can name keys.
fn by_api_key() -> impl fleetgate::key::KeyExtractor<Request<Body>> + Clone {
    key_fn(|req: &Request<Body>| {
        req.headers()
            .get("x-api-key")
            .and_then(|v| v.to_str().ok())
            .map(|v| Key::new(format!("t:{v}")))
    })
}

fn policy(name: &str, max: u64) -> ConcurrencyPolicy {
    ConcurrencyPolicy::builder(name, max)
        .lease_ttl(Duration::from_secs(30))
        .build()
        .unwrap()
}

/// Where to count the leases a test left behind.
#[derive(Clone, Copy)]
enum Held<'a> {
    Memory(&'a MemoryStore),
    Redis(&'a RedisServer),
}

impl Held<'_> {
    /// Every lease recorded: the memory store's count, or the members of
    /// every lease set in Redis.
    async fn count(self) -> usize {
        match self {
            Held::Memory(store) => store.lease_count(),
            Held::Redis(server) => server.leases_held().await,
        }
    }
}

fn request(path: &str, api_key: &str) -> Request<Body> {
    Request::get(path)
        .header("x-api-key", api_key)
        .body(Body::empty())
        .unwrap()
}

// ---------------------------------------------------------------------------
// The cap is never exceeded.

/// A router whose `/gated` handler counts itself in flight and waits for
/// the gate to open, and whose `/busy` handler stays a little while.
fn counting_app(
    limiter: ConcurrencyLimiter,
    inflight: Arc<InFlight>,
    gate: watch::Receiver<bool>,
    entered: mpsc::UnboundedSender<()>,
) -> Router {
    let gated = {
        let inflight = inflight.clone();
        move || {
            let inflight = inflight.clone();
            let mut gate = gate.clone();
            let entered = entered.clone();
            async move {
                inflight.enter();
                let _ = entered.send(());
                let _ = gate.wait_for(|open| *open).await;
                inflight.leave();
                "done"
            }
        }
    };
    let busy = move || {
        let inflight = inflight.clone();
        async move {
            inflight.enter();
            for _ in 0..20 {
                tokio::task::yield_now().await;
            }
            inflight.leave();
            "done"
        }
    };
    Router::new()
        .route("/gated", get(gated))
        .route("/busy", get(busy))
        .route_layer(ConcurrencyLimitLayer::new(limiter).key(by_api_key()))
}

/// `instances` routers (each with its own limiter; with Redis, each its own
/// store and connection) share one cap of `cap` for one API key.
async fn cap_holds(limiters: Vec<ConcurrencyLimiter>, cap: usize) {
    let inflight = Arc::new(InFlight::default());
    let (entered_tx, mut entered) = mpsc::unbounded_channel();
    let (open, gate) = watch::channel(false);
    let apps: Vec<Router> = limiters
        .iter()
        .map(|l| {
            counting_app(
                l.clone(),
                inflight.clone(),
                gate.clone(),
                entered_tx.clone(),
            )
        })
        .collect();

    // Rounds: 16 callers at once; exactly `cap` get in and wait at the
    // gate, the others are refused at once.
    const CALLERS: usize = 16;
    for round in 0..3 {
        let _ = open.send(false);
        let (done_tx, mut done) = mpsc::unbounded_channel();
        for i in 0..CALLERS {
            let app = apps[i % apps.len()].clone();
            let done = done_tx.clone();
            tokio::spawn(async move {
                let response = app.oneshot(request("/gated", "shared")).await.unwrap();
                let status = response.status();
                let _ = response.into_body().collect().await;
                let _ = done.send(status);
            });
        }
        for _ in 0..CALLERS - cap {
            let status = tokio::time::timeout(Duration::from_secs(10), done.recv())
                .await
                .expect("fewer refusals than callers above the cap")
                .unwrap();
            assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "round {round}");
        }
        for _ in 0..cap {
            tokio::time::timeout(Duration::from_secs(10), entered.recv())
                .await
                .expect("admitted callers never reached the handler")
                .unwrap();
        }
        assert_eq!(inflight.now(), cap, "round {round}");
        assert!(entered.try_recv().is_err(), "more than {cap} entered");
        let _ = open.send(true);
        for _ in 0..cap {
            assert_eq!(done.recv().await.unwrap(), StatusCode::OK, "round {round}");
        }
        for l in &limiters {
            l.releases_settled().await;
        }
    }

    // Free for all: 32 callers, 600 requests, on every instance.
    let refused = Arc::new(AtomicUsize::new(0));
    let mut set = JoinSet::new();
    for worker in 0..32 {
        let app = apps[worker % apps.len()].clone();
        let refused = refused.clone();
        set.spawn(async move {
            for _ in 0..600 / 32 {
                let response = app
                    .clone()
                    .oneshot(request("/busy", "shared"))
                    .await
                    .unwrap();
                match response.status() {
                    StatusCode::OK => {}
                    StatusCode::TOO_MANY_REQUESTS => {
                        refused.fetch_add(1, Ordering::SeqCst);
                    }
                    other => panic!("unexpected {other}"),
                }
                let _ = response.into_body().collect().await;
            }
        });
    }
    while let Some(joined) = set.join_next().await {
        joined.unwrap();
    }
    assert!(
        inflight.max() <= cap,
        "{} in flight with a cap of {cap}",
        inflight.max()
    );
    assert!(
        refused.load(Ordering::SeqCst) > 0,
        "32 callers never hit a cap of {cap}"
    );
    drop(entered_tx);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cap_holds_under_many_callers_on_the_memory_store() {
    let store = MemoryStore::new();
    let limiters = (0..2)
        .map(|_| ConcurrencyLimiter::new(policy("cap", 3), store.clone()))
        .collect();
    cap_holds(limiters, 3).await;
    assert_eq!(store.lease_count(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cap_holds_across_instances_sharing_one_redis() {
    let server = RedisServer::start();
    let mut limiters = Vec::new();
    // Four instances: four stores, four connections.
    for _ in 0..4 {
        limiters.push(ConcurrencyLimiter::new(
            policy("cap", 3),
            redis_store(&server).await,
        ));
    }
    cap_holds(limiters.clone(), 3).await;
    for l in &limiters {
        l.releases_settled().await;
    }
    assert_eq!(Held::Redis(&server).count().await, 0);
}

// ---------------------------------------------------------------------------
// No lease is lost, however a request ends.

fn lifecycle_app(limiter: ConcurrencyLimiter, dropped: mpsc::UnboundedSender<()>) -> Router {
    Router::new()
        .route("/ok", get(|| async { "ok" }))
        .route("/hang", get(handlers::hang))
        .route("/panic", get(handlers::panic))
        .route(
            "/stream",
            get(move || {
                let dropped = dropped.clone();
                async move { Response::new(Body::new(EndlessBody(Some(dropped)))) }
            }),
        )
        .route_layer(ConcurrencyLimitLayer::new(limiter).key(by_api_key()))
}

/// One request, ended in one of five ways.
async fn one_request(app: Router, i: usize) {
    match i % 5 {
        // Finishes normally; the body is read to its end.
        0 => {
            let response = app.oneshot(request("/ok", "life")).await.unwrap();
            assert_eq!(response.status(), StatusCode::OK);
            let body = response.into_body().collect().await.unwrap().to_bytes();
            assert_eq!(&body[..], b"ok");
        }
        // Cancelled mid-flight, while the handler runs.
        1 => {
            let (started, handler_started) = Started::new();
            let mut req = request("/hang", "life");
            req.extensions_mut().insert(started);
            let call = app.oneshot(req);
            tokio::pin!(call);
            tokio::select! {
                _ = &mut call => panic!("a hanging handler answered"),
                ok = handler_started => ok.expect("handler started"),
            }
        }
        // The handler panics.
        2 => {
            let joined = tokio::spawn(app.oneshot(request("/panic", "life"))).await;
            assert!(joined.expect_err("the handler panics").is_panic());
        }
        // Streams a body that the client drops after one frame.
        3 => {
            let response = app.oneshot(request("/stream", "life")).await.unwrap();
            assert_eq!(response.status(), StatusCode::OK);
            let mut body = response.into_body();
            let frame = body.frame().await.unwrap().unwrap();
            assert!(frame.is_data());
        }
        // Cancelled before the store has answered (with Redis: the acquire
        // was sent and may be recorded).
        _ => {
            let mut req = request("/hang", "life");
            req.extensions_mut().insert(Started::default());
            let call = app.oneshot(req);
            tokio::pin!(call);
            tokio::select! {
                biased;
                _ = &mut call => panic!("a hanging handler answered"),
                _ = std::future::ready(()) => {}
            }
        }
    }
}

async fn no_lease_lost(limiter: ConcurrencyLimiter, held: Held<'_>) {
    quiet_deliberate_panics();
    let (dropped_tx, _dropped) = mpsc::unbounded_channel();
    let app = lifecycle_app(limiter.clone(), dropped_tx);
    // The count sees a lease while a request is in flight (the test can
    // fail), and none after it was cancelled.
    let (started, handler_started) = Started::new();
    let mut req = request("/hang", "life");
    req.extensions_mut().insert(started);
    let call = tokio::spawn(app.clone().oneshot(req));
    handler_started.await.unwrap();
    assert_eq!(held.count().await, 1);
    call.abort();
    assert!(call.await.unwrap_err().is_cancelled());
    limiter.releases_settled().await;
    assert_eq!(held.count().await, 0);

    const REQUESTS: usize = 10_000;
    const WORKERS: usize = 32;
    let mut set = JoinSet::new();
    for worker in 0..WORKERS {
        let app = app.clone();
        set.spawn(async move {
            for i in (worker..REQUESTS).step_by(WORKERS) {
                one_request(app.clone(), i).await;
            }
        });
    }
    while let Some(joined) = set.join_next().await {
        joined.unwrap();
    }
    limiter.releases_settled().await;
    assert_eq!(limiter.pending_releases(), 0);
    assert_eq!(held.count().await, 0, "leases were lost");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_lease_is_lost_on_the_memory_store() {
    let store = MemoryStore::new();
    let limiter = ConcurrencyLimiter::new(policy("life", 1000), store.clone());
    no_lease_lost(limiter, Held::Memory(&store)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_lease_is_lost_on_redis() {
    let server = RedisServer::start();
    let limiter = ConcurrencyLimiter::new(policy("life", 1000), redis_store(&server).await);
    no_lease_lost(limiter, Held::Redis(&server)).await;
    let mut conn = server
        .client()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    // What may stay is the lease set of releases that overtook their
    // cancelled acquires: tombstones only (lua/lease.lua), going by
    // themselves within a few store timeouts.
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("*")
        .query_async(&mut conn)
        .await
        .unwrap();
    for key in &keys {
        assert!(key.ends_with(":lease"), "left behind: {keys:?}");
        let held: u64 = redis::cmd("ZCOUNT")
            .arg(key)
            .arg("(0")
            .arg("+inf")
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(held, 0, "{key}");
        let ttl: i64 = redis::cmd("PTTL")
            .arg(key)
            .query_async(&mut conn)
            .await
            .unwrap();
        // -2: it expired since it was listed.
        assert!(
            ttl == -2 || (ttl > 0 && ttl <= 120_000),
            "{key} expires in {ttl} ms"
        );
    }
}

/// Over a real TCP connection: the client reads part of a streaming
/// response and hangs up; the server drops the body and the lease with it.
#[tokio::test]
async fn a_client_that_hangs_up_mid_stream_frees_its_slot() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let store = MemoryStore::new();
    let limiter = ConcurrencyLimiter::new(policy("tcp", 1), store.clone());
    let (dropped_tx, mut dropped) = mpsc::unbounded_channel();
    let app = lifecycle_app(limiter, dropped_tx);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
    });

    let mut client = tokio::net::TcpStream::connect(addr).await.unwrap();
    client
        .write_all(b"GET /stream HTTP/1.1\r\nhost: x\r\nx-api-key: tcp\r\n\r\n")
        .await
        .unwrap();
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    while !seen.windows(5).any(|w| w == b"data\n") {
        let n = client.read(&mut buf).await.unwrap();
        assert!(n > 0, "connection closed early");
        seen.extend_from_slice(&buf[..n]);
    }
    assert!(seen.starts_with(b"HTTP/1.1 200"));
    assert_eq!(Held::Memory(&store).count().await, 1);
    drop(client);
    // The server notices on its next write and drops the body; the guard
    // goes first (the memory store releases in place).
    dropped.recv().await.unwrap();
    assert_eq!(Held::Memory(&store).count().await, 0);
    server.abort();
}

// ---------------------------------------------------------------------------
// Renewal.

fn slow_stream_app(limiter: ConcurrencyLimiter, every: Duration, chunks: u32) -> Router {
    Router::new()
        .route(
            "/slow",
            get(move || async move {
                Response::new(Body::new(SlowBody {
                    every,
                    left: chunks,
                    sleep: None,
                }))
            }),
        )
        .route_layer(ConcurrencyLimitLayer::new(limiter).key(GlobalKey::new()))
}

async fn status_of(app: &Router) -> StatusCode {
    let response = app.clone().oneshot(request("/slow", "x")).await.unwrap();
    let status = response.status();
    if status == StatusCode::OK {
        // Do not hold the slot: drop the body unread.
        drop(response);
    }
    status
}

/// Streams `chunks` frames of one response; after each but the last, a second caller
/// is refused (the one slot is held), or (without renewal) admitted once
/// the TTL has passed. Returns the statuses the second caller saw.
async fn second_caller_while_streaming(
    limiter: &ConcurrencyLimiter,
    app: &Router,
    chunks: u32,
) -> Vec<StatusCode> {
    let response = app.clone().oneshot(request("/slow", "x")).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let mut body = response.into_body();
    let mut seen = Vec::new();
    // After the last frame the body has ended and the slot is free: check
    // after every frame but that one.
    for _ in 1..chunks {
        body.frame().await.unwrap().unwrap();
        seen.push(status_of(app).await);
        limiter.releases_settled().await;
    }
    body.frame().await.unwrap().unwrap();
    assert!(body.frame().await.is_none(), "longer than expected");
    seen
}

#[tokio::test(start_paused = true)]
async fn renewal_keeps_a_slow_stream_admitted_past_the_ttl_memory() {
    // TTL 1 s, renewed every 300 ms; the stream lasts 2.5 s.
    let renewing = ConcurrencyPolicy::builder("slow", 1)
        .lease_ttl(Duration::from_secs(1))
        .renew_every(Duration::from_millis(300))
        .build()
        .unwrap();
    let limiter = ConcurrencyLimiter::new(renewing, crate::paused_memory_store());
    let app = slow_stream_app(limiter.clone(), Duration::from_millis(250), 10);
    let seen = second_caller_while_streaming(&limiter, &app, 10).await;
    assert!(
        seen.iter().all(|s| *s == StatusCode::TOO_MANY_REQUESTS),
        "the stream lost its slot: {seen:?}"
    );
    // The body ended: the slot is free, and renewal has stopped.
    assert_eq!(status_of(&app).await, StatusCode::OK);

    // Control: without renewal the same stream loses its slot after 1 s.
    let expiring = ConcurrencyPolicy::builder("slow2", 1)
        .lease_ttl(Duration::from_secs(1))
        .no_renewal()
        .build()
        .unwrap();
    let limiter = ConcurrencyLimiter::new(expiring, crate::paused_memory_store());
    let app = slow_stream_app(limiter.clone(), Duration::from_millis(250), 10);
    let seen = second_caller_while_streaming(&limiter, &app, 10).await;
    assert_eq!(seen[0], StatusCode::TOO_MANY_REQUESTS);
    // 2.25 s in, long past the 1 s TTL.
    assert_eq!(seen[8], StatusCode::OK, "{seen:?}");
}

#[tokio::test]
async fn renewal_keeps_a_slow_stream_admitted_past_the_ttl_redis() {
    let server = RedisServer::start();
    let store = redis_store(&server).await;
    // TTL 1 s on Redis' clock, renewed every 100 ms; the stream lasts at
    // least 2.5 s, two and a half TTLs. A renewal may be late by up to
    // 900 ms on a busy machine before the lease would lapse.
    let policy = ConcurrencyPolicy::builder("slow", 1)
        .lease_ttl(Duration::from_secs(1))
        .renew_every(Duration::from_millis(100))
        .build()
        .unwrap();
    let limiter = ConcurrencyLimiter::new(policy, store.clone());
    let app = slow_stream_app(limiter.clone(), Duration::from_millis(100), 25);
    let seen = second_caller_while_streaming(&limiter, &app, 25).await;
    assert!(
        seen.iter().all(|s| *s == StatusCode::TOO_MANY_REQUESTS),
        "the stream lost its slot: {seen:?}"
    );
    limiter.releases_settled().await;
    assert_eq!(status_of(&app).await, StatusCode::OK);
}

// ---------------------------------------------------------------------------
// Refusals.

#[tokio::test]
async fn refusal_is_429_with_retry_after_and_other_keys_pass() {
    let limiter = ConcurrencyLimiter::new(policy("one", 1), MemoryStore::new());
    let (open, gate) = watch::channel(false);
    let (entered_tx, mut entered) = mpsc::unbounded_channel();
    let app = counting_app(limiter, Arc::default(), gate, entered_tx);
    let first = tokio::spawn(app.clone().oneshot(request("/gated", "a")));
    entered.recv().await.unwrap();

    let refused = app.clone().oneshot(request("/gated", "a")).await.unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(refused.headers()["retry-after"], "1");
    let body = refused.into_body().collect().await.unwrap().to_bytes();
    assert!(
        std::str::from_utf8(&body).unwrap().contains("one"),
        "{body:?}"
    );

    // Another key is not affected.
    let other = tokio::spawn(app.clone().oneshot(request("/gated", "b")));
    entered.recv().await.unwrap();
    let _ = open.send(true);
    assert_eq!(other.await.unwrap().unwrap().status(), StatusCode::OK);
    assert_eq!(first.await.unwrap().unwrap().status(), StatusCode::OK);
}

#[tokio::test]
async fn status_and_retry_after_are_configurable() {
    let limiter = ConcurrencyLimiter::new(policy("cfg", 1), MemoryStore::new());
    let layer = ConcurrencyLimitLayer::new(limiter)
        .key(GlobalKey::new())
        .status(StatusCode::SERVICE_UNAVAILABLE)
        .unwrap()
        .retry_after(Duration::from_millis(2500));
    let (open, gate) = watch::channel(false);
    let (entered_tx, mut entered) = mpsc::unbounded_channel();
    let app = Router::new()
        .route(
            "/",
            get(move || {
                let mut gate = gate.clone();
                let entered = entered_tx.clone();
                async move {
                    let _ = entered.send(());
                    let _ = gate.wait_for(|open| *open).await;
                    "ok"
                }
            }),
        )
        .route_layer(layer);
    let first = tokio::spawn(app.clone().oneshot(request("/", "k")));
    entered.recv().await.unwrap();
    let refused = app.clone().oneshot(request("/", "k")).await.unwrap();
    assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(refused.headers()["retry-after"], "3");
    let _ = open.send(true);
    assert_eq!(first.await.unwrap().unwrap().status(), StatusCode::OK);

    // A custom rejection.
    let custom = ConcurrencyLimitLayer::new(ConcurrencyLimiter::new(
        policy("cfg", 1),
        MemoryStore::new(),
    ))
    .key(GlobalKey::new())
    .rejection(|r| {
        let mut response = r.default_response();
        *response.body_mut() = Bytes::from(format!("busy: {}", r.policy().max_in_flight()));
        response
    });
    let mut svc =
        ServiceBuilder::new()
            .layer(custom)
            .service(service_fn(|_req: Request<Body>| async {
                Ok::<_, Infallible>(Response::new(Body::from("ok")))
            }));
    let held = svc
        .ready()
        .await
        .unwrap()
        .call(request("/", "k"))
        .await
        .unwrap();
    let refused = svc
        .ready()
        .await
        .unwrap()
        .call(request("/", "k"))
        .await
        .unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    let body = refused.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&body[..], b"busy: 1");
    drop(held);

    assert_eq!(
        ConcurrencyLimitLayer::new(ConcurrencyLimiter::new(
            policy("cfg", 1),
            MemoryStore::new()
        ))
        .status(StatusCode::OK)
        .unwrap_err(),
        ConfigError::RejectionStatus {
            status: StatusCode::OK
        }
    );
}

#[test]
fn bad_policies_are_refused() {
    use fleetgate::concurrency::ConcurrencyPolicy as P;
    assert_eq!(P::new("x", 0).unwrap_err(), ConfigError::ZeroInFlight);
    assert!(matches!(
        P::new("bad name", 1).unwrap_err(),
        ConfigError::InvalidName { .. }
    ));
    for ttl in [
        Duration::ZERO,
        Duration::from_micros(999),
        Duration::from_secs(86_401),
    ] {
        assert_eq!(
            P::builder("x", 1).lease_ttl(ttl).build().unwrap_err(),
            ConfigError::LeaseTtl { ttl }
        );
    }
    let ttl = Duration::from_secs(3);
    for every in [Duration::ZERO, ttl, 2 * ttl] {
        assert_eq!(
            P::builder("x", 1)
                .lease_ttl(ttl)
                .renew_every(every)
                .build()
                .unwrap_err(),
            ConfigError::RenewInterval { every, ttl }
        );
    }
    let ok = P::builder("x", 4).lease_ttl(ttl).build().unwrap();
    assert_eq!(ok.renew_every(), Some(Duration::from_secs(1)));
    assert_eq!(
        P::builder("x", 4)
            .no_renewal()
            .build()
            .unwrap()
            .renew_every(),
        None
    );
}

#[tokio::test]
async fn typed_errors_for_services_that_are_not_http() {
    let limiter = ConcurrencyLimiter::new(policy("jobs", 1), MemoryStore::new());
    let mut svc = ServiceBuilder::new()
        .layer(
            ConcurrencyLimitLayer::new(limiter.clone())
                .key(GlobalKey::new())
                .typed_errors(),
        )
        .service(service_fn(|done: oneshot::Receiver<()>| async move {
            let _ = done.await;
            Ok::<_, Infallible>("done")
        }));
    let (finish, done) = oneshot::channel();
    let first = svc.ready().await.unwrap().call(done);
    let (_tx, never) = oneshot::channel();
    let err = svc.ready().await.unwrap().call(never).await.unwrap_err();
    assert_eq!(
        *err.downcast::<ConcurrencyLimitError>().unwrap(),
        ConcurrencyLimitError::InFlight {
            limit: "jobs".into(),
            max_in_flight: 1
        }
    );
    finish.send(()).unwrap();
    assert_eq!(first.await.unwrap(), "done");
    // The lease ended with the call.
    let (finish, done) = oneshot::channel();
    finish.send(()).unwrap();
    assert_eq!(svc.ready().await.unwrap().call(done).await.unwrap(), "done");
}

#[tokio::test]
async fn missing_keys_and_store_failures_follow_the_layer_settings() {
    let app = |layer: ConcurrencyLimitLayer<HeaderKey>| {
        Router::new()
            .route("/", get(|| async { "ok" }))
            .route_layer(layer)
    };
    let no_key = || Request::get("/").body(Body::empty()).unwrap();
    let memory = || ConcurrencyLimiter::new(policy("keys", 1), MemoryStore::new());

    let rejecting = app(ConcurrencyLimitLayer::new(memory()).key(HeaderKey::new("x-api-key")));
    assert_eq!(
        rejecting.oneshot(no_key()).await.unwrap().status(),
        StatusCode::BAD_REQUEST
    );
    let allowing = app(ConcurrencyLimitLayer::new(memory())
        .key(HeaderKey::new("x-api-key"))
        .on_missing_key(OnMissingKey::Allow));
    assert_eq!(
        allowing.oneshot(no_key()).await.unwrap().status(),
        StatusCode::OK
    );

    let down = common::unreachable_store(Duration::from_millis(100)).await;
    let down = || ConcurrencyLimiter::new(policy("down", 1), down.clone());
    let open = app(ConcurrencyLimitLayer::new(down()).key(HeaderKey::new("x-api-key")));
    assert_eq!(
        open.oneshot(request("/", "k")).await.unwrap().status(),
        StatusCode::OK
    );
    let closed = app(ConcurrencyLimitLayer::new(down())
        .key(HeaderKey::new("x-api-key"))
        .on_store_error(FailurePolicy::Closed));
    let refused = closed.oneshot(request("/", "k")).await.unwrap();
    assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(refused.headers()["retry-after"], "1");
}
