//! The client's address key: the unit every per-address limit counts by
//! (the password-attempt and activation windows, their Redis keys, the
//! unknown-API-key budget and the connection cap). [`AddressKey::of`] is the
//! one place that decides it.
//!
//! An IPv4 address is its own key, and so is the IPv4 address inside an
//! IPv4-mapped IPv6 address (`::ffff:192.0.2.7`). An IPv6 address counts by
//! its first `limits.ipv6_prefix_len` bits (default 64, the block one
//! subscriber or host is normally given): otherwise one host could start a
//! fresh budget from each of its 2^64 addresses.

use std::net::{IpAddr, Ipv6Addr};

/// `limits.ipv6_prefix_len` unless configured.
pub const DEFAULT_IPV6_PREFIX_LEN: u8 = 64;

/// What a per-address limit counts by: an IPv4 address, or an IPv6 network.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AddressKey {
    network: IpAddr,
    /// 32 for IPv4; the prefix length for IPv6.
    prefix_len: u8,
}

impl AddressKey {
    /// The key `ip` counts under, IPv6 grouped by `ipv6_prefix_len` bits
    /// (1 to 128; validated with the configuration, clamped here).
    pub fn of(ip: IpAddr, ipv6_prefix_len: u8) -> AddressKey {
        match ip.to_canonical() {
            IpAddr::V4(v4) => AddressKey {
                network: IpAddr::V4(v4),
                prefix_len: 32,
            },
            IpAddr::V6(v6) => {
                let prefix_len = ipv6_prefix_len.clamp(1, 128);
                let mask = u128::MAX << (128 - u32::from(prefix_len));
                AddressKey {
                    network: IpAddr::V6(Ipv6Addr::from(u128::from(v6) & mask)),
                    prefix_len,
                }
            }
        }
    }

    /// The first address of the key's network (the address itself for IPv4).
    pub fn network(&self) -> IpAddr {
        self.network
    }
}

/// `192.0.2.7` or `2001:db8:1:2::/64`: in logs and Redis keys.
impl std::fmt::Display for AddressKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.network {
            IpAddr::V4(v4) => write!(f, "{v4}"),
            IpAddr::V6(v6) => write!(f, "{v6}/{}", self.prefix_len),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(text: &str, len: u8) -> AddressKey {
        AddressKey::of(text.parse().unwrap(), len)
    }

    #[test]
    fn ipv4_counts_alone_and_mapped_ipv6_reads_as_ipv4() {
        assert_eq!(key("192.0.2.7", 64), key("::ffff:192.0.2.7", 64));
        assert_ne!(key("192.0.2.7", 64), key("192.0.2.8", 64));
        assert_eq!(key("::ffff:192.0.2.7", 64).to_string(), "192.0.2.7");
    }

    #[test]
    fn ipv6_addresses_of_one_prefix_share_a_key() {
        let one = key("2001:db8:1:2::1", 64);
        assert_eq!(one, key("2001:db8:1:2:ffff:ffff:ffff:ffff", 64));
        assert_ne!(one, key("2001:db8:1:3::1", 64));
        assert_eq!(one.to_string(), "2001:db8:1:2::/64");
        assert_eq!(key("2001:db8:1:2::1", 48), key("2001:db8:1:ffff::1", 48));
        assert_ne!(key("2001:db8:1:2::1", 128), key("2001:db8:1:2::2", 128));
        assert_eq!(key("2001:db8::1", 1).to_string(), "::/1");
    }

    #[test]
    fn an_out_of_range_prefix_is_clamped() {
        assert_eq!(key("2001:db8::1", 0), key("2001:db8::1", 1));
        assert_eq!(key("2001:db8::1", 200), key("2001:db8::1", 128));
    }
}
