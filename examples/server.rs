//! The fleetgate demo server.
//!
//! ```text
//! cargo run --example server                                  # in-process store
//! REDIS_URL=redis://127.0.0.1:6379 cargo run --example server # shared through Redis
//! ```
//!
//! Environment:
//! - `FLEETGATE_ADDR`: listen address (default `127.0.0.1:3000`).
//! - `REDIS_URL`: when set, limits live in that Redis, so every instance
//!   pointed at it shares the same counts.
//! - `RUST_LOG`: log filter (default `info`; `fleetgate=debug` shows denials).
//! - `FLEETGATE_FAILURE_POLICY`: what `/api/ping` does when Redis is down or
//!   slow (every call times out after 50 ms): `open` (default) answers
//!   `pong` unlimited, `closed` answers 503 with `Retry-After: 1`, `local`
//!   limits each instance to half the limit on its own (`local:0.25` to a
//!   quarter: one of four instances). The demo
//!   starts even while Redis is down and reconnects by itself when it is
//!   back; failures are logged at `warn`, at most once a second.
//! - `FLEETGATE_POLICIES`: a TOML policy file (see `examples/policies.toml`)
//!   whose routes and policies replace the built-in rate limits of
//!   `/api/ping` and `/api/window`: limits change without a rebuild.
//! - `FLEETGATE_SHED_WORKERS`: the worker capacity of the worker-utilization
//!   shedder in front of `/api/charge` and `/api/report` (default 64).
//!
//! Routes:
//! - `GET /` lists the routes and their limits.
//! - `GET /api/ping` answers `pong`, limited per API key (`x-api-key`, or the
//!   client IP without one) to a burst of 5, refilling 1 per second.
//! - `GET /api/window` answers `window`, limited per API key (or client IP)
//!   by an exact sliding-window log of 25 per 5 s and 300 per minute, the
//!   way many upstream APIs publish their limits: the 26th quick call gets
//!   a 429 naming the 5 s window.
//! - `GET /healthz` answers `ok`, never limited.
//! - `GET /metrics` shows the limiter's metrics in Prometheus' text format
//!   (`fleetgate_decisions_total` by policy and outcome, store latency, ...).
//! - `GET /api/slow?ms=N` answers after `N` milliseconds (default 1000, at
//!   most 60000), at most 2 in flight per API key (`x-api-key`, or the
//!   client IP without one): a third concurrent call gets 429.
//! - `POST /api/charge?ms=N` (critical) and `GET /api/report?ms=N` (low
//!   priority) answer after `N` milliseconds (default 1000), behind a fleet
//!   load shedder of 4 in flight of which reports may use 2: a third
//!   concurrent report gets 503, a charge is never shed. In front of both,
//!   a worker-utilization shedder sheds reports first once this process
//!   has had more than 80% of `FLEETGATE_SHED_WORKERS` busy for a while
//!   (28 s with all of them busy; longer the closer it is to 80%).
//!
//! Try: `for i in $(seq 8); do curl -s -o /dev/null -w '%{http_code}\n' localhost:3000/api/ping; done`
//! and `for i in 1 2 3; do curl -s -w ' %{http_code}\n' 'localhost:3000/api/slow?ms=3000' & done; wait`
//! and `for i in 1 2 3 4; do curl -s -w ' %{http_code}\n' 'localhost:3000/api/report?ms=3000' & done; curl -s -w ' %{http_code}\n' -X POST localhost:3000/api/charge; wait`

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::Query;
use axum::http::{Method, StatusCode};
use axum::routing::{get, post};
use fleetgate::concurrency::{ConcurrencyLimitLayer, ConcurrencyLimiter, ConcurrencyPolicy};
use fleetgate::key::{HeaderKey, PeerIp};
use fleetgate::rate_limit::RoutePolicies;
use fleetgate::shed::{
    FleetShedLayer, FleetShedPolicy, FleetShedder, RouteTiers, Tiers, UtilizationShedLayer,
    UtilizationShedder,
};
use fleetgate::spec::PolicyFile;
use fleetgate::{
    Algorithm, FailurePolicy, Limit, Limiter, MemoryStore, Policy, Rate, RateLimitLayer,
    RedisStore, Store,
};
use tracing_subscriber::EnvFilter;

const ROUTES: &str = "\
fleetgate demo
GET /api/ping  pong; per x-api-key (or client IP): burst 5, 1/s
GET /api/window  window; per x-api-key (or client IP): sliding log, 25/5s and 300/min
GET /healthz   ok; unlimited
GET /metrics   Prometheus metrics: decisions by policy and outcome, store latency
GET /api/slow?ms=N  answers after N ms (default 1000); per x-api-key (or client IP): 2 in flight
POST /api/charge?ms=N  answers after N ms (default 1000); critical: never shed
GET /api/report?ms=N  answers after N ms (default 1000); low priority: 503 beyond 2 of the fleet's 4 in flight
";

type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .init();

    let addr: SocketAddr = std::env::var("FLEETGATE_ADDR")
        .unwrap_or_else(|_| "127.0.0.1:3000".into())
        .parse()
        .map_err(|err| format!("FLEETGATE_ADDR: {err}"))?;

    let failure = match std::env::var("FLEETGATE_FAILURE_POLICY").as_deref() {
        Err(_) | Ok("" | "open") => FailurePolicy::Open,
        Ok("closed") => FailurePolicy::Closed,
        Ok("local") => FailurePolicy::local(0.5)?,
        Ok(other) => match other.strip_prefix("local:").map(str::parse::<f64>) {
            Some(Ok(share)) => FailurePolicy::local(share)
                .map_err(|err| format!("FLEETGATE_FAILURE_POLICY: {err}"))?,
            _ => {
                return Err(format!(
                    "FLEETGATE_FAILURE_POLICY: {other:?}; use open, closed, local or local:<share>"
                )
                .into());
            }
        },
    };

    // Before any layer decides: handles are resolved on first use.
    let metrics = metrics_exporter_prometheus::PrometheusBuilder::new()
        .install_recorder()
        .map_err(|err| format!("metrics recorder: {err}"))?;

    let (store, store_name): (Arc<dyn Store>, String) = match std::env::var("REDIS_URL") {
        Ok(url) if !url.is_empty() => {
            // Lazy: the demo serves even while Redis is down, and connects
            // (and reconnects) in the background.
            let store = RedisStore::builder()
                .prefix("fleetgate-demo")
                .connect_lazy(&url)
                .map_err(|err| format!("REDIS_URL {url}: {err}"))?;
            let when_down = match failure {
                FailurePolicy::Closed => "fails closed".to_owned(),
                FailurePolicy::Local(share) => {
                    format!("falls back to {share} of each limit in this process")
                }
                _ => "fails open".to_owned(),
            };
            (
                Arc::new(store),
                format!("redis {url}, {when_down} when Redis is down"),
            )
        }
        _ => (Arc::new(MemoryStore::new()), "memory".to_owned()),
    };

    let ping = Policy::single(
        "ping",
        Limit::builder(Rate::per_second(1)).burst(5).build()?,
    )?;
    // An upstream's published limits, mirrored exactly: 25 per 5 s and 300
    // per minute, decided together.
    let window = Policy::builder("window")
        .algorithm(Algorithm::SlidingLog)
        .limit(Limit::new(Rate::new(25, Duration::from_secs(5)))?)
        .limit(Limit::new(Rate::per_minute(300))?)
        .build()?;
    let limited = match std::env::var("FLEETGATE_POLICIES") {
        // Policies from a file: one layer, each route by its own policy.
        Ok(path) if !path.is_empty() => {
            let text = std::fs::read_to_string(&path)
                .map_err(|err| format!("FLEETGATE_POLICIES {path}: {err}"))?;
            let file: PolicyFile =
                toml::from_str(&text).map_err(|err| format!("FLEETGATE_POLICIES {path}: {err}"))?;
            let routes = RoutePolicies::from_file(&file, store.clone())
                .map_err(|err| format!("FLEETGATE_POLICIES {path}: {err}"))?;
            println!("policies from {path}: {}", describe(&file));
            Router::new()
                .route("/api/ping", get(|| async { "pong\n" }))
                .route("/api/window", get(|| async { "window\n" }))
                .layer(
                    RateLimitLayer::per_route(routes)?
                        .key(HeaderKey::new("x-api-key").or(PeerIp))
                        .on_store_error(failure),
                )
        }
        _ => Router::new()
            .route("/api/ping", get(|| async { "pong\n" }))
            .route_layer(
                RateLimitLayer::new(Limiter::new(ping, store.clone()))
                    .key(HeaderKey::new("x-api-key").or(PeerIp))
                    .on_store_error(failure),
            )
            .route(
                "/api/window",
                get(|| async { "window\n" }).layer(
                    RateLimitLayer::new(Limiter::new(window, store.clone()))
                        .key(HeaderKey::new("x-api-key").or(PeerIp)),
                ),
            ),
    };
    let workers = match std::env::var("FLEETGATE_SHED_WORKERS") {
        Err(_) => 64,
        Ok(n) => n
            .parse()
            .map_err(|err| format!("FLEETGATE_SHED_WORKERS {n:?}: {err}"))?,
    };
    let app = limited
        .merge(slow_routes(store.clone())?)
        .merge(shed_routes(store.clone(), workers)?)
        .route("/", get(|| async { ROUTES }))
        .route("/healthz", get(|| async { "ok\n" }))
        .route(
            "/metrics",
            get(move || {
                let metrics = metrics.clone();
                async move {
                    metrics.run_upkeep();
                    metrics.render()
                }
            }),
        );

    let listener = tokio::net::TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    println!("fleetgate demo listening on http://{local} (store: {store_name})");
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(async {
        let _ = tokio::signal::ctrl_c().await;
    })
    .await?;
    Ok(())
}

/// One line naming each route's policy, for the start-up message.
fn describe(file: &PolicyFile) -> String {
    let mut parts: Vec<String> = file
        .routes
        .iter()
        .map(|r| {
            let spec = file
                .policies
                .get(&r.policy)
                .map_or_else(String::new, |p| p.to_string());
            format!(
                "{} {} = {} ({spec})",
                r.method.as_deref().unwrap_or("*"),
                r.path,
                r.policy
            )
        })
        .collect();
    if let Some(default) = &file.default {
        parts.push(format!("default = {default}"));
    }
    parts.join("; ")
}

/// `GET /api/slow`: at most 2 in flight per API key (or client IP).
fn slow_routes(store: Arc<dyn Store>) -> Result<Router, BoxError> {
    let slow = ConcurrencyPolicy::builder("slow", 2)
        .lease_ttl(Duration::from_secs(30))
        .build()?;
    Ok(Router::new()
        .route(
            "/api/slow",
            get(|q: Query<HashMap<String, String>>| answer_after(q, "slept")),
        )
        .route_layer(
            ConcurrencyLimitLayer::new(ConcurrencyLimiter::new(slow, store))
                .key(HeaderKey::new("x-api-key").or(PeerIp)),
        ))
}

/// `POST /api/charge` (critical) and `GET /api/report` (low priority)
/// behind a fleet load shedder of 4 in flight, of which reports may use
/// half, and a worker-utilization shedder for this process.
fn shed_routes(store: Arc<dyn Store>, workers: u64) -> Result<Router, BoxError> {
    let tiers = Tiers::default();
    let routes = RouteTiers::new(&tiers)
        .route(Some(Method::POST), "/api/charge", "critical")?
        .route(Some(Method::GET), "/api/report", "low")?;
    let fleet = FleetShedPolicy::builder("fleet", 4)
        .share("low", 0.5)
        .build()?;
    let local = UtilizationShedder::workers(workers)
        .name("workers")
        .build()?;
    Ok(Router::new()
        .route(
            "/api/charge",
            post(|q: Query<HashMap<String, String>>| answer_after(q, "charged after")),
        )
        .route(
            "/api/report",
            get(|q: Query<HashMap<String, String>>| answer_after(q, "report after")),
        )
        // The last layer added runs first: the local shedder decides
        // before the fleet's count is asked.
        .route_layer(FleetShedLayer::new(FleetShedder::new(fleet, store)).classify(routes.clone()))
        .route_layer(UtilizationShedLayer::new(local).classify(routes)))
}

/// Answers `"{what} N ms"` after `ms` milliseconds from the query string
/// (default 1000, at most 60000).
async fn answer_after(
    Query(q): Query<HashMap<String, String>>,
    what: &str,
) -> (StatusCode, String) {
    let ms = match q.get("ms").map(|ms| ms.parse::<u64>()) {
        None => 1000,
        Some(Ok(ms)) => ms.min(60_000),
        Some(Err(_)) => {
            return (StatusCode::BAD_REQUEST, "ms must be a number\n".to_owned());
        }
    };
    tokio::time::sleep(Duration::from_millis(ms)).await;
    (StatusCode::OK, format!("{what} {ms} ms\n"))
}
