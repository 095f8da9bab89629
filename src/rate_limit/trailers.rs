//! Upstream feedback read from a response body's trailers: a gRPC status
//! sent after a streamed reply, too late for the response future.

use std::sync::Arc;

use http::HeaderMap;

use crate::response::TrailerWatch;

use super::{RateSettings, RetryAfter, UpstreamQuota};
use crate::key::Key;

// `pub` in a private module and re-exported only inside the crate: it
// appears in a hidden method of the public, user-implementable
// `UpstreamFeedback`, and as no one outside can name it, no one outside
// can override or call that method (a sealed method; users' own impls
// keep the default).

/// How a feedback reads the trailers that end a response's body (a gRPC
/// status after a streamed reply): as a [`RetryAfter`] reads a gRPC
/// refusal.
#[doc(hidden)]
#[derive(Clone, Copy, Debug)]
pub struct TrailerReader(pub(crate) RetryAfter);

/// What a watched body does with its trailers: reads them with `reader`
/// and pauses the call's identity if they ask for it.
pub(crate) fn watch(reader: TrailerReader, settings: Arc<RateSettings>, key: Key) -> TrailerWatch {
    TrailerWatch::new(move |trailers| seen(reader, settings, key, trailers))
}

/// Reads `trailers`; records the pause they ask for, if any: at once on
/// the memory store, else in a task of the current tokio runtime (the
/// body's reader should not wait for the store).
fn seen(reader: TrailerReader, settings: Arc<RateSettings>, key: Key, trailers: &HeaderMap) {
    {
        let Some(pause) = reader.0.grpc_pause(trailers).filter(|p| !p.is_zero()) else {
            return;
        };
        let hold = UpstreamQuota {
            remaining: 0,
            reset: pause,
        };
        let mut report = settings.limiter.defer(&key, pause);
        if let Some(recorded) = report.take_ready() {
            super::quota::log_hold(settings.limiter.name(), hold, &recorded);
            return;
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let recorded = report.await;
                super::quota::log_hold(settings.limiter.name(), hold, &recorded);
            });
        }
    }
}
