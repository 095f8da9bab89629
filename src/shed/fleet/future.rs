use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use http::Response;
use pin_project_lite::pin_project;
use tower_service::Service;

use super::{FleetShedBody, TierGate};
use crate::concurrency::Admitting;
use crate::error::BoxError;
use crate::layer::mode;
use crate::lease::{GuardedBody, LeaseGuard};
use crate::shed::state::TierSlot;

pin_project! {
    /// The response future of [`FleetShed`](super::FleetShed): waits for
    /// the fleet lease, then calls the inner service holding it, or sheds
    /// the request.
    ///
    /// Dropped at any point (the client went away, a timeout outside, a
    /// panic unwinding through the handler), it releases the lease it holds
    /// or may have taken, and leaves this process's in-flight count.
    pub struct ResponseFuture<S, Req, M>
    where
        S: Service<Req>,
    {
        #[pin]
        inner: Admitting<S, Req, TierGate>,
        slot: Option<LeaseGuard<TierSlot>>,
        _mode: PhantomData<fn() -> M>,
    }
}

impl<S: Service<Req>, Req, M> ResponseFuture<S, Req, M> {
    pub(crate) fn new(inner: Admitting<S, Req, TierGate>, slot: LeaseGuard<TierSlot>) -> Self {
        ResponseFuture {
            inner,
            slot: Some(slot),
            _mode: PhantomData,
        }
    }
}

impl<S, Req, ResBody> Future for ResponseFuture<S, Req, mode::Http>
where
    S: Service<Req, Response = Response<ResBody>>,
{
    type Output = Result<Response<FleetShedBody<ResBody>>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        let outcome = ready!(this.inner.as_mut().poll_outcome(cx));
        // A shed request leaves the count now, an admitted one with its body.
        let slot = this.slot.take().filter(|_| outcome.passed());
        Poll::Ready(
            outcome
                .into_http(this.inner.gate())
                .map(|response| response.map(|body| GuardedBody::new(body, slot))),
        )
    }
}

impl<S, Req> Future for ResponseFuture<S, Req, mode::TypedErrors>
where
    S: Service<Req>,
    S::Error: Into<BoxError>,
{
    type Output = Result<S::Response, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let result = ready!(this.inner.poll_typed(cx));
        this.slot.take();
        Poll::Ready(result)
    }
}

impl<S: Service<Req>, Req, M> fmt::Debug for ResponseFuture<S, Req, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}
