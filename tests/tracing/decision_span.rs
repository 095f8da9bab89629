//! One `fleetgate.decision` span per decision, carrying the layer, the
//! policy, the outcome and, for Redis, the store's latency; read back
//! through a subscriber layer that keeps every span's fields.
use crate::common;

use std::collections::HashMap;
use std::fmt::Debug;
use std::sync::{Arc, Mutex};

use common::RedisServer;
use fleetgate::concurrency::{ConcurrencyLimitLayer, ConcurrencyLimiter, ConcurrencyPolicy};
use fleetgate::key::{GlobalKey, HeaderKey};
use fleetgate::{Limit, Limiter, MemoryStore, Policy, Rate, RateLimitLayer, RedisStore};
use http::{Request, Response, StatusCode};
use tower::{Layer, ServiceExt, service_fn};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::Registry;

type Fields = HashMap<String, String>;

/// Every `fleetgate.decision` span's fields, in order of creation.
#[derive(Clone, Default)]
struct Spans(Arc<Mutex<Vec<(Id, Fields)>>>);

struct Collect<'a>(&'a mut Fields);

impl Visit for Collect<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Spans {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, _: Context<'_, S>) {
        if attrs.metadata().name() == "fleetgate.decision" {
            let mut fields = Fields::new();
            attrs.record(&mut Collect(&mut fields));
            self.0.lock().unwrap().push((id.clone(), fields));
        }
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, _: Context<'_, S>) {
        let mut spans = self.0.lock().unwrap();
        if let Some((_, fields)) = spans.iter_mut().rev().find(|(i, _)| i == id) {
            values.record(&mut Collect(fields));
        }
    }
}

impl Spans {
    /// Installs the collector for this thread (the tests run on a
    /// current-thread runtime).
    fn install() -> (Spans, tracing::subscriber::DefaultGuard) {
        let spans = Spans::default();
        let subscriber = Registry::default().with(spans.clone());
        let guard = tracing::subscriber::set_default(subscriber);
        (spans, guard)
    }

    fn taken(&self) -> Vec<Fields> {
        std::mem::take(&mut *self.0.lock().unwrap())
            .into_iter()
            .map(|(_, fields)| fields)
            .collect()
    }
}

fn field<'a>(fields: &'a Fields, name: &str) -> Option<&'a str> {
    fields.get(name).map(String::as_str)
}

fn policy(name: &str) -> Policy {
    Policy::single(
        name,
        Limit::builder(Rate::per_minute(1))
            .burst(2)
            .build()
            .unwrap(),
    )
    .unwrap()
}

fn ok_service() -> impl tower::Service<
    Request<()>,
    Response = Response<String>,
    Error = std::convert::Infallible,
    Future = impl Send,
> + Clone {
    service_fn(|_req: Request<()>| async { Ok(Response::new(String::from("ok"))) })
}

fn get(api_key: Option<&str>) -> Request<()> {
    let mut req = Request::get("/").body(()).unwrap();
    if let Some(key) = api_key {
        req.headers_mut().insert("x-api-key", key.parse().unwrap());
    }
    req
}

#[tokio::test]
async fn redis_decisions_carry_outcome_and_store_latency() {
    let (spans, _guard) = Spans::install();
    let server = RedisServer::start();
    let store = RedisStore::connect(&server.url()).await.unwrap();
    let svc = RateLimitLayer::new(Limiter::new(policy("traced"), store))
        .key(GlobalKey::new())
        .layer(ok_service());
    let mut statuses = Vec::new();
    for _ in 0..3 {
        statuses.push(svc.clone().oneshot(get(None)).await.unwrap().status());
    }
    assert_eq!(
        statuses,
        [
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::TOO_MANY_REQUESTS
        ]
    );
    let spans = spans.taken();
    let outcomes: Vec<_> = spans.iter().map(|s| field(s, "outcome")).collect();
    assert_eq!(
        outcomes,
        [Some("allowed"), Some("allowed"), Some("denied")],
        "{spans:?}"
    );
    for span in &spans {
        assert_eq!(field(span, "layer"), Some("rate_limit"));
        assert_eq!(field(span, "policy"), Some("traced"));
        let micros: u64 = field(span, "store_latency_us")
            .unwrap_or_else(|| panic!("no store latency: {span:?}"))
            .parse()
            .unwrap();
        // A loopback round trip; a generous bound that a missing or
        // garbled figure would still break.
        assert!(micros < 10_000_000, "{micros}");
    }
}

#[tokio::test]
async fn in_process_decisions_have_no_store_latency() {
    let (spans, _guard) = Spans::install();
    let svc = RateLimitLayer::new(Limiter::new(policy("local"), MemoryStore::new()))
        .key(GlobalKey::new())
        .layer(ok_service());
    for _ in 0..3 {
        svc.clone().oneshot(get(None)).await.unwrap();
    }
    let spans = spans.taken();
    assert_eq!(spans.len(), 3);
    assert_eq!(field(&spans[2], "outcome"), Some("denied"));
    assert!(spans.iter().all(|s| field(s, "store_latency_us").is_none()));
}

#[tokio::test]
async fn a_missing_key_is_a_decision_span_of_its_own() {
    let (spans, _guard) = Spans::install();
    let rate = RateLimitLayer::new(Limiter::new(policy("keyed"), MemoryStore::new()))
        .key(HeaderKey::new("x-api-key"))
        .layer(ok_service());
    let res = rate.oneshot(get(None)).await.unwrap();
    assert_eq!(res.status(), StatusCode::BAD_REQUEST);
    let concurrency = ConcurrencyLimitLayer::new(ConcurrencyLimiter::new(
        ConcurrencyPolicy::new("keyed-inflight", 1).unwrap(),
        MemoryStore::new(),
    ))
    .key(HeaderKey::new("x-api-key"))
    .layer(ok_service());
    let res = concurrency.oneshot(get(None)).await.unwrap();
    assert_eq!(res.status(), StatusCode::BAD_REQUEST);
    let spans = spans.taken();
    let seen: Vec<_> = spans
        .iter()
        .map(|s| (field(s, "layer"), field(s, "policy"), field(s, "outcome")))
        .collect();
    assert_eq!(
        seen,
        [
            (Some("rate_limit"), Some("keyed"), Some("missing_key")),
            (
                Some("concurrency"),
                Some("keyed-inflight"),
                Some("missing_key")
            ),
        ]
    );
}

#[tokio::test]
async fn concurrency_decisions_on_redis_carry_store_latency() {
    let (spans, _guard) = Spans::install();
    let server = RedisServer::start();
    let store = RedisStore::connect(&server.url()).await.unwrap();
    let svc = ConcurrencyLimitLayer::new(ConcurrencyLimiter::new(
        ConcurrencyPolicy::new("inflight", 1).unwrap(),
        store,
    ))
    .key(HeaderKey::new("x-api-key"))
    .layer(ok_service());
    let res = svc.oneshot(get(Some("k"))).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let spans = spans.taken();
    assert_eq!(spans.len(), 1, "{spans:?}");
    assert_eq!(field(&spans[0], "layer"), Some("concurrency"));
    assert_eq!(field(&spans[0], "outcome"), Some("allowed"));
    assert!(field(&spans[0], "store_latency_us").is_some(), "{spans:?}");
}

#[tokio::test]
async fn shed_decisions_name_their_tier() {
    use fleetgate::shed::{FleetShedLayer, FleetShedPolicy, FleetShedder, HeaderTier};

    let (spans, _guard) = Spans::install();
    let server = RedisServer::start();
    let store = RedisStore::connect(&server.url()).await.unwrap();
    let fleet = FleetShedPolicy::builder("fleet", 4).build().unwrap();
    let svc = FleetShedLayer::new(FleetShedder::new(fleet, store))
        .classify(HeaderTier::new(http::HeaderName::from_static("x-tier")))
        .layer(ok_service());
    let mut req = get(None);
    req.headers_mut().insert("x-tier", "low".parse().unwrap());
    assert_eq!(svc.oneshot(req).await.unwrap().status(), StatusCode::OK);
    let spans = spans.taken();
    assert_eq!(spans.len(), 1, "{spans:?}");
    let span = &spans[0];
    assert_eq!(field(span, "layer"), Some("fleet_shed"));
    assert_eq!(field(span, "tier"), Some("low"));
    assert_eq!(field(span, "outcome"), Some("allowed"));
    assert!(field(span, "store_latency_us").is_some(), "{span:?}");
}
