//! Limits written as text or data, for configuration files and environment
//! variables.
//!
//! A policy is one line: limits joined by `+`, each `COUNT/PERIOD`, with an
//! optional `burst N`, `block DURATION` and `as NAME`, and optionally the
//! algorithm at the end:
//!
//! | text | means |
//! |---|---|
//! | `100/s` | 100 per second, burst 100 |
//! | `100/s burst 500` | 100 per second, up to 500 at once |
//! | `25/5s + 300/min` | both, decided together |
//! | `25/5s as short + 300/min as long` | the same, with names for headers and errors |
//! | `5/15min block 1h` | once refused, the identity is refused for an hour (a penalty box: [`LimitBuilder::block_for`](crate::LimitBuilder::block_for)) |
//! | `5000/h sliding` | an exact sliding-window log of 5000 per hour |
//! | `100/min fixed` | a fixed window of 100 per minute |
//! | `10000/month` | a calendar quota: 10,000 per calendar month (UTC), reset on the 1st |
//! | `500/day tz=Europe/Paris` | 500 per calendar day, reset at midnight in Paris |
//!
//! Algorithms: `gcra` (the default), `sliding-log` (or `sliding`, `log`),
//! `sliding-window` (or `sliding-counter`) and `fixed-window` (or `fixed`);
//! see [`Algorithm`]. Window algorithms take no `burst`.
//!
//! Periods: a number (default 1) and a unit: `ms`, `s` (`sec`, `second`),
//! `min` (`m`, `minute`), `h` (`hr`, `hour`), `d` (`day`); plurals are fine.
//! Numbers may use `_` between digits (`5_000/h`). A duration (`block
//! 1h`) is one or more numbers each with its unit: `90s`, `1h30min`.
//!
//! Calendar quotas ([`Algorithm::Calendar`]): `COUNT/day` or `COUNT/month`
//! (no number before the unit), reset at the start of each calendar day or
//! month, in UTC or in the zone `tz=` names: an IANA name (`Europe/Paris`,
//! with its daylight-saving changes) or a fixed offset (`+02:00`). With a
//! number the unit is a rolling duration again: `500/d` and `500/1day`
//! refill over 24 hours, as GCRA. A policy's limits are all calendar
//! quotas or none is, and calendar quotas take no `burst`.
//!
//! ```
//! use fleetgate::spec::PolicySpec;
//!
//! let spec: PolicySpec = "25/5s + 300/min".parse()?;
//! let policy = spec.build("upstream")?;
//! assert_eq!(policy.limits().len(), 2);
//! // Written back, it reads the same.
//! assert_eq!(spec.to_string(), "25/5s + 300/min");
//!
//! // Mistakes name the offending text.
//! let err = "25/5x".parse::<PolicySpec>().unwrap_err();
//! assert_eq!(err.fragment(), "x");
//! assert!(err.to_string().contains("unknown time unit"));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! With the `serde` feature (off by default: `cargo add fleetgate
//! --features serde`) a [`PolicySpec`] reads from a string as above or from
//! a table such as
//! `{ limits = [{ rate = "25/5s", burst = 30, name = "short" }, "300/min"] }`,
//! and [`PolicyFile`] reads a whole file of named policies and routes
//! (TOML, YAML, JSON, ...), which
//! [`RoutePolicies::from_file`](crate::rate_limit::RoutePolicies::from_file)
//! turns into one layer where each route (axum's matched path and,
//! optionally, the method) has its own policy; routes no rule matches use
//! the default, or are not limited when there is none:
//!
//! ```
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use fleetgate::rate_limit::RoutePolicies;
//! use fleetgate::spec::PolicyFile;
//! use fleetgate::{MemoryStore, RateLimitLayer};
//!
//! let file: PolicyFile = toml::from_str(r#"
//!     default = "general"
//!     [policies]
//!     general = "100/s burst 200"
//!     login = "5/min"
//!     [[routes]]
//!     path = "/api/login"
//!     method = "POST"
//!     policy = "login"
//! "#)?;
//! let layer = RateLimitLayer::per_route(RoutePolicies::from_file(&file, MemoryStore::new())?)?;
//! # Ok(()) }
//! ```
//!
//! Add such a layer with `Router::layer` or `Router::route_layer`, so that
//! the matched route (`/users/{id}`) is known.

use std::collections::BTreeMap;
use std::fmt;
use std::ops::Range;
use std::str::FromStr;
use std::time::Duration;

use crate::algorithm::Algorithm;
use crate::algorithm::calendar::{self, Calendar};
use crate::error::ConfigError;
use crate::policy::rate::DurationText;
use crate::policy::{Limit, Policy, Rate};

/// Text that does not describe a limit or policy: what is wrong, and where.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParseError {
    text: String,
    span: Range<usize>,
    problem: String,
}

impl ParseError {
    fn new(text: &str, span: Range<usize>, problem: impl Into<String>) -> Self {
        let end = span.end.min(text.len());
        let start = span.start.min(end);
        ParseError {
            text: text.to_owned(),
            span: start..end,
            problem: problem.into(),
        }
    }

    /// The whole text that was parsed.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// Where in [`text`](Self::text) the problem is, in bytes.
    pub fn span(&self) -> Range<usize> {
        self.span.clone()
    }

    /// The offending part of the text (empty when something is missing at
    /// the end).
    pub fn fragment(&self) -> &str {
        self.text.get(self.span.clone()).unwrap_or("")
    }

    /// What is wrong, without the position.
    pub fn problem(&self) -> &str {
        &self.problem
    }
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.span.is_empty() {
            write!(
                f,
                "{} at the end of {:?} (byte {})",
                self.problem, self.text, self.span.start
            )
        } else {
            write!(
                f,
                "{}: {:?} at bytes {}..{} of {:?}",
                self.problem,
                self.fragment(),
                self.span.start,
                self.span.end,
                self.text
            )
        }
    }
}

impl std::error::Error for ParseError {}

/// The algorithms a policy text may name, with their aliases.
const ALGORITHMS: &[(&str, Algorithm)] = &[
    ("gcra", Algorithm::Gcra),
    ("sliding-log", Algorithm::SlidingLog),
    ("sliding", Algorithm::SlidingLog),
    ("log", Algorithm::SlidingLog),
    ("sliding-window", Algorithm::SlidingWindow),
    ("sliding-counter", Algorithm::SlidingWindow),
    ("fixed-window", Algorithm::FixedWindow),
    ("fixed", Algorithm::FixedWindow),
    ("calendar", Algorithm::Calendar),
];

/// The algorithm named `word` (any case), if any.
pub(crate) fn algorithm_named(word: &str) -> Option<Algorithm> {
    let word = word.to_ascii_lowercase();
    ALGORITHMS
        .iter()
        .find(|(name, _)| *name == word)
        .map(|(_, a)| *a)
}

fn algorithm_names() -> String {
    ALGORITHMS
        .iter()
        .map(|(name, _)| *name)
        .collect::<Vec<_>>()
        .join(", ")
}

/// One limit as written: a rate, an optional burst and an optional name.
/// [`build`](Self::build) checks it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LimitSpec {
    /// The long-run rate; for a calendar quota, its count per the period's
    /// nominal length.
    pub rate: Rate,
    /// A calendar quota's calendar (`500/day tz=Europe/Paris`); `None` for
    /// a rate.
    pub calendar: Option<Calendar>,
    /// How many may pass at once (default: the rate's count).
    pub burst: Option<u64>,
    /// The limit's name in headers and errors (default: the rate, as
    /// `25/5s`).
    pub name: Option<String>,
    /// Its penalty box (`block 1h`): see
    /// [`LimitBuilder::block_for`](crate::LimitBuilder::block_for).
    pub block: Option<Duration>,
}

impl LimitSpec {
    /// Checks the limit and builds it.
    pub fn build(&self) -> Result<Limit, ConfigError> {
        let mut builder = match &self.calendar {
            Some(calendar) => Limit::calendar_builder(self.rate.count(), calendar.clone()),
            None => Limit::builder(self.rate),
        };
        if let Some(burst) = self.burst {
            builder = builder.burst(burst);
        }
        if let Some(name) = &self.name {
            builder = builder.name(name.clone());
        }
        if let Some(block) = self.block {
            builder = builder.block_for(block);
        }
        builder.build()
    }
}

impl From<&Limit> for LimitSpec {
    fn from(limit: &Limit) -> Self {
        let rate = limit.rate();
        let calendar = limit.calendar_of().cloned();
        let default_name = match &calendar {
            Some(calendar) => format!("{}/{}", rate.count(), calendar.unit()),
            None => rate.to_string(),
        };
        LimitSpec {
            rate,
            burst: (limit.burst() != rate.count()).then_some(limit.burst()),
            name: (limit.name() != default_name).then(|| limit.name().to_owned()),
            calendar,
            block: limit.block_for(),
        }
    }
}

impl fmt::Display for LimitSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.calendar {
            Some(calendar) => write!(f, "{}/{calendar}", self.rate.count())?,
            None => write!(f, "{}", self.rate)?,
        }
        if let Some(burst) = self.burst {
            write!(f, " burst {burst}")?;
        }
        if let Some(block) = self.block {
            write!(f, " block {}", DurationText(block))?;
        }
        if let Some(name) = &self.name {
            write!(f, " as {name}")?;
        }
        Ok(())
    }
}

impl FromStr for LimitSpec {
    type Err = ParseError;

    fn from_str(text: &str) -> Result<Self, ParseError> {
        let mut parser = Parser::new(text);
        parser.skip_space();
        let limit = parser.limit()?;
        parser.skip_space();
        parser.end()?;
        Ok(limit.0)
    }
}

impl FromStr for Rate {
    type Err = ParseError;

    /// Parses `100/s`, `25/5s`, `5000/h`.
    fn from_str(text: &str) -> Result<Self, ParseError> {
        let mut parser = Parser::new(text);
        parser.skip_space();
        let (rate, calendar) = parser.rate()?;
        if calendar.is_some() {
            return Err(ParseError::new(
                text,
                0..text.len(),
                "a calendar quota, not a rate: write the period with a number (1day) for a rolling one",
            ));
        }
        parser.skip_space();
        parser.end()?;
        Ok(rate)
    }
}

/// A policy as written, without its name: one or more limits and the
/// algorithm. Parse it from text ([`FromStr`]), or deserialize it with the
/// `serde` feature; [`build`](Self::build) checks it and names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PolicySpec {
    /// The limits, decided together.
    pub limits: Vec<LimitSpec>,
    /// The algorithm, when one was given (default GCRA).
    pub algorithm: Option<Algorithm>,
}

impl PolicySpec {
    /// Checks every limit and builds the policy under `name`.
    pub fn build(&self, name: impl Into<String>) -> Result<Policy, ConfigError> {
        let mut builder = Policy::builder(name);
        if let Some(algorithm) = self.algorithm {
            builder = builder.algorithm(algorithm);
        }
        for limit in &self.limits {
            builder = builder.limit(limit.build()?);
        }
        builder.build()
    }
}

impl From<&Policy> for PolicySpec {
    fn from(policy: &Policy) -> Self {
        PolicySpec {
            limits: policy.limits().iter().map(LimitSpec::from).collect(),
            // Calendar quotas name their algorithm themselves.
            algorithm: (policy.algorithm().is_window()
                && policy.algorithm() != Algorithm::Calendar)
                .then(|| policy.algorithm()),
        }
    }
}

impl fmt::Display for PolicySpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, limit) in self.limits.iter().enumerate() {
            if i > 0 {
                f.write_str(" + ")?;
            }
            write!(f, "{limit}")?;
        }
        if let Some(algorithm) = self.algorithm {
            write!(f, " {algorithm}")?;
        }
        Ok(())
    }
}

impl FromStr for PolicySpec {
    type Err = ParseError;

    fn from_str(text: &str) -> Result<Self, ParseError> {
        let mut parser = Parser::new(text);
        parser.skip_space();
        if parser.at_end() {
            return Err(parser.error_here("expected a limit such as 100/s"));
        }
        let mut limits = Vec::new();
        let mut algorithm = None;
        loop {
            let (limit, span) = parser.limit()?;
            // Building checks zero rates, bursts and names where they were
            // written, so the error can point at them.
            if let Err(err) = limit.build() {
                return Err(ParseError::new(text, span, err.to_string()));
            }
            limits.push(limit);
            parser.skip_space();
            if parser.eat(b'+') {
                parser.skip_space();
                continue;
            }
            if parser.at_end() {
                break;
            }
            let problem = format!(
                "expected `+`, `burst`, `block`, `as` or an algorithm ({})",
                algorithm_names()
            );
            let (word, span) = parser.word();
            if word.is_empty() {
                return Err(parser.error_here(&problem));
            }
            if let Some(named) = algorithm_named(word) {
                algorithm = Some(named);
                parser.skip_space();
                parser.end()?;
                break;
            }
            return Err(ParseError::new(text, span, problem));
        }
        let spec = PolicySpec { limits, algorithm };
        // What only the whole policy can refuse (a burst on a window, too
        // many limits, duplicate names).
        if let Err(err) = spec.build("policy") {
            return Err(ParseError::new(text, 0..text.len(), err.to_string()));
        }
        Ok(spec)
    }
}

/// A rate, or a calendar quota with its zone, alone in `text`.
#[cfg(feature = "serde")]
fn rate_or_calendar(text: &str) -> Result<(Rate, Option<Calendar>), ParseError> {
    let mut parser = Parser::new(text);
    parser.skip_space();
    let read = parser.rate()?;
    parser.skip_space();
    parser.end()?;
    Ok(read)
}

/// A cursor over the text, with positions for errors.
struct Parser<'a> {
    text: &'a str,
    pos: usize,
}

impl<'a> Parser<'a> {
    fn new(text: &'a str) -> Self {
        Parser { text, pos: 0 }
    }

    fn rest(&self) -> &'a str {
        self.text.get(self.pos..).unwrap_or("")
    }

    fn at_end(&self) -> bool {
        self.rest().is_empty()
    }

    fn peek(&self) -> Option<u8> {
        self.rest().bytes().next()
    }

    fn skip_space(&mut self) {
        let rest = self.rest();
        self.pos += rest.len() - rest.trim_start().len();
    }

    fn eat(&mut self, byte: u8) -> bool {
        if self.peek() == Some(byte) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    fn end(&self) -> Result<(), ParseError> {
        if self.at_end() {
            Ok(())
        } else {
            let len = self.rest().split_whitespace().next().map_or(1, str::len);
            Err(ParseError::new(
                self.text,
                self.pos..self.pos + len,
                "unexpected text",
            ))
        }
    }

    fn error_here(&self, problem: &str) -> ParseError {
        // Point at the next word, or at the end if nothing is left.
        let len = self
            .rest()
            .split(|c: char| c.is_whitespace() || c == '+')
            .next()
            .map_or(0, str::len);
        let len = if len == 0 {
            self.rest().chars().next().map_or(0, char::len_utf8)
        } else {
            len
        };
        ParseError::new(self.text, self.pos..self.pos + len, problem)
    }

    /// Digits, with `_` allowed between them.
    fn number(&mut self, what: &str) -> Result<u64, ParseError> {
        let start = self.pos;
        let rest = self.rest();
        let len = rest
            .bytes()
            .take_while(|b| b.is_ascii_digit() || *b == b'_')
            .count();
        let digits = &rest[..len];
        if len == 0 || !digits.starts_with(|c: char| c.is_ascii_digit()) {
            return Err(self.error_here(&format!("expected {what}")));
        }
        self.pos += len;
        let clean: String = digits.chars().filter(|c| *c != '_').collect();
        clean
            .parse::<u64>()
            .map_err(|_| ParseError::new(self.text, start..self.pos, "number too large"))
    }

    /// A run of letters, `-` and `_` (possibly empty).
    fn word(&mut self) -> (&'a str, Range<usize>) {
        let start = self.pos;
        let rest = self.rest();
        let len: usize = rest
            .chars()
            .take_while(|c| c.is_ascii_alphabetic() || matches!(c, '-' | '_' | 'µ'))
            .map(char::len_utf8)
            .sum();
        self.pos += len;
        (&rest[..len], start..self.pos)
    }

    /// `COUNT/PERIOD`, or a calendar quota's `COUNT/day` or
    /// `COUNT/month` with its ` tz=<zone>`: the rate (for a calendar
    /// quota, its count per the period's nominal length) and the calendar.
    fn rate(&mut self) -> Result<(Rate, Option<Calendar>), ParseError> {
        let count = self.number("a count such as the 100 of 100/s")?;
        self.skip_space();
        if !self.eat(b'/') {
            return Err(self.error_here("expected `/` and a period after the count, as in 100/s"));
        }
        self.skip_space();
        let period_start = self.pos;
        let multiple = if self.peek().is_some_and(|b| b.is_ascii_digit()) {
            let n = self.number("a number")?;
            if n == 0 {
                return Err(ParseError::new(
                    self.text,
                    period_start..self.pos,
                    "period must be longer than zero",
                ));
            }
            n
        } else {
            1
        };
        let (unit, span) = self.word();
        if multiple == 1
            && period_start == span.start
            && let Some(read) = calendar::unit(unit, self.rest())
        {
            let after = self.pos;
            return match read {
                Ok((calendar, taken)) => {
                    self.pos += taken;
                    Ok((Rate::new(count, calendar.nominal()), Some(calendar)))
                }
                Err((problem, at)) => Err(ParseError::new(
                    self.text,
                    after + at.start..after + at.end,
                    problem,
                )),
            };
        }
        let unit = self.unit(unit, span)?;
        let period = u32::try_from(multiple)
            .ok()
            .and_then(|n| unit.checked_mul(n))
            .ok_or_else(|| ParseError::new(self.text, period_start..self.pos, "period too long"))?;
        Ok((Rate::new(count, period), None))
    }

    /// The time unit `word`, read at `span`.
    fn unit(&self, word: &str, span: Range<usize>) -> Result<Duration, ParseError> {
        unit_of(word).ok_or_else(|| {
            let problem = "unknown time unit; use ms, s, min, h or d";
            if span.is_empty() {
                self.error_here(problem)
            } else {
                ParseError::new(self.text, span, problem)
            }
        })
    }

    /// One or more numbers, each with its unit, with nothing between
    /// them: `90s`, `1h30min`.
    fn duration(&mut self, what: &str) -> Result<Duration, ParseError> {
        let start = self.pos;
        let mut total = Duration::ZERO;
        loop {
            let n = self.number(what)?;
            let (unit, span) = self.word();
            let unit = self.unit(unit, span)?;
            total = u32::try_from(n)
                .ok()
                .and_then(|n| unit.checked_mul(n))
                .and_then(|d| total.checked_add(d))
                .ok_or_else(|| ParseError::new(self.text, start..self.pos, "duration too long"))?;
            if !self.peek().is_some_and(|b| b.is_ascii_digit()) {
                return Ok(total);
            }
        }
    }

    fn limit(&mut self) -> Result<(LimitSpec, Range<usize>), ParseError> {
        let start = self.pos;
        let (rate, calendar) = self.rate()?;
        let mut spec = LimitSpec {
            rate,
            calendar,
            burst: None,
            name: None,
            block: None,
        };
        loop {
            let before = self.pos;
            self.skip_space();
            let (word, span) = self.word();
            match word.to_ascii_lowercase().as_str() {
                "burst" if spec.burst.is_none() => {
                    self.skip_space();
                    spec.burst = Some(self.number("a number after `burst`")?);
                }
                "as" if spec.name.is_none() => {
                    self.skip_space();
                    let rest = self.rest();
                    let len = rest
                        .find(|c: char| c.is_whitespace() || c == '+')
                        .unwrap_or(rest.len());
                    if len == 0 {
                        return Err(self.error_here("expected a name after `as`"));
                    }
                    spec.name = Some(rest[..len].to_owned());
                    self.pos += len;
                }
                "block" if spec.block.is_none() => {
                    self.skip_space();
                    spec.block = Some(self.duration("a duration after `block`, such as 1h")?);
                }
                "burst" | "as" | "block" => {
                    return Err(ParseError::new(
                        self.text,
                        span,
                        format!("`{word}` given twice"),
                    ));
                }
                _ => {
                    // Not ours: leave it, and the space before it, to the
                    // caller.
                    self.pos = before;
                    break;
                }
            }
        }
        Ok((spec, start..self.pos))
    }
}

/// A duration alone in `text` (`10m`, `1h30min`, `90s`), as the policy
/// text writes a block.
#[cfg(any(feature = "serde", feature = "admin"))]
pub(crate) fn parse_duration(text: &str) -> Result<Duration, ParseError> {
    let mut parser = Parser::new(text);
    parser.skip_space();
    let duration = parser.duration("a duration such as 10m or 1h")?;
    parser.skip_space();
    parser.end()?;
    Ok(duration)
}

fn unit_of(word: &str) -> Option<Duration> {
    let unit = match word.to_ascii_lowercase().as_str() {
        "ms" | "msec" | "millisecond" | "milliseconds" => Duration::from_millis(1),
        "us" | "µs" | "microsecond" | "microseconds" => Duration::from_micros(1),
        "s" | "sec" | "secs" | "second" | "seconds" => Duration::from_secs(1),
        "m" | "min" | "mins" | "minute" | "minutes" => Duration::from_secs(60),
        "h" | "hr" | "hrs" | "hour" | "hours" => Duration::from_secs(3600),
        "d" | "day" | "days" => Duration::from_secs(86_400),
        _ => return None,
    };
    Some(unit)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calendar_quotas_parse_and_write_back() {
        let one = |text: &str| {
            let spec: PolicySpec = text.parse().unwrap();
            let limit = &spec.limits[0];
            (limit.rate.count(), limit.calendar.clone())
        };
        assert_eq!(one("10000/month"), (10_000, Some(Calendar::monthly())));
        assert_eq!(one("500/days"), (500, Some(Calendar::daily())));
        assert_eq!(one("5_000/Month"), (5_000, Some(Calendar::monthly())));
        let paris = Calendar::daily().zone("Europe/Paris").unwrap();
        assert_eq!(one("500/day tz=Europe/Paris"), (500, Some(paris)));
        let plus = Calendar::daily().zone("+02:00").unwrap();
        assert_eq!(one("500/day tz=+02:00 as daily"), (500, Some(plus)));
        // With a number, or as `d`, a day is a rolling 24 hours again.
        for rolling in ["500/d", "500/1day", "500/2days", "500/24h"] {
            assert_eq!(one(rolling).1, None, "{rolling}");
        }
        for text in [
            "10000/month",
            "500/day tz=Europe/Paris",
            "3/day as ping-day + 50/month",
        ] {
            let spec: PolicySpec = text.parse().unwrap();
            assert_eq!(spec.to_string(), text);
            let policy = spec.build("plan").unwrap();
            assert_eq!(policy.algorithm(), Algorithm::Calendar);
            assert_eq!(PolicySpec::from(&policy).to_string(), text);
        }
        for (text, says) in [
            (
                "500/day tz=Nowhere/Land",
                "unknown time zone \"Nowhere/Land\"",
            ),
            ("500/day tz=+25:00", "invalid UTC offset"),
            ("500/day burst 5", "a window admits its rate's count"),
            (
                "500/day + 10/s",
                "does not fit a policy decided by calendar",
            ),
            (
                "500/day sliding",
                "does not fit a policy decided by sliding-log",
            ),
            ("10/s calendar", "does not fit a policy decided by calendar"),
            ("0/day", "at least one event per period"),
        ] {
            let err = err(text).to_string();
            assert!(err.contains(says), "{text}: {err}");
        }
        assert_eq!(err("500/day tz=Nowhere/Land").fragment(), "Nowhere/Land");
    }

    fn err(text: &str) -> ParseError {
        text.parse::<PolicySpec>().unwrap_err()
    }

    #[test]
    fn policies_parse() {
        let spec: PolicySpec = "100/s burst 500".parse().unwrap();
        assert_eq!(spec.limits.len(), 1);
        assert_eq!(spec.limits[0].rate, Rate::per_second(100));
        assert_eq!(spec.limits[0].burst, Some(500));

        let spec: PolicySpec = "25/5s+300/min".parse().unwrap();
        assert_eq!(
            spec.limits.iter().map(|l| l.rate).collect::<Vec<_>>(),
            [Rate::new(25, Duration::from_secs(5)), Rate::per_minute(300)]
        );

        let spec: PolicySpec = "  5_000 / hour  GCRA ".parse().unwrap();
        assert_eq!(spec.limits[0].rate, Rate::per_hour(5000));
        assert_eq!(spec.algorithm, Some(Algorithm::Gcra));
        let spec: PolicySpec = "5000/h sliding".parse().unwrap();
        assert_eq!(spec.algorithm, Some(Algorithm::SlidingLog));
        assert_eq!(spec.build("p").unwrap().algorithm(), Algorithm::SlidingLog);
        for (text, algorithm) in [
            ("1/s fixed", Algorithm::FixedWindow),
            ("1/s Fixed-Window", Algorithm::FixedWindow),
            ("1/s sliding-counter", Algorithm::SlidingWindow),
            ("1/s sliding-window", Algorithm::SlidingWindow),
            ("1/s log", Algorithm::SlidingLog),
        ] {
            assert_eq!(
                text.parse::<PolicySpec>().unwrap().algorithm,
                Some(algorithm)
            );
        }

        let spec: PolicySpec = "25/5s as short + 300/60s burst 10 as long".parse().unwrap();
        assert_eq!(spec.limits[0].name.as_deref(), Some("short"));
        assert_eq!(spec.limits[1].name.as_deref(), Some("long"));
        assert_eq!(spec.limits[1].burst, Some(10));
        assert_eq!(spec.limits[1].rate, Rate::per_minute(300));

        let spec: PolicySpec = "1/250ms".parse().unwrap();
        assert_eq!(
            spec.limits[0].rate,
            Rate::new(1, Duration::from_millis(250))
        );
    }

    #[test]
    fn text_round_trips() {
        for text in [
            "100/s",
            "100/s burst 500",
            "25/5s + 300/min",
            "25/5s burst 30 as short + 300/min as long",
            "5000/h gcra",
            "25/5s + 300/min sliding-log",
            "100/h fixed-window",
            "1/250ms + 7/d",
        ] {
            let spec: PolicySpec = text.parse().unwrap();
            assert_eq!(spec.to_string(), text);
            assert_eq!(spec.to_string().parse::<PolicySpec>().unwrap(), spec);
        }
        // From a built policy and back.
        let policy = "25/5s burst 30 + 300/min as long"
            .parse::<PolicySpec>()
            .unwrap()
            .build("p")
            .unwrap();
        let spec = PolicySpec::from(&policy);
        assert_eq!(spec.to_string(), "25/5s burst 30 + 300/min as long");
        assert_eq!(spec.build("p").unwrap(), policy);
    }

    #[test]
    fn errors_point_at_the_offending_text() {
        let cases: &[(&str, &str, &str)] = &[
            ("", "", "expected a limit"),
            ("   ", "", "expected a limit"),
            ("25/5x", "x", "unknown time unit"),
            ("25/5", "", "unknown time unit"),
            ("x/s", "x/s", "expected a count"),
            ("25 per s", "per", "expected `/`"),
            ("100/s burst", "", "a number after `burst`"),
            ("100/s burst ten", "ten", "a number after `burst`"),
            ("100/s burst 5 burst 6", "burst", "given twice"),
            ("100/s + ", "", "expected a count"),
            ("100/s sliding-fast", "sliding-fast", "expected `+`"),
            ("100/s gcra extra", "extra", "unexpected text"),
            ("0/s", "0/s", "at least one event"),
            ("10/s burst 0", "10/s burst 0", "burst must be at least 1"),
            ("10/s as no{braces}", "10/s as no{braces}", "invalid name"),
            (
                "99999999999999999999/s",
                "99999999999999999999",
                "number too large",
            ),
            ("1/0s", "0", "longer than zero"),
            ("1/99999999999d", "99999999999d", "too long"),
            ("100/s as", "", "a name after `as`"),
            ("100/s\u{1F600}", "\u{1F600}", "expected `+`"),
            (
                "10/s burst 20 sliding",
                "10/s burst 20 sliding",
                "window admits",
            ),
            (
                "1/s as a + 2/s as a",
                "1/s as a + 2/s as a",
                "two limits are named",
            ),
        ];
        for (text, fragment, problem) in cases {
            let e = err(text);
            assert_eq!(e.fragment(), *fragment, "{text:?}: {e}");
            assert!(e.problem().contains(problem), "{text:?}: {e}");
            assert!(e.to_string().contains(problem), "{e}");
            assert_eq!(e.text(), *text);
        }
    }

    #[test]
    fn rates_and_limits_parse_alone() {
        assert_eq!("300/min".parse::<Rate>().unwrap(), Rate::per_minute(300));
        assert!("300/min extra".parse::<Rate>().is_err());
        let limit: LimitSpec = "10/s burst 20".parse().unwrap();
        assert_eq!(limit.build().unwrap().burst(), 20);
        assert!("10/s + 1/s".parse::<LimitSpec>().is_err());
    }
}

/// A file of named policies and the routes they apply to, as read with the
/// `serde` feature from TOML, YAML or JSON:
///
/// ```toml
/// default = "general"
///
/// [policies]
/// general = "100/s burst 200"
/// upstream = "25/5s + 300/min"
/// login = { limits = [{ rate = "5/min", name = "login" }] }
///
/// [[routes]]
/// path = "/api/login"
/// method = "POST"
/// policy = "login"
/// ```
///
/// [`policies`](Self::policies) checks every policy and names it after its
/// key; routes refer to those names.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Deserialize, serde::Serialize))]
#[cfg_attr(feature = "serde", serde(deny_unknown_fields))]
pub struct PolicyFile {
    /// The policies, by name.
    pub policies: BTreeMap<String, PolicySpec>,
    /// Routes and the policy each one uses, first match wins.
    #[cfg_attr(
        feature = "serde",
        serde(default, skip_serializing_if = "Vec::is_empty")
    )]
    pub routes: Vec<RouteSpec>,
    /// The policy for requests no route matches; none means they are not
    /// limited.
    #[cfg_attr(
        feature = "serde",
        serde(default, skip_serializing_if = "Option::is_none")
    )]
    pub default: Option<String>,
    /// Plans (`[plans.pro]`): under each plan, other limits for some of
    /// the policies (`api = "100/s"`), for the identities
    /// [`LivePolicies`](crate::live::LivePolicies) assigns the plan and the
    /// requests that name it.
    #[cfg_attr(
        feature = "serde",
        serde(default, skip_serializing_if = "BTreeMap::is_empty")
    )]
    pub plans: BTreeMap<String, BTreeMap<String, PolicySpec>>,
    /// Shedding tiers by route (`[[shed_routes]]`), first match wins, for
    /// the shedders' [`RouteTiers::from_file`](crate::shed::RouteTiers::from_file).
    #[cfg_attr(
        feature = "serde",
        serde(default, skip_serializing_if = "Vec::is_empty")
    )]
    pub shed_routes: Vec<ShedRouteSpec>,
}

/// One route of a [`PolicyFile`]: requests whose matched path (and method,
/// when given) is this use the named policy.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Deserialize, serde::Serialize))]
#[cfg_attr(feature = "serde", serde(deny_unknown_fields))]
pub struct RouteSpec {
    /// The route as the router declares it, such as `/users/{id}`, or a
    /// gRPC method, `/package.Service/Method`; ending in `*`, every path
    /// that starts with the rest (`/package.Service/*`).
    pub path: String,
    /// The method, such as `POST`; none matches every method.
    #[cfg_attr(
        feature = "serde",
        serde(default, skip_serializing_if = "Option::is_none")
    )]
    pub method: Option<String>,
    /// The name of a policy of the file.
    pub policy: String,
}

/// One of a [`PolicyFile`]'s `shed_routes`: requests whose matched path
/// (and method, when given) is this are shed in the named tier.
///
/// ```toml
/// [[shed_routes]]
/// path = "/fleetgate.demo.Greeter/SayHelloStream"
/// tier = "low"
///
/// [[shed_routes]]
/// path = "/v1/reports/*"
/// method = "GET"
/// tier = "low"
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Deserialize, serde::Serialize))]
#[cfg_attr(feature = "serde", serde(deny_unknown_fields))]
pub struct ShedRouteSpec {
    /// The route or gRPC method, as in [`RouteSpec::path`].
    pub path: String,
    /// The method, such as `POST`; none matches every method.
    #[cfg_attr(
        feature = "serde",
        serde(default, skip_serializing_if = "Option::is_none")
    )]
    pub method: Option<String>,
    /// The name of a tier of the shedder's [`Tiers`](crate::shed::Tiers).
    pub tier: String,
}

/// A route's `method` as written in a policy file.
pub(crate) fn route_method(method: Option<&String>) -> Result<Option<http::Method>, ConfigError> {
    method
        .map(|m| {
            http::Method::from_bytes(m.as_bytes())
                .map_err(|_| ConfigError::InvalidMethod { method: m.clone() })
        })
        .transpose()
}

impl PolicyFile {
    /// Checks every policy, route and the default, and builds the policies,
    /// each named after its key.
    pub fn policies(&self) -> Result<BTreeMap<String, Policy>, ConfigError> {
        let mut built = BTreeMap::new();
        for (name, spec) in &self.policies {
            built.insert(name.clone(), spec.build(name.clone())?);
        }
        let known = |name: &str| {
            if built.contains_key(name) {
                Ok(())
            } else {
                Err(ConfigError::UnknownPolicy {
                    name: name.to_owned(),
                })
            }
        };
        for route in &self.routes {
            known(&route.policy)?;
            route_method(route.method.as_ref())?;
            if !route.path.starts_with('/') {
                return Err(ConfigError::InvalidRoute {
                    path: route.path.clone(),
                });
            }
        }
        if let Some(default) = &self.default {
            known(default)?;
        }
        Ok(built)
    }

    /// Checks and builds every plan: plan → policy → limits. Each plan
    /// must name policies of the file.
    pub fn plans(&self) -> Result<BTreeMap<String, BTreeMap<String, Policy>>, ConfigError> {
        let mut plans = BTreeMap::new();
        for (plan, specs) in &self.plans {
            crate::policy::check_name(plan)?;
            let mut built = BTreeMap::new();
            for (name, spec) in specs {
                if !self.policies.contains_key(name) {
                    return Err(ConfigError::UnknownPolicy { name: name.clone() });
                }
                built.insert(name.clone(), spec.build(name.clone())?);
            }
            plans.insert(plan.clone(), built);
        }
        Ok(plans)
    }
}

#[cfg(feature = "serde")]
mod serde_impls {
    use std::fmt;

    use serde::de::{self, MapAccess, Visitor};
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    use super::{LimitSpec, PolicySpec, algorithm_named, algorithm_names};
    use crate::policy::Rate;

    impl Serialize for Rate {
        fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
            serializer.collect_str(self)
        }
    }

    impl<'de> Deserialize<'de> for Rate {
        fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
            let text = String::deserialize(deserializer)?;
            text.parse().map_err(de::Error::custom)
        }
    }

    impl Serialize for LimitSpec {
        fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
            serializer.collect_str(self)
        }
    }

    impl Serialize for PolicySpec {
        fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
            serializer.collect_str(self)
        }
    }

    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct LimitTable {
        /// A rate, or a calendar quota (`500/day tz=Europe/Paris`).
        rate: String,
        #[serde(default)]
        burst: Option<u64>,
        #[serde(default)]
        name: Option<String>,
        /// A penalty box: a duration (`1h`).
        #[serde(default)]
        block: Option<String>,
    }

    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct PolicyTable {
        limits: Vec<LimitSpec>,
        #[serde(default)]
        algorithm: Option<String>,
    }

    /// Text parsed with `FromStr`, or a table read as `Table`.
    struct TextOrTable<T, Table>(std::marker::PhantomData<(T, Table)>);

    impl<'de, T, Table> Visitor<'de> for TextOrTable<T, Table>
    where
        T: std::str::FromStr<Err = super::ParseError> + TryFrom<Table, Error = String>,
        Table: Deserialize<'de>,
    {
        type Value = T;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a string such as \"25/5s + 300/min\" or a table")
        }

        fn visit_str<E: de::Error>(self, text: &str) -> Result<T, E> {
            text.parse().map_err(E::custom)
        }

        fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
            let table = Table::deserialize(de::value::MapAccessDeserializer::new(map))?;
            T::try_from(table).map_err(de::Error::custom)
        }
    }

    impl TryFrom<LimitTable> for LimitSpec {
        type Error = String;

        fn try_from(t: LimitTable) -> Result<Self, String> {
            let (rate, calendar) = super::rate_or_calendar(&t.rate).map_err(|e| e.to_string())?;
            let block = match t.block {
                Some(text) => Some(super::parse_duration(&text).map_err(|e| e.to_string())?),
                None => None,
            };
            let spec = LimitSpec {
                rate,
                calendar,
                burst: t.burst,
                name: t.name,
                block,
            };
            spec.build().map_err(|e| format!("limit {spec}: {e}"))?;
            Ok(spec)
        }
    }

    impl TryFrom<PolicyTable> for PolicySpec {
        type Error = String;

        fn try_from(t: PolicyTable) -> Result<Self, String> {
            if t.limits.is_empty() {
                return Err("a policy needs at least one limit".into());
            }
            let algorithm = match t.algorithm {
                Some(a) => Some(algorithm_named(&a).ok_or_else(|| {
                    format!(
                        "unknown algorithm {a:?}; expected one of {}",
                        algorithm_names()
                    )
                })?),
                None => None,
            };
            Ok(PolicySpec {
                limits: t.limits,
                algorithm,
            })
        }
    }

    impl<'de> Deserialize<'de> for LimitSpec {
        fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
            deserializer.deserialize_any(TextOrTable::<LimitSpec, LimitTable>(
                std::marker::PhantomData,
            ))
        }
    }

    impl<'de> Deserialize<'de> for PolicySpec {
        fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
            deserializer.deserialize_any(TextOrTable::<PolicySpec, PolicyTable>(
                std::marker::PhantomData,
            ))
        }
    }
}
