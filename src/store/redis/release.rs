//! Lease releases that did not get through (a connection reset while Redis
//! stays up, a timeout, Redis down), retried until they reach Redis or
//! their lease has expired anyway.
//!
//! One queue per store, bounded, drained by one task that exists only while
//! the queue has something in it: while Redis is away, one release at a
//! time probes it, with a growing delay, and once one lands the rest
//! follow, several at a time. Releasing is idempotent (removing an id that is not
//! held does nothing), so a release that timed out after it had landed is
//! simply sent again and answers "not held".
//!
//! Only failures that sending again may cure are retried (see
//! [`Failure`]): an error of the call's own (no permission, a key of
//! another type) is given up at once. In metrics, a release counts one
//! failure when its first attempt fails and one more if it is given up;
//! the retries in between count nothing, so an outage shows up as many
//! failures as releases, not as many as attempts.
//!
//! The drainer runs on the runtime of the release that started it. If that
//! runtime shuts down (the drainer is dropped), the releases still queued
//! are given up: their leases expire after their TTL, and nobody waits on
//! a release no task will send.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Mutex, MutexGuard};
use std::task::Poll;
use std::time::{Duration, Instant};

use tokio::runtime::Handle;
use tokio::sync::oneshot;

use super::{Failure, RedisStore};
use crate::error::StoreError;

/// The most releases a store keeps for retrying; past that a failed release
/// is given up at once. A release waiting here costs a few hundred bytes.
const CAPACITY: usize = 10_000;

/// The delay after the first failed retry; it doubles with every failure in
/// a row, up to [`MAX_DELAY`], and starts over once a release lands.
const FIRST_DELAY: Duration = Duration::from_millis(5);

/// The longest delay between two retries while Redis stays unreachable: a
/// bound on how long a release waits after Redis is back.
const MAX_DELAY: Duration = Duration::from_millis(500);

/// The store's queue of releases to retry.
#[derive(Debug, Default)]
pub(super) struct Retries {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    queue: VecDeque<Retry>,
    /// Whether a task is draining the queue.
    draining: bool,
}

/// One release to retry, and whoever waits for its outcome.
#[derive(Debug)]
struct Retry {
    key: String,
    id: String,
    /// An undo: the lease's acquire was never answered (see
    /// `lua/lease.lua`).
    undo: bool,
    /// When the lease has surely expired: retrying past it frees nothing.
    expired_at: Instant,
    last_error: StoreError,
    done: oneshot::Sender<Result<bool, StoreError>>,
}

impl Retry {
    fn give_up(self, store: &RedisStore, why: &str) {
        let error = StoreError::Redis(format!(
            "lease release given up ({why}): {}",
            self.last_error
        ));
        store.count_release_failure(&error);
        // Whoever waited may be gone; the outcome is then nobody's concern.
        let _ = self.done.send(Err(error));
    }
}

const EXPIRED: &str = "the lease has expired by now";

impl Retries {
    /// The queue is consistent after every step: a panic elsewhere while it
    /// was held changes nothing.
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    #[cfg(test)]
    fn next(&self) -> Option<Retry> {
        self.take(1).pop()
    }

    /// The next (up to) `count` releases to send; none, and the drainer
    /// stops, when the queue is empty.
    fn take(&self, count: usize) -> Vec<Retry> {
        let mut state = self.lock();
        let end = count.min(state.queue.len());
        let taken: Vec<Retry> = state.queue.drain(..end).collect();
        if taken.is_empty() {
            state.draining = false;
        }
        taken
    }

    /// Puts `retry`, which failed again, back at the end (a release that
    /// keeps failing while others would land holds none of them up), and
    /// takes out every release whose lease has expired by `now`, for the
    /// caller to give up outside the lock (a waiter woken then may enqueue
    /// at once).
    fn failed(&self, retry: Retry, now: Instant) -> VecDeque<Retry> {
        {
            let mut state = self.lock();
            state.queue.push_back(retry);
            let (expired, live): (VecDeque<Retry>, _) = std::mem::take(&mut state.queue)
                .into_iter()
                .partition(|r| r.expired_at <= now);
            state.queue = live;
            expired
        }
    }
}

/// The task draining a store's queue. Dropped before the queue is empty
/// (its runtime shut down, or would not take it), it gives up the queued
/// releases, which no task would send, and clears the draining flag, so
/// that the next failed release starts another.
struct Draining {
    store: RedisStore,
    finished: bool,
}

impl Drop for Draining {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        let queue = {
            let mut state = self.store.inner.releases.lock();
            state.draining = false;
            std::mem::take(&mut state.queue)
        };
        // Outside the lock, as in `failed`.
        for retry in queue {
            retry.give_up(&self.store, "the runtime retrying it shut down");
        }
    }
}

impl RedisStore {
    /// Sends the release of lease `id` from the set `key` once more, and
    /// again after each failure, until it reaches Redis or `expired_at`
    /// passes. `error` is why the first attempt failed: the answer when no
    /// retry is possible (no tokio runtime here, the queue full, the
    /// runtime shutting down).
    pub(super) async fn retry_release(
        &self,
        key: String,
        id: String,
        undo: bool,
        expired_at: Instant,
        error: StoreError,
    ) -> Result<bool, StoreError> {
        let Ok(runtime) = Handle::try_current() else {
            return Err(error);
        };
        let (done, outcome) = oneshot::channel();
        let start = {
            let mut state = self.inner.releases.lock();
            if state.queue.len() >= CAPACITY {
                return Err(StoreError::Redis(format!(
                    "lease release failed and {CAPACITY} releases already wait for a retry: {error}"
                )));
            }
            state.queue.push_back(Retry {
                key,
                id,
                undo,
                expired_at,
                last_error: error.clone(),
                done,
            });
            !std::mem::replace(&mut state.draining, true)
        };
        // Outside the lock: a runtime shutting down drops the task here, at
        // once, and the drainer's drop takes the lock.
        if start {
            runtime.spawn(
                Draining {
                    store: self.clone(),
                    finished: false,
                }
                .drain(),
            );
        }
        outcome.await.unwrap_or(Err(error))
    }
}

impl Draining {
    /// Sends the queued releases in order until none is left: one at a
    /// time while they fail, waiting after each failure, and up to
    /// [`BURST`] at once while they land.
    async fn drain(mut self) {
        let store = self.store.clone();
        let retries = &store.inner.releases;
        let mut delay = FIRST_DELAY;
        let mut width = 1;
        loop {
            let group = retries.take(width);
            if group.is_empty() {
                break;
            }
            let sent = join_all(group.into_iter().map(|retry| store.send_retry(retry))).await;
            if sent.contains(&Sent::Failed) {
                width = 1;
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(MAX_DELAY);
            } else if sent.contains(&Sent::Reached) {
                width = BURST;
                delay = FIRST_DELAY;
            }
        }
        // `take` cleared the flag; a drainer started since then is not
        // this one's to clear.
        self.finished = true;
    }
}

/// How many releases the drainer sends at once while they land: enough
/// that a backlog clears in a few round trips once Redis is back, few
/// enough not to crowd out the decisions sharing the connection.
const BURST: usize = 16;

/// What became of one retry.
#[derive(Debug, PartialEq, Eq)]
enum Sent {
    /// Redis answered it (a release, or an error of its own).
    Reached,
    /// It failed on the way again, and is queued once more.
    Failed,
    /// Its lease had expired: not sent.
    Expired,
}

impl RedisStore {
    async fn send_retry(&self, mut retry: Retry) -> Sent {
        if Instant::now() >= retry.expired_at {
            retry.give_up(self, EXPIRED);
            return Sent::Expired;
        }
        match self.release_once(&retry.key, &retry.id, retry.undo).await {
            Err(Failure {
                error,
                transient: true,
            }) => {
                retry.last_error = error;
                for expired in self.inner.releases.failed(retry, Instant::now()) {
                    expired.give_up(self, EXPIRED);
                }
                Sent::Failed
            }
            Err(Failure { error, .. }) => {
                retry.last_error = error;
                retry.give_up(self, "Redis refused it");
                Sent::Reached
            }
            Ok(held) => {
                let _ = retry.done.send(Ok(held));
                Sent::Reached
            }
        }
    }
}

/// Runs `futures` together, each polled when woken; their outputs in order.
async fn join_all<F: Future>(futures: impl Iterator<Item = F>) -> Vec<F::Output> {
    let mut running: Vec<Option<Pin<Box<F>>>> = futures.map(|f| Some(Box::pin(f))).collect();
    let mut outputs: Vec<Option<F::Output>> = running.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (slot, output) in running.iter_mut().zip(outputs.iter_mut()) {
            if let Some(future) = slot {
                match future.as_mut().poll(cx) {
                    Poll::Ready(value) => {
                        *output = Some(value);
                        *slot = None;
                    }
                    Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    })
    .await;
    outputs.into_iter().flatten().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn retry(
        id: &str,
        expired_at: Instant,
    ) -> (Retry, oneshot::Receiver<Result<bool, StoreError>>) {
        let (done, outcome) = oneshot::channel();
        let retry = Retry {
            key: "k".into(),
            id: id.into(),
            undo: false,
            expired_at,
            last_error: StoreError::Redis("broken pipe".into()),
            done,
        };
        (retry, outcome)
    }

    #[test]
    fn a_failed_retry_goes_last_and_expired_ones_are_given_up() {
        let now = Instant::now();
        let retries = Retries::default();
        let (a, _a) = retry("a", now + Duration::from_secs(60));
        let (b, mut b_outcome) = retry("b", now + Duration::from_secs(1));
        let (c, _c) = retry("c", now + Duration::from_secs(60));
        retries.lock().queue.extend([b, c]);
        assert!(retries.failed(a, now).is_empty());
        let order: Vec<String> = retries.lock().queue.iter().map(|r| r.id.clone()).collect();
        assert_eq!(order, ["b", "c", "a"]);
        assert!(
            b_outcome.try_recv().is_err(),
            "given up before its lease expired"
        );

        let first = retries.next().unwrap();
        let expired: Vec<String> = retries
            .failed(first, now + Duration::from_secs(2))
            .into_iter()
            .map(|r| r.id)
            .collect();
        assert_eq!(expired, ["b"]);
        let order: Vec<String> = retries.lock().queue.iter().map(|r| r.id.clone()).collect();
        assert_eq!(order, ["c", "a"]);
        assert!(retries.next().is_some() && retries.next().is_some());
        assert!(retries.next().is_none());
        assert!(!retries.lock().draining);
    }

    /// A runtime shutting down drops a task spawned on it at once, on the
    /// spawning thread: the drainer's drop must not find the queue locked
    /// by that thread, and the release it would have sent is given up
    /// rather than left waiting for a task that never runs.
    #[test]
    fn a_runtime_shutting_down_gives_the_queued_release_up() {
        let live = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let store = live
            .block_on(RedisStore::builder("redis://127.0.0.1:1").lazy().connect())
            .unwrap();
        let dead = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let handle = dead.handle().clone();
        drop(dead);
        let (answered, answer) = std::sync::mpsc::channel();
        // On a thread of its own: were it to deadlock, the test fails
        // rather than hangs.
        std::thread::spawn(move || {
            let _entered = handle.enter();
            let release = store.retry_release(
                "k".into(),
                "a".into(),
                false,
                Instant::now() + Duration::from_secs(60),
                StoreError::Timeout(Duration::from_millis(1)),
            );
            let mut release = std::pin::pin!(release);
            let poll = release
                .as_mut()
                .poll(&mut std::task::Context::from_waker(std::task::Waker::noop()));
            let given_up = matches!(&poll, std::task::Poll::Ready(Err(StoreError::Redis(text)))
                if text.contains("shut down"));
            let state = store.inner.releases.lock();
            let cleared = state.queue.is_empty() && !state.draining;
            drop(state);
            let _ = answered.send((given_up && cleared, format!("{poll:?}, cleared: {cleared}")));
        });
        match answer.recv_timeout(Duration::from_secs(30)) {
            Ok((given_up, poll)) => assert!(given_up, "{poll}"),
            Err(_) => panic!("deadlocked: the drainer was dropped under the queue's lock"),
        }
    }
}
