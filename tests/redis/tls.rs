//! `RedisStore` over TLS (feature `tls-rustls`), against real redis-servers
//! that speak only TLS, with certificates made for each test by `openssl`
//! (`tests/common/tls.rs`): a single node over `rediss://` with the test's
//! CA given to the client, servers whose certificate the client must refuse
//! (unknown CA, another name), `#insecure` (feature `tls-rustls-insecure`),
//! and Redis Sentinel with TLS between everyone (feature `sentinel`).
use crate::common;

use std::time::Duration;

use common::tls::{Certs, start_tls_server, tls_url};
use fleetgate::key::Key;
use fleetgate::{Limit, Limiter, Policy, Rate, RedisStore, Topology};

/// Generous: a Sentinel lookup over TLS makes a handshake per sentinel
/// and per `ROLE` check, each re-reading the system's roots; under CI's
/// load on 2 cores one took over 2 s. What these tests assert is which
/// error comes, never how soon.
const TIMEOUT: Duration = Duration::from_secs(10);

/// Three a minute: three allowed, the fourth denied.
fn policy() -> Policy {
    Policy::single(
        "tls",
        Limit::builder(Rate::per_minute(3))
            .burst(3)
            .build()
            .unwrap(),
    )
    .unwrap()
}

/// The first three calls on `key` are allowed, the fourth denied: Redis
/// decided (the deny cache is off, nothing is answered locally).
async fn decides(store: RedisStore, key: &str) {
    let limiter = Limiter::new(policy(), store);
    let key = Key::new(key);
    for i in 0..3 {
        let decision = limiter.check(&key, 1).await.expect("a decision over TLS");
        assert!(decision.is_allowed(), "call {i} denied");
    }
    let decision = limiter.check(&key, 1).await.expect("a decision over TLS");
    assert!(!decision.is_allowed(), "the fourth call was allowed");
}

fn builder(topology: impl Into<Topology>) -> fleetgate::RedisStoreBuilder {
    RedisStore::builder(topology)
        .prefix("tls")
        .timeout(Duration::from_secs(2))
        .connect_timeout(TIMEOUT)
        .deny_cache(0)
}

/// The keys of the `tls` prefix in the server behind `client`.
async fn tls_keys(client: &redis::Client) -> Vec<String> {
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("the test's own connection");
    redis::cmd("KEYS")
        .arg("tls:*")
        .query_async(&mut conn)
        .await
        .expect("KEYS")
}

/// A server that speaks only TLS decides through a store given the test's
/// CA (`redis::Client::build_with_tls`, then `Topology::client`); its
/// state is in that server; plain TCP to the same port gets nowhere.
#[tokio::test]
async fn a_tls_only_server_decides_over_rediss() {
    let certs = Certs::new();
    let server = start_tls_server(&certs, &certs.server);
    let client = certs.client(server.port(), certs.ca_pem());
    let store = builder(Topology::client(client.clone()))
        .connect()
        .await
        .expect("connect over TLS with the test's CA");
    decides(store, "over-tls").await;
    assert_eq!(tls_keys(&client).await.len(), 1, "one GCRA key");

    let plain = builder(format!("redis://127.0.0.1:{}", server.port()))
        .connect()
        .await;
    assert!(plain.is_err(), "plain TCP to a TLS port connected");
}

/// The client checks the server: `rediss://` with the system's roots
/// alone, or with another CA, refuses the test's server; the test's CA
/// refuses a certificate it signed for another name.
#[tokio::test]
async fn a_certificate_the_client_does_not_trust_is_refused() {
    let certs = Certs::new();
    let server = start_tls_server(&certs, &certs.server);
    let port = server.port();

    let system_roots = builder(tls_url(port)).connect().await;
    let err = system_roots.expect_err("the test's CA is no system root");
    assert!(
        err.to_string().contains("certificate"),
        "not a certificate error: {err}"
    );

    let other_ca = builder(Topology::client(certs.client(port, certs.other_ca_pem())))
        .connect()
        .await;
    let err = other_ca.expect_err("trusted a server another CA signed");
    assert!(
        err.to_string().contains("certificate"),
        "not a certificate error: {err}"
    );

    let misnamed = start_tls_server(&certs, &certs.wrong_name);
    let wrong_name = builder(Topology::client(
        certs.client(misnamed.port(), certs.ca_pem()),
    ))
    .connect()
    .await;
    let err = wrong_name.expect_err("a certificate for another name");
    assert!(
        err.to_string().contains("certificate"),
        "not a certificate error: {err}"
    );

    // The same CA and server, named right: the refusals above were the
    // checks', not the setup's.
    let store = builder(Topology::client(certs.client(port, certs.ca_pem())))
        .connect()
        .await
        .expect("connect with the right CA");
    decides(store, "trusted").await;
}

/// `#insecure` (feature `tls-rustls-insecure`) skips the check, and only
/// when asked for: the misnamed server is refused without it.
#[cfg(feature = "tls-rustls-insecure")]
#[tokio::test]
async fn insecure_trusts_any_certificate_when_asked() {
    let certs = Certs::new();
    let server = start_tls_server(&certs, &certs.wrong_name);
    let checked = builder(tls_url(server.port())).connect().await;
    assert!(checked.is_err(), "trusted an unknown certificate unasked");
    let store = builder(format!("{}/#insecure", tls_url(server.port())))
        .connect()
        .await
        .expect("connect with #insecure");
    decides(store, "insecure").await;
}

/// Sentinel with TLS between everyone: the store asks the sentinels over
/// TLS (their addresses carry the test's CA), connects to the master's TLS
/// port they name (`TlsMode::Insecure`; for the check, see
/// `a_sentinel_master_behind_a_private_ca_is_checked_against_it`), decides
/// there, and after the master is killed, on the promoted replica, over
/// TLS again.
#[cfg(all(feature = "sentinel", feature = "tls-rustls-insecure"))]
#[tokio::test]
async fn sentinels_and_master_over_tls_through_a_failover() {
    use common::sentinel::{MASTER_NAME, SentinelSet};
    use redis::sentinel::SentinelNodeConnectionInfo;

    let certs = Certs::new();
    let mut set = SentinelSet::start_tls(&certs).await;
    let ports = set.tls_ports().expect("a TLS set").clone();
    let sentinels: Vec<redis::ConnectionInfo> =
        ports.sentinels.iter().map(|&p| certs.info(p)).collect();
    // Only TLS addresses: the sentinels name the master's TLS port.
    let named: (String, u16) = set
        .sentinel_cmd(&["GET-MASTER-ADDR-BY-NAME", MASTER_NAME])
        .await
        .expect("the sentinels name the master");
    assert_eq!(named.1, ports.master, "the sentinels name the TLS port");

    let store = builder(Topology::sentinel(sentinels, MASTER_NAME))
        .sentinel_master(
            SentinelNodeConnectionInfo::default().set_tls_mode(redis::TlsMode::Insecure),
        )
        .connect()
        .await
        .expect("connect through the sentinels over TLS");
    let after = store.gcra_key(&policy(), &Key::new("after"), 0);
    let limiter = Limiter::new(policy(), store);
    let key = Key::new("before");
    assert!(limiter.check(&key, 1).await.unwrap().is_allowed());
    let master_port = set.master_port();
    let mut master = set.connect(master_port).await;
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("tls:*")
        .query_async(&mut master)
        .await
        .unwrap();
    assert_eq!(keys.len(), 1, "the decision's key on the master");

    // The master dies; the replica (TLS port `ports.replica`) is promoted.
    decides_on_the_promoted_replica(&mut set, ports.replica, &limiter, &after).await;
}

/// A master behind a private CA: `sentinel_master_tls` with the test's CA
/// connects, decides there, and after the master is killed on the
/// promoted replica, checked against the same CA. With another CA, or
/// `TlsMode::Secure` in `sentinel_master` (the system's roots, which the
/// redis crate's `SentinelClient` checks with), the master is refused and
/// the store is not built.
#[cfg(feature = "sentinel")]
#[tokio::test]
async fn a_sentinel_master_behind_a_private_ca_is_checked_against_it() {
    use common::sentinel::{MASTER_NAME, SentinelSet};
    use redis::sentinel::SentinelNodeConnectionInfo;
    use redis::{RedisConnectionInfo, TlsCertificates};

    let certs = Certs::new();
    let mut set = SentinelSet::start_tls(&certs).await;
    let ports = set.tls_ports().expect("a TLS set").clone();
    let sentinels: Vec<redis::ConnectionInfo> =
        ports.sentinels.iter().map(|&p| certs.info(p)).collect();
    let with_ca = |pem: Vec<u8>| TlsCertificates {
        client_tls: None,
        root_cert: Some(pem),
    };

    let system_roots = builder(Topology::sentinel(sentinels.clone(), MASTER_NAME))
        .sentinel_master(SentinelNodeConnectionInfo::default().set_tls_mode(redis::TlsMode::Secure))
        .connect()
        .await;
    let err = system_roots.expect_err("a master behind the test's CA passed the system roots");
    assert!(
        err.to_string().contains("certificate"),
        "not a certificate error: {err}"
    );

    let other_ca = builder(Topology::sentinel(sentinels.clone(), MASTER_NAME))
        .sentinel_master_tls(
            RedisConnectionInfo::default(),
            with_ca(certs.other_ca_pem()),
        )
        .connect()
        .await;
    let err = other_ca.expect_err("trusted a master another CA signed");
    assert!(
        err.to_string().contains("certificate"),
        "not a certificate error: {err}"
    );

    // The last of `sentinel_master` and `sentinel_master_tls` applies.
    let store = builder(Topology::sentinel(sentinels, MASTER_NAME))
        .sentinel_master(SentinelNodeConnectionInfo::default().set_tls_mode(redis::TlsMode::Secure))
        .sentinel_master_tls(RedisConnectionInfo::default(), with_ca(certs.ca_pem()))
        .connect()
        .await
        .expect("connect to the master with the test's CA");
    let after = store.gcra_key(&policy(), &Key::new("after"), 0);
    let limiter = Limiter::new(policy(), store);
    let key = Key::new("private-ca");
    for i in 0..3 {
        let decision = limiter.check(&key, 1).await.expect("a decision over TLS");
        assert!(decision.is_allowed(), "call {i} denied");
    }
    let decision = limiter.check(&key, 1).await.expect("a decision over TLS");
    assert!(!decision.is_allowed(), "the fourth call was allowed");
    let mut master = set.connect(set.master_port()).await;
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("tls:*")
        .query_async(&mut master)
        .await
        .expect("KEYS on the master");
    assert_eq!(keys.len(), 1, "the decision's key on the master");

    // The master dies; the replica is promoted, and checked against the
    // same CA.
    decides_on_the_promoted_replica(&mut set, ports.replica, &limiter, &after).await;
}

/// Kills the master, waits for the sentinels to promote the replica (TLS
/// port `tls_port`), and for the store to find it by itself: its calls
/// fail until then, each one the lookup has not caught up with yet. The
/// decision's key (`after_key`) must land on the promoted replica.
#[cfg(feature = "sentinel")]
async fn decides_on_the_promoted_replica(
    set: &mut common::sentinel::SentinelSet,
    tls_port: u16,
    limiter: &Limiter,
    after_key: &str,
) {
    if let Some(master) = set.master.take() {
        master.stop();
    }
    set.wait_switched(tls_port, Duration::from_secs(30)).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let after = Key::new("after");
    loop {
        match limiter.check(&after, 1).await {
            Ok(decision) => {
                assert!(decision.is_allowed());
                break;
            }
            Err(err) => assert!(
                std::time::Instant::now() < deadline,
                "no decision on the promoted replica: {err}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut replica = set.connect(set.replica.port()).await;
    let found: u32 = redis::cmd("EXISTS")
        .arg(after_key)
        .query_async(&mut replica)
        .await
        .expect("EXISTS on the promoted replica");
    assert_eq!(found, 1, "the decision's key on the promoted replica");
}
