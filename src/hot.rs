//! Hot keys decided in process: an instance takes a lease of a hot
//! identity's tokens from the store in one call and spends it here, so
//! that the store sees a few calls a second per hot identity instead of
//! one per request. What it promises is on [`HotKeys`].

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::algorithm::Algorithm;
use crate::decision::Decision;
use crate::error::{ConfigError, StoreError};
use crate::key::Key;
use crate::limit::Policy;
use crate::limiter::Limiter;
use crate::share::LocalShare;
use crate::store::{AdjustCall, Store, StoreFuture};

/// Hot-key mode for a [`Limiter`]: an identity seen more than
/// [`threshold`](Self::threshold) times a second on this instance is
/// decided here, from a lease of its tokens, instead of one store call per
/// request. Opt in with [`Limiter::hot_keys`]; every other identity keeps
/// the ordinary path.
///
/// **A lease** of `k` tokens is an ordinary decision of cost `k` in the
/// store (one round trip, charged to every limit of the policy), spent
/// here one call at a time. `k` is sized from this instance's calls for
/// the identity over the last second: enough for one
/// [`lease_time`](Self::lease_time) at that rate, at least the call's
/// cost, and at most the **largest lease**,
/// [`max_share`](Self::max_share) of the policy's smallest burst (1% by
/// default; never below 1). A lease the store refuses (it has fewer
/// tokens than asked) makes this instance refuse the identity locally
/// until the store's retry time, when the lease would fit, capped at one
/// lease time; it then asks again. Near the limit, calls are therefore
/// refused a little early rather than leased a few tokens at a time.
/// Tokens left when the lease time has passed are given back with a
/// refund ([`Limiter::refund`]), as are those still held when the limiter
/// is dropped inside a runtime. While a lease is on its way, other calls
/// for the identity wait for it rather than asking the store themselves.
///
/// **The bound.** Every call admitted here spends a token the store
/// charged earlier, and an instance holds at most one largest lease of an
/// identity at a time (tokens on their way back in a refund included). So
/// over any interval, `n` instances admit at most what the store alone
/// would have admitted plus `n` largest leases: those leased before the
/// interval began and spent (or refunded, which lets the store admit as
/// many again) within it. With the default 1%, that is at most 1% of the
/// burst per instance. Tokens never spent are charged all the same until
/// refunded: the error on the other side is an undercount of at most the
/// same size.
///
/// **Algorithms.** GCRA and [`Algorithm::SlidingWindow`] (the sliding
/// window counter). The sliding log and fixed window are refused when the
/// mode is set ([`ConfigError::HotKeysUnsupported`]); a per-identity policy
/// ([`LivePolicies`](crate::live::LivePolicies)) on one of those is
/// decided the ordinary way, as is a call whose cost is above the largest
/// lease and every call in reserve mode.
///
/// **Headers.** A call admitted from a lease reports as remaining the
/// tokens this instance still holds plus what the store had left after the
/// lease, and as reset what the store said then (at most a lease time
/// old). A local refusal reports 0 remaining and, as retry-after, when
/// this instance will ask the store again.
///
/// **Failures.** A lease the store fails on fails the call that asked for
/// it, and the layer's [`FailurePolicy`](crate::FailurePolicy) applies, as
/// for any decision; tokens already held are still spent.
///
/// **Memory.** At most [`max_keys`](Self::max_keys) identities are
/// tracked (10,000 by default, each a few dozen bytes); when the table is
/// full, identities idle for a second are forgotten, and new identities
/// take the ordinary path until there is room.
///
/// ```
/// use std::time::Duration;
/// use fleetgate::{HotKeys, Key, Limit, Limiter, LocalShare, MemoryStore, Policy, Rate};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let policy = Policy::single("tenant", Limit::builder(Rate::per_second(50_000)).build()?)?;
/// let hot = HotKeys::new()
///     .threshold(200)
///     .lease_time(Duration::from_millis(200))
///     .max_share(LocalShare::new(0.01)?);
/// // 1% of the burst of 50,000: an instance holds at most 500 tokens.
/// assert_eq!(hot.max_lease(&policy), 500);
/// // A RedisStore in production; any store works.
/// let limiter = Limiter::new(policy, MemoryStore::new()).hot_keys(hot)?;
/// assert!(limiter.check(&Key::new("tenant:big"), 1).await?.is_allowed());
/// # Ok(()) }
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HotKeys {
    threshold: u64,
    lease_time: Duration,
    share: LocalShare,
    max_keys: usize,
}

impl Default for HotKeys {
    fn default() -> Self {
        HotKeys::new()
    }
}

impl HotKeys {
    /// Hot above 100 calls a second, leases of 200 ms, at most 1% of the
    /// burst per lease, 10,000 identities tracked.
    pub fn new() -> Self {
        HotKeys {
            threshold: 100,
            lease_time: Duration::from_millis(200),
            share: LocalShare::one_of(100).unwrap_or(LocalShare::auto()),
            max_keys: 10_000,
        }
    }

    /// An identity is hot from `calls_per_second` calls in a second on
    /// this instance (at least 1).
    #[must_use]
    pub fn threshold(mut self, calls_per_second: u64) -> Self {
        self.threshold = calls_per_second;
        self
    }

    /// How long a lease's tokens are spent before what is left goes back
    /// to the store, and the span of calls a lease is sized for.
    #[must_use]
    pub fn lease_time(mut self, lease_time: Duration) -> Self {
        self.lease_time = lease_time;
        self
    }

    /// The largest lease, as a share of the policy's smallest burst (at
    /// least one token): with `n` instances, the fleet overshoots by at
    /// most `n` times this.
    #[must_use]
    pub fn max_share(mut self, share: LocalShare) -> Self {
        self.share = share;
        self
    }

    /// How many identities are tracked at most.
    #[must_use]
    pub fn max_keys(mut self, max_keys: usize) -> Self {
        self.max_keys = max_keys;
        self
    }

    /// The largest lease under `policy`, in tokens: what one instance may
    /// admit beyond the limit, at most.
    pub fn max_lease(&self, policy: &Policy) -> u64 {
        self.share.scale(policy.max_cost())
    }

    /// Whether the mode can apply to `policy`.
    pub(crate) fn check(&self, policy: &Policy) -> Result<(), ConfigError> {
        if self.lease_time.is_zero() || self.threshold == 0 {
            return Err(ConfigError::HotKeysZero);
        }
        match policy.algorithm() {
            Algorithm::Gcra | Algorithm::SlidingWindow => Ok(()),
            algorithm => Err(ConfigError::HotKeysUnsupported { algorithm }),
        }
    }

    fn lease_us(&self) -> u64 {
        u64::try_from(self.lease_time.as_micros()).unwrap_or(u64::MAX)
    }
}

/// The identities one limiter tracks, and the leases it holds.
pub(crate) struct HotTable {
    config: HotKeys,
    store: Arc<dyn Store>,
    state: Mutex<State>,
    /// Woken whenever a lease or refund in flight ends: the calls waiting
    /// for it look again.
    done: Arc<Notify>,
}

struct State {
    entries: HashMap<Key, Entry>,
    /// When the table was last pruned, so that a flood of new identities
    /// costs one scan per 100 ms at most.
    pruned: Option<Instant>,
    sweeping: bool,
}

/// One identity: its recent calls, and the lease held for it.
struct Entry {
    /// Start of the current one-second count, and the calls in it and in
    /// the second before.
    second: Instant,
    seen: u64,
    seen_before: u64,
    last: Instant,
    /// Tokens held, and until when they may be spent.
    held: u64,
    expires: Instant,
    /// After a refused lease: refused here until then.
    denied_until: Option<Instant>,
    /// What the store said at the last lease.
    limit: usize,
    remaining: u64,
    reset_us: u64,
    /// The policy the tokens were leased under, to give them back.
    policy: Option<Policy>,
    /// A lease or refund is in flight.
    busy: bool,
}

impl Entry {
    fn new(now: Instant) -> Self {
        Entry {
            second: now,
            seen: 0,
            seen_before: 0,
            last: now,
            held: 0,
            expires: now,
            denied_until: None,
            limit: 0,
            remaining: 0,
            reset_us: 0,
            policy: None,
            busy: false,
        }
    }

    /// Counts a call; the calls of the last full second, or of this one if
    /// more.
    fn count(&mut self, now: Instant) -> u64 {
        let elapsed = now.saturating_duration_since(self.second);
        if elapsed >= Duration::from_secs(1) {
            self.seen_before = if elapsed < Duration::from_secs(2) {
                self.seen
            } else {
                0
            };
            self.seen = 0;
            self.second = now;
        }
        self.seen = self.seen.saturating_add(1);
        self.last = now;
        self.seen.max(self.seen_before)
    }

    fn allowed(&self) -> Decision {
        Decision {
            allowed: true,
            limit: self.limit,
            remaining: self.remaining.saturating_add(self.held),
            reset_us: self.reset_us,
            retry_us: None,
            wait_us: 0,
            each: None,
        }
    }

    fn denied(&self, retry: Duration) -> Decision {
        Decision {
            allowed: false,
            limit: self.limit,
            remaining: 0,
            reset_us: self.reset_us,
            retry_us: Some(u64::try_from(retry.as_micros()).unwrap_or(u64::MAX)),
            wait_us: 0,
            each: None,
        }
    }

    /// Idle, holding nothing and refusing nothing: safe to forget.
    fn idle(&self, now: Instant) -> bool {
        !self.busy
            && self.held == 0
            && self.denied_until.is_none_or(|until| until <= now)
            && now.saturating_duration_since(self.last) >= Duration::from_secs(1)
    }
}

impl HotTable {
    pub(crate) fn new(config: HotKeys, store: Arc<dyn Store>) -> Self {
        HotTable {
            config,
            store,
            state: Mutex::new(State {
                entries: HashMap::new(),
                pruned: None,
                sweeping: false,
            }),
            done: Arc::new(Notify::new()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic elsewhere while holding the lock leaves counts that are
        // still counts: carry on with them.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Decides `cost` for `key` from this instance's lease, or takes one;
    /// `None` for the ordinary path (not hot, not tracked, or a policy or
    /// cost the mode does not cover).
    pub(crate) fn decide(
        self: &Arc<Self>,
        limiter: &Limiter,
        policy: &Policy,
        key: &Key,
        cost: u64,
    ) -> Option<StoreFuture<Decision>> {
        if !matches!(
            policy.algorithm(),
            Algorithm::Gcra | Algorithm::SlidingWindow
        ) {
            return None;
        }
        let cap = self.config.max_lease(policy);
        if cost == 0 || cost > cap {
            return None;
        }
        let now = Instant::now();
        let mut state = self.lock();
        if !state.entries.contains_key(key) {
            if !state.make_room(now, self.config.max_keys) {
                return None;
            }
            state.entries.insert(key.clone(), Entry::new(now));
        }
        let entry = state.entries.get_mut(key)?;
        if entry
            .policy
            .as_ref()
            .is_some_and(|leased| leased.as_ptr() != policy.as_ptr())
        {
            // Held under another policy (a plan or the identity's own
            // limits changed): decided the ordinary way until the sweep
            // gives those tokens back.
            return None;
        }
        let rate = entry.count(now);
        if entry.busy {
            let mut notified = Box::pin(Arc::clone(&self.done).notified_owned());
            // Registered before the lock is let go: the end of the lease in
            // flight cannot be missed.
            notified.as_mut().enable();
            drop(state);
            let (limiter, policy, key) = (limiter.clone(), policy.clone(), key.clone());
            return Some(StoreFuture::pending(async move {
                notified.await;
                limiter.decide_as(&policy, &key, cost, None).await
            }));
        }
        if now < entry.expires && entry.held >= cost {
            entry.held -= cost;
            return Some(StoreFuture::ready(Ok(entry.allowed())));
        }
        if let Some(until) = entry.denied_until {
            if now < until {
                return Some(StoreFuture::ready(Ok(entry.denied(until - now))));
            }
            entry.denied_until = None;
        }
        if rate < self.config.threshold {
            // Not hot (any tokens left are given back by the sweep).
            return None;
        }
        // Enough for one lease time at the rate seen, within the cap.
        let want = u128::from(rate) * u128::from(self.config.lease_us()) / 1_000_000 + 1;
        let want = u64::try_from(want).unwrap_or(u64::MAX);
        let asked = want.min(cap).max(cost);
        // Tokens left (expired, or too few for this cost) go back first, so
        // that what this instance holds or returns stays within one lease.
        let left = std::mem::take(&mut entry.held);
        let back = entry.policy.take().filter(|_| left > 0);
        entry.busy = true;
        let sweep = !std::mem::replace(&mut state.sweeping, true);
        drop(state);
        if sweep {
            self.start_sweeping();
        }
        let refund = back.map(|p| {
            self.store.refund(AdjustCall {
                policy: &p,
                key,
                cost: left,
            })
        });
        let busy = Busy {
            table: Arc::clone(self),
            key: key.clone(),
            armed: true,
        };
        let (limiter, policy) = (limiter.clone(), policy.clone());
        Some(StoreFuture::pending(async move {
            if let Some(refund) = refund {
                // A refund lost leaves the tokens charged: an undercount.
                let _ = refund.await;
            }
            let reply = limiter.decide_plain(&policy, &busy.key, asked).await;
            busy.finish(reply, &policy, asked, cost)
        }))
    }

    /// Drops what this instance holds or remembers of `key` (a lease in
    /// flight finds no entry and answers its call alone).
    pub(crate) fn forget(&self, key: &Key) {
        self.lock().entries.remove(key);
    }

    /// Starts the task that gives back what expired leases left and
    /// forgets idle identities, every lease time, for as long as the table
    /// lives; none outside a runtime (leftovers then go back when the
    /// identity is next decided).
    fn start_sweeping(self: &Arc<Self>) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            self.lock().sweeping = false;
            return;
        };
        let table = Arc::downgrade(self);
        let every = self.config.lease_time.max(Duration::from_millis(10));
        runtime.spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                let Some(table) = Weak::upgrade(&table) else {
                    return;
                };
                table.sweep(Instant::now());
            }
        });
    }

    /// Refunds expired leftovers and forgets idle identities.
    fn sweep(self: &Arc<Self>, now: Instant) {
        let mut back = Vec::new();
        let mut state = self.lock();
        state.entries.retain(|key, entry| {
            if !entry.busy
                && entry.held > 0
                && now >= entry.expires
                && let Some(policy) = entry.policy.take()
            {
                entry.busy = true;
                back.push((key.clone(), policy, std::mem::take(&mut entry.held)));
                return true;
            }
            !entry.idle(now) || now.saturating_duration_since(entry.last) < Duration::from_secs(2)
        });
        drop(state);
        for (key, policy, left) in back {
            let refund = self.store.refund(AdjustCall {
                policy: &policy,
                key: &key,
                cost: left,
            });
            let busy = Busy {
                table: Arc::clone(self),
                key,
                armed: true,
            };
            tokio::spawn(async move {
                let _ = refund.await;
                drop(busy);
            });
        }
    }
}

impl State {
    /// Whether a new identity fits, pruning idle ones when full.
    fn make_room(&mut self, now: Instant, max_keys: usize) -> bool {
        if self.entries.len() < max_keys {
            return true;
        }
        if self
            .pruned
            .is_some_and(|at| now.saturating_duration_since(at) < Duration::from_millis(100))
        {
            return false;
        }
        self.pruned = Some(now);
        self.entries.retain(|_, entry| !entry.idle(now));
        self.entries.len() < max_keys
    }
}

impl Drop for HotTable {
    /// Gives back every token still held, if a runtime is there to send
    /// the refunds.
    fn drop(&mut self) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let state = self.state.get_mut().unwrap_or_else(|e| e.into_inner());
        for (key, entry) in state.entries.drain() {
            let (Some(policy), held @ 1..) = (entry.policy, entry.held) else {
                continue;
            };
            let refund = self.store.refund(AdjustCall {
                policy: &policy,
                key: &key,
                cost: held,
            });
            runtime.spawn(async move {
                let _ = refund.await;
            });
        }
    }
}

/// A lease or refund in flight for `key`: when it ends (or its future is
/// dropped), the identity is free again and the calls waiting look again.
struct Busy {
    table: Arc<HotTable>,
    key: Key,
    armed: bool,
}

impl Busy {
    /// Records the store's answer to a lease of `asked` tokens and answers
    /// the call of `cost` that asked for it.
    fn finish(
        mut self,
        reply: Result<Decision, StoreError>,
        policy: &Policy,
        asked: u64,
        cost: u64,
    ) -> Result<Decision, StoreError> {
        self.armed = false;
        let lease_time = self.table.config.lease_time;
        let now = Instant::now();
        let mut state = self.table.lock();
        let answer = match (state.entries.get_mut(&self.key), reply) {
            (_, Err(err)) => Err(err),
            (None, Ok(d)) => Ok(d),
            (Some(entry), Ok(d)) => {
                entry.limit = d.limit;
                entry.reset_us = d.reset_us;
                if d.allowed {
                    entry.held = asked - cost;
                    entry.remaining = d.remaining;
                    entry.expires = now + lease_time;
                    entry.policy = Some(policy.clone());
                    Ok(entry.allowed())
                } else {
                    let retry = d
                        .retry_after()
                        .map_or(lease_time, |retry| retry.min(lease_time));
                    entry.denied_until = Some(now + retry);
                    Ok(entry.denied(retry))
                }
            }
        };
        if let Some(entry) = state.entries.get_mut(&self.key) {
            entry.busy = false;
        }
        drop(state);
        self.table.done.notify_waiters();
        answer
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        if let Some(entry) = self.table.lock().entries.get_mut(&self.key) {
            entry.busy = false;
        }
        self.table.done.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::MonotonicClock;
    use crate::limit::{Limit, Rate};
    use crate::store::MemoryStore;

    /// GCRA, `per_second` a second with a burst of as many; on tokio's
    /// clock, which these tests pause.
    fn limiter(per_second: u64, hot: HotKeys) -> Limiter {
        let limit = Limit::builder(Rate::per_second(per_second))
            .build()
            .unwrap();
        let store = MemoryStore::builder().clock(MonotonicClock::new()).build();
        Limiter::new(Policy::single("hot", limit).unwrap(), store)
            .hot_keys(hot)
            .unwrap()
    }

    fn held(limiter: &Limiter, key: &Key) -> Option<u64> {
        let table = limiter.hot.as_ref().unwrap().lock();
        table.entries.get(key).map(|e| e.held)
    }

    /// What the store has left for `key`, asked without charging.
    async fn left_in_store(limiter: &Limiter, key: &Key) -> u64 {
        let d = limiter.peek(key, 1).await.unwrap();
        d.remaining() + u64::from(d.is_allowed())
    }

    #[tokio::test(start_paused = true)]
    async fn an_identity_leases_once_it_is_hot_and_spends_the_lease_here() {
        let hot = HotKeys::new().threshold(10);
        let limiter = limiter(10_000, hot);
        let key = Key::new("k");
        // Cold: every call is charged in the store as it comes.
        for n in 1..10 {
            assert!(limiter.check(&key, 1).await.unwrap().is_allowed());
            assert_eq!(left_in_store(&limiter, &key).await, 10_000 - n);
            assert_eq!(held(&limiter, &key), Some(0));
        }
        // The tenth call in the second: a lease for 200 ms at 10/s, plus one.
        let d = limiter.check(&key, 1).await.unwrap();
        assert!(d.is_allowed());
        assert_eq!(left_in_store(&limiter, &key).await, 10_000 - 9 - 3);
        assert_eq!(held(&limiter, &key), Some(2));
        // The headers count what is held as remaining.
        assert_eq!(d.remaining(), 10_000 - 12 + 2);
        // Spent here: the store is not charged again.
        for _ in 0..2 {
            assert!(limiter.check(&key, 1).await.unwrap().is_allowed());
        }
        assert_eq!(held(&limiter, &key), Some(0));
        assert_eq!(left_in_store(&limiter, &key).await, 10_000 - 12);
    }

    #[tokio::test(start_paused = true)]
    async fn a_reset_drops_the_lease() {
        let limiter = limiter(10_000, HotKeys::new().threshold(1));
        let key = Key::new("k");
        // Leases grow with the calls seen: one is soon left holding some.
        for _ in 0..100 {
            limiter.check(&key, 1).await.unwrap();
            if held(&limiter, &key).unwrap() > 0 {
                break;
            }
        }
        assert!(held(&limiter, &key).unwrap() > 0);
        limiter.reset(&key).await.unwrap();
        assert_eq!(held(&limiter, &key), None);
        assert_eq!(left_in_store(&limiter, &key).await, 10_000);
    }

    #[tokio::test(start_paused = true)]
    async fn leases_are_sized_from_the_last_second_and_capped() {
        let hot = HotKeys::new().threshold(10);
        // Burst 10,000: the largest lease is 100 tokens.
        let limiter = limiter(10_000, hot);
        assert_eq!(hot.max_lease(&limiter.policy()), 100);
        let key = Key::new("k");
        // 200 calls in one second: leases of 200 x 0.2 s + 1.
        for _ in 0..200 {
            assert!(limiter.check(&key, 1).await.unwrap().is_allowed());
            tokio::time::advance(Duration::from_millis(5)).await;
        }
        let before = left_in_store(&limiter, &key).await;
        let spent = held(&limiter, &key).unwrap();
        for _ in 0..=spent {
            limiter.check(&key, 1).await.unwrap();
        }
        assert_eq!(before - left_in_store(&limiter, &key).await, 41);
        // 1,000 calls in a second would want 201: capped at 100.
        tokio::time::advance(Duration::from_secs(2)).await;
        for _ in 0..1000 {
            limiter.check(&key, 1).await.unwrap();
            tokio::time::advance(Duration::from_millis(1)).await;
        }
        let before = left_in_store(&limiter, &key).await;
        let spent = held(&limiter, &key).unwrap();
        for _ in 0..=spent {
            limiter.check(&key, 1).await.unwrap();
        }
        assert_eq!(before - left_in_store(&limiter, &key).await, 100);
    }

    #[tokio::test(start_paused = true)]
    async fn what_a_lease_leaves_goes_back_when_its_time_has_passed() {
        // A burst of 10,000 that barely refills while the test runs.
        let limit = Limit::builder(Rate::per_hour(1))
            .burst(10_000)
            .build()
            .unwrap();
        let store = MemoryStore::builder().clock(MonotonicClock::new()).build();
        let limiter = Limiter::new(Policy::single("hot", limit).unwrap(), store)
            .hot_keys(HotKeys::new().threshold(1))
            .unwrap();
        let key = Key::new("k");
        for _ in 0..51 {
            assert!(limiter.check(&key, 1).await.unwrap().is_allowed());
        }
        let held_now = held(&limiter, &key).unwrap();
        assert!(held_now > 0, "{held_now}");
        let charged = 10_000 - left_in_store(&limiter, &key).await;
        // The sweep after the lease time gives the rest back.
        tokio::time::sleep(Duration::from_millis(450)).await;
        assert_eq!(held(&limiter, &key), Some(0));
        assert_eq!(
            10_000 - left_in_store(&limiter, &key).await,
            charged - held_now
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_refused_lease_refuses_locally_until_the_store_admits_again() {
        // 20 a second, burst 20: leases of up to 10.
        let hot = HotKeys::new()
            .threshold(5)
            .max_share(LocalShare::new(0.5).unwrap());
        let limiter = limiter(20, hot);
        let key = Key::new("k");
        let mut allowed = 0;
        for _ in 0..30 {
            allowed += u64::from(limiter.check(&key, 1).await.unwrap().is_allowed());
        }
        assert_eq!(allowed, 20);
        let d = limiter.check(&key, 1).await.unwrap();
        assert!(!d.is_allowed());
        let retry = d.retry_after().unwrap();
        assert!(retry <= Duration::from_millis(200), "{retry:?}");
        // Refused here until then: the store's state does not move.
        let t = {
            let table = limiter.hot.as_ref().unwrap().lock();
            table.entries.get(&key).unwrap().denied_until
        };
        assert!(t.is_some());
        assert_eq!(left_in_store(&limiter, &key).await, 0);
        for _ in 0..100 {
            assert!(!limiter.check(&key, 1).await.unwrap().is_allowed());
        }
        // Then the store is asked again each retry time, and admits once a
        // lease of 10 fits: 10 tokens at 20 a second, in 500 ms.
        let mut waited = Duration::ZERO;
        loop {
            let d = limiter.check(&key, 1).await.unwrap();
            if d.is_allowed() {
                break;
            }
            let retry = d.retry_after().unwrap();
            assert!(retry <= Duration::from_millis(200), "{retry:?}");
            tokio::time::advance(retry).await;
            waited += retry;
        }
        assert!(waited >= Duration::from_millis(500), "{waited:?}");
        assert!(waited <= Duration::from_millis(600), "{waited:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_flood_of_identities_stays_within_max_keys() {
        let limiter = limiter(10_000, HotKeys::new().max_keys(100));
        for n in 0..5_000u32 {
            let key = Key::new(format!("flood:{n}"));
            assert!(limiter.check(&key, 1).await.unwrap().is_allowed());
            if n % 1000 == 999 {
                tokio::time::advance(Duration::from_millis(700)).await;
            }
            let len = limiter.hot.as_ref().unwrap().lock().entries.len();
            assert!(len <= 100, "{len}");
        }
        // Idle identities are forgotten: a new one fits again.
        tokio::time::advance(Duration::from_secs(2)).await;
        let key = Key::new("late");
        limiter.check(&key, 1).await.unwrap();
        assert_eq!(held(&limiter, &key), Some(0));
    }

    /// Two instances on one store, callers far above the limit, for 10 s:
    /// admitted at most what two ordinary limiters admit in the same run,
    /// plus one largest lease per instance.
    #[tokio::test(start_paused = true)]
    async fn two_instances_stay_within_the_limit_plus_one_lease_each() {
        /// Admitted in 10 s of 5,000 calls a second on each of two
        /// limiters sharing one store, hot keys on or off.
        async fn run(policy: &Policy, hot: Option<HotKeys>) -> u64 {
            let store: Arc<dyn Store> =
                Arc::new(MemoryStore::builder().clock(MonotonicClock::new()).build());
            let instance = || {
                let limiter = Limiter::new(policy.clone(), Arc::clone(&store));
                match hot {
                    Some(hot) => limiter.hot_keys(hot).unwrap(),
                    None => limiter,
                }
            };
            let (a, b) = (instance(), instance());
            let key = Key::new("big");
            let mut admitted = 0u64;
            for _ in 0..50_000 {
                for limiter in [&a, &b] {
                    admitted += u64::from(limiter.check(&key, 1).await.unwrap().is_allowed());
                }
                tokio::time::advance(Duration::from_micros(200)).await;
            }
            admitted
        }
        for algorithm in [Algorithm::Gcra, Algorithm::SlidingWindow] {
            let policy = Policy::builder("hot")
                .algorithm(algorithm)
                .limit(Limit::new(Rate::per_second(1_000)).unwrap())
                .build()
                .unwrap();
            let hot = HotKeys::new().threshold(50);
            let plain = run(&policy, None).await;
            let leased = run(&policy, Some(hot)).await;
            let bound = plain + 2 * hot.max_lease(&policy);
            assert!(leased <= bound, "{algorithm}: {leased} > {bound}");
            // And the limit is used: leases do not starve the callers.
            assert!(leased + 100 >= plain, "{algorithm}: {leased} vs {plain}");
        }
    }
}
