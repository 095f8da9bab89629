//! Releases announced to the fleet: a release through the public API of a
//! set that a refused caller waits for (its marker, `<lease key>:w`, set
//! by a waiting acquire; here by hand, as another instance's would) is
//! published on `<prefix>:released` with the set's key, which any
//! instance subscribed there hears; a release of a set nobody waits for,
//! or of a lease no longer held, publishes nothing; a caller queued on one
//! instance is woken by it. (What a store's own subscriber does with the
//! messages is tested in src/store/redis/wake.rs.)
use crate::common;

use std::time::Duration;

use common::RedisServer;
use fleetgate::concurrency::{Admission, ConcurrencyLimiter, ConcurrencyPolicy, WaitQueue};
use fleetgate::lease::{Lease, LeaseGuard, StoreLease};
use fleetgate::{Key, RedisStore};
use redis::aio::MultiplexedConnection;
use redis::{PushInfo, PushKind, Value};
use tokio::sync::mpsc;

/// Only a failing test waits this long.
const SIGNAL: Duration = Duration::from_secs(10);

/// A subscriber of the test's own on `channel`, as another instance's:
/// its connection, and the sets it hears released, in order.
async fn subscriber(
    server: &RedisServer,
    channel: &str,
) -> (MultiplexedConnection, mpsc::UnboundedReceiver<String>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let config = redis::AsyncConnectionConfig::new().set_push_sender(move |push: PushInfo| {
        if push.kind == PushKind::Message
            && let [_, Value::BulkString(set)] = push.data.as_slice()
        {
            let _ = tx.send(String::from_utf8_lossy(set).into_owned());
        }
        Ok::<(), ()>(())
    });
    let client = redis::Client::open(format!("{}?protocol=resp3", server.url())).unwrap();
    let mut conn = client
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .expect("the test's subscriber connects");
    conn.subscribe(channel).await.expect("subscribed");
    (conn, rx)
}

async fn next(rx: &mut mpsc::UnboundedReceiver<String>) -> String {
    tokio::time::timeout(SIGNAL, rx.recv())
        .await
        .expect("a release announced")
        .expect("the subscriber is connected")
}

type Guard = LeaseGuard<StoreLease>;

async fn take(limiter: &ConcurrencyLimiter, key: &str) -> Guard {
    match limiter.acquire(&Key::new(key)).await {
        Ok(Admission::Acquired(guard)) => guard,
        other => panic!("{key}: {other:?}"),
    }
}

async fn release(guard: &Guard) -> bool {
    guard.lease().expect("armed").release().await.unwrap()
}

/// Marks `key`'s set as a refused acquire waiting `wait` would.
async fn mark(server: &RedisServer, store: &RedisStore, name: &str, key: &str, wait: Duration) {
    let marker = format!("{}:w", store.lease_key(name, &Key::new(key)));
    let _: () = redis::cmd("SET")
        .arg(&marker)
        .arg(1)
        .arg("PX")
        .arg(wait.as_millis() as u64)
        .query_async(&mut server.admin().await)
        .await
        .unwrap();
}

#[tokio::test]
async fn a_release_of_a_set_someone_waits_for_is_announced_to_the_fleet() {
    let server = RedisServer::start();
    let store = common::redis_store(&server).await;
    let channel = format!("{}:released", store.prefix());
    let (_subscribed, mut heard) = subscriber(&server, &channel).await;
    let other_prefix = RedisStore::builder(server.url())
        .prefix("elsewhere")
        .timeout(Duration::from_secs(2))
        .connect()
        .await
        .unwrap();
    let policy = || ConcurrencyPolicy::builder("slots", 1).build().unwrap();
    let limiter = ConcurrencyLimiter::new(policy(), store.clone());
    let elsewhere = ConcurrencyLimiter::new(policy(), other_prefix.clone());

    let waited = take(&limiter, "waited").await;
    let quiet = take(&limiter, "quiet").await;
    let other = take(&elsewhere, "waited").await;
    mark(&server, &store, "slots", "waited", Duration::from_secs(60)).await;
    mark(
        &server,
        &other_prefix,
        "slots",
        "waited",
        Duration::from_secs(60),
    )
    .await;

    // Announced in the order they land: a release nobody waits for, or on
    // another prefix's channel, would come before the one announced.
    assert!(release(&quiet).await);
    assert!(release(&other).await);
    assert!(release(&waited).await);
    assert_eq!(
        next(&mut heard).await,
        store.lease_key("slots", &Key::new("waited"))
    );

    // A lease no longer held frees nothing, and announces nothing.
    assert!(!release(&waited).await);
    let again = take(&limiter, "waited").await;
    assert!(release(&again).await);
    assert_eq!(
        next(&mut heard).await,
        store.lease_key("slots", &Key::new("waited"))
    );
    assert!(heard.try_recv().is_err(), "announced more than once");
}

/// Whether a `MONITOR` line is a script's call (not a command run inside
/// one) on the lease set `set` by a caller that may still wait, whose
/// last argument is the wait it has left: from 1 ms to `most` ms.
fn is_waiting_call(line: &str, set: &str, most: u64) -> bool {
    let left = line
        .rsplit(' ')
        .next()
        .and_then(|last| last.trim_matches('"').parse::<u64>().ok());
    (line.contains("\"EVALSHA\"") || line.contains("\"EVAL\""))
        && line.contains(&format!("\"{set}\""))
        && left.is_some_and(|ms| (1..=most).contains(&ms))
}

/// The whole way through the public API: a caller queued on one instance
/// takes the slot as soon as another instance releases it, told by Redis,
/// long before the lease would expire or the wait end. The release comes
/// once the caller's second acquire (the one it makes once its watch is
/// live) has reached Redis, which `MONITOR` shows: it is then surely heard
/// through the watch, not found by that acquire.
#[tokio::test]
async fn a_caller_queued_on_one_instance_takes_the_slot_another_releases() {
    use futures_util::StreamExt;
    let server = RedisServer::start();
    let (here, there) = (
        common::redis_store(&server).await,
        common::redis_store(&server).await,
    );
    let mut monitor = server
        .client()
        .get_async_monitor()
        .await
        .unwrap()
        .into_on_message::<String>();
    let policy = || {
        ConcurrencyPolicy::builder("jobs", 1)
            .lease_ttl(Duration::from_secs(60))
            .no_renewal()
            .build()
            .unwrap()
    };
    let holder = ConcurrencyLimiter::new(policy(), there);
    let wait = Duration::from_secs(30);
    let queued =
        ConcurrencyLimiter::new(policy(), here.clone()).queue(WaitQueue::fifo(4, wait).unwrap());
    let held = take(&holder, "k").await;
    let waiting = tokio::spawn(async move { queued.acquire(&Key::new("k")).await });

    let set = here.lease_key("jobs", &Key::new("k"));
    let wait_ms = u64::try_from(wait.as_millis()).unwrap();
    let mut refused = 0;
    while refused < 2 {
        let line = tokio::time::timeout(SIGNAL, monitor.next())
            .await
            .expect("the queued caller's acquires")
            .expect("MONITOR goes on");
        refused += usize::from(is_waiting_call(&line, &set, wait_ms));
    }
    assert!(release(&held).await);
    let admitted = tokio::time::timeout(SIGNAL, waiting)
        .await
        .expect("admitted once the other instance released")
        .unwrap()
        .unwrap();
    assert!(matches!(admitted, Admission::Acquired(_)), "{admitted:?}");
}

/// On a Redis Cluster a release is announced on every node, masters and
/// replicas, whichever owns the set: a store's subscriber may sit on any
/// of them (it takes the nodes it was given, in turn).
#[cfg(feature = "cluster")]
#[tokio::test]
async fn on_a_cluster_every_node_hears_a_release() {
    use common::redis_cluster::RedisCluster;
    let cluster = RedisCluster::start();
    let store = RedisStore::builder(fleetgate::Topology::cluster(cluster.urls()))
        .prefix("cl")
        .timeout(Duration::from_secs(2))
        .connect()
        .await
        .expect("connect to the cluster");
    let channel = format!("{}:released", store.prefix());
    let mut subscribers = Vec::new();
    for node in cluster.nodes() {
        subscribers.push(subscriber(node, &channel).await);
    }
    bus_carries_every_master(&cluster, &channel, &mut subscribers).await;
    let limiter = ConcurrencyLimiter::new(
        ConcurrencyPolicy::builder("slots", 1).build().unwrap(),
        store.clone(),
    );
    // Sets on different masters.
    let keys = ["a", "b", "c", "d", "e", "f"];
    let mut guards = Vec::new();
    for key in keys {
        guards.push(take(&limiter, key).await);
    }
    let marker = |key: &str| format!("{}:w", store.lease_key("slots", &Key::new(key)));
    let nodes = redis::cluster::ClusterClient::new(cluster.urls()).unwrap();
    let mut conn = nodes.get_async_connection().await.unwrap();
    for key in keys {
        let _: () = redis::cmd("SET")
            .arg(marker(key))
            .arg(1)
            .arg("PX")
            .arg(60_000)
            .query_async(&mut conn)
            .await
            .unwrap();
    }
    for guard in &guards {
        assert!(release(guard).await);
    }
    // Each master announces on the cluster bus of its own: in any order.
    let mut sets: Vec<String> = keys
        .iter()
        .map(|key| store.lease_key("slots", &Key::new(key)))
        .collect();
    sets.sort();
    for (_, heard) in &mut subscribers {
        let mut got = Vec::new();
        while got.len() < keys.len() {
            let set = next(heard).await;
            if !set.starts_with("probe ") {
                got.push(set);
            }
        }
        got.sort();
        assert_eq!(got, sets);
    }
}

/// Waits until a message published on any master reaches every node's
/// subscriber: a cluster forwards it over the links between nodes, which
/// `RedisCluster::start` does not wait for (a node can know another while
/// their link is still being set up). Each round every master publishes
/// `probe <round> <master>`; a round whose probes do not all arrive within
/// a second is lost on some link, and the next is sent.
async fn bus_carries_every_master(
    cluster: &common::redis_cluster::RedisCluster,
    channel: &str,
    subscribers: &mut [(MultiplexedConnection, mpsc::UnboundedReceiver<String>)],
) {
    let masters = cluster.masters();
    for round in 0..30 {
        for (m, master) in masters.iter().enumerate() {
            let _: i64 = redis::cmd("PUBLISH")
                .arg(channel)
                .arg(format!("probe {round} {m}"))
                .query_async(&mut master.admin().await)
                .await
                .unwrap();
        }
        let mut all = true;
        for (_, heard) in subscribers.iter_mut() {
            let mut seen = std::collections::HashSet::new();
            let deadline = tokio::time::Instant::now() + Duration::from_secs(1);
            while seen.len() < masters.len() {
                match tokio::time::timeout_at(deadline, heard.recv()).await {
                    Ok(Some(probe)) => {
                        if let Some(m) = probe.strip_prefix(&format!("probe {round} ")) {
                            seen.insert(m.to_owned());
                        }
                    }
                    _ => break,
                }
            }
            all &= seen.len() == masters.len();
        }
        if all {
            return;
        }
    }
    panic!("a publish on some master never reached every node");
}
