//! Upstream feedback on the memory store: `gcra::defer` under the shard's
//! lock, exactly as `lua/gcra_defer.lua` does it in Redis.

use std::hash::BuildHasher;

use super::{Entry, MemoryStore, lock};
use crate::gcra::{self, Params};
use crate::limit::MAX_LIMITS_PER_POLICY;
use crate::store::DeferCall;

impl MemoryStore {
    pub(super) fn defer(&self, call: &DeferCall<'_>) {
        let limits = call.policy.limits();
        let mut params = [Params {
            emission: 1,
            tolerance: 0,
        }; MAX_LIMITS_PER_POLICY];
        for (p, limit) in params.iter_mut().zip(limits) {
            *p = Params {
                emission: limit.emission_us(),
                tolerance: limit.tolerance_us(),
            };
        }
        let params = &params[..limits.len()];
        let shard_index =
            self.inner.hasher.hash_one(call.key.as_str()) as usize % self.inner.shards.len();
        let mut shard = lock(&self.inner.shards[shard_index]);
        let now = self.inner.clock.now_micros();
        let pause = call.pause_us();
        let policy = call.policy.name();
        let existing = shard
            .map
            .get_mut(call.key.as_str())
            .and_then(|slot| slot.iter_mut().find(|e| &*e.policy == policy));
        if let Some(entry) = existing {
            if entry.tats.len() < params.len() {
                // Keep each limit's state by position, as in `decide`.
                let mut tats = vec![0u64; params.len()].into_boxed_slice();
                tats[..entry.tats.len()].copy_from_slice(&entry.tats);
                entry.tats = tats;
            }
            let idle_at = gcra::defer(params, &mut entry.tats[..params.len()], now, pause);
            entry.idle_at = entry.idle_at.max(idle_at);
            return;
        }
        let mut tats = vec![0u64; params.len()].into_boxed_slice();
        let idle_at = gcra::defer(params, &mut tats, now, pause);
        let entry = Entry {
            policy: call.policy.name_arc(),
            tats,
            idle_at,
        };
        shard.insert(call.key, entry, now);
    }
}
