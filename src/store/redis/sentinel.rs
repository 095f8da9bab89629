//! The connection of a [`RedisStore`](super::RedisStore) on
//! [`Topology::sentinel`](super::Topology::sentinel): a
//! plain multiplexed connection to the master the sentinels name, swapped
//! for a connection to the new master after a failover.
//!
//! The connection never reconnects by itself: the only way to any server is
//! a lookup, which
//!
//! - asks every sentinel at once (`SENTINEL MASTER <name>`), within the
//!   connect timeout, so one sentinel that never answers holds nothing up;
//! - takes an address only once **more than half of all the configured
//!   sentinels** (not only of those that answered) name it, as a master
//!   they do not flag down. A sentinel cut off with the old master, which
//!   still answers `ROLE` master, names it for as long as the cut lasts:
//!   taking the first answer (as this module did before) let that one
//!   sentinel move the store back to the old master, and the next periodic
//!   check move it forward again. Sentinel itself needs a majority to fail
//!   over, so the majority's address is the one that can have been
//!   promoted. The price: with more than half the sentinels unreachable
//!   from the store, no lookup succeeds, and the store keeps the
//!   connection it has (or, with none, fails calls under the failure
//!   policy) until they are back;
//! - while no address has that majority, asks the sentinels that answered
//!   again every [`ASK_AGAIN`]: one that saw no master (flags it down, a
//!   failover under way) or named another address may name the winner a
//!   moment later. Only sentinels that failed (an error, or no answer in
//!   time) are not asked again, and only they end the lookup early, once
//!   the others cannot make a majority any more; otherwise it runs until
//!   the connect timeout;
//! - connects to the winner (through a redis crate `SentinelClient` of a
//!   sentinel that named it, which holds the master's password and TLS
//!   settings, and checks its `ROLE`; or, for a master checked against
//!   given certificates, which that client cannot take, directly:
//!   [`MasterTls`]), checks `ROLE` again on the new connection, and swaps
//!   it in; a winner that cannot be connected to or
//!   is no master is tried again while the majority names it, within the
//!   same time. So the store never sends to an address it merely used to
//!   know, nor to one a minority of the sentinels names.
//!
//! A lookup runs in the background, one at a time and at most one per
//! [`LOOKUP_EVERY`], when a call fails in a way that says the master may
//! have moved (its connection dropped or refused, a timeout, `READONLY`,
//! `MASTERDOWN`, `NOREPLICAS`, also wrapped in a Redis < 7 script error),
//! and when the periodic check asks one sentinel (`SENTINEL
//! GET-MASTER-ADDR-BY-NAME`) and it names another address than the one in
//! use: a master demoted by hand, or cut off from the sentinels, still
//! answers normally, so the calls alone would not tell. After such a
//! disagreement the check asks the next sentinel, so that one sentinel in
//! the minority does not start a lookup at every check.
//!
//! Each connection swapped in has a generation, and a call reports its
//! failure with the generation of the connection it was sent on: a call
//! sent to the old master that fails after the swap starts no lookup (it
//! would replace the new master's sound connection once more).
//! Calls never wait for a lookup: until it swaps the connection they fail
//! (at once on a dropped connection) and the layers follow their failure
//! policy.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, PoisonError, RwLock, Weak};
use std::time::{Duration, Instant};

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::sentinel::{SentinelClient, SentinelNodeConnectionInfo, SentinelServerType};
use redis::{AsyncConnectionConfig, ConnectionInfo, ErrorKind, RedisError, ServerErrorKind, Value};

use crate::log::LogGate;

/// Failed lookups are logged at `warn` at most once a second per process.
static LOOKUP_WARNINGS: LogGate = LogGate::new();

/// The shortest time between the starts of two lookups: calls failing by
/// the thousand during a failover start one lookup per this, not one each.
pub(crate) const LOOKUP_EVERY: Duration = Duration::from_millis(100);

/// The master the sentinels name, and the store's connection to it.
pub(crate) struct SentinelConn {
    name: String,
    /// The sentinels, as the lookups ask them.
    voters: Vec<Arc<Voter>>,
    current: RwLock<Option<Arc<Master>>>,
    /// Whether a lookup is running.
    looking: AtomicBool,
    /// The zero of `last_lookup`.
    start: Instant,
    /// When the last lookup started, in µs since `start` plus one; 0 before
    /// the first.
    last_lookup: AtomicU64,
    /// Bounds each lookup, and each question of the periodic check.
    connect_timeout: Duration,
    /// With it, the store connects to the master itself, not through the
    /// sentinel clients (which cannot take its certificates).
    #[cfg(feature = "tls-rustls")]
    master_tls: Option<MasterTls>,
    /// How many times the connection was swapped (for `Debug`): the
    /// generation of the connection in use (0: none yet). Changed only
    /// with `current` locked for writing.
    swaps: AtomicU64,
}

struct Master {
    /// `host:port`, as the sentinels name it.
    addr: String,
    conn: MultiplexedConnection,
    /// How `conn` was made (address, TLS, credentials, database): for the
    /// store's other connections to the master (its release subscriber,
    /// [`wake`](super::wake)).
    info: ConnectionInfo,
    /// [`SentinelConn::swaps`] when this connection was swapped in: its
    /// generation, which tells a failure of it from one of a connection
    /// it replaced.
    generation: u64,
}

/// The connection a call is sent on: the master's, tagged with its
/// generation, so that a failure is reported with the connection it
/// happened on ([`SentinelConn::failed_on`]).
pub(crate) struct Tagged {
    conn: MultiplexedConnection,
    generation: u64,
    owner: Arc<SentinelConn>,
}

impl Tagged {
    /// Reports a failure: the connection's, or the server's error reply
    /// (which the client hands over as a value, made an error later).
    fn report(&self, result: Result<&[Value], &RedisError>) {
        match result {
            Err(err) => self.owner.failed_on(self.generation, err),
            Ok(values) => {
                for value in values {
                    if let Value::ServerError(err) = value {
                        self.owner
                            .failed_on(self.generation, &RedisError::from(err.clone()));
                    }
                }
            }
        }
    }
}

impl ConnectionLike for Tagged {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a redis::Cmd) -> redis::RedisFuture<'a, Value> {
        Box::pin(async move {
            let result = self.conn.req_packed_command(cmd).await;
            self.report(result.as_ref().map(std::slice::from_ref));
            result
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            let result = self.conn.req_packed_commands(pipeline, offset, count).await;
            self.report(result.as_ref().map(Vec::as_slice));
            result
        })
    }

    fn get_db(&self) -> i64 {
        self.conn.get_db()
    }
}

/// One sentinel, as the lookups ask it.
struct Voter {
    info: ConnectionInfo,
    /// The lookups' connection to it, made on the first question and
    /// dropped when a question fails.
    conn: tokio::sync::Mutex<Option<MultiplexedConnection>>,
    /// Connects to the master this sentinel names (asking it again, with
    /// `SENTINEL MASTERS`, and checking the master's `ROLE`), with the
    /// settings of the master's connection (password, TLS).
    client: tokio::sync::Mutex<SentinelClient>,
}

/// What one sentinel answered a lookup.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Answer {
    /// It names this `host:port`, a master it does not flag down.
    Names(String),
    /// It answered without a master: it does not know the name, or flags
    /// the master down (a failover is under way). It is asked again.
    NoMaster,
    /// No answer: an error, or none within the lookup's time. It is not
    /// asked again in this lookup.
    Failed,
}

/// The latest answer of each sentinel in one lookup.
#[derive(Debug)]
struct Tally {
    latest: Vec<Option<Answer>>,
}

impl Tally {
    fn new(sentinels: usize) -> Self {
        Tally {
            latest: vec![None; sentinels],
        }
    }

    fn set(&mut self, sentinel: usize, answer: Answer) {
        if let Some(slot) = self.latest.get_mut(sentinel) {
            *slot = Some(answer);
        }
    }

    /// The address more than half of all the sentinels (not only of those
    /// that answered) name now, and which of them name it.
    fn winner(&self) -> Option<(&str, Vec<usize>)> {
        let named = |i: usize| match self.latest.get(i) {
            Some(Some(Answer::Names(addr))) => Some(addr.as_str()),
            _ => None,
        };
        (0..self.latest.len()).find_map(|i| {
            let addr = named(i)?;
            let voters: Vec<usize> = (0..self.latest.len())
                .filter(|&j| named(j) == Some(addr))
                .collect();
            (voters.len() * 2 > self.latest.len()).then_some((addr, voters))
        })
    }

    /// Whether no address can have a majority any more: so many sentinels
    /// failed that the others are half or fewer. Only failures count: a
    /// sentinel that answered without a master, or named another address,
    /// is asked again and may name the winner yet.
    fn hopeless(&self) -> bool {
        let failed = self
            .latest
            .iter()
            .filter(|a| matches!(a, Some(Answer::Failed)))
            .count();
        (self.latest.len() - failed) * 2 <= self.latest.len()
    }

    /// For an error: what the sentinels answered last.
    fn summary(&self) -> String {
        self.latest
            .iter()
            .map(|a| match a {
                Some(Answer::Names(addr)) => addr.as_str(),
                Some(Answer::NoMaster) => "no master",
                Some(Answer::Failed) => "failed",
                None => "no answer yet",
            })
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// How long a sentinel that answered is left before it is asked again,
/// while no address has a majority.
const ASK_AGAIN: Duration = Duration::from_millis(50);

/// What [`Topology::sentinel`](super::Topology::sentinel) and the
/// builder's Sentinel settings make.
pub(crate) struct Settings {
    pub(crate) name: String,
    pub(crate) sentinels: Vec<ConnectionInfo>,
    pub(crate) node: SentinelNodeConnectionInfo,
    pub(crate) connect_timeout: Duration,
    pub(crate) poll: Duration,
    /// A master behind TLS checked against given certificates
    /// ([`sentinel_master_tls`](super::RedisStoreBuilder::sentinel_master_tls)):
    /// then `node` is not used.
    #[cfg(feature = "tls-rustls")]
    pub(crate) master_tls: Option<MasterTls>,
}

/// How to reach a master behind TLS whose certificate is checked against
/// given certificates (a private CA), which the redis crate's
/// `SentinelClient` cannot take together with a `SentinelNodeConnectionInfo`
/// (it has no getters, and `SentinelClientBuilder` rebuilds one from its own
/// setters): the store connects to the address the majority names itself.
#[cfg(feature = "tls-rustls")]
#[derive(Clone, Debug)]
pub(crate) struct MasterTls {
    /// Username, password, database, protocol.
    pub(crate) info: redis::RedisConnectionInfo,
    /// The CA (`root_cert`) and, for `tls-auth-clients yes`, the client's
    /// certificate and key.
    pub(crate) certs: redis::TlsCertificates,
}

#[cfg(feature = "tls-rustls")]
impl MasterTls {
    /// A client of the master at `addr` (`host:port`, as the sentinels
    /// name it): TLS, the certificate checked against `certs`.
    fn client(&self, addr: &str) -> redis::RedisResult<redis::Client> {
        let (host, port) = addr
            .rsplit_once(':')
            .and_then(|(host, port)| Some((host, port.parse::<u16>().ok()?)))
            .ok_or_else(|| {
                RedisError::from((
                    ErrorKind::InvalidClientConfig,
                    "a master address without a port",
                    addr.to_owned(),
                ))
            })?;
        let info =
            redis::IntoConnectionInfo::into_connection_info(redis::ConnectionAddr::TcpTls {
                host: host.to_owned(),
                port,
                insecure: false,
                tls_params: None,
            })?
            .set_redis_settings(self.info.clone());
        redis::Client::build_with_tls(info, self.certs.clone())
    }
}

impl SentinelConn {
    /// The connection, with no master yet; the caller looks it up
    /// ([`SentinelConn::lookup`] or [`SentinelConn::trigger`]) and starts
    /// the periodic check ([`SentinelConn::watch`]).
    pub(crate) fn new(settings: &Settings) -> redis::RedisResult<Arc<Self>> {
        let voters = settings
            .sentinels
            .iter()
            .map(|sentinel| {
                SentinelClient::build(
                    vec![sentinel.clone()],
                    settings.name.clone(),
                    Some(settings.node.clone()),
                    SentinelServerType::Master,
                )
                .map(|client| {
                    Arc::new(Voter {
                        info: sentinel.clone(),
                        conn: tokio::sync::Mutex::new(None),
                        client: tokio::sync::Mutex::new(client),
                    })
                })
            })
            .collect::<redis::RedisResult<Vec<_>>>()?;
        Ok(Arc::new(SentinelConn {
            name: settings.name.clone(),
            voters,
            current: RwLock::new(None),
            looking: AtomicBool::new(false),
            start: Instant::now(),
            last_lookup: AtomicU64::new(0),
            connect_timeout: settings.connect_timeout,
            #[cfg(feature = "tls-rustls")]
            master_tls: settings.master_tls.clone(),
            swaps: AtomicU64::new(0),
        }))
    }

    fn master(&self) -> Option<Arc<Master>> {
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

    /// How to connect to the master in use, once one is known.
    pub(crate) fn master_info(&self) -> Option<ConnectionInfo> {
        self.master().map(|m| m.info.clone())
    }

    /// How many times the master connection was made or swapped.
    pub(crate) fn swaps(&self) -> u64 {
        self.swaps.load(Ordering::Acquire)
    }

    /// The current master's connection, tagged with its generation, or an
    /// error (of the I/O kind, a transient one) while none is known, which
    /// starts a lookup.
    pub(crate) fn connection(self: &Arc<Self>) -> redis::RedisResult<Tagged> {
        match self.master() {
            Some(master) => Ok(Tagged {
                conn: master.conn.clone(),
                generation: master.generation,
                owner: self.clone(),
            }),
            None => {
                self.trigger(true);
                Err(std::io::Error::new(
                    std::io::ErrorKind::NotConnected,
                    "no Redis master known yet; asking the sentinels",
                )
                .into())
            }
        }
    }

    pub(crate) fn db(&self) -> i64 {
        self.master().map_or(0, |m| m.conn.get_db())
    }

    /// Takes note of a failed call (`None`: the store's own timeout). A
    /// timeout starts a lookup that keeps the connection if it answers
    /// `PING`; an error was already reported, with the generation of the
    /// connection it came from, by [`Tagged`] ([`failed_on`](Self::failed_on)),
    /// or by [`connection`](Self::connection) when there was none.
    pub(crate) fn failed(self: &Arc<Self>, err: Option<&RedisError>) {
        if err.is_none() {
            self.trigger(false);
        }
    }

    /// Takes note of `err` on the connection of generation `generation`:
    /// one that may mean the master moved starts a lookup, unless the
    /// connection was replaced since (a call sent on the old master's
    /// connection failing after the swap says nothing about the new one).
    fn failed_on(self: &Arc<Self>, generation: u64, err: &RedisError) {
        if generation != self.swaps() {
            tracing::trace!(master = %self.name, error = %err, "sentinel: a replaced connection failed");
            return;
        }
        if let Some(broken) = lookup_after(Some(err)) {
            self.trigger(broken);
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

    /// Asks the sentinels for the master and swaps the connection if a
    /// majority of them name another one (or, with `broken`, in any case;
    /// without, the current connection is also replaced if it does not
    /// answer `PING` within [`ping_timeout`]). Bounded: the sentinels'
    /// answers by the connect timeout ([`find`](Self::find)), each
    /// connection attempt by the connect timeout too. On failure the
    /// current connection stays.
    pub(crate) async fn lookup(&self, broken: bool) -> Result<(), RedisError> {
        match self.find(broken).await {
            Ok(Some(mut master)) => {
                let addr = master.addr.clone();
                let old = {
                    let mut current = self.current.write().unwrap_or_else(PoisonError::into_inner);
                    master.generation = self.swaps.fetch_add(1, Ordering::AcqRel) + 1;
                    current.replace(Arc::new(master))
                };
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
            Ok(None) => Ok(()),
            Err(err) => {
                if LOOKUP_WARNINGS.allow() {
                    tracing::warn!(master = %self.name, error = %err, "sentinel: Redis master lookup failed");
                } else {
                    tracing::debug!(master = %self.name, error = %err, "sentinel: Redis master lookup failed");
                }
                Err(err)
            }
        }
    }

    /// The new master to swap in, or `None` to keep the current one.
    ///
    /// Asks every sentinel at once, and again every [`ASK_AGAIN`] while
    /// no address has a majority, until more than half of all the
    /// sentinels name the same master (not flagged down by them); then
    /// connects to it, unless it is the one in use and that answers
    /// `PING` (without `broken`). A master that cannot be connected to, or
    /// does not say `ROLE` master, is tried again after [`ASK_AGAIN`] if
    /// the majority still names it. All within the connect timeout (plus
    /// one connection attempt begun before its end); it fails sooner only
    /// once so many sentinels failed (error, or no answer in time) that
    /// the rest cannot make a majority.
    async fn find(&self, broken: bool) -> redis::RedisResult<Option<Master>> {
        let deadline = tokio::time::Instant::now() + self.connect_timeout;
        let (tx, mut answers) = tokio::sync::mpsc::unbounded_channel();
        let mut asking = tokio::task::JoinSet::new();
        for (i, voter) in self.voters.iter().enumerate() {
            let (voter, tx, name) = (voter.clone(), tx.clone(), self.name.clone());
            asking.spawn(async move {
                loop {
                    let answer = match tokio::time::timeout_at(deadline, voter.ask(&name)).await {
                        Ok(answer) => answer,
                        Err(_) => Err(std::io::Error::new(
                            std::io::ErrorKind::TimedOut,
                            "asking a sentinel for the master timed out",
                        )
                        .into()),
                    };
                    let failed = answer.is_err();
                    if tx.send((i, answer)).is_err() || failed {
                        return;
                    }
                    tokio::time::sleep(ASK_AGAIN).await;
                }
            });
        }
        drop(tx);
        let mut tally = Tally::new(self.voters.len());
        let mut last_err: Option<RedisError> = None;
        let mut master_err: Option<RedisError> = None;
        let mut tried: Option<tokio::time::Instant> = None;
        loop {
            let Ok(Some((i, answer))) = tokio::time::timeout_at(deadline, answers.recv()).await
            else {
                break;
            };
            let answer = answer.unwrap_or_else(|err| {
                last_err = Some(err);
                Answer::Failed
            });
            tally.set(i, answer);
            if tally.hopeless() {
                break;
            }
            let Some((addr, voters)) = tally.winner() else {
                continue;
            };
            if tried.is_some_and(|t| t.elapsed() < ASK_AGAIN) {
                continue;
            }
            tried = Some(tokio::time::Instant::now());
            let addr = addr.to_owned();
            match self.take(&addr, &voters, broken).await {
                Ok(found) => return Ok(found),
                Err(err) => master_err = Some(err),
            }
        }
        Err(match (master_err, last_err) {
            // A master a majority named failed us (a certificate it could
            // not prove, a refused connection): that is the news, even if
            // the sentinels' last questions then ran out of time.
            (Some(err), _) => err,
            (None, last_err) => RedisError::from((
                ErrorKind::MasterNameNotFoundBySentinel,
                "no master named by a majority of the sentinels",
                match last_err {
                    Some(err) => format!("they answered: {}; last error: {err}", tally.summary()),
                    None => format!("they answered: {}", tally.summary()),
                },
            )),
        })
    }

    /// `addr`, named by a majority (`voters`): `None` if it is the address
    /// in use and the connection answers `PING` (without `broken`),
    /// otherwise a new connection to it that says `ROLE` master.
    async fn take(
        &self,
        addr: &str,
        voters: &[usize],
        broken: bool,
    ) -> redis::RedisResult<Option<Master>> {
        if !broken && let Some(current) = self.master().filter(|m| m.addr == addr) {
            let mut conn = current.conn.clone();
            if answers_ping(&mut conn, ping_timeout(self.connect_timeout)).await {
                return Ok(None);
            }
        }
        let (client, named) = self.master_client(addr, voters).await?;
        let config = AsyncConnectionConfig::new()
            .set_response_timeout(None)
            .set_connection_timeout(Some(self.connect_timeout));
        let mut conn = bounded(
            self.connect_timeout,
            "connecting to the Redis master",
            client.get_multiplexed_async_connection_with_config(&config),
        )
        .await?;
        let role: Value = bounded(
            self.connect_timeout,
            "asking the Redis master its ROLE",
            redis::cmd("ROLE").query_async(&mut conn),
        )
        .await?;
        if !says_master(&role) {
            return Err(RedisError::from((
                ErrorKind::MasterNameNotFoundBySentinel,
                "the server the sentinels named is not a master",
                named,
            )));
        }
        Ok(Some(Master {
            addr: named,
            conn,
            info: client.get_connection_info().clone(),
            generation: 0,
        }))
    }

    /// A client of the master at `addr`, named by a majority (`voters`),
    /// and its address. The settings of the master's connection are in the
    /// sentinel clients: one of the sentinels that named it connects (and
    /// checks the master's `ROLE`), unless the master's certificate is
    /// checked against given certificates, which those clients cannot
    /// take: then the client is built here (the caller checks `ROLE`).
    async fn master_client(
        &self,
        addr: &str,
        voters: &[usize],
    ) -> redis::RedisResult<(redis::Client, String)> {
        #[cfg(feature = "tls-rustls")]
        if let Some(tls) = &self.master_tls {
            return Ok((tls.client(addr)?, addr.to_owned()));
        }
        let voter = voters
            .first()
            .and_then(|&i| self.voters.get(i))
            .ok_or_else(|| RedisError::from((ErrorKind::EmptySentinelList, "no sentinel")))?;
        let client = bounded(
            self.connect_timeout,
            "asking a sentinel for the master",
            async { voter.client.lock().await.async_get_client().await },
        )
        .await?;
        let named = client.get_connection_info().addr().to_string();
        if named != addr {
            return Err(RedisError::from((
                ErrorKind::MasterNameNotFoundBySentinel,
                "a sentinel named another master meanwhile",
                format!("{named}, not {addr}"),
            )));
        }
        Ok((client, named))
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
                    (Some(named), Some(current)) if named != current => {
                        // The lookup moves the store only if a majority
                        // agrees; this sentinel may be alone in its view
                        // (cut off with the old master): ask the next one
                        // from now on, so that it does not start a lookup
                        // every time.
                        this.trigger(false);
                        asker.skip();
                    }
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

impl Voter {
    /// What the sentinel answers `SENTINEL MASTER <name>` (an error: no
    /// answer).
    async fn ask(&self, name: &str) -> redis::RedisResult<Answer> {
        let mut cached = self.conn.lock().await;
        let mut conn = match cached.clone() {
            Some(conn) => conn,
            None => {
                let config = AsyncConnectionConfig::new().set_response_timeout(None);
                let conn = redis::Client::open(self.info.clone())?
                    .get_multiplexed_async_connection_with_config(&config)
                    .await?;
                *cached = Some(conn.clone());
                conn
            }
        };
        let reply: redis::RedisResult<Value> = redis::cmd("SENTINEL")
            .arg("MASTER")
            .arg(name)
            .query_async(&mut conn)
            .await;
        match reply {
            Ok(fields) => Ok(named_master(&fields)),
            // `ERR No such master with that name`: it answered.
            Err(err) if err.kind() == ErrorKind::Server(ServerErrorKind::ResponseError) => {
                Ok(Answer::NoMaster)
            }
            Err(err) => {
                *cached = None;
                Err(err)
            }
        }
    }
}

/// The master in a `SENTINEL MASTER` reply (field names and values in
/// turn, or a map), unless flagged down or not a master.
fn named_master(reply: &Value) -> Answer {
    let text = |v: &Value| match v {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        Value::Int(i) => Some(i.to_string()),
        _ => None,
    };
    let pairs: Vec<(String, String)> = match reply {
        Value::Array(items) => items
            .chunks_exact(2)
            .filter_map(|kv| Some((text(&kv[0])?, text(&kv[1])?)))
            .collect(),
        Value::Map(items) => items
            .iter()
            .filter_map(|(k, v)| Some((text(k)?, text(v)?)))
            .collect(),
        _ => return Answer::NoMaster,
    };
    let field = |name: &str| {
        pairs
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    };
    let (Some(ip), Some(port), Some(flags)) = (field("ip"), field("port"), field("flags")) else {
        return Answer::NoMaster;
    };
    let flags: Vec<&str> = flags.split(',').collect();
    if !flags.contains(&"master") || flags.contains(&"s_down") || flags.contains(&"o_down") {
        return Answer::NoMaster;
    }
    match port.parse::<u16>() {
        Ok(port) => Answer::Names(format!("{ip}:{port}")),
        Err(_) => Answer::NoMaster,
    }
}

impl Asker {
    /// Asks the next sentinel from now on.
    fn skip(&mut self) {
        self.conn = None;
        self.next = (self.next + 1) % self.sentinels.len().max(1);
    }

    /// `host:port` of the master as the first sentinel that answers names
    /// it; `None` if none does.
    async fn ask(&mut self, name: &str, timeout: Duration) -> Option<String> {
        for _ in 0..self.sentinels.len() {
            let answer = tokio::time::timeout(timeout, self.ask_one(name)).await;
            match answer {
                Ok(Ok(Some((host, port)))) => return Some(format!("{host}:{port}")),
                // This sentinel does not know the name (or failed): ask the
                // next one.
                _ => self.skip(),
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

/// Whether a failed call (`None`: the store's own timeout) starts a lookup,
/// and if so whether the connection is surely broken (`Some(true)`: replace
/// it in any case) or may still be sound (`Some(false)`: a timeout says
/// nothing certain, the lookup checks the connection before replacing it).
fn lookup_after(err: Option<&RedisError>) -> Option<bool> {
    let broken = err.is_none_or(|e| e.is_io_error() || e.is_connection_dropped());
    let moved = err.is_some_and(|e| {
        matches!(
            e.kind(),
            ErrorKind::Server(ServerErrorKind::ReadOnly | ServerErrorKind::MasterDown)
        ) || e.code() == Some("NOREPLICAS")
            || ["READONLY", "MASTERDOWN", "NOREPLICAS"]
                .into_iter()
                .any(|code| wraps(e, code))
    });
    (broken || moved).then_some(err.is_some() && broken)
}

/// Whether `err` is a script's `ERR` with a failover's `code` in its text,
/// as Redis < 7 sends what a call inside a script answered: `ERR Error
/// running script (call to f_...): @user_script:1: -READONLY You can't
/// write against a read only replica.` (The same test as in
/// `redis::is_transient`, which must not depend on this feature.)
fn wraps(err: &RedisError, code: &str) -> bool {
    err.kind() == ErrorKind::Server(ServerErrorKind::ResponseError) && {
        let text = err.to_string();
        text.contains(&format!("-{code} ")) || text.contains(&format!(": {code} "))
    }
}

/// How long a connection kept after a timeout has to answer `PING`: half
/// the connect timeout, so that a lookup that found the same address still
/// has time to connect anew.
pub(crate) fn ping_timeout(connect_timeout: Duration) -> Duration {
    connect_timeout / 2
}

/// Whether `conn` answers `PING` within `within`; a connection that does
/// not (half-open, its peer gone without a reset) is replaced.
async fn answers_ping<C: ConnectionLike + Send>(conn: &mut C, within: Duration) -> bool {
    let ping = redis::cmd("PING");
    matches!(
        tokio::time::timeout(within, ping.query_async::<()>(conn)).await,
        Ok(Ok(()))
    )
}

/// Whether a `ROLE` answer says master.
fn says_master(role: &Value) -> bool {
    let Value::Array(items) = role else {
        return false;
    };
    match items.first() {
        Some(Value::BulkString(b)) => b == b"master",
        Some(Value::SimpleString(s)) => s == "master",
        _ => false,
    }
}

/// `what`, bounded by `timeout` (its expiry an I/O error, a transient one).
async fn bounded<T>(
    timeout: Duration,
    what: &'static str,
    fut: impl std::future::Future<Output = redis::RedisResult<T>>,
) -> redis::RedisResult<T> {
    match tokio::time::timeout(timeout, fut).await {
        Ok(result) => result,
        Err(_) => Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("{what} timed out"),
        )
        .into()),
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
            #[cfg(feature = "tls-rustls")]
            master_tls: None,
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
        // Asking for the connection started one lookup, in the background;
        // it fails (nothing listens on port 1) and leaves no master.
        assert!(c.looking.load(Ordering::Acquire) || c.last_lookup.load(Ordering::Acquire) != 0);
        assert!(c.lookup(true).await.is_err());
        assert_eq!(c.addr(), None);
        assert_eq!(c.swaps(), 0);
    }

    fn lookup_started(c: &SentinelConn) -> bool {
        c.looking.load(Ordering::Acquire) || c.last_lookup.load(Ordering::Acquire) != 0
    }

    /// A call sent on the old master's connection that fails after the
    /// swap (its connection dropped, say) starts no lookup: one would
    /// replace the new master's sound connection (a failure with `broken`
    /// replaces it even when the sentinels still name its address). A
    /// failure of the connection in use still does.
    #[tokio::test]
    async fn a_failure_of_a_replaced_connection_starts_no_lookup() {
        let c = conn();
        // The connection in use is the second one; calls sent on the
        // first may still be failing.
        c.swaps.store(2, Ordering::Release);
        let dropped: RedisError =
            std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset").into();
        c.failed_on(1, &dropped);
        assert!(!lookup_started(&c), "a stale failure started a lookup");
        let readonly = RedisError::from((
            ErrorKind::Server(ServerErrorKind::ReadOnly),
            "READONLY",
            "You can't write against a read only replica.".to_owned(),
        ));
        c.failed_on(1, &readonly);
        assert!(!lookup_started(&c), "a stale READONLY started a lookup");
        c.failed_on(2, &dropped);
        assert!(lookup_started(&c), "a failure of the connection in use");
    }

    /// A connection whose every command waits forever, as on a half-open
    /// TCP connection.
    struct Silent;

    impl ConnectionLike for Silent {
        fn req_packed_command<'a>(
            &'a mut self,
            _: &'a redis::Cmd,
        ) -> redis::RedisFuture<'a, Value> {
            Box::pin(std::future::pending())
        }
        fn req_packed_commands<'a>(
            &'a mut self,
            _: &'a redis::Pipeline,
            _: usize,
            _: usize,
        ) -> redis::RedisFuture<'a, Vec<Value>> {
            Box::pin(std::future::pending())
        }
        fn get_db(&self) -> i64 {
            0
        }
    }

    /// A connection that answers every command with `PONG`.
    struct Pong;

    impl ConnectionLike for Pong {
        fn req_packed_command<'a>(
            &'a mut self,
            _: &'a redis::Cmd,
        ) -> redis::RedisFuture<'a, Value> {
            Box::pin(async { Ok(Value::SimpleString("PONG".into())) })
        }
        fn req_packed_commands<'a>(
            &'a mut self,
            _: &'a redis::Pipeline,
            _: usize,
            _: usize,
        ) -> redis::RedisFuture<'a, Vec<Value>> {
            Box::pin(async { Ok(vec![]) })
        }
        fn get_db(&self) -> i64 {
            0
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_that_does_not_answer_ping_in_time_is_replaced() {
        let within = ping_timeout(Duration::from_secs(1));
        assert_eq!(within, Duration::from_millis(500));
        assert!(
            !answers_ping(&mut Silent, within).await,
            "a silent connection kept"
        );
        assert!(
            answers_ping(&mut Pong, within).await,
            "a live connection replaced"
        );
    }

    fn names(addr: &str) -> Answer {
        Answer::Names(addr.into())
    }

    /// A sentinel cut off with the old master, which still says `ROLE`
    /// master, names it first: the lookup does not take it.
    #[test]
    fn an_address_needs_a_majority_of_all_the_sentinels() {
        let mut t = Tally::new(3);
        t.set(0, names("old:6379"));
        assert_eq!(t.winner(), None, "one of three");
        t.set(1, names("new:6379"));
        assert_eq!(t.winner(), None, "one each");
        t.set(2, names("new:6379"));
        assert_eq!(t.winner(), Some(("new:6379", vec![1, 2])));
        // Two of four is no majority; three is.
        let mut t = Tally::new(4);
        t.set(0, Answer::Failed);
        t.set(1, names("m:1"));
        t.set(2, names("m:1"));
        assert_eq!(t.winner(), None);
        assert!(!t.hopeless());
        t.set(3, names("m:1"));
        assert_eq!(t.winner(), Some(("m:1", vec![1, 2, 3])));
        // One sentinel of one.
        let mut t = Tally::new(1);
        t.set(0, names("m:1"));
        assert_eq!(t.winner(), Some(("m:1", vec![0])));
    }

    /// Only failures end a lookup early: sentinels that answered without a
    /// master (a failover under way) are asked again, and may name it yet.
    #[test]
    fn a_lookup_gives_up_only_on_failed_sentinels() {
        let mut t = Tally::new(3);
        t.set(0, Answer::NoMaster);
        t.set(1, Answer::NoMaster);
        assert!(!t.hopeless(), "two of three without a master");
        t.set(0, names("new:1"));
        t.set(1, names("new:1"));
        assert_eq!(t.winner(), Some(("new:1", vec![0, 1])));
        let mut t = Tally::new(3);
        t.set(0, Answer::Failed);
        assert!(!t.hopeless(), "one of three failed");
        t.set(1, Answer::Failed);
        assert!(t.hopeless(), "two of three failed");
        let mut t = Tally::new(4);
        t.set(0, Answer::Failed);
        assert!(!t.hopeless());
        t.set(1, Answer::Failed);
        assert!(t.hopeless(), "two of four failed: two cannot be a majority");
        assert_eq!(
            t.summary(),
            "failed, failed, no answer yet, no answer yet",
            "the error names each answer"
        );
    }

    #[test]
    fn a_sentinel_names_a_master_it_does_not_flag_down() {
        let bulk = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        let reply = |flags: &str| {
            Value::Array(
                [
                    "name", "mymaster", "ip", "10.0.0.2", "port", "6380", "flags", flags,
                ]
                .into_iter()
                .map(bulk)
                .collect(),
            )
        };
        assert_eq!(named_master(&reply("master")), names("10.0.0.2:6380"));
        assert_eq!(
            named_master(&reply("master,disconnected")),
            names("10.0.0.2:6380")
        );
        assert_eq!(named_master(&reply("master,s_down")), Answer::NoMaster);
        assert_eq!(
            named_master(&reply("master,s_down,o_down")),
            Answer::NoMaster
        );
        let map = Value::Map(vec![
            (bulk("ip"), bulk("h")),
            (bulk("port"), Value::Int(1)),
            (bulk("flags"), bulk("master")),
        ]);
        assert_eq!(named_master(&map), names("h:1"));
        assert_eq!(named_master(&Value::Array(vec![])), Answer::NoMaster);
        assert_eq!(named_master(&Value::Nil), Answer::NoMaster);
        let bad_port = Value::Array(
            ["ip", "h", "port", "x", "flags", "master"]
                .into_iter()
                .map(bulk)
                .collect(),
        );
        assert_eq!(named_master(&bad_port), Answer::NoMaster);
    }

    /// The master's client is built from the address the sentinels name,
    /// an IPv6 one too, with the given settings, over TLS, checked.
    #[cfg(feature = "tls-rustls")]
    #[test]
    fn a_master_behind_a_private_ca_gets_a_checked_tls_client() {
        let tls = MasterTls {
            info: redis::RedisConnectionInfo::default()
                .set_password("secret")
                .set_db(2),
            certs: redis::TlsCertificates {
                client_tls: None,
                root_cert: None,
            },
        };
        for (addr, host, port) in [
            ("10.0.0.2:6380", "10.0.0.2", 6380),
            ("::1:6381", "::1", 6381),
        ] {
            let client = tls.client(addr).expect("a client");
            let info = client.get_connection_info();
            match info.addr() {
                redis::ConnectionAddr::TcpTls {
                    host: h,
                    port: p,
                    insecure,
                    tls_params,
                } => {
                    assert_eq!((h.as_str(), *p), (host, port));
                    assert!(!insecure, "unchecked");
                    assert!(tls_params.is_some(), "the certificates were dropped");
                }
                other => panic!("not TLS: {other:?}"),
            }
            assert_eq!(info.redis_settings().password(), Some("secret"));
            assert_eq!(info.redis_settings().db(), 2);
        }
        for bad in ["10.0.0.2", "10.0.0.2:x", ""] {
            assert!(tls.client(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn only_a_role_master_is_a_master() {
        let bulk = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        assert!(says_master(&Value::Array(vec![
            bulk("master"),
            Value::Int(0)
        ])));
        assert!(!says_master(&Value::Array(vec![
            bulk("slave"),
            bulk("127.0.0.1")
        ])));
        assert!(!says_master(&Value::Array(vec![])));
        assert!(!says_master(&Value::Nil));
    }

    /// A script's error as Redis < 7 sends it, parsed as from the wire.
    fn script_error(inner: &str) -> RedisError {
        let reply = format!(
            "-ERR Error running script (call to f_0123456789abcdef): \
             @user_script:1: @user_script: 1: {inner}\r\n"
        );
        match redis::parse_redis_value(reply.as_bytes()).and_then(Value::extract_error) {
            Err(err) => err,
            Ok(value) => panic!("not an error: {value:?}"),
        }
    }

    #[test]
    fn a_failover_reply_wrapped_in_a_script_error_is_transient() {
        let transient = super::super::is_transient;
        let readonly = script_error("-READONLY You can't write against a read only replica.");
        assert_eq!(
            readonly.kind(),
            ErrorKind::Server(ServerErrorKind::ResponseError),
            "{readonly}"
        );
        assert!(transient(&readonly), "{readonly}");
        assert_eq!(lookup_after(Some(&readonly)), Some(false), "{readonly}");
        // Without its leading `-`, as some versions write it.
        let bare = script_error("READONLY You can't write against a read only replica.");
        assert!(transient(&bare), "{bare}");
        assert_eq!(lookup_after(Some(&bare)), Some(false));
        for inner in [
            "-MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'.",
            "-NOREPLICAS Not enough good replicas to write.",
        ] {
            let err = script_error(inner);
            assert!(transient(&err), "{err}");
            assert_eq!(lookup_after(Some(&err)), Some(false), "{err}");
        }
        let noreplicas =
            redis::parse_redis_value(b"-NOREPLICAS Not enough good replicas to write.\r\n")
                .and_then(Value::extract_error)
                .err();
        assert!(noreplicas.as_ref().is_some_and(transient), "{noreplicas:?}");
        // A script's own error is not, even one that names a key READONLY.
        let own = script_error("-ERR wrong number of arguments for 'set' command");
        assert!(!transient(&own), "{own}");
        assert_eq!(lookup_after(Some(&own)), None);
        let key = script_error("user_script:3: bad key READONLY:1");
        assert!(!transient(&key), "{key}");
    }

    #[test]
    fn a_readonly_wrapped_in_a_script_error_starts_a_lookup() {
        let err = RedisError::from((
            ErrorKind::Server(ServerErrorKind::ResponseError),
            "Error running script",
            "-READONLY You can't write against a read only replica.".to_owned(),
        ));
        assert_eq!(lookup_after(Some(&err)), Some(false));
        let plain = RedisError::from((
            ErrorKind::Server(ServerErrorKind::ResponseError),
            "Error running script",
            "-ERR wrong number of arguments".to_owned(),
        ));
        assert_eq!(lookup_after(Some(&plain)), None);
        assert_eq!(lookup_after(None), Some(false), "a timeout");
        let dropped: RedisError =
            std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset").into();
        assert_eq!(lookup_after(Some(&dropped)), Some(true));
    }
}
