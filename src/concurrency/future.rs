use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use http::Response;
use pin_project_lite::pin_project;
use tower_service::Service;

use super::{Acquire, Common, ConcurrencyBody, ConcurrencyRejectionKind};
use crate::BoxError;
use crate::error::StoreError;
use crate::key::Key;
use crate::lease::{GuardedBody, LeaseGuard, StoreLease};
use crate::rate_limit::mode;
use crate::response::ResponseBody;

pin_project! {
    /// The response future of
    /// [`ConcurrencyLimit`](super::ConcurrencyLimit): waits for the lease,
    /// then calls the inner service holding it, or refuses.
    ///
    /// Dropped at any point (the client went away, a timeout outside, a
    /// panic unwinding through the handler), it releases the lease it holds
    /// or may have taken.
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
        Acquiring {
            acquire: Acquire,
            inner: Option<S>,
            req: Option<Req>,
            // Kept only for the local fallback.
            key: Option<Key>,
        },
        Calling {
            #[pin]
            fut: S::Future,
            guard: Option<LeaseGuard<StoreLease>>,
        },
        Rejected {
            kind: Option<ConcurrencyRejectionKind>,
        },
        Done,
    }
}

/// How a request ended, before the mode turns it into a response or error.
enum Outcome<R, E> {
    Passed(Result<R, E>, Option<LeaseGuard<StoreLease>>),
    Rejected(ConcurrencyRejectionKind),
}

impl<S: Service<Req>, Req, M> ResponseFuture<S, Req, M> {
    pub(crate) fn acquiring(
        common: Arc<Common>,
        acquire: Acquire,
        inner: S,
        req: Req,
        key: Option<Key>,
    ) -> Self {
        Self::with_state(
            common,
            State::Acquiring {
                acquire,
                inner: Some(inner),
                req: Some(req),
                key,
            },
        )
    }

    pub(crate) fn calling(
        common: Arc<Common>,
        fut: S::Future,
        guard: Option<LeaseGuard<StoreLease>>,
    ) -> Self {
        Self::with_state(common, State::Calling { fut, guard })
    }

    pub(crate) fn rejected(common: Arc<Common>, kind: ConcurrencyRejectionKind) -> Self {
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
                StateProj::Acquiring {
                    acquire,
                    inner,
                    req,
                    key,
                } => {
                    let result = ready!(Pin::new(&mut *acquire).poll(cx));
                    let latency = acquire.latency();
                    let result = Common::fall_back(this.common, result, key.as_ref());
                    match (this.common.judge(result, latency), inner.take(), req.take()) {
                        (Err(kind), _, _) => Outcome::Rejected(kind),
                        (Ok(guard), Some(mut inner), Some(req)) => {
                            let fut = inner.call(req);
                            this.state.set(State::Calling { fut, guard });
                            continue;
                        }
                        (Ok(_), _, _) => Outcome::polled_after_completion(),
                    }
                }
                StateProj::Calling { fut, guard } => {
                    let result = ready!(fut.poll(cx));
                    Outcome::Passed(result, guard.take())
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
        Outcome::Rejected(ConcurrencyRejectionKind::Unavailable(
            StoreError::UnexpectedReply("response future polled after completion".into()),
        ))
    }
}

impl<S, Req, ResBody> Future for ResponseFuture<S, Req, mode::Http>
where
    S: Service<Req, Response = Response<ResBody>>,
{
    type Output = Result<Response<ConcurrencyBody<ResBody>>, S::Error>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let outcome = ready!(self.as_mut().poll_outcome(cx));
        Poll::Ready(match outcome {
            // The body holds the lease from here on.
            Outcome::Passed(result, guard) => result.map(|response| {
                response.map(|body| GuardedBody::new(ResponseBody::inner(body), guard))
            }),
            Outcome::Rejected(kind) => Ok(self
                .common
                .rejection(kind)
                .map(|body| GuardedBody::new(ResponseBody::full(body), None))),
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
            // No body to follow: the lease ends with the call.
            Outcome::Passed(result, _guard) => result.map_err(Into::into),
            Outcome::Rejected(kind) => Err(Box::new(self.common.error(kind))),
        })
    }
}

impl<S: Service<Req>, Req, M> fmt::Debug for ResponseFuture<S, Req, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}
