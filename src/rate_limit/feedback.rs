//! Upstream feedback: when the API behind a client answers "slow down",
//! hold the whole fleet back for that identity, not just the caller that
//! heard it.

use std::time::{Duration, SystemTime};

use http::header::RETRY_AFTER;
use http::{HeaderMap, StatusCode};

use super::quota::{UpstreamQuota, quotas, tightest};
use super::retry_after::parse_retry_after;
use super::trailers::TrailerReader;

/// Reads, from an inner service's response, how long the upstream asked
/// every caller of that identity to hold off.
///
/// When [`pause`](Self::pause) returns a duration, the layer records it in
/// the store ([`Limiter::defer`](crate::Limiter::defer)) before handing the
/// response back: from then on, the identity's next slot is no earlier than
/// that, for every instance sharing the store; [`quota`](Self::quota)
/// likewise records what the upstream says is left. Implemented by
/// [`RetryAfter`] and [`UpstreamHeaders`] for `http::Response`, by the
/// default (which never pauses), and by any
/// `Fn(&Res) -> Option<Duration> + Clone`, for responses of other types.
pub trait UpstreamFeedback<Res>: Clone + Send + Sync + 'static {
    /// How long from now the identity should pause, judging by `response`;
    /// `None` (or zero) to carry on.
    fn pause(&self, response: &Res) -> Option<Duration>;

    /// What the upstream says is left of its limit, judging by `response`:
    /// when this returns a quota, the layer records it in the store
    /// ([`Limiter::align`](crate::Limiter::align)) before handing the
    /// response back, so that the fleet admits at most that many more calls
    /// of the identity before the upstream's reset. `None` (the default)
    /// states nothing. A [`pause`](Self::pause) of the same response is
    /// recorded instead when there is one, lengthened to the quota's reset
    /// if the quota has nothing left.
    fn quota(&self, response: &Res) -> Option<UpstreamQuota> {
        let _ = response;
        None
    }

    /// Whether this can ever ask for a pause; when not, the layer does not
    /// keep each request's key around for it.
    fn is_enabled(&self) -> bool {
        true
    }

    /// How to read the trailers that end a response's body (a gRPC status
    /// sent after a streamed reply). Sealed (its type cannot be named
    /// outside this crate): only [`RetryAfter`] and [`UpstreamHeaders`]
    /// with a `RetryAfter` read trailers, in tonic's `Body` (feature
    /// `grpc`); a feedback of your own does not.
    #[doc(hidden)]
    fn trailers(&self) -> Option<TrailerReader> {
        None
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
/// A gRPC upstream's refusal counts too: a trailers-only response (the
/// status in its headers, as fleetgate's own [`grpc`](crate::RateLimitLayer::grpc)
/// refusals and most servers' early refusals are) with `grpc-status`
/// `RESOURCE_EXHAUSTED` (8) or `UNAVAILABLE` (14) pauses for its
/// `grpc-retry-pushback-ms`, else its `Retry-After`. Such a status in the
/// trailers after a streamed reply pauses too, when the trailers arrive,
/// in tonic's `Body` (feature `grpc`); see the [gRPC guide](crate::grpc).
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
        let headers = response.headers();
        let status = response.status();
        if status != StatusCode::TOO_MANY_REQUESTS && status != StatusCode::SERVICE_UNAVAILABLE {
            return self.grpc_pause(headers);
        }
        self.pause_for(headers.get(RETRY_AFTER))
    }

    fn trailers(&self) -> Option<TrailerReader> {
        Some(TrailerReader(*self))
    }
}

impl RetryAfter {
    /// A gRPC refusal's pause: its pushback, else its `Retry-After`, else
    /// the fallback, capped; `None` when `headers` are no gRPC refusal.
    pub(crate) fn grpc_pause(&self, headers: &HeaderMap) -> Option<Duration> {
        if !grpc_refusal(headers) {
            return None;
        }
        match grpc_pushback(headers) {
            Some(pushback) => Some(pushback.min(self.max_pause)),
            None => self.pause_for(headers.get(RETRY_AFTER)),
        }
    }

    /// The pause a refusal with this `Retry-After` asks for: its own, else
    /// the fallback; capped.
    fn pause_for(&self, retry_after: Option<&http::HeaderValue>) -> Option<Duration> {
        retry_after
            .and_then(|value| parse_retry_after(value.as_bytes(), SystemTime::now()))
            .or(self.fallback)
            .map(|pause| pause.min(self.max_pause))
    }
}

/// Whether `headers` (a trailers-only response's, or trailers) end a gRPC
/// call with `RESOURCE_EXHAUSTED` (8) or `UNAVAILABLE` (14), gRPC's 429
/// and 503.
pub(super) fn grpc_refusal(headers: &HeaderMap) -> bool {
    headers
        .get("grpc-status")
        .is_some_and(|code| code == "8" || code == "14")
}

/// `grpc-retry-pushback-ms`, when it is a whole number of milliseconds. A
/// negative value (the server's "do not retry") or anything else is no
/// pause of its own.
fn grpc_pushback(headers: &HeaderMap) -> Option<Duration> {
    let value = headers.get("grpc-retry-pushback-ms")?.to_str().ok()?;
    value.parse::<u64>().ok().map(Duration::from_millis)
}

/// Reads the upstream's own rate-limit headers on every response, and
/// brings the fleet's budget for the identity in line with what they say
/// is left ([`Limiter::align`](crate::Limiter::align)), so that a fleet of
/// workers does not earn a 429 even when the upstream's limit is unknown to
/// the policy or changes. Also pauses on a 429 or 503 with `Retry-After`,
/// as [`RetryAfter`] does (replace it with [`retry_after`](Self::retry_after)).
///
/// Read, in this order, every one present (the tightest, fewest calls
/// left, is recorded):
///
/// | header | example | reset |
/// |---|---|---|
/// | `RateLimit` (IETF draft) | `"default";r=50;t=30` (each item of the list) | seconds |
/// | `RateLimit` (older drafts) | `limit=100, remaining=50, reset=30` | seconds |
/// | `RateLimit-Remaining`, `RateLimit-Reset` | `50`, `30` | seconds |
/// | `X-RateLimit-Remaining`, `X-RateLimit-Reset` (or `-Reset-After`) | `12`, `1700000042` | a Unix time from 10^9 on (GitHub), else seconds, fractions allowed |
/// | `X-RateLimit-Remaining-Requests`, `-Reset-Requests` (OpenAI) | `59`, `6m0s` | a Go duration |
///
/// `RateLimit-Policy` and OpenAI's `-tokens` pair state the limit or a
/// budget in tokens, not calls left, and are not read. A remaining without
/// a usable reset (or the reverse), and any value that is not a plain
/// non-negative number (or duration), are ignored; nothing here panics. A
/// remaining too large for a `u64` saturates (plenty left). Each reset is
/// lengthened by [`margin`](Self::margin) (for upstreams that round it down,
/// or whose clock runs behind; none by default) and then capped at
/// [`max_reset`](Self::max_reset) (10 minutes by default), so that a broken
/// or hostile upstream cannot stop the fleet for years.
///
/// ```
/// use std::time::Duration;
/// use fleetgate::rate_limit::{UpstreamFeedback, UpstreamHeaders, UpstreamQuota};
///
/// let feedback = UpstreamHeaders::new();
/// let github = http::Response::builder()
///     .header("x-ratelimit-remaining", "0")
///     .header("x-ratelimit-reset", "30")
///     .body(())
///     .unwrap();
/// assert_eq!(
///     feedback.quota(&github),
///     Some(UpstreamQuota { remaining: 0, reset: Duration::from_secs(30) })
/// );
/// let ietf = http::Response::builder()
///     .header("ratelimit", "\"default\";r=9;t=3600")
///     .body(())
///     .unwrap();
/// // Capped at 10 minutes.
/// assert_eq!(
///     feedback.quota(&ietf),
///     Some(UpstreamQuota { remaining: 9, reset: Duration::from_secs(600) })
/// );
/// assert_eq!(feedback.quota(&http::Response::new(())), None);
/// ```
#[derive(Clone, Copy, Debug)]
pub struct UpstreamHeaders {
    retry_after: Option<RetryAfter>,
    max_reset: Duration,
    margin: Duration,
}

impl UpstreamHeaders {
    /// Reads every style of rate-limit header, and `Retry-After` on a 429
    /// or 503; resets capped at 10 minutes.
    pub const fn new() -> Self {
        UpstreamHeaders {
            retry_after: Some(RetryAfter::new()),
            max_reset: Duration::from_secs(600),
            margin: Duration::ZERO,
        }
    }

    /// The longest reset any one response can state (default 10 minutes).
    /// An upstream with longer windows (GitHub's hour) needs more to be
    /// followed to its reset; with less, the fleet holds back until the
    /// cap, then reads the upstream's next answer.
    pub const fn max_reset(mut self, max: Duration) -> Self {
        self.max_reset = max;
        self
    }

    /// Added to every reset read (default none): for an upstream that
    /// rounds its reset down to whole seconds, or one whose clock (for
    /// Unix-time resets) may run behind this machine's.
    pub const fn margin(mut self, margin: Duration) -> Self {
        self.margin = margin;
        self
    }

    /// How 429 and 503 responses with `Retry-After` pause the identity
    /// (default [`RetryAfter::new`]); `None` to read the rate-limit
    /// headers only.
    pub const fn retry_after(mut self, retry_after: Option<RetryAfter>) -> Self {
        self.retry_after = retry_after;
        self
    }
}

impl Default for UpstreamHeaders {
    fn default() -> Self {
        UpstreamHeaders::new()
    }
}

impl<B> UpstreamFeedback<http::Response<B>> for UpstreamHeaders {
    fn pause(&self, response: &http::Response<B>) -> Option<Duration> {
        self.retry_after.as_ref()?.pause(response)
    }

    fn trailers(&self) -> Option<TrailerReader> {
        self.retry_after.map(TrailerReader)
    }

    fn quota(&self, response: &http::Response<B>) -> Option<UpstreamQuota> {
        let found = quotas(response.headers(), SystemTime::now());
        let quota = tightest(&found)?;
        Some(UpstreamQuota {
            remaining: quota.remaining,
            reset: quota.reset.saturating_add(self.margin).min(self.max_reset),
        })
    }
}

/// What the layer records for one response: a pause, or a quota; `None`
/// when the response asks for nothing. A pause wins (the upstream refused
/// this call, whatever it says is left), lengthened to the quota's reset
/// when the quota has nothing left either.
pub(crate) fn hold_of<Res, F: UpstreamFeedback<Res>>(
    feedback: &F,
    response: &Res,
) -> Option<UpstreamQuota> {
    let pause = feedback.pause(response).filter(|pause| !pause.is_zero());
    let quota = feedback.quota(response);
    match (pause, quota) {
        (Some(pause), Some(q)) if q.remaining == 0 => Some(UpstreamQuota {
            remaining: 0,
            reset: pause.max(q.reset),
        }),
        (Some(pause), _) => Some(UpstreamQuota {
            remaining: 0,
            reset: pause,
        }),
        // Nothing left, but already reset: nothing to hold back.
        (None, Some(q)) if q.reset.is_zero() => None,
        (None, quota) => quota,
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

    fn grpc(code: &str, pushback: Option<&str>, retry_after: Option<&str>) -> http::Response<()> {
        let mut builder = http::Response::builder().header("grpc-status", code);
        if let Some(ms) = pushback {
            builder = builder.header("grpc-retry-pushback-ms", ms);
        }
        if let Some(secs) = retry_after {
            builder = builder.header(RETRY_AFTER, secs);
        }
        builder.body(()).unwrap()
    }

    #[test]
    fn pauses_on_grpc_refusals_with_pushback() {
        let f = RetryAfter::new().max_pause(Duration::from_secs(60));
        let ms = Duration::from_millis;
        assert_eq!(f.pause(&grpc("8", Some("1500"), Some("2"))), Some(ms(1500)));
        assert_eq!(f.pause(&grpc("14", Some("250"), None)), Some(ms(250)));
        // Capped; without a pushback, the Retry-After.
        assert_eq!(
            f.pause(&grpc("8", Some("99999999"), None)),
            Some(ms(60_000))
        );
        assert_eq!(f.pause(&grpc("8", None, Some("3"))), Some(ms(3000)));
        // "Do not retry", nonsense, another status: no pause of their own.
        assert_eq!(f.pause(&grpc("8", Some("-1"), None)), None);
        assert_eq!(f.pause(&grpc("8", Some("soon"), None)), None);
        assert_eq!(f.pause(&grpc("0", Some("1500"), None)), None);
        assert_eq!(f.pause(&grpc("13", Some("1500"), None)), None);
        let f = f.fallback(ms(700));
        assert_eq!(f.pause(&grpc("8", Some("-1"), None)), Some(ms(700)));
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

    #[test]
    fn upstream_headers_caps_and_combines_with_retry_after() {
        let f = UpstreamHeaders::new()
            .max_reset(Duration::from_secs(60))
            .margin(Duration::from_millis(500));
        let res = |status: u16, pairs: &[(&str, &str)]| {
            let mut b = http::Response::builder().status(status);
            for (n, v) in pairs {
                b = b.header(*n, *v);
            }
            b.body(()).unwrap()
        };
        let q = |remaining, ms| UpstreamQuota {
            remaining,
            reset: Duration::from_millis(ms),
        };
        let ok = res(200, &[("ratelimit", "\"d\";r=3;t=2")]);
        assert_eq!(f.quota(&ok), Some(q(3, 2_500)));
        assert_eq!(hold_of(&f, &ok), Some(q(3, 2_500)));
        let far = res(200, &[("ratelimit", "\"d\";r=0;t=99999999999")]);
        assert_eq!(hold_of(&f, &far), Some(q(0, 60_000)));
        // A 429 with Retry-After: the pause wins, to the longer of the two
        // when nothing is left.
        let refused = res(
            429,
            &[
                ("retry-after", "5"),
                ("x-ratelimit-remaining", "0"),
                ("x-ratelimit-reset", "9"),
            ],
        );
        assert_eq!(hold_of(&f, &refused), Some(q(0, 9_500)));
        let refused = res(429, &[("retry-after", "5"), ("ratelimit", "\"d\";r=7;t=9")]);
        assert_eq!(hold_of(&f, &refused), Some(q(0, 5_000)));
        // Without Retry-After handling, only the headers count.
        let f = f.retry_after(None);
        assert_eq!(hold_of(&f, &refused), Some(q(7, 9_500)));
        assert_eq!(hold_of(&f, &res(429, &[("retry-after", "5")])), None);
        // Nothing left but already reset, or no headers: nothing.
        let reset = res(200, &[("ratelimit", "\"d\";r=0;t=0")]);
        assert_eq!(hold_of(&UpstreamHeaders::new(), &reset), None);
        assert_eq!(hold_of(&UpstreamHeaders::new(), &res(200, &[])), None);
        // Plain Retry-After feedback states no quota.
        assert_eq!(RetryAfter::new().quota(&ok), None);
        assert_eq!(hold_of(&RetryAfter::new(), &ok), None);
    }
}
