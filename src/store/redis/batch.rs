//! GCRA calls that travel together.
//!
//! A store lets a few GCRA scripts be in flight on its connection at once
//! ([`RedisStoreBuilder::max_in_flight`](super::RedisStoreBuilder::max_in_flight)).
//! A call that finds them all taken waits in a queue; when a script comes
//! back, everything queued by then (up to
//! [`max_batch`](super::RedisStoreBuilder::max_batch) calls) goes in the
//! next script, one `EVALSHA` that decides each call in order at one
//! instant, as if they had reached Redis back to back. Below that many
//! calls in flight nothing waits and each call is its own script, so a
//! lightly loaded service pays nothing for this; under load Redis runs one
//! script (one `TIME`, one `GET` and one `SET` per identity) for many calls
//! instead of one each.
//!
//! A call takes its slot or its place in the queue when its future is
//! first polled, so a future made and never polled holds nothing and is
//! charged nothing. The queue is a mutex-guarded list. A script's slot is a
//! [`Permit`]: the call that sends alone holds it in its own future; a
//! batch holds it in a spawned task, because the calls it carries belong to
//! many callers and none of them may cancel it. Dropping a permit, however
//! its holder ends (answer, error, cancellation, panic), sends what has
//! queued meanwhile or frees the slot, so no slot is ever lost.

use std::collections::VecDeque;
use std::future::Future;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, Waker};

use redis::Value;
use tokio::sync::oneshot;

use super::RedisStore;
use crate::error::StoreError;
use crate::key::Key;
use crate::limit::Policy;

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
}

/// A call waiting for a script, with everything needed to write it into one.
#[derive(Debug)]
pub(super) struct Queued {
    policy: Policy,
    key: Key,
    cost: u64,
    max_wait_us: u64,
    answer: oneshot::Sender<Result<Answer, StoreError>>,
}

/// One call's part of a batch's reply.
#[derive(Debug)]
pub(super) struct Answer {
    /// The call's own reply, as a script of one call would have given it.
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
    Wait(oneshot::Receiver<Result<Answer, StoreError>>),
}

/// One of the store's script slots, held while its script is in flight.
pub(super) struct Permit {
    store: RedisStore,
    /// Whether dropping the permit gives the slot back; not once `leave`
    /// has handed the slot on itself.
    armed: bool,
}

impl Permit {
    fn new(store: &RedisStore) -> Self {
        Permit {
            store: store.clone(),
            armed: true,
        }
    }

    /// Lets go of the permit without giving its slot back: the caller
    /// keeps the slot.
    fn disarm(mut self) {
        self.armed = false;
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

    /// Takes a slot for the call, or queues it.
    pub(super) fn enter(
        &self,
        store: &RedisStore,
        policy: &Policy,
        key: &Key,
        cost: u64,
        max_wait_us: u64,
    ) -> Entry {
        let mut state = self.state();
        if state.in_flight < self.max_in_flight {
            state.in_flight += 1;
            return Entry::Send(Permit::new(store));
        }
        let (answer, receiver) = oneshot::channel();
        state.queue.push_back(Queued {
            policy: policy.clone(),
            key: key.clone(),
            cost,
            max_wait_us,
            answer,
        });
        Entry::Wait(receiver)
    }

    /// A slot came back: the queued calls whose callers still wait (up to
    /// `max_batch`) keep it and leave together; with none, it is freed.
    ///
    /// The batch's script is written to the connection here, under the
    /// lock (one poll of the exchange, which queues the command on the
    /// multiplexed connection), and only the wait for the reply goes to a
    /// spawned task: so batches reach Redis in the order their calls were
    /// queued, which is the order their callers first polled, and a waiting
    /// (reserve-mode) call never loses its place to a later one.
    fn leave(&self, store: &RedisStore) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            // Dropped outside any runtime (a caller's future dropped by a
            // plain thread): nothing can be sent from here. The queued
            // calls are told so, and the slot is freed.
            let mut state = self.state();
            let error = StoreError::Redis("no tokio runtime to send queued calls".into());
            for call in state.queue.drain(..) {
                let _ = call.answer.send(Err(error.clone()));
            }
            state.in_flight -= 1;
            return;
        };
        // One batch after another while each is answered at once (a closed
        // connection, Redis refusing): in a loop, not through each permit's
        // drop, so that a long queue does not grow the stack.
        loop {
            // Declared before the lock is taken, so that were the first poll
            // below to panic, the lock is released before the permit's drop
            // takes it again.
            let permit;
            let mut state = self.state();
            let mut batch = Vec::new();
            while batch.len() < self.max_batch {
                let Some(call) = state.queue.pop_front() else {
                    break;
                };
                if !call.answer.is_closed() {
                    batch.push(call);
                }
            }
            if batch.is_empty() {
                state.in_flight -= 1;
                return;
            }
            // The slot passes to the batch.
            permit = Permit::new(store);
            let mut sending = Box::pin(send(store.clone(), batch));
            let written = sending
                .as_mut()
                .poll(&mut Context::from_waker(Waker::noop()));
            drop(state);
            match written {
                // Answered at once: the slot goes on to the next batch.
                Poll::Ready(()) => permit.disarm(),
                Poll::Pending => {
                    runtime.spawn(async move {
                        sending.await;
                        drop(permit);
                    });
                    return;
                }
            }
        }
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        if let Some(batcher) = &self.store.inner.batcher {
            batcher.leave(&self.store);
        }
    }
}

/// Sends one batch and hands each caller its answer. A reply that is an
/// error for one call (its key holds another type) fails that call only.
async fn send(store: RedisStore, batch: Vec<Queued>) {
    let (cmd, sent_at) = store.gcra_script(
        batch
            .iter()
            .map(|c| (&c.policy, &c.key, c.cost, c.max_wait_us)),
    );
    let script = &store.inner.gcra;
    let replies = match store.exchange(script, cmd).await {
        Ok(Value::Array(replies)) if replies.len() == batch.len() => Ok(replies),
        Ok(other) => Err(StoreError::UnexpectedReply(format!("{other:?}"))),
        Err(err) => Err(err),
    };
    match replies {
        Ok(replies) => {
            for (call, reply) in batch.into_iter().zip(replies) {
                let _ = call.answer.send(Ok(Answer { reply, sent_at }));
            }
        }
        Err(err) => {
            // One failure per call still waiting: a caller that gave up
            // first has counted its own timeout.
            for call in batch {
                if !call.answer.is_closed() {
                    script.metrics.failed(&err);
                }
                let _ = call.answer.send(Err(err.clone()));
            }
        }
    }
}
