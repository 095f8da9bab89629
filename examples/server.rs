//! The fleetgate demo server.
//!
//! ```text
//! cargo run --example server                                  # in-process store
//! REDIS_URL=redis://127.0.0.1:6379 cargo run --example server # shared through Redis
//! FLEETGATE_REDIS_CLUSTER=127.0.0.1:7000,127.0.0.1:7001 \
//!   cargo run --example server                                # through a Redis Cluster
//! FLEETGATE_REDIS_SENTINELS=127.0.0.1:26379,127.0.0.1:26380 \
//!   cargo run --example server                                # through Redis Sentinel
//! ```
//!
//! Environment:
//! - `FLEETGATE_ADDR`: listen address (default `127.0.0.1:3000`).
//! - `REDIS_URL`: when set, limits live in that Redis, so every instance
//!   pointed at it shares the same counts.
//! - `FLEETGATE_REDIS_CLUSTER`: comma-separated `host:port` of any nodes of
//!   a Redis Cluster: limits live in the cluster, which must answer at
//!   start-up; the client follows its failovers (a replica promoted in
//!   place of a dead master) and resharding.
//! - `FLEETGATE_REDIS_SENTINELS`: comma-separated `host:port` of Redis
//!   Sentinels, which name the master (`FLEETGATE_REDIS_MASTER`, default
//!   `mymaster`): limits live in that master, and the demo follows the
//!   sentinels to its replica when it fails over. Like `REDIS_URL`, the
//!   demo starts while they are down and finds the master when it can.
//! - Set at most one of `REDIS_URL`, `FLEETGATE_REDIS_CLUSTER` and
//!   `FLEETGATE_REDIS_SENTINELS`.
//! - `RUST_LOG`: log filter (default `info`; `fleetgate=debug` shows denials).
//! - `FLEETGATE_FAILURE_POLICY`: what every limited route (`/api/ping`,
//!   `/api/window`, `/api/slow`, `/api/report`, `/api/complete`,
//!   `/api/login`, `/api/flaky`) does when Redis is down or
//!   slow (every call times out after 50 ms): `open` (default) lets the
//!   call through unlimited, `closed` answers 503 with `Retry-After`,
//!   `local` limits each instance to half the limit on its own
//!   (`local:0.25` to a quarter: one of four instances; `local:auto` to
//!   one share of the instances the heartbeats saw last, so a fleet of 8
//!   admits an eighth each). `/api/charge` is
//!   critical and never shed, whatever the policy. The demo starts even
//!   while Redis is down and reconnects by itself when it is back; failures
//!   are logged at `warn`, at most once a second.
//! - `FLEETGATE_API_KEYS`: comma-separated API keys. When set, only these
//!   `x-api-key` values are identities with budgets of their own; a request
//!   with any other value (or none) is limited by its client IP, so keys
//!   made up on the fly share one budget per address. When unset, any
//!   `x-api-key` value is trusted as an identity (logged at start-up).
//! - `FLEETGATE_POLICIES`: a TOML policy file (see `examples/policies.toml`)
//!   whose routes and policies replace the built-in rate limits of
//!   `/api/ping` and `/api/window`: limits change without a rebuild. The
//!   file is re-read when it changes and on SIGHUP: new limits and plans
//!   apply within about a second (routes and new policies need a
//!   restart), and an edit that does not parse keeps the previous ones
//!   (logged at `warn`). Its `[plans.pro]` defines the plan `pro`
//!   (without a file, the demo defines the same one).
//! - `FLEETGATE_ADMIN_TOKEN`: when set, the admin API answers under
//!   `/admin` (routes below), each call needing `Authorization: Bearer
//!   <token>` (401 otherwise); when unset, every `/admin/*` path is 404.
//!   With Redis, its changes reach every instance sharing the store within
//!   a poll (250 ms) and outlive restarts (they are kept in Redis).
//! - `FLEETGATE_MEMORY_MAX_KEYS`: without Redis (none of the three above), the
//!   most identities the in-process store keeps per kind of state (default
//!   100000, at most 100000000); past it, expired state and then the state
//!   closest to expiry is evicted.
//! - `FLEETGATE_ADAPTIVE_POOL`: how many calls `/api/adaptive`'s backend
//!   serves at once (default 8).
//! - `FLEETGATE_SHED_WORKERS`: the worker capacity of the worker-utilization
//!   shedder in front of `/api/charge` and `/api/report` (default 64).
//! - `FLEETGATE_OBSERVE_SECRET`: the secret the dashboard's identity hashes
//!   are keyed with (`fleetgate::observe::set_identity_secret`); give every
//!   instance the same one.
//! - `FLEETGATE_HEADER_TIMEOUT_SECS`: how long a client may take to send a
//!   request head, on a new connection and between the requests of a kept-
//!   alive one (default 10, from 1 to 3600): a connection that sends part
//!   of a head, or nothing, is closed after it.
//! - `FLEETGATE_MAX_CONNECTIONS`: the most connections served at once
//!   (default 10000, at most 1000000): past it the demo stops accepting,
//!   and new connections wait in the kernel's accept queue until one
//!   closes. The open-file limit (`ulimit -n`) must allow as many (the
//!   demo warns at start-up when it does not).
//! - `FLEETGATE_DRAIN_SECS`: how long requests in flight may take to finish
//!   after SIGTERM or SIGINT (default 10, from 0 to 3600).
//!
//! The demo serves HTTP/1.1 itself (hyper's server, not `axum::serve`),
//! for the header timeout, the connection cap and a shutdown that gives
//! every lease back. On SIGTERM or SIGINT (Ctrl-C) it stops accepting
//! connections, lets the requests in flight finish (for at most 10 s,
//! `FLEETGATE_DRAIN_SECS`), cuts off those still running, gives back the
//! leases of all of them (waiting at most 10 s for the store) and exits
//! with status 0.
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
//! - `POST /api/complete?tokens=N&ms=M` answers after `M` ms (default 0, at
//!   most 10000) with the header `x-tokens-used: N` (default 100): per API
//!   key (or client IP) a budget of 1000 tokens a minute (burst 1000),
//!   charged after the response by that header. Three calls with
//!   `tokens=400` are admitted; the fourth quick one gets 429 with
//!   `Retry-After` of about 13 s (the 200-token debt and one token, repaid
//!   at 1000 a minute).
//! - `POST /api/login?ok=1|0` answers 200 when `ok=1`, 401 otherwise: per
//!   API key (or client IP) only the 401s count, `5/15min block 1h`.
//!   Twenty good logins pass; after five bad ones, the next is refused
//!   even with `ok=1`, and that refusal blocks the identity for an hour on
//!   every instance (`Retry-After: 3600`, counting down), until
//!   `POST /admin/reset/login/{identity}` lifts it.
//! - `GET /api/flaky?fail=1|0` answers 500 when `fail=1`, 200 otherwise:
//!   per API key (or client IP) 3 a minute (burst 3), each 5xx refunded, so
//!   a failing handler does not eat its clients' budget.
//! - `GET /api/adaptive?ms=N` answers after `N` ms (default 20, at most
//!   10000) of a backend that serves `FLEETGATE_ADAPTIVE_POOL` calls at a
//!   time (default 8) and queues the rest inside the handler, as an
//!   overloaded backend does. In front of it, one adaptive concurrency
//!   limit for the whole route (Gradient2, this instance's own) with a
//!   short LIFO queue (16 callers, 10 ms): beyond what the backend holds,
//!   calls are refused within that wait with 503 and `Retry-After: 1`
//!   (and with 503 alone once its workers are booked 30 s ahead), and the
//!   admitted ones keep the backend's own latency. The limit is
//!   `fleetgate_concurrency_limit{policy="adaptive"}` in `/metrics` and on
//!   the dashboard; `examples/adaptive_load.rs` drives the route.
//! - `/admin/...` (with `FLEETGATE_ADMIN_TOKEN`): `GET /admin/policies`
//!   (JSON: each policy and its limits now), `PUT /admin/policies/{policy}`
//!   (body: limits such as `1/s burst 5`; 400 names a parse error and
//!   changes nothing; `DELETE` restores the default),
//!   `PUT`/`DELETE /admin/overrides/{policy}/{identity}` (one identity's own
//!   limits), `PUT`/`DELETE /admin/plans/{identity}` (body: a plan name),
//!   `POST /admin/reset/{policy}/{identity}` and `POST /admin/reset/{identity}`
//!   (clear its state: its next call is admitted as if new), `GET
//!   /admin/instances` (JSON: the instances sharing the store),
//!   `PUT`/`DELETE /admin/deny/{identity}` (refused with 403 on every
//!   route limited per identity, `/api/ping`, `/api/window`, `/api/slow`,
//!   `/api/complete`, `/api/login` and `/api/flaky`, until `DELETE`;
//!   optional body a duration such as `10m` for an entry that ends by
//!   itself; `/admin/deny/{policy}/{identity}` for one policy),
//!   `PUT`/`DELETE /admin/allow/{policy}/{identity}` (exempt from that
//!   policy, without a decision; `/admin/allow/{identity}` from every
//!   one), `PUT`/`DELETE /admin/deny-net/{cidr}` and
//!   `/admin/allow-net/{cidr}` (each also `/{policy}/{cidr}`: every client
//!   IP of a network, the CIDR percent-encoded, `203.0.113.0%2F24`), and
//!   `GET /admin/lists` (JSON: the deny and allow entries in force). Bad
//!   input (a network such as `10.0.0.0%2F33`, a control character, a
//!   duration that is not one) is 400 and changes nothing. `{identity}`
//!   is an `x-api-key` value, or a client IP for calls without one (an IP
//!   text is always the client IP's key). See `docs/live-policies.md` and
//!   `docs/demo.md`.
//!
//! Try: `for i in $(seq 8); do curl -s -o /dev/null -w '%{http_code}\n' localhost:3000/api/ping; done`
//! and `for i in 1 2 3; do curl -s -w ' %{http_code}\n' 'localhost:3000/api/slow?ms=3000' & done; wait`
//! and `for i in 1 2 3 4; do curl -s -w ' %{http_code}\n' 'localhost:3000/api/report?ms=3000' & done; curl -s -w ' %{http_code}\n' -X POST localhost:3000/api/charge; wait`

mod dashboard;
#[path = "common/shutdown.rs"]
mod shutdown;

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{ConnectInfo, Query, Request};
use axum::http::{Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use fleetgate::concurrency::{
    AdaptiveLimit, ConcurrencyLimitLayer, ConcurrencyLimiter, ConcurrencyPolicy, WaitQueue,
};
use fleetgate::key::{ExtensionKey, GlobalKey, HeaderKey, Key, KeyExtractor, PeerIp};
use fleetgate::live::{AdminApi, LivePolicies};
use fleetgate::rate_limit::ResponseCost;
use fleetgate::shed::{
    FleetShedLayer, FleetShedPolicy, FleetShedder, RouteTiers, Tiers, UtilizationShedLayer,
    UtilizationShedder,
};
use fleetgate::spec::{PolicyFile, PolicySpec};
use fleetgate::{
    Algorithm, FailurePolicy, Limit, LocalShare, MemoryStore, Policy, Rate, RateLimitLayer,
    RedisStore, Store, Topology,
};
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinSet;
use tower::Layer;
use tracing_subscriber::EnvFilter;

const ROUTES: &str = "\
fleetgate demo
GET /api/ping  pong; per x-api-key (or client IP): burst 5, 1/s
GET /api/window  window; per x-api-key (or client IP): sliding log, 25/5s and 300/min
GET /healthz   ok; unlimited
GET /metrics   Prometheus metrics: decisions by policy and outcome, store latency
GET /dashboard  a live page of the decisions; GET /dashboard/events: its data, one JSON event a second (SSE)
GET /api/slow?ms=N  answers after N ms (default 1000); per x-api-key (or client IP): 2 in flight
POST /api/charge?ms=N  answers after N ms (default 1000); critical: never shed
GET /api/report?ms=N  answers after N ms (default 1000); low priority: 503 beyond 2 of the fleet's 4 in flight
POST /api/complete?tokens=N&ms=M  answers after M ms (default 0, at most 10000) with x-tokens-used: N (default 100); per x-api-key (or client IP): 1000 tokens/min, charged after the response
POST /api/login?ok=1|0  200 when ok=1, else 401; per x-api-key (or client IP): only 401s count, 5/15min block 1h
GET /api/flaky?fail=1|0  500 when fail=1, else 200; per x-api-key (or client IP): 3/min burst 3, 5xx refunded
GET /api/adaptive?ms=N  a backend of FLEETGATE_ADAPTIVE_POOL (8) workers, N ms a call (default 20); an adaptive limit for the route, 503 beyond it
GET /api/outbound?fail=1|0  calls this demo's /api/flaky as an upstream, through a client-side adaptive throttle and a retry budget (2 retries); its answer, or 503 when throttled locally
/admin/...  only with FLEETGATE_ADMIN_TOKEN, each call with Authorization: Bearer <token>:
  GET /admin/policies  every policy and its limits now (JSON)
  PUT /admin/policies/{policy}  body: new limits (1/s burst 5); DELETE: back to the defaults
  PUT /admin/overrides/{policy}/{identity}  body: that identity's own limits; DELETE: removes them
  PUT /admin/plans/{identity}  body: a plan (pro); DELETE: no plan
  POST /admin/reset/{policy}/{identity}  clears its state (POST /admin/reset/{identity}: every policy)
  GET /admin/instances  the instances sharing the store (JSON)
  PUT /admin/deny/{identity}  refused with 403 on every route limited per identity (ping, window, slow, complete, login, flaky); body: empty, or a duration (10m) after which it ends; DELETE: lifts it
  PUT /admin/deny/{policy}/{identity}  refused by that policy only; DELETE: lifts it
  PUT /admin/allow/{policy}/{identity}  exempt from that policy (PUT /admin/allow/{identity}: from every one); body as for deny; DELETE: limited again
  PUT /admin/deny-net/{cidr}  every client IP in the network refused, the CIDR percent-encoded (203.0.113.0%2F24); /admin/allow-net/{cidr} exempts; each also /{policy}/{cidr}; DELETE: off again
  GET /admin/lists  the deny and allow entries in force (JSON)
  {identity}: an x-api-key value, or a client IP for calls without one
";

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// How long the lease releases of the requests stopped on shutdown may
/// take to reach the store.
const SETTLE: Duration = Duration::from_secs(10);

/// File descriptors kept for what is not a client connection: the store's
/// connections, the policy-file watch, stdio, the runtime's own.
const RESERVED_FILES: u64 = 64;

/// The identity of the API-key extractor, shared by every limited route.
type ApiKey = Arc<dyn KeyExtractor<Request<Body>>>;

/// An `x-api-key` value found in `FLEETGATE_API_KEYS`, put in the request
/// by [`check_api_key`]: a client cannot set it.
#[derive(Clone, Debug)]
struct ApiClient(Arc<str>);

impl fmt::Display for ApiClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Errors are printed as their messages (`?` in `main` would print their
/// `Debug` form), and the exit status says whether the demo failed.
fn main() -> ExitCode {
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("Error: tokio runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("Error: {err}");
            ExitCode::FAILURE
        }
    }
}

async fn run() -> Result<(), BoxError> {
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .init();

    if let Ok(secret) = std::env::var("FLEETGATE_OBSERVE_SECRET") {
        fleetgate::observe::set_identity_secret(secret);
    }

    let addr: SocketAddr = std::env::var("FLEETGATE_ADDR")
        .unwrap_or_else(|_| "127.0.0.1:3000".into())
        .parse()
        .map_err(|err| format!("FLEETGATE_ADDR: {err}"))?;
    let serving = Serving::from_env()?;

    let failure = match std::env::var("FLEETGATE_FAILURE_POLICY").as_deref() {
        Err(_) | Ok("" | "open") => FailurePolicy::Open,
        Ok("closed") => FailurePolicy::Closed,
        Ok("local:auto") => FailurePolicy::local_auto(),
        Ok("local") => {
            FailurePolicy::local(0.5).map_err(|err| format!("FLEETGATE_FAILURE_POLICY: {err}"))?
        }
        Ok(other) => match other.strip_prefix("local:").map(str::parse::<f64>) {
            Some(Ok(share)) => FailurePolicy::local(share)
                .map_err(|err| format!("FLEETGATE_FAILURE_POLICY: {err}"))?,
            _ => {
                return Err(format!(
                    "FLEETGATE_FAILURE_POLICY: {other:?}; use open, closed, local, local:<share> \
                     or local:auto"
                )
                .into());
            }
        },
    };

    // Before any layer decides: handles are resolved on first use.
    let metrics = metrics_exporter_prometheus::PrometheusBuilder::new()
        .install_recorder()
        .map_err(|err| format!("metrics recorder: {err}"))?;
    // The recorder keeps every histogram sample until its upkeep runs:
    // without a timer, memory would grow with every request while nobody
    // scrapes /metrics.
    let upkeep = metrics.clone();
    every_five_seconds(move || upkeep.run_upkeep());

    let when_down = match failure {
        FailurePolicy::Closed => "fails closed".to_owned(),
        FailurePolicy::Local(share) if share == LocalShare::auto() => {
            "falls back to 1/<instances seen> of each limit in this process".to_owned()
        }
        FailurePolicy::Local(share) => {
            format!("falls back to {share} of each limit in this process")
        }
        _ => "fails open".to_owned(),
    };
    let cluster = std::env::var("FLEETGATE_REDIS_CLUSTER").unwrap_or_default();
    let sentinels = std::env::var("FLEETGATE_REDIS_SENTINELS").unwrap_or_default();
    let url = std::env::var("REDIS_URL").unwrap_or_default();
    let chosen = [&url, &cluster, &sentinels]
        .iter()
        .filter(|v| !v.is_empty())
        .count();
    if chosen > 1 {
        return Err("set at most one of REDIS_URL, FLEETGATE_REDIS_CLUSTER and \
                    FLEETGATE_REDIS_SENTINELS"
            .into());
    }
    let (store, store_name): (Arc<dyn Store>, String) = match (cluster.as_str(), url.as_str()) {
        ("", "") if !sentinels.is_empty() => {
            let master = std::env::var("FLEETGATE_REDIS_MASTER")
                .ok()
                .filter(|name| !name.is_empty())
                .unwrap_or_else(|| "mymaster".to_owned());
            let seeds = node_urls("FLEETGATE_REDIS_SENTINELS", &sentinels)?;
            let count = seeds.len();
            // Lazy, as for REDIS_URL: the master is found in the background.
            let store = RedisStore::builder(Topology::sentinel(seeds, &master))
                .prefix("fleetgate-demo")
                .lazy()
                .connect()
                .await
                .map_err(|err| {
                    format!("FLEETGATE_REDIS_SENTINELS {}: {err}", redacted(&sentinels))
                })?;
            (
                Arc::new(store),
                format!(
                    "redis sentinel, master {master} named by {count} sentinel{} ({}), \
                     {when_down} when Redis is down",
                    if count == 1 { "" } else { "s" },
                    redacted(&sentinels)
                ),
            )
        }
        ("", "") => {
            let max_keys = match std::env::var("FLEETGATE_MEMORY_MAX_KEYS") {
                Err(_) => 100_000,
                Ok(n) => n
                    .parse()
                    .map_err(|err| format!("FLEETGATE_MEMORY_MAX_KEYS {n:?}: {err}"))?,
            };
            let store = MemoryStore::builder()
                .max_keys(max_keys)
                .map_err(|err| format!("FLEETGATE_MEMORY_MAX_KEYS {max_keys}: {err}"))?
                .build();
            // Calls sweep expired state as they come; the timer gives the
            // memory of a flood back even when no call follows it.
            let swept = store.clone();
            every_five_seconds(move || swept.sweep());
            println!("memory store: at most {max_keys} identities per kind of state");
            (Arc::new(store), "memory".to_owned())
        }
        ("", url) => {
            // Lazy: the demo serves even while Redis is down, and connects
            // (and reconnects) in the background.
            let store = RedisStore::builder(url)
                .prefix("fleetgate-demo")
                .lazy()
                .connect()
                .await
                .map_err(|err| format!("REDIS_URL {}: {err}", redacted(url)))?;
            (
                Arc::new(store),
                format!("redis {}, {when_down} when Redis is down", redacted(url)),
            )
        }
        (nodes, "") => {
            let (store, seeds) = connect_cluster(nodes).await?;
            (
                store,
                format!(
                    "redis cluster, {seeds} seed node{} ({}), {when_down} when Redis is down",
                    if seeds == 1 { "" } else { "s" },
                    redacted(nodes)
                ),
            )
        }
        _ => unreachable!("at most one store variable is set"),
    };

    let (api_key, api_keys) = api_key_extractor()?;
    // Every limit below follows the fleet's changes (the admin API, another
    // instance's): read from memory on each request, synced by one small
    // Redis call per poll.
    let live = LivePolicies::new(store.clone());
    // Bound first, so that the heartbeat names the real address (with port
    // 0 too).
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    // The fleet's changes so far, then a task that follows them; limiters
    // made afterwards take them when made. Started before the layers:
    // with `local:auto`, the concurrency and shedding layers take the
    // fleet's size when their failure policy is set. With Redis down the
    // demo starts all the same and the task catches up.
    if let Err(err) = live.clone().address(bound.to_string()).start().await {
        tracing::warn!(error = %err, "live policies: the store could not be read; following it in the background");
    }

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
            let routes = live
                .routes(&file)
                .map_err(|err| format!("FLEETGATE_POLICIES {path}: {err}"))?;
            // Edits to the file (or a SIGHUP) change the limits and plans
            // while the demo runs; a broken edit keeps the previous ones.
            live.watch_file(path.clone(), |text| toml::from_str::<PolicyFile>(text))
                .map_err(|err| format!("FLEETGATE_POLICIES {path}: {err}"))?;
            println!("policies from {path}: {}", describe(&file));
            Router::new()
                .route("/api/ping", get(|| async { "pong\n" }))
                .route("/api/window", get(|| async { "window\n" }))
                .layer(
                    RateLimitLayer::per_route(routes)?
                        .key(api_key.clone())
                        .on_store_error(failure),
                )
        }
        _ => {
            // The plan of examples/policies.toml, for the built-in limits.
            for (policy, limits) in [
                ("ping", "10/s burst 50"),
                ("window", "250/5s + 3000/min sliding-log"),
            ] {
                live.define_plan("pro", limits.parse::<PolicySpec>()?.build(policy)?)?;
            }
            Router::new()
                .route("/api/ping", get(|| async { "pong\n" }))
                .route_layer(
                    RateLimitLayer::new(live.limiter(ping))
                        .key(api_key.clone())
                        .on_store_error(failure),
                )
                .route(
                    "/api/window",
                    get(|| async { "window\n" }).layer(
                        RateLimitLayer::new(live.limiter(window))
                            .key(api_key.clone())
                            .on_store_error(failure),
                    ),
                )
        }
    };
    let workers = match std::env::var("FLEETGATE_SHED_WORKERS") {
        Err(_) => 64,
        Ok(n) => n
            .parse()
            .map_err(|err| format!("FLEETGATE_SHED_WORKERS {n:?}: {err}"))?,
    };
    let local = UtilizationShedder::workers(workers)
        .name("workers")
        .build()
        .map_err(|err| format!("FLEETGATE_SHED_WORKERS {workers}: {err}"))?;
    // Kept to wait for their lease releases on shutdown.
    let slow = live.concurrency(ConcurrencyLimiter::new(
        ConcurrencyPolicy::builder("slow", 2)
            .lease_ttl(Duration::from_secs(30))
            .build()?,
        store.clone(),
    ));
    let fleet = FleetShedder::new(
        FleetShedPolicy::builder("fleet", 4)
            .share("low", 0.5)
            .build()?,
        store.clone(),
    );
    let admin = admin_routes(&live, api_key.clone(), api_keys.clone());
    let api_key_after = api_key.clone();
    let app = limited
        .merge(admin)
        .merge(slow_routes(slow.clone(), api_key, failure))
        .merge(shed_routes(fleet.clone(), local, failure)?)
        .merge(after_routes(&live, api_key_after, failure)?)
        .merge(adaptive_routes()?)
        .merge(outbound_routes(bound, store.clone())?)
        .merge(dashboard::routes(live.clone()))
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
        )
        // Outermost, so that every limit sees the identity it verified.
        .layer(middleware::from_fn_with_state(api_keys, check_api_key));

    println!("{serving}");
    println!("fleetgate demo listening on http://{bound} (store: {store_name})");
    serve(listener, app, serving).await?;
    // The leases of the requests that finished, and of those cut off, are
    // being given back on spawned tasks: let them reach the store before
    // the runtime stops.
    let settled = async { tokio::join!(slow.releases_settled(), fleet.releases_settled()) };
    if tokio::time::timeout(SETTLE, settled).await.is_err() {
        println!(
            "lease releases still pending after {} s; they expire with their TTL",
            SETTLE.as_secs()
        );
    }
    println!("fleetgate demo stopped");
    Ok(())
}

/// How the demo serves its connections, from the environment (see the
/// module docs).
#[derive(Clone, Copy, Debug)]
struct Serving {
    /// How long a client may take to send a request head
    /// (`FLEETGATE_HEADER_TIMEOUT_SECS`).
    header_timeout: Duration,
    /// The most connections served at once (`FLEETGATE_MAX_CONNECTIONS`).
    max_connections: usize,
    /// How long requests in flight may take to finish after SIGTERM or
    /// SIGINT (`FLEETGATE_DRAIN_SECS`).
    drain: Duration,
}

impl Serving {
    fn from_env() -> Result<Self, BoxError> {
        let serving = Serving {
            header_timeout: Duration::from_secs(env_number(
                "FLEETGATE_HEADER_TIMEOUT_SECS",
                10,
                1..=3600,
            )?),
            // Below Linux's default ceiling on open files (fs.nr_open, 2^20).
            max_connections: env_number("FLEETGATE_MAX_CONNECTIONS", 10_000, 1..=1_000_000)?,
            drain: Duration::from_secs(env_number("FLEETGATE_DRAIN_SECS", 10, 0..=3600)?),
        };
        if let Some(files) = open_file_limit()
            && serving.max_connections as u64 + RESERVED_FILES > files
        {
            tracing::warn!(
                "FLEETGATE_MAX_CONNECTIONS is {} but this process may open {files} files \
                 (ulimit -n): past about {} connections, accepting fails (retried every \
                 second) before the cap applies",
                serving.max_connections,
                files.saturating_sub(RESERVED_FILES)
            );
        }
        Ok(serving)
    }
}

impl fmt::Display for Serving {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "connections: at most {} at once (more wait to be accepted), a request head \
             within {} s, {} s to drain on SIGTERM",
            self.max_connections,
            self.header_timeout.as_secs(),
            self.drain.as_secs()
        )
    }
}

/// The number in the variable `var`, `default` when it is unset; an error
/// naming the variable when it does not parse or falls outside `range`.
fn env_number<T>(var: &str, default: T, range: std::ops::RangeInclusive<T>) -> Result<T, BoxError>
where
    T: std::str::FromStr + PartialOrd + fmt::Display,
    T::Err: fmt::Display,
{
    let Ok(text) = std::env::var(var) else {
        return Ok(default);
    };
    let n: T = text
        .trim()
        .parse()
        .map_err(|err| format!("{var} {text:?}: {err}"))?;
    if !range.contains(&n) {
        return Err(format!(
            "{var} {n}: must be from {} to {}",
            range.start(),
            range.end()
        )
        .into());
    }
    Ok(n)
}

/// The soft limit on this process's open files (`ulimit -n`), where Linux
/// shows it; `None` elsewhere or when unlimited.
fn open_file_limit() -> Option<u64> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits
        .lines()
        .find_map(|line| line.strip_prefix("Max open files"))?;
    line.split_whitespace().next()?.parse().ok()
}

/// Serves `app` on `listener` until SIGTERM or SIGINT, then stops
/// accepting and lets the requests in flight finish for at most
/// `serving.drain`. Requests still running then are cut off here, while
/// the runtime runs, so that the releases their lease guards send are
/// answered on its tasks (a request dropped with the runtime has none
/// left to finish them): returns once every connection is closed.
///
/// Served by hand, not by `axum::serve`, for the header timeout and the
/// connection cap it does not have, and for that last step: the
/// connection tasks of `axum::serve` outlive its future.
async fn serve(mut listener: TcpListener, app: Router, serving: Serving) -> Result<(), BoxError> {
    let mut http = http1::Builder::new();
    // The timeout needs a timer (hyper panics without one). It runs while
    // hyper waits for a request head: from the connection's start, then
    // again after each response, so idle kept-alive connections close too.
    http.timer(TokioTimer::new())
        .header_read_timeout(serving.header_timeout);
    let slots = Arc::new(Semaphore::new(serving.max_connections));
    let (stopping, stop) = watch::channel(false);
    let mut connections = JoinSet::new();
    let mut signal = std::pin::pin!(shutdown::shutdown_signal());
    let signal = loop {
        // A slot first: at the cap nothing is accepted, so new connections
        // wait in the kernel's accept queue and hold no descriptor here.
        let slot = tokio::select! {
            signal = &mut signal => break signal,
            slot = slots.clone().acquire_owned() => slot?,
        };
        // axum's accept retries its errors (after a second for EMFILE and
        // the like) rather than stopping the demo.
        let (stream, peer) = tokio::select! {
            signal = &mut signal => break signal,
            accepted = axum::serve::Listener::accept(&mut listener) => accepted,
        };
        // Finished connections leave their results in the set until taken.
        while connections.try_join_next().is_some() {}
        // What `into_make_service_with_connect_info::<SocketAddr>()` gives
        // each connection: `ConnectInfo` in every request, for `PeerIp`.
        let service =
            TowerToHyperService::new(axum::Extension(ConnectInfo(peer)).layer(app.clone()));
        let conn = http
            .serve_connection(TokioIo::new(stream), service)
            .with_upgrades();
        let mut stop = stop.clone();
        connections.spawn(async move {
            // Its place under the cap, given back when the connection ends.
            let _slot = slot;
            let mut conn = std::pin::pin!(conn);
            let served = tokio::select! {
                served = conn.as_mut() => served,
                // (`Ref` is not `Send`: dropped before the next await.)
                () = async { drop(stop.wait_for(|stop| *stop).await) } => {
                    // Answers the request in flight, if any, then closes.
                    conn.as_mut().graceful_shutdown();
                    conn.await
                }
            };
            if let Err(err) = served {
                tracing::debug!(%peer, error = %err, "connection closed");
            }
        });
    };
    // Closed: new connections are refused from now on.
    drop(listener);
    println!(
        "{signal}: draining in-flight requests (at most {} s)",
        serving.drain.as_secs()
    );
    let _ = stopping.send(true);
    let drained = async { while connections.join_next().await.is_some() {} };
    if tokio::time::timeout(serving.drain, drained).await.is_err() {
        println!(
            "requests still in flight after {} s; stopping anyway",
            serving.drain.as_secs()
        );
        let open = connections.len();
        // Each aborted task drops its request futures, whose lease guards
        // send their releases (answered on spawned tasks); the caller
        // waits for those.
        connections.abort_all();
        while connections.join_next().await.is_some() {}
        println!(
            "cut off {open} connection{} still open; releasing the leases of {} requests",
            if open == 1 { "" } else { "s" },
            if open == 1 { "its" } else { "their" }
        );
    }
    Ok(())
}

/// `urls` (one URL or a comma-separated list) with every password replaced
/// by `***`, for the startup line and error messages.
fn redacted(urls: &str) -> String {
    urls.split(',')
        .map(|url| {
            let Some((scheme, rest)) = url.split_once("://") else {
                return url.to_owned();
            };
            match rest.split_once('@') {
                Some((userinfo, host)) => {
                    let user = userinfo.split_once(':').map_or("", |(user, _)| user);
                    format!("{scheme}://{user}:***@{host}")
                }
                None => url.to_owned(),
            }
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// The URLs of a comma-separated list of `host:port` (`redis://` or
/// `rediss://` URLs pass as they are), read from the variable `var`.
fn node_urls(var: &str, nodes: &str) -> Result<Vec<String>, BoxError> {
    let urls: Vec<String> = nodes
        .split(',')
        .map(str::trim)
        .filter(|node| !node.is_empty())
        .map(|node| {
            if node.contains("://") {
                node.to_owned()
            } else {
                format!("redis://{node}")
            }
        })
        .collect();
    if urls.is_empty() {
        return Err(format!("{var} {nodes:?}: no node").into());
    }
    Ok(urls)
}

/// A store on the Redis Cluster reached through `nodes`
/// (`FLEETGATE_REDIS_CLUSTER`), and how many seeds it was given. Unlike a
/// single node, the cluster must answer at start-up: the client reads its
/// slot map there. Afterwards it follows failovers and resharding by
/// itself.
async fn connect_cluster(nodes: &str) -> Result<(Arc<dyn Store>, usize), BoxError> {
    let seeds = node_urls("FLEETGATE_REDIS_CLUSTER", nodes)?;
    let count = seeds.len();
    let store = RedisStore::builder(Topology::cluster(seeds))
        .prefix("fleetgate-demo")
        .connect()
        .await
        .map_err(|err| format!("FLEETGATE_REDIS_CLUSTER {}: {err}", redacted(nodes)))?;
    Ok((Arc::new(store), count))
}

/// Runs `chore` every 5 s, for as long as the demo runs.
fn every_five_seconds(chore: impl Fn() + Send + 'static) {
    tokio::spawn(async move {
        let mut every = tokio::time::interval(Duration::from_secs(5));
        loop {
            every.tick().await;
            chore();
        }
    });
}

/// The admin API under `/admin` when `FLEETGATE_ADMIN_TOKEN` is set (each
/// call needing that bearer token); otherwise no route, so that every
/// `/admin/*` path answers 404.
fn admin_routes(live: &LivePolicies, api_key: ApiKey, keys: Arc<HashSet<String>>) -> Router {
    let token = std::env::var("FLEETGATE_ADMIN_TOKEN").unwrap_or_default();
    if token.is_empty() {
        return Router::new();
    }
    println!("admin API on /admin (FLEETGATE_ADMIN_TOKEN)");
    let api = AdminApi::new(live.clone(), move |raw| identity_key(&api_key, &keys, raw));
    Router::new().nest("/admin", api.token(token).router())
}

/// The key the limits know a client by, from what it sends: its
/// `x-api-key` value (checked against `FLEETGATE_API_KEYS` as
/// [`check_api_key`] does), or its IP address.
fn identity_key(api_key: &ApiKey, keys: &HashSet<String>, raw: &str) -> Option<Key> {
    if let Ok(ip) = raw.parse::<std::net::IpAddr>() {
        return Some(Key::from_ip(ip.to_canonical()));
    }
    let mut req = Request::new(Body::empty());
    req.headers_mut()
        .insert("x-api-key", axum::http::HeaderValue::from_str(raw).ok()?);
    if keys.contains(raw.trim()) {
        req.extensions_mut()
            .insert(ApiClient(Arc::from(raw.trim())));
    }
    api_key.extract(&req)
}

/// The key every limited route is kept by, and the API keys
/// [`check_api_key`] accepts (none: every key is trusted).
fn api_key_extractor() -> Result<(ApiKey, Arc<HashSet<String>>), BoxError> {
    let keys: HashSet<String> = std::env::var("FLEETGATE_API_KEYS")
        .unwrap_or_default()
        .split(',')
        .map(str::trim)
        .filter(|key| !key.is_empty())
        .map(str::to_owned)
        .collect();
    if keys.is_empty() {
        println!(
            "FLEETGATE_API_KEYS is not set: any x-api-key value is trusted as an identity \
             (a client inventing keys gets a budget per key)"
        );
        return Ok((
            Arc::new(HeaderKey::new("x-api-key").or(PeerIp)),
            Arc::new(keys),
        ));
    }
    println!(
        "api keys: {} known; any other x-api-key is limited by client IP",
        keys.len()
    );
    Ok((
        Arc::new(ExtensionKey::<ApiClient>::new("client").hashed().or(PeerIp)),
        Arc::new(keys),
    ))
}

/// Marks a request whose `x-api-key` is one of `keys` with its
/// [`ApiClient`]. Anything else passes unmarked, to be limited by its
/// client IP.
async fn check_api_key(
    axum::extract::State(keys): axum::extract::State<Arc<HashSet<String>>>,
    mut req: Request,
    next: Next,
) -> Response {
    let known = req
        .headers()
        .get("x-api-key")
        .and_then(|value| value.to_str().ok())
        .map(str::trim)
        .filter(|value| keys.contains(*value))
        .map(Arc::<str>::from);
    if let Some(key) = known {
        req.extensions_mut().insert(ApiClient(key));
    }
    next.run(req).await
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
fn slow_routes(slow: ConcurrencyLimiter, api_key: ApiKey, failure: FailurePolicy) -> Router {
    Router::new()
        .route(
            "/api/slow",
            get(|q: Query<HashMap<String, String>>| answer_after(q, "slept")),
        )
        .route_layer(
            ConcurrencyLimitLayer::new(slow)
                .key(api_key)
                .on_store_error(failure),
        )
}

/// `GET /api/outbound`: this demo's own `/api/flaky` as an upstream,
/// called through a retry budget (ratio 0.1, at least 1 retry a second,
/// shared by the fleet on Redis) and an adaptive throttle (K = 2), both
/// named `flaky-upstream`: what the dashboard's Outbound table and the
/// `fleetgate_throttle_*` and `fleetgate_retry_budget_total` metrics show.
fn outbound_routes(bound: SocketAddr, store: Arc<dyn Store>) -> Result<Router, BoxError> {
    use fleetgate::rate_limit::{
        AdaptiveThrottle, AdaptiveThrottleLayer, RetryBudget, RetryPolicy,
    };
    use http_body_util::Empty;
    use hyper_util::client::legacy::Client;
    use hyper_util::rt::TokioExecutor;
    use tower::ServiceExt;

    let budget = RetryBudget::new(store)
        .ratio(0.1)
        .min_per_second(1)
        .build("flaky-upstream")?;
    let throttle = AdaptiveThrottle::builder().name("flaky-upstream").build()?;
    let client = tower::ServiceBuilder::new()
        .layer(tower::retry::RetryLayer::new(RetryPolicy::new(budget, 2)))
        .layer(AdaptiveThrottleLayer::new(throttle))
        .service(Client::builder(TokioExecutor::new()).build_http::<Empty<bytes::Bytes>>());
    // A listener on every address is called on loopback.
    let host = if bound.ip().is_unspecified() {
        SocketAddr::new(std::net::Ipv4Addr::LOCALHOST.into(), bound.port())
    } else {
        bound
    };
    Ok(Router::new().route(
        "/api/outbound",
        get(move |q: Query<HashMap<String, String>>| {
            let client = client.clone();
            async move {
                let fail = q.get("fail").is_some_and(|f| f == "1");
                let uri = format!("http://{host}/api/flaky?fail={}", u8::from(fail));
                let Ok(request) = http::Request::get(uri)
                    .header("x-api-key", "outbound-demo")
                    .body(Empty::new())
                else {
                    return (
                        StatusCode::INTERNAL_SERVER_ERROR,
                        "bad request\n".to_owned(),
                    );
                };
                match client.oneshot(request).await {
                    Ok(res) => (
                        res.status(),
                        format!("upstream answered {}\n", res.status()),
                    ),
                    Err(err) if err.is::<fleetgate::RateLimitError>() => (
                        StatusCode::SERVICE_UNAVAILABLE,
                        "throttled locally: the upstream fails too often\n".to_owned(),
                    ),
                    Err(err) => (StatusCode::BAD_GATEWAY, format!("upstream failed: {err}\n")),
                }
            }
        }),
    ))
}

/// `GET /api/adaptive?ms=N`: a backend of `FLEETGATE_ADAPTIVE_POOL`
/// workers that queues what it cannot serve, behind an adaptive limit
/// for the whole route that finds how many it can.
fn adaptive_routes() -> Result<Router, BoxError> {
    let pool = env_number("FLEETGATE_ADAPTIVE_POOL", 8, 1..=10_000)?;
    // At least 4 (or the pool): a probe of the minimum RTT at 4 takes a
    // quarter of the time one at 1 does. The initial 10 is the default.
    let limit = AdaptiveLimit::gradient2()
        .min(pool.min(4))
        .max(256)
        .build()?;
    let limiter = ConcurrencyLimiter::adaptive("adaptive", limit)?
        .queue(WaitQueue::lifo(16, Duration::from_millis(10))?);
    let workers = Workers::new(pool);
    Ok(Router::new()
        .route(
            "/api/adaptive",
            get(move |q: Query<HashMap<String, String>>| {
                let workers = workers.clone();
                async move {
                    let ms = match q.get("ms").map(|ms| ms.parse::<u64>()) {
                        None => 20,
                        Some(Ok(ms)) => ms.min(MAX_COMPLETE_MS),
                        Some(Err(_)) => {
                            return (StatusCode::BAD_REQUEST, "ms must be a number\n".to_owned());
                        }
                    };
                    let Some(ends) = workers.serve(Duration::from_millis(ms)) else {
                        return (
                            StatusCode::SERVICE_UNAVAILABLE,
                            "backend backlog full\n".to_owned(),
                        );
                    };
                    tokio::time::sleep_until(ends).await;
                    (StatusCode::OK, format!("adaptive {ms} ms\n"))
                }
            }),
        )
        .route_layer(
            ConcurrencyLimitLayer::new(limiter)
                .key(GlobalKey::new())
                .status(StatusCode::SERVICE_UNAVAILABLE)?,
        ))
}

/// `/api/adaptive`'s backend: `pool` workers, each serving one call at a
/// time for exactly its time, the rest waiting for the first worker free
/// (a backend's own queue). Each worker's schedule is kept, not read off
/// the clock after each call: the timer's late wake-ups then delay the
/// answers but not the next calls' service, so the pool serves
/// `pool / N ms` calls a second, as the backend it stands for would.
#[derive(Clone)]
struct Workers {
    /// When each worker is next free.
    free_at: Arc<std::sync::Mutex<Vec<tokio::time::Instant>>>,
}

impl Workers {
    fn new(pool: u64) -> Self {
        let now = tokio::time::Instant::now();
        Workers {
            // At most 10,000 (FLEETGATE_ADAPTIVE_POOL's bound).
            free_at: Arc::new(std::sync::Mutex::new(vec![now; pool as usize])),
        }
    }

    /// Books the first free worker for `took`; returns when the call
    /// ends, or `None` when even that worker is booked for longer than
    /// `BACKLOG` (a call whose client leaves keeps its worker busy to the
    /// end, as a backend that cannot cancel work does, so clients that
    /// leave could otherwise book it without end).
    fn serve(&self, took: Duration) -> Option<tokio::time::Instant> {
        const BACKLOG: Duration = Duration::from_secs(30);
        let mut free_at = self.free_at.lock().unwrap_or_else(|e| e.into_inner());
        let now = tokio::time::Instant::now();
        let first = free_at.iter_mut().min()?;
        let starts = (*first).max(now);
        if starts > now + BACKLOG {
            return None;
        }
        *first = starts + took;
        Some(*first)
    }
}

/// `POST /api/charge` (critical) and `GET /api/report` (low priority)
/// behind a fleet load shedder of 4 in flight, of which reports may use
/// half, and a worker-utilization shedder for this process.
fn shed_routes(
    fleet: FleetShedder,
    local: UtilizationShedder,
    failure: FailurePolicy,
) -> Result<Router, BoxError> {
    let tiers = Tiers::default();
    let routes = RouteTiers::new(&tiers)
        .route(Some(Method::POST), "/api/charge", "critical")?
        .route(Some(Method::GET), "/api/report", "low")?;
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
        .route_layer(
            FleetShedLayer::new(fleet)
                .classify(routes.clone())
                .on_store_error(failure),
        )
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

/// The most `/api/complete` waits before it answers.
const MAX_COMPLETE_MS: u64 = 10_000;

/// The routes whose cost is known once they have answered, each per API
/// key (or client IP) through a live limiter: `POST /api/complete` charges
/// the tokens its response says it used, `POST /api/login` counts only
/// failed logins, `GET /api/flaky` gives a server error's unit back.
fn after_routes(
    live: &LivePolicies,
    api_key: ApiKey,
    failure: FailurePolicy,
) -> Result<Router, BoxError> {
    let complete = Policy::single(
        "complete",
        Limit::builder(Rate::per_minute(1000)).burst(1000).build()?,
    )?;
    let login = Policy::single(
        "login",
        Limit::builder(Rate::new(5, Duration::from_secs(15 * 60)))
            .burst(5)
            .block_for(Duration::from_secs(3600))
            .build()?,
    )?;
    let flaky = Policy::single(
        "flaky",
        Limit::builder(Rate::per_minute(3)).burst(3).build()?,
    )?;
    Ok(Router::new()
        .route(
            "/api/complete",
            post(complete_handler).layer(
                RateLimitLayer::new(live.limiter(complete))
                    .key(api_key.clone())
                    .on_store_error(failure)
                    .response_cost(ResponseCost::header("x-tokens-used")),
            ),
        )
        .route(
            "/api/login",
            post(login_handler).layer(
                RateLimitLayer::new(live.limiter(login))
                    .key(api_key.clone())
                    .on_store_error(failure)
                    .response_cost(ResponseCost::count_if(|head| head.status == 401)),
            ),
        )
        .route(
            "/api/flaky",
            get(flaky_handler).layer(
                RateLimitLayer::new(live.limiter(flaky))
                    .key(api_key)
                    .on_store_error(failure)
                    .response_cost(ResponseCost::refund_server_errors()),
            ),
        ))
}

/// A number from the query string: `default` when absent, `Err` with a
/// 400 naming `name` when it is not an unsigned integer.
fn query_number(
    q: &HashMap<String, String>,
    name: &str,
    default: u64,
) -> Result<u64, (StatusCode, String)> {
    match q.get(name).map(|v| v.trim().parse::<u64>()) {
        None => Ok(default),
        Some(Ok(n)) => Ok(n),
        Some(Err(_)) => Err((
            StatusCode::BAD_REQUEST,
            format!("{name} must be an unsigned integer\n"),
        )),
    }
}

/// `POST /api/complete?tokens=N&ms=M`: after `M` ms (default 0, at most
/// 10000), a completion that says it used `N` tokens (default 100).
async fn complete_handler(Query(q): Query<HashMap<String, String>>) -> Response {
    let (tokens, ms) = match (query_number(&q, "tokens", 100), query_number(&q, "ms", 0)) {
        (Ok(tokens), Ok(ms)) => (tokens, ms.min(MAX_COMPLETE_MS)),
        (Err(bad), _) | (_, Err(bad)) => return bad.into_response(),
    };
    tokio::time::sleep(Duration::from_millis(ms)).await;
    (
        [("x-tokens-used", tokens.to_string())],
        format!("completed: {tokens} tokens after {ms} ms\n"),
    )
        .into_response()
}

/// `POST /api/login?ok=1|0`: 200 when `ok=1`, 401 otherwise.
async fn login_handler(Query(q): Query<HashMap<String, String>>) -> (StatusCode, &'static str) {
    match q.get("ok").map(String::as_str) {
        Some("1") => (StatusCode::OK, "logged in\n"),
        _ => (StatusCode::UNAUTHORIZED, "wrong password\n"),
    }
}

/// `GET /api/flaky?fail=1|0`: 500 when `fail=1`, 200 otherwise.
async fn flaky_handler(Query(q): Query<HashMap<String, String>>) -> (StatusCode, &'static str) {
    match q.get("fail").map(String::as_str) {
        Some("1") => (StatusCode::INTERNAL_SERVER_ERROR, "failed\n"),
        _ => (StatusCode::OK, "fine\n"),
    }
}
