//! A throwaway Redis Sentinel setup for a test: a master, one replica and
//! three sentinels (quorum 2, `down-after-milliseconds` 500,
//! `failover-timeout` 2000), each on a free loopback port, the sentinels'
//! configuration files in a directory of their own
//! (`common::config_dir`). Everything is killed when dropped.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::RedisServer;
use super::redis_server::free_port;

/// The name the sentinels monitor the master under.
pub const MASTER_NAME: &str = "mymaster";

/// Passwords of a setup with authentication.
#[derive(Clone, Debug)]
pub struct Passwords {
    /// `requirepass` of the master and the replica (and their `masterauth`).
    pub redis: String,
    /// `requirepass` of the sentinels.
    pub sentinel: String,
}

/// One sentinel process.
pub struct Sentinel {
    child: Option<Child>,
    port: u16,
}

impl Sentinel {
    pub fn port(&self) -> u16 {
        self.port
    }

    /// SIGKILL, now.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Sentinel {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A master, a replica and three sentinels.
pub struct SentinelSet {
    /// `None` once killed.
    pub master: Option<RedisServer>,
    pub replica: RedisServer,
    pub sentinels: Vec<Sentinel>,
    master_port: u16,
    passwords: Option<Passwords>,
    dir: PathBuf,
    /// The TLS ports, in a set started with [`SentinelSet::start_tls`].
    tls: Option<TlsPorts>,
}

/// The TLS ports of a set started with [`SentinelSet::start_tls`]: every
/// process listens on its plain port (which the harness's own checks use)
/// and on one of these, and the set speaks TLS within itself (replication,
/// the sentinels' connections to the servers and to each other), so the
/// sentinels name the servers' TLS ports.
#[derive(Clone, Debug)]
pub struct TlsPorts {
    pub master: u16,
    pub replica: u16,
    pub sentinels: Vec<u16>,
}

impl SentinelSet {
    /// Starts the set and waits until every sentinel knows the replica and
    /// the other sentinels, and the replica is in sync.
    pub async fn start() -> SentinelSet {
        SentinelSet::start_with(None).await
    }

    /// [`start`](Self::start), with passwords on the servers and on the
    /// sentinels.
    pub async fn start_with(passwords: Option<Passwords>) -> SentinelSet {
        SentinelSet::start_inner(passwords, None).await
    }

    /// [`start`](Self::start), every process also on a TLS port with
    /// `certs.server` (see [`TlsPorts`]).
    #[cfg(feature = "tls-rustls")]
    pub async fn start_tls(certs: &super::tls::Certs) -> SentinelSet {
        SentinelSet::start_inner(None, Some(certs)).await
    }

    /// The TLS ports, if started with [`start_tls`](Self::start_tls).
    pub fn tls_ports(&self) -> Option<&TlsPorts> {
        self.tls.as_ref()
    }

    async fn start_inner(passwords: Option<Passwords>, tls: Option<&TlsConf>) -> SentinelSet {
        let auth: Vec<String> = match &passwords {
            Some(p) => vec![
                "--requirepass".into(),
                p.redis.clone(),
                "--masterauth".into(),
                p.redis.clone(),
            ],
            None => Vec::new(),
        };
        let (master, master_tls) = start_server_tls(&auth, tls);
        let master_port = master.port();
        // Sentinels and replica reach the master on its TLS port, if any.
        let monitored = master_tls.unwrap_or(master_port);
        let mut replica_args = auth.clone();
        replica_args.extend([
            "--replicaof".into(),
            "127.0.0.1".into(),
            monitored.to_string(),
        ]);
        let (replica, replica_tls) = start_server_tls(&replica_args, tls);
        let dir = crate::common::config_dir(&format!("sentinel-{master_port}"));
        let mut sentinels = Vec::new();
        let mut sentinel_tls = Vec::new();
        for i in 0..3 {
            let (sentinel, tls_port) =
                start_sentinel_tls(&dir, i, monitored, passwords.as_ref(), tls);
            sentinels.push(sentinel);
            sentinel_tls.extend(tls_port);
        }
        let tls = match (master_tls, replica_tls) {
            (Some(master), Some(replica)) => Some(TlsPorts {
                master,
                replica,
                sentinels: sentinel_tls,
            }),
            _ => None,
        };
        let set = SentinelSet {
            master: Some(master),
            replica,
            sentinels,
            master_port,
            passwords,
            dir,
            tls,
        };
        set.wait_ready().await;
        set
    }

    /// `redis://[:password@]127.0.0.1:<port>` of each sentinel.
    pub fn sentinel_urls(&self) -> Vec<String> {
        let auth = match &self.passwords {
            Some(p) => format!(":{}@", p.sentinel),
            None => String::new(),
        };
        self.sentinels
            .iter()
            .map(|s| format!("redis://{auth}127.0.0.1:{}", s.port))
            .collect()
    }

    /// The port the master was started on.
    pub fn master_port(&self) -> u16 {
        self.master_port
    }

    /// A connection to a server of the set (with its password).
    pub async fn connect(&self, port: u16) -> redis::aio::MultiplexedConnection {
        self.try_connect(port)
            .await
            .expect("connect to a server of the set")
    }

    async fn try_connect(
        &self,
        port: u16,
    ) -> redis::RedisResult<redis::aio::MultiplexedConnection> {
        let auth = match &self.passwords {
            Some(p) => format!(":{}@", p.redis),
            None => String::new(),
        };
        redis::Client::open(format!("redis://{auth}127.0.0.1:{port}"))?
            .get_multiplexed_async_connection()
            .await
    }

    async fn sentinel_conn(
        &self,
        port: u16,
    ) -> redis::RedisResult<redis::aio::MultiplexedConnection> {
        let auth = match &self.passwords {
            Some(p) => format!(":{}@", p.sentinel),
            None => String::new(),
        };
        redis::Client::open(format!("redis://{auth}127.0.0.1:{port}"))?
            .get_multiplexed_async_connection()
            .await
    }

    /// `SENTINEL <args>` on the first sentinel still running.
    pub async fn sentinel_cmd<T: redis::FromRedisValue>(
        &self,
        args: &[&str],
    ) -> redis::RedisResult<T> {
        let mut last = None;
        for s in self.sentinels.iter().filter(|s| s.child.is_some()) {
            match self.sentinel_conn(s.port).await {
                Ok(mut conn) => {
                    return redis::cmd("SENTINEL")
                        .arg(args)
                        .query_async(&mut conn)
                        .await;
                }
                Err(err) => last = Some(err),
            }
        }
        Err(last.unwrap_or_else(|| (redis::ErrorKind::Io, "no sentinel running").into()))
    }

    /// `ROLE` of the server on `port`: `"master"`, `"slave"`, or an error.
    pub async fn role(&self, port: u16) -> redis::RedisResult<String> {
        let mut conn = self.try_connect(port).await?;
        let role: Vec<redis::Value> = redis::cmd("ROLE").query_async(&mut conn).await?;
        match role.first() {
            Some(redis::Value::BulkString(b)) => Ok(String::from_utf8_lossy(b).into_owned()),
            Some(redis::Value::SimpleString(s)) => Ok(s.clone()),
            other => Err((
                redis::ErrorKind::Parse,
                "odd ROLE reply",
                format!("{other:?}"),
            )
                .into()),
        }
    }

    /// Polls until every running sentinel names `port` as the master.
    pub async fn wait_switched(&self, port: u16, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            let mut all = true;
            for s in self.sentinels.iter().filter(|s| s.child.is_some()) {
                let named: Option<(String, u16)> = match self.sentinel_conn(s.port).await {
                    Ok(mut conn) => redis::cmd("SENTINEL")
                        .arg("GET-MASTER-ADDR-BY-NAME")
                        .arg(MASTER_NAME)
                        .query_async(&mut conn)
                        .await
                        .unwrap_or(None),
                    Err(_) => None,
                };
                all &= named.is_some_and(|(_, p)| p == port);
            }
            if all {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the sentinels never named port {port}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if self.ready().await {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the sentinel set did not become ready within 30 s"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn ready(&self) -> bool {
        let Ok(mut replica) = self.try_connect(self.replica.port()).await else {
            return false;
        };
        let info: String = match redis::cmd("INFO")
            .arg("replication")
            .query_async(&mut replica)
            .await
        {
            Ok(info) => info,
            Err(_) => return false,
        };
        if !info.contains("master_link_status:up") {
            return false;
        }
        for s in &self.sentinels {
            let Ok(mut conn) = self.sentinel_conn(s.port).await else {
                return false;
            };
            let fields: Vec<String> = match redis::cmd("SENTINEL")
                .arg("MASTER")
                .arg(MASTER_NAME)
                .query_async(&mut conn)
                .await
            {
                Ok(fields) => fields,
                Err(_) => return false,
            };
            let field = |name: &str| {
                fields
                    .chunks_exact(2)
                    .find(|kv| kv[0] == name)
                    .map(|kv| kv[1].clone())
                    .unwrap_or_default()
            };
            if field("num-slaves") != "1" || field("num-other-sentinels") != "2" {
                return false;
            }
            if field("flags") != "master" {
                return false;
            }
        }
        true
    }
}

impl Drop for SentinelSet {
    fn drop(&mut self) {
        for s in &mut self.sentinels {
            s.kill();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn start_server(extra: &[String]) -> RedisServer {
    let mut last = String::new();
    for _ in 0..5 {
        match RedisServer::start_on_with(free_port(), extra) {
            Ok(server) => return server,
            Err(err) => last = err,
        }
    }
    panic!("could not start redis-server: {last}");
}

/// A server on a free plain port and, with `tls`, a free TLS port too.
fn start_server_tls(extra: &[String], tls: Option<&TlsConf>) -> (RedisServer, Option<u16>) {
    let Some(certs) = tls else {
        return (start_server(extra), None);
    };
    let mut last = String::new();
    for _ in 0..5 {
        let tls_port = free_port();
        let mut args = extra.to_vec();
        args.extend(tls_args(certs, tls_port));
        match RedisServer::start_on_with(free_port(), &args) {
            Ok(server) => return (server, Some(tls_port)),
            Err(err) => last = err,
        }
    }
    panic!("could not start a TLS redis-server: {last}");
}

/// The certificates a TLS set's processes use: none without the
/// `tls-rustls` feature, which the TLS tests need.
#[cfg(feature = "tls-rustls")]
use super::tls::Certs as TlsConf;
#[cfg(not(feature = "tls-rustls"))]
enum TlsConf {}

/// A server's arguments for TLS on `port`.
#[cfg(feature = "tls-rustls")]
fn tls_args(certs: &TlsConf, port: u16) -> Vec<String> {
    certs.server_args(port, &certs.server)
}
#[cfg(not(feature = "tls-rustls"))]
fn tls_args(certs: &TlsConf, _: u16) -> Vec<String> {
    match *certs {}
}

/// A sentinel's configuration lines for TLS on `port`.
#[cfg(feature = "tls-rustls")]
fn tls_conf(certs: &TlsConf, port: u16) -> String {
    certs.conf_lines(port)
}
#[cfg(not(feature = "tls-rustls"))]
fn tls_conf(certs: &TlsConf, _: u16) -> String {
    match *certs {}
}

/// A sentinel on a free port and, with `tls`, on a free TLS port too,
/// returned.
fn start_sentinel_tls(
    dir: &std::path::Path,
    i: usize,
    master_port: u16,
    passwords: Option<&Passwords>,
    tls: Option<&TlsConf>,
) -> (Sentinel, Option<u16>) {
    let binary = std::env::var("REDIS_SERVER").unwrap_or_else(|_| "redis-server".into());
    for _ in 0..5 {
        let port = free_port();
        let tls_port = tls.map(|_| free_port());
        let conf = dir.join(format!("sentinel-{i}.conf"));
        let mut text = format!(
            "port {port}\nbind 127.0.0.1\ndir {dir}\nlogfile \"\"\n\
             sentinel monitor {MASTER_NAME} 127.0.0.1 {master_port} 2\n\
             sentinel down-after-milliseconds {MASTER_NAME} 500\n\
             sentinel failover-timeout {MASTER_NAME} 2000\n",
            dir = dir.display()
        );
        if let Some(p) = passwords {
            text.push_str(&format!(
                "sentinel auth-pass {MASTER_NAME} {}\nrequirepass {}\nsentinel sentinel-pass {}\n",
                p.redis, p.sentinel, p.sentinel
            ));
        }
        if let (Some(certs), Some(tls_port)) = (tls, tls_port) {
            text.push_str(&tls_conf(certs, tls_port));
        }
        std::fs::write(&conf, text).expect("write a sentinel configuration");
        // The configuration file must come first, and stay writable:
        // sentinels rewrite it.
        let mut child = Command::new(&binary)
            .arg(&conf)
            .arg("--sentinel")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|err| panic!("cannot run `{binary}` ({err})"));
        // Wait until it answers PING (it prints no "ready" line).
        let deadline = Instant::now() + Duration::from_secs(10);
        let up = loop {
            if let Ok(Some(_)) = child.try_wait() {
                break false; // exited: the port was taken, most likely
            }
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                break true;
            }
            if Instant::now() > deadline {
                break false;
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        if up {
            let sentinel = Sentinel {
                child: Some(child),
                port,
            };
            return (sentinel, tls_port);
        }
        let _ = child.kill();
        let _ = child.wait();
    }
    panic!("could not start a sentinel");
}

/// How a [`FakeSentinel`] answers.
#[derive(Clone, Debug, Default)]
pub struct FakeConfig {
    /// The port (on 127.0.0.1) of the master it names.
    pub master_port: u16,
    /// How many of the lookups' questions (`SENTINEL MASTER`, `SENTINEL
    /// MASTERS`) it answers first with that master flagged down
    /// (`s_down,o_down`), as while a failover is under way.
    pub down_first: usize,
    /// Accepts connections and never answers (blackholed).
    pub silent: bool,
    /// Holds its answers to the lookups' questions until this count (the
    /// [`FakeSentinel::lookups`] of another fake) is at least 1: answers
    /// in a known order, without timing.
    pub after: Option<tokio::sync::watch::Receiver<usize>>,
}

/// A stand-in for a sentinel, on a free loopback port, that answers what
/// the store asks (`SENTINEL MASTER`, `MASTERS`, `GET-MASTER-ADDR-BY-NAME`)
/// as told, for the situations real sentinels do not make on demand: a
/// sentinel cut off with the old master, one that answers late. `ROLE`
/// says sentinel, `PING` `+PONG`, everything else `+OK`. Stopped when
/// dropped.
pub struct FakeSentinel {
    port: u16,
    lookups: tokio::sync::watch::Sender<usize>,
    polls: tokio::sync::watch::Sender<usize>,
    task: tokio::task::JoinHandle<()>,
}

impl FakeSentinel {
    pub async fn start(config: FakeConfig) -> FakeSentinel {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind a fake sentinel");
        let port = listener.local_addr().expect("its address").port();
        let (lookups, _) = tokio::sync::watch::channel(0usize);
        let (polls, _) = tokio::sync::watch::channel(0usize);
        let (l, p) = (lookups.clone(), polls.clone());
        let task = tokio::spawn(async move {
            let mut conns = tokio::task::JoinSet::new();
            while let Ok((socket, _)) = listener.accept().await {
                conns.spawn(serve_fake(socket, config.clone(), l.clone(), p.clone()));
            }
        });
        FakeSentinel {
            port,
            lookups,
            polls,
            task,
        }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// How many of the lookups' questions it answered, as it changes.
    pub fn lookups(&self) -> tokio::sync::watch::Receiver<usize> {
        self.lookups.subscribe()
    }

    /// How many periodic questions (`GET-MASTER-ADDR-BY-NAME`) it answered,
    /// as it changes.
    pub fn polls(&self) -> tokio::sync::watch::Receiver<usize> {
        self.polls.subscribe()
    }
}

impl Drop for FakeSentinel {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn serve_fake(
    mut socket: tokio::net::TcpStream,
    mut config: FakeConfig,
    lookups: tokio::sync::watch::Sender<usize>,
    polls: tokio::sync::watch::Sender<usize>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let Ok(n) = socket.read(&mut chunk).await else {
            return;
        };
        if n == 0 {
            return;
        }
        if config.silent {
            continue;
        }
        buf.extend_from_slice(&chunk[..n]);
        while let Some((args, used)) = parse_command(&buf) {
            buf.drain(..used);
            let word = |i: usize| args.get(i).map(|a| a.to_ascii_uppercase());
            let reply = match (word(0).as_deref(), word(1).as_deref()) {
                (Some("SENTINEL"), Some(sub @ ("MASTER" | "MASTERS"))) => {
                    if let Some(after) = config.after.as_mut() {
                        let _ = after.wait_for(|n| *n >= 1).await;
                    }
                    let down = *lookups.borrow() < config.down_first;
                    let master = fake_master(config.master_port, down);
                    let reply = if sub == "MASTERS" {
                        format!("*1\r\n{master}")
                    } else {
                        master
                    };
                    lookups.send_modify(|n| *n += 1);
                    reply
                }
                (Some("SENTINEL"), Some("GET-MASTER-ADDR-BY-NAME")) => {
                    polls.send_modify(|n| *n += 1);
                    let port = config.master_port.to_string();
                    format!("*2\r\n$9\r\n127.0.0.1\r\n${}\r\n{port}\r\n", port.len())
                }
                (Some("PING"), _) => "+PONG\r\n".into(),
                (Some("ROLE"), _) => format!(
                    "*2\r\n$8\r\nsentinel\r\n*1\r\n${}\r\n{MASTER_NAME}\r\n",
                    MASTER_NAME.len()
                ),
                _ => "+OK\r\n".into(),
            };
            if socket.write_all(reply.as_bytes()).await.is_err() {
                return;
            }
        }
    }
}

/// `SENTINEL MASTER` of a master on 127.0.0.1:`port`: field names and
/// values in turn.
fn fake_master(port: u16, down: bool) -> String {
    let flags = if down {
        "master,s_down,o_down"
    } else {
        "master"
    };
    let port = port.to_string();
    let fields = [
        "name",
        MASTER_NAME,
        "ip",
        "127.0.0.1",
        "port",
        port.as_str(),
        "flags",
        flags,
        "num-slaves",
        "0",
        "num-other-sentinels",
        "2",
        "quorum",
        "2",
    ];
    let mut out = format!("*{}\r\n", fields.len());
    for f in fields {
        out.push_str(&format!("${}\r\n{f}\r\n", f.len()));
    }
    out
}

/// One command (an array of bulk strings) from the front of `buf`, and
/// how many bytes it took; `None` until it is all there.
fn parse_command(buf: &[u8]) -> Option<(Vec<String>, usize)> {
    fn line(buf: &[u8], at: usize) -> Option<(&[u8], usize)> {
        let end = buf.get(at..)?.windows(2).position(|w| w == b"\r\n")?;
        Some((&buf[at..at + end], at + end + 2))
    }
    let (head, mut at) = line(buf, 0)?;
    let count: usize = std::str::from_utf8(head.strip_prefix(b"*")?)
        .ok()?
        .parse()
        .ok()?;
    let mut args = Vec::with_capacity(count);
    for _ in 0..count {
        let (len, next) = line(buf, at)?;
        let len: usize = std::str::from_utf8(len.strip_prefix(b"$")?)
            .ok()?
            .parse()
            .ok()?;
        let arg = buf.get(next..next + len)?;
        args.push(String::from_utf8_lossy(arg).into_owned());
        at = next + len + 2;
        if buf.len() < at {
            return None;
        }
    }
    Some((args, at))
}

/// A TCP proxy on a free loopback port to a server on 127.0.0.1. After
/// [`freeze`](Self::freeze), the connections open at that moment stay
/// open but carry nothing more either way (a half-open connection: its
/// peer gone without a reset); connections made later work. Stopped when
/// dropped.
pub struct FreezingProxy {
    port: u16,
    /// Connections numbered below this are frozen.
    frozen_below: tokio::sync::watch::Sender<u64>,
    next: std::sync::Arc<std::sync::atomic::AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl FreezingProxy {
    pub async fn start(upstream: u16) -> FreezingProxy {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind a proxy");
        let port = listener.local_addr().expect("its address").port();
        let (frozen_below, _) = tokio::sync::watch::channel(0u64);
        let next = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let (frozen, counter) = (frozen_below.clone(), next.clone());
        let task = tokio::spawn(async move {
            let mut conns = tokio::task::JoinSet::new();
            while let Ok((client, _)) = listener.accept().await {
                let id = counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                conns.spawn(pipe(id, client, upstream, frozen.subscribe()));
            }
        });
        FreezingProxy {
            port,
            frozen_below,
            next,
            task,
        }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// Freezes every connection open now.
    pub fn freeze(&self) {
        let below = self.next.load(std::sync::atomic::Ordering::SeqCst);
        self.frozen_below.send_replace(below);
    }
}

impl Drop for FreezingProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn pipe(
    id: u64,
    client: tokio::net::TcpStream,
    upstream: u16,
    mut frozen_below: tokio::sync::watch::Receiver<u64>,
) {
    let Ok(server) = tokio::net::TcpStream::connect(("127.0.0.1", upstream)).await else {
        return;
    };
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let forward = async {
        let _ = tokio::join!(
            tokio::io::copy(&mut client_read, &mut server_write),
            tokio::io::copy(&mut server_read, &mut client_write),
        );
    };
    tokio::select! {
        () = forward => return,
        _ = frozen_below.wait_for(|below| id < *below) => {}
    }
    // Frozen: both sockets stay open, nothing is read or sent.
    std::future::pending::<()>().await;
    drop((client_read, client_write, server_read, server_write));
}
