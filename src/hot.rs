//! Hot keys decided in process: an instance takes a lease of a hot
//! identity's tokens from the store in one call and spends it here, so
//! that the store sees a few calls a second per hot identity instead of
//! one per request. What it promises is on [`HotKeys`].

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use tokio::sync::{oneshot, watch};
use tokio::time::Instant;

use crate::algorithm::Algorithm;
use crate::decision::Decision;
use crate::error::{ConfigError, StoreError};
use crate::key::Key;
use crate::policy::Policy;
use crate::share::LocalShare;
use crate::store::{self, Op, Store, StoreFuture, decide};

/// Hot-key mode for a [`Limiter`](crate::Limiter): an identity seen more than
/// [`threshold`](Self::threshold) times a second on this instance is
/// decided here, from a lease of its tokens, instead of one store call per
/// request. Opt in with [`Limiter::hot_keys`](crate::Limiter::hot_keys); every other identity keeps
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
/// refund ([`Limiter::refund`](crate::Limiter::refund)), as are those still held when the limiter
/// is dropped inside a runtime. While a lease is on its way, other calls
/// for the identity wait for it rather than asking the store themselves.
///
/// **The bound.** Every call admitted here spends a token the store
/// charged when the lease was taken, and an instance holds at most one
/// largest lease of an identity at a time (tokens on their way back in a
/// refund included; a reset waits for a lease in flight). So over any
/// window, `n` instances admit at most what the store alone would have
/// admitted plus `n` largest leases: those leased before the window began
/// and spent (or refunded, which lets the store admit as many again)
/// within it. Not exactly the limit over windows longer than the lease
/// time: the excess is those `n` leases, whatever the window's length.
/// With the default 1%, that is at most 1% of the burst per instance.
/// Tokens never spent are charged all the same until refunded: the error
/// on the other side is an undercount of at most the same size.
///
/// **Algorithms.** GCRA and [`Algorithm::SlidingWindow`] (the sliding
/// window counter). The sliding log and fixed window are refused when the
/// mode is set ([`ConfigError::HotKeysUnsupported`]); a per-identity policy
/// ([`LivePolicies`](crate::live::LivePolicies)) on one of those is
/// decided the ordinary way, as is a policy with a penalty box
/// ([`LimitBuilder::block_for`](crate::LimitBuilder::block_for): a lease
/// refused would start a block), a call whose cost is above the largest
/// lease and every call in reserve mode.
///
/// **Headers.** A call admitted from a lease reports as remaining the
/// tokens this instance still holds plus what the store had left after the
/// lease, and as reset what the store said then (at most a lease time
/// old), for each limit of a policy of several windows as for one. A local
/// refusal reports 0 remaining and, as retry-after, when this instance
/// will ask the store again.
///
/// **Failures.** A lease the store fails on fails the call that asked for
/// it and every call waiting for it, at once, with the same error (the
/// layer's [`FailurePolicy`](crate::FailurePolicy) then applies, as for
/// any decision); for min(store timeout, lease time) after, the identity
/// is decided the ordinary way, each call with its own timeout. Tokens
/// already held are still spent. A lease runs on its own task, so a caller
/// that goes away loses no tokens.
///
/// **Memory.** At most [`max_keys`](Self::max_keys) identities are
/// tracked (10,000 by default, each a few dozen bytes); when the table is
/// full (checked at most every 100 ms), identities idle for a second are
/// forgotten, then the coldest tenth of those holding nothing, and new
/// identities take the ordinary path until there is room.
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
    /// The longest [`lease_time`](Self::lease_time) accepted: tokens held
    /// longer would make the bound below meaningless.
    pub const MAX_LEASE_TIME: Duration = Duration::from_secs(60);

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
    /// to the store, and the span of calls a lease is sized for; above
    /// zero and at most [`MAX_LEASE_TIME`](Self::MAX_LEASE_TIME), or
    /// [`Limiter::hot_keys`](crate::Limiter::hot_keys) refuses it.
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
        if self.lease_time.is_zero()
            || self.lease_time > Self::MAX_LEASE_TIME
            || self.threshold == 0
        {
            return Err(ConfigError::HotKeysOutOfRange);
        }
        match policy.algorithm() {
            algorithm if covers(algorithm) => Ok(()),
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
}

struct State {
    entries: HashMap<Key, Entry>,
    /// When the table was last pruned, so that a flood of new identities
    /// costs one scan per 100 ms at most.
    pruned: Option<Instant>,
    sweeping: bool,
    /// Source of entry generations and flight ids.
    next_id: u64,
}

/// How a lease or refund in flight ended, as its waiters see it: `None`
/// while in flight; a failed lease fails its waiters with the same error.
type Outcome = Option<Result<(), StoreError>>;

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
    /// After a failed lease: the ordinary path until then, each call with
    /// its own timeout, so that a hung store does not queue the calls.
    failed_until: Option<Instant>,
    /// What the store said at the last lease.
    limit: usize,
    remaining: u64,
    reset_us: u64,
    /// Every limit's remaining and reset, where the store reported them
    /// all (a policy of several windows).
    each: Option<Arc<[(u64, Duration)]>>,
    /// The policy the tokens were leased under, to give them back.
    policy: Option<Policy>,
    /// Changed by a reset: a lease in flight from before it records
    /// nothing when it ends.
    generation: u64,
    /// The lease or refund in flight, if any (its id, and where its end is
    /// told): at most one per identity, and the others wait for it.
    flight: Option<(u64, watch::Receiver<Outcome>)>,
}

impl Entry {
    fn new(now: Instant, generation: u64) -> Self {
        Entry {
            second: now,
            seen: 0,
            seen_before: 0,
            last: now,
            held: 0,
            expires: now,
            denied_until: None,
            failed_until: None,
            limit: 0,
            remaining: 0,
            reset_us: 0,
            each: None,
            policy: None,
            generation,
            flight: None,
        }
    }

    /// Moves the one-second count on to `now`.
    fn roll(&mut self, now: Instant) {
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
    }

    /// The calls of the last full second, or of this one if more.
    fn rate(&mut self, now: Instant) -> u64 {
        self.roll(now);
        self.seen.max(self.seen_before)
    }

    /// Counts a call, then its rate.
    fn count(&mut self, now: Instant) -> u64 {
        self.roll(now);
        self.seen = self.seen.saturating_add(1);
        self.last = now;
        self.seen.max(self.seen_before)
    }

    /// What the store had left after the lease, plus what is held here,
    /// for the deciding limit and (where the store reported them all)
    /// every other: the tokens held were charged to each.
    fn allowed(&self) -> Decision {
        Decision {
            allowed: true,
            limit: self.limit,
            remaining: self.remaining.saturating_add(self.held),
            reset_us: self.reset_us,
            retry_us: None,
            wait_us: 0,
            each: self.each.as_ref().map(|each| {
                each.iter()
                    .map(|&(remaining, reset)| (remaining.saturating_add(self.held), reset))
                    .collect()
            }),
            blocked: false,
        }
    }

    /// Nothing left for the deciding limit; the others as the store last
    /// reported them.
    fn denied(&self, retry: Duration) -> Decision {
        Decision {
            allowed: false,
            limit: self.limit,
            remaining: 0,
            reset_us: self.reset_us,
            retry_us: Some(u64::try_from(retry.as_micros()).unwrap_or(u64::MAX)),
            wait_us: 0,
            each: self.each.as_ref().map(|each| {
                each.iter()
                    .enumerate()
                    .map(|(i, &(remaining, reset))| {
                        (if i == self.limit { 0 } else { remaining }, reset)
                    })
                    .collect()
            }),
            blocked: false,
        }
    }

    /// Holding nothing, refusing nothing and nothing in flight: forgetting
    /// it loses only its count.
    fn empty(&self, now: Instant) -> bool {
        self.flight.is_none()
            && self.held == 0
            && self.denied_until.is_none_or(|until| until <= now)
    }

    /// Empty and idle for a second: safe to forget.
    fn idle(&self, now: Instant) -> bool {
        self.empty(now) && now.saturating_duration_since(self.last) >= Duration::from_secs(1)
    }
}

/// The algorithms a lease of tokens works for.
fn covers(algorithm: Algorithm) -> bool {
    matches!(algorithm, Algorithm::Gcra | Algorithm::SlidingWindow)
}

/// `now + span`, or far ahead when that overflows the clock.
fn after(now: Instant, span: Duration) -> Instant {
    now.checked_add(span)
        .unwrap_or_else(|| now + Duration::from_secs(86_400 * 365))
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
                next_id: 0,
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic elsewhere while holding the lock leaves counts that are
        // still counts: carry on with them.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Decides `cost` for `key` from this instance's lease, or takes one;
    /// `None` for the ordinary path (not hot, not tracked, after a failed
    /// lease, or a policy or cost the mode does not cover). `counted`: the
    /// call was counted already (it waited for a lease and looks again).
    pub(crate) fn decide(
        self: &Arc<Self>,
        policy: &Policy,
        key: &Key,
        cost: u64,
        counted: bool,
    ) -> Option<StoreFuture<Decision>> {
        // A refused lease must not start a penalty box: such policies are
        // decided the ordinary way.
        if !covers(policy.algorithm()) || policy.blocks() {
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
            let generation = state.id();
            state
                .entries
                .insert(key.clone(), Entry::new(now, generation));
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
        let rate = if counted {
            entry.rate(now)
        } else {
            entry.count(now)
        };
        if let Some((_, flight)) = &entry.flight {
            let mut flight = flight.clone();
            drop(state);
            let (table, policy, key) = (Arc::clone(self), policy.clone(), key.clone());
            return Some(StoreFuture::pending(async move {
                // A sender gone without a word (its task ended with the
                // runtime) counts as done: look again.
                let outcome = match flight.wait_for(Option::is_some).await {
                    Ok(outcome) => outcome.clone(),
                    Err(_) => None,
                };
                if let Some(Err(err)) = outcome {
                    return Err(err);
                }
                match table.decide(&policy, &key, cost, true) {
                    Some(decided) => decided.await,
                    None => decide(&*table.store, &policy, &key, cost, Duration::ZERO).await,
                }
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
        if let Some(until) = entry.failed_until {
            if now < until {
                return None;
            }
            entry.failed_until = None;
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
        let generation = entry.generation;
        let (tx, rx) = watch::channel(None);
        let id = state.id();
        if let Some(entry) = state.entries.get_mut(key) {
            entry.flight = Some((id, rx));
        }
        let sweep = !std::mem::replace(&mut state.sweeping, true);
        drop(state);
        if sweep {
            self.start_sweeping();
        }
        let busy = Busy {
            table: Arc::clone(self),
            key: key.clone(),
            id,
            generation,
            tx,
            unsent: back.map(|p| (p, left)),
        };
        let policy = policy.clone();
        let lease = async move {
            let mut busy = busy;
            if let Some((back, left)) = &busy.unsent {
                let refund = store::adjust(&*busy.table.store, back, &busy.key, *left, Op::Refund);
                busy.unsent = None;
                // A refund lost leaves the tokens charged: an undercount.
                let _ = refund.await;
            }
            let store = &*busy.table.store;
            let reply = decide(store, &policy, &busy.key, asked, Duration::ZERO).await;
            busy.finish(reply, &policy, asked, cost)
        };
        // The lease runs on its own task, so that a caller that goes away
        // (a client gone, a timeout above) loses no tokens: what the store
        // charged is recorded here all the same.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return Some(StoreFuture::pending(async move { lease.await.0 }));
        };
        let (answer_tx, answer_rx) = oneshot::channel();
        runtime.spawn(async move {
            let (answer, table, key, generation) = lease.await;
            if let (Err(Ok(decision)), Some(table)) = (answer_tx.send(answer), table)
                && decision.allowed
            {
                // Nobody took the token spent for the caller: keep it.
                let mut state = table.lock();
                if let Some(entry) = state.entries.get_mut(&key)
                    && entry.generation == generation
                {
                    entry.held = entry.held.saturating_add(cost);
                }
            }
        });
        Some(StoreFuture::pending(async move {
            answer_rx
                .await
                .unwrap_or_else(|_| Err(StoreError::Redis("hot-key lease task ended".into())))
        }))
    }

    /// Drops what this instance holds or remembers of `key`. A lease or
    /// refund in flight keeps the entry (so no second one starts), but
    /// records nothing when it ends.
    pub(crate) fn forget(&self, key: &Key) {
        let mut state = self.lock();
        let generation = state.id();
        let Some(entry) = state.entries.get_mut(key) else {
            return;
        };
        if entry.flight.is_none() {
            state.entries.remove(key);
            return;
        }
        let flight = entry.flight.take();
        *entry = Entry::new(Instant::now(), generation);
        entry.flight = flight;
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
        let mut next_id = state.next_id;
        state.entries.retain(|key, entry| {
            if entry.flight.is_none()
                && entry.held > 0
                && now >= entry.expires
                && let Some(policy) = entry.policy.take()
            {
                let (tx, rx) = watch::channel(None);
                next_id += 1;
                entry.flight = Some((next_id, rx));
                let left = std::mem::take(&mut entry.held);
                back.push((key.clone(), policy, left, next_id, entry.generation, tx));
                return true;
            }
            !entry.idle(now) || now.saturating_duration_since(entry.last) < Duration::from_secs(2)
        });
        state.next_id = next_id;
        drop(state);
        for (key, policy, left, id, generation, tx) in back {
            let refund = store::adjust(&*self.store, &policy, &key, left, Op::Refund);
            let busy = Busy {
                table: Arc::clone(self),
                key,
                id,
                generation,
                tx,
                unsent: None,
            };
            tokio::spawn(async move {
                let _ = refund.await;
                drop(busy);
            });
        }
    }
}

impl State {
    fn id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    /// Whether a new identity fits. When full, at most every 100 ms:
    /// forgets idle identities, then the coldest tenth of those holding
    /// nothing, so that a busy identity arriving late still finds room.
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
        if self.entries.len() >= max_keys {
            let mut cold: Vec<(u64, Key)> = self
                .entries
                .iter_mut()
                .filter(|(_, entry)| entry.empty(now))
                .map(|(key, entry)| (entry.rate(now), key.clone()))
                .collect();
            let evict = (max_keys / 10).max(1).min(cold.len());
            if evict > 0 {
                cold.select_nth_unstable_by_key(evict - 1, |(rate, _)| *rate);
                for (_, key) in &cold[..evict] {
                    self.entries.remove(key);
                }
            }
        }
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
            let refund = store::adjust(&*self.store, &policy, &key, held, Op::Refund);
            runtime.spawn(async move {
                let _ = refund.await;
            });
        }
    }
}

/// A lease or refund in flight for `key`: when it ends (or is dropped
/// unfinished), the identity is free again and its waiters are told.
struct Busy {
    table: Arc<HotTable>,
    key: Key,
    /// The flight's id, and the entry's generation when it began.
    id: u64,
    generation: u64,
    tx: watch::Sender<Outcome>,
    /// Leftovers to give back that have not been sent yet: put back in the
    /// entry if dropped before they are, for the sweep to send.
    unsent: Option<(Policy, u64)>,
}

/// The answer for the call that asked for a lease, and where to put a
/// token back if that call is gone.
type Answered = (
    Result<Decision, StoreError>,
    Option<Arc<HotTable>>,
    Key,
    u64,
);

impl Busy {
    /// Records the store's answer to a lease of `asked` tokens, tells the
    /// waiters, and answers the call of `cost` that asked for it.
    fn finish(
        self,
        reply: Result<Decision, StoreError>,
        policy: &Policy,
        asked: u64,
        cost: u64,
    ) -> Answered {
        let lease_time = self.table.config.lease_time;
        let now = Instant::now();
        let mut state = self.table.lock();
        let current = state
            .entries
            .get_mut(&self.key)
            .filter(|entry| entry.generation == self.generation);
        let answer = match (current, reply) {
            (Some(entry), Err(err)) => {
                let span = match &err {
                    StoreError::Timeout(timeout) => lease_time.min(*timeout),
                    _ => lease_time,
                };
                entry.failed_until = Some(after(now, span));
                Err(err)
            }
            (None, reply) => reply,
            (Some(entry), Ok(d)) => {
                entry.limit = d.limit;
                entry.reset_us = d.reset_us;
                entry.each = d.each.clone();
                if d.allowed {
                    entry.held = asked.saturating_sub(cost);
                    entry.remaining = d.remaining;
                    entry.expires = after(now, lease_time);
                    entry.policy = Some(policy.clone());
                    Ok(entry.allowed())
                } else {
                    entry.remaining = d.remaining;
                    let retry = d
                        .retry_after()
                        .map_or(lease_time, |retry| retry.min(lease_time));
                    entry.denied_until = Some(after(now, retry));
                    Ok(entry.denied(retry))
                }
            }
        };
        // The flight ends before its waiters are told, so that none of
        // them finds it still in flight when it looks again.
        if let Some(entry) = state.entries.get_mut(&self.key)
            && entry.flight.as_ref().is_some_and(|(id, _)| *id == self.id)
        {
            entry.flight = None;
        }
        drop(state);
        let (table, key, generation) = (Arc::clone(&self.table), self.key.clone(), self.generation);
        let _ = self
            .tx
            .send_replace(Some(answer.as_ref().map(|_| ()).map_err(Clone::clone)));
        drop(self);
        (answer, Some(table), key, generation)
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        let mut state = self.table.lock();
        if let Some(entry) = state.entries.get_mut(&self.key) {
            if entry.flight.as_ref().is_some_and(|(id, _)| *id == self.id) {
                entry.flight = None;
            }
            if let Some((policy, left)) = self.unsent.take()
                && entry.generation == self.generation
            {
                entry.held = entry.held.saturating_add(left);
                entry.policy.get_or_insert(policy);
            }
        }
        // Waiters not told an outcome see the sender (dropped with `self`)
        // gone, and look again.
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Limiter;
    use crate::clock::MonotonicClock;
    use crate::policy::{Limit, Rate};
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
    async fn a_call_from_a_lease_reports_every_window_of_the_policy() {
        let policy = Policy::builder("hot-windows")
            .algorithm(Algorithm::SlidingWindow)
            .limit(Limit::new(Rate::per_second(10_000)).unwrap())
            .limit(Limit::new(Rate::new(100_000, Duration::from_secs(60))).unwrap())
            .build()
            .unwrap();
        let store = MemoryStore::builder().clock(MonotonicClock::new()).build();
        let limiter = Limiter::new(policy, store)
            .hot_keys(HotKeys::new().threshold(10))
            .unwrap();
        let key = Key::new("k");
        for _ in 0..9 {
            assert!(limiter.check(&key, 1).await.unwrap().is_allowed());
        }
        // The tenth call leases 3 (one for itself), the next spends one.
        assert!(limiter.check(&key, 1).await.unwrap().is_allowed());
        let d = limiter.check(&key, 1).await.unwrap();
        assert!(d.is_allowed());
        assert_eq!(held(&limiter, &key), Some(1));
        // 12 charged to each window, 1 of them still held here.
        assert_eq!(d.limit_index(), 0);
        assert_eq!(d.remaining_of(0), Some(10_000 - 12 + 1));
        assert_eq!(d.remaining_of(1), Some(100_000 - 12 + 1));
    }

    #[test]
    fn a_lease_time_of_zero_or_above_a_minute_is_refused() {
        let policy = Policy::single("hot", Limit::new(Rate::per_second(10)).unwrap()).unwrap();
        let limiter = || Limiter::new(policy.clone(), MemoryStore::new());
        for lease_time in [Duration::ZERO, Duration::from_secs(61), Duration::MAX] {
            let err = limiter()
                .hot_keys(HotKeys::new().lease_time(lease_time))
                .unwrap_err();
            assert_eq!(err, ConfigError::HotKeysOutOfRange, "{lease_time:?}");
        }
        assert!(
            limiter()
                .hot_keys(HotKeys::new().lease_time(HotKeys::MAX_LEASE_TIME))
                .is_ok()
        );
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
