use std::fmt::{self, Display, Write as _};
use std::marker::PhantomData;

use super::{Key, KeyExtractor};

/// Keys requests by an identity that an authentication layer put in the
/// request's extensions: the one key extractor a client cannot choose its
/// key with.
///
/// [`HeaderKey`](super::HeaderKey) keys by whatever a client sends, so a
/// client that invents a new API key on every call gets a fresh budget on
/// every call. Put the layer that checks credentials in front of the limit
/// and let it insert the identity it verified (`req.extensions_mut()
/// .insert(...)`); key by that with `ExtensionKey`, and chain
/// [`PeerIp`](super::PeerIp) (or [`ForwardedIp`](super::ForwardedIp))
/// after it, so that every request without a verified identity, a made-up
/// key included, shares its client address's budget:
///
/// ```
/// use fleetgate::key::{ExtensionKey, KeyExtractor, PeerIp};
///
/// /// Put in the request by the authentication layer, never by a client.
/// #[derive(Clone, Debug)]
/// struct Account(u64);
///
/// impl std::fmt::Display for Account {
///     fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
///         write!(f, "{}", self.0)
///     }
/// }
///
/// let key = ExtensionKey::<Account>::new("account").or(PeerIp);
///
/// let mut req = http::Request::get("/").body(()).unwrap();
/// req.extensions_mut().insert(Account(42));
/// assert_eq!(key.extract(&req).unwrap().text(), "account:42");
/// ```
///
/// The key is `prefix:` and the identity as `Display` writes it (a digest
/// of it past 128 bytes, or always with [`hashed`](Self::hashed)). A
/// request without the extension yields no key.
///
/// The layer that inserts the identity must run before the limit: with
/// axum, add it with `.layer(...)` after the limit's (the last layer added
/// runs first), or, as a `ServiceBuilder`, before it.
pub struct ExtensionKey<T> {
    prefix: &'static str,
    hashed: bool,
    // `fn() -> T`: the extractor holds no `T`, so it is `Send + Sync`
    // whatever `T` is.
    identity: PhantomData<fn() -> T>,
}

/// Prefixes the built-in extractors use: an identity under one of them
/// could pose as, say, an IP address and share its budget.
const RESERVED: [&str; 6] = ["ip", "h", "hv", "global", "host", "sha256"];

impl<T> ExtensionKey<T> {
    /// Keys by the `T` in the request's extensions, as `prefix:<identity>`.
    ///
    /// # Panics
    ///
    /// When `prefix` is empty, contains `:`, or is one the built-in
    /// extractors use (`ip`, `h`, `hv`, `global`, `host`, `sha256`): an
    /// identity could then pose as another kind of key. That is a mistake
    /// in a literal.
    pub fn new(prefix: &'static str) -> Self {
        assert!(
            !prefix.is_empty() && !prefix.contains(':') && !RESERVED.contains(&prefix),
            "ExtensionKey::new: {prefix:?} cannot be a key prefix: use a name of your \
             own without ':', not one of {RESERVED:?}"
        );
        ExtensionKey {
            prefix,
            hashed: false,
            identity: PhantomData,
        }
    }

    /// Keeps only a digest of the identity, for identities that are
    /// secrets themselves (an API key checked against a list).
    pub fn hashed(mut self) -> Self {
        self.hashed = true;
        self
    }
}

impl<T> Clone for ExtensionKey<T> {
    fn clone(&self) -> Self {
        ExtensionKey { ..*self }
    }
}

impl<T> fmt::Debug for ExtensionKey<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ExtensionKey")
            .field("type", &std::any::type_name::<T>())
            .field("prefix", &self.prefix)
            .field("hashed", &self.hashed)
            .finish()
    }
}

impl<B, T> KeyExtractor<http::Request<B>> for ExtensionKey<T>
where
    T: Display + Send + Sync + 'static,
{
    fn extract(&self, req: &http::Request<B>) -> Option<Key> {
        let identity = req.extensions().get::<T>()?;
        let mut text = String::with_capacity(self.prefix.len() + 24);
        text.push_str(self.prefix);
        text.push(':');
        let start = text.len();
        write!(text, "{identity}").ok()?;
        if text.len() == start {
            return None;
        }
        if self.hashed {
            let (prefix, identity) = text.split_at(start);
            return Some(Key::hashed(prefix, identity.as_bytes()));
        }
        // Past `MAX_KEY_LEN`, `Key::new` keeps a digest of the whole text.
        Some(Key::new(text))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone)]
    struct User(&'static str);

    impl Display for User {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(self.0)
        }
    }

    fn req(user: Option<User>) -> http::Request<()> {
        let mut req = http::Request::new(());
        if let Some(user) = user {
            req.extensions_mut().insert(user);
        }
        req
    }

    #[test]
    fn keys_by_the_extension_or_none() {
        let key = ExtensionKey::<User>::new("user");
        assert_eq!(
            key.extract(&req(Some(User("ann")))).unwrap().text(),
            "user:ann"
        );
        assert_eq!(key.extract(&req(None)), None);
        // An empty identity is no identity.
        assert_eq!(key.extract(&req(Some(User("")))), None);
    }

    #[test]
    fn hashed_identities_hide_the_identity() {
        let key = ExtensionKey::<User>::new("client").hashed();
        let text = key.extract(&req(Some(User("sk_live_1")))).unwrap();
        assert!(text.text().starts_with("client:"));
        assert!(!text.text().contains("sk_live_1"));
        assert_ne!(
            Some(text),
            key.extract(&req(Some(User("sk_live_2")))),
            "two identities, two keys"
        );
    }

    #[test]
    fn an_identity_cannot_pose_as_an_ip_key() {
        let key = ExtensionKey::<User>::new("user");
        let posing = key.extract(&req(Some(User("ip:192.0.2.7")))).unwrap();
        assert_ne!(posing, Key::new("ip:192.0.2.7"));
        let long = key
            .extract(&req(Some(User("x".repeat(500).leak()))))
            .unwrap();
        assert!(long.text().starts_with("sha256:"));
    }

    #[test]
    fn reserved_prefixes_are_refused() {
        for prefix in ["", "ip", "h", "hv", "global", "host", "sha256", "a:b"] {
            let refused = std::panic::catch_unwind(|| ExtensionKey::<User>::new(prefix));
            assert!(refused.is_err(), "{prefix:?}");
        }
    }
}
