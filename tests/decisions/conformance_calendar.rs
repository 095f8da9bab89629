//! The conformance suite for calendar quotas, run against every store.
//!
//! As in `conformance_windows` (both use `harness.rs`), each scenario runs
//! on a `MemoryStore` and on a `RedisStore` whose scripts read the same
//! `ManualClock` (`TimeSource::Client`; a manual clock reads Unix time),
//! every decision is asserted exactly, and the two stores' decision
//! sequences must be equal. The test after the scenarios checks the
//! layer's view: `Retry-After` and `RateLimit` count down to the next
//! calendar boundary in the quota's zone.
use crate::common;
use crate::harness::{S, Sut, US, allowed, conformance, denied};

use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::routing::get;
use common::RedisServer;
use fleetgate::key::GlobalKey;
use fleetgate::spec::PolicySpec;
use fleetgate::{Algorithm, Calendar, Limit, Policy, RateLimitLayer};
use http::{Request, StatusCode};
use tower::ServiceExt;

const HOUR: Duration = Duration::from_secs(3600);
const DAY: Duration = Duration::from_secs(86_400);

/// 23:00 in Paris on Saturday 28 March 2026 (22:00 UTC): an hour before
/// the night the clocks go forward, so that Sunday is 23 hours long.
const PARIS_SATURDAY_23H: Duration = Duration::from_secs(1_774_735_200);
/// One second before March 2026 starts, in UTC.
const FEBRUARY_LAST_SECOND: Duration = Duration::from_secs(1_772_323_199);

fn paris_daily(count: u64) -> Policy {
    let paris = Calendar::daily()
        .zone("Europe/Paris")
        .expect("a known zone");
    Policy::single("paris", Limit::calendar(count, paris).expect("valid quota")).expect("valid")
}

// ---------------------------------------------------------------------------
// Scenarios.

/// 3 a day in Paris: the day ends at local midnight, the next one is 23
/// hours long (the clocks go forward at 02:00), and a charge, a peek and a
/// refund count in the day that holds now.
async fn a_paris_day_of_23_hours(s: Sut) {
    let l = s.limiter(&paris_daily(3));
    assert_eq!(l.policy().algorithm(), Algorithm::Calendar);
    for k in 1..=3u64 {
        let d = s.check(&l, "k", 1).await;
        s.expect(&d, allowed(0, 3 - k, HOUR));
    }
    let d = s.check(&l, "k", 1).await;
    s.expect(&d, denied(0, 0, HOUR, HOUR));
    s.advance(HOUR - US);
    let d = s.check(&l, "k", 1).await;
    s.expect(&d, denied(0, 0, US, US));
    // Midnight in Paris: a new day, of 23 hours.
    s.advance(US);
    let d = s.check(&l, "k", 1).await;
    s.expect(&d, allowed(0, 2, 23 * HOUR));
    let d = s.check(&l, "k", 2).await;
    s.expect(&d, allowed(0, 0, 23 * HOUR));
    s.refund(&l, "k", 1).await;
    let d = s.peek(&l, "k", 1).await;
    s.expect(&d, allowed(0, 0, 23 * HOUR));
    // A charge past the quota: nothing passes until the day ends.
    s.advance(HOUR);
    let d = s.charge(&l, "k", 5).await;
    s.expect(&d, denied(0, 0, 22 * HOUR, 22 * HOUR));
    s.advance(22 * HOUR);
    // Monday, back to 24 hours; the overdraft went with Sunday.
    let d = s.check(&l, "k", 3).await;
    s.expect(&d, allowed(0, 0, DAY));
    // A cost above the quota can never pass.
    let d = s.check(&l, "k", 4).await;
    s.expect_never(&d, 0);
}

/// 2 a day and 3 a month, in UTC, decided together: the day denies at the
/// month's last second, both start again on the 1st, and the month denies
/// for the 30 days left of March once it is spent.
async fn a_day_and_a_month_together(s: Sut) {
    let spec: PolicySpec = "2/day + 3/month".parse().expect("a policy text");
    let l = s.limiter(&spec.build("plan").expect("valid"));
    let d = s.check(&l, "k", 1).await;
    s.expect(&d, allowed(0, 1, S));
    let d = s.check(&l, "k", 1).await;
    s.expect(&d, allowed(0, 0, S));
    let d = s.check(&l, "k", 1).await;
    s.expect(&d, denied(0, 0, S, S));
    // 1 March, 00:00 UTC: a new day and a new month of 31 days.
    s.advance(S);
    let d = s.check(&l, "k", 1).await;
    s.expect(&d, allowed(0, 1, DAY));
    let d = s.check(&l, "k", 1).await;
    s.expect(&d, allowed(0, 0, DAY));
    s.advance(DAY);
    // 2 March: the day has room, the month one call left, then none.
    let d = s.check(&l, "k", 1).await;
    s.expect(&d, allowed(1, 0, 30 * DAY));
    let d = s.check(&l, "k", 1).await;
    s.expect(&d, denied(1, 0, 30 * DAY, 30 * DAY));
    // Other identities count on their own.
    let d = s.check(&l, "other", 2).await;
    s.expect(&d, allowed(0, 0, DAY));
}

conformance! {
    prefix "cal";
    a_paris_day_of_23_hours at PARIS_SATURDAY_23H;
    a_day_and_a_month_together at FEBRUARY_LAST_SECOND;
}

// ---------------------------------------------------------------------------
// The layer's view.

/// Through an axum router on both stores: three calls, then 429 with
/// `Retry-After` and `RateLimit` counting down to midnight in Paris, and
/// `RateLimit-Policy` giving the quota and a day's length.
#[tokio::test]
async fn headers_count_down_to_the_calendar_boundary() {
    let server = RedisServer::start();
    let memory = Sut::memory(PARIS_SATURDAY_23H);
    let redis = Sut::redis(&server, "calhdr", PARIS_SATURDAY_23H).await;
    for s in [memory, redis] {
        let layer = RateLimitLayer::new(s.limiter(&paris_daily(3))).key(GlobalKey::new());
        let app = Router::new()
            .route("/api/ping", get(|| async { "pong" }))
            .layer(layer);
        let call = || async {
            app.clone()
                .oneshot(Request::get("/api/ping").body(Body::empty()).unwrap())
                .await
                .unwrap()
        };
        let header = |res: &http::Response<Body>, name: &str| {
            res.headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        for left in [2, 1, 0] {
            let res = call().await;
            assert_eq!(res.status(), StatusCode::OK, "{}", s.name);
            assert_eq!(
                header(&res, "ratelimit").as_deref(),
                Some(format!("\"3/day\";r={left};t=3600").as_str()),
                "{}",
                s.name
            );
            assert_eq!(
                header(&res, "ratelimit-policy").as_deref(),
                Some("\"3/day\";q=3;w=86400"),
                "{}",
                s.name
            );
        }
        let res = call().await;
        assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS, "{}", s.name);
        assert_eq!(
            header(&res, "retry-after").as_deref(),
            Some("3600"),
            "{}",
            s.name
        );
        // Half an hour later, half an hour to go.
        s.advance(HOUR / 2);
        let res = call().await;
        assert_eq!(
            header(&res, "retry-after").as_deref(),
            Some("1800"),
            "{}",
            s.name
        );
        assert_eq!(
            header(&res, "ratelimit").as_deref(),
            Some("\"3/day\";r=0;t=1800"),
            "{}",
            s.name
        );
        // Past midnight: a day of 23 hours, counted from zero.
        s.advance(HOUR / 2);
        let res = call().await;
        assert_eq!(res.status(), StatusCode::OK, "{}", s.name);
        assert_eq!(
            header(&res, "ratelimit").as_deref(),
            Some("\"3/day\";r=2;t=82800"),
            "{}",
            s.name
        );
    }
}
