//! What the layers decide, as metrics through the [`metrics`] facade (with
//! the `metrics` feature), so any exporter (Prometheus, StatsD, OTLP via
//! `metrics-exporter-*`) sees them.
//!
//! | metric | kind | labels | meaning |
//! |---|---|---|---|
//! | `fleetgate_decisions_total` | counter | `layer`, `policy`, `outcome` | one per request a layer decided |
//! | `fleetgate_near_limit_total` | counter | `layer`, `policy` | rate limits: admitted with at most a tenth of the deciding limit's burst left |
//! | `fleetgate_shed_in_flight` | gauge | `layer`, `policy`, `tier` | load shedders: this process's requests of the tier in flight |
//! | `fleetgate_shed_fraction` | gauge | `layer`, `policy`, `tier` | load shedders: how much of the tier is shed now, 0 to 1: `utilization_shed`, the drop probability; `fleet_shed`, the share of this process's recent requests of the tier shed (each weighing `e^(−age/10 s)`; it holds while none come) |
//! | `fleetgate_shed_total` | counter | `layer`, `policy`, `tier` | load shedders: requests of the tier shed (by the fleet shedder's local fallback too) |
//! | `fleetgate_concurrency_limit` | gauge | `policy` | adaptive concurrency limits: the limit enforced now (set as it moves) |
//! | `fleetgate_concurrency_min_rtt_seconds` | gauge | `policy` | adaptive concurrency limits: the minimum RTT measured |
//! | `fleetgate_concurrency_gradient` | gauge | `policy` | Gradient2 limits: the last sampling window's gradient (below 1: the service queues) |
//! | `fleetgate_concurrency_queue_waiting` | gauge | `policy` | concurrency limits with a wait queue: callers waiting now in this process |
//! | `fleetgate_concurrency_queue_total` | counter | `policy`, `result` | callers that left a wait queue: `admitted`, `timed_out`, `overflowed` (refused for a full queue) |
//! | `fleetgate_concurrency_queue_wait_seconds` | histogram | `policy` | how long the admitted callers waited |
//! | `fleetgate_throttle_calls_total` | counter | `throttle`, `result` | client-side adaptive throttles: calls `sent`, `accepted` by the upstream, `refused` locally |
//! | `fleetgate_throttle_rejection_probability` | gauge | `throttle` | the probability a call is refused now (set at each call) |
//! | `fleetgate_throttle_accept_ratio` | gauge | `throttle` | accepted over sent in the throttle's window (set at each call) |
//! | `fleetgate_retry_budget_total` | counter | `budget`, `result` | retry budgets: `first_attempt` deposited, `retry` allowed, `refused` for want of a token |
//! | `fleetgate_store_duration_seconds` | histogram | `store`, `op` | one Redis round trip, timeouts and errors included |
//! | `fleetgate_store_errors_total` | counter | `store`, `op`, `error` | Redis calls that failed: `timeout`, `redis`, `reply` |
//! | `fleetgate_memory_evictions_total` | counter | `state` | [`MemoryStore`](crate::MemoryStore): live entries evicted to stay within its bound; `state` is `gcra` or `window` |
//! | `fleetgate_memory_lease_refusals_total` | counter | | [`MemoryStore`](crate::MemoryStore): lease acquires refused because their shard was full of held leases |
//!
//! `layer` is the kind of layer (`rate_limit`, `concurrency`, `fleet_shed`,
//! `utilization_shed`), `tier` a load shedder's tier name, `policy`
//! the configured policy name, `op` the script (`gcra`, `sliding_log`,
//! `lease_acquire`, ...), and `outcome` one of:
//!
//! | outcome | the request was |
//! |---|---|
//! | `allowed` | admitted by the limit |
//! | `denied` | refused by the limit |
//! | `shadow_denied` | over the limit in shadow mode: admitted, only counted |
//! | `shed` | dropped by a load shedder (by the fleet shedder's local fallback: `fallback_denied`) |
//! | `missing_key` | refused: no key could be extracted |
//! | `fail_open` | admitted: the store failed |
//! | `fail_closed` | refused: the store failed |
//! | `fallback_allowed` | admitted by the local fallback: the store failed |
//! | `fallback_denied` | refused by the local fallback: the store failed |
//! | `deny_listed` | refused by a deny list entry ([`LivePolicies::deny`](crate::live::LivePolicies::deny)), without a decision |
//! | `allow_listed` | let through by an allow list entry, without a decision |
//!
//! A store failure shows twice: as a store error, and as the `fail_open`,
//! `fail_closed` or `fallback_*` outcome of the decision it spoiled.
//! Every label comes from configuration, never from a request: the number of
//! series is bounded by the number of policies, whatever the traffic. Keys
//! (IP addresses, API keys) are never labels.
//!
//! Handles are resolved on a layer's first decision, so install the
//! recorder before the first request. Without the `metrics` feature nothing
//! is recorded and nothing is paid.
//!
//! **Keep the recorder's memory bounded.** A recorder that keeps histogram
//! samples until it is drained grows with every request while nobody
//! scrapes it: `metrics-exporter-prometheus`'s recorder from
//! `install_recorder()` keeps `fleetgate_store_duration_seconds` samples
//! until `PrometheusHandle::run_upkeep` runs. Either install it with
//! `PrometheusBuilder::install()` (its own listener runs the upkeep on a
//! timer, `upkeep_timeout`), or run the upkeep yourself on a timer, as the
//! demo does:
//!
//! ```no_run
//! use std::time::Duration;
//! use metrics_exporter_prometheus::PrometheusBuilder;
//!
//! # #[tokio::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let handle = PrometheusBuilder::new().install_recorder()?;
//! let upkeep = handle.clone();
//! tokio::spawn(async move {
//!     let mut every = tokio::time::interval(Duration::from_secs(5));
//!     loop {
//!         every.tick().await;
//!         upkeep.run_upkeep();
//!     }
//! });
//! // Serve `handle.render()` on your own /metrics route.
//! # Ok(()) }
//! ```

use std::sync::Arc;
use std::time::Duration;

use crate::error::StoreError;
use crate::observe::PolicyStats;
use crate::outcome::Outcome;

/// The `error` label of a store failure.
#[cfg_attr(not(all(feature = "metrics", feature = "redis")), allow(dead_code))]
pub(crate) fn error_label(err: &StoreError) -> &'static str {
    match err {
        StoreError::Timeout(_) => "timeout",
        StoreError::Redis(_) => "redis",
        StoreError::UnexpectedReply(_) => "reply",
        StoreError::Config(_) => "config",
    }
}

/// One layer's metric handles: cheap to clone, resolved once. They also
/// feed [`observe`](crate::observe), which needs no feature.
#[derive(Clone, Debug)]
pub(crate) struct LayerMetrics {
    #[cfg(feature = "metrics")]
    inner: Arc<enabled::Inner>,
    observed: Arc<PolicyStats>,
}

impl LayerMetrics {
    /// Handles for a layer of kind `layer` (`rate_limit`, ...) deciding
    /// `policy`.
    pub(crate) fn new(layer: &'static str, policy: Arc<str>) -> Self {
        LayerMetrics {
            #[cfg(feature = "metrics")]
            inner: Arc::new(enabled::Inner::new(layer, policy.clone())),
            observed: PolicyStats::register(layer, policy),
        }
    }

    /// The layer's counters in [`observe`](crate::observe).
    pub(crate) fn observed(&self) -> &Arc<PolicyStats> {
        &self.observed
    }

    /// Counts one decision. `near_limit` says whether an admitted request
    /// left at most a tenth of the deciding limit.
    #[inline]
    pub(crate) fn decided(&self, outcome: Outcome, near_limit: bool) {
        #[cfg(feature = "metrics")]
        self.inner.decided(outcome, near_limit);
        self.observed.decided(outcome, near_limit);
    }

    /// Offers a refused identity to [`observe`](crate::observe)'s table of
    /// the most denied.
    #[inline]
    pub(crate) fn denied(&self, key: &crate::Key) {
        self.observed.denied(key);
    }
}

/// An adaptive limit's and a wait queue's gauges, resolved per event: a
/// limit moves a few times a second, and queue events are a refused
/// caller's, not every request's.
#[derive(Clone, Debug)]
pub(crate) struct LimitMetrics {
    #[cfg(feature = "metrics")]
    policy: Arc<str>,
}

#[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
impl LimitMetrics {
    pub(crate) fn new(policy: Arc<str>) -> Self {
        LimitMetrics {
            #[cfg(feature = "metrics")]
            policy,
        }
    }

    /// Where an adaptive limit is now.
    pub(crate) fn adaptive(&self, limit: u64, min_rtt: Option<Duration>, gradient: Option<f64>) {
        #[cfg(feature = "metrics")]
        {
            let policy = self.policy.clone();
            ::metrics::gauge!("fleetgate_concurrency_limit", "policy" => policy.clone())
                .set(limit as f64);
            if let Some(rtt) = min_rtt {
                ::metrics::gauge!("fleetgate_concurrency_min_rtt_seconds", "policy" => policy.clone())
                    .set(rtt.as_secs_f64());
            }
            if let Some(gradient) = gradient {
                ::metrics::gauge!("fleetgate_concurrency_gradient", "policy" => policy)
                    .set(gradient);
            }
        }
    }

    /// A caller joined (`1`) or left (`-1`) a wait queue.
    pub(crate) fn queue_waiting(&self, delta: f64) {
        #[cfg(feature = "metrics")]
        ::metrics::gauge!("fleetgate_concurrency_queue_waiting", "policy" => self.policy.clone())
            .increment(delta);
    }

    /// A caller left the queue with `result` (`admitted`, `timed_out`,
    /// `overflowed`), having waited `waited` if admitted.
    pub(crate) fn queue_left(&self, result: &'static str, waited: Option<Duration>) {
        #[cfg(feature = "metrics")]
        {
            let policy = self.policy.clone();
            ::metrics::counter!(
                "fleetgate_concurrency_queue_total",
                "policy" => policy.clone(),
                "result" => result,
            )
            .increment(1);
            if let Some(waited) = waited {
                ::metrics::histogram!("fleetgate_concurrency_queue_wait_seconds", "policy" => policy)
                    .record(waited.as_secs_f64());
            }
        }
    }
}

/// Counts one call of the throttle `name`: `sent`, `accepted` or
/// `refused` (resolved per call: each is an outbound call's, far costlier
/// than the lookup).
#[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
pub(crate) fn throttle_call(name: &Arc<str>, result: &'static str) {
    #[cfg(feature = "metrics")]
    ::metrics::counter!("fleetgate_throttle_calls_total", "throttle" => name.clone(), "result" => result)
        .increment(1);
}

/// Counts one event of the retry budget `name`: `first_attempt`, `retry`
/// or `refused`.
#[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
pub(crate) fn budget_event(name: &Arc<str>, result: &'static str) {
    #[cfg(feature = "metrics")]
    ::metrics::counter!("fleetgate_retry_budget_total", "budget" => name.clone(), "result" => result)
        .increment(1);
}

/// Sets a throttle's gauges.
#[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
pub(crate) fn throttle_gauges(name: &Arc<str>, probability: f64, accept_ratio: Option<f64>) {
    #[cfg(feature = "metrics")]
    {
        ::metrics::gauge!("fleetgate_throttle_rejection_probability", "throttle" => name.clone())
            .set(probability);
        if let Some(ratio) = accept_ratio {
            ::metrics::gauge!("fleetgate_throttle_accept_ratio", "throttle" => name.clone())
                .set(ratio);
        }
    }
}

/// One Redis script's latency and error counters.
#[cfg(feature = "redis")]
#[derive(Debug)]
pub(crate) struct ScriptMetrics {
    #[cfg(feature = "metrics")]
    op: &'static str,
    #[cfg(feature = "metrics")]
    latency: std::sync::OnceLock<::metrics::Histogram>,
}

#[cfg(feature = "redis")]
impl ScriptMetrics {
    #[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
    pub(crate) fn new(op: &'static str) -> Self {
        ScriptMetrics {
            #[cfg(feature = "metrics")]
            op,
            #[cfg(feature = "metrics")]
            latency: std::sync::OnceLock::new(),
        }
    }

    /// Counts one call whose store call failed (rare: the series is
    /// resolved per failure).
    #[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
    pub(crate) fn failed(&self, error: &StoreError) {
        crate::observe::store_failed();
        #[cfg(feature = "metrics")]
        ::metrics::counter!(
            "fleetgate_store_errors_total",
            "store" => "redis",
            "op" => self.op,
            "error" => error_label(error),
        )
        .increment(1);
    }

    /// Records how long one round trip took (its failure, if any, is
    /// counted by [`failed`](Self::failed), once per call it failed).
    #[inline]
    #[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
    pub(crate) fn timed(&self, took: Duration) {
        crate::observe::store_timed(took);
        #[cfg(feature = "metrics")]
        {
            let op = self.op;
            self.latency
                .get_or_init(|| {
                    ::metrics::histogram!(
                        "fleetgate_store_duration_seconds",
                        "store" => "redis",
                        "op" => op,
                    )
                })
                .record(took.as_secs_f64());
        }
    }
}

/// Counts `count` live entries of the memory store's `state` (`gcra`,
/// `window`) evicted at its bound (in batches: the series is resolved per
/// batch).
#[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
pub(crate) fn memory_evicted(state: &'static str, count: u64) {
    #[cfg(feature = "metrics")]
    ::metrics::counter!("fleetgate_memory_evictions_total", "state" => state).increment(count);
}

/// Counts one lease acquire the memory store refused for want of room.
pub(crate) fn memory_lease_refused() {
    #[cfg(feature = "metrics")]
    ::metrics::counter!("fleetgate_memory_lease_refusals_total").increment(1);
}

/// Whether an admitted call left at most a tenth of the burst.
pub(crate) fn near_limit(remaining: u64, burst: u64) -> bool {
    remaining.saturating_mul(10) <= burst
}

#[cfg(feature = "metrics")]
mod enabled {
    use std::sync::{Arc, OnceLock};

    use ::metrics::{Counter, counter};

    use crate::outcome::Outcome;

    #[derive(Debug)]
    pub(super) struct Inner {
        layer: &'static str,
        policy: Arc<str>,
        handles: OnceLock<Handles>,
    }

    #[derive(Debug)]
    struct Handles {
        outcomes: [Counter; Outcome::ALL.len()],
        near_limit: Counter,
    }

    impl Inner {
        pub(super) fn new(layer: &'static str, policy: Arc<str>) -> Self {
            Inner {
                layer,
                policy,
                handles: OnceLock::new(),
            }
        }

        fn handles(&self) -> &Handles {
            self.handles.get_or_init(|| Handles {
                outcomes: Outcome::ALL.map(|outcome| {
                    counter!(
                        "fleetgate_decisions_total",
                        "layer" => self.layer,
                        "policy" => self.policy.clone(),
                        "outcome" => outcome.as_str(),
                    )
                }),
                near_limit: counter!(
                    "fleetgate_near_limit_total",
                    "layer" => self.layer,
                    "policy" => self.policy.clone(),
                ),
            })
        }

        pub(super) fn decided(&self, outcome: Outcome, near_limit: bool) {
            let handles = self.handles();
            handles.outcomes[outcome.index()].increment(1);
            if near_limit && outcome == Outcome::Allowed {
                handles.near_limit.increment(1);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn labels_are_fixed_words() {
        let names: Vec<&str> = Outcome::ALL.iter().map(|o| o.as_str()).collect();
        assert_eq!(
            names,
            [
                "allowed",
                "denied",
                "shadow_denied",
                "shed",
                "missing_key",
                "fail_open",
                "fail_closed",
                "fallback_allowed",
                "fallback_denied",
                "deny_listed",
                "allow_listed"
            ]
        );
        for (i, o) in Outcome::ALL.iter().enumerate() {
            assert_eq!(o.index(), i);
        }
        assert_eq!(
            error_label(&StoreError::Timeout(Duration::from_millis(1))),
            "timeout"
        );
        assert!(near_limit(1, 10));
        assert!(!near_limit(2, 10));
        assert!(near_limit(0, 1));
    }
}
