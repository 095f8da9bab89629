//! Resetting one identity's state on Redis: `lua/reset.lua`, one round
//! trip that deletes every key the identity may hold under one name.

use ::redis::Value;

use super::{RedisStore, limit_key};
use crate::error::StoreError;
use crate::key::Key;
use crate::policy::MAX_LIMITS_PER_POLICY;
use crate::store::StoreFuture;

impl RedisStore {
    /// Every key `key` may hold under the name `name`, for a policy of any
    /// algorithm and as many limits as a policy may hold (its limits may
    /// have changed since the state was written): `{base}:{i}` (GCRA),
    /// `{base}:sw:{i}` and `{base}:fw:{i}` (window counters) for `i` up to
    /// the most limits a policy may hold, `{base}:log` (sliding log) and
    /// `{base}:lease` (concurrency leases).
    pub(crate) fn reset_keys(&self, name: &str, key: &Key) -> Vec<String> {
        let base = self.key_base(name, key);
        let mut keys = Vec::with_capacity(4 * MAX_LIMITS_PER_POLICY + 2);
        keys.extend((0..MAX_LIMITS_PER_POLICY).map(|i| limit_key(&base, i)));
        keys.extend(
            (0..MAX_LIMITS_PER_POLICY).map(|i| super::defer::hold_key(&limit_key(&base, i))),
        );
        for tag in [":sw:", ":fw:"] {
            let mut digits = itoa::Buffer::new();
            keys.extend(
                (0..MAX_LIMITS_PER_POLICY)
                    .map(|i| crate::text::concat(&[&base, tag, digits.format(i)])),
            );
        }
        keys.push(crate::text::concat(&[&base, ":log"]));
        keys.push(crate::text::concat(&[&base, ":lease"]));
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
            decode_reset(&reply?, keys.len())?;
            if !store.inner.owed.is_empty() {
                store.inner.owed.forget(&store.key_base(&name, &key));
            }
            Ok(())
        })
    }
}

/// The script returns how many keys existed: 0 to all of them.
fn decode_reset(reply: &Value, keys: usize) -> Result<(), StoreError> {
    match reply {
        Value::Int(n) if usize::try_from(*n).is_ok_and(|n| n <= keys) => Ok(()),
        _ => Err(StoreError::UnexpectedReply(format!("{reply:?}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn odd_reset_replies_are_errors() {
        for reply in [
            Value::Nil,
            Value::Okay,
            Value::Int(-1),
            Value::Int(51),
            Value::Array(vec![Value::Int(1)]),
            Value::BulkString(b"1".to_vec()),
        ] {
            assert!(decode_reset(&reply, 50).is_err(), "{reply:?}");
        }
        assert!(decode_reset(&Value::Int(0), 50).is_ok());
        assert!(decode_reset(&Value::Int(50), 50).is_ok());
    }
}
