use std::convert::Infallible;

use bytes::{Buf, Bytes};
use http_body_util::combinators::{BoxBody, UnsyncBoxBody};
use http_body_util::{BodyExt, Full};

#[cfg(feature = "axum")]
use super::Metered;
use super::{BodyMeter, ResponseBody};
use super::{TrailerWatch, WatchesTrailers};
use crate::lease::{GuardedBody, Lease};

/// A response body type the rate-limit layer can answer a refusal in: the
/// body of the 429 (or 503, or 400) is built from the refusal's text.
///
/// By default [`RateLimitLayer`](crate::RateLimitLayer) answers in the
/// inner service's own body type, so that the responses that pass are
/// handed on as they are: axum then sends them without boxing their body
/// a second time. Implemented for:
///
/// - axum's `Body` (every route of an axum `Router`, whatever the layers
///   added with `Router::layer` before this one);
/// - tonic's `Body` (feature `grpc`: what a tonic server's services and a
///   tonic client's `Channel` answer in);
/// - `String` (a custom rejection body that is not UTF-8 is converted
///   lossily, so a `Content-Length` set by that rejection would no longer
///   match: leave it to the server);
/// - `http_body_util::Full`, `BoxBody` and `UnsyncBoxBody` (of `Bytes`);
/// - this crate's [`ResponseBody`] and the bodies of its concurrency and
///   shedding layers ([`GuardedBody`](crate::lease::GuardedBody), with no
///   lease), so that the layers stack in any order.
///
/// Implement it for a body type of your own. Around a body that cannot be
/// built from bytes (hyper's `Incoming`, `Empty`) or one of another crate
/// (tower-http's wrappers, when stacked with `ServiceBuilder` outside
/// axum's router), call
/// [`RateLimitLayer::any_body`](crate::RateLimitLayer::any_body), which
/// wraps every response in a [`ResponseBody`].
#[diagnostic::on_unimplemented(
    message = "the rate-limit layer cannot answer a refusal in a `{Self}` body",
    label = "the inner service's response body",
    note = "call `.any_body()` on the `RateLimitLayer` to wrap responses in `fleetgate::response::ResponseBody` instead, or implement `RefusalBody` for a body type of your own"
)]
pub trait RefusalBody: Sized {
    /// The body of a refusal whose text is `text`.
    fn refusal(text: Bytes) -> Self;

    /// For [`ResponseCost::body_bytes`](crate::rate_limit::ResponseCost::body_bytes):
    /// this body, with `meter` counting the bytes it sends and charging
    /// them when it ends or is dropped. By default the body is not
    /// wrapped: `meter` charges its whole length (its exact size, else the
    /// lower bound of its size hint) at once. axum's `Body` and
    /// [`ResponseBody`] count as they go.
    #[doc(hidden)]
    fn metered(self, mut meter: BodyMeter) -> Self
    where
        Self: http_body::Body,
    {
        let hint = self.size_hint();
        meter.add(hint.exact().unwrap_or(hint.lower()));
        meter.finish();
        self
    }

    /// For upstream feedback from trailers: this body, with `watch`
    /// reading its trailers. By default the body is not wrapped and its
    /// trailers are not read; tonic's `Body` reads them. Sealed: its
    /// argument's type cannot be named outside this crate.
    #[doc(hidden)]
    fn watch_trailers(self, watch: TrailerWatch) -> Self {
        drop(watch);
        self
    }

    /// Whether [`watch_trailers`](Self::watch_trailers) reads them: when
    /// not, the layer builds no watch. Sealed as that method is.
    #[doc(hidden)]
    const WATCHES_TRAILERS: WatchesTrailers = WatchesTrailers(false);
}

#[cfg(feature = "axum")]
impl RefusalBody for axum::body::Body {
    fn refusal(text: Bytes) -> Self {
        axum::body::Body::from(text)
    }

    fn metered(self, meter: BodyMeter) -> Self {
        axum::body::Body::new(Metered::new(self, meter))
    }
}

#[cfg(feature = "grpc")]
impl RefusalBody for tonic::body::Body {
    fn refusal(text: Bytes) -> Self {
        // A gRPC refusal has no body: an empty body ends the stream with
        // the headers, which makes the response trailers-only.
        if text.is_empty() {
            tonic::body::Body::empty()
        } else {
            tonic::body::Body::new(Full::new(text))
        }
    }

    const WATCHES_TRAILERS: WatchesTrailers = WatchesTrailers(true);

    fn watch_trailers(self, watch: TrailerWatch) -> Self {
        tonic::body::Body::new(super::Watched::new(self, watch))
    }
}

impl RefusalBody for String {
    fn refusal(text: Bytes) -> Self {
        // The layer's own refusal texts are UTF-8; a custom rejection body
        // that is not is converted lossily (see the trait's docs).
        String::from_utf8_lossy(&text).into_owned()
    }
}

impl<D: Buf + From<Bytes>> RefusalBody for Full<D> {
    fn refusal(text: Bytes) -> Self {
        Full::new(D::from(text))
    }
}

impl<E> RefusalBody for BoxBody<Bytes, E> {
    fn refusal(text: Bytes) -> Self {
        BoxBody::new(Full::new(text).map_err(|never: Infallible| match never {}))
    }
}

impl<E> RefusalBody for UnsyncBoxBody<Bytes, E> {
    fn refusal(text: Bytes) -> Self {
        UnsyncBoxBody::new(Full::new(text).map_err(|never: Infallible| match never {}))
    }
}

impl<B> RefusalBody for ResponseBody<B> {
    fn refusal(text: Bytes) -> Self {
        ResponseBody::full(text)
    }

    fn metered(self, meter: BodyMeter) -> Self {
        self.with_meter(meter)
    }
}

impl<B: RefusalBody, L: Lease> RefusalBody for GuardedBody<B, L> {
    fn refusal(text: Bytes) -> Self {
        GuardedBody::new(B::refusal(text), None)
    }
}
