//! What the HTTP benches put in front of the hello-world handler, shared by
//! `benches/http.rs` (wall clock) and `benches/http_instructions.rs`
//! (callgrind), so that both measure the same cases.

use std::sync::Arc;

use axum::Router;
use axum::routing::get;
use fleetgate::{ConfigError, Limit, Rate};
use tower_governor::GovernorLayer;
use tower_governor::governor::GovernorConfigBuilder;

/// The bare application: `GET /` answers "hello, world".
pub fn hello() -> Router {
    Router::new().route("/", get(|| async { "hello, world" }))
}

/// The limit of every limited case. Admitted: far above any load this
/// machine can make. Rejected: one per hour, so all but the first request
/// are refused.
pub fn limit(rejected: bool) -> Result<Limit, ConfigError> {
    if rejected {
        Limit::builder(Rate::per_hour(1)).burst(1).build()
    } else {
        Limit::builder(Rate::per_second(1_000_000))
            .burst(1_000_000_000)
            .build()
    }
}

/// `router` behind tower_governor with the same limit as [`limit`]; with
/// `headers`, tower_governor's rate-limit headers on (`use_headers`:
/// `x-ratelimit-limit` and `x-ratelimit-remaining` on the responses that
/// pass), to set beside our layer's default headers.
pub fn with_governor(
    router: Router,
    rejected: bool,
    headers: bool,
) -> Result<Router, &'static str> {
    let mut builder = GovernorConfigBuilder::default();
    if rejected {
        builder.per_second(3600).burst_size(1);
    } else {
        builder.per_nanosecond(1).burst_size(1_000_000_000);
    }
    // Two arms: `use_headers` changes the configuration's type.
    Ok(if headers {
        let config = builder.use_headers().finish().ok_or("governor config")?;
        router.layer(GovernorLayer::new(Arc::new(config)))
    } else {
        let config = builder.finish().ok_or("governor config")?;
        router.layer(GovernorLayer::new(Arc::new(config)))
    })
}
