//! [`LocalShare`]: the part of a fleet-wide limit one instance enforces on
//! its own while the store is unreachable.

use std::fmt;

use crate::error::ConfigError;

/// One instance's share of a limit, `0 < share <= 1`: what
/// [`FailurePolicy::Local`](crate::FailurePolicy::Local) scales every limit
/// by while the store cannot decide. With `n` instances behind a load
/// balancer, `1/n` ([`LocalShare::one_of`]) keeps the fleet near its limit.
///
/// Counts are scaled by [`scale`](LocalShare::scale): multiplied by the
/// share and rounded down, never below 1, so that `n` instances at `1/n`
/// admit no more than the limit together (unless the limit is below `n`:
/// each instance still admits one).
///
/// ```
/// use fleetgate::LocalShare;
///
/// let quarter = LocalShare::new(0.25)?;
/// assert_eq!(quarter.scale(500), 125);
/// assert_eq!(LocalShare::one_of(3)?.scale(5), 1); // 1.67, rounded down
/// assert_eq!(LocalShare::one_of(3)?.scale(300), 100);
/// assert_eq!(quarter.scale(2), 1); // never 0
///
/// // Nonsense is refused, not turned into "admit nothing".
/// assert!(LocalShare::new(0.0).is_err());
/// assert!(LocalShare::new(1.5).is_err());
/// assert!(LocalShare::new(f64::NAN).is_err());
/// assert!(LocalShare::one_of(0).is_err());
/// # Ok::<(), fleetgate::ConfigError>(())
/// ```
#[derive(Clone, Copy, PartialEq, PartialOrd)]
pub struct LocalShare(f64);

// Never NaN: `new` refuses it, so equality is reflexive.
impl Eq for LocalShare {}

impl LocalShare {
    /// `share` of each limit; refused unless `0 < share <= 1`.
    pub fn new(share: f64) -> Result<Self, ConfigError> {
        if share > 0.0 && share <= 1.0 {
            Ok(LocalShare(share))
        } else {
            Err(ConfigError::InvalidShare {
                share: share.to_string(),
            })
        }
    }

    /// One of `instances` equal shares: `1/instances`; refused for 0.
    pub fn one_of(instances: u64) -> Result<Self, ConfigError> {
        if instances == 0 {
            return Err(ConfigError::InvalidShare {
                share: "1/0".to_owned(),
            });
        }
        LocalShare::new(1.0 / instances as f64)
    }

    /// The share, in `(0, 1]`.
    pub fn get(self) -> f64 {
        self.0
    }

    /// `n` scaled by the share: rounded down to a whole number, at least 1.
    /// A product within a billionth of a whole number counts as that
    /// number, so that `1/3` of 300 is 100 despite floating point.
    pub fn scale(self, n: u64) -> u64 {
        if self.0 >= 1.0 {
            return n;
        }
        let exact = n as f64 * self.0;
        let nearest = exact.round();
        let scaled = if (exact - nearest).abs() <= exact * 1e-9 {
            nearest
        } else {
            exact.floor()
        };
        // `as` saturates; the product is at most `n`.
        (scaled as u64).clamp(1, n.max(1))
    }
}

impl fmt::Debug for LocalShare {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "LocalShare({})", self.0)
    }
}

impl fmt::Display for LocalShare {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
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
        assert_eq!(s(1e-12).scale(10), 1);
        assert_eq!(s(0.5).scale(u64::MAX), 1 << 63);
        assert_eq!(LocalShare::one_of(7).unwrap().scale(700), 100);
        assert_eq!(LocalShare::one_of(1).unwrap(), s(1.0));
    }

    #[test]
    fn invalid_shares_are_errors() {
        for bad in [0.0, -0.1, 1.000_001, f64::INFINITY, f64::NAN] {
            let err = LocalShare::new(bad).unwrap_err();
            assert!(matches!(err, ConfigError::InvalidShare { .. }), "{bad}");
        }
        assert!(
            LocalShare::one_of(0)
                .unwrap_err()
                .to_string()
                .contains("1/0")
        );
    }
}
