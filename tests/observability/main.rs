//! What the layers report through the `metrics` facade (one recorder
//! installed for the whole binary), `fleetgate::observe`, and the Grafana dashboard over the
//! metrics. The tracing span has a binary of its own (`tests/tracing`).
#[path = "../common/mod.rs"]
mod common;

mod dashboard;
mod metrics;
mod observe;
