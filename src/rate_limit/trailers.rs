//! Upstream feedback read from a response body's trailers: a gRPC status
//! sent after a streamed reply, too late for the response future.

use std::sync::Arc;

use http::HeaderMap;

use super::{RateSettings, RetryAfter, UpstreamQuota};
use crate::key::Key;

// The three types below are `pub` in a private module and re-exported
// only inside the crate: they appear in hidden methods of the public,
// user-implementable `RefusalBody` and `UpstreamFeedback`, and as no one
// outside can name them, no one outside can override or call those
// methods (a sealed method; users' own impls keep the defaults).

/// How a feedback reads the trailers that end a response's body (a gRPC
/// status after a streamed reply): as a [`RetryAfter`] reads a gRPC
/// refusal.
#[doc(hidden)]
#[derive(Clone, Copy, Debug)]
pub struct TrailerReader(pub(crate) RetryAfter);

/// Whether a body type's `watch_trailers` reads the trailers: when not,
/// the layer builds no [`TrailerWatch`].
#[doc(hidden)]
#[derive(Clone, Copy, Debug)]
pub struct WatchesTrailers(pub(crate) bool);

/// What a watched body needs to pause its call's identity when its
/// trailers ask for it.
#[doc(hidden)]
// Only tonic's `Body` (feature `grpc`) reads trailers.
#[cfg_attr(not(feature = "grpc"), allow(dead_code))]
pub struct TrailerWatch {
    reader: TrailerReader,
    settings: Arc<RateSettings>,
    key: Key,
}

impl std::fmt::Debug for TrailerWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TrailerWatch").finish_non_exhaustive()
    }
}

impl TrailerWatch {
    pub(crate) fn new(reader: TrailerReader, settings: Arc<RateSettings>, key: Key) -> Self {
        TrailerWatch {
            reader,
            settings,
            key,
        }
    }

    /// Reads `trailers`; records the pause they ask for, if any: at once
    /// on the memory store, else in a task of the current tokio runtime
    /// (the body's reader should not wait for the store).
    #[cfg_attr(not(feature = "grpc"), allow(dead_code))]
    pub(crate) fn seen(self, trailers: &HeaderMap) {
        let Some(pause) = self.reader.0.grpc_pause(trailers).filter(|p| !p.is_zero()) else {
            return;
        };
        let hold = UpstreamQuota {
            remaining: 0,
            reset: pause,
        };
        let mut report = self.settings.limiter.defer(&self.key, pause);
        if let Some(recorded) = report.take_ready() {
            super::quota::log_hold(self.settings.limiter.name(), hold, &recorded);
            return;
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let settings = self.settings;
            runtime.spawn(async move {
                let recorded = report.await;
                super::quota::log_hold(settings.limiter.name(), hold, &recorded);
            });
        }
    }
}

#[cfg(feature = "grpc")]
pin_project_lite::pin_project! {
    /// A body whose trailers are read by a [`TrailerWatch`].
    pub(crate) struct Watched<B> {
        #[pin]
        inner: B,
        watch: Option<TrailerWatch>,
    }
}

#[cfg(feature = "grpc")]
impl<B> Watched<B> {
    pub(crate) fn new(inner: B, watch: TrailerWatch) -> Self {
        Watched {
            inner,
            watch: Some(watch),
        }
    }
}

#[cfg(feature = "grpc")]
impl<B: http_body::Body> http_body::Body for Watched<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<B::Data>, B::Error>>> {
        let this = self.project();
        let frame = std::task::ready!(this.inner.poll_frame(cx));
        if let Some(Ok(frame)) = &frame
            && let Some(trailers) = frame.trailers_ref()
            && let Some(watch) = this.watch.take()
        {
            watch.seen(trailers);
        }
        std::task::Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}
