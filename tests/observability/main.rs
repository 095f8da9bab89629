//! What the layers report through the `metrics` facade (one recorder
//! installed for the whole binary), and the Grafana dashboard over them.
//! The tracing span has a binary of its own (`tests/tracing`).
#[path = "../common/mod.rs"]
mod common;

mod dashboard;
mod metrics;
