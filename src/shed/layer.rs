use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::Response;

use super::rejection::{ShedAnswer, ShedRejectFn, ShedRejection};
use super::tier::Tiers;
use crate::layer::mode;

/// What both shed layers ([`FleetShedLayer`](super::FleetShedLayer) and
/// [`UtilizationShedLayer`](super::UtilizationShedLayer)) hold besides
/// their shedder: the classifier, how a shed request is answered, and
/// whether as an HTTP response or a typed error (`M`), or in shadow mode
/// not at all. Each layer's
/// builder methods forward here.
pub(crate) struct ShedLayerSettings<C, M> {
    pub(crate) classify: C,
    pub(crate) retry_after: Duration,
    rejection: Option<ShedRejectFn>,
    grpc: bool,
    /// Shadow mode: what would be shed is only counted.
    pub(crate) shadow: bool,
    _mode: PhantomData<fn() -> M>,
}

impl ShedLayerSettings<(), mode::Http> {
    /// No classifier, the default response with `retry_after`.
    pub(crate) fn new(retry_after: Duration) -> Self {
        ShedLayerSettings {
            classify: (),
            retry_after,
            rejection: None,
            grpc: false,
            shadow: false,
            _mode: PhantomData,
        }
    }
}

impl<C, M> ShedLayerSettings<C, M> {
    pub(crate) fn classify<C2>(self, classify: C2) -> ShedLayerSettings<C2, M> {
        self.rebuild(|_| classify)
    }

    pub(crate) fn retry_after(mut self, after: Duration) -> Self {
        self.retry_after = after;
        self
    }

    pub(crate) fn rejection<F, B>(mut self, f: F) -> Self
    where
        F: Fn(&ShedRejection<'_>) -> Response<B> + Send + Sync + 'static,
        B: Into<Bytes>,
    {
        self.rejection = Some(Arc::new(move |r: &ShedRejection<'_>| f(r).map(Into::into)));
        self
    }

    pub(crate) fn grpc(mut self) -> Self {
        self.grpc = true;
        self
    }

    pub(crate) fn shadow(mut self, shadow: bool) -> Self {
        self.shadow = shadow;
        self
    }

    pub(crate) fn typed_errors(self) -> ShedLayerSettings<C, mode::TypedErrors> {
        self.rebuild(|classify| classify)
    }

    fn rebuild<C2, M2>(self, f: impl FnOnce(C) -> C2) -> ShedLayerSettings<C2, M2> {
        ShedLayerSettings {
            classify: f(self.classify),
            retry_after: self.retry_after,
            rejection: self.rejection,
            grpc: self.grpc,
            shadow: self.shadow,
            _mode: PhantomData,
        }
    }

    /// How the services answer what they shed.
    pub(crate) fn answer(&self, policy: Arc<str>, tiers: &Tiers) -> ShedAnswer {
        ShedAnswer {
            policy,
            tiers: tiers.clone(),
            retry_after: self.retry_after,
            rejection: self.rejection.clone(),
            grpc: self.grpc,
        }
    }
}

impl<C: Clone, M> Clone for ShedLayerSettings<C, M> {
    fn clone(&self) -> Self {
        ShedLayerSettings {
            classify: self.classify.clone(),
            retry_after: self.retry_after,
            rejection: self.rejection.clone(),
            grpc: self.grpc,
            shadow: self.shadow,
            _mode: PhantomData,
        }
    }
}
