//! Client-side adaptive throttling: a client that sees its upstream
//! refuse or fail most calls stops sending most of them, locally.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use pin_project_lite::pin_project;
use tokio::time::Instant;
use tower_layer::Layer;
use tower_service::Service;

use super::feedback::grpc_refusal;
use crate::error::{BoxError, ConfigError, RateLimitError, is_refusal};
use crate::metrics;
use crate::observe::{OutboundStats, ThrottleSource};
use crate::policy::check_name;

/// How many buckets the window is counted in: the counts age out a
/// bucket (a 60th of the window) at a time.
const BUCKETS: usize = 60;

/// Client-side adaptive throttling, as Google's SRE book (Handling
/// Overload, chapter 21) describes it: each instance counts, over a
/// sliding window, the calls it made (`requests`) and those its upstream
/// accepted (`accepts`), and refuses a new call locally, before sending
/// it, with probability
///
/// ```text
/// p = min(max_rejection, max(0, (requests − K · accepts) / (requests + 1)))
/// ```
///
/// While the upstream accepts at least one call in `K`, nothing is
/// refused; as it fails more, the instance sends only about `K` times
/// what it accepts, and at least `1 − max_rejection` of its calls (10 %
/// by default): a failing upstream gets a trickle, enough to see it
/// recover, instead of the whole fleet's traffic and retries.
///
/// `requests` counts the calls sent, so that both counts are what the
/// upstream saw and recovery is quick: once the upstream accepts again,
/// each accepted call lowers the probability, and an instance is back to
/// sending every call well within one window (27 s at the defaults, after
/// a failure longer than the window). The SRE book also counts the calls
/// refused locally ([`count_refused`](AdaptiveThrottleBuilder::count_refused)):
/// an upstream that can take `X` calls a second then gets about `K · X`
/// rather than `√(K · X · N)` of `N` offered, but the share sent stays
/// at the floor until the failure's calls have aged out, and recovery
/// takes about two windows.
///
/// The state is this process's own (no store, no round trip); clones
/// share it. A call is counted when it ends, so that calls in flight
/// (a burst to a fresh throttle) refuse nothing; a call that a layer
/// inside refused (a [`RateLimitError`], such as a waiting layer's) never
/// reached the upstream and is not counted; a call dropped before its
/// answer (a timeout layer outside, a caller gone) counts as a request
/// not accepted. What counts as accepted is the layer's classifier
/// ([`AdaptiveThrottleLayer`]: by default [`HttpAccepts`], neither 5xx
/// nor 429, nor gRPC `UNAVAILABLE`/`RESOURCE_EXHAUSTED`, nor an error
/// such as a timeout).
///
/// ```
/// use std::time::Duration;
/// use fleetgate::rate_limit::AdaptiveThrottle;
///
/// let throttle = AdaptiveThrottle::builder().k(2.0).window(Duration::from_secs(120)).build()?;
/// assert_eq!(throttle.rejection_probability(), 0.0);
/// assert!(AdaptiveThrottle::builder().k(0.5).build().is_err());
/// # Ok::<(), fleetgate::ConfigError>(())
/// ```
#[derive(Clone)]
pub struct AdaptiveThrottle {
    shared: Arc<Shared>,
}

struct Shared {
    name: Arc<str>,
    stats: Arc<OutboundStats>,
    k: f64,
    window: Duration,
    max_rejection: f64,
    count_refused: bool,
    /// Where bucket indexes count from, on tokio's clock (paused time
    /// moves the window).
    origin: Instant,
    counts: Mutex<Counts>,
}

/// Requests and accepts per bucket, the newest at `newest`.
struct Counts {
    requests: [u64; BUCKETS],
    accepts: [u64; BUCKETS],
    /// The bucket index (time / bucket length) of the newest bucket.
    newest: u64,
}

impl Counts {
    /// Moves the window to `bucket`, dropping what aged out.
    fn advance(&mut self, bucket: u64) {
        if bucket <= self.newest {
            return;
        }
        let gone = (bucket - self.newest).min(BUCKETS as u64);
        for i in 1..=gone {
            let slot = ((self.newest + i) % BUCKETS as u64) as usize;
            self.requests[slot] = 0;
            self.accepts[slot] = 0;
        }
        self.newest = bucket;
    }

    fn slot(&self) -> usize {
        (self.newest % BUCKETS as u64) as usize
    }
}

/// Builds an [`AdaptiveThrottle`]: its name (default `upstream`), `K`
/// (default 2, at least 1), the window (default 2 minutes, from 1 s to 1
/// hour) and the highest rejection probability (default 0.9, from 0 to
/// 1).
#[derive(Clone, Debug)]
pub struct AdaptiveThrottleBuilder {
    name: String,
    k: f64,
    window: Duration,
    max_rejection: f64,
    count_refused: bool,
}

impl AdaptiveThrottleBuilder {
    /// The name the throttle is observed by (the upstream's, say): the
    /// `throttle` label of its metrics, its entry in
    /// [`observe`](crate::observe) snapshots (throttles of one name share
    /// their counters there).
    pub fn name(mut self, name: &str) -> Self {
        self.name = name.to_owned();
        self
    }

    /// The multiplier `K`: how many times what the upstream accepts an
    /// instance may send (2: the SRE book's default; lower refuses
    /// sooner).
    pub fn k(mut self, k: f64) -> Self {
        self.k = k;
        self
    }

    /// How far back calls are counted.
    pub fn window(mut self, window: Duration) -> Self {
        self.window = window;
        self
    }

    /// The highest probability a call is refused with, however badly
    /// the upstream does: `1 − max_rejection` of the calls still go out.
    pub fn max_rejection(mut self, max_rejection: f64) -> Self {
        self.max_rejection = max_rejection;
        self
    }

    /// Whether a call refused locally counts as a request (default
    /// `false`): `true` is the SRE book's rule, which holds an upstream
    /// that is short of capacity nearer `K` times what it accepts, and
    /// recovers slower (see [`AdaptiveThrottle`]).
    pub fn count_refused(mut self, count_refused: bool) -> Self {
        self.count_refused = count_refused;
        self
    }

    /// Checks the settings and builds the throttle.
    pub fn build(self) -> Result<AdaptiveThrottle, ConfigError> {
        let invalid = |detail: String| Err(ConfigError::AdaptiveThrottle { detail });
        check_name(&self.name)?;
        if !(self.k.is_finite() && self.k >= 1.0) {
            return invalid(format!("K {} must be a number of at least 1", self.k));
        }
        if !(Duration::from_secs(1)..=Duration::from_secs(3600)).contains(&self.window) {
            return invalid(format!("window {:?} is outside 1 s ..= 1 h", self.window));
        }
        if !(0.0..=1.0).contains(&self.max_rejection) {
            return invalid(format!(
                "max_rejection {} is outside 0 ..= 1",
                self.max_rejection
            ));
        }
        let stats = OutboundStats::throttle(&self.name);
        let shared = Arc::new(Shared {
            name: self.name.as_str().into(),
            stats: stats.clone(),
            k: self.k,
            window: self.window,
            max_rejection: self.max_rejection,
            count_refused: self.count_refused,
            origin: Instant::now(),
            counts: Mutex::new(Counts {
                requests: [0; BUCKETS],
                accepts: [0; BUCKETS],
                newest: 0,
            }),
        });
        let source: Weak<dyn ThrottleSource> = Arc::downgrade(&shared) as Weak<_>;
        stats.live(source);
        Ok(AdaptiveThrottle { shared })
    }
}

/// What a call the throttle let through should report. It is counted
/// when it ends: as a request, accepted or not, once answered; as a
/// request not accepted when dropped unanswered (a timeout outside, a
/// caller gone); as nothing when a layer inside refused it. Calls in
/// flight are in neither count, so that a burst to a fresh throttle is
/// not refused before any answer.
pub(crate) struct Sent {
    throttle: Option<AdaptiveThrottle>,
}

impl Sent {
    /// The upstream's answer: accepted or not.
    pub(crate) fn answered(mut self, accepted: bool) {
        if let Some(throttle) = self.throttle.take() {
            throttle.ended(accepted);
        }
    }

    /// The call never reached the upstream (a layer inside refused it):
    /// it is no request.
    fn withdrawn(mut self) {
        self.throttle = None;
    }
}

impl Drop for Sent {
    fn drop(&mut self) {
        if let Some(throttle) = self.throttle.take() {
            throttle.ended(false);
        }
    }
}

impl AdaptiveThrottle {
    /// Counts a sent call that ended: a request, accepted or not.
    fn ended(&self, accepted: bool) {
        let shared = &*self.shared;
        let mut counts = shared.counts_now();
        let slot = counts.slot();
        counts.requests[slot] += 1;
        if accepted {
            counts.accepts[slot] += 1;
        }
        drop(counts);
        if accepted {
            shared.stats.add(OutboundStats::ACCEPTED);
            metrics::throttle_call(&shared.name, "accepted");
        }
    }
}

impl Shared {
    /// The counts, their window moved to now.
    fn counts_now(&self) -> MutexGuard<'_, Counts> {
        let mut counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        counts.advance(self.bucket());
        counts
    }

    /// The bucket index now.
    fn bucket(&self) -> u64 {
        let length = (self.window / BUCKETS as u32).as_micros().max(1);
        let since = Instant::now()
            .saturating_duration_since(self.origin)
            .as_micros();
        u64::try_from(since / length).unwrap_or(u64::MAX)
    }

    fn probability(&self, counts: &Counts) -> f64 {
        self.figures(counts).0
    }

    /// The rejection probability, and accepts over requests (`None`
    /// without requests).
    fn figures(&self, counts: &Counts) -> (f64, Option<f64>) {
        let requests: u64 = counts.requests.iter().sum();
        let accepts: u64 = counts.accepts.iter().sum();
        let (requests, accepts) = (requests as f64, accepts as f64);
        let p = ((requests - self.k * accepts) / (requests + 1.0)).clamp(0.0, self.max_rejection);
        (p, (requests > 0.0).then(|| (accepts / requests).min(1.0)))
    }
}

impl ThrottleSource for Shared {
    fn now(&self) -> (f64, Option<f64>) {
        self.figures(&self.counts_now())
    }
}

impl AdaptiveThrottle {
    /// Starts building a throttle.
    pub fn builder() -> AdaptiveThrottleBuilder {
        AdaptiveThrottleBuilder {
            name: "upstream".to_owned(),
            k: 2.0,
            window: Duration::from_secs(120),
            max_rejection: 0.9,
            count_refused: false,
        }
    }

    /// The probability a call made now is refused locally.
    pub fn rejection_probability(&self) -> f64 {
        self.shared.probability(&self.shared.counts_now())
    }

    /// Counts a call about to be made: `None` when it is refused
    /// locally, else what to tell once the upstream answered.
    pub(crate) fn admit(&self) -> Option<Sent> {
        let shared = &*self.shared;
        let mut counts = shared.counts_now();
        let (p, accept_ratio) = shared.figures(&counts);
        let sent = fastrand::f64() >= p;
        // A sent call is counted when it ends (see `Sent`).
        if !sent && shared.count_refused {
            let slot = counts.slot();
            counts.requests[slot] += 1;
        }
        drop(counts);
        let (counter, result) = if sent {
            (OutboundStats::SENT, "sent")
        } else {
            (OutboundStats::REFUSED, "refused")
        };
        shared.stats.add(counter);
        metrics::throttle_call(&shared.name, result);
        metrics::throttle_gauges(&shared.name, p, accept_ratio);
        sent.then(|| Sent {
            throttle: Some(self.clone()),
        })
    }
}

impl fmt::Debug for AdaptiveThrottle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdaptiveThrottle")
            .field("name", &self.shared.name)
            .field("k", &self.shared.k)
            .field("window", &self.shared.window)
            .field("rejection_probability", &self.rejection_probability())
            .finish()
    }
}

/// Decides whether the upstream accepted a call, for an
/// [`AdaptiveThrottle`]. A closure `Fn(&Result<Res, E>) -> bool` is one.
pub trait Accepts<Res, E> {
    /// Whether the upstream accepted the call that ended in `result`.
    fn accepted(&self, result: &Result<Res, E>) -> bool;
}

impl<Res, E, F: Fn(&Result<Res, E>) -> bool> Accepts<Res, E> for F {
    fn accepted(&self, result: &Result<Res, E>) -> bool {
        self(result)
    }
}

/// The default [`Accepts`] of HTTP calls: an answer that is neither 5xx
/// nor 429 (HTTP's `RESOURCE_EXHAUSTED`) and whose head carries no gRPC
/// `UNAVAILABLE` (14) or `RESOURCE_EXHAUSTED` (8); an error (a timeout, a
/// refused connection) is no accept.
#[derive(Clone, Copy, Debug, Default)]
pub struct HttpAccepts;

impl<B, E> Accepts<http::Response<B>, E> for HttpAccepts {
    fn accepted(&self, result: &Result<http::Response<B>, E>) -> bool {
        let Ok(response) = result else { return false };
        let status = response.status();
        !status.is_server_error()
            && status != http::StatusCode::TOO_MANY_REQUESTS
            && !grpc_refusal(response.headers())
    }
}

/// Wraps a client in an [`AdaptiveThrottle`]: a call refused locally
/// fails at once with [`RateLimitError::Throttled`] (in a `BoxError`),
/// the inner service never called. Put it outside (before) a waiting
/// [`RateLimitLayer`](crate::RateLimitLayer) so that a refused call
/// never waits for a slot.
///
/// ```
/// use fleetgate::rate_limit::{AdaptiveThrottle, AdaptiveThrottleLayer};
/// use tower::{ServiceBuilder, service_fn};
///
/// let throttle = AdaptiveThrottle::builder().k(2.0).build()?;
/// let client = ServiceBuilder::new()
///     .layer(AdaptiveThrottleLayer::new(throttle))
///     .service(service_fn(|_req: http::Request<String>| async {
///         Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
///     }));
/// # drop(client);
/// # Ok::<(), fleetgate::ConfigError>(())
/// ```
#[derive(Clone, Debug)]
pub struct AdaptiveThrottleLayer<A = HttpAccepts> {
    throttle: AdaptiveThrottle,
    accepts: A,
}

impl AdaptiveThrottleLayer {
    /// Throttles with `throttle`, HTTP answers judged by [`HttpAccepts`].
    pub fn new(throttle: AdaptiveThrottle) -> Self {
        AdaptiveThrottleLayer {
            throttle,
            accepts: HttpAccepts,
        }
    }
}

impl<A> AdaptiveThrottleLayer<A> {
    /// Judges what the upstream accepted with `accepts` instead (any
    /// service: `|result: &Result<Res, E>| ...`).
    pub fn accepts<A2>(self, accepts: A2) -> AdaptiveThrottleLayer<A2> {
        AdaptiveThrottleLayer {
            throttle: self.throttle,
            accepts,
        }
    }
}

impl<S, A: Clone> Layer<S> for AdaptiveThrottleLayer<A> {
    type Service = Throttled<S, A>;

    fn layer(&self, inner: S) -> Self::Service {
        Throttled {
            inner,
            throttle: self.throttle.clone(),
            accepts: self.accepts.clone(),
        }
    }
}

/// The service [`AdaptiveThrottleLayer`] makes.
#[derive(Clone, Debug)]
pub struct Throttled<S, A = HttpAccepts> {
    inner: S,
    throttle: AdaptiveThrottle,
    accepts: A,
}

impl<S, A, Req> Service<Req> for Throttled<S, A>
where
    S: Service<Req>,
    S::Error: Into<BoxError> + 'static,
    A: Accepts<S::Response, S::Error> + Clone,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = ThrottledFuture<S::Future, A>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        let sent = self.throttle.admit();
        ThrottledFuture {
            inner: sent.is_some().then(|| self.inner.call(req)),
            sent,
            accepts: self.accepts.clone(),
        }
    }
}

pin_project! {
    /// The future of a [`Throttled`] call.
    pub struct ThrottledFuture<F, A> {
        // `None`: refused locally.
        #[pin]
        inner: Option<F>,
        sent: Option<Sent>,
        accepts: A,
    }
}

impl<F, A, Res, E> Future for ThrottledFuture<F, A>
where
    F: Future<Output = Result<Res, E>>,
    E: Into<BoxError> + 'static,
    A: Accepts<Res, E>,
{
    type Output = Result<Res, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let Some(inner) = this.inner.as_pin_mut() else {
            return Poll::Ready(Err(RateLimitError::Throttled.into()));
        };
        let result = ready!(inner.poll(cx));
        if let Some(sent) = this.sent.take() {
            match &result {
                Err(err) if is_refusal(err) => sent.withdrawn(),
                _ => sent.answered(this.accepts.accepted(&result)),
            }
        }
        Poll::Ready(result.map_err(Into::into))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn throttle() -> AdaptiveThrottle {
        AdaptiveThrottle::builder().build().unwrap()
    }

    /// Makes `n` calls, the upstream accepting each `accept` says.
    fn calls(t: &AdaptiveThrottle, n: u64, accept: impl Fn(u64) -> bool) -> u64 {
        let mut refused = 0;
        for i in 0..n {
            match t.admit() {
                Some(sent) => sent.answered(accept(i)),
                None => refused += 1,
            }
        }
        refused
    }

    #[tokio::test(start_paused = true)]
    async fn nothing_is_refused_while_the_upstream_accepts_one_in_k() {
        let t = throttle();
        assert_eq!(calls(&t, 10_000, |i| i % 2 == 0), 0);
        assert_eq!(t.rejection_probability(), 0.0);
    }

    #[tokio::test(start_paused = true)]
    async fn calls_in_flight_refuse_nothing() {
        // A burst to a fresh throttle, none answered yet: all sent.
        let t = throttle();
        let burst: Vec<Sent> = (0..50).map(|_| t.admit().expect("sent")).collect();
        assert_eq!(t.rejection_probability(), 0.0);
        for sent in burst {
            sent.answered(true);
        }
        assert_eq!(t.rejection_probability(), 0.0);
        // A dropped call is a request not accepted; a withdrawn one
        // nothing.
        let t = throttle();
        drop(t.admit().expect("sent"));
        assert!((t.rejection_probability() - 0.5).abs() < 1e-9);
        let t = throttle();
        t.admit().expect("sent").withdrawn();
        assert_eq!(t.rejection_probability(), 0.0);
    }

    #[tokio::test(start_paused = true)]
    async fn the_probability_follows_the_formula() {
        // Refused calls counted: 100 requests, 20 accepted: (100 − 2·20) / 101.
        let t = AdaptiveThrottle::builder()
            .count_refused(true)
            .build()
            .unwrap();
        calls(&t, 100, |i| i < 20);
        let p = t.rejection_probability();
        assert!((p - 60.0 / 101.0).abs() < 1e-9, "p {p}");
        // By default the requests are the calls sent.
        let t = throttle();
        let sent = 100.0 - calls(&t, 100, |i| i < 20) as f64;
        let p = t.rejection_probability();
        assert!((p - (sent - 40.0) / (sent + 1.0)).abs() < 1e-9, "p {p}");
    }

    /// A window of seconds of 100 calls, every one failing, then every
    /// one sent accepted: returns how many were sent in the last failing
    /// second, and the seconds until none is refused.
    /// A window of failures, 100 calls a second, then an upstream that
    /// accepts all: how many calls of the last 10 seconds' 1000 were sent
    /// while it failed (a draw per call: one second's 100 were too few to
    /// bound tightly), and how many seconds it took to send all again.
    async fn fail_then_recover(t: &AdaptiveThrottle, window: f64) -> (u64, u64) {
        let mut sent_last = 0;
        let seconds = window as u64;
        for second in 0..seconds {
            let sent = 100 - calls(t, 100, |_| false);
            if second + 10 >= seconds {
                sent_last += sent;
            }
            tokio::time::advance(Duration::from_secs(1)).await;
        }
        let mut back = None;
        for second in 0..(3.0 * window) as u64 {
            if calls(t, 100, |_| true) == 0 && t.rejection_probability() == 0.0 {
                back = Some(second);
                break;
            }
            tokio::time::advance(Duration::from_secs(1)).await;
        }
        (sent_last, back.unwrap_or(u64::MAX))
    }

    #[tokio::test(start_paused = true)]
    async fn a_failing_upstream_gets_a_trickle_then_all_again_within_a_window() {
        let t = throttle();
        let (sent_last, back) = fail_then_recover(&t, 120.0).await;
        // The floor: 10 % of the calls (binomial, 1000 draws: 100 ± 9.5).
        assert!((50..=160).contains(&sent_last), "{sent_last} of 1000 sent");
        // About 27 s; within the window in any case.
        assert!((5..=60).contains(&back), "back after {back} s");
    }

    #[tokio::test(start_paused = true)]
    async fn counting_refused_calls_recovers_in_about_two_windows() {
        let t = AdaptiveThrottle::builder()
            .count_refused(true)
            .build()
            .unwrap();
        let (sent_last, back) = fail_then_recover(&t, 120.0).await;
        assert!((50..=160).contains(&sent_last), "{sent_last} of 1000 sent");
        // About window / K · (1 + ln 10) = 198 s; the last accepts come
        // slower, as the probability nears 0.
        assert!((120..=300).contains(&back), "back after {back} s");
    }

    #[test]
    fn http_accepts_what_is_no_5xx_and_no_grpc_refusal() {
        let of = |status: u16, grpc: Option<&str>| {
            let mut response = http::Response::builder().status(status);
            if let Some(code) = grpc {
                response = response.header("grpc-status", code);
            }
            let result: Result<_, ()> = Ok(response.body(()).unwrap());
            HttpAccepts.accepted(&result)
        };
        assert!(of(200, None) && of(404, None));
        assert!(!of(429, None) && !of(500, None) && !of(503, None));
        assert!(of(200, Some("0")) && of(200, Some("5")));
        assert!(!of(200, Some("14")) && !of(200, Some("8")));
        let failed: Result<http::Response<()>, &str> = Err("timed out");
        assert!(!HttpAccepts.accepted(&failed));
    }

    #[test]
    fn settings_are_checked() {
        assert!(AdaptiveThrottle::builder().k(1.0).build().is_ok());
        for k in [0.0, 0.99, f64::NAN, f64::INFINITY] {
            assert!(AdaptiveThrottle::builder().k(k).build().is_err(), "K {k}");
        }
        for w in [
            Duration::ZERO,
            Duration::from_millis(999),
            Duration::from_secs(3601),
        ] {
            assert!(
                AdaptiveThrottle::builder().window(w).build().is_err(),
                "{w:?}"
            );
        }
        for m in [-0.1, 1.1, f64::NAN] {
            assert!(
                AdaptiveThrottle::builder()
                    .max_rejection(m)
                    .build()
                    .is_err(),
                "{m}"
            );
        }
    }
}
