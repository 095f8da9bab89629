use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::Response;
use pin_project_lite::pin_project;
use tower_service::Service;

use super::adaptive::{AdaptiveCall, Verdict};
use super::{Admission, ConcurrencyBody, ConcurrencyRejectionKind, ConcurrencySettings};
use super::{Admitting, Gate};
use crate::error::BoxError;
use crate::error::StoreError;
use crate::key::Key;
use crate::layer::mode;
use crate::lease::{LeaseGuard, StoreLease};
use crate::response::Answer;

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
        inner: Admitting<S, Req, ConcurrencySettings>,
        _mode: PhantomData<fn() -> M>,
    }
}

impl<S: Service<Req>, Req, M> ResponseFuture<S, Req, M> {
    pub(crate) fn new(inner: Admitting<S, Req, ConcurrencySettings>) -> Self {
        ResponseFuture {
            inner,
            _mode: PhantomData,
        }
    }
}

impl<S, Req, ResBody> Future for ResponseFuture<S, Req, mode::Http>
where
    S: Service<Req, Response = Response<ResBody>>,
{
    type Output = Result<Response<ConcurrencyBody<ResBody>>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.project().inner.poll_http(cx)
    }
}

impl<S, Req> Future for ResponseFuture<S, Req, mode::TypedErrors>
where
    S: Service<Req>,
    S::Error: Into<BoxError>,
{
    type Output = Result<S::Response, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.project().inner.poll_typed(cx)
    }
}

impl<S: Service<Req>, Req, M> fmt::Debug for ResponseFuture<S, Req, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

impl Answer for ConcurrencySettings {
    type Refusal = ConcurrencyRejectionKind;

    fn respond(&self, kind: ConcurrencyRejectionKind) -> Response<Bytes> {
        self.rejection(kind)
    }

    fn fail(&self, kind: ConcurrencyRejectionKind) -> BoxError {
        Box::new(self.error(kind))
    }
}

impl Gate for ConcurrencySettings {
    fn admit(
        &self,
        result: Result<Admission, StoreError>,
        latency: Option<Duration>,
        key: Option<&Key>,
    ) -> Result<Option<LeaseGuard<StoreLease>>, ConcurrencyRejectionKind> {
        self.judge(result, latency, key)
    }

    fn broken(&self, err: StoreError) -> ConcurrencyRejectionKind {
        ConcurrencyRejectionKind::Unavailable(err)
    }

    fn fall_back(
        settings: &mut Arc<ConcurrencySettings>,
        result: Result<Admission, StoreError>,
        key: Option<&Key>,
    ) -> Result<Admission, StoreError> {
        ConcurrencySettings::fall_back(settings, result, key)
    }

    fn measure(&self) -> Option<AdaptiveCall> {
        self.limiter.measure()
    }

    fn measured(&self, call: AdaptiveCall, verdict: Verdict) {
        self.limiter.measured(call, verdict);
    }
}
