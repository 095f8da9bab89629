//! The worker-utilization load shedder: local to one process, slow to
//! start shedding and slow to stop. See [`UtilizationShedLayer`].

mod controller;
mod future;
mod layer;
mod service;
mod shedder;

use bytes::Bytes;
use http::Response;

pub(crate) use self::future::ResponseFuture;
pub use self::layer::UtilizationShedLayer;
pub use self::service::UtilizationShed;
pub use self::shedder::{UtilizationShedder, UtilizationShedderBuilder};

use super::rejection::{Refusal, ShedAnswer, ShedRejectionKind};
use super::state::TierSlot;
use super::tier::Tier;
use crate::error::BoxError;
use crate::lease::{GuardedBody, LeaseGuard};
use crate::log::decision_span;
use crate::metrics::LayerMetrics;
use crate::outcome::Outcome;
use crate::response::Answer;
use crate::response::ResponseBody;

/// The response body of a [`UtilizationShed`] service: the inner body
/// holding the request's place in the in-flight count until it ends, or a
/// rejection's text.
pub(crate) type UtilizationShedBody<B> = GuardedBody<ResponseBody<B>, TierSlot>;

/// Settings every clone of a service and every response future shares.
pub(crate) struct UtilizationSettings {
    pub(crate) shedder: UtilizationShedder,
    pub(crate) answer: ShedAnswer,
    /// Shadow mode ([`UtilizationShedLayer::shadow`]): a request the
    /// shedder would drop goes on, only counted.
    pub(crate) shadow: bool,
    pub(crate) metrics: LayerMetrics,
}

impl crate::observe::ShedSource for UtilizationSettings {
    fn state(&self) -> super::ShedState {
        self.shedder.state()
    }

    fn id(&self) -> usize {
        self.shedder.id()
    }

    fn capacity(&self) -> Option<u64> {
        None
    }
}

impl UtilizationSettings {
    /// Admits a request of `tier` (of the shedder's set; holding its slot)
    /// or sheds it; in shadow mode admits it all the same. Counts and
    /// traces the decision.
    pub(crate) fn decide(&self, tier: Tier) -> Result<LeaseGuard<TierSlot>, Refusal> {
        let policy = &*self.answer.policy;
        let tier_name = self.answer.tiers.name(tier);
        let span = decision_span("utilization_shed", policy, Some(tier_name), None);
        let _entered = span.enter();
        let (outcome, verdict) = match self.shedder.would_drop(tier) {
            None => (Outcome::Allowed, Ok(self.shedder.enter(tier))),
            Some(probability) if self.shadow => {
                tracing::debug!(policy, tier = tier_name, probability, "shadow-denied");
                // In flight as any admitted request: it loads the process.
                (Outcome::ShadowDenied, Ok(self.shedder.enter(tier)))
            }
            Some(probability) => {
                tracing::debug!(policy, tier = tier_name, probability, "shed");
                self.shedder.shed(tier);
                let kind = ShedRejectionKind::Dropped { probability };
                (Outcome::Shed, Err(Refusal { tier, kind }))
            }
        };
        self.metrics.decided(outcome, false);
        span.record("outcome", outcome.as_str());
        verdict
    }
}

impl Answer for UtilizationSettings {
    type Refusal = Refusal;

    fn respond(&self, refusal: Refusal) -> Response<Bytes> {
        self.answer.respond(refusal)
    }

    fn fail(&self, refusal: Refusal) -> BoxError {
        self.answer.fail(refusal)
    }
}
