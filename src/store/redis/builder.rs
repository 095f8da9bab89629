//! The one way to configure and connect a [`RedisStore`]: [`RedisStoreBuilder`].

use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};

use super::topology::{Kind, Topology};
use super::*;

/// Configures a [`RedisStore`] on its [`Topology`] and connects it, with
/// [`connect`](Self::connect): made by [`RedisStore::builder`].
///
/// Every setting has a default, stated in its doc; a bad one (a zero
/// timeout, an invalid prefix) and a bad topology (an address that does not
/// parse, a cluster without nodes) are reported by `connect` as
/// [`StoreError::Config`] before any I/O.
///
/// ```no_run
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use fleetgate::RedisStore;
/// use std::time::Duration;
///
/// let store = RedisStore::builder("redis://127.0.0.1:6379")
///     .prefix("myapp")
///     .timeout(Duration::from_millis(20))
///     .lazy()
///     .connect()
///     .await?;
/// # Ok(()) }
/// ```
///
/// Available with the `redis` feature (on by default).
#[derive(Clone, Debug)]
#[must_use]
pub struct RedisStoreBuilder {
    topology: Topology,
    lazy: bool,
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
    pub(super) fn new(topology: Topology) -> Self {
        RedisStoreBuilder {
            topology,
            lazy: false,
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

    /// How many scripts (checks' and leases') may be in flight on the
    /// connection at once
    /// before calls queue (default 8). A call that finds them all in flight
    /// queues, and goes with every other call queued in the same turn of
    /// the runtime (once every task ready to run has made its calls) in
    /// one script sent at the end of that turn, without waiting for a
    /// script to come back: one `EVALSHA` per algorithm that decides them
    /// in order, exactly as if they had reached Redis back to back at one
    /// instant. Concurrency leases' acquires and releases queue the same
    /// way, and go together in one script of their own.
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
    /// Charges, refunds, peeks, lease renewals and upstream feedback send
    /// one script per call always.
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

    /// Connects on first use rather than in [`connect`](Self::connect),
    /// which then returns at once, without I/O, so that a service can start
    /// while Redis is down. Until Redis answers, decisions fail and the
    /// layers follow their [`FailurePolicy`](crate::FailurePolicy); the
    /// connection is made, and remade after failures, in the background.
    ///
    /// Every [`Topology`] can be lazy: one server (the connection manager
    /// connects at the first call, and again after failures), a Cluster
    /// (the cluster client connects to the nodes and reads the slot map in
    /// the background; calls made meanwhile wait for it, within the
    /// store's timeout, and once the nodes are known to be unreachable it
    /// tries them again at the next calls), and Sentinel (the master is
    /// looked up in the background; calls fail until it is found).
    pub fn lazy(mut self) -> Self {
        self.lazy = true;
        self
    }

    /// Checks the settings and the topology, then connects: at once, or, if
    /// [`lazy`](Self::lazy), on first use. Must run within a tokio runtime
    /// (otherwise [`ConfigError::NoRuntime`]): the store's connection
    /// lives in tasks of its own.
    ///
    /// A bad setting or topology is a [`StoreError::Config`], reported
    /// before any I/O; an eager connection that fails is a
    /// [`StoreError::Redis`], within the
    /// [connect timeout](Self::connect_timeout) (for Sentinel, the lookup's
    /// time, which that timeout bounds too).
    pub async fn connect(self) -> Result<RedisStore, StoreError> {
        // Report a bad setting as such, before any I/O can fail first.
        self.check()?;
        self.topology.check()?;
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(ConfigError::NoRuntime {
                what: "RedisStoreBuilder::connect",
            }
            .into());
        }
        let conn = match self.topology.kind.clone() {
            Kind::Node(client) => {
                let config = self.manager_config();
                let conn = if self.lazy {
                    ConnectionManager::new_lazy_with_config(client, config)?
                } else {
                    ConnectionManager::new_with_config(client, config).await?
                };
                Conn::Single(conn)
            }
            #[cfg(feature = "cluster")]
            Kind::Cluster(nodes) => self.cluster(nodes).await?,
            #[cfg(feature = "sentinel")]
            Kind::Sentinel { sentinels, master } => self.sentinel(sentinels, master).await?,
            Kind::Invalid(err) => return Err(err.into()),
        };
        self.build(conn)
    }

    fn manager_config(&self) -> ConnectionManagerConfig {
        // No per-request timer in the client: `eval` bounds the whole
        // exchange (NOSCRIPT retry and reconnect waits included) with one
        // timer, and a second one per request cost about 15% of the
        // requests per second of a Redis-backed layer (benches/http.rs).
        // One attempt per reconnection, with no backoff inside it: calls
        // wait for a reconnection in flight, so a refused attempt must end
        // at once; how often a refusing server is tried again is the
        // store's business (`Refusals`). So the store makes its connection
        // manager itself, and takes none the caller configured.
        ConnectionManagerConfig::new()
            .set_response_timeout(None)
            .set_connection_timeout(Some(self.connect_timeout))
            .set_number_of_retries(0)
    }

    fn build(self, conn: Conn) -> Result<RedisStore, StoreError> {
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
        let hub = wake::Hub::new(
            self.subscriber_source(&conn),
            &self.prefix,
            self.timeout,
            self.connect_timeout,
        );
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
                hub,
            }),
        })
    }

    /// Where the store's subscriber to its releases connects
    /// ([`wake`]): the node; one of a cluster's nodes given; the master
    /// the store follows through Sentinel.
    fn subscriber_source(&self, conn: &Conn) -> wake::Source {
        #[cfg(feature = "sentinel")]
        if let Conn::Sentinel(sentinel) = conn {
            return wake::Source::Sentinel(sentinel.clone());
        }
        let _ = conn;
        match &self.topology.kind {
            Kind::Node(client) => wake::Source::Nodes(vec![client.get_connection_info().clone()]),
            #[cfg(feature = "cluster")]
            Kind::Cluster(nodes) => wake::Source::Nodes(nodes.clone()),
            _ => wake::Source::Nodes(Vec::new()),
        }
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
    /// period. The answers are those Redis would give, except after the
    /// key's state in Redis is wiped or given back (restart without
    /// persistence, `DEL`, a reset or refund through another instance):
    /// then the cache keeps denying for at most the retry time it already
    /// announced. A reset or refund through this instance
    /// ([`Limiter::reset`](crate::Limiter::reset),
    /// [`Limiter::refund`](crate::Limiter::refund)) forgets its cached
    /// denials of that key and policy. An entry takes about 150 bytes plus
    /// the identity; when full, expired entries go first, then those
    /// closest to expiry.
    pub fn deny_cache(mut self, capacity: usize) -> Self {
        self.deny_cache = capacity;
        self
    }
}

#[cfg(feature = "cluster")]
impl RedisStoreBuilder {
    /// The connection to the cluster of `nodes`
    /// ([`Topology::cluster`]).
    async fn cluster(&self, nodes: Vec<redis::ConnectionInfo>) -> Result<Conn, StoreError> {
        let client = redis::cluster::ClusterClient::builder(nodes)
            .connection_timeout(self.connect_timeout)
            .response_timeout(self.timeout)
            .build()
            // No I/O yet: what the client refuses is in the addresses
            // (nodes that disagree on TLS or credentials, say).
            .map_err(|err| ConfigError::InvalidRedisAddress {
                reason: format!("{err}"),
            })?;
        let config = redis::cluster::ClusterConfig::new()
            .set_connection_timeout(self.connect_timeout)
            .set_response_timeout(self.timeout);
        // Eager, as the store always connected to a cluster: the client's
        // own settings, which its failovers are tested with.
        let conn = if self.lazy {
            client.get_pending_async_connection_with_config(config)
        } else {
            client.get_async_connection().await?
        };
        Ok(Conn::Cluster(conn))
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
    /// The connection to the master the `sentinels` name `master`
    /// ([`Topology::sentinel`]): with its first master, or, if lazy,
    /// looking it up in the background.
    async fn sentinel(
        &self,
        sentinels: Vec<redis::ConnectionInfo>,
        master: String,
    ) -> Result<Conn, StoreError> {
        if self.sentinel_poll.is_zero() {
            return Err(ConfigError::ZeroTimeout.into());
        }
        let settings = super::sentinel::Settings {
            name: master,
            sentinels,
            node: self.sentinel_node.clone().unwrap_or_default(),
            connect_timeout: self.connect_timeout,
            poll: self.sentinel_poll.min(MAX_SENTINEL_POLL),
            #[cfg(feature = "tls-rustls")]
            master_tls: self.sentinel_master_tls.clone(),
        };
        let conn = super::sentinel::SentinelConn::new(&settings)?;
        if self.lazy {
            conn.trigger(true);
        } else {
            conn.lookup(true).await?;
        }
        super::sentinel::SentinelConn::watch(&conn, settings.sentinels, settings.poll);
        Ok(Conn::Sentinel(conn))
    }

    /// How to connect to the master found through the sentinels
    /// ([`Topology::sentinel`]; other topologies do not use it): its
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
    /// their addresses (see [`Topology::sentinel`]). Other topologies do
    /// not use it. Needs the `sentinel` and `tls-rustls` features.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// use fleetgate::{RedisStore, Topology};
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
    /// let store = RedisStore::builder(Topology::sentinel(sentinels, "mymaster"))
    ///     .sentinel_master_tls(
    ///         RedisConnectionInfo::default().set_password("master-secret"),
    ///         certs,
    ///     )
    ///     .connect()
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
    /// taken as a day. Only [`Topology::sentinel`] polls.
    pub fn sentinel_poll(mut self, every: Duration) -> Self {
        self.sentinel_poll = every;
        self
    }
}
