use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use tower_service::Service;

use super::future::Start;
use super::{
    Cost, NoFeedback, OnMissingKey, RateLimitParts, RateSettings, ResponseFuture, UpstreamFeedback,
    Which, mode,
};
use crate::error::BoxError;
use crate::key::KeyExtractor;
use crate::response::{RefusalBody, RejectionKind, ResponseBody};
use crate::rules::Plan;

/// The service [`RateLimitLayer`](super::RateLimitLayer) produces.
///
/// It is ready whenever the inner service is, and the inner service is only
/// ever called after its own `poll_ready` said yes: when the store answers
/// at once (the memory store) and there is no slot to wait for, the ready
/// service is called inside `call`; otherwise (a store doing I/O, or a
/// slot in the future in waiting mode) the ready service is moved into the
/// response future and called there once the decision is in and the slot
/// has come, and a clone takes its place, to be driven to readiness before
/// the next call.
///
/// While a call waits for its slot, it therefore holds a service that said
/// it was ready, and whatever that readiness reserved (a `Buffer` slot, a
/// `ConcurrencyLimit` permit) stays reserved until the call is made. That
/// is deliberate: polling the service again after the sleep could find it
/// not ready and push the call past its slot, bunching it with the next
/// one. A waiting future that is dropped drops that service and the request
/// uncalled, which releases the reservation; the inner service is never
/// half-called.
pub struct RateLimit<S, K, C, M, F = NoFeedback> {
    inner: S,
    shared: Arc<RateLimitParts<K, C, F>>,
    _mode: PhantomData<fn() -> M>,
}

impl<S, K, C, M, F> RateLimit<S, K, C, M, F> {
    pub(crate) fn new(inner: S, shared: Arc<RateLimitParts<K, C, F>>) -> Self {
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

    // The steps of a call (`call_http`, `start`, `start_with`) are
    // inlined into `call`: they run on every request.
    #[inline(always)]
    fn start<Req>(&mut self, req: Req) -> ResponseFuture<S, Req, M, F>
    where
        S: Service<Req> + Clone,
        K: KeyExtractor<Req>,
        C: Cost<Req>,
        F: UpstreamFeedback<S::Response>,
    {
        self.start_with(req, Which::Layer, |_| None, |_| None)
    }

    /// Decides `req` with the settings `which` names (the layer's, or its
    /// route's) for its key and for the plan `plan` finds in it; in gRPC
    /// waiting mode, within the deadline `deadline` finds in it.
    ///
    /// `req` is only borrowed until the decision is in, and then moved
    /// once: moved earlier into a function of its own (even one inlined),
    /// a refused request's 240 bytes (axum's) were copied once more.
    #[inline(always)]
    fn start_with<Req>(
        &mut self,
        req: Req,
        which: Which,
        plan: impl Fn(&Req) -> Option<&Plan>,
        deadline: impl Fn(&Req) -> Option<Duration>,
    ) -> ResponseFuture<S, Req, M, F>
    where
        S: Service<Req> + Clone,
        K: KeyExtractor<Req>,
        C: Cost<Req>,
        F: UpstreamFeedback<S::Response>,
    {
        let feedback = self.shared.feedback.clone();
        let plan = || plan(&req).map(Plan::name);
        let live = self.shared.live(which);
        let ((settings, listed), key) = match self.shared.key.extract(&req) {
            Some(key) => (live.select(&key, plan), key),
            None => {
                let settings = live.base();
                let status = match &settings.on_missing {
                    OnMissingKey::Fallback(key) => Ok(key.clone()),
                    OnMissingKey::Reject(status) => Err(Some(*status)),
                    OnMissingKey::Allow => Err(None),
                };
                match status {
                    Ok(key) => (live.select(&key, plan), key),
                    Err(reject) => {
                        let refusal = reject.and_then(|status| settings.missing_key(status));
                        return self.undecided(req, settings, feedback, refusal);
                    }
                }
            }
        };
        if let Some(verdict) = listed {
            let refusal = settings.listed(verdict);
            return self.undecided(req, settings, feedback, refusal);
        }
        let cost = self.shared.cost.cost(&req);
        // A gRPC client does not enforce its deadline while it waits here
        // (the server counts it from when the call arrives): a slot past
        // it would be spent on a call that is dead on arrival.
        let deadline = match settings.max_wait {
            Some(_) if settings.grpc => deadline(&req),
            _ => None,
        };
        let mut start = Start::new(settings, feedback);
        let mut decision = start.settings.ask(&key, cost, deadline);
        start.cost = cost;
        let mut key = Some(key);
        if start.feedback.is_enabled()
            || start.settings.fallback.is_some()
            || start.settings.after.is_some()
        {
            start.key = key.take();
        }
        // The memory store has decided already: call the service that was
        // driven to readiness right away, unless there is a slot to wait for.
        if let Some(result) = decision.take_ready() {
            let result =
                RateSettings::fall_back(&mut start.settings, result, start.key.as_ref(), cost);
            let seen = start.key.as_ref().or(key.as_ref());
            return match start.settings.judge(result, None, seen) {
                Ok(decision) => match start.settings.wait_for(decision.as_ref()) {
                    None => ResponseFuture::calling(start, self.inner.call(req), decision),
                    Some(wait) => {
                        let inner = self.take_ready();
                        ResponseFuture::waiting(start, wait, inner, req, decision)
                    }
                },
                Err(kind) => ResponseFuture::rejected(start, kind),
            };
        }
        // Kept while the store decides, for `observe` to count a refusal
        // by identity (the feedback and the charge after the response ask
        // for it themselves, and only act when configured).
        if start.key.is_none() {
            start.key = key;
        }
        let inner = self.take_ready();
        ResponseFuture::deciding(start, decision, inner, req)
    }

    /// A request decided without the store (no key and no fallback key,
    /// or a deny or allow list entry): refused with `refusal`, or (`None`:
    /// shadow mode, an allow entry, a keyless request let through) passed
    /// on unlimited.
    #[inline(never)]
    fn undecided<Req>(
        &mut self,
        req: Req,
        settings: Arc<RateSettings>,
        feedback: F,
        refusal: Option<RejectionKind>,
    ) -> ResponseFuture<S, Req, M, F>
    where
        S: Service<Req>,
        F: UpstreamFeedback<S::Response>,
    {
        let start = Start::new(settings, feedback);
        match refusal {
            Some(kind) => ResponseFuture::rejected(start, kind),
            None => ResponseFuture::calling(start, self.inner.call(req), None),
        }
    }

    /// Takes the service that `poll_ready` drove to readiness, to be called
    /// later by the response future, and leaves a clone that must be driven
    /// to readiness again before the next call.
    fn take_ready(&mut self) -> S
    where
        S: Clone,
    {
        let clone = self.inner.clone();
        std::mem::replace(&mut self.inner, clone)
    }
}

impl<S: Clone, K, C, M, F> Clone for RateLimit<S, K, C, M, F> {
    fn clone(&self) -> Self {
        RateLimit {
            inner: self.inner.clone(),
            shared: self.shared.clone(),
            _mode: PhantomData,
        }
    }
}

impl<S: fmt::Debug, K, C, M, F> fmt::Debug for RateLimit<S, K, C, M, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimit")
            .field("inner", &self.inner)
            .field("limiter", self.shared.settings.limiter())
            .finish_non_exhaustive()
    }
}

impl<S, K, C, M, F> RateLimit<S, K, C, M, F> {
    /// An HTTP request: decided by its route's settings when the layer
    /// has a route table.
    #[inline(always)]
    fn call_http<ReqBody>(
        &mut self,
        req: Request<ReqBody>,
    ) -> ResponseFuture<S, Request<ReqBody>, M, F>
    where
        S: Service<Request<ReqBody>> + Clone,
        K: KeyExtractor<Request<ReqBody>>,
        C: Cost<Request<ReqBody>>,
        F: UpstreamFeedback<S::Response>,
    {
        let which = match &self.shared.routes {
            None => Which::Layer,
            Some(routes) => match routes.select(&req) {
                Some(which) => which,
                // No rule and no default: this route is not limited.
                None => {
                    let settings = self.shared.settings.base();
                    let start = Start::new(settings, self.shared.feedback.clone());
                    return ResponseFuture::calling(start, self.inner.call(req), None);
                }
            },
        };
        self.start_with(
            req,
            which,
            |req| req.extensions().get::<Plan>(),
            |req| crate::response::grpc::timeout(req.headers()),
        )
    }
}

impl<S, K, C, F, ReqBody, ResBody> Service<Request<ReqBody>> for RateLimit<S, K, C, mode::Http, F>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone,
    K: KeyExtractor<Request<ReqBody>>,
    C: Cost<Request<ReqBody>>,
    F: UpstreamFeedback<Response<ResBody>>,
    ResBody: Body<Data = Bytes> + RefusalBody,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    type Future = ResponseFuture<S, Request<ReqBody>, mode::Http, F>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        self.call_http(req)
    }
}

impl<S, K, C, F, ReqBody, ResBody> Service<Request<ReqBody>>
    for RateLimit<S, K, C, mode::AnyBody, F>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone,
    K: KeyExtractor<Request<ReqBody>>,
    C: Cost<Request<ReqBody>>,
    F: UpstreamFeedback<Response<ResBody>>,
    ResBody: Body<Data = Bytes>,
{
    type Response = Response<ResponseBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<S, Request<ReqBody>, mode::AnyBody, F>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        self.call_http(req)
    }
}

impl<S, K, C, F, Req> Service<Req> for RateLimit<S, K, C, mode::TypedErrors, F>
where
    S: Service<Req> + Clone,
    S::Error: Into<BoxError>,
    K: KeyExtractor<Req>,
    C: Cost<Req>,
    F: UpstreamFeedback<S::Response>,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = ResponseFuture<S, Req, mode::TypedErrors, F>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        self.start(req)
    }
}
