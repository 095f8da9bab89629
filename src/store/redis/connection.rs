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
    #[cfg(feature = "sentinel")]
    Sentinel(std::sync::Arc<super::sentinel::SentinelConn>),
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Single(conn) => conn.req_packed_command(cmd),
            #[cfg(feature = "cluster")]
            Conn::Cluster(conn) => conn.req_packed_command(cmd),
            #[cfg(feature = "sentinel")]
            Conn::Sentinel(sentinel) => {
                let conn = sentinel.connection();
                Box::pin(async move { conn?.req_packed_command(cmd).await })
            }
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
            #[cfg(feature = "sentinel")]
            Conn::Sentinel(sentinel) => {
                let conn = sentinel.connection();
                Box::pin(async move { conn?.req_packed_commands(pipeline, offset, count).await })
            }
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(conn) => conn.get_db(),
            #[cfg(feature = "cluster")]
            Conn::Cluster(conn) => conn.get_db(),
            #[cfg(feature = "sentinel")]
            Conn::Sentinel(sentinel) => sentinel.db(),
        }
    }
}

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            #[cfg(feature = "sentinel")]
            Conn::Sentinel(sentinel) => sentinel.fmt(f),
            _ => f.write_str(self.kind()),
        }
    }
}

impl Conn {
    /// `"redis"`, `"redis-cluster"` or `"redis-sentinel"`, for logs.
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            Conn::Single(_) => "redis",
            #[cfg(feature = "cluster")]
            Conn::Cluster(_) => "redis-cluster",
            #[cfg(feature = "sentinel")]
            Conn::Sentinel(_) => "redis-sentinel",
        }
    }

    /// Whether every call goes to one server: calls may then share a
    /// script (the batcher) and one `SCRIPT LOAD` serves them all.
    pub(crate) fn one_server(&self) -> bool {
        match self {
            Conn::Single(_) => true,
            #[cfg(feature = "cluster")]
            Conn::Cluster(_) => false,
            #[cfg(feature = "sentinel")]
            Conn::Sentinel(_) => true,
        }
    }

    /// Takes note of a failed call (`None`: the store's own timeout). On
    /// Sentinel, a failure that may mean the master moved starts a lookup
    /// in the background.
    pub(crate) fn failed(&self, err: Option<&redis::RedisError>) {
        #[cfg(feature = "sentinel")]
        if let Conn::Sentinel(sentinel) = self {
            sentinel.failed(err);
        }
        let _ = err;
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
/// A refusal reported by a call that was sent before some other call got
/// an answer is stale (it used a connection attempt older than the one
/// that works now) and leaves the gate as it is: so the gate never closes
/// on a server that answers.
///
/// Not used on a cluster, whose client follows each node by itself: one
/// node refusing says nothing about the others.
#[derive(Debug)]
pub(crate) struct Refusals {
    /// The zero of [`now`](Self::now).
    start: Instant,
    /// The instant (of [`now`](Self::now)) until which calls fail at once;
    /// 0 while the server is not known to refuse.
    until: AtomicU64,
    /// How many answers the server has given: the generation a call is
    /// admitted in, to tell its refusal stale.
    answers: AtomicU64,
}

/// A call let through by [`Refusals::admit`], to be reported to
/// [`Refusals::observe`].
#[derive(Clone, Copy, Debug)]
pub(crate) struct Admitted {
    answers: u64,
}

impl Refusals {
    pub(crate) fn new() -> Self {
        Refusals {
            start: Instant::now(),
            until: AtomicU64::new(0),
            answers: AtomicU64::new(0),
        }
    }

    /// Microseconds since the gate was made, never 0 (which means "not
    /// refused"). The gate takes its time as a parameter, so that its tests
    /// do not depend on how fast the machine runs them.
    pub(crate) fn now(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_micros())
            .unwrap_or(u64::MAX - 1)
            .saturating_add(1)
    }

    fn later(now: u64) -> u64 {
        let wait = u64::try_from(REFUSED_FOR.as_micros()).unwrap_or(u64::MAX);
        now.saturating_add(wait)
    }

    /// Whether a call may go to the server at `now`: always, unless it
    /// refused lately; then only the first call after [`REFUSED_FOR`],
    /// which tries again.
    pub(crate) fn admit(&self, now: u64) -> Option<Admitted> {
        let admitted = Admitted {
            answers: self.answers.load(Ordering::SeqCst),
        };
        let until = self.until.load(Ordering::SeqCst);
        let open = until == 0 || (now >= until && self.take_turn(until, now));
        open.then_some(admitted)
    }

    /// Whether this call, which found the window that began with `until`
    /// over, is the one that tries again: the first to move the window on,
    /// or any call once an answer has opened the gate meanwhile.
    fn take_turn(&self, until: u64, now: u64) -> bool {
        match self.until.compare_exchange(
            until,
            Self::later(now),
            Ordering::SeqCst,
            Ordering::SeqCst,
        ) {
            Ok(_) | Err(0) => true,
            Err(_) => false,
        }
    }

    /// Takes note of how a call admitted as `admitted` ended at `now`: a
    /// refused connection makes the next calls fail at once, unless the
    /// server has answered since the call was admitted; an answer from the
    /// server (a reply, or an error of its own) opens the gate.
    pub(crate) fn observe<T>(&self, admitted: Admitted, result: &redis::RedisResult<T>, now: u64) {
        match result {
            Err(err) if err.is_connection_refusal() => {
                if self.answers.load(Ordering::SeqCst) != admitted.answers {
                    return;
                }
                let until = Self::later(now);
                self.until.store(until, Ordering::SeqCst);
                // An answer counted between the check and the store may
                // have found the gate still open and left it so: undo.
                if self.answers.load(Ordering::SeqCst) != admitted.answers {
                    let _ =
                        self.until
                            .compare_exchange(until, 0, Ordering::SeqCst, Ordering::SeqCst);
                }
            }
            Err(err) if err.is_io_error() || err.is_timeout() => {}
            _ => {
                self.answers.fetch_add(1, Ordering::SeqCst);
                if self.until.load(Ordering::SeqCst) != 0 {
                    self.until.store(0, Ordering::SeqCst);
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

    fn answered() -> redis::RedisResult<()> {
        Ok(())
    }

    const WAIT: u64 = REFUSED_FOR.as_micros() as u64;

    #[test]
    fn a_refusal_fails_calls_until_the_server_answers() {
        let gate = Refusals::new();
        let t = 1;
        let call = gate.admit(t).expect("open at first");
        gate.observe(call, &refused(), t);
        assert!(
            gate.admit(t).is_none(),
            "a refused server is tried again at once"
        );
        // A reset connection says nothing about refusals.
        let broken: redis::RedisResult<()> =
            Err(std::io::Error::from(std::io::ErrorKind::BrokenPipe).into());
        gate.observe(call, &broken, t);
        assert!(gate.admit(t + 1).is_none());
        // Any answer of the server's own, an error too, ends it.
        let noscript: redis::RedisResult<()> = Err(redis::RedisError::from((
            redis::ErrorKind::Server(redis::ServerErrorKind::NoScript),
            "NOSCRIPT",
        )));
        gate.observe(call, &noscript, t + 2);
        assert!(gate.admit(t + 3).is_some());
        let call = gate.admit(t + 3).expect("open");
        gate.observe(call, &refused(), t + 4);
        gate.observe(call, &answered(), t + 5);
        assert!(gate.admit(t + 6).is_some());
    }

    #[test]
    fn one_call_per_window_tries_again() {
        let gate = Refusals::new();
        let t = 1;
        let call = gate.admit(t).expect("open at first");
        gate.observe(call, &refused(), t);
        assert!(gate.admit(t + WAIT - 1).is_none(), "within the window");
        let probe = gate
            .admit(t + WAIT)
            .expect("the first call after the window");
        assert!(gate.admit(t + WAIT).is_none(), "a second call at once");
        assert!(gate.admit(t + 2 * WAIT - 1).is_none());
        gate.observe(probe, &refused(), t + WAIT + 1);
        assert!(
            gate.admit(t + 2 * WAIT).is_none(),
            "the probe's refusal restarts it"
        );
        assert!(gate.admit(t + 2 * WAIT + 1).is_some());
    }

    #[test]
    fn a_stale_refusal_leaves_an_answering_server_open() {
        let gate = Refusals::new();
        let t = 1;
        // Two calls in flight; one is answered, then the other, sent on an
        // older connection attempt, reports a refusal.
        let stale = gate.admit(t).expect("open");
        let fresh = gate.admit(t).expect("open");
        gate.observe(fresh, &answered(), t + 1);
        gate.observe(stale, &refused(), t + 2);
        assert!(gate.admit(t + 3).is_some(), "closed by a stale refusal");
        // A call admitted after that answer still closes it.
        let call = gate.admit(t + 3).expect("open");
        gate.observe(call, &refused(), t + 4);
        assert!(gate.admit(t + 5).is_none());
    }

    #[test]
    fn a_gate_opened_while_a_call_takes_its_turn_admits_it() {
        let gate = Refusals::new();
        let t = 1;
        let call = gate.admit(t).expect("open");
        gate.observe(call, &refused(), t);
        // The call that finds the window over has read `until`, then an
        // answer opens the gate before it takes its turn: it goes through.
        let until = gate.until.load(Ordering::SeqCst);
        gate.observe(call, &answered(), t + 1);
        assert!(gate.take_turn(until, t + WAIT), "refused on an open gate");
        assert!(gate.admit(t + WAIT).is_some());
    }
}
