//! A throwaway `redis-server` on a free loopback port, started for a test
//! and killed when dropped. Shared by the tests and the benchmarks.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// A running `redis-server` owned by the test.
pub struct RedisServer {
    child: Child,
    port: u16,
}

impl RedisServer {
    /// Starts a server on a free port of 127.0.0.1 and waits until it says
    /// it accepts connections. Panics with instructions when `redis-server`
    /// is not installed.
    pub fn start() -> RedisServer {
        let mut last_error = String::new();
        // A port found free can be taken by someone else before the server
        // binds it: try a few.
        for _ in 0..5 {
            let port = free_port();
            match RedisServer::start_on(port) {
                Ok(server) => return server,
                Err(err) => last_error = err,
            }
        }
        panic!("could not start redis-server: {last_error}");
    }

    /// Starts a server on `port` (used to restart one on the same port).
    pub fn start_on(port: u16) -> Result<RedisServer, String> {
        RedisServer::start_on_with(port, &[])
    }

    /// Starts a server on `port` with extra `redis-server` arguments (later
    /// ones override the defaults), such as `--cluster-enabled yes`.
    pub fn start_on_with(port: u16, extra: &[String]) -> Result<RedisServer, String> {
        let binary = std::env::var("REDIS_SERVER").unwrap_or_else(|_| "redis-server".into());
        let dir = std::env::temp_dir();
        let mut child = Command::new(&binary)
            .args(["--port", &port.to_string()])
            .args(["--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .args(["--dir", &dir.to_string_lossy()])
            .args(["--logfile", ""])
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|err| {
                panic!(
                    "cannot run `{binary}` ({err}). The Redis tests need redis-server: \
                     run scripts/test.sh (it installs it on Debian/Ubuntu), or install it \
                     yourself (apt-get install -y redis-server, brew install redis) or set \
                     REDIS_SERVER to its path."
                )
            });
        let Some(stdout) = child.stdout.take() else {
            let _ = child.kill();
            let _ = child.wait();
            return Err("redis-server has no stdout".into());
        };
        // The server prints this line once it listens: wait for that signal
        // rather than polling the port.
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut ready = false;
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if !ready && line.contains("Ready to accept connections") {
                    ready = true;
                    let _ = tx.send(Ok(()));
                }
                if !ready && (line.contains("Address already in use") || line.contains("# Failed"))
                {
                    let _ = tx.send(Err(line.clone()));
                }
            }
            // Drain until the server exits so it never blocks on a full pipe.
        });
        match rx.recv_timeout(Duration::from_secs(20)) {
            Ok(Ok(())) => Ok(RedisServer { child, port }),
            Ok(Err(line)) => {
                let _ = child.kill();
                let _ = child.wait();
                Err(line)
            }
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                Err(format!("redis-server on port {port} did not become ready"))
            }
        }
    }

    /// The server's port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The server's process id (for SIGSTOP/SIGKILL in fault tests).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGSTOP: the server keeps its connections but answers nothing, as a
    /// hung Redis would.
    pub fn pause(&self) {
        self.signal(Signal::SIGSTOP);
    }

    /// SIGCONT: a paused server answers again.
    pub fn resume(&self) {
        self.signal(Signal::SIGCONT);
    }

    fn signal(&self, sig: Signal) {
        let pid = i32::try_from(self.child.id()).expect("pid fits pid_t");
        // The child is not reaped before `kill`/drop, so the pid is ours.
        if let Err(err) = kill(Pid::from_raw(pid), sig) {
            panic!("kill({pid}, {sig}): {err}");
        }
    }

    /// A plain client, for inspecting the server from tests.
    pub fn client(&self) -> redis::Client {
        redis::Client::open(self.url()).expect("valid url")
    }

    /// A connection of the test's own, for inspecting and resetting the
    /// server (`INFO`, `CONFIG RESETSTAT`, writing odd keys).
    pub async fn admin(&self) -> redis::aio::MultiplexedConnection {
        self.client()
            .get_multiplexed_async_connection()
            .await
            .expect("connect to the test's redis-server")
    }

    /// Concurrency leases held in the server: the members of every lease
    /// set, less the tombstones of releases that found no lease (scored
    /// below zero; see lua/lease.lua).
    pub async fn leases_held(&self) -> usize {
        let mut conn = self.admin().await;
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg("*:lease")
            .query_async(&mut conn)
            .await
            .expect("KEYS");
        let mut total = 0;
        for key in keys {
            let n: usize = redis::cmd("ZCOUNT")
                .arg(&key)
                .arg("(0")
                .arg("+inf")
                .query_async(&mut conn)
                .await
                .expect("ZCOUNT");
            total += n;
        }
        total
    }

    /// Stops the server now.
    pub fn stop(mut self) {
        self.kill();
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A loopback port with nothing listening on it (yet).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}
