use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::Response;
use tower_layer::Layer;

use super::{UtilizationSettings, UtilizationShed, UtilizationShedder};
use crate::layer::mode;
use crate::metrics::LayerMetrics;
use crate::observe::ShedSource;
use crate::shed::layer::ShedLayerSettings;
use crate::shed::rejection::ShedRejection;

/// Sheds requests when this process has been overloaded for a while, with
/// a [`UtilizationShedder`]: least important tiers first, with rising
/// probability; `503 Service Unavailable` and `Retry-After`.
///
/// Defaults: every request in the default tier until
/// [`classify`](Self::classify) says otherwise (`C = ()` classifies
/// nothing), `Retry-After: 5` (shedding lasts tens of seconds at least, so
/// a quick retry would only be shed again), enforcing (not
/// [shadow](Self::shadow)), HTTP responses for rejections
/// (`M` is [`mode::Http`], or [`mode::TypedErrors`] after
/// [`typed_errors`](Self::typed_errors)). See the
/// [module docs](crate::shed) for an example.
#[must_use]
pub struct UtilizationShedLayer<C = (), M = mode::Http> {
    shedder: UtilizationShedder,
    settings: ShedLayerSettings<C, M>,
}

impl UtilizationShedLayer {
    /// Sheds requests with `shedder`.
    pub fn new(shedder: UtilizationShedder) -> Self {
        UtilizationShedLayer {
            shedder,
            settings: ShedLayerSettings::new(Duration::from_secs(5)),
        }
    }
}

impl<C, M> UtilizationShedLayer<C, M> {
    /// The shedder.
    pub fn shedder(&self) -> &UtilizationShedder {
        &self.shedder
    }

    /// Which tier a request is in: a [`RouteTiers`](crate::shed::RouteTiers)
    /// table, a [`HeaderTier`](crate::shed::HeaderTier), or a closure
    /// `Fn(&Request<B>, &Tiers) -> Option<Tier>` (`None`: the default
    /// tier). Without one, every request is in the default tier.
    pub fn classify<C2>(self, classify: C2) -> UtilizationShedLayer<C2, M> {
        UtilizationShedLayer {
            shedder: self.shedder,
            settings: self.settings.classify(classify),
        }
    }

    /// The `Retry-After` of a shed request (sent in whole seconds, rounded
    /// up; default 5 s).
    pub fn retry_after(mut self, after: Duration) -> Self {
        self.settings = self.settings.retry_after(after);
        self
    }

    /// Replaces the rejection response. The function receives the reason
    /// and can start from [`ShedRejection::default_response`].
    pub fn rejection<F, B>(mut self, f: F) -> Self
    where
        F: Fn(&ShedRejection<'_>) -> Response<B> + Send + Sync + 'static,
        B: Into<Bytes>,
    {
        self.settings = self.settings.rejection(f);
        self
    }

    /// gRPC mode, for tonic servers: a shed call gets an HTTP 200
    /// trailers-only response with `grpc-status` `UNAVAILABLE` and the
    /// retry hints gRPC clients read ([`ShedRejection::grpc_response`];
    /// see the [gRPC guide](crate::grpc)). A custom
    /// [`rejection`](Self::rejection) still replaces it. Give the layer
    /// only gRPC traffic: it does not look at `content-type`.
    pub fn grpc(mut self) -> Self {
        self.settings = self.settings.grpc();
        self
    }

    /// Shadow mode: decide and count, but never shed, for trying new
    /// thresholds on live traffic before enforcing them. The shedder
    /// samples and moves its shed amount as usual, and flips its coin for
    /// every request; one it would drop goes on, counted in flight and as
    /// admitted in the tier's state (as `shadow_denied`, not `shed`, in
    /// [metrics](crate::metrics) and [`observe`](crate::observe)), with a
    /// `debug` event named `shadow-denied`.
    ///
    /// The shed fraction ([`TierState::shed_fraction`](crate::shed::TierState::shed_fraction),
    /// `fleetgate_shed_fraction`) stays the shedder's drop probability:
    /// what it would drop now, not what it drops. Since nothing is shed,
    /// the load it measures is the whole load, which enforcing would
    /// relieve: it rises sooner and further, and recovers later, than it
    /// would while enforcing. Read it as an upper bound; the shadow
    /// denials count what would have been dropped at it.
    pub fn shadow(mut self, shadow: bool) -> Self {
        self.settings = self.settings.shadow(shadow);
        self
    }

    /// Refuse with a [`ShedError`](crate::shed::ShedError) instead of an
    /// HTTP response; works around any `tower::Service`. An admitted call
    /// then holds its place in the in-flight count until the response
    /// future resolves.
    pub fn typed_errors(self) -> UtilizationShedLayer<C, mode::TypedErrors> {
        UtilizationShedLayer {
            shedder: self.shedder,
            settings: self.settings.typed_errors(),
        }
    }
}

impl<C: Clone, M> Clone for UtilizationShedLayer<C, M> {
    fn clone(&self) -> Self {
        UtilizationShedLayer {
            shedder: self.shedder.clone(),
            settings: self.settings.clone(),
        }
    }
}

impl<C, M> fmt::Debug for UtilizationShedLayer<C, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UtilizationShedLayer")
            .field("shedder", &self.shedder)
            .field("retry_after", &self.settings.retry_after)
            .field("shadow", &self.settings.shadow)
            .finish_non_exhaustive()
    }
}

impl<S, C: Clone, M> Layer<S> for UtilizationShedLayer<C, M> {
    type Service = UtilizationShed<S, C, M>;

    fn layer(&self, inner: S) -> Self::Service {
        let name: Arc<str> = Arc::from(self.shedder.name());
        let metrics = LayerMetrics::new("utilization_shed", name.clone());
        let settings = Arc::new(UtilizationSettings {
            shedder: self.shedder.clone(),
            answer: self.settings.answer(name, self.shedder.tiers()),
            shadow: self.settings.shadow,
            metrics,
        });
        // Read by `observe` while the service built here lives.
        let source: Arc<dyn ShedSource> = settings.clone();
        settings.metrics.observed().shedder(Arc::downgrade(&source));
        UtilizationShed::new(inner, self.settings.classify.clone(), settings)
    }
}
