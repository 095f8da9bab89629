//! Releases made by other instances, announced to the callers of this one
//! that wait for a slot ([`StoreOps::watch_releases`](crate::store::StoreOps)).
//!
//! A refused acquire that waits marks its set (`<set>:w`, for as long as
//! it waits), and a release that frees a slot of a marked set publishes
//! the set's key on the store's channel, `<prefix>:released` (see
//! `lua/lease.lua`). Each store has one [`Hub`], shared by its clones and
//! started at the first watch: a task with one connection subscribed to
//! that channel, and the watches of each set, which it tells of every
//! release of their set that it hears.
//!
//! The subscriber speaks RESP3 (Redis 6 or later), the one protocol in
//! which the redis crate hands subscribed messages over without a
//! `Stream` (a RESP2 `PubSub` gives nothing else); the store's other
//! connections keep their own protocol. Where it subscribes: the server
//! of a single-node store; on a Redis Cluster, one of the nodes the store
//! was given, in turn (a `PUBLISH` reaches every node of a cluster); on
//! Sentinel, the master in use (whose releases it hears also once demoted:
//! a replica passes on what its master publishes), and the new one once
//! the store has moved.
//!
//! Releases published while the subscriber is not connected are lost: after
//! subscribing again, every watch is told once (a waiter woken for nothing
//! tries its acquire again, and is refused). Until the subscription is
//! back, watches cannot be made (their future fails), and the waiters
//! fall back on their own process's releases and the oldest lease's
//! expiry. The connection is checked with a `PING` every
//! [`PING_EVERY`], so that a connection whose peer vanished without a
//! reset is replaced too. Connecting is bounded by the store's connect
//! timeout, `SUBSCRIBE` by its timeout; failed attempts are retried with a
//! backoff ([`backoff`]). The task ends once the store (its last clone) is
//! dropped.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, ConnectionInfo, ProtocolVersion, PushInfo, PushKind, Value};
use tokio::sync::{Notify, mpsc, watch};
use tokio::time::Instant;

use crate::error::{ConfigError, StoreError};
use crate::log::LogGate;
use crate::store::{ReleaseWatch, StoreFuture};

/// Failed subscriptions are logged at `warn` at most once a second per
/// process.
static SUBSCRIBE_WARNINGS: LogGate = LogGate::new();

/// How often the subscribed connection is sent a `PING`.
const PING_EVERY: Duration = Duration::from_secs(5);

/// A connection that ends sooner than this after subscribing counts as a
/// failed attempt: the next one waits its backoff (a server that drops
/// subscribers at once is not knocked on in a loop).
const SHORT_LIVED: Duration = Duration::from_secs(1);

/// The wait before subscription attempt number `failures + 1` after
/// `failures` failed ones in a row: 50 ms, doubling up to 2 s, less up to
/// a quarter at random (so that the instances of a fleet do not all knock
/// at once when Redis comes back).
fn backoff(failures: u32) -> Duration {
    let full = Duration::from_millis(50)
        .saturating_mul(1 << failures.saturating_sub(1).min(6))
        .min(Duration::from_secs(2));
    full.mul_f64(1.0 - fastrand::f64() / 4.0)
}

/// Where the subscriber connects.
pub(super) enum Source {
    /// One of these servers, in turn after a failure: the single node, or
    /// the nodes a cluster store was given.
    Nodes(Vec<ConnectionInfo>),
    /// The master the store follows through Sentinel.
    #[cfg(feature = "sentinel")]
    Sentinel(Arc<super::sentinel::SentinelConn>),
}

/// The watches of one set: each one's id and what it is told through.
type SetWatches = Vec<(u64, Arc<Notify>)>;

/// The watches of each set, by the set's key.
#[derive(Default)]
pub(super) struct Watches {
    sets: Mutex<HashMap<String, SetWatches>>,
    next: AtomicU64,
}

/// Keeps one watch in its [`Watches`] until dropped; the set's entry goes
/// with its last watch.
struct Registration {
    watches: Arc<Watches>,
    set: String,
    id: u64,
}

impl Drop for Registration {
    fn drop(&mut self) {
        let mut sets = self.watches.lock();
        if let Some(watches) = sets.get_mut(&self.set) {
            watches.retain(|(id, _)| *id != self.id);
            if watches.is_empty() {
                sets.remove(&self.set);
            }
        }
    }
}

impl Watches {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, SetWatches>> {
        self.sets.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A new watch of `set`: what it is told through, and what keeps it
    /// registered.
    fn register(self: &Arc<Self>, set: String) -> (Arc<Notify>, Registration) {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let notify = Arc::new(Notify::new());
        self.lock()
            .entry(set.clone())
            .or_default()
            .push((id, notify.clone()));
        let registration = Registration {
            watches: self.clone(),
            set,
            id,
        };
        (notify, registration)
    }

    /// Tells every watch of `set` of a release; how many there were.
    fn released(&self, set: &str) -> usize {
        let sets = self.lock();
        let watches = sets.get(set).map_or(&[][..], Vec::as_slice);
        for (_, notify) in watches {
            notify.notify_one();
        }
        watches.len()
    }

    /// Tells every watch of every set once; how many there were.
    fn all(&self) -> usize {
        let sets = self.lock();
        let watches = sets.values().flatten();
        watches.map(|(_, notify)| notify.notify_one()).count()
    }

    /// How many sets are watched.
    #[cfg(test)]
    fn sets(&self) -> usize {
        self.lock().len()
    }
}

/// Where the subscription stands, as the watches' futures read it.
#[derive(Clone, Debug)]
enum Status {
    /// Connecting and subscribing.
    Connecting,
    /// Subscribed: a release announced now reaches the watches.
    Live,
    /// The last attempt failed; the next waits its backoff.
    Down(StoreError),
}

/// What the hub's task is told.
enum Event {
    /// A push of the connection made in attempt `.0`.
    Push(u64, PushInfo),
    /// The store is gone.
    Close,
}

/// What the hub's task and the store share.
struct Shared {
    source: Source,
    channel: String,
    timeout: Duration,
    connect_timeout: Duration,
    watches: Arc<Watches>,
    status: watch::Sender<Status>,
}

/// The store's subscriber to its releases' channel and the watches it
/// tells (see the [module](self)); one per store, shared by its clones.
pub(super) struct Hub {
    shared: Arc<Shared>,
    /// The task's mailbox, once it is started.
    events: Mutex<Option<mpsc::UnboundedSender<Event>>>,
}

impl Hub {
    /// A hub on `source`, announcing on `<prefix>:released`; no task yet.
    pub(super) fn new(
        source: Source,
        prefix: &str,
        timeout: Duration,
        connect_timeout: Duration,
    ) -> Self {
        Hub {
            shared: Arc::new(Shared {
                source,
                channel: format!("{prefix}:released"),
                timeout,
                connect_timeout,
                watches: Arc::default(),
                status: watch::Sender::new(Status::Connecting),
            }),
            events: Mutex::new(None),
        }
    }

    /// The channel releases are announced on.
    pub(super) fn channel(&self) -> &str {
        &self.shared.channel
    }

    /// A watch of the set `set`, once the subscription is live: at once if
    /// it is; after the attempt in flight if one is (within the connect
    /// timeout and the timeout); an error if it failed and waits to try
    /// again. The first watch starts the hub.
    pub(super) fn watch(&self, set: String) -> StoreFuture<ReleaseWatch> {
        if let Err(err) = self.start() {
            return StoreFuture::ready(Err(err));
        }
        let (notify, registration) = self.shared.watches.register(set);
        let mut status = self.shared.status.subscribe();
        let bound = self
            .shared
            .connect_timeout
            .saturating_add(self.shared.timeout);
        StoreFuture::pending(async move {
            let settled = status.wait_for(|s| !matches!(s, Status::Connecting));
            let status = match tokio::time::timeout(bound, settled).await {
                Ok(Ok(status)) => status.clone(),
                Ok(Err(_)) => Status::Down(StoreError::Redis(
                    "the store is gone; its releases are no longer watched".into(),
                )),
                Err(_) => Status::Down(StoreError::Timeout(bound)),
            };
            match status {
                Status::Live => Ok(ReleaseWatch::new(notify, Box::new(registration))),
                Status::Down(err) => Err(err),
                Status::Connecting => Err(StoreError::Timeout(bound)),
            }
        })
    }

    /// Starts the task, unless it runs.
    fn start(&self) -> Result<(), StoreError> {
        let mut events = self.events.lock().unwrap_or_else(PoisonError::into_inner);
        if events.is_some() {
            return Ok(());
        }
        let runtime =
            tokio::runtime::Handle::try_current().map_err(|_| ConfigError::NoRuntime {
                what: "watching a Redis store's releases",
            })?;
        let (tx, rx) = mpsc::unbounded_channel();
        runtime.spawn(run(self.shared.clone(), tx.clone(), rx));
        *events = Some(tx);
        Ok(())
    }

    /// The subscription's status, for the tests: closed once the task has
    /// ended and the store is gone.
    #[cfg(test)]
    fn status(&self) -> watch::Receiver<Status> {
        self.shared.status.subscribe()
    }
}

impl Drop for Hub {
    fn drop(&mut self) {
        let events = self
            .events
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(events) = events.take() {
            let _ = events.send(Event::Close);
        }
    }
}

/// How a subscribed connection ended.
enum Ended {
    /// The store is gone: the task ends.
    Closed,
    /// The connection failed, for this reason: subscribe again.
    Lost(String),
}

/// The hub's task: subscribes, hears, subscribes again, until told to
/// close.
async fn run(
    shared: Arc<Shared>,
    tx: mpsc::UnboundedSender<Event>,
    mut rx: mpsc::UnboundedReceiver<Event>,
) {
    // Each attempt's number tags its connection's pushes: those of a
    // connection already given up on are ignored.
    let mut attempt = 0u64;
    let mut subscribed = 0u64;
    let mut failures = 0u32;
    let mut node = 0usize;
    loop {
        attempt += 1;
        shared.status.send_replace(Status::Connecting);
        match shared.subscribe(attempt, &tx, node).await {
            Ok((conn, addr)) => {
                let since = Instant::now();
                subscribed += 1;
                shared.status.send_replace(Status::Live);
                if subscribed > 1 {
                    // Releases may have been announced while no connection
                    // heard them.
                    let told = shared.watches.all();
                    tracing::debug!(channel = %shared.channel, watches = told, "releases: subscribed again; every watch told");
                }
                match shared.listen(conn, &addr, attempt, &mut rx).await {
                    Ended::Closed => return,
                    Ended::Lost(reason) => {
                        // New watches wait for the next subscription.
                        shared.status.send_replace(Status::Connecting);
                        tracing::debug!(channel = %shared.channel, reason = %reason, "releases: subscription lost");
                        if since.elapsed() < SHORT_LIVED {
                            failures = failures.saturating_add(1);
                        } else {
                            failures = 0;
                        }
                    }
                }
            }
            Err(err) => {
                failures = failures.saturating_add(1);
                if SUBSCRIBE_WARNINGS.allow() {
                    tracing::warn!(channel = %shared.channel, error = %err, "releases: subscribing failed; waiting callers hear only this process's releases");
                } else {
                    tracing::debug!(channel = %shared.channel, error = %err, "releases: subscribing failed");
                }
                shared.status.send_replace(Status::Down(err));
                node = node.wrapping_add(1);
            }
        }
        if failures > 0 && !wait(&mut rx, backoff(failures)).await {
            return;
        }
    }
}

/// Waits `pause`, dropping the pushes of old connections meanwhile:
/// `false` if told to close.
async fn wait(rx: &mut mpsc::UnboundedReceiver<Event>, pause: Duration) -> bool {
    let until = Instant::now() + pause;
    loop {
        match tokio::time::timeout_at(until, rx.recv()).await {
            Err(_) => return true,
            Ok(None | Some(Event::Close)) => return false,
            Ok(Some(Event::Push(..))) => {}
        }
    }
}

impl Shared {
    /// Where attempt `node` (counted from 0) connects; with RESP3.
    fn info(&self, node: usize) -> Result<ConnectionInfo, StoreError> {
        let info = match &self.source {
            Source::Nodes(nodes) if nodes.is_empty() => {
                return Err(StoreError::Redis("no Redis server to subscribe to".into()));
            }
            Source::Nodes(nodes) => nodes[node % nodes.len()].clone(),
            #[cfg(feature = "sentinel")]
            Source::Sentinel(sentinel) => match sentinel.master_info() {
                Some(info) => info,
                None => {
                    sentinel.trigger(true);
                    return Err(StoreError::Redis(
                        "no Redis master known yet; asking the sentinels".into(),
                    ));
                }
            },
        };
        let redis = info
            .redis_settings()
            .clone()
            .set_protocol(ProtocolVersion::RESP3);
        Ok(info.set_redis_settings(redis))
    }

    /// A new connection (attempt number `attempt`, its pushes tagged so)
    /// to the `node`th place it may be made ([`info`](Self::info)),
    /// subscribed to the channel, and that place's `host:port`.
    async fn subscribe(
        &self,
        attempt: u64,
        tx: &mpsc::UnboundedSender<Event>,
        node: usize,
    ) -> Result<(MultiplexedConnection, String), StoreError> {
        let info = self.info(node)?;
        let addr = info.addr().to_string();
        let client = redis::Client::open(info)?;
        let tx = tx.clone();
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.connect_timeout))
            .set_response_timeout(None)
            .set_push_sender(move |push: PushInfo| tx.send(Event::Push(attempt, push)));
        // A server that does not speak RESP3 (before Redis 6, some
        // proxies) refuses the `HELLO 3` of the handshake: say what it was.
        let connect = client.get_multiplexed_async_connection_with_config(&config);
        let mut conn = tokio::time::timeout(self.connect_timeout, connect)
            .await
            .map_err(|_| StoreError::Timeout(self.connect_timeout))?
            .map_err(|err| {
                StoreError::Redis(format!(
                    "connecting with RESP3 (Redis 6 or later) to subscribe to {}: {err}",
                    self.channel
                ))
            })?;
        tokio::time::timeout(self.timeout, conn.subscribe(&self.channel))
            .await
            .map_err(|_| StoreError::Timeout(self.timeout))?
            .map_err(|err| StoreError::Redis(format!("subscribing to {}: {err}", self.channel)))?;
        Ok((conn, addr))
    }

    /// Hears the channel on `conn` (to `addr`, made in attempt `attempt`)
    /// until it fails, or, on Sentinel, the store has moved to another
    /// master, or the store is gone.
    async fn listen(
        &self,
        mut conn: MultiplexedConnection,
        addr: &str,
        attempt: u64,
        rx: &mut mpsc::UnboundedReceiver<Event>,
    ) -> Ended {
        let mut ping_at = Instant::now() + PING_EVERY;
        // Read on Sentinel only.
        let _ = addr;
        loop {
            let event = match tokio::time::timeout_at(ping_at, rx.recv()).await {
                Ok(event) => event,
                Err(_) => {
                    #[cfg(feature = "sentinel")]
                    if let Source::Sentinel(sentinel) = &self.source
                        && sentinel.addr().is_some_and(|master| master != addr)
                    {
                        return Ended::Lost("the store moved to another master".into());
                    }
                    let ping = redis::cmd("PING");
                    let ping = ping.query_async::<Value>(&mut conn);
                    match tokio::time::timeout(self.timeout.max(PING_TIMEOUT), ping).await {
                        Ok(Ok(_)) => {}
                        Ok(Err(err)) => return Ended::Lost(format!("PING failed: {err}")),
                        Err(_) => return Ended::Lost("PING went unanswered".into()),
                    }
                    ping_at = Instant::now() + PING_EVERY;
                    continue;
                }
            };
            match event {
                None | Some(Event::Close) => return Ended::Closed,
                Some(Event::Push(of, push)) if of == attempt => match push.kind {
                    PushKind::Message => {
                        self.heard(&push.data);
                    }
                    PushKind::Disconnection => return Ended::Lost("connection closed".into()),
                    PushKind::Unsubscribe => return Ended::Lost("unsubscribed".into()),
                    _ => {}
                },
                // A push of a connection given up on.
                Some(Event::Push(..)) => {}
            }
        }
    }

    /// A message, `[channel, set]`: tells the set's watches. Anything else
    /// (another channel, a set that is not text) is ignored.
    fn heard(&self, data: &[Value]) -> usize {
        let [Value::BulkString(channel), Value::BulkString(set)] = data else {
            return 0;
        };
        if channel.as_slice() != self.channel.as_bytes() {
            return 0;
        }
        match std::str::from_utf8(set) {
            Ok(set) => self.watches.released(set),
            Err(_) => 0,
        }
    }
}

/// The least time a `PING` is given to answer (the store's timeout, if
/// longer): a slow answer now and then must not cost a new subscription,
/// and with it a wake of every watch.
const PING_TIMEOUT: Duration = Duration::from_secs(1);

#[cfg(test)]
mod tests {
    use std::future::Future;
    use std::pin::pin;
    use std::task::{Context, Waker};

    use super::*;

    /// Whether `watch` has been told of a release, without waiting: the
    /// permit `notify_one` leaves is taken at the first poll.
    fn told(notify: &Notify) -> bool {
        let mut cx = Context::from_waker(Waker::noop());
        pin!(notify.notified()).poll(&mut cx).is_ready()
    }

    #[test]
    fn a_set_is_watched_until_its_last_watch_is_dropped() {
        let watches = Arc::new(Watches::default());
        let (a1, r_a1) = watches.register("a".into());
        let (a2, r_a2) = watches.register("a".into());
        let (b, r_b) = watches.register("b".into());
        assert_eq!(watches.sets(), 2);
        assert_eq!(watches.released("a"), 2);
        assert!(told(&a1) && told(&a2));
        assert!(!told(&b), "a release of another set");
        assert_eq!(watches.released("c"), 0);
        drop(r_a1);
        assert_eq!(watches.sets(), 2, "a is still watched");
        assert_eq!(watches.released("a"), 1);
        assert!(told(&a2) && !told(&a1));
        drop(r_a2);
        assert_eq!(watches.sets(), 1, "a's entry goes with its last watch");
        assert_eq!(watches.all(), 1);
        assert!(told(&b));
        drop(r_b);
        assert_eq!(watches.sets(), 0);
        // Many watches made and dropped leave nothing behind.
        for i in 0..1000 {
            let _ = watches.register(format!("set{}", i % 7));
        }
        assert_eq!(watches.sets(), 0);
    }

    #[test]
    fn odd_messages_are_ignored() {
        let hub = Hub::new(
            Source::Nodes(Vec::new()),
            "p",
            Duration::ZERO,
            Duration::ZERO,
        );
        let (notify, _registration) = hub.shared.watches.register("s".into());
        let bulk = |text: &[u8]| Value::BulkString(text.to_vec());
        for data in [
            vec![],
            vec![bulk(b"p:released")],
            vec![bulk(b"p:released"), Value::Int(1)],
            vec![bulk(b"p:released"), Value::Nil],
            vec![bulk(b"p:released"), bulk(b"\xff\xfe")],
            vec![bulk(b"other"), bulk(b"s")],
            vec![bulk(b"p:released"), bulk(b"s"), bulk(b"s")],
            vec![Value::SimpleString("p:released".into()), bulk(b"s")],
            vec![bulk(b"p:released"), bulk(b"t")],
        ] {
            assert_eq!(hub.shared.heard(&data), 0, "{data:?}");
        }
        assert!(!told(&notify));
        assert_eq!(hub.shared.heard(&[bulk(b"p:released"), bulk(b"s")]), 1);
        assert!(told(&notify));
    }

    #[test]
    fn backoff_grows_to_a_bound() {
        for failures in 0..40 {
            let pause = backoff(failures);
            assert!(pause <= Duration::from_secs(2), "{failures}: {pause:?}");
            assert!(pause >= Duration::from_millis(37), "{failures}: {pause:?}");
        }
        assert!(backoff(10) >= Duration::from_millis(1500));
    }

    use super::super::test_server::RedisServer as Server;

    /// A sentinel (quorum 1) of the master `master` on a free port, once it
    /// monitors it; killed, and its config file removed, when dropped.
    #[cfg(feature = "sentinel")]
    struct Sentinel {
        child: std::process::Child,
        port: u16,
        conf: std::path::PathBuf,
    }

    #[cfg(feature = "sentinel")]
    impl Sentinel {
        fn start(master: &Server) -> Sentinel {
            use std::io::{BufRead, BufReader};
            let binary = std::env::var("REDIS_SERVER").unwrap_or_else(|_| "redis-server".into());
            let port = super::super::test_server::free_port();
            let conf = std::env::temp_dir().join(format!(
                "fleetgate-wake-sentinel-{}-{port}.conf",
                std::process::id()
            ));
            let text = format!("sentinel monitor main 127.0.0.1 {} 1\n", master.port());
            std::fs::write(&conf, text).expect("the sentinel's config file");
            let mut child = std::process::Command::new(&binary)
                .arg(&conf)
                .arg("--sentinel")
                .args([
                    "--port",
                    &port.to_string(),
                    "--bind",
                    "127.0.0.1",
                    "--logfile",
                    "",
                ])
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::null())
                .spawn()
                .expect("redis-server runs as a sentinel");
            let stdout = child.stdout.take().expect("piped stdout");
            let (tx, rx) = std::sync::mpsc::channel();
            // It says when it monitors the master; the thread then drains
            // its output until it exits.
            std::thread::spawn(move || {
                for line in BufReader::new(stdout).lines() {
                    let Ok(line) = line else { break };
                    if line.contains("+monitor master") {
                        let _ = tx.send(());
                    }
                }
            });
            let sentinel = Sentinel { child, port, conf };
            rx.recv_timeout(Duration::from_secs(20))
                .expect("the sentinel monitors the master");
            sentinel
        }

        fn url(&self) -> String {
            format!("redis://127.0.0.1:{}", self.port)
        }
    }

    #[cfg(feature = "sentinel")]
    impl Drop for Sentinel {
        fn drop(&mut self) {
            let _ = self.child.kill();
            let _ = self.child.wait();
            let _ = std::fs::remove_file(&self.conf);
        }
    }

    use super::super::RedisStore;
    use crate::key::Key;
    use crate::store::{LeaseCall, LeaseGrant, LeaseId, StoreOps};

    /// Long enough for anything on a loaded machine: only a test that
    /// fails waits this long.
    const SIGNAL: Duration = Duration::from_secs(10);

    /// A store, as one instance of the fleet has.
    async fn instance(server: &Server) -> RedisStore {
        RedisStore::builder(server.url())
            .timeout(Duration::from_secs(2))
            .connect()
            .await
            .expect("connect to the test's redis-server")
    }

    fn call<'a>(key: &'a Key, id: &'a LeaseId, wait: Option<Duration>) -> LeaseCall<'a> {
        LeaseCall {
            name: "slots",
            key,
            id,
            capacity: 1,
            ttl: Duration::from_secs(60),
            wait,
            undo: false,
        }
    }

    /// Takes the one slot of `set`, as another instance would.
    async fn hold(store: &RedisStore, set: &str) -> LeaseId {
        let id = LeaseId::generate();
        let grant = acquire(store, set, &id, None).await;
        assert!(grant.is_acquired(), "{set}: {grant:?}");
        id
    }

    async fn acquire(
        store: &RedisStore,
        set: &str,
        id: &LeaseId,
        wait: Option<Duration>,
    ) -> LeaseGrant {
        let key = Key::new(set);
        store.run_lease_acquire(call(&key, id, wait)).await.unwrap()
    }

    /// A refused acquire of `set`, waiting `wait` (`None`: not waiting).
    async fn refused(store: &RedisStore, set: &str, wait: Option<Duration>) {
        let grant = acquire(store, set, &LeaseId::generate(), wait).await;
        assert!(!grant.is_acquired(), "{set}: {grant:?}");
    }

    async fn release(store: &RedisStore, set: &str, id: &LeaseId) -> bool {
        let key = Key::new(set);
        store.run_lease_release(call(&key, id, None)).await.unwrap()
    }

    async fn watch(store: &RedisStore, set: &str) -> ReleaseWatch {
        let watch = store
            .watch_releases("slots", &Key::new(set))
            .expect("Redis watches");
        tokio::time::timeout(SIGNAL, watch)
            .await
            .expect("a watch within its bound")
            .expect("a live watch")
    }

    /// Waits for `watch`'s signal, for at most [`SIGNAL`].
    async fn told_within(watch: &ReleaseWatch, what: &str) {
        tokio::time::timeout(SIGNAL, watch.released())
            .await
            .unwrap_or_else(|_| panic!("not told: {what}"));
    }

    /// Whether `watch` has been told since it last was, without waiting.
    fn was_told(watch: &ReleaseWatch) -> bool {
        let mut cx = Context::from_waker(Waker::noop());
        pin!(watch.released()).poll(&mut cx).is_ready()
    }

    async fn marker_ttl(server: &Server, store: &RedisStore, set: &str) -> i64 {
        let marker = format!("{}:w", store.lease_key("slots", &Key::new(set)));
        redis::cmd("PTTL")
            .arg(marker)
            .query_async(&mut server.admin().await)
            .await
            .unwrap()
    }

    /// A release through another instance wakes the watches of its set;
    /// nothing else does: a release of another set, of a set no refused
    /// caller waits for, of a lease not held. The hub hears the channel
    /// in order, so once a later release has been told, an earlier one
    /// that was announced would have been too: the checks that nothing
    /// came need no timeout.
    #[tokio::test]
    async fn a_release_by_another_instance_wakes_the_watches_of_its_set() {
        let server = Server::start();
        let (here, there) = (instance(&server).await, instance(&server).await);
        let mut held = HashMap::new();
        for set in ["a", "b", "c", "d"] {
            held.insert(set, hold(&there, set).await);
        }
        // Callers of this instance wait for a, b and d; c's does not wait.
        for set in ["a", "b", "d"] {
            refused(&here, set, Some(Duration::from_secs(60))).await;
            assert!(marker_ttl(&server, &here, set).await > 0, "{set} marked");
        }
        refused(&here, "c", None).await;
        assert_eq!(marker_ttl(&server, &here, "c").await, -2, "c unmarked");

        let (a1, a2) = (watch(&here, "a").await, watch(&here, "a").await);
        let (c, d) = (watch(&here, "c").await, watch(&here, "d").await);
        assert!(release(&there, "b", &held["b"]).await);
        assert!(release(&there, "c", &held["c"]).await);
        assert!(release(&there, "a", &held["a"]).await);
        told_within(&a1, "a released").await;
        told_within(&a2, "a released, second watch").await;
        assert!(!was_told(&c), "c's release was announced, unmarked");
        assert!(!was_told(&d), "d told of another set's release");

        // Releasing a lease no longer held frees nothing, announces nothing.
        assert!(!release(&there, "a", &held["a"]).await);
        assert!(release(&there, "d", &held["d"]).await);
        told_within(&d, "d released").await;
        assert!(
            !was_told(&a1) && !was_told(&a2),
            "a not-held lease was announced"
        );
    }

    /// A refused caller's mark lasts as long as its wait, is never
    /// shortened by a shorter one, and goes once the longest wait is
    /// over; a caller that does not wait, or is granted, marks nothing.
    #[tokio::test]
    async fn a_set_is_marked_for_the_longest_wait() {
        let server = Server::start();
        let (here, there) = (instance(&server).await, instance(&server).await);
        let granted = LeaseId::generate();
        let grant = acquire(&here, "free", &granted, Some(Duration::from_secs(60))).await;
        assert!(grant.is_acquired());
        assert_eq!(marker_ttl(&server, &here, "free").await, -2);

        hold(&there, "m").await;
        refused(&here, "m", Some(Duration::ZERO)).await;
        assert_eq!(
            marker_ttl(&server, &here, "m").await,
            -2,
            "no wait, no mark"
        );
        refused(&here, "m", Some(Duration::from_millis(300))).await;
        let ttl = marker_ttl(&server, &here, "m").await;
        assert!((1..=300).contains(&ttl), "{ttl}");
        refused(&here, "m", Some(Duration::from_secs(60))).await;
        assert!(
            marker_ttl(&server, &here, "m").await > 1_000,
            "a longer wait extends it"
        );
        refused(&here, "m", Some(Duration::from_millis(300))).await;
        assert!(
            marker_ttl(&server, &here, "m").await > 1_000,
            "a shorter one keeps it"
        );
        // A wait of any length marks the set (for at most 2^40 ms).
        hold(&there, "forever").await;
        refused(&here, "forever", Some(Duration::MAX)).await;
        assert!(marker_ttl(&server, &here, "forever").await > 1 << 39);
        // Gone once the wait is over: a release is no longer announced.
        let short = hold(&there, "short").await;
        refused(&here, "short", Some(Duration::from_millis(20))).await;
        let watched = watch(&here, "short").await;
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(marker_ttl(&server, &here, "short").await, -2, "expired");
        let later = hold(&there, "later").await;
        refused(&here, "later", Some(Duration::from_secs(60))).await;
        let witness = watch(&here, "later").await;
        assert!(release(&there, "short", &short).await);
        assert!(release(&there, "later", &later).await);
        told_within(&witness, "later released").await;
        assert!(!was_told(&watched), "a release announced past every wait");
    }

    /// On Sentinel the hub subscribes on the master the store follows.
    #[cfg(feature = "sentinel")]
    #[tokio::test]
    async fn on_sentinel_the_hub_subscribes_on_the_master() {
        let master = Server::start();
        let sentinel = Sentinel::start(&master);
        let here = RedisStore::builder(crate::Topology::sentinel([sentinel.url()], "main"))
            .timeout(Duration::from_secs(2))
            .connect()
            .await
            .expect("the master, through the sentinel");
        let there = instance(&master).await;
        let id = hold(&there, "a").await;
        refused(&here, "a", Some(Duration::from_secs(60))).await;
        let watched = watch(&here, "a").await;
        assert!(release(&there, "a", &id).await);
        told_within(&watched, "a released").await;
    }

    /// The marker is a refused caller's only write: on a master past
    /// `maxmemory` a refused acquire that waits fails (its `SET` takes
    /// memory), one that does not wait is answered as before.
    #[tokio::test]
    async fn a_refused_caller_that_waits_fails_where_writes_are_refused() {
        let server = Server::start();
        let (here, there) = (instance(&server).await, instance(&server).await);
        hold(&there, "a").await;
        let mut admin = server.admin().await;
        let _: () = redis::cmd("CONFIG")
            .arg(&["SET", "maxmemory-policy", "noeviction"])
            .query_async(&mut admin)
            .await
            .unwrap();
        let _: () = redis::cmd("CONFIG")
            .arg(&["SET", "maxmemory", "1"])
            .query_async(&mut admin)
            .await
            .unwrap();
        refused(&here, "a", None).await;
        let key = Key::new("a");
        let id = LeaseId::generate();
        let waiting = call(&key, &id, Some(Duration::from_secs(60)));
        let failed = here.run_lease_acquire(waiting).await;
        assert!(
            matches!(&failed, Err(StoreError::Redis(text)) if text.contains("OOM")),
            "{failed:?}"
        );
        assert_eq!(marker_ttl(&server, &here, "a").await, -2);
    }

    /// An ACL user without the channel cannot watch, and its releases of a
    /// marked set are done and answered all the same, unannounced.
    #[tokio::test]
    async fn a_release_is_done_where_its_announcement_is_refused() {
        let server = Server::start();
        let _: () = redis::cmd("ACL")
            .arg(&[
                "SETUSER",
                "keys",
                "on",
                ">secret",
                "~*",
                "resetchannels",
                "+@all",
            ])
            .query_async(&mut server.admin().await)
            .await
            .unwrap();
        let url = format!("redis://keys:secret@127.0.0.1:{}", server.port());
        let limited = RedisStore::builder(url)
            .timeout(Duration::from_secs(2))
            .connect()
            .await
            .unwrap();
        let there = instance(&server).await;
        let watching = limited.watch_releases("slots", &Key::new("a")).unwrap();
        let refused_watch = tokio::time::timeout(SIGNAL, watching)
            .await
            .expect("bounded");
        assert!(
            matches!(&refused_watch, Err(StoreError::Redis(text)) if text.to_lowercase().contains("noperm")),
            "{refused_watch:?}"
        );
        let id = hold(&limited, "a").await;
        refused(&there, "a", Some(Duration::from_secs(60))).await;
        let witness = watch(&there, "a").await;
        assert!(release(&limited, "a", &id).await, "released, and said so");
        assert!(!release(&limited, "a", &id).await);
        // Announced by a user who may: only that one is heard.
        let id = hold(&there, "a").await;
        assert!(release(&there, "a", &id).await);
        told_within(&witness, "a released").await;
        assert!(
            !was_told(&witness),
            "the limited user's release was announced"
        );
    }

    /// After the subscriber's connection is killed, the hub subscribes
    /// again and tells every watch once (releases may have gone unheard
    /// meanwhile); releases announced later reach the watches, old and new.
    #[tokio::test]
    async fn watches_are_told_once_subscribed_again() {
        let server = Server::start();
        let (here, there) = (instance(&server).await, instance(&server).await);
        let old = watch(&here, "a").await;
        let killed: i64 = redis::cmd("CLIENT")
            .arg(&["KILL", "TYPE", "pubsub"])
            .query_async(&mut server.admin().await)
            .await
            .unwrap();
        assert_eq!(killed, 1, "the hub's one subscriber");
        told_within(&old, "subscribed again").await;
        assert!(!was_told(&old), "told more than once");

        let new = watch(&here, "a").await;
        let id = hold(&there, "a").await;
        refused(&here, "a", Some(Duration::from_secs(60))).await;
        assert!(release(&there, "a", &id).await);
        told_within(&new, "a release after the reconnection").await;
        told_within(&old, "a release after the reconnection, old watch").await;
    }

    /// The hub's task ends once the store's last clone is dropped, even
    /// with watches still held.
    #[tokio::test]
    async fn the_hub_ends_with_its_store() {
        let server = Server::start();
        let store = instance(&server).await;
        let clone = store.clone();
        let held = watch(&store, "a").await;
        let mut status = store.inner.hub.status();
        drop(store);
        drop(clone);
        let ended = async { while status.changed().await.is_ok() {} };
        tokio::time::timeout(SIGNAL, ended)
            .await
            .expect("the hub's task ended with its store");
        drop(held);
    }

    /// While Redis cannot be reached, a watch fails (within the connect
    /// timeout and the timeout) and leaves nothing registered.
    #[tokio::test]
    async fn a_watch_fails_while_redis_cannot_be_reached() {
        let store = RedisStore::builder("redis://127.0.0.1:1")
            .timeout(Duration::from_millis(200))
            .connect_timeout(Duration::from_millis(500))
            .lazy()
            .connect()
            .await
            .unwrap();
        for _ in 0..2 {
            let watch = store.watch_releases("slots", &Key::new("a")).unwrap();
            let result = tokio::time::timeout(SIGNAL, watch)
                .await
                .expect("within its bound");
            assert!(result.is_err(), "{result:?}");
            assert_eq!(store.inner.hub.shared.watches.sets(), 0);
        }
    }

    #[test]
    fn a_watch_needs_a_runtime() {
        let hub = Hub::new(
            Source::Nodes(Vec::new()),
            "p",
            Duration::ZERO,
            Duration::ZERO,
        );
        let result = hub.watch("s".into()).take_ready();
        assert!(
            matches!(
                result,
                Some(Err(StoreError::Config(ConfigError::NoRuntime { .. })))
            ),
            "{result:?}"
        );
        assert_eq!(hub.shared.watches.sets(), 0, "nothing registered");
    }
}
