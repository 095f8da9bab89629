//! Peek, charge and refund on Redis: one script per operation and
//! algorithm (see [`scripts`](super::scripts)), one round trip each, on
//! the same keys as the decision.
//!
//! Each operation is a function of the algorithm's Lua file, as the check
//! is: a peek is the check without its store; a charge stores the charge
//! whatever the state holds, then reports the figures of now for a call
//! of cost 1, as `charge` does in the algorithm's Rust file.
//!
//! The deny cache: a peek is answered from it and recorded in it exactly
//! as a check is (a denied check stores nothing, so its denial is the
//! peek's). A charge that leaves the key unable to pass a call of cost 1
//! records that denial for calls of cost 1; anything else it says drops
//! what was cached. A refund drops this instance's cached denials of the
//! key under the policy, whatever its outcome (like a reset); other
//! instances' caches may still deny locally until the retry time they were
//! told: a refund is the one write that makes Redis admit sooner, so the
//! cache is conservative, not exact, for keys that get refunds.

use std::time::Duration;

use ::redis::Value;
use tokio::runtime::Handle;

use super::owed::{Claim, Sending, ran};
use super::window::decode_window;
use super::{RedisStore, TimeSource, decode_decision, one_reply};
use crate::algorithm::Algorithm;
use crate::decision::Decision;
use crate::error::StoreError;
use crate::key::Key;
use crate::policy::Policy;
use crate::store::StoreFuture;

/// A peek, a charge or a refund of `cost` for `key` under `policy`.
#[derive(Clone, Copy, Debug)]
pub(super) struct AdjustCall<'a> {
    pub(super) policy: &'a Policy,
    pub(super) key: &'a Key,
    pub(super) cost: u64,
}

/// Which operation a script runs: the arguments of a GCRA peek are those
/// of a check of one call (`lua/gcra.lua`).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Op {
    Peek,
    Charge,
    Refund,
}

impl RedisStore {
    /// The keys and arguments of `op` on `call`, and the instant it is
    /// sent as the deny cache counts time (see `RedisStore::sent_at`).
    fn adjust_command(
        &self,
        call: &AdjustCall<'_>,
        op: Op,
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
            if op == Op::Peek {
                // One set of limits, counted; then one call of it: its
                // cost, no wait.
                args.extend(["1".to_owned(), limits.len().to_string()]);
                args.extend(each_limit);
                args.extend(["1".to_owned(), call.cost.to_string(), "0".to_owned()]);
            } else {
                args.push(call.cost.to_string());
                args.extend(each_limit);
                if op == Op::Charge {
                    args.extend(limits.iter().map(|l| l.debt_horizon_us().to_string()));
                }
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
            let call = AdjustCall {
                policy: &policy,
                key: &key,
                cost,
            };
            let (keys, args, sent_at) = store.adjust_command(&call, Op::Peek);
            let script = &store.inner.scripts.of(policy.algorithm()).peek;
            let reply = store.eval(script, &keys, &args).await?;
            if !policy.algorithm().is_window() {
                let reply = one_reply(Algorithm::Gcra, reply)?;
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
        let (keys, args, sent_at) = self.adjust_command(&call, Op::Charge);
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
        let (keys, args, _) = self.adjust_command(&call, Op::Refund);
        let store = self.clone();
        let (policy, key) = (call.policy.clone(), call.key.clone());
        StoreFuture::pending(async move {
            let script = &store.inner.scripts.of(policy.algorithm()).refund;
            let reply = store.eval(script, &keys, &args).await;
            if let Some(cache) = &store.inner.deny {
                cache.forget(policy.name(), &key);
            }
            decode_refund(&reply?)
        })
    }
}

/// A refund script returns how much it gave back (limits moved for GCRA,
/// units for the windows): a count, never negative.
fn decode_refund(reply: &Value) -> Result<(), StoreError> {
    match reply {
        Value::Int(n) if *n >= 0 => Ok(()),
        _ => Err(StoreError::UnexpectedReply(format!("{reply:?}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn odd_refund_replies_are_errors() {
        for reply in [
            Value::Nil,
            Value::Okay,
            Value::Int(-1),
            Value::Array(vec![Value::Int(1)]),
            Value::BulkString(b"1".to_vec()),
        ] {
            assert!(decode_refund(&reply).is_err(), "{reply:?}");
        }
        assert!(decode_refund(&Value::Int(0)).is_ok());
        assert!(decode_refund(&Value::Int(7)).is_ok());
    }
}
