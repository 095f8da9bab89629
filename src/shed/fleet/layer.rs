use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::Response;
use tower_layer::Layer;

use super::{FleetShed, FleetShedSettings, FleetShedder, TierGate};
use crate::layer::{FailurePolicy, mode};
use crate::metrics::LayerMetrics;
use crate::observe::ShedSource;
use crate::shed::layer::ShedLayerSettings;
use crate::shed::rejection::ShedRejection;

/// Sheds requests of the tiers whose share of the fleet's capacity is in
/// use, with a [`FleetShedder`]: `503 Service Unavailable` and
/// `Retry-After`.
///
/// Defaults: every request in the default tier until
/// [`classify`](Self::classify) says otherwise (`C = ()` classifies
/// nothing), `Retry-After: 1` (a slot frees up as soon as any request
/// ends), enforcing (not [shadow](Self::shadow)), fail open when the store
/// fails, HTTP responses for rejections
/// (`M` is [`mode::Http`], or [`mode::TypedErrors`] after
/// [`typed_errors`](Self::typed_errors)). See the
/// [module docs](crate::shed) for an example.
#[must_use]
pub struct FleetShedLayer<C = (), M = mode::Http> {
    shedder: FleetShedder,
    on_store_error: FailurePolicy,
    /// Under [`FailurePolicy::Local`]: the local shedder, shared by every
    /// clone of the layer and every service it makes.
    local: Option<FleetShedder>,
    settings: ShedLayerSettings<C, M>,
}

impl FleetShedLayer {
    /// Sheds requests with `shedder`.
    pub fn new(shedder: FleetShedder) -> Self {
        FleetShedLayer {
            shedder,
            on_store_error: FailurePolicy::default(),
            local: None,
            settings: ShedLayerSettings::new(Duration::from_secs(1)),
        }
    }
}

impl<C, M> FleetShedLayer<C, M> {
    /// The shedder.
    pub fn shedder(&self) -> &FleetShedder {
        &self.shedder
    }

    /// Which tier a request is in: a [`RouteTiers`](crate::shed::RouteTiers)
    /// table, a [`HeaderTier`](crate::shed::HeaderTier), or a closure
    /// `Fn(&Request<B>, &Tiers) -> Option<Tier>` (`None`: the default
    /// tier). Without one, every request is in the default tier.
    pub fn classify<C2>(self, classify: C2) -> FleetShedLayer<C2, M> {
        FleetShedLayer {
            shedder: self.shedder,
            on_store_error: self.on_store_error,
            local: self.local,
            settings: self.settings.classify(classify),
        }
    }

    /// The `Retry-After` of a shed request (sent in whole seconds, rounded
    /// up; default 1 s).
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

    /// Refuse with a [`ShedError`](crate::shed::ShedError) instead of an
    /// HTTP response; works around any `tower::Service`. An admitted call
    /// then holds its place (and its fleet lease) until the response
    /// future resolves.
    pub fn typed_errors(self) -> FleetShedLayer<C, mode::TypedErrors> {
        FleetShedLayer {
            shedder: self.shedder,
            on_store_error: self.on_store_error,
            local: self.local,
            settings: self.settings.typed_errors(),
        }
    }

    /// Shadow mode: decide and count, but never shed, for trying a new
    /// capacity or share on live traffic before enforcing it. A request
    /// its tier's share admits takes its fleet lease and holds it as
    /// usual, so the fleet's count in flight stays true; one that would be
    /// shed goes on without a lease, counted as `shadow_denied` in
    /// [metrics](crate::metrics) and [`observe`](crate::observe), with a
    /// `debug` event named `shadow-denied`. Nothing counts as shed: the
    /// tier's state ([`FleetShedder::state`]) counts such a request as
    /// admitted, and neither its shed fraction (the share of recent
    /// requests really shed) nor `fleetgate_shed_total` counts it as shed;
    /// read the would-be sheds from `shadow_denied`. A request the
    /// store failed on goes on whatever
    /// [`on_store_error`](Self::on_store_error) says (`fail_open`; under
    /// [`FailurePolicy::Local`] with a local lease if its share has room,
    /// `shadow_denied` if not).
    pub fn shadow(mut self, shadow: bool) -> Self {
        self.settings = self.settings.shadow(shadow);
        self
    }

    /// What to do when the store fails (default: let requests through).
    /// Failing closed refuses every tier but the most important, which
    /// this layer never refuses.
    ///
    /// With [`FailurePolicy::Local`], a request the store failed on is
    /// decided by an in-memory shedder of this process holding the given
    /// share of the capacity and of every tier's limit
    /// ([`FleetShedPolicy::scaled`](super::FleetShedPolicy::scaled)); its
    /// lease is given back there, never to the store. Its decisions count
    /// as `fallback_allowed` and `fallback_denied` in metrics (not
    /// `allowed` and `shed`: the fleet did not decide them), and what it
    /// sheds counts as shed in the tier's state.
    pub fn on_store_error(mut self, policy: FailurePolicy) -> Self {
        self.local = match policy {
            FailurePolicy::Local(share) => Some(self.shedder.local(share)),
            _ => None,
        };
        self.on_store_error = policy;
        self
    }
}

impl<C: Clone, M> Clone for FleetShedLayer<C, M> {
    fn clone(&self) -> Self {
        FleetShedLayer {
            shedder: self.shedder.clone(),
            on_store_error: self.on_store_error,
            local: self.local.clone(),
            settings: self.settings.clone(),
        }
    }
}

impl<C, M> fmt::Debug for FleetShedLayer<C, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FleetShedLayer")
            .field("shedder", &self.shedder)
            .field("on_store_error", &self.on_store_error)
            .field("retry_after", &self.settings.retry_after)
            .field("shadow", &self.settings.shadow)
            .finish_non_exhaustive()
    }
}

impl<S, C: Clone, M> Layer<S> for FleetShedLayer<C, M> {
    type Service = FleetShed<S, C, M>;

    fn layer(&self, inner: S) -> Self::Service {
        let policy = self.shedder.policy();
        let name: Arc<str> = Arc::from(policy.name());
        let tiers = policy.tiers();
        let metrics = LayerMetrics::new("fleet_shed", name.clone());
        let settings = |shedder: &FleetShedder, local: bool| {
            Arc::new(FleetShedSettings {
                shedder: shedder.clone(),
                answer: self.settings.answer(name.clone(), tiers),
                // The local shedder's memory store cannot fail; should it
                // ever, the request passes.
                failure: if local {
                    FailurePolicy::Open
                } else {
                    self.on_store_error
                },
                shadow: self.settings.shadow,
                metrics: metrics.clone(),
                local,
            })
        };
        let local = self.local.as_ref().map(|local| settings(local, true));
        let settings = settings(&self.shedder, false);
        // Read by `observe` while the service built here lives. The local
        // fallback shares the shedder's counters (the same state), so it
        // is read through the shedder's own settings.
        let source: Arc<dyn ShedSource> = settings.clone();
        metrics.observed().shedder(Arc::downgrade(&source));
        let gate = |tier| {
            let fallback = local.as_ref().map(|local| {
                Arc::new(TierGate {
                    settings: local.clone(),
                    tier,
                    limit: local.shedder.policy().limit(tier),
                    fallback: None,
                })
            });
            Arc::new(TierGate {
                settings: settings.clone(),
                tier,
                limit: policy.limit(tier),
                fallback,
            })
        };
        let gates = tiers.iter().map(gate).collect();
        let unclassified = gate(tiers.unclassified());
        FleetShed::new(inner, self.settings.classify.clone(), gates, unclassified)
    }
}
