//! Without any tracing subscriber, tracing's `log` feature (which axum's
//! default `tower-log` turns on) hands the `fleetgate.decision` span to
//! `log`: a logger taking debug records still sees it, and with debug
//! records filtered out the layer makes no span at all. Its own process:
//! installing a tracing subscriber anywhere would turn the fallback off.

use std::sync::Mutex;

use fleetgate::key::GlobalKey;
use fleetgate::{Limit, Limiter, MemoryStore, Policy, Rate, RateLimitLayer};
use http::{Request, Response};
use tower::{Layer, ServiceExt, service_fn};

/// Every record's text, as a logger taking everything down to debug.
struct Records(Mutex<Vec<String>>);

impl log::Log for Records {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }

    fn log(&self, record: &log::Record<'_>) {
        if let Ok(mut records) = self.0.lock() {
            records.push(format!("{} {}", record.target(), record.args()));
        }
    }

    fn flush(&self) {}
}

static RECORDS: Records = Records(Mutex::new(Vec::new()));

fn span_records() -> usize {
    let mut records = RECORDS.0.lock().unwrap();
    let count = records
        .iter()
        .filter(|r| r.contains("fleetgate.decision"))
        .count();
    records.clear();
    count
}

#[tokio::test(flavor = "current_thread")]
async fn the_decision_span_reaches_log_only_when_debug_records_are_taken() {
    log::set_logger(&RECORDS).expect("the only logger of this test binary");
    let policy = Policy::single("logged", Limit::new(Rate::per_second(100)).unwrap()).unwrap();
    let layer = RateLimitLayer::new(Limiter::new(policy, MemoryStore::new())).key(GlobalKey::new());
    let service = layer.layer(service_fn(|_: Request<()>| async {
        Ok::<_, std::convert::Infallible>(Response::new(String::new()))
    }));

    log::set_max_level(log::LevelFilter::Debug);
    let response = service.clone().oneshot(Request::new(())).await.unwrap();
    assert!(response.status().is_success());
    assert!(
        span_records() > 0,
        "a logger taking debug records sees the decision span"
    );

    log::set_max_level(log::LevelFilter::Info);
    let response = service.oneshot(Request::new(())).await.unwrap();
    assert!(response.status().is_success());
    assert_eq!(
        span_records(),
        0,
        "no span is made for a logger above debug"
    );
}
