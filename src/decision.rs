//! The answer to "may this call pass?".

use std::sync::Arc;
use std::time::Duration;

/// What a limiter decided for one call.
///
/// A decision names the limit that decided it: when allowed, the limit with
/// the least room left; when denied, the limit that asks for the longest
/// wait. Times are relative to the moment the store decided.
///
/// The window algorithms also report every other limit of a policy of
/// several windows ([`remaining_of`](Self::remaining_of),
/// [`reset_of`](Self::reset_of)); GCRA reports the deciding limit only.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    pub(crate) allowed: bool,
    pub(crate) limit: usize,
    pub(crate) remaining: u64,
    /// Times in microseconds, as the stores count them: turned into
    /// `Duration`s only when asked for.
    pub(crate) reset_us: u64,
    pub(crate) retry_us: Option<u64>,
    pub(crate) wait_us: u64,
    /// `(remaining, reset)` of every limit, by position, when the store
    /// reported them all (window algorithms, policies of several limits).
    pub(crate) each: Option<Arc<[(u64, Duration)]>>,
    /// Refused by a penalty box ([`LimitBuilder::block_for`](crate::LimitBuilder::block_for)).
    pub(crate) blocked: bool,
}

impl Decision {
    /// Whether the call may pass.
    pub fn is_allowed(&self) -> bool {
        self.allowed
    }

    /// Whether the call was refused by a penalty box
    /// ([`LimitBuilder::block_for`](crate::LimitBuilder::block_for)): the
    /// identity is refused until [`retry_after`](Self::retry_after), by the
    /// limit [`limit_index`](Self::limit_index) names, whatever its calls.
    pub fn is_blocked(&self) -> bool {
        self.blocked
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
        Duration::from_micros(self.reset_us)
    }

    /// When denied, how long until the same call would pass. `None` when
    /// allowed, and when denied because the call's cost is above the burst,
    /// so that it can never pass.
    pub fn retry_after(&self) -> Option<Duration> {
        self.retry_us.map(Duration::from_micros)
    }

    /// What [`remaining`](Self::remaining) says, for limit `index` of the
    /// policy: known for the deciding limit, and for every limit when a
    /// window algorithm decided a policy of several windows. `None` when
    /// not reported.
    ///
    /// A denied call is charged nowhere, so for a denial each window's
    /// figure is its room before the call.
    pub fn remaining_of(&self, index: usize) -> Option<u64> {
        self.state_of(index).map(|(remaining, _)| remaining)
    }

    /// What [`reset`](Self::reset) says, for limit `index` of the policy;
    /// known as for [`remaining_of`](Self::remaining_of).
    pub fn reset_of(&self, index: usize) -> Option<Duration> {
        self.state_of(index).map(|(_, reset)| reset)
    }

    fn state_of(&self, index: usize) -> Option<(u64, Duration)> {
        match &self.each {
            Some(each) => each.get(index).copied(),
            None => (index == self.limit).then(|| (self.remaining, self.reset())),
        }
    }

    /// In reserve mode, how long the caller must wait before using its slot
    /// (zero for an ordinary check).
    pub fn wait(&self) -> Duration {
        Duration::from_micros(self.wait_us)
    }

    /// A denial for a call whose cost no limit could ever admit. The key's
    /// state is not read, so `remaining` and `reset` say nothing (zero).
    pub(crate) fn never(limit: usize) -> Self {
        Decision {
            allowed: false,
            limit,
            remaining: 0,
            reset_us: 0,
            retry_us: None,
            wait_us: 0,
            each: None,
            blocked: false,
        }
    }
}
