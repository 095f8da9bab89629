//! A throwaway 3-master Redis Cluster on loopback ports: three
//! `redis-server --cluster-enabled yes`, joined by
//! `redis-cli --cluster create`, torn down when dropped.

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::common::RedisServer;

/// A running cluster owned by the test.
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
    dir: PathBuf,
}

impl RedisCluster {
    /// Starts three masters, assigns them all 16384 slots and waits until
    /// every node reports `cluster_state:ok`. Panics with instructions
    /// when `redis-server` or `redis-cli` is missing.
    pub fn start() -> RedisCluster {
        let dir = std::env::temp_dir().join(format!(
            "fleetgate-cluster-{}-{}",
            std::process::id(),
            RandomState::new().hash_one(Instant::now()) % 1_000_000
        ));
        std::fs::create_dir_all(&dir).expect("cluster directory");
        let mut nodes = Vec::with_capacity(3);
        while nodes.len() < 3 {
            let port = cluster_port();
            let args: Vec<String> = [
                "--cluster-enabled",
                "yes",
                "--cluster-node-timeout",
                "5000",
                "--cluster-config-file",
                &format!("nodes-{port}.conf"),
                "--dir",
                &dir.to_string_lossy(),
            ]
            .iter()
            .map(|s| s.to_string())
            .collect();
            // A port can be taken between the check and the bind: retry.
            if let Ok(node) = RedisServer::start_on_with(port, &args) {
                nodes.push(node);
            }
        }
        let cluster = RedisCluster { nodes, dir };
        let mut create = Command::new(cli());
        create.arg("--cluster").arg("create");
        for node in &cluster.nodes {
            create.arg(format!("127.0.0.1:{}", node.port()));
        }
        create.args(["--cluster-replicas", "0", "--cluster-yes"]);
        cluster.run(create, "--cluster create");
        cluster.wait_until_ok();
        cluster
    }

    /// `redis://127.0.0.1:<port>` of every node.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(|n| n.url()).collect()
    }

    /// The nodes, each a plain server.
    pub fn nodes(&self) -> &[RedisServer] {
        &self.nodes
    }

    /// Moves `slots` slots from node `from` to node `to` with
    /// `redis-cli --cluster reshard`, keys included, while clients keep
    /// running: they see `ASK` during the move and `MOVED` after it.
    pub fn reshard(&self, from: usize, to: usize, slots: u32) {
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
                if info.contains("cluster_state:ok") && info.contains("cluster_slots_ok:16384") {
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
