//! Redis hung, killed, paused or stripped of its scripts under load. A
//! binary of its own: its tests bound every request's latency, so they run
//! one at a time (`faults::SERIAL`) and share the machine with no other
//! test.
#[path = "../common/mod.rs"]
mod common;

mod faults;
