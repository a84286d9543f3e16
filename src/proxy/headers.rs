//! Every header edit between a client and an upstream, each direction in one
//! function: [`to_upstream`] and [`to_client`]. Hop-by-hop removal follows
//! RFC 9110 section 7.6.1.

use http::header::{CONNECTION, HOST, TE, TRAILER, TRANSFER_ENCODING, UPGRADE};
use http::{HeaderMap, HeaderName, HeaderValue};
use smallvec::SmallVec;

use crate::http1::connection;
use crate::identity::{self, Identity, Passport};
use crate::listener::peer::Client;

pub use crate::listener::peer::{X_FORWARDED_FOR, X_FORWARDED_PROTO};
pub static X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");
pub static X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");
static KEEP_ALIVE: HeaderName = HeaderName::from_static("keep-alive");
static PROXY_CONNECTION: HeaderName = HeaderName::from_static("proxy-connection");
static PROXY_AUTHENTICATE: HeaderName = HeaderName::from_static("proxy-authenticate");
static PROXY_AUTHORIZATION: HeaderName = HeaderName::from_static("proxy-authorization");

/// The connection-specific headers (RFC 9110 section 7.6.1), besides those
/// the `Connection` header names.
fn is_hop_by_hop(name: &HeaderName) -> bool {
    HOP_BY_HOP.contains(&name)
}

static HOP_BY_HOP: [&HeaderName; 9] = [
    &CONNECTION,
    &KEEP_ALIVE,
    &PROXY_CONNECTION,
    &PROXY_AUTHENTICATE,
    &PROXY_AUTHORIZATION,
    &TE,
    &TRAILER,
    &TRANSFER_ENCODING,
    &UPGRADE,
];

/// Headers some frameworks read as the request's method in place of the
/// one on the request line (Rails, Spring's `HiddenHttpMethodFilter`
/// variants, Express's `method-override`, ASP.NET). Passed on, a `GET` that
/// keygate checked (a GET-only key's) could delete at such an upstream.
/// Removed on every route, in any spelling [`identity::folded_eq`] folds.
pub const METHOD_OVERRIDE: [&str; 3] = [
    "x-http-method-override",
    "x-http-method",
    "x-method-override",
];

/// Is `name` one of [`METHOD_OVERRIDE`]? Answered from its first byte and
/// length for every other name but a few (`x-` names of those lengths).
pub(crate) fn is_method_override(name: &HeaderName) -> bool {
    let bytes = name.as_str().as_bytes();
    bytes.first() == Some(&b'x')
        && matches!(bytes.len(), 13 | 17 | 22)
        && METHOD_OVERRIDE
            .iter()
            .any(|known| identity::folded_eq(bytes, known.as_bytes()))
}

pub use crate::identity::folds_to_framing;

/// Refuses (400, the contract's shape) a request with a header whose name
/// folds to a framing or hop-by-hop name ([`folds_to_framing`]). The one
/// rule for every driver: hyper's (HTTP/2, and HTTP/1.1 it serves) runs it
/// on admission, for every target, WebSocket upgrades included; the lean
/// HTTP/1.1 path leaves such a request to hyper's, which refuses it.
pub fn refuse_folded_framing(headers: &HeaderMap) -> Result<(), crate::error::ApiError> {
    match headers.keys().find(|name| folds_to_framing(name)) {
        None => Ok(()),
        Some(name) => Err(crate::error::ApiError::bad_request(format!(
            "Invalid header name '{name}': it reads as a message framing header where '_' or \
             another separator is read as '-'"
        ))),
    }
}

/// Is a name a `Connection` header lists one [`is_hop_by_hop`] already
/// picks? Those are gathered by the pass over the headers present, so a
/// second removal by text (a parse, a hash and a probe) is skipped: most
/// clients send `Connection: keep-alive` (criterion `headers/to_upstream`,
/// `headers/to_client`; BENCHMARKS.md, "Choices in the code").
fn listed_is_hop_by_hop(listed: &str) -> bool {
    HOP_BY_HOP
        .iter()
        .any(|name| name.as_str().eq_ignore_ascii_case(listed))
}

/// Removes the headers `doomed` picks and, when there is a `Connection`
/// header, every header it names. [`to_upstream`] runs it before setting
/// anything, so a client cannot name an identity header away. One pass over
/// the headers present, and a removal only for a header present: a remove
/// costs a hash and a probe whether or not the header is there, and most
/// requests carry none of the nine hop-by-hop headers (BENCHMARKS.md, "Choices in the code"). The names a `Connection` header lists are removed by their
/// text, which looks them up without building (and allocating) a name.
///
/// What is removed is gathered on the stack (it spills to the heap past
/// four): two vectors were two allocations and frees on almost every
/// request, most of which carry a `Connection` header and a credential.
fn remove_where(headers: &mut HeaderMap, doomed: impl Fn(&HeaderName) -> bool) {
    let mut listed: SmallVec<[HeaderValue; 2]> = SmallVec::new();
    let mut named: SmallVec<[HeaderName; 4]> = SmallVec::new();
    for (name, value) in headers.iter() {
        if name == CONNECTION {
            listed.push(value.clone());
        }
        if doomed(name) {
            named.push(name.clone());
        }
    }
    for value in &listed {
        // A value that is not visible ASCII names nothing.
        let Ok(text) = value.to_str() else { continue };
        for name in connection::tokens(text.as_bytes()) {
            // A piece of visible ASCII cut at a comma: UTF-8.
            let name = std::str::from_utf8(name).unwrap_or_default();
            if !listed_is_hop_by_hop(name) {
                headers.remove(name);
            }
        }
    }
    for name in named {
        headers.remove(&name);
    }
}

/// The request id: kept when a trusted proxy sent a sane one, generated otherwise.
pub fn request_id(headers: &HeaderMap, trusted: bool) -> HeaderValue {
    if trusted && let Some(value) = headers.get(&X_REQUEST_ID) {
        let bytes = value.as_bytes();
        if !bytes.is_empty() && bytes.len() <= 128 && bytes.iter().all(|b| b.is_ascii_graphic()) {
            return value.clone();
        }
    }
    let id = fast_v4();
    let mut buf = [0u8; uuid::fmt::Hyphenated::LENGTH];
    HeaderValue::from_bytes(id.hyphenated().encode_lower(&mut buf).as_bytes())
        .expect("uuid is ASCII")
}

/// A version 4 UUID without a system call. `Uuid::new_v4` asks the kernel
/// (`getrandom`) on every call: one of the five system calls of a proxied
/// request (criterion `headers/request_id`, BENCHMARKS.md, "Choices in the code").
/// Here each thread seeds a SipHash key once (std's `RandomState`, from the
/// system's random source) and hashes a counter: distinct per thread and
/// counter, and without the key not predictable from earlier ids. Request
/// ids correlate log lines; they are not secrets.
fn fast_v4() -> uuid::Uuid {
    use std::cell::Cell;
    use std::hash::BuildHasher;
    thread_local! {
        static IDS: (std::collections::hash_map::RandomState, Cell<u64>) =
            (std::collections::hash_map::RandomState::new(), Cell::new(0));
    }
    IDS.with(|(key, counter)| {
        let n = counter.get();
        counter.set(n.wrapping_add(1));
        let high = key.hash_one((n, 0u8)).to_le_bytes();
        let low = key.hash_one((n, 1u8)).to_le_bytes();
        let mut bytes = [0u8; 16];
        bytes[..8].copy_from_slice(&high);
        bytes[8..].copy_from_slice(&low);
        uuid::Builder::from_random_bytes(bytes).into_uuid()
    })
}

/// Headers that tell an upstream about the client, scheme, host, port or
/// original URL, beyond every `X-Forwarded-*` (matched as a prefix). From an
/// untrusted peer all of them are removed before keygate sets its own; from a
/// trusted proxy they pass. Names are compared lower-cased with every
/// non-alphanumeric separator read as `-`, as CGI-style servers fold them.
pub const FORWARDING_PREFIX: &str = "x-forwarded-";
pub const FORWARDING: &[&str] = &[
    "forwarded",
    "x-real-ip",
    "true-client-ip",
    "x-client-ip",
    "client-ip",
    "x-cluster-client-ip",
    "cf-connecting-ip",
    "fastly-client-ip",
    "x-proxyuser-ip",
    "x-original-forwarded-for",
    "x-original-url",
    "x-original-uri",
    "x-original-host",
    "x-original-proto",
    "x-rewrite-url",
    "x-host",
    "x-http-host-override",
    "x-url-scheme",
    "front-end-https",
    "x-arr-ssl",
    "via",
];

/// Is `name` one of the forwarding headers ([`FORWARDING`] or `X-Forwarded-*`)?
///
/// A name whose first byte starts none of them is answered at once: it
/// would otherwise be folded and compared against 22 spellings, and most
/// headers a client sends (`accept`, `host`, `user-agent`) start with a
/// letter none of them does. The first byte of a `HeaderName` is lower case,
/// and a separator folds to `-`, which starts no forwarding name, so the
/// filter agrees with the folded comparison.
pub(crate) fn is_forwarding(name: &HeaderName) -> bool {
    let bytes = name.as_str().as_bytes();
    let Some(&first) = bytes.first() else {
        return false;
    };
    if !FORWARDING_FIRST_BYTES[first as usize] {
        return false;
    }
    identity::folded_starts_with(bytes, FORWARDING_PREFIX.as_bytes())
        || FORWARDING
            .iter()
            .any(|known| identity::folded_eq(bytes, known.as_bytes()))
}

/// The first bytes of the forwarding names, computed from the list itself.
static FORWARDING_FIRST_BYTES: [bool; 256] = {
    let mut set = [false; 256];
    set[FORWARDING_PREFIX.as_bytes()[0] as usize] = true;
    let mut i = 0;
    while i < FORWARDING.len() {
        set[FORWARDING[i].as_bytes()[0] as usize] = true;
        i += 1;
    }
    set
};

/// [`to_upstream`] for a WebSocket upgrade. The handshake keygate makes
/// sets the upstream's `Host` (from its URI) and its own `Sec-WebSocket-*`,
/// so the client's are removed as well.
pub(crate) fn to_websocket_upstream(
    parts: &mut http::request::Parts,
    client: &Client<'_>,
    request_id: HeaderValue,
    identity: Option<&Identity>,
    passport: Option<&Passport>,
) {
    let added = to_upstream(parts, client, request_id, identity, passport);
    parts.headers.remove(http::header::HOST);
    let handshake: Vec<HeaderName> = parts
        .headers
        .keys()
        .filter(|name| name.as_str().starts_with("sec-websocket-"))
        .cloned()
        .collect();
    for name in handshake {
        parts.headers.remove(name);
    }
    added.append_to(&mut parts.headers);
}

/// Every edit of a request on its way upstream, in this order: hop-by-hop
/// headers out (so a `Connection` header can never name away what is set
/// later); the client's identity, credential, request id and (from an
/// untrusted peer) forwarding headers out; then what keygate sets, returned
/// as [`Added`]: its forwarding headers and request id, the verified
/// identity, and the route's passport (an assertion or the platform's
/// token), if it has one. `Host` stays for the caller to replace with the
/// upstream's (one insert over an existing entry, where a removal here and an
/// insert there cost two lookups): the proxy sets it per upstream tried, the
/// WebSocket handshake from its URI.
pub fn to_upstream(
    parts: &mut http::request::Parts,
    client: &Client<'_>,
    request_id: HeaderValue,
    identity: Option<&Identity>,
    passport: Option<&Passport>,
) -> Added {
    let headers = &mut parts.headers;
    let trusted = client.trusted();
    remove_where(headers, |name| {
        is_hop_by_hop(name)
            || identity::is_reserved(name)
            || identity::is_credential(name)
            || name == X_REQUEST_ID
            || is_method_override(name)
            || (!trusted && is_forwarding(name))
    });
    let mut added = forwarding(headers, client, parts.uri.authority().map(|a| a.as_str()));
    added.request_id = Some(request_id);
    added.identity = identity.cloned();
    added.passport = passport.cloned();
    added
}

/// The headers keygate sets on a request on its way upstream, kept beside
/// the client's header map rather than inserted into it. Every name here was
/// removed from that map first ([`to_upstream`]), so they go out after the
/// client's headers, in [`Added::each`]'s order: the wire client writes them
/// straight into the request head, and hyper's client gets them appended to
/// the map ([`Added::append_to`]). Inserting them into the map, hashing each
/// name, was 5,300 of the 52,000 instructions of a proxied request under
/// callgrind (BENCHMARKS.md, "Instructions per request").
#[derive(Debug, Clone, Default)]
pub struct Added {
    forwarded_for: Option<HeaderValue>,
    forwarded_proto: Option<HeaderValue>,
    forwarded_host: Option<HeaderValue>,
    request_id: Option<HeaderValue>,
    identity: Option<Identity>,
    passport: Option<Passport>,
}

impl Added {
    /// Each header, in the order it is sent.
    pub fn each(&self, mut header: impl FnMut(&HeaderName, &HeaderValue)) {
        let forwarding = [
            (&X_FORWARDED_FOR, &self.forwarded_for),
            (&X_FORWARDED_PROTO, &self.forwarded_proto),
            (&X_FORWARDED_HOST, &self.forwarded_host),
            (&X_REQUEST_ID, &self.request_id),
        ];
        for (name, value) in forwarding {
            if let Some(value) = value {
                header(name, value);
            }
        }
        if let Some(identity) = &self.identity {
            identity.each_header(&mut header);
        }
        if let Some(passport) = &self.passport {
            header(passport.name, &passport.value);
        }
    }

    /// Appends them to `headers`, after what is there.
    pub fn append_to(&self, headers: &mut HeaderMap) {
        self.each(|name, value| {
            headers.append(name.clone(), value.clone());
        });
    }
}

/// Every edit of an upstream response on its way to the client.
pub fn to_client(headers: &mut HeaderMap, pass_server_header: bool) {
    if headers.contains_key(TRANSFER_ENCODING) {
        // RFC 9112 6.3 rule 3: the body was framed by its transfer coding,
        // which is hop-by-hop; a `Content-Length` beside it is no length of
        // the body the client gets, and passed on it would let the upstream
        // end the client's response where it likes (response splitting).
        headers.remove(http::header::CONTENT_LENGTH);
    }
    remove_where(headers, is_hop_by_hop);
    if !pass_server_header {
        headers.remove(http::header::SERVER);
    }
}

/// `X-Forwarded-For`, `-Proto` and `-Host` for the request. What a trusted
/// proxy sent is kept (and the chain extended, taken out of the map to be
/// sent last); from anyone else the headers were removed, and are set from
/// the connection.
fn forwarding(headers: &mut HeaderMap, client: &Client<'_>, authority: Option<&str>) -> Added {
    let trusted = client.trusted();
    let mut added = Added::default();
    // The chain a trusted proxy sent is extended as text, not parsed. From
    // anyone else the header is gone already: no lookup.
    let chain = if trusted {
        headers.remove(&X_FORWARDED_FOR)
    } else {
        None
    };
    added.forwarded_for = match chain.as_ref().and_then(|v| v.to_str().ok()) {
        Some(chain) if !chain.trim().is_empty() => {
            HeaderValue::from_str(&format!("{chain}, {}", client.conn.address())).ok()
        }
        _ => Some(client.conn.peer_header().clone()),
    };
    let proto_ok = trusted
        && headers
            .get(&X_FORWARDED_PROTO)
            .is_some_and(|v| v == "https" || v == "http");
    if !proto_ok {
        if trusted {
            headers.remove(&X_FORWARDED_PROTO);
        }
        let proto = if client.conn.tls { "https" } else { "http" };
        added.forwarded_proto = Some(HeaderValue::from_static(proto));
    }
    if !(trusted && headers.contains_key(&X_FORWARDED_HOST)) {
        added.forwarded_host = headers
            .get(&HOST)
            .cloned()
            .or_else(|| authority.and_then(|a| HeaderValue::from_str(a).ok()));
    }
    added
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::listener::peer::Peer;

    fn conn(tls: bool, trusted: bool) -> Peer {
        let proxies: Vec<ipnet::IpNet> = if trusted {
            vec!["10.0.0.0/8".parse().unwrap()]
        } else {
            vec![]
        };
        Peer::accept("10.1.2.3:5555".parse().unwrap(), tls, "https", &proxies)
    }

    fn client(conn: &Peer) -> Client<'_> {
        Client {
            conn,
            secure: conn.tls,
        }
    }

    fn parts(pairs: &[(&str, &str)]) -> http::request::Parts {
        let mut builder = http::Request::builder().uri("/api/x");
        for (name, value) in pairs {
            builder = builder.header(*name, *value);
        }
        builder.body(()).unwrap().into_parts().0
    }

    #[test]
    fn generated_request_ids_are_distinct_version_4_uuids_on_every_thread() {
        let ids = |n| -> Vec<String> {
            (0..n)
                .map(|_| {
                    let value = request_id(&HeaderMap::new(), false);
                    value.to_str().unwrap().to_owned()
                })
                .collect()
        };
        let mut all = ids(10_000);
        let other = std::thread::spawn(move || ids(10_000)).join().unwrap();
        all.extend(other);
        for id in &all {
            let parsed = uuid::Uuid::parse_str(id).unwrap();
            assert_eq!(parsed.get_version(), Some(uuid::Version::Random), "{id}");
            assert_eq!(parsed.get_variant(), uuid::Variant::RFC4122, "{id}");
            assert_eq!(id, &parsed.hyphenated().to_string());
        }
        let distinct: std::collections::HashSet<&String> = all.iter().collect();
        assert_eq!(distinct.len(), all.len());
    }

    #[test]
    fn the_upstream_server_header_reaches_clients_only_when_allowed() {
        let upstream = || {
            let mut headers = HeaderMap::new();
            headers.insert("server", HeaderValue::from_static("Jetty(9.4.58)"));
            headers.insert("content-type", HeaderValue::from_static("application/json"));
            headers
        };
        let mut hidden = upstream();
        to_client(&mut hidden, false);
        assert!(!hidden.contains_key("server"), "{hidden:?}");
        assert!(hidden.contains_key("content-type"));
        let mut passed = upstream();
        to_client(&mut passed, true);
        assert_eq!(passed["server"], "Jetty(9.4.58)");
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
        to_client(&mut headers, false);
        assert_eq!(headers.len(), 1);
        assert!(headers.contains_key("accept"));
    }

    #[test]
    fn an_upstream_length_beside_a_transfer_coding_does_not_reach_the_client() {
        let mut headers = HeaderMap::new();
        headers.insert(TRANSFER_ENCODING, HeaderValue::from_static("chunked"));
        headers.insert("content-length", HeaderValue::from_static("3"));
        to_client(&mut headers, false);
        assert!(headers.is_empty(), "{headers:?}");
        // Alone, the length frames the body and stays.
        let mut headers = HeaderMap::new();
        headers.insert("content-length", HeaderValue::from_static("3"));
        to_client(&mut headers, false);
        assert_eq!(headers.len(), 1);
    }

    #[test]
    fn forwarding_headers_from_untrusted_clients_are_removed_in_any_spelling() {
        let mut spoofed: Vec<(String, &str)> = FORWARDING
            .iter()
            .map(|name| (name.to_string(), "evil"))
            .collect();
        for name in [
            "X-Forwarded-Prefix",
            "X-Forwarded-Port",
            "X-Forwarded-Ssl",
            "X-Forwarded-Server",
            "X-Forwarded-Scheme",
            "x_forwarded_for",
            "X.Real.IP",
            "true_client_ip",
            "X-Original-URL",
            "x~rewrite~url",
        ] {
            spoofed.push((name.to_string(), "evil"));
        }
        let pairs: Vec<(&str, &str)> = spoofed.iter().map(|(n, v)| (n.as_str(), *v)).collect();
        let mut p = parts(&pairs);
        p.headers
            .insert(HOST, HeaderValue::from_static("gw.example:8080"));
        p.headers.insert("accept", HeaderValue::from_static("*/*"));
        let id = request_id(&p.headers, false);
        to_upstream(&mut p, &client(&conn(false, false)), id, None, None).append_to(&mut p.headers);
        let left: Vec<&str> = p.headers.keys().map(|k| k.as_str()).collect();
        assert_eq!(
            left.len(),
            6,
            "only accept, host (for the forwarder to replace) and keygate's own headers remain: {left:?}"
        );
        assert_eq!(p.headers[&X_FORWARDED_FOR], "10.1.2.3");
        assert_eq!(p.headers[&X_FORWARDED_PROTO], "http");
        assert_eq!(p.headers[&X_FORWARDED_HOST], "gw.example:8080");
        assert_eq!(p.headers[&X_REQUEST_ID].len(), 36);
        assert!(p.headers.values().all(|v| v != "evil"));
    }

    #[test]
    fn the_first_byte_filter_never_lets_a_forwarding_name_through() {
        for known in FORWARDING.iter().chain(&[FORWARDING_PREFIX]) {
            for spelling in [
                known.to_string(),
                known.replace('-', "_"),
                known.to_ascii_uppercase().replace('-', "."),
            ] {
                let name = HeaderName::from_bytes(format!("{spelling}x").as_bytes()).unwrap();
                let exact = HeaderName::from_bytes(spelling.as_bytes()).unwrap();
                assert!(is_forwarding(&exact), "{spelling}");
                assert_eq!(
                    is_forwarding(&name),
                    known.ends_with('-'),
                    "{spelling}x is forwarding only under the prefix"
                );
            }
        }
        for other in ["accept", "host", "user-agent", "content-type", "-forwarded"] {
            assert!(!is_forwarding(&HeaderName::from_static(other)), "{other}");
        }
    }

    #[test]
    fn a_connection_header_listing_hop_by_hop_names_in_any_case_removes_them() {
        let mut headers = HeaderMap::new();
        headers.insert(
            CONNECTION,
            HeaderValue::from_static("Keep-Alive, UPGRADE, close"),
        );
        headers.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        headers.insert(UPGRADE, HeaderValue::from_static("websocket"));
        headers.insert("close", HeaderValue::from_static("1"));
        headers.insert("accept", HeaderValue::from_static("*/*"));
        to_client(&mut headers, false);
        assert_eq!(headers.len(), 1, "{headers:?}");
        assert!(headers.contains_key("accept"));
    }

    #[test]
    fn forwarding_headers_from_trusted_proxies_are_kept_and_extended() {
        let mut p = parts(&[
            ("x-forwarded-for", "203.0.113.9"),
            ("x-forwarded-proto", "https"),
            ("x-forwarded-host", "api.example"),
            ("x-forwarded-prefix", "/gw"),
            ("x-real-ip", "203.0.113.9"),
            ("x-request-id", "req-123"),
        ]);
        let id = request_id(&p.headers, true);
        assert_eq!(id, "req-123");
        to_upstream(&mut p, &client(&conn(false, true)), id, None, None).append_to(&mut p.headers);
        assert_eq!(p.headers[&X_FORWARDED_FOR], "203.0.113.9, 10.1.2.3");
        assert_eq!(p.headers[&X_FORWARDED_PROTO], "https");
        assert_eq!(p.headers[&X_FORWARDED_HOST], "api.example");
        assert_eq!(p.headers["x-forwarded-prefix"], "/gw");
        assert_eq!(p.headers["x-real-ip"], "203.0.113.9");
        assert_eq!(p.headers[&X_REQUEST_ID], "req-123");
    }

    #[test]
    fn identity_is_set_after_a_connection_header_tried_to_name_it_away() {
        use crate::identity::{AuthMethod, Authority, Principal, id_header_value};
        let principal = std::sync::Arc::new(Principal::new(
            uuid::Uuid::from_u128(1),
            uuid::Uuid::from_u128(2),
            crate::identity::NULL_UUID,
            Authority::TenantAdmin,
            "ta@example.com".into(),
        ));
        let key_id = uuid::Uuid::from_u128(3);
        let identity = Identity::new(
            principal,
            AuthMethod::ApiKey { key_id },
            id_header_value(&key_id),
        );
        let mut p = parts(&[
            ("connection", "x-auth-user-id, x-forwarded-for"),
            ("x.auth.user-id", "evil"),
            ("x-authorization", "ApiKey secret"),
        ]);
        to_upstream(
            &mut p,
            &client(&conn(true, false)),
            request_id(&HeaderMap::new(), false),
            Some(&identity),
            None,
        )
        .append_to(&mut p.headers);
        assert_eq!(
            p.headers["x-auth-user-id"],
            uuid::Uuid::from_u128(1).to_string()
        );
        assert_eq!(p.headers.get_all("x-auth-user-id").iter().count(), 1);
        assert!(!p.headers.contains_key("x.auth.user-id"));
        assert!(!p.headers.contains_key("x-authorization"));
        assert_eq!(p.headers[&X_FORWARDED_PROTO], "https");
    }

    #[test]
    fn keygates_headers_go_after_the_clients_once_each_in_a_fixed_order() {
        let mut p = parts(&[
            ("accept", "*/*"),
            ("x-request-id", "client-chosen"),
            ("x-forwarded-for", "198.51.100.1"),
            ("host", "gw.example"),
        ]);
        let added = to_upstream(
            &mut p,
            &client(&conn(true, false)),
            HeaderValue::from_static("rid"),
            None,
            None,
        );
        let mut out = Vec::new();
        for (name, value) in &p.headers {
            out.push(format!("{name}: {}", value.to_str().unwrap()));
        }
        added.each(|name, value| out.push(format!("{name}: {}", value.to_str().unwrap())));
        assert_eq!(
            out,
            [
                "accept: */*",
                "host: gw.example",
                "x-forwarded-for: 10.1.2.3",
                "x-forwarded-proto: https",
                "x-forwarded-host: gw.example",
                "x-request-id: rid",
            ]
        );
    }

    #[test]
    fn method_override_headers_never_reach_an_upstream_in_any_spelling() {
        let mut p = parts(&[
            ("x-http-method-override", "DELETE"),
            ("X_HTTP_Method", "DELETE"),
            ("x.method.override", "PUT"),
            ("accept", "*/*"),
            ("cache-control", "no-cache"),
            ("x-http-methods", "kept"),
        ]);
        to_upstream(
            &mut p,
            &client(&conn(true, false)),
            HeaderValue::from_static("rid"),
            None,
            None,
        );
        let mut left: Vec<&str> = p.headers.keys().map(|k| k.as_str()).collect();
        left.sort_unstable();
        assert_eq!(left, ["accept", "cache-control", "x-http-methods"]);
        for name in METHOD_OVERRIDE {
            assert!(is_method_override(&HeaderName::from_static(name)), "{name}");
        }
    }

    #[test]
    fn names_that_fold_to_framing_names_are_refused_and_the_names_themselves_are_not() {
        for name in [
            "content_length",
            "transfer_encoding",
            "transfer.encoding",
            "keep_alive",
            "proxy_connection",
            "proxy_authorization",
            "proxy~authenticate",
        ] {
            let header = HeaderName::from_bytes(name.as_bytes()).unwrap();
            assert!(folds_to_framing(&header), "{name}");
            let mut headers = HeaderMap::new();
            headers.insert("accept", HeaderValue::from_static("*/*"));
            headers.insert(header, HeaderValue::from_static("1"));
            let refused = refuse_folded_framing(&headers).unwrap_err();
            assert_eq!(refused.status, http::StatusCode::BAD_REQUEST);
        }
        for name in [
            "content-length",
            "transfer-encoding",
            "keep-alive",
            "connection",
            "user-agent",
            "user_agent",
            "x_custom_header",
            "content_type",
            "te",
            "upgrade",
        ] {
            let header = HeaderName::from_bytes(name.as_bytes()).unwrap();
            assert!(!folds_to_framing(&header), "{name}");
        }
        let mut headers = HeaderMap::new();
        headers.insert("content-length", HeaderValue::from_static("1"));
        headers.insert("x_custom", HeaderValue::from_static("1"));
        assert!(refuse_folded_framing(&headers).is_ok());
    }
}
