//! A `tower::retry::Policy` that spends a [`RetryBudget`].

use std::time::Duration;

use tokio::time::Sleep;

use super::budget::{RetryBudget, backoff};
use super::throttle::{Accepts, HttpAccepts};
use crate::error::is_refusal;

/// A [`tower::retry::Policy`] for HTTP clients that retries a failed call
/// up to `max_retries` times, each retry paid from a [`RetryBudget`]
/// shared by the fleet, after a jittered exponential backoff (a random
/// delay up to `backoff · 2^(retry − 1)`, 50 ms by default).
///
/// What failed is what the classifier does not accept (by default
/// [`HttpAccepts`]: a 5xx, a 429, a gRPC `UNAVAILABLE` or
/// `RESOURCE_EXHAUSTED` in the head, or an error such as a timeout).
/// fleetgate's own refusals ([`RateLimitError`](crate::RateLimitError),
/// such as a call the
/// [`AdaptiveThrottleLayer`](super::AdaptiveThrottleLayer) refused, or one
/// a waiting layer could not fit) are never retried, and a first attempt
/// refused that way credits the budget nothing: the ratio is of the first
/// attempts that reached the upstream. A retry refused that way has spent
/// its token, and the call ends with that refusal. A 429 is retried after
/// the backoff, not its `Retry-After`: put a waiting layer with
/// [`upstream_feedback`](crate::RateLimitLayer::upstream_feedback) inside,
/// and the retry waits for the pause. Only retry what is safe to send
/// twice. Requests are cloned for each attempt, so their
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
        let refused = result.as_ref().err().is_some_and(is_refusal);
        // A first attempt the upstream answered (not one refused on the
        // way) credits the budget: once per call, at its first result.
        if self.retries == 0 && !refused {
            self.budget.deposit();
        }
        if refused || self.retries >= self.max_retries || self.accepts.accepted(result) {
            return None;
        }
        if !self.budget.try_withdraw() {
            return None;
        }
        self.retries += 1;
        Some(tokio::time::sleep(backoff(self.backoff, self.retries - 1)))
    }

    fn clone_request(&mut self, req: &http::Request<B>) -> Option<http::Request<B>> {
        let mut clone = http::Request::new(req.body().clone());
        *clone.method_mut() = req.method().clone();
        *clone.uri_mut() = req.uri().clone();
        *clone.version_mut() = req.version();
        *clone.headers_mut() = req.headers().clone();
        *clone.extensions_mut() = req.extensions().clone();
        Some(clone)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};

    use tower::retry::Retry;
    use tower::{Service, ServiceExt, service_fn};

    use super::*;
    use crate::MemoryStore;
    use crate::clock::ManualClock;
    use crate::error::{BoxError, RateLimitError};

    /// A budget of `min` retries and no more: its store's clock stands
    /// still, and first attempts credit nothing.
    fn budget(min: u32) -> RetryBudget {
        let clock = ManualClock::new(Duration::from_secs(100));
        let store = MemoryStore::builder().clock(clock).build();
        RetryBudget::new(Arc::new(store))
            .ratio(0.0)
            .min_per_second(min)
            .build("retry-test")
            .unwrap()
    }

    /// Calls a service answering `answer` through a retry policy: how
    /// many times the service was called.
    async fn attempts(
        policy: RetryPolicy,
        answer: fn() -> Result<http::Response<()>, BoxError>,
    ) -> u32 {
        let calls = Arc::new(AtomicU32::new(0));
        let counted = calls.clone();
        let inner = service_fn(move |_req: http::Request<String>| {
            counted.fetch_add(1, Ordering::SeqCst);
            async move { answer() }
        });
        let mut retry = Retry::new(policy.backoff(Duration::ZERO), inner);
        let request = http::Request::new("body".to_owned());
        let _ = retry.ready().await.unwrap().call(request).await;
        calls.load(Ordering::SeqCst)
    }

    fn unavailable() -> Result<http::Response<()>, BoxError> {
        Ok(http::Response::builder().status(503).body(()).unwrap())
    }

    #[tokio::test]
    async fn failures_are_retried_while_the_budget_and_the_cap_allow() {
        // The budget allows 2 of the 3 retries asked for.
        let b = budget(2);
        assert_eq!(
            attempts(RetryPolicy::new(b.clone(), 3), unavailable).await,
            3
        );
        let stats = b.stats();
        assert_eq!(
            (stats.first_attempts, stats.retries, stats.refused),
            (1, 2, 1)
        );
        // The cap: 1 retry asked for, from a budget of 10.
        let b = budget(10);
        assert_eq!(
            attempts(RetryPolicy::new(b.clone(), 1), unavailable).await,
            2
        );
        assert_eq!(b.stats().retries, 1);
    }

    #[tokio::test]
    async fn successes_and_fleetgates_refusals_are_not_retried() {
        let b = budget(10);
        let ok = || Ok(http::Response::new(()));
        assert_eq!(attempts(RetryPolicy::new(b.clone(), 3), ok).await, 1);
        assert_eq!((b.stats().first_attempts, b.stats().retries), (1, 0));
        // A call refused on the way never reached the upstream: no
        // retry, and no credit.
        let b = budget(10);
        let throttled = || Err(BoxError::from(RateLimitError::Throttled));
        assert_eq!(attempts(RetryPolicy::new(b.clone(), 3), throttled).await, 1);
        assert_eq!((b.stats().first_attempts, b.stats().retries), (0, 0));
        // Any other error is retried.
        let b = budget(10);
        let broken = || Err(BoxError::from("connection reset"));
        assert_eq!(attempts(RetryPolicy::new(b.clone(), 2), broken).await, 3);
    }

    #[tokio::test]
    async fn a_custom_classifier_decides_what_failed() {
        let b = budget(10);
        // 503 accepted: nothing to retry.
        let policy =
            RetryPolicy::new(b, 3).accepts(|_: &Result<http::Response<()>, BoxError>| true);
        let calls = Arc::new(AtomicU32::new(0));
        let counted = calls.clone();
        let inner = service_fn(move |_req: http::Request<String>| {
            counted.fetch_add(1, Ordering::SeqCst);
            async { unavailable() }
        });
        let mut retry = Retry::new(policy, inner);
        let _ = retry
            .ready()
            .await
            .unwrap()
            .call(http::Request::new(String::new()))
            .await;
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }
}
