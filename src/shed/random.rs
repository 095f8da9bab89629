//! The coin the shedders flip: injectable, so that tests are
//! deterministic.

use std::fmt;
use std::sync::Arc;

/// A source of uniform numbers in `[0, 1)` for the shedders' coin flips;
/// injectable so tests are deterministic: any `Fn() -> f64` is one. The
/// default is a fast generator of its own per thread.
pub trait Random: Send + Sync + 'static {
    /// The next number, in `[0, 1)`.
    fn next_f64(&self) -> f64;
}

impl<F: Fn() -> f64 + Send + Sync + 'static> Random for F {
    fn next_f64(&self) -> f64 {
        self()
    }
}

/// fastrand's generator, one per thread, seeded from the OS: plenty for
/// coin flips, not for secrets.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct ThreadRandom;

impl Random for ThreadRandom {
    fn next_f64(&self) -> f64 {
        fastrand::f64()
    }
}

/// A shared [`Random`].
pub(crate) type SharedRandom = Arc<dyn Random>;

impl fmt::Debug for dyn Random {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Random")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thread_random_is_in_range() {
        let r = ThreadRandom;
        let mut sum = 0.0;
        for _ in 0..10_000 {
            let x = r.next_f64();
            assert!((0.0..1.0).contains(&x));
            sum += x;
        }
        let mean = sum / 10_000.0;
        assert!((0.45..0.55).contains(&mean), "{mean}");
    }
}
