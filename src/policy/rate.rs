//! [`Rate`]: how many events per period, the plain value every limit is
//! built from.

use std::fmt;
use std::time::Duration;

/// A long-run rate: `count` events per `period`.
///
/// Constructors say what they mean: `Rate::per_second(100)` is one hundred
/// per second. A rate is checked when a [`Limit`](crate::Limit) is built from it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Rate {
    count: u64,
    period: Duration,
}

impl Rate {
    /// `count` events per `period`.
    pub const fn new(count: u64, period: Duration) -> Self {
        Rate { count, period }
    }

    /// `count` events per second.
    pub const fn per_second(count: u64) -> Self {
        Rate::new(count, Duration::from_secs(1))
    }

    /// `count` events per minute.
    pub const fn per_minute(count: u64) -> Self {
        Rate::new(count, Duration::from_secs(60))
    }

    /// `count` events per hour.
    pub const fn per_hour(count: u64) -> Self {
        Rate::new(count, Duration::from_secs(3600))
    }

    /// `count` events per day.
    pub const fn per_day(count: u64) -> Self {
        Rate::new(count, Duration::from_secs(86_400))
    }

    /// How many events per period.
    pub const fn count(&self) -> u64 {
        self.count
    }

    /// The period.
    pub const fn period(&self) -> Duration {
        self.period
    }
}

impl fmt::Display for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/", self.count)?;
        fmt_period(self.period, f)
    }
}

fn fmt_period(period: Duration, f: &mut fmt::Formatter<'_>) -> fmt::Result {
    match in_unit(period) {
        (1, unit) => f.write_str(unit),
        (value, unit) => write!(f, "{value}{unit}"),
    }
}

/// A duration in the largest unit that holds it whole: `(90, "s")`.
fn in_unit(period: Duration) -> (u128, &'static str) {
    let micros = period.as_micros();
    if !period.subsec_nanos().is_multiple_of(1000) {
        (period.as_nanos(), "ns")
    } else if micros.is_multiple_of(86_400_000_000) {
        (micros / 86_400_000_000, "d")
    } else if micros.is_multiple_of(3_600_000_000) {
        (micros / 3_600_000_000, "h")
    } else if micros.is_multiple_of(60_000_000) {
        (micros / 60_000_000, "min")
    } else if micros.is_multiple_of(1_000_000) {
        (micros / 1_000_000, "s")
    } else if micros.is_multiple_of(1_000) {
        (micros / 1_000, "ms")
    } else {
        (micros, "us")
    }
}

/// A duration as the policy text writes it, in the largest unit that
/// holds it whole: `1h`, `90s`, `15min`.
pub(crate) struct DurationText(pub(crate) Duration);

impl fmt::Display for DurationText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (value, unit) = in_unit(self.0);
        write!(f, "{value}{unit}")
    }
}
