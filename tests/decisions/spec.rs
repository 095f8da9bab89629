//! Policies written as data: TOML and JSON files, round trips, and errors
//! that name the problem.
use std::time::Duration;

use fleetgate::spec::{PolicyFile, PolicySpec};
use fleetgate::{Algorithm, ConfigError, Rate};

const FILE: &str = r#"
default = "general"

[policies]
general = "100/s burst 200"
upstream = "25/5s + 300/min"
login = { limits = [{ rate = "5/min", name = "login" }] }
mixed = { limits = ["10/s", { rate = "100/min", burst = 20 }], algorithm = "gcra" }
window = { limits = ["25/5s", "300/min"], algorithm = "sliding-log" }
hourly = "5000/h sliding"

[[routes]]
path = "/api/login"
method = "POST"
policy = "login"

[[routes]]
path = "/api/upstream/{id}"
policy = "upstream"
"#;

#[test]
fn a_toml_file_builds_named_policies() {
    let file: PolicyFile = toml::from_str(FILE).unwrap();
    let policies = file.policies().unwrap();
    assert_eq!(policies.len(), 6);
    assert_eq!(policies["window"].algorithm(), Algorithm::SlidingLog);
    assert_eq!(policies["hourly"].algorithm(), Algorithm::SlidingLog);
    assert_eq!(policies["upstream"].algorithm(), Algorithm::Gcra);
    let upstream = &policies["upstream"];
    assert_eq!(upstream.name(), "upstream");
    assert_eq!(
        upstream
            .limits()
            .iter()
            .map(|l| l.rate())
            .collect::<Vec<_>>(),
        [Rate::new(25, Duration::from_secs(5)), Rate::per_minute(300)]
    );
    assert_eq!(policies["general"].limits()[0].burst(), 200);
    assert_eq!(policies["login"].limits()[0].name(), "login");
    let mixed = &policies["mixed"];
    assert_eq!(mixed.limits()[1].burst(), 20);
    assert_eq!(file.routes[0].method.as_deref(), Some("POST"));
    assert_eq!(file.routes[1].method, None);
    assert_eq!(file.default.as_deref(), Some("general"));
}

#[test]
fn files_round_trip_through_toml_and_json() {
    let file: PolicyFile = toml::from_str(FILE).unwrap();
    let again: PolicyFile = toml::from_str(&toml::to_string(&file).unwrap()).unwrap();
    assert_eq!(again, file);
    let json = serde_json::to_string(&file).unwrap();
    let from_json: PolicyFile = serde_json::from_str(&json).unwrap();
    assert_eq!(from_json, file);
    // Tables come back as their short text.
    assert!(json.contains(r#""login":"5/min as login""#), "{json}");
    assert_eq!(from_json.policies().unwrap(), file.policies().unwrap());
}

#[test]
fn bad_text_in_a_file_names_the_problem() {
    let cases: &[(&str, &[&str])] = &[
        (
            "[policies]\na = \"25/5x\"",
            &["unknown time unit", "\"x\"", "25/5x"],
        ),
        ("[policies]\na = \"0/s\"", &["at least one event", "0/s"]),
        ("[policies]\na = { limits = [] }", &["at least one limit"]),
        (
            "[policies]\na = { limits = [\"1/s\"], algorithm = \"magic\" }",
            &["unknown algorithm", "magic"],
        ),
        (
            "[policies]\na = { limits = [{ rate = \"1/s\", burst = 0 }] }",
            &["burst must be at least 1"],
        ),
        (
            "[policies]\na = { limits = [{ rate = \"1/s\", brust = 5 }] }",
            &["unknown field", "brust"],
        ),
        ("[policies]\na = 5", &["a string such as"]),
        ("polices = {}", &["unknown field", "polices"]),
    ];
    for (text, words) in cases {
        let err = toml::from_str::<PolicyFile>(text).unwrap_err().to_string();
        for word in *words {
            assert!(err.contains(word), "{text:?}: {err} lacks {word:?}");
        }
    }
}

#[test]
fn routes_must_name_defined_policies() {
    let mut file: PolicyFile = toml::from_str(FILE).unwrap();
    file.routes[0].policy = "nope".into();
    assert_eq!(
        file.policies().unwrap_err(),
        ConfigError::UnknownPolicy {
            name: "nope".into()
        }
    );
    let mut file: PolicyFile = toml::from_str(FILE).unwrap();
    file.default = Some("missing".into());
    assert!(matches!(
        file.policies(),
        Err(ConfigError::UnknownPolicy { name }) if name == "missing"
    ));
    let mut file: PolicyFile = toml::from_str(FILE).unwrap();
    file.routes[0].method = Some("GE T".into());
    assert!(matches!(
        file.policies(),
        Err(ConfigError::InvalidMethod { .. })
    ));
    let mut file: PolicyFile = toml::from_str(FILE).unwrap();
    file.routes[0].path = "api".into();
    assert!(matches!(
        file.policies(),
        Err(ConfigError::InvalidRoute { .. })
    ));
    // A policy name that cannot be a key is refused when built.
    let file: PolicyFile = toml::from_str("[policies]\n\"a b\" = \"1/s\"").unwrap();
    assert!(matches!(
        file.policies(),
        Err(ConfigError::InvalidName { .. })
    ));
}

#[test]
fn json_strings_and_tables() {
    let spec: PolicySpec = serde_json::from_str(r#""5000/h""#).unwrap();
    assert_eq!(spec.limits[0].rate, Rate::per_hour(5000));
    let spec: PolicySpec =
        serde_json::from_str(r#"{"limits":[{"rate":"25/5s","name":"short"},"300/min"]}"#).unwrap();
    assert_eq!(spec.to_string(), "25/5s as short + 300/min");
    let err = serde_json::from_str::<PolicySpec>(r#""25/5s +""#).unwrap_err();
    assert!(err.to_string().contains("expected a count"), "{err}");
}

#[test]
fn penalty_boxes_parse_build_and_write_back() {
    let spec: PolicySpec = "5/15min block 1h".parse().unwrap();
    assert_eq!(spec.limits[0].block, Some(Duration::from_secs(3600)));
    let policy = spec.build("login").unwrap();
    assert_eq!(
        policy.limits()[0].block_for(),
        Some(Duration::from_secs(3600))
    );
    assert_eq!(PolicySpec::from(&policy).to_string(), "5/15min block 1h");
    for text in [
        "100/s burst 200 block 10min as api",
        "25/5s block 90s + 300/min block 90min sliding-log",
        "2/day block 1h",
    ] {
        let spec: PolicySpec = text.parse().unwrap();
        assert_eq!(spec.to_string(), text);
        let built = PolicySpec::from(&spec.build("p").unwrap()).to_string();
        assert_eq!(built, text);
    }
    let spec: PolicySpec = "1/s block 1h30min".parse().unwrap();
    assert_eq!(spec.limits[0].block, Some(Duration::from_secs(5400)));
    // Any order of the clauses reads the same.
    let spec: PolicySpec = "100/s as api block 10m burst 200".parse().unwrap();
    assert_eq!(spec.to_string(), "100/s burst 200 block 10min as api");
    for (text, says, fragment) in [
        ("5/min block", "expected a duration", ""),
        ("5/min block 1x", "unknown time unit", "x"),
        ("5/min block h", "expected a duration", "h"),
        ("5/min block 1h block 2h", "`block` given twice", "block"),
        ("5/min block 0s", "out of range", "5/min block 0s"),
        ("5/min block 999us", "at least 1 ms", "5/min block 999us"),
        (
            "5/min block 99999999999d",
            "duration too long",
            "99999999999d",
        ),
    ] {
        let err = text.parse::<PolicySpec>().unwrap_err();
        assert!(err.to_string().contains(says), "{text}: {err}");
        assert_eq!(err.fragment(), fragment, "{text}");
    }
    let forever = fleetgate::Limit::builder(Rate::per_second(1)).block_for(Duration::MAX);
    assert!(matches!(
        forever.build(),
        Err(ConfigError::BlockOutOfRange { .. })
    ));
    // In a table, the block is a duration.
    let spec: PolicySpec =
        serde_json::from_str(r#"{"limits":[{"rate":"5/15min","block":"1h"}]}"#).unwrap();
    assert_eq!(spec.to_string(), "5/15min block 1h");
    let err =
        serde_json::from_str::<PolicySpec>(r#"{"limits":[{"rate":"5/15min","block":"soon"}]}"#)
            .unwrap_err();
    assert!(err.to_string().contains("expected a duration"), "{err}");
}
