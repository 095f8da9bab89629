//! A fleet of workers sharing one upstream API's limits, waiting their turn
//! instead of earning 429s.
//!
//! ```text
//! cargo run --example client                                   # memory store
//! REDIS_URL=redis://127.0.0.1:6379 cargo run --example client  # through Redis
//! cargo run --example client -- --workers 16 --calls 60
//! cargo run --example client -- --limits 50/1s --calls 200 --fail-for 3 --retries 3
//! cargo run --example client -- --limits 50/1s --calls 200 --fail-for 3 --retries 3 --throttle 2
//! ```
//!
//! It starts a small upstream API on a free loopback port that enforces its
//! own limits (by default 25 calls per 5 s and 300 per 60 s, counted over
//! sliding windows) and answers `429` with `Retry-After` when a call would
//! exceed them. Then it runs worker tasks that make a burst of calls through
//! a hyper client wrapped in `RateLimitLayer` in waiting mode: each call
//! reserves its slot (one Redis round trip), sleeps until it, and goes. With
//! `REDIS_URL`, every worker opens its own Redis connection, as separate
//! processes would. It ends with one line on stdout:
//!
//! ```text
//! calls=40 upstream_429=0 achieved_per_s=4.90 allowed_per_s=5.00 attempts=40 retries=0 throttled=0 failed=0 failed_after_recovery=0 run_s=8.0
//! ```
//!
//! `calls` counts the calls the workers made, `upstream_429` the requests
//! the upstream refused with 429 (expected 0), `achieved_per_s` is the
//! rate between the first and the last accepted request, and
//! `allowed_per_s` the upstream's long-run rate (its tightest limit).
//! `attempts` counts the requests the upstream received, `retries` those
//! among them that were retries, `throttled` the calls the adaptive
//! throttle refused locally, `failed` the calls that failed in the end
//! (throttled ones included), `failed_after_recovery` those of them that
//! started after the upstream recovered (`--fail-for`), and `run_s` the
//! run's seconds. The client mirrors each upstream window with
//! `within_window` (burst 1, plus a margin for timer and network jitter),
//! so it runs a little below the allowed rate by design.
//!
//! Each worker's client is, from the outside in: a `tower::retry` layer
//! whose `RetryPolicy` spends a fleet-wide `RetryBudget`, the
//! `AdaptiveThrottleLayer` (with `--throttle`), the waiting
//! `RateLimitLayer`, and the hyper client: every attempt is throttled and
//! waits its turn. Each worker builds its own budget and throttle, as a
//! separate process would.
//!
//! Options, as flags or environment variables (flags win):
//!
//! | flag | env | default | meaning |
//! |---|---|---|---|
//! | `--workers N` | `FLEETGATE_WORKERS` | 8 | worker tasks |
//! | `--calls N` | `FLEETGATE_CALLS` | 40 | calls in all, shared by the workers |
//! | `--limits L` | `FLEETGATE_LIMITS` | `25/5s,300/60s` | the upstream's limits: `count/window`, window in `ms`, `s`, `min` or `h` |
//! | `--margin-ms N` | `FLEETGATE_MARGIN_MS` | 100 | jitter margin added to each window by the client |
//! | `--max-wait-s N` | `FLEETGATE_MAX_WAIT_S` | 120 | longest a call waits for its slot before failing |
//! | `--fail-for SECS` | `FLEETGATE_FAIL_FOR` | 0 | the upstream answers 503 to everything for its first SECS seconds, then recovers |
//! | `--retries N` | `FLEETGATE_RETRIES` | 0 | retry each failed call up to N times, from a `RetryBudget` (ratio 0.1, at least 1 retry a second) |
//! | `--throttle K` | `FLEETGATE_THROTTLE` | off | client-side adaptive throttling with this K (e.g. 2) |
//! | | `REDIS_URL` | unset | share the limits through this Redis instead of the memory store |
//! | | `RUST_LOG` | `warn` | log filter |

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use bytes::Bytes;
use fleetgate::key::HostKey;
use fleetgate::rate_limit::{
    AdaptiveThrottle, AdaptiveThrottleLayer, RetryAfter, RetryBudget, RetryPolicy, within_window,
};
use fleetgate::{
    FailurePolicy, Limiter, MemoryStore, Policy, RateLimitError, RateLimitLayer, RedisStore, Store,
};
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::time::Instant;
use tower::retry::RetryLayer;
use tower::{Service, ServiceBuilder, ServiceExt};
use tracing_subscriber::EnvFilter;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

struct Options {
    workers: usize,
    calls: usize,
    limits: Vec<(u64, Duration)>,
    margin: Duration,
    max_wait: Duration,
    fail_for: Duration,
    retries: u32,
    throttle: Option<f64>,
    redis_url: Option<String>,
}

/// What the workers counted.
#[derive(Default)]
struct Outcomes {
    calls: AtomicU64,
    retries: AtomicU64,
    throttled: AtomicU64,
    failed: AtomicU64,
    failed_after_recovery: AtomicU64,
}

/// A call's attempts so far: an extension its retries' clones share.
#[derive(Clone, Default)]
struct Attempts(Arc<AtomicU32>);

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let options = options()?;

    let upstream = Upstream::new(&options.limits, options.fail_for);
    let addr = upstream.clone().serve().await?;
    eprintln!(
        "upstream on http://{addr} enforcing {}; {} workers, {} calls, store: {}",
        options
            .limits
            .iter()
            .map(|(n, w)| format!("{n} per {w:?}"))
            .collect::<Vec<_>>()
            .join(" and "),
        options.workers,
        options.calls,
        options.redis_url.as_deref().unwrap_or("memory"),
    );

    let mut policy = Policy::builder("upstream");
    for &(count, window) in &options.limits {
        policy = policy.limit(within_window(count, window, options.margin)?);
    }
    let policy = policy.build()?;

    let memory: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let issued = Arc::new(AtomicUsize::new(0));
    let outcomes = Arc::new(Outcomes::default());
    let started = Instant::now();
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..options.workers {
        // One store per worker on Redis: its own connection, as a separate
        // process would have. The memory store can only be shared in process.
        let store: Arc<dyn Store> = match &options.redis_url {
            Some(url) => Arc::new(
                RedisStore::builder(url)
                    .prefix("fleetgate-example")
                    .timeout(Duration::from_secs(1))
                    .connect()
                    .await
                    .map_err(|err| format!("cannot reach Redis at {url}: {err}"))?,
            ),
            None => memory.clone(),
        };
        let http = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
        // Innermost: counts the attempts that go out, retries among them.
        let counted = outcomes.clone();
        let http = ServiceBuilder::new()
            .map_request(move |req: http::Request<Empty<Bytes>>| {
                if let Some(attempts) = req.extensions().get::<Attempts>()
                    && attempts.0.fetch_add(1, Ordering::SeqCst) > 0
                {
                    counted.retries.fetch_add(1, Ordering::SeqCst);
                }
                req
            })
            .service(http);
        let waiting = RateLimitLayer::new(Limiter::new(policy.clone(), store.clone()))
            // Each upstream host has its own limits (and so would each
            // access token, with HeaderKey::bearer()).
            .key(HostKey)
            .typed_errors()
            .wait_up_to(options.max_wait)
            // A client that must never earn a 429 refuses rather than calls
            // blind when Redis is unreachable.
            .on_store_error(FailurePolicy::Closed)
            // Should the upstream still answer 429 or 503 with Retry-After,
            // hold every worker back for that long.
            .upstream_feedback(RetryAfter::new());
        let throttle = match options.throttle {
            Some(k) => Some(AdaptiveThrottleLayer::new(
                AdaptiveThrottle::builder().k(k).build()?,
            )),
            None => None,
        };
        // Retries as a share of the fleet's first attempts: a tenth, and
        // at least one a second.
        let budget = RetryBudget::new(store)
            .ratio(0.1)
            .min_per_second(1)
            .build("upstream")?;
        let mut client = ServiceBuilder::new()
            .layer(RetryLayer::new(RetryPolicy::new(budget, options.retries)))
            .option_layer(throttle)
            .layer(waiting)
            .service(http);
        let issued = issued.clone();
        let outcomes = outcomes.clone();
        let calls = options.calls;
        let recovered = started + options.fail_for;
        workers.spawn(async move {
            loop {
                if issued.fetch_add(1, Ordering::SeqCst) >= calls {
                    return Ok::<_, BoxError>(());
                }
                outcomes.calls.fetch_add(1, Ordering::SeqCst);
                let began = Instant::now();
                let mut req = http::Request::get(format!("http://{addr}/items"))
                    .body(Empty::<Bytes>::new())?;
                req.extensions_mut().insert(Attempts::default());
                let ok = match client.ready().await?.call(req).await {
                    Ok(res) => {
                        let ok = res.status().is_success();
                        // Read the body so the connection can be reused.
                        res.into_body().collect().await?;
                        ok
                    }
                    Err(err) => {
                        if matches!(err.downcast_ref(), Some(RateLimitError::Throttled)) {
                            outcomes.throttled.fetch_add(1, Ordering::SeqCst);
                        } else {
                            eprintln!("call failed: {err}");
                        }
                        false
                    }
                };
                if !ok {
                    outcomes.failed.fetch_add(1, Ordering::SeqCst);
                    if began >= recovered {
                        outcomes
                            .failed_after_recovery
                            .fetch_add(1, Ordering::SeqCst);
                    }
                }
            }
        });
    }
    let mut failed = 0;
    while let Some(joined) = workers.join_next().await {
        if let Err(err) = joined.map_err(BoxError::from).and_then(|r| r) {
            eprintln!("worker failed: {err}");
            failed += 1;
        }
    }

    let stats = upstream.stats();
    let allowed = options
        .limits
        .iter()
        .map(|&(n, w)| n as f64 / w.as_secs_f64())
        .fold(f64::INFINITY, f64::min);
    let count = |n: &AtomicU64| n.load(Ordering::SeqCst);
    println!(
        "calls={} upstream_429={} achieved_per_s={:.2} allowed_per_s={:.2} attempts={} retries={} throttled={} failed={} failed_after_recovery={} run_s={:.1}",
        count(&outcomes.calls),
        stats.refused,
        stats.achieved_per_s,
        allowed,
        stats.calls,
        count(&outcomes.retries),
        count(&outcomes.throttled),
        count(&outcomes.failed),
        count(&outcomes.failed_after_recovery),
        started.elapsed().as_secs_f64(),
    );
    if failed > 0 {
        return Err(format!("{failed} workers failed").into());
    }
    // Against an upstream that never fails, every call must succeed.
    let failed_calls = count(&outcomes.failed);
    if failed_calls > 0 && options.fail_for.is_zero() && options.throttle.is_none() {
        return Err(format!("{failed_calls} calls failed").into());
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// The upstream API: its own limits, counted over sliding windows.

#[derive(Clone)]
struct Upstream(Arc<Mutex<UpstreamState>>);

struct UpstreamState {
    limits: Vec<(u64, Duration)>,
    /// Answers 503 to everything until then.
    failing_until: Instant,
    accepted: VecDeque<Instant>,
    first: Option<Instant>,
    last: Option<Instant>,
    accepted_total: u64,
    calls: u64,
    refused: u64,
}

struct Stats {
    calls: u64,
    refused: u64,
    achieved_per_s: f64,
}

impl Upstream {
    fn new(limits: &[(u64, Duration)], fail_for: Duration) -> Self {
        Upstream(Arc::new(Mutex::new(UpstreamState {
            limits: limits.to_vec(),
            failing_until: Instant::now() + fail_for,
            accepted: VecDeque::new(),
            first: None,
            last: None,
            accepted_total: 0,
            calls: 0,
            refused: 0,
        })))
    }

    async fn serve(self) -> Result<SocketAddr, BoxError> {
        let app = Router::new().route("/items", get(items)).with_state(self);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        tokio::spawn(async move { axum::serve(listener, app).await });
        Ok(addr)
    }

    /// Admits the call if every window has room; otherwise says when the
    /// oldest call in the fullest window leaves it. `None` while failing.
    fn admit(&self) -> Option<Result<(), Duration>> {
        let mut s = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        s.calls += 1;
        if now < s.failing_until {
            return None;
        }
        Some(s.admit_at(now))
    }
}

impl UpstreamState {
    fn admit_at(&mut self, now: Instant) -> Result<(), Duration> {
        let longest = self.limits.iter().map(|l| l.1).max().unwrap_or_default();
        while self
            .accepted
            .front()
            .is_some_and(|&t| now.duration_since(t) >= longest)
        {
            self.accepted.pop_front();
        }
        let mut retry = None;
        for &(count, window) in &self.limits {
            let inside: Vec<Instant> = self
                .accepted
                .iter()
                .copied()
                .filter(|&t| now.duration_since(t) < window)
                .collect();
            if inside.len() as u64 >= count {
                let oldest = inside[inside.len() - count as usize];
                let wait = window - now.duration_since(oldest);
                retry = Some(retry.map_or(wait, |r: Duration| r.max(wait)));
            }
        }
        if let Some(wait) = retry {
            self.refused += 1;
            return Err(wait);
        }
        self.accepted.push_back(now);
        self.accepted_total += 1;
        self.first.get_or_insert(now);
        self.last = Some(now);
        Ok(())
    }
}

impl Upstream {
    fn stats(&self) -> Stats {
        let s = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let achieved_per_s = match (s.first, s.last) {
            (Some(first), Some(last)) if last > first => {
                (s.accepted_total - 1) as f64 / (last - first).as_secs_f64()
            }
            _ => 0.0,
        };
        Stats {
            calls: s.calls,
            refused: s.refused,
            achieved_per_s,
        }
    }
}

async fn items(State(upstream): State<Upstream>) -> Response {
    match upstream.admit() {
        None => (StatusCode::SERVICE_UNAVAILABLE, "failing\n").into_response(),
        Some(Ok(())) => "item\n".into_response(),
        Some(Err(wait)) => {
            let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
            let mut res = (StatusCode::TOO_MANY_REQUESTS, "slow down\n").into_response();
            res.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
            res
        }
    }
}

// ---------------------------------------------------------------------------
// Options.

fn options() -> Result<Options, BoxError> {
    let mut args = std::env::args().skip(1);
    let mut flags = std::collections::HashMap::new();
    while let Some(flag) = args.next() {
        let value = args.next().ok_or_else(|| format!("{flag} needs a value"))?;
        flags.insert(flag, value);
    }
    let get = |flag: &str, env: &str, default: &str| -> String {
        flags
            .get(flag)
            .cloned()
            .or_else(|| std::env::var(env).ok().filter(|v| !v.is_empty()))
            .unwrap_or_else(|| default.to_owned())
    };
    for flag in flags.keys() {
        if ![
            "--workers",
            "--calls",
            "--limits",
            "--margin-ms",
            "--max-wait-s",
            "--fail-for",
            "--retries",
            "--throttle",
        ]
        .contains(&flag.as_str())
        {
            return Err(format!("unknown option {flag}; see the top of examples/client.rs").into());
        }
    }
    let number = |flag: &str, env: &str, default: &str| -> Result<u64, BoxError> {
        let text = get(flag, env, default);
        text.parse()
            .map_err(|_| format!("{flag} / {env}: expected a whole number, got {text:?}").into())
    };
    let workers = number("--workers", "FLEETGATE_WORKERS", "8")?.max(1) as usize;
    let calls = number("--calls", "FLEETGATE_CALLS", "40")? as usize;
    let margin = Duration::from_millis(number("--margin-ms", "FLEETGATE_MARGIN_MS", "100")?);
    let max_wait = Duration::from_secs(number("--max-wait-s", "FLEETGATE_MAX_WAIT_S", "120")?);
    let fail_for = Duration::from_secs(number("--fail-for", "FLEETGATE_FAIL_FOR", "0")?);
    let retries = u32::try_from(number("--retries", "FLEETGATE_RETRIES", "0")?)
        .map_err(|_| "--retries / FLEETGATE_RETRIES: too many")?;
    let throttle = match get("--throttle", "FLEETGATE_THROTTLE", "").as_str() {
        "" => None,
        text => Some(text.parse::<f64>().map_err(|_| {
            format!("--throttle / FLEETGATE_THROTTLE: expected a number such as 2, got {text:?}")
        })?),
    };
    let limits = get("--limits", "FLEETGATE_LIMITS", "25/5s,300/60s")
        .split(',')
        .map(parse_limit)
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Options {
        workers,
        calls,
        limits,
        margin,
        max_wait,
        fail_for,
        retries,
        throttle,
        redis_url: std::env::var("REDIS_URL").ok().filter(|u| !u.is_empty()),
    })
}

/// `25/5s`, `300/60s`, `1000/1h`, `10/500ms`.
fn parse_limit(text: &str) -> Result<(u64, Duration), BoxError> {
    let bad = || format!("limit {text:?}: expected count/window such as 25/5s");
    let (count, window) = text.trim().split_once('/').ok_or_else(bad)?;
    let count: u64 = count.parse().map_err(|_| bad())?;
    let split = window.find(|c: char| !c.is_ascii_digit()).ok_or_else(bad)?;
    let (amount, unit) = window.split_at(split);
    let amount: u64 = amount.parse().map_err(|_| bad())?;
    let window = match unit {
        "ms" => Duration::from_millis(amount),
        "s" => Duration::from_secs(amount),
        "min" => Duration::from_secs(amount * 60),
        "h" => Duration::from_secs(amount * 3600),
        _ => return Err(bad().into()),
    };
    if count == 0 || window.is_zero() {
        return Err(bad().into());
    }
    Ok((count, window))
}
