//! The fleet load shedder: one count of requests in flight for the whole
//! fleet, of which each tier may use only its share, so that the rest stays
//! free for more important traffic. See [`FleetShedLayer`].

mod future;
mod layer;
mod policy;
mod service;
mod shedder;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::Response;

pub(crate) use self::future::ResponseFuture;
pub use self::layer::FleetShedLayer;
pub use self::policy::{FleetShedPolicy, FleetShedPolicyBuilder};
pub use self::service::FleetShed;
pub use self::shedder::FleetShedder;

use super::rejection::{Refusal, ShedAnswer, ShedRejectionKind};
use super::state::TierSlot;
use super::tier::Tier;
use crate::concurrency::Gate;
use crate::concurrency::{Admission, ConcurrencyBody};
use crate::error::BoxError;
use crate::error::StoreError;
use crate::key::Key;
use crate::layer::{FailurePolicy, fall_back_locally, log_store_failure};
use crate::lease::{GuardedBody, LeaseGuard, StoreLease};
use crate::log::decision_span;
use crate::metrics::LayerMetrics;
use crate::outcome::Outcome;
use crate::response::Answer;

/// The response body of a [`FleetShed`] service: the inner body holding
/// the request's fleet lease and its place in this process's count until
/// it ends, or a rejection's text.
pub(crate) type FleetShedBody<B> = GuardedBody<ConcurrencyBody<B>, TierSlot>;

/// Settings every clone of a service and every response future shares.
pub(crate) struct FleetShedSettings {
    pub(crate) shedder: FleetShedder,
    pub(crate) answer: ShedAnswer,
    pub(crate) failure: FailurePolicy,
    /// Shadow mode ([`FleetShedLayer::shadow`]): a request the shedder
    /// would shed goes on without a lease, only counted.
    pub(crate) shadow: bool,
    pub(crate) metrics: LayerMetrics,
    /// Whether these are a local fallback's settings: outcomes are counted
    /// as `fallback_*`.
    pub(crate) local: bool,
}

impl crate::observe::ShedSource for FleetShedSettings {
    fn state(&self) -> super::ShedState {
        self.shedder.state()
    }

    fn id(&self) -> usize {
        Arc::as_ptr(self.shedder.counters()) as usize
    }

    fn capacity(&self) -> Option<u64> {
        Some(self.shedder.capacity())
    }
}

/// The settings as seen by requests of one tier: one per tier, built with
/// the layer, so that deciding costs no allocation.
pub(crate) struct TierGate {
    pub(crate) settings: Arc<FleetShedSettings>,
    pub(crate) tier: Tier,
    pub(crate) limit: Option<u64>,
    /// Under [`FailurePolicy::Local`]: the local shedder's gate for the
    /// same tier, deciding the requests the store failed on.
    pub(crate) fallback: Option<Arc<TierGate>>,
}

impl TierGate {
    fn log_failure(&self, err: &StoreError) {
        let settings = &self.settings;
        let store = settings.shedder.store();
        log_store_failure(
            "load-shedder",
            &settings.answer.policy,
            store,
            err,
            settings.failure,
        );
    }

    fn pass(&self, outcome: Outcome, span: &tracing::Span) {
        self.settings.metrics.decided(outcome, false);
        span.record("outcome", outcome.as_str());
        self.settings.shedder.counters().decided(self.tier, false);
    }
}

impl Answer for TierGate {
    type Refusal = Refusal;

    fn respond(&self, refusal: Refusal) -> Response<Bytes> {
        self.settings.answer.respond(refusal)
    }

    fn fail(&self, refusal: Refusal) -> BoxError {
        self.settings.answer.fail(refusal)
    }
}

impl Gate for TierGate {
    fn admit(
        &self,
        result: Result<Admission, StoreError>,
        latency: Option<Duration>,
        _key: Option<&Key>,
    ) -> Result<Option<LeaseGuard<StoreLease>>, Refusal> {
        let settings = &self.settings;
        let tier_name = settings.answer.tiers.name(self.tier);
        let span = decision_span(
            "fleet_shed",
            &settings.answer.policy,
            Some(tier_name),
            latency,
        );
        let _entered = span.enter();
        match (result, self.limit) {
            (Ok(Admission::Acquired(guard)), _) => {
                self.pass(Outcome::Allowed.by_fallback(self.settings.local), &span);
                Ok(Some(guard))
            }
            // Unreachable with an unbounded capacity; never shed all the same.
            (Ok(Admission::Refused(_)), None) => {
                self.pass(Outcome::Allowed.by_fallback(self.settings.local), &span);
                Ok(None)
            }
            (Ok(Admission::Refused(grant)), Some(limit)) => {
                // A capacity that follows the fleet's limits moves.
                let limit = settings.shedder.tier_limit(self.tier).unwrap_or(limit);
                let policy = &*settings.answer.policy;
                let in_flight = grant.in_flight();
                if settings.shadow {
                    // On without a lease, counted as admitted in the
                    // tier's state: nothing was shed.
                    tracing::debug!(policy, tier = tier_name, in_flight, limit, "shadow-denied");
                    self.pass(Outcome::ShadowDenied, &span);
                    return Ok(None);
                }
                tracing::debug!(policy, tier = tier_name, in_flight, limit, "shed");
                let outcome = Outcome::Shed.by_fallback(settings.local);
                settings.metrics.decided(outcome, false);
                span.record("outcome", outcome.as_str());
                settings.shedder.counters().decided(self.tier, true);
                Err(Refusal {
                    tier: self.tier,
                    kind: ShedRejectionKind::OverLimit { in_flight, limit },
                })
            }
            (Err(err), limit) => {
                self.log_failure(&err);
                // The most important tier passes whatever the policy: this
                // shedder never refuses it; nor does shadow mode refuse
                // any. `Local` reaches here only if its own store failed.
                if limit.is_some()
                    && !settings.shadow
                    && matches!(settings.failure, FailurePolicy::Closed)
                {
                    settings.metrics.decided(Outcome::FailClosed, false);
                    span.record("outcome", Outcome::FailClosed.as_str());
                    return Err(self.broken(err));
                }
                self.pass(Outcome::FailOpen, &span);
                Ok(None)
            }
        }
    }

    fn broken(&self, err: StoreError) -> Refusal {
        Refusal {
            tier: self.tier,
            kind: ShedRejectionKind::Unavailable(err),
        }
    }

    fn fall_back(
        gate: &mut Arc<TierGate>,
        result: Result<Admission, StoreError>,
        _key: Option<&Key>,
    ) -> Result<Admission, StoreError> {
        fall_back_locally(
            gate,
            result,
            |g| g.fallback.as_ref(),
            TierGate::log_failure,
            |local| local.settings.shedder.admit(local.tier).take_ready(),
        )
    }
}
