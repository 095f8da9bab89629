//! The Grafana dashboard, `dashboards/grafana.json`: what Grafana's import
//! needs (the dashboard schema's required fields, a grid that fits, one
//! data source variable every query resolves to), and queries that read
//! only the metrics this crate records, with their own labels.
//!
//! The metrics are found in the source itself (each `counter!`, `gauge!`
//! and `histogram!` call under `src/`, its name and label keys), so
//! renaming a metric or a label fails here until the dashboard follows.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde_json::Value;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Counter,
    Gauge,
    Histogram,
}

#[derive(Debug)]
struct Metric {
    kind: Kind,
    labels: BTreeSet<String>,
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn dashboard() -> Value {
    let path = root().join("dashboards/grafana.json");
    let text = std::fs::read_to_string(&path).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn rust_files(dir: &Path, into: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, into);
        } else if path.extension().is_some_and(|e| e == "rs") {
            into.push(path);
        }
    }
}

/// The string literals of `text` up to the `)` closing the call it starts
/// in, each with whether `=>` follows it (a label key).
fn call_literals(text: &str) -> Vec<(String, bool)> {
    let mut out = Vec::new();
    let mut depth = 1;
    let mut chars = text.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        match c {
            '(' | '[' | '{' => depth += 1,
            ')' | ']' | '}' => {
                depth -= 1;
                if depth == 0 {
                    break;
                }
            }
            '"' => {
                let start = i + 1;
                let mut end = start;
                for (j, c) in chars.by_ref() {
                    if c == '"' {
                        end = j;
                        break;
                    }
                }
                let key = text[end + 1..].trim_start().starts_with("=>");
                out.push((text[start..end].to_owned(), key));
            }
            _ => {}
        }
    }
    out
}

/// Every metric the crate records: name, kind and label keys.
fn exported() -> BTreeMap<String, Metric> {
    let mut files = Vec::new();
    rust_files(&root().join("src"), &mut files);
    let mut metrics = BTreeMap::new();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        for (macro_call, kind) in [
            ("counter!(", Kind::Counter),
            ("gauge!(", Kind::Gauge),
            ("histogram!(", Kind::Histogram),
        ] {
            for (at, _) in text.match_indices(macro_call) {
                let literals = call_literals(&text[at + macro_call.len()..]);
                let Some((name, _)) = literals.first() else {
                    continue;
                };
                let labels = literals
                    .iter()
                    .filter(|(_, key)| *key)
                    .map(|(l, _)| l.clone())
                    .collect();
                let metric = Metric { kind, labels };
                if let Some(before) = metrics.insert(name.clone(), metric) {
                    let now = &metrics[name];
                    assert_eq!(
                        (before.kind, &before.labels),
                        (now.kind, &now.labels),
                        "{name} is recorded twice with different kinds or labels ({})",
                        file.display()
                    );
                }
            }
        }
    }
    metrics
}

/// The rows of a markdown table in `src/metrics.rs`' module docs: the
/// first cell of each row (without its backquotes) and the second.
fn documented_rows(header: &str) -> Vec<(String, String)> {
    let text = std::fs::read_to_string(root().join("src/metrics.rs")).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let start = lines
        .iter()
        .position(|l| l.starts_with(&format!("//! {header}")))
        .unwrap_or_else(|| panic!("src/metrics.rs has no table {header:?}"));
    lines[start + 2..]
        .iter()
        .take_while(|l| l.starts_with("//! |"))
        .map(|l| {
            let cells: Vec<&str> = l.trim_start_matches("//! |").split('|').collect();
            (
                cells[0].trim().trim_matches('`').to_owned(),
                cells[1].trim().to_owned(),
            )
        })
        .collect()
}

fn outcomes() -> BTreeSet<String> {
    documented_rows("| outcome |")
        .into_iter()
        .map(|(o, _)| o)
        .collect()
}

#[test]
fn the_source_scan_finds_every_documented_metric() {
    // Without this, a scan that found nothing would pass every check below.
    let found = exported();
    let documented = documented_rows("| metric |");
    assert!(documented.len() >= 8, "{documented:?}");
    let kinds: BTreeMap<String, Kind> = found.iter().map(|(n, m)| (n.clone(), m.kind)).collect();
    let expected: BTreeMap<String, Kind> = documented
        .into_iter()
        .map(|(name, kind)| {
            let kind = match kind.as_str() {
                "counter" => Kind::Counter,
                "gauge" => Kind::Gauge,
                "histogram" => Kind::Histogram,
                other => panic!("{name}: unknown kind {other}"),
            };
            (name, kind)
        })
        .collect();
    assert_eq!(kinds, expected);
    assert_eq!(
        found["fleetgate_decisions_total"].labels,
        ["layer", "outcome", "policy"]
            .map(String::from)
            .into_iter()
            .collect()
    );
}

#[test]
fn it_has_what_grafana_import_needs() {
    let d = dashboard();
    let title = d["title"].as_str().unwrap();
    assert!(!title.is_empty());
    let uid = d["uid"].as_str().unwrap();
    assert!(
        (1..=40).contains(&uid.len())
            && uid
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_'),
        "uid {uid:?}: Grafana takes at most 40 of [A-Za-z0-9-_]"
    );
    // An id belongs to one Grafana's database: importing one would
    // overwrite whichever dashboard has it there.
    assert!(d.get("id").is_none_or(Value::is_null), "no id");
    // Grafana migrates older schemas on load: 36 is the first with data
    // source references by uid, which the panels use; 42 the last of the
    // JSON dashboard (Grafana's apps/dashboard/pkg/migration).
    let schema = d["schemaVersion"].as_u64().unwrap();
    assert!((36..=42).contains(&schema), "schemaVersion {schema}");
    assert!(d["editable"].is_boolean());
    assert!((0..=2).contains(&d["graphTooltip"].as_u64().unwrap()));
    assert!(d["time"]["from"].as_str().unwrap().starts_with("now-"));
    assert_eq!(d["time"]["to"], "now");
    assert!(d["templating"]["list"].is_array());
    assert!(d["annotations"]["list"].is_array());
    assert!(!d["panels"].as_array().unwrap().is_empty());
}

/// Every panel, those inside rows included.
fn panels(d: &Value) -> Vec<&Value> {
    let mut out = Vec::new();
    for p in d["panels"].as_array().unwrap() {
        out.push(p);
        if let Some(inner) = p["panels"].as_array() {
            out.extend(inner);
        }
    }
    out
}

#[test]
fn panels_have_unique_ids_and_fit_the_grid() {
    let d = dashboard();
    let mut ids = BTreeSet::new();
    let mut cells: Vec<(u64, u64, u64, u64, &str)> = Vec::new();
    for p in panels(&d) {
        let title = p["title"].as_str().unwrap();
        let id = p["id"].as_u64().unwrap();
        assert!(ids.insert(id), "panel id {id} twice ({title})");
        let kind = p["type"].as_str().unwrap();
        assert!(
            ["row", "timeseries", "stat", "gauge", "bargauge", "table"].contains(&kind),
            "{title}: panel type {kind}"
        );
        let g = &p["gridPos"];
        let [x, y, w, h] = ["x", "y", "w", "h"].map(|k| g[k].as_u64().unwrap());
        assert!(
            h > 0 && (1..=24).contains(&w) && x + w <= 24,
            "{title}: {g}"
        );
        for &(x2, y2, w2, h2, other) in &cells {
            let apart = x + w <= x2 || x2 + w2 <= x || y + h <= y2 || y2 + h2 <= y;
            assert!(apart, "{title} overlaps {other}");
        }
        cells.push((x, y, w, h, title));
        if kind == "row" {
            assert!(p["panels"].is_array(), "{title}");
            continue;
        }
        assert!(p["description"].as_str().is_some_and(|s| !s.is_empty()));
        assert!(p["fieldConfig"]["defaults"].is_object(), "{title}");
        assert!(p["fieldConfig"]["overrides"].is_array(), "{title}");
        assert!(p["options"].is_object(), "{title}");
        let targets = p["targets"].as_array().unwrap();
        assert!(!targets.is_empty(), "{title}: no query");
        let refs: BTreeSet<&str> = targets
            .iter()
            .map(|t| t["refId"].as_str().unwrap())
            .collect();
        assert_eq!(refs.len(), targets.len(), "{title}: refIds repeat");
    }
}

/// The name of the data source variable the panels use, checked to be a
/// Prometheus one.
fn datasource_variable(d: &Value) -> String {
    let vars = d["templating"]["list"].as_array().unwrap();
    let ds: Vec<&Value> = vars.iter().filter(|v| v["type"] == "datasource").collect();
    assert_eq!(ds.len(), 1, "one data source variable");
    assert_eq!(ds[0]["query"], "prometheus");
    ds[0]["name"].as_str().unwrap().to_owned()
}

#[test]
fn every_query_resolves_its_data_source_and_variables() {
    let d = dashboard();
    let ds = datasource_variable(&d);
    let reference = serde_json::json!({"type": "prometheus", "uid": format!("${{{ds}}}")});
    let vars = d["templating"]["list"].as_array().unwrap();
    let mut defined: Vec<String> = Vec::new();
    for v in vars {
        let name = v["name"].as_str().unwrap();
        let kind = v["type"].as_str().unwrap();
        assert!(
            [
                "query",
                "adhoc",
                "constant",
                "datasource",
                "interval",
                "textbox",
                "custom"
            ]
            .contains(&kind),
            "${name}: type {kind}"
        );
        assert!((0..=2).contains(&v["hide"].as_u64().unwrap()));
        if kind == "query" {
            assert_eq!(v["datasource"], reference, "${name}");
            // A variable may use only those defined before it.
            let query = v["query"].as_str().unwrap();
            assert_eq!(v["definition"], query, "${name}");
            for used in variables_in(query) {
                assert!(defined.contains(&used), "${name} uses ${used} before it");
            }
        }
        assert!(!defined.contains(&name.to_owned()), "${name} twice");
        defined.push(name.to_owned());
    }
    for p in panels(&d) {
        if p["type"] == "row" {
            continue;
        }
        let title = p["title"].as_str().unwrap();
        assert_eq!(p["datasource"], reference, "{title}");
        for t in p["targets"].as_array().unwrap() {
            assert_eq!(t["datasource"], reference, "{title}");
            for used in variables_in(t["expr"].as_str().unwrap()) {
                let builtin = ["__rate_interval", "__interval", "__range"].contains(&&*used);
                assert!(builtin || defined.contains(&used), "{title}: ${used}");
            }
        }
    }
}

/// The variables `$name` and `${name}` in a query.
fn variables_in(query: &str) -> Vec<String> {
    let mut out = Vec::new();
    for (at, _) in query.match_indices('$') {
        let rest = query[at + 1..].trim_start_matches('{');
        let name: String = rest
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        assert!(!name.is_empty(), "a bare $ in {query}");
        out.push(name);
    }
    out
}

#[derive(Debug, PartialEq)]
enum Token {
    Ident(String),
    Str(String),
    Num,
    Var,
    Op(String),
    Open(char),
    Close(char),
    Comma,
}

/// Fails the check with a message unless `$cond` holds.
macro_rules! ensure {
    ($cond:expr, $($msg:tt)+) => {
        if !$cond {
            return Err(format!($($msg)+));
        }
    };
}

/// PromQL as tokens; refuses what it does not know, an unclosed string
/// and unbalanced brackets.
fn tokens(expr: &str) -> Result<Vec<Token>, String> {
    let mut out = Vec::new();
    let mut open = Vec::new();
    let mut chars = expr.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            c if c.is_whitespace() => {}
            c if c.is_ascii_alphabetic() || c == '_' || c == ':' => {
                let mut ident = String::from(c);
                while let Some(&c) = chars.peek() {
                    if !(c.is_ascii_alphanumeric() || c == '_' || c == ':') {
                        break;
                    }
                    ident.push(c);
                    chars.next();
                }
                out.push(Token::Ident(ident));
            }
            c if c.is_ascii_digit() || c == '.' => {
                while chars
                    .peek()
                    .is_some_and(|c| c.is_ascii_digit() || *c == '.')
                {
                    chars.next();
                }
                out.push(Token::Num);
            }
            '$' => {
                while chars
                    .peek()
                    .is_some_and(|c| c.is_ascii_alphanumeric() || "_{}".contains(*c))
                {
                    chars.next();
                }
                out.push(Token::Var);
            }
            '"' => {
                let mut s = String::new();
                loop {
                    match chars.next() {
                        Some('"') => break,
                        Some(c) => s.push(c),
                        None => return Err(format!("unclosed string in {expr}")),
                    }
                }
                out.push(Token::Str(s));
            }
            '(' | '{' | '[' => {
                open.push(c);
                out.push(Token::Open(c));
            }
            ')' | '}' | ']' => {
                let want = match c {
                    ')' => '(',
                    '}' => '{',
                    _ => '[',
                };
                ensure!(open.pop() == Some(want), "unbalanced {c} in {expr}");
                out.push(Token::Close(c));
            }
            ',' => out.push(Token::Comma),
            '=' | '!' => {
                let mut op = String::from(c);
                if let Some(&n) = chars.peek()
                    && (n == '~' || n == '=')
                {
                    op.push(n);
                    chars.next();
                }
                out.push(Token::Op(op));
            }
            '/' | '*' | '+' | '-' => out.push(Token::Op(c.to_string())),
            other => return Err(format!("{other:?} in {expr}")),
        }
    }
    ensure!(open.is_empty(), "unclosed {open:?} in {expr}");
    Ok(out)
}

/// The metric a series belongs to, and the kind the series reads as:
/// a histogram is read by its own name as the exporter's summary (its
/// quantiles are gauges), or by `_bucket`, `_sum` and `_count` (counters).
fn series_of<'a>(
    metrics: &'a BTreeMap<String, Metric>,
    series: &str,
) -> Option<(&'a str, &'a Metric, Kind)> {
    if let Some((name, m)) = metrics.get_key_value(series) {
        let kind = match m.kind {
            Kind::Histogram => Kind::Gauge,
            kind => kind,
        };
        return Some((name, m, kind));
    }
    ["_bucket", "_sum", "_count"].iter().find_map(|suffix| {
        let (name, m) = metrics.get_key_value(series.strip_suffix(suffix)?)?;
        (m.kind == Kind::Histogram).then_some((name.as_str(), m, Kind::Counter))
    })
}

/// Checks one query: each metric is one the crate records, read as its
/// kind allows (counters through `rate` or `increase`), each label matched
/// or grouped by is one of its own (or the scrape's `job` and
/// `instance`), and each `outcome` matched is a documented outcome.
/// `variable`: a variable's `label_values(...)`, which reads any kind.
/// Returns the metrics it reads.
fn check_query(
    expr: &str,
    metrics: &BTreeMap<String, Metric>,
    variable: bool,
) -> Result<BTreeSet<String>, String> {
    let toks = tokens(expr)?;
    let at = |j: usize| toks.get(j).ok_or_else(|| format!("cut short: {expr}"));
    let outcomes = outcomes();
    let mut read = BTreeSet::new();
    let mut labels: BTreeSet<String> = ["job", "instance"].map(String::from).into();
    let mut in_braces = false;
    for (i, tok) in toks.iter().enumerate() {
        match tok {
            Token::Open('{') => in_braces = true,
            Token::Close('}') => in_braces = false,
            _ => {}
        }
        let Token::Ident(series) = tok else { continue };
        // Inside braces, a word is a label.
        if !series.starts_with("fleetgate_") || in_braces {
            continue;
        }
        let (name, metric, kind) = series_of(metrics, series)
            .ok_or_else(|| format!("{series} is not a metric the crate records: {expr}"))?;
        read.insert(name.to_owned());
        let mut own = metric.labels.clone();
        own.extend(["job", "instance"].map(String::from));
        if metric.kind == Kind::Histogram {
            let extra = if series.ends_with("_bucket") {
                "le"
            } else {
                "quantile"
            };
            own.insert(extra.to_owned());
        }
        labels.extend(own.iter().cloned());
        let in_rate = i >= 2
            && toks[i - 1] == Token::Open('(')
            && matches!(&toks[i - 2], Token::Ident(f) if f == "rate" || f == "increase");
        if !variable {
            match kind {
                Kind::Counter => ensure!(in_rate, "{series} is a counter: rate() it in {expr}"),
                _ => ensure!(!in_rate, "{series} is not a counter: {expr}"),
            }
        }
        // Its matchers, if any.
        if toks.get(i + 1) == Some(&Token::Open('{')) {
            let mut j = i + 2;
            while *at(j)? != Token::Close('}') {
                let (Token::Ident(label), Token::Op(op), Token::Str(value)) =
                    (at(j)?, at(j + 1)?, at(j + 2)?)
                else {
                    return Err(format!("a matcher in {expr}"));
                };
                ensure!(
                    ["=", "!=", "=~", "!~"].contains(&op.as_str()),
                    "{op} in {expr}"
                );
                ensure!(own.contains(label), "{series} has no label {label}: {expr}");
                if label == "outcome" {
                    for v in value.split('|') {
                        ensure!(outcomes.contains(v), "no outcome {v:?}: {expr}");
                    }
                }
                j += 3;
                if *at(j)? == Token::Comma {
                    j += 1;
                }
            }
        }
    }
    // Grouping (by, without) and label_values' label.
    for (i, tok) in toks.iter().enumerate() {
        let Token::Ident(word) = tok else { continue };
        let grouped: Vec<&Token> = if word == "by" || word == "without" {
            ensure!(
                *at(i + 1)? == Token::Open('('),
                "{word} without ( in {expr}"
            );
            toks[i + 2..]
                .iter()
                .take_while(|t| **t != Token::Close(')'))
                .collect()
        } else if word == "label_values" && variable {
            toks.iter().rev().skip(1).take(1).collect()
        } else {
            continue;
        };
        for t in grouped {
            if let Token::Ident(label) = t {
                ensure!(labels.contains(label), "no label {label} here: {expr}");
            }
        }
    }
    Ok(read)
}

#[test]
fn queries_read_only_recorded_metrics_and_their_labels() {
    let d = dashboard();
    let metrics = exported();
    let mut read = BTreeSet::new();
    for p in panels(&d) {
        for t in p["targets"].as_array().into_iter().flatten() {
            let expr = t["expr"].as_str().unwrap();
            let metrics_read = check_query(expr, &metrics, false).unwrap();
            assert!(!metrics_read.is_empty(), "{expr} reads no fleetgate metric");
            read.extend(metrics_read);
        }
    }
    for v in d["templating"]["list"].as_array().unwrap() {
        if v["type"] == "query" {
            let q = v["query"].as_str().unwrap();
            assert!(q.starts_with("label_values("), "{q}");
            check_query(q, &metrics, true).unwrap();
        }
    }
    // A metric added to the crate gets a panel, or this says it lacks one.
    let unread: Vec<&String> = metrics.keys().filter(|m| !read.contains(*m)).collect();
    assert!(unread.is_empty(), "no panel reads {unread:?}");
}

#[test]
fn the_query_check_refuses_wrong_queries() {
    let metrics = exported();
    for (wrong, why) in [
        ("sum(rate(fleetgate_decision_total[1m]))", "not a metric"),
        ("sum(fleetgate_decisions_total)", "a counter"),
        (
            "sum by (tier) (rate(fleetgate_decisions_total[1m]))",
            "no label tier",
        ),
        (
            "rate(fleetgate_decisions_total{outcome=\"refused\"}[1m])",
            "no outcome",
        ),
        (
            "rate(fleetgate_decisions_total{route=\"x\"}[1m])",
            "no label route",
        ),
        ("rate(fleetgate_shed_in_flight[1m])", "not a counter"),
        ("sum(rate(fleetgate_decisions_total[1m])", "unclosed"),
        (
            "fleetgate_store_duration_seconds{le=\"0.1\"}",
            "no label le",
        ),
    ] {
        let err = check_query(wrong, &metrics, false).unwrap_err();
        assert!(err.contains(why), "{wrong}: {err}");
    }
    let right = "histogram_quantile(0.99, sum by (op, le) \
                 (rate(fleetgate_store_duration_seconds_bucket[1m])))";
    assert_eq!(
        check_query(right, &metrics, false).unwrap(),
        ["fleetgate_store_duration_seconds".to_owned()].into()
    );
}
