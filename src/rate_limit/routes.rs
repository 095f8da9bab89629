//! Per-route policies: one [`RateLimitLayer`](super::RateLimitLayer) over a
//! whole router, each route limited by its own policy.

use std::sync::Arc;

use http::Method;

use crate::error::ConfigError;
use crate::limiter::{IntoStore, Limiter};
use crate::policy::spec::PolicyFile;
use crate::route::RouteRule;

/// Which limiter decides which route: rules matched in order by method
/// (optional) and path, and a default for the rest (or none: unmatched
/// routes are not limited).
///
/// Paths are compared with the route the router matched (axum's
/// `MatchedPath`, such as `/users/{id}`), so add the layer with
/// `Router::layer` or `Router::route_layer`; outside a router the request's
/// URI path is used. A rule path ending in `*` matches every path that
/// starts with the rest. A gRPC method is such a path,
/// `/package.Service/Method`, and `/package.Service/*` covers a service
/// ([gRPC](crate::grpc#keys-and-methods)).
///
/// ```
/// use fleetgate::rate_limit::RoutePolicies;
/// use fleetgate::spec::PolicySpec;
/// use fleetgate::{Limiter, MemoryStore, RateLimitLayer};
/// use http::Method;
///
/// let store = MemoryStore::new();
/// let limiter = |name: &str, text: &str| -> Result<Limiter, Box<dyn std::error::Error>> {
///     Ok(Limiter::new(text.parse::<PolicySpec>()?.build(name)?, store.clone()))
/// };
/// let routes = RoutePolicies::new()
///     .route(Some(Method::POST), "/api/login", limiter("login", "5/min")?)?
///     .route(None, "/api/search/*", limiter("search", "10/s burst 20")?)?
///     .default_policy(limiter("general", "100/s")?);
/// let layer = RateLimitLayer::per_route(routes)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, Default)]
pub struct RoutePolicies {
    pub(crate) rules: Vec<RouteRule<Limiter>>,
    pub(crate) default: Option<Limiter>,
}

impl RoutePolicies {
    /// An empty table: nothing is limited until rules are added.
    pub fn new() -> Self {
        RoutePolicies::default()
    }

    /// Adds a rule: requests to `path` (and `method`, if given) are decided
    /// by `limiter`. The first matching rule wins.
    pub fn route(
        mut self,
        method: Option<Method>,
        path: &str,
        limiter: Limiter,
    ) -> Result<Self, ConfigError> {
        self.rules.push(RouteRule::new(method, path, limiter)?);
        Ok(self)
    }

    /// The limiter for requests no rule matches.
    pub fn default_policy(mut self, limiter: Limiter) -> Self {
        self.default = Some(limiter);
        self
    }

    /// The table a [`PolicyFile`] describes, every policy on `store`.
    pub fn from_file(file: &PolicyFile, store: impl IntoStore) -> Result<Self, ConfigError> {
        let store = store.into_store();
        let policies = file.policies()?;
        RoutePolicies::from_limiters(file, |name| {
            policies
                .get(name)
                .map(|p| Limiter::new(p.clone(), Arc::clone(&store)))
        })
    }

    /// The table of `file`'s routes, the limiter of each policy name made
    /// by `limiter` (`None`: no such policy).
    pub(crate) fn from_limiters(
        file: &PolicyFile,
        limiter: impl Fn(&str) -> Option<Limiter>,
    ) -> Result<Self, ConfigError> {
        let limiter = |name: &str| {
            limiter(name).ok_or_else(|| ConfigError::UnknownPolicy {
                name: name.to_owned(),
            })
        };
        let mut table = RoutePolicies::new();
        for route in &file.routes {
            let method = crate::policy::spec::route_method(route.method.as_ref())?;
            table = table.route(method, &route.path, limiter(&route.policy)?)?;
        }
        if let Some(name) = &file.default {
            table = table.default_policy(limiter(name)?);
        }
        Ok(table)
    }

    /// Every limiter of the table, rules first.
    pub(crate) fn limiters(&self) -> impl Iterator<Item = &Limiter> {
        self.rules.iter().map(|r| &r.value).chain(&self.default)
    }
}
