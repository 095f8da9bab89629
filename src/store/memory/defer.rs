//! Upstream feedback on the memory store: `gcra::defer` on the key's state,
//! exactly as `lua/gcra_defer.lua` does it in Redis.

use super::MemoryStore;
use crate::gcra;
use crate::store::DeferCall;

impl MemoryStore {
    pub(super) fn defer(&self, call: &DeferCall<'_>) {
        let pause = call.pause_us();
        self.with_tats(call.policy, call.key, |params, tats, now| {
            ((), gcra::defer(params, tats, now, pause) > now)
        });
    }
}
