//! The retry budget's one operation, `take`: report first attempts and
//! take retry tokens, as a pure function of (state, now, parameters).
//! `lua/budget.lua` transcribes it for Redis.
//!
//! Tokens are counted in thousandths, in [`SLOTS`] slots spanning the
//! budget's time to live: each slot holds what was credited while it was
//! the newest (`ratio` per first attempt reported, and `min_per_second`
//! for the slot's length, credited when the slot begins), and its tokens
//! expire with it. A take spends the oldest tokens first. So the tokens
//! ever credited, and the retries ever taken, over any stretch of time
//! are at most `ratio × first attempts reported + min_per_second ×
//! (its seconds + two slots)`: the slots it touches, the first and the
//! last perhaps in part.

/// How many slots the time to live is cut into.
pub(crate) const SLOTS: usize = 10;

/// A budget's parameters, as a store gets them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Params {
    /// Thousandths of a token credited per first attempt.
    pub(crate) ratio_milli: u64,
    /// Thousandths of a token credited per slot.
    pub(crate) min_milli_per_slot: u64,
    /// A slot's length in microseconds (at least 1).
    pub(crate) slot_us: u64,
}

/// A budget's state: the newest slot's index (time / slot length) and
/// each slot's tokens, in thousandths.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct State {
    pub(crate) newest: u64,
    pub(crate) tokens: [u64; SLOTS],
}

/// Reports `deposits` first attempts and takes up to `want` tokens at
/// `now_us`: the new state, the tokens granted and the whole tokens left.
/// A state older than every slot (or none) starts afresh with the current
/// slot's minimum, and so does one more than every slot ahead (a clock
/// far behind, another `ttl`'s slots, a corrupt value); a clock a little
/// behind the state's counts as the state's time.
pub(crate) fn take(
    state: Option<State>,
    now_us: u64,
    params: Params,
    deposits: u64,
    want: u64,
) -> (State, u64, u64) {
    let current = now_us / params.slot_us.max(1);
    let mut state = match state {
        Some(state)
            if current < state.newest.saturating_add(SLOTS as u64)
                && state.newest <= current.saturating_add(SLOTS as u64) =>
        {
            state
        }
        _ => State {
            newest: current,
            tokens: {
                let mut tokens = [0; SLOTS];
                tokens[slot(current)] = params.min_milli_per_slot;
                tokens
            },
        },
    };
    while state.newest < current {
        state.newest += 1;
        state.tokens[slot(state.newest)] = params.min_milli_per_slot;
    }
    let at = slot(state.newest);
    state.tokens[at] = state.tokens[at].saturating_add(deposits.saturating_mul(params.ratio_milli));
    let total = state
        .tokens
        .iter()
        .fold(0u64, |sum, &t| sum.saturating_add(t));
    let granted = want.min(total / 1000);
    let mut owed = granted * 1000;
    for i in 1..=SLOTS as u64 {
        let s = slot(state.newest + i);
        let used = owed.min(state.tokens[s]);
        state.tokens[s] -= used;
        owed -= used;
    }
    (state, granted, total / 1000 - granted)
}

fn slot(index: u64) -> usize {
    (index % SLOTS as u64) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    const PARAMS: Params = Params {
        ratio_milli: 100,
        min_milli_per_slot: 1000,
        slot_us: 1_000_000,
    };

    #[test]
    fn a_fresh_budget_holds_one_slot_of_the_minimum() {
        let (state, granted, left) = take(None, 5_500_000, PARAMS, 0, 10);
        assert_eq!((granted, left), (1, 0));
        assert_eq!(state.newest, 5);
        let (_, granted, _) = take(Some(state), 5_900_000, PARAMS, 0, 10);
        assert_eq!(granted, 0);
    }

    #[test]
    fn first_attempts_credit_the_ratio() {
        let (state, granted, _) = take(None, 0, PARAMS, 0, 1);
        assert_eq!(granted, 1);
        // 25 first attempts at 0.1: 2.5 tokens, 2 taken, half left.
        let (state, granted, left) = take(Some(state), 1, PARAMS, 25, 10);
        assert_eq!((granted, left), (2, 0));
        let (_, granted, _) = take(Some(state), 2, PARAMS, 5, 10);
        assert_eq!(granted, 1);
    }

    #[test]
    fn tokens_expire_with_their_slot_and_the_oldest_go_first() {
        let (state, _, _) = take(None, 0, PARAMS, 0, 1);
        let (state, granted, _) = take(Some(state), 0, PARAMS, 100, 0);
        assert_eq!(granted, 0);
        // Nine slots later the ten tokens are still there, with nine
        // slots' minimum.
        let (state, _, left) = take(Some(state), 9_000_000, PARAMS, 0, 0);
        assert_eq!(left, 19);
        // One more and the first slot's ten are gone.
        let (state, granted, left) = take(Some(state), 10_000_000, PARAMS, 0, 3);
        assert_eq!((granted, left), (3, 7));
        // Long idle: afresh, one slot's minimum.
        let (_, granted, _) = take(Some(state), 60_000_000, PARAMS, 0, 10);
        assert_eq!(granted, 1);
    }

    #[test]
    fn a_clock_behind_the_state_counts_as_its_time() {
        let (state, _, _) = take(None, 5_000_000, PARAMS, 0, 1);
        let (state, granted, _) = take(Some(state), 1_000_000, PARAMS, 30, 10);
        assert_eq!((state.newest, granted), (5, 3));
        // Far ahead of the clock: afresh.
        let ahead = State {
            newest: 1_000_000,
            tokens: [5000; SLOTS],
        };
        let (state, granted, _) = take(Some(ahead), 1_000_000, PARAMS, 0, 10);
        assert_eq!((state.newest, granted), (1, 1));
    }

    #[test]
    fn takes_never_exceed_the_bound() {
        // Random reports and takes over 100 s: the tokens granted stay
        // within ratio × first attempts + minimum × (seconds + one slot).
        let mut rng = fastrand::Rng::with_seed(7);
        let (mut state, mut now) = (None, 0u64);
        let (mut first, mut taken) = (0u64, 0u64);
        while now < 100_000_000 {
            let deposits = rng.u64(0..20);
            let (s, granted, _) = take(state, now, PARAMS, deposits, rng.u64(0..5));
            state = Some(s);
            first += deposits;
            taken += granted;
            let bound = first as f64 * 0.1 + (now as f64 / 1e6 + 1.0);
            assert!(taken as f64 <= bound, "{taken} > {bound} at {now}");
            now += rng.u64(0..300_000);
        }
        assert!(taken > 100, "the budget granted {taken}");
    }

    #[test]
    fn huge_figures_saturate() {
        let params = Params {
            ratio_milli: u64::MAX,
            ..PARAMS
        };
        let (_, granted, _) = take(None, 0, params, u64::MAX, u64::MAX);
        assert_eq!(granted, u64::MAX / 1000);
    }
}
