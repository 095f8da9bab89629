//! Holding something for exactly as long as a request is in flight, and
//! never losing it: the piece the concurrency limiter (and anything else
//! that admits and releases, such as a load shedder) builds on.
//!
//! - [`Lease`]: something that can be released and renewed, such as a
//!   [`StoreLease`] (a concurrency lease in a [`Store`](crate::Store)).
//! - [`LeaseGuard`]: releases its lease when dropped, whatever ends the
//!   request: the response finished, the request future dropped (client
//!   gone, a timeout layer outside), or a panic unwinding through it. It can
//!   also renew the lease in the background while it lives, on a task of
//!   its own or through a [`Renewer`] shared by many leases.
//! - [`GuardedBody`]: a response body that holds a guard until the body has
//!   been sent to its end, has failed, or is dropped.
//!
//! Releasing never blocks the response path: a release that is not already
//! done when the guard drops (every Redis release) is sent then, ahead of
//! the holder's next acquire on the same connection, and its answer is
//! awaited on a spawned tokio task. Without a tokio runtime at that point
//! the lease is not given back and simply expires after its TTL.
//!
//! A [`RedisStore`](crate::RedisStore) release that fails on its way (the
//! connection reset while Redis stays up, a timeout, Redis down or busy
//! loading its data) is retried, by one task per store: at once, then,
//! while Redis stays unreachable, with a growing delay, until the release
//! reaches Redis or its lease cannot hold its slot any more (its TTL has
//! passed, with a margin for a renewal in flight and, with the caller's
//! clock, for that clock's slack). A retry that finds the lease already
//! gone (the attempt that timed out had landed after all) is a release
//! like any other. A release is given up, and logged at `warn`, when that
//! time has passed, when Redis answers it with an error of its own (no
//! permission, a key of another type), when the store's queue of releases
//! to retry is full, or when the runtime that retries them shuts down; its
//! lease then expires after its TTL. A release being retried counts as
//! pending until it lands or is given up
//! ([`ConcurrencyLimiter::releases_settled`](crate::concurrency::ConcurrencyLimiter::releases_settled)).
//!
//! ```
//! use std::time::Duration;
//! use fleetgate::concurrency::{Admission, ConcurrencyLimiter, ConcurrencyPolicy};
//! use fleetgate::{Key, MemoryStore};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let policy = ConcurrencyPolicy::builder("jobs", 1)
//!     .lease_ttl(Duration::from_secs(10))
//!     .build()?;
//! let limiter = ConcurrencyLimiter::new(policy, MemoryStore::new());
//! let who = Key::new("tenant:acme");
//! let Admission::Acquired(guard) = limiter.acquire(&who).await? else {
//!     panic!("the first lease is free");
//! };
//! assert!(matches!(limiter.acquire(&who).await?, Admission::Refused(_)));
//! drop(guard); // released
//! assert!(matches!(limiter.acquire(&who).await?, Admission::Acquired(_)));
//! # Ok(()) }
//! ```

mod body;
mod guard;
mod renewer;
mod store;

pub use self::body::GuardedBody;
pub use self::guard::LeaseGuard;
pub use self::renewer::Renewer;
pub use self::store::StoreLease;

pub(crate) use self::store::{OnRelease, Pending};

use crate::error::StoreError;
use crate::log::LogGate;
use crate::store::StoreFuture;

/// Failed releases and renewals are logged at most once a second.
static LEASE_WARNINGS: LogGate = LogGate::new();

/// Something held while a request is in flight, given back exactly once
/// through a [`LeaseGuard`].
pub trait Lease: Send + Sync + 'static {
    /// Gives the lease back; `true` if it was still held. The guard calls
    /// this once, from its `Drop`: a future that is not already resolved is
    /// polled once there (within a tokio runtime), then driven on a
    /// spawned task.
    fn release(&self) -> StoreFuture<bool>;

    /// Extends the lease by its time to live; `false` if it is no longer
    /// held (it expired or was released), in which case renewing stops.
    fn renew(&self) -> StoreFuture<bool>;
}

fn log_lost() {
    if LEASE_WARNINGS.allow() {
        tracing::warn!("lease expired before it could be renewed; renewal stops");
    }
}

fn log_renew_failure(err: &StoreError) {
    if LEASE_WARNINGS.allow() {
        tracing::warn!(error = %err, "lease renewal failed; retrying at the next tick");
    }
}

fn log_release_failure(err: &StoreError) {
    if LEASE_WARNINGS.allow() {
        tracing::warn!(error = %err, "lease release failed; it expires after its TTL");
    }
}
