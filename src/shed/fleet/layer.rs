use std::sync::Arc;
use std::time::Duration;

use tower_layer::Layer;

use super::{FleetShed, FleetShedSettings, FleetShedder, TierGate};
use crate::layer::{FailurePolicy, mode};
use crate::metrics::LayerMetrics;
use crate::shed::layer::ShedLayer;

/// Sheds requests of the tiers whose share of the fleet's capacity is in
/// use, with a [`FleetShedder`]: `503 Service Unavailable` and
/// `Retry-After`.
///
/// Defaults: every request in the default tier until
/// [`classify`](ShedLayer::classify) says otherwise, `Retry-After: 1` (a
/// slot frees up as soon as any request ends), fail open when the store
/// fails, HTTP responses for rejections. See the
/// [module docs](crate::shed) for an example.
pub type FleetShedLayer<C = (), M = mode::Http> = ShedLayer<FleetShedder, C, M>;

impl FleetShedLayer {
    /// Sheds requests with `shedder`.
    pub fn new(shedder: FleetShedder) -> Self {
        ShedLayer::with_defaults(shedder, Duration::from_secs(1))
    }
}

impl<C, M> FleetShedLayer<C, M> {
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
        let local = match policy {
            FailurePolicy::Local(share) => Some(self.shedder.local(share)),
            _ => None,
        };
        self.on_store_error = (policy, local);
        self
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
                answer: self.answer(name.clone(), tiers),
                // The local shedder's memory store cannot fail; should it
                // ever, the request passes.
                failure: if local {
                    FailurePolicy::Open
                } else {
                    self.on_store_error.0
                },
                metrics: metrics.clone(),
                local,
            })
        };
        let local = self
            .on_store_error
            .1
            .as_ref()
            .map(|local| settings(local, true));
        let settings = settings(&self.shedder, false);
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
        FleetShed::new(inner, self.classify.clone(), gates, unclassified)
    }
}
