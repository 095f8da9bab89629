//! Where a [`RedisStore`](super::RedisStore)'s Redis is: [`Topology`].

use std::fmt;

use redis::{ConnectionInfo, IntoConnectionInfo};

use crate::error::ConfigError;

/// Where a [`RedisStore`](super::RedisStore) finds Redis, the one thing
/// [`RedisStore::builder`](super::RedisStore::builder) must be told: one
/// server (a URL, or a [`redis::Client`] built by the caller), a Redis
/// Cluster's nodes (feature `cluster`), or the sentinels that name a
/// master (feature `sentinel`).
///
/// A URL (`&str`, `String`), a [`redis::ConnectionInfo`] or a
/// [`redis::Client`] converts into a topology of one server, so
/// `RedisStore::builder("redis://127.0.0.1:6379")` needs no `Topology` in
/// sight. Addresses are read when the topology is made; a mistake (an
/// address that does not parse, a cluster without nodes, a Sentinel without
/// sentinels or master name) is reported by
/// [`RedisStoreBuilder::connect`](super::RedisStoreBuilder::connect) as a
/// [`ConfigError`], before any I/O.
///
/// Every topology connects at once, or on first use with
/// [`RedisStoreBuilder::lazy`](super::RedisStoreBuilder::lazy).
///
/// `Debug` shows the addresses, never a password.
///
/// ```no_run
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use fleetgate::{RedisStore, Topology};
///
/// // A URL is a topology of one server.
/// let store = RedisStore::builder("redis://127.0.0.1:6379").connect().await?;
/// // So is a client built by hand (a private CA, a custom TCP setting).
/// let client = redis::Client::open("redis://127.0.0.1:6379")?;
/// let store = RedisStore::builder(Topology::client(client)).connect().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
#[must_use]
pub struct Topology {
    pub(super) kind: Kind,
}

#[derive(Clone)]
pub(super) enum Kind {
    Node(redis::Client),
    #[cfg(feature = "cluster")]
    Cluster(Vec<ConnectionInfo>),
    #[cfg(feature = "sentinel")]
    Sentinel {
        sentinels: Vec<ConnectionInfo>,
        master: String,
    },
    /// What was wrong with the addresses given, reported at connect.
    Invalid(ConfigError),
}

impl Topology {
    /// One Redis server at `addr`: a URL (`redis://[user:password@]host:port/db`,
    /// `rediss://` for TLS with the `tls-rustls` feature,
    /// `redis+unix:///path`), a [`redis::ConnectionInfo`], or a
    /// `(host, port)` pair. What a URL converts into.
    ///
    /// The connection is multiplexed and reconnects by itself after
    /// failures. A `rediss://` server's certificate is checked against the
    /// system's root certificates; for a server behind a private CA, build
    /// the client with the CA (`redis::Client::build_with_tls`) and give it
    /// to [`Topology::client`]. `rediss://host:port/#insecure` skips the
    /// check, with the `tls-rustls-insecure` feature. See
    /// docs/topologies.md (TLS) for the crypto provider rustls needs.
    pub fn node(addr: impl IntoConnectionInfo) -> Topology {
        match redis::Client::open(addr) {
            Ok(client) => Topology::client(client),
            Err(err) => Topology::invalid(format!("{err}")),
        }
    }

    /// One Redis server, through a client the caller built (with a
    /// private CA's certificates, TCP settings, a credentials provider):
    /// as [`Topology::node`] otherwise. The store makes its own connection
    /// manager from it, with the builder's
    /// [connect timeout](super::RedisStoreBuilder::connect_timeout).
    pub fn client(client: redis::Client) -> Topology {
        Topology {
            kind: Kind::Node(client),
        }
    }

    /// A Redis Cluster, reached through any of its `nodes`
    /// (`redis://host:port` each, `rediss://` for TLS with the
    /// `tls-rustls` feature); needs the `cluster` feature. An empty list is
    /// refused ([`ConfigError::NoRedisAddresses`]).
    ///
    /// The keys of one identity share a hash tag, so each script runs on
    /// the one master that owns that slot; the cluster client follows
    /// `MOVED` and `ASK` redirections and refreshes its slot map by itself.
    /// A script missing on a node (`NOSCRIPT` after a restart or failover)
    /// is sent with its source (`EVAL`) to that node, which caches it
    /// again: a node that cannot answer fails only its own keys' calls.
    /// The store's timeout bounds each decision, redirections included.
    /// Calls are never batched on a cluster
    /// ([`max_in_flight`](super::RedisStoreBuilder::max_in_flight)).
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// use fleetgate::{RedisStore, Topology};
    ///
    /// let nodes = ["redis://10.0.0.1:6379", "redis://10.0.0.2:6379"];
    /// let store = RedisStore::builder(Topology::cluster(nodes))
    ///     .prefix("myapp")
    ///     .connect()
    ///     .await?;
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "cluster")]
    pub fn cluster<I, T>(nodes: I) -> Topology
    where
        I: IntoIterator<Item = T>,
        T: IntoConnectionInfo,
    {
        match addresses(nodes, "a Redis Cluster", "node") {
            Ok(nodes) => Topology {
                kind: Kind::Cluster(nodes),
            },
            Err(err) => Topology {
                kind: Kind::Invalid(err),
            },
        }
    }

    /// The master that Redis Sentinel names `master_name`, found by asking
    /// the `sentinels` (`redis://[user:password@]host:port` each,
    /// `rediss://` for TLS) and followed through failovers; needs the
    /// `sentinel` feature. No sentinels, or an empty name, is refused
    /// ([`ConfigError::NoRedisAddresses`], [`ConfigError::EmptyMasterName`]).
    ///
    /// The store sends every call to the master it is connected to, and never
    /// reconnects to an address by itself: a new connection is made only to a
    /// server the sentinels name as master and that itself says `ROLE` master,
    /// so no call is sent to a replica on purpose. A lookup runs in the
    /// background (one at a time, at most one per 100 ms) when a call fails in
    /// a way that says the master may have moved: its connection dropped or
    /// refused, a timeout, `READONLY` (the server was demoted to a replica),
    /// `MASTERDOWN` or `NOREPLICAS`. A lookup asks all the sentinels at once,
    /// within the [connect timeout](super::RedisStoreBuilder::connect_timeout),
    /// so a sentinel that never answers holds nothing up; it takes a master
    /// only once more than half of all the sentinels given name it (and do not
    /// flag it down), so that a sentinel cut off with the old master cannot
    /// move the store back there; with most sentinels unreachable no lookup
    /// succeeds, and the store keeps the connection it has. Sentinels that
    /// answered without a master, or named another, are asked again every 50 ms
    /// until the connect timeout; only sentinels that fail end the lookup
    /// sooner. It connects to the master and checks `ROLE`. After a dropped or
    /// refused connection the connection is always replaced. After a timeout,
    /// `READONLY`, `MASTERDOWN` or `NOREPLICAS`, if the sentinels still name
    /// the same address, the connection in use is sent a `PING` with half the
    /// connect timeout to answer: it is kept if it answers (so a demoted server
    /// the sentinels still name stays in use, refusing writes, until they name
    /// another), and replaced if it does not (a half-open connection, whose
    /// peer is gone without a reset). Repeated lookup failures are logged at
    /// `warn`, at most once a second. The sentinels are also asked every
    /// [`sentinel_poll`](super::RedisStoreBuilder::sentinel_poll) which address
    /// the master has, and a different answer starts a lookup: a demoted
    /// master, or one cut off from the sentinels, may go on answering (and
    /// taking writes that are lost) until Sentinel reconfigures it. Calls never
    /// wait for a lookup: until the new master is connected they fail (at once
    /// once the old connection has dropped, or at the timeout) and the layers
    /// follow their [`FailurePolicy`](crate::FailurePolicy). Calls are batched
    /// and scripts loaded as on a single server; a promoted replica has no
    /// scripts cached, so one `SCRIPT LOAD` follows each failover.
    ///
    /// Before Redis 7, a write in a script run on a demoted master comes back
    /// as `ERR ... -READONLY ...`: it starts a lookup and counts as a transient
    /// error too.
    ///
    /// What a failover costs, besides the time without a master (from the old
    /// master's end to about one second after the replica's promotion, the time
    /// Sentinel takes to name it): replication is asynchronous, so writes the
    /// old master acknowledged but had not yet sent to the replica are lost.
    /// GCRA and window state then goes back by those writes (up to about one
    /// burst admitted again), and leases taken in those last moments are gone
    /// from the new master: their releases answer "not held", and concurrency
    /// may go over its limit until their holders finish. Leases that did reach
    /// the replica are released on the new master (failed releases are
    /// retried), or expire after their TTL. With
    /// [`TimeSource::Server`](super::TimeSource::Server) decisions follow the
    /// new master's clock.
    ///
    /// Passwords: those of the sentinels go in their URLs; those of the master
    /// (and its TLS mode and database) in
    /// [`sentinel_master`](super::RedisStoreBuilder::sentinel_master).
    ///
    /// TLS needs the `tls-rustls` feature. The sentinels: `rediss://` URLs,
    /// checked against the system's root certificates, or, behind a private CA,
    /// the connection infos of clients built with it
    /// (`redis::Client::build_with_tls(url,
    /// certs)?.get_connection_info().clone()`). The master:
    /// [`sentinel_master_tls`](super::RedisStoreBuilder::sentinel_master_tls)
    /// with its CA (a private one), or `TlsMode::Secure` in
    /// [`sentinel_master`](super::RedisStoreBuilder::sentinel_master), checked
    /// against the system's root certificates, or `TlsMode::Insecure`,
    /// unchecked, with the `tls-rustls-insecure` feature.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// use fleetgate::{RedisStore, Topology};
    /// use redis::sentinel::SentinelNodeConnectionInfo;
    /// use redis::RedisConnectionInfo;
    ///
    /// let sentinels = [
    ///     "redis://:sentinel-secret@10.0.0.1:26379",
    ///     "redis://:sentinel-secret@10.0.0.2:26379",
    ///     "redis://:sentinel-secret@10.0.0.3:26379",
    /// ];
    /// let store = RedisStore::builder(Topology::sentinel(sentinels, "mymaster"))
    ///     .prefix("myapp")
    ///     .sentinel_master(SentinelNodeConnectionInfo::default().set_redis_connection_info(
    ///         RedisConnectionInfo::default().set_password("master-secret"),
    ///     ))
    ///     .connect()
    ///     .await?;
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "sentinel")]
    pub fn sentinel<I, T>(sentinels: I, master_name: impl Into<String>) -> Topology
    where
        I: IntoIterator<Item = T>,
        T: IntoConnectionInfo,
    {
        let master = master_name.into();
        let kind = match addresses(sentinels, "Redis Sentinel", "sentinel") {
            Err(err) => Kind::Invalid(err),
            Ok(_) if master.is_empty() => Kind::Invalid(ConfigError::EmptyMasterName),
            Ok(sentinels) => Kind::Sentinel { sentinels, master },
        };
        Topology { kind }
    }

    fn invalid(reason: String) -> Topology {
        Topology {
            kind: Kind::Invalid(ConfigError::InvalidRedisAddress { reason }),
        }
    }

    /// The mistake in the addresses given, if any.
    pub(super) fn check(&self) -> Result<(), ConfigError> {
        match &self.kind {
            Kind::Invalid(err) => Err(err.clone()),
            _ => Ok(()),
        }
    }
}

/// Every address of a cluster or Sentinel topology, or what is wrong with
/// them: the first that does not parse (`what` and its place in the list),
/// or none at all (`topology` needs one).
#[cfg(any(feature = "cluster", feature = "sentinel"))]
fn addresses<I, T>(
    addrs: I,
    topology: &'static str,
    what: &str,
) -> Result<Vec<ConnectionInfo>, ConfigError>
where
    I: IntoIterator<Item = T>,
    T: IntoConnectionInfo,
{
    let addrs = addrs
        .into_iter()
        .enumerate()
        .map(|(i, addr)| {
            addr.into_connection_info()
                .map_err(|err| ConfigError::InvalidRedisAddress {
                    reason: format!("{what} {}: {err}", i + 1),
                })
        })
        .collect::<Result<Vec<_>, _>>()?;
    if addrs.is_empty() {
        return Err(ConfigError::NoRedisAddresses { topology });
    }
    Ok(addrs)
}

impl From<&str> for Topology {
    fn from(url: &str) -> Self {
        Topology::node(url)
    }
}

impl From<String> for Topology {
    fn from(url: String) -> Self {
        Topology::node(url)
    }
}

impl From<&String> for Topology {
    fn from(url: &String) -> Self {
        Topology::node(url.as_str())
    }
}

impl From<ConnectionInfo> for Topology {
    fn from(info: ConnectionInfo) -> Self {
        Topology::node(info)
    }
}

impl From<redis::Client> for Topology {
    fn from(client: redis::Client) -> Self {
        Topology::client(client)
    }
}

/// An address as `Debug` shows it: where, and whether TLS, never who.
struct Addr<'a>(&'a ConnectionInfo);

impl fmt::Debug for Addr<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0.addr() {
            redis::ConnectionAddr::TcpTls { .. } => write!(f, "rediss://{}", self.0.addr()),
            redis::ConnectionAddr::Unix(_) => write!(f, "redis+unix://{}", self.0.addr()),
            _ => write!(f, "redis://{}", self.0.addr()),
        }
    }
}

impl fmt::Debug for Topology {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            Kind::Node(client) => f
                .debug_tuple("Node")
                .field(&Addr(client.get_connection_info()))
                .finish(),
            #[cfg(feature = "cluster")]
            Kind::Cluster(nodes) => f
                .debug_tuple("Cluster")
                .field(&nodes.iter().map(Addr).collect::<Vec<_>>())
                .finish(),
            #[cfg(feature = "sentinel")]
            Kind::Sentinel { sentinels, master } => f
                .debug_struct("Sentinel")
                .field("master", master)
                .field("sentinels", &sentinels.iter().map(Addr).collect::<Vec<_>>())
                .finish(),
            Kind::Invalid(err) => f.debug_tuple("Invalid").field(err).finish(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_shows_where_and_never_a_password() {
        let node = Topology::from("redis://:hunter2@10.0.0.1:6380/2");
        let shown = format!("{node:?}");
        assert_eq!(shown, "Node(redis://10.0.0.1:6380)");
        #[cfg(feature = "sentinel")]
        {
            let sentinel = Topology::sentinel(["redis://:hunter2@10.0.0.2:26379"], "main");
            let shown = format!("{sentinel:?}");
            assert!(!shown.contains("hunter2"), "{shown}");
            assert!(shown.contains("10.0.0.2:26379"), "{shown}");
        }
    }

    #[test]
    fn a_url_that_does_not_parse_is_kept_as_the_mistake() {
        let err = Topology::from("not a url").check().unwrap_err();
        assert!(
            matches!(err, ConfigError::InvalidRedisAddress { .. }),
            "{err:?}"
        );
    }
}
