use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use tower_service::Service;

use super::{FleetShedBody, ResponseFuture, TierGate};
use crate::concurrency::Admitting;
use crate::error::BoxError;
use crate::layer::mode;
use crate::shed::tier::Classify;

/// The service [`FleetShedLayer`](super::FleetShedLayer) produces.
///
/// It is ready whenever the inner service is. As with
/// [`ConcurrencyLimit`](crate::ConcurrencyLimit), the ready inner service
/// is called in `call` when the store answers at once (the memory store),
/// and moved into the response future (a clone taking its place) when the
/// store does I/O.
pub struct FleetShed<S, C, M> {
    inner: S,
    shared: Arc<FleetShedParts<C>>,
    _mode: PhantomData<fn() -> M>,
}

/// What a service's clones share: the classifier and one gate per tier.
struct FleetShedParts<C> {
    classify: C,
    gates: Box<[Arc<TierGate>]>,
    unclassified: Arc<TierGate>,
}

impl<S, C, M> FleetShed<S, C, M> {
    pub(crate) fn new(
        inner: S,
        classify: C,
        gates: Box<[Arc<TierGate>]>,
        unclassified: Arc<TierGate>,
    ) -> Self {
        FleetShed {
            inner,
            shared: Arc::new(FleetShedParts {
                classify,
                gates,
                unclassified,
            }),
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
        C: Classify<Req>,
    {
        let shared = &self.shared;
        let settings = &shared.unclassified.settings;
        let gate = shared
            .classify
            .classify(&req, &settings.answer.tiers)
            .and_then(|tier| shared.gates.get(tier.rank()))
            .unwrap_or(&shared.unclassified)
            .clone();
        // Counted from here: a request waiting for the store is in flight.
        let slot = settings.shedder.counters().enter(gate.tier);
        let acquire = settings.shedder.admit(gate.tier);
        // The fallback needs no key: the tier's gate knows its local one.
        let admitting = Admitting::start(gate, acquire, &mut self.inner, req, None);
        ResponseFuture::new(admitting, slot)
    }
}

impl<S: Clone, C, M> Clone for FleetShed<S, C, M> {
    fn clone(&self) -> Self {
        FleetShed {
            inner: self.inner.clone(),
            shared: self.shared.clone(),
            _mode: PhantomData,
        }
    }
}

impl<S: fmt::Debug, C, M> fmt::Debug for FleetShed<S, C, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FleetShed")
            .field("inner", &self.inner)
            .field("shedder", &self.shared.unclassified.settings.shedder)
            .finish_non_exhaustive()
    }
}

impl<S, C, ReqBody, ResBody> Service<Request<ReqBody>> for FleetShed<S, C, mode::Http>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone,
    C: Classify<Request<ReqBody>>,
    ResBody: Body<Data = Bytes>,
{
    type Response = Response<FleetShedBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<S, Request<ReqBody>, mode::Http>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        self.start(req)
    }
}

impl<S, C, Req> Service<Req> for FleetShed<S, C, mode::TypedErrors>
where
    S: Service<Req> + Clone,
    S::Error: Into<BoxError>,
    C: Classify<Req>,
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
