//! TLS for the throwaway servers: certificates made at test time with the
//! `openssl` command (a CA, a server certificate for 127.0.0.1 it signed,
//! and the odd ones a client must refuse), and redis-servers that speak
//! only TLS on a free loopback port. Everything lives in a temporary
//! directory removed when the [`Certs`] are dropped.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::RedisServer;
use super::redis_server::free_port;

/// A certificate and its key, in PEM files.
#[derive(Clone, Debug)]
pub struct Pair {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// The certificates of one test.
pub struct Certs {
    dir: PathBuf,
    /// The test's own CA.
    pub ca: Pair,
    /// For `IP:127.0.0.1` and `DNS:localhost`, signed by [`ca`](Self::ca).
    pub server: Pair,
    /// Signed by [`ca`](Self::ca), but for `DNS:elsewhere.invalid` only:
    /// right CA, wrong name.
    pub wrong_name: Pair,
    /// Another CA, which signed nothing the servers use.
    pub other_ca: Pair,
}

impl Certs {
    /// Makes them all (EC P-256 keys, valid for two days). Panics with
    /// instructions when `openssl` is not installed.
    pub fn new() -> Certs {
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("fleetgate-tls-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("a temporary directory for the certificates");
        let ca = self_signed_ca(&dir, "ca", "fleetgate test CA");
        let other_ca = self_signed_ca(&dir, "other-ca", "fleetgate other CA");
        let server = signed(&dir, "server", &ca, "1", "IP:127.0.0.1,DNS:localhost");
        let wrong_name = signed(&dir, "wrong-name", &ca, "2", "DNS:elsewhere.invalid");
        Certs {
            dir,
            ca,
            server,
            wrong_name,
            other_ca,
        }
    }

    /// The CA's certificate in PEM, as `redis::TlsCertificates::root_cert`
    /// takes it.
    pub fn ca_pem(&self) -> Vec<u8> {
        std::fs::read(&self.ca.cert).expect("the CA certificate")
    }

    /// [`other_ca`](Self::other_ca)'s certificate in PEM.
    pub fn other_ca_pem(&self) -> Vec<u8> {
        std::fs::read(&self.other_ca.cert).expect("the other CA certificate")
    }

    /// `redis-server` arguments for a TLS port `port` with `pair`, this
    /// CA trusted for the server's own TLS connections (replication,
    /// sentinels), clients not asked for certificates.
    pub fn server_args(&self, port: u16, pair: &Pair) -> Vec<String> {
        vec![
            "--tls-port".into(),
            port.to_string(),
            "--tls-cert-file".into(),
            path(&pair.cert),
            "--tls-key-file".into(),
            path(&pair.key),
            "--tls-ca-cert-file".into(),
            path(&self.ca.cert),
            "--tls-auth-clients".into(),
            "no".into(),
            "--tls-replication".into(),
            "yes".into(),
        ]
    }

    /// The same settings as lines of a configuration file (a sentinel's).
    pub fn conf_lines(&self, port: u16) -> String {
        format!(
            "tls-port {port}\ntls-cert-file {}\ntls-key-file {}\ntls-ca-cert-file {}\n\
             tls-auth-clients no\ntls-replication yes\n",
            path(&self.server.cert),
            path(&self.server.key),
            path(&self.ca.cert),
        )
    }

    /// A client of `rediss://127.0.0.1:<port>` that trusts `ca_pem` alone.
    pub fn client(&self, port: u16, ca_pem: Vec<u8>) -> redis::Client {
        redis::Client::build_with_tls(
            tls_url(port),
            redis::TlsCertificates {
                client_tls: None,
                root_cert: Some(ca_pem),
            },
        )
        .expect("a TLS client")
    }

    /// The connection settings of [`client`](Self::client) with this CA:
    /// a `rediss://` address that carries the CA along (for sentinel
    /// addresses, which `Topology::sentinel` takes as connection infos).
    pub fn info(&self, port: u16) -> redis::ConnectionInfo {
        self.client(port, self.ca_pem())
            .get_connection_info()
            .clone()
    }
}

impl Drop for Certs {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A redis-server that speaks only TLS, with `pair`, on a free loopback
/// port (its plain port is 0: closed).
pub fn start_tls_server(certs: &Certs, pair: &Pair) -> RedisServer {
    let mut last = String::new();
    for _ in 0..5 {
        let port = free_port();
        let mut args = certs.server_args(port, pair);
        args.extend(["--port".into(), "0".into()]);
        // The later `--port 0` overrides the harness's `--port`: the
        // server's port is the TLS one.
        match RedisServer::start_on_with(port, &args) {
            Ok(server) => return server,
            Err(err) => last = err,
        }
    }
    panic!("could not start a TLS redis-server: {last}");
}

/// `rediss://127.0.0.1:<port>`.
pub fn tls_url(port: u16) -> String {
    format!("rediss://127.0.0.1:{port}")
}

fn path(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|err| {
            panic!(
                "cannot run `openssl` ({err}): the TLS tests make their certificates with it \
                 (apt-get install -y openssl)"
            )
        });
    assert!(
        out.status.success(),
        "openssl {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn self_signed_ca(dir: &Path, name: &str, cn: &str) -> Pair {
    let pair = Pair {
        cert: dir.join(format!("{name}.crt")),
        key: dir.join(format!("{name}.key")),
    };
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-days",
            "2",
            "-subj",
            &format!("/CN={cn}"),
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
            "-keyout",
            &path(&pair.key),
            "-out",
            &path(&pair.cert),
        ],
    );
    pair
}

fn signed(dir: &Path, name: &str, ca: &Pair, serial: &str, names: &str) -> Pair {
    let pair = Pair {
        cert: dir.join(format!("{name}.crt")),
        key: dir.join(format!("{name}.key")),
    };
    let csr = dir.join(format!("{name}.csr"));
    let ext = dir.join(format!("{name}.ext"));
    std::fs::write(
        &ext,
        format!(
            "subjectAltName={names}\nbasicConstraints=CA:FALSE\n\
             keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth,clientAuth\n"
        ),
    )
    .expect("write the certificate's extensions");
    openssl(
        dir,
        &[
            "req",
            "-new",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-subj",
            &format!("/CN={name}"),
            "-keyout",
            &path(&pair.key),
            "-out",
            &path(&csr),
        ],
    );
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            &path(&csr),
            "-CA",
            &path(&ca.cert),
            "-CAkey",
            &path(&ca.key),
            "-set_serial",
            serial,
            "-days",
            "2",
            "-extfile",
            &path(&ext),
            "-out",
            &path(&pair.cert),
        ],
    );
    pair
}
