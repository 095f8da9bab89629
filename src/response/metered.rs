//! Counting the bytes of a response body as it is sent, for
//! [`ResponseCost::body_bytes`](crate::rate_limit::ResponseCost::body_bytes).

use bytes::Buf;
use http_body::Frame;

/// Counts the bytes of one response body and charges them, once, when the
/// body ends, fails or is dropped. Made by the rate-limit layer only; see
/// [`RefusalBody::metered`](super::RefusalBody::metered).
pub struct BodyMeter {
    sent: u64,
    charge: Option<Charge>,
}

/// What a [`BodyMeter`] does with the bytes sent, once: the layer's charge.
type Charge = Box<dyn FnOnce(u64) + Send + Sync>;

impl BodyMeter {
    pub(crate) fn new(charge: impl FnOnce(u64) + Send + Sync + 'static) -> Self {
        BodyMeter {
            sent: 0,
            charge: Some(Box::new(charge)),
        }
    }

    /// Counts `bytes` more as sent.
    pub(crate) fn add(&mut self, bytes: u64) {
        self.sent = self.sent.saturating_add(bytes);
    }

    /// Charges what was counted; later calls (and the drop) charge nothing.
    pub(crate) fn finish(&mut self) {
        if let Some(charge) = self.charge.take() {
            charge(self.sent);
        }
    }

    /// Counts the data of `frame` and, at the end of the body (`end`) or on
    /// an error, charges.
    pub(crate) fn observe<D: Buf, E>(&mut self, frame: &Option<Result<Frame<D>, E>>, end: bool) {
        match frame {
            Some(Ok(frame)) => {
                if let Some(data) = frame.data_ref() {
                    self.add(data.remaining() as u64);
                }
                if end {
                    self.finish();
                }
            }
            _ => self.finish(),
        }
    }
}

impl Drop for BodyMeter {
    fn drop(&mut self) {
        self.finish();
    }
}

impl std::fmt::Debug for BodyMeter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BodyMeter")
            .field("sent", &self.charge.as_ref().map(|_| self.sent))
            .finish_non_exhaustive()
    }
}

/// A body whose bytes a [`BodyMeter`] counts: wraps axum's `Body` (without
/// axum, nothing makes one).
#[cfg(feature = "axum")]
mod wrap {
    use std::pin::Pin;
    use std::task::{Context, Poll, ready};

    use http_body::{Body, Frame, SizeHint};
    use pin_project_lite::pin_project;

    use super::BodyMeter;

    pin_project! {
        /// A body whose bytes a [`BodyMeter`] counts as they are sent.
        pub(crate) struct Metered<B> {
            #[pin]
            body: B,
            meter: BodyMeter,
        }
    }

    impl<B> Metered<B> {
        pub(crate) fn new(body: B, meter: BodyMeter) -> Self {
            Metered { body, meter }
        }
    }

    impl<B: Body> Body for Metered<B> {
        type Data = B::Data;
        type Error = B::Error;

        fn poll_frame(
            self: Pin<&mut Self>,
            cx: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
            let mut this = self.project();
            let frame = ready!(this.body.as_mut().poll_frame(cx));
            this.meter.observe(&frame, this.body.is_end_stream());
            Poll::Ready(frame)
        }

        fn is_end_stream(&self) -> bool {
            self.body.is_end_stream()
        }

        fn size_hint(&self) -> SizeHint {
            self.body.size_hint()
        }
    }
}

#[cfg(feature = "axum")]
pub(crate) use self::wrap::Metered;
