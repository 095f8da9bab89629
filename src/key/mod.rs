//! Who is this? Key extractors turn a request into the identity a limit is
//! kept for.
//!
//! | extractor | key | when missing |
//! |---|---|---|
//! | [`PeerIp`] | the TCP peer's address (axum `ConnectInfo`); `.ipv6_prefix(64)` groups IPv6 clients by /64 | server not started with connect info |
//! | [`ForwardedIp`] | the client address from `X-Forwarded-For` / `Forwarded`, trusted only from configured proxies | never (falls back to the peer) unless the peer is missing |
//! | [`ExtensionKey`] | an identity your authentication layer put in the request's extensions | no such extension |
//! | [`HeaderKey`] | a header such as `x-api-key` or a bearer token, hashed: **any value a client sends** | header absent or empty |
//! | [`GlobalKey`] | one key for everyone | never |
//! | [`HostKey`] | the host a client request goes to (`host:api.example.com`) | no URI authority and no `Host` header |
//! | [`key_fn`] | whatever your closure returns | closure returns `None` |
//!
//! Chain extractors with `.or(...)`: `ExtensionKey::<Account>::new("account").or(PeerIp)`
//! limits per verified account and falls back to the client address.
//!
//! **A key a client can choose is a budget a client can multiply.**
//! `HeaderKey::new("x-api-key").or(PeerIp)` gives every made-up API key a
//! budget of its own, so one address sending a new key per call is never
//! limited. Use it only behind a layer that refuses unknown keys, or key by
//! what that layer verified with [`ExtensionKey`], falling back to the
//! client IP: then unauthenticated traffic, invented keys included, shares
//! one budget per address (see [`ExtensionKey`] for the pattern).

mod compose;
mod extension;
mod header;
mod host;
mod ip;
mod text;

use std::fmt::{self, Write as _};
use std::hash::{Hash, Hasher};
use std::net::IpAddr;
use std::sync::Arc;

use sha2::{Digest, Sha256};
use smol_str::SmolStr;

pub use self::compose::key_fn;
use self::compose::{KeyFn, Or};
pub use self::extension::ExtensionKey;
pub use self::header::HeaderKey;
pub use self::host::HostKey;
use self::ip::IpPrefix;
pub use self::ip::{ForwardedIp, IpNet, PeerIp};
pub(crate) use self::ip::{mask32, mask128};
use self::text::{KeyText, StackText, TextRepr};

/// Keys longer than this are replaced by their SHA-256 digest, so that one
/// client cannot make the store hold arbitrarily large keys.
pub(crate) const MAX_KEY_LEN: usize = 128;

/// An identity to limit: an IP, a hashed API key, a user id.
///
/// Cheap to clone, and made without allocating when it is an IP key or a
/// text of at most 23 bytes; longer texts (such as the 34-byte `h:` keys of
/// hashed headers) share one allocation among their clones. An IP key ([`Key::from_ip`]) is kept as
/// the address's bytes and written out as text (`ip:203.0.113.7`,
/// `ip:2001:db8::7`) only when asked for ([`text`](Self::text), `Display`,
/// the Redis store): a request keyed by its peer's address costs no
/// formatting. It is the same key, equal and with the same text, as
/// `Key::new("ip:203.0.113.7")`.
///
/// The built-in extractors give their keys
/// distinct prefixes (`ip:` addresses, `h:` hashed headers, `hv:`
/// unhashed headers, `global`) so that they never collide. Keys you make yourself (with [`key_fn`] or
/// [`OnMissingKey::Fallback`](crate::OnMissingKey::Fallback)) are used as
/// given: give them a prefix of your own, such as `tenant:`, and never pass
/// raw client input through unprefixed, or a client could send `ip:<victim>`
/// and share a victim's limit.
#[derive(Clone, PartialEq, Eq)]
pub struct Key(Repr);

/// A key's one representation: an IP key is always `V4` or `V6` (text
/// that spells one, `ip:` and the address as std writes it, is read into
/// it), so that equal keys are equal representations and derived equality
/// is the keys' own.
#[derive(Clone, PartialEq, Eq)]
enum Repr {
    Text(SmolStr),
    V4([u8; 4]),
    V6([u8; 16]),
}

impl Key {
    /// A key from text. Text longer than 128 bytes is replaced by
    /// its digest (`sha256:…`).
    pub fn new(text: impl AsRef<str>) -> Self {
        let text = text.as_ref();
        if text.len() > MAX_KEY_LEN {
            Key::digest("sha256:", text.as_bytes())
        } else if let Some(ip) = ip_key_address(text) {
            Key::from_ip(ip)
        } else {
            Key(Repr::Text(SmolStr::new(text)))
        }
    }

    /// A key from a secret (an API key, a token): only a digest of it is
    /// kept, so the secret never reaches the store or the logs.
    pub fn hashed(prefix: &str, secret: &[u8]) -> Self {
        Key::digest(prefix, secret)
    }

    /// A key for an IP address (`ip:203.0.113.7`).
    #[inline]
    pub fn from_ip(ip: IpAddr) -> Self {
        match ip {
            IpAddr::V4(v4) => Key(Repr::V4(v4.octets())),
            IpAddr::V6(v6) => Key(Repr::V6(v6.octets())),
        }
    }

    /// The key as text: borrowed from the key, or for an IP key written
    /// on the stack. Dereferences to `&str`.
    ///
    /// ```
    /// use fleetgate::key::Key;
    ///
    /// let key = Key::from_ip("203.0.113.7".parse().unwrap());
    /// assert_eq!(key.text(), "ip:203.0.113.7");
    /// assert!(key.text().starts_with("ip:"));
    /// assert_eq!(key, Key::new("ip:203.0.113.7"));
    /// ```
    pub fn text(&self) -> KeyText<'_> {
        let mut text = StackText::default();
        // Every write fits: `ip:` and at most 45 bytes of address.
        match &self.0 {
            Repr::Text(text) => return KeyText(TextRepr::Borrowed(text)),
            // As std writes it (`ip:203.0.113.7`), without its formatting
            // machinery, which takes several times as long.
            Repr::V4(octets) => {
                let mut digits = itoa::Buffer::new();
                let _ = text.write_str("ip:");
                for (i, octet) in octets.iter().enumerate() {
                    if i > 0 {
                        let _ = text.write_str(".");
                    }
                    let _ = text.write_str(digits.format(*octet));
                }
            }
            Repr::V6(octets) => {
                let _ = write!(text, "ip:{}", std::net::Ipv6Addr::from(*octets));
            }
        }
        KeyText(TextRepr::Written(text))
    }

    /// The bytes the memory store hashes a key by: its text, or an IP
    /// key's address bytes. A text of the same bytes (`"abcd"` and
    /// 97.98.99.100) hashes alike, always: the store tells such keys apart
    /// by comparing them whole, as any two keys in one bucket.
    #[inline]
    pub(crate) fn hash_bytes(&self) -> &[u8] {
        match &self.0 {
            Repr::Text(text) => text.as_bytes(),
            Repr::V4(octets) => octets,
            Repr::V6(octets) => octets,
        }
    }

    /// The network this key names, for deny and allow lists: an IP key's
    /// address (all its bits), or the network of a `net:` key made by
    /// grouping addresses ([`PeerIp::ipv6_prefix`]).
    pub(crate) fn network(&self) -> Option<(IpAddr, u8)> {
        match &self.0 {
            Repr::V4(octets) => Some((IpAddr::from(*octets), 32)),
            // An IPv4-mapped address is in the IPv4 networks.
            Repr::V6(octets) => Some(match std::net::Ipv6Addr::from(*octets).to_ipv4_mapped() {
                Some(v4) => (IpAddr::V4(v4), 32),
                None => (IpAddr::from(*octets), 128),
            }),
            Repr::Text(text) => {
                let (addr, bits) = text.strip_prefix("net:")?.split_once('/')?;
                let addr: IpAddr = addr.parse().ok()?;
                let bits: u8 = bits.parse().ok()?;
                let max = if addr.is_ipv4() { 32 } else { 128 };
                (bits <= max).then_some((addr, bits))
            }
        }
    }

    fn digest(prefix: &str, bytes: &[u8]) -> Self {
        let digest = Sha256::digest(bytes);
        // 128 bits are plenty against collisions and keep keys short.
        let mut text = String::with_capacity(prefix.len() + 32);
        text.push_str(prefix);
        push_hex(&mut text, &digest[..16]);
        Key(Repr::Text(SmolStr::from(text)))
    }
}

/// The address of an IP key's text, `ip:` and the address exactly as
/// std writes it (no leading zeros, no spaces, IPv6 compressed and in
/// lower case): text that [`Key::from_ip`] of that address would give.
fn ip_key_address(text: &str) -> Option<IpAddr> {
    let ip = text.strip_prefix("ip:")?.parse::<IpAddr>().ok()?;
    (Key::from_ip(ip).text() == text).then_some(ip)
}

/// Appends `bytes` to `out` as lowercase hex.
pub(crate) fn push_hex(out: &mut String, bytes: &[u8]) {
    for byte in bytes {
        out.push(hex_digit(byte >> 4));
        out.push(hex_digit(byte & 0xf));
    }
}

fn hex_digit(nibble: u8) -> char {
    char::from_digit(u32::from(nibble), 16).unwrap_or('0')
}

/// A key hashes as its text or, for an IP key, its address bytes, with a
/// terminating `0xff` as a `str` has (a text key hashes as its text):
/// equal keys are equal representations, so they hash alike.
impl Hash for Key {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write(self.hash_bytes());
        state.write_u8(0xff);
    }
}

/// Keys order as their texts.
impl PartialOrd for Key {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Key {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (*self.text()).cmp(&*other.text())
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.text(), f)
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text())
    }
}

impl From<&str> for Key {
    fn from(text: &str) -> Self {
        Key::new(text)
    }
}

impl From<String> for Key {
    fn from(text: String) -> Self {
        Key::new(text)
    }
}

/// Turns a request into a [`Key`], or `None` when it carries none.
pub trait KeyExtractor<Req>: Send + Sync + 'static {
    /// The key for `req`, or `None` when no key can be found.
    fn extract(&self, req: &Req) -> Option<Key>;
}

impl<Req, K: KeyExtractor<Req> + ?Sized> KeyExtractor<Req> for Arc<K> {
    fn extract(&self, req: &Req) -> Option<Key> {
        (**self).extract(req)
    }
}

/// Adds `.or(other)` to a key extractor type: use `self`, or `other` when
/// `self` finds no key.
macro_rules! chainable {
    ($([$($gen:tt)*] $ty:ty),* $(,)?) => {$(
        impl<$($gen)*> $ty {
            /// Uses this extractor, or `other` when this one finds no key:
            /// `HeaderKey::new("x-api-key").or(PeerIp)`.
            pub fn or<O>(self, other: O) -> Or<Self, O> {
                Or { first: self, second: other }
            }
        }
    )*};
}

chainable!(
    [] HeaderKey,
    [] PeerIp,
    [] ForwardedIp,
    [] GlobalKey,
    [F] KeyFn<F>,
    [E] IpPrefix<E>,
    [A, B] Or<A, B>,
    [] HostKey,
    [T] ExtensionKey<T>,
);

/// One key for every request: a limit on the whole service.
#[derive(Clone, Debug)]
pub struct GlobalKey(Key);

impl GlobalKey {
    /// A global key named `global`.
    pub fn new() -> Self {
        GlobalKey(Key::new("global"))
    }

    /// A global key with its own name, for several global limits.
    pub fn named(name: &str) -> Self {
        GlobalKey(Key::new(format!("global:{name}")))
    }
}

impl Default for GlobalKey {
    fn default() -> Self {
        GlobalKey::new()
    }
}

impl<Req> KeyExtractor<Req> for GlobalKey {
    fn extract(&self, _req: &Req) -> Option<Key> {
        Some(self.0.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ip_keys_are_the_address_text() {
        for text in [
            "203.0.113.7",
            "0.0.0.0",
            "10.99.100.255",
            "255.255.255.255",
            "1.22.9.100",
            "127.0.0.1",
            "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
            "::ffff:255.255.255.255",
        ] {
            let ip: IpAddr = text.parse().unwrap();
            assert_eq!(Key::from_ip(ip).text(), format!("ip:{text}"));
        }
    }

    /// Every octet value, in every position, as std writes it.
    #[test]
    fn ipv4_keys_match_std_for_every_octet() {
        for octet in 0..=255u8 {
            for position in 0..4 {
                let mut octets = [1, 20, 255, 7];
                octets[position] = octet;
                let ip = IpAddr::from(octets);
                assert_eq!(Key::from_ip(ip).text(), format!("ip:{ip}"));
            }
        }
    }

    /// An IPv4 key is one key however it was made, from the address or
    /// from its text, equal and hashed alike; text that only resembles
    /// it stays text of its own.
    #[test]
    fn ipv4_keys_from_text_or_address_are_one_key() {
        use std::hash::{BuildHasher, RandomState};
        let hasher = RandomState::new();
        let ip: IpAddr = "192.0.2.7".parse().unwrap();
        let (a, b) = (Key::from_ip(ip), Key::new("ip:192.0.2.7"));
        assert_eq!(a, b);
        assert!(matches!(b.0, Repr::V4([192, 0, 2, 7])));
        assert_eq!(hasher.hash_one(&a), hasher.hash_one(&b));
        for other in [
            "ip:192.0.2.07",
            "ip:192.0.2.7 ",
            "ip: 192.0.2.7",
            "IP:192.0.2.7",
            "ip:192.0.2",
            "ip:192.0.2.256",
            "ip:2001:DB8::7",
            "ip:2001:db8:0::7",
            "ip:[2001:db8::7]",
            // std writes these in hex, and parses no zone.
            "ip:::1.2.3.4",
            "ip:2001:db8::192.0.2.7",
            "ip:fe80::1%eth0",
            "192.0.2.7",
        ] {
            let key = Key::new(other);
            assert_ne!(key, a, "{other}");
            assert_eq!(key.text(), other);
            assert!(matches!(key.0, Repr::Text(_)), "{other}");
        }
        // IPv6 likewise, an IPv4-mapped address included (a different
        // key from the IPv4 address: `PeerIp` maps it first).
        for text in ["2001:db8::7", "::ffff:192.0.2.7", "::", "fe80::1"] {
            let ip: IpAddr = text.parse().unwrap();
            let (a, b) = (Key::from_ip(ip), Key::new(format!("ip:{text}")));
            assert_eq!(a, b);
            assert!(matches!(b.0, Repr::V6(_)), "{text}");
            assert_eq!(hasher.hash_one(&a), hasher.hash_one(&b));
            assert_eq!(b.text(), format!("ip:{text}"));
        }
        assert_ne!(Key::new("ip:::ffff:192.0.2.7"), Key::new("ip:192.0.2.7"));
    }

    /// Keys order as their texts do, whichever way they are kept.
    #[test]
    fn keys_order_as_their_text() {
        let mut keys = [
            "ip:9.0.0.1",
            "ip:10.0.0.1",
            "h:ab",
            "ip:10.0.0.1x",
            "ip:1.2.3.4",
            "ip:10.0.0.10",
            "ip:2001:db8::7",
            "ip:::1",
            "ip:::ffff:10.0.0.1",
        ]
        .map(Key::new);
        keys.sort();
        let texts: Vec<String> = keys.iter().map(Key::to_string).collect();
        let mut sorted = texts.clone();
        sorted.sort();
        assert_eq!(texts, sorted);
    }

    /// A key stays three words (the memory store keeps one per entry,
    /// and the response future one per call when it needs it).
    #[test]
    fn a_key_is_three_words() {
        assert_eq!(std::mem::size_of::<Key>(), 24);
    }

    #[test]
    fn long_keys_are_digested() {
        let long = "x".repeat(1000);
        let key = Key::new(&long);
        assert!(key.text().starts_with("sha256:"));
        assert_eq!(key.text().len(), 7 + 32);
        assert_eq!(key, Key::new(&long));
    }

    #[test]
    fn hashed_keys_hide_the_secret() {
        let key = Key::hashed("h:", b"sk_live_secret");
        assert!(!key.text().contains("secret"));
        assert_eq!(key.text().len(), 2 + 32);
    }
}
