//! A throwaway Redis Cluster on loopback ports: three masters (and, for
//! failover tests, a replica of each), `redis-server --cluster-enabled
//! yes` joined by `redis-cli --cluster create`, torn down when dropped.
#![allow(dead_code)] // each binary uses part of it

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::common::RedisServer;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// A running cluster owned by the test.
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
    /// Which nodes were masters once the cluster was up.
    masters: Vec<usize>,
    dir: PathBuf,
}

impl RedisCluster {
    /// Starts three masters and a replica of each (`--cluster-replicas
    /// 1`), assigns the masters all 16384 slots and waits until every node
    /// reports `cluster_state:ok` and every replica is linked to its
    /// master. Panics with instructions when `redis-server` or `redis-cli`
    /// is missing.
    ///
    /// The node timeout is 15 s: a master paused by a test (`SIGSTOP`,
    /// a few seconds) is not failed over meanwhile.
    pub fn start() -> RedisCluster {
        RedisCluster::launch(false)
    }

    /// [`start`](Self::start) with a 500 ms node timeout, so that a dead
    /// master's replica is promoted within seconds.
    pub fn start_failing_over_fast() -> RedisCluster {
        RedisCluster::launch(true)
    }

    fn launch(failing_over: bool) -> RedisCluster {
        let node_timeout = if failing_over { "500" } else { "15000" };
        // While a master is dead and not yet replaced, only its own slots
        // fail; with `yes` (Redis' default) every node answers
        // `CLUSTERDOWN` for every slot until the promotion.
        let extra = [
            "--cluster-require-full-coverage",
            "no",
            // A replica's first sync starts at once rather than after the
            // default 5 s wait for other replicas to join a diskless sync.
            "--repl-diskless-sync-delay",
            "0",
        ];
        let (nodes, replicas) = (6, 1);
        let dir = crate::common::config_dir("cluster");
        let mut servers = Vec::with_capacity(nodes);
        while servers.len() < nodes {
            let port = cluster_port();
            let args: Vec<String> = [
                "--cluster-enabled",
                "yes",
                "--cluster-node-timeout",
                node_timeout,
                "--cluster-config-file",
                &format!("nodes-{port}.conf"),
                "--dir",
                &dir.to_string_lossy(),
            ]
            .iter()
            .chain(&extra)
            .map(|s| s.to_string())
            .collect();
            // A port can be taken between the check and the bind: retry.
            if let Ok(node) = RedisServer::start_on_with(port, &args) {
                servers.push(node);
            }
        }
        let mut cluster = RedisCluster {
            nodes: servers,
            masters: Vec::new(),
            dir,
        };
        let mut create = Command::new(cli());
        create.arg("--cluster").arg("create");
        for node in &cluster.nodes {
            create.arg(format!("127.0.0.1:{}", node.port()));
        }
        create.args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"]);
        cluster.run(create, "--cluster create");
        cluster.wait_until_ok();
        cluster.wait_until_replicated(failing_over);
        cluster.masters = (0..cluster.nodes.len())
            .filter(|&i| {
                let mut conn = cluster.nodes[i].client().get_connection().expect("node");
                role(&mut conn).expect("ROLE") == Role::Master
            })
            .collect();
        assert_eq!(cluster.masters.len(), 3, "masters of a new cluster");
        cluster
    }

    /// `redis://127.0.0.1:<port>` of every node.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(|n| n.url()).collect()
    }

    /// The nodes, each a plain server: masters and replicas.
    pub fn nodes(&self) -> &[RedisServer] {
        &self.nodes
    }

    /// The three masters, as they were once the cluster was up (a
    /// failover or a reshard does not change this list).
    pub fn masters(&self) -> Vec<&RedisServer> {
        self.masters.iter().map(|&i| &self.nodes[i]).collect()
    }

    /// Moves `slots` slots from master `from` to master `to` (indices in
    /// [`masters`](Self::masters)) with
    /// `redis-cli --cluster reshard`, keys included, while clients keep
    /// running: they see `ASK` during the move and `MOVED` after it.
    pub fn reshard(&self, from: usize, to: usize, slots: u32) {
        let (from, to) = (self.masters[from], self.masters[to]);
        let id = |i: usize| -> String {
            let mut conn = self.nodes[i].client().get_connection().expect("node");
            redis::cmd("CLUSTER")
                .arg("MYID")
                .query(&mut conn)
                .expect("CLUSTER MYID")
        };
        let mut reshard = Command::new(cli());
        reshard
            .arg("--cluster")
            .arg("reshard")
            .arg(format!("127.0.0.1:{}", self.nodes[from].port()))
            .args(["--cluster-from", &id(from)])
            .args(["--cluster-to", &id(to)])
            .args(["--cluster-slots", &slots.to_string()])
            .arg("--cluster-yes");
        self.run(reshard, "--cluster reshard");
        self.wait_until_ok();
    }

    fn run(&self, mut command: Command, what: &str) {
        let output = command.output().unwrap_or_else(|err| {
            panic!(
                "cannot run redis-cli ({err}). The cluster tests need it: run scripts/test.sh \
                 (it installs redis-tools on Debian/Ubuntu), install it yourself, or set \
                 REDIS_CLI to its path."
            )
        });
        assert!(
            output.status.success(),
            "redis-cli {what} failed: {}\n{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }

    /// Every node says `cluster_state:ok` with all slots assigned. The
    /// nodes agree by gossip, which announces nothing to a client: ask
    /// each node until it agrees, for at most 20 s.
    fn wait_until_ok(&self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        for node in &self.nodes {
            let mut conn = node.client().get_connection().expect("cluster node");
            loop {
                let info: String = redis::cmd("CLUSTER")
                    .arg("INFO")
                    .query(&mut conn)
                    .expect("CLUSTER INFO");
                let known = format!("cluster_known_nodes:{}", self.nodes.len());
                if info.contains("cluster_state:ok")
                    && info.contains("cluster_slots_ok:16384")
                    && info.contains(&known)
                {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "cluster not ok after 20 s:\n{info}"
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
}

impl RedisCluster {
    /// Each replica's `ROLE` says its link to its master is up and, for
    /// `elections`, every node knows every replica and none is flagged
    /// failing or still in handshake: only then can a replica be elected
    /// when its master dies. (Gossip spreads that in seconds, more with a
    /// long node timeout: tests that kill no master need not wait for it.)
    /// Polled, for at most 30 s.
    fn wait_until_replicated(&self, elections: bool) {
        let deadline = Instant::now() + Duration::from_secs(30);
        let replicas = self.nodes.len() / 2;
        for node in &self.nodes {
            let mut conn = node.client().get_connection().expect("cluster node");
            loop {
                let nodes: String = redis::cmd("CLUSTER")
                    .arg("NODES")
                    .query(&mut conn)
                    .expect("CLUSTER NODES");
                let linked = nodes
                    .lines()
                    .filter(|line| line.contains("slave") && line.contains(" connected"))
                    .count();
                let troubled = ["fail", "handshake", "noaddr"]
                    .iter()
                    .any(|flag| nodes.contains(flag));
                let synced = match role(&mut conn) {
                    Ok(Role::Replica { link_up, .. }) => link_up,
                    Ok(Role::Master) => true,
                    Err(_) => false,
                };
                if synced && (!elections || (linked == replicas && !troubled)) {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "replicas not linked after 30 s:\n{nodes}"
                );
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }

    /// The index of a master and of its replica, as their `ROLE` says now.
    pub fn master_and_replica(&self) -> (usize, usize) {
        for (r, node) in self.nodes.iter().enumerate() {
            let mut conn = node.client().get_connection().expect("cluster node");
            if let Ok(Role::Replica { master_port, .. }) = role(&mut conn) {
                let master = self
                    .nodes
                    .iter()
                    .position(|n| n.port() == master_port)
                    .expect("a replica of one of the cluster's nodes");
                return (master, r);
            }
        }
        panic!("the cluster has no replica");
    }

    /// The slot ranges (first, last) node `index` serves as a master, as
    /// node `ask` (a live one) sees them.
    pub fn slots_of(&self, index: usize, ask: usize) -> Vec<(u16, u16)> {
        let mut conn = self.nodes[ask].client().get_connection().expect("node");
        let port = i64::from(self.nodes[index].port());
        // Each range: first, last, its master (address, port, id), replicas.
        let ranges: Vec<redis::Value> = redis::cmd("CLUSTER")
            .arg("SLOTS")
            .query(&mut conn)
            .expect("CLUSTER SLOTS");
        let mut slots = Vec::new();
        for range in ranges {
            let redis::Value::Array(items) = range else {
                panic!("CLUSTER SLOTS: {range:?}")
            };
            if let [
                redis::Value::Int(first),
                redis::Value::Int(last),
                redis::Value::Array(master),
                ..,
            ] = items.as_slice()
                && master.get(1) == Some(&redis::Value::Int(port))
            {
                slots.push((*first as u16, *last as u16));
            }
        }
        slots
    }

    /// The slot of `key` (`CLUSTER KEYSLOT`, asked of node `ask`).
    pub fn slot(&self, key: &str, ask: usize) -> u16 {
        let mut conn = self.nodes[ask].client().get_connection().expect("node");
        redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(key)
            .query(&mut conn)
            .expect("CLUSTER KEYSLOT")
    }

    /// SIGKILL to node `index`: it dies at once, without a word to its
    /// replica or its clients, as a crashed host would. It stays dead (and
    /// is reaped when the cluster is dropped).
    pub fn kill(&self, index: usize) {
        let pid = i32::try_from(self.nodes[index].pid()).expect("pid fits pid_t");
        kill(Pid::from_raw(pid), Signal::SIGKILL).expect("SIGKILL a cluster node");
    }
}

/// A node's replication role (`ROLE`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Master,
    Replica { master_port: u16, link_up: bool },
}

/// Asks `ROLE` on `conn`.
pub fn role(conn: &mut impl redis::ConnectionLike) -> redis::RedisResult<Role> {
    let reply: Vec<redis::Value> = redis::cmd("ROLE").query(conn)?;
    parse_role(&reply)
}

/// Asks `ROLE` on an async connection (to time a promotion).
pub async fn role_async(conn: &mut impl redis::aio::ConnectionLike) -> redis::RedisResult<Role> {
    let reply: Vec<redis::Value> = redis::cmd("ROLE").query_async(conn).await?;
    parse_role(&reply)
}

fn parse_role(reply: &[redis::Value]) -> redis::RedisResult<Role> {
    let text = |v: &redis::Value| -> String {
        match v {
            redis::Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
            redis::Value::SimpleString(s) => s.clone(),
            _ => String::new(),
        }
    };
    match reply {
        [kind, ..] if text(kind) == "master" => Ok(Role::Master),
        // slave, master host, master port, link state, offset
        [kind, _host, redis::Value::Int(port), state, ..] if text(kind) == "slave" => {
            Ok(Role::Replica {
                master_port: *port as u16,
                link_up: text(state) == "connected",
            })
        }
        other => Err(redis::RedisError::from((
            redis::ErrorKind::UnexpectedReturnType,
            "ROLE",
            format!("{other:?}"),
        ))),
    }
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        self.nodes.clear();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn cli() -> String {
    std::env::var("REDIS_CLI").unwrap_or_else(|_| "redis-cli".into())
}

/// A port whose cluster bus port (`port + 10000`) is free too.
fn cluster_port() -> u16 {
    let random = RandomState::new();
    for attempt in 0u64..1000 {
        let port = 20_000 + (random.hash_one(attempt) % 25_000) as u16;
        let free = |p: u16| TcpListener::bind(("127.0.0.1", p)).is_ok();
        if free(port) && free(port + 10_000) {
            return port;
        }
    }
    panic!("no free pair of loopback ports for a cluster node");
}
