//! The connection a [`RedisStore`](super::RedisStore) sends its scripts on:
//! one server through a reconnecting [`ConnectionManager`], or, with the
//! `cluster` feature, a Redis Cluster through the redis crate's cluster
//! client, which routes each script to the node that owns its keys' slot
//! and follows `MOVED` and `ASK` redirections by itself.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

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

/// How long calls fail at once after the server refused a connection,
/// before one call may try again. It bounds how long decisions keep failing
/// once Redis accepts connections again (about twice this: the call that
/// tries finds the refusal of the attempt before it, and starts the next
/// one in the background), and how often a down Redis is knocked on.
const REFUSED_FOR: Duration = Duration::from_millis(100);

/// Whether a single server refused its connection lately (nothing listens
/// on its port: it is down or restarting). Calls then fail at once instead
/// of waiting on connection attempts; one call per [`REFUSED_FOR`] goes
/// through, which has the connection manager try again in the background.
///
/// Not used on a cluster, whose client follows each node by itself: one
/// node refusing says nothing about the others.
#[derive(Debug)]
pub(crate) struct Refusals {
    /// The zero of `until`.
    start: Instant,
    /// Microseconds after `start` until which calls fail at once; 0 while
    /// the server is not known to refuse.
    until: AtomicU64,
}

impl Refusals {
    pub(crate) fn new() -> Self {
        Refusals {
            start: Instant::now(),
            until: AtomicU64::new(0),
        }
    }

    /// Never 0, which means "not refused".
    fn now(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_micros())
            .unwrap_or(u64::MAX - 1)
            .saturating_add(1)
    }

    fn later(&self) -> u64 {
        let wait = u64::try_from(REFUSED_FOR.as_micros()).unwrap_or(u64::MAX);
        self.now().saturating_add(wait)
    }

    /// Whether a call may go to the server now: always, unless it refused
    /// lately; then only the first call after [`REFUSED_FOR`], which tries
    /// again.
    pub(crate) fn admit(&self) -> bool {
        let until = self.until.load(Ordering::Relaxed);
        if until == 0 {
            return true;
        }
        if self.now() < until {
            return false;
        }
        self.until
            .compare_exchange(until, self.later(), Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
    }

    /// Takes note of how a call that went to the server ended: a refused
    /// connection makes the next calls fail at once; an answer from the
    /// server (a reply, or an error of its own) ends that.
    pub(crate) fn observe<T>(&self, result: &redis::RedisResult<T>) {
        match result {
            Err(err) if err.is_connection_refusal() => {
                self.until.store(self.later(), Ordering::Relaxed);
            }
            Err(err) if err.is_io_error() || err.is_timeout() => {}
            _ => {
                if self.until.load(Ordering::Relaxed) != 0 {
                    self.until.store(0, Ordering::Relaxed);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused() -> redis::RedisResult<()> {
        Err(std::io::Error::from(std::io::ErrorKind::ConnectionRefused).into())
    }

    #[test]
    fn a_refusal_fails_calls_until_the_server_answers() {
        let refusals = Refusals::new();
        assert!(refusals.admit());
        refusals.observe(&refused());
        assert!(!refusals.admit(), "a refused server is tried again at once");
        // A reset connection says nothing about refusals.
        refusals.observe::<()>(&Err(
            std::io::Error::from(std::io::ErrorKind::BrokenPipe).into()
        ));
        assert!(!refusals.admit());
        // Any answer of the server's own, an error too, ends it.
        refusals.observe::<()>(&Err(redis::RedisError::from((
            redis::ErrorKind::Server(redis::ServerErrorKind::NoScript),
            "NOSCRIPT",
        ))));
        assert!(refusals.admit());
        refusals.observe(&refused());
        refusals.observe(&Ok(()));
        assert!(refusals.admit());
    }
}
