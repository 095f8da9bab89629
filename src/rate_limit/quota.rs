//! Reading what an upstream says is left of its limit: the IETF
//! `RateLimit` header (current and older drafts), `X-RateLimit-*` as GitHub
//! and many others send them, and OpenAI's `x-ratelimit-*-requests`.

use std::time::{Duration, SystemTime};

use http::HeaderMap;

use crate::error::StoreError;
use crate::log::LogGate;

/// What an upstream says is left of its limit for the caller: `remaining`
/// calls until its limit resets, `reset` from now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UpstreamQuota {
    /// Calls the upstream will still accept before the reset.
    pub remaining: u64,
    /// How long from now until the upstream's limit resets.
    pub reset: Duration,
}

/// Members of a `RateLimit` field read at most, so that a hostile header
/// costs little.
const MAX_MEMBERS: usize = 16;

/// A reset of at least this many seconds is a Unix time (GitHub's
/// `X-RateLimit-Reset`), not a delay: 10^9 s is September 2001, and no
/// upstream's window is 31 years long.
const EPOCH_FROM: u64 = 1_000_000_000;

/// Every quota the headers state, in the order: `RateLimit` (each item of
/// the current draft, or the older draft's dictionary),
/// `RateLimit-Remaining`/`-Reset`, `X-RateLimit-Remaining`/`-Reset`
/// (`-Reset-After` preferred when present), and
/// `X-RateLimit-Remaining-Requests`/`-Reset-Requests`. A remaining without
/// a usable reset, or the reverse, states nothing. `now` reads Unix-time
/// resets.
pub(super) fn quotas(headers: &HeaderMap, now: SystemTime) -> Vec<UpstreamQuota> {
    let mut found = Vec::new();
    let mut members = 0;
    for value in headers.get_all("ratelimit") {
        let Ok(text) = value.to_str() else { continue };
        ratelimit_field(text, &mut members, &mut found);
    }
    let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let pair = |remaining: Option<&str>, reset: Option<Duration>| {
        Some(UpstreamQuota {
            remaining: parse_count(remaining?)?,
            reset: reset?,
        })
    };
    found.extend(pair(
        text("ratelimit-remaining"),
        text("ratelimit-reset").and_then(parse_seconds),
    ));
    let x_reset = text("x-ratelimit-reset-after")
        .and_then(parse_seconds)
        .or_else(|| text("x-ratelimit-reset").and_then(|t| parse_reset(t, now)));
    found.extend(pair(text("x-ratelimit-remaining"), x_reset));
    found.extend(pair(
        text("x-ratelimit-remaining-requests"),
        text("x-ratelimit-reset-requests").and_then(parse_go_duration),
    ));
    found
}

/// The quota that holds back most, as far as the headers alone can tell:
/// the fewest calls left, and of those the longest reset.
pub(super) fn tightest(quotas: &[UpstreamQuota]) -> Option<UpstreamQuota> {
    quotas
        .iter()
        .copied()
        .min_by(|a, b| a.remaining.cmp(&b.remaining).then(b.reset.cmp(&a.reset)))
}

/// One `RateLimit` field: items of the current draft
/// (`"default";r=50;t=30`), each with its own `r` and `t`, or the older
/// draft's dictionary (`limit=100, remaining=50, reset=30`).
fn ratelimit_field(text: &str, members: &mut usize, found: &mut Vec<UpstreamQuota>) {
    let (mut remaining, mut reset) = (None, None);
    for member in split_outside_quotes(text, ',') {
        *members += 1;
        if *members > MAX_MEMBERS {
            return;
        }
        let (mut r, mut t) = (None, None);
        for part in split_outside_quotes(member, ';') {
            let Some((name, value)) = part.split_once('=') else {
                continue;
            };
            match name.trim().to_ascii_lowercase().as_str() {
                "r" => r = parse_count(value),
                "t" => t = parse_seconds(value),
                "remaining" => remaining = parse_count(value),
                "reset" => reset = parse_seconds(value),
                _ => {}
            }
        }
        if let (Some(remaining), Some(reset)) = (r, t) {
            found.push(UpstreamQuota { remaining, reset });
        }
    }
    if let (Some(remaining), Some(reset)) = (remaining, reset) {
        found.push(UpstreamQuota { remaining, reset });
    }
}

/// `text` split at `sep`, except inside double quotes (with `\` escapes),
/// as a structured field's strings allow.
fn split_outside_quotes(text: &str, sep: char) -> impl Iterator<Item = &str> {
    let mut parts = Vec::new();
    let (mut start, mut quoted, mut escaped) = (0, false, false);
    for (i, c) in text.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' if quoted => escaped = true,
            '"' => quoted = !quoted,
            c if c == sep && !quoted => {
                parts.push(&text[start..i]);
                start = i + c.len_utf8();
            }
            _ => {}
        }
    }
    parts.push(&text[start..]);
    parts.into_iter()
}

/// A count of calls: digits only (spaces around allowed); too large for a
/// `u64` saturates (plenty left). Signs, fractions, garbage: `None`.
fn parse_count(text: &str) -> Option<u64> {
    let text = text.trim_matches(|c| c == ' ' || c == '\t');
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some(text.parse::<u64>().unwrap_or(u64::MAX))
}

/// Seconds, whole or with a fraction (`30`, `1.5`); too large saturates.
fn parse_seconds(text: &str) -> Option<Duration> {
    let text = text.trim_matches(|c| c == ' ' || c == '\t');
    decimal(text, 1_000_000_000)
}

/// `X-RateLimit-Reset`: a Unix time in seconds (GitHub, Twitter) when at
/// least [`EPOCH_FROM`], else seconds from now. A time in the past is 0.
fn parse_reset(text: &str, now: SystemTime) -> Option<Duration> {
    let value = parse_seconds(text)?;
    if value.as_secs() < EPOCH_FROM {
        return Some(value);
    }
    let at = SystemTime::UNIX_EPOCH.checked_add(value)?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

/// A Go duration as OpenAI sends it: `1s`, `6m0s`, `20ms`, `1h2m3.5s`
/// (units `h`, `m`, `s`, `ms`, `us`, `µs`, `ns`); saturating.
fn parse_go_duration(text: &str) -> Option<Duration> {
    let mut rest = text.trim_matches(|c| c == ' ' || c == '\t');
    if rest.is_empty() {
        return None;
    }
    let mut total = Duration::ZERO;
    while !rest.is_empty() {
        let number_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let (number, tail) = rest.split_at(number_len);
        let unit_len = tail
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(tail.len());
        let (unit, tail) = tail.split_at(unit_len);
        let nanos_per_unit: u64 = match unit {
            "h" => 3_600_000_000_000,
            "m" => 60_000_000_000,
            "s" => 1_000_000_000,
            "ms" => 1_000_000,
            "us" | "µs" | "μs" => 1_000,
            "ns" => 1,
            _ => return None,
        };
        total = total.saturating_add(decimal(number, nanos_per_unit)?);
        rest = tail;
    }
    Some(total)
}

/// `digits[.digits]` times a unit of `unit_nanos` nanoseconds; saturating.
fn decimal(text: &str, unit_nanos: u64) -> Option<Duration> {
    let (whole, fraction) = text.split_once('.').unwrap_or((text, ""));
    let digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    if whole.is_empty() || !digits(whole) || !digits(fraction) || text.ends_with('.') {
        return None;
    }
    let whole_nanos = match whole.parse::<u64>() {
        Ok(n) => u128::from(n) * u128::from(unit_nanos),
        Err(_) => u128::MAX,
    };
    // Nine digits of fraction are a nanosecond of a second: more are noise.
    let mut fraction_nanos: u128 = 0;
    let mut scale: u128 = 1;
    for b in fraction.bytes().take(18) {
        fraction_nanos = fraction_nanos * 10 + u128::from(b - b'0');
        scale *= 10;
    }
    let nanos = whole_nanos.saturating_add(fraction_nanos * u128::from(unit_nanos) / scale);
    let secs = u64::try_from(nanos / 1_000_000_000).unwrap_or(u64::MAX);
    let sub = u32::try_from(nanos % 1_000_000_000).unwrap_or(0);
    Some(if secs == u64::MAX {
        Duration::MAX
    } else {
        Duration::new(secs, sub)
    })
}

/// Upstream pauses (429/503 with Retry-After) are logged at most once a
/// second per process.
static FEEDBACK_WARNINGS: LogGate = LogGate::new();

/// What upstreams say is left (their rate-limit headers), recorded on
/// every response that states it, is logged at most once a second per
/// process too, apart from the pauses.
static QUOTA_LOGS: LogGate = LogGate::new();

/// Logs a recorded pause (at `warn`) or quota (at `debug`; a failure to
/// record it at `warn`), each kind at most once a second per process.
pub(super) fn log_hold(policy: &str, hold: UpstreamQuota, recorded: &Result<(), StoreError>) {
    let (remaining, reset) = (hold.remaining, hold.reset);
    if remaining == 0 {
        if FEEDBACK_WARNINGS.allow() {
            match recorded {
                Ok(()) => tracing::warn!(
                    policy,
                    pause = ?reset,
                    "upstream asked to slow down; identity paused fleet-wide"
                ),
                Err(err) => tracing::warn!(
                    policy,
                    pause = ?reset,
                    error = %err,
                    "upstream asked to slow down; recording the pause failed"
                ),
            }
        }
    } else if QUOTA_LOGS.allow() {
        match recorded {
            Ok(()) => tracing::debug!(
                policy,
                remaining,
                ?reset,
                "upstream's remaining budget recorded fleet-wide"
            ),
            Err(err) => tracing::warn!(
                policy,
                remaining,
                ?reset,
                error = %err,
                "recording the upstream's remaining budget failed"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn now() -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000)
    }

    fn read(pairs: &[(&str, &[u8])]) -> Vec<UpstreamQuota> {
        let mut headers = HeaderMap::new();
        for (name, value) in pairs {
            headers.append(
                http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
                http::HeaderValue::from_bytes(value).unwrap(),
            );
        }
        quotas(&headers, now())
    }

    fn q(remaining: u64, reset: Duration) -> UpstreamQuota {
        UpstreamQuota { remaining, reset }
    }

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn each_style() {
        // The current IETF draft, with its policy alongside.
        assert_eq!(
            read(&[
                ("ratelimit", b"\"default\";r=50;t=30"),
                ("ratelimit-policy", b"\"default\";q=100;w=60"),
            ]),
            [q(50, 30 * S)]
        );
        // Several items, a name with a comma and a semicolon inside quotes.
        assert_eq!(
            read(&[("ratelimit", b"\"a,b;c\";r=1;t=2, \"day\";r=900;t=3600")]),
            [q(1, 2 * S), q(900, 3600 * S)]
        );
        // The older draft's dictionary, and its separate fields.
        assert_eq!(
            read(&[("ratelimit", b"limit=100, remaining=5, reset=7")]),
            [q(5, 7 * S)]
        );
        assert_eq!(
            read(&[("ratelimit-remaining", b"3"), ("ratelimit-reset", b"9")]),
            [q(3, 9 * S)]
        );
        // GitHub: a Unix time; others: seconds from now, or a fraction.
        assert_eq!(
            read(&[
                ("x-ratelimit-remaining", b"12"),
                ("x-ratelimit-reset", b"1700000042"),
            ]),
            [q(12, 42 * S)]
        );
        assert_eq!(
            read(&[
                ("x-ratelimit-remaining", b"0"),
                ("x-ratelimit-reset", b"1699999000")
            ]),
            [q(0, Duration::ZERO)],
            "a reset in the past"
        );
        assert_eq!(
            read(&[
                ("x-ratelimit-remaining", b"4"),
                ("x-ratelimit-reset", b"60")
            ]),
            [q(4, 60 * S)]
        );
        assert_eq!(
            read(&[
                ("x-ratelimit-remaining", b"4"),
                ("x-ratelimit-reset", b"1700000042"),
                ("x-ratelimit-reset-after", b"1.5"),
            ]),
            [q(4, Duration::from_millis(1500))]
        );
        // OpenAI: Go durations; the tokens pair is not about calls.
        assert_eq!(
            read(&[
                ("x-ratelimit-remaining-requests", b"59"),
                ("x-ratelimit-reset-requests", b"6m0s"),
                ("x-ratelimit-remaining-tokens", b"100"),
                ("x-ratelimit-reset-tokens", b"1s"),
            ]),
            [q(59, 360 * S)]
        );
        for (text, want) in [
            ("1s", S),
            ("20ms", Duration::from_millis(20)),
            ("1h2m3.5s", Duration::from_millis(3_723_500)),
            ("0s", Duration::ZERO),
            ("7.25µs", Duration::from_nanos(7_250)),
            ("3us", Duration::from_micros(3)),
        ] {
            assert_eq!(parse_go_duration(text), Some(want), "{text}");
        }
        // Every style at once: the tightest wins.
        let all = read(&[
            ("ratelimit", b"\"default\";r=50;t=30"),
            ("x-ratelimit-remaining", b"0"),
            ("x-ratelimit-reset", b"2"),
            ("x-ratelimit-remaining-requests", b"0"),
            ("x-ratelimit-reset-requests", b"5s"),
        ]);
        assert_eq!(all.len(), 3);
        assert_eq!(tightest(&all), Some(q(0, 5 * S)));
        assert_eq!(tightest(&[]), None);
    }

    #[test]
    fn garbage_is_ignored_never_a_panic() {
        for (name, value) in [
            ("ratelimit", &b"\"default\";r=-1;t=30"[..]),
            ("ratelimit", b"\"default\";r=5;t=-30"),
            ("ratelimit", b"\"default\";r=5"),
            ("ratelimit", b"\"default\";t=5"),
            ("ratelimit", b"\"default\";r=1.5;t=5"),
            ("ratelimit", b"\"default\";r=;t="),
            ("ratelimit", b"\"unterminated;r=1;t=2"),
            ("ratelimit", b";;;,,,==="),
            ("ratelimit", b"\xff\xfe"),
            ("ratelimit", b"r=5;t=1e3"),
            ("ratelimit", b"\"d\";r=0x10;t=5"),
            ("ratelimit", b"\"d\";r=5;t=5."),
            ("ratelimit", b"\"d\";r=5;t=.5"),
        ] {
            assert_eq!(
                read(&[(name, value)]),
                [],
                "{:?}",
                String::from_utf8_lossy(value)
            );
        }
        for (remaining, reset) in [
            (&b"12"[..], &b"soon"[..]),
            (b"-1", b"5"),
            (b"1 2", b"5"),
            (b"", b"5"),
            (b"5", b""),
            (b"5", b"5s"),
            (b"5", b"\xc3\x28"),
        ] {
            assert_eq!(
                read(&[
                    ("x-ratelimit-remaining", remaining),
                    ("x-ratelimit-reset", reset),
                ]),
                []
            );
        }
        for text in [
            "", "5", "s", "5x", "1h-2m", "..s", "1.s", "5 s", "ms5", "1e3s",
        ] {
            assert_eq!(parse_go_duration(text), None, "{text}");
        }
        // Only a remaining, or only a reset: nothing is stated.
        assert_eq!(read(&[("x-ratelimit-remaining", b"0")]), []);
        assert_eq!(read(&[("x-ratelimit-reset", b"5")]), []);
        // A hostile field: members past the cap are not read.
        let long = "\"x\";r=1;t=1, ".repeat(10_000);
        assert_eq!(read(&[("ratelimit", long.as_bytes())]).len(), MAX_MEMBERS);
        // Every prefix and single-byte change of a valid field.
        let field = b"\"default\";r=50;t=30, limit=1, remaining=2, reset=3";
        for end in 0..field.len() {
            let _ = read(&[("ratelimit", &field[..end])]);
        }
        for i in 0..field.len() {
            for byte in [b'"', b';', b',', b'=', b'\\', b'9', b' '] {
                let mut odd = field.to_vec();
                odd[i] = byte;
                let _ = read(&[("ratelimit", &odd)]);
            }
        }
    }

    #[test]
    fn huge_values_saturate() {
        let huge = "9".repeat(1000);
        assert_eq!(
            read(&[
                ("x-ratelimit-remaining", huge.as_bytes()),
                ("x-ratelimit-reset", b"5"),
            ]),
            [q(u64::MAX, 5 * S)]
        );
        // A reset too far for any Unix time: saturates, then is capped by
        // the caller.
        let quotas = read(&[("ratelimit", format!("\"d\";r=0;t={huge}").as_bytes())]);
        assert_eq!(quotas, [q(0, Duration::MAX)]);
        assert_eq!(parse_go_duration(&format!("{huge}h")), Some(Duration::MAX));
        assert_eq!(
            parse_go_duration("99999999999999999999h99999999999999999999h"),
            Some(Duration::MAX)
        );
        assert_eq!(
            parse_seconds("1.123456789123456789123"),
            Some(Duration::new(1, 123_456_789))
        );
        // A Unix time beyond what SystemTime holds is no reset at all.
        let _ = read(&[
            ("x-ratelimit-remaining", b"0"),
            ("x-ratelimit-reset", huge.as_bytes()),
        ]);
    }
}
