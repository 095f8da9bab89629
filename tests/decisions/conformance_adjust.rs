//! Cost known after the response, on every store: `peek`, `charge` and
//! `refund` under every algorithm give the same exact figures on a
//! `MemoryStore` and on a `RedisStore` reading the same manual clock
//! (`harness.rs`), and the two stores' sequences of answers must be
//! equal. A GCRA debt is repaid at exactly the limit's rate: admitted
//! again exactly when the math says, not a microsecond earlier. A refund
//! never gives more than a fresh state has; a peek stores nothing.
use crate::harness::{S, Sut, UNIX_NOW, US, allowed, conformance, denied};

use std::time::Duration;

use fleetgate::{Algorithm, Limit, Policy, Rate};

/// A Unix time on a minute boundary, where fixed windows start.
const ALIGNED: Duration = Duration::from_secs(1_699_999_980);
const MS: Duration = Duration::from_millis(1);

fn policy(name: &str, algorithm: Algorithm, limits: &[Rate]) -> Policy {
    limits
        .iter()
        .fold(
            Policy::builder(name).algorithm(algorithm),
            |builder, rate| builder.limit(Limit::new(*rate).expect("valid limit")),
        )
        .build()
        .expect("valid policy")
}

// ---------------------------------------------------------------------------
// Scenarios.

/// A token budget of 1000 a minute (T = 60 ms), admitted while not
/// exhausted and charged after the fact: three completions of 400 tokens
/// leave a debt of 200, and the next call passes exactly 201 × 60 ms later.
async fn gcra_token_budget(s: Sut) {
    let l = s.limiter(&policy(
        "tokens",
        Algorithm::Gcra,
        &[Rate::per_minute(1000)],
    ));
    let d = s.peek(&l, "k", 1).await;
    s.expect(&d, allowed(0, 999, 60 * MS));
    let d = s.charge(&l, "k", 400).await;
    s.expect(&d, allowed(0, 600, 24 * S));
    let d = s.peek(&l, "k", 1).await;
    s.expect(&d, allowed(0, 599, 24 * S + 60 * MS));
    let d = s.charge(&l, "k", 400).await;
    s.expect(&d, allowed(0, 200, 48 * S));
    let d = s.charge(&l, "k", 400).await;
    s.expect(&d, denied(0, 0, 72 * S, 12_060 * MS));
    let d = s.peek(&l, "k", 1).await;
    s.expect(&d, denied(0, 0, 72 * S, 12_060 * MS));
    // Charging nothing asks no store and reports nothing.
    let d = s.charge(&l, "k", 0).await;
    s.expect(&d, allowed(0, 0, Duration::ZERO));
    // A cost no limit could admit is refused at once, as by `check`.
    let d = s.peek(&l, "k", 1001).await;
    s.expect_never(&d, 0);
    // Repaid at exactly the rate: not a microsecond early.
    s.advance(12_060 * MS - US);
    let d = s.peek(&l, "k", 1).await;
    s.expect(&d, denied(0, 0, 59_940 * MS + US, US));
    let d = s.check(&l, "k", 1).await;
    s.expect(&d, denied(0, 0, 59_940 * MS + US, US));
    s.advance(US);
    let d = s.peek(&l, "k", 1).await;
    s.expect(&d, allowed(0, 0, 60 * S));
    let d = s.check(&l, "k", 1).await;
    s.expect(&d, allowed(0, 0, 60 * S));
    let d = s.check(&l, "k", 1).await;
    s.expect(&d, denied(0, 0, 60 * S, 60 * MS));
}

/// A debt on a limit of burst 1 (1/s): a charge of 10 holds the next call
/// back exactly 10 s.
async fn gcra_debt_repaid_at_the_rate(s: Sut) {
    let l = s.limiter(&policy("debt", Algorithm::Gcra, &[Rate::per_second(1)]));
    let d = s.charge(&l, "k", 10).await;
    s.expect(&d, denied(0, 0, 10 * S, 10 * S));
    s.advance(10 * S - US);
    let d = s.check(&l, "k", 1).await;
    s.expect(&d, denied(0, 0, US, US));
    s.advance(US);
    let d = s.check(&l, "k", 1).await;
    s.expect(&d, allowed(0, 0, S));
    // A second debt adds to what is left of the first.
    let d = s.charge(&l, "k", 2).await;
    s.expect(&d, denied(0, 0, 3 * S, 3 * S));
    // The largest cost: the debt is cut at an hour past the burst (16
    // periods are less), 3601 s in all, exactly on both stores (Lua's
    // doubles included), and a refund of as much clears it.
    let most = Duration::from_secs(3601);
    let d = s.charge(&l, "huge", u64::MAX).await;
    s.expect(&d, denied(0, 0, most, most));
    let d = s.charge(&l, "huge", u64::MAX).await;
    s.expect(&d, denied(0, 0, most, most));
    s.refund(&l, "huge", u64::MAX).await;
    let d = s.peek(&l, "huge", 1).await;
    s.expect(&d, allowed(0, 0, S));
}

/// Refunds on two limits (5/s, T = 200 ms; 20/min, T = 3 s): each gives
/// back its cost on every limit, never past a fresh state; peeks store
/// nothing.
async fn gcra_refund(s: Sut) {
    let l = s.limiter(&policy(
        "refund",
        Algorithm::Gcra,
        &[Rate::per_second(5), Rate::per_minute(20)],
    ));
    for _ in 0..3 {
        let d = s.peek(&l, "k", 1).await;
        s.expect(&d, allowed(0, 4, 200 * MS));
    }
    let d = s.check(&l, "k", 3).await;
    s.expect(&d, allowed(0, 2, 600 * MS));
    s.refund(&l, "k", 1).await;
    let d = s.peek(&l, "k", 1).await;
    s.expect(&d, allowed(0, 2, 600 * MS));
    // Far more than was taken: back to a fresh state, no further.
    s.refund(&l, "k", 100).await;
    let d = s.peek(&l, "k", 1).await;
    s.expect(&d, allowed(0, 4, 200 * MS));
    let d = s.check(&l, "k", 5).await;
    s.expect(&d, allowed(0, 0, S));
    let d = s.check(&l, "k", 1).await;
    s.expect(&d, denied(0, 0, S, 200 * MS));
    s.refund(&l, "k", 2).await;
    let d = s.check(&l, "k", 2).await;
    s.expect(&d, allowed(0, 0, S));
    let d = s.check(&l, "k", 1).await;
    s.expect(&d, denied(0, 0, S, 200 * MS));
    // 10 s on, the first limit is full and the minute's holds 5 calls:
    // a refund moves only the second.
    s.advance(10 * S);
    s.refund(&l, "k", 1).await;
    let d = s.check(&l, "k", 5).await;
    s.expect(&d, allowed(0, 0, S));
    s.refund(&l, "nobody", 5).await;
    let d = s.peek(&l, "nobody", 1).await;
    s.expect(&d, allowed(0, 4, 200 * MS));
}

/// A fixed window of 5 per 10 s: a charge may overdraw the window, which
/// then refuses until it ends and forgets the overdraft; a refund lowers
/// the current window's count, not below 0.
async fn fixed_window_charge(s: Sut) {
    let l = s.limiter(&policy(
        "fixed",
        Algorithm::FixedWindow,
        &[Rate::new(5, 10 * S)],
    ));
    s.advance(2 * S);
    let d = s.charge(&l, "k", 3).await;
    s.expect(&d, allowed(0, 2, 8 * S));
    let d = s.charge(&l, "k", 5).await;
    s.expect(&d, denied(0, 0, 8 * S, 8 * S));
    let d = s.peek(&l, "k", 1).await;
    s.expect(&d, denied(0, 0, 8 * S, 8 * S));
    s.refund(&l, "k", 2).await;
    let d = s.peek(&l, "k", 1).await;
    s.expect(&d, denied(0, 0, 8 * S, 8 * S));
    s.refund(&l, "k", 2).await;
    let d = s.peek(&l, "k", 1).await;
    s.expect(&d, allowed(0, 0, 8 * S));
    let d = s.check(&l, "k", 1).await;
    s.expect(&d, allowed(0, 0, 8 * S));
    let d = s.check(&l, "k", 1).await;
    s.expect(&d, denied(0, 0, 8 * S, 8 * S));
    s.refund(&l, "k", 100).await;
    let d = s.peek(&l, "k", 5).await;
    s.expect(&d, allowed(0, 0, 8 * S));
    let d = s.peek(&l, "k", 6).await;
    s.expect_never(&d, 0);
    let d = s.charge(&l, "k", 7).await;
    s.expect(&d, denied(0, 0, 8 * S, 8 * S));
    s.advance(8 * S - US);
    let d = s.peek(&l, "k", 1).await;
    s.expect(&d, denied(0, 0, US, US));
    s.advance(US);
    let d = s.peek(&l, "k", 1).await;
    s.expect(&d, allowed(0, 4, 10 * S));
    let d = s.charge(&l, "k", 1).await;
    s.expect(&d, allowed(0, 4, 10 * S));
    // A window that has ended keeps its count: nothing to give back.
    s.advance(10 * S);
    s.refund(&l, "k", 1).await;
    let d = s.peek(&l, "k", 1).await;
    s.expect(&d, allowed(0, 4, 10 * S));
}

/// A sliding-window counter of 10 per 10 s: an overdraft of the current
/// window fades as it becomes the previous one.
async fn sliding_counter_charge(s: Sut) {
    let l = s.limiter(&policy(
        "counter",
        Algorithm::SlidingWindow,
        &[Rate::new(10, 10 * S)],
    ));
    s.advance(5 * S);
    // 15 of 10 in [t0, t0+10): a call of cost 1 fits once 15 weighs 9 or
    // less, 4 s into the next window.
    let d = s.charge(&l, "k", 15).await;
    s.expect(&d, denied(0, 0, 15 * S, 9 * S));
    let d = s.peek(&l, "k", 1).await;
    s.expect(&d, denied(0, 0, 15 * S, 9 * S));
    s.advance(9 * S - US);
    let d = s.peek(&l, "k", 1).await;
    s.expect(&d, denied(0, 0, 6 * S + US, US));
    s.advance(US);
    let d = s.peek(&l, "k", 1).await;
    s.expect(&d, allowed(0, 0, 16 * S));
    // The overdraft is the previous window's: a refund leaves it alone.
    s.refund(&l, "k", 3).await;
    let d = s.check(&l, "k", 1).await;
    s.expect(&d, allowed(0, 0, 16 * S));
    let d = s.peek(&l, "k", 1).await;
    s.expect(&d, denied(0, 0, 16 * S, 666_667 * US));
    s.refund(&l, "k", 5).await;
    let d = s.peek(&l, "k", 1).await;
    s.expect(&d, allowed(0, 0, 16 * S));
}

/// A sliding log of 5 per 10 s: a charge logs its cost (at most the
/// count), a refund drops the newest entries; calls at the same instant
/// after a refund are all counted.
async fn sliding_log_charge(s: Sut) {
    let l = s.limiter(&policy(
        "log",
        Algorithm::SlidingLog,
        &[Rate::new(5, 10 * S)],
    ));
    let d = s.check(&l, "k", 1).await;
    s.expect(&d, allowed(0, 4, 10 * S));
    s.advance(S);
    // 6 of 5: logged as 5 at t0+1, the second oldest leaves at t0+11.
    let d = s.charge(&l, "k", 6).await;
    s.expect(&d, denied(0, 0, 10 * S, 10 * S));
    s.refund(&l, "k", 2).await;
    let d = s.peek(&l, "k", 1).await;
    s.expect(&d, allowed(0, 0, 10 * S));
    let d = s.charge(&l, "k", 1).await;
    s.expect(&d, denied(0, 0, 10 * S, 9 * S));
    let d = s.check(&l, "k", 1).await;
    s.expect(&d, denied(0, 0, 10 * S, 9 * S));
    s.refund(&l, "k", 1).await;
    let d = s.check(&l, "k", 1).await;
    s.expect(&d, allowed(0, 0, 10 * S));
    let d = s.check(&l, "k", 1).await;
    s.expect(&d, denied(0, 0, 10 * S, 9 * S));
    s.refund(&l, "k", 2).await;
    for remaining in [1, 0] {
        let d = s.check(&l, "k", 1).await;
        s.expect(&d, allowed(0, remaining, 10 * S));
    }
    let d = s.check(&l, "k", 1).await;
    s.expect(&d, denied(0, 0, 10 * S, 9 * S));
    // The entry of t0 leaves; a refund drops only what is still inside.
    s.advance(9 * S);
    let d = s.peek(&l, "k", 1).await;
    s.expect(&d, allowed(0, 0, 10 * S));
    s.refund(&l, "k", 10).await;
    let d = s.peek(&l, "k", 1).await;
    s.expect(&d, allowed(0, 4, 10 * S));
    let d = s.peek(&l, "k", 5).await;
    s.expect(&d, allowed(0, 0, 10 * S));
}

/// A sliding log of 20 per 10 s, a dozen entries at one instant: a refund
/// drops the entries numbered last (not the last in text order: "t-9"
/// sorts after "t-11"), so that calls logged at that instant afterwards
/// take fresh members and all count.
async fn sliding_log_refund_at_one_instant(s: Sut) {
    let l = s.limiter(&policy(
        "log",
        Algorithm::SlidingLog,
        &[Rate::new(20, 10 * S)],
    ));
    let d = s.charge(&l, "k", 12).await;
    s.expect(&d, allowed(0, 8, 10 * S));
    s.refund(&l, "k", 2).await;
    for remaining in (0..10).rev() {
        let d = s.check(&l, "k", 1).await;
        s.expect(&d, allowed(0, remaining, 10 * S));
    }
    let d = s.check(&l, "k", 1).await;
    s.expect(&d, denied(0, 0, 10 * S, 10 * S));
    s.refund(&l, "k", 11).await;
    let d = s.charge(&l, "k", 3).await;
    s.expect(&d, allowed(0, 8, 10 * S));
    let d = s.peek(&l, "k", 8).await;
    s.expect(&d, allowed(0, 0, 10 * S));
    let d = s.peek(&l, "k", 9).await;
    s.expect(&d, denied(0, 8, 10 * S, 10 * S));
}

/// Two windows (25 per 5 s, 300 per minute) under `algorithm`: charges,
/// refunds and peeks report every window alike on both stores.
async fn dual_adjust(s: Sut, algorithm: Algorithm) {
    let l = s.limiter(&policy(
        "dual",
        algorithm,
        &[Rate::new(25, 5 * S), Rate::per_minute(300)],
    ));
    let d = s.charge(&l, "k", 30).await;
    assert!(!d.is_allowed(), "{}: 30 of 25 left room", s.name);
    assert_eq!(d.limit_index(), 0, "{}", s.name);
    let d = s.peek(&l, "k", 1).await;
    assert!(!d.is_allowed(), "{}", s.name);
    s.refund(&l, "k", 10).await;
    let d = s.peek(&l, "k", 1).await;
    assert!(d.is_allowed(), "{}: refund gave nothing back", s.name);
    let d = s.check(&l, "k", 5).await;
    assert!(d.is_allowed(), "{}", s.name);
    s.advance(5 * S);
    let d = s.charge(&l, "k", 20).await;
    // The sliding counter still weighs the 25 of the 5 s before in full.
    assert_eq!(
        d.is_allowed(),
        algorithm != Algorithm::SlidingWindow,
        "{}",
        s.name
    );
    let d = s.charge(&l, "k", 260).await;
    assert!(!d.is_allowed(), "{}", s.name);
    s.refund(&l, "k", 50).await;
    s.peek(&l, "k", 1).await;
    s.advance(5 * S);
    s.peek(&l, "k", 1).await;
    s.check(&l, "k", 1).await;
    s.advance(55 * S);
    s.peek(&l, "k", 1).await;
    s.check(&l, "k", 25).await;
    // The largest cost, and as large a refund: a fresh state again.
    let d = s.charge(&l, "huge", u64::MAX).await;
    assert!(!d.is_allowed(), "{}", s.name);
    s.charge(&l, "huge", u64::MAX).await;
    s.peek(&l, "huge", 1).await;
    s.refund(&l, "huge", u64::MAX).await;
    let d = s.peek(&l, "huge", 25).await;
    assert!(d.is_allowed(), "{}: not fresh after the refund", s.name);
}

async fn dual_gcra(s: Sut) {
    dual_adjust(s, Algorithm::Gcra).await;
}

async fn dual_sliding_log(s: Sut) {
    dual_adjust(s, Algorithm::SlidingLog).await;
}

async fn dual_fixed_window(s: Sut) {
    dual_adjust(s, Algorithm::FixedWindow).await;
}

async fn dual_sliding_counter(s: Sut) {
    dual_adjust(s, Algorithm::SlidingWindow).await;
}

conformance! {
    prefix "adjust";
    gcra_token_budget at UNIX_NOW;
    gcra_debt_repaid_at_the_rate at UNIX_NOW;
    gcra_refund at UNIX_NOW;
    fixed_window_charge at ALIGNED;
    sliding_counter_charge at ALIGNED;
    sliding_log_charge at UNIX_NOW;
    sliding_log_refund_at_one_instant at UNIX_NOW;
    dual_gcra at ALIGNED;
    dual_sliding_log at ALIGNED;
    dual_fixed_window at ALIGNED;
    dual_sliding_counter at ALIGNED;
}
