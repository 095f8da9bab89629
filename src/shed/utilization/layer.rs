use std::sync::Arc;
use std::time::Duration;

use tower_layer::Layer;

use super::{UtilizationSettings, UtilizationShed, UtilizationShedder};
use crate::layer::mode;
use crate::metrics::LayerMetrics;
use crate::shed::layer::ShedLayer;

/// Sheds requests when this process has been overloaded for a while, with
/// a [`UtilizationShedder`]: least important tiers first, with rising
/// probability; `503 Service Unavailable` and `Retry-After`.
///
/// Defaults: every request in the default tier until
/// [`classify`](ShedLayer::classify) says otherwise, `Retry-After: 5`
/// (shedding lasts tens of seconds at least, so a quick retry would only be
/// shed again), HTTP responses for rejections. See the
/// [module docs](crate::shed) for an example.
pub type UtilizationShedLayer<C = (), M = mode::Http> = ShedLayer<UtilizationShedder, C, M>;

impl UtilizationShedLayer {
    /// Sheds requests with `shedder`.
    pub fn new(shedder: UtilizationShedder) -> Self {
        ShedLayer::with_defaults(shedder, Duration::from_secs(5))
    }
}

impl<S, C: Clone, M> Layer<S> for UtilizationShedLayer<C, M> {
    type Service = UtilizationShed<S, C, M>;

    fn layer(&self, inner: S) -> Self::Service {
        let name: Arc<str> = Arc::from(self.shedder.name());
        let settings = UtilizationSettings {
            shedder: self.shedder.clone(),
            answer: self.answer(name.clone(), self.shedder.tiers()),
            metrics: LayerMetrics::new("utilization_shed", name),
        };
        UtilizationShed::new(inner, self.classify.clone(), Arc::new(settings))
    }
}
