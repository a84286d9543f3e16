//! The client's upgrade request: is it one, the `Sec-WebSocket-Accept` answer,
//! the `token` query parameter taken out, the credential it carries.

use http::header::UPGRADE;
use http::header::{CONNECTION, SEC_WEBSOCKET_ACCEPT, SEC_WEBSOCKET_KEY, SEC_WEBSOCKET_VERSION};
use http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode, Uri, Version};
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;

use crate::auth::AuthFailure;
use crate::auth::credential::{self, Credential};
use crate::body::{self, Body};
use crate::error::ApiError;
use crate::http1::connection;
use crate::identity::platform;

/// How a socket presented its credential, as counted and logged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Form {
    /// `?token=<JWT>` on the upgrade.
    QueryToken,
    /// `X-Authorization` (or `Authorization`) on the upgrade.
    Header,
    /// The first frame's `authCmd`.
    AuthCmd,
}

impl Form {
    pub const ALL: [Form; 3] = [Form::QueryToken, Form::Header, Form::AuthCmd];

    pub fn label(self) -> &'static str {
        match self {
            Form::QueryToken => "query_token",
            Form::Header => "header",
            Form::AuthCmd => "auth_cmd",
        }
    }
}

/// An HTTP/1.1 `GET` asking to switch to the WebSocket protocol.
pub fn is_upgrade<B>(req: &Request<B>) -> bool {
    let has_token = |name, token: &str| {
        req.headers()
            .get_all(name)
            .iter()
            .filter(|v| v.to_str().is_ok())
            .flat_map(|v| connection::tokens(v.as_bytes()))
            .any(|t| t.eq_ignore_ascii_case(token.as_bytes()))
    };
    req.method() == Method::GET
        && req.version() == Version::HTTP_11
        && has_token(&UPGRADE, "websocket")
        && has_token(&CONNECTION, "upgrade")
}

/// The `Sec-WebSocket-Accept` value for a version 13 upgrade; anything else
/// is a bad request.
pub fn accept_key<B>(req: &Request<B>) -> Result<String, ApiError> {
    let headers = req.headers();
    if headers.get(SEC_WEBSOCKET_VERSION).is_none_or(|v| v != "13") {
        return Err(ApiError::bad_request(
            "WebSocket upgrade needs Sec-WebSocket-Version: 13",
        ));
    }
    let mut keys = headers.get_all(SEC_WEBSOCKET_KEY).iter();
    match (keys.next(), keys.next()) {
        (Some(key), None) if key.len() == 24 => Ok(derive_accept_key(key.as_bytes())),
        _ => Err(ApiError::bad_request(
            "WebSocket upgrade needs one valid Sec-WebSocket-Key",
        )),
    }
}

/// The 101 answer. No subprotocol or extension is agreed: the upstream is
/// reached only after authentication, so none could be negotiated with it.
pub fn switching_protocols(accept: &str) -> Response<Body> {
    let mut response = Response::new(body::empty());
    *response.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let headers = response.headers_mut();
    headers.insert(UPGRADE, HeaderValue::from_static("websocket"));
    headers.insert(CONNECTION, HeaderValue::from_static("Upgrade"));
    if let Ok(value) = HeaderValue::from_str(accept) {
        headers.insert(SEC_WEBSOCKET_ACCEPT, value);
    }
    response
}

/// The upgrade's query, split: the `token` parameter, and the rest.
#[derive(Debug, PartialEq, Eq)]
pub struct Query {
    /// The decoded value; `Some("")` when it was given twice, which no
    /// credential check accepts.
    pub token: Option<String>,
    pub rest: Option<String>,
}

/// Takes every `token` parameter out of `uri`, so that nothing after this
/// (the upstream, the access log) ever sees it. A parameter is `token` when
/// its name, decoded, is (`%74oken` too), as the platform reads it
/// ([`platform::is_token_parameter`]).
pub fn take_token(uri: &mut Uri) -> Query {
    let Some(query) = uri.query() else {
        return Query {
            token: None,
            rest: None,
        };
    };
    let mut tokens: Vec<Option<String>> = platform::token_parameters(query)
        .map(crate::path::percent_decode)
        .collect();
    let token = match tokens.len() {
        0 => None,
        1 => Some(tokens.pop().flatten().unwrap_or_default()),
        _ => Some(String::new()),
    };
    platform::strip_token_parameters(uri);
    let rest = uri.query().map(str::to_owned);
    Query { token, rest }
}

/// `uri` with its `token` parameters replaced by `token` (URL-safe text: a
/// JWT), appended last.
pub fn with_token(mut uri: Uri, token: &[u8]) -> Option<Uri> {
    let token = std::str::from_utf8(token).ok()?;
    if !token
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
    {
        return None;
    }
    let rest = take_token(&mut uri).rest;
    let query = match rest {
        Some(rest) => format!("{rest}&token={token}"),
        None => format!("token={token}"),
    };
    let mut parts = uri.into_parts();
    let path = parts.path_and_query.as_ref().map_or("/", |p| p.path());
    parts.path_and_query = Some(format!("{path}?{query}").parse().ok()?);
    Uri::from_parts(parts).ok()
}

/// The credential the upgrade itself carries: `?token=` first (the
/// platform's), else the credential header; `None` when it carries neither.
pub fn upgrade_credential(
    token: Option<&str>,
    headers: &HeaderMap,
) -> Option<(Form, Result<Credential, AuthFailure>)> {
    if let Some(token) = token {
        let parsed = credential::parse_value(format!("Bearer {token}").as_bytes());
        return Some((Form::QueryToken, parsed.map_err(AuthFailure::from)));
    }
    match credential::parse(headers) {
        Err(credential::CredentialError::Missing) => None,
        parsed => Some((Form::Header, parsed.map_err(AuthFailure::from))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::credential::Secret;

    fn upgrade(pairs: &[(&str, &str)]) -> Request<()> {
        let mut builder = Request::builder().uri("/api/ws");
        for (name, value) in pairs {
            builder = builder.header(*name, *value);
        }
        builder.body(()).unwrap()
    }

    #[test]
    fn an_upgrade_names_websocket_and_upgrade_in_any_case_and_list() {
        assert!(is_upgrade(&upgrade(&[
            ("Upgrade", "WebSocket"),
            ("Connection", "keep-alive, Upgrade")
        ])));
        assert!(!is_upgrade(&upgrade(&[("Upgrade", "websocket")])));
        assert!(!is_upgrade(&upgrade(&[
            ("Upgrade", "h2c"),
            ("Connection", "upgrade")
        ])));
    }

    #[test]
    fn the_accept_key_follows_rfc_6455() {
        let req = upgrade(&[
            ("Sec-WebSocket-Version", "13"),
            ("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ=="),
        ]);
        assert_eq!(accept_key(&req).unwrap(), "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=");
        let old = upgrade(&[
            ("Sec-WebSocket-Version", "8"),
            ("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ=="),
        ]);
        assert!(accept_key(&old).is_err());
        assert!(accept_key(&upgrade(&[("Sec-WebSocket-Version", "13")])).is_err());
    }

    #[test]
    fn the_token_parameter_is_taken_out_of_the_uri() {
        let mut uri: Uri = "/api/ws/plugins/telemetry?a=1&token=x.y.z&b=2"
            .parse()
            .unwrap();
        let query = take_token(&mut uri);
        assert_eq!(query.token.as_deref(), Some("x.y.z"));
        assert_eq!(query.rest.as_deref(), Some("a=1&b=2"));
        assert_eq!(uri, "/api/ws/plugins/telemetry?a=1&b=2");

        let mut only: Uri = "/api/ws?token=a%2Eb".parse().unwrap();
        assert_eq!(take_token(&mut only).token.as_deref(), Some("a.b"));
        assert_eq!(only, "/api/ws");
    }

    #[test]
    fn an_escaped_token_name_is_the_token_and_never_rides_beside_keygates() {
        // The platform decodes parameter names: `%74oken` is its `token`.
        let mut uri: Uri = "/api/ws?%74oken=x.y.z&a=1".parse().unwrap();
        let query = take_token(&mut uri);
        assert_eq!(query.token.as_deref(), Some("x.y.z"));
        assert_eq!(uri, "/api/ws?a=1");
        // Given twice in two spellings, it is no token at all.
        let mut uri: Uri = "/api/ws?token=a&tok%65n=b".parse().unwrap();
        assert_eq!(take_token(&mut uri).token.as_deref(), Some(""));
        assert_eq!(uri, "/api/ws");
        let uri: Uri = "ws://10.0.0.1:8080/api/ws?%74oken=theirs&a=1&tok%65n=again"
            .parse()
            .unwrap();
        assert_eq!(
            with_token(uri, b"ours").unwrap().to_string(),
            "ws://10.0.0.1:8080/api/ws?a=1&token=ours"
        );
    }

    #[test]
    fn the_upstream_token_replaces_every_token_the_client_gave() {
        let uri: Uri = "ws://10.0.0.1:8080/api/ws?token=theirs&a=1&token=again"
            .parse()
            .unwrap();
        let with = with_token(uri, b"aa.bb-_.cc").unwrap();
        assert_eq!(
            with.to_string(),
            "ws://10.0.0.1:8080/api/ws?a=1&token=aa.bb-_.cc"
        );
        let bare: Uri = "ws://10.0.0.1:8080/api/ws".parse().unwrap();
        assert_eq!(
            with_token(bare.clone(), b"t").unwrap().to_string(),
            "ws://10.0.0.1:8080/api/ws?token=t"
        );
        assert!(with_token(bare, b"a&b=c").is_none());
    }

    #[test]
    fn a_token_given_twice_is_no_token_at_all() {
        let mut uri: Uri = "/api/ws?token=a&token=b".parse().unwrap();
        assert_eq!(take_token(&mut uri).token.as_deref(), Some(""));
        assert!(
            upgrade_credential(Some(""), &HeaderMap::new())
                .unwrap()
                .1
                .is_err()
        );
    }

    #[test]
    fn the_query_token_wins_over_the_header_and_a_header_alone_counts() {
        let req = upgrade(&[("X-Authorization", "ApiKey k1")]);
        let (form, parsed) = upgrade_credential(Some("t.t.t"), req.headers()).unwrap();
        assert_eq!(form, Form::QueryToken);
        assert_eq!(parsed, Ok(Credential::Bearer(Secret::new("t.t.t"))));
        let (form, parsed) = upgrade_credential(None, req.headers()).unwrap();
        assert_eq!(form, Form::Header);
        assert_eq!(parsed, Ok(Credential::ApiKey(Secret::new("k1"))));
        assert!(upgrade_credential(None, &HeaderMap::new()).is_none());
    }

    /// Hostile upgrade queries, for the property tests and `fuzz/run`.
    mod properties {
        use super::*;
        use proptest::prelude::*;

        fn pair() -> impl Strategy<Value = String> {
            prop_oneof![
                Just("token=a.b.c".to_string()),
                Just("token".to_string()),
                Just("token=".to_string()),
                Just("token=%zz".to_string()),
                Just("Token=x".to_string()),
                Just("%74oken=x.y.z".to_string()),
                Just("tok%65n".to_string()),
                Just("%74%6F%6B%65%6E=a".to_string()),
                Just("tokenx=y".to_string()),
                Just("x=token".to_string()),
                "[a-z%0-9.=_-]{0,12}",
            ]
        }

        proptest! {
            #[test]
            fn no_token_parameter_survives_and_the_rest_keeps_its_order(
                pairs in proptest::collection::vec(pair(), 1..8)
            ) {
                let query = pairs.join("&");
                let Ok(mut uri) = format!("/api/ws?{query}").parse::<Uri>() else {
                    return Ok(());
                };
                let taken = take_token(&mut uri);
                // A pair is a token when its name decodes to `token`.
                let is_token = |pair: &str| {
                    let name = pair.split('=').next().unwrap_or("");
                    crate::path::percent_decode(name).as_deref() == Some("token")
                };
                let kept: Vec<&str> = pairs
                    .iter()
                    .map(String::as_str)
                    .filter(|p| !is_token(p))
                    .collect();
                let left = uri.query().unwrap_or("");
                prop_assert!(left.split('&').all(|p| !is_token(p)));
                prop_assert_eq!(taken.rest.as_deref().unwrap_or(""), kept.join("&"));
                prop_assert_eq!(left, kept.join("&"));
                prop_assert_eq!(taken.token.is_some(), kept.len() < pairs.len());
            }
        }
    }
}
