//! Where limiter state lives: [`MemoryStore`] in this process, or
//! [`RedisStore`] shared by the whole fleet (with the `redis` feature, on by
//! default).
//!
//! A store is the only part that knows where state lives. Both run the same
//! algorithm (`src/gcra.rs`, transcribed in `lua/gcra.lua`) and give the same decisions for the same
//! sequence of calls and times.
//!
//! The window algorithms likewise: `src/window.rs` for the memory store,
//! `lua/sliding_log.lua`, `lua/sliding_window.lua` and
//! `lua/fixed_window.lua` for Redis.

mod adjust;
mod call;
mod defer;
mod lease;
mod memory;
#[cfg(feature = "redis")]
mod redis;

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::{Duration, Instant};

pub(crate) use self::adjust::AdjustCall;
pub(crate) use self::call::{GcraCall, WindowCall, decide, decide_now, never};
pub(crate) use self::defer::DeferCall;
pub use self::lease::LeaseGrant;
pub(crate) use self::lease::{LeaseCall, LeaseId};
pub use self::memory::{MemoryStore, MemoryStoreBuilder, MemoryStoreStats};
#[cfg(feature = "redis")]
pub use self::redis::DenyCacheStats;
#[cfg(feature = "redis")]
pub(crate) use self::redis::live as redis_live;
#[cfg(feature = "redis")]
pub use self::redis::{RedisStore, RedisStoreBuilder, TimeSource};

#[cfg(feature = "redis")]
#[cfg(all(test, feature = "redis"))]
pub(crate) use self::redis::DenyCache;
#[cfg(all(test, feature = "redis"))]
pub(crate) use self::redis::{decode_gcra, hash_tag};

use crate::decision::Decision;
use crate::error::StoreError;
use crate::key::Key;

/// Holds limiter state and decides calls atomically.
///
/// Implemented by [`MemoryStore`] and [`RedisStore`]; the trait is sealed
/// (its operations are the crate's own) so that new operations (leases,
/// windows) can be added without breaking anyone. Use it as
/// `Arc<dyn Store>` to choose a store at run time.
pub trait Store: Send + Sync + fmt::Debug + sealed::StoreOps + 'static {
    /// A short name for logs and metrics: `"memory"` or `"redis"`.
    fn kind(&self) -> &'static str;
}

mod sealed {
    use super::*;

    /// What a store does, on the calls a [`Limiter`](crate::Limiter) or a
    /// concurrency limiter makes.
    pub trait StoreOps {
        /// Decides one GCRA call, all limits of the policy together.
        fn gcra(&self, call: GcraCall<'_>) -> StoreFuture<Decision>;

        /// Decides one call with the policy's window algorithm (sliding log,
        /// sliding-window counter or fixed window), all windows together.
        fn window(&self, call: WindowCall<'_>) -> StoreFuture<Decision>;

        /// Decides one GCRA call at once, in the calling thread, if this store
        /// can without I/O: the [`MemoryStore`] always can (it answers what
        /// [`gcra`](Store::gcra) would); a store doing I/O returns `None`.
        fn gcra_now(&self, call: GcraCall<'_>) -> Option<Decision> {
            let _ = call;
            None
        }

        /// [`gcra_now`](Store::gcra_now) for the window algorithms: what
        /// [`window`](Store::window) would answer, if this store can answer
        /// at once.
        fn window_now(&self, call: WindowCall<'_>) -> Option<Decision> {
            let _ = call;
            None
        }

        /// Upstream feedback: holds every GCRA limit of the policy back so that
        /// the key's next call is admitted no earlier than the pause from now
        /// (see [`Limiter::defer`](crate::Limiter::defer)). One round trip.
        fn gcra_defer(&self, call: DeferCall<'_>) -> StoreFuture<()>;

        /// This store as a [`RedisStore`], whose live policies are shared
        /// by the fleet; `None` for a store of one process.
        #[cfg(feature = "redis")]
        fn as_redis(&self) -> Option<&RedisStore> {
            None
        }

        /// Takes a lease if the key holds fewer unexpired leases than the
        /// call's capacity (expired ones are dropped first); see
        /// [`LeaseCall`] for the rules. One round trip in Redis.
        fn lease_acquire(&self, call: LeaseCall<'_>) -> StoreFuture<LeaseGrant>;

        /// Gives a lease back; `true` if it was held. One round trip in Redis.
        fn lease_release(&self, call: LeaseCall<'_>) -> StoreFuture<bool>;

        /// Extends an unexpired lease to `now + ttl`; `false` if it is no longer
        /// held (released, or expired and dropped). One round trip in Redis.
        fn lease_renew(&self, call: LeaseCall<'_>) -> StoreFuture<bool>;

        /// Clears every state `key` has under the name `name`: the GCRA
        /// state of every limit, every window algorithm's state, and the
        /// concurrency leases held under that name (a concurrency policy's
        /// name). The next call is decided as if the identity were new.
        /// One round trip in Redis.
        fn reset(&self, name: &str, key: &Key) -> StoreFuture<()>;

        /// What a check of the call's cost would answer now, storing
        /// nothing (see [`Limiter::peek`](crate::Limiter::peek)). One round
        /// trip in Redis.
        fn peek(&self, call: AdjustCall<'_>) -> StoreFuture<Decision>;

        /// Takes the call's cost from every limit unconditionally, into debt
        /// if need be, and says what is left: the figures of now for a call
        /// of cost 1 (see [`Limiter::charge`](crate::Limiter::charge)). One
        /// round trip in Redis.
        fn charge(&self, call: AdjustCall<'_>) -> StoreFuture<Decision>;

        /// Gives the call's cost back, never beyond a fresh state (see
        /// [`Limiter::refund`](crate::Limiter::refund)). One round trip in
        /// Redis.
        fn refund(&self, call: AdjustCall<'_>) -> StoreFuture<()>;

        /// Forgets the denials this instance remembers (the Redis store's
        /// deny cache), so that the next calls go to the store; stores that
        /// remember none do nothing.
        fn forget_denials(&self) {}
    }
}

pub(crate) use self::sealed::StoreOps;

/// The future a store returns: already resolved for the memory store (no
/// allocation), boxed for stores that do I/O.
#[must_use = "futures do nothing unless polled"]
pub struct StoreFuture<T> {
    inner: Inner<T>,
    /// How long a store doing I/O took, once it has answered.
    latency: Option<Duration>,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send + 'static>>;

enum Inner<T> {
    Ready(Option<Result<T, StoreError>>),
    /// The I/O, and when it started.
    Pending(BoxFuture<T>, Instant),
}

impl<T> StoreFuture<T> {
    /// A future that is already resolved.
    pub fn ready(result: Result<T, StoreError>) -> Self {
        StoreFuture {
            inner: Inner::Ready(Some(result)),
            latency: None,
        }
    }

    /// The result, if it is already known; the future is then spent.
    pub fn take_ready(&mut self) -> Option<Result<T, StoreError>> {
        match &mut self.inner {
            Inner::Ready(result) => result.take(),
            Inner::Pending(..) => None,
        }
    }

    /// The result if it is known, else polls the future once (with a waker
    /// that does nothing), so that a store doing I/O sends its command now:
    /// a future then handed to a task of its own still goes out ahead of
    /// the caller's later calls on the same connection. `None` while the
    /// answer is yet to come (poll it again, from a task, to get it).
    pub(crate) fn start(&mut self) -> Option<Result<T, StoreError>>
    where
        T: Unpin,
    {
        if let Some(result) = self.take_ready() {
            return Some(result);
        }
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        match Pin::new(self).poll(&mut cx) {
            std::task::Poll::Ready(result) => Some(result),
            std::task::Poll::Pending => None,
        }
    }

    /// How long the store took to answer, from the creation of this future
    /// until it resolved; `None` for an answer that was ready at once (the
    /// memory store) and before the answer has come.
    pub fn latency(&self) -> Option<Duration> {
        self.latency
    }

    /// Wraps a future that does I/O.
    pub fn pending(fut: impl Future<Output = Result<T, StoreError>> + Send + 'static) -> Self {
        StoreFuture {
            inner: Inner::Pending(Box::pin(fut), Instant::now()),
            latency: None,
        }
    }
}

impl<T> fmt::Debug for StoreFuture<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match self.inner {
            Inner::Ready(Some(_)) => "ready",
            Inner::Ready(None) => "done",
            Inner::Pending(..) => "pending",
        };
        f.debug_struct("StoreFuture")
            .field("state", &state)
            .finish()
    }
}

impl<T: Unpin> Future for StoreFuture<T> {
    type Output = Result<T, StoreError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        match &mut this.inner {
            Inner::Ready(result) => match result.take() {
                Some(result) => Poll::Ready(result),
                None => Poll::Ready(Err(StoreError::UnexpectedReply(
                    "store future polled after completion".into(),
                ))),
            },
            Inner::Pending(fut, started) => {
                let result = ready!(fut.as_mut().poll(cx));
                this.latency = Some(started.elapsed());
                Poll::Ready(result)
            }
        }
    }
}
