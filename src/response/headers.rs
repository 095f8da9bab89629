use std::fmt::Write as _;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue};

use crate::decision::Decision;
use crate::policy::Policy;

/// Which rate-limit headers responses carry. `Retry-After` is always sent
/// on 429 and 503, whatever the style, with two exceptions: a call whose
/// cost is above the burst (no wait would let it pass), and a missing-key
/// refusal with a status chosen through
/// [`OnMissingKey::Reject`](crate::OnMissingKey::Reject).
///
/// | style | headers |
/// |---|---|
/// | [`Draft`](HeaderStyle::Draft) (default) | `RateLimit-Policy`, `RateLimit` (IETF draft-ietf-httpapi-ratelimit-headers) |
/// | [`Legacy`](HeaderStyle::Legacy) | `X-RateLimit-Limit`, `X-RateLimit-Remaining`, `X-RateLimit-Reset` |
/// | [`Both`](HeaderStyle::Both) | all of the above |
/// | [`None`](HeaderStyle::None) | none |
///
/// For GCRA, a limit's quota is its burst and its window the time a full
/// burst takes to refill: `100/s burst 500` is advertised as
/// `RateLimit-Policy: "100/s";q=500;w=5`. `RateLimit` reports the limit
/// that decided: `r` the calls of cost 1 left, `t` the seconds (rounded
/// up) until it is full again. For a window algorithm over several windows
/// it reports every window, in the policy's order. `X-RateLimit-Reset` is that same number of
/// seconds, not a timestamp.
///
/// For the window algorithms a limit's quota is the window's count and its
/// window the window's length; what `r` and `t` mean for each is tabled in
/// [`Algorithm`](crate::Algorithm).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum HeaderStyle {
    /// The IETF draft pair `RateLimit-Policy` / `RateLimit`.
    #[default]
    Draft,
    /// The `X-RateLimit-*` headers many APIs send.
    Legacy,
    /// Both sets.
    Both,
    /// No rate-limit headers.
    None,
}

impl HeaderStyle {
    fn draft(self) -> bool {
        matches!(self, HeaderStyle::Draft | HeaderStyle::Both)
    }

    fn legacy(self) -> bool {
        matches!(self, HeaderStyle::Legacy | HeaderStyle::Both)
    }
}

// The names are made at compile time (`const` blocks), so each use is a
// fresh copy handed to the map by value: no clone call per response.
fn ratelimit_policy() -> HeaderName {
    const { HeaderName::from_static("ratelimit-policy") }
}
fn ratelimit() -> HeaderName {
    const { HeaderName::from_static("ratelimit") }
}
fn x_limit() -> HeaderName {
    const { HeaderName::from_static("x-ratelimit-limit") }
}
fn x_remaining() -> HeaderName {
    const { HeaderName::from_static("x-ratelimit-remaining") }
}
fn x_reset() -> HeaderName {
    const { HeaderName::from_static("x-ratelimit-reset") }
}

/// Seconds for `Retry-After`, rounded up so that a client that waits that
/// long is not refused again.
pub(crate) fn retry_after_secs(after: Duration) -> u64 {
    after
        .as_micros()
        .div_ceil(1_000_000)
        .try_into()
        .unwrap_or(u64::MAX)
}

/// An integer header value, its digits copied straight into the value's
/// one allocation (`HeaderValue::from(u64)` goes through a growing buffer).
pub(crate) fn integer_value(n: u64) -> HeaderValue {
    HeaderValue::from_bytes(itoa::Buffer::new().format(n).as_bytes())
        .unwrap_or_else(|_| HeaderValue::from(n))
}

/// Header values computed once per policy.
#[derive(Debug)]
pub(crate) struct PolicyHeaders {
    style: HeaderStyle,
    policy: Policy,
    policy_value: Option<HeaderValue>,
    /// `"<name>";r=` of each limit: the start of its `RateLimit` value.
    ratelimit_prefixes: Box<[Box<[u8]>]>,
    /// The longest `RateLimit` value this policy can send.
    ratelimit_max_len: usize,
}

impl PolicyHeaders {
    pub(crate) fn new(policy: &Policy, style: HeaderStyle) -> Self {
        let mut text = String::new();
        for limit in policy.limits() {
            if !text.is_empty() {
                text.push_str(", ");
            }
            let _ = write!(
                text,
                "\"{}\";q={};w={}",
                limit.name(),
                limit.burst(),
                retry_after_secs(limit.window())
            );
        }
        let ratelimit_prefixes: Box<[Box<[u8]>]> = policy
            .limits()
            .iter()
            .map(|limit| format!("\"{}\";r=", limit.name()).into_bytes().into())
            .collect();
        // Each member: ", ", its prefix, two numbers of up to 20 digits
        // and ";t=".
        let ratelimit_max_len = ratelimit_prefixes
            .iter()
            .map(|prefix| 2 + prefix.len() + 20 + 3 + 20)
            .sum();
        PolicyHeaders {
            style,
            policy: policy.clone(),
            policy_value: HeaderValue::from_str(&text).ok(),
            ratelimit_prefixes,
            ratelimit_max_len,
        }
    }

    pub(crate) fn style(&self) -> HeaderStyle {
        self.style
    }

    /// Adds the rate-limit headers for `decision`.
    ///
    /// When layers are stacked, each layer's limits join the draft headers
    /// (they are lists), and the `X-RateLimit-*` headers of the innermost
    /// layer, set first, stay.
    pub(crate) fn write(&self, headers: &mut HeaderMap, decision: &Decision) {
        let Some(limit) = self.policy.limits().get(decision.limit_index()) else {
            return;
        };
        let reset = retry_after_secs(decision.reset());
        if self.style.draft() {
            if let Some(value) = &self.policy_value {
                append_member(headers, ratelimit_policy, value.clone());
            }
            let value = self.ratelimit_value(decision, reset);
            if let Ok(value) = value {
                append_member(headers, ratelimit, value);
            }
        }
        if self.style.legacy() {
            headers
                .entry(x_limit())
                .or_insert_with(|| integer_value(limit.burst()));
            headers
                .entry(x_remaining())
                .or_insert_with(|| integer_value(decision.remaining()));
            headers
                .entry(x_reset())
                .or_insert_with(|| integer_value(reset));
        }
    }

    /// The `RateLimit` value: `"<name>";r=<remaining>;t=<reset>` for the
    /// deciding limit, or for every window of a policy of several, in
    /// policy order.
    fn ratelimit_value(
        &self,
        decision: &Decision,
        reset: u64,
    ) -> Result<HeaderValue, http::header::InvalidHeaderValue> {
        let mut text = Vec::with_capacity(self.ratelimit_max_len);
        let mut digits = itoa::Buffer::new();
        self.members(decision, reset, |prefix, remaining, reset| {
            if !text.is_empty() {
                text.extend_from_slice(b", ");
            }
            text.extend_from_slice(prefix);
            text.extend_from_slice(digits.format(remaining).as_bytes());
            text.extend_from_slice(b";t=");
            text.extend_from_slice(digits.format(reset).as_bytes());
        });
        HeaderValue::from_bytes(&text)
    }

    /// Calls `f` with the `RateLimit` prefix, the remaining calls and the
    /// reset seconds of each limit `decision` reports, in policy order.
    fn members(&self, decision: &Decision, reset: u64, mut f: impl FnMut(&[u8], u64, u64)) {
        match decision.each.as_deref() {
            Some(each) => {
                for (prefix, (remaining, reset)) in self.ratelimit_prefixes.iter().zip(each) {
                    f(prefix, *remaining, retry_after_secs(*reset));
                }
            }
            None => {
                if let Some(prefix) = self.ratelimit_prefixes.get(decision.limit_index()) {
                    f(prefix, decision.remaining(), reset);
                }
            }
        }
    }
}

/// Adds `value` as one more member of a structured-field list header: the
/// header's first value and `value`, joined with `, `, when it is already
/// there (stacked layers); else `value`.
fn append_member(headers: &mut HeaderMap, name: fn() -> HeaderName, value: HeaderValue) {
    // One hash and probe in the usual case, where the header is new:
    // `append` says whether it was there, and only then are the values
    // joined (the appended copy is replaced by the joined one).
    if !headers.append(name(), value) {
        return;
    }
    let name = name();
    let mut values = headers.get_all(&name).iter();
    let (Some(existing), Some(value)) = (values.next(), values.next_back()) else {
        return;
    };
    let mut bytes = Vec::with_capacity(existing.len() + 2 + value.len());
    bytes.extend_from_slice(existing.as_bytes());
    bytes.extend_from_slice(b", ");
    bytes.extend_from_slice(value.as_bytes());
    let joined =
        HeaderValue::from_maybe_shared(Bytes::from(bytes)).unwrap_or_else(|_| value.clone());
    headers.insert(name, joined);
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::policy::{Limit, Rate};

    /// The `RateLimit` value for a policy of limits named `names`, each
    /// with `remaining` calls left and `reset` to go.
    fn ratelimit_value(names: &[String], remaining: u64, reset: Duration) -> String {
        let mut policy = Policy::builder("p");
        for (i, name) in names.iter().enumerate() {
            let limit = Limit::builder(Rate::per_second(10 + i as u64))
                .burst(20)
                .name(name.as_str())
                .build()
                .unwrap();
            policy = policy.limit(limit);
        }
        let headers = PolicyHeaders::new(&policy.build().unwrap(), HeaderStyle::Draft);
        let decision = Decision {
            allowed: true,
            limit: 0,
            remaining,
            reset_us: u64::try_from(reset.as_micros()).unwrap_or(u64::MAX),
            retry_us: None,
            wait_us: 0,
            each: (names.len() > 1).then(|| Arc::from(vec![(remaining, reset); names.len()])),
            blocked: false,
        };
        let mut map = HeaderMap::new();
        headers.write(&mut map, &decision);
        map["ratelimit"].to_str().unwrap().to_owned()
    }

    fn expected(names: &[String], remaining: u64, reset_secs: u64) -> String {
        let members: Vec<String> = names
            .iter()
            .map(|n| format!("\"{n}\";r={remaining};t={reset_secs}"))
            .collect();
        members.join(", ")
    }

    /// Values of one limit and of several, down to the longest names and
    /// numbers.
    #[test]
    fn ratelimit_values_short_and_long() {
        let short = ["short".to_owned()];
        let reset = Duration::from_micros(1_500_000);
        assert_eq!(ratelimit_value(&short, 17, reset), "\"short\";r=17;t=2");
        // One limit of the longest name and the largest numbers.
        let longest = ["n".repeat(64)];
        let value = ratelimit_value(&longest, u64::MAX, Duration::MAX);
        // A single limit's reset is the decision's, in microseconds.
        let reset_secs = retry_after_secs(Duration::from_micros(u64::MAX));
        assert_eq!(value, expected(&longest, u64::MAX, reset_secs));
        // Two limits, with 20-digit numbers.
        for len in [14, 20] {
            let names: Vec<String> = (0..2).map(|i| format!("{i}").repeat(len)).collect();
            let value = ratelimit_value(&names, u64::MAX, Duration::MAX);
            assert_eq!(
                value,
                expected(&names, u64::MAX, u64::MAX),
                "names of {len}"
            );
        }
        let names: Vec<String> = (0..3).map(|i| format!("{i}").repeat(60)).collect();
        let value = ratelimit_value(&names, 17, reset);
        assert!(value.len() > 128);
        assert_eq!(value, expected(&names, 17, 2));
    }
}
