//! The decision over its inputs, table-driven: method, path, sender, the
//! credential's kind, an upgrade, a scoped key's grants, a route public or
//! not, and the rules added → the verdict.

use std::sync::Arc;
use std::time::Duration;

use http::{HeaderMap, HeaderName, HeaderValue, Method, Uri};
use uuid::Uuid;

use super::*;
use crate::auth::AuthFailure;
use crate::auth::credential::{self, CredentialError, Secret};
use crate::auth::scope::Scopes;
use crate::config::RouteSpec;
use crate::identity::{AuthMethod, Authority, Principal, id_header_value};
use crate::telemetry::Metrics;

fn spec(name: &str, prefix: &str, public: bool) -> RouteSpec {
    RouteSpec {
        name: name.into(),
        prefix: prefix.into(),
        upstreams: vec!["http://127.0.0.1:1".parse().unwrap()],
        public,
        request_timeout: Duration::from_secs(1),
        openapi: None,
        quota: Default::default(),
        identity: Default::default(),
        audience: name.into(),
        upstream_tls: None,
    }
}

fn routes() -> RouteTable {
    RouteTable::new(
        &[
            spec("api", "/api/", false),
            spec("noauth", "/api/noauth/", true),
        ],
        &Metrics::new(),
    )
}

fn decision(rules: Rules) -> Decision {
    Decision {
        max_header_bytes: 1024,
        in_clear: InClear {
            disable_keys: true,
            allow_plaintext: false,
            provider_issuers: Default::default(),
        },
        browser: true,
        sync_upstream: None,
        websocket_routes: vec!["/api/ws".into(), "/api/ws/plugins/".into()],
        rules,
    }
}

const TLS: Sender = Sender {
    secure: true,
    trusted: false,
    loopback: false,
};
const PLAIN: Sender = Sender {
    secure: false,
    trusted: false,
    loopback: false,
};
const NEIGHBOUR: Sender = Sender {
    secure: false,
    trusted: false,
    loopback: true,
};

/// The credential header of each kind.
fn headers(kind: &str, extra: &[(&str, &str)]) -> HeaderMap {
    let mut headers = HeaderMap::new();
    let value = match kind {
        "key" => Some("ApiKey k"),
        "token" => Some("Bearer t"),
        "malformed" => Some("Basic x"),
        _ => None,
    };
    if let Some(value) = value {
        headers.insert("x-authorization", HeaderValue::from_static(value));
    }
    for (name, value) in extra {
        headers.append(
            HeaderName::from_bytes(name.as_bytes()).unwrap(),
            HeaderValue::from_str(value).unwrap(),
        );
    }
    headers
}

/// The verdict, as one word a table can hold.
fn word(verdict: Result<Admitted<'_, '_>, Refusal>) -> String {
    match verdict {
        Ok(Admitted { target, path }) => match target {
            Target::ApiBrowser => "browser".into(),
            Target::Endpoint(matched) => format!("endpoint {}", matched.route.pattern),
            Target::Proxied(route) => format!("proxied {} {path}", route.name),
            Target::WebSocket(route, label) => format!("socket {} {label}", route.name),
        },
        Err(Refusal::HeadTooLarge) => "431".into(),
        Err(Refusal::AmbiguousFraming) => "ambiguous".into(),
        Err(Refusal::FoldedName(_)) => "folded".into(),
        Err(Refusal::Path(_)) => "bad path".into(),
        Err(Refusal::InClear(exposure)) => format!("in clear {exposure:?}"),
        Err(Refusal::NoTarget(error)) => error.status.as_str().to_owned(),
    }
}

struct Case {
    method: Method,
    path: &'static str,
    sender: Sender,
    credential: &'static str,
    upgrade: bool,
    extra: &'static [(&'static str, &'static str)],
    expected: &'static str,
}

fn case(method: Method, path: &'static str, sender: Sender, credential: &'static str) -> Case {
    Case {
        method,
        path,
        sender,
        credential,
        upgrade: false,
        extra: &[],
        expected: "",
    }
}

impl Case {
    fn upgrade(self) -> Case {
        Case {
            upgrade: true,
            ..self
        }
    }
    fn with(self, extra: &'static [(&'static str, &'static str)]) -> Case {
        Case { extra, ..self }
    }
    fn is(self, expected: &'static str) -> Case {
        Case { expected, ..self }
    }
}

#[test]
fn every_request_gets_one_verdict_from_its_head_sender_and_credential() {
    let long: &'static str = Box::leak("a".repeat(2000).into_boxed_str());
    let long_header: &'static [(&str, &str)] = Box::leak(Box::new([("x-long", long)]));
    let get = Method::GET;
    let cases = [
        case(get.clone(), "/api/devices", TLS, "key").is("proxied api /api/devices"),
        case(get.clone(), "/api//devices/./x", TLS, "key").is("proxied api /api/devices/x"),
        case(get.clone(), "/api/noauth/x", TLS, "none").is("proxied noauth /api/noauth/x"),
        case(get.clone(), "/api/devices", PLAIN, "key").is("in clear ApiKey"),
        case(get.clone(), "/api/noauth/x", PLAIN, "key").is("in clear ApiKey"),
        case(get.clone(), "/api/devices", NEIGHBOUR, "key").is("in clear ApiKey"),
        case(get.clone(), "/api/devices", PLAIN, "token").is("in clear Token"),
        case(get.clone(), "/api/devices", NEIGHBOUR, "token").is("proxied api /api/devices"),
        case(get.clone(), "/api/devices", PLAIN, "malformed").is("proxied api /api/devices"),
        case(get.clone(), "/api/devices", PLAIN, "none").is("proxied api /api/devices"),
        case(get.clone(), "/api/%2e%2e/x", TLS, "key").is("bad path"),
        case(get.clone(), "/../x", TLS, "none").is("bad path"),
        case(get.clone(), "/api/x", TLS, "key")
            .with(long_header)
            .is("431"),
        case(Method::POST, "/api/x", TLS, "key")
            .with(&[("content_length", "3")])
            .is("folded"),
        case(get.clone(), "/api/ws", TLS, "none")
            .upgrade()
            .is("socket api /api/ws"),
        case(get.clone(), "/api/ws/plugins/telemetry", TLS, "token")
            .upgrade()
            .is("socket api /api/ws/plugins/"),
        case(get.clone(), "/api/ws", TLS, "key").is("proxied api /api/ws"),
        case(get.clone(), "/api/chat", TLS, "key")
            .upgrade()
            .is("proxied api /api/chat"),
        case(get.clone(), "/api/auth/user", TLS, "key").is("endpoint /api/auth/user"),
        case(get.clone(), "/api/auth/login", TLS, "none").is("405"),
        case(get.clone(), "/swagger-ui.html", TLS, "none").is("browser"),
        case(get.clone(), "/elsewhere", TLS, "key").is("404"),
    ];
    let decision = decision(Rules::default());
    let routes = routes();
    for case in cases {
        let uri: Uri = case.path.parse().unwrap();
        let headers = headers(case.credential, case.extra);
        let parsed = credential::parse(&headers);
        let input = Input {
            method: &case.method,
            uri: &uri,
            headers: &headers,
            sender: case.sender,
            upgrade: case.upgrade,
            ambiguous_framing: false,
            credential: &parsed,
        };
        let got = word(decision.evaluate(&input, &routes));
        assert_eq!(
            got, case.expected,
            "{} {} {:?} {}",
            case.method, case.path, case.sender, case.credential
        );
    }
}

#[test]
fn ambiguous_framing_is_refused_before_anything_else_is_read() {
    let decision = decision(Rules::default());
    let routes = routes();
    let uri: Uri = "/api/%2e%2e".parse().unwrap();
    let headers = headers("key", &[]);
    let parsed: Parsed = Err(CredentialError::Missing);
    let input = Input {
        method: &Method::POST,
        uri: &uri,
        headers: &headers,
        sender: PLAIN,
        upgrade: false,
        ambiguous_framing: true,
        credential: &parsed,
    };
    assert_eq!(word(decision.evaluate(&input, &routes)), "ambiguous");
}

fn identity(scopes: Option<&str>) -> Identity {
    let principal = Arc::new(Principal::new(
        Uuid::from_u128(1),
        Uuid::from_u128(2),
        Uuid::from_u128(3),
        Authority::TenantAdmin,
        "ta@example.com".into(),
    ));
    let key_id = Uuid::from_u128(4);
    let scopes = scopes.map(|text| {
        let value: serde_json::Value = serde_json::from_str(text).unwrap();
        Arc::new(Scopes::from_json(&value).unwrap())
    });
    Identity::new(
        principal,
        AuthMethod::ApiKey { key_id },
        id_header_value(&key_id),
    )
    .with_scopes(scopes)
}

#[test]
fn a_scoped_key_is_authorised_by_its_grants_on_the_path_the_decision_normalised() {
    let read_devices = Some(r#"[{"path": "/api/devices", "methods": ["GET"]}]"#);
    let decision = decision(Rules::default());
    let routes = routes();
    let api = routes.named("api").unwrap();
    let current_user = crate::api::find(&Method::GET, "/api/auth/user")
        .unwrap()
        .unwrap();
    for (method, path, scopes, endpoint, upgrade, expected) in [
        (
            Method::GET,
            "/api/devices/1",
            read_devices,
            false,
            false,
            Ok(()),
        ),
        (Method::GET, "/api/devices/1", None, false, false, Ok(())),
        (
            Method::DELETE,
            "/api/devices/1",
            read_devices,
            false,
            false,
            Err(Denial::OutOfScope),
        ),
        (
            Method::GET,
            "/api/tenants",
            read_devices,
            false,
            false,
            Err(Denial::OutOfScope),
        ),
        (
            Method::GET,
            "/api/devices/ws",
            read_devices,
            false,
            true,
            Ok(()),
        ),
        (
            Method::GET,
            "/api/auth/user",
            read_devices,
            true,
            false,
            Ok(()),
        ),
    ] {
        let requirement = if endpoint {
            Requirement::endpoint(&current_user, path, false)
        } else {
            Requirement::proxied(api, path)
        };
        assert!(requirement.required);
        let asked = Asked {
            method: &method,
            path,
            upgrade,
        };
        let identity = identity(scopes);
        let got = decision.authorize(&asked, requirement.scope, Some(&identity));
        assert_eq!(got, expected, "{method} {path} {scopes:?}");
    }
}

#[test]
fn a_target_says_whether_a_credential_is_required() {
    let routes = routes();
    let api = routes.named("api").unwrap();
    let noauth = routes.named("noauth").unwrap();
    assert!(Requirement::proxied(api, "/api/x").required);
    assert!(!Requirement::proxied(noauth, "/api/noauth/x").required);
    assert!(Requirement::socket("/api/ws").required);
    let login = crate::api::find(&Method::POST, "/api/auth/login")
        .unwrap()
        .unwrap();
    assert!(!Requirement::endpoint(&login, "/api/auth/login", false).required);
    let user = crate::api::find(&Method::GET, "/api/auth/user")
        .unwrap()
        .unwrap();
    let requirement = Requirement::endpoint(&user, "/api/auth/user", false);
    assert_eq!(requirement.scope, ScopeCheck::Exempt);
}

/// Refuses sockets, and any request of the user with id 1 to `/api/closed`.
struct Closed;

impl Rule for Closed {
    fn refuse(&self, asked: &Asked<'_>, identity: Option<&Identity>) -> Option<AuthFailure> {
        let user = identity.map(|identity| identity.principal.user_id);
        let closed = asked.upgrade
            || (asked.path.starts_with("/api/closed") && user == Some(Uuid::from_u128(1)));
        closed.then_some(AuthFailure::OutOfScope)
    }
}

#[test]
fn an_added_rule_refuses_after_the_scope_check_with_or_without_an_identity() {
    let decision = decision(Rules(vec![Arc::new(Closed)]));
    let identity = identity(None);
    for (path, upgrade, who, expected) in [
        ("/api/open", false, Some(&identity), Ok(())),
        ("/api/closed", false, None, Ok(())),
        (
            "/api/closed",
            false,
            Some(&identity),
            Err(Denial::Rule(AuthFailure::OutOfScope)),
        ),
        (
            "/api/open",
            true,
            None,
            Err(Denial::Rule(AuthFailure::OutOfScope)),
        ),
    ] {
        let asked = Asked {
            method: &Method::GET,
            path,
            upgrade,
        };
        let got = decision.authorize(&asked, ScopeCheck::Proxied(path), who);
        assert_eq!(got, expected, "{path} {upgrade}");
    }
}

#[test]
fn a_credential_that_could_not_be_read_reaches_the_gate_as_its_failure() {
    let missing: Parsed = Err(CredentialError::Missing);
    let malformed: Parsed = Err(CredentialError::Malformed);
    let key: Parsed = Ok(Credential::ApiKey(Secret::new("k")));
    assert_eq!(presented(&missing), Err(AuthFailure::Missing));
    assert_eq!(presented(&malformed), Err(AuthFailure::Malformed));
    assert!(presented(&key).is_ok());
}
