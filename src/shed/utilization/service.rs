use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use tower_service::Service;

use super::{ResponseFuture, UtilizationSettings, UtilizationShedBody};
use crate::error::BoxError;
use crate::layer::mode;
use crate::shed::tier::Classify;

/// The service [`UtilizationShedLayer`](super::UtilizationShedLayer)
/// produces. It decides in `call`, without I/O, and is ready whenever the
/// inner service is.
pub struct UtilizationShed<S, C, M> {
    inner: S,
    shared: Arc<UtilizationParts<C>>,
    _mode: PhantomData<fn() -> M>,
}

/// What a service's clones share.
struct UtilizationParts<C> {
    classify: C,
    settings: Arc<UtilizationSettings>,
}

impl<S, C, M> UtilizationShed<S, C, M> {
    pub(crate) fn new(inner: S, classify: C, settings: Arc<UtilizationSettings>) -> Self {
        UtilizationShed {
            inner,
            shared: Arc::new(UtilizationParts { classify, settings }),
            _mode: PhantomData,
        }
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Unwraps the inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }

    fn start<Req>(&mut self, req: Req) -> ResponseFuture<S::Future, M>
    where
        S: Service<Req>,
        C: Classify<Req>,
    {
        let settings = self.shared.settings.clone();
        let tiers = &settings.answer.tiers;
        // A tier of another set (a closure's mistake) counts as the default
        // tier, here already, so that spans and answers name it.
        let tier = tiers.clamp(
            self.shared
                .classify
                .classify(&req, tiers)
                .unwrap_or_else(|| tiers.unclassified()),
        );
        match settings.decide(tier) {
            Ok(slot) => {
                let fut = self.inner.call(req);
                ResponseFuture::calling(settings, fut, slot)
            }
            Err(refusal) => ResponseFuture::rejected(settings, refusal),
        }
    }
}

impl<S: Clone, C, M> Clone for UtilizationShed<S, C, M> {
    fn clone(&self) -> Self {
        UtilizationShed {
            inner: self.inner.clone(),
            shared: self.shared.clone(),
            _mode: PhantomData,
        }
    }
}

impl<S: fmt::Debug, C, M> fmt::Debug for UtilizationShed<S, C, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UtilizationShed")
            .field("inner", &self.inner)
            .field("shedder", &self.shared.settings.shedder)
            .finish_non_exhaustive()
    }
}

impl<S, C, ReqBody, ResBody> Service<Request<ReqBody>> for UtilizationShed<S, C, mode::Http>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    C: Classify<Request<ReqBody>>,
    ResBody: Body<Data = Bytes>,
{
    type Response = Response<UtilizationShedBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future, mode::Http>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        self.start(req)
    }
}

impl<S, C, Req> Service<Req> for UtilizationShed<S, C, mode::TypedErrors>
where
    S: Service<Req>,
    S::Error: Into<BoxError>,
    C: Classify<Req>,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = ResponseFuture<S::Future, mode::TypedErrors>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        self.start(req)
    }
}
