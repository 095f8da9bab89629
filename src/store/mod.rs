//! Where limiter state lives: [`MemoryStore`] in this process, or
//! [`RedisStore`] shared by the whole fleet (with the `redis` feature, on by
//! default).
//!
//! A store is the only part that knows where state lives. Stores run
//! algorithms: each algorithm is defined once, in `src/algorithm/`, and a
//! store runs its operations on the state it holds (the memory store calls
//! the Rust functions; the Redis store runs `lua/<algorithm>.lua`, which
//! transcribes them). Both give the same decisions for the same sequence
//! of calls and times.

mod call;
mod lease;
mod memory;
#[cfg(feature = "redis")]
mod redis;

use std::any::Any;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::{Duration, Instant};

pub(crate) use self::call::{
    Answer, BudgetCall, BudgetTake, Call, LeaseAnswer, LeaseOp, Op, adjust, decide, decide_now,
    decision, lease_acquire, lease_held, micros, never,
};
pub use self::lease::LeaseGrant;
pub(crate) use self::lease::{LeaseCall, LeaseId, ReleaseWatch};
pub use self::memory::{MemoryStore, MemoryStoreBuilder, MemoryStoreStats};
#[cfg(feature = "redis")]
pub use self::redis::DenyCacheStats;
#[cfg(feature = "redis")]
pub(crate) use self::redis::live as redis_live;
#[cfg(feature = "redis")]
pub use self::redis::{RedisStore, RedisStoreBuilder, TimeSource, Topology};

#[cfg(all(test, feature = "redis"))]
pub(crate) use self::redis::DenyCache;
#[cfg(all(test, feature = "redis"))]
pub(crate) use self::redis::{decode_gcra, hash_tag};

use crate::error::StoreError;
use crate::key::Key;

/// Holds limiter state and decides calls atomically.
///
/// Implemented by [`MemoryStore`] and [`RedisStore`]; the trait is sealed
/// (its operations are the crate's own) so that new operations can be
/// added without breaking anyone. Use it as `Arc<dyn Store>` to choose a
/// store at run time.
pub trait Store: Send + Sync + fmt::Debug + Any + sealed::StoreOps + 'static {
    /// A short name for logs and metrics: `"memory"` or `"redis"`.
    fn kind(&self) -> &'static str;
}

impl dyn Store {
    /// This store as a [`RedisStore`], whose live policies are shared by
    /// the fleet; `None` for a store of one process.
    #[cfg(feature = "redis")]
    pub(crate) fn as_redis(&self) -> Option<&RedisStore> {
        (self as &dyn Any).downcast_ref()
    }
}

mod sealed {
    use super::*;

    /// What a store does, on the calls a [`Limiter`](crate::Limiter) or a
    /// concurrency limiter makes.
    pub trait StoreOps {
        /// Runs one operation of the policy's algorithm for one key (see
        /// [`Op`]), all limits of the policy together. One round trip in
        /// Redis, where checks may travel together in one script.
        fn run(&self, call: Call<'_>) -> StoreFuture<Answer>;

        /// [`run`](StoreOps::run) at once, in the calling thread, if this
        /// store can without I/O: the [`MemoryStore`] always can; a store
        /// doing I/O returns `None`.
        fn run_now(&self, call: Call<'_>) -> Option<Answer> {
            let _ = call;
            None
        }

        /// Takes, gives back or renews a lease of a concurrency limit; see
        /// [`LeaseCall`] for the rules. One round trip in Redis.
        fn lease(&self, call: LeaseCall<'_>, op: LeaseOp) -> StoreFuture<LeaseAnswer>;

        /// Clears every state `key` has under the name `name`: the state of
        /// every algorithm and limit, and the concurrency leases held under
        /// that name (a concurrency policy's name). The next call is
        /// decided as if the identity were new. One round trip in Redis.
        fn reset(&self, name: &str, key: &Key) -> StoreFuture<()>;

        /// Reports first attempts to a retry budget and takes retry
        /// tokens from it (see [`BudgetCall`]). One round trip in Redis.
        fn budget(&self, call: BudgetCall<'_>) -> StoreFuture<BudgetTake>;

        /// Forgets the denials this instance remembers (the Redis store's
        /// deny cache), so that the next calls go to the store; stores that
        /// remember none do nothing.
        fn forget_denials(&self) {}

        /// Watches the releases of `(name, key)`'s leases made by other
        /// instances, for a caller queued for a slot. The future resolves
        /// once the watch is live (a release announced after that reaches
        /// it), or fails if the store cannot watch now: the caller then
        /// waits for its own process's releases, the oldest lease's expiry
        /// or its deadline. `None` where every release is made in this
        /// process (the memory store).
        fn watch_releases(&self, name: &str, key: &Key) -> Option<StoreFuture<ReleaseWatch>> {
            let _ = (name, key);
            None
        }
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

    /// The same answer, turned by `f` once it is known: at once for an
    /// answer already known, after the I/O otherwise.
    pub(crate) fn map<U>(self, f: fn(T) -> Result<U, StoreError>) -> StoreFuture<U>
    where
        T: Send + 'static,
        U: 'static,
    {
        match self.inner {
            Inner::Ready(result) => StoreFuture {
                inner: Inner::Ready(result.map(|r| r.and_then(f))),
                latency: None,
            },
            Inner::Pending(fut, started) => StoreFuture {
                inner: Inner::Pending(Box::pin(async move { fut.await.and_then(f) }), started),
                latency: None,
            },
        }
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
