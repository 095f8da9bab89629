//! Upstream feedback: pushing an identity's next slot past a pause, for the
//! whole fleet at once.

use std::time::Duration;

use super::StoreFuture;
use crate::key::Key;
use crate::limit::{MAX_TOLERANCE_MICROS, Policy};
use crate::limiter::Limiter;

/// A pause to record: every GCRA limit of `policy` for `key` is held back so
/// that the key's next call is admitted no earlier than `pause` from the
/// store's "now". Borrowed, like [`GcraCall`](super::GcraCall).
#[derive(Clone, Copy, Debug)]
pub struct DeferCall<'a> {
    pub(crate) policy: &'a Policy,
    pub(crate) key: &'a Key,
    pub(crate) pause: Duration,
}

impl DeferCall<'_> {
    /// The policy whose limits are held back.
    pub fn policy(&self) -> &Policy {
        self.policy
    }

    /// The identity to pause.
    pub fn key(&self) -> &Key {
        self.key
    }

    /// How long from now the next call must wait at least.
    pub fn pause(&self) -> Duration {
        self.pause
    }

    pub(crate) fn pause_us(&self) -> u64 {
        u64::try_from(self.pause.as_micros()).unwrap_or(u64::MAX)
    }
}

impl Limiter {
    /// Records that the upstream asked `key` to hold off for `pause`: the
    /// key's next call (under every limit of the policy) is admitted no
    /// earlier than `pause` from now, for every instance sharing the store,
    /// and calls then resume at the policy's rate, one at a time rather
    /// than with a full burst. One round trip; a state already further out
    /// is left as it is. `pause` is capped at
    /// [`MAX_TOLERANCE_MICROS`](crate::MAX_TOLERANCE_MICROS).
    ///
    /// Slots already handed out by [`reserve`](Self::reserve) keep their
    /// times: the pause holds back reservations made after it is recorded.
    ///
    /// ```
    /// use std::time::Duration;
    /// use fleetgate::clock::MonotonicClock;
    /// use fleetgate::{Key, Limit, Limiter, MemoryStore, Policy, Rate};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// // Paused time, and a store on tokio's clock: time stands still.
    /// let store = MemoryStore::builder().clock(MonotonicClock::new()).build();
    /// let limiter = Limiter::new(Policy::single("api", Limit::new(Rate::per_second(10))?)?, store);
    /// let token = Key::new("token:1");
    /// // The upstream answered 429 with `Retry-After: 30`.
    /// limiter.defer(&token, Duration::from_secs(30)).await?;
    /// let d = limiter.check(&token, 1).await?;
    /// assert_eq!(d.retry_after(), Some(Duration::from_secs(30)));
    /// # Ok(()) }
    /// ```
    pub fn defer(&self, key: &Key, pause: Duration) -> StoreFuture<()> {
        let cap = Duration::from_micros(MAX_TOLERANCE_MICROS);
        self.store().gcra_defer(DeferCall {
            policy: self.policy(),
            key,
            pause: pause.min(cap),
        })
    }
}
