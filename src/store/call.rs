//! The calls a limiter makes of its store: borrowed, so that deciding in
//! memory copies nothing. Not nameable outside the crate: the store's
//! operations are sealed.

use std::time::Duration;

use crate::key::Key;
use crate::limit::Policy;

/// One call to decide: which policy, for whom, at what cost. Borrowed, so
/// that deciding in memory copies nothing.
#[derive(Clone, Copy, Debug)]
pub struct GcraCall<'a> {
    pub(crate) policy: &'a Policy,
    pub(crate) key: &'a Key,
    pub(crate) cost: u64,
    pub(crate) max_wait: Duration,
}

impl GcraCall<'_> {
    pub(crate) fn max_wait_us(&self) -> u64 {
        u64::try_from(self.max_wait.as_micros()).unwrap_or(u64::MAX)
    }
}

/// One call to decide with a window algorithm: which policy, for whom, at
/// what cost. Borrowed, like [`GcraCall`].
#[derive(Clone, Copy, Debug)]
pub struct WindowCall<'a> {
    pub(crate) policy: &'a Policy,
    pub(crate) key: &'a Key,
    pub(crate) cost: u64,
}

impl WindowCall<'_> {
    /// The same call as an ordinary GCRA check.
    pub(crate) fn as_gcra(&self) -> GcraCall<'_> {
        GcraCall {
            policy: self.policy,
            key: self.key,
            cost: self.cost,
            max_wait: Duration::ZERO,
        }
    }
}
