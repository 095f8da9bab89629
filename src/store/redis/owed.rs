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
//! not at all: the limit errs on the side of holding.
//!
//! Bounded: at most [`CAPACITY`] keys owe at once. A failed charge beyond
//! that is not kept; the store is then *overflowed*, and a peek of a key
//! that owes nothing fails too, unless a charge another key owes lands
//! first: that shows Redis takes writes again and ends the overflow. A
//! key whose charge was not kept can thus have had one call more than its
//! limit, no more.
//!
//! While a key's owed charge is on its way, its other peeks fail at once
//! rather than wait or pass: whether the charge lands is not known yet.
//!
//! [`ResponseCost`]: crate::rate_limit::ResponseCost

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::error::StoreError;
use crate::key::Key;
use crate::limit::Policy;

/// The most keys that owe a charge at once. An entry costs a policy
/// handle, the key and its Redis name: a few hundred bytes.
pub(super) const CAPACITY: usize = 10_000;

/// The store's owed charges.
#[derive(Debug, Default)]
pub(super) struct Owed {
    /// Whether anything is owed or the store is overflowed: read on every
    /// peek and charge, so that a store that owes nothing takes no lock.
    any: AtomicBool,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// By the key's Redis name under its policy (`RedisStore::key_base`).
    keys: HashMap<String, Entry>,
    overflowed: bool,
}

#[derive(Debug)]
struct Entry {
    policy: Policy,
    key: Key,
    amount: u64,
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
    pub(super) policy: Policy,
    pub(super) key: Key,
    pub(super) amount: u64,
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

    fn update_any(&self, state: &State) {
        let any = !state.keys.is_empty() || state.overflowed;
        self.any.store(any, Ordering::Release);
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
        let mut state = self.lock();
        if let Some(entry) = state.keys.get_mut(&base) {
            entry.amount = entry.amount.saturating_add(amount);
            entry.error = error;
        } else if state.keys.len() < CAPACITY {
            let entry = Entry {
                policy: policy.clone(),
                key: key.clone(),
                amount,
                sending: false,
                error,
            };
            state.keys.insert(base, entry);
        } else {
            state.overflowed = true;
        }
        self.update_any(&state);
    }

    /// What a peek of the key named `base` must do first: send its owed
    /// charge, or with an overflowed store another key's, as a probe.
    pub(super) fn claim_for_peek(self: &Arc<Self>, base: &str) -> Claim {
        let mut state = self.lock();
        if let Some(entry) = state.keys.get_mut(base) {
            return take(self, base, entry);
        }
        if !state.overflowed {
            return Claim::Settled;
        }
        if state.keys.is_empty() {
            state.overflowed = false;
            self.update_any(&state);
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
        let mut state = self.lock();
        let entry = state.keys.get_mut(base)?;
        match take(self, base, entry) {
            Claim::Send(sending) => Some(sending),
            _ => None,
        }
    }

    /// `charge` has landed: what it carried is paid, and Redis takes
    /// writes again, which ends an overflow.
    fn landed(&self, charge: &Charge) {
        let mut state = self.lock();
        if let Some(entry) = state.keys.get_mut(&charge.base) {
            entry.amount = entry.amount.saturating_sub(charge.amount);
            entry.sending = false;
            if entry.amount == 0 {
                state.keys.remove(&charge.base);
            }
        }
        state.overflowed = false;
        self.update_any(&state);
    }

    /// Some charge that owed nothing has landed: an overflow ends.
    pub(super) fn wrote(&self) {
        if self.is_empty() {
            return;
        }
        let mut state = self.lock();
        if state.overflowed {
            state.overflowed = false;
            self.update_any(&state);
        }
    }

    /// The key named `base` was reset: what it owed is forgotten. (A
    /// charge of it on its way now is paid or owed again as it ends.)
    pub(super) fn forget(&self, base: &str) {
        let mut state = self.lock();
        if state.keys.remove(base).is_some() {
            self.update_any(&state);
        }
    }

    /// `charge` failed again with `error` (or, with `None`, was never
    /// sent to the end): still owed, and free for the next peek to send.
    fn failed(&self, charge: &Charge, error: Option<StoreError>) {
        let mut state = self.lock();
        if let Some(entry) = state.keys.get_mut(&charge.base) {
            entry.sending = false;
            if let Some(error) = error {
                entry.error = error;
            }
        }
    }
}

/// A claimed charge on its way, which ends [`landed`](Self::landed) or
/// [`failed`](Self::failed). Dropped before either (the future of the
/// call that was to send it was dropped: a client gone), it is owed as
/// before and the key's next peek sends it, rather than every later peek
/// being refused as if it were still on its way.
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
    use crate::limit::Limit;
    use crate::rate::Rate;

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
