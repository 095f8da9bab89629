use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::Response;

use super::rejection::{ShedAnswer, ShedRejectFn, ShedRejection};
use super::tier::Tiers;
use super::{FleetShedder, UtilizationShedder};
use crate::layer::{FailurePolicy, mode};

/// The shedders a [`ShedLayer`] wraps:
/// [`FleetShedder`](super::FleetShedder) and
/// [`UtilizationShedder`](super::UtilizationShedder). Sealed.
pub trait Shedder: Clone + fmt::Debug + sealed::Sealed {
    /// The layer settings of this shedder alone: for the fleet shedder,
    /// what to do when its store fails and, under
    /// [`FailurePolicy::Local`], the local shedder (shared by every clone of
    /// the layer and every service it makes); nothing for the
    /// worker-utilization shedder, which has no store.
    type OnStoreError: Clone + fmt::Debug + Default + Send + Sync + 'static;
}

impl Shedder for FleetShedder {
    type OnStoreError = (FailurePolicy, Option<FleetShedder>);
}

impl Shedder for UtilizationShedder {
    type OnStoreError = ();
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for super::FleetShedder {}
    impl Sealed for super::UtilizationShedder {}
}

/// A load-shedding layer: [`FleetShedLayer`](super::FleetShedLayer) when
/// `D` is a [`FleetShedder`](super::FleetShedder),
/// [`UtilizationShedLayer`](super::UtilizationShedLayer) when it is a
/// [`UtilizationShedder`](super::UtilizationShedder). The settings both
/// share are here.
#[must_use]
pub struct ShedLayer<D: Shedder, C = (), M = mode::Http> {
    pub(crate) shedder: D,
    pub(crate) classify: C,
    pub(crate) on_store_error: D::OnStoreError,
    pub(crate) retry_after: Duration,
    pub(crate) rejection: Option<ShedRejectFn>,
    _mode: PhantomData<fn() -> M>,
}

impl<D: Shedder> ShedLayer<D> {
    pub(crate) fn with_defaults(shedder: D, retry_after: Duration) -> Self {
        ShedLayer {
            shedder,
            classify: (),
            on_store_error: D::OnStoreError::default(),
            retry_after,
            rejection: None,
            _mode: PhantomData,
        }
    }
}

impl<D: Shedder, C, M> ShedLayer<D, C, M> {
    /// The shedder.
    pub fn shedder(&self) -> &D {
        &self.shedder
    }

    /// Which tier a request is in: any [`Classify`](super::Classify), such
    /// as [`RouteTiers`](super::RouteTiers),
    /// [`HeaderTier`](super::HeaderTier) or a closure. Without one, every
    /// request is in the default tier.
    pub fn classify<C2>(self, classify: C2) -> ShedLayer<D, C2, M> {
        self.rebuild(|_| classify)
    }

    /// The `Retry-After` of a shed request (sent in whole seconds, rounded
    /// up).
    pub fn retry_after(mut self, after: Duration) -> Self {
        self.retry_after = after;
        self
    }

    /// Replaces the rejection response. The function receives the reason
    /// and can start from [`ShedRejection::default_response`].
    pub fn rejection<F, B>(mut self, f: F) -> Self
    where
        F: Fn(&ShedRejection<'_>) -> Response<B> + Send + Sync + 'static,
        B: Into<Bytes>,
    {
        self.rejection = Some(Arc::new(move |r: &ShedRejection<'_>| f(r).map(Into::into)));
        self
    }

    /// Refuse with a [`ShedError`](super::ShedError) instead of an HTTP
    /// response; works around any `tower::Service`. An admitted call then
    /// holds its place (and the fleet shedder's lease) until the response
    /// future resolves.
    pub fn typed_errors(self) -> ShedLayer<D, C, mode::TypedErrors> {
        self.rebuild(|classify| classify)
    }

    fn rebuild<C2, M2>(self, f: impl FnOnce(C) -> C2) -> ShedLayer<D, C2, M2> {
        ShedLayer {
            shedder: self.shedder,
            classify: f(self.classify),
            on_store_error: self.on_store_error,
            retry_after: self.retry_after,
            rejection: self.rejection,
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
        }
    }
}

impl<D: Shedder, C: Clone, M> Clone for ShedLayer<D, C, M> {
    fn clone(&self) -> Self {
        ShedLayer {
            shedder: self.shedder.clone(),
            classify: self.classify.clone(),
            on_store_error: self.on_store_error.clone(),
            retry_after: self.retry_after,
            rejection: self.rejection.clone(),
            _mode: PhantomData,
        }
    }
}

impl<D: Shedder, C, M> fmt::Debug for ShedLayer<D, C, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ShedLayer")
            .field("shedder", &self.shedder)
            .field("on_store_error", &self.on_store_error)
            .field("retry_after", &self.retry_after)
            .finish_non_exhaustive()
    }
}
