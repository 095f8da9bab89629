//! Peek, charge and refund on the memory store: `gcra::{decide, charge,
//! refund}` on the key's TATs, and `window::{peek, charge, refund}` on its
//! window state, exactly as the Lua scripts do them in Redis.
//!
//! A refund may move a state earlier, where every other step only moves it
//! later: a shard's `earliest` (no entry idle before then) is then too late
//! for that entry, which is only swept a little later than it could be.
//! An idle entry answers as no entry would, so nothing else changes.

use super::MemoryStore;
use super::slot::Step;
use crate::algorithm::gcra;
use crate::decision::Decision;
use crate::limit::Limit;
use crate::store::AdjustCall;

/// What the window table does with a key's state: the ordinary check, or
/// one of the operations of this file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Op {
    Check,
    Peek,
    Charge,
    Refund,
}

impl MemoryStore {
    pub(super) fn peek(&self, call: &AdjustCall<'_>) -> Decision {
        if call.policy.algorithm().is_window() {
            return self.window_op(call, Op::Peek);
        }
        self.with_tats(call.policy, call.key, &Peek { cost: call.cost })
    }

    pub(super) fn charge(&self, call: &AdjustCall<'_>) -> Decision {
        if call.policy.algorithm().is_window() {
            return self.window_op(call, Op::Charge);
        }
        self.with_tats(call.policy, call.key, &Charge { cost: call.cost })
    }

    pub(super) fn refund(&self, call: &AdjustCall<'_>) {
        if call.policy.algorithm().is_window() {
            self.window_op(call, Op::Refund);
            return;
        }
        self.with_tats(call.policy, call.key, &Refund { cost: call.cost });
    }
}

/// What a check of `cost` would answer: GCRA's decision on a copy of the
/// TATs, never stored.
struct Peek {
    cost: u64,
}

impl Step for Peek {
    type Output = Decision;

    fn run(&self, limits: &[Limit], tats: &mut [u64], now: u64) -> (Decision, bool) {
        (gcra::peek(limits, tats, now, self.cost), false)
    }
}

/// Takes `cost` from every limit, into debt if need be: always stored.
struct Charge {
    cost: u64,
}

impl Step for Charge {
    type Output = Decision;

    fn run(&self, limits: &[Limit], tats: &mut [u64], now: u64) -> (Decision, bool) {
        let (decision, _) = gcra::charge(limits, tats, now, self.cost);
        (decision, true)
    }
}

/// Gives `cost` back: stored when a TAT moved.
struct Refund {
    cost: u64,
}

impl Step for Refund {
    type Output = ();

    fn run(&self, limits: &[Limit], tats: &mut [u64], now: u64) -> ((), bool) {
        ((), gcra::refund(limits, tats, now, self.cost))
    }
}
