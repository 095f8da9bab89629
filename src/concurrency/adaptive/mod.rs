//! Adaptive concurrency limits: the settings ([`AdaptiveLimit`], whose
//! docs are the users'), the running limit a limiter shares
//! ([`Adaptive`]), and the algorithms (gradient.rs, aimd.rs).

mod aimd;
mod gradient;

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use self::aimd::{Aimd, AimdConfig};
use self::gradient::{Gradient, GradientConfig};
use crate::error::ConfigError;
use crate::metrics::LimitMetrics;
pub use crate::observe::AdaptiveState;

/// The largest adaptive limit a builder accepts.
const MOST: u64 = 1_000_000;

/// An adaptive concurrency limit: how it moves, and between which
/// bounds. Built by [`AdaptiveLimit::gradient2`] or [`AdaptiveLimit::aimd`]
/// and given to
/// [`ConcurrencyLimiter::adaptive`](crate::concurrency::ConcurrencyLimiter::adaptive).
///
/// The limit finds what the service behind the layer can take, from the
/// latency of its calls. It is this process's own (no store round trip
/// per call): it measures the service this process calls, and caps each
/// key's calls in flight at the current limit, as a fixed maximum does.
/// Key the layer with [`GlobalKey`](crate::key::GlobalKey) for one limit
/// over every call, which is what adaptive concurrency usually means.
///
/// # What counts as a sample
///
/// A call's round trip time runs from its admission to the inner
/// service's response (its head: a streamed body's length says nothing
/// about the service's queue).
///
/// | the call | counts as |
/// |---|---|
/// | answered 1xx–4xx, other than 429 | a success, with its RTT |
/// | answered 5xx or 429, a gRPC capacity error in the head (`grpc-status` 4, 8, 13 or 14: a trailers-only answer), or an error in typed-error mode, no faster than the minimum RTT | a failure, with its RTT (AIMD backs off; Gradient2 takes the RTT) |
/// | such a failure answered faster than the minimum RTT (Gradient2: the one measured; AIMD: the fastest success seen) | nothing: a fast failure (a refusal, a broken dependency) says nothing about capacity |
/// | cancelled (the request future dropped before the response) | nothing |
///
/// ```
/// use std::time::Duration;
/// use fleetgate::concurrency::AdaptiveLimit;
///
/// let limit = AdaptiveLimit::gradient2().min(2).max(64).initial(8).build()?;
/// assert_eq!((limit.min(), limit.max(), limit.initial()), (2, 64, 8));
///
/// let aimd = AdaptiveLimit::aimd()
///     .max(200)
///     .timeout(Duration::from_millis(250))
///     .build()?;
/// assert_eq!(aimd.initial(), 10);
///
/// // Nonsense is refused when built.
/// assert!(AdaptiveLimit::gradient2().min(10).max(5).build().is_err());
/// assert!(AdaptiveLimit::gradient2().smoothing(0.0).build().is_err());
/// assert!(AdaptiveLimit::aimd().smoothing(0.5).build().is_err()); // Gradient2's
/// # Ok::<(), fleetgate::ConfigError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdaptiveLimit {
    algorithm: Algorithm,
    min: u64,
    max: u64,
    initial: u64,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Algorithm {
    Gradient2(GradientConfig),
    Aimd(AimdConfig),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Gradient2,
    Aimd,
}

impl AdaptiveLimit {
    /// Gradient2: the limit follows `min RTT / current RTT`, with the
    /// minimum RTT measured by probing at the lowest limit at the start
    /// and every minute (jittered).
    ///
    /// ```text
    /// gradient = clamp(1.1 · min_rtt / window_rtt, 0.5, 2)
    /// headroom = √limit · clamp((gradient − 1) / 0.1, 0, 1)
    /// target   = gradient · limit + headroom
    /// limit    = clamp((1 − smoothing) · limit + smoothing · target, min, max)
    /// ```
    ///
    /// `window_rtt` is the mean RTT of the calls that ended in the last
    /// sampling window ([`sample_window`](AdaptiveLimitBuilder::sample_window),
    /// 250 ms, and at least 80 calls); the limit settles where the
    /// service's queue adds a tenth to the minimum, and does not grow
    /// while fewer than half of it were in use (on average over the
    /// window's calls). A probe drops the limit to `min` until 40 calls
    /// admitted under it have ended (or 10 sampling windows passed, as
    /// calls that hold their slots can keep them from coming); their mean
    /// RTT is the minimum, and the limit returns to where it was. Between
    /// probes the minimum follows a service that got faster (a window's
    /// mean RTT below it is the new minimum) or slower (a probe starts
    /// once the limit has fallen by a fifth, or to `min`, under a gradient
    /// below 1 while the RTT barely fell: no queue was draining). Settings: `min`, `max`, `initial`,
    /// `smoothing`, `sample_window`, `probe_every`.
    pub fn gradient2() -> AdaptiveLimitBuilder {
        AdaptiveLimitBuilder::new(Kind::Gradient2)
    }

    /// AIMD: one more per limit's worth of good calls, times
    /// [`backoff`](AdaptiveLimitBuilder::backoff) (0.9) on a failure or on
    /// a call slower than [`timeout`](AdaptiveLimitBuilder::timeout)
    /// (5 s), except for calls admitted before the last backoff (the
    /// calls of one bad moment back off once, as TCP does once per
    /// window). Settings: `min`, `max`, `initial`, `backoff`, `timeout`.
    pub fn aimd() -> AdaptiveLimitBuilder {
        AdaptiveLimitBuilder::new(Kind::Aimd)
    }

    /// The lowest the limit goes.
    pub fn min(&self) -> u64 {
        self.min
    }

    /// The highest the limit goes.
    pub fn max(&self) -> u64 {
        self.max
    }

    /// The limit before any call has been measured.
    pub fn initial(&self) -> u64 {
        self.initial
    }

    /// The algorithm's name: `gradient2` or `aimd`.
    pub fn algorithm(&self) -> &'static str {
        match self.algorithm {
            Algorithm::Gradient2(_) => "gradient2",
            Algorithm::Aimd(_) => "aimd",
        }
    }
}

impl fmt::Display for AdaptiveLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} in flight, {} to {}",
            self.algorithm(),
            self.min,
            self.max
        )
    }
}

/// Builds an [`AdaptiveLimit`]; see [`AdaptiveLimit::gradient2`] and
/// [`AdaptiveLimit::aimd`].
#[derive(Clone, Debug)]
#[must_use]
pub struct AdaptiveLimitBuilder {
    kind: Kind,
    min: u64,
    max: u64,
    initial: Option<u64>,
    smoothing: Option<f64>,
    window: Option<Duration>,
    probe_every: Option<Duration>,
    backoff: Option<f64>,
    timeout: Option<Duration>,
}

impl AdaptiveLimitBuilder {
    fn new(kind: Kind) -> Self {
        AdaptiveLimitBuilder {
            kind,
            min: 1,
            max: 1000,
            initial: None,
            smoothing: None,
            window: None,
            probe_every: None,
            backoff: None,
            timeout: None,
        }
    }

    /// The lowest the limit goes (default 1, at least 1).
    pub fn min(mut self, min: u64) -> Self {
        self.min = min;
        self
    }

    /// The highest the limit goes (default 1000, at most 1,000,000).
    pub fn max(mut self, max: u64) -> Self {
        self.max = max;
        self
    }

    /// The limit before any call has been measured (default 10, kept
    /// within `min..=max`; given, it must lie there).
    pub fn initial(mut self, initial: u64) -> Self {
        self.initial = Some(initial);
        self
    }

    /// Gradient2: how far each window moves the limit toward its target,
    /// above 0 and at most 1 (default 0.2: a step change is mostly
    /// followed within about ten windows).
    pub fn smoothing(mut self, smoothing: f64) -> Self {
        self.smoothing = Some(smoothing);
        self
    }

    /// Gradient2: how long a sampling window lasts (default 250 ms, from
    /// 1 ms to 1 minute; a window also waits for 80 calls). Shorter
    /// follows faster, on fewer calls a window.
    pub fn sample_window(mut self, window: Duration) -> Self {
        self.window = Some(window);
        self
    }

    /// Gradient2: how often the minimum RTT is measured again (default
    /// 60 s, each time moved by up to ±25 % at random; longer than the
    /// sampling window, at most a day).
    pub fn probe_every(mut self, every: Duration) -> Self {
        self.probe_every = Some(every);
        self
    }

    /// AIMD: what a failure multiplies the limit by, above 0 and below 1
    /// (default 0.9).
    pub fn backoff(mut self, backoff: f64) -> Self {
        self.backoff = Some(backoff);
        self
    }

    /// AIMD: a call slower than this counts as a failure (default 5 s,
    /// longer than zero).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// Checks the settings and builds the limit.
    pub fn build(self) -> Result<AdaptiveLimit, ConfigError> {
        let invalid = |detail: String| Err(ConfigError::AdaptiveLimit { detail });
        let (min, max) = (self.min, self.max);
        if min == 0 {
            return invalid("min must be at least 1".into());
        }
        if max > MOST {
            return invalid(format!("max {max} is above {MOST}"));
        }
        if min > max {
            return invalid(format!("min {min} is above max {max}"));
        }
        let initial = match self.initial {
            Some(initial) if !(min..=max).contains(&initial) => {
                return invalid(format!(
                    "initial {initial} is outside min {min} ..= max {max}"
                ));
            }
            Some(initial) => initial,
            None => 10u64.clamp(min, max),
        };
        let only =
            |setting: &str, kind: &str| invalid(format!("{setting} is a setting of {kind} only"));
        let algorithm = match self.kind {
            Kind::Gradient2 => {
                if self.backoff.is_some() {
                    return only("backoff", "aimd");
                }
                if self.timeout.is_some() {
                    return only("timeout", "aimd");
                }
                let smoothing = self.smoothing.unwrap_or(0.2);
                if !(smoothing > 0.0 && smoothing <= 1.0) {
                    return invalid(format!(
                        "smoothing {smoothing} is outside 0 < smoothing <= 1"
                    ));
                }
                let window = self.window.unwrap_or(Duration::from_millis(250));
                if !(Duration::from_millis(1)..=Duration::from_secs(60)).contains(&window) {
                    return invalid(format!(
                        "sample window {window:?} is outside 1 ms ..= 1 min"
                    ));
                }
                let probe_every = self.probe_every.unwrap_or(Duration::from_secs(60));
                if probe_every <= window || probe_every > Duration::from_secs(86_400) {
                    return invalid(format!(
                        "probe_every {probe_every:?} must be longer than the sample window ({window:?}) and at most a day"
                    ));
                }
                Algorithm::Gradient2(GradientConfig {
                    smoothing,
                    window,
                    probe_every,
                })
            }
            Kind::Aimd => {
                if self.smoothing.is_some() {
                    return only("smoothing", "gradient2");
                }
                if self.window.is_some() {
                    return only("sample_window", "gradient2");
                }
                if self.probe_every.is_some() {
                    return only("probe_every", "gradient2");
                }
                let backoff = self.backoff.unwrap_or(0.9);
                if !(backoff > 0.0 && backoff < 1.0) {
                    return invalid(format!("backoff {backoff} is outside 0 < backoff < 1"));
                }
                let timeout = self.timeout.unwrap_or(Duration::from_secs(5));
                if timeout.is_zero() {
                    return invalid("timeout must be longer than zero".into());
                }
                Algorithm::Aimd(AimdConfig { backoff, timeout })
            }
        };
        Ok(AdaptiveLimit {
            algorithm,
            min,
            max,
            initial,
        })
    }
}

/// How a call ended, for the limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    Succeeded,
    Failed,
    /// Says nothing about capacity.
    Ignore,
}

impl Verdict {
    /// The verdict on an HTTP answer: 5xx and 429 failed, and so did a
    /// gRPC answer whose head carries (trailers-only) `grpc-status`
    /// DEADLINE_EXCEEDED (4), RESOURCE_EXHAUSTED (8), INTERNAL (13) or
    /// UNAVAILABLE (14): gRPC answers its errors with HTTP 200.
    pub(crate) fn of_response<B>(response: &http::Response<B>) -> Self {
        let status = response.status();
        let grpc_failed = || {
            response
                .headers()
                .get("grpc-status")
                .is_some_and(|code| matches!(code.as_bytes(), b"4" | b"8" | b"13" | b"14"))
        };
        if status.is_server_error()
            || status == http::StatusCode::TOO_MANY_REQUESTS
            || grpc_failed()
        {
            Verdict::Failed
        } else {
            Verdict::Succeeded
        }
    }
}

/// One call's measurement.
#[derive(Clone, Copy, Debug)]
pub(super) struct Sample {
    /// When the call was admitted.
    started: Instant,
    rtt: Duration,
    /// Calls in flight when it was admitted, itself included.
    in_flight: u64,
    verdict: Verdict,
}

#[derive(Debug)]
enum Controller {
    Gradient2(Gradient),
    Aimd(Aimd),
}

/// A running adaptive limit, shared by a limiter's clones.
pub(crate) struct Adaptive {
    config: AdaptiveLimit,
    /// The limit enforced, read on every acquire.
    limit: AtomicU64,
    in_flight: AtomicU64,
    controller: Mutex<Controller>,
    /// The last gradient, as `f64` bits (NaN: none yet).
    gradient: AtomicU64,
    metrics: LimitMetrics,
}

impl fmt::Debug for Adaptive {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Adaptive")
            .field("config", &self.config)
            .field("limit", &self.limit())
            .finish_non_exhaustive()
    }
}

/// Calls' RTTs are read on tokio's clock, so that tests on paused time
/// see the time they advance.
fn now() -> Instant {
    tokio::time::Instant::now().into_std()
}

impl Adaptive {
    pub(crate) fn new(config: AdaptiveLimit, metrics: LimitMetrics) -> Arc<Self> {
        let controller = match config.algorithm {
            Algorithm::Gradient2(g) => Controller::Gradient2(Gradient::new(
                g,
                config.min,
                config.max,
                config.initial,
                now(),
            )),
            Algorithm::Aimd(a) => {
                Controller::Aimd(Aimd::new(a, config.min, config.max, config.initial))
            }
        };
        let adaptive = Arc::new(Adaptive {
            config,
            limit: AtomicU64::new(config.initial),
            in_flight: AtomicU64::new(0),
            controller: Mutex::new(controller),
            gradient: AtomicU64::new(f64::NAN.to_bits()),
            metrics,
        });
        let limit = enforced(&adaptive.lock(), config.min);
        adaptive.limit.store(limit, Ordering::Relaxed);
        adaptive.metrics.adaptive(limit, None, None);
        adaptive
    }

    /// The limit to enforce now.
    pub(crate) fn limit(&self) -> u64 {
        self.limit.load(Ordering::Relaxed)
    }

    fn lock(&self) -> MutexGuard<'_, Controller> {
        self.controller.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Starts measuring an admitted call; the measurement is taken when
    /// [`AdaptiveCall::finish`] is called, and none if it is dropped.
    pub(crate) fn start(self: &Arc<Self>) -> AdaptiveCall {
        let in_flight = self.in_flight.fetch_add(1, Ordering::Relaxed) + 1;
        AdaptiveCall {
            adaptive: self.clone(),
            started: now(),
            in_flight,
        }
    }

    /// Takes a sample; returns by how much the enforced limit rose (to
    /// wake as many queued callers).
    fn sample(&self, sample: Sample) -> u64 {
        let at = now();
        let mut controller = self.lock();
        let min_rtt = match &*controller {
            Controller::Gradient2(g) => g.min_rtt(),
            Controller::Aimd(a) => a.min_rtt(),
        };
        // A failure faster than the service's minimum RTT did not reach
        // its queue.
        if sample.verdict == Verdict::Failed && min_rtt.is_some_and(|min| sample.rtt < min) {
            return 0;
        }
        let gradient = match &mut *controller {
            Controller::Gradient2(g) => g.sample(&sample, at),
            Controller::Aimd(a) => {
                a.sample(&sample, at);
                None
            }
        };
        if let Some(gradient) = gradient {
            self.gradient.store(gradient.to_bits(), Ordering::Relaxed);
        }
        let limit = enforced(&controller, self.config.min);
        let min_rtt = match &*controller {
            Controller::Gradient2(g) => g.min_rtt(),
            Controller::Aimd(a) => a.min_rtt(),
        };
        drop(controller);
        let before = self.limit.swap(limit, Ordering::Relaxed);
        if before != limit || gradient.is_some() {
            self.metrics.adaptive(limit, min_rtt, gradient);
        }
        limit.saturating_sub(before)
    }

    pub(crate) fn state(&self) -> AdaptiveState {
        let controller = self.lock();
        let (min_rtt, probing) = match &*controller {
            Controller::Gradient2(g) => (g.min_rtt(), g.probing()),
            Controller::Aimd(a) => (a.min_rtt(), false),
        };
        drop(controller);
        let gradient = f64::from_bits(self.gradient.load(Ordering::Relaxed));
        AdaptiveState {
            algorithm: self.config.algorithm(),
            limit: self.limit(),
            in_flight: self.in_flight.load(Ordering::Relaxed),
            min_rtt_us: min_rtt.map(|d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX)),
            gradient: (!gradient.is_nan()).then_some(gradient),
            probing,
        }
    }
}

/// The whole calls the controller's limit allows, never below `min`.
fn enforced(controller: &Controller, min: u64) -> u64 {
    let limit = match controller {
        Controller::Gradient2(g) => g.limit(),
        Controller::Aimd(a) => a.limit(),
    };
    (limit.floor() as u64).max(min)
}

/// An admitted call being measured; dropped without
/// [`finish`](Self::finish) (cancelled), it counts as no sample.
pub(crate) struct AdaptiveCall {
    adaptive: Arc<Adaptive>,
    started: Instant,
    in_flight: u64,
}

impl AdaptiveCall {
    /// The call was answered: takes its sample. Returns by how much the
    /// limit rose.
    pub(crate) fn finish(self, verdict: Verdict) -> u64 {
        let sample = Sample {
            started: self.started,
            rtt: now().saturating_duration_since(self.started),
            in_flight: self.in_flight,
            verdict,
        };
        self.adaptive.sample(sample)
    }
}

impl Drop for AdaptiveCall {
    fn drop(&mut self) {
        self.adaptive.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

impl fmt::Debug for AdaptiveCall {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdaptiveCall")
            .field("in_flight", &self.in_flight)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn fast_failures_and_cancelled_calls_are_no_samples() {
        let limit = AdaptiveLimit::aimd()
            .min(1)
            .max(100)
            .initial(10)
            .timeout(Duration::from_secs(1))
            .build()
            .unwrap();
        let adaptive = Adaptive::new(limit, LimitMetrics::new(Arc::from("t")));
        let took = |ms| tokio::time::advance(Duration::from_millis(ms));
        // A success in 20 ms: the fastest seen.
        let call = adaptive.start();
        took(20).await;
        call.finish(Verdict::Succeeded);
        // A failure in 5 ms did not reach the service's queue.
        let call = adaptive.start();
        took(5).await;
        call.finish(Verdict::Failed);
        assert_eq!(adaptive.limit(), 10);
        // Cancelled: nothing measured, nothing left in flight.
        let call = adaptive.start();
        took(500).await;
        drop(call);
        assert_eq!(adaptive.limit(), 10);
        assert_eq!(adaptive.state().in_flight, 0);
        // A failure no faster than the minimum backs AIMD off.
        let call = adaptive.start();
        took(30).await;
        call.finish(Verdict::Failed);
        assert_eq!(adaptive.limit(), 9);
    }

    #[test]
    fn verdicts_of_responses() {
        let of = |status: u16, grpc: Option<&str>| {
            let mut response = http::Response::builder().status(status);
            if let Some(code) = grpc {
                response = response.header("grpc-status", code);
            }
            Verdict::of_response(&response.body(()).unwrap())
        };
        assert_eq!(of(200, None), Verdict::Succeeded);
        assert_eq!(of(404, None), Verdict::Succeeded);
        assert_eq!(of(429, None), Verdict::Failed);
        assert_eq!(of(502, None), Verdict::Failed);
        assert_eq!(of(200, Some("0")), Verdict::Succeeded);
        assert_eq!(of(200, Some("5")), Verdict::Succeeded); // NOT_FOUND
        for code in ["4", "8", "13", "14"] {
            assert_eq!(of(200, Some(code)), Verdict::Failed, "grpc-status {code}");
        }
        assert_eq!(of(200, Some("14x")), Verdict::Succeeded);
    }
}
