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
    /// Admits a request of `tier` (holding its slot) or sheds it. Counts
    /// and traces the decision.
    pub(crate) fn decide(&self, tier: Tier) -> Result<LeaseGuard<TierSlot>, Refusal> {
        let span = decision_span(
            "utilization_shed",
            &self.answer.policy,
            Some(self.answer.tiers.name(tier)),
            None,
        );
        let _entered = span.enter();
        let (outcome, verdict) = match self.shedder.admit(tier) {
            Ok(slot) => (Outcome::Allowed, Ok(slot)),
            Err(probability) => {
                tracing::debug!(
                    policy = &*self.answer.policy,
                    tier = self.answer.tiers.name(tier),
                    probability,
                    "shed"
                );
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
