use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::Response;
use tower_layer::Layer;

use super::{Common, FleetShed, FleetShedder, TierGate};
use crate::metrics::LayerMetrics;
use crate::rate_limit::{FailurePolicy, mode};
use crate::shed::rejection::{ShedAnswer, ShedRejectFn, ShedRejection};
use crate::shed::tier::Unclassified;

/// Sheds requests of the tiers whose share of the fleet's capacity is in
/// use, with a [`FleetShedder`]: `503 Service Unavailable` and
/// `Retry-After`.
///
/// Defaults: every request in the default tier until
/// [`classify`](Self::classify) says otherwise, `Retry-After: 1`, fail open
/// when the store fails, HTTP responses for rejections. See the
/// [module docs](crate::shed) for an example.
#[must_use]
pub struct FleetShedLayer<C = Unclassified, M = mode::Http> {
    shedder: FleetShedder,
    classify: C,
    failure: FailurePolicy,
    retry_after: Duration,
    rejection: Option<ShedRejectFn>,
    _mode: PhantomData<fn() -> M>,
}

impl FleetShedLayer {
    /// Sheds requests with `shedder`.
    pub fn new(shedder: FleetShedder) -> Self {
        FleetShedLayer {
            shedder,
            classify: Unclassified,
            failure: FailurePolicy::default(),
            retry_after: Duration::from_secs(1),
            rejection: None,
            _mode: PhantomData,
        }
    }
}

impl<C, M> FleetShedLayer<C, M> {
    /// The shedder.
    pub fn shedder(&self) -> &FleetShedder {
        &self.shedder
    }

    /// Which tier a request is in: any [`Classify`](crate::shed::Classify),
    /// such as [`RouteTiers`](crate::shed::RouteTiers),
    /// [`HeaderTier`](crate::shed::HeaderTier) or a closure.
    pub fn classify<C2>(self, classify: C2) -> FleetShedLayer<C2, M> {
        self.rebuild(|_| classify)
    }

    /// What to do when the store fails (default: let requests through).
    /// Failing closed refuses every tier but the most important, which
    /// this layer never refuses.
    pub fn on_store_error(mut self, policy: FailurePolicy) -> Self {
        self.failure = policy;
        self
    }

    /// The `Retry-After` of a shed request (default 1 s; sent in whole
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
    /// HTTP response; works around any `tower::Service`. The lease is then
    /// held until the response future resolves.
    pub fn typed_errors(self) -> FleetShedLayer<C, mode::TypedErrors> {
        self.rebuild(|classify| classify)
    }

    fn rebuild<C2, M2>(self, f: impl FnOnce(C) -> C2) -> FleetShedLayer<C2, M2> {
        FleetShedLayer {
            shedder: self.shedder,
            classify: f(self.classify),
            failure: self.failure,
            retry_after: self.retry_after,
            rejection: self.rejection,
            _mode: PhantomData,
        }
    }
}

impl<C: Clone, M> Clone for FleetShedLayer<C, M> {
    fn clone(&self) -> Self {
        FleetShedLayer {
            shedder: self.shedder.clone(),
            classify: self.classify.clone(),
            failure: self.failure,
            retry_after: self.retry_after,
            rejection: self.rejection.clone(),
            _mode: PhantomData,
        }
    }
}

impl<C, M> fmt::Debug for FleetShedLayer<C, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FleetShedLayer")
            .field("shedder", &self.shedder)
            .field("failure", &self.failure)
            .field("retry_after", &self.retry_after)
            .finish_non_exhaustive()
    }
}

impl<S, C: Clone, M> Layer<S> for FleetShedLayer<C, M> {
    type Service = FleetShed<S, C, M>;

    fn layer(&self, inner: S) -> Self::Service {
        let policy = self.shedder.policy();
        let name: Arc<str> = Arc::from(policy.name());
        let common = Arc::new(Common {
            shedder: self.shedder.clone(),
            answer: ShedAnswer {
                policy: name.clone(),
                tiers: policy.tiers().clone(),
                retry_after: self.retry_after,
                rejection: self.rejection.clone(),
            },
            failure: self.failure,
            metrics: LayerMetrics::new("fleet_shed", name),
        });
        let tiers = policy.tiers();
        let gates = tiers
            .iter()
            .map(|tier| {
                Arc::new(TierGate {
                    common: common.clone(),
                    tier,
                    limit: policy.limit(tier),
                })
            })
            .collect();
        let unclassified = Arc::new(TierGate {
            common,
            tier: tiers.unclassified(),
            limit: policy.limit(tiers.unclassified()),
        });
        FleetShed::new(inner, self.classify.clone(), gates, unclassified)
    }
}
