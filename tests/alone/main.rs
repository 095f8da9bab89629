//! The tests that need the machine, or the process, to themselves, run one
//! at a time in a binary of their own (cargo runs test binaries one after
//! another): an axum router under load while Redis is hung, killed, paused
//! or stripped of its scripts (`faults`); a master killed under Sentinel
//! and under Cluster, whose bounds are latencies (the rest of the Sentinel
//! tests share their helpers and run here too); a failing charge's warning,
//! which goes through the process's once-a-second gate (`charge_log`); and
//! `local_auto`, whose fleet size is the process's. Every test starts with
//! [`one_at_a_time`].
#[path = "../common/mod.rs"]
mod common;
#[path = "../common/response_cost.rs"]
mod response_cost;

mod charge_log;
#[cfg(feature = "cluster")]
mod cluster_failover;
mod faults;
mod local_auto;
#[cfg(feature = "sentinel")]
mod sentinel;

/// This binary's turn, held until dropped: its tests run one after the
/// other, each with the machine to itself.
async fn one_at_a_time() -> tokio::sync::MutexGuard<'static, ()> {
    static TURN: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    TURN.lock().await
}
