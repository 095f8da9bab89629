//! Property tests: whatever a client sends and whatever Redis answers, the
//! crate returns a key, a header or an error, never a panic.
//!
//! Case counts are bounded so that CI stays fast: `PROPTEST_CASES`
//! overrides them for a longer local run.

use std::net::{IpAddr, SocketAddr};
#[cfg(feature = "redis")]
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderMap, HeaderName, HeaderValue, Request};
use proptest::prelude::*;
#[cfg(feature = "redis")]
use redis::Value;

#[cfg(feature = "redis")]
use crate::clock::ManualClock;
use crate::decision::Decision;
use crate::key::{ForwardedIp, HeaderKey, IpNet, Key, KeyExtractor, MAX_KEY_LEN, PeerIp};
use crate::policy::{Limit, Policy, Rate};
use crate::response::{HeaderStyle, PolicyHeaders, Rejection, RejectionKind};
#[cfg(feature = "redis")]
use crate::store::{DenyCache, decode_gcra, hash_tag};

fn config(cases: u32) -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(cases);
    ProptestConfig {
        cases,
        // Failures are reported with their minimal input; no files are
        // written into the source tree.
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

// ---------------------------------------------------------------------------
// Strategies.

/// Any reply Redis could send (RESP2 and RESP3 shapes), nested a few levels.
#[cfg(feature = "redis")]
fn redis_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Nil),
        Just(Value::Okay),
        any::<i64>().prop_map(Value::Int),
        // Small integers hit the decoder's accepted range more often.
        (-3i64..20).prop_map(Value::Int),
        proptest::collection::vec(any::<u8>(), 0..16).prop_map(Value::BulkString),
        ".{0,12}".prop_map(Value::SimpleString),
        any::<f64>().prop_map(Value::Double),
        any::<bool>().prop_map(Value::Boolean),
    ];
    leaf.prop_recursive(3, 48, 7, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..8).prop_map(Value::Array),
            proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Set),
            proptest::collection::vec((inner.clone(), inner), 0..4).prop_map(Value::Map),
        ]
    })
}

/// A reply of the script's shape: five small integers, mostly valid.
#[cfg(feature = "redis")]
fn gcra_like_reply() -> impl Strategy<Value = Value> {
    proptest::collection::vec(
        prop_oneof![
            (-2i64..4).prop_map(Value::Int),
            any::<i64>().prop_map(Value::Int)
        ],
        5,
    )
    .prop_map(Value::Array)
}

fn ip() -> impl Strategy<Value = IpAddr> {
    prop_oneof![
        any::<[u8; 4]>().prop_map(IpAddr::from),
        any::<[u8; 16]>().prop_map(IpAddr::from),
        // Inside the trusted network, so that chains are walked.
        (any::<u8>(), any::<u8>()).prop_map(|(a, b)| IpAddr::from([10, 0, a, b])),
    ]
}

/// One forwarding hop: a real address (with or without port, quoted,
/// bracketed), a `for=` element, or junk bytes.
fn hop() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        ip().prop_map(|ip| ip.to_string().into_bytes()),
        (ip(), any::<u16>())
            .prop_map(|(ip, port)| SocketAddr::new(ip, port).to_string().into_bytes()),
        ip().prop_map(|ip| format!("for=\"{ip}\";proto=https").into_bytes()),
        ip().prop_map(|ip| format!(" [{ip}]:80 ").into_bytes()),
        proptest::collection::vec(any::<u8>(), 0..24),
    ]
}

/// Header lines of hops joined by commas, many hops long at times.
fn forwarding_lines() -> impl Strategy<Value = Vec<Vec<u8>>> {
    proptest::collection::vec(
        proptest::collection::vec(hop(), 0..80).prop_map(|hops| hops.join(&b","[..])),
        0..6,
    )
}

fn header_map(name: &str, lines: &[Vec<u8>]) -> HeaderMap {
    let name = HeaderName::from_bytes(name.as_bytes()).unwrap();
    let mut map = HeaderMap::new();
    for line in lines {
        // Bytes a header value cannot hold (CR, LF, NUL) never reach a
        // service: http refuses them before it.
        if let Ok(value) = HeaderValue::from_bytes(line) {
            map.append(name.clone(), value);
        }
    }
    map
}

fn limit() -> impl Strategy<Value = Limit> {
    (1u64..10_000, 1u64..100_000_000, 1u64..10_000).prop_filter_map(
        "a limit the builder accepts",
        |(count, period_us, burst)| {
            Limit::builder(Rate::new(count, Duration::from_micros(period_us)))
                .burst(burst)
                .build()
                .ok()
        },
    )
}

fn policy() -> impl Strategy<Value = Policy> {
    proptest::collection::vec(limit(), 1..4).prop_filter_map("distinct names", |limits| {
        let mut builder = Policy::builder("p");
        for (i, l) in limits.into_iter().enumerate() {
            let named = Limit::builder(l.rate())
                .burst(l.burst())
                .name(format!("l{i}"))
                .build()
                .ok()?;
            builder = builder.limit(named);
        }
        builder.build().ok()
    })
}

fn decision() -> impl Strategy<Value = Decision> {
    (
        any::<bool>(),
        0usize..6,
        any::<u64>(),
        any::<u64>(),
        proptest::option::of(any::<u64>()),
        any::<u64>(),
    )
        .prop_map(|(allowed, limit, remaining, reset, retry, wait)| Decision {
            allowed,
            limit,
            remaining,
            reset_us: reset,
            retry_us: retry,
            wait_us: wait,
            each: None,
            blocked: false,
        })
}

// ---------------------------------------------------------------------------
// Properties.

proptest! {
    #![proptest_config(config(512))]

    /// Any reply at all: an error or a decision that makes sense, never a
    /// panic.
    #[test]
    #[cfg(feature = "redis")]
    fn redis_replies_decode_or_fail_cleanly(reply in redis_value(), limits in 0usize..20) {
        if let Ok(d) = decode_gcra(&reply, limits) {
            prop_assert!(d.limit_index() < limits);
            prop_assert_eq!(d.is_allowed(), d.retry_after().is_none());
            if !d.is_allowed() {
                prop_assert_eq!(d.wait(), Duration::ZERO);
            }
        }
    }

    /// Replies of the script's shape decode exactly when every field is in
    /// range, and then to those very fields.
    #[test]
    #[cfg(feature = "redis")]
    fn script_shaped_replies_decode_exactly(reply in gcra_like_reply(), limits in 1usize..4) {
        let Value::Array(items) = &reply else { unreachable!() };
        let ints: Vec<i64> = items
            .iter()
            .map(|v| match v { Value::Int(n) => *n, _ => unreachable!() })
            .collect();
        let valid = ints.iter().all(|n| *n >= 0)
            && ints[0] <= 2
            && (1..=limits as i64).contains(&ints[1]);
        match decode_gcra(&reply, limits) {
            Ok(d) => {
                prop_assert!(valid, "{:?} accepted", ints);
                prop_assert_eq!(d.is_allowed(), ints[0] == 1);
                prop_assert_eq!(d.is_blocked(), ints[0] == 2);
                prop_assert_eq!(d.limit_index() as i64, ints[1] - 1);
                prop_assert_eq!(d.remaining() as i64, ints[2]);
                prop_assert_eq!(d.reset(), Duration::from_micros(ints[3] as u64));
                let delay = Duration::from_micros(ints[4] as u64);
                if d.is_allowed() {
                    prop_assert_eq!(d.wait(), delay);
                } else {
                    prop_assert_eq!(d.retry_after(), Some(delay));
                }
            }
            Err(_) => prop_assert!(!valid, "{:?} refused", ints),
        }
    }

    /// `X-Forwarded-For` with arbitrary bytes and many hops: a client
    /// address always comes out; an untrusted peer is never overridden;
    /// whatever is chosen is the peer or an address a hop spelled out.
    #[test]
    fn forwarded_for_never_panics(peer in ip(), lines in forwarding_lines()) {
        let fwd = ForwardedIp::new(["10.0.0.0/16"]).unwrap();
        for (name, fwd) in [("x-forwarded-for", fwd.clone()), ("forwarded", fwd.use_forwarded_header())] {
            let headers = header_map(name, &lines);
            let client = fwd.client(peer, &headers);
            let trusted: IpNet = "10.0.0.0/16".parse().unwrap();
            if !trusted.contains(peer) {
                prop_assert_eq!(client, peer.to_canonical());
            } else if client != peer {
                let text = lines.iter().map(|l| String::from_utf8_lossy(l)).collect::<Vec<_>>().join(",");
                let spelled = client.to_string();
                let mapped = format!("::ffff:{client}");
                prop_assert!(
                    text.contains(&spelled) || text.contains(&mapped) || text.to_lowercase().contains(&spelled),
                    "{} not in {:?}", client, text
                );
            }
            // Through the extractor, with the peer as connect info.
            let mut req = Request::new(());
            *req.headers_mut() = headers;
            req.extensions_mut().insert(SocketAddr::new(peer, 443));
            let key = fwd.extract(&req).unwrap();
            prop_assert_eq!(key, Key::from_ip(client));
        }
    }

    /// Header keys from arbitrary bytes, huge values included: hashed keys
    /// are `h:` and 32 hex digits, unhashed ones stay short, equal input
    /// gives equal keys.
    #[test]
    fn header_keys_from_arbitrary_bytes(
        value in prop_oneof![
            proptest::collection::vec(any::<u8>(), 0..64),
            proptest::collection::vec(32u8..127, 100..20_000),
        ],
        bearer in any::<bool>(),
    ) {
        let Ok(header) = HeaderValue::from_bytes(&value) else { return Ok(()) };
        let mut req = Request::new(());
        let name = if bearer { "authorization" } else { "x-api-key" };
        req.headers_mut().insert(name, header);
        let hashed = if bearer { HeaderKey::bearer() } else { HeaderKey::new("x-api-key") };
        let plain = hashed.clone().unhashed();
        let (a, b) = (hashed.extract(&req), hashed.extract(&req));
        prop_assert_eq!(&a, &b);
        if let Some(key) = a {
            let text = key.text();
            prop_assert!(text.starts_with("h:") && text.len() == 34, "{}", text);
            prop_assert!(text[2..].bytes().all(|c| c.is_ascii_hexdigit()));
        }
        if let Some(key) = plain.extract(&req) {
            prop_assert!(key.text().len() <= MAX_KEY_LEN, "{}", key.text().len());
        }
    }

    /// The peer's address as the key, canonical for IPv4-mapped IPv6.
    #[test]
    fn peer_ip_keys(peer in ip(), port in any::<u16>()) {
        let mut req = Request::new(());
        req.extensions_mut().insert(SocketAddr::new(peer, port));
        let key = PeerIp.extract(&req).unwrap();
        prop_assert_eq!(&*key.text(), format!("ip:{}", peer.to_canonical()));
    }

    /// An IP key's text is the address as std writes it, and read back
    /// it is the same key.
    #[test]
    fn ip_key_text_is_the_same_key(ip in ip()) {
        let key = Key::from_ip(ip);
        prop_assert_eq!(&*key.text(), format!("ip:{ip}"));
        prop_assert_eq!(Key::new(&*key.text()), key);
    }

    /// Network text from configuration: parsed or refused, never a panic;
    /// a parsed network contains the address it names.
    #[test]
    fn networks_parse_or_fail(text in ".{0,40}", net in (ip(), 0u8..140)) {
        let _ = text.parse::<IpNet>();
        let (addr, prefix) = net;
        if let Ok(parsed) = format!("{addr}/{prefix}").parse::<IpNet>() {
            prop_assert!(parsed.contains(addr));
        }
    }

    /// Identities of any text: short keys, and one non-empty hash tag per
    /// identity, the same for all its Redis keys and distinct between
    /// identities.
    #[test]
    #[cfg(feature = "redis")]
    fn keys_and_hash_tags(a in ".{0,200}", b in ".{0,8}") {
        let (ka, kb) = (Key::new(&a), Key::new(&b));
        let (xa, xb) = (ka.text(), kb.text());
        prop_assert!(xa.len() <= MAX_KEY_LEN);
        let (ta, tb) = (hash_tag(&xa), hash_tag(&xb));
        prop_assert!(!ta.is_empty());
        prop_assert_eq!(ta == tb, ka == kb);
        for i in 0..3 {
            let full = format!("fg:p:{{{ta}}}:{i}");
            // Redis Cluster hashes the text between the first `{` and the
            // first `}` after it.
            let open = full.find('{').unwrap();
            let close = full[open + 1..].find('}').unwrap();
            prop_assert!(close > 0);
            let hashed = &full[open + 1..open + 1 + close];
            prop_assert!(ta.starts_with(hashed), "{} vs {}", hashed, ta);
            if i == 0 {
                continue;
            }
            let first = format!("fg:p:{{{ta}}}:0");
            prop_assert_eq!(&first[open + 1..open + 1 + close], hashed);
        }
    }

    /// Rate-limit headers and rejections for any decision and policy:
    /// valid header values, `Retry-After` the retry rounded up to seconds.
    #[test]
    fn headers_render_for_any_decision(
        policy in policy(),
        decision in decision(),
        style in prop_oneof![
            Just(HeaderStyle::Draft),
            Just(HeaderStyle::Legacy),
            Just(HeaderStyle::Both),
            Just(HeaderStyle::None),
        ],
    ) {
        let headers = PolicyHeaders::new(&policy, style);
        let mut map = HeaderMap::new();
        headers.write(&mut map, &decision);
        headers.write(&mut map, &decision);
        if let Some(limit) = policy.limits().get(decision.limit_index()) {
            if matches!(style, HeaderStyle::Draft | HeaderStyle::Both) {
                let expected = format!(
                    "\"{}\";r={};t={}",
                    limit.name(),
                    decision.remaining(),
                    decision.reset().as_micros().div_ceil(1_000_000)
                );
                let value = map.get("ratelimit").unwrap().to_str().unwrap();
                prop_assert_eq!(value, format!("{expected}, {expected}"));
            }
        } else {
            prop_assert!(map.is_empty());
        }
        let rejection = Rejection {
            kind: RejectionKind::Limited(decision.clone()),
            policy: &policy,
            headers: &headers,
        };
        let response = rejection.default_response();
        prop_assert_eq!(response.status(), http::StatusCode::TOO_MANY_REQUESTS);
        let retry = response.headers().get("retry-after").map(|v| v.to_str().unwrap().to_owned());
        let expected = decision
            .retry_after()
            .map(|d| d.as_micros().div_ceil(1_000_000).to_string());
        prop_assert_eq!(retry, expected);
    }

    /// The deny cache under any sequence of denials, admissions and time
    /// steps: within its capacity, and only ever answering with denials
    /// whose retry lies ahead.
    #[test]
    #[cfg(feature = "redis")]
    fn deny_cache_stays_bounded(
        capacity in 1usize..40,
        ops in proptest::collection::vec((0u8..3, 0u8..50, 1u64..3, 0u64..5_000_000), 1..300),
    ) {
        let clock = ManualClock::new(Duration::from_secs(1_000));
        let cache = DenyCache::new(capacity, Arc::new(clock.clone()));
        let policy = Policy::single("p", Limit::new(Rate::per_second(2)).unwrap()).unwrap();
        for (op, key, cost, micros) in ops {
            let key = Key::new(format!("k{key}"));
            let d = Duration::from_micros(micros);
            match op {
                0 => cache.record(&policy, &key, cost, cache.now(), &Decision {
                    allowed: false,
                    limit: 0,
                    remaining: 0,
                    reset_us: micros,
                    retry_us: Some(micros),
                    wait_us: 0,
                    each: None,
                    blocked: false,
                }),
                1 => clock.advance(d / 4),
                _ => {
                    if let Some(hit) = cache.lookup(&policy, &key, cost, Duration::ZERO) {
                        prop_assert!(!hit.is_allowed());
                        prop_assert!(hit.retry_after().is_some_and(|r| !r.is_zero()));
                    }
                }
            }
            let entries = cache.stats().entries as usize;
            prop_assert!(entries <= capacity, "{} > {}", entries, capacity);
        }
    }
}
