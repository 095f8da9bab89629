//! Per-route policies: one [`RateLimitLayer`](super::RateLimitLayer) over a
//! whole router, each route limited by its own policy.

use std::sync::Arc;

use http::{Method, Request};

use crate::error::ConfigError;
use crate::limiter::{IntoStore, Limiter};
use crate::spec::PolicyFile;

/// Which limiter decides which route: rules matched in order by method
/// (optional) and path, and a default for the rest (or none: unmatched
/// routes are not limited).
///
/// Paths are compared with the route the router matched (axum's
/// `MatchedPath`, such as `/users/{id}`), so add the layer with
/// `Router::layer` or `Router::route_layer`; outside a router the request's
/// URI path is used. A rule path ending in `*` matches every path that
/// starts with the rest.
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

/// One rule of a route table.
#[derive(Clone, Debug)]
pub(crate) struct RouteRule<T> {
    method: Option<Method>,
    path: Box<str>,
    prefix: bool,
    pub(crate) value: T,
}

impl<T> RouteRule<T> {
    fn new(method: Option<Method>, path: &str, value: T) -> Result<Self, ConfigError> {
        if !path.starts_with('/') {
            return Err(ConfigError::InvalidRoute {
                path: path.to_owned(),
            });
        }
        let (path, prefix) = match path.strip_suffix('*') {
            Some(stem) => (stem, true),
            None => (path, false),
        };
        Ok(RouteRule {
            method,
            path: path.into(),
            prefix,
            value,
        })
    }

    pub(crate) fn with_value<U>(&self, value: U) -> RouteRule<U> {
        RouteRule {
            method: self.method.clone(),
            path: self.path.clone(),
            prefix: self.prefix,
            value,
        }
    }

    fn matches(&self, method: &Method, path: &str) -> bool {
        self.method.as_ref().is_none_or(|m| m == method)
            && if self.prefix {
                path.starts_with(&*self.path)
            } else {
                path == &*self.path
            }
    }
}

/// The first rule matching `method` and `path`.
pub(crate) fn select<'a, T>(
    rules: &'a [RouteRule<T>],
    method: &Method,
    path: &str,
) -> Option<&'a T> {
    rules
        .iter()
        .find(|r| r.matches(method, path))
        .map(|r| &r.value)
}

/// The route a request was matched to, else its URI path.
pub(crate) fn route_path<B>(req: &Request<B>) -> &str {
    #[cfg(feature = "axum")]
    if let Some(matched) = req.extensions().get::<axum::extract::MatchedPath>() {
        return matched.as_str();
    }
    req.uri().path()
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
        let limiter = |name: &str| {
            policies
                .get(name)
                .map(|p| Limiter::new(p.clone(), Arc::clone(&store)))
                .ok_or_else(|| ConfigError::UnknownPolicy {
                    name: name.to_owned(),
                })
        };
        let mut table = RoutePolicies::new();
        for route in &file.routes {
            let method = match &route.method {
                Some(m) => Some(
                    Method::from_bytes(m.as_bytes())
                        .map_err(|_| ConfigError::InvalidMethod { method: m.clone() })?,
                ),
                None => None,
            };
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_match_in_order() {
        let rules = vec![
            RouteRule::new(Some(Method::POST), "/login", 1).unwrap(),
            RouteRule::new(None, "/api/*", 2).unwrap(),
            RouteRule::new(None, "/api/x", 3).unwrap(),
        ];
        assert_eq!(select(&rules, &Method::POST, "/login"), Some(&1));
        assert_eq!(select(&rules, &Method::GET, "/login"), None);
        assert_eq!(select(&rules, &Method::GET, "/api/x"), Some(&2));
        assert_eq!(select(&rules, &Method::GET, "/apix"), None);
        assert!(RouteRule::new(None, "nope", 0).is_err());
    }
}
