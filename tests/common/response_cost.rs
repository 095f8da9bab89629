//! The app behind the response-cost tests (`RateLimitLayer::response_cost`):
//! a handler that states its cost, fails or streams on request, and the
//! helpers that call it. Shared by tests/layers/after.rs (the scenarios,
//! on both stores), tests/redis/after.rs and refused_writes.rs, and
//! tests/alone/charge_log.rs.
#![allow(dead_code)] // each binary uses part of it

use axum::body::Body;
use bytes::Bytes;
use fleetgate::key::{HeaderKey, KeyExtractor};
use fleetgate::rate_limit::ResponseCost;
use fleetgate::{Decision, Key, Limit, Limiter, Policy, RateLimitLayer};
use http::{Request, Response};
use http_body::Frame;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tower::{ServiceExt, service_fn};

pub struct Chunks {
    left: u64,
}

impl http_body::Body for Chunks {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if self.left == 0 {
            return Poll::Ready(None);
        }
        self.left -= 1;
        Poll::Ready(Some(Ok(Frame::data(Bytes::from(vec![b'x'; 100])))))
    }

    fn is_end_stream(&self) -> bool {
        self.left == 0
    }
}

pub fn param(req: &Request<Body>, name: &str) -> Option<u64> {
    req.uri().query()?.split('&').find_map(|pair| {
        let (k, v) = pair.split_once('=')?;
        (k == name).then(|| v.parse().ok())?
    })
}

/// The handler: answers `status=S` (default 200), states `tokens=N` in
/// `x-tokens-used`, and sends `chunks=C` frames of 100 bytes; counts its
/// calls in `calls` and the calls in flight in `inside` (highest in
/// `peak`), yielding `yields` times while in flight.
#[derive(Clone, Default)]
pub struct Handler {
    pub calls: Arc<AtomicUsize>,
    pub inside: Arc<AtomicUsize>,
    pub peak: Arc<AtomicUsize>,
}

impl Handler {
    pub fn service(
        &self,
    ) -> impl tower::Service<
        Request<Body>,
        Response = Response<Body>,
        Error = Infallible,
        Future = impl Future<Output = Result<Response<Body>, Infallible>> + Send,
    > + Clone
    + Send
    + Sync
    + 'static {
        let this = self.clone();
        service_fn(move |req: Request<Body>| {
            let this = this.clone();
            async move {
                this.calls.fetch_add(1, Ordering::SeqCst);
                let now = this.inside.fetch_add(1, Ordering::SeqCst) + 1;
                this.peak.fetch_max(now, Ordering::SeqCst);
                for _ in 0..param(&req, "yields").unwrap_or(0) {
                    tokio::task::yield_now().await;
                }
                this.inside.fetch_sub(1, Ordering::SeqCst);
                let status = param(&req, "status").unwrap_or(200) as u16;
                let mut res = Response::builder().status(status);
                if let Some(tokens) = param(&req, "tokens") {
                    res = res.header("x-tokens-used", tokens);
                }
                let body = match param(&req, "chunks") {
                    Some(left) => Body::new(Chunks { left }),
                    None => Body::empty(),
                };
                Ok::<_, Infallible>(res.body(body).unwrap())
            }
        })
    }
}

pub fn policy(name: &str, limit: Limit) -> Policy {
    Policy::single(name, limit).unwrap()
}

/// The layer of these tests: keyed by `x-api-key`, charging `cost`.
pub fn layer(limiter: &Limiter, cost: ResponseCost) -> RateLimitLayer<HeaderKey> {
    RateLimitLayer::new(limiter.clone())
        .key(HeaderKey::new("x-api-key"))
        .response_cost(cost)
}

pub fn request(uri: &str, api_key: &str) -> Request<Body> {
    Request::post(uri)
        .header("x-api-key", api_key)
        .body(Body::empty())
        .unwrap()
}

pub async fn call<S>(svc: &S, uri: &str, api_key: &str) -> Response<Body>
where
    S: tower::Service<Request<Body>, Response = Response<Body>, Error = Infallible> + Clone,
{
    svc.clone().oneshot(request(uri, api_key)).await.unwrap()
}

/// The key the layer's `HeaderKey` makes of `api_key` (hashed).
pub fn key_of(api_key: &str) -> Key {
    HeaderKey::new("x-api-key")
        .extract(&request("/", api_key))
        .unwrap()
}

pub fn retry_after(res: &Response<Body>) -> u64 {
    res.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap()
}

/// Waits (in real time, within 5 s) until `key` has `left` calls of cost
/// 1 left under `limiter`: a charge or refund made off the response's
/// path has landed. A peek that fails (Redis refusing writes, a charge
/// still owed) counts as not yet.
pub async fn wait_for_remaining(limiter: &Limiter, key: &Key, left: u64) {
    let what = format!("remaining {left}");
    wait_for_peek(limiter, key, Duration::from_secs(5), &what, |d| {
        d.remaining() == left
    })
    .await;
}

/// Peeks `key` (cost 1) under `limiter` until `settled` holds of the
/// decision, for at most `within` in real time (zero: the first peek must
/// do), and returns that decision. A peek that fails counts as not yet;
/// `what` names the awaited state in the failure.
pub async fn wait_for_peek(
    limiter: &Limiter,
    key: &Key,
    within: Duration,
    what: &str,
    settled: impl Fn(&Decision) -> bool,
) -> Decision {
    let deadline = Instant::now() + within;
    loop {
        let seen = limiter.peek(key, 1).await;
        if let Ok(d) = &seen
            && settled(d)
        {
            return d.clone();
        }
        assert!(Instant::now() < deadline, "never {what}: {seen:?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
