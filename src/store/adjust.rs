//! Cost known after the response: what a check would answer (peek), a
//! charge that may go into debt, and a refund, on every algorithm.
//!
//! Each is one atomic step on the same state (the same Redis keys) as the
//! decision, one round trip on Redis. See [`Limiter::peek`],
//! [`Limiter::charge`] and [`Limiter::refund`] for what they promise, and
//! `src/gcra.rs` and `src/window.rs` for how each algorithm takes a debt
//! and gives a refund.
//!
//! [`Limiter::peek`]: crate::Limiter::peek
//! [`Limiter::charge`]: crate::Limiter::charge
//! [`Limiter::refund`]: crate::Limiter::refund

use crate::key::Key;
use crate::limit::Policy;

/// A peek, a charge or a refund of `cost` for `key` under `policy`, on the
/// policy's own algorithm. Borrowed, like [`GcraCall`](super::GcraCall).
#[derive(Clone, Copy, Debug)]
pub struct AdjustCall<'a> {
    pub(crate) policy: &'a Policy,
    pub(crate) key: &'a Key,
    pub(crate) cost: u64,
}
