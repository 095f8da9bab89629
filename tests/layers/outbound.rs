//! Outbound clients: the rate-limit layer in waiting mode around a tower
//! client of someone else's API (DESIGN.md, "Reserve mode").
//!
//! The upstream here is an in-process tower service that enforces its own
//! windows (a log of accepted calls per window) and answers 429 when they
//! are exceeded, so every test can count the 429s the limiter earned.
//! Memory-store tests run on tokio's paused clock, which the memory store
//! follows, so their timings are exact. Redis tests run on a private
//! `redis-server` in real time and assert on counts and orders, with
//! timings only as lower bounds.
use crate::common;

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use common::{RedisServer, redis_store};
use fleetgate::clock::ManualClock;
use fleetgate::key::{GlobalKey, HeaderKey, HostKey};
use fleetgate::mode;
use fleetgate::rate_limit::{RateLimit, RetryAfter, within_window};
use fleetgate::{
    BoxError, Decision, FailurePolicy, Key, Limit, Limiter, MemoryStore, Policy, Rate,
    RateLimitError, RateLimitLayer, RedisStore, Store, TimeSource,
};
use tokio::time::Instant;
use tower::{Layer, Service, ServiceExt};

type Req = http::Request<()>;
type Res = http::Response<()>;
type Client<S> = RateLimit<S, HeaderKey, u64, mode::TypedErrors, RetryAfter>;

const MS: Duration = Duration::from_millis(1);
const S: Duration = Duration::from_secs(1);

// ---------------------------------------------------------------------------
// The upstream API and a readiness probe.

/// An upstream API that enforces "at most n calls in any window w" itself.
#[derive(Clone)]
struct Upstream(Arc<Mutex<UpstreamLog>>);

struct UpstreamLog {
    windows: Vec<(usize, Duration)>,
    accepted: Vec<Instant>,
    calls: Vec<Call>,
    /// Answer the next call with 429 and `Retry-After: <secs>`.
    pause_next: Option<u64>,
}

#[derive(Clone, Debug)]
struct Call {
    at: Instant,
    label: String,
    status: u16,
}

impl Upstream {
    fn new(windows: &[(usize, Duration)]) -> Self {
        Upstream(Arc::new(Mutex::new(UpstreamLog {
            windows: windows.to_vec(),
            accepted: Vec::new(),
            calls: Vec::new(),
            pause_next: None,
        })))
    }

    fn unlimited() -> Self {
        Upstream::new(&[])
    }

    fn pause_next(&self, secs: u64) {
        self.0.lock().unwrap().pause_next = Some(secs);
    }

    fn calls(&self) -> Vec<Call> {
        self.0.lock().unwrap().calls.clone()
    }

    fn labels(&self) -> Vec<String> {
        self.calls().into_iter().map(|c| c.label).collect()
    }

    fn count(&self, status: u16) -> usize {
        self.calls().iter().filter(|c| c.status == status).count()
    }
}

impl Service<Req> for Upstream {
    type Response = Res;
    type Error = Infallible;
    type Future = std::future::Ready<Result<Res, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Req) -> Self::Future {
        let now = Instant::now();
        let mut log = self.0.lock().unwrap();
        let full = log.windows.iter().any(|&(n, w)| {
            log.accepted
                .iter()
                .filter(|&&t| now.duration_since(t) < w)
                .count()
                >= n
        });
        let (status, retry_after) = match log.pause_next.take() {
            Some(secs) => (429, Some(secs)),
            None if full => (429, Some(1)),
            None => {
                log.accepted.push(now);
                (200, None)
            }
        };
        let label = req
            .headers()
            .get("x-call")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        log.calls.push(Call {
            at: now,
            label,
            status,
        });
        let mut res = http::Response::builder().status(status);
        if let Some(secs) = retry_after {
            res = res.header("retry-after", secs.to_string());
        }
        std::future::ready(Ok(res.body(()).unwrap()))
    }
}

/// Wraps a service and checks tower's readiness contract: `call` only on a
/// clone whose `poll_ready` said yes since its last call. It answers
/// `Pending` (and wakes itself) on every other `poll_ready`, so that
/// readiness is never a given.
struct Probe<S> {
    inner: S,
    ready: bool,
    stalled: bool,
    violations: Arc<AtomicUsize>,
}

impl<S> Probe<S> {
    fn new(inner: S) -> Self {
        Probe {
            inner,
            ready: false,
            stalled: false,
            violations: Arc::default(),
        }
    }
}

impl<S: Clone> Clone for Probe<S> {
    /// A clone of a ready service is not ready itself.
    fn clone(&self) -> Self {
        Probe {
            inner: self.inner.clone(),
            ready: false,
            stalled: false,
            violations: self.violations.clone(),
        }
    }
}

impl<S: Service<Req>> Service<Req> for Probe<S> {
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        if self.ready {
            return Poll::Ready(Ok(()));
        }
        if !self.stalled {
            self.stalled = true;
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        self.stalled = false;
        let poll = self.inner.poll_ready(cx);
        if let Poll::Ready(Ok(())) = poll {
            self.ready = true;
        }
        poll
    }

    fn call(&mut self, req: Req) -> S::Future {
        if !self.ready {
            self.violations.fetch_add(1, Ordering::SeqCst);
        }
        self.ready = false;
        self.inner.call(req)
    }
}

// ---------------------------------------------------------------------------
// Helpers.

fn req(label: impl ToString, token: &str) -> Req {
    http::Request::get("https://api.example.test/items")
        .header("authorization", format!("Bearer {token}"))
        .header("x-call", label.to_string())
        .body(())
        .unwrap()
}

fn one_limit(name: &str, rate: Rate, burst: u64) -> Policy {
    Policy::single(name, Limit::builder(rate).burst(burst).build().unwrap()).unwrap()
}

/// The client the tests use: keyed by bearer token, waiting up to
/// `max_wait`, pausing on the upstream's Retry-After, failing closed.
fn client<S>(limiter: Limiter, max_wait: Duration, inner: S) -> Client<S> {
    RateLimitLayer::new(limiter)
        .key(HeaderKey::bearer())
        .on_store_error(FailurePolicy::Closed)
        .typed_errors()
        .wait_up_to(max_wait)
        .upstream_feedback(RetryAfter::new())
        .layer(inner)
}

type BoxFut = Pin<Box<dyn Future<Output = Result<Res, BoxError>> + Send>>;

/// Starts one call: drives the client to readiness, then calls it. On the
/// memory store the slot is reserved here; on Redis when the returned
/// future is first polled.
async fn start<S>(client: &mut Client<S>, req: Req) -> BoxFut
where
    S: Service<Req, Response = Res, Error = Infallible> + Clone + Send + 'static,
    S::Future: Send,
{
    let ready = client.ready().await.unwrap();
    Box::pin(ready.call(req))
}

/// Polls every future in index order until all are done, so that their
/// first polls (and, on one multiplexed Redis connection, their requests)
/// happen in that order.
async fn join_in_order(mut futs: Vec<BoxFut>) -> Vec<Result<Res, BoxError>> {
    let mut results: Vec<Option<Result<Res, BoxError>>> = futs.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (fut, result) in futs.iter_mut().zip(results.iter_mut()) {
            if result.is_none() {
                match fut.as_mut().poll(cx) {
                    Poll::Ready(r) => *result = Some(r),
                    Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    })
    .await;
    results.into_iter().map(|r| r.unwrap()).collect()
}

fn wait_too_long(err: BoxError) -> (String, Duration, Duration) {
    match *err.downcast::<RateLimitError>().expect("a RateLimitError") {
        RateLimitError::WaitTooLong {
            limit,
            wait,
            max_wait,
        } => (limit, wait, max_wait),
        other => panic!("expected WaitTooLong, got {other:?}"),
    }
}

// ---------------------------------------------------------------------------
// Memory store, paused time: exact timings.

#[tokio::test(start_paused = true)]
async fn waiting_calls_go_exactly_at_their_slots_in_order() {
    let upstream = Upstream::unlimited();
    let limiter = Limiter::new(
        one_limit("api", Rate::per_second(10), 1),
        crate::paused_memory_store(),
    );
    let mut c = client(limiter, 10 * S, upstream.clone());
    let t0 = Instant::now();
    let mut futs = Vec::new();
    for i in 0..5 {
        futs.push(start(&mut c, req(i, "a")).await);
    }
    for result in join_in_order(futs).await {
        assert_eq!(result.unwrap().status(), 200);
    }
    let calls = upstream.calls();
    assert_eq!(upstream.labels(), ["0", "1", "2", "3", "4"]);
    for (i, call) in calls.iter().enumerate() {
        assert_eq!(call.at - t0, 100 * MS * i as u32, "call {i}");
    }
}

#[tokio::test(start_paused = true)]
async fn several_limits_are_reserved_together_and_the_latest_slot_wins() {
    // 10/s one at a time, and at most 3 at once refilling 1 per second.
    let policy = Policy::builder("two")
        .limit(
            Limit::builder(Rate::per_second(10))
                .burst(1)
                .build()
                .unwrap(),
        )
        .limit(
            Limit::builder(Rate::per_second(1))
                .burst(3)
                .build()
                .unwrap(),
        )
        .build()
        .unwrap();
    let upstream = Upstream::unlimited();
    let mut c = client(
        Limiter::new(policy, crate::paused_memory_store()),
        10 * S,
        upstream.clone(),
    );
    let t0 = Instant::now();
    let mut futs = Vec::new();
    for i in 0..5 {
        futs.push(start(&mut c, req(i, "a")).await);
    }
    join_in_order(futs).await;
    let offsets: Vec<Duration> = upstream.calls().iter().map(|c| c.at - t0).collect();
    assert_eq!(
        offsets,
        [Duration::ZERO, 100 * MS, 200 * MS, S, 2 * S],
        "the 10/s limit spaces the burst of 3, then 1/s takes over"
    );
}

#[tokio::test(start_paused = true)]
async fn shadow_mode_reserves_but_never_waits() {
    let upstream = Upstream::unlimited();
    let limiter = Limiter::new(
        one_limit("api", Rate::per_second(1), 1),
        crate::paused_memory_store(),
    );
    let mut c = RateLimitLayer::new(limiter.clone())
        .key(GlobalKey::new())
        .typed_errors()
        .wait_up_to(S)
        .shadow(true)
        .layer(upstream.clone());
    let t0 = Instant::now();
    for i in 0..3 {
        let res = c.ready().await.unwrap().call(req(i, "a")).await.unwrap();
        assert_eq!(res.status(), 200);
    }
    assert_eq!(Instant::now(), t0, "no call slept");
    assert_eq!(upstream.count(200), 3, "and none was refused");
}

#[tokio::test(start_paused = true)]
async fn a_slot_beyond_the_deadline_is_refused_at_once_and_reserves_nothing() {
    let upstream = Upstream::unlimited();
    let limiter = Limiter::new(
        one_limit("api", Rate::per_second(1), 1),
        crate::paused_memory_store(),
    );
    let mut c = client(limiter.clone(), 2 * S, upstream.clone());
    let t0 = Instant::now();
    // Slots now, in 1 s and in 2 s: all within the 2 s the client waits.
    let mut futs = Vec::new();
    for i in 0..3 {
        futs.push(start(&mut c, req(i, "a")).await);
    }
    // The next would be 3 s away.
    let err = start(&mut c, req("late", "a")).await.await.unwrap_err();
    assert_eq!(Instant::now(), t0, "refused without waiting");
    assert_eq!(wait_too_long(err), ("1/s".to_owned(), 3 * S, 2 * S));
    // Nothing was reserved: the next slot is still 3 s away, not 4 s.
    let d = limiter
        .reserve(&Key::hashed("h:", b"\0a"), 1, 10 * S)
        .await
        .unwrap();
    assert!(d.is_allowed());
    assert_eq!(d.wait(), 3 * S);
    join_in_order(futs).await;
    assert_eq!(upstream.labels(), ["0", "1", "2"]);
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_waiter_never_reaches_the_inner_service() {
    let upstream = Upstream::unlimited();
    let probe = Probe::new(upstream.clone());
    let violations = probe.violations.clone();
    let limiter = Limiter::new(
        one_limit("api", Rate::per_second(1), 1),
        crate::paused_memory_store(),
    );
    let mut c = client(limiter, 10 * S, probe);
    let first = start(&mut c, req("first", "a")).await;
    let cancelled = start(&mut c, req("cancelled", "a")).await;
    let last = start(&mut c, req("last", "a")).await;
    // Let the cancelled call start waiting, then drop it before its slot.
    let mut cancelled = cancelled;
    assert!(futures_poll_once(&mut cancelled).is_pending());
    drop(cancelled);
    let results = join_in_order(vec![first, last]).await;
    assert!(results.iter().all(|r| r.is_ok()));
    assert_eq!(upstream.labels(), ["first", "last"]);
    assert_eq!(violations.load(Ordering::SeqCst), 0);
    // Its slot stayed used: `last` went at 2 s, not 1 s.
    let calls = upstream.calls();
    assert_eq!(calls[1].at - calls[0].at, 2 * S);
}

fn futures_poll_once(fut: &mut BoxFut) -> Poll<Result<Res, BoxError>> {
    let mut cx = Context::from_waker(std::task::Waker::noop());
    fut.as_mut().poll(&mut cx)
}

#[tokio::test(start_paused = true)]
async fn the_inner_service_is_only_called_when_ready_even_after_waiting() {
    let upstream = Upstream::unlimited();
    let probe = Probe::new(upstream.clone());
    let violations = probe.violations.clone();
    let limiter = Limiter::new(
        one_limit("api", Rate::per_second(20), 2),
        crate::paused_memory_store(),
    );
    let mut c = client(limiter, 10 * S, probe);
    let mut futs = Vec::new();
    for i in 0..12 {
        futs.push(start(&mut c, req(i, "a")).await);
    }
    assert!(join_in_order(futs).await.iter().all(|r| r.is_ok()));
    assert_eq!(upstream.count(200), 12);
    assert_eq!(violations.load(Ordering::SeqCst), 0);
}

#[tokio::test(start_paused = true)]
async fn one_layer_serves_many_accounts_each_with_its_own_slots() {
    // By access token (hashed).
    let upstream = Upstream::unlimited();
    let limiter = Limiter::new(
        one_limit("api", Rate::per_second(1), 1),
        crate::paused_memory_store(),
    );
    let mut c = client(limiter, 10 * S, upstream.clone());
    let t0 = Instant::now();
    let mut futs = Vec::new();
    for (label, token) in [("a0", "a"), ("a1", "a"), ("b0", "b"), ("b1", "b")] {
        futs.push(start(&mut c, req(label, token)).await);
    }
    join_in_order(futs).await;
    let at = |label: &str| {
        let calls = upstream.calls();
        calls.iter().find(|c| c.label == label).unwrap().at - t0
    };
    assert_eq!(
        [at("a0"), at("a1"), at("b0"), at("b1")],
        [Duration::ZERO, S, Duration::ZERO, S]
    );

    // By upstream host, and by tenant: any key extractor works.
    let upstream = Upstream::unlimited();
    // On tokio's paused clock, as above: a store on the real clock would
    // shorten the wait by whatever real time passed between the calls.
    let limiter = Limiter::new(
        one_limit("hosts", Rate::per_second(1), 1),
        crate::paused_memory_store(),
    );
    let mut c = RateLimitLayer::new(limiter)
        .key(HostKey)
        .typed_errors()
        .wait_up_to(10 * S)
        .layer(upstream.clone());
    let t0 = Instant::now();
    let mut futs = Vec::new();
    for (i, host) in ["one.test", "one.test", "two.test"].iter().enumerate() {
        let r = http::Request::get(format!("http://{host}/x"))
            .header("x-call", i.to_string())
            .body(())
            .unwrap();
        futs.push(c.ready().await.unwrap().call(r));
    }
    for fut in futs {
        fut.await.unwrap();
    }
    let offsets: Vec<Duration> = upstream.calls().iter().map(|c| c.at - t0).collect();
    assert_eq!(upstream.labels(), ["0", "2", "1"]);
    assert_eq!(offsets, [Duration::ZERO, Duration::ZERO, S]);
}

#[tokio::test(start_paused = true)]
async fn retry_after_from_the_upstream_pauses_that_identity() {
    let upstream = Upstream::unlimited();
    let limiter = Limiter::new(
        one_limit("api", Rate::per_second(10), 1),
        crate::paused_memory_store(),
    );
    let mut c = client(limiter, 10 * S, upstream.clone());
    upstream.pause_next(3);
    let t0 = Instant::now();
    let res = start(&mut c, req("first", "a")).await.await.unwrap();
    assert_eq!(res.status(), 429, "the upstream's answer is passed on");
    let futs = vec![
        start(&mut c, req("a-next", "a")).await,
        start(&mut c, req("b", "b")).await,
    ];
    join_in_order(futs).await;
    let calls = upstream.calls();
    let at = |label: &str| calls.iter().find(|c| c.label == label).unwrap().at - t0;
    assert_eq!(at("a-next"), 3 * S, "token a waits out the Retry-After");
    assert_eq!(at("b"), Duration::ZERO, "token b is not paused");
}

#[tokio::test(start_paused = true)]
async fn http_mode_refuses_with_429_and_retry_after() {
    let limiter = Limiter::new(
        one_limit("api", Rate::per_second(1), 1),
        crate::paused_memory_store(),
    );
    let svc = tower::service_fn(|_req: Req| async {
        Ok::<_, Infallible>(http::Response::new(
            http_body_util::Empty::<bytes::Bytes>::new(),
        ))
    });
    // `Empty` cannot be built from `Bytes`: the refusal comes wrapped.
    let mut svc = RateLimitLayer::new(limiter)
        .key(GlobalKey::new())
        .wait_up_to(S)
        .any_body()
        .layer(svc);
    let t0 = Instant::now();
    let mut futs = Vec::new();
    for i in 0..2 {
        futs.push(svc.ready().await.unwrap().call(req(i, "a")));
    }
    let refused = svc.ready().await.unwrap().call(req(2, "a")).await.unwrap();
    assert_eq!(refused.status(), 429);
    assert_eq!(refused.headers()["retry-after"], "2");
    for fut in futs {
        assert_eq!(fut.await.unwrap().status(), 200);
    }
    assert_eq!(Instant::now() - t0, S);
}

/// 32 workers on 4 clients, each with its own store handle (on Redis, its
/// own connection), calling an upstream that allows `n` per `w`.
struct Fleet {
    calls: Vec<Call>,
    errors: Vec<String>,
}

async fn run_fleet(
    stores: Vec<Arc<dyn Store>>,
    workers: usize,
    total: usize,
    n: u64,
    w: Duration,
    margin: Duration,
) -> Fleet {
    let upstream = Upstream::new(&[(n as usize, w)]);
    let policy = Policy::single("fleet", within_window(n, w, margin).unwrap()).unwrap();
    let clients: Vec<_> = stores
        .into_iter()
        .map(|store| {
            client(
                Limiter::new(policy.clone(), store),
                30 * S,
                upstream.clone(),
            )
        })
        .collect();
    let issued = Arc::new(AtomicUsize::new(0));
    let errors = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = tokio::task::JoinSet::new();
    for worker in 0..workers {
        let mut c = clients[worker % clients.len()].clone();
        let issued = issued.clone();
        let errors = errors.clone();
        tasks.spawn(async move {
            loop {
                let i = issued.fetch_add(1, Ordering::SeqCst);
                if i >= total {
                    break;
                }
                let result = match c.ready().await {
                    Ok(ready) => ready.call(req(i, "fleet")).await,
                    Err(err) => Err(err),
                };
                if let Err(err) = result {
                    errors.lock().unwrap().push(err.to_string());
                }
            }
        });
    }
    while let Some(joined) = tasks.join_next().await {
        joined.unwrap();
    }
    let errors = errors.lock().unwrap().clone();
    Fleet {
        calls: upstream.calls(),
        errors,
    }
}

impl Fleet {
    /// Calls per second over the run: intervals between the first and the
    /// last call.
    fn achieved_per_s(&self) -> f64 {
        let first = self.calls.first().unwrap().at;
        let last = self.calls.last().unwrap().at;
        (self.calls.len() - 1) as f64 / (last - first).as_secs_f64()
    }
}

#[tokio::test(start_paused = true)]
async fn memory_fleet_never_earns_a_429_at_the_full_rate() {
    let store: Arc<dyn Store> = Arc::new(crate::paused_memory_store());
    let fleet = run_fleet(vec![store; 4], 32, 90, 20, S, 50 * MS).await;
    assert!(fleet.errors.is_empty(), "{:?}", fleet.errors);
    assert_eq!(fleet.calls.len(), 90);
    assert!(fleet.calls.iter().all(|c| c.status == 200));
    // 20 per 1.05 s on the paused clock (whose timers round up to whole
    // milliseconds).
    let expected = 20.0 / 1.05;
    let achieved = fleet.achieved_per_s();
    assert!((achieved - expected).abs() < 0.01, "{achieved}");
}

// ---------------------------------------------------------------------------
// Redis, real time.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_fleet_of_32_workers_on_4_connections_never_earns_a_429() {
    let server = RedisServer::start();
    let mut stores: Vec<Arc<dyn Store>> = Vec::new();
    for _ in 0..4 {
        stores.push(Arc::new(redis_store(&server).await));
    }
    // The upstream allows 40 calls in any 2 s; the limiter keeps a 100 ms
    // margin for wake-up jitter (95% of the rate). 90 calls: about 4.5 s.
    let (n, w) = (40, 2 * S);
    let fleet = run_fleet(stores, 32, 90, n, w, 100 * MS).await;
    assert!(fleet.errors.is_empty(), "{:?}", fleet.errors);
    assert_eq!(fleet.calls.len(), 90);
    let throttled = fleet.calls.iter().filter(|c| c.status == 429).count();
    assert_eq!(throttled, 0, "the upstream answered 429");
    let allowed = n as f64 / w.as_secs_f64();
    let achieved = fleet.achieved_per_s();
    assert!(
        achieved >= 0.9 * allowed,
        "achieved {achieved:.2}/s of {allowed}/s allowed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_slots_go_to_calls_in_the_order_they_reach_redis_without_polling() {
    let server = RedisServer::start();
    let store = redis_store(&server).await;
    let upstream = Upstream::unlimited();
    let limiter = Limiter::new(one_limit("fifo", Rate::per_second(20), 1), store);
    let mut c = client(limiter, 10 * S, upstream.clone());
    // Load the script and measure from a clean slate.
    start(&mut c, req("warm-up", "other")).await.await.unwrap();
    let mut conn = server
        .client()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(&mut conn)
        .await
        .unwrap();
    // All calls share one multiplexed connection and are first polled in
    // index order, so their scripts reach Redis in that order.
    let n = 10;
    let mut futs = Vec::new();
    for i in 0..n {
        futs.push(start(&mut c, req(i, "fifo")).await);
    }
    let t0 = Instant::now();
    for result in join_in_order(futs).await {
        assert_eq!(result.unwrap().status(), 200);
    }
    let labels = upstream.labels();
    let expected: Vec<String> = std::iter::once("warm-up".to_owned())
        .chain((0..n).map(|i| i.to_string()))
        .collect();
    assert_eq!(labels, expected, "calls reached the upstream in FIFO order");
    // Slots 50 ms apart: the last call went no earlier than 9 × 50 ms later.
    let calls = upstream.calls();
    assert!(calls[n].at - t0 >= 9 * 50 * MS - 5 * MS);
    // At most one script per waiting call (calls queued behind the
    // store's busy slots travel together in one), and nothing else: no
    // polling.
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut conn)
        .await
        .unwrap();
    let count = |cmd: &str| -> usize {
        info.lines()
            .find_map(|l| l.strip_prefix(&format!("cmdstat_{cmd}:calls=")))
            .and_then(|rest| rest.split(',').next())
            .map_or(0, |n| n.parse().unwrap())
    };
    assert!((1..=n).contains(&count("evalsha")), "{info}");
    assert_eq!(count("eval"), 0, "{info}");
}

/// FIFO across independent connections: call `i + 1` is issued, on another
/// connection, only once call `i`'s reservation has landed in Redis (a
/// keyspace notification for the key's `SET` is the signal), so the calls
/// reach Redis in index order; they must reach the upstream in that order.
/// Slots are 500 ms apart: a waiting call that wakes late on a busy
/// machine must not be overtaken by the next slot's call, which is not what
/// this test is about.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_slots_are_fifo_across_connections() {
    let server = RedisServer::start();
    let policy = one_limit("fifo4", Rate::per_second(2), 1);
    let upstream = Upstream::unlimited();
    let mut clients = Vec::new();
    let mut tat_key = String::new();
    for _ in 0..4 {
        let store = redis_store(&server).await;
        tat_key = store.gcra_key(&policy, &Key::hashed("h:", b"\0fifo"), 0);
        clients.push(client(
            Limiter::new(policy.clone(), store),
            10 * S,
            upstream.clone(),
        ));
    }
    let mut admin = server
        .client()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("notify-keyspace-events")
        .arg("K$")
        .query_async(&mut admin)
        .await
        .unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let mut events = redis::Client::open(format!("{}/?protocol=resp3", server.url()))
        .unwrap()
        .get_multiplexed_async_connection_with_config(
            &redis::AsyncConnectionConfig::new().set_push_sender(tx),
        )
        .await
        .unwrap();
    events
        .subscribe(format!("__keyspace@0__:{tat_key}"))
        .await
        .unwrap();
    let n = 8;
    let mut tasks = Vec::new();
    for i in 0..n {
        let fut = start(&mut clients[i % 4], req(i, "fifo")).await;
        tasks.push(tokio::spawn(fut));
        // Wait for this call's reservation to be stored before the next.
        loop {
            let push = tokio::time::timeout(10 * S, rx.recv())
                .await
                .expect("a keyspace notification within 10 s")
                .expect("keyspace notifications");
            if push.kind == redis::PushKind::Message {
                break;
            }
        }
    }
    for task in tasks {
        assert_eq!(task.await.unwrap().unwrap().status(), 200);
    }
    let expected: Vec<String> = (0..n).map(|i| i.to_string()).collect();
    assert_eq!(upstream.labels(), expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_deadline_refusal_reserves_nothing() {
    let server = RedisServer::start();
    let store = redis_store(&server).await;
    let policy = one_limit("deadline", Rate::per_second(1), 1);
    let limiter = Limiter::new(policy.clone(), store.clone());
    let upstream = Upstream::unlimited();
    let mut c = client(limiter.clone(), 1500 * MS, upstream.clone());
    // Two slots taken: now and in 1 s.
    let key = Key::hashed("h:", b"\0a");
    for expected in [Duration::ZERO, S] {
        let d = limiter.reserve(&key, 1, 10 * S).await.unwrap();
        assert!(d.is_allowed());
        assert!(d.wait() <= expected, "{:?}", d.wait());
    }
    let tat_key = store.gcra_key(&policy, &key, 0);
    let mut conn = server
        .client()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let before: Option<String> = redis::cmd("GET")
        .arg(&tat_key)
        .query_async(&mut conn)
        .await
        .unwrap();
    let t = std::time::Instant::now();
    let err = start(&mut c, req("late", "a")).await.await.unwrap_err();
    assert!(t.elapsed() < 1000 * MS, "refused at once");
    let (limit, wait, max_wait) = wait_too_long(err);
    assert_eq!(limit, "1/s");
    assert_eq!(max_wait, 1500 * MS);
    assert!(wait > 1500 * MS && wait <= 2 * S, "{wait:?}");
    let after: Option<String> = redis::cmd("GET")
        .arg(&tat_key)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(before.is_some());
    assert_eq!(before, after, "the refused call stored nothing");
    assert!(upstream.calls().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_retry_after_from_the_upstream_pauses_the_other_workers() {
    let server = RedisServer::start();
    let upstream = Upstream::unlimited();
    let policy = Policy::single("paused", within_window(20, S, 50 * MS).unwrap()).unwrap();
    let mut clients = Vec::new();
    for _ in 0..4 {
        let store = redis_store(&server).await;
        clients.push(client(
            Limiter::new(policy.clone(), store),
            10 * S,
            upstream.clone(),
        ));
    }
    upstream.pause_next(2);
    let res = start(&mut clients[0], req("429", "shared"))
        .await
        .await
        .unwrap();
    assert_eq!(res.status(), 429);
    // The pause was recorded before that response came back: the other
    // workers, on their own connections, now wait it out.
    let mut tasks = tokio::task::JoinSet::new();
    for (i, mut c) in clients.into_iter().enumerate().skip(1) {
        tasks.spawn(async move {
            let fut = start(&mut c, req(format!("w{i}"), "shared")).await;
            fut.await.map(|r| r.status())
        });
    }
    while let Some(joined) = tasks.join_next().await {
        assert_eq!(joined.unwrap().unwrap(), 200);
    }
    let calls = upstream.calls();
    assert_eq!(calls.len(), 4);
    let paused_at = calls[0].at;
    for call in &calls[1..] {
        assert!(
            call.at - paused_at >= 2 * S - 10 * MS,
            "{} called {:?} after the 429",
            call.label,
            call.at - paused_at
        );
    }
}

/// The memory store and Redis, both on one manual clock, give the same
/// decisions for reservations around an upstream pause.
#[tokio::test]
async fn defer_gives_the_same_decisions_on_both_stores() {
    let server = RedisServer::start();
    let policy = Policy::builder("defer")
        .limit(
            Limit::builder(Rate::per_second(2))
                .burst(3)
                .build()
                .unwrap(),
        )
        .limit(Limit::new(Rate::per_minute(30)).unwrap())
        .build()
        .unwrap();
    let start = Duration::from_secs(1_700_000_000);
    let mem_clock = ManualClock::new(start);
    let memory = Limiter::new(
        policy.clone(),
        MemoryStore::builder().clock(mem_clock.clone()).build(),
    );
    let redis_clock = ManualClock::new(start);
    let redis = Limiter::new(
        policy,
        RedisStore::builder(server.url())
            .time_source(TimeSource::Client(Arc::new(redis_clock.clone())))
            .timeout(2 * S)
            .connect()
            .await
            .unwrap(),
    );
    let mut logs: Vec<Vec<Decision>> = Vec::new();
    for (limiter, clock) in [(&memory, &mem_clock), (&redis, &redis_clock)] {
        let k = Key::new("k");
        let mut log = Vec::new();
        for _ in 0..2 {
            log.push(limiter.reserve(&k, 1, 10 * S).await.unwrap());
        }
        limiter.defer(&k, 5 * S).await.unwrap();
        log.push(limiter.check(&k, 1).await.unwrap());
        log.push(limiter.reserve(&k, 1, 10 * S).await.unwrap());
        log.push(limiter.reserve(&k, 1, 10 * S).await.unwrap());
        clock.advance(7 * S);
        // A pause shorter than a limit's backlog leaves that limit alone.
        limiter.defer(&k, S).await.unwrap();
        log.push(limiter.check(&k, 1).await.unwrap());
        // A fresh key paused before its first call.
        let fresh = Key::new("fresh");
        limiter.defer(&fresh, 2 * S).await.unwrap();
        log.push(limiter.check(&fresh, 1).await.unwrap());
        logs.push(log);
    }
    assert_eq!(logs[0], logs[1]);
    let log = &logs[0];
    assert_eq!(log[2].retry_after(), Some(5 * S), "paused for 5 s");
    assert_eq!(log[3].wait(), 5 * S, "first slot after the pause");
    // Then each limit resumes from empty, at its own rate: 30/min is one
    // call every 2 s.
    assert_eq!(log[4].wait(), 7 * S, "no burst after a pause");
    // At +7 s the 1 s pause raised the 2/s limit, but 30/min's backlog
    // (2 s) was longer and decides.
    assert_eq!(log[5].retry_after(), Some(2 * S));
    assert_eq!(log[5].limit_index(), 1);
    assert_eq!(log[6].retry_after(), Some(2 * S));
}
