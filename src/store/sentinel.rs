//! The connection of a [`RedisStore`](super::RedisStore) built with
//! [`connect_sentinel`](super::RedisStoreBuilder::connect_sentinel): a
//! plain multiplexed connection to the master the sentinels name, swapped
//! for a connection to the new master after a failover.
//!
//! The connection never reconnects by itself: the only way to any server is
//! a lookup, which asks the sentinels for the master and checks that the
//! server named says `ROLE` master (the redis crate's `SentinelClient`), so
//! the store never sends to an address it merely used to know. A lookup
//! runs in the background, one at a time and at most one per
//! [`LOOKUP_EVERY`], when a call fails in a way that says the master may
//! have moved (its connection dropped or refused, a timeout, `READONLY`,
//! `MASTERDOWN`, `NOREPLICAS`), and when a periodic question to the
//! sentinels (`SENTINEL GET-MASTER-ADDR-BY-NAME`) names another address
//! than the one in use: a master demoted by hand, or cut off from the
//! sentinels, still answers normally, so the calls alone would not tell.
//! Calls never wait for a lookup: until it swaps the connection they fail
//! (at once on a dropped connection) and the layers follow their failure
//! policy.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, PoisonError, RwLock, Weak};
use std::time::{Duration, Instant};

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::sentinel::{SentinelClient, SentinelNodeConnectionInfo, SentinelServerType};
use redis::{AsyncConnectionConfig, ConnectionInfo, ErrorKind, RedisError, ServerErrorKind};

/// The shortest time between the starts of two lookups: calls failing by
/// the thousand during a failover start one lookup per this, not one each.
pub(crate) const LOOKUP_EVERY: Duration = Duration::from_millis(100);

/// The master the sentinels name, and the store's connection to it.
pub(crate) struct SentinelConn {
    name: String,
    /// Asks the sentinels and checks the master's `ROLE`; locked by the one
    /// lookup running.
    client: tokio::sync::Mutex<SentinelClient>,
    current: RwLock<Option<Master>>,
    /// Whether a lookup is running.
    looking: AtomicBool,
    /// The zero of `last_lookup`.
    start: Instant,
    /// When the last lookup started, in µs since `start` plus one; 0 before
    /// the first.
    last_lookup: AtomicU64,
    /// Bounds each lookup, and each question of the periodic check.
    connect_timeout: Duration,
    /// How many times the connection was swapped (for `Debug`).
    swaps: AtomicU64,
}

#[derive(Clone)]
struct Master {
    /// `host:port`, as the sentinels name it.
    addr: String,
    conn: MultiplexedConnection,
}

/// What the settings of
/// [`connect_sentinel`](super::RedisStoreBuilder::connect_sentinel) make.
pub(crate) struct Settings {
    pub(crate) name: String,
    pub(crate) sentinels: Vec<ConnectionInfo>,
    pub(crate) node: SentinelNodeConnectionInfo,
    pub(crate) connect_timeout: Duration,
    pub(crate) poll: Duration,
}

impl SentinelConn {
    /// The connection, with no master yet; the caller looks it up
    /// ([`SentinelConn::lookup`] or [`SentinelConn::trigger`]) and starts
    /// the periodic check ([`SentinelConn::watch`]).
    pub(crate) fn new(settings: &Settings) -> redis::RedisResult<Arc<Self>> {
        let client = SentinelClient::build(
            settings.sentinels.clone(),
            settings.name.clone(),
            Some(settings.node.clone()),
            SentinelServerType::Master,
        )?;
        Ok(Arc::new(SentinelConn {
            name: settings.name.clone(),
            client: tokio::sync::Mutex::new(client),
            current: RwLock::new(None),
            looking: AtomicBool::new(false),
            start: Instant::now(),
            last_lookup: AtomicU64::new(0),
            connect_timeout: settings.connect_timeout,
            swaps: AtomicU64::new(0),
        }))
    }

    fn master(&self) -> Option<Master> {
        self.current
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The master's `host:port`, once one is known.
    pub(crate) fn addr(&self) -> Option<String> {
        self.current
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .map(|m| m.addr.clone())
    }

    /// How many times the master connection was made or swapped.
    pub(crate) fn swaps(&self) -> u64 {
        self.swaps.load(Ordering::Relaxed)
    }

    /// The current master's connection, or an error (of the I/O kind, so a
    /// transient one that starts a lookup) while none is known.
    pub(crate) fn connection(&self) -> redis::RedisResult<MultiplexedConnection> {
        match self.master() {
            Some(master) => Ok(master.conn),
            None => Err(std::io::Error::new(
                std::io::ErrorKind::NotConnected,
                "no Redis master known yet; asking the sentinels",
            )
            .into()),
        }
    }

    pub(crate) fn db(&self) -> i64 {
        self.master().map_or(0, |m| m.conn.get_db())
    }

    /// Takes note of a failed call (`None`: the store's own timeout): one
    /// that may mean the master moved starts a lookup.
    pub(crate) fn failed(self: &Arc<Self>, err: Option<&RedisError>) {
        let broken = err.is_none_or(|e| e.is_io_error() || e.is_connection_dropped());
        let moved = err.is_some_and(|e| {
            matches!(
                e.kind(),
                ErrorKind::Server(ServerErrorKind::ReadOnly | ServerErrorKind::MasterDown)
            ) || e.code() == Some("NOREPLICAS")
        });
        if broken || moved {
            // A timeout says nothing certain about the connection: the
            // lookup checks it before replacing it.
            self.trigger(err.is_some() && broken);
        }
    }

    /// Starts a lookup in the background unless one runs or one started
    /// less than [`LOOKUP_EVERY`] ago. `broken`: the current connection
    /// failed, so it is replaced even if the sentinels still name its
    /// address; otherwise it is kept while it answers `PING`.
    pub(crate) fn trigger(self: &Arc<Self>, broken: bool) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if !self.take_turn(self.now()) {
            return;
        }
        let turn = Looking(self.clone());
        runtime.spawn(async move {
            let _ = turn.0.lookup(broken).await;
            drop(turn);
        });
    }

    /// Whether a lookup may start at `now` (µs, never 0): none runs, and
    /// the last one started at least [`LOOKUP_EVERY`] ago. If so, marks
    /// one as running; the caller clears the mark when it ends
    /// ([`Looking`]). Takes the time as a parameter, so that its tests do
    /// not depend on how fast the machine runs them.
    fn take_turn(&self, now: u64) -> bool {
        if self.looking.swap(true, Ordering::AcqRel) {
            return false;
        }
        let last = self.last_lookup.load(Ordering::Acquire);
        let every = u64::try_from(LOOKUP_EVERY.as_micros()).unwrap_or(u64::MAX);
        if last != 0 && now < last.saturating_add(every) {
            self.looking.store(false, Ordering::Release);
            return false;
        }
        self.last_lookup.store(now, Ordering::Release);
        true
    }

    fn now(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_micros())
            .unwrap_or(u64::MAX - 1)
            .saturating_add(1)
    }

    /// Asks the sentinels for the master and swaps the connection if they
    /// name another one (or, with `broken`, in any case), all within the
    /// connect timeout. On failure the current connection stays.
    pub(crate) async fn lookup(&self, broken: bool) -> Result<(), RedisError> {
        let found = tokio::time::timeout(self.connect_timeout, async {
            let client = self.client.lock().await.async_get_client().await?;
            let addr = client.get_connection_info().addr().to_string();
            if !broken && let Some(mut current) = self.master().filter(|m| m.addr == addr) {
                let pong: redis::RedisResult<()> =
                    redis::cmd("PING").query_async(&mut current.conn).await;
                if pong.is_ok() {
                    return Ok(None);
                }
            }
            let config = AsyncConnectionConfig::new()
                .set_response_timeout(None)
                .set_connection_timeout(Some(self.connect_timeout));
            let conn = client
                .get_multiplexed_async_connection_with_config(&config)
                .await?;
            Ok::<_, RedisError>(Some(Master { addr, conn }))
        })
        .await;
        match found {
            Ok(Ok(Some(master))) => {
                let addr = master.addr.clone();
                let old = self
                    .current
                    .write()
                    .unwrap_or_else(PoisonError::into_inner)
                    .replace(master);
                self.swaps.fetch_add(1, Ordering::Relaxed);
                match old {
                    Some(old) if old.addr != addr => tracing::warn!(
                        master = %self.name,
                        from = %old.addr,
                        to = %addr,
                        "sentinel: Redis master moved; connected to the new one"
                    ),
                    Some(_) => {
                        tracing::info!(master = %self.name, addr = %addr, "sentinel: reconnected to the Redis master")
                    }
                    None => {
                        tracing::info!(master = %self.name, addr = %addr, "sentinel: connected to the Redis master")
                    }
                }
                Ok(())
            }
            Ok(Ok(None)) => Ok(()),
            Ok(Err(err)) => {
                tracing::debug!(master = %self.name, error = %err, "sentinel: master lookup failed");
                Err(err)
            }
            Err(_) => {
                tracing::debug!(master = %self.name, "sentinel: master lookup timed out");
                Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "asking the sentinels for the master timed out",
                )
                .into())
            }
        }
    }

    /// Asks the sentinels every `every` which address the master has, and
    /// looks the master up when that is not the one in use (or none is).
    /// Ends once the store is dropped.
    pub(crate) fn watch(this: &Arc<Self>, sentinels: Vec<ConnectionInfo>, every: Duration) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let weak: Weak<Self> = Arc::downgrade(this);
        let (name, timeout) = (this.name.clone(), this.connect_timeout);
        runtime.spawn(async move {
            let mut asker = Asker {
                sentinels,
                next: 0,
                conn: None,
            };
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            tick.tick().await;
            loop {
                tick.tick().await;
                if weak.strong_count() == 0 {
                    return;
                }
                let named = asker.ask(&name, timeout).await;
                let Some(this) = weak.upgrade() else {
                    return;
                };
                let current = this.addr();
                match (named, current) {
                    (_, None) => this.trigger(true),
                    (Some(named), Some(current)) if named != current => this.trigger(false),
                    _ => {}
                }
            }
        });
    }
}

impl std::fmt::Debug for SentinelConn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sentinel")
            .field("master_name", &self.name)
            .field("master", &self.addr())
            .field("swaps", &self.swaps())
            .finish()
    }
}

/// Clears [`SentinelConn::looking`] when the lookup ends, also if its task
/// is dropped.
struct Looking(Arc<SentinelConn>);

impl Drop for Looking {
    fn drop(&mut self) {
        self.0.looking.store(false, Ordering::Release);
    }
}

/// The periodic check's own connection to one sentinel at a time.
struct Asker {
    sentinels: Vec<ConnectionInfo>,
    /// The sentinel to ask next.
    next: usize,
    conn: Option<MultiplexedConnection>,
}

impl Asker {
    /// `host:port` of the master as the first sentinel that answers names
    /// it; `None` if none does.
    async fn ask(&mut self, name: &str, timeout: Duration) -> Option<String> {
        for _ in 0..self.sentinels.len() {
            let answer = tokio::time::timeout(timeout, self.ask_one(name)).await;
            match answer {
                Ok(Ok(Some((host, port)))) => return Some(format!("{host}:{port}")),
                Ok(Ok(None)) => return None,
                _ => {
                    self.conn = None;
                    self.next = (self.next + 1) % self.sentinels.len().max(1);
                }
            }
        }
        None
    }

    async fn ask_one(&mut self, name: &str) -> redis::RedisResult<Option<(String, u16)>> {
        let mut conn = match self.conn.clone() {
            Some(conn) => conn,
            None => {
                let info = self.sentinels.get(self.next).cloned().ok_or_else(|| {
                    RedisError::from((ErrorKind::EmptySentinelList, "no sentinels"))
                })?;
                let config = AsyncConnectionConfig::new().set_response_timeout(None);
                let conn = redis::Client::open(info)?
                    .get_multiplexed_async_connection_with_config(&config)
                    .await?;
                self.conn = Some(conn.clone());
                conn
            }
        };
        redis::cmd("SENTINEL")
            .arg("GET-MASTER-ADDR-BY-NAME")
            .arg(name)
            .query_async(&mut conn)
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conn() -> Arc<SentinelConn> {
        SentinelConn::new(&Settings {
            name: "mymaster".into(),
            sentinels: vec![
                redis::IntoConnectionInfo::into_connection_info("redis://127.0.0.1:1").unwrap(),
            ],
            node: SentinelNodeConnectionInfo::default(),
            connect_timeout: Duration::from_secs(1),
            poll: Duration::from_millis(500),
        })
        .unwrap()
    }

    const EVERY: u64 = LOOKUP_EVERY.as_micros() as u64;

    #[test]
    fn one_lookup_at_a_time_and_one_per_interval() {
        let c = conn();
        let t = 1;
        assert!(c.take_turn(t), "the first lookup");
        assert!(!c.take_turn(t + 2 * EVERY), "while one runs");
        c.looking.store(false, Ordering::Release);
        assert!(!c.take_turn(t + EVERY - 1), "too soon after the last");
        assert!(
            !c.looking.load(Ordering::Acquire),
            "a refused turn left the mark"
        );
        assert!(c.take_turn(t + EVERY), "once the interval has passed");
    }

    #[tokio::test]
    async fn calls_fail_at_once_until_a_master_is_known() {
        let c = conn();
        let Err(err) = c.connection() else {
            panic!("a master before any lookup")
        };
        assert!(err.is_io_error(), "{err}");
        assert_eq!(c.addr(), None);
        // A failure starts one lookup, in the background; it fails
        // (nothing listens on port 1) and leaves no master.
        c.failed(Some(&err));
        assert!(c.looking.load(Ordering::Acquire) || c.last_lookup.load(Ordering::Acquire) != 0);
        assert!(c.lookup(true).await.is_err());
        assert_eq!(c.addr(), None);
        assert_eq!(c.swaps(), 0);
    }
}
