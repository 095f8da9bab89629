//! Instructions per HTTP request in the server, for callgrind: not a
//! measurement by itself. `scripts/callgrind-http.sh` runs
//! `serve <bare|memory|memory-no-headers|memory-charge-after|memory-refund|memory-count|governor|governor-headers> <admitted|rejected> <port file>`
//! under `valgrind --tool=callgrind` and `load <port> <requests>` beside
//! it, for N and 2N requests: (instructions at 2N − at N) / N is what a
//! request cost the server, start-up and warm-up cancelled out. The
//! routers are those of `benches/http.rs` (same limits). The loader sends
//! 300 warm-up requests on one connection, then the requests over 16
//! keep-alive connections, then `/quit`, a route outside the layer that
//! ends the server.
//!
//! `layer <variant> <admitted|rejected> <calls>` makes the same router
//! answer `calls` requests in process, called as a tower `Service` and its
//! future polled once, with no server, socket or runtime around it
//! (`scripts/callgrind-layer.sh`): what the layer costs on its own, beside
//! the router's own work. Run by `cargo bench` without arguments, it does
//! nothing.
#[path = "common/routers.rs"]
mod routers;

use std::future::Future;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::task::{Context, Poll, Waker};

use axum::Router;
use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::http::Request;
use axum::routing::get;
use fleetgate::rate_limit::ResponseCost;
use fleetgate::{HeaderStyle, Limiter, MemoryStore, Policy, RateLimitLayer};
use tower::Service;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

fn main() -> Result<(), BoxError> {
    let args: Vec<String> = std::env::args().collect();
    let arg = |i: usize| args.get(i).map(String::as_str).ok_or("missing argument");
    match args.get(1).map(String::as_str) {
        Some("serve") => serve(arg(2)?, arg(3)?, arg(4)?),
        Some("load") => load(arg(2)?.parse()?, arg(3)?.parse()?),
        Some("layer") => layer(arg(2)?, arg(3)?, arg(4)?.parse()?),
        // `cargo bench` passes `--bench`: nothing to measure by itself.
        _ => {
            eprintln!("http_instructions: run by scripts/callgrind-http.sh");
            Ok(())
        }
    }
}

/// The router of one case: the hello-world handler behind `variant`.
fn app(variant: &str, load: &str) -> Result<Router, BoxError> {
    let router = routers::hello();
    let rejected = load == "rejected";
    let limit = routers::limit(rejected)?;
    let policy = Policy::single("bench0", limit)?;
    Ok(match variant {
        "bare" => router,
        "memory" => router.layer(RateLimitLayer::new(Limiter::new(
            policy,
            MemoryStore::new(),
        ))),
        "memory-no-headers" => router.layer(
            RateLimitLayer::new(Limiter::new(policy, MemoryStore::new()))
                .headers(HeaderStyle::None),
        ),
        // Cost known after the response: a peek before, and after the
        // response a charge (the hello handler states no cost: the
        // request's, 1), or nothing (a 200 is neither refunded nor a 401).
        "memory-charge-after" => router.layer(
            RateLimitLayer::new(Limiter::new(policy, MemoryStore::new()))
                .response_cost(ResponseCost::header("x-tokens-used")),
        ),
        "memory-refund" => router.layer(
            RateLimitLayer::new(Limiter::new(policy, MemoryStore::new()))
                .response_cost(ResponseCost::refund_server_errors()),
        ),
        "memory-count" => router.layer(
            RateLimitLayer::new(Limiter::new(policy, MemoryStore::new()))
                .response_cost(ResponseCost::count_if(|head| head.status == 401)),
        ),
        "governor" => routers::with_governor(router, rejected, false)?,
        "governor-headers" => routers::with_governor(router, rejected, true)?,
        _ => return Err("variant".into()),
    })
}

/// `calls` requests from one client address through `variant`'s router,
/// in this thread: each future is polled once (the handler and every
/// layer measured answer at once).
fn layer(variant: &str, load: &str, calls: usize) -> Result<(), BoxError> {
    // Finalised as `axum::serve` does, so that no call builds its route again.
    let mut app = app(variant, load)?.with_state(());
    let mut cx = Context::from_waker(Waker::noop());
    let peer = ConnectInfo(SocketAddr::from(([127, 0, 0, 1], 40000)));
    let mut passed = 0;
    for _ in 0..calls {
        let mut req = Request::new(Body::empty());
        req.extensions_mut().insert(peer);
        if Service::<Request<Body>>::poll_ready(&mut app, &mut cx).is_pending() {
            return Err("the router was not ready".into());
        }
        let fut = std::pin::pin!(app.call(req));
        match fut.poll(&mut cx) {
            Poll::Ready(Ok(res)) => passed += usize::from(res.status().is_success()),
            Poll::Ready(Err(never)) => match never {},
            Poll::Pending => return Err("a layer did not answer at once".into()),
        }
    }
    eprintln!("ok={passed} other={}", calls - passed);
    Ok(())
}

fn serve(variant: &str, load: &str, port_file: &str) -> Result<(), BoxError> {
    let app = app(variant, load)?;
    // Added after the layer, so it is never limited.
    let app = app.route(
        "/quit",
        get(|| async {
            std::process::exit(0);
            #[allow(unreachable_code)]
            ""
        }),
    );
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0)).await?;
        std::fs::write(port_file, listener.local_addr()?.port().to_string())?;
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await?;
        Ok::<_, BoxError>(())
    })
}

fn request(stream: &mut TcpStream, path: &str, buf: &mut Vec<u8>) -> Result<u16, BoxError> {
    write!(stream, "GET {path} HTTP/1.1\r\nHost: x\r\n\r\n")?;
    buf.clear();
    let mut chunk = [0u8; 4096];
    loop {
        let n = stream.read(&mut chunk)?;
        if n == 0 {
            return Err("eof".into());
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = std::str::from_utf8(&buf[..end])?.to_ascii_lowercase();
            let len: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .map(|v| v.trim().parse())
                .transpose()?
                .unwrap_or(0);
            while buf.len() < end + 4 + len {
                let n = stream.read(&mut chunk)?;
                if n == 0 {
                    return Err("eof".into());
                }
                buf.extend_from_slice(&chunk[..n]);
            }
            let status: u16 = head[9..12].parse()?;
            return Ok(status);
        }
    }
}

fn load(port: u16, requests: usize) -> Result<(), BoxError> {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    // The script starts the loader once the server has written its port.
    let mut first = TcpStream::connect(addr)?;
    first.set_nodelay(true)?;
    let mut buf = Vec::new();
    // 300 warm-up requests on one connection.
    for _ in 0..300 {
        request(&mut first, "/", &mut buf)?;
    }
    let per = requests / 16;
    let threads: Vec<_> = (0..16)
        .map(|_| {
            std::thread::spawn(move || -> Result<[usize; 2], String> {
                let mut s = TcpStream::connect(addr).map_err(|e| e.to_string())?;
                s.set_nodelay(true).map_err(|e| e.to_string())?;
                let mut buf = Vec::new();
                let mut counts = [0; 2];
                for _ in 0..per {
                    match request(&mut s, "/", &mut buf).map_err(|e| e.to_string())? {
                        200 => counts[0] += 1,
                        _ => counts[1] += 1,
                    }
                }
                Ok(counts)
            })
        })
        .collect();
    let mut total = [0; 2];
    for t in threads {
        let c = t.join().map_err(|_| "join")??;
        total[0] += c[0];
        total[1] += c[1];
    }
    eprintln!("ok={} other={}", total[0], total[1]);
    let _ = request(&mut first, "/quit", &mut buf);
    Ok(())
}
