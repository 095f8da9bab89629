//! Every configuration mistake the public builders can be given is refused
//! with the `ConfigError` that names it, and a readable message; the
//! largest valid values next to each limit are accepted.
use crate::common;

use std::time::{Duration, Instant};

use common::RedisServer;
use fleetgate::key::{ForwardedIp, IpNet};
use fleetgate::{
    ConfigError, FailurePolicy, Limit, Limiter, LocalShare, MemoryStore, Policy, Rate,
    RateLimitLayer, RedisStore, StoreError, Topology,
};

/// The longest tolerance a limit may have, as the docs state it: 2^50 µs.
const MAX_TOLERANCE_MICROS: u64 = 1 << 50;
/// The most limits one policy holds, as the docs state it.
const MAX_LIMITS_PER_POLICY: usize = 16;

fn one_per_second() -> Limit {
    Limit::new(Rate::per_second(1)).unwrap()
}

/// The error's message mentions every one of `words`.
#[track_caller]
fn says(err: &impl std::fmt::Display, words: &[&str]) {
    let text = err.to_string();
    for word in words {
        assert!(
            text.to_lowercase().contains(&word.to_lowercase()),
            "{text:?} does not mention {word:?}"
        );
    }
}

#[test]
fn zero_rate() {
    for rate in [
        Rate::per_second(0),
        Rate::per_hour(0),
        Rate::new(0, Duration::from_secs(5)),
    ] {
        let err = Limit::new(rate).unwrap_err();
        assert_eq!(err, ConfigError::ZeroRate);
        says(&err, &["rate", "at least one"]);
        // An explicit burst does not rescue it.
        let err = Limit::builder(rate).burst(10).build().unwrap_err();
        assert_eq!(err, ConfigError::ZeroRate);
    }
}

#[test]
fn zero_period() {
    let err = Limit::new(Rate::new(10, Duration::ZERO)).unwrap_err();
    assert_eq!(err, ConfigError::ZeroPeriod);
    says(&err, &["period", "zero"]);
}

#[test]
fn zero_burst() {
    let err = Limit::builder(Rate::per_second(10))
        .burst(0)
        .build()
        .unwrap_err();
    assert_eq!(err, ConfigError::ZeroBurst);
    says(&err, &["burst"]);
    assert_eq!(
        Limit::builder(Rate::per_second(10))
            .burst(1)
            .build()
            .unwrap()
            .burst(),
        1
    );
}

#[test]
fn rate_finer_than_one_per_microsecond() {
    // One per microsecond is the finest rate there is.
    let finest = Limit::new(Rate::per_second(1_000_000)).unwrap();
    assert_eq!(finest.emission_interval(), Duration::from_micros(1));
    for rate in [
        Rate::per_second(1_010_101),
        Rate::new(2, Duration::from_micros(1)),
        Rate::new(1, Duration::from_nanos(500)),
        Rate::per_second(u64::MAX),
        // 1.67 µs would round to 2 µs: 17% slower than asked.
        Rate::per_second(600_000),
        Rate::per_second(300_000),
        Rate::per_second(99_999),
    ] {
        let err = Limit::new(rate).unwrap_err();
        assert_eq!(err, ConfigError::RateTooFine { rate });
        says(&err, &["microsecond"]);
    }
    // Whole microseconds, or rounding within 1%, are kept.
    for (rate, us) in [
        (Rate::per_second(1_000_001), 1),
        (Rate::per_second(500_000), 2),
        (Rate::per_second(250_000), 4),
        (Rate::per_second(100_000), 10),
        (Rate::per_second(9_999), 101),
        (Rate::per_second(7), 142_858),
    ] {
        let limit = Limit::new(rate).unwrap();
        assert_eq!(
            limit.emission_interval(),
            Duration::from_micros(us),
            "{rate}"
        );
    }
}

#[test]
fn period_too_long() {
    let longest = Duration::from_micros(MAX_TOLERANCE_MICROS);
    assert!(Limit::new(Rate::new(1, longest)).is_ok());
    for period in [
        longest + Duration::from_micros(1),
        Duration::from_secs(100 * 365 * 86_400),
        Duration::MAX,
    ] {
        let err = Limit::new(Rate::new(1, period)).unwrap_err();
        assert_eq!(err, ConfigError::PeriodTooLong { period });
        says(&err, &["period", "too long"]);
    }
    // What must be representable is the interval between events (and the
    // burst's window), not the period: a million per century, one at a time.
    let century = Duration::from_secs(100 * 365 * 86_400);
    let sparse = Limit::builder(Rate::new(1_000_000, century))
        .burst(1)
        .build()
        .unwrap();
    assert_eq!(
        sparse.emission_interval(),
        Duration::from_micros(3_153_600_000)
    );
}

#[test]
fn burst_too_large() {
    // One per hour: the window is burst × 3600 s, at most 2^50 µs.
    let per_hour = Rate::per_hour(1);
    let max_burst = MAX_TOLERANCE_MICROS / 3_600_000_000;
    let ok = Limit::builder(per_hour).burst(max_burst).build().unwrap();
    assert!(ok.window() <= Duration::from_micros(MAX_TOLERANCE_MICROS));
    for burst in [max_burst + 1, u64::MAX] {
        let err = Limit::builder(per_hour).burst(burst).build().unwrap_err();
        assert!(
            matches!(err, ConfigError::BurstTooLarge { burst: b, .. } if b == burst),
            "{err:?}"
        );
        says(&err, &["burst", &burst.to_string()]);
    }
    // The default burst (the rate's count) on the longest period: the
    // interval rounded up to whole microseconds makes the window 2 µs too
    // long.
    let err = Limit::new(Rate::new(3, Duration::from_micros(MAX_TOLERANCE_MICROS))).unwrap_err();
    assert_eq!(
        err,
        ConfigError::BurstTooLarge {
            burst: 3,
            window: Duration::from_micros(MAX_TOLERANCE_MICROS + 2)
        }
    );
}

#[test]
fn empty_policy() {
    let err = Policy::builder("empty").build().unwrap_err();
    assert_eq!(err, ConfigError::EmptyPolicy);
    says(&err, &["policy", "limit"]);
}

#[test]
fn too_many_limits() {
    let limits = |n: usize| {
        (0..n).fold(Policy::builder("many"), |b, i| {
            b.limit(
                Limit::builder(Rate::per_second(1 + i as u64))
                    .name(format!("l{i}"))
                    .build()
                    .unwrap(),
            )
        })
    };
    let full = limits(MAX_LIMITS_PER_POLICY).build().unwrap();
    assert_eq!(full.limits().len(), 16);
    let err = limits(MAX_LIMITS_PER_POLICY + 1).build().unwrap_err();
    assert_eq!(err, ConfigError::TooManyLimits { count: 17, max: 16 });
    says(&err, &["16", "17"]);
}

#[test]
fn duplicate_limit_names() {
    // Default names come from the rate: the same rate twice clashes.
    let err = Policy::builder("dup")
        .limit(one_per_second())
        .limit(
            Limit::builder(Rate::per_second(1))
                .burst(5)
                .build()
                .unwrap(),
        )
        .build()
        .unwrap_err();
    assert_eq!(err, ConfigError::DuplicateLimit { name: "1/s".into() });
    says(&err, &["1/s"]);
    // Explicit names too.
    let err = Policy::builder("dup")
        .limit(
            Limit::builder(Rate::per_second(1))
                .name("x")
                .build()
                .unwrap(),
        )
        .limit(
            Limit::builder(Rate::per_minute(5))
                .name("x")
                .build()
                .unwrap(),
        )
        .build()
        .unwrap_err();
    assert_eq!(err, ConfigError::DuplicateLimit { name: "x".into() });
    // Distinct names make the same rates fine.
    Policy::builder("dup")
        .limit(
            Limit::builder(Rate::per_second(1))
                .name("a")
                .build()
                .unwrap(),
        )
        .limit(
            Limit::builder(Rate::per_second(1))
                .name("b")
                .build()
                .unwrap(),
        )
        .build()
        .unwrap();
}

/// Names that would be empty, too long, or break keys and hash tags.
const BAD_NAMES: &[&str] = &[
    "",
    "has space",
    "brace{",
    "brace}",
    "tab\t",
    "new\nline",
    "star*",
    "quote\"",
    "é",
];

#[test]
fn invalid_policy_and_limit_names() {
    let long_ok = "a".repeat(64);
    let long_bad = "a".repeat(65);
    Policy::single(&*long_ok, one_per_second()).unwrap();
    Policy::single("api-v1/users:get_all.x", one_per_second()).unwrap();
    for &name in BAD_NAMES.iter().chain([long_bad.as_str()].iter()) {
        let err = Policy::single(name, one_per_second()).unwrap_err();
        assert_eq!(
            err,
            ConfigError::InvalidName {
                name: name.to_owned()
            }
        );
        says(&err, &["invalid name"]);
        let err = Limit::builder(Rate::per_second(1))
            .name(name)
            .build()
            .unwrap_err();
        assert_eq!(
            err,
            ConfigError::InvalidName {
                name: name.to_owned()
            }
        );
    }
}

#[test]
fn fixed_cost_above_burst() {
    let policy = Policy::builder("cost")
        .limit(
            Limit::builder(Rate::per_second(10))
                .burst(8)
                .build()
                .unwrap(),
        )
        .limit(
            Limit::builder(Rate::per_minute(100))
                .burst(5)
                .build()
                .unwrap(),
        )
        .build()
        .unwrap();
    assert_eq!(policy.max_cost(), 5);
    let layer = || RateLimitLayer::new(Limiter::new(policy.clone(), MemoryStore::new()));
    assert!(layer().fixed_cost(5).is_ok());
    for cost in [6, 8, u64::MAX] {
        let Err(err) = layer().fixed_cost(cost) else {
            panic!("cost {cost} above the burst accepted");
        };
        assert_eq!(err, ConfigError::CostAboveBurst { cost, max: 5 });
        says(&err, &["cost", "burst", &cost.to_string(), "5"]);
    }
}

#[test]
fn local_share_outside_zero_to_one() {
    for share in [
        0.0,
        -0.5,
        1.01,
        2.0,
        f64::NAN,
        f64::INFINITY,
        f64::NEG_INFINITY,
        // So small that every limit below a million would scale to nothing.
        1e-300,
        f64::MIN_POSITIVE,
        9e-7,
    ] {
        let err = FailurePolicy::local(share).unwrap_err();
        assert!(matches!(err, ConfigError::InvalidShare { .. }), "{share}");
        says(
            &err,
            &["share", "1e-6 <= share <= 1", &format!("{share:?}")],
        );
    }
    let err = LocalShare::one_of(0).unwrap_err();
    says(&err, &["1/0", "share"]);
    let err = LocalShare::one_of(1_000_001).unwrap_err();
    says(&err, &["1/1000001", "share"]);
    // The bounds themselves: the smallest share, a millionth, and the whole.
    for share in [1e-6, 1.0] {
        let policy = FailurePolicy::local(share).unwrap();
        assert_eq!(
            policy,
            FailurePolicy::Local(LocalShare::new(share).unwrap())
        );
    }
    // However small the share, every scaled limit still admits something,
    // a period of 68 years included.
    let tiny = LocalShare::new(1e-6).unwrap();
    for (rate, burst) in [
        (Rate::new(1_000_000, Duration::from_secs(1000)), 1_000_000),
        (Rate::new(1 << 20, Duration::from_secs(1 << 31)), 1),
    ] {
        let limit = Limit::builder(rate).burst(burst).build().unwrap();
        let scaled = Policy::single("p", limit).unwrap().scaled(tiny);
        let limit = &scaled.limits()[0];
        assert_eq!((limit.rate().count(), limit.burst()), (1, 1), "{rate}");
        assert!(limit.emission_interval() <= Duration::from_micros(MAX_TOLERANCE_MICROS));
        assert_eq!(scaled.max_cost(), 1);
    }
}

#[test]
fn invalid_network() {
    ForwardedIp::new(["10.0.0.0/8", "127.0.0.1", "fd00::/8", " 192.168.0.0/16 "]).unwrap();
    for text in [
        "",
        "not-an-ip",
        "10.0.0.0/33",
        "10.0.0.0/",
        "10.0.0.0/-1",
        "10.0.0/8",
        "fd00::/129",
        "example.com",
    ] {
        let err = ForwardedIp::new(["10.0.0.0/8", text]).unwrap_err();
        assert_eq!(
            err,
            ConfigError::InvalidNetwork {
                text: text.to_owned()
            }
        );
        says(&err, &["network", text]);
        let err = text.parse::<IpNet>().unwrap_err();
        assert!(matches!(err, ConfigError::InvalidNetwork { .. }), "{err:?}");
    }
    let err = IpNet::new("10.0.0.0".parse().unwrap(), 33).unwrap_err();
    assert!(matches!(err, ConfigError::InvalidNetwork { .. }), "{err:?}");
}

/// A store error that carries a configuration mistake.
#[track_caller]
fn config_refused(result: Result<RedisStore, StoreError>, words: &[&str]) {
    let err = result.expect_err("the builder accepted a bad setting");
    assert!(matches!(err, StoreError::Config(_)), "{err:?}");
    says(&err, words);
}

#[tokio::test]
async fn redis_store_builder_refuses_zero_timeout_and_bad_prefixes() {
    let server = RedisServer::start();
    let url = server.url();
    // Good settings connect.
    let store = RedisStore::builder(&url)
        .prefix("app-1:rl")
        .timeout(Duration::from_millis(20))
        .connect()
        .await
        .unwrap();
    assert_eq!(store.prefix(), "app-1:rl");
    assert_eq!(store.timeout(), Duration::from_millis(20));

    config_refused(
        RedisStore::builder(&url)
            .timeout(Duration::ZERO)
            .connect()
            .await,
        &[&ConfigError::ZeroTimeout.to_string()],
    );
    config_refused(
        RedisStore::builder(&url)
            .connect_timeout(Duration::ZERO)
            .connect()
            .await,
        &[&ConfigError::ZeroTimeout.to_string()],
    );
    for (builder, setting) in [
        (RedisStore::builder(&url).max_in_flight(0), "max_in_flight"),
        (RedisStore::builder(&url).max_batch(0), "max_batch"),
    ] {
        config_refused(
            builder.connect().await,
            &[&ConfigError::ZeroBatch { setting }.to_string(), setting],
        );
    }
    let long = "p".repeat(65);
    for &prefix in BAD_NAMES.iter().chain([long.as_str()].iter()) {
        config_refused(
            RedisStore::builder(&url).prefix(prefix).connect().await,
            &[&ConfigError::InvalidName {
                name: prefix.to_owned(),
            }
            .to_string()],
        );
    }
    // On a client built by hand too.
    config_refused(
        RedisStore::builder(Topology::client(server.client()))
            .prefix("bad prefix")
            .connect()
            .await,
        &["invalid name"],
    );
    config_refused(
        RedisStore::builder(Topology::client(server.client()))
            .timeout(Duration::ZERO)
            .connect()
            .await,
        &["timeout"],
    );
}

/// A configuration mistake is reported as such before any I/O, even when
/// Redis cannot be reached.
#[tokio::test]
async fn redis_store_builder_checks_settings_before_connecting() {
    // A port with nothing listening: bind, note, close.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("redis://127.0.0.1:{port}");
    let started = Instant::now();
    config_refused(
        RedisStore::builder(&url).prefix("no{tags}").connect().await,
        &["invalid name", "no{tags}"],
    );
    config_refused(
        RedisStore::builder(&url)
            .timeout(Duration::ZERO)
            .connect()
            .await,
        &["timeout must be longer than zero"],
    );
    config_refused(
        RedisStore::builder(&url)
            .connect_timeout(Duration::ZERO)
            .connect()
            .await,
        &["timeout must be longer than zero"],
    );
    assert!(
        started.elapsed() < Duration::from_millis(500),
        "settings were checked only after trying to connect"
    );
}

/// A topology that makes no sense (an address that does not parse, a
/// cluster without nodes, Sentinel without sentinels or without a master's
/// name) is refused as such by `connect`, lazy or not, before any I/O: the
/// good addresses beside the bad ones lead to a port that takes
/// connections and never answers, where a connection attempt would wait
/// out the 30 s connect timeout.
#[tokio::test]
async fn redis_store_builder_refuses_a_topology_that_makes_no_sense() {
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let good = format!("redis://127.0.0.1:{}", silent.local_addr().unwrap().port());
    let invalid = "invalid redis address";
    let cases: Vec<(Topology, Vec<String>)> = vec![
        (Topology::from("not a url"), vec![invalid.into()]),
        (
            Topology::from("http://127.0.0.1:6380"),
            vec![invalid.into()],
        ),
        (
            Topology::cluster(Vec::<String>::new()),
            vec![
                ConfigError::NoRedisAddresses {
                    topology: "a Redis Cluster",
                }
                .to_string(),
            ],
        ),
        (
            Topology::cluster([good.as_str(), "not a url"]),
            vec![invalid.into(), "node 2".into()],
        ),
        (
            Topology::sentinel(Vec::<String>::new(), "mymaster"),
            vec![
                ConfigError::NoRedisAddresses {
                    topology: "Redis Sentinel",
                }
                .to_string(),
            ],
        ),
        (
            Topology::sentinel([good.as_str(), "not a url"], "mymaster"),
            vec![invalid.into(), "sentinel 2".into()],
        ),
        (
            Topology::sentinel([good.as_str()], ""),
            vec![ConfigError::EmptyMasterName.to_string()],
        ),
    ];
    let started = Instant::now();
    for (topology, words) in cases {
        let words: Vec<&str> = words.iter().map(String::as_str).collect();
        for lazy in [false, true] {
            let builder =
                RedisStore::builder(topology.clone()).connect_timeout(Duration::from_secs(30));
            let builder = if lazy { builder.lazy() } else { builder };
            config_refused(builder.connect().await, &words);
        }
    }
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "a topology was checked only after trying to connect"
    );
}

/// The refusal of an address that does not parse never repeats the
/// address, which may hold a password.
#[tokio::test]
async fn a_refused_address_is_not_repeated() {
    for url in [
        "redis://:hunter2@127.0.0.1:notaport",
        "redis://user:hunter2@",
        "hunter2",
    ] {
        let err = RedisStore::builder(url).connect().await.unwrap_err();
        assert!(
            matches!(
                err,
                StoreError::Config(ConfigError::InvalidRedisAddress { .. })
            ),
            "{err:?}"
        );
        assert!(!err.to_string().contains("hunter2"), "{err}");
        assert!(!format!("{err:?}").contains("hunter2"), "{err:?}");
    }
}

/// A client built by hand (`Topology::client`) decides as a URL does,
/// connected at once or on first use (`lazy`).
#[tokio::test]
async fn a_client_built_by_hand_decides_at_once_or_on_first_use() {
    let server = RedisServer::start();
    for lazy in [false, true] {
        let builder = RedisStore::builder(Topology::client(server.client()))
            .prefix(if lazy { "lazy" } else { "eager" })
            .timeout(Duration::from_secs(2));
        let builder = if lazy { builder.lazy() } else { builder };
        let store = builder.connect().await.expect("a store on the client");
        let limit = Limit::builder(Rate::per_hour(2)).burst(2).build().unwrap();
        let limiter = Limiter::new(Policy::single("by-hand", limit).unwrap(), store);
        let key = fleetgate::Key::new("k");
        let mut outcomes = Vec::new();
        for _ in 0..3 {
            let decision = limiter.check(&key, 1).await.expect("a decision");
            outcomes.push(decision.is_allowed());
        }
        assert_eq!(outcomes, [true, true, false], "lazy: {lazy}");
    }
}
