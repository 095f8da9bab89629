use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use redis::{Arg, Cmd, ErrorKind, ServerErrorKind, ToRedisArgs, Value};

mod batch;
mod builder;
mod connection;
mod deny_cache;
mod lease;
pub(crate) mod live;
mod owed;
mod prune;
mod release;
mod run;
mod scripts;
#[cfg(feature = "sentinel")]
mod sentinel;
mod topology;
mod wake;

/// The tests' throwaway `redis-server`, shared with tests/common.
#[cfg(test)]
#[allow(unreachable_pub)]
#[path = "../../../tests/common/redis_server.rs"]
mod test_server;

pub use self::builder::RedisStoreBuilder;
use self::connection::{Conn, Refusals};
pub(crate) use self::deny_cache::DenyCache;
pub use self::deny_cache::DenyCacheStats;
use self::deny_cache::RealClock;
pub use self::topology::Topology;

use super::{
    Answer, BudgetCall, BudgetTake, Call, LeaseAnswer, LeaseCall, LeaseOp, ReleaseWatch, Store,
    StoreFuture, StoreOps,
};
use crate::algorithm::Algorithm;
use crate::clock::{Clock, SystemClock};
use crate::decision::Decision;
use crate::error::{ConfigError, StoreError};
use crate::key::Key;
use crate::metrics::ScriptMetrics;
use crate::policy::{Limit, Policy, check_name};
use crate::text::concat;

/// A Lua script run by SHA, with its source kept for the `NOSCRIPT` fallback
/// and its name for metrics.
#[derive(Debug)]
pub(crate) struct LuaScript {
    name: &'static str,
    source: &'static str,
    sha: &'static str,
    metrics: ScriptMetrics,
    /// How many times loading this script (`SCRIPT LOAD`) was tried,
    /// doubled, plus one if the last attempt failed: read as each call is
    /// sent, so that a call that finds the script missing knows whether
    /// some other call has tried to load it since.
    loads: AtomicU64,
    /// Held by the call that loads the script; the calls that found it
    /// missing meanwhile wait for that outcome instead of repeating it.
    loading: tokio::sync::Mutex<()>,
}

impl LuaScript {
    /// The script `source`, whose SHA-1 is `sha`, with load counts and
    /// metrics of its own; call at store construction. `name` is the `op`
    /// label of its metrics (`gcra`, `lease_acquire`, ...).
    pub(crate) fn new(name: &'static str, source: &'static str, sha: &'static str) -> Self {
        LuaScript {
            name,
            source,
            sha,
            metrics: ScriptMetrics::new(name),
            loads: AtomicU64::new(0),
            loading: tokio::sync::Mutex::new(()),
        }
    }

    /// The load attempts so far, for [`load`](Self::load).
    fn loads(&self) -> u64 {
        self.loads.load(Ordering::Acquire)
    }

    /// Loads the script after a call sent when [`loads`](Self::loads) was
    /// `seen` found it missing, unless another call has tried since: many
    /// calls in flight find it missing together, and one `SCRIPT LOAD`
    /// serves them all. Whether the script is now loaded: if not (loading
    /// failed, here or in the call that tried since), the call carries the
    /// script's source instead.
    async fn load(&self, conn: &mut Conn, seen: u64) -> bool {
        let _loading = self.loading.lock().await;
        let loads = self.loads();
        if loads != seen {
            return loads & 1 == 0;
        }
        tracing::debug!(script = self.name, "script cache empty, loading the script");
        let result: redis::RedisResult<Value> = redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(self.source)
            .query_async(conn)
            .await;
        if let Err(err) = &result {
            // Not an error of the call's own: it goes on with the source.
            tracing::debug!(
                script = self.name,
                error = %err,
                "loading the script failed; sending its source instead"
            );
        }
        let failed = u64::from(result.is_err());
        self.loads
            .store((seen & !1) + 2 + failed, Ordering::Release);
        result.is_ok()
    }

    /// `EVALSHA <sha> <keys> <args>`.
    fn command<T: ToRedisArgs>(&self, keys: &[T], args: &[T]) -> Cmd {
        let mut cmd = self.call(keys.len(), args.len());
        cmd.arg(keys).arg(args);
        cmd
    }

    /// `EVALSHA <sha> <keys>`, for the caller to add the keys and then the
    /// arguments, numbers written straight into the command.
    fn call(&self, keys: usize, args: usize) -> Cmd {
        let mut cmd = Cmd::with_capacity(3 + keys + args, 64 + 48 * keys + 12 * args);
        cmd.arg("EVALSHA").arg(self.sha).arg(keys);
        cmd
    }

    /// The same call with the whole script (`EVAL`, which also caches it),
    /// for a server that has lost it again, or refused to load it.
    fn with_source(&self, call: &Cmd) -> Cmd {
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(self.source);
        // Past `EVALSHA <sha>`: the key count, the keys, the arguments.
        for arg in call.args_iter().skip(2) {
            if let Arg::Simple(bytes) = arg {
                cmd.arg(bytes);
            }
        }
        cmd
    }
}

/// Where the Redis scripts read "now".
///
/// Available with the `redis` feature (on by default).
#[derive(Clone, Debug, Default)]
pub enum TimeSource {
    /// `redis.call('TIME')` inside the script: every instance agrees,
    /// whatever their own clocks say. The default.
    #[default]
    Server,
    /// The caller's clock, passed to the script: for hosted Redis services
    /// that refuse `TIME` in scripts. Instances then agree only as far as
    /// their clocks do ([`TimeSource::system_clock`] is wall-clock time).
    ///
    /// The clock must run in real time, and near the other instances'
    /// clocks: key expiries still run on Redis' own clock. So that a clock
    /// that falls somewhat behind (another instance's lags this one's, a
    /// process stalls, a test's clock stands still between steps) never
    /// finds its state expired while it still matters, every key then lives
    /// one minute longer than with the server's clock, which costs Redis
    /// memory for that minute. A clock that falls further behind Redis'
    /// than that, between two calls on one identity, may find the state
    /// gone and admit as if the identity were new: more than the limit, for
    /// that identity, once.
    ///
    /// Decisions are as exact as the clocks agree, not more. A clock that
    /// runs ahead sees windows end and TATs pass earlier than the others
    /// do, so over any span of real time the fleet admits up to what the
    /// limit allows over that span stretched by the clocks' spread. The
    /// window scripts keep it to that: a fixed window's stored start never
    /// moves back (a caller whose clock still reads an earlier window is
    /// decided in the stored one, its reset and retry running to that
    /// window's end on its own clock), and the sliding log trims entries
    /// only once they have left every window by the minute of slack (a log
    /// then holds that minute's entries too), so an entry a clock ahead no
    /// longer counts still counts for one that lags.
    /// The deny cache is then conservative rather than exact: it may deny
    /// until a retry time that a clock ahead has already made moot.
    Client(Arc<dyn Clock>),
}

impl TimeSource {
    /// The caller's wall clock: Unix time from the operating system.
    pub fn system_clock() -> Self {
        TimeSource::Client(Arc::new(SystemClock))
    }
}

/// Limiter state in Redis, shared by every instance that points at the same
/// server: one Lua script and one round trip per decision, at most; under
/// load, checks made together while the connection's script slots are busy
/// share one script ([`RedisStoreBuilder::max_in_flight`]).
///
/// Keys look like `{prefix}:{policy}:{{tag}}`, the tag being the identity
/// hashed; the braces are a Redis Cluster hash tag, so all keys of one
/// identity live in one slot and a multi-limit script touches a single
/// node. Each key expires once its limit has refilled, so idle identities
/// cost nothing (`docs/operating.md`, "Redis keys and versions").
///
/// Scripts are sent by SHA (`EVALSHA`); when Redis answers `NOSCRIPT` (at
/// the first calls, after a restart or `SCRIPT FLUSH`) the script is loaded
/// once (`SCRIPT LOAD`, shared by every call that found it missing
/// meanwhile) and the call sent again; if loading fails (a user without
/// the `SCRIPT` command), those calls carry the script's source (`EVAL`),
/// which the server caches too. On a cluster a missing script always goes
/// with its source, to the node that owns the key. Every call is bounded
/// by the store's timeout (default 50 ms); what the layers do on timeout
/// is their
/// [`FailurePolicy`](crate::FailurePolicy). While Redis refuses connections
/// (down, restarting) calls fail at once rather than wait out the timeout;
/// one call every 100 ms tries again, which reconnects in the background.
/// Denials are remembered, so a client over its limit is refused locally
/// until its retry time passes ([`RedisStoreBuilder::deny_cache`]). With
/// the `cluster` feature the same store runs on a Redis Cluster
/// (`Topology::cluster`); with the `sentinel` feature, on the master that
/// Redis Sentinel names, followed through failovers (`Topology::sentinel`).
///
/// Callers waiting in a concurrency limit's queue
/// ([`ConcurrencyLimiter::queue`](crate::concurrency::ConcurrencyLimiter::queue))
/// hear of the releases other instances make through Redis pub/sub: a
/// refused acquire that waits marks its lease set (`<lease key>:w`, for as
/// long as it waits), and a release of a marked set is published on
/// `{prefix}:released`. From the first such wait on, the store keeps one
/// more connection, subscribed to that channel: to the server, one of a
/// cluster's nodes, or the master it follows through Sentinel. It speaks
/// RESP3 (Redis 6 or later), and is checked with a `PING` every 5 s. An ACL
/// user needs that channel (`&{prefix}:released`) to subscribe and publish;
/// without it, or while the subscriber reconnects, waiters hear only their
/// own process's releases (and try again when the oldest lease expires).
///
/// Available with the `redis` feature (on by default).
///
/// ```no_run
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use fleetgate::RedisStore;
/// use std::time::Duration;
///
/// let store = RedisStore::builder("redis://127.0.0.1:6379")
///     .prefix("myapp")
///     .timeout(Duration::from_millis(20))
///     .connect()
///     .await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct RedisStore {
    inner: Arc<Inner>,
}

struct Inner {
    conn: Conn,
    prefix: Box<str>,
    timeout: Duration,
    time: TimeSource,
    /// Every script, hashed once per store.
    scripts: scripts::Scripts,
    /// `None` on a cluster, where calls of different slots cannot share a
    /// script.
    batcher: Option<batch::Batcher>,
    deny: Option<DenyCache>,
    /// Releases that failed on the way, being retried.
    releases: release::Retries,
    /// Charges that did not land, sent again before their keys' next
    /// peek or charge.
    owed: Arc<owed::Owed>,
    /// Whether the server refused the connection lately; `None` on a
    /// cluster, and on Sentinel, whose connection never reconnects by
    /// itself (a dropped one fails calls at once until a lookup replaces
    /// it).
    refusals: Option<Refusals>,
    /// The subscriber to the releases other instances announce, and the
    /// watches it tells.
    hub: wake::Hub,
}

impl RedisStore {
    /// Connects to `topology` (a URL, or any [`Topology`]) with the
    /// default settings, at once: exactly
    /// `RedisStore::builder(topology).connect().await`.
    pub async fn connect(topology: impl Into<Topology>) -> Result<Self, StoreError> {
        RedisStore::builder(topology).connect().await
    }

    /// Configures a store on `topology`: a URL (`"redis://host:port"`), or
    /// any [`Topology`] (a client built by hand, a Redis Cluster's nodes,
    /// Redis Sentinel). Connect it with
    /// [`RedisStoreBuilder::connect`], at once or, after
    /// [`lazy`](RedisStoreBuilder::lazy), on first use.
    pub fn builder(topology: impl Into<Topology>) -> RedisStoreBuilder {
        RedisStoreBuilder::new(topology.into())
    }

    /// The key prefix.
    pub fn prefix(&self) -> &str {
        &self.inner.prefix
    }

    /// The timeout of every call.
    pub fn timeout(&self) -> Duration {
        self.inner.timeout
    }

    /// The Redis key that holds the GCRA state of limit number `limit` of
    /// `policy` for `key`: `{prefix}:{policy}:{{tag}}` for the first limit,
    /// `{prefix}:{policy}:{{tag}}:{limit}` for the others, where `tag` is
    /// the identity hashed: 12 characters of its SHA-256, the same on
    /// every instance.
    pub fn gcra_key(&self, policy: &Policy, key: &Key, limit: usize) -> String {
        limit_key(&self.key_base(policy.name(), key), limit)
    }

    /// The [`gcra_key`](Self::gcra_key) of every limit of `policy`, in
    /// order, from one [`key_base`](Self::key_base): the key's text
    /// (written out for an IP key) and hash tag are made once for them all.
    pub(crate) fn gcra_keys(&self, policy: &Policy, key: &Key) -> impl Iterator<Item = String> {
        let base = self.key_base(policy.name(), key);
        (0..policy.limits().len()).map(move |limit| limit_key(&base, limit))
    }

    /// `{prefix}:{name}:{{tag}}`, the start of every Redis key that one
    /// identity uses under one policy name, where `tag` is the identity
    /// hashed ([`identity_tag`]): Redis never holds the identity itself, and
    /// every key is short. The tag is the cluster hash tag, so all of an
    /// identity's keys share a slot.
    pub(crate) fn key_base(&self, name: &str, key: &Key) -> String {
        let tag = identity_tag(&key.text());
        concat(&[&self.inner.prefix, ":", name, ":{", &tag, "}"])
    }

    /// Answers from the deny cache, or, when the returned future is first
    /// polled, sends the call alone if the connection has a free script
    /// slot, or queues it for the next batch (see [`batch`]).
    fn run_gcra(&self, call: Call<'_>) -> StoreFuture<Decision> {
        if let Some(cache) = &self.inner.deny
            && let Some(denied) = cache.lookup(call.policy, call.key, call.cost, call.max_wait())
        {
            return StoreFuture::ready(Ok(denied));
        }
        let (policy, key) = (call.policy.clone(), call.key.clone());
        let (cost, max_wait_us) = (call.cost, call.max_wait_us());
        let store = self.clone();
        StoreFuture::pending(async move {
            let (reply, sent_at) = store
                .check_reply(Algorithm::Gcra, &policy, &key, cost, max_wait_us)
                .await?;
            store.decided(&reply, &policy, &key, cost, sent_at)
        })
    }

    /// The check script of `algorithm`: GCRA's or a window algorithm's.
    fn check_script(&self, algorithm: Algorithm) -> &LuaScript {
        &self.inner.scripts.of(algorithm).check
    }

    /// One call of `algorithm`'s check script deciding `calls` (policy,
    /// identity, cost, longest wait in µs) in order, with the instant it is
    /// sent ([`RedisStore::sent_at`]).
    fn check_call<'a, I>(&self, algorithm: Algorithm, calls: I) -> (Cmd, Option<u64>)
    where
        I: Iterator<Item = (&'a Policy, &'a Key, u64, u64)> + Clone,
    {
        self.decide_call(self.check_script(algorithm), algorithm, calls)
    }

    /// [`check_call`](Self::check_call) of `script`: the check's, or the
    /// peek's, whose arguments are those of a check of one call.
    pub(super) fn decide_call<'a, I>(
        &self,
        script: &LuaScript,
        algorithm: Algorithm,
        calls: I,
    ) -> (Cmd, Option<u64>)
    where
        I: Iterator<Item = (&'a Policy, &'a Key, u64, u64)> + Clone,
    {
        if algorithm.is_window() {
            self.window_script(
                script,
                calls.map(|(policy, key, cost, _)| (policy, key, cost)),
            )
        } else {
            self.gcra_script(script, calls)
        }
    }

    /// The key of `key`'s penalty box under `policy` (see
    /// `algorithm::block`): `{key_base}:block`.
    pub(crate) fn box_key(&self, name: &str, key: &Key) -> String {
        concat(&[&self.key_base(name, key), ":block"])
    }

    /// One check's reply, undecoded, and the instant it was sent: sent
    /// alone when the connection has a free script slot, else in the next
    /// batch of `algorithm`'s calls (see [`batch`]).
    async fn check_reply(
        &self,
        algorithm: Algorithm,
        policy: &Policy,
        key: &Key,
        cost: u64,
        max_wait_us: u64,
    ) -> Result<(Value, Option<u64>), StoreError> {
        let script = self.check_script(algorithm);
        let permit = match &self.inner.batcher {
            Some(batcher) => {
                let job = || batch::Job::Check {
                    algorithm,
                    policy: policy.clone(),
                    key: key.clone(),
                    cost,
                    max_wait_us,
                };
                match batcher.enter(self, job) {
                    batch::Entry::Send(permit) => Some(permit),
                    batch::Entry::Wait(answer) => {
                        let answer = self.queued(answer).await.map_err(|failure| {
                            script.metrics.failed(&failure.error);
                            failure.error
                        })?;
                        return Ok((answer.reply, answer.sent_at));
                    }
                }
            }
            None => None,
        };
        let (cmd, sent_at) =
            self.check_call(algorithm, std::iter::once((policy, key, cost, max_wait_us)));
        let reply = self.run(script, cmd).await;
        drop(permit);
        Ok((one_reply(algorithm, reply?)?, sent_at))
    }

    /// A queued call's answer, within the store's timeout counted from the
    /// moment it was queued. A failure is left for the caller to count.
    async fn queued(
        &self,
        answer: tokio::sync::oneshot::Receiver<Result<batch::Answer, Failure>>,
    ) -> Result<batch::Answer, Failure> {
        let timeout = self.inner.timeout;
        let error = match tokio::time::timeout(timeout, answer).await {
            Ok(Ok(answer)) => return answer,
            Ok(Err(_)) => StoreError::Redis("the batch carrying this call was dropped".into()),
            Err(_) => StoreError::Timeout(timeout),
        };
        Err(Failure {
            error,
            transient: true,
        })
    }

    /// Decodes one call's reply (counting it when it failed the call) and
    /// remembers a denial.
    fn decided(
        &self,
        reply: &Value,
        policy: &Policy,
        key: &Key,
        cost: u64,
        sent_at: Option<u64>,
    ) -> Result<Decision, StoreError> {
        let decision = decode_gcra(reply, policy.limits().len())
            .inspect_err(|err| self.check_script(Algorithm::Gcra).metrics.failed(err))?;
        if let (Some(cache), Some(sent_at)) = (&self.inner.deny, sent_at) {
            cache.record(policy, key, cost, sent_at, &decision);
        }
        Ok(decision)
    }

    /// The instant a script is sent, as the deny cache counts time: its own
    /// clock with the server's time, or the caller's clock, whose reading
    /// is also the script's "now" ([`RedisStore::gcra_script`]). `None`
    /// without a deny cache and with the server's time.
    fn sent_at(&self) -> Option<u64> {
        match &self.inner.time {
            TimeSource::Server => self.inner.deny.as_ref().map(|c| c.now()),
            TimeSource::Client(clock) => Some(clock.now_micros()),
        }
    }

    /// One script that decides `calls` (policy, identity, cost, longest
    /// wait in µs) in order: alone, or queued ones together. Returns it
    /// with the instant it is sent ([`RedisStore::sent_at`]).
    fn gcra_script<'a, I>(&self, script: &LuaScript, calls: I) -> (Cmd, Option<u64>)
    where
        I: Iterator<Item = (&'a Policy, &'a Key, u64, u64)> + Clone,
    {
        // Each distinct set of limits once, and each call's place in them:
        // calls of one policy travel together far more often than not.
        let mut sets: Vec<&[Limit]> = Vec::new();
        let mut set_of: Vec<usize> = Vec::new();
        let mut keys = 0;
        for (policy, ..) in calls.clone() {
            let limits = policy.limits();
            keys += limits.len() + usize::from(policy.blocks());
            let set = match sets.iter().position(|s| *s == limits) {
                Some(set) => set,
                None => {
                    sets.push(limits);
                    sets.len() - 1
                }
            };
            set_of.push(set + 1);
        }
        let boxed = |limits: &[Limit]| limits.iter().any(|l| l.block_us() > 0);
        let set_args: usize = sets
            .iter()
            .map(|s| 1 + if boxed(s) { 3 } else { 2 } * s.len())
            .sum();
        let mut cmd = script.call(keys, 2 + set_args + 3 * set_of.len());
        // Each call's keys, one per limit; a call that shares one with
        // another call of the script is marked (its set negated), so that
        // the script reads and writes such keys once and keeps no table of
        // the others (lua/gcra.lua).
        let names: Vec<Vec<String>> = calls
            .clone()
            .map(|(policy, key, ..)| {
                let mut names: Vec<String> = self.gcra_keys(policy, key).collect();
                if policy.blocks() {
                    names.push(self.box_key(policy.name(), key));
                }
                names
            })
            .collect();
        let shared = shared_calls(&names);
        for name in names.into_iter().flatten() {
            cmd.arg(name);
        }
        // "Now": empty for the server's clock; with the caller's, `sent_at`.
        let sent_at = self.sent_at();
        match (&self.inner.time, sent_at) {
            (TimeSource::Client(_), Some(now)) => cmd.arg(now),
            _ => cmd.arg(""),
        };
        // Each set: its number of limits (negated with a penalty box), then
        // each one's emission interval and tolerance, then each one's block.
        cmd.arg(sets.len());
        for limits in sets {
            let n = i64::try_from(limits.len()).unwrap_or(i64::MAX);
            cmd.arg(if boxed(limits) { -n } else { n });
            for limit in limits {
                cmd.arg(limit.emission_us()).arg(limit.tolerance_us());
            }
            if boxed(limits) {
                for limit in limits {
                    cmd.arg(limit.block_us());
                }
            }
        }
        // Each call: its set, cost and longest wait.
        for (((_, _, cost, max_wait_us), set), shared) in calls.zip(set_of).zip(shared) {
            let set = i64::try_from(set).unwrap_or(i64::MAX);
            cmd.arg(if shared { -set } else { set })
                .arg(cost)
                .arg(max_wait_us);
        }
        (cmd, sent_at)
    }

    /// `EVALSHA`, loading the script when the server has lost it (see
    /// [`LuaScript::load`]); the whole exchange is bounded by the timeout.
    pub(crate) async fn eval(
        &self,
        script: &LuaScript,
        keys: &[String],
        args: &[String],
    ) -> Result<Value, StoreError> {
        self.run(script, script.command(keys, args)).await
    }

    /// Sends `call`, built by [`LuaScript::call`], as [`RedisStore::eval`]
    /// does.
    async fn run(&self, script: &LuaScript, call: Cmd) -> Result<Value, StoreError> {
        let result = self.exchange(script, call).await;
        if let Err(err) = &result {
            script.metrics.failed(err);
        }
        result
    }

    /// [`run`](Self::run), timed but with a failure left for the caller to
    /// count: a batch counts one failure per call still waiting for it.
    async fn exchange(&self, script: &LuaScript, call: Cmd) -> Result<Value, StoreError> {
        self.try_exchange(script, call).await.map_err(|f| f.error)
    }

    /// [`exchange`](Self::exchange), telling a failure that sending the
    /// call again may cure from one it cannot.
    async fn try_exchange(&self, script: &LuaScript, call: Cmd) -> Result<Value, Failure> {
        let gate = match &self.inner.refusals {
            Some(refusals) => match refusals.admit(refusals.now()) {
                Some(admitted) => Some((refusals, admitted)),
                None => {
                    return Err(Failure {
                        error: StoreError::Redis(
                            "Redis refused the connection; reconnecting in the background".into(),
                        ),
                        transient: true,
                    });
                }
            },
            None => None,
        };
        // On a cluster `SCRIPT LOAD` would go to every node, and one node
        // failing would fail it for all: `EVAL` goes to the key's owner.
        let shared_load = self.inner.conn.one_server();
        let mut conn = self.inner.conn.clone();
        let exchange = async {
            let seen = script.loads();
            match call.query_async::<Value>(&mut conn).await {
                Err(err) if is_noscript(&err) => {
                    // The script's source once per server, not once per
                    // call in flight; if loading fails, or the script is
                    // gone again at once, the source goes with this call.
                    if shared_load && script.load(&mut conn, seen).await {
                        match call.query_async::<Value>(&mut conn).await {
                            Err(err) if is_noscript(&err) => {}
                            other => return other,
                        }
                    }
                    script
                        .with_source(&call)
                        .query_async::<Value>(&mut conn)
                        .await
                }
                other => other,
            }
        };
        let started = std::time::Instant::now();
        let timed_out = || Failure {
            error: StoreError::Timeout(self.inner.timeout),
            transient: true,
        };
        let result = match tokio::time::timeout(self.inner.timeout, exchange).await {
            Ok(result) => {
                if let Some((refusals, admitted)) = gate {
                    refusals.observe(admitted, &result, refusals.now());
                }
                if let Err(err) = &result {
                    self.inner.conn.failed(Some(err));
                }
                match result {
                    Ok(reply) => Ok(reply),
                    // A timeout reported by the client (the cluster
                    // client's, set to the store's own).
                    Err(err) if err.is_timeout() => Err(timed_out()),
                    Err(err) => Err(Failure {
                        transient: is_transient(&err),
                        error: err.into(),
                    }),
                }
            }
            Err(_) => {
                self.inner.conn.failed(None);
                Err(timed_out())
            }
        };
        script.metrics.timed(started.elapsed());
        result
    }
}

/// A failed call, and whether the same call sent again may succeed.
#[derive(Debug, Clone)]
pub(super) struct Failure {
    pub(super) error: StoreError,
    /// The connection failed, or the server could not run the call for now
    /// (loading its data, busy with a script, a failover); not the call
    /// itself (no permission, a key of another type, a script error).
    pub(super) transient: bool,
}

/// Whether the same call sent again may succeed: the connection failed, or
/// the server cannot run it for now. A failover's replies count, also as
/// Redis < 7 gives them from inside a script, wrapped in an `ERR`
/// (`ERR Error running script ...: -READONLY You can't write against a read
/// only replica.`), and `NOREPLICAS` (`min-replicas-to-write` unmet).
pub(super) fn is_transient(err: &redis::RedisError) -> bool {
    if err.is_io_error() || err.is_connection_dropped() || err.is_timeout() {
        return true;
    }
    // A failover's code inside the text of a script's `ERR`.
    let wrapped = |code: &str| {
        err.kind() == ErrorKind::Server(ServerErrorKind::ResponseError) && {
            let text = err.to_string();
            text.contains(&format!("-{code} ")) || text.contains(&format!(": {code} "))
        }
    };
    match err.kind() {
        ErrorKind::Server(
            ServerErrorKind::BusyLoading
            | ServerErrorKind::TryAgain
            | ServerErrorKind::ClusterDown
            | ServerErrorKind::MasterDown
            | ServerErrorKind::ReadOnly,
        )
        | ErrorKind::ClusterConnectionNotFound => true,
        // `BUSY`, a script running past its time limit, and `NOREPLICAS`:
        // not codes the client names.
        _ => {
            matches!(err.code(), Some("BUSY" | "NOREPLICAS"))
                || ["READONLY", "MASTERDOWN", "NOREPLICAS"]
                    .into_iter()
                    .any(wrapped)
        }
    }
}

fn is_noscript(err: &redis::RedisError) -> bool {
    err.kind() == ErrorKind::Server(ServerErrorKind::NoScript)
}

/// The identity as a hash tag. Redis hashes the text between the first `{`
/// and the first `}` after it, unless that text is empty, in which case it
/// hashes the whole key, and then the keys of one identity could land in
/// different slots. An identity that is empty or starts with `}` (or with
/// the escape `~`) is therefore written with a leading `~`: the tag is never
/// empty, and distinct identities stay distinct.
pub(crate) fn hash_tag(identity: &str) -> std::borrow::Cow<'_, str> {
    if identity.is_empty() || identity.starts_with('}') || identity.starts_with('~') {
        format!("~{identity}").into()
    } else {
        identity.into()
    }
}

/// The Redis key of one limit's GCRA state, after
/// [`RedisStore::key_base`]: the base itself for the first limit (most
/// policies have one), `{base}:{limit}` for the others. Made on every
/// call: joined from its pieces, not by `format!`.
fn limit_key(base: &str, limit: usize) -> String {
    if limit == 0 {
        return base.to_owned();
    }
    let mut digits = itoa::Buffer::new();
    concat(&[base, ":", digits.format(limit)])
}

/// An identity as it appears in Redis keys: the first 72 bits of its
/// SHA-256 in 12 characters of URL-safe base64. Short, because Redis keeps
/// a key of up to 30 bytes in its smallest string and every byte past that
/// costs each identity's every key (BENCHMARKS.md, memory per identity);
/// a digest, so that the identity (an address, a user id) is never stored;
/// the same on every instance, as no secret is involved. What sharing a
/// tag takes, by chance or on purpose, is in docs/operating.md.
pub(crate) fn identity_tag(identity: &str) -> String {
    use sha2::{Digest, Sha256};
    let digest = Sha256::digest(identity.as_bytes());
    crate::text::base64(
        &digest[..9],
        b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_",
    )
}

/// Whether each call (its keys) has a key that another call has too.
fn shared_calls(names: &[Vec<String>]) -> Vec<bool> {
    if names.len() < 2 {
        return vec![false; names.len()];
    }
    let mut seen: HashMap<&str, usize> = HashMap::with_capacity(names.len());
    for keys in names {
        for key in keys {
            *seen.entry(key.as_str()).or_default() += 1;
        }
    }
    names
        .iter()
        .map(|keys| {
            keys.iter()
                .any(|key| seen.get(key.as_str()).is_some_and(|n| *n > 1))
        })
        .collect()
}

/// How many values GCRA's check script answers per call (see
/// `lua/gcra.lua`).
const GCRA_REPLY: usize = 5;

/// The reply of a check script of one call, as [`split_replies`] gives it.
fn one_reply(algorithm: Algorithm, reply: Value) -> Result<Value, StoreError> {
    split_replies(algorithm, reply, 1)?
        .pop()
        .ok_or_else(|| StoreError::UnexpectedReply("no reply".into()))
}

/// Each call's part of the reply of `algorithm`'s check script deciding
/// `count` calls, in order. GCRA's script answers in one flat list, five
/// values a call; a window script in a list per call.
fn split_replies(
    algorithm: Algorithm,
    reply: Value,
    count: usize,
) -> Result<Vec<Value>, StoreError> {
    match reply {
        Value::Array(items) if algorithm.is_window() && items.len() == count => Ok(items),
        Value::Array(items) if !algorithm.is_window() && items.len() == GCRA_REPLY * count => {
            let mut items = items.into_iter();
            Ok((0..count)
                .map(|_| Value::Array(items.by_ref().take(GCRA_REPLY).collect()))
                .collect())
        }
        other => Err(StoreError::UnexpectedReply(format!("{other:?}"))),
    }
}

/// One call's part of a GCRA script's replies: its decision, or the text of
/// the error that failed it alone (see `lua/gcra.lua`).
pub(crate) fn decode_gcra(reply: &Value, limits: usize) -> Result<Decision, StoreError> {
    if let Value::Array(items) = reply
        && let Some(Value::BulkString(text)) = items.first()
    {
        return Err(StoreError::Redis(
            String::from_utf8_lossy(text).into_owned(),
        ));
    }
    decode_decision(reply, limits, false)
}

/// Decodes `{allowed, limit (1-based), remaining, reset_us, delay_us}`,
/// followed, when `each` is set and there are several limits, by
/// `remaining_i, reset_us_i` for every limit in order.
pub(crate) fn decode_decision(
    reply: &Value,
    limits: usize,
    each: bool,
) -> Result<Decision, StoreError> {
    let unexpected = || StoreError::UnexpectedReply(format!("{reply:?}"));
    let Value::Array(items) = reply else {
        return Err(unexpected());
    };
    let int = |item: &Value| match item {
        Value::Int(n) if *n >= 0 => Ok(*n as u64),
        _ => Err(unexpected()),
    };
    let extra = if each && limits > 1 { 2 * limits } else { 0 };
    if items.len() != 5 + extra {
        return Err(unexpected());
    }
    let [allowed, limit, remaining, reset, delay] = [0, 1, 2, 3, 4].map(|i| int(&items[i]));
    let (allowed, limit, remaining, reset, delay) = (allowed?, limit?, remaining?, reset?, delay?);
    let limit = usize::try_from(limit).map_err(|_| unexpected())?;
    // 1 admitted, 0 refused, 2 refused by the penalty box.
    if !(1..=limits).contains(&limit) || allowed > 2 {
        return Err(unexpected());
    }
    let blocked = allowed == 2;
    let each = if extra > 0 {
        let pairs = items[5..]
            .chunks_exact(2)
            .map(|pair| Ok((int(&pair[0])?, Duration::from_micros(int(&pair[1])?))))
            .collect::<Result<Arc<[_]>, StoreError>>()?;
        Some(pairs)
    } else {
        None
    };
    let allowed = allowed == 1;
    Ok(Decision {
        allowed,
        limit: limit - 1,
        remaining,
        reset_us: reset,
        retry_us: (!allowed).then_some(delay),
        wait_us: if allowed { delay } else { 0 },
        each,
        blocked,
    })
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStore")
            .field("prefix", &self.inner.prefix)
            .field("timeout", &self.inner.timeout)
            .field("time", &self.inner.time)
            .field("connection", &self.inner.conn)
            .field("deny_cache", &self.inner.deny.is_some())
            .finish()
    }
}

impl Store for RedisStore {
    fn kind(&self) -> &'static str {
        "redis"
    }
}

impl RedisStore {
    /// A window call's two arguments for `limit`: its window's length and
    /// count; for a calendar quota, its period's nominal length and
    /// `count:b0:b1:b2:b3`, the bounds of the periods around the caller's
    /// clock, among which `lua/calendar.lua` finds the one holding the
    /// script's own now (Redis has no time-zone database).
    pub(super) fn window_args(&self, limit: &Limit) -> (u64, String) {
        let window = limit.as_window();
        match limit.calendar_of() {
            None => (window.length, window.count.to_string()),
            Some(calendar) => {
                let now = match &self.inner.time {
                    TimeSource::Client(clock) => clock.now_micros(),
                    TimeSource::Server => SystemClock.now_micros(),
                };
                let [b0, b1, b2, b3] = calendar.bounds(now);
                (
                    window.length,
                    format!("{}:{b0}:{b1}:{b2}:{b3}", window.count),
                )
            }
        }
    }
}

impl StoreOps for RedisStore {
    fn run(&self, call: Call<'_>) -> StoreFuture<Answer> {
        self.run_call(call)
    }

    fn lease(&self, call: LeaseCall<'_>, op: LeaseOp) -> StoreFuture<LeaseAnswer> {
        match op {
            LeaseOp::Acquire => self
                .run_lease_acquire(call)
                .map(|grant| Ok(LeaseAnswer::Grant(grant))),
            LeaseOp::Release => self
                .run_lease_release(call)
                .map(|held| Ok(LeaseAnswer::Held(held))),
            LeaseOp::Renew => self
                .run_lease_renew(call)
                .map(|held| Ok(LeaseAnswer::Held(held))),
        }
    }

    fn reset(&self, name: &str, key: &Key) -> StoreFuture<()> {
        self.run_reset(name, key)
    }

    fn budget(&self, call: BudgetCall<'_>) -> StoreFuture<BudgetTake> {
        self.run_budget(call)
    }

    fn forget_denials(&self) {
        if let Some(cache) = &self.inner.deny {
            cache.clear();
        }
    }

    fn watch_releases(&self, name: &str, key: &Key) -> Option<StoreFuture<ReleaseWatch>> {
        Some(self.inner.hub.watch(self.lease_key(name, key)))
    }
}

impl RedisStore {
    /// The deny cache's counters (all zero when it is off): how many calls
    /// it answered without Redis, and how full it is.
    pub fn deny_cache_stats(&self) -> DenyCacheStats {
        self.inner
            .deny
            .as_ref()
            .map(DenyCache::stats)
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reply that is a list of integers.
    pub(super) fn array(ints: &[i64]) -> Value {
        Value::Array(ints.iter().copied().map(Value::Int).collect())
    }

    #[test]
    fn hash_tags_are_never_empty_and_stay_distinct() {
        assert_eq!(hash_tag("ip:1.2.3.4"), "ip:1.2.3.4");
        assert_eq!(hash_tag(""), "~");
        assert_eq!(hash_tag("}x"), "~}x");
        assert_eq!(hash_tag("~}x"), "~~}x");
        assert_eq!(hash_tag("a}b{c"), "a}b{c");
        // Redis Cluster's rule: the text between the first `{` and the
        // first `}` after it, if not empty; otherwise the whole key.
        fn hashed(key: &str) -> &str {
            if let Some(open) = key.find('{')
                && let Some(len) = key[open + 1..].find('}')
                && len > 0
            {
                return &key[open + 1..open + 1 + len];
            }
            key
        }
        for id in ["", "}", "}}", "a}b", "~", "{", "{}", "x"] {
            let tags: Vec<String> = (0..3)
                .map(|i| hashed(&format!("p:n:{{{}}}:{i}", hash_tag(id))).to_owned())
                .collect();
            assert!(tags.iter().all(|t| *t == tags[0]), "{id:?}: {tags:?}");
        }
    }

    #[test]
    fn odd_replies_are_errors() {
        for reply in [
            Value::Nil,
            Value::Okay,
            Value::Array(vec![Value::Int(1)]),
            Value::Array(vec![Value::Int(1); 6]),
            array(&[3, 1, 0, 0, 0]),
            array(&[1, 0, 0, 0, 0]),
            array(&[1, 3, 0, 0, 0]),
            array(&[1, 1, -1, 0, 0]),
            Value::Array(vec![
                Value::Int(1),
                Value::Nil,
                Value::Int(0),
                Value::Int(0),
                Value::Int(0),
            ]),
        ] {
            assert!(decode_gcra(&reply, 2).is_err(), "{reply:?}");
        }
        let ok = array(&[0, 2, 0, 5, 7]);
        let d = decode_gcra(&ok, 2).unwrap();
        assert!(!d.is_allowed());
        assert_eq!(d.limit_index(), 1);
        assert_eq!(d.retry_after(), Some(Duration::from_micros(7)));

        // One call's error travels as its text, then four zeros.
        let failed = Value::Array(vec![
            Value::BulkString(b"WRONGTYPE Operation".to_vec()),
            Value::Int(0),
            Value::Int(0),
            Value::Int(0),
            Value::Int(0),
        ]);
        assert!(matches!(
            decode_gcra(&failed, 1),
            Err(StoreError::Redis(text)) if text == "WRONGTYPE Operation"
        ));

        // GCRA's script answers five values a call in one list; a window
        // script a list per call.
        let ints = |n: i64| (0..n).map(Value::Int).collect::<Vec<_>>();
        assert_eq!(
            one_reply(Algorithm::Gcra, Value::Array(ints(5))).unwrap(),
            Value::Array(ints(5))
        );
        assert_eq!(
            split_replies(Algorithm::Gcra, Value::Array(ints(10)), 2).unwrap(),
            vec![
                Value::Array(ints(5)),
                Value::Array((5..10).map(Value::Int).collect())
            ]
        );
        assert_eq!(
            one_reply(Algorithm::FixedWindow, Value::Array(vec![ok.clone()])).unwrap(),
            ok
        );
        for reply in [
            Value::Nil,
            Value::Array(vec![]),
            Value::Array(ints(4)),
            Value::Array(ints(6)),
            Value::Array(vec![ok.clone(), failed]),
        ] {
            assert!(
                one_reply(Algorithm::Gcra, reply.clone()).is_err(),
                "{reply:?}"
            );
            assert!(
                split_replies(Algorithm::Gcra, reply.clone(), 2).is_err(),
                "{reply:?}"
            );
        }
        for reply in [
            ok.clone(),
            Value::Array(vec![]),
            Value::Array(vec![ok.clone(), ok]),
        ] {
            assert!(
                one_reply(Algorithm::SlidingWindow, reply.clone()).is_err(),
                "{reply:?}"
            );
        }
    }
}
