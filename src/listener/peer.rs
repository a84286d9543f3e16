//! What is known about the sender of a request before any header is believed.
//! [`Peer`] is worked out once, when the connection is accepted: the
//! peer, TLS or not, the listener, whether the peer is a trusted proxy. Each
//! request then derives its [`Client`] from it and its own forwarding headers.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use http::{HeaderMap, HeaderName, HeaderValue};
use ipnet::IpNet;

pub static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
pub static X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");

/// One accepted connection, as every request on it sees it.
#[derive(Debug, Clone)]
pub struct Peer {
    pub peer: SocketAddr,
    /// TLS was terminated here.
    pub tls: bool,
    /// Listener name, for metrics: "https", "http" or "admin".
    pub listener: &'static str,
    /// The peer is one of the configured trusted proxies.
    pub trusted: bool,
    /// The peer's address as an `X-Forwarded-For` value, formatted once.
    peer_header: HeaderValue,
    /// Proxied requests in flight on this connection and from its address.
    load: Arc<Load>,
}

/// Proxied requests in flight: on one connection, and from its client
/// address over all of that address's connections (the counter the
/// per-address connection cap hands out, shared by them).
#[derive(Debug, Default)]
struct Load {
    connection: AtomicUsize,
    address: Arc<AtomicUsize>,
    /// Bytes held by request bodies being read whole on this connection
    /// ([`Peer::buffering`]).
    buffering: AtomicU64,
}

/// One proxied request counted in flight on its connection and address;
/// dropping it (when the upstream exchange ends) gives both places back.
#[derive(Debug)]
pub struct InFlight(Arc<Load>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.connection.fetch_sub(1, Ordering::Relaxed);
        self.0.address.fetch_sub(1, Ordering::Relaxed);
    }
}

/// What one body being read whole holds of its connection's budget
/// ([`Peer::buffering`]); dropping it gives all of it back.
#[derive(Debug)]
pub struct Buffering<'p> {
    held: &'p AtomicU64,
    taken: u64,
    budget: u64,
}

impl Buffering<'_> {
    /// Takes `bytes` more; `false`, taking nothing, when the connection's
    /// bodies would then hold more than its budget.
    pub(crate) fn take(&mut self, bytes: u64) -> bool {
        let budget = self.budget;
        let taken = self
            .held
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |held| {
                held.checked_add(bytes).filter(|&total| total <= budget)
            })
            .is_ok();
        if taken {
            self.taken += bytes;
        }
        taken
    }
}

impl Drop for Buffering<'_> {
    fn drop(&mut self) {
        self.held.fetch_sub(self.taken, Ordering::Relaxed);
    }
}

/// Which bound a request in flight would pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Crowded {
    Connection,
    Address,
}

impl Peer {
    /// The context of a connection accepted from `peer`; the only place the
    /// trusted-proxy list is matched against the peer.
    pub fn accept(
        peer: SocketAddr,
        tls: bool,
        listener: &'static str,
        trusted_proxies: &[IpNet],
    ) -> Peer {
        let ip = peer.ip();
        Peer {
            peer,
            tls,
            listener,
            trusted: is_trusted(trusted_proxies, &ip),
            peer_header: HeaderValue::from_str(&ip.to_string()).expect("an IP address is ASCII"),
            load: Arc::default(),
        }
    }

    /// Counts this connection's proxied requests also in `address`, the
    /// in-flight counter of its client address.
    pub(crate) fn sharing_address_load(mut self, address: Arc<AtomicUsize>) -> Peer {
        self.load = Arc::new(Load {
            connection: AtomicUsize::new(0),
            address,
            buffering: AtomicU64::new(0),
        });
        self
    }

    /// Counts one more proxied request in flight, unless this connection
    /// already has `per_connection` or its address `per_address`.
    pub(crate) fn start_proxied(
        &self,
        per_connection: usize,
        per_address: usize,
    ) -> Result<InFlight, Crowded> {
        let load = &self.load;
        if load.connection.fetch_add(1, Ordering::Relaxed) >= per_connection {
            load.connection.fetch_sub(1, Ordering::Relaxed);
            return Err(Crowded::Connection);
        }
        if load.address.fetch_add(1, Ordering::Relaxed) >= per_address {
            load.address.fetch_sub(1, Ordering::Relaxed);
            load.connection.fetch_sub(1, Ordering::Relaxed);
            return Err(Crowded::Address);
        }
        Ok(InFlight(load.clone()))
    }

    /// A share of this connection's `budget` of bytes held by request
    /// bodies being read whole (the proxy's request buffering), taken as
    /// they arrive and given back when the share is dropped.
    pub(crate) fn buffering(&self, budget: u64) -> Buffering<'_> {
        Buffering {
            held: &self.load.buffering,
            taken: 0,
            budget,
        }
    }

    /// The client address the connection alone tells: the peer's.
    pub fn address(&self) -> IpAddr {
        self.peer.ip()
    }

    /// The peer's address as an `X-Forwarded-For` value.
    pub(crate) fn peer_header(&self) -> &HeaderValue {
        &self.peer_header
    }

    /// What one request on this connection tells about its sender.
    pub fn client<'c>(&'c self, headers: &HeaderMap) -> Client<'c> {
        let secure = self.tls
            || (self.trusted
                && headers
                    .get(&X_FORWARDED_PROTO)
                    .is_some_and(|v| v == "https"));
        Client { conn: self, secure }
    }
}

/// Who sent a request, as far as the connection and a trusted proxy tell;
/// worked out once per request.
#[derive(Debug, Clone, Copy)]
pub struct Client<'c> {
    pub conn: &'c Peer,
    /// The request reached keygate over HTTPS: TLS here, or a trusted proxy
    /// that reports `X-Forwarded-Proto: https`.
    pub secure: bool,
}

impl Client<'_> {
    pub fn trusted(&self) -> bool {
        self.conn.trusted
    }

    /// What the in-clear rule knows of this request's sender.
    pub fn sender(&self) -> crate::auth::in_clear::Sender {
        crate::auth::in_clear::Sender {
            secure: self.secure,
            trusted: self.conn.trusted,
            loopback: self.conn.peer.ip().is_loopback(),
        }
    }

    /// May this request carry a password or a token?
    /// ([`crate::auth::in_clear::Sender::may_send_secrets`]).
    pub(crate) fn may_send_secrets(&self, allow_plaintext: bool) -> bool {
        self.sender().may_send_secrets(allow_plaintext)
    }

    /// The real client address: the peer, or, behind trusted proxies, the
    /// right-most `X-Forwarded-For` entry that is not itself a trusted proxy
    /// (the left-most entry when all are). One pass over the header, no copy.
    pub fn address(&self, headers: &HeaderMap, trusted_proxies: &[IpNet]) -> IpAddr {
        let peer = self.conn.address();
        if !self.conn.trusted {
            return peer;
        }
        let mut first = None;
        let mut last_untrusted = None;
        let entries = headers
            .get_all(&X_FORWARDED_FOR)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .filter_map(|entry| entry.trim().parse::<IpAddr>().ok());
        for ip in entries {
            first.get_or_insert(ip);
            if !is_trusted(trusted_proxies, &ip) {
                last_untrusted = Some(ip);
            }
        }
        last_untrusted.or(first).unwrap_or(peer)
    }
}

fn is_trusted(trusted_proxies: &[IpNet], ip: &IpAddr) -> bool {
    trusted_proxies.iter().any(|net| net.contains(ip))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(
                HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_str(value).unwrap(),
            );
        }
        map
    }

    #[test]
    fn bodies_read_whole_on_one_connection_hold_no_more_than_its_budget() {
        let conn = Peer::accept("192.0.2.1:5555".parse().unwrap(), true, "https", &[]);
        let mut first = conn.buffering(100);
        let mut second = conn.buffering(100);
        assert!(first.take(60));
        assert!(!second.take(41), "over the budget: nothing taken");
        assert!(second.take(40), "what is left of it");
        assert!(!first.take(1));
        drop(first);
        let mut third = conn.buffering(100);
        assert!(third.take(60), "a body read whole gives its share back");
        assert!(!third.take(1));
        // Another connection has a budget of its own.
        let other = Peer::accept("192.0.2.1:5556".parse().unwrap(), true, "https", &[]);
        assert!(other.buffering(100).take(100));
    }

    #[test]
    fn forwarded_client_address_is_believed_only_from_a_trusted_proxy() {
        let proxies: Vec<IpNet> = vec!["10.0.0.0/8".parse().unwrap()];
        let sent = headers(&[
            ("x-forwarded-for", "198.51.100.7, 203.0.113.9"),
            ("x-forwarded-for", "10.0.0.5"),
            ("x-forwarded-proto", "https"),
        ]);
        let proxy = Peer::accept("10.1.2.3:5555".parse().unwrap(), false, "http", &proxies);
        let client = proxy.client(&sent);
        assert!(client.trusted() && client.secure);
        assert_eq!(
            client.address(&sent, &proxies),
            "203.0.113.9".parse::<IpAddr>().unwrap()
        );
        let all_proxies = headers(&[("x-forwarded-for", "10.0.0.9, garbage, 10.0.0.5")]);
        assert_eq!(
            proxy.client(&all_proxies).address(&all_proxies, &proxies),
            "10.0.0.9".parse::<IpAddr>().unwrap()
        );

        let stranger = Peer::accept("192.0.2.1:4444".parse().unwrap(), false, "http", &proxies);
        let client = stranger.client(&sent);
        assert!(!client.trusted() && !client.secure);
        assert_eq!(
            client.address(&sent, &proxies),
            "192.0.2.1".parse::<IpAddr>().unwrap()
        );
        assert_eq!(stranger.peer_header(), "192.0.2.1");
    }

    #[test]
    fn proxied_requests_in_flight_are_bounded_per_connection_and_per_address() {
        let address = Arc::new(AtomicUsize::new(0));
        let accept = || {
            Peer::accept("192.0.2.1:4444".parse().unwrap(), true, "https", &[])
                .sharing_address_load(address.clone())
        };
        let (one, two) = (accept(), accept());
        let a = one.start_proxied(2, 3).unwrap();
        let _b = one.start_proxied(2, 3).unwrap();
        assert_eq!(one.start_proxied(2, 3).unwrap_err(), Crowded::Connection);
        let _c = two.start_proxied(2, 3).unwrap();
        assert_eq!(two.start_proxied(2, 3).unwrap_err(), Crowded::Address);
        assert_eq!(address.load(Ordering::Relaxed), 3, "refusals give back");
        drop(a);
        assert!(
            two.start_proxied(2, 3).is_ok(),
            "a finished request frees both"
        );
    }
}
