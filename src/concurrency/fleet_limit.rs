//! A concurrency limit summed over the fleet's live instances.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use super::ConcurrencyLimiter;

/// A concurrency limit summed over the fleet: this process's current limit
/// ([`ConcurrencyLimiter::limit`]) plus the limits the other live
/// instances published with their last heartbeats (every second, through
/// a Redis store). Made by
/// [`LivePolicies::fleet_limit`](crate::live::LivePolicies::fleet_limit);
/// [`FleetShedder::capacity_from`](crate::shed::FleetShedder::capacity_from)
/// takes the fleet's capacity from it, so that each instance's adaptive
/// limit sets its part. Alone (a memory store, or before the first
/// heartbeat), it is this process's limit. Clones share everything.
#[derive(Clone)]
pub struct FleetLimit {
    own: ConcurrencyLimiter,
    /// The other live instances' limits, summed at the last heartbeat.
    others: Arc<AtomicU64>,
}

impl FleetLimit {
    pub(crate) fn new(own: ConcurrencyLimiter) -> Self {
        FleetLimit {
            own,
            others: Arc::default(),
        }
    }

    /// The limiter's policy name, under which its limit is published.
    pub fn name(&self) -> &str {
        self.own.policy().name()
    }

    /// The fleet's limit now: this process's plus the others' last
    /// published.
    pub fn get(&self) -> u64 {
        self.own()
            .saturating_add(self.others.load(Ordering::Relaxed))
    }

    /// This process's part: its limiter's current limit.
    pub fn own(&self) -> u64 {
        self.own.limit()
    }

    /// The other live instances' limits, as their heartbeats said.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn set_others(&self, sum: u64) {
        self.others.store(sum, Ordering::Relaxed);
    }
}

impl fmt::Debug for FleetLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FleetLimit")
            .field("name", &self.name())
            .field("own", &self.own())
            .field("fleet", &self.get())
            .finish()
    }
}
