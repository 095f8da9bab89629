//! Calls that travel together.
//!
//! A store lets a few scripts be in flight on its connection at once
//! ([`RedisStoreBuilder::max_in_flight`](super::RedisStoreBuilder::max_in_flight)).
//! A check (GCRA or a window algorithm), lease acquire or lease release
//! that finds them all taken (or earlier calls still queued) joins a
//! queue, and the queue goes at the end
//! of the runtime's current turn: a task spawned by the first call queued
//! yields once, so that every task ready to run makes its calls first, and
//! then sends everything queued (up to
//! [`max_batch`](super::RedisStoreBuilder::max_batch) calls a script, the
//! checks of one algorithm, or leases, to a script) in one `EVALSHA` that
//! decides each call in order, as if they had reached Redis back to back:
//! a release queued before an acquire frees its slot for it. Below that
//! many calls in flight nothing waits and each call is its own script, so
//! a lightly loaded service pays nothing for this; under load Redis runs
//! one script for many calls instead of one each (and one `TIME` for them
//! all; for GCRA also each policy's limits sent once, and one `GET` and
//! one `SET` per identity). A concurrency-limited request, whose acquire
//! and release each used to be a script of its own, so costs well under
//! one script. Renewals, rare, always go alone.
//!
//! Queued calls wait for the end of the turn, never for a script in flight
//! to come back: waiting for a free slot, as this once did, made batches
//! larger but held every queued call for up to a round trip more, and
//! under load left Redis and the client idle in turn (benches/decisions.rs:
//! 0.9-1.0x the plain `EVALSHA` loop at 16 and 64 in flight before, 1.2-1.7x
//! after, in the same run).
//!
//! A call takes its slot or its place in the queue when its future is
//! first polled, so a future made and never polled holds nothing and is
//! charged nothing. The queue is a mutex-guarded list. A script's slot is a
//! [`Permit`]: the call that sends alone holds it in its own future; a
//! batch holds it in a spawned task, because the calls it carries belong to
//! many callers and none of them may cancel it. Dropping a permit, however
//! its holder ends (answer, error, cancellation, panic), frees the slot.

use std::collections::VecDeque;
use std::future::Future;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, Waker};

use redis::Value;
use tokio::sync::oneshot;

use super::{Failure, RedisStore, split_replies};
use crate::algorithm::Algorithm;
use crate::error::StoreError;
use crate::key::Key;
use crate::policy::Policy;

/// The queue and the count of scripts in flight of one store.
#[derive(Debug)]
pub(super) struct Batcher {
    state: Mutex<State>,
    max_in_flight: usize,
    max_batch: usize,
}

#[derive(Debug, Default)]
struct State {
    in_flight: usize,
    queue: VecDeque<Queued>,
    /// A task is on its way to send the queue at the end of the runtime's
    /// current turn.
    flush_scheduled: bool,
}

/// A call waiting for a script, with everything needed to write it into one.
#[derive(Debug)]
pub(super) struct Queued {
    job: Job,
    answer: oneshot::Sender<Result<Answer, Failure>>,
}

/// What a queued call asks of Redis.
#[derive(Debug)]
pub(super) enum Job {
    /// A check of GCRA or a window algorithm, decided by that algorithm's
    /// check script.
    Check {
        algorithm: Algorithm,
        policy: Policy,
        key: Key,
        cost: u64,
        max_wait_us: u64,
    },
    /// A lease acquire or release, by `lua/lease.lua`'s batch.
    Lease(LeaseJob),
}

/// A lease operation, as `lua/lease.lua`'s batch takes it.
#[derive(Debug, Clone)]
pub(super) enum LeaseJob {
    /// `acquire`'s arguments: the set, capacity, TTL in µs, lease id and
    /// wait in whole milliseconds ("" for none).
    Acquire {
        set: String,
        capacity: u64,
        ttl_us: u64,
        id: String,
        wait_ms: String,
    },
    /// `release`'s: the set, the lease id, and whether it is an undo
    /// ([`LeaseCall::undo`](crate::store::LeaseCall)), which leaves a
    /// tombstone if it finds no lease.
    Release { set: String, id: String, undo: bool },
}

impl LeaseJob {
    pub(super) fn set(&self) -> &str {
        match self {
            LeaseJob::Acquire { set, .. } | LeaseJob::Release { set, .. } => set,
        }
    }
}

/// Which script decides a job: jobs of one kind share a script.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Check(Algorithm),
    Lease,
}

impl Job {
    fn kind(&self) -> Kind {
        match self {
            Job::Check { algorithm, .. } => Kind::Check(*algorithm),
            Job::Lease(_) => Kind::Lease,
        }
    }
}

/// One call's part of a batch's reply.
#[derive(Debug)]
pub(super) struct Answer {
    /// The call's own reply, as a script of one call would have given it
    /// (undecoded: the caller knows its algorithm's shape).
    pub(super) reply: Value,
    /// The instant the batch was sent, on the deny cache's clock (see
    /// `RedisStore::sent_at`).
    pub(super) sent_at: Option<u64>,
}

/// What a call does: send its own script now, or wait for a batch.
pub(super) enum Entry {
    /// A slot was free: send alone, holding the slot until the answer.
    Send(Permit),
    /// Every slot is taken: the answer comes from a batch.
    Wait(oneshot::Receiver<Result<Answer, Failure>>),
}

/// One of the store's script slots, held while its script is in flight.
pub(super) struct Permit {
    store: RedisStore,
}

impl Permit {
    fn new(store: &RedisStore) -> Self {
        Permit {
            store: store.clone(),
        }
    }
}

impl Batcher {
    /// Both at least 1 (the builder's check refuses zero).
    pub(super) fn new(max_in_flight: usize, max_batch: usize) -> Self {
        Batcher {
            state: Mutex::default(),
            max_in_flight,
            max_batch,
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // The lock is held across nothing but the queue's own updates and
        // the first poll of a batch's exchange; were that to panic, the
        // counts inside are still whole.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Takes a slot for the call, or queues the job `job` makes.
    pub(super) fn enter(&self, store: &RedisStore, job: impl FnOnce() -> Job) -> Entry {
        let mut state = self.state();
        // A free slot and no earlier call waiting to go first; or no
        // runtime to send a batch from (a future polled outside tokio),
        // where the call goes alone as it can.
        let runtime = tokio::runtime::Handle::try_current();
        if (state.in_flight < self.max_in_flight && state.queue.is_empty()) || runtime.is_err() {
            state.in_flight += 1;
            return Entry::Send(Permit::new(store));
        }
        let (answer, receiver) = oneshot::channel();
        state.queue.push_back(Queued { job: job(), answer });
        if !state.flush_scheduled
            && let Ok(runtime) = runtime
        {
            state.flush_scheduled = true;
            let flusher = Flusher(Some(store.clone()));
            runtime.spawn(async move {
                // Behind every task ready to run now, so that the calls
                // they make meanwhile go in the same script.
                tokio::task::yield_now().await;
                flusher.flush();
            });
        }
        Entry::Wait(receiver)
    }

    /// Sends every call queued whose caller still waits, in scripts of up
    /// to `max_batch` calls of one kind (the checks of one algorithm, or
    /// leases), each taking a slot without waiting for one.
    ///
    /// Each script is written to the connection here, under the lock (one
    /// poll of the exchange, which queues the command on the multiplexed
    /// connection), and only the wait for the reply goes to a spawned task:
    /// so the calls of one algorithm reach Redis in the order they were
    /// queued, which is the order their callers first polled, and a waiting
    /// (reserve-mode) call never loses its place to a later one.
    fn flush(&self, store: &RedisStore) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            // Called from a task on a runtime, so never here; were it, the
            // queued calls' own timeouts end them.
            self.state().flush_scheduled = false;
            return;
        };
        // One script after another, in a loop rather than through each
        // permit's drop, so that a long queue does not grow the stack.
        loop {
            // Declared before the lock is taken, so that were the first poll
            // below to panic, the lock is released before the permit's drop
            // takes it again.
            let permit;
            let mut state = self.state();
            // The first waiting call's kind, and every call queued of that
            // kind, in order: one script decides one algorithm, or leases.
            // Calls of other kinds keep their places (their keys are their
            // own, so the order between kinds decides nothing).
            let mut batch: Vec<Queued> = Vec::new();
            let mut i = 0;
            while i < state.queue.len() && batch.len() < self.max_batch {
                let call = &state.queue[i];
                if call.answer.is_closed() {
                    state.queue.remove(i);
                } else if batch
                    .first()
                    .is_some_and(|first| first.job.kind() != call.job.kind())
                {
                    i += 1;
                } else if let Some(call) = state.queue.remove(i) {
                    batch.push(call);
                }
            }
            if batch.is_empty() {
                state.flush_scheduled = false;
                return;
            }
            state.in_flight += 1;
            permit = Permit::new(store);
            let mut sending = Box::pin(send(store.clone(), batch));
            let written = sending
                .as_mut()
                .poll(&mut Context::from_waker(Waker::noop()));
            drop(state);
            match written {
                Poll::Ready(()) => drop(permit),
                Poll::Pending => {
                    runtime.spawn(async move {
                        sending.await;
                        drop(permit);
                    });
                }
            }
        }
    }

    /// A script came back (or its caller gave up): its slot is free.
    fn leave(&self) {
        self.state().in_flight -= 1;
    }
}

/// The task that sends the queue, which, were it dropped unrun (its runtime
/// shutting down), lets the next call queued schedule another.
struct Flusher(Option<RedisStore>);

impl Flusher {
    fn flush(mut self) {
        if let Some(store) = self.0.take()
            && let Some(batcher) = &store.inner.batcher
        {
            batcher.flush(&store);
        }
    }
}

impl Drop for Flusher {
    fn drop(&mut self) {
        if let Some(store) = &self.0
            && let Some(batcher) = &store.inner.batcher
        {
            batcher.state().flush_scheduled = false;
        }
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        if let Some(batcher) = &self.store.inner.batcher {
            batcher.leave();
        }
    }
}

/// Sends one batch and hands each caller its answer. A reply that is an
/// error for one call (its key holds another type) fails that call only.
async fn send(store: RedisStore, batch: Vec<Queued>) {
    let Some(kind) = batch.first().map(|call| call.job.kind()) else {
        return;
    };
    let (script, cmd, sent_at) = match kind {
        Kind::Check(algorithm) => {
            let checks = batch.iter().filter_map(|call| match &call.job {
                Job::Check {
                    policy,
                    key,
                    cost,
                    max_wait_us,
                    ..
                } => Some((policy, key, *cost, *max_wait_us)),
                Job::Lease(_) => None,
            });
            let (cmd, sent_at) = store.check_call(algorithm, checks);
            (store.check_script(algorithm), cmd, sent_at)
        }
        Kind::Lease => {
            let leases = batch.iter().filter_map(|call| match &call.job {
                Job::Lease(job) => Some(job),
                Job::Check { .. } => None,
            });
            (&store.inner.scripts.leases, store.lease_batch(leases), None)
        }
    };
    let replies = store.try_exchange(script, cmd).await.and_then(|reply| {
        let replies = match kind {
            Kind::Check(algorithm) => split_replies(algorithm, reply, batch.len()),
            Kind::Lease => split_lease_replies(reply, batch.len()),
        };
        replies.map_err(|error| Failure {
            error,
            transient: false,
        })
    });
    match replies {
        Ok(replies) => {
            for (call, reply) in batch.into_iter().zip(replies) {
                let _ = call.answer.send(Ok(Answer { reply, sent_at }));
            }
        }
        Err(failure) => {
            // Each caller still waiting counts the failure as its own; one
            // that gave up first has counted its timeout.
            for call in batch {
                let _ = call.answer.send(Err(failure.clone()));
            }
        }
    }
}

/// A lease batch's reply: one item per operation.
fn split_lease_replies(reply: Value, count: usize) -> Result<Vec<Value>, StoreError> {
    match reply {
        Value::Array(items) if items.len() == count => Ok(items),
        other => Err(StoreError::UnexpectedReply(format!("{other:?}"))),
    }
}
