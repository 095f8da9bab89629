//! The one way to configure and connect a [`RedisStore`]: [`RedisStoreBuilder`].

use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};

use super::*;
/// Configures a [`RedisStore`]; see [`RedisStore::builder`].
///
/// Available with the `redis` feature (on by default).
#[derive(Clone, Debug)]
#[must_use]
pub struct RedisStoreBuilder {
    prefix: String,
    timeout: Duration,
    connect_timeout: Duration,
    time: TimeSource,
    deny_cache: usize,
    max_in_flight: usize,
    max_batch: usize,
    #[cfg(feature = "sentinel")]
    sentinel_node: Option<redis::sentinel::SentinelNodeConnectionInfo>,
    /// Set by [`RedisStoreBuilder::sentinel_master_tls`], cleared by
    /// [`RedisStoreBuilder::sentinel_master`]: the last one called wins.
    #[cfg(all(feature = "sentinel", feature = "tls-rustls"))]
    sentinel_master_tls: Option<super::sentinel::MasterTls>,
    #[cfg(feature = "sentinel")]
    sentinel_poll: Duration,
}

impl RedisStoreBuilder {
    /// The defaults, as each setting's doc states them.
    pub(super) fn new() -> Self {
        RedisStoreBuilder {
            prefix: "fleetgate".into(),
            timeout: Duration::from_millis(50),
            connect_timeout: Duration::from_secs(1),
            time: TimeSource::Server,
            deny_cache: DEFAULT_DENY_CACHE,
            max_in_flight: DEFAULT_MAX_IN_FLIGHT,
            max_batch: DEFAULT_MAX_BATCH,
            #[cfg(feature = "sentinel")]
            sentinel_node: None,
            #[cfg(all(feature = "sentinel", feature = "tls-rustls"))]
            sentinel_master_tls: None,
            #[cfg(feature = "sentinel")]
            sentinel_poll: DEFAULT_SENTINEL_POLL,
        }
    }

    /// The first part of every key (default `fleetgate`), so that several
    /// applications can share a server.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// The longest any one decision may take, round trip and any time
    /// queued behind busy script slots included (default 50 ms).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The longest one connection attempt may take (default 1 s).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Where scripts read the time (default: the Redis server's clock).
    pub fn time_source(mut self, time: TimeSource) -> Self {
        self.time = time;
        self
    }

    /// How many checks' scripts may be in flight on the connection at once
    /// before calls queue (default 8). A call that finds them all in flight
    /// queues, and goes with every other call queued in the same turn of
    /// the runtime (once every task ready to run has made its calls) in
    /// one script sent at the end of that turn, without waiting for a
    /// script to come back: one `EVALSHA` per algorithm that decides them
    /// in order, exactly as if they had reached Redis back to back at one
    /// instant.
    ///
    /// Below this many calls in flight nothing waits. Under load, Redis
    /// runs one script for many calls instead of one per call (one `TIME`;
    /// for GCRA one `GET` and one `SET` per identity), which is
    /// how a Redis-backed layer serves more requests than one `EVALSHA`
    /// per request can (see BENCHMARKS.md). A queued call's wait counts
    /// toward its [timeout](Self::timeout). A call takes its slot or its
    /// place in the queue when its future is first polled, and calls of one
    /// algorithm reach Redis in that order. `usize::MAX` never queues: one
    /// script per call, however many are in flight. On a Redis Cluster, where calls for
    /// different slots cannot share a script, calls are never queued; behind
    /// a proxy that spreads keys over several servers (twemproxy, Envoy's
    /// Redis proxy), set `usize::MAX`. Zero is refused
    /// ([`ConfigError::ZeroBatch`]).
    ///
    /// Charges, refunds, peeks, leases and upstream feedback send one
    /// script per call always.
    pub fn max_in_flight(mut self, scripts: usize) -> Self {
        self.max_in_flight = scripts;
        self
    }

    /// The most calls one script decides (default 64); more calls queued
    /// in the same turn go in further scripts, sent one after the other.
    /// Zero is refused ([`ConfigError::ZeroBatch`]); 1 sends queued calls
    /// one script each. Redis runs a script's calls back to back, serving
    /// no other client meanwhile: with sliding-log policies whose calls
    /// cost thousands (each unit one logged entry), a smaller batch keeps
    /// that pause short.
    pub fn max_batch(mut self, calls: usize) -> Self {
        self.max_batch = calls;
        self
    }

    /// Checks the settings.
    fn check(&self) -> Result<(), StoreError> {
        check_name(&self.prefix)?;
        if self.timeout.is_zero() || self.connect_timeout.is_zero() {
            return Err(ConfigError::ZeroTimeout.into());
        }
        for (setting, value) in [
            ("max_in_flight", self.max_in_flight),
            ("max_batch", self.max_batch),
        ] {
            if value == 0 {
                return Err(ConfigError::ZeroBatch { setting }.into());
            }
        }
        Ok(())
    }

    /// Connects to `url` (`redis://host:port/db`, `rediss://` for TLS) and
    /// checks the settings.
    ///
    /// The connection is multiplexed and reconnects by itself after
    /// failures.
    ///
    /// TLS needs the `tls-rustls` feature: the server's certificate is
    /// checked against the system's root certificates. For a server behind
    /// a private CA, build the client with the CA
    /// (`redis::Client::build_with_tls`) and pass it to
    /// [`connect_client`](Self::connect_client); `rediss://host:port/#insecure`
    /// skips the check, with the `tls-rustls-insecure` feature. See
    /// docs/topologies.md (TLS) for the crypto provider rustls needs.
    pub async fn connect(self, url: &str) -> Result<RedisStore, StoreError> {
        self.check()?;
        let client = redis::Client::open(url)?;
        self.connect_client(client).await
    }

    /// Builds the store without waiting for Redis, so that a service can
    /// start while Redis is down: until Redis answers, decisions fail and
    /// the layers follow their [`FailurePolicy`](crate::FailurePolicy); the
    /// connection is made, and remade after failures, in the background.
    /// Must be called within a tokio runtime (otherwise
    /// [`ConfigError::NoRuntime`]).
    pub fn connect_lazy(self, url: &str) -> Result<RedisStore, StoreError> {
        self.check()?;
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(ConfigError::NoRuntime {
                what: "RedisStoreBuilder::connect_lazy",
            }
            .into());
        }
        let client = redis::Client::open(url)?;
        let conn = ConnectionManager::new_lazy_with_config(client, self.manager_config())?;
        self.with_connection(conn)
    }

    fn manager_config(&self) -> ConnectionManagerConfig {
        // No per-request timer in the client: `eval` bounds the whole
        // exchange (NOSCRIPT retry and reconnect waits included) with one
        // timer, and a second one per request cost about 15% of the
        // requests per second of a Redis-backed layer (benches/http.rs).
        // One attempt per reconnection, with no backoff inside it: calls
        // wait for a reconnection in flight, so a refused attempt must end
        // at once; how often a refusing server is tried again is the
        // store's business (`Refusals`).
        ConnectionManagerConfig::new()
            .set_response_timeout(None)
            .set_connection_timeout(Some(self.connect_timeout))
            .set_number_of_retries(0)
    }

    /// Like [`connect`](Self::connect), from a configured client.
    pub async fn connect_client(self, client: redis::Client) -> Result<RedisStore, StoreError> {
        // Report a bad setting as such, before any I/O can fail first.
        self.check()?;
        let conn = ConnectionManager::new_with_config(client, self.manager_config()).await?;
        self.with_connection(conn)
    }

    /// Uses an existing connection manager (its own timeouts apply too).
    pub fn with_connection(self, conn: ConnectionManager) -> Result<RedisStore, StoreError> {
        self.build(Conn::Single(conn))
    }

    fn build(self, conn: Conn) -> Result<RedisStore, StoreError> {
        self.check()?;
        let deny = (self.deny_cache > 0).then(|| {
            let clock: Arc<dyn Clock> = match &self.time {
                TimeSource::Client(clock) => clock.clone(),
                TimeSource::Server => Arc::new(RealClock::new()),
            };
            DenyCache::new(self.deny_cache, clock)
        });
        let refusals = matches!(conn, Conn::Single(_)).then(Refusals::new);
        let batcher = (conn.one_server() && self.max_in_flight < usize::MAX)
            .then(|| batch::Batcher::new(self.max_in_flight, self.max_batch));
        Ok(RedisStore {
            inner: Arc::new(Inner {
                conn,
                prefix: self.prefix.into_boxed_str(),
                timeout: self.timeout,
                time: self.time,
                scripts: scripts::Scripts::new(),
                batcher,
                deny,
                releases: release::Retries::default(),
                owed: Arc::default(),
                refusals,
            }),
        })
    }
}

// The builder's defaults, as its methods' docs state them.
pub(crate) const DEFAULT_MAX_IN_FLIGHT: usize = 8;
pub(crate) const DEFAULT_MAX_BATCH: usize = 64;
pub(crate) const DEFAULT_DENY_CACHE: usize = 10_000;

impl RedisStoreBuilder {
    /// How many denials to remember locally (default 10,000; `0` turns the
    /// cache off).
    ///
    /// After Redis denies a call, the same call (same policy, identity and
    /// cost) is denied by this instance without a round trip until its
    /// retry time has passed, with the same headers Redis' answer would
    /// give. A client hammering one key far past its limit then costs Redis
    /// about the admitted rate plus one denied call per instance and retry
    /// period. The answers are those Redis would give, except after a wipe
    /// of the key's state in Redis (restart without persistence, `DEL`, a
    /// reset through another instance): then the cache keeps denying for
    /// at most the retry time it already announced. A reset through this
    /// instance ([`Limiter::reset`](crate::Limiter::reset)) forgets its
    /// cached denials of that key and policy. An entry takes about 150 bytes plus the identity; when
    /// full, expired entries go first, then those closest to expiry.
    pub fn deny_cache(mut self, capacity: usize) -> Self {
        self.deny_cache = capacity;
        self
    }
}

#[cfg(feature = "cluster")]
impl RedisStoreBuilder {
    /// Connects to a Redis Cluster through any of its nodes
    /// (`redis://host:port` each, `rediss://` for TLS with the
    /// `tls-rustls` feature); needs the `cluster` feature.
    ///
    /// The keys of one identity share a hash tag, so each script runs on
    /// the one master that owns that slot; the cluster client follows
    /// `MOVED` and `ASK` redirections and refreshes its slot map by itself.
    /// A script missing on a node (`NOSCRIPT` after a restart or failover)
    /// is sent with its source (`EVAL`) to that node, which caches it
    /// again: a node that cannot answer fails only its own keys' calls.
    /// The store's timeout bounds each decision, redirections included.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// use fleetgate::RedisStore;
    ///
    /// let store = RedisStore::builder()
    ///     .prefix("myapp")
    ///     .connect_cluster(["redis://10.0.0.1:6379", "redis://10.0.0.2:6379"])
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub async fn connect_cluster<I, T>(self, nodes: I) -> Result<RedisStore, StoreError>
    where
        I: IntoIterator<Item = T>,
        T: redis::IntoConnectionInfo,
    {
        self.check()?;
        let client = redis::cluster::ClusterClient::builder(nodes)
            .connection_timeout(self.connect_timeout)
            .response_timeout(self.timeout)
            .build()?;
        let conn = client.get_async_connection().await?;
        self.build(Conn::Cluster(conn))
    }
}

/// How often a store on Sentinel asks the sentinels which address the
/// master has, by default.
#[cfg(feature = "sentinel")]
pub(crate) const DEFAULT_SENTINEL_POLL: Duration = Duration::from_millis(500);

/// The longest [`RedisStoreBuilder::sentinel_poll`] taken (longer ones
/// would overflow the clock of the periodic check).
#[cfg(feature = "sentinel")]
const MAX_SENTINEL_POLL: Duration = Duration::from_secs(24 * 3600);

#[cfg(feature = "sentinel")]
impl RedisStoreBuilder {
    /// Connects to the Redis master that Redis Sentinel names `master_name`,
    /// asking the `sentinels` (`redis://[user:password@]host:port` each,
    /// `rediss://` for TLS), and follows it through failovers; needs the
    /// `sentinel` feature.
    ///
    /// The store sends every call to the master it is connected to, and
    /// never reconnects to an address by itself: a new connection is made
    /// only to a server the sentinels name as master and that itself says
    /// `ROLE` master, so no call is sent to a replica on purpose. A lookup
    /// runs in the background (one at a time, at most one per 100 ms) when
    /// a call fails in a way that says the master may have moved: its
    /// connection dropped or refused, a timeout, `READONLY` (the server was
    /// demoted to a replica), `MASTERDOWN` or `NOREPLICAS`. A lookup asks
    /// all the sentinels at once, within the
    /// [connect timeout](Self::connect_timeout), so a sentinel that never
    /// answers holds nothing up; it takes a master only once more than
    /// half of all the sentinels given name it (and do not flag it down),
    /// so that a sentinel cut off with the old master cannot move the
    /// store back there; with most sentinels unreachable no lookup
    /// succeeds, and the store keeps the connection it has. Sentinels that
    /// answered without a master, or named another, are asked again every
    /// 50 ms until the connect timeout; only sentinels that fail end the
    /// lookup sooner. It connects to the master and checks `ROLE`. After a
    /// dropped or refused connection the connection is always replaced.
    /// After a timeout, `READONLY`, `MASTERDOWN` or `NOREPLICAS`, if the
    /// sentinels still name the same address, the connection in use is
    /// sent a `PING` with half the connect timeout to answer: it is kept if
    /// it answers (so a demoted server the sentinels still name stays in
    /// use, refusing writes, until they name another), and replaced if it
    /// does not (a half-open connection, whose peer is gone without a
    /// reset). Repeated lookup failures are logged at `warn`, at most once
    /// a second. The sentinels are also asked every
    /// [`sentinel_poll`](Self::sentinel_poll) which address the master has,
    /// and a different answer starts a lookup: a demoted master, or one cut
    /// off from the sentinels, may go on answering (and taking writes that
    /// are lost) until Sentinel reconfigures it. Calls never wait for a
    /// lookup: until the new master is connected they fail (at once once the
    /// old connection has dropped, or at the timeout) and the layers follow
    /// their [`FailurePolicy`](crate::FailurePolicy). Calls are batched and
    /// scripts loaded as on a single server; a promoted replica has no
    /// scripts cached, so one `SCRIPT LOAD` follows each failover.
    ///
    /// Before Redis 7, a write in a script run on a demoted master comes
    /// back as `ERR ... -READONLY ...`: it starts a lookup and counts as a
    /// transient error too.
    ///
    /// Must be called within a tokio runtime (otherwise
    /// [`ConfigError::NoRuntime`]).
    ///
    /// What a failover costs, besides the time without a master (from the
    /// old master's end to about one second after the replica's promotion,
    /// the time Sentinel takes to name it): replication is asynchronous, so
    /// writes the old master acknowledged but had not yet sent to the
    /// replica are lost. GCRA and window state then goes back by those
    /// writes (up to about one burst admitted again), and leases taken in
    /// those last moments are gone from the new master: their releases
    /// answer "not held", and concurrency may go over its limit until their
    /// holders finish. Leases that did reach the replica are released on the
    /// new master (failed releases are retried), or expire after their TTL.
    /// With [`TimeSource::Server`] decisions follow the new master's clock.
    ///
    /// Passwords: those of the sentinels go in their URLs; those of the
    /// master (and its TLS mode and database) in
    /// [`sentinel_master`](Self::sentinel_master).
    ///
    /// TLS needs the `tls-rustls` feature. The sentinels: `rediss://` URLs,
    /// checked against the system's root certificates, or, behind a
    /// private CA, the connection infos of clients built with it
    /// (`redis::Client::build_with_tls(url, certs)?.get_connection_info().clone()`).
    /// The master: [`sentinel_master_tls`](Self::sentinel_master_tls)
    /// with its CA (a private one), or `TlsMode::Secure` in
    /// [`sentinel_master`](Self::sentinel_master), checked against the
    /// system's root certificates, or `TlsMode::Insecure`, unchecked, with
    /// the `tls-rustls-insecure` feature.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// use fleetgate::RedisStore;
    /// use redis::sentinel::SentinelNodeConnectionInfo;
    /// use redis::RedisConnectionInfo;
    ///
    /// let store = RedisStore::builder()
    ///     .prefix("myapp")
    ///     .sentinel_master(SentinelNodeConnectionInfo::default().set_redis_connection_info(
    ///         RedisConnectionInfo::default().set_password("master-secret"),
    ///     ))
    ///     .connect_sentinel(
    ///         "mymaster",
    ///         [
    ///             "redis://:sentinel-secret@10.0.0.1:26379",
    ///             "redis://:sentinel-secret@10.0.0.2:26379",
    ///             "redis://:sentinel-secret@10.0.0.3:26379",
    ///         ],
    ///     )
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub async fn connect_sentinel<I, T>(
        self,
        master_name: &str,
        sentinels: I,
    ) -> Result<RedisStore, StoreError>
    where
        I: IntoIterator<Item = T>,
        T: redis::IntoConnectionInfo,
    {
        let (conn, settings) = self.sentinel_conn(
            "RedisStoreBuilder::connect_sentinel",
            master_name,
            sentinels,
        )?;
        conn.lookup(true).await?;
        super::sentinel::SentinelConn::watch(&conn, settings.sentinels, settings.poll);
        self.build(Conn::Sentinel(conn))
    }

    /// Like [`connect_sentinel`](Self::connect_sentinel), without waiting
    /// for the sentinels: decisions fail (and the layers follow their
    /// failure policy) until a master is found in the background. Must be
    /// called within a tokio runtime (otherwise [`ConfigError::NoRuntime`]).
    pub fn connect_sentinel_lazy<I, T>(
        self,
        master_name: &str,
        sentinels: I,
    ) -> Result<RedisStore, StoreError>
    where
        I: IntoIterator<Item = T>,
        T: redis::IntoConnectionInfo,
    {
        let (conn, settings) = self.sentinel_conn(
            "RedisStoreBuilder::connect_sentinel_lazy",
            master_name,
            sentinels,
        )?;
        conn.trigger(true);
        super::sentinel::SentinelConn::watch(&conn, settings.sentinels, settings.poll);
        self.build(Conn::Sentinel(conn))
    }

    /// How to connect to the master found through the sentinels: its
    /// username, password and database
    /// ([`RedisConnectionInfo`](redis::RedisConnectionInfo)) and TLS mode
    /// (feature `tls-rustls`: `TlsMode::Secure` checks the master's
    /// certificate against the system's root certificates;
    /// `TlsMode::Insecure`, with `tls-rustls-insecure`, checks nothing).
    /// By default: no password, database 0, plain TCP. For a master
    /// behind a private CA, see
    /// [`sentinel_master_tls`](Self::sentinel_master_tls); of the two, the
    /// one called last applies.
    pub fn sentinel_master(mut self, info: redis::sentinel::SentinelNodeConnectionInfo) -> Self {
        self.sentinel_node = Some(info);
        #[cfg(feature = "tls-rustls")]
        {
            self.sentinel_master_tls = None;
        }
        self
    }

    /// How to connect to the master found through the sentinels when it
    /// speaks TLS with a certificate the system's root certificates do not
    /// check (a private CA): its username, password, database and protocol
    /// (`info`), and the certificates to check it with (`certs.root_cert`,
    /// the CA in PEM; `certs.client_tls`, a client certificate and key for
    /// servers with `tls-auth-clients yes`). The master's certificate must
    /// name the address the sentinels give (an IP address, usually). Like
    /// `TlsMode::Secure` in [`sentinel_master`](Self::sentinel_master),
    /// which takes no certificates (nor does the redis crate's
    /// `SentinelClient` together with one); of the two, the one called
    /// last applies. Default TCP settings.
    ///
    /// The store then connects itself to the address a majority of the
    /// sentinels names (checking its `ROLE`, as always), not through the
    /// redis crate's `SentinelClient`. The sentinels' own TLS stays in
    /// their addresses (see [`connect_sentinel`](Self::connect_sentinel)).
    /// Needs the `sentinel` and `tls-rustls` features.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// use fleetgate::RedisStore;
    /// use redis::{RedisConnectionInfo, TlsCertificates};
    ///
    /// let ca_pem = std::fs::read("/etc/redis/ca.crt")?;
    /// let certs = TlsCertificates { client_tls: None, root_cert: Some(ca_pem) };
    /// let sentinels = ["10.0.0.1:26379", "10.0.0.2:26379", "10.0.0.3:26379"]
    ///     .into_iter()
    ///     .map(|addr| {
    ///         redis::Client::build_with_tls(format!("rediss://{addr}"), certs.clone())
    ///             .map(|client| client.get_connection_info().clone())
    ///     })
    ///     .collect::<Result<Vec<_>, _>>()?;
    /// let store = RedisStore::builder()
    ///     .sentinel_master_tls(
    ///         RedisConnectionInfo::default().set_password("master-secret"),
    ///         certs,
    ///     )
    ///     .connect_sentinel("mymaster", sentinels)
    ///     .await?;
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "tls-rustls")]
    pub fn sentinel_master_tls(
        mut self,
        info: redis::RedisConnectionInfo,
        certs: redis::TlsCertificates,
    ) -> Self {
        self.sentinel_master_tls = Some(super::sentinel::MasterTls { info, certs });
        self
    }

    /// How often the sentinels are asked which address the master has
    /// (default 500 ms): the longest a master that was replaced while it
    /// still answers (a failover by hand, a partition) keeps the store's
    /// calls. Failures of the calls themselves start a lookup at once.
    /// Zero is refused ([`ConfigError::ZeroTimeout`]); more than a day is
    /// taken as a day.
    pub fn sentinel_poll(mut self, every: Duration) -> Self {
        self.sentinel_poll = every;
        self
    }

    /// What both Sentinel connects share: a tokio runtime to run the
    /// lookups on (`what` is refused without one), the settings, and the
    /// connection before its first master.
    fn sentinel_conn<I, T>(
        &self,
        what: &'static str,
        master_name: &str,
        sentinels: I,
    ) -> Result<
        (
            Arc<super::sentinel::SentinelConn>,
            super::sentinel::Settings,
        ),
        StoreError,
    >
    where
        I: IntoIterator<Item = T>,
        T: redis::IntoConnectionInfo,
    {
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(ConfigError::NoRuntime { what }.into());
        }
        let settings = self.sentinel_settings(master_name, sentinels)?;
        let conn = super::sentinel::SentinelConn::new(&settings)?;
        Ok((conn, settings))
    }

    fn sentinel_settings<I, T>(
        &self,
        master_name: &str,
        sentinels: I,
    ) -> Result<super::sentinel::Settings, StoreError>
    where
        I: IntoIterator<Item = T>,
        T: redis::IntoConnectionInfo,
    {
        self.check()?;
        if self.sentinel_poll.is_zero() {
            return Err(ConfigError::ZeroTimeout.into());
        }
        let sentinels = sentinels
            .into_iter()
            .map(redis::IntoConnectionInfo::into_connection_info)
            .collect::<redis::RedisResult<Vec<_>>>()?;
        if sentinels.is_empty() {
            return Err(StoreError::Redis("no sentinel addresses given".into()));
        }
        Ok(super::sentinel::Settings {
            name: master_name.to_owned(),
            sentinels,
            node: self.sentinel_node.clone().unwrap_or_default(),
            connect_timeout: self.connect_timeout,
            poll: self.sentinel_poll.min(MAX_SENTINEL_POLL),
            #[cfg(feature = "tls-rustls")]
            master_tls: self.sentinel_master_tls.clone(),
        })
    }
}
