//! Calls the gRPC demo (`cargo run --example grpc`) a number of times in a
//! row and prints what each call got.
//!
//! ```text
//! cargo run --example grpc_client
//! cargo run --example grpc_client -- --calls 20 --api-key alice
//! ```
//!
//! One line per call, then a summary:
//!
//! ```text
//! call 1: OK "Hello, fleetgate!"
//! ...
//! call 6: ResourceExhausted "rate limit hello exceeded ..." pushback_ms=1000
//! calls=8 ok=5 resource_exhausted=3 other=0
//! ```
//!
//! `pushback_ms` is the server's `grpc-retry-pushback-ms`: how long to
//! wait before the call would pass.
//!
//! Options, as flags or environment variables (flags win):
//!
//! | flag | env | default | meaning |
//! |---|---|---|---|
//! | `--addr A` | `FLEETGATE_GRPC_ADDR` | `127.0.0.1:50051` | the server |
//! | `--calls N` | `FLEETGATE_CALLS` | 8 | calls, one after the other |
//! | `--api-key K` | `FLEETGATE_API_KEY` | `demo-key` | `x-api-key` metadata (`""`: none, limited by IP) |
//! | `--name N` | | `fleetgate` | the name to greet |

use std::process::ExitCode;

use tonic::Code;
use tonic::metadata::MetadataValue;

#[allow(dead_code)] // the server half of the generated code is the server example's
mod pb {
    include!("../proto/fleetgate.demo.rs");
}
use pb::HelloRequest;
use pb::greeter_client::GreeterClient;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

struct Options {
    addr: String,
    calls: u32,
    api_key: String,
    name: String,
}

fn options() -> Result<Options, BoxError> {
    let env =
        |name: &str, default: &str| std::env::var(name).unwrap_or_else(|_| default.to_owned());
    let mut addr = env("FLEETGATE_GRPC_ADDR", "127.0.0.1:50051");
    let mut calls = env("FLEETGATE_CALLS", "8");
    let mut api_key = env("FLEETGATE_API_KEY", "demo-key");
    let mut name = "fleetgate".to_owned();
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args.next().ok_or_else(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--addr" => addr = value,
            "--calls" => calls = value,
            "--api-key" => api_key = value,
            "--name" => name = value,
            _ => {
                return Err(
                    format!("unknown flag {flag}; see the top of examples/grpc_client.rs").into(),
                );
            }
        }
    }
    let calls = calls
        .parse()
        .map_err(|err| format!("--calls {calls:?}: {err}"))?;
    Ok(Options {
        addr,
        calls,
        api_key,
        name,
    })
}

fn main() -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("Error: tokio runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("Error: {err}");
            ExitCode::FAILURE
        }
    }
}

async fn run() -> Result<(), BoxError> {
    let options = options()?;
    let api_key = match options.api_key.as_str() {
        "" => None,
        key => Some(MetadataValue::try_from(key).map_err(|err| format!("--api-key: {err}"))?),
    };
    let url = format!("http://{}", options.addr);
    let mut client = GreeterClient::connect(url.clone())
        .await
        .map_err(|err| format!("{url}: {err}"))?;

    let (mut ok, mut exhausted, mut other) = (0u32, 0u32, 0u32);
    for call in 1..=options.calls {
        let mut request = tonic::Request::new(HelloRequest {
            name: options.name.clone(),
        });
        if let Some(key) = &api_key {
            request.metadata_mut().insert("x-api-key", key.clone());
        }
        match client.say_hello(request).await {
            Ok(reply) => {
                ok += 1;
                println!("call {call}: OK {:?}", reply.into_inner().message);
            }
            Err(status) => {
                match status.code() {
                    Code::ResourceExhausted => exhausted += 1,
                    _ => other += 1,
                }
                let pushback = status
                    .metadata()
                    .get("grpc-retry-pushback-ms")
                    .and_then(|value| value.to_str().ok())
                    .unwrap_or("none");
                println!(
                    "call {call}: {:?} {:?} pushback_ms={pushback}",
                    status.code(),
                    status.message()
                );
            }
        }
    }
    println!(
        "calls={} ok={ok} resource_exhausted={exhausted} other={other}",
        options.calls
    );
    Ok(())
}
