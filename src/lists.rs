//! Deny and allow lists: identities and networks that a rate-limit layer
//! refuses outright, or lets through without asking its limiter. Changed
//! through [`LivePolicies`](crate::live::LivePolicies); what one limiter
//! reads is built here, once per change, into maps a request looks up
//! without a lock and without the store.

use std::collections::HashMap;
use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::key::{IpNet, Key, mask32, mask128};

/// Which list an entry is on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum List {
    /// Refused outright, with the layer's
    /// [`deny_status`](crate::RateLimitLayer::deny_status) (403 by
    /// default). A deny entry beats an allow entry.
    Deny,
    /// Let through without asking the limiter: no decision, no state, no
    /// rate-limit headers.
    Allow,
}

impl List {
    /// `deny` or `allow`.
    pub fn as_str(self) -> &'static str {
        match self {
            List::Deny => "deny",
            List::Allow => "allow",
        }
    }
}

/// What a list entry names: one identity, a key as the layer's extractor
/// makes it, or a network, which matches every IP key in it (and every
/// `net:` key of a [`ipv6_prefix`](crate::key::PeerIp::ipv6_prefix)
/// grouping that lies in it).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Listed {
    /// One identity.
    Key(Key),
    /// Every address of a network (IPv4 or IPv6).
    Net(IpNet),
}

impl From<Key> for Listed {
    fn from(key: Key) -> Self {
        Listed::Key(key)
    }
}

impl From<IpNet> for Listed {
    fn from(net: IpNet) -> Self {
        Listed::Net(net)
    }
}

impl fmt::Display for Listed {
    /// The key's text, or the network as `address/prefix`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Listed::Key(key) => f.write_str(&key.text()),
            Listed::Net(net) => net.fmt(f),
        }
    }
}

/// One entry of the fleet's lists, as [`LivePolicies::lists`](crate::live::LivePolicies::lists)
/// reads them.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ListEntry {
    /// The list it is on.
    pub list: List,
    /// The policy it applies to; `None` for every policy.
    pub policy: Option<String>,
    /// The identity or network.
    pub listed: Listed,
    /// When it ends (by the clock of the instance that wrote it); `None`
    /// for never.
    pub expires: Option<SystemTime>,
}

/// What a list says of one key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Refuse it; the entry ends in this long (`None`: never).
    Deny(Option<Duration>),
    /// Let it through unlimited.
    Allow,
}

/// The deny and allow entries in force for one limiter: those for every
/// policy (one value every limiter shares) and its own. Empty by default,
/// so a limiter without lists pays one branch per request.
#[derive(Clone, Debug)]
pub(crate) struct Lists {
    every: Arc<ListSet>,
    own: Arc<ListSet>,
    empty: bool,
}

/// The deny and allow entries of one scope: one policy, or every policy.
#[derive(Debug, Default)]
pub(crate) struct ListSet {
    deny: Entries,
    allow: Entries,
}

/// One list's entries: each with its end in Unix milliseconds (0: never).
#[derive(Debug, Default)]
struct Entries {
    keys: HashMap<Key, u64>,
    /// Networks by prefix length, each as its masked address: a lookup
    /// masks the address once per length in use, however many networks.
    v4: Vec<(u8, HashMap<u32, u64>)>,
    v6: Vec<(u8, HashMap<u128, u64>)>,
}

impl ListSet {
    /// The set of `entries`: (list, what it names, its end in Unix ms or 0).
    pub(crate) fn new(entries: impl IntoIterator<Item = (List, Listed, u64)>) -> Self {
        let mut set = ListSet::default();
        for (list, listed, ends) in entries {
            let entries = match list {
                List::Deny => &mut set.deny,
                List::Allow => &mut set.allow,
            };
            entries.insert(listed, ends);
        }
        set
    }

    fn is_empty(&self) -> bool {
        self.deny.is_empty() && self.allow.is_empty()
    }
}

impl Default for Lists {
    fn default() -> Self {
        Lists::new(Arc::default(), Arc::default())
    }
}

impl Lists {
    /// The lists of a limiter: the entries for `every` policy and its
    /// `own`.
    pub(crate) fn new(every: Arc<ListSet>, own: Arc<ListSet>) -> Self {
        let empty = every.is_empty() && own.is_empty();
        Lists { every, own, empty }
    }

    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.empty
    }

    /// The entries for every policy, one value shared by every limiter.
    #[cfg(test)]
    pub(crate) fn every(&self) -> &Arc<ListSet> {
        &self.every
    }

    /// What the lists say of `key` now: deny first (the latest end of
    /// either scope's entries), then allow. One branch when there are no
    /// entries; the clock is read only when one matches.
    #[inline]
    pub(crate) fn check(&self, key: &Key) -> Option<Verdict> {
        if self.empty {
            return None;
        }
        self.look_up(key)
    }

    fn look_up(&self, key: &Key) -> Option<Verdict> {
        let network = key.network();
        let deny = latest(
            self.every.deny.find(key, network, now_ms),
            self.own.deny.find(key, network, now_ms),
        );
        if let Some(ends) = deny {
            let left = (ends != 0).then(|| Duration::from_millis(ends.saturating_sub(now_ms())));
            return Some(Verdict::Deny(left));
        }
        let allowed = self.every.allow.find(key, network, now_ms).is_some()
            || self.own.allow.find(key, network, now_ms).is_some();
        allowed.then_some(Verdict::Allow)
    }
}

impl Entries {
    fn is_empty(&self) -> bool {
        self.keys.is_empty() && self.v4.is_empty() && self.v6.is_empty()
    }

    fn insert(&mut self, listed: Listed, ends: u64) {
        // Two entries for one target (its own policy's and every
        // policy's): the longer one holds.
        fn keep(slot: &mut u64, ends: u64) {
            *slot = latest(Some(*slot), Some(ends)).unwrap_or(ends);
        }
        match listed {
            Listed::Key(key) => keep(self.keys.entry(key).or_insert(ends), ends),
            Listed::Net(net) => match net.network() {
                (IpAddr::V4(addr), bits) => {
                    let map = by_length(&mut self.v4, bits);
                    keep(map.entry(u32::from(addr)).or_insert(ends), ends);
                }
                (IpAddr::V6(addr), bits) => {
                    let map = by_length(&mut self.v6, bits);
                    keep(map.entry(u128::from(addr)).or_insert(ends), ends);
                }
            },
        }
    }

    /// The latest end (0, never, beats any) of the unexpired entries
    /// matching `key` (whose network, if it is an IP or `net:` key, is
    /// `network`): the key's own and each network's that holds it.
    fn find(&self, key: &Key, network: Option<(IpAddr, u8)>, now: impl Fn() -> u64) -> Option<u64> {
        let mut found = self.keys.get(key).copied();
        match network {
            Some((IpAddr::V4(addr), bits)) => {
                let addr = u32::from(addr);
                for (len, nets) in self.v4.iter().filter(|(len, _)| *len <= bits) {
                    found = latest(found, nets.get(&mask32(addr, *len)).copied());
                }
            }
            Some((IpAddr::V6(addr), bits)) => {
                let addr = u128::from(addr);
                for (len, nets) in self.v6.iter().filter(|(len, _)| *len <= bits) {
                    found = latest(found, nets.get(&mask128(addr, *len)).copied());
                }
            }
            None => {}
        }
        found.filter(|&ends| ends == 0 || ends > now())
    }
}

/// The later of two ends, 0 (never) the latest.
fn latest(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    match (a, b) {
        (Some(0), _) | (_, Some(0)) => Some(0),
        (Some(a), Some(b)) => Some(a.max(b)),
        (a, b) => a.or(b),
    }
}

fn by_length<T>(lengths: &mut Vec<(u8, HashMap<T, u64>)>, bits: u8) -> &mut HashMap<T, u64> {
    let i = match lengths.iter().position(|(len, _)| *len == bits) {
        Some(i) => i,
        None => {
            lengths.push((bits, HashMap::new()));
            lengths.len() - 1
        }
    };
    &mut lengths[i].1
}

/// The system clock in Unix milliseconds: entries end by the wall clock,
/// the one every instance shares.
pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(text: &str) -> Listed {
        Listed::Net(text.parse().unwrap())
    }

    /// Lists of `entries`, all for every policy.
    fn of<const N: usize>(entries: [(List, Listed, u64); N]) -> Lists {
        Lists::new(Arc::new(ListSet::new(entries)), Arc::default())
    }

    #[test]
    fn a_policys_own_entries_and_every_policys_answer_together() {
        let (alice, bob) = (Key::new("user:alice"), Key::new("user:bob"));
        let soon = now_ms() + 60_000;
        let every = Arc::new(ListSet::new([(
            List::Deny,
            Listed::Key(alice.clone()),
            soon,
        )]));
        let own = Arc::new(ListSet::new([
            (List::Deny, Listed::Key(alice.clone()), 0),
            (List::Allow, Listed::Key(bob.clone()), 0),
        ]));
        let both = Lists::new(every.clone(), own);
        assert_eq!(both.check(&alice), Some(Verdict::Deny(None)));
        assert_eq!(both.check(&bob), Some(Verdict::Allow));
        let alone = Lists::new(every, Arc::default());
        assert!(matches!(alone.check(&alice), Some(Verdict::Deny(Some(_)))));
        assert_eq!(alone.check(&bob), None);
        assert!(Lists::new(Arc::default(), Arc::default()).is_empty());
    }

    #[test]
    fn networks_match_the_addresses_in_them() {
        let lists = of([
            (List::Deny, net("203.0.113.0/24"), 0),
            (List::Deny, net("2001:db8::/32"), 0),
            (List::Allow, net("10.0.0.0/8"), 0),
            (List::Allow, net("0.0.0.0/0"), now_ms() - 1),
        ]);
        let ip = |s: &str| Key::from_ip(s.parse().unwrap());
        assert_eq!(lists.check(&ip("203.0.113.200")), Some(Verdict::Deny(None)));
        assert_eq!(lists.check(&ip("2001:db8:1::7")), Some(Verdict::Deny(None)));
        assert_eq!(
            lists.check(&ip("::ffff:203.0.113.9")),
            Some(Verdict::Deny(None))
        );
        assert_eq!(lists.check(&ip("10.9.8.7")), Some(Verdict::Allow));
        // The /0 entry has ended.
        assert_eq!(lists.check(&ip("203.0.114.1")), None);
        assert_eq!(lists.check(&ip("2001:db9::1")), None);
        // A /64 grouping key inside the /32; a /16 one is wider than it.
        assert_eq!(
            lists.check(&Key::new("net:2001:db8:0:1::/64")),
            Some(Verdict::Deny(None))
        );
        assert_eq!(lists.check(&Key::new("net:2001::/16")), None);
        assert_eq!(lists.check(&Key::new("user:203.0.113.1")), None);
    }

    #[test]
    fn deny_beats_allow_and_the_longer_entry_holds() {
        let soon = now_ms() + 60_000;
        let alice = Key::new("user:alice");
        let lists = of([
            (List::Allow, Listed::Key(alice.clone()), 0),
            (List::Deny, Listed::Key(alice.clone()), soon),
            (List::Deny, Listed::Key(alice.clone()), soon - 30_000),
        ]);
        match lists.check(&alice) {
            Some(Verdict::Deny(Some(left))) => {
                assert!(left > Duration::from_secs(50) && left <= Duration::from_secs(60))
            }
            other => panic!("{other:?}"),
        }
        let lists = of([
            (List::Deny, Listed::Key(alice.clone()), soon),
            (List::Deny, Listed::Key(alice.clone()), 0),
        ]);
        assert_eq!(lists.check(&alice), Some(Verdict::Deny(None)));
        // A key's entry and a wider network's: the later end answers,
        // and an ended one hides no live one.
        let ip = Key::from_ip("10.1.2.3".parse().unwrap());
        let lists = of([
            (List::Deny, Listed::Key(ip.clone()), soon),
            (List::Deny, net("10.1.0.0/16"), 0),
        ]);
        assert_eq!(lists.check(&ip), Some(Verdict::Deny(None)));
        let lists = of([
            (List::Deny, Listed::Key(ip.clone()), now_ms() - 1),
            (List::Deny, net("10.0.0.0/8"), soon),
        ]);
        assert!(matches!(lists.check(&ip), Some(Verdict::Deny(Some(_)))));
        assert!(Lists::default().is_empty());
        assert!(!lists.is_empty());
    }

    #[test]
    fn masks_cover_every_length() {
        assert_eq!(mask32(0xffff_ffff, 0), 0);
        assert_eq!(mask32(0xffff_ffff, 8), 0xff00_0000);
        assert_eq!(mask32(0xffff_ffff, 32), 0xffff_ffff);
        assert_eq!(mask128(u128::MAX, 0), 0);
        assert_eq!(mask128(u128::MAX, 128), u128::MAX);
        assert_eq!(mask128(u128::MAX, 1), 1 << 127);
    }
}
