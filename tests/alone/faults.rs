//! Redis hung, killed, paused or stripped of its scripts while an axum
//! router is under concurrent load. For each fault: no request waits
//! longer than the store's timeout plus a margin, nothing panics, the only
//! 5xx is the 503 of the route that fails closed, each route follows its
//! failure policy while Redis is gone, and Redis decides again within a
//! couple of seconds once it is back.
//!
//! One router, two routes sharing one store: `/open` fails open (the
//! default), `/closed` fails closed. Load tasks on each route send one
//! request every few milliseconds, a quarter of them for one hot client
//! over its limit and the rest spread over many clients under theirs. A
//! response tells how it was decided: a 200 with a `RateLimit` header or a
//! 429 was decided by the store; a 200 without it was let through because
//! the store failed (fail open); a 503 is the fail-closed refusal.
//!
//! The tests share two cores with nothing else: they run one at a time in
//! a binary of their own, so that their latencies are their own (no other
//! test runs meanwhile, nor starts a server on a port a killed one left
//! free).
use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::routing::get;
use common::RedisServer;
use common::stats::command_calls;
use fleetgate::key::HeaderKey;
use fleetgate::{FailurePolicy, Limit, Limiter, Policy, Rate, RateLimitLayer, RedisStore};
use http::{Request, StatusCode};
use tokio::sync::mpsc;
use tower::ServiceExt;

/// The store's timeout: short, yet long enough that a healthy Redis on a
/// loaded 2-core machine always answers within it.
const TIMEOUT: Duration = Duration::from_millis(150);
/// What a loaded 2-core machine may add to it: scheduling, the router,
/// the test's own tasks.
const MARGIN: Duration = Duration::from_millis(400);
/// How long a fault lasts: far longer than timeout + margin, so that a
/// request waiting on Redis instead of timing out fails the test.
const FAULT: Duration = Duration::from_millis(1500);
/// How soon Redis must decide again once it is back.
const RECOVERY: Duration = Duration::from_secs(2);
const TASKS_PER_ROUTE: usize = 3;
const PACE: Duration = Duration::from_millis(4);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Route {
    Open,
    Closed,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Outcome {
    /// 200 with rate-limit headers: the store admitted it.
    Admitted,
    /// 429: the store (or its deny cache) refused it.
    Limited,
    /// 200 without rate-limit headers: the store failed, fail open.
    PassedUnchecked,
    /// 503 with `Retry-After: 1`: the store failed, fail closed.
    Unavailable,
    /// Anything else: always a failure.
    Other(StatusCode),
}

impl Outcome {
    fn decided(self) -> bool {
        matches!(self, Outcome::Admitted | Outcome::Limited)
    }
}

#[derive(Clone, Copy, Debug)]
struct Record {
    route: Route,
    hot: bool,
    started: Instant,
    ended: Instant,
    outcome: Outcome,
}

impl Record {
    fn took(&self) -> Duration {
        self.ended - self.started
    }
}

fn app(store: RedisStore) -> Router {
    // 50 per second, burst 20, per client.
    let policy = Policy::single(
        "faults",
        Limit::builder(Rate::per_second(50))
            .burst(20)
            .build()
            .unwrap(),
    )
    .unwrap();
    let layer = |failure| {
        RateLimitLayer::new(Limiter::new(policy.clone(), store.clone()))
            .key(HeaderKey::new("x-client").unhashed())
            .on_store_error(failure)
    };
    Router::new()
        .route(
            "/open",
            get(|| async { "open" }).route_layer(layer(FailurePolicy::Open)),
        )
        .route(
            "/closed",
            get(|| async { "closed" }).route_layer(layer(FailurePolicy::Closed)),
        )
}

async fn store(server: &RedisServer) -> RedisStore {
    RedisStore::builder(server.url())
        .prefix("faults")
        .timeout(TIMEOUT)
        .connect()
        .await
        .expect("connect")
}

/// Load on both routes until stopped; every response is reported on the
/// channel as it arrives.
struct Load {
    stop: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    records: mpsc::UnboundedReceiver<Record>,
    seen: Vec<Record>,
}

impl Load {
    fn start(app: Router) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, records) = mpsc::unbounded_channel();
        let mut tasks = Vec::new();
        for route in [Route::Open, Route::Closed] {
            for task in 0..TASKS_PER_ROUTE {
                let (app, stop, tx) = (app.clone(), stop.clone(), tx.clone());
                tasks.push(tokio::spawn(async move {
                    let mut tick = tokio::time::interval(PACE);
                    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                    let mut n = 0usize;
                    while !stop.load(Ordering::Relaxed) {
                        tick.tick().await;
                        n += 1;
                        let hot = n.is_multiple_of(4);
                        let client = if hot {
                            "hot".to_owned()
                        } else {
                            format!("c{task}-{}", n % 64)
                        };
                        let path = match route {
                            Route::Open => "/open",
                            Route::Closed => "/closed",
                        };
                        let req = Request::get(path)
                            .header("x-client", client)
                            .body(Body::empty())
                            .unwrap();
                        let started = Instant::now();
                        let res = app.clone().oneshot(req).await.unwrap();
                        let ended = Instant::now();
                        let headers = res.headers().contains_key("ratelimit");
                        let outcome = match res.status() {
                            StatusCode::OK if headers => Outcome::Admitted,
                            StatusCode::OK => Outcome::PassedUnchecked,
                            StatusCode::TOO_MANY_REQUESTS if headers => Outcome::Limited,
                            StatusCode::SERVICE_UNAVAILABLE
                                if res.headers().get("retry-after")
                                    == Some(&http::HeaderValue::from_static("1")) =>
                            {
                                Outcome::Unavailable
                            }
                            other => Outcome::Other(other),
                        };
                        let record = Record {
                            route,
                            hot,
                            started,
                            ended,
                            outcome,
                        };
                        if tx.send(record).is_err() {
                            break;
                        }
                    }
                }));
            }
        }
        Load {
            stop,
            tasks,
            records,
            seen: Vec::new(),
        }
    }

    /// Takes in responses for `period`.
    async fn run_for(&mut self, period: Duration) {
        let until = tokio::time::Instant::now() + period;
        while let Ok(Some(record)) = tokio::time::timeout_at(until, self.records.recv()).await {
            self.seen.push(record);
        }
    }

    /// Waits for the first response matching `pred` to a request started
    /// after `since`; returns when it ended.
    async fn first_after(
        &mut self,
        since: Instant,
        deadline: Duration,
        pred: impl Fn(&Record) -> bool,
    ) -> Option<Instant> {
        let until = tokio::time::Instant::now() + deadline;
        while let Ok(Some(record)) = tokio::time::timeout_at(until, self.records.recv()).await {
            self.seen.push(record);
            if record.started >= since && pred(&record) {
                return Some(record.ended);
            }
        }
        None
    }

    /// Stops the load; every task must end without a panic.
    async fn finish(mut self) -> Vec<Record> {
        self.stop.store(true, Ordering::Relaxed);
        for task in self.tasks.drain(..) {
            task.await.expect("a load task panicked");
        }
        while let Ok(record) = self.records.try_recv() {
            self.seen.push(record);
        }
        self.seen
    }
}

/// What every fault test asserts on the whole run; returns the slowest
/// request's time.
fn check_run(records: &[Record]) -> Duration {
    // Enough requests for the checks below to mean something: a quiet
    // machine makes 800 to 1100 in these runs, a busy CI machine half
    // that; this is no throughput floor.
    assert!(records.len() > 100, "only {} requests", records.len());
    let slowest = records.iter().map(Record::took).max().unwrap();
    assert!(
        slowest <= TIMEOUT + MARGIN,
        "a request waited {slowest:?}, more than {TIMEOUT:?} + {MARGIN:?}"
    );
    for r in records {
        match (r.route, r.outcome) {
            (_, Outcome::Other(status)) => panic!("unexpected status {status}: {r:?}"),
            (Route::Open, Outcome::Unavailable) => panic!("fail-open route answered 503: {r:?}"),
            (Route::Closed, Outcome::PassedUnchecked) => {
                panic!("fail-closed route let an unchecked request through: {r:?}")
            }
            _ => {}
        }
    }
    slowest
}

/// Requests that started after `from` and ended before `to`: squarely
/// inside the fault.
fn during(records: &[Record], from: Instant, to: Instant) -> Vec<Record> {
    records
        .iter()
        .filter(|r| r.started >= from && r.ended <= to)
        .copied()
        .collect()
}

/// While Redis is gone, each route follows its policy: the open route lets
/// requests through unchecked (a hot client may still be refused from the
/// deny cache until its retry time passes), the closed route answers 503.
fn check_policies_followed(records: &[Record], from: Instant, to: Instant) {
    let inside = during(records, from, to);
    let count = |route, outcome| {
        inside
            .iter()
            .filter(|r| r.route == route && r.outcome == outcome)
            .count()
    };
    let unchecked = count(Route::Open, Outcome::PassedUnchecked);
    let refused = count(Route::Closed, Outcome::Unavailable);
    // A hung Redis makes each request wait the full timeout, so each task
    // sends at most one per TIMEOUT: 3 tasks × 1.35 s / 150 ms ≈ 27.
    assert!(unchecked >= 10, "fail open let only {unchecked} through");
    assert!(refused >= 10, "fail closed refused only {refused}");
    let admitted = count(Route::Open, Outcome::Admitted) + count(Route::Closed, Outcome::Admitted);
    assert_eq!(admitted, 0, "admitted by a store that cannot answer");
    // Only the hot client's denials can come from the deny cache.
    assert!(
        inside
            .iter()
            .all(|r| r.outcome != Outcome::Limited || r.hot),
        "a 429 for a client under its limit while Redis was gone"
    );
}

/// Before any fault, everything is decided by Redis, and the hot client is
/// refused.
fn check_healthy(records: &[Record], to: Instant) {
    let before: Vec<_> = records.iter().filter(|r| r.ended <= to).collect();
    assert!(!before.is_empty());
    assert!(
        before.iter().all(|r| r.outcome.decided()),
        "undecided request with Redis up: {:?}",
        before.iter().find(|r| !r.outcome.decided())
    );
    assert!(
        before
            .iter()
            .any(|r| r.hot && r.outcome == Outcome::Limited)
    );
    assert!(
        before
            .iter()
            .all(|r| r.hot || r.outcome == Outcome::Admitted),
        "a client under its limit was refused"
    );
}

/// A response decided by Redis itself, not by the deny cache.
fn decided_by_redis(r: &Record) -> bool {
    r.outcome == Outcome::Admitted || (r.outcome == Outcome::Limited && !r.hot)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigstop_hang_then_resume() {
    let _alone = crate::one_at_a_time().await;
    let server = RedisServer::start();
    let mut load = Load::start(app(store(&server).await));
    load.run_for(Duration::from_millis(400)).await;

    let hung = Instant::now();
    server.pause();
    load.run_for(FAULT).await;
    let resumed = Instant::now();
    server.resume();
    let back = load
        .first_after(resumed, RECOVERY, decided_by_redis)
        .await
        .expect("Redis did not decide again within 2 s of SIGCONT");
    load.run_for(Duration::from_millis(300)).await;
    let records = load.finish().await;

    let slowest = check_run(&records);
    check_healthy(&records, hung);
    check_policies_followed(&records, hung + TIMEOUT, resumed);
    println!(
        "sigstop: {} requests, slowest {slowest:?}, back after {:?}",
        records.len(),
        back - resumed
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_then_restart_on_the_same_port() {
    let _alone = crate::one_at_a_time().await;
    let server = RedisServer::start();
    let mut load = Load::start(app(store(&server).await));
    load.run_for(Duration::from_millis(400)).await;

    let killed = Instant::now();
    // SIGKILL, then nothing listens on the port for FAULT.
    let port = server.port();
    server.stop();
    load.run_for(FAULT).await;
    let restarted = Instant::now();
    let server = RedisServer::start_on(port).expect("restart on the same port");
    let back = load
        .first_after(restarted, RECOVERY, decided_by_redis)
        .await
        .expect("Redis did not decide again within 2 s of its restart");
    // The new server had no script: the store reloaded it.
    let mut admin = server
        .client()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let calls = command_calls(&mut admin).await;
    assert!(
        calls.get("script|load").copied().unwrap_or(0) >= 1,
        "{calls:?}"
    );
    load.run_for(Duration::from_millis(300)).await;
    let records = load.finish().await;

    let slowest = check_run(&records);
    check_healthy(&records, killed);
    check_policies_followed(&records, killed + TIMEOUT, restarted);
    // Once back, the hot client is refused by Redis again.
    let after: Vec<_> = records.iter().filter(|r| r.started >= back).collect();
    assert!(after.iter().any(|r| r.hot && r.outcome == Outcome::Limited));
    println!(
        "sigkill: {} requests, slowest {slowest:?}, back after {:?}",
        records.len(),
        back - restarted
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_pause_then_unpause() {
    let _alone = crate::one_at_a_time().await;
    let server = RedisServer::start();
    let mut admin = server
        .client()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let mut load = Load::start(app(store(&server).await));
    load.run_for(Duration::from_millis(400)).await;

    // Redis pauses somewhere between sending the command and its reply,
    // and lifts the pause by itself FAULT after that: on a loaded machine
    // either end can be late. The pause surely holds from the reply until
    // FAULT after the command was sent.
    let sent = Instant::now();
    let () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(FAULT.as_millis() as u64)
        .arg("ALL")
        .query_async(&mut admin)
        .await
        .unwrap();
    let paused = Instant::now();
    load.run_for(FAULT).await;
    // Redis lifts the pause by itself; the admin connection may say so too.
    let unpaused = Instant::now();
    let () = redis::cmd("CLIENT")
        .arg("UNPAUSE")
        .query_async(&mut admin)
        .await
        .unwrap();
    let back = load
        .first_after(unpaused, RECOVERY, decided_by_redis)
        .await
        .expect("Redis did not decide again within 2 s of the pause");
    load.run_for(Duration::from_millis(300)).await;
    let records = load.finish().await;

    let slowest = check_run(&records);
    check_healthy(&records, sent);
    check_policies_followed(&records, paused + TIMEOUT, sent + FAULT);
    println!(
        "client pause: {} requests, slowest {slowest:?}, back after {:?}",
        records.len(),
        back - unpaused
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn script_flush_mid_run_costs_no_decision() {
    let _alone = crate::one_at_a_time().await;
    let server = RedisServer::start();
    let mut admin = server
        .client()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let mut load = Load::start(app(store(&server).await));
    load.run_for(Duration::from_millis(300)).await;
    for _ in 0..5 {
        let () = redis::cmd("SCRIPT")
            .arg("FLUSH")
            .query_async(&mut admin)
            .await
            .unwrap();
        load.run_for(Duration::from_millis(150)).await;
    }
    let records = load.finish().await;

    let slowest = check_run(&records);
    // Every request was decided: NOSCRIPT is answered by loading the
    // script again, within the same decision.
    let end = records.iter().map(|r| r.ended).max().unwrap();
    check_healthy(&records, end);
    let calls = command_calls(&mut admin).await;
    let loads = calls.get("script|load").copied().unwrap_or(0);
    assert!(loads >= 5, "script reloaded {loads} times after 5 flushes");
    println!(
        "script flush: {} requests, slowest {slowest:?}, {loads} reloads",
        records.len()
    );
}
