//! Without any tracing subscriber, tracing's `log` feature (which axum's
//! default `tower-log` turns on) hands the `fleetgate.decision` span to
//! `log`: a logger taking debug records still sees it, and with debug
//! records filtered out the layer makes no span at all. Its own process:
//! installing a tracing subscriber anywhere would turn the fallback off.
//! A router keyed by `PeerIp` but served without connect info says in the
//! log how to serve it.

use std::net::SocketAddr;
use std::sync::{Mutex, Once};

use fleetgate::key::{GlobalKey, PeerIp};
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

/// Installs the logger, and keeps the tests, which share it and its level,
/// one at a time.
async fn logger() -> tokio::sync::MutexGuard<'static, ()> {
    static INSTALL: Once = Once::new();
    static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    INSTALL.call_once(|| log::set_logger(&RECORDS).expect("the only logger of this test binary"));
    ONE_AT_A_TIME.lock().await
}

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
    let _one_at_a_time = logger().await;
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

/// Forgetting `into_make_service_with_connect_info` leaves `PeerIp`
/// without an address: every request is refused with a 400 whose body
/// points to the log, and the log says, once, what to do.
#[tokio::test(flavor = "current_thread")]
async fn peer_ip_without_connect_info_says_how_to_serve_the_router() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let _one_at_a_time = logger().await;
    log::set_max_level(log::LevelFilter::Warn);
    RECORDS.0.lock().unwrap().clear();
    let policy = Policy::single("peer", Limit::new(Rate::per_second(100)).unwrap()).unwrap();
    let app = axum::Router::new()
        .route("/", axum::routing::get(|| async { "ok" }))
        .layer(RateLimitLayer::new(Limiter::new(policy, MemoryStore::new())).key(PeerIp));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr: SocketAddr = listener.local_addr().unwrap();
    // The mistake: served without `into_make_service_with_connect_info`.
    let server = tokio::spawn(async move { axum::serve(listener, app).await });
    for _ in 0..3 {
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        let req = format!("GET / HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\n\r\n");
        stream.write_all(req.as_bytes()).await.unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).await.unwrap();
        assert!(response.starts_with("HTTP/1.1 400"), "{response}");
        assert!(
            response.ends_with(
                "\r\n\r\nrate limiting could not identify the client; the server's log says why\n"
            ),
            "{response}"
        );
    }
    server.abort();
    let records = std::mem::take(&mut *RECORDS.0.lock().unwrap());
    let fix = "PeerIp found no ConnectInfo: serve the router with \
               into_make_service_with_connect_info::<SocketAddr>()";
    let told = records.iter().filter(|r| r.contains(fix)).count();
    assert_eq!(told, 1, "said once, however many requests: {records:#?}");
}
