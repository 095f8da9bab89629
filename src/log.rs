//! Logs that cannot flood, and the span of each decision.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Store failures are logged at most once a second per process.
pub(crate) static STORE_WARNINGS: LogGate = LogGate::new();
/// Requests without a key likewise.
pub(crate) static KEY_WARNINGS: LogGate = LogGate::new();

/// Logs, at most once a second per process, that a request carried no key
/// for the `what` layer's `policy`, with the usual cause.
pub(crate) fn warn_missing_key(what: &str, policy: &str) {
    if KEY_WARNINGS.allow() {
        tracing::warn!(
            policy,
            "no {what} key in the request; when keying by peer IP, serve with \
             into_make_service_with_connect_info::<SocketAddr>()"
        );
    }
}

/// The span of one decision, `fleetgate.decision` at `debug`: the layer,
/// the policy, the tier (shedding layers), the outcome (recorded once
/// known) and, for a store that did I/O, its latency in microseconds. Free
/// unless a subscriber wants `debug`.
pub(crate) fn decision_span(
    layer: &'static str,
    policy: &str,
    tier: Option<&str>,
    latency: Option<Duration>,
) -> tracing::Span {
    // With tracing's `log` feature on (axum's default `tower-log` turns it
    // on), even a disabled span offers its fields to `log` when made,
    // entered, recorded, exited and dropped. When no subscriber may want
    // `debug` (so the span would be disabled) and no logger takes debug
    // records (so none of it could reach one), the span is none at all,
    // and is not even made.
    let no_debug_log = log::max_level() < log::LevelFilter::Debug;
    if !tracing::level_enabled!(tracing::Level::DEBUG) && no_debug_log {
        return tracing::Span::none();
    }
    let span = tracing::debug_span!(
        "fleetgate.decision",
        layer,
        policy,
        tier = tracing::field::Empty,
        outcome = tracing::field::Empty,
        store_latency_us = tracing::field::Empty,
    );
    if span.is_disabled() {
        // A subscriber that wants `debug` elsewhere, but not here: as
        // above, nothing of this span can reach a logger that filters out
        // debug records.
        return if no_debug_log {
            tracing::Span::none()
        } else {
            span
        };
    }
    if let Some(tier) = tier {
        span.record("tier", tier);
    }
    if let Some(latency) = latency {
        let micros = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
        span.record("store_latency_us", micros);
    }
    span
}

/// Lets one log line through per second, so that a failing store cannot
/// flood the logs.
#[derive(Debug)]
pub(crate) struct LogGate {
    last_ms: AtomicU64,
}

impl LogGate {
    pub(crate) const fn new() -> Self {
        LogGate {
            last_ms: AtomicU64::new(0),
        }
    }

    pub(crate) fn allow(&self) -> bool {
        static START: OnceLock<Instant> = OnceLock::new();
        let now_ms = u64::try_from(START.get_or_init(Instant::now).elapsed().as_millis())
            .unwrap_or(u64::MAX)
            .saturating_add(1000);
        let last = self.last_ms.load(Ordering::Relaxed);
        now_ms.saturating_sub(last) >= 1000
            && self
                .last_ms
                .compare_exchange(last, now_ms, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
    }
}
