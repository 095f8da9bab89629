//! The memory store's one dispatch: each operation of each algorithm,
//! run on the state this process holds (the GCRA TATs of the slot map,
//! the window table's logs and counters) with the functions of
//! `src/algorithm/`, exactly as the Lua scripts run them in Redis.
//!
//! A refund may move a state earlier, where every other step only moves it
//! later: a shard's `earliest` (no entry idle before then) is then too late
//! for that entry, which is only swept a little later than it could be.
//! An idle entry answers as no entry would, so nothing else changes.

use super::MemoryStore;
use super::slot::Step;
use crate::algorithm::{block, gcra};
use crate::decision::Decision;
use crate::policy::{Limit, Policy};
use crate::store::{Answer, Call, Op, micros};

impl MemoryStore {
    /// Runs `call` on this store's state, at the current time.
    #[inline(always)]
    pub(super) fn run_call(&self, call: &Call<'_>) -> Answer {
        if let Some(penalty) = call.policy.penalty_box()
            && matches!(call.op, Op::Check { .. } | Op::Peek)
        {
            return self.run_boxed(call, penalty);
        }
        self.run_algorithm(call)
    }

    /// A check or a peek of a policy with a penalty box (see
    /// `algorithm::block`): refused while the identity's box holds a
    /// block, else decided, and a refusal by a limit with a block starts
    /// one. The box is the one state of `penalty` for the key.
    #[inline(never)]
    fn run_boxed(&self, call: &Call<'_>, penalty: &Policy) -> Answer {
        let (value, now) = self.with_tats(penalty, call.key, &ReadBox);
        if let Some((end, limit)) = block::held(value, now) {
            return Answer::Decision(block::refusal(call.policy, end, limit, now));
        }
        let answer = self.run_algorithm(call);
        if let Answer::Decision(decision) = &answer
            && let Some((value, refusal)) = block::start(call.policy, decision, now)
        {
            self.with_tats(penalty, call.key, &StartBox(value));
            return Answer::Decision(refusal);
        }
        answer
    }

    /// Runs `call` with its algorithm alone.
    #[inline(always)]
    fn run_algorithm(&self, call: &Call<'_>) -> Answer {
        let Call {
            policy, key, cost, ..
        } = *call;
        match call.op {
            // Upstream feedback holds GCRA limits back, whatever the
            // policy's algorithm; the holds live in the second half of the
            // state.
            Op::Defer {
                pause,
                remaining,
                age,
            } => {
                let defer = Defer {
                    pause: micros(pause),
                    remaining,
                    age: micros(age),
                };
                self.with_tats(&policy.doubled(), key, &defer);
                Answer::Done
            }
            op if policy.algorithm().is_window() => self.window_op(call, op),
            Op::Check { max_wait } => Answer::Decision(self.with_tats(
                policy,
                key,
                &Check {
                    cost,
                    max_wait: micros(max_wait),
                },
            )),
            Op::Peek => Answer::Decision(self.with_tats(policy, key, &Peek { cost })),
            Op::Charge => Answer::Decision(self.with_tats(policy, key, &Charge { cost })),
            Op::Refund => {
                self.with_tats(policy, key, &Refund { cost });
                Answer::Done
            }
        }
    }
}

/// A GCRA check (or reservation): stores the TATs when admitted.
struct Check {
    cost: u64,
    max_wait: u64,
}

impl Step for Check {
    type Output = Decision;

    #[inline(always)]
    fn run(&self, limits: &[Limit], tats: &mut [u64], now: u64) -> (Decision, bool) {
        let (decision, idle_at) = gcra::check(limits, tats, now, self.cost, self.max_wait);
        (decision, idle_at.is_some())
    }
}

/// What a check of `cost` would answer: never stored.
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

/// Reads a penalty box (see `algorithm::block`) and the time it was read
/// at: never stored.
struct ReadBox;

impl Step for ReadBox {
    type Output = (u64, u64);

    fn run(&self, _: &[Limit], tats: &mut [u64], now: u64) -> ((u64, u64), bool) {
        ((tats.first().copied().unwrap_or(0), now), false)
    }
}

/// Starts a block: the box's new value, stored. The sweep counts the
/// value as the time the entry falls idle, which the block's end is, to
/// within the limit index it carries.
struct StartBox(u64);

impl Step for StartBox {
    type Output = ();

    fn run(&self, _: &[Limit], tats: &mut [u64], _: u64) -> ((), bool) {
        if let Some(value) = tats.first_mut() {
            *value = (*value).max(self.0);
        }
        ((), true)
    }
}
