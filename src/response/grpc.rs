//! gRPC refusals: what the layers send a gRPC client instead of a 429 or
//! 503, which gRPC clients read as a broken transport.
//!
//! A refusal is a trailers-only response: HTTP 200 with an empty body and
//! the status in the headers, `grpc-status` and `grpc-message`
//! (percent-encoded as the gRPC spec asks). When a retry can help, it
//! carries the hints clients and proxies read: `grpc-retry-pushback-ms`
//! (gRPC's retry policy), `retry-after` (HTTP proxies), and
//! `grpc-status-details-bin`, a `google.rpc.Status` holding a
//! `google.rpc.RetryInfo` (what `tonic-types` and the Go and Java
//! clients' `errdetails` decode). Those few protobuf fields are written by
//! hand here: no protobuf crate is needed for them.

use std::time::Duration;

use bytes::Bytes;
use http::header::{CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderMap, HeaderValue, Response, StatusCode};

use super::headers::{integer_value, retry_after_secs};

/// `RESOURCE_EXHAUSTED`: a rate or concurrency limit refused the call.
pub(crate) const RESOURCE_EXHAUSTED: u8 = 8;
/// `UNAVAILABLE`: shed, or the limiter's store is down and it fails closed.
pub(crate) const UNAVAILABLE: u8 = 14;

/// Where `grpc-status-details-bin`'s `Any` says its `RetryInfo` is defined.
const RETRY_INFO_URL: &str = "type.googleapis.com/google.rpc.RetryInfo";

/// A call's deadline from its `grpc-timeout` header, as the gRPC spec
/// writes it: 1 to 8 ASCII digits and a unit, `H` `M` `S` `m` `u` `n`
/// (hours down to nanoseconds). Anything else is no deadline.
pub(crate) fn timeout(headers: &HeaderMap) -> Option<Duration> {
    let value = headers.get("grpc-timeout")?.as_bytes();
    let (&unit, digits) = value.split_last()?;
    if digits.is_empty() || digits.len() > 8 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    // At most 8 digits: no overflow, even in hours (10^8 h fits in u64 s).
    let n = digits
        .iter()
        .fold(0u64, |n, d| n * 10 + u64::from(d - b'0'));
    Some(match unit {
        b'H' => Duration::from_secs(n * 3600),
        b'M' => Duration::from_secs(n * 60),
        b'S' => Duration::from_secs(n),
        b'm' => Duration::from_millis(n),
        b'u' => Duration::from_micros(n),
        b'n' => Duration::from_nanos(n),
        _ => return None,
    })
}

/// The trailers-only refusal with gRPC status `code` and `message`.
///
/// `retry` is when a retry can help: `Some(Some(after))` sends the retry
/// hints, `Some(None)` says never (`grpc-retry-pushback-ms: -1`, the spec's
/// "do not retry"), `None` sends none.
pub(crate) fn refusal(code: u8, message: &str, retry: Option<Option<Duration>>) -> Response<Bytes> {
    let mut response = Response::new(Bytes::new());
    *response.status_mut() = StatusCode::OK;
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    headers.insert("grpc-status", integer_value(u64::from(code)));
    if let Ok(value) = HeaderValue::from_str(&percent_encode(message)) {
        headers.insert("grpc-message", value);
    }
    match retry {
        Some(Some(after)) => write_retry(headers, code, message, after),
        Some(None) => {
            headers.insert("grpc-retry-pushback-ms", HeaderValue::from_static("-1"));
        }
        None => {}
    }
    response
}

fn write_retry(headers: &mut HeaderMap, code: u8, message: &str, after: Duration) {
    headers.insert("grpc-retry-pushback-ms", integer_value(pushback_ms(after)));
    headers.insert(RETRY_AFTER, integer_value(retry_after_secs(after)));
    let details = base64(&status_with_retry_info(code, message, after));
    if let Ok(value) = HeaderValue::from_str(&details) {
        headers.insert("grpc-status-details-bin", value);
    }
}

/// `after` in whole milliseconds, rounded up: a client retrying on the
/// dot must not arrive early.
fn pushback_ms(after: Duration) -> u64 {
    u64::try_from(after.as_nanos().div_ceil(1_000_000)).unwrap_or(u64::MAX)
}

/// The gRPC spec's encoding of `grpc-message`: every byte outside
/// printable ASCII, and `%` itself, as `%XX`.
pub(crate) fn percent_encode(message: &str) -> String {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    let mut out = String::with_capacity(message.len());
    for &b in message.as_bytes() {
        if (0x20..=0x7e).contains(&b) && b != b'%' {
            out.push(char::from(b));
        } else {
            out.push('%');
            out.push(char::from(HEX[usize::from(b >> 4)]));
            out.push(char::from(HEX[usize::from(b & 0xf)]));
        }
    }
    out
}

/// `google.rpc.Status { code, message, details: [Any(RetryInfo { retry_delay })] }`
/// in protobuf's wire format.
fn status_with_retry_info(code: u8, message: &str, after: Duration) -> Vec<u8> {
    // google.protobuf.Duration { seconds = 1; nanos = 2; }
    let mut delay = Vec::with_capacity(16);
    if after.as_secs() > 0 {
        varint_field(&mut delay, 1, after.as_secs());
    }
    if after.subsec_nanos() > 0 {
        varint_field(&mut delay, 2, u64::from(after.subsec_nanos()));
    }
    // google.rpc.RetryInfo { retry_delay = 1; }
    let mut retry_info = Vec::with_capacity(delay.len() + 2);
    bytes_field(&mut retry_info, 1, &delay);
    // google.protobuf.Any { type_url = 1; value = 2; }
    let mut any = Vec::with_capacity(RETRY_INFO_URL.len() + retry_info.len() + 4);
    bytes_field(&mut any, 1, RETRY_INFO_URL.as_bytes());
    bytes_field(&mut any, 2, &retry_info);
    // google.rpc.Status { code = 1; message = 2; details = 3; }
    let mut status = Vec::with_capacity(message.len() + any.len() + 8);
    varint_field(&mut status, 1, u64::from(code));
    if !message.is_empty() {
        bytes_field(&mut status, 2, message.as_bytes());
    }
    bytes_field(&mut status, 3, &any);
    status
}

fn varint(out: &mut Vec<u8>, mut n: u64) {
    while n >= 0x80 {
        out.push((n as u8 & 0x7f) | 0x80);
        n >>= 7;
    }
    out.push(n as u8);
}

fn varint_field(out: &mut Vec<u8>, field: u64, n: u64) {
    varint(out, field << 3);
    varint(out, n);
}

fn bytes_field(out: &mut Vec<u8>, field: u64, bytes: &[u8]) {
    varint(out, (field << 3) | 2);
    varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

/// Standard base64 without padding, as gRPC asks binary headers to be sent.
fn base64(bytes: &[u8]) -> String {
    crate::text::base64(
        bytes,
        b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/",
    )
}

/// The gRPC status for a refusal whose HTTP status is `status` (a
/// missing key's configured status, a custom concurrency status), after
/// gRPC's own HTTP mapping, made precise where the cause is known.
pub(crate) fn code_for(status: StatusCode) -> u8 {
    match status.as_u16() {
        400 => 3,  // INVALID_ARGUMENT
        401 => 16, // UNAUTHENTICATED
        403 => 7,  // PERMISSION_DENIED
        404 => 12, // UNIMPLEMENTED
        429 => RESOURCE_EXHAUSTED,
        502..=504 => UNAVAILABLE,
        _ => 2, // UNKNOWN
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timeout_of(value: &'static str) -> Option<Duration> {
        let mut headers = HeaderMap::new();
        headers.insert("grpc-timeout", HeaderValue::from_static(value));
        timeout(&headers)
    }

    #[test]
    fn reads_grpc_timeout_as_the_spec_writes_it() {
        assert_eq!(timeout_of("2H"), Some(Duration::from_secs(7200)));
        assert_eq!(timeout_of("3M"), Some(Duration::from_secs(180)));
        assert_eq!(timeout_of("1S"), Some(Duration::from_secs(1)));
        assert_eq!(timeout_of("200m"), Some(Duration::from_millis(200)));
        assert_eq!(timeout_of("250u"), Some(Duration::from_micros(250)));
        assert_eq!(
            timeout_of("99999999n"),
            Some(Duration::from_nanos(99_999_999))
        );
        assert_eq!(timeout_of("0m"), Some(Duration::ZERO));
        assert_eq!(
            timeout_of("99999999H"),
            Some(Duration::from_secs(99_999_999 * 3600))
        );
        // Nine digits, no digits, no unit, a bad unit, a sign: ignored.
        for bad in [
            "123456789m",
            "m",
            "100",
            "100s",
            "100x",
            "-1S",
            "+1S",
            "1 S",
            "",
        ] {
            assert_eq!(timeout_of(bad), None, "{bad:?}");
        }
        assert_eq!(timeout(&HeaderMap::new()), None);
    }

    #[test]
    fn messages_are_percent_encoded() {
        assert_eq!(percent_encode("limit 5/s"), "limit 5/s");
        assert_eq!(percent_encode("100% über\n"), "100%25 %C3%BCber%0A");
    }

    #[test]
    fn base64_matches_the_rfc_vectors_unpadded() {
        let cases = [
            ("", ""),
            ("f", "Zg"),
            ("fo", "Zm8"),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg"),
            ("fooba", "Zm9vYmE"),
            ("foobar", "Zm9vYmFy"),
        ];
        for (plain, encoded) in cases {
            assert_eq!(base64(plain.as_bytes()), encoded);
        }
    }

    #[test]
    fn retry_info_is_protobuf() {
        // Status { code: 8, message: "m", details: [Any { type_url, value:
        // RetryInfo { retry_delay: Duration { seconds: 1, nanos: 500000000 } } }] }
        let encoded = status_with_retry_info(8, "m", Duration::from_millis(1500));
        let mut expected = vec![0x08, 8, 0x12, 1, b'm', 0x1a];
        let duration = [0x08, 1, 0x10, 0x80, 0xca, 0xb5, 0xee, 0x01];
        let retry_info = [&[0x0a, duration.len() as u8][..], &duration].concat();
        let any = [
            &[0x0a, RETRY_INFO_URL.len() as u8][..],
            RETRY_INFO_URL.as_bytes(),
            &[0x12, retry_info.len() as u8],
            &retry_info,
        ]
        .concat();
        expected.push(any.len() as u8);
        expected.extend_from_slice(&any);
        assert_eq!(encoded, expected);
    }

    #[test]
    fn pushback_rounds_up() {
        assert_eq!(pushback_ms(Duration::from_micros(1)), 1);
        assert_eq!(pushback_ms(Duration::from_millis(250)), 250);
        assert_eq!(pushback_ms(Duration::from_micros(250_001)), 251);
    }
}
