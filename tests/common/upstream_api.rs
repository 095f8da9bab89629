//! A fake upstream API for the outbound tests of `UpstreamHeaders`: it
//! enforces its own limit in fixed windows (unknown to the clients' policy,
//! and changed on a schedule), answers 429 past it, and states what is
//! left on every response in one of the header styles real APIs use.
//! Shared by the layer tests (memory store, paused time) and the Redis
//! tests (real time).
#![allow(dead_code)] // each binary uses part of it

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fleetgate::key::GlobalKey;
use fleetgate::rate_limit::UpstreamFeedback;
use fleetgate::{Limiter, RateLimitError, RateLimitLayer};
use tokio::time::Instant;
use tower::{Layer, ServiceExt};

/// How the upstream states what is left.
#[derive(Clone, Copy, Debug)]
pub enum Style {
    /// `RateLimit: "default";r=R;t=T`, `t` in whole seconds, rounded up.
    Ietf,
    /// `X-RateLimit-Remaining` and `X-RateLimit-Reset` in whole seconds
    /// from now, rounded up.
    XRateLimit,
    /// OpenAI's `x-ratelimit-remaining-requests` and
    /// `x-ratelimit-reset-requests` as a Go duration, to the millisecond
    /// (rounded up).
    OpenAi,
}

/// The upstream: `limit` calls per window of `window` from its start,
/// the limit changing at the times of `schedule` (from the start).
#[derive(Clone)]
pub struct UpstreamApi(Arc<Mutex<State>>);

struct State {
    start: Instant,
    window: Duration,
    schedule: Vec<(Duration, u64)>,
    style: Style,
    counts: BTreeMap<u64, u64>,
    /// When the first accepted call of each window came, from the start.
    firsts: BTreeMap<u64, Duration>,
    /// When each 429 was sent, from the start.
    refused: Vec<Duration>,
}

impl UpstreamApi {
    pub fn new(window: Duration, schedule: &[(Duration, u64)], style: Style) -> Self {
        UpstreamApi(Arc::new(Mutex::new(State {
            start: Instant::now(),
            window,
            schedule: schedule.to_vec(),
            style,
            counts: BTreeMap::new(),
            firsts: BTreeMap::new(),
            refused: Vec::new(),
        })))
    }

    /// Accepted calls per window (by index from the start).
    pub fn accepted(&self) -> BTreeMap<u64, u64> {
        self.0.lock().unwrap().counts.clone()
    }

    /// When the first accepted call of each window (by index) came, from
    /// the window's start.
    pub fn first_calls(&self) -> BTreeMap<u64, Duration> {
        let state = self.0.lock().unwrap();
        let w = state.window.as_micros() as u64;
        let start = |index: u64| Duration::from_micros(index * w);
        state
            .firsts
            .iter()
            .map(|(&index, &at)| (index, at - start(index)))
            .collect()
    }

    /// When each 429 was sent, from the start.
    pub fn refused(&self) -> Vec<Duration> {
        self.0.lock().unwrap().refused.clone()
    }

    /// The limit in force `at` from the start.
    pub fn limit_at(&self, at: Duration) -> u64 {
        let state = self.0.lock().unwrap();
        state.limit_at(at)
    }

    fn answer(&self) -> http::Response<()> {
        let mut state = self.0.lock().unwrap();
        let at = state.start.elapsed();
        let w = state.window.as_micros() as u64;
        let index = at.as_micros() as u64 / w;
        let reset = Duration::from_micros((index + 1) * w) - at;
        let limit = state.limit_at(at);
        let count = state.counts.entry(index).or_insert(0);
        let ok = *count < limit;
        if ok {
            *count += 1;
        }
        let remaining = limit.saturating_sub(*count);
        if ok {
            state.firsts.entry(index).or_insert(at);
        }
        if !ok {
            state.refused.push(at);
        }
        let secs = reset.as_micros().div_ceil(1_000_000);
        let mut b = http::Response::builder().status(if ok { 200 } else { 429 });
        if !ok {
            b = b.header("retry-after", secs.to_string());
        }
        b = match state.style {
            Style::Ietf => b
                .header("ratelimit", format!("\"default\";r={remaining};t={secs}"))
                .header(
                    "ratelimit-policy",
                    format!("\"default\";q={limit};w={}", state.window.as_secs()),
                ),
            Style::XRateLimit => b
                .header("x-ratelimit-limit", limit.to_string())
                .header("x-ratelimit-remaining", remaining.to_string())
                .header("x-ratelimit-reset", secs.to_string()),
            Style::OpenAi => b
                .header("x-ratelimit-remaining-requests", remaining.to_string())
                .header(
                    "x-ratelimit-reset-requests",
                    format!("{}ms", reset.as_micros().div_ceil(1_000)),
                ),
        };
        b.body(()).unwrap()
    }
}

impl State {
    fn limit_at(&self, at: Duration) -> u64 {
        self.schedule
            .iter()
            .rev()
            .find(|(from, _)| *from <= at)
            .map_or(0, |(_, limit)| *limit)
    }
}

/// What a fleet's run did.
#[derive(Debug, Default)]
pub struct Run {
    pub calls: usize,
    pub errors: Vec<String>,
}

/// `workers` tasks per limiter, each calling the upstream one call at a
/// time through its own layer (waiting mode, `feedback`, one global
/// identity) until `until` from now.
pub async fn run_fleet<F: UpstreamFeedback<http::Response<()>>>(
    api: &UpstreamApi,
    limiters: &[Limiter],
    workers: usize,
    until: Duration,
    feedback: F,
) -> Run {
    let end = Instant::now() + until;
    let mut tasks = Vec::new();
    for limiter in limiters {
        let layer = RateLimitLayer::new(limiter.clone())
            .key(GlobalKey::new())
            .typed_errors()
            .wait_up_to(Duration::from_secs(10))
            .upstream_feedback(feedback.clone());
        for _ in 0..workers {
            let api = api.clone();
            let client = layer.layer(tower::service_fn(move |_: http::Request<()>| {
                let response = api.answer();
                async move { Ok::<_, Infallible>(response) }
            }));
            tasks.push(tokio::spawn(async move {
                let mut run = Run::default();
                while Instant::now() < end {
                    match client.clone().oneshot(http::Request::new(())).await {
                        Ok(_) => run.calls += 1,
                        Err(err) => {
                            let err = match err.downcast::<RateLimitError>() {
                                Ok(err) => err.to_string(),
                                Err(err) => err.to_string(),
                            };
                            run.errors.push(err);
                            return run;
                        }
                    }
                }
                run
            }));
        }
    }
    let mut total = Run::default();
    for task in tasks {
        let run = task.await.unwrap();
        total.calls += run.calls;
        total.errors.extend(run.errors);
    }
    total
}
