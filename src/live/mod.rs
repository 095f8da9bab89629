//! Live policies: change limits while the fleet runs, give identities
//! limits of their own or a plan, and reset an identity.
//!
//! [`LivePolicies`] hands out the limiters of a service (one per policy)
//! and changes them all at once. On a [`RedisStore`]
//! the changes are the fleet's: written to Redis under the store's prefix
//! (so a restarted instance finds them), and picked up by every instance
//! sharing the store within one poll (250 ms by default) of a version that
//! every change bumps. On a [`MemoryStore`](crate::MemoryStore) they apply
//! to the one process. A decision reads its limits from memory, never from
//! Redis: a change costs nothing on the request path.
//!
//! ```
//! use fleetgate::key::Key;
//! use fleetgate::live::LivePolicies;
//! use fleetgate::spec::PolicySpec;
//! use fleetgate::MemoryStore;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let live = LivePolicies::new(MemoryStore::new());
//! let api = live.limiter("1/min".parse::<PolicySpec>()?.build("api")?);
//! // A plan, defined in code (or in a policy file's `[plans.pro]`).
//! live.define_plan("pro", "100/min".parse::<PolicySpec>()?.build("api")?)?;
//! live.start().await?;
//!
//! let (alice, bob) = (Key::new("user:alice"), Key::new("user:bob"));
//! live.assign_plan(&alice, Some("pro")).await?;
//! for _ in 0..50 {
//!     assert!(api.check(&alice, 1).await?.is_allowed());
//! }
//! assert!(api.check(&bob, 1).await?.is_allowed());
//! assert!(!api.check(&bob, 1).await?.is_allowed());
//!
//! // Raise everyone's limit, with no restart.
//! live.set_policy("api", "1/min burst 2").await?;
//! assert!(api.check(&bob, 1).await?.is_allowed());
//! // And clear bob's state: his next call is decided as if he were new.
//! live.reset(&bob, None).await?;
//! assert!(api.check(&bob, 1).await?.is_allowed());
//! # Ok(()) }
//! ```
//!
//! # What decides an identity
//!
//! Its own limits for the policy ([`set_override`](LivePolicies::set_override))
//! first, then the plan it was assigned
//! ([`assign_plan`](LivePolicies::assign_plan)), then the plan its request
//! names (a [`Plan`] its authentication layer put in the request's
//! extensions), then the policy. Identities are keys as the layer's
//! extractor makes them ([`Key`]), so an API key is stored only
//! as its hash. A plan that does not define a policy leaves that policy's
//! limits as they are.
//!
//! # Deny and allow lists
//!
//! [`deny`](LivePolicies::deny) refuses an identity, or every IP key in a
//! network (`203.0.113.0/24`, `2001:db8::/32`), outright;
//! [`allow`](LivePolicies::allow) exempts one from a policy (a health
//! checker, a partner). Either for one policy or every one, with an
//! optional end, fleet-wide as every other change. A layer checks them
//! before its limiter, from memory: a listed request costs no store call,
//! and a limiter without lists one branch. A deny entry beats an allow
//! entry; shadow mode refuses nothing. Rate and concurrency layers check
//! them (a concurrency limiter once given to
//! [`concurrency`](LivePolicies::concurrency)); load shedders, which
//! decide by tier and not by identity, and direct calls to a
//! [`Limiter`] do not. At most 100,000 entries are in force
//! ([`ConfigError::TooManyListed`] past it); ended ones do not count.
//!
//! [`AdminApi`] (cargo feature `admin`) serves these calls over HTTP, for
//! an operator or a tool; `docs/live-policies.md` shows them as curl lines.
//!
//! State carries over a change: an identity's state is read under its new
//! limits; a change of algorithm starts fresh state (see
//! [`Limiter::set_policy`](crate::Limiter::set_policy)).

#[cfg(feature = "admin")]
mod admin;
mod watch;

use std::collections::{BTreeMap, HashMap};
use std::fmt;
#[cfg(feature = "redis")]
use std::sync::Weak;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

#[cfg(feature = "admin")]
pub use self::admin::AdminApi;
use crate::rules::{Cell, Rules};

use crate::concurrency::{ConcurrencyLimiter, FleetLimit};
use crate::error::{ConfigError, StoreError};
use crate::key::Key;
use crate::limiter::{IntoStore, Limiter};
use crate::lists::{ListSet, Lists, now_ms};
use crate::log::LogGate;
use crate::policy::spec::{ParseError, PolicyFile, PolicySpec};
use crate::policy::{Policy, check_name};
use crate::rate_limit::RoutePolicies;
#[cfg(feature = "redis")]
use crate::store::{RedisStore, redis_live};
use crate::store::{Store, StoreFuture};

/// Live-policy warnings (a stored text that no longer parses, a failed
/// sync) are logged at most once a second per process.
static LIVE_WARNINGS: LogGate = LogGate::new();

/// The most identities with limits of their own (overrides and assigned
/// plans together) one fleet keeps: changes beyond it are refused, so that
/// a flood of them cannot grow every instance's memory without bound.
const MAX_IDENTITIES: usize = 100_000;

/// The most deny and allow entries (together, not counting those that
/// have ended) one fleet keeps.
const MAX_LISTED: usize = 100_000;

/// The longest a list entry may be given to last: beyond it, leave it
/// without an end.
const MAX_LIST_EXPIRY: Duration = Duration::from_secs(10 * 365 * 24 * 3600);

/// At most this many ended entries are deleted from Redis by one write.
#[cfg(feature = "redis")]
const PRUNE_PER_WRITE: usize = 1_000;

/// How often an instance checks the fleet's version by default.
const DEFAULT_POLL: Duration = Duration::from_millis(250);

/// How often an instance records its heartbeat.
#[cfg(feature = "redis")]
const HEARTBEAT: Duration = Duration::from_secs(1);

/// An instance not seen for this long no longer counts as live.
#[cfg(feature = "redis")]
const LIVE_WINDOW: Duration = Duration::from_secs(3);

/// A heartbeat older than this is deleted from Redis.
#[cfg(feature = "redis")]
const FORGET_AFTER: Duration = Duration::from_secs(60);

pub use crate::lists::{List, ListEntry, Listed};
pub use crate::rules::Plan;

/// An instance sharing the store, from its heartbeat.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Instance {
    /// A random id, new at each start.
    pub id: String,
    /// The address it said it serves ([`LivePolicies::address`]), or empty.
    pub address: String,
    /// When it started.
    pub started: SystemTime,
    /// When its last heartbeat reached the store (the store's clock).
    pub last_seen: SystemTime,
}

/// Why a live change was refused. Nothing was changed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LiveError {
    /// The policy text does not parse.
    #[error(transparent)]
    Parse(#[from] ParseError),
    /// The policy, plan or name is refused (an unknown policy is
    /// [`ConfigError::UnknownPolicy`], an unknown plan
    /// [`ConfigError::UnknownPlan`]).
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The store could not record the change. Nothing changed in this
    /// process; but a write that timed out may still be applied by Redis
    /// later (a hung server runs what it was sent when it wakes), as for
    /// any call that times out: read the fleet's state back
    /// ([`refresh`](LivePolicies::refresh), [`policies`](LivePolicies::policies))
    /// before retrying.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The limiters of a service, their policies changed while it runs, for
/// the whole fleet on a Redis store. See the [module docs](self).
#[derive(Clone)]
pub struct LivePolicies {
    fleet: Arc<Fleet>,
}

struct Fleet {
    store: Arc<dyn Store>,
    #[cfg(feature = "redis")]
    redis: Option<RedisStore>,
    state: Mutex<State>,
    /// Held by a refresh from reading the changes to applying them: one
    /// at a time, so that a snapshot read earlier is never applied over
    /// one read later (a writer then found its own change undone).
    #[cfg(feature = "redis")]
    refreshing: tokio::sync::Mutex<()>,
    id: String,
    started: SystemTime,
}

#[derive(Default)]
struct State {
    /// The rate limiters handed out, by policy name, with the policy they
    /// were given (or the policy file's): what a removed change restores.
    limiters: BTreeMap<String, Registered>,
    /// Concurrency limiters, known for [`LivePolicies::reset`].
    concurrency: BTreeMap<String, ConcurrencyLimiter>,
    /// Plans defined in code or in a policy file: plan → policy → limits.
    plans: BTreeMap<String, BTreeMap<String, Policy>>,
    /// The fleet's changes, as stored.
    changes: Changes,
    version: u64,
    address: String,
    /// How often the sync task checks the version.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    poll: Duration,
    started: bool,
    instances: Vec<Instance>,
    /// Limits published with each heartbeat and summed over the fleet, by
    /// policy name.
    published: BTreeMap<String, FleetLimit>,
    /// The deny and allow tables as last read.
    lists: ReadLists,
}

/// The deny and allow tables as read, kept until they change: every
/// limiter shares one value of the entries for every policy, and a change
/// of anything else reads nothing again.
#[derive(Default)]
struct ReadLists {
    /// The tables they were read from.
    deny: BTreeMap<String, String>,
    allow: BTreeMap<String, String>,
    /// The entries for every policy.
    every: Arc<ListSet>,
    /// Each policy's own.
    own: HashMap<String, Arc<ListSet>>,
}

struct Registered {
    cell: Arc<Cell>,
    default: Policy,
}

/// The fleet's changes as text, exactly as stored in Redis.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Changes {
    /// Policy → its replacement.
    policies: BTreeMap<String, String>,
    /// (policy, identity) → that identity's limits.
    overrides: BTreeMap<(String, String), String>,
    /// (plan, policy) → the plan's limits, defined at run time.
    plans: BTreeMap<(String, String), String>,
    /// Identity → its plan.
    assigned: BTreeMap<String, String>,
    /// `{policy|*} k {key}` or `{policy|*} n {network}` → the entry's end
    /// in Unix milliseconds (0: never).
    deny: BTreeMap<String, String>,
    /// As `deny`.
    allow: BTreeMap<String, String>,
}

impl LivePolicies {
    /// Live policies on `store`: the fleet's, on a
    /// [`RedisStore`]; this process's otherwise.
    /// Nothing is read until [`start`](Self::start).
    pub fn new(store: impl IntoStore) -> Self {
        let store = store.into_store();
        #[cfg(feature = "redis")]
        let redis = store.as_redis().cloned();
        let id = instance_id();
        LivePolicies {
            fleet: Arc::new(Fleet {
                store,
                #[cfg(feature = "redis")]
                redis,
                state: Mutex::new(State {
                    poll: DEFAULT_POLL,
                    ..State::default()
                }),
                id,
                started: SystemTime::now(),
                #[cfg(feature = "redis")]
                refreshing: tokio::sync::Mutex::new(()),
            }),
        }
    }

    /// How often each instance checks for changes (default 250 ms):
    /// changes reach every instance within about this long. Each check is
    /// one small script call; at least 10 ms. Set before [`start`](Self::start)
    /// (it applies to every clone).
    pub fn poll_every(self, every: Duration) -> Self {
        self.fleet.lock().poll = every.max(Duration::from_millis(10));
        self
    }

    /// The address this instance serves, shown with its heartbeat in
    /// [`instances`](Self::instances).
    pub fn address(self, address: impl Into<String>) -> Self {
        self.fleet.lock().address = address.into();
        self
    }

    /// A limiter for `policy`, whose limits follow the fleet's changes to
    /// the policy of its name. Asking again for the same name gives the
    /// same limiter (the policy given first stays the default).
    pub fn limiter(&self, policy: Policy) -> Limiter {
        let mut state = self.fleet.lock();
        let name = policy.name().to_owned();
        let cell = match state.limiters.get(&name) {
            Some(registered) => registered.cell.clone(),
            None => {
                let cell = Arc::new(Cell::new(policy.clone()));
                state.limiters.insert(
                    name.clone(),
                    Registered {
                        cell: cell.clone(),
                        default: policy,
                    },
                );
                state.read_lists();
                state.apply_one(&name);
                cell
            }
        };
        Limiter::from_cell(cell, self.fleet.store.clone())
    }

    /// Makes the policy of `limiter` known to [`reset`](Self::reset), which
    /// then drops an identity's leases too, and to the deny and allow
    /// lists, which its [`ConcurrencyLimitLayer`](crate::concurrency::ConcurrencyLimitLayer)s
    /// then check; returns the limiter. A second limiter of the same
    /// policy name replaces the first, which then follows no further
    /// change: give the same one (or its clones) to every layer.
    pub fn concurrency(&self, limiter: ConcurrencyLimiter) -> ConcurrencyLimiter {
        let mut state = self.fleet.lock();
        let name = limiter.policy().name().to_owned();
        state.read_lists();
        limiter.set_lists(state.lists_for(&name));
        state.concurrency.insert(name, limiter.clone());
        limiter
    }

    /// `limiter`'s limit summed over the fleet: its current limit goes
    /// with this instance's heartbeats (every second, through a Redis
    /// store, under the limiter's policy name), and the returned
    /// [`FleetLimit`] adds those the other live instances published
    /// (instances seen in the last 3 s). Give it to
    /// [`FleetShedder::capacity_from`](crate::shed::FleetShedder::capacity_from).
    /// On a memory store it is this process's limit alone. A second call
    /// for the same policy name replaces the first's limiter.
    pub fn fleet_limit(&self, limiter: &ConcurrencyLimiter) -> FleetLimit {
        let limit = FleetLimit::new(limiter.clone());
        self.fleet
            .lock()
            .published
            .insert(limiter.policy().name().to_owned(), limit.clone());
        limit
    }

    /// The route table of a policy file, each policy a live limiter (see
    /// [`RoutePolicies::from_file`]), and the file's plans defined.
    pub fn routes(&self, file: &PolicyFile) -> Result<RoutePolicies, ConfigError> {
        let policies = file.policies()?;
        let plans = file.plans()?;
        let table = RoutePolicies::from_limiters(file, |name| {
            policies.get(name).map(|p| self.limiter(p.clone()))
        })?;
        let mut state = self.fleet.lock();
        state.plans = plans;
        state.apply_all();
        Ok(table)
    }

    /// Replaces the defaults with a re-read policy file: each policy the
    /// file names that has a limiter takes its new limits (unless the fleet
    /// changed it), and the file's plans replace those defined before.
    /// Routes and new policies need a restart. Nothing changes when the
    /// file is refused.
    pub fn reload(&self, file: &PolicyFile) -> Result<(), ConfigError> {
        let policies = file.policies()?;
        let plans = file.plans()?;
        let mut state = self.fleet.lock();
        for (name, policy) in policies {
            if let Some(registered) = state.limiters.get_mut(&name) {
                registered.default = policy;
            }
        }
        state.plans = plans;
        state.apply_all();
        Ok(())
    }

    /// Defines (in code, for this process) the limits `policy` has under
    /// plan `plan`, for the policy of its name.
    pub fn define_plan(&self, plan: &str, policy: Policy) -> Result<(), ConfigError> {
        check_name(plan)?;
        let mut state = self.fleet.lock();
        state
            .plans
            .entry(plan.to_owned())
            .or_default()
            .insert(policy.name().to_owned(), policy);
        state.apply_all();
        Ok(())
    }

    /// Reads the fleet's changes, then keeps following them (with a Redis
    /// store: a task polls the version and records this instance's
    /// heartbeat, until every clone of this value is dropped). Call it
    /// once, inside a tokio runtime, after the limiters are made. Fails
    /// when the store cannot be read; with Redis, the task then keeps
    /// trying.
    pub async fn start(&self) -> Result<(), StoreError> {
        let first = {
            let mut state = self.fleet.lock();
            !std::mem::replace(&mut state.started, true)
        };
        #[cfg(feature = "redis")]
        if first && self.fleet.redis.is_some() {
            let result = self.refresh().await;
            let _ = self.fleet.heartbeat().await;
            spawn_sync(Arc::downgrade(&self.fleet));
            return result;
        }
        let _ = first;
        Ok(())
    }

    /// Reads the fleet's changes now (what the poll does when the version
    /// moves). Nothing to do on a memory store.
    pub async fn refresh(&self) -> Result<(), StoreError> {
        self.fleet.refresh().await
    }

    /// Replaces policy `name`'s limits with `text` (the policy syntax of
    /// [`spec`](crate::policy::spec), such as `10/s burst 20`), fleet-wide; the
    /// policy as it now is.
    pub async fn set_policy(&self, name: &str, text: &str) -> Result<Policy, LiveError> {
        let policy = self.fleet.parse_for(name, text)?;
        let text = PolicySpec::from(&policy).to_string();
        self.fleet
            .write(Change::Policy(name.to_owned()), Some(text))
            .await?;
        Ok(policy)
    }

    /// Undoes the fleet's change to policy `name`: it has its default
    /// limits again (from code or the policy file).
    pub async fn restore_policy(&self, name: &str) -> Result<Policy, LiveError> {
        self.fleet.known(name)?;
        self.fleet
            .write(Change::Policy(name.to_owned()), None)
            .await?;
        Ok(self.fleet.current(name)?)
    }

    /// Gives `key` limits of its own (`Some(text)`) under policy `policy`,
    /// or (`None`) takes them away, fleet-wide.
    pub async fn set_override(
        &self,
        policy: &str,
        key: &Key,
        text: Option<&str>,
    ) -> Result<(), LiveError> {
        let text = match text {
            Some(text) => Some(PolicySpec::from(&self.fleet.parse_for(policy, text)?).to_string()),
            None => {
                self.fleet.known(policy)?;
                None
            }
        };
        let change = Change::Override(policy.to_owned(), key.text().to_string());
        self.fleet.write(change, text).await
    }

    /// Defines (`Some(text)`) or removes the limits policy `policy` has
    /// under plan `plan`, fleet-wide (a plan defined in code or a file is
    /// shadowed, not removed).
    pub async fn set_plan(
        &self,
        plan: &str,
        policy: &str,
        text: Option<&str>,
    ) -> Result<(), LiveError> {
        check_name(plan)?;
        let text = match text {
            Some(text) => Some(PolicySpec::from(&self.fleet.parse_for(policy, text)?).to_string()),
            None => {
                self.fleet.known(policy)?;
                None
            }
        };
        let change = Change::Plan(plan.to_owned(), policy.to_owned());
        self.fleet.write(change, text).await
    }

    /// Assigns `key` the plan `plan` (which must be defined), or (`None`)
    /// none, fleet-wide.
    pub async fn assign_plan(&self, key: &Key, plan: Option<&str>) -> Result<(), LiveError> {
        if let Some(plan) = plan
            && !self.fleet.lock().has_plan(plan)
        {
            return Err(ConfigError::UnknownPlan {
                name: plan.to_owned(),
            }
            .into());
        }
        let change = Change::Assigned(key.text().to_string());
        self.fleet.write(change, plan.map(str::to_owned)).await
    }

    /// Clears `key`'s state under policy `policy` (a rate or concurrency
    /// policy of these live policies), or under every one of them
    /// (`None`), fleet-wide: its next call is decided as if it were new,
    /// and its concurrency leases are dropped. Instances that remember a
    /// denial of it forget it at their next poll.
    pub async fn reset(&self, key: &Key, policy: Option<&str>) -> Result<(), LiveError> {
        // Each store call, made outside the lock: a concurrency limiter's
        // own reset, which also stops renewing the leases it drops.
        let resets: Vec<StoreFuture<()>> = {
            let state = self.fleet.lock();
            if let Some(name) = policy
                && !state.knows(name)
            {
                return Err(ConfigError::UnknownPolicy {
                    name: name.to_owned(),
                }
                .into());
            }
            let wanted = |name: &str| policy.is_none_or(|p| p == name);
            let rate = state
                .limiters
                .keys()
                .filter(|n| wanted(n))
                .map(|name| self.fleet.store.reset(name, key));
            let concurrency = state
                .concurrency
                .iter()
                .filter(|(n, _)| wanted(n))
                .map(|(_, limiter)| limiter.reset(key));
            rate.chain(concurrency).collect()
        };
        for reset in resets {
            reset.await?;
        }
        self.fleet.write(Change::Reset, None).await
    }

    /// Puts `listed` (an identity, or a network of IP keys) on the deny
    /// list of policy `policy`, or (`None`) of every policy, fleet-wide:
    /// every [`RateLimitLayer`](crate::RateLimitLayer) on that policy's
    /// limiter, and every [`ConcurrencyLimitLayer`](crate::concurrency::ConcurrencyLimitLayer)
    /// on a limiter given to [`concurrency`](Self::concurrency), refuses
    /// it outright (403 by default, `deny_status` on either layer) without
    /// asking its store, until `expires_in` has passed (`None`: until
    /// [`unlist`](Self::unlist)ed; at most 10 years, by the writer's
    /// clock). Listing it again replaces its end.
    ///
    /// ```
    /// use std::time::Duration;
    /// use fleetgate::key::{IpNet, Key};
    /// use fleetgate::live::{List, LivePolicies};
    /// use fleetgate::MemoryStore;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let live = LivePolicies::new(MemoryStore::new());
    /// let _api = live.limiter("10/s".parse::<fleetgate::spec::PolicySpec>()?.build("api")?);
    /// live.deny(None, Key::new("user:mallory"), Some(Duration::from_secs(600))).await?;
    /// live.deny(Some("api"), "203.0.113.0/24".parse::<IpNet>()?, None).await?;
    /// // The health checker is never limited by `api`.
    /// live.allow(Some("api"), Key::new("ip:10.0.0.9"), None).await?;
    /// assert_eq!(live.lists().len(), 3);
    /// live.unlist(List::Deny, None, Key::new("user:mallory")).await?;
    /// # Ok(()) }
    /// ```
    pub async fn deny(
        &self,
        policy: Option<&str>,
        listed: impl Into<Listed>,
        expires_in: Option<Duration>,
    ) -> Result<(), LiveError> {
        self.list(List::Deny, policy, listed.into(), expires_in)
            .await
    }

    /// Puts `listed` on the allow list of policy `policy`, or (`None`) of
    /// every policy, fleet-wide: its requests pass those policies' layers
    /// without a decision (no store call, no state, no lease, no
    /// rate-limit headers), until `expires_in` has passed. A deny entry
    /// for the same request beats it. As [`deny`](Self::deny) otherwise.
    pub async fn allow(
        &self,
        policy: Option<&str>,
        listed: impl Into<Listed>,
        expires_in: Option<Duration>,
    ) -> Result<(), LiveError> {
        self.list(List::Allow, policy, listed.into(), expires_in)
            .await
    }

    /// Takes `listed` off `list` for `policy` (or the entry for every
    /// policy, `None`), fleet-wide. Nothing to take off is no error.
    pub async fn unlist(
        &self,
        list: List,
        policy: Option<&str>,
        listed: impl Into<Listed>,
    ) -> Result<(), LiveError> {
        let field = self.fleet.list_field(policy, &listed.into())?;
        self.fleet.write(Change::List(list, field), None).await
    }

    /// The fleet's deny and allow entries in force (as of the last
    /// poll), deny entries first.
    pub fn lists(&self) -> Vec<ListEntry> {
        let state = self.fleet.lock();
        let now = now_ms();
        state
            .changes
            .entries(now)
            .map(|(list, policy, listed, ends)| ListEntry {
                list,
                policy: policy.map(str::to_owned),
                listed,
                expires: (ends != 0)
                    .then(|| UNIX_EPOCH.checked_add(Duration::from_millis(ends)))
                    .flatten(),
            })
            .collect()
    }

    async fn list(
        &self,
        list: List,
        policy: Option<&str>,
        listed: Listed,
        expires_in: Option<Duration>,
    ) -> Result<(), LiveError> {
        let field = self.fleet.list_field(policy, &listed)?;
        let ends = match expires_in {
            None => 0,
            Some(d) if d >= Duration::from_millis(1) && d <= MAX_LIST_EXPIRY => {
                now_ms().saturating_add(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
            }
            Some(d) => return Err(ConfigError::ListExpiryOutOfRange { expires_in: d }.into()),
        };
        self.fleet
            .write(Change::List(list, field), Some(ends.to_string()))
            .await
    }

    /// Every policy with a limiter here, and its limits as text now.
    pub fn policies(&self) -> BTreeMap<String, String> {
        let state = self.fleet.lock();
        state
            .limiters
            .iter()
            .map(|(name, r)| {
                (
                    name.clone(),
                    PolicySpec::from(&r.cell.rules().base).to_string(),
                )
            })
            .collect()
    }

    /// The instances sharing the store, as of the last heartbeat (every
    /// second with Redis: instances seen in the last 3 s); this one alone
    /// on a memory store.
    pub fn instances(&self) -> Vec<Instance> {
        let state = self.fleet.lock();
        if state.instances.is_empty() {
            return vec![Instance {
                id: self.fleet.id.clone(),
                address: state.address.clone(),
                started: self.fleet.started,
                last_seen: SystemTime::now(),
            }];
        }
        state.instances.clone()
    }

    /// How many instances share the store, as of the last heartbeat (at
    /// least 1).
    pub fn instance_count(&self) -> usize {
        self.fleet.lock().instances.len().max(1)
    }
}

impl fmt::Debug for LivePolicies {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.fleet.lock();
        f.debug_struct("LivePolicies")
            .field("store", &self.fleet.store)
            .field("policies", &state.limiters.keys().collect::<Vec<_>>())
            .field("version", &state.version)
            .finish_non_exhaustive()
    }
}

/// One change of the fleet's.
enum Change {
    Policy(String),
    Override(String, String),
    Plan(String, String),
    Assigned(String),
    /// An entry of a deny or allow list, by its field.
    List(List, String),
    /// No table changes: the version moves, so that every instance forgets
    /// the denials it remembers.
    Reset,
}

impl Fleet {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves consistent data: every
        // change is applied as a whole after it is validated.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn known(&self, name: &str) -> Result<(), ConfigError> {
        if self.lock().limiters.contains_key(name) {
            Ok(())
        } else {
            Err(ConfigError::UnknownPolicy {
                name: name.to_owned(),
            })
        }
    }

    /// The stored field of a list entry for `policy` (a rate or concurrency
    /// policy known here) or every policy.
    fn list_field(&self, policy: Option<&str>, listed: &Listed) -> Result<String, ConfigError> {
        if let Some(name) = policy
            && !self.lock().knows(name)
        {
            return Err(ConfigError::UnknownPolicy {
                name: name.to_owned(),
            });
        }
        let kind = match listed {
            Listed::Key(_) => 'k',
            Listed::Net(_) => 'n',
        };
        Ok(format!("{} {kind} {listed}", policy.unwrap_or("*")))
    }

    fn current(&self, name: &str) -> Result<Policy, ConfigError> {
        self.lock()
            .limiters
            .get(name)
            .map(|r| r.cell.rules().base.clone())
            .ok_or_else(|| ConfigError::UnknownPolicy {
                name: name.to_owned(),
            })
    }

    /// `text` as limits for the policy named `name`, which must have a
    /// limiter here.
    fn parse_for(&self, name: &str, text: &str) -> Result<Policy, LiveError> {
        self.known(name)?;
        Ok(text.parse::<PolicySpec>()?.build(name)?)
    }

    /// Records a change: in Redis (then read back with every other change
    /// made meanwhile), or in this process.
    async fn write(&self, change: Change, value: Option<String>) -> Result<(), LiveError> {
        if value.is_some() {
            self.lock().within_bounds(&change)?;
        }
        #[cfg(feature = "redis")]
        if let Some(redis) = &self.redis {
            use redis_live::Table;
            let (table, field) = match &change {
                Change::Policy(name) => (Table::Policies, name.clone()),
                Change::Override(policy, key) => (Table::Overrides, format!("{policy} {key}")),
                Change::Plan(plan, policy) => (Table::Plans, format!("{plan} {policy}")),
                Change::Assigned(key) => (Table::Assigned, key.clone()),
                Change::List(List::Deny, field) => (Table::Deny, field.clone()),
                Change::List(List::Allow, field) => (Table::Allow, field.clone()),
                Change::Reset => {
                    redis.live_bump().await?;
                    self.store.forget_denials();
                    return Ok(());
                }
            };
            // A list's write also deletes the entries of it that ended.
            let ended = match &change {
                Change::List(list, _) => {
                    self.lock().changes.ended(*list, now_ms(), PRUNE_PER_WRITE)
                }
                _ => Vec::new(),
            };
            redis
                .live_write(table, &field, value.as_deref(), &ended)
                .await?;
            self.refresh().await?;
            return Ok(());
        }
        let mut state = self.lock();
        let mut changes = state.changes.clone();
        if let Change::List(list, _) = &change {
            for (field, _) in changes.ended(*list, now_ms(), usize::MAX) {
                changes.table_mut(*list).remove(&field);
            }
        }
        changes.set(change, value);
        state.changes = changes;
        state.version += 1;
        state.apply_all();
        Ok(())
    }

    /// Reads every change from Redis and applies them; nothing on a memory
    /// store.
    async fn refresh(&self) -> Result<(), StoreError> {
        #[cfg(feature = "redis")]
        if let Some(redis) = &self.redis {
            let _one = self.refreshing.lock().await;
            let snapshot = redis.live_load().await?;
            let changes = Changes::from_snapshot(&snapshot);
            let mut state = self.lock();
            if snapshot.version != state.version || changes != state.changes {
                state.version = snapshot.version;
                state.changes = changes;
                state.apply_all();
                drop(state);
                // A denial remembered under the old limits (or before a
                // reset) may no longer hold.
                self.store.forget_denials();
            }
        }
        Ok(())
    }

    /// Checks the version, and reads the changes when it moved.
    #[cfg(feature = "redis")]
    async fn poll(&self) -> Result<(), StoreError> {
        if let Some(redis) = &self.redis {
            let version = redis.live_version().await?;
            if version != self.lock().version {
                self.refresh().await?;
            }
        }
        Ok(())
    }

    /// Records this instance's heartbeat and reads the others'.
    #[cfg(feature = "redis")]
    async fn heartbeat(&self) -> Result<(), StoreError> {
        let Some(redis) = &self.redis else {
            return Ok(());
        };
        let (address, published) = {
            let state = self.lock();
            (state.address.clone(), state.published.clone())
        };
        // `name=limit` pairs: policy names hold neither `=` nor spaces.
        let limits: Vec<String> = published
            .values()
            .map(|l| format!("{}={}", l.name(), l.own()))
            .collect();
        let started = millis(self.started);
        let (now, list, their_limits) = redis
            .live_heartbeat(
                &self.id,
                started,
                &address,
                ms(FORGET_AFTER),
                &limits.join(" "),
            )
            .await?;
        let mut instances: Vec<Instance> = list
            .iter()
            .filter_map(|(id, value)| parse_heartbeat(id, value))
            .filter(|i| now.saturating_sub(millis(i.last_seen)) <= ms(LIVE_WINDOW))
            .collect();
        instances.sort_by(|a, b| a.started.cmp(&b.started).then(a.id.cmp(&b.id)));
        // Local shares follow the fleet's size.
        crate::share::set_fleet_size(instances.len());
        for limit in published.values() {
            let others = their_limits
                .iter()
                .filter(|(id, _)| *id != self.id && instances.iter().any(|i| &i.id == id))
                .filter_map(|(_, text)| published_limit(text, limit.name()))
                .fold(0u64, u64::saturating_add);
            limit.set_others(others);
        }
        self.lock().instances = instances;
        Ok(())
    }
}

impl Changes {
    fn set(&mut self, change: Change, value: Option<String>) {
        match (change, value) {
            (Change::Policy(k), Some(v)) => {
                self.policies.insert(k, v);
            }
            (Change::Policy(k), None) => {
                self.policies.remove(&k);
            }
            (Change::Override(p, k), Some(v)) => {
                self.overrides.insert((p, k), v);
            }
            (Change::Override(p, k), None) => {
                self.overrides.remove(&(p, k));
            }
            (Change::Plan(p, k), Some(v)) => {
                self.plans.insert((p, k), v);
            }
            (Change::Plan(p, k), None) => {
                self.plans.remove(&(p, k));
            }
            (Change::Assigned(k), Some(v)) => {
                self.assigned.insert(k, v);
            }
            (Change::Assigned(k), None) => {
                self.assigned.remove(&k);
            }
            (Change::List(list, k), Some(v)) => {
                self.table_mut(list).insert(k, v);
            }
            (Change::List(list, k), None) => {
                self.table_mut(list).remove(&k);
            }
            (Change::Reset, _) => {}
        }
    }

    fn table(&self, list: List) -> &BTreeMap<String, String> {
        match list {
            List::Deny => &self.deny,
            List::Allow => &self.allow,
        }
    }

    fn table_mut(&mut self, list: List) -> &mut BTreeMap<String, String> {
        match list {
            List::Deny => &mut self.deny,
            List::Allow => &mut self.allow,
        }
    }

    /// Every list entry in force at `now` (Unix ms): its list, policy
    /// (`None`: every policy), target and end (0: never). Entries that do
    /// not read (written by hand, or by a newer version) are skipped.
    fn entries(&self, now: u64) -> impl Iterator<Item = (List, Option<&str>, Listed, u64)> {
        [List::Deny, List::Allow].into_iter().flat_map(move |list| {
            self.table(list).iter().filter_map(move |(field, ends)| {
                let (scope, listed, ends) = read_entry(field, ends, now)?;
                in_force(ends, now).then_some((list, scope, listed, ends))
            })
        })
    }

    /// How many list entries are in force at `now`, and whether `field`
    /// of `list` is one of them.
    fn listed(&self, list: List, field: &str, now: u64) -> (usize, bool) {
        let count = self.entries(now).count();
        let present = self.table(list).get(field).is_some_and(|ends| {
            read_entry(field, ends, now).is_some_and(|(_, _, ends)| in_force(ends, now))
        });
        (count, present)
    }

    /// Up to `max` fields of `list` whose entries have ended by `now`, each
    /// with its stored value (to be deleted only if still that). Entries
    /// this version cannot read are left alone: a newer one may.
    fn ended(&self, list: List, now: u64, max: usize) -> Vec<(String, String)> {
        self.table(list)
            .iter()
            .filter(|(field, ends)| {
                read_entry(field, ends, now).is_some_and(|(_, _, ends)| !in_force(ends, now))
            })
            .take(max)
            .map(|(f, e)| (f.clone(), e.clone()))
            .collect()
    }

    #[cfg(feature = "redis")]
    fn from_snapshot(snapshot: &redis_live::Snapshot) -> Self {
        use redis_live::Table;
        let split = |field: &str| {
            field
                .split_once(' ')
                .map(|(a, b)| (a.to_owned(), b.to_owned()))
        };
        // Written past this crate's bounds (by hand, say), a table is read
        // only up to them.
        let table = |t| snapshot.table(t).iter().take(MAX_IDENTITIES);
        Changes {
            policies: table(Table::Policies).cloned().collect(),
            overrides: table(Table::Overrides)
                .filter_map(|(f, v)| Some((split(f)?, v.clone())))
                .collect(),
            plans: table(Table::Plans)
                .filter_map(|(f, v)| Some((split(f)?, v.clone())))
                .collect(),
            assigned: table(Table::Assigned).cloned().collect(),
            deny: table(Table::Deny).cloned().collect(),
            allow: table(Table::Allow).cloned().collect(),
        }
    }
}

impl State {
    fn knows(&self, name: &str) -> bool {
        self.limiters.contains_key(name) || self.concurrency.contains_key(name)
    }

    fn has_plan(&self, plan: &str) -> bool {
        self.plans.contains_key(plan) || self.changes.plans.keys().any(|(p, _)| p == plan)
    }

    /// Refuses recording `change` (a set, not a removal) when it would
    /// add an identity, or a list entry, past the bound.
    fn within_bounds(&self, change: &Change) -> Result<(), ConfigError> {
        if let Change::List(list, field) = change {
            let (count, present) = self.changes.listed(*list, field, now_ms());
            if !present && count >= MAX_LISTED {
                return Err(ConfigError::TooManyListed { max: MAX_LISTED });
            }
            return Ok(());
        }
        let count = self.changes.overrides.len() + self.changes.assigned.len();
        let new = match change {
            Change::Override(p, k) => !self.changes.overrides.contains_key(&(p.clone(), k.clone())),
            Change::Assigned(k) => !self.changes.assigned.contains_key(k),
            _ => false,
        };
        if new && count >= MAX_IDENTITIES {
            return Err(ConfigError::TooManyIdentities {
                max: MAX_IDENTITIES,
            });
        }
        Ok(())
    }

    fn apply_all(&mut self) {
        self.read_lists();
        for name in self.limiters.keys() {
            self.apply_one(name);
        }
        for (name, limiter) in &self.concurrency {
            limiter.set_lists(self.lists_for(name));
        }
    }

    /// Reads the deny and allow tables into [`ReadLists`] when they
    /// changed since last read.
    fn read_lists(&mut self) {
        let read = &self.lists;
        if read.deny == self.changes.deny && read.allow == self.changes.allow {
            return;
        }
        let mut every = Vec::new();
        let mut own: HashMap<String, Vec<_>> = HashMap::new();
        for (list, scope, listed, ends) in self.changes.entries(now_ms()) {
            match scope {
                None => every.push((list, listed, ends)),
                Some(policy) => own
                    .entry(policy.to_owned())
                    .or_default()
                    .push((list, listed, ends)),
            }
        }
        self.lists = ReadLists {
            deny: self.changes.deny.clone(),
            allow: self.changes.allow.clone(),
            every: Arc::new(ListSet::new(every)),
            own: own
                .into_iter()
                .map(|(policy, entries)| (policy, Arc::new(ListSet::new(entries))))
                .collect(),
        };
    }

    /// The deny and allow entries of policy `name`: its own and those for
    /// every policy, as last read.
    fn lists_for(&self, name: &str) -> Lists {
        let own = self.lists.own.get(name).cloned().unwrap_or_default();
        Lists::new(self.lists.every.clone(), own)
    }

    /// Builds the rules of policy `name` from its default and the changes,
    /// and swaps them in. A stored text that no longer parses (written by
    /// a newer version, say) is skipped and logged: the limits in force
    /// where it applies stay (on a fresh start, those from code).
    fn apply_one(&self, name: &str) {
        let Some(registered) = self.limiters.get(name) else {
            return;
        };
        let parse = |what: &str, text: &str| match text
            .parse::<PolicySpec>()
            .map_err(LiveError::from)
            .and_then(|spec| Ok(spec.build(name)?))
        {
            Ok(policy) => Some(policy),
            Err(err) => {
                if LIVE_WARNINGS.allow() {
                    tracing::warn!(policy = name, what, text, error = %err, "live policy text refused; kept the previous limits");
                }
                None
            }
        };
        // What a text that does not parse leaves in force: the limits of
        // the rules it would have replaced.
        let previous = registered.cell.rules();
        let base = match self.changes.policies.get(name) {
            Some(text) => parse("policy", text).unwrap_or_else(|| previous.base.clone()),
            None => registered.default.clone(),
        };
        let mut by_plan: HashMap<Arc<str>, Policy> = HashMap::new();
        for (plan, policies) in &self.plans {
            if let Some(policy) = policies.get(name) {
                by_plan.insert(Arc::from(plan.as_str()), policy.clone());
            }
        }
        for ((plan, policy), text) in &self.changes.plans {
            if policy != name {
                continue;
            }
            let plan = plan.as_str();
            if let Some(policy) =
                parse("plan", text).or_else(|| previous.by_plan.get(plan).cloned())
            {
                by_plan.insert(Arc::from(plan), policy);
            }
        }
        let mut by_key = HashMap::new();
        for (key, plan) in &self.changes.assigned {
            if let Some(policy) = by_plan.get(plan.as_str()) {
                by_key.insert(Key::new(key), policy.clone());
            }
        }
        for ((policy, key), text) in &self.changes.overrides {
            if policy != name {
                continue;
            }
            let key = Key::new(key);
            if let Some(policy) =
                parse("override", text).or_else(|| previous.by_key.get(&key).cloned())
            {
                by_key.insert(key, policy);
            }
        }
        registered.cell.set(Rules {
            base,
            by_key,
            by_plan,
            lists: self.lists_for(name),
        });
    }
}

/// A stored list entry, read: its policy (`None`: every policy), target
/// and end (Unix ms, 0 for never); `None` unless this version could have
/// written it, the end no further than the longest entry allows (and a
/// day for clocks that disagree) from `now`.
fn read_entry<'a>(field: &'a str, ends: &str, now: u64) -> Option<(Option<&'a str>, Listed, u64)> {
    let ends: u64 = ends.parse().ok()?;
    let longest = u64::try_from(MAX_LIST_EXPIRY.as_millis()).unwrap_or(u64::MAX);
    if ends > now.saturating_add(longest).saturating_add(86_400_000) {
        return None;
    }
    let (scope, listed) = parse_list_field(field)?;
    Some((scope, listed, ends))
}

/// Whether an entry ending at `ends` (0: never) is in force at `now`.
fn in_force(ends: u64, now: u64) -> bool {
    ends == 0 || ends > now
}

/// A list entry's stored field: `{policy|*} k {key}` or `{policy|*} n
/// {network}`.
fn parse_list_field(field: &str) -> Option<(Option<&str>, Listed)> {
    let (scope, rest) = field.split_once(' ')?;
    let scope = (scope != "*").then_some(scope);
    match rest.split_once(' ')? {
        ("k", key) => Some((scope, Listed::Key(Key::new(key)))),
        ("n", net) => Some((scope, Listed::Net(net.parse().ok()?))),
        _ => None,
    }
}

#[cfg(feature = "redis")]
fn spawn_sync(fleet: Weak<Fleet>) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let poll = match fleet.upgrade() {
        Some(f) => f.lock().poll,
        None => return,
    };
    runtime.spawn(async move {
        let mut ticks = tokio::time::interval(poll);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last_beat = tokio::time::Instant::now();
        loop {
            ticks.tick().await;
            let Some(fleet) = fleet.upgrade() else { return };
            let result = if last_beat.elapsed() >= HEARTBEAT {
                last_beat = tokio::time::Instant::now();
                match fleet.heartbeat().await {
                    Ok(()) => fleet.poll().await,
                    Err(err) => Err(err),
                }
            } else {
                fleet.poll().await
            };
            if let Err(err) = result
                && LIVE_WARNINGS.allow()
            {
                tracing::warn!(error = %err, "live policies: reading the fleet's changes failed; keeping the current limits");
            }
        }
    });
}

/// A random id for this instance: 16 hex digits from the OS's hasher
/// seed, the clock and the process id.
fn instance_id() -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos(),
    );
    h.write_u32(std::process::id());
    format!("{:016x}", h.finish())
}

#[cfg(feature = "redis")]
fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(feature = "redis")]
fn millis(t: SystemTime) -> u64 {
    ms(t.duration_since(UNIX_EPOCH).unwrap_or_default())
}

/// The limit an instance published for `name` in its `name=limit ...`
/// text; `None` if it published none (or garbage).
#[cfg(feature = "redis")]
fn published_limit(text: &str, name: &str) -> Option<u64> {
    text.split(' ')
        .filter_map(|pair| pair.split_once('='))
        .find(|(n, _)| *n == name)
        .and_then(|(_, limit)| limit.parse().ok())
}

/// `started last_seen address`, as the heartbeat script stores it.
#[cfg(feature = "redis")]
fn parse_heartbeat(id: &str, value: &str) -> Option<Instance> {
    let mut parts = value.splitn(3, ' ');
    let started: u64 = parts.next()?.parse().ok()?;
    let seen: u64 = parts.next()?.parse().ok()?;
    let address = parts.next().unwrap_or("").to_owned();
    Some(Instance {
        id: id.to_owned(),
        address,
        started: UNIX_EPOCH + Duration::from_millis(started),
        last_seen: UNIX_EPOCH + Duration::from_millis(seen),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemoryStore;

    fn too_many(result: Result<(), LiveError>) {
        match result {
            Err(LiveError::Config(ConfigError::TooManyIdentities { max })) => {
                assert_eq!(max, MAX_IDENTITIES);
            }
            other => panic!("{other:?}"),
        }
    }

    /// The bound on identities with limits of their own, which no test can
    /// reach through the public calls in reasonable time (each change rebuilds
    /// every rule): filled here from inside.
    #[tokio::test]
    async fn identities_past_the_bound_are_refused() {
        let live = LivePolicies::new(MemoryStore::new());
        let policy = |text: &str| text.parse::<PolicySpec>().unwrap().build("api").unwrap();
        let api = live.limiter(policy("1/h"));
        live.define_plan("pro", policy("3/h")).unwrap();
        {
            let mut state = live.fleet.lock();
            for i in 0..MAX_IDENTITIES - 1 {
                let field = ("api".to_owned(), format!("user:{i}"));
                state.changes.overrides.insert(field, "2/h".to_owned());
            }
            let assigned = &mut state.changes.assigned;
            assigned.insert("user:planned".to_owned(), "pro".to_owned());
        }
        let new = Key::new("user:new");
        too_many(live.set_override("api", &new, Some("5/h")).await);
        too_many(live.assign_plan(&new, Some("pro")).await);
        assert!(api.check_now(&new, 1).unwrap().is_allowed());
        assert!(!api.check_now(&new, 1).unwrap().is_allowed());

        // Identities already counted may change; removing one makes room.
        live.set_override("api", &Key::new("user:7"), Some("4/h"))
            .await
            .unwrap();
        live.assign_plan(&Key::new("user:planned"), None)
            .await
            .unwrap();
        live.set_override("api", &new, Some("1/h burst 3"))
            .await
            .unwrap();
        too_many(live.assign_plan(&Key::new("user:late"), Some("pro")).await);
        // Its own limits: 2 more of 3 (the base would refuse).
        assert!(api.check_now(&new, 1).unwrap().is_allowed());
        assert!(api.check_now(&new, 1).unwrap().is_allowed());
        assert!(!api.check_now(&new, 1).unwrap().is_allowed());
    }

    /// The bound on list entries in force, filled from inside as above;
    /// ended entries do not count, and the next write prunes them.
    #[tokio::test]
    async fn list_entries_past_the_bound_are_refused() {
        let live = LivePolicies::new(MemoryStore::new());
        let _api = live.limiter("1/h".parse::<PolicySpec>().unwrap().build("api").unwrap());
        {
            let mut state = live.fleet.lock();
            for i in 0..MAX_LISTED - 1 {
                let field = format!("* k user:{i}");
                state.changes.deny.insert(field, "0".to_owned());
            }
            state
                .changes
                .allow
                .insert("* k user:ended".to_owned(), "1".to_owned());
        }
        let key = |name: &str| Key::new(format!("user:{name}"));
        live.allow(None, key("last"), None).await.unwrap();
        match live.deny(Some("api"), key("over"), None).await {
            Err(LiveError::Config(ConfigError::TooManyListed { max })) => {
                assert_eq!(max, MAX_LISTED)
            }
            other => panic!("{other:?}"),
        }
        assert!(
            !live
                .fleet
                .lock()
                .changes
                .allow
                .contains_key("* k user:ended")
        );
        // An entry already listed may change; taking one off makes room.
        live.deny(None, key("7"), Some(Duration::from_secs(60)))
            .await
            .unwrap();
        live.unlist(List::Deny, None, key("8")).await.unwrap();
        live.deny(Some("api"), key("over"), None).await.unwrap();
        assert_eq!(live.lists().len(), MAX_LISTED);
    }

    /// Every limiter shares one value of the entries for every policy, and
    /// a change of anything but the lists reads none of them again.
    #[tokio::test]
    async fn limiters_share_the_entries_for_every_policy() {
        let live = LivePolicies::new(MemoryStore::new());
        let policy = |name: &str| "1/h".parse::<PolicySpec>().unwrap().build(name).unwrap();
        let (a, b) = (live.limiter(policy("a")), live.limiter(policy("b")));
        live.deny(None, Key::new("user:x"), None).await.unwrap();
        live.deny(Some("a"), Key::new("user:y"), None)
            .await
            .unwrap();
        let every = |l: &Limiter| l.cell().rules().lists.every().clone();
        assert!(Arc::ptr_eq(&every(&a), &every(&b)));
        let before = every(&a);
        live.set_policy("b", "2/h").await.unwrap();
        assert!(
            Arc::ptr_eq(&every(&a), &before),
            "re-read without a list change"
        );
        assert!(Arc::ptr_eq(&every(&b), &before));
        live.allow(None, Key::new("user:z"), None).await.unwrap();
        assert!(!Arc::ptr_eq(&every(&a), &before), "a list change is read");
    }

    #[test]
    fn list_fields_are_read_back_or_skipped() {
        let field =
            |f: &str| parse_list_field(f).map(|(p, l)| (p.map(str::to_owned), l.to_string()));
        assert_eq!(field("* k user:a b"), Some((None, "user:a b".to_owned())));
        assert_eq!(
            field("api n 10.0.0.0/8"),
            Some((Some("api".to_owned()), "10.0.0.0/8".to_owned()))
        );
        for bad in [
            "",
            "*",
            "* k",
            "* x y",
            "api n 10.0.0.0/33",
            "api n nonsense",
        ] {
            assert_eq!(field(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn poll_every_applies_to_every_clone() {
        let live = LivePolicies::new(crate::MemoryStore::new());
        let other = live.clone();
        let live = live.poll_every(Duration::from_millis(40));
        assert_eq!(other.fleet.lock().poll, Duration::from_millis(40));
        let live = live.poll_every(Duration::ZERO);
        assert_eq!(live.fleet.lock().poll, Duration::from_millis(10));
    }
}
