use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::Response;
use tower_layer::Layer;

use super::{Common, UtilizationShed, UtilizationShedder};
use crate::metrics::LayerMetrics;
use crate::rate_limit::mode;
use crate::shed::rejection::{ShedAnswer, ShedRejectFn, ShedRejection};
use crate::shed::tier::Unclassified;

/// Sheds requests when this process has been overloaded for a while, with
/// a [`UtilizationShedder`]: least important tiers first, with rising
/// probability; `503 Service Unavailable` and `Retry-After`.
///
/// Defaults: every request in the default tier until
/// [`classify`](Self::classify) says otherwise, `Retry-After: 5` (shedding
/// lasts tens of seconds at least, so a quick retry would only be shed
/// again), HTTP responses for rejections. See the
/// [module docs](crate::shed) for an example.
#[must_use]
pub struct UtilizationShedLayer<C = Unclassified, M = mode::Http> {
    shedder: UtilizationShedder,
    classify: C,
    retry_after: Duration,
    rejection: Option<ShedRejectFn>,
    _mode: PhantomData<fn() -> M>,
}

impl UtilizationShedLayer {
    /// Sheds requests with `shedder`.
    pub fn new(shedder: UtilizationShedder) -> Self {
        UtilizationShedLayer {
            shedder,
            classify: Unclassified,
            retry_after: Duration::from_secs(5),
            rejection: None,
            _mode: PhantomData,
        }
    }
}

impl<C, M> UtilizationShedLayer<C, M> {
    /// The shedder.
    pub fn shedder(&self) -> &UtilizationShedder {
        &self.shedder
    }

    /// Which tier a request is in: any [`Classify`](crate::shed::Classify),
    /// such as [`RouteTiers`](crate::shed::RouteTiers),
    /// [`HeaderTier`](crate::shed::HeaderTier) or a closure.
    pub fn classify<C2>(self, classify: C2) -> UtilizationShedLayer<C2, M> {
        self.rebuild(|_| classify)
    }

    /// The `Retry-After` of a shed request (default 5 s; sent in whole
    /// seconds, rounded up).
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

    /// Refuse with a [`ShedError`](crate::shed::ShedError) instead of an
    /// HTTP response; works around any `tower::Service`. The request then
    /// counts in flight until the response future resolves.
    pub fn typed_errors(self) -> UtilizationShedLayer<C, mode::TypedErrors> {
        self.rebuild(|classify| classify)
    }

    fn rebuild<C2, M2>(self, f: impl FnOnce(C) -> C2) -> UtilizationShedLayer<C2, M2> {
        UtilizationShedLayer {
            shedder: self.shedder,
            classify: f(self.classify),
            retry_after: self.retry_after,
            rejection: self.rejection,
            _mode: PhantomData,
        }
    }
}

impl<C: Clone, M> Clone for UtilizationShedLayer<C, M> {
    fn clone(&self) -> Self {
        UtilizationShedLayer {
            shedder: self.shedder.clone(),
            classify: self.classify.clone(),
            retry_after: self.retry_after,
            rejection: self.rejection.clone(),
            _mode: PhantomData,
        }
    }
}

impl<C, M> fmt::Debug for UtilizationShedLayer<C, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UtilizationShedLayer")
            .field("shedder", &self.shedder)
            .field("retry_after", &self.retry_after)
            .finish_non_exhaustive()
    }
}

impl<S, C: Clone, M> Layer<S> for UtilizationShedLayer<C, M> {
    type Service = UtilizationShed<S, C, M>;

    fn layer(&self, inner: S) -> Self::Service {
        let name: Arc<str> = Arc::from(self.shedder.name());
        let common = Common {
            shedder: self.shedder.clone(),
            answer: ShedAnswer {
                policy: name.clone(),
                tiers: self.shedder.tiers().clone(),
                retry_after: self.retry_after,
                rejection: self.rejection.clone(),
            },
            metrics: LayerMetrics::new("utilization_shed", name),
        };
        UtilizationShed::new(inner, self.classify.clone(), Arc::new(common))
    }
}
