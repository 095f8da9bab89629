//! The Redis store's window algorithms: one script per algorithm, one
//! round trip per decision, every key of one identity under one hash tag.
//! Calls that find the connection busy travel together in one script, as
//! GCRA calls do (see [`batch`](super::batch)).

use std::time::Duration;

use redis::{Cmd, Value};

use super::{RedisStore, TimeSource, decode_decision};
use crate::algorithm::Algorithm;
use crate::decision::Decision;
use crate::error::StoreError;
use crate::key::Key;
use crate::policy::Policy;
use crate::store::{Call, StoreFuture};

impl RedisStore {
    /// The Redis keys that hold the window state of `policy` for `key`:
    /// `{prefix}:{policy}:{{key}}:log` for the sliding log (one sorted set
    /// for every window), `…:sw:{i}` and `…:fw:{i}` (one per window) for the
    /// sliding-window counter and the fixed window. Empty for GCRA; see
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
    pub(super) fn window_script<'a, I>(&self, algorithm: Algorithm, calls: I) -> (Cmd, Option<u64>)
    where
        I: Iterator<Item = (&'a Policy, &'a Key, u64)> + Clone,
    {
        let keys: Vec<Vec<String>> = calls
            .clone()
            .map(|(policy, key, _)| self.window_keys(policy, key))
            .collect();
        let args = 2 + calls
            .clone()
            .map(|(policy, ..)| 3 + 2 * policy.limits().len())
            .sum::<usize>();
        let mut cmd = self
            .check_script(algorithm)
            .call(keys.iter().map(Vec::len).sum(), args);
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
        // Each call's keys and arguments counted, then its arguments: cost,
        // and each window's length and count.
        for ((policy, _, cost), names) in calls.zip(&keys) {
            let limits = policy.limits();
            cmd.arg(names.len()).arg(1 + 2 * limits.len());
            cmd.arg(cost);
            for limit in limits {
                let (length, count) = self.window_args(limit);
                cmd.arg(length).arg(count);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn odd_window_replies_are_errors() {
        for reply in [
            Value::Nil,
            Value::Array(vec![]),
            Value::Array(vec![Value::Int(1); 5]),
            Value::Array(vec![
                Value::Int(1),
                Value::Int(3),
                Value::Int(0),
                Value::Int(0),
                Value::Int(0),
                Value::Int(0),
            ]),
            Value::Array(vec![
                Value::Int(0),
                Value::Int(1),
                Value::SimpleString("x".into()),
                Value::Int(0),
                Value::Int(0),
                Value::Int(0),
            ]),
            // No hold, or a hold that is not a count of microseconds.
            Value::Array(vec![
                Value::Int(0),
                Value::Int(1),
                Value::Int(0),
                Value::Int(5),
                Value::Int(5),
            ]),
            Value::Array(vec![
                Value::Int(0),
                Value::Int(1),
                Value::Int(0),
                Value::Int(5),
                Value::Int(5),
                Value::Int(-1),
            ]),
        ] {
            assert!(decode_window(reply.clone(), 1).is_err(), "{reply:?}");
        }
        let ok = Value::Array(vec![
            Value::Int(0),
            Value::Int(2),
            Value::Int(0),
            Value::Int(5),
            Value::Int(7),
            Value::Int(1),
            Value::Int(9),
            Value::Int(0),
            Value::Int(5),
            Value::Int(4),
        ]);
        let (d, hold) = decode_window(ok, 2).unwrap();
        assert!(!d.is_allowed());
        assert_eq!(d.limit_index(), 1);
        assert_eq!(d.retry_after(), Some(Duration::from_micros(7)));
        assert_eq!(d.reset_of(0), Some(Duration::from_micros(9)));
        assert_eq!(hold, 4);
    }
}
