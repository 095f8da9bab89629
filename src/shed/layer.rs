use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::Response;

use super::rejection::{ShedAnswer, ShedRejectFn, ShedRejection};
use super::tier::{Tiers, Unclassified};
use crate::rate_limit::{FailurePolicy, mode};

/// A load-shedding layer: [`FleetShedLayer`](super::FleetShedLayer) when
/// `D` is a [`FleetShedder`](super::FleetShedder),
/// [`UtilizationShedLayer`](super::UtilizationShedLayer) when it is a
/// [`UtilizationShedder`](super::UtilizationShedder). The settings both
/// share are here.
#[must_use]
pub struct ShedLayer<D, C = Unclassified, M = mode::Http> {
    pub(crate) shedder: D,
    pub(crate) classify: C,
    /// Used by the fleet shedder only: the other has no store to fail.
    pub(crate) failure: FailurePolicy,
    /// Under [`FailurePolicy::Local`]: the local shedder, shared by every
    /// clone of the layer and every service it makes.
    pub(crate) local: Option<D>,
    pub(crate) retry_after: Duration,
    pub(crate) rejection: Option<ShedRejectFn>,
    _mode: PhantomData<fn() -> M>,
}

impl<D> ShedLayer<D> {
    pub(crate) fn with_defaults(shedder: D, retry_after: Duration) -> Self {
        ShedLayer {
            shedder,
            classify: Unclassified,
            failure: FailurePolicy::default(),
            local: None,
            retry_after,
            rejection: None,
            _mode: PhantomData,
        }
    }
}

impl<D, C, M> ShedLayer<D, C, M> {
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
            failure: self.failure,
            local: self.local,
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

impl<D: Clone, C: Clone, M> Clone for ShedLayer<D, C, M> {
    fn clone(&self) -> Self {
        ShedLayer {
            shedder: self.shedder.clone(),
            classify: self.classify.clone(),
            failure: self.failure,
            local: self.local.clone(),
            retry_after: self.retry_after,
            rejection: self.rejection.clone(),
            _mode: PhantomData,
        }
    }
}

impl<D: fmt::Debug, C, M> fmt::Debug for ShedLayer<D, C, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ShedLayer")
            .field("shedder", &self.shedder)
            .field("failure", &self.failure)
            .field("retry_after", &self.retry_after)
            .finish_non_exhaustive()
    }
}
