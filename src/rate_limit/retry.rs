//! A `tower::retry::Policy` that spends a [`RetryBudget`].

use std::any::Any;
use std::time::Duration;

use tokio::time::Sleep;

use super::budget::RetryBudget;
use super::throttle::{Accepts, HttpAccepts};
use crate::error::{BoxError, RateLimitError};

/// A [`tower::retry::Policy`] for HTTP clients that retries a failed call
/// up to `max_retries` times, each retry paid from a [`RetryBudget`]
/// shared by the fleet, after a jittered exponential backoff (a random
/// delay up to `backoff · 2^(retry − 1)`, 50 ms by default).
///
/// What failed is what the classifier does not accept (by default
/// [`HttpAccepts`]: a 5xx, a 429, a gRPC `UNAVAILABLE` or
/// `RESOURCE_EXHAUSTED` in the head, or an error such as a timeout).
/// fleetgate's own refusals ([`RateLimitError`], such as a call the
/// [`AdaptiveThrottleLayer`](super::AdaptiveThrottleLayer) refused, or one
/// a waiting layer could not fit) are never retried. Only retry what is
/// safe to send twice. Requests are cloned for each attempt, so their
/// bodies must be `Clone` (`Full<Bytes>`, `String`, `Empty`).
///
/// Put it outside the [`AdaptiveThrottleLayer`](super::AdaptiveThrottleLayer)
/// and the waiting [`RateLimitLayer`](crate::RateLimitLayer): each attempt
/// is throttled, waits its turn, and is counted by the upstream's limits.
///
/// ```
/// use std::sync::Arc;
/// use fleetgate::MemoryStore;
/// use fleetgate::rate_limit::{RetryBudget, RetryPolicy};
/// use tower::retry::RetryLayer;
/// use tower::{ServiceBuilder, service_fn};
///
/// let budget = RetryBudget::new(Arc::new(MemoryStore::new())).build("upstream")?;
/// let client = ServiceBuilder::new()
///     .layer(RetryLayer::new(RetryPolicy::new(budget, 3)))
///     .service(service_fn(|_req: http::Request<String>| async {
///         Ok::<_, fleetgate::BoxError>(http::Response::new(String::new()))
///     }));
/// # drop(client);
/// # Ok::<(), fleetgate::ConfigError>(())
/// ```
#[derive(Clone, Debug)]
pub struct RetryPolicy<A = HttpAccepts> {
    budget: RetryBudget,
    max_retries: u32,
    backoff: Duration,
    accepts: A,
    /// Retries made so far for this call (each call gets its own clone).
    retries: u32,
}

impl RetryPolicy {
    /// Retries up to `max_retries` times from `budget`.
    pub fn new(budget: RetryBudget, max_retries: u32) -> Self {
        RetryPolicy {
            budget,
            max_retries,
            backoff: Duration::from_millis(50),
            accepts: HttpAccepts,
            retries: 0,
        }
    }
}

impl<A> RetryPolicy<A> {
    /// Judges which answers failed with `accepts` instead: a call is
    /// retried when `accepts` does not accept it.
    pub fn accepts<A2>(self, accepts: A2) -> RetryPolicy<A2> {
        RetryPolicy {
            budget: self.budget,
            max_retries: self.max_retries,
            backoff: self.backoff,
            accepts,
            retries: self.retries,
        }
    }

    /// The longest delay before the first retry; each further retry
    /// doubles it (the delay itself is drawn at random below it).
    pub fn backoff(mut self, backoff: Duration) -> Self {
        self.backoff = backoff;
        self
    }

    fn delay(&self) -> Duration {
        let ceiling = self
            .backoff
            .saturating_mul(1 << self.retries.saturating_sub(1).min(16));
        ceiling.mul_f64(fastrand::f64())
    }
}

/// Whether `err` is one of fleetgate's own refusals, bare or boxed.
fn is_refusal<E: 'static>(err: &E) -> bool {
    let any = err as &dyn Any;
    any.is::<RateLimitError>()
        || any
            .downcast_ref::<BoxError>()
            .is_some_and(|boxed| boxed.is::<RateLimitError>())
}

impl<B, Res, E, A> tower::retry::Policy<http::Request<B>, Res, E> for RetryPolicy<A>
where
    B: Clone,
    E: 'static,
    A: Accepts<Res, E>,
{
    type Future = Sleep;

    fn retry(
        &mut self,
        _req: &mut http::Request<B>,
        result: &mut Result<Res, E>,
    ) -> Option<Self::Future> {
        if self.retries >= self.max_retries || self.accepts.accepted(result) {
            return None;
        }
        if let Err(err) = result
            && is_refusal(err)
        {
            return None;
        }
        if !self.budget.try_withdraw() {
            return None;
        }
        self.retries += 1;
        Some(tokio::time::sleep(self.delay()))
    }

    fn clone_request(&mut self, req: &http::Request<B>) -> Option<http::Request<B>> {
        if self.retries == 0 {
            self.budget.deposit();
        }
        let mut clone = http::Request::new(req.body().clone());
        *clone.method_mut() = req.method().clone();
        *clone.uri_mut() = req.uri().clone();
        *clone.version_mut() = req.version();
        *clone.headers_mut() = req.headers().clone();
        *clone.extensions_mut() = req.extensions().clone();
        Some(clone)
    }
}
