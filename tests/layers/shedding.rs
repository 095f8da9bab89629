//! FleetShedLayer through real axum routers, on the memory store and on a
//! private Redis shared by several instances (each its own store and
//! connection): at capacity the low tier gets 503 while critical requests
//! still pass, shed requests hold no slot, no slot is lost however a
//! request ends, store failures follow the layer's policy, and the state
//! tells how much of each tier was shed recently.
use crate::common;

use std::convert::Infallible;
use std::time::Duration;

use crate::handlers::{self, Started, gated, quiet_deliberate_panics};
use axum::Router;
use axum::body::Body;
use axum::routing::get;
use common::{RedisServer, redis_store};
use fleetgate::shed::{
    FleetShed, FleetShedLayer, FleetShedPolicy, FleetShedder, HeaderTier, RouteTiers, ShedError,
    ShedRejectionKind, Tiers, UtilizationShedLayer, UtilizationShedder,
};
use fleetgate::{FailurePolicy, MemoryStore, mode};
use http::{HeaderName, Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use tokio::sync::{mpsc, watch};
use tower::util::BoxCloneService;
use tower::{Layer, Service, ServiceBuilder, ServiceExt, service_fn};

// ---------------------------------------------------------------------------
// Helpers.

/// A fleet of 4 in flight: high may use all of it, normal 3, low 2;
/// critical is never shed.
fn policy(name: &str) -> FleetShedPolicy {
    FleetShedPolicy::builder(name, 4)
        .share("high", 1.0)
        .share("normal", 0.75)
        .share("low", 0.5)
        .lease_ttl(Duration::from_secs(30))
        .build()
        .unwrap()
}

/// The tier comes from `x-priority`, as an upstream gateway would set it.
fn classifier() -> HeaderTier {
    HeaderTier::new(HeaderName::from_static("x-priority"))
}

fn request(path: &str, tier: &str) -> Request<Body> {
    Request::get(path)
        .header("x-priority", tier)
        .body(Body::empty())
        .unwrap()
}

/// `/held` reports that it started and waits for the gate; `/hang` never
/// answers; `/panic` panics; `/quick` answers at once.
fn app(
    shedder: FleetShedder,
    gate: watch::Receiver<bool>,
    entered: mpsc::UnboundedSender<()>,
) -> Router {
    Router::new()
        .route("/held", get(gated(gate, entered)))
        .route("/quick", get(|| async { "ok" }))
        .route("/hang", get(handlers::hang))
        .route("/panic", get(handlers::panic))
        .route_layer(FleetShedLayer::new(shedder).classify(classifier()))
}

/// Several instances of one service: one shedder and router each (with
/// Redis, each its own store and connection), one gate for all.
struct Fleet {
    shedders: Vec<FleetShedder>,
    apps: Vec<Router>,
    open: watch::Sender<bool>,
    entered: mpsc::UnboundedReceiver<()>,
}

impl Fleet {
    fn new(shedders: Vec<FleetShedder>) -> Fleet {
        let (entered_tx, entered) = mpsc::unbounded_channel();
        let (open, gate) = watch::channel(false);
        let apps = shedders
            .iter()
            .map(|s| app(s.clone(), gate.clone(), entered_tx.clone()))
            .collect();
        Fleet {
            shedders,
            apps,
            open,
            entered,
        }
    }

    fn app(&self, i: usize) -> Router {
        self.apps[i % self.apps.len()].clone()
    }

    /// Starts a `/held` request of `tier` on instance `i`, and waits until
    /// its handler runs: it was admitted and holds its slot.
    async fn hold(&mut self, i: usize, tier: &str) -> tokio::task::JoinHandle<StatusCode> {
        let call = self.app(i).oneshot(request("/held", tier));
        let task = tokio::spawn(async move {
            let response = call.await.unwrap();
            let status = response.status();
            let _ = response.into_body().collect().await;
            status
        });
        tokio::time::timeout(Duration::from_secs(10), self.entered.recv())
            .await
            .unwrap_or_else(|_| panic!("a {tier} request was not admitted"))
            .unwrap();
        task
    }

    /// A `/quick` request of `tier` on instance `i`: its status, its
    /// `Retry-After` and its body.
    async fn quick(&self, i: usize, tier: &str) -> (StatusCode, Option<String>, String) {
        let response = self.app(i).oneshot(request("/quick", tier)).await.unwrap();
        let status = response.status();
        let retry = response
            .headers()
            .get("retry-after")
            .map(|v| v.to_str().unwrap().to_owned());
        let body = response.into_body().collect().await.unwrap().to_bytes();
        (status, retry, String::from_utf8_lossy(&body).into_owned())
    }

    async fn settled(&self) {
        for s in &self.shedders {
            s.releases_settled().await;
        }
    }

    /// The fleet's count, as the store has it.
    async fn in_flight(&self) -> u64 {
        self.shedders[0].fleet_in_flight().await.unwrap()
    }

    /// This tier's in-flight and shed counts, summed over the instances.
    fn local(&self, tier: &str) -> (u64, u64) {
        self.shedders.iter().fold((0, 0), |(f, s), shedder| {
            let state = shedder.state();
            let t = state.tier(tier).unwrap();
            (f + t.in_flight(), s + t.shed())
        })
    }
}

// ---------------------------------------------------------------------------
// At capacity: the low tier is shed, critical passes, shed requests hold
// nothing.

async fn at_capacity(shedders: Vec<FleetShedder>) {
    let mut fleet = Fleet::new(shedders);

    // Two reports (low: limit 2) fill the low tier's share.
    let mut held = vec![fleet.hold(0, "low").await, fleet.hold(1, "low").await];
    assert_eq!(fleet.in_flight().await, 2);
    for i in 0..3 {
        let (status, retry, body) = fleet.quick(i, "low").await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(retry.as_deref(), Some("1"));
        assert!(body.contains("low"), "{body}");
    }
    // Shed requests took no slot.
    assert_eq!(fleet.in_flight().await, 2);

    // Normal (limit 3) gets one more, then is shed too.
    held.push(fleet.hold(2, "normal").await);
    assert_eq!(
        fleet.quick(0, "normal").await.0,
        StatusCode::SERVICE_UNAVAILABLE
    );

    // Critical is never shed: three more, past the fleet's capacity of 4.
    for i in 0..3 {
        held.push(fleet.hold(i, "critical").await);
    }
    assert_eq!(fleet.quick(1, "critical").await.0, StatusCode::OK);
    // It counts: high (limit 4) is shed now that 6 are in flight.
    assert_eq!(
        fleet.quick(2, "high").await.0,
        StatusCode::SERVICE_UNAVAILABLE
    );
    // (The quick charge's release may still be on its way.)
    fleet.settled().await;
    assert_eq!(fleet.in_flight().await, 6);

    assert_eq!(fleet.local("low"), (2, 3));
    assert_eq!(fleet.local("normal"), (1, 1));
    assert_eq!(fleet.local("critical"), (3, 0));
    assert_eq!(fleet.local("high"), (0, 1));
    let state = fleet.shedders[0].state();
    assert_eq!(state.tier("low").unwrap().limit(), Some(2));
    assert_eq!(state.tier("critical").unwrap().limit(), None);

    // Everything ends: every slot is given back, and reports pass again.
    let _ = fleet.open.send(true);
    for task in held {
        assert_eq!(task.await.unwrap(), StatusCode::OK);
    }
    fleet.settled().await;
    assert_eq!(fleet.in_flight().await, 0);
    assert_eq!(fleet.local("low"), (0, 3));
    assert_eq!(fleet.quick(0, "low").await.0, StatusCode::OK);
    fleet.settled().await;

    // Sixteen reports at once on every instance: exactly two get in.
    let _ = fleet.open.send(false);
    let (done_tx, mut done) = mpsc::unbounded_channel();
    for i in 0..16 {
        let call = fleet.app(i).oneshot(request("/held", "low"));
        let done = done_tx.clone();
        tokio::spawn(async move {
            let response = call.await.unwrap();
            let status = response.status();
            let _ = response.into_body().collect().await;
            let _ = done.send(status);
        });
    }
    for _ in 0..14 {
        let status = tokio::time::timeout(Duration::from_secs(10), done.recv())
            .await
            .expect("fewer than 14 reports shed")
            .unwrap();
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    }
    for _ in 0..2 {
        tokio::time::timeout(Duration::from_secs(10), fleet.entered.recv())
            .await
            .expect("two reports should be admitted")
            .unwrap();
    }
    assert!(fleet.entered.try_recv().is_err(), "more than 2 reports in");
    assert_eq!(fleet.in_flight().await, 2);
    let _ = fleet.open.send(true);
    for _ in 0..2 {
        assert_eq!(done.recv().await.unwrap(), StatusCode::OK);
    }
    fleet.settled().await;
    assert_eq!(fleet.in_flight().await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_capacity_low_is_shed_and_critical_passes_on_the_memory_store() {
    let store = MemoryStore::new();
    at_capacity(vec![FleetShedder::new(policy("fleet"), store.clone())]).await;
    assert_eq!(store.lease_count(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_capacity_low_is_shed_and_critical_passes_across_instances_on_redis() {
    let server = RedisServer::start();
    let mut shedders = Vec::new();
    // Three instances: three stores, three connections.
    for _ in 0..3 {
        shedders.push(FleetShedder::new(
            policy("fleet"),
            redis_store(&server).await,
        ));
    }
    at_capacity(shedders).await;
    assert_eq!(server.leases_held().await, 0);
}

// ---------------------------------------------------------------------------
// No slot is lost, however a request ends.

async fn nothing_lost(shedder: FleetShedder) {
    quiet_deliberate_panics();
    let fleet = Fleet::new(vec![shedder.clone()]);
    let app = fleet.app(0);

    // Cancelled while the handler runs.
    let (started, handler_started) = Started::new();
    let mut req = request("/hang", "low");
    req.extensions_mut().insert(started);
    let call = tokio::spawn(app.clone().oneshot(req));
    handler_started.await.unwrap();
    assert_eq!(fleet.in_flight().await, 1);
    assert_eq!(shedder.state().in_flight(), 1);
    call.abort();
    assert!(call.await.unwrap_err().is_cancelled());
    fleet.settled().await;
    assert_eq!(fleet.in_flight().await, 0);
    assert_eq!(shedder.state().in_flight(), 0);

    // The handler panics.
    let joined = tokio::spawn(app.clone().oneshot(request("/panic", "low"))).await;
    assert!(joined.expect_err("the handler panics").is_panic());
    fleet.settled().await;
    assert_eq!(fleet.in_flight().await, 0);

    // The body holds the slot until it is dropped unread.
    let response = app.clone().oneshot(request("/quick", "low")).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(fleet.in_flight().await, 1, "the unread body holds its slot");
    assert_eq!(shedder.state().tier("low").unwrap().in_flight(), 1);
    drop(response);
    fleet.settled().await;
    assert_eq!(fleet.in_flight().await, 0);
    assert_eq!(shedder.state().in_flight(), 0);

    // Cancelled before the store has answered.
    for _ in 0..50 {
        let mut req = request("/hang", "low");
        req.extensions_mut().insert(Started::default());
        let call = app.clone().oneshot(req);
        tokio::pin!(call);
        tokio::select! {
            biased;
            _ = &mut call => panic!("a hanging handler answered"),
            _ = std::future::ready(()) => {}
        }
    }
    fleet.settled().await;
    assert_eq!(fleet.in_flight().await, 0);
    assert_eq!(shedder.state().in_flight(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_slot_is_lost_on_the_memory_store() {
    let store = MemoryStore::new();
    nothing_lost(FleetShedder::new(policy("life"), store.clone())).await;
    assert_eq!(store.lease_count(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_slot_is_lost_on_redis() {
    let server = RedisServer::start();
    nothing_lost(FleetShedder::new(
        policy("life"),
        redis_store(&server).await,
    ))
    .await;
}

// ---------------------------------------------------------------------------
// Store failures, rejections, typed errors.

#[tokio::test]
async fn a_store_failure_follows_the_policy_and_never_sheds_critical() {
    let down = common::unreachable_store(Duration::from_millis(100)).await;
    let shedder = FleetShedder::new(policy("down"), down.clone());
    let app = |failure: FailurePolicy| {
        Router::new()
            .route("/", get(|| async { "ok" }))
            .route_layer(
                FleetShedLayer::new(shedder.clone())
                    .classify(classifier())
                    .on_store_error(failure),
            )
    };
    let open = app(FailurePolicy::Open);
    assert_eq!(
        open.oneshot(request("/", "low")).await.unwrap().status(),
        StatusCode::OK
    );
    let closed = app(FailurePolicy::Closed);
    let refused = closed.clone().oneshot(request("/", "low")).await.unwrap();
    assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(refused.headers()["retry-after"], "1");
    assert_eq!(
        closed
            .oneshot(request("/", "critical"))
            .await
            .unwrap()
            .status(),
        StatusCode::OK
    );

    // Local: this instance sheds on its own with half of everything: the
    // low tier may have 1 in flight, critical still passes.
    let local = app(FailurePolicy::local(0.5).unwrap());
    let held = local.clone().oneshot(request("/", "low")).await.unwrap();
    assert_eq!(held.status(), StatusCode::OK);
    let shed = local.clone().oneshot(request("/", "low")).await.unwrap();
    assert_eq!(shed.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(shed.headers()["retry-after"], "1");
    let critical = local.clone().oneshot(request("/", "critical")).await;
    assert_eq!(critical.unwrap().status(), StatusCode::OK);
    assert_eq!(shedder.state().tier("low").unwrap().in_flight(), 1);
    drop(held);
    let again = local.oneshot(request("/", "low")).await.unwrap();
    assert_eq!(again.status(), StatusCode::OK);
}

#[tokio::test]
async fn routes_classify_and_rejections_are_configurable() {
    let tiers = Tiers::default();
    let routes = RouteTiers::new(&tiers)
        .route(Some(Method::POST), "/charge", "critical")
        .unwrap()
        .route(None, "/report", "low")
        .unwrap();
    let shedder = FleetShedder::new(policy("routes"), MemoryStore::new());
    let app = Router::new()
        .route("/charge", axum::routing::post(|| async { "charged" }))
        .route("/report", get(|| async { "report" }))
        .route("/other", get(|| async { "other" }))
        .route_layer(
            FleetShedLayer::new(shedder.clone())
                .classify(routes)
                .retry_after(Duration::from_millis(2500))
                .rejection(|r| {
                    let mut response = r.default_response();
                    if let ShedRejectionKind::OverLimit { in_flight, limit } = r.kind() {
                        *response.body_mut() =
                            format!("{} shed at {in_flight}/{limit}", r.tier_name()).into();
                    }
                    response
                }),
        );
    let call = |method: Method, path: &str| {
        let req = Request::builder().method(method).uri(path);
        app.clone().oneshot(req.body(Body::empty()).unwrap())
    };
    // Two unread report bodies hold the low tier's share.
    let mut bodies = Vec::new();
    for _ in 0..2 {
        bodies.push(call(Method::GET, "/report").await.unwrap());
    }
    let shed = call(Method::GET, "/report").await.unwrap();
    assert_eq!(shed.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(shed.headers()["retry-after"], "3");
    let body = shed.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&body[..], b"low shed at 2/2");
    // Unclassified requests are normal (limit 3): one more fits.
    let other = call(Method::GET, "/other").await.unwrap();
    assert_eq!(other.status(), StatusCode::OK);
    assert_eq!(shedder.state().tier("normal").unwrap().in_flight(), 1);
    let charge = call(Method::POST, "/charge").await.unwrap();
    assert_eq!(charge.status(), StatusCode::OK);
    assert_eq!(shedder.fleet_in_flight().await.unwrap(), 4);
}

#[tokio::test]
async fn typed_errors_for_services_that_are_not_http() {
    let shedder = FleetShedder::new(policy("typed"), MemoryStore::new());
    let (release, released) = watch::channel(false);
    let (entered_tx, mut entered) = mpsc::unbounded_channel();
    let svc = ServiceBuilder::new()
        .layer(
            FleetShedLayer::new(shedder.clone())
                .classify(|job: &&'static str, tiers: &Tiers| tiers.get(job))
                .typed_errors(),
        )
        .service(service_fn(move |_job: &'static str| {
            let mut released = released.clone();
            let entered = entered_tx.clone();
            async move {
                let _ = entered.send(());
                let _ = released.wait_for(|r| *r).await;
                Ok::<_, Infallible>("done")
            }
        }));
    let first = tokio::spawn(svc.clone().oneshot("low"));
    let second = tokio::spawn(svc.clone().oneshot("low"));
    for _ in 0..2 {
        entered.recv().await.unwrap();
    }
    let err = svc.clone().oneshot("low").await.unwrap_err();
    let err = err.downcast::<ShedError>().unwrap();
    assert!(matches!(*err, ShedError::Shed { ref tier, .. } if tier == "low"));
    assert_eq!(shedder.state().tier("low").unwrap().shed(), 1);
    let _ = release.send(true);
    assert_eq!(first.await.unwrap().unwrap(), "done");
    assert_eq!(second.await.unwrap().unwrap(), "done");
    assert_eq!(svc.oneshot("low").await.unwrap(), "done");
    assert_eq!(shedder.fleet_in_flight().await.unwrap(), 0);
    assert_eq!(shedder.state().in_flight(), 0);
}

/// The types the shed module's docs say can be written, can: the layers
/// without a classifier (`()`) or with typed errors, and a service's
/// response future and body through `Service`.
#[tokio::test]
async fn the_layers_and_services_types_can_be_written() {
    type Inner = BoxCloneService<Request<Body>, Response<Body>, Infallible>;
    type Shed = FleetShed<Inner, (), mode::Http>;
    type ShedFuture = <Shed as Service<Request<Body>>>::Future;
    type ShedResponse = <Shed as Service<Request<Body>>>::Response;
    let shedder = FleetShedder::new(policy("named"), MemoryStore::new());
    let layer: FleetShedLayer = FleetShedLayer::new(shedder.clone());
    let _typed: FleetShedLayer<(), mode::TypedErrors> = layer.clone().typed_errors();
    let _routes: UtilizationShedLayer<RouteTiers> =
        UtilizationShedLayer::new(UtilizationShedder::workers(4).build().unwrap())
            .classify(RouteTiers::new(&Tiers::default()));
    let inner: Inner = BoxCloneService::new(service_fn(|_: Request<Body>| async {
        Ok(Response::new(Body::from("ok")))
    }));
    let mut svc: Shed = layer.layer(inner);
    let future: ShedFuture = svc.ready().await.unwrap().call(request("/", "low"));
    let response: ShedResponse = future.await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    drop(response);
    assert_eq!(shedder.state().in_flight(), 0);
}

#[tokio::test]
async fn one_round_trip_to_admit_one_to_release_none_for_a_shed_request() {
    use common::stats::{reset_stats, script_calls};

    let server = RedisServer::start();
    let shedder = FleetShedder::new(policy("trips"), redis_store(&server).await);
    let fleet = Fleet::new(vec![shedder.clone()]);
    let mut conn = server
        .client()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    // Load the scripts so that no NOSCRIPT fallback muddies the count.
    assert_eq!(fleet.quick(0, "low").await.0, StatusCode::OK);
    fleet.settled().await;
    reset_stats(&mut conn).await;

    for _ in 0..5 {
        assert_eq!(fleet.quick(0, "critical").await.0, StatusCode::OK);
        fleet.settled().await;
    }
    assert_eq!(script_calls(&mut conn).await, 10);
    // Two unread reports fill the low share; the third is shed: its one
    // round trip took nothing, so nothing is released.
    let held = [
        fleet
            .app(0)
            .oneshot(request("/quick", "low"))
            .await
            .unwrap(),
        fleet
            .app(0)
            .oneshot(request("/quick", "low"))
            .await
            .unwrap(),
    ];
    assert_eq!(
        fleet.quick(0, "low").await.0,
        StatusCode::SERVICE_UNAVAILABLE
    );
    drop(held);
    fleet.settled().await;
    assert_eq!(script_calls(&mut conn).await, 10 + 3 + 2);
    assert_eq!(shedder.fleet_in_flight().await.unwrap(), 0);
}

// ---------------------------------------------------------------------------
// State: the shed fraction, the lease set's identity.

#[tokio::test(start_paused = true)]
async fn the_shed_fraction_is_the_share_of_recent_requests_shed() {
    let shedder = FleetShedder::new(policy("fraction"), MemoryStore::new());
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .route_layer(FleetShedLayer::new(shedder.clone()).classify(classifier()));
    let call = |tier: &str| app.clone().oneshot(request("/", tier));
    let fraction = |tier: &str| shedder.state().tier(tier).unwrap().shed_fraction();

    // Two low responses held (unread) fill the tier's 2; two more are shed.
    let mut held = vec![call("low").await.unwrap(), call("low").await.unwrap()];
    for _ in 0..2 {
        let status = call("low").await.unwrap().status();
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    }
    assert_eq!(fraction("low"), 0.5);
    // One given back, one more admitted: 2 of 5 shed, not "the last one
    // passed".
    held.pop();
    shedder.releases_settled().await;
    held.push(call("low").await.unwrap());
    assert_eq!(fraction("low"), 0.4);
    assert_eq!(call("critical").await.unwrap().status(), StatusCode::OK);
    assert_eq!(fraction("critical"), 0.0);

    // Ten seconds later the old decisions weigh 1/e each: one more shed
    // request moves the fraction to (2/e + 1) / (5/e + 1).
    tokio::time::advance(Duration::from_secs(10)).await;
    assert_eq!(fraction("low"), 0.4, "it holds while no request comes");
    let status = call("low").await.unwrap().status();
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    let e = std::f64::consts::E;
    let expected = (2.0 / e + 1.0) / (5.0 / e + 1.0);
    assert!(
        (fraction("low") - expected).abs() < 1e-9,
        "{}",
        fraction("low")
    );
    drop(held);
    shedder.releases_settled().await;
}

#[tokio::test]
async fn a_concurrency_limit_of_the_same_name_has_its_own_lease_set() {
    use fleetgate::Key;
    use fleetgate::concurrency::{Admission, ConcurrencyLimiter, ConcurrencyPolicy};

    let store = MemoryStore::new();
    let shedder = FleetShedder::new(policy("same"), store.clone());
    let low = shedder.policy().tiers().get("low").unwrap();
    let mut held = Vec::new();
    for _ in 0..2 {
        match shedder.admit(low).await.unwrap() {
            Admission::Acquired(guard) => held.push(guard),
            Admission::Refused(grant) => panic!("refused at {}", grant.in_flight()),
        }
    }
    // One slot per key, on the same store, for a key named like the
    // shedder's old identity: the shedder's two leases are not its.
    let limiter = ConcurrencyLimiter::new(ConcurrencyPolicy::new("same", 1).unwrap(), store);
    let admission = limiter.acquire(&Key::new("fleet")).await.unwrap();
    assert!(matches!(admission, Admission::Acquired(_)));
    assert_eq!(shedder.fleet_in_flight().await.unwrap(), 2);
}
