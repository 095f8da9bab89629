//! The Redis store's leases: one sorted set per key and limit name, one
//! script per operation (of `lua/lease.lua`); acquires and releases that
//! find every script slot taken go together in one (see
//! [`batch`](super::batch)).

use std::time::{Duration, Instant};

use redis::Value;

use super::batch::{Entry, Job, LeaseJob};
use super::{Failure, RedisStore, TimeSource};
use crate::error::StoreError;
use crate::key::Key;
use crate::store::{LeaseCall, LeaseGrant, StoreFuture};
use crate::text::concat;

/// How much longer than its TTL a lease may count as held with the
/// caller's clock: the `slack_ms` of `lua/lease.lua`.
const CLIENT_CLOCK_SLACK: Duration = Duration::from_secs(60);

impl RedisStore {
    /// The Redis key of the sorted set that holds the concurrency leases of
    /// `key` under the limit `name`: `{prefix}:{name}:{{key}}:lease`
    /// (member = lease id, score = expiry in microseconds).
    pub fn lease_key(&self, name: &str, key: &Key) -> String {
        format!("{}:lease", self.key_base(name, key))
    }

    /// The wait marker of the lease set `set`, the second key of acquire
    /// and release: `<set>:w`, present while a refused caller waits (see
    /// `lua/lease.lua`); it shares the set's hash tag.
    pub(super) fn lease_marker(set: &str) -> String {
        concat(&[set, ":w"])
    }

    /// A script's ARGV[1]: now on the caller's clock, or "" to read
    /// the server's (see `clock` in lua/prelude.lua).
    pub(super) fn now_arg(&self) -> String {
        match &self.inner.time {
            TimeSource::Server => String::new(),
            TimeSource::Client(clock) => clock.now_micros().to_string(),
        }
    }

    pub(super) fn run_lease_acquire(&self, call: LeaseCall<'_>) -> StoreFuture<LeaseGrant> {
        let job = LeaseJob::Acquire {
            set: self.lease_key(call.name, call.key),
            capacity: call.capacity,
            ttl_us: call.ttl_us(),
            id: call.id.as_str().to_owned(),
            wait_ms: call.wait.map(wait_ms).unwrap_or_default(),
        };
        let store = self.clone();
        StoreFuture::pending(async move {
            let reply = store.lease_reply(job).await;
            reply
                .map_err(|failure| failure.error)
                .and_then(|reply| decode_grant(&reply))
                .inspect_err(|error| store.inner.scripts.lease_acquire.metrics.failed(error))
        })
    }

    /// A lease operation's reply: sent alone, by its own script, when the
    /// connection has a free script slot, else in the next batch of lease
    /// operations (see [`batch`](super::batch)). A failure is left for the
    /// caller to count.
    async fn lease_reply(&self, job: LeaseJob) -> Result<Value, Failure> {
        let permit = match &self.inner.batcher {
            Some(batcher) => match batcher.enter(self, || Job::Lease(job.clone())) {
                Entry::Send(permit) => Some(permit),
                Entry::Wait(answer) => {
                    return match self.queued(answer).await?.reply {
                        // The text of an error that failed this call alone
                        // (see `batch` in lua/lease.lua): as if sent alone.
                        Value::BulkString(text) => Err(Failure {
                            error: StoreError::Redis(String::from_utf8_lossy(&text).into_owned()),
                            transient: false,
                        }),
                        reply => Ok(reply),
                    };
                }
            },
            None => None,
        };
        let script = match job {
            LeaseJob::Acquire { .. } => &self.inner.scripts.lease_acquire,
            LeaseJob::Release { .. } => &self.inner.scripts.lease_release,
        };
        let mut call = script.call(2, 5);
        call.arg(job.set()).arg(Self::lease_marker(job.set()));
        match &job {
            LeaseJob::Acquire {
                capacity,
                ttl_us,
                id,
                wait_ms,
                ..
            } => call
                .arg(self.now_arg())
                .arg(capacity)
                .arg(ttl_us)
                .arg(id)
                .arg(wait_ms),
            LeaseJob::Release { id, undo, .. } => {
                call.arg(id).arg(self.inner.hub.channel());
                if *undo {
                    call.arg(self.now_arg()).arg(self.tombstone_ms());
                }
                &mut call
            }
        };
        let reply = self.try_exchange(script, call).await;
        drop(permit);
        reply
    }

    /// One call of `lua/lease.lua`'s batch running `jobs` in order.
    pub(super) fn lease_batch<'a>(
        &self,
        jobs: impl Iterator<Item = &'a LeaseJob> + Clone,
    ) -> redis::Cmd {
        let (mut keys, mut args) = (0, 2);
        for job in jobs.clone() {
            keys += 2;
            args += match job {
                LeaseJob::Acquire { .. } => 5,
                LeaseJob::Release { .. } => 3,
            };
        }
        let mut cmd = self.inner.scripts.leases.call(keys, args);
        for job in jobs.clone() {
            cmd.arg(job.set()).arg(Self::lease_marker(job.set()));
        }
        cmd.arg(self.now_arg()).arg(self.inner.hub.channel());
        for job in jobs {
            match job {
                LeaseJob::Acquire {
                    capacity,
                    ttl_us,
                    id,
                    wait_ms,
                    ..
                } => cmd.arg("a").arg(capacity).arg(ttl_us).arg(id).arg(wait_ms),
                LeaseJob::Release { id, undo, .. } if *undo => {
                    cmd.arg("r").arg(id).arg(self.tombstone_ms())
                }
                LeaseJob::Release { id, .. } => cmd.arg("r").arg(id).arg(""),
            };
        }
        cmd
    }

    /// One attempt, and if that fails on the way (a reset connection, a
    /// timeout), retries until the release reaches Redis or the lease has
    /// expired anyway (see [`release`](super::release)). The future
    /// resolves when the release has landed or been given up on.
    pub(super) fn run_lease_release(&self, call: LeaseCall<'_>) -> StoreFuture<bool> {
        let key = self.lease_key(call.name, call.key);
        let id = call.id.as_str().to_owned();
        let undo = call.undo;
        let expired_at = Instant::now() + self.release_deadline(call.ttl);
        let store = self.clone();
        StoreFuture::pending(async move {
            match store.release_once(&key, &id, undo).await {
                Ok(held) => Ok(held),
                Err(failure) => {
                    store.count_release_failure(&failure.error);
                    if failure.transient {
                        store
                            .retry_release(key, id, undo, expired_at, failure.error)
                            .await
                    } else {
                        Err(failure.error)
                    }
                }
            }
        })
    }

    /// How long the tombstone of a release that found no lease lasts, in
    /// milliseconds (see `lua/lease.lua`): an acquire that the release
    /// overtook is sent again, if at all, within the store's timeout of its
    /// first sending, which came before the release; twice that, and at
    /// least a second, leaves room for a loaded machine.
    pub(super) fn tombstone_ms(&self) -> u128 {
        self.inner
            .timeout
            .saturating_mul(2)
            .max(Duration::from_secs(1))
            .as_millis()
    }

    /// How long from now a lease of `ttl` may still hold its slot, by this
    /// process's clock: retrying its release past that frees nothing. The
    /// lease was last acquired or renewed before now, for at most `ttl`
    /// from when Redis ran that script, which may be up to the store's
    /// timeout later still (a renewal in flight). With the caller's clock,
    /// the scripts keep the set longer than its leases (their
    /// `slack_ms`), so a clock that lags Redis' may still count the lease
    /// as held that much longer.
    fn release_deadline(&self, ttl: Duration) -> Duration {
        let slack = match self.inner.time {
            TimeSource::Server => Duration::ZERO,
            TimeSource::Client(_) => CLIENT_CLOCK_SLACK,
        };
        ttl.saturating_add(self.inner.timeout).saturating_add(slack)
    }

    /// Counts a release that failed, in the metrics of its script.
    pub(super) fn count_release_failure(&self, error: &StoreError) {
        self.inner.scripts.lease_release.metrics.failed(error);
    }

    /// Removes lease `id` from the set `key`: `true` if it was held. A
    /// failure is left for the caller to count.
    /// A release that frees a slot of a set a refused caller waits for is
    /// announced on the store's channel ([`wake`](super::wake)).
    pub(super) async fn release_once(
        &self,
        key: &str,
        id: &str,
        undo: bool,
    ) -> Result<bool, Failure> {
        let job = LeaseJob::Release {
            set: key.to_owned(),
            id: id.to_owned(),
            undo,
        };
        let reply = self.lease_reply(job).await?;
        decode_flag(&reply).map_err(|error| Failure {
            error,
            transient: false,
        })
    }

    pub(super) fn run_lease_renew(&self, call: LeaseCall<'_>) -> StoreFuture<bool> {
        let keys = [self.lease_key(call.name, call.key)];
        let args = [
            self.now_arg(),
            call.ttl_us().to_string(),
            call.id.as_str().to_owned(),
        ];
        let store = self.clone();
        StoreFuture::pending(async move {
            let reply = store
                .eval(&store.inner.scripts.lease_renew, &keys, &args)
                .await?;
            decode_flag(&reply)
        })
    }
}

/// The longest a refused caller's mark lasts, in milliseconds: longer
/// waits are marked this long (about 35 years), far from what `SET ... PX`
/// refuses (an expiry past `i64::MAX` ms) and exact in Lua's doubles.
const MAX_WAIT_MS: u64 = 1 << 40;

/// A wait as `lua/lease.lua`'s acquire takes it: whole milliseconds,
/// rounded up (a wait of 1 µs still marks the set), at most
/// [`MAX_WAIT_MS`].
fn wait_ms(wait: Duration) -> String {
    let ms = wait.as_nanos().div_ceil(1_000_000);
    u64::try_from(ms)
        .unwrap_or(u64::MAX)
        .min(MAX_WAIT_MS)
        .to_string()
}

fn decode_grant(reply: &Value) -> Result<LeaseGrant, StoreError> {
    let unexpected = || StoreError::UnexpectedReply(format!("{reply:?}"));
    let Value::Array(items) = reply else {
        return Err(unexpected());
    };
    let [Value::Int(acquired), Value::Int(held), Value::Int(wait)] = items.as_slice() else {
        return Err(unexpected());
    };
    let (Ok(held), Ok(wait)) = (u64::try_from(*held), u64::try_from(*wait)) else {
        return Err(unexpected());
    };
    match acquired {
        1 if held > 0 => Ok(LeaseGrant {
            acquired: true,
            in_flight: held,
            oldest_expires_in: None,
        }),
        0 => Ok(LeaseGrant {
            acquired: false,
            in_flight: held,
            oldest_expires_in: Some(Duration::from_micros(wait)),
        }),
        _ => Err(unexpected()),
    }
}

fn decode_flag(reply: &Value) -> Result<bool, StoreError> {
    match reply {
        Value::Int(0) => Ok(false),
        Value::Int(1) => Ok(true),
        _ => Err(StoreError::UnexpectedReply(format!("{reply:?}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::LeaseId;

    #[test]
    fn odd_lease_replies_are_errors() {
        for reply in [
            Value::Nil,
            Value::Int(1),
            Value::Array(vec![]),
            Value::Array(vec![Value::Int(1), Value::Int(1)]),
            Value::Array(vec![Value::Int(2), Value::Int(1), Value::Int(0)]),
            Value::Array(vec![Value::Int(1), Value::Int(0), Value::Int(0)]),
            Value::Array(vec![Value::Int(0), Value::Int(-1), Value::Int(0)]),
            Value::Array(vec![Value::Int(0), Value::Int(1), Value::Int(-5)]),
            Value::Array(vec![Value::Int(1), Value::Nil, Value::Int(0)]),
        ] {
            assert!(decode_grant(&reply).is_err(), "{reply:?}");
        }
        let denied = decode_grant(&Value::Array(vec![
            Value::Int(0),
            Value::Int(2),
            Value::Int(1500),
        ]))
        .unwrap();
        assert!(!denied.is_acquired());
        assert_eq!(denied.in_flight(), 2);
        assert_eq!(
            denied.oldest_expires_in(),
            Some(Duration::from_micros(1500))
        );
        for reply in [Value::Nil, Value::Int(2), Value::Int(-1), Value::Okay] {
            assert!(decode_flag(&reply).is_err(), "{reply:?}");
        }
        assert!(decode_flag(&Value::Int(1)).unwrap());
    }

    #[test]
    fn a_wait_is_marked_in_whole_milliseconds_rounded_up() {
        assert_eq!(wait_ms(Duration::ZERO), "0");
        assert_eq!(wait_ms(Duration::from_nanos(1)), "1");
        assert_eq!(wait_ms(Duration::from_micros(1500)), "2");
        assert_eq!(wait_ms(Duration::from_secs(3)), "3000");
        assert_eq!(wait_ms(Duration::MAX), MAX_WAIT_MS.to_string());
    }

    #[test]
    fn the_client_clock_slack_is_the_scripts_own() {
        let slack = format!("slack_ms = {}", CLIENT_CLOCK_SLACK.as_millis());
        let scripts = super::super::scripts::Scripts::new();
        for script in [
            &scripts.lease_acquire,
            &scripts.lease_renew,
            &scripts.lease_release,
            &scripts.leases,
        ] {
            assert!(script.source.contains(&slack), "{}", script.name);
        }
    }

    /// A release that reaches Redis before the acquire it undoes (the
    /// acquire sent again after `SCRIPT LOAD`, say) leaves a tombstone: the
    /// late acquire takes nothing, and the set counts no lease. Past the
    /// tombstone's life, on the caller's clock, the id may be taken again;
    /// the tombstone itself is trimmed by the next acquire.
    #[tokio::test]
    async fn a_release_that_overtakes_its_acquire_leaves_it_nothing() {
        let server = super::super::test_server::RedisServer::start();
        let clock = crate::clock::ManualClock::new(Duration::from_secs(1_700_000_000));
        let store = RedisStore::builder(server.url())
            .timeout(Duration::from_secs(2))
            .time_source(TimeSource::Client(std::sync::Arc::new(clock.clone())))
            .connect()
            .await
            .unwrap();
        let key = Key::new("k");
        let (late, other) = (LeaseId::generate(), LeaseId::generate());
        let call = |id| LeaseCall {
            name: "slots",
            key: &key,
            id,
            capacity: 1,
            ttl: Duration::from_secs(60),
            wait: None,
            undo: true,
        };
        let set = store.lease_key("slots", &key);
        let mut admin = server.admin().await;
        let mut members = async || -> Vec<String> {
            redis::cmd("ZRANGE")
                .arg(&set)
                .arg(0)
                .arg(-1)
                .query_async(&mut admin)
                .await
                .unwrap()
        };
        // With the caller's clock a tombstone lasts the scripts' slack
        // longer.
        let past_tombstones = || {
            let life = u64::try_from(store.tombstone_ms()).unwrap();
            clock.advance(CLIENT_CLOCK_SLACK + Duration::from_millis(life + 1));
        };
        let acquired = async |id| {
            let grant = store.run_lease_acquire(call(id)).await.unwrap();
            grant.is_acquired()
        };
        assert!(!store.run_lease_release(call(&late)).await.unwrap());
        assert!(!acquired(&late).await);
        assert_eq!(members().await, Vec::<String>::new());
        // A release that finds nothing: a tombstone, trimmed by the next
        // acquire once past.
        assert!(!store.run_lease_release(call(&late)).await.unwrap());
        past_tombstones();
        assert!(acquired(&other).await);
        assert_eq!(members().await, [other.as_str()]);
        assert!(store.run_lease_release(call(&other)).await.unwrap());
        // A tombstone past no longer refuses its id.
        assert!(!store.run_lease_release(call(&late)).await.unwrap());
        past_tombstones();
        assert!(acquired(&late).await);
    }

    /// A release is retried as long as its lease may still hold its slot:
    /// past its TTL by the store's timeout (a renewal in flight), and with
    /// the caller's clock by the scripts' slack too.
    #[tokio::test]
    async fn a_release_is_retried_while_its_lease_may_hold() {
        let (timeout, ttl) = (Duration::from_millis(300), Duration::from_secs(10));
        let server_clock = RedisStore::builder("redis://127.0.0.1:1")
            .timeout(timeout)
            .lazy()
            .connect()
            .await
            .unwrap();
        assert!(server_clock.release_deadline(ttl) >= ttl + timeout);
        let client_clock = RedisStore::builder("redis://127.0.0.1:1")
            .timeout(timeout)
            .time_source(TimeSource::system_clock())
            .lazy()
            .connect()
            .await
            .unwrap();
        assert!(client_clock.release_deadline(ttl) >= ttl + timeout + CLIENT_CLOCK_SLACK);
    }
}
