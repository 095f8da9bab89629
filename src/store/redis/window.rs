//! The Redis store's window algorithms: one script per algorithm, one
//! round trip per decision, every key of one identity under one hash tag.

use super::{LuaScript, RedisStore, TimeSource, decode_decision};
use crate::algorithm::Algorithm;
use crate::decision::Decision;
use crate::key::Key;
use crate::limit::Policy;
use crate::store::{StoreFuture, WindowCall};
use crate::window::Window;

const SLIDING_LOG_LUA: &str = include_str!("../../../lua/sliding_log.lua");
const SLIDING_COUNTER_LUA: &str = include_str!("../../../lua/sliding_counter.lua");
const FIXED_WINDOW_LUA: &str = include_str!("../../../lua/fixed_window.lua");

/// The window scripts, hashed once per store.
#[derive(Debug)]
pub(super) struct Scripts {
    sliding_log: LuaScript,
    sliding_counter: LuaScript,
    fixed_window: LuaScript,
}

impl Scripts {
    pub(super) fn new() -> Self {
        Scripts {
            sliding_log: LuaScript::new("sliding_log", SLIDING_LOG_LUA),
            sliding_counter: LuaScript::new("sliding_counter", SLIDING_COUNTER_LUA),
            fixed_window: LuaScript::new("fixed_window", FIXED_WINDOW_LUA),
        }
    }

    fn script(&self, algorithm: Algorithm) -> &LuaScript {
        match algorithm {
            Algorithm::SlidingLog => &self.sliding_log,
            Algorithm::SlidingWindow => &self.sliding_counter,
            _ => &self.fixed_window,
        }
    }
}

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
            Algorithm::Gcra => return Vec::new(),
        };
        (0..policy.limits().len())
            .map(|i| format!("{base}:{tag}:{i}"))
            .collect()
    }

    pub(super) fn run_window(&self, call: WindowCall<'_>) -> StoreFuture<Decision> {
        let algorithm = call.policy.algorithm();
        if !algorithm.is_window() {
            // Only reached through a GCRA policy handed to `window`: decide
            // it as what it is.
            return self.run_gcra(call.as_gcra());
        }
        let limits = call.policy.limits();
        let keys = self.window_keys(call.policy, call.key);
        let script = self.inner.windows.script(algorithm);
        let mut cmd = script.call(keys.len(), 2 + 2 * limits.len());
        cmd.arg(&keys);
        match &self.inner.time {
            TimeSource::Server => cmd.arg(""),
            TimeSource::Client(clock) => cmd.arg(clock.now_micros()),
        };
        cmd.arg(call.cost);
        for limit in limits {
            let w = Window::of(limit);
            cmd.arg(w.length).arg(w.count);
        }
        let store = self.clone();
        let count = limits.len();
        StoreFuture::pending(async move {
            let reply = store
                .run(store.inner.windows.script(algorithm), cmd)
                .await?;
            // GCRA's reply shape, with 0 where GCRA puts the wait, then
            // every window's remaining and reset.
            decode_decision(&reply, count, true)
        })
    }
}

#[cfg(test)]
mod tests {
    use redis::Value;

    use super::*;

    #[test]
    fn odd_window_replies_are_errors() {
        for reply in [
            Value::Nil,
            Value::Array(vec![Value::Int(1); 4]),
            Value::Array(vec![
                Value::Int(1),
                Value::Int(3),
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
            ]),
        ] {
            assert!(decode_decision(&reply, 2, true).is_err(), "{reply:?}");
        }
    }
}
