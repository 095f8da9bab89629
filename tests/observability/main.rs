//! What the layers report: metrics through the `metrics` facade (one
//! recorder installed for the whole binary) and the `fleetgate.decision`
//! tracing span (a subscriber for each test's thread).
#[path = "../common/mod.rs"]
mod common;

mod metrics;
mod tracing;
