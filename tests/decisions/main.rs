//! What a limiter decides: the same exact decisions from the memory store
//! and from Redis for every algorithm, exact counts under concurrency, the
//! deny cache, building limiters and policies (builders and spec files),
//! and the memory store's own promises (sweeping, no allocation per
//! decision).
#[path = "../common/mod.rs"]
mod common;

mod adjust;
mod allocations;
mod builder;
mod conformance;
mod conformance_adjust;
mod conformance_block;
mod conformance_calendar;
mod conformance_windows;
mod deny_cache;
mod exactness;
mod harness;
mod memory_store;
mod reset;
mod spec;
mod watch;
