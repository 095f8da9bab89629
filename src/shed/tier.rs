//! Priority tiers and the classifiers that put requests into them.

use std::fmt;
use std::sync::Arc;

use http::{HeaderName, Method, Request};

use crate::error::ConfigError;
use crate::policy::check_name;
use crate::policy::spec::PolicyFile;
use crate::route::{self, RouteRule};

/// The most tiers a set may hold (stated as 16 in the docs and in
/// [`ConfigError::TierCount`]'s message).
pub(crate) const MAX_TIERS: usize = 16;

/// One tier of a [`Tiers`] set, by position: 0 is the most important.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Tier(u8);

impl Tier {
    /// The tier's position: 0 is the most important.
    pub fn rank(self) -> usize {
        usize::from(self.0)
    }
}

/// An ordered set of priority tiers, most important first, and the tier of
/// requests nobody classified.
///
/// The most important tier is never shed. The default set is `critical`,
/// `high`, `normal`, `low`, with unclassified requests in `normal`.
///
/// ```
/// use fleetgate::shed::Tiers;
///
/// let tiers = Tiers::new(["payments", "api", "reports", "analytics"])?
///     .default_tier("api")?;
/// assert_eq!(tiers.get("analytics").map(|t| t.rank()), Some(3));
/// assert_eq!(tiers.name(tiers.unclassified()), "api");
/// # Ok::<(), fleetgate::ConfigError>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tiers {
    names: Arc<[Arc<str>]>,
    default: Tier,
}

impl Default for Tiers {
    fn default() -> Self {
        Tiers {
            names: ["critical", "high", "normal", "low"]
                .into_iter()
                .map(Arc::from)
                .collect(),
            default: Tier(2),
        }
    }
}

impl Tiers {
    /// Tiers named most important first; unclassified requests go to the
    /// least important until [`default_tier`](Self::default_tier) says
    /// otherwise. 2 to 16 tiers (one that is never shed, at least one that
    /// can be), names as for policies and unique.
    pub fn new<I, S>(names: I) -> Result<Self, ConfigError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let mut list: Vec<Arc<str>> = Vec::new();
        for name in names {
            let name = name.as_ref();
            check_name(name)?;
            if list.iter().any(|n| &**n == name) {
                return Err(ConfigError::DuplicateTier {
                    name: name.to_owned(),
                });
            }
            list.push(Arc::from(name));
        }
        if !(2..=MAX_TIERS).contains(&list.len()) {
            return Err(ConfigError::TierCount { count: list.len() });
        }
        let last = u8::try_from(list.len() - 1).unwrap_or(u8::MAX);
        Ok(Tiers {
            names: list.into(),
            default: Tier(last),
        })
    }

    /// The tier of requests no classifier placed.
    pub fn default_tier(mut self, name: &str) -> Result<Self, ConfigError> {
        self.default = self.get(name).ok_or_else(|| ConfigError::UnknownTier {
            name: name.to_owned(),
        })?;
        Ok(self)
    }

    /// The tier called `name`.
    pub fn get(&self, name: &str) -> Option<Tier> {
        self.names
            .iter()
            .position(|n| &**n == name)
            .and_then(|i| u8::try_from(i).ok())
            .map(Tier)
    }

    /// The tier of unclassified requests.
    pub fn unclassified(&self) -> Tier {
        self.default
    }

    /// The name of `tier` (`"?"` for a tier of another set).
    pub fn name(&self, tier: Tier) -> &str {
        self.names.get(tier.rank()).map_or("?", |n| n)
    }

    /// How many tiers there are.
    pub fn len(&self) -> usize {
        self.names.len()
    }

    /// Always false: a set has at least two tiers.
    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }

    /// Every tier, most important first.
    pub fn iter(&self) -> impl Iterator<Item = Tier> + '_ {
        (0..self.names.len()).filter_map(|i| u8::try_from(i).ok().map(Tier))
    }

    /// The most important tier, never shed.
    pub fn critical(&self) -> Tier {
        Tier(0)
    }

    /// Clamps a tier of unknown origin into this set.
    pub(crate) fn clamp(&self, tier: Tier) -> Tier {
        if tier.rank() < self.len() {
            tier
        } else {
            self.default
        }
    }
}

/// Puts a request into a tier, or says nothing (the default tier applies).
///
/// Implemented by [`RouteTiers`], [`HeaderTier`], any closure
/// `Fn(&Req, &Tiers) -> Option<Tier>`, and `()`, which classifies nothing:
/// the layers' classifier until one is given.
pub trait Classify<Req>: Send + Sync + 'static {
    /// The tier of `req` within `tiers`, if this classifier knows it.
    fn classify(&self, req: &Req, tiers: &Tiers) -> Option<Tier>;
}

impl<Req, F> Classify<Req> for F
where
    F: Fn(&Req, &Tiers) -> Option<Tier> + Send + Sync + 'static,
{
    fn classify(&self, req: &Req, tiers: &Tiers) -> Option<Tier> {
        self(req, tiers)
    }
}

/// Classifies nothing: every request falls into the default tier. The
/// layers' classifier until one is given.
impl<Req> Classify<Req> for () {
    fn classify(&self, _req: &Req, _tiers: &Tiers) -> Option<Tier> {
        None
    }
}

/// Classifies by a header that a trusted gateway sets to a tier name, such
/// as `x-priority: critical`. Unknown or unreadable values fall to the
/// default tier. Only use it behind a gateway that overwrites the header:
/// a client that can set it can make itself critical.
#[derive(Clone, Debug)]
pub struct HeaderTier {
    name: HeaderName,
}

impl HeaderTier {
    /// Reads the header `name`.
    pub fn new(name: HeaderName) -> Self {
        HeaderTier { name }
    }
}

impl<B> Classify<Request<B>> for HeaderTier {
    fn classify(&self, req: &Request<B>, tiers: &Tiers) -> Option<Tier> {
        let value = req.headers().get(&self.name)?.to_str().ok()?;
        tiers.get(value.trim())
    }
}

/// Classifies by route: the first rule whose method (if given) and path
/// match. Paths are matched against axum's `MatchedPath` (such as
/// `/users/{id}`) when the request has one, else the URI path; a rule path
/// ending in `*` matches by prefix. A gRPC method is such a path
/// (`/package.Service/Method`, or `/package.Service/*` for a service).
///
/// ```
/// use fleetgate::shed::{RouteTiers, Tiers};
/// use http::Method;
///
/// let routes = RouteTiers::new(&Tiers::default())
///     .route(Some(Method::POST), "/v1/charges", "critical")?
///     .route(None, "/v1/reports/*", "low")?;
/// # Ok::<(), fleetgate::ConfigError>(())
/// ```
#[derive(Clone, Debug)]
pub struct RouteTiers {
    tiers: Tiers,
    rules: Vec<RouteRule<Tier>>,
}

impl RouteTiers {
    /// An empty table over `tiers`.
    pub fn new(tiers: &Tiers) -> Self {
        RouteTiers {
            tiers: tiers.clone(),
            rules: Vec::new(),
        }
    }

    /// Adds a rule; the tier must exist and the path start with `/`.
    pub fn route(
        mut self,
        method: Option<Method>,
        path: &str,
        tier: &str,
    ) -> Result<Self, ConfigError> {
        let tier = self
            .tiers
            .get(tier)
            .ok_or_else(|| ConfigError::UnknownTier {
                name: tier.to_owned(),
            })?;
        self.rules.push(RouteRule::new(method, path, tier)?);
        Ok(self)
    }

    /// The table of a policy file's `[[shed_routes]]`
    /// ([`ShedRouteSpec`](crate::policy::spec::ShedRouteSpec)) over `tiers`; every
    /// tier named must exist. Read once: a reload of the file by
    /// [`LivePolicies`](crate::live::LivePolicies) does not change it.
    pub fn from_file(file: &PolicyFile, tiers: &Tiers) -> Result<Self, ConfigError> {
        let mut table = RouteTiers::new(tiers);
        for route in &file.shed_routes {
            let method = crate::policy::spec::route_method(route.method.as_ref())?;
            table = table.route(method, &route.path, &route.tier)?;
        }
        Ok(table)
    }
}

impl<B> Classify<Request<B>> for RouteTiers {
    fn classify(&self, req: &Request<B>, tiers: &Tiers) -> Option<Tier> {
        let tier = *route::select(&self.rules, req.method(), route::route_path(req))?;
        // A table built over another set of tiers is read by name.
        if *tiers == self.tiers {
            Some(tier)
        } else {
            tiers.get(self.tiers.name(tier))
        }
    }
}

impl fmt::Display for Tier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "tier {}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiers_are_checked() {
        assert!(matches!(
            Tiers::new(["only"]),
            Err(ConfigError::TierCount { count: 1 })
        ));
        assert!(matches!(
            Tiers::new(["a", "a"]),
            Err(ConfigError::DuplicateTier { .. })
        ));
        assert!(matches!(
            Tiers::new(["a", "b c"]),
            Err(ConfigError::InvalidName { .. })
        ));
        let many: Vec<String> = (0..17).map(|i| format!("t{i}")).collect();
        assert!(Tiers::new(&many).is_err());
        let t = Tiers::new(["gold", "silver", "bronze"]).unwrap();
        assert_eq!(t.name(t.unclassified()), "bronze");
        assert!(t.clone().default_tier("tin").is_err());
        assert_eq!(t.iter().count(), 3);
        let d = Tiers::default();
        assert_eq!(d.name(d.unclassified()), "normal");
        assert_eq!(d.name(d.critical()), "critical");
    }

    #[test]
    fn headers_and_routes_classify() {
        let tiers = Tiers::default();
        let h = HeaderTier::new(HeaderName::from_static("x-priority"));
        let req = |m: Method, p: &str, prio: Option<&[u8]>| {
            let mut b = Request::builder().method(m).uri(p);
            if let Some(v) = prio {
                b = b.header("x-priority", http::HeaderValue::from_bytes(v).unwrap());
            }
            b.body(()).unwrap()
        };
        assert_eq!(
            h.classify(&req(Method::GET, "/", Some(b"low")), &tiers),
            tiers.get("low")
        );
        assert_eq!(
            h.classify(&req(Method::GET, "/", Some(b"\xff")), &tiers),
            None
        );
        assert_eq!(
            h.classify(&req(Method::GET, "/", Some(b"boss")), &tiers),
            None
        );
        assert_eq!(h.classify(&req(Method::GET, "/", None), &tiers), None);

        let routes = RouteTiers::new(&tiers)
            .route(Some(Method::POST), "/pay", "critical")
            .unwrap()
            .route(None, "/reports/*", "low")
            .unwrap();
        assert_eq!(
            routes.classify(&req(Method::POST, "/pay", None), &tiers),
            tiers.get("critical")
        );
        assert_eq!(
            routes.classify(&req(Method::GET, "/pay", None), &tiers),
            None
        );
        assert_eq!(
            routes.classify(&req(Method::GET, "/reports/2026", None), &tiers),
            tiers.get("low")
        );
        assert!(RouteTiers::new(&tiers).route(None, "/x", "nope").is_err());
        assert!(RouteTiers::new(&tiers).route(None, "x", "low").is_err());
    }
}
