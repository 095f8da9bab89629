//! Waiting for a slot: a bounded queue of the callers a concurrency limit
//! refused, woken by releases.

use std::collections::VecDeque;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use crate::error::ConfigError;
use crate::key::Key;
use crate::metrics::LimitMetrics;
pub use crate::observe::QueueState;

/// The longest queue a [`WaitQueue`] takes.
const MOST_WAITING: usize = 100_000;
/// The longest wait a [`WaitQueue`] takes.
const LONGEST_WAIT: Duration = Duration::from_secs(3600);

/// Which queued caller a freed slot goes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QueueOrder {
    /// The one that has waited longest: fair while the queue drains.
    Fifo,
    /// The one that arrived last: under overload, the callers that waited
    /// longest are those most likely to have given up already, and a full
    /// queue makes room by refusing its oldest caller rather than the new
    /// one.
    Lifo,
}

/// Lets a call that finds every slot taken wait for one, up to a bound:
/// at most `max_len` callers wait (per limiter and process), each at most
/// `max_wait`. Given to
/// [`ConcurrencyLimiter::queue`](super::ConcurrencyLimiter::queue).
///
/// A caller waits until a slot frees up; it then tries again, first in
/// the queue's [order](QueueOrder). A slot frees when a lease of the same
/// key is released by this process (woken at once), by another instance
/// sharing a Redis store (woken by a message Redis publishes: a refused
/// acquire that waits marks the lease set for as long as it may wait, and a
/// release of a marked set is published), or when the oldest lease
/// expires; an adaptive limit that rises wakes as many callers as it
/// rose by. Nothing polls. A caller still waiting at `max_wait` is
/// refused as if there had been no queue (the layer's status and
/// `Retry-After`); one that finds the queue full is refused at once
/// (FIFO), or takes the place of the oldest caller, which is refused
/// (LIFO). A caller whose request is dropped leaves the queue at once.
///
/// A newcomer that finds a slot free takes it even while callers wait
/// (one is then on its way to a slot released an instant ago): the order
/// is the order callers are woken in, not a promise about newcomers.
///
/// ```
/// use std::time::Duration;
/// use fleetgate::concurrency::{QueueOrder, WaitQueue};
///
/// let queue = WaitQueue::lifo(16, Duration::from_millis(50))?;
/// assert_eq!(queue.order(), QueueOrder::Lifo);
/// assert!(WaitQueue::fifo(0, Duration::from_secs(1)).is_err());
/// # Ok::<(), fleetgate::ConfigError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct WaitQueue {
    order: QueueOrder,
    max_len: usize,
    max_wait: Duration,
}

impl WaitQueue {
    /// A first-in, first-out queue of at most `max_len` callers (1 to
    /// 100,000), each waiting at most `max_wait` (1 ms to 1 hour).
    pub fn fifo(max_len: usize, max_wait: Duration) -> Result<Self, ConfigError> {
        WaitQueue::new(QueueOrder::Fifo, max_len, max_wait)
    }

    /// A last-in, first-out queue, as [`fifo`](Self::fifo) otherwise.
    pub fn lifo(max_len: usize, max_wait: Duration) -> Result<Self, ConfigError> {
        WaitQueue::new(QueueOrder::Lifo, max_len, max_wait)
    }

    fn new(order: QueueOrder, max_len: usize, max_wait: Duration) -> Result<Self, ConfigError> {
        if !(1..=MOST_WAITING).contains(&max_len) {
            return Err(ConfigError::WaitQueue {
                detail: format!("max_len {max_len} is outside 1 ..= {MOST_WAITING}"),
            });
        }
        if !(Duration::from_millis(1)..=LONGEST_WAIT).contains(&max_wait) {
            return Err(ConfigError::WaitQueue {
                detail: format!("max_wait {max_wait:?} is outside 1 ms ..= 1 hour"),
            });
        }
        Ok(WaitQueue {
            order,
            max_len,
            max_wait,
        })
    }

    /// The order.
    pub fn order(&self) -> QueueOrder {
        self.order
    }

    /// How many callers may wait at once.
    pub fn max_len(&self) -> usize {
        self.max_len
    }

    /// How long a caller waits at most.
    pub fn max_wait(&self) -> Duration {
        self.max_wait
    }
}

/// The callers waiting for a slot of one limiter.
pub(crate) struct Waiters {
    config: WaitQueue,
    list: Mutex<List>,
    admitted: AtomicU64,
    timed_out: AtomicU64,
    overflowed: AtomicU64,
    waited_us: AtomicU64,
    metrics: LimitMetrics,
}

#[derive(Default)]
struct List {
    next: u64,
    /// In order of arrival.
    entries: VecDeque<Entry>,
}

struct Entry {
    id: u64,
    key: Key,
    state: Wake,
    waker: Option<Waker>,
}

/// What a queued caller has been told.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Wake {
    /// Nothing yet.
    Waiting,
    /// A slot may be free: try again.
    Retry,
    /// Refused to make room for a newer caller (LIFO, full).
    Displaced,
}

impl Waiters {
    pub(crate) fn new(config: WaitQueue, metrics: LimitMetrics) -> Arc<Self> {
        Arc::new(Waiters {
            config,
            list: Mutex::default(),
            admitted: AtomicU64::new(0),
            timed_out: AtomicU64::new(0),
            overflowed: AtomicU64::new(0),
            waited_us: AtomicU64::new(0),
            metrics,
        })
    }

    pub(crate) fn config(&self) -> &WaitQueue {
        &self.config
    }

    fn lock(&self) -> MutexGuard<'_, List> {
        self.list.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues a caller for `key`; `None` when it is refused (FIFO, full).
    pub(crate) fn enter(self: &Arc<Self>, key: &Key) -> Option<Ticket> {
        let mut list = self.lock();
        if list.entries.len() >= self.config.max_len {
            match self.config.order {
                QueueOrder::Fifo => {
                    drop(list);
                    self.overflowed();
                    return None;
                }
                QueueOrder::Lifo => {
                    // The oldest caller not yet told to go.
                    if let Some(oldest) =
                        list.entries.iter_mut().find(|e| e.state != Wake::Displaced)
                    {
                        oldest.state = Wake::Displaced;
                        if let Some(waker) = oldest.waker.take() {
                            waker.wake();
                        }
                        self.overflowed();
                    }
                }
            }
        }
        let id = list.next;
        list.next += 1;
        list.entries.push_back(Entry {
            id,
            key: key.clone(),
            state: Wake::Waiting,
            waker: None,
        });
        drop(list);
        self.metrics.queue_waiting(1.0);
        Some(Ticket {
            waiters: self.clone(),
            id,
        })
    }

    fn overflowed(&self) {
        self.overflowed.fetch_add(1, Ordering::Relaxed);
        self.metrics.queue_left("overflowed", None);
    }

    /// A lease of `key` was released: wakes its first waiting caller.
    pub(crate) fn released(&self, key: &Key) {
        let mut list = self.lock();
        if list.entries.is_empty() {
            return;
        }
        self.wake(&mut list, Some(key), 1);
    }

    /// The limit rose by `n`: wakes the first `n` waiting callers.
    pub(crate) fn raised(&self, n: u64) {
        let mut list = self.lock();
        self.wake(&mut list, None, n);
    }

    /// Wakes up to `n` callers still waiting, of `key` or any, in order.
    fn wake(&self, list: &mut List, key: Option<&Key>, n: u64) {
        let mut left = n;
        let mut visit = |entry: &mut Entry| {
            if left == 0 || entry.state != Wake::Waiting || key.is_some_and(|k| *k != entry.key) {
                return;
            }
            entry.state = Wake::Retry;
            if let Some(waker) = entry.waker.take() {
                waker.wake();
            }
            left -= 1;
        };
        match self.config.order {
            QueueOrder::Fifo => list.entries.iter_mut().for_each(&mut visit),
            QueueOrder::Lifo => list.entries.iter_mut().rev().for_each(&mut visit),
        }
    }

    /// Callers waiting now.
    pub(crate) fn len(&self) -> usize {
        self.lock().entries.len()
    }

    pub(crate) fn state(&self) -> QueueState {
        QueueState {
            waiting: self.len(),
            admitted: self.admitted.load(Ordering::Relaxed),
            timed_out: self.timed_out.load(Ordering::Relaxed),
            overflowed: self.overflowed.load(Ordering::Relaxed),
            waited_us: self.waited_us.load(Ordering::Relaxed),
        }
    }
}

impl fmt::Debug for Waiters {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Waiters")
            .field("config", &self.config)
            .field("waiting", &self.len())
            .finish()
    }
}

/// A queued caller's place; dropped, it leaves the queue.
pub(crate) struct Ticket {
    waiters: Arc<Waiters>,
    id: u64,
}

impl Ticket {
    /// Ready once the caller has been told something: [`Wake::Retry`]
    /// (consumed: the caller waits again after) or [`Wake::Displaced`].
    pub(crate) fn poll_wake(&self, cx: &mut Context<'_>) -> Poll<Wake> {
        let mut list = self.waiters.lock();
        let Some(entry) = list.entries.iter_mut().find(|e| e.id == self.id) else {
            return Poll::Ready(Wake::Displaced);
        };
        match entry.state {
            Wake::Waiting => {
                entry.waker = Some(cx.waker().clone());
                Poll::Pending
            }
            Wake::Retry => {
                entry.state = Wake::Waiting;
                Poll::Ready(Wake::Retry)
            }
            Wake::Displaced => Poll::Ready(Wake::Displaced),
        }
    }

    /// The caller got a slot after waiting `waited`.
    pub(crate) fn admitted(&self, waited: Duration) {
        let w = &self.waiters;
        w.admitted.fetch_add(1, Ordering::Relaxed);
        let us = u64::try_from(waited.as_micros()).unwrap_or(u64::MAX);
        w.waited_us.fetch_add(us, Ordering::Relaxed);
        w.metrics.queue_left("admitted", Some(waited));
    }

    /// The caller waited the longest wait.
    pub(crate) fn timed_out(&self) {
        self.waiters.timed_out.fetch_add(1, Ordering::Relaxed);
        self.waiters.metrics.queue_left("timed_out", None);
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let waiters = &self.waiters;
        let mut list = waiters.lock();
        let Some(at) = list.entries.iter().position(|e| e.id == self.id) else {
            return;
        };
        let Some(entry) = list.entries.remove(at) else {
            return;
        };
        waiters.metrics.queue_waiting(-1.0);
        // Told to try a slot it will not take: the next caller of its key
        // may take it instead.
        if entry.state == Wake::Retry {
            waiters.wake(&mut list, Some(&entry.key), 1);
        }
    }
}

impl fmt::Debug for Ticket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ticket").field("id", &self.id).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn woken(ticket: &Ticket) -> Option<Wake> {
        let mut cx = Context::from_waker(Waker::noop());
        match ticket.poll_wake(&mut cx) {
            Poll::Ready(wake) => Some(wake),
            Poll::Pending => None,
        }
    }

    fn queue(order: QueueOrder, len: usize) -> Arc<Waiters> {
        let config = WaitQueue::new(order, len, Duration::from_secs(1)).unwrap();
        Waiters::new(config, LimitMetrics::new(Arc::from("test")))
    }

    #[test]
    fn a_release_wakes_the_first_caller_of_its_key_in_order() {
        for (order, first, second) in [(QueueOrder::Fifo, 0, 2), (QueueOrder::Lifo, 2, 0)] {
            let waiters = queue(order, 8);
            let (a, b) = (Key::new("a"), Key::new("b"));
            let mut tickets = vec![
                Some(waiters.enter(&a).unwrap()),
                Some(waiters.enter(&b).unwrap()),
                Some(waiters.enter(&a).unwrap()),
            ];
            let told = |tickets: &[Option<Ticket>]| -> Vec<Option<Wake>> {
                tickets.iter().map(|t| t.as_ref().and_then(woken)).collect()
            };
            assert_eq!(told(&tickets), [None, None, None]);
            waiters.released(&a);
            let mut want = vec![None; 3];
            want[first] = Some(Wake::Retry);
            assert_eq!(told(&tickets), want, "{order:?}");
            // That caller took the slot; the next release goes to the other
            // caller of `a`.
            tickets[first] = None;
            waiters.released(&a);
            let mut want = vec![None; 3];
            want[second] = Some(Wake::Retry);
            assert_eq!(told(&tickets), want, "{order:?}");
        }
    }

    #[test]
    fn a_full_queue_refuses_newcomers_fifo_and_displaces_the_oldest_lifo() {
        let fifo = queue(QueueOrder::Fifo, 2);
        let key = Key::new("k");
        let _held = [fifo.enter(&key).unwrap(), fifo.enter(&key).unwrap()];
        assert!(fifo.enter(&key).is_none());
        assert_eq!(fifo.state().overflowed, 1);

        let lifo = queue(QueueOrder::Lifo, 2);
        let old = lifo.enter(&key).unwrap();
        let mid = lifo.enter(&key).unwrap();
        let new = lifo.enter(&key).unwrap();
        assert_eq!(woken(&old), Some(Wake::Displaced));
        assert_eq!(woken(&mid), None);
        assert_eq!(woken(&new), None);
        drop(old);
        assert_eq!(lifo.len(), 2);
        assert_eq!(lifo.state().overflowed, 1);
    }

    #[test]
    fn a_dropped_caller_leaves_at_once_and_passes_on_an_unused_wake() {
        let waiters = queue(QueueOrder::Fifo, 8);
        let key = Key::new("k");
        let first = waiters.enter(&key).unwrap();
        let second = waiters.enter(&key).unwrap();
        waiters.released(&key);
        drop(first);
        assert_eq!(waiters.len(), 1);
        assert_eq!(woken(&second), Some(Wake::Retry));
    }

    #[test]
    fn a_rise_wakes_that_many_callers_of_any_key() {
        let waiters = queue(QueueOrder::Fifo, 8);
        let tickets: Vec<_> = (0..4)
            .map(|i| waiters.enter(&Key::new(format!("k{i}"))).unwrap())
            .collect();
        waiters.raised(2);
        let told: Vec<_> = tickets.iter().map(woken).collect();
        assert_eq!(told, [Some(Wake::Retry), Some(Wake::Retry), None, None]);
    }

    #[test]
    fn bounds_are_checked() {
        assert!(WaitQueue::lifo(100_001, Duration::from_secs(1)).is_err());
        assert!(WaitQueue::fifo(1, Duration::ZERO).is_err());
        assert!(WaitQueue::fifo(1, Duration::from_secs(3601)).is_err());
        assert!(WaitQueue::fifo(100_000, Duration::from_secs(3600)).is_ok());
    }
}
