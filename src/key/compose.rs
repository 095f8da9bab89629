//! Extractors made of other extractors, or of a closure.

use std::fmt;

use super::{Key, KeyExtractor};

/// Tries one extractor, then another; see [`HeaderKey::or`].
#[derive(Clone, Debug)]
pub struct Or<A, B> {
    pub(super) first: A,
    pub(super) second: B,
}

impl<Req, A: KeyExtractor<Req>, B: KeyExtractor<Req>> KeyExtractor<Req> for Or<A, B> {
    fn extract(&self, req: &Req) -> Option<Key> {
        self.first.extract(req).or_else(|| self.second.extract(req))
    }
}

/// A key extractor from a closure; see [`key_fn`].
#[derive(Clone)]
pub struct KeyFn<F>(F);

impl<F> fmt::Debug for KeyFn<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("KeyFn")
    }
}

/// Uses a closure as a key extractor.
///
/// ```
/// use fleetgate::key::{key_fn, Key, KeyExtractor};
///
/// let by_tenant = key_fn(|req: &http::Request<()>| {
///     req.uri().path().split('/').nth(2).map(|tenant| Key::new(format!("tenant:{tenant}")))
/// });
/// let req = http::Request::get("/t/acme/orders").body(()).unwrap();
/// assert_eq!(by_tenant.extract(&req).unwrap().text(), "tenant:acme");
/// ```
pub fn key_fn<Req, F>(f: F) -> KeyFn<F>
where
    F: Fn(&Req) -> Option<Key> + Send + Sync + 'static,
{
    KeyFn(f)
}

impl<Req, F> KeyExtractor<Req> for KeyFn<F>
where
    F: Fn(&Req) -> Option<Key> + Send + Sync + 'static,
{
    fn extract(&self, req: &Req) -> Option<Key> {
        (self.0)(req)
    }
}
