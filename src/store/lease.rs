//! The lease operations of a store: the state behind concurrency limits.
//!
//! A key's leases are a set of `(lease id, expiry)`: a sorted set scored by
//! expiry in Redis (`lua/lease.lua`), a small vector in memory. Both
//! stores follow the same rules, checked by one conformance suite:
//!
//! - **acquire**: drop the leases that have expired (`expiry ≤ now`); if
//!   fewer than `capacity` remain, record the new id with
//!   `expiry = now + ttl`, else refuse and record nothing.
//! - **release**: remove the id; releasing an id that is not held (already
//!   released, expired, never acquired) does nothing.
//! - **renew**: if the id is held and has not expired, move its expiry to
//!   `now + ttl`; a lease that has expired is never revived, because its
//!   slot may already have been handed to someone else.

use std::fmt;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use crate::key::Key;

/// One lease operation: on which set (`name`, `key`), for which lease, with
/// which capacity and time to live. Release ignores the capacity and TTL;
/// renew ignores the capacity.
#[derive(Clone, Copy, Debug)]
pub struct LeaseCall<'a> {
    pub(crate) name: &'a str,
    pub(crate) key: &'a Key,
    pub(crate) id: &'a LeaseId,
    pub(crate) capacity: u64,
    pub(crate) ttl: Duration,
    /// On acquire: the caller waits in a queue this long at most if it is
    /// refused, so releases of this set must be announced to it (Redis:
    /// a refused acquire marks the set for that long, and a release of a
    /// marked set is published; see [`ReleaseWatch`]). `None`: nobody
    /// waits.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) wait: Option<Duration>,
    /// On release: the lease's acquire was never answered (its caller gave
    /// up, or it failed), so it may still reach the store after this
    /// release (Redis: the release leaves a tombstone that refuses it; see
    /// `lua/lease.lua`).
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) undo: bool,
}

impl LeaseCall<'_> {
    pub(crate) fn ttl_us(&self) -> u64 {
        u64::try_from(self.ttl.as_micros()).unwrap_or(u64::MAX)
    }
}

/// Told when a lease of one set (limit name and key) is released by any
/// instance sharing the store: what a caller queued for a slot waits on,
/// besides the releases of its own process. Made by
/// `StoreOps::watch_releases`; dropping it ends the watch.
pub struct ReleaseWatch {
    notify: Arc<tokio::sync::Notify>,
    /// Whatever keeps the watch registered with its store, until dropped.
    _registration: Box<dyn Send + Sync>,
}

impl ReleaseWatch {
    /// A watch that `notify` is told through (`notify_one`, so that a
    /// release announced between two waits is not lost), registered for as
    /// long as `registration` lives.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn new(
        notify: Arc<tokio::sync::Notify>,
        registration: Box<dyn Send + Sync>,
    ) -> Self {
        ReleaseWatch {
            notify,
            _registration: registration,
        }
    }

    /// Resolves at the next release announced since the last call (at once
    /// if one was announced since then, or since the watch was made).
    pub(crate) async fn released(&self) {
        self.notify.notified().await;
    }
}

impl fmt::Debug for ReleaseWatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReleaseWatch").finish_non_exhaustive()
    }
}

/// What a store answered to an acquire.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseGrant {
    pub(crate) acquired: bool,
    pub(crate) in_flight: u64,
    pub(crate) oldest_expires_in: Option<Duration>,
}

impl LeaseGrant {
    /// Whether the lease was recorded.
    pub fn is_acquired(&self) -> bool {
        self.acquired
    }

    /// How many unexpired leases the key holds after the call, the new one
    /// included when it was acquired.
    pub fn in_flight(&self) -> u64 {
        self.in_flight
    }

    /// When refused: how long until the oldest lease expires, the latest a
    /// slot frees up if no holder releases. `None` when acquired.
    pub fn oldest_expires_in(&self) -> Option<Duration> {
        self.oldest_expires_in
    }
}

/// A lease's id, unique across processes and machines: 128 random bits
/// drawn once per process, then a per-process counter
/// (`<32 hex digits>-<counter>`).
///
/// The random part comes from the operating system's randomness, through
/// the seeds of std's `RandomState`; two processes share it with a
/// probability of about 2^-64 even among billions of processes.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct LeaseId(Arc<str>);

impl LeaseId {
    /// A fresh id, never returned before by any process.
    pub fn generate() -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        LeaseId(Arc::from(format!("{}-{n:x}", process_token())))
    }

    /// The id as text, as it is stored.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// 128 random bits for this process. Each `RandomState` is keyed with OS
/// randomness (per thread, then stepped); hashing the process id and the
/// time with two of them gives two independent 64-bit values.
fn process_token() -> &'static str {
    static TOKEN: OnceLock<String> = OnceLock::new();
    TOKEN.get_or_init(|| {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let seed = (std::process::id(), nanos);
        let a = std::collections::hash_map::RandomState::new().hash_one(seed);
        let b = std::collections::hash_map::RandomState::new().hash_one(seed);
        format!("{a:016x}{b:016x}")
    })
}

impl fmt::Debug for LeaseId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl fmt::Display for LeaseId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_distinct_and_carry_the_process_token() {
        let ids: std::collections::HashSet<LeaseId> =
            (0..1000).map(|_| LeaseId::generate()).collect();
        assert_eq!(ids.len(), 1000);
        for id in &ids {
            let (token, n) = id.as_str().split_once('-').unwrap();
            assert_eq!(token.len(), 32);
            assert!(token.bytes().all(|b| b.is_ascii_hexdigit()));
            assert!(u64::from_str_radix(n, 16).is_ok());
        }
    }
}
