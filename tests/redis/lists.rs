//! Deny and allow lists across a fleet: two `LivePolicies`, each on a
//! `RedisStore` of its own connected to the test's server, as two
//! instances would be. An entry written through one refuses (or exempts)
//! on the other within a poll, and on an instance started later; taking
//! it off lifts it everywhere; an ended entry is pruned from Redis by the
//! next list write; entries written by hand that do not read (a bad field,
//! an end no version writes) are skipped and left alone.
use crate::common;

use std::convert::Infallible;
use std::time::{Duration, Instant};

use axum::body::Body;
use common::RedisServer;
use fleetgate::key::{IpNet, Key, key_fn};
use fleetgate::live::{List, LivePolicies};
use fleetgate::spec::PolicySpec;
use fleetgate::{RateLimitLayer, RedisStore};
use http::{Request, Response, StatusCode};
use redis::AsyncCommands;
use tower::util::BoxCloneService;
use tower::{Layer, ServiceExt};

/// What the fleet is given to see a change: many polls of 50 ms, for a
/// loaded machine.
const PROPAGATION: Duration = Duration::from_secs(3);

type App = BoxCloneService<Request<Body>, Response<Body>, Infallible>;

struct Instance {
    live: LivePolicies,
    app: App,
}

/// An instance following the fleet's changes (polling every 50 ms).
async fn instance(server: &RedisServer) -> Instance {
    let instance = quiet_instance(server).await;
    instance.live.start().await.unwrap();
    instance
}

/// An instance never started, so that it never polls.
async fn quiet_instance(server: &RedisServer) -> Instance {
    let store = RedisStore::builder(server.url())
        .prefix("listed")
        .connect()
        .await
        .unwrap();
    let live = LivePolicies::new(store).poll_every(Duration::from_millis(50));
    let limiter = live.limiter("1/h".parse::<PolicySpec>().unwrap().build("api").unwrap());
    let by_user = key_fn(|req: &Request<Body>| {
        let user = req.headers().get("x-user")?.to_str().ok()?;
        Some(Key::new(format!("user:{user}")))
    });
    let ok = tower::service_fn(|_: Request<Body>| async {
        Ok::<_, Infallible>(Response::new(Body::from("ok")))
    });
    let app = BoxCloneService::new(RateLimitLayer::new(limiter).key(by_user).layer(ok));
    Instance { live, app }
}

impl Instance {
    async fn status(&self, user: &str) -> StatusCode {
        let req = Request::get("/")
            .header("x-user", user)
            .body(Body::empty())
            .unwrap();
        self.app.clone().oneshot(req).await.unwrap().status()
    }

    /// Waits (within [`PROPAGATION`]) until `user` is answered `status`.
    async fn until(&self, user: &str, status: StatusCode) {
        self.until_that(user, |got| got == status).await
    }

    /// Waits (within [`PROPAGATION`]) until `user`'s answer is one `ok`
    /// accepts.
    async fn until_that(&self, user: &str, ok: impl Fn(StatusCode) -> bool) {
        let start = Instant::now();
        loop {
            let got = self.status(user).await;
            if ok(got) {
                return;
            }
            assert!(start.elapsed() < PROPAGATION, "{user}: still {got}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

#[tokio::test]
async fn entries_are_the_fleets_and_taking_one_off_lifts_it_everywhere() {
    let server = RedisServer::start();
    let (a, b) = (instance(&server).await, instance(&server).await);

    a.live
        .deny(None, Key::new("user:mallory"), None)
        .await
        .unwrap();
    // The writer refuses at once; the other within a poll.
    assert_eq!(a.status("mallory").await, StatusCode::FORBIDDEN);
    b.until("mallory", StatusCode::FORBIDDEN).await;
    assert_eq!(b.status("alice").await, StatusCode::OK);
    assert_eq!(b.status("alice").await, StatusCode::TOO_MANY_REQUESTS);

    // An allow entry through b exempts on a from the 1/h policy, which
    // partner has spent.
    assert_eq!(a.status("partner").await, StatusCode::OK);
    assert_eq!(a.status("partner").await, StatusCode::TOO_MANY_REQUESTS);
    b.live
        .allow(Some("api"), Key::new("user:partner"), None)
        .await
        .unwrap();
    a.until("partner", StatusCode::OK).await;
    for _ in 0..3 {
        assert_eq!(a.status("partner").await, StatusCode::OK);
    }

    // An instance started later reads them with the policies.
    let c = instance(&server).await;
    assert_eq!(c.status("mallory").await, StatusCode::FORBIDDEN);
    assert_eq!(c.live.lists().len(), 2);

    b.live
        .unlist(List::Deny, None, Key::new("user:mallory"))
        .await
        .unwrap();
    // Limited as before again (b may have admitted a call before it saw
    // the entry: 200 or 429).
    for instance in [&a, &c] {
        instance
            .until_that("mallory", |got| got != StatusCode::FORBIDDEN)
            .await;
    }
}

#[tokio::test]
async fn ended_entries_are_pruned_and_hand_written_garbage_is_skipped() {
    let server = RedisServer::start();
    let (a, b) = (instance(&server).await, instance(&server).await);
    let table = "listed:{live}:deny";
    let mut redis = server.admin().await;

    let before = Instant::now();
    a.live
        .deny(
            None,
            Key::new("user:brief"),
            Some(Duration::from_millis(500)),
        )
        .await
        .unwrap();
    let first = a.status("brief").await;
    // Refused while it lasts (unless a loaded machine took that long).
    if before.elapsed() < Duration::from_millis(450) {
        assert_eq!(first, StatusCode::FORBIDDEN);
    }
    a.until("brief", StatusCode::OK).await;
    // The wall clock the end is kept by ticks in whole milliseconds.
    assert!(before.elapsed() >= Duration::from_millis(498));
    let fields: Vec<String> = redis.hkeys(table).await.unwrap();
    assert_eq!(fields, ["* k user:brief"]);

    // Garbage beside it, as a hand or a newer version might write it:
    // skipped, and left alone (a newer version may read it).
    let garbage = [
        ("* x what", "0"),
        ("api n 10.0.0.0/99", "0"),
        ("* k user:x", "soon"),
        ("* k user:far", "999999999999999"),
    ];
    let _: () = redis.hset_multiple(table, &garbage).await.unwrap();
    // Read as any change is (a hand's write bumps no version).
    b.live.refresh().await.unwrap();
    b.live
        .deny(
            Some("api"),
            "203.0.113.0/24".parse::<IpNet>().unwrap(),
            None,
        )
        .await
        .unwrap();
    let mut fields: Vec<String> = redis.hkeys(table).await.unwrap();
    fields.sort();
    let mut expected: Vec<&str> = garbage.iter().map(|(f, _)| *f).collect();
    expected.push("api n 203.0.113.0/24");
    expected.sort();
    assert_eq!(
        fields, expected,
        "the ended entry pruned, the unreadable kept"
    );
    assert_eq!(b.status("x").await, StatusCode::OK);
    assert_eq!(b.status("far").await, StatusCode::OK);
    a.live.refresh().await.unwrap();
    let lists = a.live.lists();
    assert_eq!(lists.len(), 1, "{lists:?}");
    assert_eq!(lists[0].listed.to_string(), "203.0.113.0/24");
    assert_eq!(lists[0].policy.as_deref(), Some("api"));
}

#[tokio::test]
async fn a_listed_request_costs_no_redis_call() {
    let server = RedisServer::start();
    // An instance never started, so that it never polls: every call
    // Redis runs meanwhile is a decision's.
    let quiet = quiet_instance(&server).await;
    quiet
        .live
        .deny(None, Key::new("user:mallory"), None)
        .await
        .unwrap();
    quiet
        .live
        .allow(None, Key::new("user:partner"), None)
        .await
        .unwrap();
    let mut admin = server.admin().await;
    let before = common::stats::script_calls(&mut admin).await;
    for _ in 0..10 {
        assert_eq!(quiet.status("mallory").await, StatusCode::FORBIDDEN);
        assert_eq!(quiet.status("partner").await, StatusCode::OK);
    }
    let listed = common::stats::script_calls(&mut admin).await;
    assert_eq!(listed, before, "listed requests called Redis");
    assert_eq!(quiet.status("alice").await, StatusCode::OK);
    assert!(
        common::stats::script_calls(&mut admin).await > listed,
        "a decision is counted"
    );
}
