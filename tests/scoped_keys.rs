//! Scoped API keys end to end: the real server, a recording upstream, and
//! keys limited to some methods under some paths. A request outside a key's
//! scopes is a 403 that reaches no upstream, however its path is spelled;
//! a scoped key never makes a key. Each behaviour's one body runs over both
//! wires ([`common::WIRES`]): HTTP/1.1 through the lean path, and HTTP/2.

mod common;

use std::time::Duration;

use common::{Gateway, Upstream, WIRES, Wire, api_key_header, counter, error_body};
use keygate::identity::Authority;
use keygate::store::UserRecord;
use serde_json::{Value, json};
use tokio::net::TcpStream;

const OUT_OF_SCOPE: &str = "This API key's scopes do not allow this request";
const OUT_OF_SCOPE_SERIES: &str = r#"keygate_auth_total{method="api-key",result="out_of_scope"}"#;

/// A tenant administrator with an unscoped key (to create scoped ones).
async fn admin(gw: &Gateway, email: &str) -> (UserRecord, String) {
    let user = gw.user(email, Authority::TenantAdmin).await;
    let (_, key) = gw.api_key(&user, 0).await;
    (user, key)
}

/// `POST /api/apiKey` for `user` with `scopes` (left out when `None`),
/// sent with the key `with` over `wire`.
async fn create_key_over(
    gw: &Gateway,
    wire: Wire,
    with: &str,
    user: &UserRecord,
    scopes: Option<Value>,
) -> reqwest::Response {
    let mut body =
        json!({"userId": {"id": user.id, "entityType": "USER"}, "description": "scoped"});
    if let Some(scopes) = scopes {
        body["scopes"] = scopes;
    }
    let response = gw
        .client_over(wire)
        .post(gw.https("/api/apiKey"))
        .header("X-Authorization", api_key_header(with))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(response.version(), wire.version());
    response
}

/// [`create_key_over`] HTTP/2, for a test's setting up.
async fn create_key(
    gw: &Gateway,
    with: &str,
    user: &UserRecord,
    scopes: Option<Value>,
) -> reqwest::Response {
    create_key_over(gw, Wire::Http2, with, user, scopes).await
}

/// A new key of `user` limited to `scopes`: its value and its record.
async fn scoped_key(gw: &Gateway, with: &str, user: &UserRecord, scopes: Value) -> (String, Value) {
    let response = create_key(gw, with, user, Some(scopes)).await;
    assert_eq!(response.status(), 200);
    let record: Value = response.json().await.unwrap();
    (record["value"].as_str().unwrap().to_string(), record)
}

/// `method path` with `key` over `wire`.
async fn call(gw: &Gateway, wire: Wire, method: &str, path: &str, key: &str) -> reqwest::Response {
    let response = gw
        .client_over(wire)
        .request(method.parse().unwrap(), gw.https(path))
        .header("X-Authorization", api_key_header(key))
        .send()
        .await
        .unwrap();
    assert_eq!(response.version(), wire.version(), "{method} {path}");
    response
}

/// Checks a refusal for being out of scope: 403, code 20, a message naming
/// neither the key nor its grants.
async fn assert_out_of_scope(response: reqwest::Response, key: &str, what: &str) {
    let (status, body) = error_body(response).await;
    assert_eq!(
        (status, &body["errorCode"]),
        (403, &json!(20)),
        "{what}: {body}"
    );
    assert_eq!(body["message"], OUT_OF_SCOPE, "{what}");
    assert!(!body.to_string().contains(key), "{what}");
}

/// A request sent byte for byte over TLS (an HTTP client would resolve or
/// re-encode its path); the raw answer.
async fn raw_https(gw: &Gateway, method: &str, path: &str, key: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let port = gw.running.https.unwrap().port();
    let tcp = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let server_name = rustls_pki_types::ServerName::try_from("localhost").unwrap();
    let mut tls = common::tls_connector(&gw.ca_pem)
        .connect(server_name, tcp)
        .await
        .unwrap();
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\
         X-Authorization: ApiKey {key}\r\n\r\n"
    );
    tls.write_all(request.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), tls.read_to_end(&mut out)).await;
    String::from_utf8_lossy(&out).into_owned()
}

/// The status and contract body of a raw answer.
fn raw_status(response: &str) -> (u16, Value) {
    let status = response
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = response.split("\r\n\r\n").nth(1).unwrap_or_default();
    (status, serde_json::from_str(body).unwrap_or(Value::Null))
}

#[tokio::test]
async fn a_scoped_key_reaches_the_upstream_only_with_a_grant_of_the_method_and_path() {
    let (upstream, gw) = common::gateway("").await;
    let (user, admin_key) = admin(&gw, "scoped-requests@example.com").await;
    let scopes = json!([
        {"path": "/api/device", "methods": ["GET"]},
        {"path": "/api/plugins/telemetry/", "methods": ["post"]},
    ]);
    let (key, _) = scoped_key(&gw, &admin_key, &user, scopes).await;

    for (round, wire) in (1..).zip(WIRES) {
        let declines = gw.declines().await;
        let forwarded = upstream.requests().len();
        for (method, path) in [
            ("GET", "/api/device"),
            ("GET", "/api/device/abc"),
            ("GET", "/api/device/abc/credentials?x=1"),
            ("HEAD", "/api/device/abc"),
            ("POST", "/api/plugins/telemetry/DEVICE/abc/timeseries/ANY"),
        ] {
            let response = call(&gw, wire, method, path, &key).await;
            assert_eq!(response.status(), 200, "{wire:?} {method} {path}");
        }
        let allowed = upstream.requests().len();
        assert_eq!(allowed, forwarded + 5, "{wire:?}");
        assert_eq!(upstream.last().method, "POST");

        for (method, path) in [
            ("POST", "/api/device/abc"),
            ("DELETE", "/api/device/abc"),
            ("PUT", "/api/device"),
            ("GET", "/api/tenant/devices"),
            ("GET", "/api/plugins/telemetry/DEVICE/abc/values/timeseries"),
            // The grant ends in '/': only what is below it.
            ("POST", "/api/plugins/telemetry"),
            ("OPTIONS", "/api/device"),
        ] {
            let response = call(&gw, wire, method, path, &key).await;
            assert_out_of_scope(response, &key, &format!("{wire:?} {method} {path}")).await;
        }
        assert_eq!(
            upstream.requests().len(),
            allowed,
            "{wire:?}: nothing more was forwarded"
        );
        assert_eq!(counter(&gw.metrics().await, OUT_OF_SCOPE_SERIES), 7 * round);
        // The same user's unscoped key keeps the user's full rights.
        let whole = call(&gw, wire, "DELETE", "/api/device/abc", &admin_key).await;
        assert_eq!(whole.status(), 200, "{wire:?}");
        // HEAD is hyper's over HTTP/1.1 (its answer has a length, no body).
        gw.assert_lean_path_took(&declines, &["method"], &format!("{wire:?}"))
            .await;
    }
}

#[tokio::test]
async fn a_grant_prefix_that_is_not_a_segment_boundary_matches_nothing_more() {
    let (upstream, gw) = common::gateway("").await;
    let (user, admin_key) = admin(&gw, "scoped-boundary@example.com").await;
    let scopes = json!([{"path": "/api/device", "methods": ["GET"]}]);
    let (key, _) = scoped_key(&gw, &admin_key, &user, scopes).await;
    for wire in WIRES {
        let declines = gw.declines().await;
        for path in [
            "/api/devices",
            "/api/deviceProfile/x",
            "/api/device-x",
            "/api/devic",
        ] {
            let response = call(&gw, wire, "GET", path, &key).await;
            assert_out_of_scope(response, &key, &format!("{wire:?} {path}")).await;
        }
        gw.assert_lean_path_took(&declines, &[], &format!("{wire:?}"))
            .await;
    }
    assert!(upstream.requests().is_empty(), "nothing was forwarded");
}

/// HTTP/1.1 only: the request line is sent byte for byte, which an HTTP
/// client would resolve or re-encode.
#[tokio::test]
async fn dot_segments_and_encoded_tricks_cannot_climb_out_of_a_scope() {
    let (upstream, gw) = common::gateway("").await;
    let (user, admin_key) = admin(&gw, "scoped-tricks@example.com").await;
    let scopes = json!([{"path": "/api/device/", "methods": ["GET"]}]);
    let (key, _) = scoped_key(&gw, &admin_key, &user, scopes).await;
    let tricks = [
        "/api/device/../user/x",
        "/api/device/../../api/user/x",
        "/api/device/%2e%2e/user/x",
        "/api/device/%2E%2E/user/x",
        "/api/device/.%2e/user/x",
        "/api/device/..%2fuser%2fx",
        "/api/device%2f..%2fuser",
        "/api/device/%252e%252e/user/x",
        // A doubled slash is one to the upstream: `..` climbs out of the
        // grant from it as from a single one.
        "/api/device//../user/x",
        "//api/device/../user/x",
        "/api/device/..;/user/x",
        "/api/device;/../user/x",
        "/api/device/%3b/../../user",
        "/api/device/..%5cuser",
        "/api/device/\u{FF0E}\u{FF0E}/user/x",
        "/api/device/%ef%bc%8e%ef%bc%8e/user/x",
        "/api/devic%65/../user/x",
    ];
    for path in tricks {
        let response = raw_https(&gw, "GET", path, &key).await;
        let (status, body) = raw_status(&response);
        assert!(
            matches!(status, 400 | 403),
            "{path}: not refused: {response}"
        );
        let expected_code = if status == 400 { 31 } else { 20 };
        assert_eq!(body["errorCode"], expected_code, "{path}: {response}");
    }
    assert!(upstream.requests().is_empty(), "no trick was forwarded");
    // Dot segments that stay inside the scope resolve to the path the
    // upstream receives, and pass.
    let response = raw_https(&gw, "GET", "/api/user/../device/./abc", &key).await;
    assert_eq!(raw_status(&response).0, 200, "{response}");
    assert_eq!(upstream.last().path_and_query, "/api/device/abc");
}

#[tokio::test]
async fn a_scoped_key_creates_no_key_broader_narrower_or_unscoped() {
    let (_upstream, gw) = common::gateway("").await;
    for wire in WIRES {
        let email = format!("scoped-escalation-{wire:?}@example.com").to_lowercase();
        let (user, admin_key) = admin(&gw, &email).await;
        no_key_from_a_scoped_one(&gw, wire, &user, &admin_key).await;
    }
}

/// A scoped key of `user` creates no key over `wire`.
async fn no_key_from_a_scoped_one(gw: &Gateway, wire: Wire, user: &UserRecord, admin_key: &str) {
    let own = json!([
        {"path": "/api/apiKey", "methods": ["POST"]},
        {"path": "/api/device/", "methods": ["GET", "POST"]},
    ]);
    let (key, _) = scoped_key(gw, admin_key, user, own).await;

    let unscoped = create_key_over(gw, wire, &key, user, None).await;
    let (status, body) = error_body(unscoped).await;
    assert_eq!(
        (status, &body["errorCode"]),
        (403, &json!(20)),
        "{wire:?} {body}"
    );
    let null = create_key_over(gw, wire, &key, user, Some(Value::Null)).await;
    assert_eq!(null.status(), 403, "{wire:?}: null scopes are no scopes");
    for broader in [
        json!([{"path": "/api/", "methods": ["GET"]}]),
        json!([{"path": "/", "methods": ["GET"]}]),
        json!([{"path": "/api/device", "methods": ["GET"]}]),
        json!([{"path": "/api/device/", "methods": ["DELETE"]}]),
        json!([{"path": "/api/device/x", "methods": ["GET", "PUT"]}]),
        json!([{"path": "/api/device/x", "methods": ["GET"]}, {"path": "/api/user", "methods": ["GET"]}]),
        json!([{"path": "/api/apiKeys", "methods": ["POST"]}]),
    ] {
        let response = create_key_over(gw, wire, &key, user, Some(broader.clone())).await;
        let (status, body) = error_body(response).await;
        assert_eq!(
            (status, &body["errorCode"]),
            (403, &json!(20)),
            "{wire:?} {broader}: {body}"
        );
    }
    // Nor narrower (or the same) grants: making a key is a credential,
    // never a scoped key's, whatever it holds.
    for narrower in [
        json!([{"path": "/api/device/abc", "methods": ["GET", "HEAD"]}]),
        json!([{"path": "/api/apiKey", "methods": ["POST"]}]),
    ] {
        let response = create_key_over(gw, wire, &key, user, Some(narrower.clone())).await;
        let what = format!("{wire:?} narrower {narrower}");
        assert_out_of_scope(response, &key, &what).await;
    }
    assert_eq!(
        gw.running.store.list_api_keys(user.id).await.unwrap().len(),
        2,
        "{wire:?}: the administrator's key and the scoped one, nothing more"
    );

    // Without a grant of POST /api/apiKey, no key at all.
    let reader = json!([{"path": "/api/device/", "methods": ["GET"]}]);
    let (reader, _) = scoped_key(gw, admin_key, user, reader).await;
    let narrower = json!([{"path": "/api/device/x", "methods": ["GET"]}]);
    let response = create_key_over(gw, wire, &reader, user, Some(narrower)).await;
    assert_out_of_scope(
        response,
        &reader,
        &format!("{wire:?} create without a grant"),
    )
    .await;
}

#[tokio::test]
async fn a_scoped_key_manages_users_and_keys_only_with_a_grant_of_that_endpoint() {
    let (_upstream, gw) = common::gateway("").await;
    for wire in WIRES {
        let email = format!("scoped-manager-{wire:?}@example.com").to_lowercase();
        let (user, admin_key) = admin(&gw, &email).await;
        manages_only_with_a_grant(&gw, wire, &user, &admin_key).await;
    }
}

/// A scoped key of `user` reaches the management endpoints it has a grant
/// of, and no other, over `wire`.
async fn manages_only_with_a_grant(gw: &Gateway, wire: Wire, user: &UserRecord, admin_key: &str) {
    let read_user = json!([{"path": "/api/user", "methods": ["GET"]}]);
    let (key, _) = scoped_key(gw, admin_key, user, read_user).await;
    let own = format!("/api/user/{}", user.id);
    let response = call(gw, wire, "GET", &own, &key).await;
    assert_eq!(response.status(), 200, "{wire:?}");
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["email"], user.email);
    // `/api/users` is not below `/api/user`.
    let listing = call(gw, wire, "GET", "/api/users?pageSize=10&page=0", &key).await;
    assert_out_of_scope(listing, &key, "GET /api/users").await;
    let delete = call(gw, wire, "DELETE", &own, &key).await;
    assert_out_of_scope(delete, &key, "DELETE /api/user/{id}").await;
    let keys = format!("/api/apiKeys/{}?pageSize=10&page=0", user.id);
    let listed = call(gw, wire, "GET", &keys, &key).await;
    assert_out_of_scope(listed, &key, "list keys").await;
    let disable = format!("/api/apiKey/{}/enabled/false", uuid::Uuid::new_v4());
    let disabled = call(gw, wire, "PUT", &disable, &key).await;
    assert_out_of_scope(disabled, &key, "disable").await;

    let manage = json!([
        {"path": "/api/users", "methods": ["GET"]},
        {"path": "/api/apiKeys/", "methods": ["GET"]},
    ]);
    let (manager, _) = scoped_key(gw, admin_key, user, manage).await;
    let users = call(gw, wire, "GET", "/api/users?pageSize=10&page=0", &manager).await;
    assert_eq!(users.status(), 200, "{wire:?}");
    let listed = call(gw, wire, "GET", &keys, &manager).await;
    assert_eq!(listed.status(), 200, "{wire:?}");
    let page: Value = listed.json().await.unwrap();
    let records = page["data"].as_array().unwrap();
    assert_eq!(records.len(), 3, "{wire:?}");
    // An unscoped key's record is as it always was; a scoped one shows its grants.
    assert!(records[0].get("scopes").is_none(), "{}", records[0]);
    assert_eq!(
        records[1]["scopes"],
        json!([{"path": "/api/user", "methods": ["GET"]}])
    );
    assert!(
        !page.to_string().contains(&manager),
        "no key value in a listing"
    );
}

#[tokio::test]
async fn any_scoped_key_reads_its_user_and_none_changes_a_password() {
    let (upstream, gw) = common::gateway("").await;
    let (user, admin_key) = admin(&gw, "scoped-self@example.com").await;
    let everything = json!([{"path": "/", "methods": ["GET", "POST", "PUT", "DELETE"]}]);
    let (all, _) = scoped_key(&gw, &admin_key, &user, everything).await;
    let narrow = json!([{"path": "/api/device/", "methods": ["GET"]}]);
    let (narrow, _) = scoped_key(&gw, &admin_key, &user, narrow).await;
    for wire in WIRES {
        for key in [&all, &narrow] {
            let me = call(&gw, wire, "GET", "/api/auth/user", key).await;
            assert_eq!(me.status(), 200, "{wire:?}");
            let body: Value = me.json().await.unwrap();
            assert_eq!(body["email"], "scoped-self@example.com");
            let change = gw
                .client_over(wire)
                .post(gw.https("/api/auth/changePassword"))
                .header("X-Authorization", api_key_header(key))
                .json(&json!({"currentPassword": common::PASSWORD, "newPassword": "another-long-password"}))
                .send()
                .await
                .unwrap();
            assert_eq!(change.version(), wire.version());
            assert_out_of_scope(change, key, &format!("{wire:?} change password")).await;
        }
    }
    assert!(upstream.requests().is_empty());
    // The password is unchanged.
    let login = gw.login("scoped-self@example.com", common::PASSWORD).await;
    assert_eq!(login.status(), 200);
}

#[tokio::test]
async fn the_read_only_grant_reads_every_path_and_writes_none() {
    let (upstream, gw) = common::gateway("").await;
    let (user, admin_key) = admin(&gw, "scoped-reader@example.com").await;
    let read_only = json!([{"path": "/", "methods": ["GET"]}]);
    let (key, record) = scoped_key(&gw, &admin_key, &user, read_only).await;
    assert_eq!(record["scopes"], json!([{"path": "/", "methods": ["GET"]}]));
    for wire in WIRES {
        let declines = gw.declines().await;
        for path in ["/api/tenant/devices", "/api/device/x", "/api/noauth/info"] {
            let response = call(&gw, wire, "GET", path, &key).await;
            assert_eq!(response.status(), 200, "{wire:?} {path}");
        }
        let head = call(&gw, wire, "HEAD", "/api/device/x", &key).await;
        assert_eq!(head.status(), 200, "{wire:?}");
        let seen = upstream.requests().len();
        for method in ["POST", "PUT", "PATCH", "DELETE"] {
            let response = call(&gw, wire, method, "/api/device/x", &key).await;
            assert_out_of_scope(response, &key, &format!("{wire:?} {method}")).await;
        }
        assert_eq!(
            upstream.requests().len(),
            seen,
            "{wire:?}: no write was forwarded"
        );
        // HEAD is hyper's over HTTP/1.1 (its answer has a length, no body).
        gw.assert_lean_path_took(&declines, &["method"], &format!("{wire:?}"))
            .await;
    }
}

#[tokio::test]
async fn every_malformed_scope_is_a_400_naming_its_field_and_creates_nothing() {
    let (_upstream, gw) = common::gateway("").await;
    let (user, admin_key) = admin(&gw, "scoped-malformed@example.com").await;
    for wire in WIRES {
        for (scopes, expected) in malformed_scopes() {
            let response =
                create_key_over(&gw, wire, &admin_key, &user, Some(scopes.clone())).await;
            let (status, body) = error_body(response).await;
            assert_eq!(
                (status, &body["errorCode"]),
                (400, &json!(31)),
                "{wire:?} {scopes}: {body}"
            );
            let message = body["message"].as_str().unwrap();
            assert!(
                message.starts_with(expected),
                "{wire:?} {scopes}: {message}"
            );
        }
    }
    let keys = gw.running.store.list_api_keys(user.id).await.unwrap();
    assert_eq!(keys.len(), 1, "only the administrator's own key exists");
}

/// Malformed `scopes` values and the start of the message each gets.
fn malformed_scopes() -> Vec<(Value, &'static str)> {
    vec![
        (
            json!({"path": "/", "methods": ["GET"]}),
            "scopes: must be a list",
        ),
        (json!("GET /"), "scopes: must be a list"),
        (json!([]), "scopes: must hold at least one grant"),
        (json!(["GET /"]), "scopes[0]: must be an object"),
        (json!([{"methods": ["GET"]}]), "scopes[0].path: missing"),
        (json!([{"path": "/"}]), "scopes[0].methods: missing"),
        (
            json!([{"path": "/", "methods": "GET"}]),
            "scopes[0].methods: must be a list",
        ),
        (
            json!([{"path": "/", "methods": []}]),
            "scopes[0].methods: must name at least one",
        ),
        (
            json!([{"path": "/", "methods": ["GET"]}, {"path": "/x", "methods": ["GET", "FETCH"]}]),
            "scopes[1].methods[1]: unknown method \"FETCH\"",
        ),
        (
            json!([{"path": "api/device", "methods": ["GET"]}]),
            "scopes[0].path: must start with '/'",
        ),
        (
            json!([{"path": 3, "methods": ["GET"]}]),
            "scopes[0].path: must be a string",
        ),
        (
            json!([{"path": "/api/../x", "methods": ["GET"]}]),
            "scopes[0].path: must not contain '.'",
        ),
        (
            json!([{"path": "/api//x", "methods": ["GET"]}]),
            "scopes[0].path: must not contain an empty segment",
        ),
        (
            json!([{"path": "/api/%2e", "methods": ["GET"]}]),
            "scopes[0].path: must not contain '%'",
        ),
        (
            json!([{"path": "/api?x", "methods": ["GET"]}]),
            "scopes[0].path: must not contain a query",
        ),
        (
            json!([{"path": "/api;x", "methods": ["GET"]}]),
            "scopes[0].path: must not contain ';'",
        ),
        (
            json!([{"path": "/", "methods": ["GET"], "paths": ["/x"]}]),
            "scopes[0]: unknown field `paths`",
        ),
    ]
}

/// Authenticates a socket on `/api/ws` with `key` in the first frame, then
/// sends `hello`: the reference service's answer, or the close frame.
async fn keyed_socket(gw: &Gateway, key: &str) -> Result<Value, (u16, String)> {
    use futures_util::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::Message;
    let mut socket = common::open_socket(gw, "/api/ws").await;
    let auth = json!({"authCmd": {"cmdId": 0, "apiKey": key}}).to_string();
    socket.send(Message::text(auth)).await.unwrap();
    let _ = socket.send(Message::text("hello")).await;
    let read = async {
        loop {
            match socket.next().await {
                Some(Ok(Message::Text(text))) => {
                    return Ok(serde_json::from_str(&text).unwrap());
                }
                Some(Ok(Message::Close(Some(frame)))) => {
                    return Err((u16::from(frame.code), frame.reason.to_string()));
                }
                Some(Ok(_)) => {}
                other => panic!("expected a message or a close, got {other:?}"),
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(30), read)
        .await
        .expect("an answer in time")
}

/// HTTP/1.1 only: an upgrade, which HTTP/2 does not have.
#[tokio::test]
async fn a_scoped_key_opens_a_websocket_only_with_a_get_grant_of_its_path() {
    let gw = Gateway::start(&common::reference_upstream().await, "").await;
    let (user, admin_key) = admin(&gw, "scoped-socket@example.com").await;
    let socket_grant = json!([{"path": "/api/ws", "methods": ["GET"]}]);
    let (allowed, _) = scoped_key(&gw, &admin_key, &user, socket_grant).await;
    let answer = keyed_socket(&gw, &allowed).await.expect("the socket opens");
    assert_eq!(answer["received"], "hello", "{answer}");

    for (grants, what) in [
        (
            json!([{"path": "/api/device/", "methods": ["GET"]}]),
            "another path",
        ),
        (
            json!([{"path": "/api/ws", "methods": ["POST"]}]),
            "another method",
        ),
        (
            json!([{"path": "/api/ws/", "methods": ["GET"]}]),
            "only below it",
        ),
    ] {
        let (key, _) = scoped_key(&gw, &admin_key, &user, grants).await;
        let closed = keyed_socket(&gw, &key).await;
        assert_eq!(closed, Err((1008, OUT_OF_SCOPE.to_string())), "{what}");
    }
    let metrics = gw.metrics().await;
    assert_eq!(counter(&metrics, OUT_OF_SCOPE_SERIES), 3);
    assert_eq!(
        counter(
            &metrics,
            r#"keygate_websocket_auth_total{form="auth_cmd",result="out_of_scope"}"#
        ),
        3
    );
}

/// HTTP/1.1 only: an upgrade, which HTTP/2 does not have.
#[tokio::test]
async fn a_websocket_upgrade_on_a_proxied_route_is_checked_against_the_scope() {
    let upstream = Upstream::start().await;
    let gw = Gateway::start(&upstream.url(), "").await;
    let (user, admin_key) = admin(&gw, "scoped-upgrade@example.com").await;
    let grants = json!([{"path": "/api/device/", "methods": ["GET"]}]);
    let (key, _) = scoped_key(&gw, &admin_key, &user, grants).await;
    let response = raw_upgrade(&gw, "/api/stream", &key).await;
    let (status, body) = raw_status(&response);
    assert_eq!(
        (status, &body["errorCode"]),
        (403, &json!(20)),
        "{response}"
    );
    assert!(
        upstream.requests().is_empty(),
        "the upgrade was not forwarded"
    );
}

/// An upgrade to `path` over TLS with the key `key`; the raw answer.
async fn raw_upgrade(gw: &Gateway, path: &str, key: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let port = gw.running.https.unwrap().port();
    let tcp = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let server_name = rustls_pki_types::ServerName::try_from("localhost").unwrap();
    let mut tls = common::tls_connector(&gw.ca_pem)
        .connect(server_name, tcp)
        .await
        .unwrap();
    let request = format!(
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\n\
         Connection: Upgrade, close\r\nSec-WebSocket-Version: 13\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nX-Authorization: ApiKey {key}\r\n\r\n"
    );
    tls.write_all(request.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), tls.read_to_end(&mut out)).await;
    String::from_utf8_lossy(&out).into_owned()
}
