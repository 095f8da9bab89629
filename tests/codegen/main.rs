//! The Rust code generated from `proto/greeter.proto` is committed
//! (`proto/fleetgate.demo.rs`), so building the gRPC demo, tests and bench
//! needs no protoc. This test regenerates it with tonic's generator and the
//! protoc shipped in `protoc-bin-vendored`, and fails when the committed
//! file differs: after changing the proto (or upgrading tonic or prost), run
//! `FLEETGATE_REGENERATE=1 cargo test --all-features --test codegen` to
//! write the new file, and commit it.

use std::path::{Path, PathBuf};

// The committed code builds against this crate's tonic and prost (the
// other gRPC targets include it the same way).
#[allow(dead_code)]
mod pb {
    include!("../../proto/fleetgate.demo.rs");
}

const PROTO: &str = "proto/greeter.proto";
const GENERATED: &str = "proto/fleetgate.demo.rs";

/// Generates the demo's code into a fresh directory and returns its text.
fn generate(out_dir: &Path) -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let protoc = protoc_bin_vendored::protoc_bin_path()
        .expect("protoc-bin-vendored has a protoc for this platform");
    let mut config = tonic_prost_build::Config::new();
    config.protoc_executable(protoc);
    tonic_prost_build::configure()
        .out_dir(out_dir)
        .emit_rerun_if_changed(false)
        .compile_with_config(config, &[root.join(PROTO)], &[root.join("proto")])
        .expect("generate the demo's code");
    std::fs::read_to_string(out_dir.join("fleetgate.demo.rs"))
        .expect("the generator wrote fleetgate.demo.rs")
}

#[test]
fn committed_code_round_trips_a_request() {
    use prost::Message;
    let request = pb::HelloRequest {
        name: "fleet".into(),
    };
    let decoded = pb::HelloRequest::decode(request.encode_to_vec().as_slice())
        .expect("decode what was encoded");
    assert_eq!(decoded, request);
}

#[test]
fn committed_code_is_what_the_proto_generates() {
    let out_dir =
        PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("codegen-{}", std::process::id()));
    // A directory of this run only: a stale file cannot pass for a new one.
    let _ = std::fs::remove_dir_all(&out_dir);
    std::fs::create_dir_all(&out_dir).expect("create the output directory");
    let fresh = generate(&out_dir);
    let _ = std::fs::remove_dir_all(&out_dir);

    let committed_path = Path::new(env!("CARGO_MANIFEST_DIR")).join(GENERATED);
    if std::env::var_os("FLEETGATE_REGENERATE").is_some() {
        std::fs::write(&committed_path, &fresh).expect("write the generated code");
        return;
    }
    let committed = std::fs::read_to_string(&committed_path).unwrap_or_default();
    assert!(
        committed == fresh,
        "{GENERATED} is not what {PROTO} generates; regenerate it with \
         `FLEETGATE_REGENERATE=1 cargo test --all-features --test codegen` and commit it"
    );
    // The file really is a Greeter with both methods: a generator that
    // wrote nothing would not pass for current.
    assert!(
        fresh.contains("pub struct GreeterServer<")
            && fresh.contains("pub async fn say_hello_stream(")
    );
}
