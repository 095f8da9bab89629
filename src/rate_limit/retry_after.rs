//! Reading an upstream's `Retry-After`: delay-seconds or an HTTP date
//! (RFC 9110, section 10.2.3).

use std::time::{Duration, SystemTime};

/// How long a `Retry-After` value asks the caller to wait, from `now`.
///
/// Accepts delay-seconds (`120`, optionally surrounded by spaces or tabs)
/// and HTTP dates in the three forms RFC 9110 allows
/// (`Sun, 06 Nov 1994 08:49:37 GMT` and the two obsolete ones). A date in
/// the past means no wait (`Some(ZERO)`). A number of seconds too large for
/// a `u64` saturates, so the caller's cap applies rather than the value
/// being ignored. Anything else (negative or fractional numbers, signs,
/// garbage, bytes that are not UTF-8) is `None`. Never panics.
pub(super) fn parse_retry_after(value: &[u8], now: SystemTime) -> Option<Duration> {
    let text = std::str::from_utf8(value)
        .ok()?
        .trim_matches(|c| c == ' ' || c == '\t');
    if text.is_empty() {
        return None;
    }
    if text.bytes().all(|b| b.is_ascii_digit()) {
        // Only digits: parsing fails on overflow alone.
        let secs = text.parse::<u64>().unwrap_or(u64::MAX);
        return Some(Duration::from_secs(secs));
    }
    let at = httpdate::parse_http_date(text).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn now() -> SystemTime {
        // Wed, 21 Oct 2015 07:27:50 GMT
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_445_412_470)
    }

    fn parse(value: &[u8]) -> Option<Duration> {
        parse_retry_after(value, now())
    }

    #[test]
    fn delay_seconds() {
        assert_eq!(parse(b"0"), Some(Duration::ZERO));
        assert_eq!(parse(b"5"), Some(Duration::from_secs(5)));
        assert_eq!(parse(b" \t7 "), Some(Duration::from_secs(7)));
        assert_eq!(parse(b"007"), Some(Duration::from_secs(7)));
        assert_eq!(
            parse(b"99999999999999999999999999999999"),
            Some(Duration::from_secs(u64::MAX))
        );
        let long = "9".repeat(100_000);
        assert_eq!(parse(long.as_bytes()), Some(Duration::from_secs(u64::MAX)));
    }

    #[test]
    fn http_dates() {
        assert_eq!(
            parse(b"Wed, 21 Oct 2015 07:28:00 GMT"),
            Some(Duration::from_secs(10))
        );
        // RFC 850 and asctime forms.
        assert_eq!(
            parse(b"Wednesday, 21-Oct-15 07:28:00 GMT"),
            Some(Duration::from_secs(10))
        );
        assert_eq!(
            parse(b"Wed Oct 21 07:28:00 2015"),
            Some(Duration::from_secs(10))
        );
        // In the past: go now.
        assert_eq!(
            parse(b"Sun, 06 Nov 1994 08:49:37 GMT"),
            Some(Duration::ZERO)
        );
        assert_eq!(
            parse(b"Fri, 31 Dec 9999 23:59:59 GMT"),
            SystemTime::UNIX_EPOCH
                .checked_add(Duration::from_secs(253_402_300_799))
                .and_then(|t| t.duration_since(now()).ok())
        );
    }

    #[test]
    fn odd_inputs_are_none_never_a_panic() {
        for value in [
            &b""[..],
            b"   ",
            b"-1",
            b"+5",
            b"1.5",
            b"1e3",
            b"0x10",
            b"5 5",
            b"5s",
            b"\xff\xfe",
            b"\x00",
            b"Wed, 21 Oct 2015 07:28:00",
            b"Wed, 31 Feb 2015 07:28:00 GMT",
            b"Wed, 21 Oct 2015 25:28:00 GMT",
            b"Wed, 21 Oct 15 07:28:00 GMT",
            b"Wed, 21 Oct 20150 07:28:00 GMT",
            b"Mon, 99 Xyz 2015 07:28:00 GMT",
            b"\xe2\x80\x83120",
            b"Wed, 21 Oct 2015 07:28:00 GMT\x00",
        ] {
            assert_eq!(parse(value), None, "{:?}", String::from_utf8_lossy(value));
        }
        // Every prefix of a valid date, and every single-byte change of it.
        let date = b"Wed, 21 Oct 2015 07:28:00 GMT";
        for end in 0..date.len() {
            let _ = parse(&date[..end]);
        }
        for i in 0..date.len() {
            for byte in [0u8, b'9', b' ', b'-', 0x7f, 0xc3] {
                let mut odd = date.to_vec();
                odd[i] = byte;
                let _ = parse(&odd);
            }
        }
        // Dates before the epoch or far from `now` in either direction.
        let _ = parse_retry_after(date, SystemTime::UNIX_EPOCH);
        let _ = parse_retry_after(b"Thu, 01 Jan 1970 00:00:00 GMT", now());
    }
}
