use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use tower_service::Service;

use super::{Cost, OnMissingKey, ResponseFuture, Shared, mode};
use crate::BoxError;
use crate::key::KeyExtractor;
use crate::response::{RejectionKind, ResponseBody};

/// The service [`RateLimitLayer`](super::RateLimitLayer) produces.
///
/// It is ready whenever the inner service is, and the inner service is only
/// ever called after its own `poll_ready` said yes: when the store answers
/// at once (the memory store), the ready service is called inside `call`;
/// when the store does I/O, the ready service is moved into the response
/// future and called there once the decision is in, and a clone takes its
/// place, to be driven to readiness before the next call.
pub struct RateLimit<S, K, C, M> {
    inner: S,
    shared: Arc<Shared<K, C>>,
    _mode: PhantomData<fn() -> M>,
}

impl<S, K, C, M> RateLimit<S, K, C, M> {
    pub(crate) fn new(inner: S, shared: Arc<Shared<K, C>>) -> Self {
        RateLimit {
            inner,
            shared,
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

    fn start<Req>(&mut self, req: Req) -> ResponseFuture<S, Req, M>
    where
        S: Service<Req> + Clone,
        K: KeyExtractor<Req>,
        C: Cost<Req>,
    {
        let common = self.shared.common.clone();
        let key = match self.shared.key.extract(&req) {
            Some(key) => key,
            None => match &common.on_missing {
                OnMissingKey::Reject(status) => {
                    return match common.refuse(RejectionKind::MissingKey(*status)) {
                        Some(kind) => ResponseFuture::rejected(common, kind),
                        None => ResponseFuture::calling(common.clone(), self.inner.call(req), None),
                    };
                }
                OnMissingKey::Fallback(key) => key.clone(),
                OnMissingKey::Allow => {
                    return ResponseFuture::calling(common, self.inner.call(req), None);
                }
            },
        };
        let cost = self.shared.cost.cost(&req);
        let mut decision = common.limiter.check(&key, cost);
        // The memory store has decided already: call the service that was
        // driven to readiness right away.
        if let Some(result) = decision.take_ready() {
            return match common.judge(result) {
                Ok(decision) => ResponseFuture::calling(common, self.inner.call(req), decision),
                Err(kind) => ResponseFuture::rejected(common, kind),
            };
        }
        // A store doing I/O decides later: take the ready service into the
        // future, to be called once the decision is in, and leave a clone
        // that must be driven to readiness again before the next call.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        ResponseFuture::deciding(common, decision, inner, req)
    }
}

impl<S: Clone, K, C, M> Clone for RateLimit<S, K, C, M> {
    fn clone(&self) -> Self {
        RateLimit {
            inner: self.inner.clone(),
            shared: self.shared.clone(),
            _mode: PhantomData,
        }
    }
}

impl<S: fmt::Debug, K, C, M> fmt::Debug for RateLimit<S, K, C, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimit")
            .field("inner", &self.inner)
            .field("limiter", &self.shared.common.limiter)
            .finish_non_exhaustive()
    }
}

impl<S, K, C, ReqBody, ResBody> Service<Request<ReqBody>> for RateLimit<S, K, C, mode::Http>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone,
    K: KeyExtractor<Request<ReqBody>>,
    C: Cost<Request<ReqBody>>,
    ResBody: Body<Data = Bytes>,
{
    type Response = Response<ResponseBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<S, Request<ReqBody>, mode::Http>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        self.start(req)
    }
}

impl<S, K, C, Req> Service<Req> for RateLimit<S, K, C, mode::TypedErrors>
where
    S: Service<Req> + Clone,
    S::Error: Into<BoxError>,
    K: KeyExtractor<Req>,
    C: Cost<Req>,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = ResponseFuture<S, Req, mode::TypedErrors>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        self.start(req)
    }
}
