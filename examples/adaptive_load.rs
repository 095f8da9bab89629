//! Drives the demo's `GET /api/adaptive` with concurrent callers that
//! each call again as soon as they are answered (a refused caller too),
//! and checks what the adaptive limit promises (docs/demo.md): admitted
//! calls keep the backend's latency, nearly all of its capacity is
//! admitted, and every other call is refused soon with 429 or 503 and
//! `Retry-After`.
//!
//! ```sh
//! cargo run --example server &
//! cargo run --example adaptive_load -- http://127.0.0.1:3000/api/adaptive
//! ```
//!
//! Flags: `--callers N` (64), `--seconds S` (10), and the bounds
//! `--p99-ms` (admitted calls' p99 latency under it, 60), `--min-rate`
//! (calls admitted a second, at least, 360) and `--refused-ms` (refused
//! calls' p99 under it, 60). One keep-alive HTTP/1.1 connection per
//! caller; latency is to the response head; a connection or call that
//! takes over 10 s fails the run. Prints one line,
//! `admitted=N rate=R/s p99_ms=P refused=M refused_p99_ms=Q other=K`,
//! and exits 1 if a bound is missed.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use axum::body::Body;
use http::{Request, StatusCode, Uri, header};
use http_body_util::{BodyExt, Limited};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::time::timeout;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

struct Args {
    uri: Uri,
    callers: usize,
    seconds: f64,
    p99_ms: f64,
    min_rate: f64,
    refused_ms: f64,
}

fn args() -> Result<Args, BoxError> {
    let mut args = Args {
        uri: Uri::from_static("http://127.0.0.1:3000/api/adaptive"),
        callers: 64,
        seconds: 10.0,
        p99_ms: 60.0,
        min_rate: 360.0,
        refused_ms: 60.0,
    };
    let mut given = std::env::args().skip(1);
    while let Some(arg) = given.next() {
        let mut value = || given.next().ok_or_else(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--callers" => args.callers = value()?.parse()?,
            "--seconds" => args.seconds = value()?.parse()?,
            "--p99-ms" => args.p99_ms = value()?.parse()?,
            "--min-rate" => args.min_rate = value()?.parse()?,
            "--refused-ms" => args.refused_ms = value()?.parse()?,
            url if !url.starts_with("--") => args.uri = url.parse()?,
            other => return Err(format!("unknown flag {other}").into()),
        }
    }
    let run = Duration::try_from_secs_f64(args.seconds).unwrap_or_default();
    if args.callers == 0
        || args.callers > 10_000
        || run.is_zero()
        || run > Duration::from_secs(3600)
    {
        return Err("--callers must be 1 to 10000 and --seconds above 0, at most 3600".into());
    }
    for (flag, bound) in [
        ("--p99-ms", args.p99_ms),
        ("--min-rate", args.min_rate),
        ("--refused-ms", args.refused_ms),
    ] {
        if !bound.is_finite() || bound < 0.0 {
            return Err(format!("{flag} must be a number, 0 or more").into());
        }
    }
    Ok(args)
}

/// What one caller saw.
#[derive(Default)]
struct Seen {
    admitted: Vec<Duration>,
    refused: Vec<Duration>,
    other: Vec<String>,
}

/// The longest a connection or one call may take before the run fails.
const PATIENCE: Duration = Duration::from_secs(10);
/// The largest response body read.
const LARGEST_BODY: usize = 1 << 20;

async fn caller(uri: Uri, stop: Instant) -> Result<Seen, BoxError> {
    let authority = uri.authority().ok_or("the URL has no host")?.clone();
    let stream = timeout(PATIENCE, TcpStream::connect(authority.as_str())).await??;
    stream.set_nodelay(true)?;
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(connection);
    let path = uri.path_and_query().map_or("/", |p| p.as_str()).to_owned();
    let mut seen = Seen::default();
    while Instant::now() < stop {
        sender.ready().await?;
        let request = Request::get(path.as_str())
            .header(header::HOST, authority.as_str())
            .body(Body::empty())?;
        let started = Instant::now();
        let response = timeout(PATIENCE, sender.send_request(request)).await??;
        let took = started.elapsed();
        let status = response.status();
        let retry_after = response.headers().contains_key(header::RETRY_AFTER);
        let body = Limited::new(response.into_body(), LARGEST_BODY);
        timeout(PATIENCE, body.collect()).await??;
        match status {
            StatusCode::OK => seen.admitted.push(took),
            StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE if retry_after => {
                seen.refused.push(took)
            }
            other => seen.other.push(other.to_string()),
        }
    }
    Ok(seen)
}

fn p99_ms(took: &mut [Duration]) -> f64 {
    if took.is_empty() {
        return 0.0;
    }
    took.sort();
    took[(took.len() * 99 / 100).min(took.len() - 1)].as_secs_f64() * 1000.0
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = match args() {
        Ok(args) => args,
        Err(e) => {
            eprintln!("adaptive_load: {e}");
            return ExitCode::from(2);
        }
    };
    let started = Instant::now();
    // Checked by args(): above 0, at most an hour.
    let stop = started + Duration::from_secs_f64(args.seconds);
    let callers: Vec<_> = (0..args.callers)
        .map(|_| tokio::spawn(caller(args.uri.clone(), stop)))
        .collect();
    let mut all = Seen::default();
    for caller in callers {
        match caller.await {
            Ok(Ok(mut seen)) => {
                all.admitted.append(&mut seen.admitted);
                all.refused.append(&mut seen.refused);
                all.other.append(&mut seen.other);
            }
            Ok(Err(e)) => all.other.push(format!("error: {e}")),
            Err(e) => all.other.push(format!("caller failed: {e}")),
        }
    }
    let elapsed = started.elapsed().as_secs_f64();
    let rate = all.admitted.len() as f64 / elapsed;
    let (admitted_p99, refused_p99) = (p99_ms(&mut all.admitted), p99_ms(&mut all.refused));
    println!(
        "admitted={} rate={rate:.0}/s p99_ms={admitted_p99:.1} refused={} refused_p99_ms={refused_p99:.1} other={}",
        all.admitted.len(),
        all.refused.len(),
        all.other.len()
    );
    let mut failed = Vec::new();
    if !all.other.is_empty() {
        all.other.sort();
        all.other.dedup();
        failed.push(format!(
            "answers neither 200 nor a refusal with Retry-After: {:?}",
            all.other
        ));
    }
    if admitted_p99 >= args.p99_ms {
        failed.push(format!(
            "admitted p99 {admitted_p99:.1} ms is not under {} ms",
            args.p99_ms
        ));
    }
    if rate < args.min_rate {
        failed.push(format!("{rate:.0} admitted/s is under {}", args.min_rate));
    }
    if refused_p99 >= args.refused_ms {
        failed.push(format!(
            "refused p99 {refused_p99:.1} ms is not under {} ms",
            args.refused_ms
        ));
    }
    for reason in &failed {
        eprintln!("FAIL: {reason}");
    }
    if failed.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
