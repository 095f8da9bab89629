//! Calendar quotas over one or more quotas at once: "10,000 calls per
//! month", reset at the start of each calendar day or month in a time
//! zone. A fixed window whose boundaries are calendar boundaries: one
//! tally per quota, forgotten when its period ends.
//!
//! The one definition of the algorithm, for every operation: [`check`],
//! [`peek`], [`charge`] and [`refund`], pure functions of (tallies, now,
//! quotas). [`Calendar::period`] turns an instant into its period; the
//! operations take each quota's period already resolved, so they need no
//! time-zone database, and neither does `lua/calendar.lua`, which
//! transcribes them and [`period_at`] function by function for Redis. How
//! the quotas of a policy combine is in the [window module](super::window)
//! (a quota is a window there).
//!
//! A quota holding `count` per period, for a call of cost `n` at `now`:
//!
//! ```text
//! [start, end) = the day (local midnight to midnight) or month (the 1st
//!                at 00:00 to the next 1st) holding now, in the zone
//! used         = cost admitted in [start, end)
//! admit        ⇔ used + n ≤ count;  remaining = count − used (− n)
//! retry = reset = end − now
//! ```
//!
//! A local day is 23 or 25 hours across a daylight-saving change; where
//! midnight does not exist (the clocks jump over it) the day starts at its
//! first instant, as `jiff`'s `start_of_day` has it. Unix microseconds;
//! a period that starts before 1970 starts at 0 here.
//!
//! The stored tally keeps its period's end beside its start: a call whose
//! clock is behind the one that wrote it (a stored start later than the
//! resolved one, as with fixed windows) is decided in the stored period,
//! and its reset and retry run to that period's end, which the caller
//! then knows without resolving the calendar again (a Redis script could
//! not: it has no time-zone database).
//!
//! A charge past the count lets nothing pass until the period ends, and
//! the overdraft is forgotten with the rest of the count.

use std::fmt;
use std::ops::Range;
use std::str::FromStr;
use std::time::Duration;

use jiff::Timestamp;
use jiff::civil::{Date, DateTime};
use jiff::tz::{Offset, TimeZone};

use super::MAX_LIMITS_PER_POLICY;
use super::window::{EMPTY, MAX_COUNTED, Verdict, Verdicts, Window, admit, charged, combine};
use crate::decision::Decision;

const DAY_US: u64 = 86_400_000_000;

/// How long a calendar quota's period is: a calendar day or a calendar
/// month, in the [`Calendar`]'s time zone.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum CalendarPeriod {
    /// From local midnight to the next: 24 hours, or 23 or 25 on the days
    /// the clocks change.
    Day,
    /// From the 1st at local midnight to the next 1st: 28 to 31 days.
    Month,
}

impl CalendarPeriod {
    /// `day` or `month`, as policy texts write it.
    pub fn name(self) -> &'static str {
        match self {
            CalendarPeriod::Day => "day",
            CalendarPeriod::Month => "month",
        }
    }
}

impl fmt::Display for CalendarPeriod {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// When a calendar quota resets: at the start of each calendar day or
/// month in a time zone, UTC unless another is named.
///
/// The zone is a name from the IANA time-zone database, daylight-saving
/// changes included (`Europe/Paris`: a day of 23 hours in March and of 25
/// in October), read from the system's copy of the database
/// (`/usr/share/zoneinfo`, or the directory `TZDIR` names) when the
/// calendar is made; or a fixed offset from UTC (`+02:00`, `-05:30`); or
/// `UTC` (also `Z`), the default.
///
/// Written as text it reads as policy texts write it: `day`, `month`,
/// `day tz=Europe/Paris`, `month tz=+02:00` (UTC writes no zone), and
/// that text parses back ([`FromStr`]).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Calendar {
    unit: CalendarPeriod,
    zone: Zone,
}

/// A calendar's zone: its name as written back (`None` for UTC; an IANA
/// name as the database spells it, or `±HH:MM`), which alone says which
/// zone it is, and the rules to resolve instants with.
#[derive(Clone)]
struct Zone {
    name: Option<Box<str>>,
    tz: TimeZone,
}

impl PartialEq for Zone {
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name
    }
}

impl Eq for Zone {}

impl std::hash::Hash for Zone {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.name.hash(state);
    }
}

impl fmt::Debug for Zone {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name.as_deref().unwrap_or("UTC"))
    }
}

/// A calendar that could not be made: an unknown period, zone or offset.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CalendarError {
    /// The zone is no name the system's time-zone database knows.
    #[error(
        "unknown time zone {name:?}: use an IANA zone name such as Europe/Paris, an offset such as +02:00, or UTC"
    )]
    UnknownZone {
        /// The name as given.
        name: String,
    },
    /// A named zone was asked for, but the system has no time-zone
    /// database to look it up in.
    #[error(
        "time zone {name:?} needs the system's time-zone database, which was not found (install tzdata, or set TZDIR to a zoneinfo directory); offsets such as +02:00 need none"
    )]
    NoZoneDatabase {
        /// The name as given.
        name: String,
    },
    /// A zone starting with `+` or `-` that is not an offset of at most
    /// 23:59.
    #[error(
        "invalid UTC offset {text:?}: use ±HH:MM (or ±HH, ±HHMM) with HH at most 23 and MM at most 59, such as +02:00 or -05:30"
    )]
    BadOffset {
        /// The offset as given.
        text: String,
    },
    /// A period other than a day or a month.
    #[error("unknown calendar period {text:?}: use day or month")]
    UnknownPeriod {
        /// The text as given.
        text: String,
    },
}

impl Calendar {
    /// A quota that resets at each calendar day's start, UTC unless
    /// [`zone`](Self::zone) names another.
    pub fn daily() -> Calendar {
        Calendar::new(CalendarPeriod::Day)
    }

    /// A quota that resets on the 1st of each month at 00:00, UTC unless
    /// [`zone`](Self::zone) names another.
    pub fn monthly() -> Calendar {
        Calendar::new(CalendarPeriod::Month)
    }

    /// A quota that resets at the start of each `unit`, in UTC.
    pub fn new(unit: CalendarPeriod) -> Calendar {
        Calendar {
            unit,
            zone: Zone {
                name: None,
                tz: TimeZone::UTC,
            },
        }
    }

    /// The same calendar in the time zone `zone`: an IANA name
    /// (`Europe/Paris`, any case), an offset (`+02:00`, `-05:30`; also
    /// `+02`, `+0200`) or `UTC` (`Z`). An offset of zero is UTC.
    pub fn zone(self, zone: &str) -> Result<Calendar, CalendarError> {
        Ok(Calendar {
            unit: self.unit,
            zone: Zone::named(zone)?,
        })
    }

    /// Whether the quota resets daily or monthly.
    pub fn unit(&self) -> CalendarPeriod {
        self.unit
    }

    /// The zone as it is written back (`Europe/Paris`, `+02:00`), or
    /// `None` for UTC.
    pub fn zone_name(&self) -> Option<&str> {
        self.zone.name.as_deref()
    }

    /// A period's nominal length, for what needs a window length (the
    /// `w=` of `RateLimit-Policy`): a day is 86,400 s, a month 30 days.
    pub(crate) fn nominal(&self) -> Duration {
        Duration::from_micros(self.nominal_us())
    }

    fn nominal_us(&self) -> u64 {
        match self.unit {
            CalendarPeriod::Day => DAY_US,
            CalendarPeriod::Month => 30 * DAY_US,
        }
    }

    /// The period holding the instant `unix_us` (Unix microseconds):
    /// `(start, end)` with `start ≤ unix_us < end`, in the zone. Beyond
    /// what the calendar can resolve (the year 9999), periods of the
    /// nominal length from the epoch, so that every instant has one.
    pub(crate) fn period(&self, unix_us: u64) -> (u64, u64) {
        self.civil_period(unix_us).unwrap_or_else(|| {
            let length = self.nominal_us();
            let start = unix_us / length * length;
            (start, start.saturating_add(length))
        })
    }

    /// What a caller without the calendar (a Redis script, on a clock of
    /// its own) needs to resolve the period of an instant near
    /// `unix_us`: the boundaries `[b0, b1, b2, b3]` of the period before
    /// the one holding `unix_us`, that one (`[b1, b2)`) and the next.
    /// [`period_at`] picks from them.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn bounds(&self, unix_us: u64) -> [u64; 4] {
        let (start, end) = self.period(unix_us);
        let (before, _) = self.period(start.saturating_sub(1));
        let (_, after) = self.period(end);
        [before.min(start), start, end, after.max(end)]
    }

    /// The period holding `t` by its local date, corrected by one period
    /// either way where a clock change moves the instant a boundary
    /// resolves to past `t` (midnight in a gap that starts before it, or
    /// in a fold), so that periods tile time: each ends where the next
    /// starts. `None` where jiff cannot resolve it.
    fn civil_period(&self, t: u64) -> Option<(u64, u64)> {
        let at = Timestamp::from_microsecond(i64::try_from(t).ok()?).ok()?;
        let mut first = self.first(self.zone.tz.to_datetime(at).date());
        let mut start = self.boundary(first)?;
        if start > t {
            first = self.first(first.yesterday().ok()?);
            start = self.boundary(first)?;
        }
        let next = self.next(first)?;
        let mut end = self.boundary(next)?;
        if end <= t {
            start = end;
            end = self.boundary(self.next(next)?)?;
        }
        (start <= t && t < end).then_some((start, end))
    }

    /// The first day of the period holding `date`.
    fn first(&self, date: Date) -> Date {
        match self.unit {
            CalendarPeriod::Day => date,
            CalendarPeriod::Month => date.first_of_month(),
        }
    }

    /// The first day of the period after the one starting on `first`.
    fn next(&self, first: Date) -> Option<Date> {
        match self.unit {
            CalendarPeriod::Day => first.tomorrow().ok(),
            CalendarPeriod::Month => first.last_of_month().tomorrow().ok(),
        }
    }

    /// The instant `date` starts at in the zone: local midnight, or the
    /// first instant after a gap holding it (jiff's compatible reading,
    /// as `start_of_day`), the earlier midnight of a fold. Clamped at the
    /// epoch.
    fn boundary(&self, date: Date) -> Option<u64> {
        let at = self.zone.tz.to_timestamp(DateTime::from(date)).ok()?;
        Some(u64::try_from(at.as_microsecond()).unwrap_or(0))
    }
}

impl Zone {
    fn named(zone: &str) -> Result<Zone, CalendarError> {
        if zone.eq_ignore_ascii_case("utc") || zone.eq_ignore_ascii_case("z") {
            return Ok(Zone {
                name: None,
                tz: TimeZone::UTC,
            });
        }
        if zone.starts_with(['+', '-']) {
            return Zone::offset(zone);
        }
        let unknown = || CalendarError::UnknownZone {
            name: zone.to_owned(),
        };
        match TimeZone::get(zone) {
            // `Etc/Unknown` reads as UTC in jiff; a policy meaning UTC says so.
            Ok(tz) if tz.is_unknown() => Err(unknown()),
            Ok(tz) => Ok(Zone {
                name: Some(tz.iana_name().unwrap_or(zone).into()),
                tz,
            }),
            Err(_) if jiff::tz::db().is_definitively_empty() => {
                Err(CalendarError::NoZoneDatabase {
                    name: zone.to_owned(),
                })
            }
            Err(_) => Err(unknown()),
        }
    }

    /// `±HH:MM`, `±HH` or `±HHMM`, at most 23:59 either way.
    fn offset(text: &str) -> Result<Zone, CalendarError> {
        let bad = || CalendarError::BadOffset {
            text: text.to_owned(),
        };
        let (sign, digits) = text.split_at(1);
        let (hh, mm) = match digits.as_bytes() {
            [_, _] => (digits, "00"),
            [_, _, b':', _, _] => (&digits[..2], &digits[3..]),
            [_, _, _, _] => (&digits[..2], &digits[2..]),
            _ => return Err(bad()),
        };
        // Digits only: `parse` would take a sign.
        let two = |s: &str| {
            if s.bytes().all(|b| b.is_ascii_digit()) {
                s.parse::<i32>().ok()
            } else {
                None
            }
        };
        let (Some(h), Some(m)) = (two(hh), two(mm)) else {
            return Err(bad());
        };
        if h > 23 || m > 59 {
            return Err(bad());
        }
        let seconds = (h * 3600 + m * 60) * if sign == "-" { -1 } else { 1 };
        if seconds == 0 {
            return Ok(Zone {
                name: None,
                tz: TimeZone::UTC,
            });
        }
        let offset = Offset::from_seconds(seconds).map_err(|_| bad())?;
        Ok(Zone {
            name: Some(format!("{sign}{h:02}:{m:02}").into()),
            tz: TimeZone::fixed(offset),
        })
    }
}

impl fmt::Display for Calendar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.unit.name())?;
        match &self.zone.name {
            Some(name) => write!(f, " tz={name}"),
            None => Ok(()),
        }
    }
}

impl FromStr for Calendar {
    type Err = CalendarError;

    /// `day` or `month` (plurals and any case are fine), then optionally
    /// ` tz=<zone>`: the text [`Display`](fmt::Display) writes.
    fn from_str(text: &str) -> Result<Calendar, CalendarError> {
        let text = text.trim();
        let (word, rest) = text.split_at(text.find(char::is_whitespace).unwrap_or(text.len()));
        let unknown = || CalendarError::UnknownPeriod {
            text: text.to_owned(),
        };
        let unit = unit_named(word).ok_or_else(unknown)?;
        match zone_text(rest) {
            ZoneText::None if rest.trim().is_empty() => Ok(Calendar::new(unit)),
            ZoneText::Zone(zone, span) if rest[span.end..].trim().is_empty() => {
                Calendar::new(unit).zone(zone)
            }
            _ => Err(unknown()),
        }
    }
}

/// The period a calendar unit word names: `day`, `days`, `month`,
/// `months`, any case. `d` is not one: `100/d` stays a rolling 24 hours
/// ([`Rate::per_day`](crate::Rate::per_day) writes itself so).
fn unit_named(word: &str) -> Option<CalendarPeriod> {
    match word.to_ascii_lowercase().as_str() {
        "day" | "days" => Some(CalendarPeriod::Day),
        "month" | "months" => Some(CalendarPeriod::Month),
        _ => None,
    }
}

/// What follows a unit word: nothing of ours, or a `tz=<zone>` (the
/// zone, and the span of the whole `tz=<zone>` in the text). A zone runs
/// to the next space: offsets and names such as `Etc/GMT+5` hold a `+`.
enum ZoneText<'a> {
    None,
    Zone(&'a str, Range<usize>),
}

fn zone_text(rest: &str) -> ZoneText<'_> {
    let space = rest.len() - rest.trim_start().len();
    let word = &rest[space..];
    let Some(zone) = word
        .get(..3)
        .filter(|key| key.eq_ignore_ascii_case("tz="))
        .map(|_| &word[3..])
    else {
        return ZoneText::None;
    };
    let len = zone.find(char::is_whitespace).unwrap_or(zone.len());
    ZoneText::Zone(&zone[..len], space..space + 3 + len)
}

/// What [`unit`] read: the calendar and how many bytes of the text after
/// the unit word it took, or what is wrong and where in that text.
pub(crate) type UnitText = Result<(Calendar, usize), (String, Range<usize>)>;

/// A calendar unit in a limit's text and what follows it, for the policy
/// parser: `word` is the unit word after `COUNT/`, `rest` the text after
/// it. `None` when `word` is no calendar unit (`d` is none: a rolling
/// 24 hours). Otherwise the calendar and how many bytes of `rest` its
/// ` tz=<zone>` took (0 when it names none), or what is wrong and where
/// in `rest`.
pub(crate) fn unit(word: &str, rest: &str) -> Option<UnitText> {
    let calendar = Calendar::new(unit_named(word)?);
    Some(match zone_text(rest) {
        ZoneText::None => Ok((calendar, 0)),
        ZoneText::Zone(zone, span) => match calendar.zone(zone) {
            Ok(calendar) => Ok((calendar, span.end)),
            // Point at the zone, not at `tz=`.
            Err(err) => Err((err.to_string(), span.start + 3..span.end)),
        },
    })
}

/// The period holding `now` among those `bounds` ([`Calendar::bounds`]
/// of a caller's clock) describe: `[b0, b1)`, `[b1, b2)` or `[b2, b3)`.
/// Before `b0`, `[b0, b1)`: a period later than `now`, as a stored start
/// later than a lagging clock. From `b3` on (clocks a period apart),
/// periods as long as the last one, `[b2, b3)`, counted on from `b3`.
/// Integers only: what a Redis script, on its own clock, transcribes
/// (`lua/calendar.lua`); in Rust the stores resolve periods with the
/// calendar itself, so only the tests call it.
#[cfg(test)]
pub(crate) fn period_at(bounds: &[u64; 4], now: u64) -> (u64, u64) {
    let [b0, b1, b2, b3] = *bounds;
    if now < b1 {
        (b0, b1)
    } else if now < b2 {
        (b1, b2)
    } else if now < b3 {
        (b2, b3)
    } else {
        let length = (b3 - b2).max(1);
        let start = b3 + (now - b3) / length * length;
        (start, start.saturating_add(length))
    }
}

/// One quota of a policy as a call at `now` sees it: the cost it admits
/// per period, and the period `[start, end)` its calendar gives for now
/// ([`Calendar::period`], or [`period_at`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Quota {
    pub(crate) count: u64,
    pub(crate) start: u64,
    pub(crate) end: u64,
    /// The period's nominal length ([`Calendar::nominal`]): what ties
    /// between quotas are broken by, as windows' lengths are, and what
    /// both stores know alike.
    pub(crate) nominal: u64,
}

/// What is stored for one quota: the period its count belongs to, end
/// included (see the module's doc for why), and the cost admitted in it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Tally {
    pub(crate) start: u64,
    pub(crate) end: u64,
    pub(crate) used: u64,
}

impl Tally {
    /// The period a call at `now` is decided in, with the cost already
    /// used in it, and whether that is this tally's period. The stored
    /// period when it is the quota's, or when it starts later and has not
    /// ended (a clock behind the one that wrote it: a stored start never
    /// moves back); otherwise the quota's, empty. A later stored period
    /// that has ended on this clock too was written under another
    /// calendar (the policy went from days to months, or changed its
    /// zone): it is left behind.
    fn at(&self, quota: &Quota, now: u64) -> (Tally, bool) {
        let stored = (self.start == quota.start && self.end == quota.end)
            || (self.start > quota.start && now < self.end);
        if stored {
            (*self, true)
        } else {
            let fresh = Tally {
                start: quota.start,
                end: quota.end,
                used: 0,
            };
            (fresh, false)
        }
    }
}

/// Calendar quotas, decided together as windows are. `tallies[i]` is
/// quota `i`'s state; an admitted call updates every one. Returns the
/// decision and, when admitted, the time from which the state means
/// nothing.
pub(crate) fn check(
    quotas: &[Quota],
    tallies: &mut [Tally],
    now: u64,
    cost: u64,
) -> (Decision, Option<u64>) {
    let verdicts = verdicts(quotas, tallies, now, cost);
    admit(&windows(quotas)[..quotas.len()], &verdicts, || {
        store(quotas, tallies, now, cost)
    })
}

/// What [`check`] would answer for a call of `cost` now, storing nothing.
pub(crate) fn peek(quotas: &[Quota], tallies: &[Tally], now: u64, cost: u64) -> Decision {
    combine(
        &windows(quotas),
        &verdicts(quotas, tallies, now, cost)[..quotas.len()],
    )
}

/// Takes `cost` from every quota whatever it holds: the count goes past
/// the quota's if need be; nothing passes until the period ends, and then
/// the overdraft is forgotten with the rest. Tallies saturate at
/// [`MAX_COUNTED`]. Returns the figures of now for a call of cost 1
/// (`standing` in the window module) and the time from which the state means nothing.
pub(crate) fn charge(
    quotas: &[Quota],
    tallies: &mut [Tally],
    now: u64,
    cost: u64,
) -> (Decision, u64) {
    let idle_at = store(quotas, tallies, now, cost);
    let verdicts = verdicts(quotas, tallies, now, 1);
    charged(&windows(quotas)[..quotas.len()], verdicts, idle_at)
}

/// Gives `cost` back: the tally of the period a call now is decided in
/// goes down by `cost`, not below 0; a tally of a period that has ended
/// is left as it is. Returns how much was given back.
pub(crate) fn refund(quotas: &[Quota], tallies: &mut [Tally], now: u64, cost: u64) -> u64 {
    let mut back = 0;
    for (q, t) in quotas.iter().zip(tallies.iter_mut()) {
        if t.at(q, now).1 {
            let less = t.used.min(cost);
            t.used -= less;
            back += less;
        }
    }
    back
}

/// The quotas as [`combine`] weighs windows: ties go to the longer
/// nominal period, so a month is reported over a day.
fn windows(quotas: &[Quota]) -> [Window; MAX_LIMITS_PER_POLICY] {
    let mut windows = [Window {
        length: 1,
        count: 0,
    }; MAX_LIMITS_PER_POLICY];
    for (w, q) in windows.iter_mut().zip(quotas) {
        *w = Window {
            length: q.nominal,
            count: q.count,
        };
    }
    windows
}

/// What each quota says about a call of `cost`, storing nothing.
fn verdicts(quotas: &[Quota], tallies: &[Tally], now: u64, cost: u64) -> Verdicts {
    let mut verdicts = EMPTY;
    for ((v, q), t) in verdicts.iter_mut().zip(quotas).zip(tallies) {
        let (period, _) = t.at(q, now);
        // A period ends after now unless the caller resolved it for
        // another instant; then the reset is 0, never a wrap-around.
        let reset = period.end.saturating_sub(now);
        let used = period.used;
        *v = if used.saturating_add(cost) <= q.count {
            Verdict {
                admits: true,
                remaining: q.count - used - cost,
                reset,
                retry: 0,
                before: (q.count - used, reset),
            }
        } else {
            let remaining = q.count.saturating_sub(used);
            Verdict {
                admits: false,
                remaining,
                reset,
                retry: reset,
                before: (remaining, reset),
            }
        };
    }
    verdicts
}

/// Adds `cost` to every quota's tally for the period it is decided in
/// (saturating at [`MAX_COUNTED`]); returns the time from which the state
/// means nothing.
fn store(quotas: &[Quota], tallies: &mut [Tally], now: u64, cost: u64) -> u64 {
    let mut idle_at = now;
    for (q, t) in quotas.iter().zip(tallies.iter_mut()) {
        let (period, _) = t.at(q, now);
        *t = Tally {
            used: period.used.saturating_add(cost).min(MAX_COUNTED),
            ..period
        };
        idle_at = idle_at.max(period.end);
    }
    idle_at
}

#[cfg(test)]
mod tests {
    use super::*;

    const H: u64 = 3_600_000_000;

    /// Unix microseconds of an RFC 3339 instant.
    fn at(text: &str) -> u64 {
        let ts: Timestamp = text.parse().unwrap();
        u64::try_from(ts.as_microsecond()).unwrap()
    }

    fn paris() -> Calendar {
        Calendar::daily().zone("Europe/Paris").unwrap()
    }

    fn quota(calendar: &Calendar, count: u64, now: u64) -> Quota {
        let (start, end) = calendar.period(now);
        Quota {
            count,
            start,
            end,
            nominal: calendar.nominal_us(),
        }
    }

    #[test]
    fn months_run_from_the_first_to_the_next_first() {
        let month = Calendar::monthly();
        let midnight = |date: &str| at(&format!("{date}T00:00:00Z"));
        for (inside, start, end, days) in [
            // February of a leap year, and of a common one.
            ("2024-02-15T12:00:00Z", "2024-02-01", "2024-03-01", 29),
            ("2026-02-28T23:59:59Z", "2026-02-01", "2026-03-01", 28),
            ("2026-01-31T23:00:00Z", "2026-01-01", "2026-02-01", 31),
            ("2026-04-01T00:00:00Z", "2026-04-01", "2026-05-01", 30),
            // December into January of the next year.
            ("2026-12-31T23:59:59Z", "2026-12-01", "2027-01-01", 31),
        ] {
            let period = month.period(at(inside));
            assert_eq!(period, (midnight(start), midnight(end)), "{inside}");
            assert_eq!(period.1 - period.0, days * 24 * H, "{inside}");
        }
        // A month in Paris starts at local midnight: 23:00 UTC in winter.
        let month = Calendar::monthly().zone("Europe/Paris").unwrap();
        assert_eq!(
            month.period(at("2026-01-01T00:30:00Z")),
            (at("2025-12-31T23:00:00Z"), at("2026-01-31T23:00:00Z"))
        );
        assert_eq!(month.nominal(), Duration::from_secs(30 * 86_400));
    }

    #[test]
    fn paris_days_follow_the_clock_changes() {
        let day = paris();
        // 2026-03-29: 02:00 becomes 03:00, a day of 23 hours.
        let (start, end) = day.period(at("2026-03-29T12:00:00+02:00"));
        assert_eq!(start, at("2026-03-29T00:00:00+01:00"));
        assert_eq!(end, at("2026-03-30T00:00:00+02:00"));
        assert_eq!(end - start, 23 * H);
        // 2026-10-25: 03:00 becomes 02:00, a day of 25 hours.
        let (start, end) = day.period(at("2026-10-25T12:00:00+01:00"));
        assert_eq!(start, at("2026-10-25T00:00:00+02:00"));
        assert_eq!(end, at("2026-10-26T00:00:00+01:00"));
        assert_eq!(end - start, 25 * H);
        // An ordinary summer day.
        let (start, end) = day.period(at("2026-07-14T23:59:59+02:00"));
        assert_eq!(
            (start, end - start),
            (at("2026-07-14T00:00:00+02:00"), 24 * H)
        );
        assert_eq!(day.nominal(), Duration::from_secs(86_400));
    }

    /// Where the clocks jump over midnight, the day starts at its first
    /// instant, and the day before ends there.
    #[test]
    fn a_day_without_a_midnight_starts_at_its_first_instant() {
        let day = Calendar::daily().zone("America/Sao_Paulo").unwrap();
        // 2015-10-18: 00:00 became 01:00.
        let (start, end) = day.period(at("2015-10-18T12:00:00-02:00"));
        assert_eq!(start, at("2015-10-18T01:00:00-02:00"));
        assert_eq!(end - start, 23 * H);
        assert_eq!(day.period(start - 1).1, start);
    }

    /// Every instant of a year is in exactly one period, and each period
    /// ends where the next starts.
    #[test]
    fn periods_tile_time() {
        for calendar in [
            paris(),
            Calendar::monthly().zone("Europe/Paris").unwrap(),
            Calendar::daily().zone("America/Sao_Paulo").unwrap(),
            Calendar::daily().zone("-05:30").unwrap(),
        ] {
            let mut t = at("2015-01-01T00:00:00Z");
            let stop = at("2016-01-01T00:00:00Z");
            let (mut start, mut end) = calendar.period(t);
            while t < stop {
                let period = calendar.period(t);
                if t >= end {
                    assert_eq!(period.0, end, "{calendar} at {t}");
                    (start, end) = period;
                }
                assert_eq!(period, (start, end), "{calendar} at {t}");
                assert!(start <= t && t < end);
                t += H / 2;
            }
        }
    }

    #[test]
    fn fixed_offsets_and_utc() {
        let plus = Calendar::daily().zone("+02:00").unwrap();
        assert_eq!(
            plus.period(at("2026-07-14T21:59:59Z")),
            (at("2026-07-13T22:00:00Z"), at("2026-07-14T22:00:00Z"))
        );
        assert_eq!(plus.to_string(), "day tz=+02:00");
        let minus = Calendar::daily().zone("-05:30").unwrap();
        assert_eq!(
            minus.period(at("2026-07-14T03:00:00Z")).0,
            at("2026-07-13T05:30:00Z")
        );
        assert_eq!(minus.zone_name(), Some("-05:30"));
        for same in ["+0200", "+02"] {
            assert_eq!(Calendar::daily().zone(same).unwrap(), plus, "{same}");
        }

        // UTC unless a zone is named, and however UTC is named.
        let utc = Calendar::daily();
        assert_eq!(
            utc.period(at("2026-07-14T15:00:00Z")),
            (at("2026-07-14T00:00:00Z"), at("2026-07-15T00:00:00Z"))
        );
        for name in ["UTC", "utc", "Z", "+00:00", "-00"] {
            assert_eq!(Calendar::daily().zone(name).unwrap(), utc, "{name}");
        }
        assert_eq!(utc.zone_name(), None);
        assert_eq!(utc.to_string(), "day");
        assert_eq!(Calendar::monthly().to_string(), "month");
        assert_eq!(Calendar::monthly().unit(), CalendarPeriod::Month);
    }

    #[test]
    fn unknown_zones_and_bad_offsets_are_refused() {
        for name in [
            "Mars/Olympus_Mons",
            "Europe/Pariss",
            "",
            "Etc/Unknown",
            "../etc/passwd",
        ] {
            let err = Calendar::daily().zone(name).unwrap_err();
            assert_eq!(
                err,
                CalendarError::UnknownZone {
                    name: name.to_owned()
                }
            );
            assert!(
                err.to_string()
                    .contains("IANA zone name such as Europe/Paris")
            );
        }
        for text in [
            "+2",
            "+24:00",
            "+02:60",
            "-1:30",
            "+02:3",
            "+02:00:00",
            "+ab:cd",
            "+",
        ] {
            let err = Calendar::daily().zone(text).unwrap_err();
            assert_eq!(
                err,
                CalendarError::BadOffset {
                    text: text.to_owned()
                },
                "{text}"
            );
        }
    }

    #[test]
    fn names_print_as_the_database_spells_them() {
        let lower = Calendar::daily().zone("europe/paris").unwrap();
        assert_eq!(lower, paris());
        assert_eq!(lower.to_string(), "day tz=Europe/Paris");
        assert_ne!(paris(), Calendar::monthly().zone("Europe/Paris").unwrap());
        for text in ["day", "month", "day tz=Europe/Paris", "month tz=-05:30"] {
            let calendar: Calendar = text.parse().unwrap();
            assert_eq!(calendar.to_string(), text);
        }
        assert_eq!("Days".parse::<Calendar>().unwrap(), Calendar::daily());
        assert!(matches!(
            "week".parse::<Calendar>(),
            Err(CalendarError::UnknownPeriod { .. })
        ));
        for bad in ["day tz=Europe/Paris extra", "day junk"] {
            assert!(
                matches!(
                    bad.parse::<Calendar>(),
                    Err(CalendarError::UnknownPeriod { .. })
                ),
                "{bad}"
            );
        }
    }

    /// What the policy parser calls after `COUNT/`: how much it took, and
    /// where a bad zone is.
    #[test]
    fn the_parser_learns_what_a_unit_took() {
        assert!(unit("d", " tz=Europe/Paris").is_none());
        assert!(unit("min", "").is_none());
        assert_eq!(unit("day", " + 5/s"), Some(Ok((Calendar::daily(), 0))));
        let rest = " tz=Europe/Paris + 10000/month";
        let (calendar, used) = unit("day", rest).unwrap().unwrap();
        assert_eq!((calendar, &rest[used..]), (paris(), " + 10000/month"));
        let rest = " tz=+02:00 as daily";
        let (_, used) = unit("DAY", rest).unwrap().unwrap();
        assert_eq!(&rest[used..], " as daily");
        let rest = "  tz=Atlantis as x";
        let (problem, span) = unit("month", rest).unwrap().unwrap_err();
        assert!(problem.contains("unknown time zone"));
        assert_eq!(&rest[span], "Atlantis");
    }

    #[test]
    fn a_quota_resets_on_the_calendar_boundary() {
        let day = paris();
        let end = at("2026-03-30T00:00:00+02:00");
        let mut t = [Tally::default()];
        let q = [quota(&day, 2, end - H)];
        let (d, idle) = check(&q, &mut t, end - H, 2);
        assert!(d.allowed);
        assert_eq!((d.remaining, d.reset_us, idle), (0, H, Some(end)));
        // One microsecond before midnight: still the old day, full.
        assert_eq!(day.period(end - 1).1, end);
        let q = [quota(&day, 2, end - 1)];
        let (d, _) = check(&q, &mut t, end - 1, 1);
        assert!(!d.allowed);
        assert_eq!((d.remaining, d.retry_us), (0, Some(1)));
        // Midnight: a new day of 24 hours, empty.
        assert_eq!(day.period(end).0, end);
        let q = [quota(&day, 2, end)];
        let (d, idle) = check(&q, &mut t, end, 2);
        assert!(d.allowed);
        assert_eq!((d.reset_us, idle), (24 * H, Some(end + 24 * H)));
        assert_eq!(
            t[0],
            Tally {
                start: end,
                end: end + 24 * H,
                used: 2
            }
        );
    }

    #[test]
    fn check_peek_charge_refund_figures() {
        let month = Calendar::monthly();
        let now = at("2026-02-27T00:00:00Z");
        let q = [quota(&month, 10, now)];
        let until_march = 2 * 24 * H;
        let mut t = [Tally::default()];
        // Peek stores nothing.
        let d = peek(&q, &t, now, 4);
        assert_eq!((d.allowed, d.remaining, d.reset_us), (true, 6, until_march));
        assert_eq!(t[0], Tally::default());
        let (d, _) = check(&q, &mut t, now, 4);
        assert_eq!((d.remaining, d.retry_us), (6, None));
        let (d, _) = check(&q, &mut t, now, 7);
        assert!(!d.allowed);
        assert_eq!((d.remaining, d.retry_us), (6, Some(until_march)));
        assert_eq!(t[0].used, 4, "a denial charges nothing");
        // A charge past the count: nothing passes until March.
        let (d, idle) = charge(&q, &mut t, now, 9);
        assert_eq!(idle, at("2026-03-01T00:00:00Z"));
        assert_eq!(t[0].used, 13);
        assert!(!d.allowed);
        assert_eq!((d.remaining, d.retry_us), (0, Some(until_march)));
        // Refunds never go below 0.
        assert_eq!(refund(&q, &mut t, now, 5), 5);
        assert!(peek(&q, &t, now, 2).allowed);
        assert_eq!(refund(&q, &mut t, now, 50), 8);
        assert_eq!(t[0].used, 0);
        // A charge saturates; March starts empty, and February's tally
        // gives nothing back once it has ended.
        charge(&q, &mut t, now, u64::MAX);
        assert_eq!(t[0].used, MAX_COUNTED);
        let march = at("2026-03-01T00:00:00Z");
        let q = [quota(&month, 10, march)];
        assert_eq!(refund(&q, &mut t, march, 3), 0);
        assert_eq!(t[0].used, MAX_COUNTED);
        let d = peek(&q, &t, march, 10);
        assert_eq!((d.allowed, d.reset_us), (true, 31 * 24 * H));
    }

    /// A day and a month together: every quota must admit, and the one
    /// with the least left (or the longest retry) decides.
    #[test]
    fn quotas_decide_together() {
        let now = at("2026-05-10T12:00:00Z");
        let q = [
            quota(&Calendar::daily(), 3, now),
            quota(&Calendar::monthly(), 5, now),
        ];
        let mut t = [Tally::default(); 2];
        let (d, _) = check(&q, &mut t, now, 3);
        assert_eq!((d.limit, d.remaining), (0, 0));
        let next = now + 24 * H;
        let q = [
            quota(&Calendar::daily(), 3, next),
            quota(&Calendar::monthly(), 5, next),
        ];
        let (d, _) = check(&q, &mut t, next, 3);
        assert!(!d.allowed);
        // The month denies, retry on June 1st; the day charges nothing.
        assert_eq!(d.limit, 1);
        assert_eq!(d.retry_us, Some(at("2026-06-01T00:00:00Z") - next));
        assert_eq!(
            t[0],
            Tally {
                start: at("2026-05-10T00:00:00Z"),
                end: at("2026-05-11T00:00:00Z"),
                used: 3
            }
        );
        let each = d.each.unwrap();
        assert_eq!(each[0], (3, Duration::from_micros(12 * H)));
    }

    /// A clock behind the one that wrote the tally is decided in the
    /// stored, later period, to its end.
    #[test]
    fn a_stored_period_never_moves_back() {
        let day = Calendar::daily();
        let midnight = at("2026-05-11T00:00:00Z");
        let mut t = [Tally::default()];
        let (d, _) = check(&[quota(&day, 2, midnight)], &mut t, midnight, 2);
        assert!(d.allowed);
        let behind = midnight - 5;
        let q = [quota(&day, 2, behind)];
        let (d, _) = check(&q, &mut t, behind, 1);
        assert!(!d.allowed);
        assert_eq!(d.retry_us, Some(24 * H + 5));
        assert_eq!(t[0].start, midnight);
        // A stored day that has ended on this clock too (the policy went
        // from days to months) is left behind.
        let month = Calendar::monthly();
        let later = midnight + 30 * H;
        let q = [quota(&month, 2, later)];
        let (d, _) = check(&q, &mut t, later, 2);
        assert!(d.allowed);
        assert_eq!(t[0].start, at("2026-05-01T00:00:00Z"));
    }

    /// A script on its own clock picks its period from the caller's
    /// bounds, on either side of the caller's boundary.
    #[test]
    fn bounds_resolve_a_clock_of_its_own() {
        let day = paris();
        let midnight = at("2026-03-29T00:00:00+01:00");
        let caller = midnight + 1;
        let bounds = day.bounds(caller);
        assert_eq!(
            bounds,
            [
                midnight - 24 * H,
                midnight,
                midnight + 23 * H,
                midnight + 47 * H
            ]
        );
        for now in [
            midnight - 24 * H,
            midnight - 1,
            midnight,
            midnight + 23 * H - 1,
            midnight + 23 * H,
            midnight + 47 * H - 1,
        ] {
            assert_eq!(period_at(&bounds, now), day.period(now), "{now}");
        }
        // Earlier than any bound: the first period, later than now.
        assert_eq!(period_at(&bounds, 0), (bounds[0], bounds[1]));
        // Past the last: periods as long as the last one.
        assert_eq!(
            period_at(&bounds, bounds[3] + 30 * H),
            (bounds[3] + 24 * H, bounds[3] + 48 * H)
        );
        // At the epoch, in a zone ahead of UTC: periods start at 0.
        let ahead = Calendar::daily().zone("+02:00").unwrap();
        assert_eq!(ahead.bounds(0), [0, 0, 22 * H, 46 * H]);
        assert_eq!(ahead.period(0), (0, 22 * H));
    }

    /// Instants beyond the year 9999 still have a period.
    #[test]
    fn far_instants_fall_back_to_nominal_periods() {
        let far = u64::MAX - 5;
        let (start, end) = Calendar::monthly().period(far);
        assert!(start <= far && far < end);
        // Paris' next midnight is past what jiff holds: UTC days of the
        // nominal length instead.
        let t = at("9999-12-30T12:00:00Z");
        let midnight = at("9999-12-30T00:00:00Z");
        assert_eq!(paris().period(t), (midnight, midnight + 24 * H));
    }
}
