//! [`LocalShare`]: the part of a fleet-wide limit one instance enforces on
//! its own while the store is unreachable.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::ConfigError;

/// How many instances share the store, as the heartbeats of this
/// process's [`LivePolicies`](crate::live::LivePolicies) last counted
/// them, 0 until then (when [`LocalShare::auto`] divides by 1).
static FLEET_SIZE: AtomicU64 = AtomicU64::new(0);

/// Bumped whenever [`FLEET_SIZE`] changes, so that layers rebuild their
/// local fallbacks.
static FLEET_EPOCH: AtomicU64 = AtomicU64::new(0);

/// Records the fleet's size as a heartbeat counted it.
#[cfg(feature = "redis")]
pub(crate) fn set_fleet_size(instances: usize) {
    let n = u64::try_from(instances)
        .unwrap_or(MAX_DENOM)
        .clamp(1, MAX_DENOM);
    if FLEET_SIZE.swap(n, Ordering::AcqRel).max(1) != n {
        FLEET_EPOCH.fetch_add(1, Ordering::AcqRel);
    }
}

/// How many instances share the store, if a heartbeat has counted them.
pub(crate) fn counted_fleet_size() -> Option<u64> {
    match FLEET_SIZE.load(Ordering::Acquire) {
        0 => None,
        n => Some(n),
    }
}

/// Moves whenever the fleet's size does.
#[inline]
pub(crate) fn fleet_epoch() -> u64 {
    FLEET_EPOCH.load(Ordering::Acquire)
}

/// One instance's share of a limit, from a millionth to the whole
/// (`1e-6 <= share <= 1`): what
/// [`FailurePolicy::Local`](crate::FailurePolicy::Local) scales every limit
/// by while the store cannot decide. With `n` instances behind a load
/// balancer, `1/n` ([`LocalShare::one_of`]) keeps the fleet near its limit.
///
/// A smaller share is refused: every count below a million would scale to
/// less than one (held at one, see below), so the share would decide
/// nothing, and no fleet has that many instances; such a setting is a
/// mistake (`local:1e-300`), not a choice.
///
/// The share is held as a fraction, so that scaling is exact: a decimal
/// share is taken as the nearest fraction whose denominator is at most a
/// million (`0.29` is 29/100, `1.0 / 3.0` is 1/3). Counts are scaled by
/// [`scale`](LocalShare::scale): multiplied by the share and rounded down,
/// never below 1, so that `n` instances at `1/n` admit no more than the
/// limit together (unless the limit is below `n`: each instance still
/// admits one).
///
/// ```
/// use fleetgate::LocalShare;
///
/// let quarter = LocalShare::new(0.25)?;
/// assert_eq!(quarter.scale(500), 125);
/// assert_eq!(LocalShare::one_of(3)?.scale(5), 1); // 1.67, rounded down
/// assert_eq!(LocalShare::new(1.0 / 3.0)?.scale(300), 100);
/// assert_eq!(quarter.scale(2), 1); // never 0
/// assert_eq!(LocalShare::new(0.29)?.to_string(), "29/100");
///
/// // Nonsense is refused, not turned into "admit nothing".
/// assert!(LocalShare::new(0.0).is_err());
/// assert!(LocalShare::new(1.5).is_err());
/// assert!(LocalShare::new(f64::NAN).is_err());
/// assert!(LocalShare::new(1e-300).is_err());
/// assert!(LocalShare::one_of(0).is_err());
/// assert!(LocalShare::one_of(2_000_000).is_err());
/// # Ok::<(), fleetgate::ConfigError>(())
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct LocalShare {
    numer: u64,
    denom: u64,
}

/// The largest denominator of a share: a share is at least its inverse,
/// and a decimal share is approximated with denominators up to it.
const MAX_DENOM: u64 = 1_000_000;

impl LocalShare {
    /// `share` of each limit; refused (naming the share) unless
    /// `1e-6 <= share <= 1`.
    pub fn new(share: f64) -> Result<Self, ConfigError> {
        // Written so that NaN fails too.
        if !(share * MAX_DENOM as f64 >= 1.0 && share <= 1.0) {
            return Err(ConfigError::InvalidShare {
                share: format!("{share:?}"),
            });
        }
        match nearest_fraction(share) {
            (0, _) => Err(ConfigError::InvalidShare {
                share: format!("{share:?}"),
            }),
            (numer, denom) => Ok(LocalShare { numer, denom }),
        }
    }

    /// One of `instances` equal shares: `1/instances`; refused for 0 and
    /// for more than a million.
    pub fn one_of(instances: u64) -> Result<Self, ConfigError> {
        if instances == 0 || instances > MAX_DENOM {
            return Err(ConfigError::InvalidShare {
                share: format!("1/{instances}"),
            });
        }
        Ok(LocalShare {
            numer: 1,
            denom: instances,
        })
    }

    /// One equal share of the fleet, however many instances it has now:
    /// `1/n` for the `n` instances seen in the last heartbeats of this
    /// process's [`LivePolicies`](crate::live::LivePolicies) (1 without
    /// them). A rate-limit layer rescales its local limits whenever `n`
    /// changes; a concurrency limit or shedder takes `n` as it is when its
    /// failure policy is set, so set it after
    /// [`LivePolicies::start`](crate::live::LivePolicies::start).
    ///
    /// ```
    /// use fleetgate::LocalShare;
    ///
    /// // No heartbeats seen in this process: the whole limit.
    /// assert_eq!(LocalShare::auto().scale(100), 100);
    /// assert_eq!(LocalShare::auto().to_string(), "auto");
    /// ```
    pub fn auto() -> Self {
        LocalShare { numer: 0, denom: 0 }
    }

    /// Whether this is [`LocalShare::auto`].
    pub(crate) fn is_auto(self) -> bool {
        self.denom == 0
    }

    /// The share as a fraction now.
    fn fraction(self) -> (u64, u64) {
        if self.is_auto() {
            (1, FLEET_SIZE.load(Ordering::Acquire).max(1))
        } else {
            (self.numer, self.denom)
        }
    }

    /// The share, in `(0, 1]` (for [`auto`](Self::auto), as it is now).
    pub fn get(self) -> f64 {
        let (numer, denom) = self.fraction();
        numer as f64 / denom as f64
    }

    /// `n` scaled by the share: rounded down to a whole number, at least 1.
    pub fn scale(self, n: u64) -> u64 {
        self.floor_of(n).max(1)
    }

    /// `n` scaled by the share, rounded down: 0 when the share of `n` is
    /// less than one.
    pub(crate) fn floor_of(self, n: u64) -> u64 {
        let (numer, denom) = self.fraction();
        let scaled = u128::from(n) * u128::from(numer) / u128::from(denom);
        // At most `n`: the share is at most 1.
        u64::try_from(scaled).unwrap_or(n)
    }
}

/// The last continued-fraction convergent of `x` (in `[1e-6, 1]`) whose
/// denominator is at most [`MAX_DENOM`], stopping early once it matches `x`
/// to twelve digits; `(0, 1)` when `x` is below a millionth.
fn nearest_fraction(x: f64) -> (u64, u64) {
    // Two convergents back and one back: h/k = a·h₁/k₁ + h₂/k₂.
    let (mut h2, mut k2, mut h1, mut k1) = (0u64, 1u64, 1u64, 0u64);
    let mut rest = x;
    loop {
        let a = rest.floor();
        if a > MAX_DENOM as f64 {
            break;
        }
        let a = a as u64;
        let (h, k) = (a * h1 + h2, a * k1 + k2);
        if k > MAX_DENOM {
            break;
        }
        (h2, k2, h1, k1) = (h1, k1, h, k);
        let frac = rest - a as f64;
        if (h as f64 / k as f64 - x).abs() <= x * 1e-12 || frac <= 0.0 {
            break;
        }
        rest = 1.0 / frac;
    }
    (h1, k1)
}

impl fmt::Debug for LocalShare {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "LocalShare({self})")
    }
}

impl fmt::Display for LocalShare {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_auto() {
            return f.write_str("auto");
        }
        write!(f, "{}/{}", self.numer, self.denom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scaling_rounds_down_but_never_to_zero() {
        let s = |x: f64| LocalShare::new(x).unwrap();
        assert_eq!(s(1.0).scale(7), 7);
        assert_eq!(s(1.0).scale(u64::MAX), u64::MAX);
        assert_eq!(s(0.5).scale(5), 2);
        assert_eq!(s(0.29).scale(100), 29);
        assert_eq!(s(0.1).scale(30), 3);
        assert_eq!(s(1e-6).scale(10), 1);
        assert_eq!(s(0.5).scale(u64::MAX), u64::MAX / 2);
        assert_eq!(LocalShare::one_of(7).unwrap().scale(700), 100);
        assert_eq!(LocalShare::one_of(1).unwrap(), s(1.0));
        assert_eq!(s(1.0 / 7.0), LocalShare::one_of(7).unwrap());
        assert_eq!(s(0.123_456).to_string(), "1929/15625");
        assert_eq!(s(1e-6).to_string(), "1/1000000");
        assert_eq!(s(1.5e-6).to_string(), "1/666667");
        assert_eq!(LocalShare::one_of(1_000_000).unwrap(), s(1e-6));
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig {
            failure_persistence: None,
            ..Default::default()
        })]

        /// `n` instances at `1/n` never admit more than the limit together
        /// (or than one each, for a limit below `n`).
        #[test]
        fn equal_shares_never_add_up_to_more(count in 1u64..1 << 40, instances in 1u64..10_000) {
            let each = LocalShare::one_of(instances).unwrap().scale(count);
            proptest::prop_assert!(each >= 1);
            proptest::prop_assert!(each * instances <= count.max(instances), "{each} x {instances} > {count}");
        }

        #[test]
        fn scaled_counts_stay_within_one_and_the_product(count in 1u64.., share in 1e-6f64..=1.0) {
            let share = LocalShare::new(share).unwrap();
            let scaled = share.scale(count);
            proptest::prop_assert!((1..=count).contains(&scaled));
            proptest::prop_assert!(scaled as f64 <= (count as f64 * share.get()).max(1.0) * (1.0 + 1e-12));
        }

        /// The fraction is within a millionth of the share (relative),
        /// exact for shares that are fractions of small numbers.
        #[test]
        fn fractions_match_the_share(share in 1e-6f64..=1.0, numer in 1u64..1000, extra in 0u64..1000) {
            let got = LocalShare::new(share).unwrap().get();
            proptest::prop_assert!((got - share).abs() <= share * 1e-6, "{share} -> {got}");
            let denom = numer + extra;
            let exact = LocalShare::new(numer as f64 / denom as f64).unwrap();
            proptest::prop_assert_eq!(exact.scale(denom * 1000), numer * 1000);
        }
    }

    #[test]
    fn invalid_shares_are_errors() {
        for bad in [
            0.0,
            -0.1,
            1.000_001,
            f64::INFINITY,
            f64::NEG_INFINITY,
            f64::NAN,
            1e-300,
            f64::MIN_POSITIVE,
            5e-324,
            9.999e-7,
            1e-12,
        ] {
            let err = LocalShare::new(bad).unwrap_err();
            assert!(matches!(err, ConfigError::InvalidShare { .. }), "{bad}");
            // The error names the share as given.
            assert!(err.to_string().contains(&format!("{bad:?}")), "{err}");
        }
        for instances in [0, 1_000_001, u64::MAX] {
            let err = LocalShare::one_of(instances).unwrap_err();
            assert!(err.to_string().contains(&format!("1/{instances}")), "{err}");
        }
        // The smallest shares that are accepted.
        assert!(LocalShare::new(1e-6).is_ok());
        assert!(LocalShare::one_of(1_000_000).is_ok());
    }
}
