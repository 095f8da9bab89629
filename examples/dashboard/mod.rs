//! The demo's live page: `GET /dashboard` (this folder's HTML, CSS and
//! script, compiled in) and `GET /dashboard/events`, one JSON object a
//! second over Server-Sent Events, built from `fleetgate::observe`. The
//! event's shape is in docs/dashboard.md.

use std::collections::{HashMap, VecDeque};
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::http::header;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::routing::get;
use fleetgate::live::LivePolicies;
use fleetgate::observe::{self, Decisions, Snapshot};
use serde_json::{Value, json};

const PAGE: &str = include_str!("index.html");
const STYLE: &str = include_str!("dashboard.css");
const SCRIPT: &str = include_str!("dashboard.js");

/// One point a second per policy, five minutes of them.
const POINTS: usize = 300;
/// At most this many instances are listed (the count is always sent).
const INSTANCES: usize = 16;

/// What every client's stream starts from: the points so far and the
/// latest event.
#[derive(Default)]
struct Board {
    /// Per `layer/policy`: [admitted, denied, shed, store failed] per
    /// second, oldest first.
    history: HashMap<String, VecDeque<[f64; 4]>>,
    latest: Option<Value>,
}

/// The page and its events, sampled once a second for as long as the demo
/// runs (whether or not anyone watches: the history is ready when someone
/// does).
pub fn routes(live: LivePolicies) -> Router {
    let board = Arc::new(Mutex::new(Board::default()));
    let (events, _) = tokio::sync::watch::channel(Arc::new(String::new()));
    let events = Arc::new(events);
    tokio::spawn(sample(live, board.clone(), events.clone()));
    Router::new()
        .route(
            "/dashboard",
            get(|| async { ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], PAGE) }),
        )
        .route(
            "/dashboard/dashboard.css",
            get(|| async { ([(header::CONTENT_TYPE, "text/css; charset=utf-8")], STYLE) }),
        )
        .route(
            "/dashboard/dashboard.js",
            get(|| async {
                (
                    [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
                    SCRIPT,
                )
            }),
        )
        .route(
            "/dashboard/events",
            get(move || {
                let (board, events) = (board.clone(), events.clone());
                async move { stream(&board, &events) }
            }),
        )
}

/// The SSE response: first the latest event with the history, then each
/// new event as it comes (a slow client skips to the newest: the watch
/// keeps only one).
fn stream(
    board: &Mutex<Board>,
    events: &tokio::sync::watch::Sender<Arc<String>>,
) -> Sse<impl futures_util::Stream<Item = Result<Event, Infallible>> + use<>> {
    let mut receiver = events.subscribe();
    receiver.mark_unchanged();
    // Before the first sample there is nothing to send: the stream starts
    // with the first event (an empty history then), so that every event
    // has the same shape.
    let first = {
        let board = board.lock().unwrap_or_else(|e| e.into_inner());
        board.latest.clone().map(|mut first| {
            let history: serde_json::Map<String, Value> = board
                .history
                .iter()
                .map(|(name, points)| (name.clone(), json!(points)))
                .collect();
            first["history"] = Value::Object(history);
            Ok(Event::default().data(first.to_string()))
        })
    };
    let first = futures_util::stream::iter(first);
    let next = futures_util::stream::unfold(receiver, |mut receiver| async move {
        receiver.changed().await.ok()?;
        let data = receiver.borrow_and_update().clone();
        Some((Ok(Event::default().data(data.as_str())), receiver))
    });
    Sse::new(futures_util::StreamExt::chain(first, next)).keep_alive(KeepAlive::default())
}

/// Each second: the snapshot, turned into rates against the one before.
async fn sample(
    live: LivePolicies,
    board: Arc<Mutex<Board>>,
    events: Arc<tokio::sync::watch::Sender<Arc<String>>>,
) {
    let mut snapshots = observe::watch(Duration::from_secs(1));
    let mut before: Arc<Snapshot> = snapshots.borrow_and_update().clone();
    // Rates are per second of the monotonic clock, read as each snapshot
    // arrives (right after it is taken): a step of the wall clock, which
    // `at_ms` follows, would make them 0 or huge.
    let mut before_at = Instant::now();
    while snapshots.changed().await.is_ok() {
        let now = snapshots.borrow_and_update().clone();
        let now_at = Instant::now();
        let seconds = now_at.duration_since(before_at).as_secs_f64();
        before_at = now_at;
        let event = {
            let mut board = board.lock().unwrap_or_else(|e| e.into_inner());
            let event = tick(&live, &before, &now, seconds, &mut board.history);
            board.latest = Some(event.clone());
            event
        };
        events.send_replace(Arc::new(event.to_string()));
        before = now;
    }
}

/// One event: `now`, with rates per second since `before`, `seconds`
/// earlier; appends each policy's point to `history`.
fn tick(
    live: &LivePolicies,
    before: &Snapshot,
    now: &Snapshot,
    seconds: f64,
    history: &mut HashMap<String, VecDeque<[f64; 4]>>,
) -> Value {
    let seconds = seconds.max(0.001);
    let per_s = |a: u64, b: u64| (a.saturating_sub(b) as f64 / seconds * 100.0).round() / 100.0;
    let policies: Vec<Value> = now
        .policies
        .iter()
        .map(|p| {
            let zero = Decisions::default();
            let was = before
                .policies
                .iter()
                .find(|b| b.layer == p.layer && b.policy == p.policy)
                .map_or(&zero, |b| &b.decisions);
            let (d, w) = (&p.decisions, was);
            let rates = json!({
                "allowed": per_s(d.allowed, w.allowed),
                "denied": per_s(d.denied, w.denied),
                "shadow_denied": per_s(d.shadow_denied, w.shadow_denied),
                "shed": per_s(d.shed, w.shed),
                "missing_key": per_s(d.missing_key, w.missing_key),
                "fail_open": per_s(d.fail_open, w.fail_open),
                "fail_closed": per_s(d.fail_closed, w.fail_closed),
                "fallback_allowed": per_s(d.fallback_allowed, w.fallback_allowed),
                "fallback_denied": per_s(d.fallback_denied, w.fallback_denied),
                "deny_listed": per_s(d.deny_listed, w.deny_listed),
                "allow_listed": per_s(d.allow_listed, w.allow_listed),
            });
            let point = [
                per_s(d.allowed, w.allowed),
                per_s(d.denied, w.denied),
                per_s(d.shed, w.shed),
                per_s(
                    d.fail_open + d.fail_closed + d.fallback_allowed + d.fallback_denied,
                    w.fail_open + w.fail_closed + w.fallback_allowed + w.fallback_denied,
                ),
            ];
            let points = history
                .entry(format!("{}/{}", p.layer, p.policy))
                .or_default();
            if points.len() == POINTS {
                points.pop_front();
            }
            points.push_back(point);
            let mut policy = serde_json::to_value(p).unwrap_or_default();
            policy["per_second"] = rates;
            policy["point"] = json!(point);
            policy
        })
        .collect();
    let instances: Vec<Value> = live
        .instances()
        .iter()
        .take(INSTANCES)
        .map(|i| json!({ "id": i.id, "address": i.address }))
        .collect();
    json!({
        "at_ms": now.at_ms,
        "instances": now.instances,
        "instance_list": instances,
        "store": now.store,
        "store_per_second": {
            "calls": per_s(now.store.calls, before.store.calls),
            "errors": per_s(now.store.errors, before.store.errors),
        },
        "policies": policies,
        "throttles": now.throttles,
        "retry_budgets": now.retry_budgets,
    })
}
