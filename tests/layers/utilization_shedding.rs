//! UtilizationShedLayer through a real axum router, on tokio's paused
//! clock with an evenly spread coin, so that shed fractions are exact:
//! nothing is shed before the delay, the low tier goes first, critical
//! never, the dead zone holds, recovery is as slow as the ramp and no
//! slower after a quiet spell, and odd coins and tiers change nothing.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::handlers::gated;
use axum::Router;
use axum::body::Body;
use axum::routing::get;
use fleetgate::clock::ManualClock;
use fleetgate::shed::{
    HeaderTier, Tiers, UtilizationShedLayer, UtilizationShedder, UtilizationShedderBuilder,
};
use http::{HeaderName, Request, StatusCode};
use http_body_util::BodyExt;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tower::ServiceExt;

const TIERS: [&str; 4] = ["critical", "high", "normal", "low"];
/// Requests per tier in one measurement: the coin cycles through this many
/// evenly spread values, so a batch sheds exactly `p × BATCH`.
const BATCH: u64 = 100;

/// `(k + 0.5) / BATCH` for k = 0, 1, ..., BATCH − 1, then again.
fn even_coin() -> impl Fn() -> f64 + Send + Sync + 'static {
    let next = AtomicU64::new(0);
    move || {
        (next.fetch_add(1, Ordering::Relaxed) % BATCH) as f64 / BATCH as f64 + 0.5 / BATCH as f64
    }
}

fn app(
    shedder: UtilizationShedder,
    gate: watch::Receiver<bool>,
    entered: mpsc::UnboundedSender<()>,
) -> Router {
    Router::new()
        .route("/", get(|| async { "ok" }))
        .route("/held", get(gated(gate, entered)))
        .layer(
            UtilizationShedLayer::new(shedder)
                .classify(HeaderTier::new(HeaderName::from_static("x-priority"))),
        )
}

/// The shedder `builder` sets up (on workers) with the even coin, its
/// router, the gate of `/held` and the signals of its handlers starting.
fn on_workers(
    builder: UtilizationShedderBuilder,
) -> (
    UtilizationShedder,
    Router,
    watch::Sender<bool>,
    mpsc::UnboundedReceiver<()>,
) {
    let shedder = builder.random(even_coin()).build().unwrap();
    let (open, gate) = watch::channel(false);
    let (entered_tx, entered) = mpsc::unbounded_channel();
    let app = app(shedder.clone(), gate, entered_tx);
    (shedder, app, open, entered)
}

async fn call(app: &Router, path: &str, tier: &str) -> StatusCode {
    let req = Request::get(path)
        .header("x-priority", tier)
        .body(Body::empty())
        .unwrap();
    let response = app.clone().oneshot(req).await.unwrap();
    let status = response.status();
    let _ = response.into_body().collect().await;
    status
}

/// Starts `n` critical `/held` requests and waits until each handler runs:
/// they keep `n` workers busy until [`release`].
async fn hold(
    app: &Router,
    entered: &mut mpsc::UnboundedReceiver<()>,
    n: usize,
) -> Vec<JoinHandle<StatusCode>> {
    let mut held = Vec::new();
    for _ in 0..n {
        let app = app.clone();
        held.push(tokio::spawn(async move {
            call(&app, "/held", "critical").await
        }));
        entered.recv().await.unwrap();
    }
    held
}

/// Opens the gate and waits for the held requests to end.
async fn release(open: &watch::Sender<bool>, held: Vec<JoinHandle<StatusCode>>) {
    let _ = open.send(true);
    for task in held {
        assert_eq!(task.await.unwrap(), StatusCode::OK);
    }
}

/// The fraction of each tier shed now, most important first.
async fn fractions(app: &Router) -> [f64; 4] {
    let mut out = [0.0; 4];
    for (i, tier) in TIERS.iter().enumerate() {
        let mut shed = 0;
        for _ in 0..BATCH {
            match call(app, "/", tier).await {
                StatusCode::OK => {}
                StatusCode::SERVICE_UNAVAILABLE => shed += 1,
                other => panic!("unexpected {other}"),
            }
        }
        out[i] = shed as f64 / BATCH as f64;
    }
    out
}

/// Moves the paused clock one second at a time up to `to`, with one
/// (critical, never shed) request a second so that every second is
/// sampled; the gauge, if any, reads `u` for each of these seconds.
async fn run_until(app: &Router, now: &mut u64, to: u64, gauge: Option<(&Mutex<f64>, f64)>) {
    while *now < to {
        tokio::time::advance(Duration::from_secs(1)).await;
        *now += 1;
        if let Some((gauge, u)) = gauge {
            *gauge.lock().unwrap() = u;
        }
        assert_eq!(call(app, "/", "critical").await, StatusCode::OK);
    }
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

#[tokio::test(start_paused = true)]
async fn a_gauge_trace_reproduces_the_ramp_and_the_slow_recovery() {
    let gauge = Arc::new(Mutex::new(0.0));
    let read = gauge.clone();
    let shedder = UtilizationShedder::gauge(move || *read.lock().unwrap())
        .random(even_coin())
        .build()
        .unwrap();
    let (_open, gate) = watch::channel(false);
    let (entered, _) = mpsc::unbounded_channel();
    let app = app(shedder.clone(), gate, entered);
    let mut t = 0;
    assert_eq!(call(&app, "/", "critical").await, StatusCode::OK);

    // (until second, utilization up to it, shed fractions then: critical,
    // high, normal, low)
    let trace: [(u64, f64, [f64; 4]); 11] = [
        // Saturated from t = 0: nothing is shed for the first 28 s.
        (27, 1.0, [0.0; 4]),
        (28, 1.0, [0.0; 4]),
        // 20 s later the amount is 1/6: half the low tier, nothing else.
        (48, 1.0, [0.0, 0.0, 0.0, 0.5]),
        // 60 s in: low gone, normal half.
        (88, 1.0, [0.0, 0.0, 0.5, 1.0]),
        // 120 s in: everything sheddable is shed; critical never.
        (148, 1.0, [0.0, 1.0, 1.0, 1.0]),
        (200, 1.0, [0.0, 1.0, 1.0, 1.0]),
        // 0.75 is in the dead zone: a minute there changes nothing.
        (260, 0.75, [0.0, 1.0, 1.0, 1.0]),
        // Idle: recovery takes as long as the ramp, most important first.
        (290, 0.0, [0.0, 0.25, 1.0, 1.0]),
        (320, 0.0, [0.0, 0.0, 0.5, 1.0]),
        (360, 0.0, [0.0, 0.0, 0.0, 0.5]),
        (380, 0.0, [0.0; 4]),
    ];
    for (until, u, expected) in trace {
        run_until(&app, &mut t, until, Some((&gauge, u))).await;
        assert_eq!(fractions(&app).await, expected, "at {t} s");
        // The state says the same: the drop probabilities, the gauge.
        let state = shedder.state();
        let p: Vec<f64> = state.tiers().iter().map(|t| t.shed_fraction()).collect();
        assert!(
            p.iter().zip(expected).all(|(p, e)| close(*p, e)),
            "at {t} s: {p:?}"
        );
        assert_eq!(state.utilization(), Some(u));
    }

    // Per tier, what this process shed and admitted.
    let state = shedder.state();
    let low = state.tier("low").unwrap();
    let critical = state.tier("critical").unwrap();
    assert_eq!(critical.shed(), 0);
    // Half a batch at 48 s and 360 s, whole batches from 88 s to 320 s.
    assert_eq!(low.shed(), 50 + 6 * BATCH + 50);
    assert_eq!(low.admitted() + low.shed(), 11 * BATCH);
    assert_eq!(state.in_flight(), 0);
}

#[tokio::test(start_paused = true)]
async fn its_own_requests_in_flight_drive_it_with_configured_numbers() {
    // 4 workers; shed after 2 s of saturation, everything after 4 s more.
    let (shedder, app, open, mut entered) = on_workers(
        UtilizationShedder::workers(4)
            .thresholds(0.5, 0.6)
            .delay(Duration::from_secs(2))
            .ramp(Duration::from_secs(4)),
    );
    let mut t = 0;
    assert_eq!(call(&app, "/", "critical").await, StatusCode::OK);

    // Four critical requests occupy every worker, until the gate opens.
    let held = hold(&app, &mut entered, 4).await;
    assert_eq!(shedder.state().tier("critical").unwrap().in_flight(), 4);
    run_until(&app, &mut t, 2, None).await;
    assert_eq!(fractions(&app).await, [0.0; 4]);
    run_until(&app, &mut t, 3, None).await;
    // a = 1/4: the low tier is shed 3/4 of the time.
    assert_eq!(fractions(&app).await, [0.0, 0.0, 0.0, 0.75]);
    let shed = Request::get("/")
        .header("x-priority", "low")
        .body(Body::empty())
        .unwrap();
    let response = app.clone().oneshot(shed).await.unwrap();
    // The coin's next value is 0.005: shed.
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(response.headers()["retry-after"], "5");
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert!(String::from_utf8_lossy(&body).contains("low"));
    run_until(&app, &mut t, 6, None).await;
    assert_eq!(fractions(&app).await, [0.0, 1.0, 1.0, 1.0]);

    // The workers free up: utilization 0, and the amount falls 1/4 a second.
    release(&open, held).await;
    assert_eq!(shedder.state().in_flight(), 0);
    run_until(&app, &mut t, 8, None).await;
    assert_eq!(fractions(&app).await, [0.0, 0.0, 0.5, 1.0]);
    run_until(&app, &mut t, 10, None).await;
    assert_eq!(fractions(&app).await, [0.0; 4]);
}

#[tokio::test(start_paused = true)]
async fn utilization_is_the_busy_share_of_time_not_the_count_at_arrivals() {
    // 2 workers, no delay, a 10 s ramp: a push of 1/2 moves 0.05 a second.
    let (shedder, app, open, mut entered) = on_workers(
        UtilizationShedder::workers(2)
            .delay(Duration::ZERO)
            .ramp(Duration::from_secs(10)),
    );
    assert_eq!(call(&app, "/", "critical").await, StatusCode::OK);

    // Waves: two requests busy for 0.9 s of every second, all done when
    // the next second's first request samples. The count at that instant
    // is 0; the busy share is 0.9.
    for _ in 0..10 {
        let _ = open.send(false);
        let wave = hold(&app, &mut entered, 2).await;
        tokio::time::advance(Duration::from_millis(900)).await;
        release(&open, wave).await;
        tokio::time::advance(Duration::from_millis(100)).await;
        assert_eq!(call(&app, "/", "critical").await, StatusCode::OK);
    }
    let state = shedder.state();
    assert!(close(state.utilization().unwrap(), 0.9), "{state:?}");
    assert!(close(state.amount().unwrap(), 0.5), "{state:?}");
    assert_eq!(fractions(&app).await, [0.0, 0.0, 0.5, 1.0]);
}

#[tokio::test(start_paused = true)]
async fn a_quiet_spell_counts_in_full_for_recovery() {
    // Default numbers: 28 s delay, 120 s ramp; 4 workers, all held busy.
    let (shedder, app, open, mut entered) = on_workers(UtilizationShedder::workers(4));
    let mut t = 0;
    assert_eq!(call(&app, "/", "critical").await, StatusCode::OK);
    let held = hold(&app, &mut entered, 4).await;
    run_until(&app, &mut t, 160, None).await;
    assert_eq!(fractions(&app).await, [0.0, 1.0, 1.0, 1.0]);
    release(&open, held).await;

    // Nobody comes for a minute: idle, the amount falls 1/120 a second, so
    // the first requests back find half of it gone (not 28 s worth).
    tokio::time::advance(Duration::from_secs(60)).await;
    assert_eq!(fractions(&app).await, [0.0, 0.0, 0.5, 1.0]);
    // After an hour more nothing is shed.
    tokio::time::advance(Duration::from_secs(3600)).await;
    assert_eq!(fractions(&app).await, [0.0; 4]);
    assert!(shedder.state().amount().unwrap() < 0.0);
}

#[tokio::test(start_paused = true)]
async fn no_delay_sampled_on_every_request_sheds_all_the_same() {
    // One worker, no delay, sampled on every request, a 10 s ramp.
    let shedder = UtilizationShedder::workers(1)
        .delay(Duration::ZERO)
        .ramp(Duration::from_secs(10))
        .sample_every(Duration::ZERO)
        .random(even_coin())
        .build()
        .unwrap();
    let (open, gate) = watch::channel(false);
    let (entered_tx, mut entered) = mpsc::unbounded_channel();
    let app = app(shedder, gate, entered_tx);
    let held = hold(&app, &mut entered, 1).await;
    let mut t = 0;
    run_until(&app, &mut t, 5, None).await;
    // Five saturated seconds: half of everything sheddable.
    assert_eq!(fractions(&app).await, [0.0, 0.0, 0.5, 1.0]);
    release(&open, held).await;
}

/// A shedder on a gauge stuck at 1, its clock moved by hand, fully
/// shedding after two seconds: no delay, a one-second ramp.
fn saturated(coin: impl Fn() -> f64 + Send + Sync + 'static) -> UtilizationShedder {
    let clock = ManualClock::new(Duration::from_secs(1));
    let shedder = UtilizationShedder::gauge(|| 1.0)
        .delay(Duration::ZERO)
        .ramp(Duration::from_secs(1))
        .clock(clock.clone())
        .random(coin)
        .build()
        .unwrap();
    let critical = shedder.tiers().critical();
    drop(shedder.admit(critical).expect("critical is never shed"));
    clock.advance(Duration::from_secs(2));
    drop(shedder.admit(critical).expect("critical is never shed"));
    assert_eq!(shedder.state().amount(), Some(1.0));
    shedder
}

#[test]
fn a_coin_out_of_range_never_admits_at_full_shedding() {
    for coin in [1.0, 1.5, f64::NAN, f64::INFINITY] {
        let shedder = saturated(move || coin);
        let low = shedder.tiers().get("low").unwrap();
        assert_eq!(shedder.admit(low).map(drop), Err(1.0), "coin {coin}");
    }
}

#[tokio::test]
async fn a_tier_of_another_set_is_answered_as_the_default_tier() {
    let shedder = saturated(|| 0.5);
    let other = Tiers::new(["a", "b", "c", "d", "e", "f"]).unwrap();
    let stray = other.get("f").unwrap();
    let app = Router::new().route("/", get(|| async { "ok" })).layer(
        UtilizationShedLayer::new(shedder.clone())
            .classify(move |_: &Request<Body>, _: &Tiers| Some(stray)),
    );
    let response = app
        .oneshot(Request::get("/").body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(
        String::from_utf8_lossy(&body),
        "overloaded: normal traffic is being shed; retry in 5 s\n"
    );
    assert_eq!(shedder.state().tier("normal").unwrap().shed(), 1);
}

/// Utilization over a concurrency limiter's current limit: the same four
/// requests saturate a limit of 4 and shed as over 4 workers, and leave a
/// limit of 8 half used, shedding nothing.
#[tokio::test(start_paused = true)]
async fn a_limiters_current_limit_is_its_capacity() {
    use fleetgate::MemoryStore;
    use fleetgate::concurrency::{ConcurrencyLimiter, ConcurrencyPolicy};

    for (limit, at_six) in [(4, [0.0, 1.0, 1.0, 1.0]), (8, [0.0; 4])] {
        let policy = ConcurrencyPolicy::new("backend", limit).unwrap();
        let limiter = ConcurrencyLimiter::new(policy, MemoryStore::new());
        let (_shedder, app, open, mut entered) = on_workers(
            UtilizationShedder::limit(&limiter)
                .thresholds(0.5, 0.6)
                .delay(Duration::from_secs(2))
                .ramp(Duration::from_secs(4)),
        );
        let mut t = 0;
        let held = hold(&app, &mut entered, 4).await;
        run_until(&app, &mut t, 6, None).await;
        assert_eq!(fractions(&app).await, at_six, "limit {limit}");
        release(&open, held).await;
    }
}
