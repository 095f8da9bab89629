//! What the layers report through the `metrics` facade (one recorder
//! installed for the whole binary) and `fleetgate::observe`. The tracing span has a binary of its
//! own (`tests/tracing`).
#[path = "../common/mod.rs"]
mod common;

mod metrics;
mod observe;
