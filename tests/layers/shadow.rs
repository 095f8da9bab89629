//! Shadow mode on ConcurrencyLimitLayer, FleetShedLayer and
//! UtilizationShedLayer: at a capacity that forces refusals, every request
//! is answered by the inner service, the would-be refusals are counted as
//! `shadow_denied` in `observe` (not as denied or shed), the admitted
//! request holds its lease, nothing waits in a queue, and a store failure
//! lets requests through; the same setup enforcing refuses. On the memory
//! store and, for the layers with leases, on a private Redis.
use crate::common;

use std::time::Duration;

use crate::handlers::{self, Started};
use axum::Router;
use axum::body::Body;
use axum::routing::get;
use common::logs::Logs;
use common::{RedisServer, redis_store};
use fleetgate::clock::ManualClock;
use fleetgate::concurrency::{ConcurrencyLimitLayer, ConcurrencyLimiter, WaitQueue};
use fleetgate::key::HeaderKey;
use fleetgate::observe::{self, PolicySnapshot};
use fleetgate::shed::{
    FleetShedLayer, FleetShedPolicy, FleetShedder, HeaderTier, UtilizationShedLayer,
    UtilizationShedder,
};
use fleetgate::{ConcurrencyPolicy, FailurePolicy, MemoryStore};
use http::{HeaderName, Request, StatusCode};
use http_body_util::BodyExt;
use tokio::task::JoinHandle;
use tower::ServiceExt;

// ---------------------------------------------------------------------------
// Helpers.

/// This test's policy in the process's `observe` snapshot (each test names
/// its own policies: the registry is the binary's).
pub(crate) fn observed(layer: &str, name: &str) -> PolicySnapshot {
    observe::snapshot()
        .policies
        .into_iter()
        .find(|p| p.layer == layer && p.policy == name)
        .unwrap_or_else(|| panic!("{layer} {name} not in the snapshot"))
}

/// `/ok` answers at once; `/hang` signals that it started and never
/// answers.
fn routes() -> Router {
    Router::new()
        .route("/ok", get(|| async { "ok" }))
        .route("/hang", get(handlers::hang))
}

/// A request of API key `k`, for the concurrency limit.
fn keyed(path: &str) -> Request<Body> {
    Request::get(path)
        .header("x-api-key", "k")
        .body(Body::empty())
        .unwrap()
}

/// A request of `tier`, for the shedders.
fn tiered(path: &str, tier: &str) -> Request<Body> {
    Request::get(path)
        .header("x-priority", tier)
        .body(Body::empty())
        .unwrap()
}

fn by_api_key() -> HeaderKey {
    HeaderKey::new("x-api-key")
}

fn by_priority() -> HeaderTier {
    HeaderTier::new(HeaderName::from_static("x-priority"))
}

/// Sends a request and reads its body: its status.
async fn status(app: &Router, req: Request<Body>) -> StatusCode {
    let response = app.clone().oneshot(req).await.unwrap();
    let status = response.status();
    let _ = response.into_body().collect().await;
    status
}

/// Starts a `/hang` request and waits until its handler runs: it was
/// let through, and holds whatever the layer gave it until [`end`].
async fn hold(app: &Router, mut req: Request<Body>) -> JoinHandle<()> {
    let (started, handler_started) = Started::new();
    req.extensions_mut().insert(started);
    let call = app.clone().oneshot(req);
    let task = tokio::spawn(async move {
        let _ = call.await;
    });
    handler_started.await.expect("the hanging handler started");
    task
}

/// Cancels a held request.
async fn end(task: JoinHandle<()>) {
    task.abort();
    assert!(task.await.unwrap_err().is_cancelled());
}

// ---------------------------------------------------------------------------
// ConcurrencyLimitLayer.

/// One in flight per key, and a queue that would make a refused caller
/// wait 100 ms for a slot.
fn one_at_a_time(name: &str, store: impl fleetgate::Store) -> ConcurrencyLimiter {
    let policy = ConcurrencyPolicy::builder(name, 1)
        .lease_ttl(Duration::from_secs(30))
        .build()
        .unwrap();
    let queue = WaitQueue::fifo(8, Duration::from_millis(100)).unwrap();
    ConcurrencyLimiter::new(policy, store).queue(queue)
}

/// Where to count the leases held.
#[derive(Clone, Copy)]
enum Held<'a> {
    Memory(&'a MemoryStore),
    Redis(&'a RedisServer),
}

impl Held<'_> {
    async fn count(self) -> usize {
        match self {
            Held::Memory(store) => store.lease_count(),
            Held::Redis(server) => server.leases_held().await,
        }
    }
}

/// With one request of the key held in flight, shadow mode lets the
/// others through at once without a lease (and one without a key), counts
/// them `shadow_denied`, and leaves the queue alone; enforcing, the same
/// limiter refuses.
async fn concurrency_in_shadow(limiter: ConcurrencyLimiter, held: Held<'_>) {
    let name = limiter.policy().name().to_owned();
    let layer = ConcurrencyLimitLayer::new(limiter.clone()).key(by_api_key());
    let shadow = routes().route_layer(layer.clone().shadow(true));

    let hung = hold(&shadow, keyed("/hang")).await;
    assert_eq!(held.count().await, 1, "the admitted request holds a lease");
    for _ in 0..3 {
        assert_eq!(status(&shadow, keyed("/ok")).await, StatusCode::OK);
    }
    let no_key = || Request::get("/ok").body(Body::empty()).unwrap();
    assert_eq!(status(&shadow, no_key()).await, StatusCode::OK);
    limiter.releases_settled().await;
    assert_eq!(held.count().await, 1, "a shadow denial took a lease");
    let seen = observed("concurrency", &name);
    assert_eq!(seen.decisions.allowed, 1);
    assert_eq!(seen.decisions.shadow_denied, 4);
    assert_eq!(seen.decisions.denied, 0);
    assert_eq!(seen.decisions.missing_key, 0);
    assert_eq!(seen.leases_in_use, Some(1));
    let queue = limiter.queue_state().unwrap();
    assert_eq!(
        (
            queue.waiting,
            queue.admitted,
            queue.timed_out,
            queue.overflowed
        ),
        (0, 0, 0, 0),
        "a shadow request waited in the queue"
    );

    // Enforcing: the caller waits out the queue and gets 429; without a
    // key, 400.
    let enforcing = routes().route_layer(layer);
    assert_eq!(
        status(&enforcing, keyed("/ok")).await,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(status(&enforcing, no_key()).await, StatusCode::BAD_REQUEST);
    assert_eq!(limiter.queue_state().unwrap().timed_out, 1);
    let seen = observed("concurrency", &name);
    assert_eq!((seen.decisions.denied, seen.decisions.missing_key), (1, 1));
    assert_eq!(seen.decisions.shadow_denied, 4);

    end(hung).await;
    limiter.releases_settled().await;
    assert_eq!(held.count().await, 0);
    assert_eq!(observed("concurrency", &name).leases_in_use, Some(0));
    // A free slot is taken in shadow mode as ever.
    assert_eq!(status(&shadow, keyed("/ok")).await, StatusCode::OK);
    assert_eq!(observed("concurrency", &name).decisions.allowed, 2);
}

#[tokio::test]
async fn concurrency_shadow_refuses_and_queues_nothing_on_the_memory_store() {
    let store = MemoryStore::new();
    let limiter = one_at_a_time("shadow-conc-memory", store.clone());
    concurrency_in_shadow(limiter, Held::Memory(&store)).await;
}

#[tokio::test]
async fn concurrency_shadow_refuses_and_queues_nothing_on_redis() {
    let server = RedisServer::start();
    let limiter = one_at_a_time("shadow-conc-redis", redis_store(&server).await);
    concurrency_in_shadow(limiter, Held::Redis(&server)).await;
}

#[tokio::test]
async fn concurrency_shadow_lets_requests_through_when_the_store_fails() {
    let down = common::unreachable_store(Duration::from_millis(100)).await;
    let name = "shadow-conc-down";
    let layer = ConcurrencyLimitLayer::new(one_at_a_time(name, down.clone()))
        .key(by_api_key())
        .on_store_error(FailurePolicy::Closed);
    let shadow = routes().route_layer(layer.clone().shadow(true));
    assert_eq!(status(&shadow, keyed("/ok")).await, StatusCode::OK);
    let seen = observed("concurrency", name);
    assert_eq!(
        (seen.decisions.fail_open, seen.decisions.fail_closed),
        (1, 0)
    );
    let enforcing = routes().route_layer(layer);
    let refused = status(&enforcing, keyed("/ok")).await;
    assert_eq!(refused, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(observed("concurrency", name).decisions.fail_closed, 1);

    // The local fallback (one in flight here) takes its lease, and what it
    // would refuse goes on too.
    let name = "shadow-conc-local";
    let layer = ConcurrencyLimitLayer::new(one_at_a_time(name, down))
        .key(by_api_key())
        .on_store_error(FailurePolicy::local(1.0).unwrap());
    let shadow = routes().route_layer(layer.clone().shadow(true));
    let hung = hold(&shadow, keyed("/hang")).await;
    assert_eq!(status(&shadow, keyed("/ok")).await, StatusCode::OK);
    let seen = observed("concurrency", name);
    assert_eq!(seen.decisions.fallback_allowed, 1);
    assert_eq!(seen.decisions.shadow_denied, 1);
    assert_eq!(seen.decisions.fallback_denied, 0);
    let enforcing = routes().route_layer(layer);
    let refused = status(&enforcing, keyed("/ok")).await;
    assert_eq!(refused, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(observed("concurrency", name).decisions.fallback_denied, 1);
    end(hung).await;
}

// ---------------------------------------------------------------------------
// FleetShedLayer.

/// A fleet of 4 in flight, of which the low tier may use 2.
fn fleet_policy(name: &str) -> FleetShedPolicy {
    FleetShedPolicy::builder(name, 4)
        .share("low", 0.5)
        .lease_ttl(Duration::from_secs(30))
        .build()
        .unwrap()
}

/// With the low tier's share held, shadow mode lets more low requests
/// through without a lease, counted `shadow_denied` and admitted in the
/// tier's state, never shed; enforcing, the same shedder sheds.
async fn fleet_in_shadow(shedder: FleetShedder) {
    let name = shedder.policy().name().to_owned();
    let layer = FleetShedLayer::new(shedder.clone()).classify(by_priority());
    let shadow = routes().route_layer(layer.clone().shadow(true));

    let held = [
        hold(&shadow, tiered("/hang", "low")).await,
        hold(&shadow, tiered("/hang", "low")).await,
    ];
    assert_eq!(shedder.fleet_in_flight().await.unwrap(), 2);
    for _ in 0..3 {
        let passed = status(&shadow, tiered("/ok", "low")).await;
        assert_eq!(passed, StatusCode::OK);
    }
    shedder.releases_settled().await;
    assert_eq!(
        shedder.fleet_in_flight().await.unwrap(),
        2,
        "a shadow denial took a lease"
    );
    let seen = observed("fleet_shed", &name);
    assert_eq!(seen.decisions.allowed, 2);
    assert_eq!(seen.decisions.shadow_denied, 3);
    assert_eq!(seen.decisions.shed, 0);
    let low = shedder.state().tier("low").unwrap().clone();
    assert_eq!((low.in_flight(), low.admitted(), low.shed()), (2, 5, 0));
    assert_eq!(low.shed_fraction(), 0.0);

    let enforcing = routes().route_layer(layer);
    let shed = status(&enforcing, tiered("/ok", "low")).await;
    assert_eq!(shed, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(shedder.state().tier("low").unwrap().shed(), 1);
    assert_eq!(observed("fleet_shed", &name).decisions.shed, 1);

    for task in held {
        end(task).await;
    }
    shedder.releases_settled().await;
    assert_eq!(shedder.fleet_in_flight().await.unwrap(), 0);
    assert_eq!(shedder.state().in_flight(), 0);
}

#[tokio::test]
async fn fleet_shed_shadow_sheds_nothing_on_the_memory_store() {
    let shedder = FleetShedder::new(fleet_policy("shadow-fleet-memory"), MemoryStore::new());
    fleet_in_shadow(shedder).await;
}

#[tokio::test]
async fn fleet_shed_shadow_sheds_nothing_on_redis() {
    let server = RedisServer::start();
    let store = redis_store(&server).await;
    let shedder = FleetShedder::new(fleet_policy("shadow-fleet-redis"), store);
    fleet_in_shadow(shedder).await;
    assert_eq!(server.leases_held().await, 0);
}

#[tokio::test]
async fn fleet_shed_shadow_lets_requests_through_when_the_store_fails() {
    let down = common::unreachable_store(Duration::from_millis(100)).await;
    let name = "shadow-fleet-down";
    let shedder = FleetShedder::new(fleet_policy(name), down.clone());
    let layer = FleetShedLayer::new(shedder)
        .classify(by_priority())
        .on_store_error(FailurePolicy::Closed);
    let shadow = routes().route_layer(layer.clone().shadow(true));
    assert_eq!(status(&shadow, tiered("/ok", "low")).await, StatusCode::OK);
    let seen = observed("fleet_shed", name);
    assert_eq!(
        (seen.decisions.fail_open, seen.decisions.fail_closed),
        (1, 0)
    );
    let enforcing = routes().route_layer(layer);
    let refused = status(&enforcing, tiered("/ok", "low")).await;
    assert_eq!(refused, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(observed("fleet_shed", name).decisions.fail_closed, 1);

    // The local fallback with half of everything: one low request in
    // flight here, and what it would shed goes on too.
    let name = "shadow-fleet-local";
    let shedder = FleetShedder::new(fleet_policy(name), down);
    let layer = FleetShedLayer::new(shedder.clone())
        .classify(by_priority())
        .on_store_error(FailurePolicy::local(0.5).unwrap());
    let shadow = routes().route_layer(layer.clone().shadow(true));
    let hung = hold(&shadow, tiered("/hang", "low")).await;
    assert_eq!(status(&shadow, tiered("/ok", "low")).await, StatusCode::OK);
    let seen = observed("fleet_shed", name);
    assert_eq!(seen.decisions.fallback_allowed, 1);
    assert_eq!(seen.decisions.shadow_denied, 1);
    assert_eq!(seen.decisions.fallback_denied, 0);
    assert_eq!(shedder.state().tier("low").unwrap().shed(), 0);
    let enforcing = routes().route_layer(layer);
    let shed = status(&enforcing, tiered("/ok", "low")).await;
    assert_eq!(shed, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(observed("fleet_shed", name).decisions.fallback_denied, 1);
    end(hung).await;
}

// ---------------------------------------------------------------------------
// UtilizationShedLayer.

/// A shedder on a gauge stuck at 1, its clock moved by hand, dropping
/// everything sheddable: no delay, a one-second ramp, two seconds past.
fn saturated(name: &str) -> UtilizationShedder {
    let clock = ManualClock::new(Duration::from_secs(1));
    let shedder = UtilizationShedder::gauge(|| 1.0)
        .name(name)
        .delay(Duration::ZERO)
        .ramp(Duration::from_secs(1))
        .clock(clock.clone())
        .random(|| 0.5)
        .build()
        .unwrap();
    let critical = shedder.tiers().critical();
    drop(shedder.admit(critical).expect("critical is never shed"));
    clock.advance(Duration::from_secs(2));
    drop(shedder.admit(critical).expect("critical is never shed"));
    assert_eq!(shedder.state().amount(), Some(1.0));
    shedder
}

#[tokio::test]
async fn utilization_shadow_counts_what_it_would_drop_and_drops_nothing() {
    let name = "shadow-utilization";
    let shedder = saturated(name);
    let layer = UtilizationShedLayer::new(shedder.clone()).classify(by_priority());
    let shadow = routes().layer(layer.clone().shadow(true));
    let logs = Logs::default();
    let writer = logs.clone();
    let _logging = tracing::subscriber::set_default(
        tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .with_max_level(tracing::Level::DEBUG)
            .finish(),
    );

    // A request it would drop goes on, and counts in flight.
    let hung = hold(&shadow, tiered("/hang", "low")).await;
    assert_eq!(shedder.state().tier("low").unwrap().in_flight(), 1);
    for tier in ["high", "normal", "low", "critical"] {
        assert_eq!(status(&shadow, tiered("/ok", tier)).await, StatusCode::OK);
    }
    let seen = observed("utilization_shed", name);
    assert_eq!(seen.decisions.shadow_denied, 4);
    assert_eq!(seen.decisions.allowed, 1);
    assert_eq!(seen.decisions.shed, 0);
    let state = shedder.state();
    for tier in state.tiers() {
        assert_eq!(tier.shed(), 0, "{}", tier.name());
    }
    let low = state.tier("low").unwrap();
    assert_eq!((low.in_flight(), low.admitted()), (1, 2));
    // The shed fraction is still the drop probability: what it would drop.
    assert_eq!(low.shed_fraction(), 1.0);
    let text = logs.text();
    assert_eq!(text.matches("shadow-denied").count(), 4, "{text}");
    assert!(!text.contains(" shed "), "{text}");

    let enforcing = routes().layer(layer);
    let shed = status(&enforcing, tiered("/ok", "low")).await;
    assert_eq!(shed, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(shedder.state().tier("low").unwrap().shed(), 1);
    assert_eq!(observed("utilization_shed", name).decisions.shed, 1);
    end(hung).await;
    assert_eq!(shedder.state().in_flight(), 0);
}
