//! Upstream feedback: when the API behind a client answers "slow down",
//! hold the whole fleet back for that identity, not just the caller that
//! heard it.

use std::time::{Duration, SystemTime};

use http::StatusCode;
use http::header::RETRY_AFTER;

use super::retry_after::parse_retry_after;

/// Reads, from an inner service's response, how long the upstream asked
/// every caller of that identity to hold off.
///
/// When [`pause`](Self::pause) returns a duration, the layer records it in
/// the store ([`Limiter::defer`](crate::Limiter::defer)) before handing the
/// response back: from then on, the identity's next slot is no earlier than
/// that, for every instance sharing the store. Implemented by [`RetryAfter`]
/// for `http::Response`, by the default (which never pauses), and by any
/// `Fn(&Res) -> Option<Duration> + Clone`, for responses of other types.
pub trait UpstreamFeedback<Res>: Clone + Send + Sync + 'static {
    /// How long from now the identity should pause, judging by `response`;
    /// `None` (or zero) to carry on.
    fn pause(&self, response: &Res) -> Option<Duration>;

    /// Whether this can ever ask for a pause; when not, the layer does not
    /// keep each request's key around for it.
    fn is_enabled(&self) -> bool {
        true
    }
}

/// No upstream feedback: the default.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoFeedback;

impl<Res> UpstreamFeedback<Res> for NoFeedback {
    fn pause(&self, _response: &Res) -> Option<Duration> {
        None
    }

    fn is_enabled(&self) -> bool {
        false
    }
}

impl<Res, F> UpstreamFeedback<Res> for F
where
    F: Fn(&Res) -> Option<Duration> + Clone + Send + Sync + 'static,
{
    fn pause(&self, response: &Res) -> Option<Duration> {
        self(response)
    }
}

/// Pauses an identity when the upstream answers `429 Too Many Requests` or
/// `503 Service Unavailable` with a `Retry-After` header: delay-seconds
/// (`120`) or an HTTP date in any form RFC 9110 allows (a date in the past
/// is no pause; a value that is neither is ignored).
///
/// The pause is capped ([`max_pause`](Self::max_pause), 10 minutes by
/// default) so that a broken or hostile upstream cannot stop the fleet for
/// years. A 429 or 503 without a usable `Retry-After` pauses nothing unless
/// a [`fallback`](Self::fallback) is set. An HTTP date is compared with this
/// machine's clock.
///
/// ```
/// use std::time::Duration;
/// use fleetgate::rate_limit::{RetryAfter, UpstreamFeedback};
///
/// let feedback = RetryAfter::new().max_pause(Duration::from_secs(60));
/// let slow_down = http::Response::builder()
///     .status(429)
///     .header("retry-after", "3600")
///     .body(())
///     .unwrap();
/// assert_eq!(feedback.pause(&slow_down), Some(Duration::from_secs(60)));
/// let fine = http::Response::new(());
/// assert_eq!(feedback.pause(&fine), None);
/// ```
#[derive(Clone, Copy, Debug)]
pub struct RetryAfter {
    max_pause: Duration,
    fallback: Option<Duration>,
}

impl RetryAfter {
    /// Pauses on 429 and 503 with `Retry-After`, for at most 10 minutes.
    pub const fn new() -> Self {
        RetryAfter {
            max_pause: Duration::from_secs(600),
            fallback: None,
        }
    }

    /// The longest pause any one response can ask for.
    pub const fn max_pause(mut self, max: Duration) -> Self {
        self.max_pause = max;
        self
    }

    /// Pauses for this long on a 429 or 503 that has no usable
    /// `Retry-After` (default: no pause).
    pub const fn fallback(mut self, pause: Duration) -> Self {
        self.fallback = Some(pause);
        self
    }
}

impl Default for RetryAfter {
    fn default() -> Self {
        RetryAfter::new()
    }
}

impl<B> UpstreamFeedback<http::Response<B>> for RetryAfter {
    fn pause(&self, response: &http::Response<B>) -> Option<Duration> {
        let status = response.status();
        if status != StatusCode::TOO_MANY_REQUESTS && status != StatusCode::SERVICE_UNAVAILABLE {
            return None;
        }
        let asked = response
            .headers()
            .get(RETRY_AFTER)
            .and_then(|value| parse_retry_after(value.as_bytes(), SystemTime::now()));
        asked
            .or(self.fallback)
            .map(|pause| pause.min(self.max_pause))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn response(status: u16, retry_after: Option<&[u8]>) -> http::Response<()> {
        let mut builder = http::Response::builder().status(status);
        if let Some(value) = retry_after {
            builder = builder.header(RETRY_AFTER, value);
        }
        builder.body(()).unwrap()
    }

    #[test]
    fn pauses_only_on_429_and_503_with_retry_after() {
        let f = RetryAfter::new();
        assert_eq!(
            f.pause(&response(429, Some(b"2"))),
            Some(Duration::from_secs(2))
        );
        assert_eq!(
            f.pause(&response(503, Some(b"1"))),
            Some(Duration::from_secs(1))
        );
        assert_eq!(f.pause(&response(200, Some(b"2"))), None);
        assert_eq!(f.pause(&response(500, Some(b"2"))), None);
        assert_eq!(f.pause(&response(429, None)), None);
        assert_eq!(f.pause(&response(429, Some(b"soon"))), None);
        let f = f.fallback(Duration::from_secs(5));
        assert_eq!(
            f.pause(&response(429, Some(b"soon"))),
            Some(Duration::from_secs(5))
        );
        assert_eq!(
            f.pause(&response(429, Some(b"99999999999999999999999"))),
            Some(Duration::from_secs(600))
        );
    }

    #[test]
    fn closures_and_no_feedback() {
        let f = |res: &u16| (*res == 429).then_some(Duration::from_secs(1));
        assert_eq!(f.pause(&429), Some(Duration::from_secs(1)));
        assert!(UpstreamFeedback::<u16>::is_enabled(&f));
        assert!(!UpstreamFeedback::<u16>::is_enabled(&NoFeedback));
        assert_eq!(NoFeedback.pause(&429u16), None);
    }
}
