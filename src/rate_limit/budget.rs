//! A retry budget shared by the fleet: retries allowed as a share of
//! first attempts plus a minimum per second, counted in the store.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::time::Instant;

use crate::algorithm::budget::{Params, SLOTS};
use crate::error::{ConfigError, StoreError};
use crate::metrics;
use crate::observe::OutboundStats;
use crate::policy::check_name;
use crate::store::{BudgetCall, BudgetTake, Store};

/// Retries allowed as a share of first attempts, for one upstream, across
/// every instance that shares the store: each first attempt credits
/// `ratio` of a token, `min_per_second` tokens are credited every second
/// whatever the traffic, tokens expire after `ttl` (10 s by default), and
/// each retry spends one. When the upstream fails everything, the fleet's
/// retries stay at or below
///
/// ```text
/// ratio × first attempts + min_per_second × (seconds + 2 × ttl / 10)
/// ```
///
/// over any stretch of `seconds` (the minimum of each tenth of the `ttl`
/// is credited when it begins, the first one's whole wherever the
/// stretch starts in it), however many instances and callers there are:
/// retries stop multiplying the load just when the upstream can least
/// take it.
///
/// On a [`MemoryStore`](crate::MemoryStore) the budget is this process's,
/// decided at each call. On a [`RedisStore`](crate::RedisStore) it is the
/// fleet's, and no retry waits for Redis: each instance reports its first
/// attempts and leases tokens in batches ([`lease`](RetryBudgetBuilder::lease),
/// 10 by default) in one script, at most once a tenth of the `ttl` while
/// it only reports, and as soon as its tokens run low for a `ttl` after a
/// retry was wanted. [`try_withdraw`](Self::try_withdraw) decides at once
/// from the tokens held: the first retry of an instance that holds none
/// is refused, and asks for a lease;
/// [`withdraw`](Self::withdraw) waits for that lease instead. Leased
/// tokens come out of the shared count, so leasing adds nothing to the
/// bound (at most one lease an instance holds may expire unspent); held
/// tokens expire a `ttl` after the last lease. Instances that share a
/// budget should agree on its settings: the `ttl` sets the unit of the
/// stored slots (a state from another `ttl` far ahead of the clock starts
/// afresh).
///
/// When the store fails (Redis gone or slow past its timeout), the first
/// attempts being reported are dropped and the instance spends what it
/// holds, then retries nothing until the store answers again, a tenth of
/// the `ttl` later at the earliest (without a round trip meanwhile): a
/// fleet that cannot count its retries does not retry.
///
/// Use it through [`RetryPolicy`](crate::rate_limit::RetryPolicy) (a
/// `tower::retry::Policy`, feature `retry`), through
/// [`grpc::retry`](crate::grpc::retry) for gRPC clients (feature `grpc`),
/// or from a policy of one's own: [`deposit`](Self::deposit) on each first
/// attempt, [`try_withdraw`](Self::try_withdraw) before each retry.
///
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
/// use fleetgate::MemoryStore;
/// use fleetgate::clock::ManualClock;
/// use fleetgate::rate_limit::RetryBudget;
///
/// # fn main() -> Result<(), fleetgate::ConfigError> {
/// let clock = ManualClock::new(Duration::from_secs(100));
/// let store = MemoryStore::builder().clock(clock.clone()).build();
/// let budget = RetryBudget::new(Arc::new(store))
///     .ratio(0.1)
///     .min_per_second(10)
///     .build("payments")?;
/// for _ in 0..100 {
///     budget.deposit();
/// }
/// // 10 from the first attempts, 10 from this second's minimum.
/// let retries = (0..50).filter(|_| budget.try_withdraw()).count();
/// assert_eq!(retries, 20);
/// // A second later, that second's minimum.
/// clock.advance(Duration::from_secs(1));
/// assert_eq!((0..50).filter(|_| budget.try_withdraw()).count(), 10);
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct RetryBudget {
    shared: Arc<Shared>,
}

struct Shared {
    name: Arc<str>,
    store: Arc<dyn Store>,
    params: Params,
    /// How long held tokens live after the last lease, and how long
    /// after a retry the tokens are kept topped up; a tenth of it (a
    /// slot) is how often first attempts are reported at most.
    ttl: Duration,
    /// Tokens asked for at a time (1 where the store answers at once).
    lease: u64,
    /// The store answers without I/O (the memory store): every call goes
    /// to it, nothing is held here.
    immediate: bool,
    local: Mutex<Local>,
    stats: Counters,
    /// The counters of every budget of this name, for `observe`.
    observed: Arc<OutboundStats>,
}

/// What a budget counts.
#[derive(Clone, Copy)]
enum Event {
    First,
    Retry,
    Refused,
    StoreError,
}

/// What this instance holds between two calls to the store.
struct Local {
    /// First attempts not yet reported.
    pending: u64,
    /// Leased tokens not yet spent, and when they expire.
    tokens: u64,
    tokens_until: Instant,
    /// A call to the store is on its way.
    syncing: bool,
    last_sync: Instant,
    /// Asks for no tokens in the background before then: the store had
    /// too few, or failed.
    quiet_until: Option<Instant>,
    /// The store failed: no call to it before then.
    failed_until: Option<Instant>,
    /// Tops the tokens up while retries were wanted lately (a ttl).
    wanted_until: Option<Instant>,
}

#[derive(Default)]
struct Counters {
    first: AtomicU64,
    spent: AtomicU64,
    refused: AtomicU64,
    store_errors: AtomicU64,
}

/// What a [`RetryBudget`] has counted in this process since it was built:
/// read with [`RetryBudget::stats`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RetryBudgetStats {
    /// First attempts deposited.
    pub first_attempts: u64,
    /// Retries allowed (tokens spent).
    pub retries: u64,
    /// Retries refused for want of a token.
    pub refused: u64,
    /// Calls to the store that failed.
    pub store_errors: u64,
}

/// Builds a [`RetryBudget`]: [`ratio`](Self::ratio) (default 0.1, from 0
/// to 10), [`min_per_second`](Self::min_per_second) (default 10, at most
/// a million), [`ttl`](Self::ttl) (default 10 s, from 1 s to 1 hour) and
/// [`lease`](Self::lease) (default 10, from 1 to 1,000).
#[derive(Clone, Debug)]
pub struct RetryBudgetBuilder {
    store: Arc<dyn Store>,
    ratio: f64,
    min_per_second: u32,
    ttl: Duration,
    lease: u32,
}

impl RetryBudget {
    /// Starts building a budget kept in `store`.
    #[allow(clippy::new_ret_no_self)]
    pub fn new(store: Arc<dyn Store>) -> RetryBudgetBuilder {
        RetryBudgetBuilder {
            store,
            ratio: 0.1,
            min_per_second: 10,
            ttl: Duration::from_secs(10),
            lease: 10,
        }
    }
}

impl RetryBudgetBuilder {
    /// Tokens credited per first attempt: 0.1 allows one retry per ten
    /// first attempts.
    pub fn ratio(mut self, ratio: f64) -> Self {
        self.ratio = ratio;
        self
    }

    /// Retries allowed per second whatever the traffic, so that a quiet
    /// client can still retry (shared by the fleet, as the ratio is).
    pub fn min_per_second(mut self, min_per_second: u32) -> Self {
        self.min_per_second = min_per_second;
        self
    }

    /// How long a credited token may wait to be spent.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// Tokens an instance leases at a time from a store shared by the
    /// fleet: more means fewer round trips, and more tokens one instance
    /// may hold while another has none.
    pub fn lease(mut self, lease: u32) -> Self {
        self.lease = lease;
        self
    }

    /// Checks the settings and builds the budget `name` (the upstream's:
    /// every instance that names it shares it).
    pub fn build(self, name: &str) -> Result<RetryBudget, ConfigError> {
        let invalid = |detail: String| {
            Err(ConfigError::RetryBudget {
                name: name.to_owned(),
                detail,
            })
        };
        check_name(name)?;
        if !(self.ratio.is_finite() && (0.0..=10.0).contains(&self.ratio)) {
            return invalid(format!("ratio {} is outside 0 ..= 10", self.ratio));
        }
        if self.min_per_second > 1_000_000 {
            return invalid(format!(
                "min_per_second {} is above 1,000,000",
                self.min_per_second
            ));
        }
        // Thousandths, rounded down: never more than the ratio asked for.
        let ratio_milli = (self.ratio * 1000.0).floor() as u64;
        if ratio_milli == 0 && self.min_per_second == 0 {
            return invalid("a ratio of 0 and no minimum never allow a retry".into());
        }
        if !(Duration::from_secs(1)..=Duration::from_secs(3600)).contains(&self.ttl) {
            return invalid(format!("ttl {:?} is outside 1 s ..= 1 h", self.ttl));
        }
        if !(1..=1000).contains(&self.lease) {
            return invalid(format!("lease {} is outside 1 ..= 1000", self.lease));
        }
        let slot = self.ttl / SLOTS as u32;
        let slot_us = slot.as_micros() as u64;
        let immediate = self.store.kind() == "memory";
        Ok(RetryBudget {
            shared: Arc::new(Shared {
                name: name.into(),
                params: Params {
                    ratio_milli,
                    min_milli_per_slot: u64::from(self.min_per_second) * slot_us / 1000,
                    slot_us,
                },
                store: self.store,
                ttl: self.ttl,
                lease: if immediate { 1 } else { self.lease.into() },
                immediate,
                local: Mutex::new(Local {
                    pending: 0,
                    tokens: 0,
                    tokens_until: Instant::now(),
                    syncing: false,
                    // The first report comes a slot after the build.
                    last_sync: Instant::now(),
                    quiet_until: None,
                    failed_until: None,
                    wanted_until: None,
                }),
                stats: Counters::default(),
                observed: OutboundStats::budget(name),
            }),
        })
    }
}

impl RetryBudget {
    /// The budget's name.
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// Counts a first attempt: credits `ratio` of a token (reported to
    /// the store with the next lease, or within a tenth of the `ttl`).
    pub fn deposit(&self) {
        self.shared.count(Event::First);
        let mut local = self.shared.local();
        local.pending += 1;
        self.maybe_sync(local, Instant::now());
    }

    /// Spends a token for a retry if there is one: `true` when the retry
    /// may go. Never waits: on a shared store it spends a token this
    /// instance leased, and asks for more in the background when they run
    /// low (so the first retry of an instance that holds none is refused).
    pub fn try_withdraw(&self) -> bool {
        let shared = &*self.shared;
        let now = Instant::now();
        let mut local = shared.local();
        shared.wanted(&mut local, now);
        if shared.immediate && local.tokens == 0 {
            self.sync(local, now, 1);
            local = shared.local();
        }
        let allowed = shared.spend(&mut local);
        self.maybe_sync(local, now);
        allowed
    }

    /// Spends a token for a retry, asking the store when this instance
    /// holds none (one round trip on Redis, with the first attempts not
    /// yet reported): for callers that can wait for the store, such as an
    /// async retry loop. `false` when the budget has no token, or the
    /// store failed.
    pub async fn withdraw(&self) -> bool {
        let shared = &*self.shared;
        let (future, want, guard) = {
            let now = Instant::now();
            let mut local = shared.local();
            shared.wanted(&mut local, now);
            // Held tokens; or none while the store is failing: no round
            // trip then.
            if local.tokens > 0 || local.failed_until.is_some_and(|until| now < until) {
                return shared.spend(&mut local);
            }
            // A batch already on its way is this instance's: ask for one.
            let (want, guard) = if local.syncing {
                (1, None)
            } else {
                local.syncing = true;
                (shared.lease, Some(Syncing(self.shared.clone())))
            };
            let deposits = std::mem::take(&mut local.pending);
            local.last_sync = now;
            (
                shared.store.budget(shared.call(deposits, want)),
                want,
                guard,
            )
        };
        let result = future.await;
        drop(guard);
        let mut local = shared.local();
        shared.apply(&mut local, result, Instant::now(), want);
        shared.spend(&mut local)
    }

    /// What this process has counted.
    pub fn stats(&self) -> RetryBudgetStats {
        let stats = &self.shared.stats;
        RetryBudgetStats {
            first_attempts: stats.first.load(Ordering::Relaxed),
            retries: stats.spent.load(Ordering::Relaxed),
            refused: stats.refused.load(Ordering::Relaxed),
            store_errors: stats.store_errors.load(Ordering::Relaxed),
        }
    }
}

impl RetryBudget {
    /// Calls the store if it is due: reports first attempts once a slot,
    /// and leases tokens when they run low while retries are wanted.
    fn maybe_sync(&self, local: MutexGuard<'_, Local>, now: Instant) {
        let shared = &*self.shared;
        if shared.immediate {
            if local.pending > 0 {
                self.sync(local, now, 0);
            }
            return;
        }
        if local.syncing {
            return;
        }
        let want = shared.want(&local, now);
        let report_due =
            local.pending > 0 && now.saturating_duration_since(local.last_sync) >= shared.slot();
        if want > 0 || report_due {
            self.sync(local, now, want);
        }
    }

    /// Reports the pending first attempts and asks for `want` tokens: at
    /// once on a store that answers without I/O, else in a task.
    fn sync(&self, mut local: MutexGuard<'_, Local>, now: Instant, want: u64) {
        let shared = &*self.shared;
        let deposits = std::mem::take(&mut local.pending);
        let mut future = shared.store.budget(shared.call(deposits, want));
        if let Some(result) = future.take_ready() {
            shared.apply(&mut local, result, now, want);
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            // No runtime to wait in: report later.
            local.pending += deposits;
            return;
        };
        local.syncing = true;
        local.last_sync = now;
        drop(local);
        let shared = self.shared.clone();
        // Cleared however the task ends: a runtime that shuts down drops
        // it unfinished.
        let guard = Syncing(shared.clone());
        runtime.spawn(async move {
            let result = future.await;
            drop(guard);
            let mut local = shared.local();
            shared.apply(&mut local, result, Instant::now(), want);
        });
    }
}

/// A call to the store on its way: `syncing` until dropped.
struct Syncing(Arc<Shared>);

impl Drop for Syncing {
    fn drop(&mut self) {
        self.0.local().syncing = false;
    }
}

impl Local {
    /// The tokens held now.
    fn held(&self, now: Instant) -> u64 {
        if self.tokens_until > now {
            self.tokens
        } else {
            0
        }
    }
}

impl Shared {
    /// A tenth of the ttl: the store's slot.
    fn slot(&self) -> Duration {
        self.ttl / SLOTS as u32
    }

    /// A retry is wanted now: keeps the tokens topped up for a ttl, and
    /// drops the held ones that have expired.
    fn wanted(&self, local: &mut Local, now: Instant) {
        local.wanted_until = Some(now + self.ttl);
        local.tokens = local.held(now);
    }

    fn count(&self, event: Event) {
        let (own, observed, result) = match event {
            Event::First => (&self.stats.first, OutboundStats::FIRST, "first_attempt"),
            Event::Retry => (&self.stats.spent, OutboundStats::RETRIES, "retry"),
            Event::Refused => (&self.stats.refused, OutboundStats::REFUSED, "refused"),
            Event::StoreError => (&self.stats.store_errors, OutboundStats::STORE_ERRORS, ""),
        };
        own.fetch_add(1, Ordering::Relaxed);
        self.observed.add(observed);
        // Store errors are the store's metric (`op` = `budget`).
        if !result.is_empty() {
            metrics::budget_event(&self.name, result);
        }
    }

    /// Spends a held token, if there is one, and counts the retry or the
    /// refusal.
    fn spend(&self, local: &mut Local) -> bool {
        let allowed = local.tokens > 0;
        if allowed {
            local.tokens -= 1;
            self.count(Event::Retry);
        } else {
            self.count(Event::Refused);
        }
        allowed
    }

    fn local(&self) -> MutexGuard<'_, Local> {
        self.local.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn call(&self, deposits: u64, want: u64) -> BudgetCall<'_> {
        BudgetCall {
            name: &self.name,
            params: self.params,
            deposits,
            want,
        }
    }

    /// Tokens to ask for now: the lease less what is held, when retries
    /// were wanted lately, the tokens are under half a lease and the store
    /// has not said lately that it has too few.
    fn want(&self, local: &Local, now: Instant) -> u64 {
        let wanted = local.wanted_until.is_some_and(|until| now < until);
        let quiet = local.quiet_until.is_some_and(|until| now < until);
        let held = local.held(now);
        if wanted && !quiet && held * 2 < self.lease.max(2) {
            self.lease - held.min(self.lease)
        } else {
            0
        }
    }

    fn apply(
        &self,
        local: &mut Local,
        result: Result<BudgetTake, StoreError>,
        now: Instant,
        want: u64,
    ) {
        match result {
            Ok(take) => {
                if take.granted > 0 {
                    local.tokens = local.held(now).saturating_add(take.granted);
                    local.tokens_until = now + self.ttl;
                }
                if take.granted < want {
                    local.quiet_until = Some(now + self.slot() / 4);
                }
            }
            Err(err) => {
                self.count(Event::StoreError);
                local.quiet_until = Some(now + self.slot());
                local.failed_until = local.quiet_until;
                tracing::warn!(budget = %self.name, error = %err, "retry budget: the store failed; no retries until it answers");
            }
        }
    }
}

/// The delay before retry `nth` (0 for the first): drawn at random below
/// `base · 2^nth` (full jitter, so that retries of many callers spread).
#[cfg(any(feature = "retry", feature = "grpc"))]
pub(crate) fn backoff(base: Duration, nth: u32) -> Duration {
    base.saturating_mul(1 << nth.min(16))
        .mul_f64(fastrand::f64())
}

impl fmt::Debug for RetryBudget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let shared = &*self.shared;
        f.debug_struct("RetryBudget")
            .field("name", &shared.name)
            .field("store", &shared.store.kind())
            .field("ratio", &(shared.params.ratio_milli as f64 / 1000.0))
            .field(
                "min_per_second",
                &(shared.params.min_milli_per_slot * 1000 / shared.params.slot_us.max(1)),
            )
            .field("ttl", &shared.ttl)
            .field("lease", &shared.lease)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemoryStore;
    use crate::clock::ManualClock;

    fn budget(clock: &ManualClock) -> RetryBudget {
        let store = MemoryStore::builder().clock(clock.clone()).build();
        RetryBudget::new(Arc::new(store))
            .ratio(0.1)
            .min_per_second(2)
            .build("upstream")
            .unwrap()
    }

    #[test]
    fn retries_stay_within_the_bound_while_everything_fails() {
        // 60 s of 50 first attempts a second, each retried while the
        // budget lets it.
        let clock = ManualClock::new(Duration::from_secs(1000));
        let budget = budget(&clock);
        for _ in 0..60 {
            for _ in 0..50 {
                budget.deposit();
                while budget.try_withdraw() {}
            }
            clock.advance(Duration::from_secs(1));
        }
        let stats = budget.stats();
        assert_eq!(stats.first_attempts, 3000);
        // 0.1 × 3000 + 2 × (60 + 1).
        assert!(stats.retries <= 300 + 122, "{stats:?}");
        assert!(stats.retries >= 300 + 118, "{stats:?}");
        assert!(stats.refused >= 3000, "{stats:?}");
    }

    #[tokio::test]
    async fn withdraw_waits_for_the_store_and_try_withdraw_does_not() {
        let clock = ManualClock::new(Duration::from_secs(1000));
        let budget = budget(&clock);
        for _ in 0..10 {
            budget.deposit();
        }
        // 1 from the first attempts, 2 from the second's minimum.
        assert!(budget.withdraw().await);
        assert!(budget.try_withdraw());
        assert!(budget.withdraw().await);
        assert!(!budget.withdraw().await);
        assert!(!budget.try_withdraw());
        assert_eq!(budget.stats().retries, 3);
    }

    #[test]
    fn clones_and_budgets_of_one_name_share_the_count() {
        let clock = ManualClock::new(Duration::from_secs(1000));
        let store: Arc<dyn Store> = Arc::new(MemoryStore::builder().clock(clock.clone()).build());
        let build = || {
            RetryBudget::new(store.clone())
                .min_per_second(3)
                .build("up")
                .unwrap()
        };
        let (a, b) = (build(), build());
        let c = a.clone();
        assert!(a.try_withdraw() && b.try_withdraw() && c.try_withdraw());
        assert!(!a.try_withdraw() && !b.try_withdraw());
        let other = RetryBudget::new(store)
            .min_per_second(3)
            .build("other")
            .unwrap();
        assert!(other.try_withdraw());
    }

    #[test]
    fn settings_are_checked() {
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
        let new = || RetryBudget::new(store.clone());
        assert!(new().build("up").is_ok());
        assert!(new().ratio(0.0).min_per_second(1).build("up").is_ok());
        assert!(new().build("").is_err());
        assert!(new().build("a b").is_err());
        for ratio in [-0.1, 10.1, f64::NAN, f64::INFINITY] {
            assert!(new().ratio(ratio).build("up").is_err(), "{ratio}");
        }
        assert!(new().ratio(0.0).min_per_second(0).build("up").is_err());
        assert!(new().min_per_second(1_000_001).build("up").is_err());
        for ttl in [
            Duration::ZERO,
            Duration::from_millis(999),
            Duration::from_secs(3601),
        ] {
            assert!(new().ttl(ttl).build("up").is_err(), "{ttl:?}");
        }
        for lease in [0, 1001] {
            assert!(new().lease(lease).build("up").is_err(), "{lease}");
        }
        let err = new().ratio(11.0).build("up").unwrap_err().to_string();
        assert!(err.contains("\"up\"") && err.contains("ratio 11"), "{err}");
    }
}
