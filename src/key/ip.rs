use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::str::FromStr;
use std::sync::{Arc, Once};

use http::header::{FORWARDED, HeaderMap};

use super::{Key, KeyExtractor};
use crate::error::ConfigError;

/// How many forwarding hops are examined at most; the rest of a longer chain
/// is ignored (and the address at that depth is used).
const MAX_HOPS: usize = 32;

/// The TCP peer's address, read from axum's `ConnectInfo<SocketAddr>` (serve
/// with `into_make_service_with_connect_info::<SocketAddr>()`), axum's
/// `MockConnectInfo<SocketAddr>` in tests, tonic's `TcpConnectInfo` (which
/// tonic's server puts in every call; feature `grpc`), or a plain
/// `SocketAddr` request extension (for hyper or other servers).
pub(crate) fn peer_addr<B>(req: &http::Request<B>) -> Option<IpAddr> {
    #[cfg(feature = "axum")]
    if let Some(info) = req
        .extensions()
        .get::<axum::extract::ConnectInfo<SocketAddr>>()
    {
        return Some(info.0.ip().to_canonical());
    }
    // What `MockConnectInfo` provides in tests of axum apps.
    #[cfg(feature = "axum")]
    if let Some(info) = req
        .extensions()
        .get::<axum::extract::connect_info::MockConnectInfo<SocketAddr>>()
    {
        return Some(info.0.ip().to_canonical());
    }
    #[cfg(feature = "grpc")]
    if let Some(addr) = req
        .extensions()
        .get::<tonic::transport::server::TcpConnectInfo>()
        .and_then(|info| info.remote_addr())
    {
        return Some(addr.ip().to_canonical());
    }
    let peer = req.extensions().get::<SocketAddr>();
    if peer.is_none() {
        warn_no_peer_address();
    }
    peer.map(|addr| addr.ip().to_canonical())
}

/// Says, once per process, how to give [`PeerIp`] and [`ForwardedIp`] the
/// peer's address: without it every request they key is one without a key
/// (by default refused with a 400), which is hard to trace back to the
/// way the server was started.
fn warn_no_peer_address() {
    static WARNED: Once = Once::new();
    WARNED.call_once(|| {
        tracing::warn!(
            "PeerIp found no ConnectInfo: serve the router with \
             into_make_service_with_connect_info::<SocketAddr>() (for tonic, \
             enable fleetgate's `grpc` feature, and over TLS copy the \
             address into the request's extensions: see fleetgate::grpc; \
             elsewhere, put the peer's SocketAddr in the request's \
             extensions)"
        );
    });
}

/// Keys requests by the address of the TCP peer: axum's `ConnectInfo`,
/// tonic's `TcpConnectInfo` (feature `grpc`; over TLS, see the
/// [gRPC guide](crate::grpc#keys-and-methods)) or a `SocketAddr` extension.
///
/// Behind a proxy or load balancer every request comes from the proxy: use
/// [`ForwardedIp`] there.
#[derive(Clone, Copy, Debug, Default)]
pub struct PeerIp;

impl<B> KeyExtractor<http::Request<B>> for PeerIp {
    fn extract(&self, req: &http::Request<B>) -> Option<Key> {
        peer_addr(req).map(Key::from_ip)
    }
}

impl<B> ClientIp<http::Request<B>> for PeerIp {
    fn client_ip(&self, req: &http::Request<B>) -> Option<IpAddr> {
        peer_addr(req)
    }
}

impl PeerIp {
    /// Keys IPv6 clients by their network of `bits` leading bits instead
    /// of their full address (IPv4 clients keep theirs): `64` for one
    /// limit per customer site, since one host commonly has a whole /64
    /// and could otherwise take a fresh address for every request.
    pub fn ipv6_prefix(self, bits: u8) -> IpPrefix<Self> {
        IpPrefix::new(self, bits)
    }
}

/// Finds the client's address in a request; implemented by [`PeerIp`] and
/// [`ForwardedIp`].
pub trait ClientIp<Req>: Send + Sync + 'static {
    /// The client's address, or `None` when the request carries none.
    fn client_ip(&self, req: &Req) -> Option<IpAddr>;
}

/// Keys clients by network rather than by address; see
/// [`PeerIp::ipv6_prefix`] and [`ForwardedIp::ipv6_prefix`].
///
/// ```
/// use fleetgate::key::{KeyExtractor, PeerIp};
/// use std::net::SocketAddr;
///
/// let by_site = PeerIp.ipv6_prefix(64);
/// let mut req = http::Request::new(());
/// req.extensions_mut().insert("[2001:db8:1:2:aaaa::1]:443".parse::<SocketAddr>().unwrap());
/// assert_eq!(by_site.extract(&req).unwrap().text(), "net:2001:db8:1:2::/64");
/// ```
#[derive(Clone, Debug)]
pub struct IpPrefix<E> {
    inner: E,
    v4_bits: u8,
    v6_bits: u8,
}

impl<E> IpPrefix<E> {
    fn new(inner: E, v6_bits: u8) -> Self {
        IpPrefix {
            inner,
            v4_bits: 32,
            v6_bits: v6_bits.min(128),
        }
    }

    /// Also groups IPv4 clients, by networks of `bits` leading bits (such
    /// as `24`).
    pub fn ipv4_prefix(mut self, bits: u8) -> Self {
        self.v4_bits = bits.min(32);
        self
    }
}

impl<Req, E: ClientIp<Req>> KeyExtractor<Req> for IpPrefix<E> {
    fn extract(&self, req: &Req) -> Option<Key> {
        let ip = self.inner.client_ip(req)?;
        let (masked, bits, full) = match ip {
            IpAddr::V4(v4) => (
                IpAddr::from(mask32(u32::from(v4), self.v4_bits).to_be_bytes()),
                self.v4_bits,
                32,
            ),
            IpAddr::V6(v6) => (
                IpAddr::from(mask128(u128::from(v6), self.v6_bits).to_be_bytes()),
                self.v6_bits,
                128,
            ),
        };
        Some(if bits == full {
            Key::from_ip(ip)
        } else {
            Key::new(format!("net:{masked}/{bits}"))
        })
    }
}

/// `addr` with all but its first `bits` bits cleared.
pub(crate) fn mask32(addr: u32, bits: u8) -> u32 {
    addr & u32::MAX
        .checked_shl(32 - u32::from(bits.min(32)))
        .unwrap_or(0)
}

/// As [`mask32`], for IPv6.
pub(crate) fn mask128(addr: u128, bits: u8) -> u128 {
    addr & u128::MAX
        .checked_shl(128 - u32::from(bits.min(128)))
        .unwrap_or(0)
}

/// An IP network such as `10.0.0.0/8` or `2001:db8::/32`; a bare address is
/// a network of one. Host bits are cleared (`10.1.2.3/8` is `10.0.0.0/8`).
/// An IPv4-mapped IPv6 network (`::ffff:10.0.0.0/104`) is the IPv4 network
/// it maps, and an IPv4-mapped address is matched as the IPv4 address it
/// is (the [`ipnet`] crate's network underneath).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct IpNet(ipnet::IpNet);

impl IpNet {
    /// The network of `addr` with `prefix` leading bits.
    pub fn new(addr: IpAddr, prefix: u8) -> Result<Self, ConfigError> {
        let canonical = addr.to_canonical();
        // An IPv4-mapped network is the IPv4 network it maps; a shorter
        // prefix would reach beyond it.
        let mapped = addr.is_ipv6() && canonical.is_ipv4();
        let bits = if mapped {
            prefix.checked_sub(96)
        } else {
            Some(prefix)
        };
        // Host bits cleared: `198.51.100.77/24` is `198.51.100.0/24`, one
        // value however it was written.
        bits.and_then(|bits| ipnet::IpNet::new(canonical, bits).ok())
            .map(|net| IpNet(net.trunc()))
            .ok_or_else(|| ConfigError::InvalidNetwork {
                text: format!("{addr}/{prefix}"),
            })
    }

    /// The network's address (its host bits cleared) and prefix length.
    pub(crate) fn network(&self) -> (IpAddr, u8) {
        (self.0.network(), self.0.prefix_len())
    }

    /// Whether `ip` lies in this network.
    pub fn contains(&self, ip: IpAddr) -> bool {
        self.0.contains(&ip.to_canonical())
    }
}

impl FromStr for IpNet {
    type Err = ConfigError;

    fn from_str(text: &str) -> Result<Self, ConfigError> {
        let invalid = || ConfigError::InvalidNetwork {
            text: text.to_owned(),
        };
        let (addr, prefix) = match text.split_once('/') {
            Some((addr, prefix)) => {
                let addr: IpAddr = addr.trim().parse().map_err(|_| invalid())?;
                let prefix: u8 = prefix.trim().parse().map_err(|_| invalid())?;
                (addr, prefix)
            }
            None => {
                let addr: IpAddr = text.trim().parse().map_err(|_| invalid())?;
                (addr, if addr.is_ipv4() { 32 } else { 128 })
            }
        };
        IpNet::new(addr, prefix).map_err(|_| invalid())
    }
}

impl fmt::Display for IpNet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// Keys requests by the client address that trusted proxies report in
/// `X-Forwarded-For` (default) or, with
/// [`use_forwarded_header`](Self::use_forwarded_header), `Forwarded`
/// (RFC 7239).
///
/// The header is believed only when the TCP peer is one of the configured
/// proxy networks; from anyone else it is ignored and the peer address is
/// used, so a client cannot pick its own key by sending the header. The
/// chain is read from the right, skipping trusted proxies: the first address
/// that is not a trusted proxy is the client. Only the header your proxies
/// write is read: most proxies append to `X-Forwarded-For` and pass a
/// client's own `Forwarded` through untouched, so reading both would let
/// clients choose.
///
/// ```
/// use fleetgate::key::{ForwardedIp, KeyExtractor};
/// use std::net::SocketAddr;
///
/// let client_ip = ForwardedIp::new(["10.0.0.0/8"])?;
/// let mut req = http::Request::get("/")
///     .header("x-forwarded-for", "198.51.100.7, 10.1.2.3")
///     .body(())
///     .unwrap();
/// req.extensions_mut().insert("10.0.0.1:4000".parse::<SocketAddr>().unwrap());
/// assert_eq!(client_ip.extract(&req).unwrap().text(), "ip:198.51.100.7");
/// # Ok::<(), fleetgate::ConfigError>(())
/// ```
#[derive(Clone, Debug)]
pub struct ForwardedIp {
    trusted: Arc<[IpNet]>,
    rfc7239: bool,
}

impl ForwardedIp {
    /// Trusts forwarding headers from these networks (`"10.0.0.0/8"`,
    /// `"127.0.0.1"`, `"fd00::/8"`).
    pub fn new<I, S>(trusted: I) -> Result<Self, ConfigError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let nets = trusted
            .into_iter()
            .map(|s| s.as_ref().parse())
            .collect::<Result<Vec<IpNet>, _>>()?;
        Ok(ForwardedIp::trusting(nets))
    }

    /// Trusts forwarding headers from these networks.
    pub fn trusting(nets: impl IntoIterator<Item = IpNet>) -> Self {
        ForwardedIp {
            trusted: nets.into_iter().collect(),
            rfc7239: false,
        }
    }

    /// Keys IPv6 clients by their network of `bits` leading bits; see
    /// [`PeerIp::ipv6_prefix`].
    pub fn ipv6_prefix(self, bits: u8) -> IpPrefix<Self> {
        IpPrefix::new(self, bits)
    }

    /// Reads the `Forwarded` header (RFC 7239) instead of
    /// `X-Forwarded-For`: for proxies that write `Forwarded: for=...`.
    pub fn use_forwarded_header(mut self) -> Self {
        self.rfc7239 = true;
        self
    }

    fn is_trusted(&self, ip: IpAddr) -> bool {
        self.trusted.iter().any(|net| net.contains(ip))
    }

    /// The client address given the peer and the request headers.
    pub(crate) fn client(&self, peer: IpAddr, headers: &HeaderMap) -> IpAddr {
        if !self.is_trusted(peer) {
            return peer;
        }
        let mut client = peer;
        let forwarded = self.rfc7239;
        let name = if forwarded {
            FORWARDED.as_str()
        } else {
            "x-forwarded-for"
        };
        // Lines in reverse, hops in each line from the right: nearest first.
        // Split raw bytes, so that junk a client put in its part of a line
        // cannot spoil the hops proxies appended after it.
        let hops = headers
            .get_all(name)
            .iter()
            .rev()
            .flat_map(|line| line.as_bytes().rsplit(|&b| b == b','))
            .map(|hop| std::str::from_utf8(hop).unwrap_or("\u{0}"))
            .take(MAX_HOPS);
        for hop in hops {
            let parsed = if forwarded {
                parse_forwarded_for(hop)
            } else {
                parse_hop(hop)
            };
            match parsed {
                // An address we cannot read was written beyond the trust
                // boundary or is obfuscated: the last readable hop stands.
                None => break,
                Some(ip) => {
                    client = ip;
                    if !self.is_trusted(ip) {
                        break;
                    }
                }
            }
        }
        client
    }
}

impl<B> KeyExtractor<http::Request<B>> for ForwardedIp {
    fn extract(&self, req: &http::Request<B>) -> Option<Key> {
        self.client_ip(req).map(Key::from_ip)
    }
}

impl<B> ClientIp<http::Request<B>> for ForwardedIp {
    fn client_ip(&self, req: &http::Request<B>) -> Option<IpAddr> {
        let peer = peer_addr(req)?;
        Some(self.client(peer, req.headers()))
    }
}

/// One `X-Forwarded-For` hop: an address, possibly with a port.
fn parse_hop(hop: &str) -> Option<IpAddr> {
    let hop = hop.trim().trim_matches('"');
    if let Ok(ip) = hop.parse::<IpAddr>() {
        return Some(ip.to_canonical());
    }
    if let Ok(addr) = hop.parse::<SocketAddr>() {
        return Some(addr.ip().to_canonical());
    }
    hop.strip_prefix('[')
        .and_then(|rest| rest.split_once(']'))
        .and_then(|(ip, _)| ip.parse::<IpAddr>().ok())
        .map(|ip| ip.to_canonical())
}

/// The `for=` parameter of one `Forwarded` element.
fn parse_forwarded_for(element: &str) -> Option<IpAddr> {
    element.split(';').find_map(|pair| {
        let (name, value) = pair.trim().split_once('=')?;
        if name.trim().eq_ignore_ascii_case("for") {
            parse_hop(value)
        } else {
            None
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(
                http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
                value.parse().unwrap(),
            );
        }
        map
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn networks() {
        let net: IpNet = "10.0.0.0/8".parse().unwrap();
        assert!(net.contains(ip("10.200.1.1")));
        assert!(!net.contains(ip("11.0.0.1")));
        assert!(net.contains(ip("::ffff:10.0.0.1")));
        let v6: IpNet = "2001:db8::/32".parse().unwrap();
        assert!(v6.contains(ip("2001:db8:1::1")));
        assert!(!v6.contains(ip("10.0.0.1")));
        let all: IpNet = "0.0.0.0/0".parse().unwrap();
        assert!(all.contains(ip("8.8.8.8")));
        assert!("10.0.0.0/33".parse::<IpNet>().is_err());
        assert!("nonsense".parse::<IpNet>().is_err());
    }

    #[test]
    fn spoofed_headers_from_untrusted_peers_are_ignored() {
        let fwd = ForwardedIp::new(["10.0.0.0/8"]).unwrap();
        let h = headers(&[("x-forwarded-for", "1.2.3.4")]);
        assert_eq!(fwd.client(ip("203.0.113.9"), &h), ip("203.0.113.9"));
    }

    #[test]
    fn chain_is_read_from_the_right() {
        let fwd = ForwardedIp::new(["10.0.0.0/8"]).unwrap();
        // The client put a fake address first; the proxy appended the real one.
        let h = headers(&[("x-forwarded-for", "6.6.6.6, 198.51.100.1, 10.0.0.2")]);
        assert_eq!(fwd.client(ip("10.0.0.1"), &h), ip("198.51.100.1"));
        let h = headers(&[
            ("x-forwarded-for", "6.6.6.6"),
            ("x-forwarded-for", "198.51.100.1:5555"),
        ]);
        assert_eq!(fwd.client(ip("10.0.0.1"), &h), ip("198.51.100.1"));
        let h = headers(&[("x-forwarded-for", "garbage, 10.0.0.3")]);
        assert_eq!(fwd.client(ip("10.0.0.1"), &h), ip("10.0.0.3"));
    }

    #[test]
    fn forwarded_header() {
        let fwd = ForwardedIp::new(["10.0.0.0/8"])
            .unwrap()
            .use_forwarded_header();
        let h = headers(&[(
            "forwarded",
            "for=1.1.1.1, for=\"[2001:db8:cafe::17]:4711\";proto=https, for=10.0.0.9",
        )]);
        assert_eq!(fwd.client(ip("10.0.0.1"), &h), ip("2001:db8:cafe::17"));
        let h = headers(&[("forwarded", "for=_hidden"), ("x-forwarded-for", "1.1.1.1")]);
        assert_eq!(fwd.client(ip("10.0.0.1"), &h), ip("10.0.0.1"));
    }

    #[test]
    fn only_the_configured_header_is_read() {
        // The proxy appends to X-Forwarded-For; the client's own Forwarded
        // header must not choose the key.
        let xff = ForwardedIp::new(["10.0.0.0/8"]).unwrap();
        let h = headers(&[
            ("forwarded", "for=1.1.1.1"),
            ("x-forwarded-for", "203.0.113.5"),
        ]);
        assert_eq!(xff.client(ip("10.0.0.1"), &h), ip("203.0.113.5"));
        let rfc = xff.clone().use_forwarded_header();
        let h = headers(&[
            ("x-forwarded-for", "6.6.6.6"),
            ("forwarded", "for=203.0.113.5"),
        ]);
        assert_eq!(rfc.client(ip("10.0.0.1"), &h), ip("203.0.113.5"));
    }

    #[test]
    fn junk_before_the_proxy_hop_is_ignored() {
        let fwd = ForwardedIp::new(["10.0.0.0/8"]).unwrap();
        let mut h = HeaderMap::new();
        h.insert(
            "x-forwarded-for",
            http::HeaderValue::from_bytes(b"\xff\xfe, 203.0.113.5").unwrap(),
        );
        assert_eq!(fwd.client(ip("10.0.0.1"), &h), ip("203.0.113.5"));
        // A huge chain of trusted hops costs at most MAX_HOPS parses.
        let long = vec!["10.0.0.7"; 10_000].join(",");
        let h = headers(&[("x-forwarded-for", &long)]);
        assert_eq!(fwd.client(ip("10.0.0.1"), &h), ip("10.0.0.7"));
    }

    #[test]
    fn an_unreadable_hop_ends_the_walk() {
        let fwd = ForwardedIp::new(["10.0.0.0/8"]).unwrap();
        // The address beyond the junk cannot be vouched for by anyone.
        let h = headers(&[("x-forwarded-for", "1.1.1.1, garbage, 10.0.0.3")]);
        assert_eq!(fwd.client(ip("10.0.0.1"), &h), ip("10.0.0.3"));
        let rfc = fwd.use_forwarded_header();
        let h = headers(&[("forwarded", "for=1.1.1.1, for=unknown, for=10.0.0.3")]);
        assert_eq!(rfc.client(ip("10.0.0.1"), &h), ip("10.0.0.3"));
    }

    #[test]
    fn at_most_max_hops_are_read() {
        let fwd = ForwardedIp::new(["10.0.0.0/8"]).unwrap();
        let chain = |trusted: usize| {
            let mut hops = vec!["203.0.113.5"];
            hops.extend(std::iter::repeat_n("10.0.0.7", trusted));
            headers(&[("x-forwarded-for", &hops.join(", "))])
        };
        // The client is the MAX_HOPS-th hop from the right: found.
        let h = chain(MAX_HOPS - 1);
        assert_eq!(fwd.client(ip("10.0.0.1"), &h), ip("203.0.113.5"));
        // One proxy more and the walk stops at the last hop it read.
        let h = chain(MAX_HOPS);
        assert_eq!(fwd.client(ip("10.0.0.1"), &h), ip("10.0.0.7"));
    }

    #[test]
    fn prefixes_group_clients() {
        let req = |addr: &str| {
            let mut req = http::Request::new(());
            req.extensions_mut()
                .insert(addr.parse::<SocketAddr>().unwrap());
            req
        };
        let by64 = PeerIp.ipv6_prefix(64);
        let a = by64.extract(&req("[2001:db8::1]:1")).unwrap();
        let b = by64.extract(&req("[2001:db8::ffff:2]:1")).unwrap();
        let c = by64.extract(&req("[2001:db8:0:1::1]:1")).unwrap();
        assert_eq!(a, b);
        assert_ne!(a, c);
        // IPv4 keeps full addresses unless asked, and then groups too.
        assert_eq!(
            by64.extract(&req("192.0.2.7:1")).unwrap().text(),
            "ip:192.0.2.7"
        );
        let by24 = PeerIp.ipv6_prefix(64).ipv4_prefix(24);
        assert_eq!(
            by24.extract(&req("192.0.2.7:1")).unwrap().text(),
            "net:192.0.2.0/24"
        );
        let all = PeerIp.ipv6_prefix(0);
        assert_eq!(
            all.extract(&req("[2001:db8::1]:1")).unwrap().text(),
            "net:::/0"
        );
    }

    #[test]
    fn mapped_networks_cannot_widen() {
        assert!("::ffff:0:0/8".parse::<IpNet>().is_err());
        let net: IpNet = "::ffff:10.0.0.0/104".parse().unwrap();
        assert!(net.contains(ip("10.1.2.3")));
        assert!(!net.contains(ip("11.1.2.3")));
    }
}
