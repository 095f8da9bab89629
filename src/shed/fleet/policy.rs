use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::concurrency::{ConcurrencyPolicy, ConcurrencyPolicyBuilder};
use crate::error::ConfigError;
use crate::share::LocalShare;
use crate::shed::tier::{Tier, Tiers};

/// How much of the fleet's capacity each tier may use: at most `capacity`
/// requests in flight across the fleet, of which a request of a tier is
/// admitted only while fewer than `floor(share × capacity)` are in flight
/// (all tiers counted; the share taken as an exact fraction, as
/// [`LocalShare`] does). The most important tier is never shed: its requests
/// are admitted whatever the count, and counted like the others.
///
/// Default shares, for `n` tiers: the least important may use half of the
/// capacity, and the shares rise evenly from there to the most important
/// (for `critical, high, normal, low`: none, 5/6, 2/3, 1/2). Each request
/// holds a lease in the store as the concurrency limiter's do, with the
/// same TTL and renewal settings (30 s, renewed every 10 s).
///
/// ```
/// use fleetgate::shed::{FleetShedPolicy, Tiers};
///
/// let policy = FleetShedPolicy::builder("fleet", 100)
///     .share("low", 0.4)
///     .build()?;
/// let tiers = policy.tiers();
/// assert_eq!(policy.limit(tiers.get("low").unwrap()), Some(40));
/// assert_eq!(policy.limit(tiers.get("high").unwrap()), Some(83));
/// assert_eq!(policy.limit(tiers.critical()), None); // never shed
///
/// // A share that leaves a tier nothing is refused.
/// assert!(FleetShedPolicy::builder("fleet", 4).share("low", 0.2).build().is_err());
/// # Ok::<(), fleetgate::ConfigError>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FleetShedPolicy {
    lease: ConcurrencyPolicy,
    tiers: Tiers,
    /// Per tier, most important first: `None` for the tier never shed.
    limits: Arc<[Option<u64>]>,
    /// Per tier, the share of the capacity its limit is (`None` for the
    /// tier never shed): what a capacity that moves is scaled by.
    shares: Arc<[Option<LocalShare>]>,
}

impl FleetShedPolicy {
    /// `capacity` in flight across the fleet over the default tiers and
    /// shares.
    pub fn new(name: impl Into<String>, capacity: u64) -> Result<Self, ConfigError> {
        FleetShedPolicy::builder(name, capacity).build()
    }

    /// Starts building a policy named `name` (part of storage keys:
    /// `[A-Za-z0-9-_./:]`, at most 64 bytes) for a fleet that can have
    /// `capacity` requests in flight.
    pub fn builder(name: impl Into<String>, capacity: u64) -> FleetShedPolicyBuilder {
        FleetShedPolicyBuilder {
            lease: ConcurrencyPolicy::builder(name, capacity),
            tiers: Tiers::default(),
            shares: Vec::new(),
        }
    }

    /// The policy's name.
    pub fn name(&self) -> &str {
        self.lease.name()
    }

    /// How many requests the fleet can have in flight.
    pub fn capacity(&self) -> u64 {
        self.lease.max_in_flight()
    }

    /// The tiers.
    pub fn tiers(&self) -> &Tiers {
        &self.tiers
    }

    /// How many requests may be in flight across the fleet for one of
    /// `tier` to be admitted; `None` for the most important tier (never
    /// shed) and for a tier of another set.
    pub fn limit(&self, tier: Tier) -> Option<u64> {
        self.limits.get(tier.rank()).copied().flatten()
    }

    /// [`limit`](Self::limit) for a fleet of `capacity` rather than the
    /// policy's: `floor(share × capacity)`, at least 1; for a
    /// [`FleetShedder`](super::FleetShedder) whose capacity follows a
    /// [`FleetLimit`](crate::concurrency::FleetLimit).
    pub fn limit_at(&self, tier: Tier, capacity: u64) -> Option<u64> {
        let share = self.shares.get(tier.rank()).copied().flatten()?;
        Some(share.floor_of(capacity).max(1))
    }

    /// The lease settings: the policy's name, capacity, lease TTL and
    /// renewal.
    pub fn lease(&self) -> &ConcurrencyPolicy {
        &self.lease
    }

    /// The same policy with the capacity and every tier's limit scaled by
    /// `share` (rounded down, at least 1): what one instance enforces on
    /// its own under [`FailurePolicy::Local`](crate::FailurePolicy::Local).
    pub fn scaled(&self, share: LocalShare) -> FleetShedPolicy {
        FleetShedPolicy {
            lease: self.lease.scaled(share),
            tiers: self.tiers.clone(),
            limits: self
                .limits
                .iter()
                .map(|limit| limit.map(|l| share.scale(l)))
                .collect(),
            shares: self.shares.clone(),
        }
    }
}

impl fmt::Display for FleetShedPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} in flight", self.capacity())?;
        for tier in self.tiers.iter() {
            if let Some(limit) = self.limit(tier) {
                write!(f, ", {} up to {limit}", self.tiers.name(tier))?;
            }
        }
        Ok(())
    }
}

/// Builds a [`FleetShedPolicy`]; see [`FleetShedPolicy::builder`].
#[derive(Clone, Debug)]
#[must_use]
pub struct FleetShedPolicyBuilder {
    lease: ConcurrencyPolicyBuilder,
    tiers: Tiers,
    shares: Vec<(String, f64)>,
}

impl FleetShedPolicyBuilder {
    /// The tiers (default: `critical`, `high`, `normal`, `low`). Shares
    /// name tiers of this set.
    pub fn tiers(mut self, tiers: Tiers) -> Self {
        self.tiers = tiers;
        self
    }

    /// The share of the capacity that requests of the tier `name` may use,
    /// from `1e-6` to `1`. A less important tier may not get a larger limit than
    /// a more important one; the most important tier takes no share.
    ///
    /// Tiers given no share keep their default unless that would put them
    /// out of order with a share given: they are raised to the largest
    /// share given to a less important tier, and lowered to the smallest
    /// given to a more important one. So `.share("low", 0.9)` alone also
    /// lets `normal` use 0.9 (its default is 2/3), and `.share("high",
    /// 0.4)` alone holds `normal` and `low` to 0.4 at most.
    pub fn share(mut self, name: &str, share: f64) -> Self {
        self.shares.push((name.to_owned(), share));
        self
    }

    /// How long a lease lives unless renewed or released (default 30 s):
    /// how long a crashed instance's requests keep counting.
    pub fn lease_ttl(mut self, ttl: Duration) -> Self {
        self.lease = self.lease.lease_ttl(ttl);
        self
    }

    /// Renews held leases this often (default: a third of the TTL).
    pub fn renew_every(mut self, every: Duration) -> Self {
        self.lease = self.lease.renew_every(every);
        self
    }

    /// Never renews: a request that outlives the TTL stops counting.
    pub fn no_renewal(mut self) -> Self {
        self.lease = self.lease.no_renewal();
        self
    }

    /// Checks the policy and builds it.
    pub fn build(self) -> Result<FleetShedPolicy, ConfigError> {
        let lease = self.lease.build()?;
        let tiers = self.tiers;
        let invalid = |tier: &str, detail: String| ConfigError::TierShare {
            tier: tier.to_owned(),
            detail,
        };
        let mut given: Vec<Option<LocalShare>> = vec![None; tiers.len()];
        for (name, share) in &self.shares {
            let tier = tiers
                .get(name)
                .ok_or_else(|| ConfigError::UnknownTier { name: name.clone() })?;
            if tier == tiers.critical() {
                return Err(invalid(
                    name,
                    "the most important tier is never shed".into(),
                ));
            }
            let share = LocalShare::new(*share)
                .map_err(|_| invalid(name, format!("{share} is outside 1e-6 <= share <= 1")))?;
            if let Some(slot) = given.get_mut(tier.rank()) {
                *slot = Some(share);
            }
        }
        let shares = fill_shares(&given)?;
        let capacity = lease.max_in_flight();
        let mut limits: Vec<Option<u64>> = vec![None];
        let kept: Vec<Option<LocalShare>> = std::iter::once(None)
            .chain(shares.iter().skip(1).copied().map(Some))
            .collect();
        let mut above = capacity;
        for (tier, share) in tiers.iter().zip(&shares).skip(1) {
            let name = tiers.name(tier);
            let limit = share.floor_of(capacity);
            if limit == 0 {
                return Err(invalid(
                    name,
                    format!("{share} of {capacity} leaves the tier no capacity"),
                ));
            }
            if limit > above {
                return Err(invalid(
                    name,
                    format!(
                        "{share} of {capacity} is {limit}, more than the {above} of a more important tier"
                    ),
                ));
            }
            above = limit;
            limits.push(Some(limit));
        }
        Ok(FleetShedPolicy {
            lease,
            tiers,
            limits: limits.into(),
            shares: kept.into(),
        })
    }
}

/// The shares given, and for the tiers without one their default, moved
/// as little as keeps the order: up to the largest share given to a less
/// important tier, down to the smallest given to a more important one.
fn fill_shares(given: &[Option<LocalShare>]) -> Result<Vec<LocalShare>, ConfigError> {
    let defaults = default_shares(given.len())?;
    let pick = |shares: &[Option<LocalShare>], more: bool| {
        shares.iter().flatten().copied().reduce(
            |a, b| {
                if (b.get() > a.get()) == more { b } else { a }
            },
        )
    };
    Ok(given
        .iter()
        .zip(defaults)
        .enumerate()
        .map(|(rank, (share, default))| {
            share.unwrap_or_else(|| {
                let mut share = default;
                if let Some(below) = pick(&given[rank + 1..], true)
                    && below.get() > share.get()
                {
                    share = below;
                }
                if let Some(above) = pick(&given[..rank], false)
                    && above.get() < share.get()
                {
                    share = above;
                }
                share
            })
        })
        .collect())
}

/// The least important of `n` tiers gets half, and the shares rise evenly
/// to 1 at the most important (whose share is never used).
fn default_shares(n: usize) -> Result<Vec<LocalShare>, ConfigError> {
    let steps = n.saturating_sub(1).max(1) as u64;
    (0..n as u64)
        .map(|rank| LocalShare::new(1.0 - rank as f64 / (2 * steps) as f64))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_shares_leave_half_to_the_lowest_tier() {
        let p = FleetShedPolicy::new("fleet", 12).unwrap();
        let limits: Vec<_> = p.tiers().iter().map(|t| p.limit(t)).collect();
        assert_eq!(limits, [None, Some(10), Some(8), Some(6)]);
        let two = FleetShedPolicy::builder("fleet", 10)
            .tiers(Tiers::new(["payments", "rest"]).unwrap())
            .build()
            .unwrap();
        assert_eq!(two.limit(two.tiers().get("rest").unwrap()), Some(5));
        assert_eq!(two.to_string(), "10 in flight, rest up to 5");
    }

    #[test]
    fn bad_shares_are_refused() {
        let b = || FleetShedPolicy::builder("fleet", 10);
        for share in [0.0, -0.5, 1.5, f64::NAN, f64::INFINITY] {
            assert!(
                matches!(
                    b().share("low", share).build(),
                    Err(ConfigError::TierShare { .. })
                ),
                "{share}"
            );
        }
        assert!(matches!(
            b().share("critical", 0.5).build(),
            Err(ConfigError::TierShare { .. })
        ));
        assert!(matches!(
            b().share("bulk", 0.5).build(),
            Err(ConfigError::UnknownTier { .. })
        ));
        // low above normal: priorities inverted.
        assert!(matches!(
            b().share("normal", 0.3).share("low", 0.6).build(),
            Err(ConfigError::TierShare { .. })
        ));
        // Default shares of a capacity of 1 leave the lower tiers nothing.
        assert!(FleetShedPolicy::new("fleet", 1).is_err());
        assert!(matches!(
            FleetShedPolicy::new("fleet", 0),
            Err(ConfigError::ZeroInFlight)
        ));
        assert!(FleetShedPolicy::new("bad name", 10).is_err());
        let all = b()
            .share("high", 1.0)
            .share("normal", 1.0)
            .share("low", 1.0)
            .build()
            .unwrap();
        assert_eq!(all.limit(all.tiers().get("low").unwrap()), Some(10));
    }

    #[test]
    fn defaults_make_room_for_the_shares_given() {
        let limits = |p: FleetShedPolicy| -> Vec<Option<u64>> {
            p.tiers().iter().map(|t| p.limit(t)).collect()
        };
        let b = || FleetShedPolicy::builder("fleet", 12);
        // Defaults: none, 10, 8, 6. A large share for low raises normal
        // (default 2/3) to it, and leaves high (5/6) alone.
        let p = b().share("low", 0.75).build().unwrap();
        assert_eq!(limits(p), [None, Some(10), Some(9), Some(9)]);
        let p = b().share("low", 0.9).build().unwrap();
        assert_eq!(limits(p), [None, Some(10), Some(10), Some(10)]);
        // A small share for high lowers the tiers below it.
        let p = b().share("high", 0.25).build().unwrap();
        assert_eq!(limits(p), [None, Some(3), Some(3), Some(3)]);
        // Between two given shares, a default is held inside them.
        let p = b().share("high", 0.5).share("low", 0.25).build().unwrap();
        assert_eq!(limits(p), [None, Some(6), Some(6), Some(3)]);
        // Shares given out of order are still refused.
        assert!(b().share("high", 0.25).share("low", 0.5).build().is_err());
    }

    #[test]
    fn shares_are_exact_fractions_and_scale_for_a_local_fallback() {
        let b = || FleetShedPolicy::builder("fleet", 100);
        let p = b().share("low", 0.29).build().unwrap();
        assert_eq!(p.limit(p.tiers().get("low").unwrap()), Some(29));
        let p = FleetShedPolicy::new("fleet", 12).unwrap();
        let local = p.scaled(LocalShare::one_of(4).unwrap());
        assert_eq!(local.capacity(), 3);
        let limits: Vec<_> = local.tiers().iter().map(|t| local.limit(t)).collect();
        assert_eq!(limits, [None, Some(2), Some(2), Some(1)]);
    }
}
