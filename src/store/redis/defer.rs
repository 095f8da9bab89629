//! Upstream feedback on Redis: `defer` of `lua/gcra.lua`, one round trip.

use ::redis::Value;

use super::{RedisStore, TimeSource};
use crate::error::StoreError;
use crate::store::{Call, Op, StoreFuture, micros};

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
        let now = match &self.inner.time {
            TimeSource::Server => String::new(),
            TimeSource::Client(clock) => clock.now_micros().to_string(),
        };
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
            decode_defer(&reply, count)
        })
    }
}

/// Where the last hold of a limit is kept: beside its TAT, under the same
/// hash tag.
pub(super) fn hold_key(tat_key: &str) -> String {
    crate::text::concat(&[tat_key, ":hold"])
}

/// The script returns how many limits it moved: 0 to `limits`.
fn decode_defer(reply: &Value, limits: usize) -> Result<(), StoreError> {
    match reply {
        Value::Int(n) if usize::try_from(*n).is_ok_and(|n| n <= limits) => Ok(()),
        _ => Err(StoreError::UnexpectedReply(format!("{reply:?}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn odd_defer_replies_are_errors() {
        for reply in [
            Value::Nil,
            Value::Okay,
            Value::Int(-1),
            Value::Int(3),
            Value::Array(vec![Value::Int(1)]),
            Value::BulkString(b"1".to_vec()),
        ] {
            assert!(decode_defer(&reply, 2).is_err(), "{reply:?}");
        }
        assert!(decode_defer(&Value::Int(0), 2).is_ok());
        assert!(decode_defer(&Value::Int(2), 2).is_ok());
    }
}
