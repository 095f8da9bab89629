//! The answer to "may this call pass?".

use std::time::Duration;

/// What a limiter decided for one call.
///
/// A decision names the limit that decided it: when allowed, the limit with
/// the least room left; when denied, the limit that asks for the longest
/// wait. Times are relative to the moment the store decided.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    pub(crate) allowed: bool,
    pub(crate) limit: usize,
    pub(crate) remaining: u64,
    pub(crate) reset: Duration,
    pub(crate) retry_after: Option<Duration>,
    pub(crate) wait: Duration,
}

impl Decision {
    /// Whether the call may pass.
    pub fn is_allowed(&self) -> bool {
        self.allowed
    }

    /// Index (into [`Policy::limits`](crate::Policy::limits)) of the limit
    /// that decided.
    pub fn limit_index(&self) -> usize {
        self.limit
    }

    /// How many more calls of cost 1 the deciding limit would admit right
    /// now, after this one.
    pub fn remaining(&self) -> u64 {
        self.remaining
    }

    /// Time until the deciding limit is back to its full burst.
    pub fn reset(&self) -> Duration {
        self.reset
    }

    /// When denied, how long until the same call would pass. `None` when
    /// allowed, and when denied because the call's cost is above the burst,
    /// so that it can never pass.
    pub fn retry_after(&self) -> Option<Duration> {
        self.retry_after
    }

    /// In reserve mode, how long the caller must wait before using its slot
    /// (zero for an ordinary check).
    pub fn wait(&self) -> Duration {
        self.wait
    }

    /// A denial for a call whose cost no limit could ever admit. The key's
    /// state is not read, so `remaining` and `reset` say nothing (zero).
    pub(crate) fn never(limit: usize) -> Self {
        Decision {
            allowed: false,
            limit,
            remaining: 0,
            reset: Duration::ZERO,
            retry_after: None,
            wait: Duration::ZERO,
        }
    }
}
