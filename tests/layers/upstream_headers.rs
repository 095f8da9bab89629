//! Outbound clients that follow the upstream's own rate-limit headers
//! (`UpstreamHeaders`): a fleet of workers around an upstream whose limit
//! the clients' policy does not know, and which changes mid-run, earns no
//! 429 but for the calls already admitted when the limit drops; the same
//! fleet without the headers earns 429s every window. Memory store on
//! tokio's paused clock (`MonotonicClock`), so timings are exact; the Redis
//! fleet is in `tests/redis/upstream_headers.rs`.
use crate::paused_memory_store;

#[path = "../common/upstream_api.rs"]
mod upstream_api;

use std::time::Duration;

use fleetgate::key::GlobalKey;
use fleetgate::rate_limit::{RetryAfter, UpstreamHeaders};
use fleetgate::{Limit, Limiter, Policy, Rate, RateLimitLayer};
use tokio::time::Instant;
use tower::{Layer, ServiceExt};
use upstream_api::{Style, UpstreamApi, run_fleet};

const RATE: u64 = 100;
const BURST: u64 = 20;
const S: Duration = Duration::from_secs(1);
const MS: Duration = Duration::from_millis(1);

/// The clients' own policy: far looser than the upstream (100 a second,
/// bursts of 20), as when the upstream's limit is unknown.
fn loose_policy() -> Policy {
    let limit = Limit::builder(Rate::per_second(RATE))
        .burst(BURST)
        .build()
        .unwrap();
    Policy::single("upstream", limit).unwrap()
}

/// Workers, each one call at a time: the most calls in flight (admitted
/// by the fleet but not yet answered) at any moment.
const WORKERS: usize = 4;

/// 10 calls per 2 s, then 5 from 7 s (in the middle of the window
/// [6 s, 8 s)), then 20 from 14 s; the fleet runs 22 s.
const SCHEDULE: [(Duration, u64); 3] = [
    (Duration::ZERO, 10),
    (Duration::from_secs(7), 5),
    (Duration::from_secs(14), 20),
];

/// The bound. A report counts the calls the upstream has seen; the store
/// adds those the fleet has admitted since the last report and not yet
/// made (slots reserved in the future), so a report never lets the fleet
/// overshoot what is left. What it cannot know is a limit that drops
/// below what the current window has already used: the calls already in
/// flight then (at most `WORKERS`, each worker making one call at a time)
/// may be refused, all in that window, and the first 429 pauses the fleet
/// to the window's end. Each window opens with at most `WORKERS` calls
/// before its first report, fewer than any limit here, so none of those
/// is refused.
#[tokio::test(start_paused = true)]
async fn a_fleet_follows_an_unknown_limit_that_changes_in_every_style() {
    for style in [Style::Ietf, Style::XRateLimit, Style::OpenAi] {
        let api = UpstreamApi::new(2 * S, &SCHEDULE, style);
        let limiter = Limiter::new(loose_policy(), paused_memory_store());
        let run = run_fleet(&api, &[limiter], WORKERS, 22 * S, UpstreamHeaders::new()).await;
        assert_eq!(run.errors, Vec::<String>::new(), "{style:?}");
        let refused = api.refused();
        assert!(
            refused.len() <= WORKERS,
            "{style:?}: {} 429s: {refused:?}",
            refused.len()
        );
        for at in &refused {
            assert!(
                (6 * S..8 * S).contains(at),
                "{style:?}: a 429 at {at:?}, outside the window the limit dropped in"
            );
        }
        // No window took more than its limit (the upstream refuses past
        // it: this checks the bookkeeping), and with resets to the
        // millisecond the fleet used exactly what the upstream allowed,
        // down and up again.
        let accepted = api.accepted();
        let per_window: Vec<u64> = (0..11)
            .map(|w| accepted.get(&w).copied().unwrap_or(0))
            .collect();
        for (w, &n) in per_window.iter().enumerate() {
            let limit = api.limit_at(2 * S * w as u32 + 2 * S - MS);
            assert!(n <= limit.max(10), "{style:?}: window {w}: {n} calls");
        }
        if !matches!(style, Style::OpenAi) {
            // Resets in whole seconds, rounded up: the calls left in a
            // window's last second are pushed past its end (see
            // docs/outbound.md), so the fleet gets fewer in, never more.
            assert!(
                per_window.iter().all(|&n| n >= 4),
                "{style:?}: stalled: {per_window:?}"
            );
            continue;
        }
        // The window after the 429s may give up one call: slots reserved
        // before a pause stay counted as in flight until a report has seen
        // them (conservative: those before the reset were refused).
        assert!(per_window[4] >= 4, "{style:?}: {per_window:?}");
        let mut rest = per_window.clone();
        rest.remove(4);
        assert_eq!(rest, [10, 10, 10, 5, 5, 5, 20, 20, 20, 20], "{style:?}");
    }
}

/// The same fleet without the headers (pausing on each 429's
/// `Retry-After`) earns 429s in every window: what the test above guards
/// against is real.
#[tokio::test(start_paused = true)]
async fn without_the_headers_the_fleet_earns_429s_every_window() {
    let api = UpstreamApi::new(2 * S, &SCHEDULE, Style::Ietf);
    let limiter = Limiter::new(loose_policy(), paused_memory_store());
    let run = run_fleet(&api, &[limiter], WORKERS, 22 * S, RetryAfter::new()).await;
    assert_eq!(run.errors, Vec::<String>::new());
    let refused = api.refused();
    assert!(refused.len() >= 11 * WORKERS / 2, "{} 429s", refused.len());
}

/// One answer that says nothing is left until its reset in 5 s holds the
/// next call back to exactly then; one that says 2 are left admits two,
/// at the policy's rate, in the last stretch before its reset, and the
/// third at the reset.
#[tokio::test(start_paused = true)]
async fn what_is_left_holds_the_next_calls_back_exactly() {
    for (header, waits) in [
        ("\"default\";r=0;t=5", vec![5 * S]),
        ("\"default\";r=2;t=5", vec![4_980 * MS, 4_990 * MS, 5 * S]),
    ] {
        let limiter = Limiter::new(loose_policy(), paused_memory_store());
        let client = RateLimitLayer::new(limiter.clone())
            .key(GlobalKey::new())
            .typed_errors()
            .wait_up_to(60 * S)
            .upstream_feedback(UpstreamHeaders::new())
            .layer(tower::service_fn(move |_: http::Request<()>| async move {
                let res = http::Response::builder()
                    .header("ratelimit", header)
                    .body(())
                    .unwrap();
                Ok::<_, std::convert::Infallible>(res)
            }));
        let start = Instant::now();
        client
            .clone()
            .oneshot(http::Request::new(()))
            .await
            .unwrap();
        // Reserve the next slots straight from the limiter: no call (and no
        // further report) in between.
        let key = fleetgate::Key::new("global");
        for want in waits {
            let d = limiter.reserve(&key, 1, 60 * S).await.unwrap();
            assert_eq!(d.wait(), want, "{header}");
        }
        assert_eq!(start.elapsed(), Duration::ZERO);
    }
}
