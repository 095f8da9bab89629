use std::pin::Pin;
use std::task::{Context, Poll, ready};

use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use super::{Lease, LeaseGuard};

pin_project! {
    /// A response body that holds a [`LeaseGuard`] until the body has been
    /// sent to its end, has failed, or is dropped (the client went away):
    /// the lease covers the whole response, not just the handler.
    pub struct GuardedBody<B, L>
    where
        L: Lease,
    {
        // Declared first so that it drops first: by the time the body's own
        // drop runs, the release is done or under way.
        guard: Option<LeaseGuard<L>>,
        #[pin]
        body: B,
    }
}

impl<B, L: Lease> GuardedBody<B, L> {
    /// Wraps `body`; `guard` (if any) is released when the body ends.
    pub fn new(body: B, guard: Option<LeaseGuard<L>>) -> Self {
        GuardedBody { body, guard }
    }

    /// Whether the body still holds its lease.
    pub fn holds_lease(&self) -> bool {
        self.guard.is_some()
    }
}

impl<B: Body, L: Lease> Body for GuardedBody<B, L> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        let mut this = self.project();
        let frame = ready!(this.body.as_mut().poll_frame(cx));
        match &frame {
            Some(Ok(_)) if !this.body.is_end_stream() => {}
            // The end, or an error that ends it: release now rather than
            // when the server gets round to dropping the body.
            _ => *this.guard = None,
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

impl<B, L: Lease> std::fmt::Debug for GuardedBody<B, L> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GuardedBody")
            .field("holds_lease", &self.guard.is_some())
            .finish_non_exhaustive()
    }
}
