//! Charges that did not land, kept per key and sent again before the
//! key's next peek or charge.
//!
//! A route charged after the response ([`ResponseCost`]) admits with a
//! peek. A Redis that answers reads but refuses writes (a read-only
//! replica after a failover, a master past `maxmemory` with
//! `noeviction`) answers the peek and refuses the charge; were the charge
//! dropped, every later peek would pass and the limit would be off. So a
//! key whose charge failed *owes* it: its next peek first sends what it
//! owes, and if that fails the peek fails with the same error. The layer's
//! failure policy then decides the call exactly as for a failed check:
//! `Closed` refuses, `Local` decides on the local limiter (which took the
//! failed charge), `Open` admits. Once a charge lands again the key is
//! settled and decided by Redis as before. A charge of a key that owes
//! carries what it owes.
//!
//! At least once: a charge that timed out may have run all the same. It
//! is sent again, so such a key can be charged twice for one call, never
//! not at all: the limit errs on the side of holding. (A charge whose
//! reply was odd did run, and is not owed.) A peek sends what its key
//! owes on a task of its own, so that a caller going away cannot cut the
//! charge off halfway and have it sent twice.
//!
//! Bounded: at most [`CAPACITY`] keys owe at once, and a charge is owed
//! only as long as it would have held its key back (its policy's horizon:
//! GCRA's `τ + 16·P`, or an hour, see `gcra::debt_horizon`; two of a
//! window algorithm's longest windows), then forgotten. A failed charge
//! beyond the capacity is not kept; the store is then *overflowed*, and a
//! peek of a key that owes nothing fails too, unless a charge another key
//! owes lands first: that shows Redis takes writes again and ends the
//! overflow. A key whose charge was not kept can thus have had one call
//! more than its limit, no more.
//!
//! While a key's owed charge is on its way, its other peeks fail at once
//! rather than wait or pass: whether the charge lands is not known yet.
//!
//! [`ResponseCost`]: crate::rate_limit::ResponseCost

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::error::StoreError;
use crate::key::Key;
use crate::policy::Policy;

/// The most keys that owe a charge at once. An entry costs a policy
/// handle, the key and its Redis name: a few hundred bytes.
pub(super) const CAPACITY: usize = 10_000;

/// How often, at most, the table is swept of charges past their time.
const SWEEP_EVERY: Duration = Duration::from_secs(1);

/// The store's owed charges.
#[derive(Debug, Default)]
pub(super) struct Owed {
    /// Whether anything is owed or the store is overflowed: read on every
    /// peek and charge, so that a store that owes nothing takes no lock.
    any: AtomicBool,
    /// Whether the store is overflowed, read by every charge that lands.
    overflowed: AtomicBool,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// By the key's Redis name under its policy (`RedisStore::key_base`).
    keys: HashMap<String, Entry>,
    overflowed: bool,
    /// Numbers entries, so that the outcome of a charge sent for an entry
    /// since forgotten (a reset) leaves a newer one of the key alone.
    generation: u64,
    swept: Option<Instant>,
}

#[derive(Debug)]
struct Entry {
    policy: Policy,
    key: Key,
    amount: u64,
    generation: u64,
    /// When the charge stops mattering: forgotten then.
    until: Instant,
    /// Whether a peek or charge is sending it now.
    sending: bool,
    /// Why it did not land, for the peeks refused meanwhile.
    error: StoreError,
}

/// What a peek or charge of a key must do first.
#[derive(Debug)]
pub(super) enum Claim {
    /// Nothing: go ahead.
    Settled,
    /// Fail with this error: the key's owed charge is on its way, or the
    /// store is overflowed with every owed charge on its way.
    Refuse(StoreError),
    /// Send this charge first.
    Send(Sending),
}

/// A charge to send again: `amount` of `key` under `policy`.
#[derive(Debug)]
pub(super) struct Charge {
    base: String,
    generation: u64,
    pub(super) policy: Policy,
    pub(super) key: Key,
    pub(super) amount: u64,
}

/// How long a charge under `policy` holds its key back at most: how long
/// it is worth sending again.
fn lasts(policy: &Policy) -> Duration {
    let micros = policy.limits().iter().map(|limit| {
        if policy.algorithm().is_window() {
            limit.as_window().length.saturating_mul(2)
        } else {
            limit.debt_horizon_us()
        }
    });
    Duration::from_micros(micros.max().unwrap_or(0))
}

impl Owed {
    /// The table is consistent after every step: a panic elsewhere while
    /// it was held changes nothing.
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Whether nothing is owed (the usual case): no lock taken.
    #[inline]
    pub(super) fn is_empty(&self) -> bool {
        !self.any.load(Ordering::Acquire)
    }

    fn update(&self, state: &State) {
        let any = !state.keys.is_empty() || state.overflowed;
        self.overflowed.store(state.overflowed, Ordering::Release);
        self.any.store(any, Ordering::Release);
    }

    /// Forgets the charges past their time, at most once a
    /// [`SWEEP_EVERY`]; those on their way are left to end.
    fn sweep(state: &mut State, now: Instant) {
        if state.swept.is_some_and(|at| now < at + SWEEP_EVERY) {
            return;
        }
        state.swept = Some(now);
        state.keys.retain(|_, e| e.sending || e.until > now);
    }

    /// A charge of `amount` for `key` under `policy` (named `base` in
    /// Redis) did not land: `error`.
    pub(super) fn owe(
        &self,
        base: String,
        policy: &Policy,
        key: &Key,
        amount: u64,
        error: StoreError,
    ) {
        let now = Instant::now();
        let until = now + lasts(policy);
        let mut state = self.lock();
        Self::sweep(&mut state, now);
        if let Some(entry) = state.keys.get_mut(&base) {
            entry.amount = entry.amount.saturating_add(amount);
            entry.until = entry.until.max(until);
            entry.error = error;
        } else if state.keys.len() < CAPACITY {
            state.generation += 1;
            let entry = Entry {
                policy: policy.clone(),
                key: key.clone(),
                amount,
                generation: state.generation,
                until,
                sending: false,
                error,
            };
            state.keys.insert(base, entry);
        } else {
            state.overflowed = true;
        }
        self.update(&state);
    }

    /// What a peek of the key named `base` must do first: send its owed
    /// charge, or with an overflowed store another key's, as a probe.
    pub(super) fn claim_for_peek(self: &Arc<Self>, base: &str) -> Claim {
        let now = Instant::now();
        let mut state = self.lock();
        Self::sweep(&mut state, now);
        let claim = self.claim(&mut state, base, now);
        self.update(&state);
        claim
    }

    fn claim(self: &Arc<Self>, state: &mut State, base: &str, now: Instant) -> Claim {
        if let Some(entry) = state.keys.get_mut(base) {
            if entry.sending || entry.until > now {
                return take(self, base, entry);
            }
            state.keys.remove(base);
        }
        if !state.overflowed {
            return Claim::Settled;
        }
        if state.keys.is_empty() {
            state.overflowed = false;
            return Claim::Settled;
        }
        let mut last = None;
        for (name, entry) in state.keys.iter_mut() {
            if !entry.sending {
                return take(self, name, entry);
            }
            last = Some(entry.error.clone());
        }
        Claim::Refuse(overflowed(last))
    }

    /// What a charge of the key named `base` carries besides its own
    /// amount: what the key owes, unless that is on its way already.
    pub(super) fn claim_for_charge(self: &Arc<Self>, base: &str) -> Option<Sending> {
        let now = Instant::now();
        let mut state = self.lock();
        let entry = state.keys.get_mut(base)?;
        if !entry.sending && entry.until <= now {
            state.keys.remove(base);
            self.update(&state);
            return None;
        }
        match take(self, base, entry) {
            Claim::Send(sending) => Some(sending),
            _ => None,
        }
    }

    /// The entry `charge` was sent for, if it is still the key's.
    fn entry<'s>(state: &'s mut State, charge: &Charge) -> Option<&'s mut Entry> {
        state
            .keys
            .get_mut(&charge.base)
            .filter(|e| e.generation == charge.generation)
    }

    /// `charge` has landed: what it carried is paid, and Redis takes
    /// writes again, which ends an overflow.
    fn landed(&self, charge: &Charge) {
        let mut state = self.lock();
        if let Some(entry) = Self::entry(&mut state, charge) {
            entry.amount = entry.amount.saturating_sub(charge.amount);
            entry.sending = false;
            if entry.amount == 0 {
                state.keys.remove(&charge.base);
            }
        }
        state.overflowed = false;
        self.update(&state);
    }

    /// Some charge that owed nothing has landed: an overflow ends.
    pub(super) fn wrote(&self) {
        if !self.overflowed.load(Ordering::Acquire) {
            return;
        }
        let mut state = self.lock();
        state.overflowed = false;
        self.update(&state);
    }

    /// The key named `base` was reset: what it owed is forgotten (a charge
    /// of it on its way ends without touching what the key owes next).
    pub(super) fn forget(&self, base: &str) {
        let mut state = self.lock();
        if state.keys.remove(base).is_some() {
            self.update(&state);
        }
    }

    /// `charge` failed again with `error` (or, with `None`, was never
    /// sent to the end): still owed, and free for the next peek to send.
    fn failed(&self, charge: &Charge, error: Option<StoreError>) {
        let mut state = self.lock();
        if let Some(entry) = Self::entry(&mut state, charge) {
            entry.sending = false;
            if let Some(error) = error {
                entry.error = error;
            }
        }
    }
}

/// A claimed charge on its way, which ends [`landed`](Self::landed) or
/// [`failed`](Self::failed). Dropped before either (the future of the
/// call that was to send it was dropped), it is owed as before and the
/// key's next peek sends it, rather than every later peek being refused
/// as if it were still on its way.
#[derive(Debug)]
pub(super) struct Sending {
    owed: Arc<Owed>,
    pub(super) charge: Charge,
    done: bool,
}

impl Sending {
    /// It landed: paid.
    pub(super) fn landed(mut self) {
        self.done = true;
        self.owed.landed(&self.charge);
    }

    /// It failed with `error`: still owed.
    pub(super) fn failed(mut self, error: StoreError) {
        self.done = true;
        self.owed.failed(&self.charge, Some(error));
    }

    /// The script that carried it answered `result`: paid if it ran (an
    /// odd reply comes from a script that ran), owed still if not.
    pub(super) fn settle<T>(self, result: &Result<T, StoreError>) {
        match result {
            Err(err) if !ran(err) => self.failed(err.clone()),
            _ => self.landed(),
        }
    }
}

/// Whether a call that failed with `err` ran all the same: an odd reply
/// comes from a script that did; any other failure may mean it did not.
pub(super) fn ran(err: &StoreError) -> bool {
    matches!(err, StoreError::UnexpectedReply(_))
}

impl Drop for Sending {
    fn drop(&mut self) {
        if !self.done {
            self.owed.failed(&self.charge, None);
        }
    }
}

fn take(owed: &Arc<Owed>, base: &str, entry: &mut Entry) -> Claim {
    if entry.sending {
        return Claim::Refuse(StoreError::Redis(format!(
            "an earlier charge of this key is being sent again (it failed: {})",
            entry.error
        )));
    }
    entry.sending = true;
    Claim::Send(Sending {
        owed: Arc::clone(owed),
        charge: Charge {
            base: base.to_owned(),
            generation: entry.generation,
            policy: entry.policy.clone(),
            key: entry.key.clone(),
            amount: entry.amount,
        },
        done: false,
    })
}

fn overflowed(last: Option<StoreError>) -> StoreError {
    StoreError::Redis(format!(
        "more than {CAPACITY} keys owe a charge that did not land{}",
        last.map(|e| format!(" ({e})")).unwrap_or_default()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::Limit;
    use crate::policy::Rate;

    fn policy() -> Policy {
        Policy::single("p", Limit::new(Rate::per_second(1)).unwrap()).unwrap()
    }

    fn error() -> StoreError {
        StoreError::Redis("READONLY".into())
    }

    #[test]
    fn an_owed_charge_is_sent_once_at_a_time_and_paid_when_it_lands() {
        let owed = Arc::new(Owed::default());
        assert!(owed.is_empty());
        let (p, k) = (policy(), Key::new("k"));
        owed.owe("a".into(), &p, &k, 3, error());
        owed.owe("a".into(), &p, &k, 4, error());
        assert!(!owed.is_empty());
        assert!(matches!(owed.claim_for_peek("b"), Claim::Settled));
        let Claim::Send(charge) = owed.claim_for_peek("a") else {
            panic!("nothing to send");
        };
        assert_eq!(charge.charge.amount, 7);
        // On its way: another peek of the key fails, a charge carries nothing.
        assert!(matches!(owed.claim_for_peek("a"), Claim::Refuse(_)));
        assert!(owed.claim_for_charge("a").is_none());
        charge.failed(error());
        let Claim::Send(charge) = owed.claim_for_peek("a") else {
            panic!("nothing to send");
        };
        // Owed meanwhile: kept once the 7 are paid.
        owed.owe("a".into(), &p, &k, 1, error());
        charge.landed();
        let charge = owed.claim_for_charge("a").expect("1 still owed");
        assert_eq!(charge.charge.amount, 1);
        charge.landed();
        assert!(owed.is_empty());
    }

    #[test]
    fn a_charge_dropped_on_its_way_is_owed_still_and_sent_next() {
        let owed = Arc::new(Owed::default());
        owed.owe("a".into(), &policy(), &Key::new("k"), 2, error());
        let Claim::Send(sending) = owed.claim_for_peek("a") else {
            panic!("nothing to send");
        };
        drop(sending);
        let Claim::Send(sending) = owed.claim_for_peek("a") else {
            panic!("refused after its sender went away");
        };
        assert_eq!(sending.charge.amount, 2);
    }

    #[test]
    fn a_reset_key_is_untouched_by_the_end_of_a_charge_sent_before() {
        let owed = Arc::new(Owed::default());
        let (p, k) = (policy(), Key::new("k"));
        owed.owe("a".into(), &p, &k, 5, error());
        let Claim::Send(old) = owed.claim_for_peek("a") else {
            panic!("nothing to send");
        };
        owed.forget("a");
        owed.owe("a".into(), &p, &k, 2, error());
        old.landed();
        let Claim::Send(new) = owed.claim_for_peek("a") else {
            panic!("the new charge is gone");
        };
        assert_eq!(new.charge.amount, 2);
    }

    #[test]
    fn a_charge_past_its_time_is_forgotten() {
        let owed = Arc::new(Owed::default());
        owed.owe("a".into(), &policy(), &Key::new("k"), 1, error());
        owed.lock().keys.get_mut("a").expect("owed").until = Instant::now();
        assert!(matches!(owed.claim_for_peek("a"), Claim::Settled));
        assert!(owed.is_empty());
    }

    #[test]
    fn past_capacity_every_peek_fails_until_a_probe_lands() {
        let owed = Arc::new(Owed::default());
        let (p, k) = (policy(), Key::new("k"));
        for i in 0..=CAPACITY {
            owed.owe(format!("k{i}"), &p, &k, 1, error());
        }
        assert_eq!(owed.lock().keys.len(), CAPACITY);
        // A key that owes nothing probes with another's charge.
        let Claim::Send(probe) = owed.claim_for_peek("fresh") else {
            panic!("no probe");
        };
        probe.failed(error());
        let Claim::Send(probe) = owed.claim_for_peek("fresh") else {
            panic!("no probe");
        };
        probe.landed();
        assert!(matches!(owed.claim_for_peek("fresh"), Claim::Settled));
        assert_eq!(owed.lock().keys.len(), CAPACITY - 1);
        // A charge of a key that owes nothing landing ends an overflow too.
        owed.owe("x".into(), &p, &k, 1, error());
        owed.owe("y".into(), &p, &k, 1, error());
        assert!(owed.lock().overflowed);
        owed.wrote();
        assert!(matches!(owed.claim_for_peek("fresh"), Claim::Settled));
    }
}
