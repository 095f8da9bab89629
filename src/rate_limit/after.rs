//! Cost known after the response: [`ResponseCost`], what the layer charges
//! (or gives back) once the inner service has answered.

use std::fmt;
use std::sync::Arc;

use http::header::HeaderName;
use http::response::Parts;
use http::{HeaderMap, Response};
use tokio::runtime::Handle;

use super::RateSettings;
use crate::decision::Decision;
use crate::error::StoreError;
use crate::key::Key;
use crate::layer::log_store_failure;
use crate::log::LogGate;
use crate::response::BodyMeter;
use crate::store::StoreFuture;

/// A charge or refund dropped because no tokio runtime was there to drive
/// it: logged at most once a second.
static NO_RUNTIME_WARNINGS: LogGate = LogGate::new();

type PartsFn<T> = Arc<dyn Fn(&Parts) -> T + Send + Sync>;

/// What a [`RateLimitLayer`](super::RateLimitLayer) charges once the
/// response is known ([`RateLimitLayer::response_cost`](super::RateLimitLayer::response_cost)).
/// Three ways, one type:
///
/// | constructor | before the call | once the response head arrives |
/// |---|---|---|
/// | [`header`](Self::header), [`from_parts`](Self::from_parts), [`body_bytes`](Self::body_bytes) | admitted while the budget is not exhausted ([`Limiter::peek`](crate::Limiter::peek) of the request's cost) | charges the cost read from the response ([`Limiter::charge`](crate::Limiter::charge), debt allowed); body bytes when the body ends or is dropped |
/// | [`refund_server_errors`](Self::refund_server_errors), [`refund_if`](Self::refund_if) | checked and charged, as without a response cost | gives the request's cost back ([`Limiter::refund`](crate::Limiter::refund)) if the response matches |
/// | [`count_if`](Self::count_if) | admitted while the budget is not exhausted (peek) | charges the request's cost only if the response matches |
///
/// The charge or refund never delays the response: the memory store's
/// answers at once, a Redis store's round trip (one, none when the amount
/// is 0) runs on a task spawned on the current tokio runtime. A charge or
/// refund that fails cannot refuse a response already made: it is logged
/// at `warn` (at most once a second, as every store failure) and counted as
/// a store error (`fleetgate_store_errors_total`, `op` the script's:
/// `gcra_charge`, `fixed_window_refund`, ...); under
/// [`FailurePolicy::Local`](crate::FailurePolicy::Local) it is then applied
/// to the local fallback's limiter instead. A Redis store keeps a failed
/// (or timed-out) charge as owed by the key and sends it before the key's
/// next peek: while it cannot land, that peek fails and the layer's
/// failure policy decides the call as for a failed check (`Closed` refuses
/// until a charge lands again, `Local` decides on the local limiter that
/// took the charge, `Open` admits), so a Redis that answers reads but
/// refuses writes does not turn the limit off
/// (`docs/operating.md`, "When Redis answers reads but refuses writes").
/// An inner service that fails (no response) is charged or refunded
/// nothing.
///
/// Charge-after callers admitted together can overshoot the budget by the
/// costs they have in flight (each was admitted by a peek that counted
/// nothing); the debt then holds the identity back until it is repaid at
/// the limit's rate, and `Retry-After` says when. Refund callers never
/// overshoot: every call was charged before it ran.
///
/// A debt is bounded by the policy: under GCRA by what each limit refills
/// in 16 periods of its rate, or in an hour if that is longer, past its
/// burst, so that a response claiming an absurd cost
/// (`x-tokens-used: 18446744073709551615`) holds its identity back an
/// hour at most under `1000/min` (16 hours under `10/h`), and its Redis
/// key expires then: a single cost above what the limit refills in that
/// time is charged only that much. The window algorithms forget a debt
/// when its window (the sliding counter's: the next one) has passed.
///
/// With [`wait_up_to`](super::RateLimitLayer::wait_up_to), a layer that
/// peeks never waits (a peek reserves no slot); a refunding one waits as
/// usual. In shadow mode the layer still charges and refunds.
///
/// Only in the HTTP modes: [`typed_errors`](super::RateLimitLayer::typed_errors)
/// works around services whose responses the layer cannot read, and drops
/// a response cost set before it.
///
/// ```
/// use fleetgate::key::HeaderKey;
/// use fleetgate::rate_limit::ResponseCost;
/// use fleetgate::{Limit, Limiter, MemoryStore, Policy, Rate, RateLimitLayer};
///
/// # fn main() -> Result<(), fleetgate::ConfigError> {
/// // An LLM gateway: 1000 tokens a minute per API key, charged from the
/// // completion's own count.
/// let tokens = Policy::single("tokens", Limit::new(Rate::per_minute(1000))?)?;
/// let layer = RateLimitLayer::new(Limiter::new(tokens, MemoryStore::new()))
///     .key(HeaderKey::new("x-api-key"))
///     .response_cost(ResponseCost::header("x-tokens-used"));
/// # let _ = layer;
/// // A login limit: only failed attempts count.
/// let logins = Policy::single("login", Limit::new(Rate::per_hour(5))?)?;
/// let login = RateLimitLayer::new(Limiter::new(logins, MemoryStore::new()))
///     .response_cost(ResponseCost::count_if(|head| {
///         head.status == 401 || head.status == 403
///     }));
/// # let _ = login;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct ResponseCost {
    kind: Kind,
}

#[derive(Clone)]
enum Kind {
    /// Peek before, charge the amount after.
    Charge(Amount),
    /// Check before, refund the request's cost when the rule matches.
    Refund(PartsFn<bool>),
    /// Peek before, charge the request's cost when the rule matches.
    Count(PartsFn<bool>),
}

#[derive(Clone)]
enum Amount {
    Header(HeaderName),
    Parts(PartsFn<u64>),
    BodyBytes,
}

impl ResponseCost {
    /// Charges the unsigned integer in the response header `name` (such as
    /// `x-tokens-used`). A response without it, or with a value that is not
    /// a plain unsigned integer, is charged the request's cost (the layer's
    /// [`cost`](super::RateLimitLayer::cost), 1 by default): a response
    /// that does not say what it cost still counts.
    ///
    /// # Panics
    ///
    /// If `name` is not a valid header name in lower case
    /// ([`HeaderName::from_static`]).
    pub fn header(name: &'static str) -> Self {
        ResponseCost {
            kind: Kind::Charge(Amount::Header(HeaderName::from_static(name))),
        }
    }

    /// Charges what `f` reads from the response's head (status, headers,
    /// extensions).
    pub fn from_parts<F>(f: F) -> Self
    where
        F: Fn(&Parts) -> u64 + Send + Sync + 'static,
    {
        ResponseCost {
            kind: Kind::Charge(Amount::Parts(Arc::new(f))),
        }
    }

    /// Charges the bytes of the response body actually handed to the
    /// server: when the body ends, fails, or is dropped (a client that went
    /// away mid-body is charged what it was sent). With axum's `Body` and
    /// this crate's [`ResponseBody`](crate::response::ResponseBody) (the
    /// [`any_body`](super::RateLimitLayer::any_body) mode) the body is
    /// counted as it goes; other body types (`String`, `Full`, ...) are
    /// charged their whole length (their exact size, else its lower bound)
    /// when the head arrives.
    pub fn body_bytes() -> Self {
        ResponseCost {
            kind: Kind::Charge(Amount::BodyBytes),
        }
    }

    /// Charges before the call, as without a response cost, and gives the
    /// request's cost back when the response is a server error (5xx): a
    /// failing upstream does not eat its clients' budgets.
    pub fn refund_server_errors() -> Self {
        Self::refund_if(|head| head.status.is_server_error())
    }

    /// Charges before the call, as without a response cost, and gives the
    /// request's cost back when `f` says so of the response's head. Only a
    /// call that was charged is refunded (not one let through because the
    /// store failed, nor one over the limit in shadow mode).
    ///
    /// With a sliding log, a refund drops the newest entries, not
    /// necessarily the call's own ([`Limiter::refund`](crate::Limiter::refund)).
    /// On Redis with a deny cache, a refund clears this instance's cached
    /// denials of the key; another instance that refused the key may keep
    /// refusing it from its cache until the retry time it was told.
    pub fn refund_if<F>(f: F) -> Self
    where
        F: Fn(&Parts) -> bool + Send + Sync + 'static,
    {
        ResponseCost {
            kind: Kind::Refund(Arc::new(f)),
        }
    }

    /// Counts only the responses `f` matches: admits a call while the
    /// budget is not exhausted (a peek of the request's cost), and charges
    /// the request's cost only if its response matches, such as a login's
    /// 401s and 403s.
    ///
    /// ```
    /// use fleetgate::key::GlobalKey;
    /// use fleetgate::rate_limit::ResponseCost;
    /// use fleetgate::{BoxError, Limit, Limiter, MemoryStore, Policy, Rate, RateLimitLayer};
    /// use http::{Request, Response, StatusCode};
    /// use tower::{service_fn, ServiceExt};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), BoxError> {
    /// let policy = Policy::single("login", Limit::new(Rate::per_hour(5))?)?;
    /// let login = RateLimitLayer::new(Limiter::new(policy, MemoryStore::new()))
    ///     .key(GlobalKey::new())
    ///     .response_cost(ResponseCost::count_if(|head| head.status == 401));
    /// let app = tower::ServiceBuilder::new().layer(login).service(service_fn(
    ///     |req: Request<String>| async move {
    ///         let status = if req.body() == "right" { 200 } else { 401 };
    ///         let mut res = Response::new(String::new());
    ///         *res.status_mut() = StatusCode::from_u16(status)?;
    ///         Ok::<_, BoxError>(res)
    ///     },
    /// ));
    /// let call = |password: &str| app.clone().oneshot(Request::new(password.to_owned()));
    /// for _ in 0..20 {
    ///     assert_eq!(call("right").await?.status(), 200);
    /// }
    /// for _ in 0..5 {
    ///     assert_eq!(call("wrong").await?.status(), 401);
    /// }
    /// // Refused now, even with the right password.
    /// assert_eq!(call("right").await?.status(), 429);
    /// # Ok(()) }
    /// ```
    pub fn count_if<F>(f: F) -> Self
    where
        F: Fn(&Parts) -> bool + Send + Sync + 'static,
    {
        ResponseCost {
            kind: Kind::Count(Arc::new(f)),
        }
    }

    /// Whether the call is admitted by a peek (charged later) rather than
    /// checked and charged at once.
    #[inline]
    pub(crate) fn peeks(&self) -> bool {
        !matches!(self.kind, Kind::Refund(_))
    }
}

impl fmt::Debug for ResponseCost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            Kind::Charge(Amount::Header(name)) => f
                .debug_tuple("ResponseCost::header")
                .field(&name.as_str())
                .finish(),
            Kind::Charge(Amount::Parts(_)) => f.write_str("ResponseCost::from_parts(..)"),
            Kind::Charge(Amount::BodyBytes) => f.write_str("ResponseCost::body_bytes()"),
            Kind::Refund(_) => f.write_str("ResponseCost::refund_if(..)"),
            Kind::Count(_) => f.write_str("ResponseCost::count_if(..)"),
        }
    }
}

/// The cost a header states: a plain unsigned integer.
fn header_cost(headers: &HeaderMap, name: &HeaderName) -> Option<u64> {
    headers.get(name)?.to_str().ok()?.trim().parse().ok()
}

/// Applies `after` to a response that passed: reads what it cost and
/// starts the charge or refund off the response's path; for body bytes,
/// the meter the body is to carry. `decision` is the one the call was
/// admitted by (`None` when it was let through unchecked: no refund).
pub(crate) fn on_response<B>(
    settings: &Arc<RateSettings>,
    after: &ResponseCost,
    key: Key,
    cost: u64,
    decision: Option<&Decision>,
    response: &mut Response<B>,
) -> Option<BodyMeter> {
    let op = match &after.kind {
        Kind::Charge(Amount::BodyBytes) => {
            let settings = Arc::clone(settings);
            return Some(BodyMeter::new(move |sent| {
                settle(settings, key, Op::Charge(sent));
            }));
        }
        Kind::Charge(Amount::Header(name)) => {
            Op::Charge(header_cost(response.headers(), name).unwrap_or(cost))
        }
        Kind::Charge(Amount::Parts(f)) => Op::Charge(with_parts(response, |p| f(p))),
        Kind::Count(rule) => match with_parts(response, |p| rule(p)) {
            true => Op::Charge(cost),
            false => return None,
        },
        // Only a call the store charged has anything to give back.
        Kind::Refund(rule) => match decision.is_some() && with_parts(response, |p| rule(p)) {
            true => Op::Refund(cost),
            false => return None,
        },
    };
    settle(Arc::clone(settings), key, op);
    None
}

/// `f` of the response's head: its headers and extensions are lent to a
/// `Parts` (swapped, not copied; an empty map allocates nothing) and put
/// back.
fn with_parts<B, T>(response: &mut Response<B>, f: impl FnOnce(&Parts) -> T) -> T {
    let (mut parts, ()) = Response::new(()).into_parts();
    parts.status = response.status();
    parts.version = response.version();
    std::mem::swap(&mut parts.headers, response.headers_mut());
    std::mem::swap(&mut parts.extensions, response.extensions_mut());
    let out = f(&parts);
    std::mem::swap(&mut parts.headers, response.headers_mut());
    std::mem::swap(&mut parts.extensions, response.extensions_mut());
    out
}

/// What to do to the key's budget once the response is known.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Op {
    Charge(u64),
    Refund(u64),
}

impl Op {
    fn amount(self) -> u64 {
        match self {
            Op::Charge(n) | Op::Refund(n) => n,
        }
    }

    fn what(self) -> &'static str {
        match self {
            Op::Charge(_) => "rate-limit charge after the response:",
            Op::Refund(_) => "rate-limit refund after the response:",
        }
    }
}

/// Charges or refunds `key` under `settings`' policy without making
/// anyone wait: the memory store's answer is in at once, a store doing I/O
/// is driven by a task of its own. Nothing happens for an amount of 0.
pub(crate) fn settle(settings: Arc<RateSettings>, key: Key, op: Op) {
    if op.amount() == 0 {
        return;
    }
    match op {
        Op::Charge(n) => {
            let fut = settings.limiter.charge(&key, n);
            drive(settings, key, op, fut);
        }
        Op::Refund(n) => {
            let fut = settings.limiter.refund(&key, n);
            drive(settings, key, op, fut);
        }
    }
}

fn drive<T: Unpin + Send + 'static>(
    settings: Arc<RateSettings>,
    key: Key,
    op: Op,
    mut fut: StoreFuture<T>,
) {
    if let Some(result) = fut.take_ready() {
        landed(&settings, key, op, result.err());
        return;
    }
    match Handle::try_current() {
        Ok(runtime) => {
            // Started here, so that a caller does not run ahead of its own
            // charges; the task takes it from there.
            if let Some(result) = fut.start() {
                landed(&settings, key, op, result.err());
                return;
            }
            runtime.spawn(async move {
                let result = fut.await;
                landed(&settings, key, op, result.err());
            });
        }
        Err(_) => {
            if NO_RUNTIME_WARNINGS.allow() {
                tracing::warn!(
                    policy = settings.limiter.name(),
                    amount = op.amount(),
                    "{} no tokio runtime to run it on; dropped",
                    op.what()
                );
            }
        }
    }
}

/// A charge or refund has been done, or has failed with `err`: logged,
/// and under a local fallback applied to the local limiter instead.
fn landed(settings: &Arc<RateSettings>, key: Key, op: Op, err: Option<StoreError>) {
    let Some(err) = err else {
        return;
    };
    log_store_failure(
        op.what(),
        settings.limiter.name(),
        settings.limiter.store(),
        &err,
        settings.failure,
    );
    if let Some(local) = &settings.fallback {
        settle(Arc::clone(local), key, op);
    }
}
