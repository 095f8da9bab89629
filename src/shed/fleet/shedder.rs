use std::fmt;
use std::sync::Arc;

use super::FleetShedPolicy;
use crate::clock::MonotonicClock;
use crate::concurrency::{Acquire, Admission, ConcurrencyLimiter, FleetLimit};
use crate::error::StoreError;
use crate::key::Key;
use crate::limiter::IntoStore;
use crate::share::LocalShare;
use crate::shed::state::{ShedState, TierCounters};
use crate::shed::tier::Tier;
use crate::store::{MemoryStore, Store};

/// The identity of the fleet's lease set: the built-in key extractors'
/// keys all start otherwise (`ip:`, `h:`, `hv:`, `host:`, `global`).
const FLEET_KEY: &str = "shed:fleet";

/// A [`FleetShedPolicy`] bound to a [`Store`]: one lease set for the whole
/// fleet, from which each request takes a lease up to its tier's limit. One
/// store round trip to admit, one to release, through the same leases as
/// the [`ConcurrencyLimiter`] (released when the guard drops, renewed while
/// held). Clones share everything.
///
/// The lease set is kept under the policy's name and the identity
/// `shed:fleet` (in Redis, `fleetgate:<policy>:{shed:fleet}:lease`), which
/// none of the built-in key extractors produces: a concurrency limit named
/// like the policy does not share it.
#[derive(Clone)]
pub struct FleetShedder {
    policy: FleetShedPolicy,
    limiter: ConcurrencyLimiter,
    key: Key,
    counters: Arc<TierCounters>,
    /// Where the capacity comes from when it is not the policy's.
    capacity: Option<FleetLimit>,
}

impl FleetShedder {
    /// Binds `policy` to `store`: a [`RedisStore`](crate::RedisStore) for a
    /// fleet, a [`MemoryStore`](crate::MemoryStore) for one instance.
    pub fn new(policy: FleetShedPolicy, store: impl IntoStore) -> Self {
        FleetShedder {
            counters: Arc::new(TierCounters::new(
                policy.tiers(),
                "fleet_shed",
                Arc::from(policy.name()),
                Arc::new(MonotonicClock::new()),
            )),
            limiter: ConcurrencyLimiter::new(policy.lease().clone(), store),
            key: Key::new(FLEET_KEY),
            policy,
            capacity: None,
        }
    }

    /// Takes the fleet's capacity from `limit` rather than the policy: the
    /// sum of the live instances' current concurrency limits (see
    /// [`FleetLimit`]), so that as each instance's adaptive limit finds
    /// less room the least important tier is shed first; the most
    /// important never is. Each tier's limit is its share of the capacity
    /// now ([`FleetShedPolicy::limit_at`]). The policy's capacity stays
    /// what the local fallback scales
    /// ([`FailurePolicy::Local`](crate::FailurePolicy::Local)).
    ///
    /// ```
    /// use fleetgate::concurrency::{AdaptiveLimit, ConcurrencyLimiter};
    /// use fleetgate::live::LivePolicies;
    /// use fleetgate::shed::{FleetShedPolicy, FleetShedder};
    /// use fleetgate::MemoryStore;
    ///
    /// # fn main() -> Result<(), fleetgate::ConfigError> {
    /// let store = MemoryStore::new();
    /// let live = LivePolicies::new(store.clone());
    /// let limit = AdaptiveLimit::gradient2().min(4).max(64).initial(8).build()?;
    /// let backend = ConcurrencyLimiter::adaptive("backend", limit)?;
    /// let fleet = FleetShedder::new(FleetShedPolicy::new("fleet", 64)?, store)
    ///     .capacity_from(live.fleet_limit(&backend));
    /// assert_eq!(fleet.capacity(), backend.limit()); // alone on a memory store
    /// # Ok(()) }
    /// ```
    pub fn capacity_from(mut self, limit: FleetLimit) -> Self {
        self.capacity = Some(limit);
        self
    }

    /// The fleet's capacity now: the policy's, or the
    /// [`FleetLimit`]'s it follows.
    pub fn capacity(&self) -> u64 {
        match &self.capacity {
            Some(limit) => limit.get(),
            None => self.policy.capacity(),
        }
    }

    /// The limit of `tier` now (`None` for the tier never shed).
    pub(crate) fn tier_limit(&self, tier: Tier) -> Option<u64> {
        match &self.capacity {
            Some(limit) => self.policy.limit_at(tier, limit.get()),
            None => self.policy.limit(tier),
        }
    }

    /// The policy.
    pub fn policy(&self) -> &FleetShedPolicy {
        &self.policy
    }

    /// The store.
    pub fn store(&self) -> &Arc<dyn Store> {
        self.limiter.store()
    }

    /// Takes a lease for a request of `tier` if the fleet has fewer requests
    /// in flight than the tier's limit. The most important tier always gets
    /// one: it is never shed, but it counts, so that the tiers below see
    /// the room it takes. A tier of another set is taken for the default
    /// tier. Cancellation-safe as [`ConcurrencyLimiter::acquire`] is.
    ///
    /// For use outside tower; [`state`](Self::state) counts only what a
    /// [`FleetShedLayer`](super::FleetShedLayer) decided.
    pub fn admit(&self, tier: Tier) -> Acquire {
        let tier = self.policy.tiers().clamp(tier);
        let capacity = self.tier_limit(tier).unwrap_or(u64::MAX);
        self.limiter.acquire_up_to(&self.key, capacity)
    }

    /// How many requests the whole fleet has in flight, asked of the store
    /// (one round trip, recording nothing).
    pub async fn fleet_in_flight(&self) -> Result<u64, StoreError> {
        // The stores have no counting operation: an acquire with no
        // capacity is always refused, records nothing and says how many
        // leases are held. Its lease id is drawn but never stored; only if
        // the store fails is a (harmless) release of it sent, as for any
        // acquire that may have reached the store.
        match self.limiter.acquire_up_to(&self.key, 0).await? {
            Admission::Refused(grant) => Ok(grant.in_flight()),
            Admission::Acquired(_) => Err(StoreError::UnexpectedReply(
                "a lease was granted with no capacity".into(),
            )),
        }
    }

    /// What this process has seen, per tier: in flight, admitted, shed, and
    /// the share of its recent requests shed
    /// ([`TierState::shed_fraction`](crate::shed::TierState::shed_fraction)).
    pub fn state(&self) -> ShedState {
        ShedState {
            tiers: self.counters.snapshot(|tier| self.tier_limit(tier)),
            in_flight: self.counters.in_flight(),
            utilization: None,
            amount: None,
        }
    }

    /// How many releases handed to spawned tasks have not reached the store
    /// yet.
    pub fn pending_releases(&self) -> usize {
        self.limiter.pending_releases()
    }

    /// Resolves once every release handed to a spawned task has reached the
    /// store (or failed): call it on shutdown. A release a Redis store
    /// retries stays pending while Redis is unreachable, for as long as its
    /// lease may still hold (see [`lease`](crate::lease)), so bound this
    /// wait with a timeout.
    pub async fn releases_settled(&self) {
        self.limiter.releases_settled().await;
    }

    pub(crate) fn counters(&self) -> &Arc<TierCounters> {
        &self.counters
    }

    /// The local fallback under [`FailurePolicy::Local`](crate::FailurePolicy::Local):
    /// `share` of the policy in this process's memory, counted in this
    /// shedder's state.
    pub(crate) fn local(&self, share: LocalShare) -> FleetShedder {
        let policy = self.policy.scaled(share);
        FleetShedder {
            counters: self.counters.clone(),
            limiter: ConcurrencyLimiter::new(policy.lease().clone(), MemoryStore::new()),
            key: self.key.clone(),
            policy,
            capacity: None,
        }
    }
}

impl fmt::Debug for FleetShedder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FleetShedder")
            .field("policy", &self.policy)
            .field("store", self.limiter.store())
            .finish()
    }
}
