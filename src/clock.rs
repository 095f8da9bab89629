//! Clocks for the stores that do not read Redis' own.
//!
//! The [`MemoryStore`](crate::MemoryStore) uses [`FastClock`] by default,
//! the CPU's own counter, which costs a few nanoseconds a read. Tests that
//! drive time with `tokio::time::pause` and `advance` give the store
//! [`MonotonicClock`] instead, which follows tokio's clock:
//!
//! ```
//! use fleetgate::MemoryStore;
//! use fleetgate::clock::MonotonicClock;
//!
//! // In a test with paused time: the store's time is tokio's.
//! let store = MemoryStore::builder().clock(MonotonicClock::new()).build();
//! # drop(store);
//! ```
//!
//! [`ManualClock`] is set by hand.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// A source of "now" in microseconds. Only differences matter to the
/// algorithms; the epoch is the clock's own.
pub trait Clock: Send + Sync + fmt::Debug + 'static {
    /// The current time in microseconds.
    fn now_micros(&self) -> u64;

    /// The Unix time, in microseconds, at which this clock read zero: what
    /// calendar quotas ([`Algorithm::Calendar`](crate::Algorithm::Calendar))
    /// add to a reading to find its calendar day. By default 0, a clock
    /// that reads Unix time (as [`ManualClock`] does: `ManualClock::new(d)`
    /// starts `d` after 1970); the clocks that count from their creation
    /// say when that was.
    fn unix_epoch_micros(&self) -> u64 {
        0
    }
}

/// The CPU's time-stamp counter (x86) or system counter (ARM), read
/// through [quanta](https://docs.rs/quanta) and scaled to microseconds,
/// counted from when the clock was created: the memory store's default.
///
/// A read costs a few nanoseconds, against a few tens for the operating
/// system's clock on many virtual machines. The counter is calibrated
/// against the OS's monotonic clock once per process, when the first such
/// clock is made (a few milliseconds typically, 200 ms at most); where the
/// CPU has no invariant counter, the OS's monotonic clock is read instead.
///
/// It does not follow `tokio::time::pause`; give a store [`MonotonicClock`]
/// for that.
#[derive(Clone, Debug)]
pub struct FastClock {
    clock: quanta::Clock,
    /// The counter's raw value when the clock was made.
    start: u64,
    /// The Unix time at which this clock read zero.
    epoch: u64,
}

impl FastClock {
    /// A clock counting from now (from one second, so that zero never
    /// means "now").
    pub fn new() -> Self {
        let clock = quanta::Clock::new();
        let start = clock.raw();
        // Read zero one second before its creation (see `now_micros`).
        let epoch = unix_now().saturating_sub(1_000_000);
        FastClock {
            clock,
            start,
            epoch,
        }
    }
}

impl Default for FastClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for FastClock {
    #[inline]
    fn now_micros(&self) -> u64 {
        // Raw reads scaled once, as a difference: a multiply and a shift.
        // A counter read behind `start` (another core's counter, a hair
        // behind) counts as no time at all.
        let nanos = self.clock.delta_as_nanos(self.start, self.clock.raw());
        1_000_000 + nanos / 1000
    }

    fn unix_epoch_micros(&self) -> u64 {
        self.epoch
    }
}

/// tokio's monotonic clock, counted from when the clock was created.
///
/// Under `tokio::time::pause` it stands still until advanced, which makes
/// it the clock for tests of time-dependent behaviour; it costs a read of
/// the OS clock (plus tokio's check for paused time where tokio's
/// `test-util` feature is on). It only measures time inside one process.
/// Where several processes must agree, Redis decides on its own clock.
#[derive(Clone, Copy, Debug)]
pub struct MonotonicClock {
    start: tokio::time::Instant,
    /// The Unix time at which this clock read zero.
    epoch: u64,
}

impl MonotonicClock {
    /// A clock counting from now (from one second, where the platform's
    /// clock allows, so that zero never means "now").
    pub fn new() -> Self {
        let now = tokio::time::Instant::now();
        let start = now.checked_sub(Duration::from_secs(1)).unwrap_or(now);
        let behind = u64::try_from((now - start).as_micros()).unwrap_or(0);
        MonotonicClock {
            start,
            epoch: unix_now().saturating_sub(behind),
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

    fn unix_epoch_micros(&self) -> u64 {
        self.epoch
    }
}

/// The system's wall clock, in Unix microseconds (0 before 1970).
fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// Wall-clock Unix time, for Redis scripts given the caller's clock
/// ([`TimeSource::system_clock`](crate::TimeSource::system_clock)).
/// Instances on several machines agree only as far as their clocks do.
#[cfg(feature = "redis")]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct SystemClock;

#[cfg(feature = "redis")]
impl Clock for SystemClock {
    fn now_micros(&self) -> u64 {
        unix_now()
    }
}

/// A clock set by hand, for tests. Clones share the same time.
///
/// Given to a [`RedisStore`](crate::RedisStore) as its
/// [`TimeSource::Client`](crate::TimeSource::Client), it must not fall
/// more than a minute behind real time between two calls on one identity:
/// Redis expires keys on its own clock (see there).
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    /// The default clock starts at one second and keeps pace with the OS's
    /// monotonic clock (its calibration reference) to within a millisecond
    /// over 20 ms.
    #[test]
    fn fast_clock_keeps_pace_with_the_os_clock() {
        let clock = FastClock::new();
        let os = Instant::now();
        let first = clock.now_micros();
        assert!(first >= 1_000_000, "starts at one second, read {first}");
        while os.elapsed() < Duration::from_millis(20) {
            std::hint::spin_loop();
        }
        let counted = clock.now_micros() - first;
        let elapsed = u64::try_from(os.elapsed().as_micros()).unwrap_or(u64::MAX);
        assert!(
            counted + 1_000 >= 20_000 && counted <= elapsed + 1_000,
            "counted {counted} µs while the OS clock counted 20000..={elapsed} µs"
        );
    }

    /// Clones read the same time line.
    #[test]
    fn fast_clock_clones_share_the_start() {
        let clock = FastClock::new();
        let copy = clock.clone();
        let (a, b) = (clock.now_micros(), copy.now_micros());
        assert!(b >= a && b - a < 1_000, "{a} then {b}");
    }
}
