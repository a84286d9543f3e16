//! The per-client-address connection cap, counted over every listener, so one
//! address cannot take the whole connection limit.
//!
//! An untrusted peer counts under its address key ([`AddressKey`]: IPv4
//! alone, IPv6 per `limits.ipv6_prefix_len`, /64 by default), the same key
//! every other per-address limit counts by. A configured trusted proxy counts
//! by its exact address against its own cap, or no cap of its own: a load
//! balancer carries many clients on one address.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex, MutexGuard};

use ipnet::IpNet;

use crate::address::AddressKey;

pub struct AddressCap {
    limit: usize,
    /// `None`: trusted proxies are not capped here (only `max_connections`).
    trusted_limit: Option<usize>,
    trusted: Vec<IpNet>,
    /// Bits of an IPv6 address that make its key.
    ipv6_prefix_len: u8,
    /// Open connections per address key; an entry lives while it has one.
    open: Mutex<HashMap<AddressKey, Entry>>,
}

/// One address key's open connections, and its proxied requests in flight
/// (shared by those connections, see [`super::peer::Peer::start_proxied`]).
#[derive(Default)]
struct Entry {
    connections: usize,
    in_flight: Arc<AtomicUsize>,
}

/// One admitted connection; dropping it gives the place back.
pub struct Slot {
    cap: Arc<AddressCap>,
    key: Option<AddressKey>,
    /// The in-flight counter of the connection's address; one of its own
    /// for a trusted proxy, which carries many clients.
    in_flight: Arc<AtomicUsize>,
}

impl Slot {
    /// The proxied requests in flight from this connection's address.
    pub fn in_flight(&self) -> Arc<AtomicUsize> {
        self.in_flight.clone()
    }
}

impl AddressCap {
    pub fn new(
        limit: usize,
        trusted_limit: Option<usize>,
        trusted: Vec<IpNet>,
        ipv6_prefix_len: u8,
    ) -> AddressCap {
        AddressCap {
            limit,
            trusted_limit,
            trusted,
            ipv6_prefix_len,
            open: Mutex::new(HashMap::new()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<AddressKey, Entry>> {
        self.open
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Admits one more connection from `peer`, or `None` when its address
    /// already holds its cap.
    pub fn admit(self: &Arc<Self>, peer: IpAddr) -> Option<Slot> {
        let peer = peer.to_canonical();
        let (key, limit) = if self.trusted.iter().any(|net| net.contains(&peer)) {
            match self.trusted_limit {
                // Exactly this proxy: every bit of its address.
                Some(limit) => (AddressKey::of(peer, 128), limit),
                None => {
                    return Some(Slot {
                        cap: self.clone(),
                        key: None,
                        in_flight: Arc::default(),
                    });
                }
            }
        } else {
            (self.key_of(peer), self.limit)
        };
        let mut open = self.lock();
        let entry = open.entry(key).or_default();
        if entry.connections >= limit {
            return None;
        }
        entry.connections += 1;
        Some(Slot {
            cap: self.clone(),
            key: Some(key),
            in_flight: entry.in_flight.clone(),
        })
    }

    /// Connections open for the address key of `peer` (for tests and logs).
    pub fn open_for(&self, peer: IpAddr) -> usize {
        self.lock()
            .get(&self.key_of(peer))
            .map_or(0, |entry| entry.connections)
    }

    /// The address an untrusted peer is counted under.
    fn key_of(&self, peer: IpAddr) -> AddressKey {
        AddressKey::of(peer, self.ipv6_prefix_len)
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let Some(key) = self.key else { return };
        let mut open = self.cap.lock();
        if let Some(entry) = open.get_mut(&key) {
            entry.connections -= 1;
            if entry.connections == 0 {
                open.remove(&key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    #[test]
    fn an_address_over_its_cap_is_refused_until_a_connection_closes() {
        let cap = Arc::new(AddressCap::new(2, None, vec![], 64));
        let a = cap.admit(ip("192.0.2.1")).unwrap();
        let _b = cap.admit(ip("192.0.2.1")).unwrap();
        assert!(cap.admit(ip("192.0.2.1")).is_none());
        assert!(
            cap.admit(ip("192.0.2.2")).is_some(),
            "other addresses unaffected"
        );
        drop(a);
        assert!(cap.admit(ip("192.0.2.1")).is_some());
    }

    #[test]
    fn ipv6_addresses_count_per_64_and_mapped_ipv4_as_ipv4() {
        let cap = Arc::new(AddressCap::new(1, None, vec![], 64));
        let _a = cap.admit(ip("2001:db8:1:2::1")).unwrap();
        assert!(cap.admit(ip("2001:db8:1:2:ffff::9")).is_none());
        assert!(cap.admit(ip("2001:db8:1:3::1")).is_some());
        let _v4 = cap.admit(ip("192.0.2.7")).unwrap();
        assert!(cap.admit(ip("::ffff:192.0.2.7")).is_none());
    }

    #[test]
    fn the_ipv6_prefix_length_is_the_configured_one() {
        let cap = Arc::new(AddressCap::new(1, None, vec![], 48));
        let _a = cap.admit(ip("2001:db8:1:2::1")).unwrap();
        assert!(cap.admit(ip("2001:db8:1:ffff::1")).is_none());
        assert!(cap.admit(ip("2001:db8:2::1")).is_some());
    }

    #[test]
    fn trusted_proxies_have_their_own_cap_or_none() {
        let trusted = vec!["10.0.0.0/8".parse().unwrap()];
        let uncapped = Arc::new(AddressCap::new(1, None, trusted.clone(), 64));
        let slots: Vec<_> = (0..10)
            .map(|_| uncapped.admit(ip("10.1.2.3")).unwrap())
            .collect();
        assert_eq!(uncapped.open_for(ip("10.1.2.3")), 0, "not counted");
        drop(slots);
        let capped = Arc::new(AddressCap::new(1, Some(3), trusted, 64));
        let _slots: Vec<_> = (0..3)
            .map(|_| capped.admit(ip("10.1.2.3")).unwrap())
            .collect();
        assert!(capped.admit(ip("10.1.2.3")).is_none());
        assert!(
            capped.admit(ip("10.1.2.4")).is_some(),
            "each proxy counts alone"
        );
    }

    #[test]
    fn connections_of_one_address_share_its_in_flight_counter() {
        let cap = Arc::new(AddressCap::new(4, None, vec![], 64));
        let a = cap.admit(ip("192.0.2.1")).unwrap();
        let b = cap.admit(ip("192.0.2.1")).unwrap();
        let other = cap.admit(ip("192.0.2.2")).unwrap();
        assert!(Arc::ptr_eq(&a.in_flight(), &b.in_flight()));
        assert!(!Arc::ptr_eq(&a.in_flight(), &other.in_flight()));
    }

    #[test]
    fn entries_are_removed_when_their_last_connection_closes() {
        let cap = Arc::new(AddressCap::new(4, None, vec![], 64));
        let slot = cap.admit(ip("192.0.2.1")).unwrap();
        assert_eq!(cap.open_for(ip("192.0.2.1")), 1);
        drop(slot);
        assert!(cap.lock().is_empty());
    }
}
