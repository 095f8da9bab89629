use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use super::BodyMeter;

pin_project! {
    /// The body of a response that went through a concurrency or shedding
    /// layer, or a rate-limit layer with
    /// [`any_body`](crate::RateLimitLayer::any_body): the inner service's
    /// body, or the short text of a rejection. (A rate-limit layer by
    /// default answers in the inner body type itself; see
    /// [`RefusalBody`](crate::response::RefusalBody).)
    ///
    /// Its error is the inner body's error; a rejection body never fails.
    pub struct ResponseBody<B> {
        #[pin]
        kind: Kind<B>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<B> {
        Inner { #[pin] body: B },
        Full { data: Option<Bytes> },
        // The inner body, its bytes counted as they go
        // (`ResponseCost::body_bytes`).
        Metered { #[pin] body: B, meter: BodyMeter },
    }
}

impl<B> ResponseBody<B> {
    /// This body, its bytes counted by `meter` (a refusal's text is
    /// charged whole, at once).
    pub(crate) fn with_meter(self, mut meter: BodyMeter) -> Self {
        let kind = match self.kind {
            Kind::Inner { body } | Kind::Metered { body, .. } => Kind::Metered { body, meter },
            Kind::Full { data } => {
                meter.add(data.as_ref().map_or(0, |d| d.len() as u64));
                meter.finish();
                Kind::Full { data }
            }
        };
        ResponseBody { kind }
    }

    pub(crate) fn inner(body: B) -> Self {
        ResponseBody {
            kind: Kind::Inner { body },
        }
    }

    pub(crate) fn full(data: Bytes) -> Self {
        ResponseBody {
            kind: Kind::Full {
                data: (!data.is_empty()).then_some(data),
            },
        }
    }
}

impl<B> std::fmt::Debug for ResponseBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.kind {
            Kind::Inner { .. } => f.write_str("ResponseBody::Inner"),
            Kind::Full { .. } => f.write_str("ResponseBody::Full"),
            Kind::Metered { .. } => f.write_str("ResponseBody::Metered"),
        }
    }
}

impl<B: Body<Data = Bytes>> Body for ResponseBody<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        match self.project().kind.project() {
            KindProj::Inner { body } => body.poll_frame(cx),
            KindProj::Full { data } => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
            KindProj::Metered { mut body, meter } => {
                let frame = std::task::ready!(body.as_mut().poll_frame(cx));
                meter.observe(&frame, body.is_end_stream());
                Poll::Ready(frame)
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Inner { body } | Kind::Metered { body, .. } => body.is_end_stream(),
            Kind::Full { data } => data.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Inner { body } | Kind::Metered { body, .. } => body.size_hint(),
            Kind::Full { data } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
        }
    }
}
