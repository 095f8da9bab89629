use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use tower_service::Service;

use super::Admitting;
use super::{
    ConcurrencyBody, ConcurrencyParts, ConcurrencyRejectionKind, ConcurrencySettings,
    ResponseFuture,
};
use crate::error::BoxError;
use crate::key::KeyExtractor;
use crate::layer::{OnMissingKey, mode};

/// The service [`ConcurrencyLimitLayer`](super::ConcurrencyLimitLayer)
/// produces.
///
/// It is ready whenever the inner service is. As with
/// [`RateLimit`](crate::RateLimit), the ready inner service is called in
/// `call` when the store answers at once (the memory store), and moved into
/// the response future (a clone taking its place) when the store does I/O.
pub struct ConcurrencyLimit<S, K, M> {
    inner: S,
    shared: Arc<ConcurrencyParts<K>>,
    _mode: PhantomData<fn() -> M>,
}

impl<S, K, M> ConcurrencyLimit<S, K, M> {
    pub(crate) fn new(inner: S, shared: Arc<ConcurrencyParts<K>>) -> Self {
        ConcurrencyLimit {
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
    {
        let settings = self.shared.settings.clone();
        let key = match self.shared.key.extract(&req) {
            Some(key) => key,
            None => match &settings.on_missing {
                OnMissingKey::Reject(status) => {
                    let refusal = settings.missing_key(*status);
                    return self.undecided(req, settings, refusal);
                }
                OnMissingKey::Fallback(key) => key.clone(),
                OnMissingKey::Allow => return self.undecided(req, settings, None),
            },
        };
        if let Some(verdict) = settings.limiter.listed(&key) {
            let refusal = settings.listed(verdict);
            return self.undecided(req, settings, refusal);
        }
        // Shadow mode queues nothing: a refused request goes on at once.
        let acquire = if settings.shadow {
            settings.limiter.acquire_now(&key)
        } else {
            settings.limiter.acquire(&key)
        };
        // Kept to count a refusal against, and for the local fallback.
        let key = Some(key);
        ResponseFuture::new(Admitting::start(
            settings,
            acquire,
            &mut self.inner,
            req,
            key,
        ))
    }
}

impl<S, K, M> ConcurrencyLimit<S, K, M> {
    /// A request decided without a lease (no key, or a list entry):
    /// refused with `refusal`, or (`None`: shadow mode, an allow entry, a
    /// keyless request let through) passed on unlimited.
    fn undecided<Req>(
        &mut self,
        req: Req,
        settings: Arc<ConcurrencySettings>,
        refusal: Option<ConcurrencyRejectionKind>,
    ) -> ResponseFuture<S, Req, M>
    where
        S: Service<Req>,
    {
        match refusal {
            Some(kind) => ResponseFuture::new(Admitting::rejected(settings, kind)),
            None => {
                let fut = self.inner.call(req);
                ResponseFuture::new(Admitting::calling(settings, fut, None))
            }
        }
    }
}

impl<S: Clone, K, M> Clone for ConcurrencyLimit<S, K, M> {
    fn clone(&self) -> Self {
        ConcurrencyLimit {
            inner: self.inner.clone(),
            shared: self.shared.clone(),
            _mode: PhantomData,
        }
    }
}

impl<S: fmt::Debug, K, M> fmt::Debug for ConcurrencyLimit<S, K, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConcurrencyLimit")
            .field("inner", &self.inner)
            .field("limiter", &self.shared.settings.limiter)
            .finish_non_exhaustive()
    }
}

impl<S, K, ReqBody, ResBody> Service<Request<ReqBody>> for ConcurrencyLimit<S, K, mode::Http>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone,
    K: KeyExtractor<Request<ReqBody>>,
    ResBody: Body<Data = Bytes>,
{
    type Response = Response<ConcurrencyBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<S, Request<ReqBody>, mode::Http>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        self.start(req)
    }
}

impl<S, K, Req> Service<Req> for ConcurrencyLimit<S, K, mode::TypedErrors>
where
    S: Service<Req> + Clone,
    S::Error: Into<BoxError>,
    K: KeyExtractor<Req>,
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
