//! The `fleetgate.decision` tracing span (a subscriber for each test's
//! thread). A binary of its own: a test hitting the same span callsites
//! at the same moment without a subscriber (as the metrics tests do) can
//! leave the callsites' cached interest at "never", and the span is then
//! not recorded.
#[path = "../common/mod.rs"]
mod common;

mod decision_span;
