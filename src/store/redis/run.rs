//! The Redis store's one dispatch: every operation of every algorithm
//! (check, peek, charge, refund, defer) and reset, encoded as the call of
//! one script of the registry (see [`scripts`](super::scripts)), one round
//! trip each, and its reply decoded. Checks that find the connection busy
//! travel together in one script (see [`batch`](super::batch)).

use std::time::Duration;

use redis::{Cmd, Value};
use tokio::runtime::Handle;

use super::owed::{Claim, Sending, ran};
use super::{LuaScript, RedisStore, TimeSource, decode_decision, hash_tag, limit_key, one_reply};
use crate::algorithm::Algorithm;
use crate::decision::Decision;
use crate::error::StoreError;
use crate::key::Key;
use crate::policy::{MAX_LIMITS_PER_POLICY, Policy};
use crate::store::{Answer, BudgetCall, BudgetTake, Call, Op, StoreFuture, micros};
use crate::text::concat;

impl RedisStore {
    /// Runs `call`: the one place that dispatches an operation.
    pub(super) fn run_call(&self, call: Call<'_>) -> StoreFuture<Answer> {
        let adjust = AdjustCall {
            policy: call.policy,
            key: call.key,
            cost: call.cost,
        };
        match call.op {
            Op::Check { .. } if call.policy.algorithm().is_window() => {
                self.run_window(call).map(decided)
            }
            Op::Check { .. } => self.run_gcra(call).map(decided),
            Op::Peek => self.run_peek(adjust).map(decided),
            Op::Charge => self.run_charge(adjust).map(decided),
            Op::Refund => self.run_refund(adjust).map(done),
            Op::Defer { .. } => self.run_gcra_defer(call).map(done),
        }
    }
}

fn decided(decision: Decision) -> Result<Answer, StoreError> {
    Ok(Answer::Decision(decision))
}

fn done((): ()) -> Result<Answer, StoreError> {
    Ok(Answer::Done)
}

// ------------------------------------------------------------------------
// The Redis store's window algorithms: one script per algorithm, one
// round trip per decision, every key of one identity under one hash tag.
// Calls that find the connection busy travel together in one script, as
// GCRA calls do (see [`batch`](super::batch)).

impl RedisStore {
    /// The Redis keys that hold the window state of `policy` for `key`:
    /// `{prefix}:{policy}:{{tag}}:log` for the sliding log (one sorted set
    /// for every window), `…:sw:{i}`, `…:fw:{i}` and `…:cq:{i}` (one per
    /// window) for the sliding-window counter, the fixed window and the
    /// calendar quota, `tag` being the identity hashed. Empty for GCRA; see
    /// [`gcra_key`](Self::gcra_key).
    pub fn window_keys(&self, policy: &Policy, key: &Key) -> Vec<String> {
        let base = self.key_base(policy.name(), key);
        let tag = match policy.algorithm() {
            Algorithm::SlidingLog => return vec![format!("{base}:log")],
            Algorithm::SlidingWindow => "sw",
            Algorithm::FixedWindow => "fw",
            Algorithm::Calendar => "cq",
            Algorithm::Gcra => return Vec::new(),
        };
        (0..policy.limits().len())
            .map(|i| format!("{base}:{tag}:{i}"))
            .collect()
    }

    /// Answers from the deny cache, or, when the returned future is first
    /// polled, sends the call alone if the connection has a free script
    /// slot, or queues it for the next batch (see [`batch`]). A denial is
    /// remembered for as long as the script says its figures hold (see
    /// [`DenyCache`](crate::store::DenyCache)).
    pub(super) fn run_window(&self, call: Call<'_>) -> StoreFuture<Decision> {
        let algorithm = call.policy.algorithm();
        if let Some(cache) = &self.inner.deny
            && let Some(denied) = cache.lookup(call.policy, call.key, call.cost, Duration::ZERO)
        {
            return StoreFuture::ready(Ok(denied));
        }
        let store = self.clone();
        let (policy, key, cost) = (call.policy.clone(), call.key.clone(), call.cost);
        StoreFuture::pending(async move {
            let (reply, sent_at) = store.check_reply(algorithm, &policy, &key, cost, 0).await?;
            store.window_decided(reply, &policy, &key, cost, sent_at)
        })
    }

    /// One script of `algorithm` that decides `calls` (policy, identity,
    /// cost) in order: alone, or queued ones together. Returns it with the
    /// instant it is sent ([`RedisStore::sent_at`]).
    pub(super) fn window_script<'a, I>(&self, script: &LuaScript, calls: I) -> (Cmd, Option<u64>)
    where
        I: Iterator<Item = (&'a Policy, &'a Key, u64)> + Clone,
    {
        let keys: Vec<Vec<String>> = calls
            .clone()
            .map(|(policy, key, _)| {
                let mut names = self.window_keys(policy, key);
                if policy.blocks() {
                    names.push(self.box_key(policy.name(), key));
                }
                names
            })
            .collect();
        let per_limit = |policy: &Policy| if policy.blocks() { 3 } else { 2 };
        let args = 2 + calls
            .clone()
            .map(|(policy, ..)| 3 + per_limit(policy) * policy.limits().len())
            .sum::<usize>();
        let mut cmd = script.call(keys.iter().map(Vec::len).sum(), args);
        for names in &keys {
            cmd.arg(names);
        }
        // "Now", once for every call: empty for the server's clock; with
        // the caller's, `sent_at`.
        let sent_at = self.sent_at();
        match (&self.inner.time, sent_at) {
            (TimeSource::Client(_), Some(now)) => cmd.arg(now),
            _ => cmd.arg(""),
        };
        cmd.arg(keys.len());
        // Each call's keys (negated with a penalty box, whose key is the
        // last) and arguments counted, then its arguments: cost, each
        // window's length and count, and with a penalty box each one's
        // block.
        for ((policy, _, cost), names) in calls.zip(&keys) {
            let limits = policy.limits();
            let n = i64::try_from(names.len()).unwrap_or(i64::MAX);
            cmd.arg(if policy.blocks() { -n } else { n });
            cmd.arg(1 + per_limit(policy) * limits.len());
            cmd.arg(cost);
            for limit in limits {
                let (length, count) = self.window_args(limit);
                cmd.arg(length).arg(count);
            }
            if policy.blocks() {
                for limit in limits {
                    cmd.arg(limit.block_us());
                }
            }
        }
        (cmd, sent_at)
    }

    /// Decodes one call's reply (counting it when it failed the call) and
    /// remembers a denial.
    fn window_decided(
        &self,
        reply: Value,
        policy: &Policy,
        key: &Key,
        cost: u64,
        sent_at: Option<u64>,
    ) -> Result<Decision, StoreError> {
        let (decision, hold_us) =
            decode_window(reply, policy.limits().len()).inspect_err(|err| {
                self.check_script(policy.algorithm()).metrics.failed(err);
            })?;
        if let (Some(cache), Some(sent_at)) = (&self.inner.deny, sent_at) {
            cache.record_held(policy, key, cost, sent_at, &decision, hold_us);
        }
        Ok(decision)
    }
}

/// Decodes one call's part of a window script's replies: the text of the
/// error that failed it alone, or GCRA's shape, with 0 where GCRA puts
/// the wait, then every window's remaining and reset (for several), then
/// how long a denial's figures hold, in µs. Takes the reply, so that the
/// figures are decoded where they are, without a copy.
pub(super) fn decode_window(reply: Value, limits: usize) -> Result<(Decision, u64), StoreError> {
    let unexpected = |reply: &Value| StoreError::UnexpectedReply(format!("{reply:?}"));
    if let Value::BulkString(text) = &reply {
        // The error that failed this call alone.
        return Err(StoreError::Redis(
            String::from_utf8_lossy(text).into_owned(),
        ));
    }
    let Value::Array(mut items) = reply else {
        return Err(unexpected(&reply));
    };
    let Some(&Value::Int(raw)) = items.last() else {
        return Err(unexpected(&Value::Array(items)));
    };
    let Ok(hold) = u64::try_from(raw) else {
        return Err(unexpected(&Value::Array(items)));
    };
    items.pop();
    let mut figures = Value::Array(items);
    decode_decision(&figures, limits, true)
        .map(|decision| (decision, hold))
        .map_err(|_| {
            // Name the whole reply, as it came.
            if let Value::Array(items) = &mut figures {
                items.push(Value::Int(raw));
            }
            unexpected(&figures)
        })
}

// ------------------------------------------------------------------------
// Peek, charge and refund on Redis: one script per operation and
// algorithm (see [`scripts`](super::scripts)), one round trip each, on
// the same keys as the decision.
//
// Each operation is a function of the algorithm's Lua file, as the check
// is: a peek is the check without its store; a charge stores the charge
// whatever the state holds, then reports the figures of now for a call
// of cost 1, as `charge` does in the algorithm's Rust file.
//
// The deny cache: a peek is answered from it and recorded in it exactly
// as a check is (a denied check stores nothing, so its denial is the
// peek's). A charge that leaves the key unable to pass a call of cost 1
// records that denial for calls of cost 1; anything else it says drops
// what was cached. A refund drops this instance's cached denials of the
// key under the policy, whatever its outcome (like a reset); other
// instances' caches may still deny locally until the retry time they were
// told: a refund is the one write that makes Redis admit sooner, so the
// cache is conservative, not exact, for keys that get refunds.

/// A peek, a charge or a refund of `cost` for `key` under `policy`.
#[derive(Clone, Copy, Debug)]
pub(super) struct AdjustCall<'a> {
    pub(super) policy: &'a Policy,
    pub(super) key: &'a Key,
    pub(super) cost: u64,
}

/// Which operation a script runs (a peek's arguments are those of a check
/// of one call: [`RedisStore::decide_call`]).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Adjust {
    Charge,
    Refund,
}

impl RedisStore {
    /// The keys and arguments of `op` on `call`, and the instant it is
    /// sent as the deny cache counts time (see `RedisStore::sent_at`).
    fn adjust_command(
        &self,
        call: &AdjustCall<'_>,
        op: Adjust,
    ) -> (Vec<String>, Vec<String>, Option<u64>) {
        let policy = call.policy;
        let limits = policy.limits();
        let sent_at = self.sent_at();
        // "Now": empty for the server's clock; with the caller's, `sent_at`.
        let now = match (&self.inner.time, sent_at) {
            (TimeSource::Client(_), Some(now)) => now.to_string(),
            _ => String::new(),
        };
        let mut args = Vec::with_capacity(6 + 2 * limits.len());
        args.push(now);
        if !policy.algorithm().is_window() {
            let each_limit = limits
                .iter()
                .flat_map(|l| [l.emission_us().to_string(), l.tolerance_us().to_string()]);
            args.push(call.cost.to_string());
            args.extend(each_limit);
            if op == Adjust::Charge {
                args.extend(limits.iter().map(|l| l.debt_horizon_us().to_string()));
            }
            return (self.gcra_keys(policy, call.key).collect(), args, sent_at);
        }
        args.push(call.cost.to_string());
        for limit in limits {
            let (length, count) = self.window_args(limit);
            args.push(length.to_string());
            args.push(count);
        }
        (self.window_keys(policy, call.key), args, sent_at)
    }

    /// Answers from the deny cache, or sends the peek: a check's script
    /// without its store, so its answer (and a denial's caching) is the
    /// check's. A key that owes a charge sends it first, and fails as it
    /// does (see `owed.rs`).
    pub(super) fn run_peek(&self, call: AdjustCall<'_>) -> StoreFuture<Decision> {
        if let Some(cache) = &self.inner.deny
            && let Some(denied) = cache.lookup(call.policy, call.key, call.cost, Duration::ZERO)
        {
            return StoreFuture::ready(Ok(denied));
        }
        let owed = match self.inner.owed.is_empty() {
            true => None,
            false => {
                let base = self.key_base(call.policy.name(), call.key);
                match self.inner.owed.claim_for_peek(&base) {
                    Claim::Settled => None,
                    Claim::Refuse(err) => return StoreFuture::ready(Err(err)),
                    Claim::Send(charge) => Some(charge),
                }
            }
        };
        let store = self.clone();
        let (policy, key, cost) = (call.policy.clone(), call.key.clone(), call.cost);
        StoreFuture::pending(async move {
            if let Some(sending) = owed {
                // On a task of its own: a caller going away must not cut
                // the charge off after it was sent (it would then be sent
                // again, and might count twice).
                let resend = store.clone();
                let send = async move { resend.send_owed(sending).await };
                match Handle::try_current() {
                    Ok(runtime) => runtime.spawn(send).await.unwrap_or_else(|err| {
                        Err(StoreError::Redis(format!("owed charge not sent: {err}")))
                    })?,
                    Err(_) => send.await?,
                }
            }
            // A check's arguments, of one call and no wait.
            let algorithm = policy.algorithm();
            let script = &store.inner.scripts.of(algorithm).peek;
            let once = std::iter::once((&policy, &key, cost, 0));
            let (cmd, sent_at) = store.decide_call(script, algorithm, once);
            let reply = one_reply(algorithm, store.run(script, cmd).await?)?;
            if !algorithm.is_window() {
                return store.decided(&reply, &policy, &key, cost, sent_at);
            }
            let (decision, hold_us) = decode_window(reply, policy.limits().len())?;
            if let (Some(cache), Some(sent_at)) = (&store.inner.deny, sent_at) {
                cache.record_held(&policy, &key, cost, sent_at, &decision, hold_us);
            }
            Ok(decision)
        })
    }

    /// Sends the charge, with what the key owes from charges that did not
    /// land; one that does not land is owed in turn (see `owed.rs`). Its
    /// answer is the figures of now for a call of cost 1, and a denial of
    /// that call is cached as one.
    pub(super) fn run_charge(&self, call: AdjustCall<'_>) -> StoreFuture<Decision> {
        let owed = match self.inner.owed.is_empty() {
            true => None,
            false => {
                let base = self.key_base(call.policy.name(), call.key);
                self.inner.owed.claim_for_charge(&base)
            }
        };
        let store = self.clone();
        let (policy, key) = (call.policy.clone(), call.key.clone());
        let cost = call.cost;
        StoreFuture::pending(async move {
            let total = cost.saturating_add(owed.as_ref().map_or(0, |s| s.charge.amount));
            let result = store.charge_now(&policy, &key, total).await;
            match owed {
                Some(sending) => sending.settle(&result),
                None if result.is_ok() => store.inner.owed.wrote(),
                None => {}
            }
            if let Err(err) = &result
                && !ran(err)
            {
                let base = store.key_base(policy.name(), &key);
                store.inner.owed.owe(base, &policy, &key, cost, err.clone());
            }
            result
        })
    }

    /// Sends what a key owes: paid when it lands, owed still when not.
    async fn send_owed(&self, sending: Sending) -> Result<(), StoreError> {
        let charge = &sending.charge;
        let result = self
            .charge_now(&charge.policy, &charge.key, charge.amount)
            .await
            .map(drop);
        // An odd reply settles the charge; the peek still fails, as on
        // any odd reply.
        sending.settle(&result);
        result
    }

    /// One charge script of `cost` for `key` under `policy`.
    async fn charge_now(
        &self,
        policy: &Policy,
        key: &Key,
        cost: u64,
    ) -> Result<Decision, StoreError> {
        let call = AdjustCall { policy, key, cost };
        let (keys, args, sent_at) = self.adjust_command(&call, Adjust::Charge);
        let script = &self.inner.scripts.of(policy.algorithm()).charge;
        let reply = self.eval(script, &keys, &args).await?;
        let limits = policy.limits().len();
        let (decision, hold_us) = if policy.algorithm().is_window() {
            decode_window(reply, limits)?
        } else {
            (decode_decision(&reply, limits, false)?, u64::MAX)
        };
        if let (Some(cache), Some(sent_at)) = (&self.inner.deny, sent_at) {
            cache.record_held(policy, key, 1, sent_at, &decision, hold_us);
        }
        Ok(decision)
    }

    /// Sends the refund, then forgets this instance's cached denials of
    /// the key under the policy (whatever the outcome: a call that timed
    /// out may have run).
    pub(super) fn run_refund(&self, call: AdjustCall<'_>) -> StoreFuture<()> {
        let (keys, args, _) = self.adjust_command(&call, Adjust::Refund);
        let store = self.clone();
        let (policy, key) = (call.policy.clone(), call.key.clone());
        StoreFuture::pending(async move {
            let script = &store.inner.scripts.of(policy.algorithm()).refund;
            let reply = store.eval(script, &keys, &args).await;
            if let Some(cache) = &store.inner.deny {
                cache.forget(policy.name(), &key);
            }
            decode_count(&reply?, usize::MAX)
        })
    }
}

/// The reply of a script that returns a count of what it did, from 0 to
/// `most`: a refund (how much it gave back: limits moved for GCRA, units
/// for the windows, any count), a defer (limits moved) and a reset (keys
/// that existed).
fn decode_count(reply: &Value, most: usize) -> Result<(), StoreError> {
    match reply {
        Value::Int(n) if usize::try_from(*n).is_ok_and(|n| n <= most) => Ok(()),
        _ => Err(StoreError::UnexpectedReply(format!("{reply:?}"))),
    }
}

// ------------------------------------------------------------------------
// Upstream feedback on Redis: `defer` of `lua/gcra.lua`, one round trip.

impl RedisStore {
    pub(super) fn run_gcra_defer(&self, call: Call<'_>) -> StoreFuture<()> {
        let Op::Defer {
            pause,
            remaining,
            age,
        } = call.op
        else {
            return StoreFuture::ready(Ok(()));
        };
        let limits = call.policy.limits();
        let now = self.now_arg();
        let mut args: Vec<String> = Vec::with_capacity(4 + 2 * limits.len());
        args.push(now);
        args.push(micros(pause).to_string());
        args.push(remaining.to_string());
        args.push(micros(age).to_string());
        for limit in limits {
            args.push(limit.emission_us().to_string());
            args.push(limit.tolerance_us().to_string());
        }
        let mut keys: Vec<String> = self.gcra_keys(call.policy, call.key).collect();
        let holds: Vec<String> = keys.iter().map(|k| hold_key(k)).collect();
        keys.extend(holds);
        let store = self.clone();
        let count = limits.len();
        StoreFuture::pending(async move {
            let reply = store
                .eval(&store.inner.scripts.gcra_defer, &keys, &args)
                .await?;
            decode_count(&reply, count)
        })
    }
}

/// Where the last hold of a limit is kept: beside its TAT, under the same
/// hash tag.
pub(super) fn hold_key(tat_key: &str) -> String {
    crate::text::concat(&[tat_key, ":hold"])
}

// ------------------------------------------------------------------------
// Resetting one identity's state on Redis: `lua/reset.lua`, one round
// trip that deletes every key the identity may hold under one name.

impl RedisStore {
    /// Every key `key` may hold under the name `name`, for a policy of any
    /// algorithm and as many limits as a policy may hold (its limits may
    /// have changed since the state was written): GCRA's (`{base}`, then
    /// `{base}:{i}`) and their holds, `{base}:sw:{i}`, `{base}:fw:{i}` and
    /// `{base}:cq:{i}` (window counters and calendar quotas) for `i` up to
    /// the most limits a policy may hold, `{base}:log` (sliding log),
    /// `{base}:block` (the penalty box), `{base}:lease` (concurrency leases)
    /// and its wait marker.
    pub(crate) fn reset_keys(&self, name: &str, key: &Key) -> Vec<String> {
        let base = self.key_base(name, key);
        let mut keys = Vec::with_capacity(5 * MAX_LIMITS_PER_POLICY + 3);
        keys.extend((0..MAX_LIMITS_PER_POLICY).map(|i| limit_key(&base, i)));
        keys.extend((0..MAX_LIMITS_PER_POLICY).map(|i| hold_key(&limit_key(&base, i))));
        for tag in [":sw:", ":fw:", ":cq:"] {
            let mut digits = itoa::Buffer::new();
            keys.extend(
                (0..MAX_LIMITS_PER_POLICY)
                    .map(|i| crate::text::concat(&[&base, tag, digits.format(i)])),
            );
        }
        keys.push(crate::text::concat(&[&base, ":log"]));
        keys.push(crate::text::concat(&[&base, ":block"]));
        keys.push(crate::text::concat(&[&base, ":lease"]));
        keys.push(crate::text::concat(&[&base, ":lease:w"]));
        keys
    }

    /// Deletes every key of [`reset_keys`](Self::reset_keys) in one script,
    /// within the store's timeout, then forgets this instance's cached
    /// denials of `key` under `name` (whatever the outcome: a call that
    /// timed out may have run). Other instances' deny caches keep what
    /// they hold, until its retry time at most. Once the keys are gone,
    /// a charge the key owed is forgotten too: it was a charge of the
    /// state just cleared.
    pub(super) fn run_reset(&self, name: &str, key: &Key) -> StoreFuture<()> {
        let keys = self.reset_keys(name, key);
        let store = self.clone();
        let (name, key) = (name.to_owned(), key.clone());
        StoreFuture::pending(async move {
            let reply = store.eval(&store.inner.scripts.reset, &keys, &[]).await;
            if let Some(cache) = &store.inner.deny {
                cache.forget(&name, &key);
            }
            decode_count(&reply?, keys.len())?;
            if !store.inner.owed.is_empty() {
                store.inner.owed.forget(&store.key_base(&name, &key));
            }
            Ok(())
        })
    }
}

// ------------------------------------------------------------------------
// Retry budgets: `take` of `lua/budget.lua`, one round trip.

impl RedisStore {
    /// The key of the retry budget `name`: `<prefix>:budget:{<name>}`.
    pub(super) fn budget_key(&self, name: &str) -> String {
        concat(&[&self.inner.prefix, ":budget:{", &hash_tag(name), "}"])
    }

    pub(super) fn run_budget(&self, call: BudgetCall<'_>) -> StoreFuture<BudgetTake> {
        let keys = [self.budget_key(call.name)];
        let now = self.now_arg();
        let args = [
            now,
            call.params.ratio_milli.to_string(),
            call.params.min_milli_per_slot.to_string(),
            call.params.slot_us.max(1).to_string(),
            call.deposits.to_string(),
            call.want.to_string(),
        ];
        let store = self.clone();
        let want = call.want;
        StoreFuture::pending(async move {
            let reply = store
                .eval(&store.inner.scripts.budget, &keys, &args)
                .await?;
            decode_budget(&reply, want)
        })
    }
}

/// Decodes `{granted, left}`, both counts of tokens, no more granted than
/// `want`.
fn decode_budget(reply: &Value, want: u64) -> Result<BudgetTake, StoreError> {
    if let Value::Array(items) = reply
        && let [Value::Int(granted), Value::Int(left)] = items.as_slice()
        && let (Ok(granted), Ok(left)) = (u64::try_from(*granted), u64::try_from(*left))
        && granted <= want
    {
        return Ok(BudgetTake { granted, left });
    }
    Err(StoreError::UnexpectedReply(format!("{reply:?}")))
}

#[cfg(test)]
mod tests {
    use super::super::tests::array;
    use super::*;

    #[test]
    fn odd_budget_replies_are_errors() {
        assert_eq!(
            decode_budget(&array(&[3, 7]), 3).unwrap(),
            BudgetTake {
                granted: 3,
                left: 7
            }
        );
        for reply in [
            Value::Nil,
            array(&[]),
            array(&[1]),
            array(&[1, 2, 3]),
            array(&[-1, 2]),
            array(&[1, -2]),
            // More than was asked for.
            array(&[4, 0]),
            array(&[i64::MAX, 0]),
            Value::Array(vec![Value::Int(1), Value::Nil]),
        ] {
            assert!(decode_budget(&reply, 3).is_err(), "{reply:?}");
        }
    }

    #[test]
    fn odd_window_replies_are_errors() {
        for reply in [
            Value::Nil,
            Value::Array(vec![]),
            Value::Array(vec![Value::Int(1); 5]),
            array(&[1, 3, 0, 0, 0, 0]),
            Value::Array(vec![
                Value::Int(0),
                Value::Int(1),
                Value::SimpleString("x".into()),
                Value::Int(0),
                Value::Int(0),
                Value::Int(0),
            ]),
            // No hold, or a hold that is not a count of microseconds.
            array(&[0, 1, 0, 5, 5]),
            array(&[0, 1, 0, 5, 5, -1]),
        ] {
            assert!(decode_window(reply.clone(), 1).is_err(), "{reply:?}");
        }
        let ok = array(&[0, 2, 0, 5, 7, 1, 9, 0, 5, 4]);
        let (d, hold) = decode_window(ok, 2).unwrap();
        assert!(!d.is_allowed());
        assert_eq!(d.limit_index(), 1);
        assert_eq!(d.retry_after(), Some(Duration::from_micros(7)));
        assert_eq!(d.reset_of(0), Some(Duration::from_micros(9)));
        assert_eq!(hold, 4);
    }

    #[test]
    fn odd_count_replies_are_errors() {
        for most in [0, 2, 50, usize::MAX] {
            for reply in [
                Value::Nil,
                Value::Okay,
                Value::Int(-1),
                Value::Array(vec![Value::Int(1)]),
                Value::BulkString(b"1".to_vec()),
            ] {
                assert!(decode_count(&reply, most).is_err(), "{reply:?}");
            }
            assert!(decode_count(&Value::Int(0), most).is_ok());
            assert!(decode_count(&Value::Int(most.min(7) as i64), most).is_ok());
        }
        assert!(decode_count(&Value::Int(2), 2).is_ok());
        assert!(decode_count(&Value::Int(50), 50).is_ok());
        assert!(decode_count(&Value::Int(3), 2).is_err());
        assert!(decode_count(&Value::Int(51), 50).is_err());
        assert!(decode_count(&Value::Int(i64::MAX), usize::MAX).is_ok());
    }
}
