//! The connection a [`RedisStore`](super::RedisStore) sends its scripts on:
//! one server through a reconnecting [`ConnectionManager`], or, with the
//! `cluster` feature, a Redis Cluster through the redis crate's cluster
//! client, which routes each script to the node that owns its keys' slot
//! and follows `MOVED` and `ASK` redirections by itself.

use redis::aio::{ConnectionLike, ConnectionManager};
use redis::{Cmd, Pipeline, RedisFuture, Value};

#[derive(Clone)]
pub(crate) enum Conn {
    Single(ConnectionManager),
    #[cfg(feature = "cluster")]
    Cluster(redis::cluster_async::ClusterConnection),
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Single(conn) => conn.req_packed_command(cmd),
            #[cfg(feature = "cluster")]
            Conn::Cluster(conn) => conn.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Single(conn) => conn.req_packed_commands(pipeline, offset, count),
            #[cfg(feature = "cluster")]
            Conn::Cluster(conn) => conn.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(conn) => conn.get_db(),
            #[cfg(feature = "cluster")]
            Conn::Cluster(conn) => conn.get_db(),
        }
    }
}

impl Conn {
    /// `"redis"` or `"redis-cluster"`, for logs.
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            Conn::Single(_) => "redis",
            #[cfg(feature = "cluster")]
            Conn::Cluster(_) => "redis-cluster",
        }
    }
}
