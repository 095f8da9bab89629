//! A fleet of workers sharing one upstream API's limits, waiting their turn
//! instead of earning 429s.
//!
//! ```text
//! cargo run --example client                                   # memory store
//! REDIS_URL=redis://127.0.0.1:6379 cargo run --example client  # through Redis
//! cargo run --example client -- --workers 16 --calls 60
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
//! calls=40 upstream_429=0 achieved_per_s=4.90 allowed_per_s=5.00
//! ```
//!
//! `calls` counts the calls that reached the upstream, `upstream_429` those
//! it refused (expected 0), `achieved_per_s` is the rate between the first
//! and the last accepted call, and `allowed_per_s` the upstream's long-run
//! rate (its tightest limit). The client mirrors each upstream window with
//! `within_window` (burst 1, plus a margin for timer and network jitter),
//! so it runs a little below the allowed rate by design.
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
//! | | `REDIS_URL` | unset | share the limits through this Redis instead of the memory store |
//! | | `RUST_LOG` | `warn` | log filter |

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use bytes::Bytes;
use fleetgate::key::HostKey;
use fleetgate::rate_limit::{RetryAfter, within_window};
use fleetgate::{FailurePolicy, Limiter, MemoryStore, Policy, RateLimitLayer, RedisStore, Store};
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::time::Instant;
use tower::{Layer, Service, ServiceExt};
use tracing_subscriber::EnvFilter;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

struct Options {
    workers: usize,
    calls: usize,
    limits: Vec<(u64, Duration)>,
    margin: Duration,
    max_wait: Duration,
    redis_url: Option<String>,
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let options = options()?;

    let upstream = Upstream::new(&options.limits);
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
        let mut client = RateLimitLayer::new(Limiter::new(policy.clone(), store))
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
            .upstream_feedback(RetryAfter::new())
            .layer(http);
        let issued = issued.clone();
        let calls = options.calls;
        workers.spawn(async move {
            loop {
                if issued.fetch_add(1, Ordering::SeqCst) >= calls {
                    return Ok::<_, BoxError>(());
                }
                let req = http::Request::get(format!("http://{addr}/items"))
                    .body(Empty::<Bytes>::new())?;
                let res = client.ready().await?.call(req).await?;
                // Read the body so the connection can be reused.
                res.into_body().collect().await?;
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
    println!(
        "calls={} upstream_429={} achieved_per_s={:.2} allowed_per_s={:.2}",
        stats.calls, stats.refused, stats.achieved_per_s, allowed
    );
    if failed > 0 {
        return Err(format!("{failed} workers failed").into());
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// The upstream API: its own limits, counted over sliding windows.

#[derive(Clone)]
struct Upstream(Arc<Mutex<UpstreamState>>);

struct UpstreamState {
    limits: Vec<(u64, Duration)>,
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
    fn new(limits: &[(u64, Duration)]) -> Self {
        Upstream(Arc::new(Mutex::new(UpstreamState {
            limits: limits.to_vec(),
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
    /// oldest call in the fullest window leaves it.
    fn admit(&self) -> Result<(), Duration> {
        let mut s = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        s.calls += 1;
        let longest = s.limits.iter().map(|l| l.1).max().unwrap_or_default();
        while s
            .accepted
            .front()
            .is_some_and(|&t| now.duration_since(t) >= longest)
        {
            s.accepted.pop_front();
        }
        let mut retry = None;
        for &(count, window) in &s.limits {
            let inside: Vec<Instant> = s
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
            s.refused += 1;
            return Err(wait);
        }
        s.accepted.push_back(now);
        s.accepted_total += 1;
        s.first.get_or_insert(now);
        s.last = Some(now);
        Ok(())
    }

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
        Ok(()) => "item\n".into_response(),
        Err(wait) => {
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
