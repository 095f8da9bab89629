use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use http::Response;
use pin_project_lite::pin_project;
use tower_service::Service;

use super::{Common, mode};
use crate::BoxError;
use crate::decision::Decision;
use crate::error::{RateLimitError, StoreError};
use crate::response::{HeaderStyle, RejectionKind, ResponseBody};
use crate::store::StoreFuture;

pin_project! {
    /// The response future of [`RateLimit`](super::RateLimit): waits for the
    /// store's decision, then calls the inner service or refuses.
    pub struct ResponseFuture<S, Req, M>
    where
        S: Service<Req>,
    {
        #[pin]
        state: State<S, Req>,
        common: Arc<Common>,
        _mode: PhantomData<fn() -> M>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<S, Req>
    where
        S: Service<Req>,
    {
        Deciding {
            decision: StoreFuture<Decision>,
            inner: Option<S>,
            req: Option<Req>,
        },
        Calling {
            #[pin]
            fut: S::Future,
            decision: Option<Decision>,
        },
        Rejected {
            kind: Option<RejectionKind>,
        },
        Done,
    }
}

/// How a request ended, before the mode turns it into a response or error.
enum Outcome<R, E> {
    Passed(Result<R, E>, Option<Decision>),
    Rejected(RejectionKind),
}

impl<S: Service<Req>, Req, M> ResponseFuture<S, Req, M> {
    pub(crate) fn deciding(
        common: Arc<Common>,
        decision: StoreFuture<Decision>,
        inner: S,
        req: Req,
    ) -> Self {
        Self::with_state(
            common,
            State::Deciding {
                decision,
                inner: Some(inner),
                req: Some(req),
            },
        )
    }

    pub(crate) fn calling(common: Arc<Common>, fut: S::Future, decision: Option<Decision>) -> Self {
        Self::with_state(common, State::Calling { fut, decision })
    }

    pub(crate) fn rejected(common: Arc<Common>, kind: RejectionKind) -> Self {
        Self::with_state(common, State::Rejected { kind: Some(kind) })
    }

    fn with_state(common: Arc<Common>, state: State<S, Req>) -> Self {
        ResponseFuture {
            state,
            common,
            _mode: PhantomData,
        }
    }

    fn poll_outcome(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Outcome<S::Response, S::Error>> {
        let mut this = self.project();
        loop {
            let outcome = match this.state.as_mut().project() {
                StateProj::Deciding {
                    decision,
                    inner,
                    req,
                } => {
                    let result = ready!(Pin::new(decision).poll(cx));
                    let (decision, refusal) = match this.common.judge(result) {
                        Ok(decision) => (decision, None),
                        Err(kind) => (None, Some(kind)),
                    };
                    match (refusal, inner.take(), req.take()) {
                        (Some(kind), _, _) => Outcome::Rejected(kind),
                        (None, Some(mut inner), Some(req)) => {
                            let fut = inner.call(req);
                            this.state.set(State::Calling { fut, decision });
                            continue;
                        }
                        (None, _, _) => Outcome::polled_after_completion(),
                    }
                }
                StateProj::Calling { fut, decision } => {
                    let result = ready!(fut.poll(cx));
                    Outcome::Passed(result, decision.take())
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

impl<S, Req, ResBody> Future for ResponseFuture<S, Req, mode::Http>
where
    S: Service<Req, Response = Response<ResBody>>,
{
    type Output = Result<Response<ResponseBody<ResBody>>, S::Error>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let outcome = ready!(self.as_mut().poll_outcome(cx));
        let common = &self.common;
        Poll::Ready(match outcome {
            Outcome::Passed(result, decision) => result.map(|response| {
                let mut response = response.map(ResponseBody::inner);
                if let Some(decision) = decision {
                    if common.headers.style() != HeaderStyle::None && !common.shadow {
                        common.headers.write(response.headers_mut(), &decision);
                    }
                }
                response
            }),
            Outcome::Rejected(kind) => Ok(common.rejection(kind).map(ResponseBody::full)),
        })
    }
}

impl<S, Req> Future for ResponseFuture<S, Req, mode::TypedErrors>
where
    S: Service<Req>,
    S::Error: Into<BoxError>,
{
    type Output = Result<S::Response, BoxError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let outcome = ready!(self.as_mut().poll_outcome(cx));
        Poll::Ready(match outcome {
            Outcome::Passed(result, _) => result.map_err(Into::into),
            Outcome::Rejected(kind) => Err(Box::new(match kind {
                RejectionKind::Limited(d) => RateLimitError::Limited {
                    limit: self
                        .common
                        .limiter
                        .policy()
                        .limits()
                        .get(d.limit_index())
                        .map(|l| l.name().to_owned())
                        .unwrap_or_default(),
                    retry_after: d.retry_after(),
                },
                RejectionKind::MissingKey(_) => RateLimitError::MissingKey,
                RejectionKind::Unavailable(err) => RateLimitError::Unavailable(err.to_string()),
            })),
        })
    }
}

impl<S: Service<Req>, Req, M> fmt::Debug for ResponseFuture<S, Req, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}
