//! Clocks for the stores that do not read Redis' own.
//!
//! The [`MemoryStore`](crate::MemoryStore) uses [`MonotonicClock`] by
//! default, which follows tokio's clock, so `tokio::time::pause` and
//! `advance` drive it in tests. [`ManualClock`] is set by hand.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A source of "now" in microseconds. Only differences matter to the
/// algorithms; the epoch is the clock's own.
pub trait Clock: Send + Sync + fmt::Debug + 'static {
    /// The current time in microseconds.
    fn now_micros(&self) -> u64;
}

/// tokio's monotonic clock, counted from when the clock was created.
///
/// Under `tokio::time::pause` it stands still until advanced. It only
/// measures time inside one process; use [`SystemClock`] where several
/// processes must agree.
#[derive(Clone, Copy, Debug)]
pub struct MonotonicClock {
    start: tokio::time::Instant,
}

impl MonotonicClock {
    /// A clock counting from now (from one second, where the platform's
    /// clock allows, so that zero never means "now").
    pub fn new() -> Self {
        let now = tokio::time::Instant::now();
        MonotonicClock {
            start: now.checked_sub(Duration::from_secs(1)).unwrap_or(now),
        }
    }
}

impl Default for MonotonicClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for MonotonicClock {
    fn now_micros(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_micros()).unwrap_or(u64::MAX)
    }
}

/// Wall-clock Unix time. Instances on several machines agree only as far as
/// their clocks do; prefer Redis' server clock where it is available.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_micros(&self) -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
            .unwrap_or(0)
    }
}

/// A clock set by hand, for tests. Clones share the same time.
///
/// ```
/// use fleetgate::clock::{Clock, ManualClock};
/// use std::time::Duration;
///
/// let clock = ManualClock::new(Duration::from_secs(10));
/// clock.advance(Duration::from_millis(1500));
/// assert_eq!(clock.now_micros(), 11_500_000);
/// ```
#[derive(Clone, Debug, Default)]
pub struct ManualClock {
    now: Arc<AtomicU64>,
}

impl ManualClock {
    /// A clock reading `start`.
    pub fn new(start: Duration) -> Self {
        let clock = ManualClock::default();
        clock.set(start);
        clock
    }

    /// Sets the time.
    pub fn set(&self, now: Duration) {
        let micros = u64::try_from(now.as_micros()).unwrap_or(u64::MAX);
        self.now.store(micros, Ordering::SeqCst);
    }

    /// Moves the time forward.
    pub fn advance(&self, by: Duration) {
        let micros = u64::try_from(by.as_micros()).unwrap_or(u64::MAX);
        let _ = self
            .now
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |now| {
                Some(now.saturating_add(micros))
            });
    }
}

impl Clock for ManualClock {
    fn now_micros(&self) -> u64 {
        self.now.load(Ordering::SeqCst)
    }
}
