//! Upstream feedback: pushing an identity's next slot past a pause, for the
//! whole fleet at once.

use std::time::Duration;

use crate::key::Key;
use crate::limit::Policy;

/// A pause to record: every GCRA limit of `policy` for `key` is held back so
/// that at most `remaining` calls of the key are admitted before `pause`
/// from the store's "now" (with `remaining` 0, its next call comes no
/// earlier than that). Borrowed, like [`GcraCall`](super::GcraCall).
#[derive(Clone, Copy, Debug)]
pub struct DeferCall<'a> {
    pub(crate) policy: &'a Policy,
    pub(crate) key: &'a Key,
    pub(crate) pause: Duration,
    pub(crate) remaining: u64,
    /// How long before now the report was written, at the earliest (see
    /// `gcra::defer`).
    pub(crate) age: Duration,
}

impl DeferCall<'_> {
    pub(crate) fn pause_us(&self) -> u64 {
        u64::try_from(self.pause.as_micros()).unwrap_or(u64::MAX)
    }

    pub(crate) fn age_us(&self) -> u64 {
        u64::try_from(self.age.as_micros()).unwrap_or(u64::MAX)
    }
}
