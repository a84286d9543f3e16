//! Hop-by-hop removal (RFC 9110 section 7.6.1) and the forwarding headers.

use http::header::{CONNECTION, HOST, TE, TRAILER, TRANSFER_ENCODING, UPGRADE};
use http::{HeaderMap, HeaderName, HeaderValue};

use crate::listener::Transport;

pub static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
pub static X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
pub static X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");
pub static X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");
static FORWARDED: HeaderName = HeaderName::from_static("forwarded");
static KEEP_ALIVE: HeaderName = HeaderName::from_static("keep-alive");
static PROXY_CONNECTION: HeaderName = HeaderName::from_static("proxy-connection");
static PROXY_AUTHENTICATE: HeaderName = HeaderName::from_static("proxy-authenticate");
static PROXY_AUTHORIZATION: HeaderName = HeaderName::from_static("proxy-authorization");

/// Removes the connection-specific headers and every header the `Connection`
/// header names. Runs before identity injection, so a client cannot name an
/// identity header away.
pub fn remove_hop_by_hop(headers: &mut HeaderMap) {
    if headers.contains_key(&CONNECTION) {
        let named: Vec<HeaderName> = headers
            .get_all(&CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
            .collect();
        for name in named {
            headers.remove(&name);
        }
    }
    for name in [
        &CONNECTION,
        &KEEP_ALIVE,
        &PROXY_CONNECTION,
        &PROXY_AUTHENTICATE,
        &PROXY_AUTHORIZATION,
        &TE,
        &TRAILER,
        &TRANSFER_ENCODING,
        &UPGRADE,
    ] {
        headers.remove(name);
    }
}

/// The request id: kept when a trusted proxy sent a sane one, generated otherwise.
pub fn request_id(headers: &HeaderMap, trusted: bool) -> HeaderValue {
    if trusted {
        if let Some(value) = headers.get(&X_REQUEST_ID) {
            let bytes = value.as_bytes();
            if !bytes.is_empty() && bytes.len() <= 128 && bytes.iter().all(|b| b.is_ascii_graphic())
            {
                return value.clone();
            }
        }
    }
    let id = uuid::Uuid::new_v4();
    let mut buf = [0u8; uuid::fmt::Hyphenated::LENGTH];
    HeaderValue::from_bytes(id.hyphenated().encode_lower(&mut buf).as_bytes())
        .expect("uuid is ASCII")
}

/// Sets `X-Forwarded-*` and `X-Request-Id`. What a trusted proxy sent is kept
/// (and the chain extended); from anyone else it is replaced.
pub fn set_forwarding(
    headers: &mut HeaderMap,
    transport: &Transport,
    trusted: bool,
    authority: Option<&str>,
    request_id: HeaderValue,
) {
    let peer_ip = transport.peer.ip().to_string();
    let forwarded_for = match headers.get(&X_FORWARDED_FOR).and_then(|v| v.to_str().ok()) {
        Some(chain) if trusted && !chain.trim().is_empty() => format!("{chain}, {peer_ip}"),
        _ => peer_ip,
    };
    if let Ok(value) = HeaderValue::from_str(&forwarded_for) {
        headers.insert(X_FORWARDED_FOR.clone(), value);
    }
    let proto_ok = trusted
        && headers
            .get(&X_FORWARDED_PROTO)
            .is_some_and(|v| v == "https" || v == "http");
    if !proto_ok {
        let proto = if transport.tls { "https" } else { "http" };
        headers.insert(X_FORWARDED_PROTO.clone(), HeaderValue::from_static(proto));
    }
    if !(trusted && headers.contains_key(&X_FORWARDED_HOST)) {
        let host = headers
            .get(&HOST)
            .cloned()
            .or_else(|| authority.and_then(|a| HeaderValue::from_str(a).ok()));
        match host {
            Some(host) => {
                headers.insert(X_FORWARDED_HOST.clone(), host);
            }
            None => {
                headers.remove(&X_FORWARDED_HOST);
            }
        }
    }
    if !trusted {
        headers.remove(&FORWARDED);
    }
    headers.insert(X_REQUEST_ID.clone(), request_id);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::listener::Transport;

    fn transport(tls: bool) -> Transport {
        Transport {
            tls,
            peer: "10.1.2.3:5555".parse().unwrap(),
            listener: "https",
        }
    }

    #[test]
    fn connection_named_headers_and_hop_by_hop_are_removed() {
        let mut headers = HeaderMap::new();
        headers.insert(
            CONNECTION,
            HeaderValue::from_static("keep-alive, X-Custom, x-auth-user-id"),
        );
        headers.insert("x-custom", HeaderValue::from_static("1"));
        headers.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        headers.insert(TE, HeaderValue::from_static("trailers"));
        headers.insert("proxy-authorization", HeaderValue::from_static("Basic x"));
        headers.insert("accept", HeaderValue::from_static("*/*"));
        remove_hop_by_hop(&mut headers);
        assert_eq!(headers.len(), 1);
        assert!(headers.contains_key("accept"));
    }

    #[test]
    fn forwarding_headers_from_untrusted_clients_are_replaced() {
        let mut headers = HeaderMap::new();
        headers.insert(&X_FORWARDED_FOR, HeaderValue::from_static("1.1.1.1"));
        headers.insert(&X_FORWARDED_PROTO, HeaderValue::from_static("https"));
        headers.insert(&X_FORWARDED_HOST, HeaderValue::from_static("evil"));
        headers.insert(HOST, HeaderValue::from_static("gw.example:8080"));
        headers.insert("forwarded", HeaderValue::from_static("for=1.1.1.1"));
        let id = request_id(&headers, false);
        set_forwarding(&mut headers, &transport(false), false, None, id);
        assert_eq!(headers[&X_FORWARDED_FOR], "10.1.2.3");
        assert_eq!(headers[&X_FORWARDED_PROTO], "http");
        assert_eq!(headers[&X_FORWARDED_HOST], "gw.example:8080");
        assert!(!headers.contains_key("forwarded"));
        assert_eq!(headers[&X_REQUEST_ID].len(), 36);
    }

    #[test]
    fn forwarding_headers_from_trusted_proxies_are_kept_and_extended() {
        let mut headers = HeaderMap::new();
        headers.insert(&X_FORWARDED_FOR, HeaderValue::from_static("203.0.113.9"));
        headers.insert(&X_FORWARDED_PROTO, HeaderValue::from_static("https"));
        headers.insert(&X_FORWARDED_HOST, HeaderValue::from_static("api.example"));
        headers.insert(&X_REQUEST_ID, HeaderValue::from_static("req-123"));
        let id = request_id(&headers, true);
        assert_eq!(id, "req-123");
        set_forwarding(&mut headers, &transport(false), true, None, id);
        assert_eq!(headers[&X_FORWARDED_FOR], "203.0.113.9, 10.1.2.3");
        assert_eq!(headers[&X_FORWARDED_PROTO], "https");
        assert_eq!(headers[&X_FORWARDED_HOST], "api.example");
        assert_eq!(headers[&X_REQUEST_ID], "req-123");
    }
}
