//! The wait queue of `ConcurrencyLimitLayer` (`ConcurrencyLimiter::queue`)
//! through a real axum router on the memory store, mostly on paused tokio
//! time: FIFO and LIFO hand freed slots out in their order; a caller that
//! waits out `max_wait` gets the layer's refusal and `Retry-After`, no
//! sooner; a full queue refuses the newcomer at once (FIFO) or displaces
//! its oldest caller (LIFO); a dropped waiter leaves at once and a wake
//! meant for it goes to the next; an adaptive limit queues too, and a
//! rise of the limit wakes as many waiters as it rose by; a panicking
//! handler and a dropped response body hand their slot to a waiter. Last,
//! many tasks on the multi-thread runtime never get more calls inside the
//! handler than the limit (fixed and adaptive), and leave nothing held.
//!
//! Events are ordered by signals: each request carries a [`Script`] (its
//! name, a oneshot that lets its handler answer, and how to answer), the
//! handler reports on a channel when it starts, and a call is polled once
//! by hand before it is spawned, so that once [`Caller::start`] returns
//! the call has been admitted, queued or refused. A wake is told from a
//! timer by the paused clock: a caller let in by a release must come in
//! without the clock moving.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::Extension;
use axum::routing::get;
use fleetgate::concurrency::{
    AdaptiveLimit, Admission, ConcurrencyLimitLayer, ConcurrencyLimiter, ConcurrencyPolicy,
    QueueState, WaitQueue,
};
use fleetgate::key::GlobalKey;
use fleetgate::{Key, MemoryStore};
use http::header::RETRY_AFTER;
use http::{Request, Response, StatusCode};
use http_body_util::BodyExt;
use tokio::sync::{mpsc, oneshot};
use tokio::task::{JoinError, JoinHandle, JoinSet};
use tokio::time::Instant;
use tower::ServiceExt;

use crate::handlers::{EndlessBody, InFlight, quiet_deliberate_panics};

// ---------------------------------------------------------------------------
// Helpers.

/// What a handler does once let go.
#[derive(Clone, Copy, Debug)]
enum Then {
    /// Answers 200 with its caller's name.
    Answer,
    /// Panics (deliberately).
    Panic,
    /// Answers 200 with a body that never ends.
    Stream,
}

/// One request's script, in an extension (extensions are `Clone`).
#[derive(Clone)]
struct Script(Arc<Mutex<Option<Plan>>>);

struct Plan {
    name: &'static str,
    let_go: oneshot::Receiver<()>,
    then: Then,
}

/// A request for `/` that the handler runs as `then` says, once let go
/// through the returned sender.
fn scripted(name: &'static str, then: Then) -> (Request<Body>, oneshot::Sender<()>) {
    let (let_go, rx) = oneshot::channel();
    let mut req = Request::get("/").body(Body::empty()).unwrap();
    req.extensions_mut()
        .insert(Script(Arc::new(Mutex::new(Some(Plan {
            name,
            let_go: rx,
            then,
        })))));
    (req, let_go)
}

/// A router whose `/` handler reports its caller's name on `entered`,
/// waits to be let go, then does what the request's script says; behind
/// `layer`.
fn app(
    layer: ConcurrencyLimitLayer<GlobalKey>,
    entered: mpsc::UnboundedSender<&'static str>,
) -> Router {
    let handler = move |Extension(script): Extension<Script>| {
        let entered = entered.clone();
        async move {
            let plan = script
                .0
                .lock()
                .unwrap()
                .take()
                .expect("one call per script");
            let _ = entered.send(plan.name);
            let _ = plan.let_go.await;
            match plan.then {
                Then::Answer => Response::new(Body::from(plan.name)),
                Then::Panic => panic!("deliberate panic in a handler"),
                Then::Stream => Response::new(Body::new(EndlessBody(None))),
            }
        }
    };
    Router::new().route("/", get(handler)).route_layer(layer)
}

/// A fixed limit of `max` with `queue`, on the memory store on tokio's
/// (paused) clock; leases live 30 s.
fn fixed(name: &str, max: u64, queue: WaitQueue) -> ConcurrencyLimiter {
    let policy = ConcurrencyPolicy::builder(name, max)
        .lease_ttl(Duration::from_secs(30))
        .build()
        .unwrap();
    ConcurrencyLimiter::new(policy, crate::paused_memory_store()).queue(queue)
}

/// The limiter's layer, one key for every request.
fn layer(limiter: &ConcurrencyLimiter) -> ConcurrencyLimitLayer<GlobalKey> {
    ConcurrencyLimitLayer::new(limiter.clone()).key(GlobalKey::new())
}

fn queue(limiter: &ConcurrencyLimiter) -> QueueState {
    limiter.queue_state().expect("the limiter has a queue")
}

/// What a caller got.
#[derive(Debug)]
struct Outcome {
    status: StatusCode,
    retry_after: Option<String>,
    body: String,
    /// When the response (its head) came.
    at: Instant,
}

impl Outcome {
    /// Reads `response` to its end (releasing its slot, if it held one).
    async fn of(response: Response<Body>) -> Outcome {
        let at = Instant::now();
        let status = response.status();
        let retry_after = response
            .headers()
            .get(RETRY_AFTER)
            .map(|v| v.to_str().unwrap().to_owned());
        let body = response.into_body().collect().await.unwrap().to_bytes();
        Outcome {
            status,
            retry_after,
            body: String::from_utf8(body.to_vec()).unwrap(),
            at,
        }
    }

    /// Asserts a refusal with `status` and `Retry-After: retry_after`.
    fn assert_refused(&self, status: StatusCode, retry_after: &str) {
        assert_eq!(self.status, status, "{self:?}");
        assert_eq!(self.retry_after.as_deref(), Some(retry_after), "{self:?}");
    }
}

/// Polls `fut` once, with a waker that does nothing: whatever it does
/// without waiting (take a slot and start the handler, join the queue, be
/// refused) it has done when this returns. The task that polls it next
/// registers its own waker.
fn poll_once<F: Future + Unpin>(fut: &mut F) -> Poll<F::Output> {
    Pin::new(fut).poll(&mut Context::from_waker(Waker::noop()))
}

type Call = Pin<Box<dyn Future<Output = Outcome> + Send>>;

/// Where a started call is.
enum State {
    /// Answered at its first poll (refused at once).
    Decided(Outcome),
    /// Polled once, kept here unspawned: dropping it drops the request.
    Held(Call),
    /// On its own task.
    Spawned(JoinHandle<Outcome>),
}

/// A request on its way through the router.
struct Caller {
    name: &'static str,
    let_go: Option<oneshot::Sender<()>>,
    state: State,
}

impl Caller {
    /// Starts a call of `name` that answers once let go, on its own task.
    fn start(app: &Router, name: &'static str) -> Caller {
        Caller::begin(app, name, Then::Answer, true)
    }

    /// As [`start`](Self::start), kept unspawned: nothing polls it again
    /// until it is awaited, and dropping it drops the request.
    fn held(app: &Router, name: &'static str) -> Caller {
        Caller::begin(app, name, Then::Answer, false)
    }

    fn begin(app: &Router, name: &'static str, then: Then, spawn: bool) -> Caller {
        let (req, let_go) = scripted(name, then);
        let app = app.clone();
        let mut call: Call =
            Box::pin(async move { Outcome::of(app.oneshot(req).await.unwrap()).await });
        let state = match poll_once(&mut call) {
            Poll::Ready(outcome) => State::Decided(outcome),
            Poll::Pending if spawn => State::Spawned(tokio::spawn(call)),
            Poll::Pending => State::Held(call),
        };
        Caller {
            name,
            let_go: Some(let_go),
            state,
        }
    }

    /// Lets the handler answer; it must be running.
    fn let_go(&mut self) {
        let sent = self.let_go.take().expect("let go twice").send(());
        assert!(sent.is_ok(), "{} is not in the handler", self.name);
    }

    /// The outcome of a call answered at its first poll, without waiting.
    fn decided_at_once(&self) -> &Outcome {
        match &self.state {
            State::Decided(outcome) => outcome,
            _ => panic!("{} was not answered at once", self.name),
        }
    }

    fn is_done(&self) -> bool {
        match &self.state {
            State::Decided(_) => true,
            State::Held(_) => false,
            State::Spawned(handle) => handle.is_finished(),
        }
    }

    /// The call's task's end: its outcome, or its panic.
    async fn join(self) -> Result<Outcome, JoinError> {
        match self.state {
            State::Decided(outcome) => Ok(outcome),
            State::Held(call) => Ok(call.await),
            State::Spawned(handle) => handle.await,
        }
    }

    async fn outcome(self) -> Outcome {
        self.join().await.unwrap()
    }

    /// Lets the handler answer and awaits the outcome: 200 with its name.
    async fn answered(mut self) -> Outcome {
        self.let_go();
        let name = self.name;
        let outcome = self.outcome().await;
        assert_eq!(outcome.status, StatusCode::OK, "{name}: {outcome:?}");
        assert_eq!(outcome.body, name);
        outcome
    }
}

/// The next caller to reach the handler. It must come without the clock
/// moving (paused time): let in by a wake, not by a timer.
async fn next_in(entered: &mut mpsc::UnboundedReceiver<&'static str>) -> &'static str {
    let before = Instant::now();
    let name = entered.recv().await.unwrap();
    assert_eq!(
        Instant::now(),
        before,
        "{name} came in on a timer, not woken by a free slot"
    );
    name
}

/// Asserts that no caller has reached the handler since the last look.
fn nobody_entered(entered: &mut mpsc::UnboundedReceiver<&'static str>) {
    assert_eq!(
        entered.try_recv(),
        Err(mpsc::error::TryRecvError::Empty),
        "someone got in"
    );
}

/// Lets every task that can run, run: spawned callers get polled by their
/// own tasks and wait with their own wakers (not the no-op one of their
/// first poll), so that what happens next must wake them.
async fn settle() {
    for _ in 0..8 {
        tokio::task::yield_now().await;
    }
}

/// A limit of one with `queue`: `h` holds the slot, and the caller names
/// in `waiters` join the queue in that order (each checked to be queued),
/// then wait on their own tasks.
async fn one_slot_held(
    name: &str,
    queue_config: WaitQueue,
    waiters: &[&'static str],
) -> (
    ConcurrencyLimiter,
    Router,
    mpsc::UnboundedReceiver<&'static str>,
    Caller,
    Vec<Caller>,
) {
    let limiter = fixed(name, 1, queue_config);
    let (entered_tx, mut entered) = mpsc::unbounded_channel();
    let app = app(layer(&limiter), entered_tx);
    let holder = Caller::start(&app, "h");
    assert_eq!(
        entered.try_recv(),
        Ok("h"),
        "the free slot was not taken at once"
    );
    let mut queued = Vec::new();
    for (i, &waiter) in waiters.iter().enumerate() {
        queued.push(Caller::start(&app, waiter));
        assert_eq!(queue(&limiter).waiting, i + 1, "{waiter} is not queued");
    }
    settle().await;
    nobody_entered(&mut entered);
    (limiter, app, entered, holder, queued)
}

// ---------------------------------------------------------------------------
// Order.

/// FIFO: callers queued A, B, C get the slot in that order, one release
/// each, none before its turn.
#[tokio::test(start_paused = true)]
async fn fifo_admits_waiters_in_arrival_order() {
    let fifo = WaitQueue::fifo(8, Duration::from_secs(60)).unwrap();
    let (limiter, _app, mut entered, holder, waiters) =
        one_slot_held("fifo", fifo, &["a", "b", "c"]).await;
    let mut waiters = waiters.into_iter();
    let mut inside = holder;
    for (turn, want) in ["a", "b", "c"].into_iter().enumerate() {
        let next = waiters.next().unwrap();
        inside.answered().await;
        assert_eq!(next_in(&mut entered).await, want);
        nobody_entered(&mut entered);
        assert_eq!(queue(&limiter).waiting, 2 - turn);
        inside = next;
    }
    inside.answered().await;
    let state = queue(&limiter);
    assert_eq!((state.waiting, state.admitted, state.timed_out), (0, 3, 0));
}

/// LIFO: the newest waiter gets each freed slot first: C, then B, then A.
#[tokio::test(start_paused = true)]
async fn lifo_admits_the_newest_waiter_first() {
    let lifo = WaitQueue::lifo(8, Duration::from_secs(60)).unwrap();
    let (limiter, _app, mut entered, mut inside, waiters) =
        one_slot_held("lifo", lifo, &["a", "b", "c"]).await;
    let mut waiters: Vec<Caller> = waiters;
    for (turn, want) in ["c", "b", "a"].into_iter().enumerate() {
        inside.answered().await;
        assert_eq!(next_in(&mut entered).await, want);
        nobody_entered(&mut entered);
        assert_eq!(queue(&limiter).waiting, 2 - turn);
        let at = waiters.iter().position(|w| w.name == want).unwrap();
        inside = waiters.remove(at);
    }
    inside.answered().await;
    let state = queue(&limiter);
    assert_eq!((state.waiting, state.admitted), (0, 3));
}

// ---------------------------------------------------------------------------
// The longest wait.

/// A caller waits `max_wait` for a slot that never frees: refused with the
/// layer's status and `Retry-After` at `max_wait`, not before; its handler
/// never runs, and the holder is not disturbed.
async fn waits_out_max_wait(
    configure: impl FnOnce(ConcurrencyLimitLayer<GlobalKey>) -> ConcurrencyLimitLayer<GlobalKey>,
    status: StatusCode,
    retry_after: &str,
) {
    let max_wait = Duration::from_millis(250);
    let limiter = fixed("timeout", 1, WaitQueue::fifo(4, max_wait).unwrap());
    let (entered_tx, mut entered) = mpsc::unbounded_channel();
    let app = app(configure(layer(&limiter)), entered_tx);
    let holder = Caller::start(&app, "h");
    assert_eq!(entered.try_recv(), Ok("h"));

    let started = Instant::now();
    let waiter = Caller::start(&app, "w");
    assert_eq!(queue(&limiter).waiting, 1);
    tokio::time::sleep(max_wait - Duration::from_millis(1)).await;
    assert!(!waiter.is_done(), "refused before max_wait");
    assert_eq!(queue(&limiter).waiting, 1);

    let refused = waiter.outcome().await;
    refused.assert_refused(status, retry_after);
    let waited = refused.at - started;
    assert!(
        waited >= max_wait && waited <= max_wait + Duration::from_millis(1),
        "refused after {waited:?}, max_wait {max_wait:?}"
    );
    nobody_entered(&mut entered);
    let state = queue(&limiter);
    assert_eq!((state.waiting, state.timed_out, state.admitted), (0, 1, 0));
    holder.answered().await;
}

#[tokio::test(start_paused = true)]
async fn a_waiter_that_waits_out_max_wait_gets_429_and_retry_after() {
    waits_out_max_wait(|layer| layer, StatusCode::TOO_MANY_REQUESTS, "1").await;
}

#[tokio::test(start_paused = true)]
async fn a_waiter_that_waits_out_max_wait_gets_the_layers_status() {
    waits_out_max_wait(
        |layer| {
            layer
                .status(StatusCode::SERVICE_UNAVAILABLE)
                .unwrap()
                .retry_after(Duration::from_millis(2500))
        },
        StatusCode::SERVICE_UNAVAILABLE,
        "3",
    )
    .await;
}

// ---------------------------------------------------------------------------
// A full queue.

/// FIFO, full: the newcomer is refused at its first poll (it waits for
/// nothing) with 429 and `Retry-After`; the queued callers keep their
/// places and get in in order.
#[tokio::test(start_paused = true)]
async fn a_full_fifo_queue_refuses_the_newcomer_at_once() {
    let fifo = WaitQueue::fifo(2, Duration::from_secs(60)).unwrap();
    let (limiter, app, mut entered, holder, waiters) =
        one_slot_held("fifofull", fifo, &["a", "b"]).await;
    let newcomer = Caller::start(&app, "c");
    newcomer
        .decided_at_once()
        .assert_refused(StatusCode::TOO_MANY_REQUESTS, "1");
    let state = queue(&limiter);
    assert_eq!((state.waiting, state.overflowed), (2, 1));

    let [a, b]: [Caller; 2] = waiters.try_into().ok().unwrap();
    holder.answered().await;
    assert_eq!(next_in(&mut entered).await, "a");
    a.answered().await;
    assert_eq!(next_in(&mut entered).await, "b");
    b.answered().await;
    nobody_entered(&mut entered);
    assert_eq!(queue(&limiter).admitted, 2);
}

/// LIFO, full: the newcomer takes the place of the oldest waiter, which is
/// refused at once (the clock has not moved) with 429 and `Retry-After`;
/// the newcomer then gets the next slot, before the one that waited less
/// long than the displaced.
#[tokio::test(start_paused = true)]
async fn a_full_lifo_queue_displaces_its_oldest_waiter() {
    let lifo = WaitQueue::lifo(2, Duration::from_secs(60)).unwrap();
    let (limiter, app, mut entered, holder, waiters) =
        one_slot_held("lifofull", lifo, &["a", "b"]).await;
    let [a, b]: [Caller; 2] = waiters.try_into().ok().unwrap();
    let started = Instant::now();
    let c = Caller::start(&app, "c");
    assert!(!c.is_done(), "the newcomer was refused");
    let displaced = a.outcome().await;
    displaced.assert_refused(StatusCode::TOO_MANY_REQUESTS, "1");
    assert_eq!(
        displaced.at, started,
        "the oldest waiter was not refused at once"
    );
    let state = queue(&limiter);
    assert_eq!((state.waiting, state.overflowed), (2, 1));

    holder.answered().await;
    assert_eq!(next_in(&mut entered).await, "c");
    c.answered().await;
    assert_eq!(next_in(&mut entered).await, "b");
    b.answered().await;
    nobody_entered(&mut entered);
    assert_eq!(queue(&limiter).admitted, 2);
}

// ---------------------------------------------------------------------------
// Dropped waiters.

/// A waiter whose request is dropped leaves the queue at once; the
/// releases that follow go to the callers still there.
#[tokio::test(start_paused = true)]
async fn a_dropped_waiter_leaves_the_queue_at_once() {
    let limiter = fixed(
        "dropped",
        1,
        WaitQueue::fifo(8, Duration::from_secs(60)).unwrap(),
    );
    let (entered_tx, mut entered) = mpsc::unbounded_channel();
    let app = app(layer(&limiter), entered_tx);
    let holder = Caller::start(&app, "h");
    assert_eq!(entered.try_recv(), Ok("h"));
    let a = Caller::start(&app, "a");
    let b = Caller::held(&app, "b");
    let c = Caller::start(&app, "c");
    assert_eq!(queue(&limiter).waiting, 3);
    settle().await;
    drop(b);
    assert_eq!(
        queue(&limiter).waiting,
        2,
        "the dropped waiter is still queued"
    );

    holder.answered().await;
    assert_eq!(next_in(&mut entered).await, "a");
    a.answered().await;
    assert_eq!(next_in(&mut entered).await, "c");
    c.answered().await;
    nobody_entered(&mut entered);
    let state = queue(&limiter);
    assert_eq!((state.waiting, state.admitted, state.timed_out), (0, 2, 0));
}

/// A waiter woken for a freed slot and dropped before it took it: the
/// wake goes on to the next waiter, which gets the slot at once (the clock
/// does not move), not lost on the dropped one. (The dropped waiter's
/// tentative lease, never held, wakes nobody: its release frees no slot.)
#[tokio::test(start_paused = true)]
async fn a_wake_for_a_dropped_waiter_goes_to_the_next() {
    let limiter = fixed(
        "handoff",
        1,
        WaitQueue::fifo(8, Duration::from_secs(60)).unwrap(),
    );
    let (entered_tx, mut entered) = mpsc::unbounded_channel();
    let app = app(layer(&limiter), entered_tx);
    let holder = Caller::start(&app, "h");
    assert_eq!(entered.try_recv(), Ok("h"));
    // First in the queue, but never polled again: it is told of the
    // release and does nothing about it.
    let a = Caller::held(&app, "a");
    let b = Caller::start(&app, "b");
    assert_eq!(queue(&limiter).waiting, 2);
    settle().await;

    let released_at = Instant::now();
    holder.answered().await;
    settle().await;
    nobody_entered(&mut entered);
    assert_eq!(queue(&limiter).waiting, 2);
    drop(a);
    assert_eq!(queue(&limiter).waiting, 1);
    assert_eq!(next_in(&mut entered).await, "b");
    assert_eq!(Instant::now(), released_at);
    b.answered().await;
    let state = queue(&limiter);
    assert_eq!((state.waiting, state.admitted, state.timed_out), (0, 1, 0));
}

// ---------------------------------------------------------------------------
// An adaptive limit.

/// A queue on an adaptive limit: a waiter gets the slot a release frees.
/// Gradient2 starts at its minimum (measuring the minimum RTT), here 2.
#[tokio::test(start_paused = true)]
async fn a_waiter_on_an_adaptive_limit_gets_a_freed_slot() {
    let limit = AdaptiveLimit::gradient2()
        .min(2)
        .max(4)
        .initial(4)
        .build()
        .unwrap();
    let limiter = ConcurrencyLimiter::adaptive("adaptive-queue", limit)
        .unwrap()
        .queue(WaitQueue::fifo(4, Duration::from_secs(60)).unwrap());
    assert_eq!(limiter.limit(), 2);
    let (entered_tx, mut entered) = mpsc::unbounded_channel();
    let app = app(layer(&limiter), entered_tx);
    let first = Caller::start(&app, "h1");
    let second = Caller::start(&app, "h2");
    assert_eq!(entered.try_recv(), Ok("h1"));
    assert_eq!(entered.try_recv(), Ok("h2"));
    let a = Caller::start(&app, "a");
    let b = Caller::start(&app, "b");
    assert_eq!(queue(&limiter).waiting, 2);
    settle().await;
    nobody_entered(&mut entered);

    first.answered().await;
    assert_eq!(next_in(&mut entered).await, "a");
    nobody_entered(&mut entered);
    assert_eq!(queue(&limiter).waiting, 1);
    second.answered().await;
    assert_eq!(next_in(&mut entered).await, "b");
    a.answered().await;
    b.answered().await;
    assert_eq!(limiter.limit(), 2, "still measuring the minimum RTT");
    let state = queue(&limiter);
    assert_eq!((state.waiting, state.admitted), (0, 2));
}

/// A rise of an adaptive limit, with no slot released, wakes as many
/// waiters as it rose by. Gradient2 measures the minimum RTT at `min` (1)
/// over 40 calls, then returns to `initial` (3): the 40th call's answer
/// (its head; its body, still open, holds its slot) lifts the limit by 2,
/// and two of three waiters get in; the third gets the slot the body
/// frees.
#[tokio::test(start_paused = true)]
async fn a_rising_adaptive_limit_wakes_as_many_waiters_as_it_rose_by() {
    let limit = AdaptiveLimit::gradient2()
        .min(1)
        .max(3)
        .initial(3)
        .build()
        .unwrap();
    let limiter = ConcurrencyLimiter::adaptive("adaptive-rise", limit)
        .unwrap()
        .queue(WaitQueue::fifo(4, Duration::from_secs(60)).unwrap());
    let (entered_tx, mut entered) = mpsc::unbounded_channel();
    let app = app(layer(&limiter), entered_tx);
    for _ in 0..39 {
        Caller::start(&app, "q").answered().await;
        assert_eq!(entered.try_recv(), Ok("q"));
    }
    assert_eq!(limiter.limit(), 1);
    assert!(limiter.adaptive_state().unwrap().probing);

    // The 40th call: in the handler, holding the one slot.
    let (req, let_go) = scripted("h", Then::Stream);
    let mut holder = Box::pin(app.clone().oneshot(req));
    assert!(poll_once(&mut holder).is_pending());
    assert_eq!(entered.try_recv(), Ok("h"));
    let waiters: Vec<Caller> = ["a", "b", "c"]
        .into_iter()
        .map(|name| Caller::start(&app, name))
        .collect();
    assert_eq!(queue(&limiter).waiting, 3);
    settle().await;
    nobody_entered(&mut entered);

    let_go.send(()).unwrap();
    let response = holder.await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(limiter.limit(), 3, "the probe did not end on the 40th call");
    assert_eq!(next_in(&mut entered).await, "a");
    assert_eq!(next_in(&mut entered).await, "b");
    settle().await;
    nobody_entered(&mut entered);
    assert_eq!(queue(&limiter).waiting, 1, "c should still wait");

    drop(response);
    assert_eq!(next_in(&mut entered).await, "c");
    for waiter in waiters {
        waiter.answered().await;
    }
    let state = queue(&limiter);
    assert_eq!((state.waiting, state.admitted, state.timed_out), (0, 3, 0));
}

// ---------------------------------------------------------------------------
// However a call ends, its slot goes to a waiter.

/// A handler that panics drops its request future, lease and all: the
/// slot goes to the waiter at once.
#[tokio::test(start_paused = true)]
async fn a_panicking_handler_hands_its_slot_to_a_waiter() {
    quiet_deliberate_panics();
    let limiter = fixed(
        "panic",
        1,
        WaitQueue::fifo(4, Duration::from_secs(60)).unwrap(),
    );
    let (entered_tx, mut entered) = mpsc::unbounded_channel();
    let app = app(layer(&limiter), entered_tx);
    let mut panicking = Caller::begin(&app, "p", Then::Panic, true);
    assert_eq!(entered.try_recv(), Ok("p"));
    let waiter = Caller::start(&app, "a");
    assert_eq!(queue(&limiter).waiting, 1);
    settle().await;

    panicking.let_go();
    let err = panicking.join().await.unwrap_err();
    assert!(err.is_panic(), "{err}");
    assert_eq!(next_in(&mut entered).await, "a");
    waiter.answered().await;
    let state = queue(&limiter);
    assert_eq!((state.waiting, state.admitted), (0, 1));
}

/// A streaming response holds its slot while its body is open, the
/// waiter meanwhile waiting; dropped unfinished, the body hands the slot
/// to the waiter at once.
#[tokio::test(start_paused = true)]
async fn a_dropped_response_body_hands_its_slot_to_a_waiter() {
    let limiter = fixed(
        "body",
        1,
        WaitQueue::fifo(4, Duration::from_secs(60)).unwrap(),
    );
    let (entered_tx, mut entered) = mpsc::unbounded_channel();
    let app = app(layer(&limiter), entered_tx);
    let (req, let_go) = scripted("s", Then::Stream);
    let_go.send(()).unwrap();
    let response = app.clone().oneshot(req).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(entered.try_recv(), Ok("s"));
    let waiter = Caller::start(&app, "a");
    assert_eq!(queue(&limiter).waiting, 1);

    let mut body = response.into_body();
    for _ in 0..3 {
        let frame = body.frame().await.unwrap().unwrap();
        assert_eq!(frame.into_data().unwrap(), "data\n");
    }
    settle().await;
    nobody_entered(&mut entered);
    assert_eq!(queue(&limiter).waiting, 1);

    drop(body);
    assert_eq!(next_in(&mut entered).await, "a");
    waiter.answered().await;
    let state = queue(&limiter);
    assert_eq!((state.waiting, state.admitted), (0, 1));
}

// ---------------------------------------------------------------------------
// Many tasks on the multi-thread runtime.

const TASKS: usize = 200;
const CALLS: usize = 5;

/// `TASKS` tasks make `CALLS` calls each through `limiter`'s layer (with
/// a queue) to a handler that counts itself inside and stays a moment
/// (yields, or sleeps a millisecond). The most inside at once, and every
/// limit the limiter reported meanwhile, stay within `bound`; every call
/// is answered 200, or refused 429 with `Retry-After`; the queue was used;
/// at the end nothing waits and every slot of the limit can be taken.
/// Returns the highest limit seen.
async fn many_callers(limiter: ConcurrencyLimiter, bound: u64) -> u64 {
    let inflight = Arc::new(InFlight::default());
    let seen_limit = Arc::new(AtomicU64::new(0));
    let turn = Arc::new(AtomicUsize::new(0));
    let busy = {
        let (inflight, seen_limit, limiter) =
            (inflight.clone(), seen_limit.clone(), limiter.clone());
        move || {
            let (inflight, seen_limit, limiter, turn) = (
                inflight.clone(),
                seen_limit.clone(),
                limiter.clone(),
                turn.clone(),
            );
            async move {
                inflight.enter();
                seen_limit.fetch_max(limiter.limit(), Ordering::SeqCst);
                if turn.fetch_add(1, Ordering::Relaxed) % 2 == 0 {
                    for _ in 0..5 {
                        tokio::task::yield_now().await;
                    }
                } else {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                inflight.leave();
                "ok"
            }
        }
    };
    let app = Router::new()
        .route("/busy", get(busy))
        .route_layer(layer(&limiter));

    let ok = Arc::new(AtomicUsize::new(0));
    let refused = Arc::new(AtomicUsize::new(0));
    let mut set = JoinSet::new();
    for _ in 0..TASKS {
        let (app, ok, refused) = (app.clone(), ok.clone(), refused.clone());
        set.spawn(async move {
            for _ in 0..CALLS {
                let req = Request::get("/busy").body(Body::empty()).unwrap();
                let response = app.clone().oneshot(req).await.unwrap();
                match response.status() {
                    StatusCode::OK => {
                        ok.fetch_add(1, Ordering::SeqCst);
                    }
                    StatusCode::TOO_MANY_REQUESTS => {
                        assert_eq!(response.headers()[RETRY_AFTER], "1");
                        refused.fetch_add(1, Ordering::SeqCst);
                    }
                    other => panic!("unexpected {other}"),
                }
                let _ = response.into_body().collect().await.unwrap();
            }
        });
    }
    // A guard against a hang, not a timing assertion.
    tokio::time::timeout(Duration::from_secs(120), async {
        while let Some(joined) = set.join_next().await {
            joined.unwrap();
        }
    })
    .await
    .expect("the callers never finished");

    let (ok, refused) = (ok.load(Ordering::SeqCst), refused.load(Ordering::SeqCst));
    assert_eq!(ok + refused, TASKS * CALLS);
    let peak = inflight.max();
    assert!(
        peak as u64 <= bound,
        "{peak} inside at once, limit at most {bound}"
    );
    assert!(peak >= 2, "the callers never overlapped: {peak}");
    let seen = seen_limit.load(Ordering::SeqCst);
    assert!(
        (1..=bound).contains(&seen),
        "the limit reached {seen}, bound {bound}"
    );
    assert_eq!(inflight.now(), 0);

    limiter.releases_settled().await;
    let state = queue(&limiter);
    assert_eq!(state.waiting, 0, "{state:?}");
    assert!(
        state.admitted > 0,
        "nobody got a slot by waiting: {state:?}"
    );
    // Every slot is free again: the limit's worth of leases can be taken.
    let key = Key::new("global");
    let mut held = Vec::new();
    for i in 0..limiter.limit() {
        match limiter.acquire(&key).await.unwrap() {
            Admission::Acquired(guard) => held.push(guard),
            Admission::Refused(grant) => {
                panic!("slot {i} of {} still held: {grant:?}", limiter.limit())
            }
        }
    }
    drop(held);
    assert_eq!(queue(&limiter).waiting, 0);
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_callers_never_exceed_a_fixed_limit_with_a_queue() {
    let store = MemoryStore::new();
    let policy = ConcurrencyPolicy::builder("stress-fixed", 4)
        .lease_ttl(Duration::from_secs(30))
        .build()
        .unwrap();
    let limiter = ConcurrencyLimiter::new(policy, store.clone())
        .queue(WaitQueue::fifo(32, Duration::from_millis(50)).unwrap());
    assert_eq!(many_callers(limiter.clone(), 4).await, 4);
    assert_eq!(store.lease_count(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_callers_never_exceed_an_adaptive_limits_max_with_a_queue() {
    let limit = AdaptiveLimit::gradient2()
        .min(2)
        .max(8)
        .initial(8)
        .sample_window(Duration::from_millis(5))
        .build()
        .unwrap();
    let limiter = ConcurrencyLimiter::adaptive("stress-adaptive", limit)
        .unwrap()
        .queue(WaitQueue::lifo(32, Duration::from_millis(50)).unwrap());
    many_callers(limiter.clone(), 8).await;
    let state = limiter.adaptive_state().unwrap();
    assert!((2..=8).contains(&state.limit), "{state:?}");
    assert_eq!(state.in_flight, 0, "{state:?}");
}

/// AIMD that starts at its max and sees only quick successes stays there:
/// the bound is the limit the whole time, so one call too many shows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_callers_never_exceed_an_aimd_limit_held_at_its_max_with_a_queue() {
    let limit = AdaptiveLimit::aimd()
        .min(2)
        .max(8)
        .initial(8)
        .build()
        .unwrap();
    let limiter = ConcurrencyLimiter::adaptive("stress-aimd", limit)
        .unwrap()
        .queue(WaitQueue::fifo(32, Duration::from_millis(50)).unwrap());
    assert_eq!(many_callers(limiter.clone(), 8).await, 8);
    assert_eq!(limiter.limit(), 8);
    assert_eq!(limiter.adaptive_state().unwrap().in_flight, 0);
}
