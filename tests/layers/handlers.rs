//! Pieces for tests that follow a request through a router: a signal that
//! the handler started, handlers that wait at a gate, hang or panic, a
//! count of the calls inside a handler, and quiet deliberate panics.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Once};
use std::task::{Context, Poll};

use axum::extract::Extension;
use bytes::Bytes;
use http_body::Frame;
use tokio::sync::{mpsc, oneshot, watch};

/// Tells the test that the handler has started (per request, through an
/// extension), so the test can cancel it mid-flight at the right moment.
#[derive(Clone, Default)]
pub struct Started(Arc<Mutex<Option<oneshot::Sender<()>>>>);

impl Started {
    pub fn new() -> (Started, oneshot::Receiver<()>) {
        let (tx, rx) = oneshot::channel();
        (Started(Arc::new(Mutex::new(Some(tx)))), rx)
    }

    pub fn signal(&self) {
        if let Some(tx) = self.0.lock().unwrap().take() {
            let _ = tx.send(());
        }
    }
}

/// A handler that reports on `entered` that it runs, then waits until the
/// gate opens, and answers `done`.
pub fn gated(
    gate: watch::Receiver<bool>,
    entered: mpsc::UnboundedSender<()>,
) -> impl Fn() -> std::pin::Pin<Box<dyn Future<Output = &'static str> + Send>>
+ Clone
+ Send
+ Sync
+ 'static {
    move || {
        let mut gate = gate.clone();
        let entered = entered.clone();
        Box::pin(async move {
            let _ = entered.send(());
            let _ = gate.wait_for(|open| *open).await;
            "done"
        })
    }
}

/// Deliberate panics in handlers are expected: keep them out of the output.
pub fn quiet_deliberate_panics() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let deliberate = info
                .payload()
                .downcast_ref::<&str>()
                .is_some_and(|m| m.contains("deliberate"));
            if !deliberate {
                default(info);
            }
        }));
    });
}

/// A handler that signals it started, then never answers: for cancelling
/// requests mid-flight.
pub async fn hang(Extension(started): Extension<Started>) -> &'static str {
    started.signal();
    std::future::pending::<()>().await;
    "never"
}

/// A handler that panics (deliberately; see [`quiet_deliberate_panics`]).
pub async fn panic() -> &'static str {
    if true {
        panic!("deliberate panic in a handler");
    }
    "never"
}

/// Calls inside a handler right now, and the most seen at once.
#[derive(Default)]
pub struct InFlight {
    now: AtomicUsize,
    max: AtomicUsize,
}

impl InFlight {
    pub fn enter(&self) {
        let now = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.max.fetch_max(now, Ordering::SeqCst);
    }

    pub fn leave(&self) {
        self.now.fetch_sub(1, Ordering::SeqCst);
    }

    /// The most inside at once.
    pub fn max(&self) -> usize {
        self.max.load(Ordering::SeqCst)
    }

    /// How many are inside now.
    pub fn now(&self) -> usize {
        self.now.load(Ordering::SeqCst)
    }
}

/// An endless body that is always ready, and says when it is dropped
/// (if given a sender).
pub struct EndlessBody(pub Option<mpsc::UnboundedSender<()>>);

impl http_body::Body for EndlessBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(b"data\n")))))
    }
}

impl Drop for EndlessBody {
    fn drop(&mut self) {
        if let Some(tx) = self.0.take() {
            let _ = tx.send(());
        }
    }
}
