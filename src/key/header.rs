use std::sync::Arc;

use http::header::{AUTHORIZATION, HeaderName};

use super::{Key, KeyExtractor};

/// Keys requests by a header such as an API key or a bearer token.
///
/// The value is hashed (SHA-256, optionally with a secret pepper) before it
/// becomes a key, so the raw secret never reaches Redis, logs or metrics.
/// A missing or empty header yields no key.
///
/// ```
/// use fleetgate::key::{HeaderKey, KeyExtractor};
///
/// let by_api_key = HeaderKey::new("x-api-key");
/// let req = http::Request::get("/").header("x-api-key", "sk_live_123").body(()).unwrap();
/// let key = by_api_key.extract(&req).unwrap();
/// assert!(!key.text().contains("sk_live_123"));
/// ```
#[derive(Clone, Debug)]
pub struct HeaderKey {
    name: HeaderName,
    bearer: bool,
    hashed: bool,
    pepper: Arc<[u8]>,
}

impl HeaderKey {
    /// Keys by the value of header `name`.
    ///
    /// Any case is accepted (`X-Api-Key` is `x-api-key`).
    ///
    /// # Panics
    ///
    /// When `name` is not a valid header name (it contains spaces, say);
    /// that is a mistake in a literal. Use [`HeaderKey::from_name`] for
    /// names read at run time.
    pub fn new(name: &'static str) -> Self {
        match HeaderName::from_bytes(name.as_bytes()) {
            Ok(name) => HeaderKey::from_name(name),
            Err(_) => panic!("HeaderKey::new: {name:?} is not a valid header name"),
        }
    }

    /// Keys by the value of header `name`.
    pub fn from_name(name: HeaderName) -> Self {
        HeaderKey {
            name,
            bearer: false,
            hashed: true,
            pepper: Arc::from(&[][..]),
        }
    }

    /// Keys by the token of an `Authorization: Bearer <token>` header.
    /// Other schemes yield no key.
    pub fn bearer() -> Self {
        HeaderKey {
            bearer: true,
            ..HeaderKey::from_name(AUTHORIZATION)
        }
    }

    /// Mixes a secret into the hash, so that short keys cannot be recovered
    /// by hashing guesses offline. Every instance of the fleet must use the
    /// same pepper.
    pub fn pepper(mut self, pepper: impl AsRef<[u8]>) -> Self {
        self.pepper = Arc::from(pepper.as_ref());
        self
    }

    /// Uses the value as it is instead of hashing it, for headers that are
    /// not secret (a tenant id). Values that are not visible ASCII, or longer
    /// than 128 bytes, are still hashed.
    pub fn unhashed(mut self) -> Self {
        self.hashed = false;
        self
    }

    fn value<'a>(&self, raw: &'a [u8]) -> Option<&'a [u8]> {
        let value = raw.trim_ascii();
        let value = if self.bearer {
            let (scheme, token) = value.split_at_checked(7)?;
            if !scheme.eq_ignore_ascii_case(b"bearer ") {
                return None;
            }
            token.trim_ascii()
        } else {
            value
        };
        (!value.is_empty()).then_some(value)
    }
}

impl<B> KeyExtractor<http::Request<B>> for HeaderKey {
    fn extract(&self, req: &http::Request<B>) -> Option<Key> {
        let value = self.value(req.headers().get(&self.name)?.as_bytes())?;
        let printable = value.iter().all(|b| b.is_ascii_graphic());
        if !self.hashed && printable {
            let text = std::str::from_utf8(value).ok()?;
            return Some(Key::new(format!("hv:{text}")));
        }
        let mut input = Vec::with_capacity(self.pepper.len() + 1 + value.len());
        input.extend_from_slice(&self.pepper);
        input.push(0);
        input.extend_from_slice(value);
        Some(Key::hashed("h:", &input))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(name: &str, value: &[u8]) -> http::Request<()> {
        let mut req = http::Request::new(());
        req.headers_mut().insert(
            HeaderName::from_bytes(name.as_bytes()).unwrap(),
            http::HeaderValue::from_bytes(value).unwrap(),
        );
        req
    }

    #[test]
    fn header_names_in_any_case() {
        let k = HeaderKey::new("X-Api-Key");
        assert!(k.extract(&req("x-api-key", b"abc")).is_some());
    }

    #[test]
    fn bearer_tokens() {
        let k = HeaderKey::bearer();
        assert!(k.extract(&req("authorization", b"Bearer abc")).is_some());
        assert!(k.extract(&req("authorization", b"bearer   abc")).is_some());
        assert!(k.extract(&req("authorization", b"Basic abc")).is_none());
        assert!(k.extract(&req("authorization", b"Bearer ")).is_none());
        assert!(k.extract(&req("authorization", b"Bear")).is_none());
        assert_eq!(
            k.extract(&req("authorization", b"Bearer abc")),
            HeaderKey::new("x-api-key").extract(&req("x-api-key", b"abc")),
        );
    }

    #[test]
    fn pepper_changes_the_key_and_non_utf8_is_fine() {
        let plain = HeaderKey::new("x-api-key");
        let peppered = HeaderKey::new("x-api-key").pepper("s3cret");
        let r = req("x-api-key", b"k\xff\xfe");
        assert_ne!(plain.extract(&r), peppered.extract(&r));
        assert!(
            HeaderKey::new("x-api-key")
                .unhashed()
                .extract(&r)
                .unwrap()
                .text()
                .starts_with("h:")
        );
        let t = req("x-api-key", b"acme");
        assert_eq!(
            HeaderKey::new("x-api-key")
                .unhashed()
                .extract(&t)
                .unwrap()
                .text(),
            "hv:acme"
        );
    }
}
