//! Route rules, shared by the tables that pick something by route
//! ([`RoutePolicies`](crate::rate_limit::RoutePolicies) a limiter,
//! [`RouteTiers`](crate::shed::RouteTiers) a tier), so that both read a
//! rule and match a request alike.

use http::{Method, Request};

use crate::error::ConfigError;

/// One rule of a route table: a method (optional) and a path, exact or,
/// ending in `*`, a prefix; and what it picks.
#[derive(Clone, Debug)]
pub(crate) struct RouteRule<T> {
    method: Option<Method>,
    path: Box<str>,
    prefix: bool,
    pub(crate) value: T,
}

impl<T> RouteRule<T> {
    /// A rule for `path`, which must start with `/`.
    pub(crate) fn new(method: Option<Method>, path: &str, value: T) -> Result<Self, ConfigError> {
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

    /// The same route, picking `value`.
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

/// The position of the first rule matching `method` and `path`.
pub(crate) fn position<T>(rules: &[RouteRule<T>], method: &Method, path: &str) -> Option<usize> {
    rules.iter().position(|r| r.matches(method, path))
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

/// The route a request was matched to (axum's `MatchedPath`), else its URI
/// path.
pub(crate) fn route_path<B>(req: &Request<B>) -> &str {
    #[cfg(feature = "axum")]
    if let Some(matched) = req.extensions().get::<axum::extract::MatchedPath>() {
        return matched.as_str();
    }
    req.uri().path()
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
