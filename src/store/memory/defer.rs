//! Upstream feedback on the memory store: `gcra::defer` on the key's state,
//! exactly as `lua/gcra_defer.lua` does it in Redis.

use super::MemoryStore;
use super::slot::Step;
use crate::algorithm::gcra;
use crate::limit::Limit;
use crate::store::DeferCall;

impl MemoryStore {
    pub(super) fn defer(&self, call: &DeferCall<'_>) {
        let defer = Defer {
            pause: call.pause_us(),
            remaining: call.remaining,
            age: call.age_us(),
        };
        // The holds live in the second half of the state.
        self.with_tats(&call.policy.doubled(), call.key, &defer);
    }
}

/// Holds every limit back so that at most `remaining` calls pass before
/// `pause` from now; stored when it moved anything past now.
struct Defer {
    pause: u64,
    remaining: u64,
    age: u64,
}

impl Step for Defer {
    type Output = ();

    fn run(&self, limits: &[Limit], tats: &mut [u64], now: u64) -> ((), bool) {
        // The policy was doubled: TATs first, then the holds.
        let n = limits.len() / 2;
        let (tats, holds) = tats.split_at_mut(n);
        let idle = gcra::defer(
            &limits[..n],
            tats,
            holds,
            now,
            self.pause,
            self.remaining,
            self.age,
        );
        ((), idle > now)
    }
}
