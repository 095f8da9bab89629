//! Reading a response body's trailers as they pass (a gRPC status sent
//! after a streamed reply, too late for the response future), for the
//! rate-limit layer's upstream feedback.

// The two types below are `pub` in a private module and re-exported only
// inside the crate: they appear in hidden methods of the public,
// user-implementable `RefusalBody`, and as no one outside can name them,
// no one outside can override or call those methods (a sealed method;
// users' own impls keep the defaults).

/// Whether a body type's `watch_trailers` reads the trailers: when not,
/// the layer builds no [`TrailerWatch`].
#[doc(hidden)]
#[derive(Clone, Copy, Debug)]
pub struct WatchesTrailers(pub(crate) bool);

/// What a watched body does with its trailers, once.
#[doc(hidden)]
// Only tonic's `Body` (feature `grpc`) reads trailers.
#[cfg_attr(not(feature = "grpc"), allow(dead_code))]
pub struct TrailerWatch(Box<dyn FnOnce(&http::HeaderMap) + Send + Sync>);

impl std::fmt::Debug for TrailerWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TrailerWatch").finish_non_exhaustive()
    }
}

impl TrailerWatch {
    pub(crate) fn new(seen: impl FnOnce(&http::HeaderMap) + Send + Sync + 'static) -> Self {
        TrailerWatch(Box::new(seen))
    }

    /// Hands the trailers on.
    #[cfg_attr(not(feature = "grpc"), allow(dead_code))]
    fn seen(self, trailers: &http::HeaderMap) {
        (self.0)(trailers);
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
