use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::Bytes;
use http::Response;
use pin_project_lite::pin_project;
use tokio::time::{Instant, Sleep};
use tower_service::Service;

use super::feedback::hold_of;
use super::quota::log_hold;
use super::{NoFeedback, RateSettings, UpstreamFeedback, UpstreamQuota, mode};
use crate::decision::Decision;
use crate::error::BoxError;
use crate::error::{RateLimitError, StoreError};
use crate::key::Key;
use crate::response::{HeaderStyle, RefusalBody, RejectionKind, ResponseBody};
use crate::store::StoreFuture;

pin_project! {
    /// The response future of [`RateLimit`](super::RateLimit): waits for the
    /// store's decision (and, in waiting mode, for the call's slot), then
    /// calls the inner service or refuses; with upstream feedback, records
    /// the upstream's pause before handing its response back.
    pub struct ResponseFuture<S, Req, M, F = NoFeedback>
    where
        S: Service<Req>,
    {
        #[pin]
        state: State<S, Req>,
        settings: Arc<RateSettings>,
        feedback: F,
        // The request's key, kept only when the feedback or the local
        // fallback may need it.
        key: Option<Key>,
        cost: u64,
        _mode: PhantomData<fn() -> M>,
    }
}

pin_project! {
    // What only some calls need is boxed: the service and request parked
    // while a store doing I/O decides or the call waits for its slot, the
    // sleep, and an upstream's pause being recorded. The future every call
    // makes and moves (and axum boxes) is then not much larger than the
    // inner service's future and a decision, whatever the request's size.
    // A call that waits for Redis allocates once more, one that waits for
    // its slot twice, next to a round trip or a sleep; recording a pause
    // (after an upstream's 429) once.
    #[project = StateProj]
    enum State<S, Req>
    where
        S: Service<Req>,
    {
        // The store is deciding. The parked service was driven to
        // readiness by the service's `poll_ready` and is called (at once,
        // or after `Waiting`) without being polled again.
        Deciding {
            decision: StoreFuture<Decision>,
            parked: Option<Box<Parked<S, Req>>>,
        },
        // A slot was reserved; sleeping until it. Dropping the future here
        // drops the request and the ready service uncalled.
        Waiting {
            sleep: Pin<Box<Sleep>>,
            parked: Option<Box<Parked<S, Req>>>,
        },
        Calling {
            #[pin]
            fut: S::Future,
            decision: Option<Decision>,
            // When the inner service was called: its answer was written no
            // earlier (see `Limiter::align_written`). Read only where
            // upstream feedback may need it.
            sent: Option<Instant>,
        },
        // The upstream asked for a pause: recording it before returning
        // its response, so that the caller's next call already sees it.
        Reporting {
            report: Box<Reporting<S::Response>>,
        },
        Rejected {
            kind: Option<RejectionKind>,
        },
        Done,
    }
}

/// A ready service and the request it is to be called with, parked while
/// the store decides or the call waits for its slot; and, once known, the
/// decision whose headers the response gets.
struct Parked<S, Req> {
    inner: S,
    req: Req,
    decision: Option<Decision>,
}

/// The upstream's pause (or what it says is left) being recorded, and the
/// response that said so.
struct Reporting<R> {
    report: StoreFuture<()>,
    hold: UpstreamQuota,
    response: Option<R>,
    decision: Option<Decision>,
}

/// How a request ended, before the mode turns it into a response or error.
enum Outcome<R, E> {
    Passed(Result<R, E>, Option<Decision>),
    Rejected(RejectionKind),
}

/// The instant the inner service is called, where `feedback` may use it.
fn sent_at<Res, F: UpstreamFeedback<Res>>(feedback: &F) -> Option<Instant> {
    feedback.is_enabled().then(Instant::now)
}

/// What every response future of one call starts from.
pub(crate) struct Start<F> {
    pub(crate) settings: Arc<RateSettings>,
    pub(crate) feedback: F,
    pub(crate) key: Option<Key>,
    pub(crate) cost: u64,
}

impl<F> Start<F> {
    pub(crate) fn new(settings: Arc<RateSettings>, feedback: F) -> Self {
        Start {
            settings,
            feedback,
            key: None,
            cost: 0,
        }
    }
}

impl<S: Service<Req>, Req, M, F> ResponseFuture<S, Req, M, F> {
    pub(crate) fn deciding(
        start: Start<F>,
        decision: StoreFuture<Decision>,
        inner: S,
        req: Req,
    ) -> Self {
        Self::with_state(
            start,
            State::Deciding {
                decision,
                parked: Some(Box::new(Parked {
                    inner,
                    req,
                    decision: None,
                })),
            },
        )
    }

    pub(crate) fn waiting(
        start: Start<F>,
        wait: Duration,
        inner: S,
        req: Req,
        decision: Option<Decision>,
    ) -> Self {
        let parked = Box::new(Parked {
            inner,
            req,
            decision,
        });
        Self::with_state(start, State::waiting(wait, parked))
    }

    pub(crate) fn calling(start: Start<F>, fut: S::Future, decision: Option<Decision>) -> Self
    where
        F: UpstreamFeedback<S::Response>,
    {
        let sent = sent_at(&start.feedback);
        Self::with_state(
            start,
            State::Calling {
                fut,
                decision,
                sent,
            },
        )
    }

    pub(crate) fn rejected(start: Start<F>, kind: RejectionKind) -> Self {
        Self::with_state(start, State::Rejected { kind: Some(kind) })
    }

    fn with_state(start: Start<F>, state: State<S, Req>) -> Self {
        ResponseFuture {
            state,
            settings: start.settings,
            feedback: start.feedback,
            key: start.key,
            cost: start.cost,
            _mode: PhantomData,
        }
    }
}

impl<S: Service<Req>, Req> State<S, Req> {
    fn waiting(wait: Duration, parked: Box<Parked<S, Req>>) -> Self {
        // The wait counts from the store's "now", which came a little
        // before this reply: sleeping from here errs on the late side.
        let sleep = match Instant::now().checked_add(wait) {
            Some(deadline) => tokio::time::sleep_until(deadline),
            // Beyond what the clock can hold (the wait is capped at about
            // 35 years): tokio's own far-future sleep.
            None => tokio::time::sleep(wait),
        };
        State::Waiting {
            sleep: Box::pin(sleep),
            parked: Some(parked),
        }
    }
}

impl<S, Req, M, F> ResponseFuture<S, Req, M, F>
where
    S: Service<Req>,
    F: UpstreamFeedback<S::Response>,
{
    fn poll_outcome(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Outcome<S::Response, S::Error>> {
        let mut this = self.project();
        loop {
            let outcome = match this.state.as_mut().project() {
                StateProj::Deciding { decision, parked } => {
                    let result = ready!(Pin::new(&mut *decision).poll(cx));
                    let latency = decision.latency();
                    let result = RateSettings::fall_back(
                        this.settings,
                        result,
                        this.key.as_ref(),
                        *this.cost,
                    );
                    match (
                        this.settings.judge(result, latency, this.key.as_ref()),
                        parked.take(),
                    ) {
                        (Err(kind), _) => Outcome::Rejected(kind),
                        (Ok(decision), Some(mut parked)) => {
                            let next = match this.settings.wait_for(decision.as_ref()) {
                                Some(wait) => {
                                    parked.decision = decision;
                                    State::waiting(wait, parked)
                                }
                                None => {
                                    let Parked { mut inner, req, .. } = *parked;
                                    State::Calling {
                                        fut: inner.call(req),
                                        decision,
                                        sent: sent_at(&*this.feedback),
                                    }
                                }
                            };
                            this.state.set(next);
                            continue;
                        }
                        (Ok(_), None) => Outcome::polled_after_completion(),
                    }
                }
                StateProj::Waiting { sleep, parked } => {
                    ready!(sleep.as_mut().poll(cx));
                    match parked.take() {
                        Some(parked) => {
                            let Parked {
                                mut inner,
                                req,
                                decision,
                            } = *parked;
                            this.state.set(State::Calling {
                                fut: inner.call(req),
                                decision,
                                sent: sent_at(&*this.feedback),
                            });
                            continue;
                        }
                        None => Outcome::polled_after_completion(),
                    }
                }
                StateProj::Calling {
                    fut,
                    decision,
                    sent,
                } => {
                    let result = ready!(fut.poll(cx));
                    let decision = decision.take();
                    // Without feedback `hold_of` finds nothing, key or not.
                    let hold = match (&result, this.key.as_ref()) {
                        (Ok(response), Some(key)) => {
                            hold_of(&*this.feedback, response).map(|hold| (hold, key))
                        }
                        _ => None,
                    };
                    match (hold, result) {
                        (Some((hold, key)), Ok(response)) => {
                            let limiter = &this.settings.limiter;
                            let mut report = match hold.remaining {
                                0 => limiter.defer(key, hold.reset),
                                left => {
                                    let age = sent.map_or(Duration::ZERO, |sent| sent.elapsed());
                                    limiter.align_written(key, left, hold.reset, age)
                                }
                            };
                            // A quota recorded at once (the memory store),
                            // or one that holds nothing back: the response
                            // goes on without being parked.
                            let at_once = match hold.remaining {
                                0 => None,
                                _ => report.take_ready(),
                            };
                            match at_once {
                                Some(recorded) => {
                                    log_hold(this.settings.limiter.name(), hold, &recorded);
                                    Outcome::Passed(Ok(response), decision)
                                }
                                None => {
                                    this.state.set(State::Reporting {
                                        report: Box::new(Reporting {
                                            report,
                                            hold,
                                            response: Some(response),
                                            decision,
                                        }),
                                    });
                                    continue;
                                }
                            }
                        }
                        (_, result) => Outcome::Passed(result, decision),
                    }
                }
                StateProj::Reporting { report } => {
                    let Reporting {
                        report,
                        hold,
                        response,
                        decision,
                    } = &mut **report;
                    let recorded = ready!(Pin::new(report).poll(cx));
                    log_hold(this.settings.limiter.name(), *hold, &recorded);
                    match response.take() {
                        Some(response) => Outcome::Passed(Ok(response), decision.take()),
                        None => Outcome::polled_after_completion(),
                    }
                }
                StateProj::Rejected { kind } => match kind.take() {
                    Some(kind) => Outcome::Rejected(kind),
                    None => Outcome::polled_after_completion(),
                },
                StateProj::Done => Outcome::polled_after_completion(),
            };
            this.state.set(State::Done);
            return Poll::Ready(outcome);
        }
    }
}

impl<R, E> Outcome<R, E> {
    /// A contract violation by the caller; answered, not panicked on.
    fn polled_after_completion() -> Self {
        Outcome::Rejected(RejectionKind::Unavailable(StoreError::UnexpectedReply(
            "response future polled after completion".into(),
        )))
    }
}

impl<S, Req, M, F> ResponseFuture<S, Req, M, F>
where
    S: Service<Req>,
    F: UpstreamFeedback<S::Response>,
{
    /// The HTTP modes' answer: a response that passed, with the
    /// rate-limit headers of its decision, or the refusal's response;
    /// `body` and `full` give each its body.
    fn poll_http<ResBody, B>(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        body: impl FnOnce(ResBody) -> B,
        full: impl FnOnce(Bytes) -> B,
    ) -> Poll<Result<Response<B>, S::Error>>
    where
        S: Service<Req, Response = Response<ResBody>>,
        B: RefusalBody + http_body::Body,
    {
        let outcome = ready!(self.as_mut().poll_outcome(cx));
        let this = self.project();
        let settings = &*this.settings;
        Poll::Ready(match outcome {
            Outcome::Passed(mut result, decision) => {
                write_headers(settings, &mut result, decision.as_ref());
                // ---- Upstream feedback from the body's trailers ----
                let reader = B::WATCHES_TRAILERS.0.then(|| this.feedback.trailers());
                let watch = match (reader.flatten(), &result, this.key.as_ref()) {
                    (Some(reader), Ok(_), Some(key)) => Some(super::trailers::watch(
                        reader,
                        Arc::clone(settings),
                        key.clone(),
                    )),
                    _ => None,
                };
                let body = |inner| match watch {
                    Some(watch) => body(inner).watch_trailers(watch),
                    None => body(inner),
                };
                // ---- end of upstream feedback from the trailers ----
                // ---- Cost known after the response (`ResponseCost`) ----
                // One branch when not configured; the charge or refund
                // never delays the response.
                if let Some(after) = &settings.after {
                    let key = this.key.take();
                    let (cost, decision) = (*this.cost, decision.as_ref());
                    let result = after_response(settings, after, key, cost, decision, result, body);
                    return Poll::Ready(result);
                }
                // ---- end of cost known after the response ----
                result.map(|response| response.map(body))
            }
            Outcome::Rejected(kind) => Ok(settings.rejection(kind).map(full)),
        })
    }
}

/// Cost known after the response: starts the charge or refund of a
/// response that passed (see [`ResponseCost`](super::ResponseCost)), and
/// gives its body (`body` of the inner one) the meter of body bytes.
#[cold]
#[inline(never)]
fn after_response<ResBody, B: RefusalBody + http_body::Body, E>(
    settings: &Arc<RateSettings>,
    after: &super::ResponseCost,
    key: Option<Key>,
    cost: u64,
    decision: Option<&Decision>,
    result: Result<Response<ResBody>, E>,
    body: impl FnOnce(ResBody) -> B,
) -> Result<Response<B>, E> {
    let mut response = result?;
    let meter = match key {
        Some(key) => super::after::on_response(settings, after, key, cost, decision, &mut response),
        None => None,
    };
    Ok(response.map(|inner| match meter {
        Some(meter) => body(inner).metered(meter),
        None => body(inner),
    }))
}

/// Gives a response that passed the rate-limit headers of its decision
/// (unless the style is none or the layer is in shadow mode).
fn write_headers<B, E>(
    settings: &RateSettings,
    result: &mut Result<Response<B>, E>,
    decision: Option<&Decision>,
) {
    if let (Ok(response), Some(decision)) = (result, decision)
        && settings.headers.style() != HeaderStyle::None
        && !settings.shadow
    {
        settings.headers.write(response.headers_mut(), decision);
    }
}

impl<S, Req, ResBody, F> Future for ResponseFuture<S, Req, mode::Http, F>
where
    S: Service<Req, Response = Response<ResBody>>,
    F: UpstreamFeedback<Response<ResBody>>,
    ResBody: RefusalBody + http_body::Body,
{
    type Output = Result<Response<ResBody>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.poll_http(cx, |body| body, ResBody::refusal)
    }
}

impl<S, Req, ResBody, F> Future for ResponseFuture<S, Req, mode::AnyBody, F>
where
    S: Service<Req, Response = Response<ResBody>>,
    F: UpstreamFeedback<Response<ResBody>>,
    ResBody: http_body::Body<Data = Bytes>,
{
    type Output = Result<Response<ResponseBody<ResBody>>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.poll_http(cx, ResponseBody::inner, ResponseBody::full)
    }
}

impl<S, Req, F> Future for ResponseFuture<S, Req, mode::TypedErrors, F>
where
    S: Service<Req>,
    S::Error: Into<BoxError>,
    F: UpstreamFeedback<S::Response>,
{
    type Output = Result<S::Response, BoxError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let outcome = ready!(self.as_mut().poll_outcome(cx));
        Poll::Ready(match outcome {
            Outcome::Passed(result, _) => result.map_err(Into::into),
            Outcome::Rejected(kind) => Err(Box::new(match kind {
                RejectionKind::Limited(d) => {
                    let limit = self
                        .settings
                        .policy
                        .limits()
                        .get(d.limit_index())
                        .map(|l| l.name().to_owned())
                        .unwrap_or_default();
                    match (self.settings.max_wait, d.retry_after()) {
                        (Some(max_wait), Some(wait)) => RateLimitError::WaitTooLong {
                            limit,
                            wait,
                            max_wait,
                        },
                        (_, retry_after) => RateLimitError::Limited { limit, retry_after },
                    }
                }
                RejectionKind::MissingKey(_) => RateLimitError::MissingKey,
                RejectionKind::Unavailable(err) => RateLimitError::Unavailable(err.to_string()),
                RejectionKind::DenyListed { retry_after, .. } => {
                    RateLimitError::Denied { retry_after }
                }
            })),
        })
    }
}

impl<S: Service<Req>, Req, M, F> fmt::Debug for ResponseFuture<S, Req, M, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;
    use std::mem::size_of;

    use http::{Request, Response};
    use tower_layer::Layer;

    use super::*;
    use crate::{Limit, Limiter, Policy, Rate, RateLimitLayer};

    fn future_size<S: Service<R>, R>(_: &S) -> usize {
        size_of::<S::Future>()
    }

    /// A future polled again after it answered (a caller's bug) answers
    /// 503, whichever way it first ended, and never panics.
    #[test]
    fn polled_again_after_answering_it_answers_503() {
        use std::task::Waker;
        // One call admitted, then refused: a burst of one per hour.
        let limit = Limit::builder(Rate::per_hour(1)).build().unwrap();
        let limiter = Limiter::in_memory(Policy::single("p", limit).unwrap());
        let inner = tower::service_fn(|_: Request<String>| {
            std::future::ready(Ok::<_, Infallible>(Response::new(String::from("ok"))))
        });
        let mut service = RateLimitLayer::new(limiter)
            .key(crate::key::GlobalKey::new())
            .layer(inner);
        let mut cx = Context::from_waker(Waker::noop());
        for first in [200, 429] {
            let mut fut = Box::pin(service.call(Request::new(String::new())));
            let status = |poll: Poll<Result<Response<String>, Infallible>>| match poll {
                Poll::Ready(Ok(response)) => response.status().as_u16(),
                Poll::Ready(Err(never)) => match never {},
                Poll::Pending => 0,
            };
            assert_eq!(status(fut.as_mut().poll(&mut cx)), first);
            assert_eq!(status(fut.as_mut().poll(&mut cx)), 503);
        }
    }

    /// Every call makes this future and the layers around it move it (axum
    /// boxes it): a request parked for a store doing I/O, a sleep or a
    /// recorded pause would make it several times the inner future's size
    /// on every call, though a memory store's calls never use them.
    #[test]
    fn the_future_holds_the_inner_future_and_a_decision_and_little_else() {
        let limit = Limit::builder(Rate::per_second(10)).build().unwrap();
        let limiter = Limiter::in_memory(Policy::single("p", limit).unwrap());
        let inner = tower::service_fn(|_: Request<String>| {
            std::future::ready(Ok::<_, Infallible>(Response::new(String::new())))
        });
        let inner_size = future_size(&inner);
        let ours = future_size(&RateLimitLayer::new(limiter).layer(inner));
        // The state's tag, the settings, the key kept for feedback and the
        // cost: 48 bytes today.
        let rest = 64;
        assert!(
            ours <= inner_size + size_of::<Option<Decision>>() + rest,
            "{ours} bytes around an inner future of {inner_size}"
        );
        // What the boxed parts would add, were they inline.
        assert!(size_of::<Request<String>>() > rest);
        assert!(size_of::<Sleep>() > rest);
    }
}
