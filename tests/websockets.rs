//! WebSockets end to end, with a real client, the real server and the
//! reference entity service behind it: the platform's ways to authenticate
//! (authCmd with a JWT or an API key, `?token=`), the `X-Authorization`
//! upgrade, every close code, the deadline, limits, and sockets closed the
//! moment their credential dies.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::shared_redis::Prefix;
use common::{Gateway, PASSWORD};
use futures_util::{SinkExt, StreamExt};
use keygate::dev::ReferenceCounters as Counters;
use keygate::identity::Authority;
use keygate::store::{SessionRecord, UserRecord};
use serde_json::{Value, json};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::{self, Message};
use uuid::Uuid;

/// A close that came from the revocation itself: an order of magnitude under
/// the `cache.ttl` of [`REVOCATION`], after which a cached credential state
/// would have gone anyway. (The time each took is printed; alone it is a few
/// milliseconds.)
const AT_ONCE: Duration = Duration::from_secs(30);

/// The config of the tests that time a revocation: a cached credential state
/// lives 300 s, so a close within [`AT_ONCE`] was the revocation's doing.
const REVOCATION: &str = "[cache]\nttl = \"300s\"\n";

/// A bound for timings on a loaded machine (every test of this file runs
/// its own server at once): the printed times show the real values.
const LOADED: Duration = Duration::from_secs(15);

trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

type Socket = WebSocketStream<Box<dyn Io>>;

/// How long [`close_of`] waits: a guard against a test hanging, above every
/// bound the tests assert.
const CLOSE_WAIT: Duration = Duration::from_secs(90);

/// The reference entity service on a free port; its URL.
async fn reference() -> String {
    reference_counted().await.0
}

/// The reference entity service on a free port; its URL, and what it counts
/// (the sockets it accepted).
async fn reference_counted() -> (String, Arc<Counters>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let counters = Arc::new(Counters::default());
    let serving = keygate::dev::serve_reference_upstream_counted(
        listener,
        std::future::pending(),
        counters.clone(),
    );
    tokio::spawn(serving);
    (format!("http://{addr}"), counters)
}

/// keygate in front of the reference entity service, with `extra` config.
async fn setup(extra: &str) -> Gateway {
    Gateway::start(&reference().await, extra).await
}

/// [`setup`], with the counters of the reference service behind it.
async fn setup_counted(extra: &str) -> (Gateway, Arc<Counters>) {
    let (upstream, counters) = reference_counted().await;
    (Gateway::start(&upstream, extra).await, counters)
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Scheme {
    Wss,
    Ws,
}

/// Opens a socket to `path` (with its query) over `scheme`, with `headers`
/// on the upgrade.
async fn try_open(
    gw: &Gateway,
    scheme: Scheme,
    path: &str,
    headers: &[(&str, &str)],
) -> Result<Socket, tungstenite::Error> {
    let (port, name) = match scheme {
        Scheme::Wss => (gw.running.https.unwrap().port(), "wss"),
        Scheme::Ws => (gw.running.http.unwrap().port(), "ws"),
    };
    let mut request = format!("{name}://localhost:{port}{path}")
        .into_client_request()
        .unwrap();
    for (header, value) in headers {
        request.headers_mut().append(
            http::HeaderName::from_bytes(header.as_bytes()).unwrap(),
            value.parse().unwrap(),
        );
    }
    let tcp = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let io: Box<dyn Io> = match scheme {
        Scheme::Ws => Box::new(tcp),
        Scheme::Wss => {
            let server_name = rustls_pki_types::ServerName::try_from("localhost").unwrap();
            Box::new(
                common::tls_connector(&gw.ca_pem)
                    .connect(server_name, tcp)
                    .await
                    .unwrap(),
            )
        }
    };
    let (socket, _) = tokio_tungstenite::client_async(request, io).await?;
    Ok(socket)
}

/// A plain `ws://` socket to a loopback port.
async fn open_plain(port: u16, path: &str) -> Socket {
    let request = format!("ws://127.0.0.1:{port}{path}")
        .into_client_request()
        .unwrap();
    let tcp = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let io: Box<dyn Io> = Box::new(tcp);
    tokio_tungstenite::client_async(request, io)
        .await
        .unwrap()
        .0
}

async fn open(gw: &Gateway, path: &str) -> Socket {
    try_open(gw, Scheme::Wss, path, &[]).await.unwrap()
}

fn auth_cmd_token(token: &str, cmds: Value) -> String {
    json!({"authCmd": {"cmdId": 0, "token": token}, "cmds": cmds}).to_string()
}

fn auth_cmd_key(key: &str) -> String {
    json!({"authCmd": {"cmdId": 0, "apiKey": key}}).to_string()
}

async fn send(socket: &mut Socket, text: &str) {
    socket.send(Message::text(text.to_owned())).await.unwrap();
}

/// The next text message, as JSON (pings and pongs skipped).
async fn next_json(socket: &mut Socket) -> Value {
    let read = async {
        loop {
            match socket.next().await {
                Some(Ok(Message::Text(text))) => return serde_json::from_str(&text).unwrap(),
                Some(Ok(Message::Ping(_) | Message::Pong(_))) => {}
                other => panic!("expected a text message, got {other:?}"),
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(10), read)
        .await
        .expect("a message within 10 s")
}

/// Reads until the close frame; its code and reason.
async fn close_of(socket: &mut Socket) -> (u16, String) {
    let read = async {
        loop {
            match socket.next().await {
                Some(Ok(Message::Close(Some(frame)))) => {
                    return (u16::from(frame.code), frame.reason.to_string());
                }
                Some(Ok(Message::Close(None))) => return (1005, String::new()),
                Some(Ok(_)) => {}
                other => panic!("expected a close frame, got {other:?}"),
            }
        }
    };
    tokio::time::timeout(CLOSE_WAIT, read)
        .await
        .expect("a close frame in time")
}

/// Sends `text` and returns what the reference service says it received.
async fn round_trip(socket: &mut Socket, text: &str) -> Value {
    send(socket, text).await;
    next_json(socket).await
}

/// A socket authenticated with the API key `key` whose first message,
/// `text`, went through.
async fn keyed_socket(gw: &Gateway, key: &str, text: &str) -> Socket {
    let mut socket = open(gw, "/api/ws").await;
    send(&mut socket, &auth_cmd_key(key)).await;
    round_trip(&mut socket, text).await;
    socket
}

/// Disables a key through the API as the user holding `token`; the status.
async fn disable_key(gw: &Gateway, key_id: Uuid, token: &str) -> u16 {
    gw.client()
        .put(gw.https(&format!("/api/apiKey/{key_id}/enabled/false")))
        .header("X-Authorization", format!("Bearer {token}"))
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

/// A user with a fresh stored session and its access token.
async fn user_with_token(gw: &Gateway, email: &str) -> (UserRecord, Uuid, String) {
    let user = gw.user(email, Authority::TenantAdmin).await;
    let (session, token) = gw.access_token(&user).await;
    (user, session, token)
}

/// A token of a new session of `user` that expires `in_secs` from now.
async fn token_expiring_in(gw: &Gateway, user: &UserRecord, in_secs: i64) -> String {
    let session = SessionRecord::open(user.id, keygate::clock::now_ms(), String::new());
    gw.running.store.insert_session(&session).await.unwrap();
    let ttl = gw.running.app.settings().jwt.access_ttl.as_secs() as i64;
    let issued = keygate::clock::now_secs() - ttl + in_secs;
    let keys = gw.running.app.authenticator().token_keys();
    keys.sign_access(user, session.id, issued).unwrap().token
}

fn header<'v>(described: &'v Value, name: &str) -> Option<&'v str> {
    described["headers"][name].as_str()
}

#[tokio::test]
async fn auth_cmd_with_a_jwt_opens_the_upstream_with_the_verified_identity_and_runs_its_cmds() {
    let gw = setup("").await;
    let (user, session, token) = user_with_token(&gw, "ws-jwt@example.com").await;
    let mut socket = open(&gw, "/api/ws").await;
    let cmds = json!([{"cmdId": 1, "type": "ENTITY_DATA"}]);
    let described = round_trip(&mut socket, &auth_cmd_token(&token, cmds.clone())).await;
    assert_eq!(described["received"], json!({"cmds": cmds}), "{described}");
    assert_eq!(described["path"], "/api/ws");
    assert_eq!(
        header(&described, "x-auth-user-id"),
        Some(&*user.id.to_string())
    );
    assert_eq!(header(&described, "x-auth-method"), Some("jwt"));
    assert_eq!(
        header(&described, "x-auth-session-id"),
        Some(&*session.to_string())
    );
    assert_eq!(header(&described, "x-forwarded-proto"), Some("https"));
    // One Host, the upstream's (a second would be described as a list); the
    // client's went to X-Forwarded-Host.
    let host = header(&described, "host").unwrap_or_default();
    assert!(host.starts_with("127.0.0.1:"), "{described}");
    assert!(
        header(&described, "x-forwarded-host").is_some_and(|h| h.starts_with("localhost:")),
        "{described}"
    );
    assert!(!described.to_string().contains(&token));

    let echoed = round_trip(&mut socket, r#"{"cmds":[{"cmdId":2}]}"#).await;
    assert_eq!(echoed["received"], json!({"cmds": [{"cmdId": 2}]}));
    socket.close(None).await.unwrap();
}

#[tokio::test]
async fn auth_cmd_with_an_api_key_authenticates_the_socket() {
    let gw = setup("").await;
    let user = gw.user("ws-key@example.com", Authority::TenantAdmin).await;
    let (key_id, key) = gw.api_key(&user, 0).await;
    let mut socket = open(&gw, "/api/ws").await;
    send(&mut socket, &auth_cmd_key(&key)).await;
    // Nothing was left of the first frame: the first answer is for this one.
    let described = round_trip(&mut socket, "hello").await;
    assert_eq!(described["received"], "hello", "{described}");
    assert_eq!(header(&described, "x-auth-method"), Some("api-key"));
    assert_eq!(
        header(&described, "x-auth-api-key-id"),
        Some(&*key_id.to_string())
    );
    assert!(!described.to_string().contains(&key));
}

#[tokio::test]
async fn query_token_on_the_deprecated_path_never_reaches_the_upstream() {
    let gw = setup("").await;
    let (user, _, token) = user_with_token(&gw, "ws-query@example.com").await;
    let path = format!("/api/ws/plugins/telemetry?a=1&token={token}&b=2");
    let mut socket = open(&gw, &path).await;
    let described = round_trip(&mut socket, r#"{"tsSubCmds":[]}"#).await;
    assert_eq!(described["path"], "/api/ws/plugins/telemetry");
    assert_eq!(described["query"], "a=1&b=2");
    assert_eq!(
        header(&described, "x-auth-user-id"),
        Some(&*user.id.to_string())
    );
    assert!(!described.to_string().contains(&token));
}

#[tokio::test]
async fn x_authorization_on_the_upgrade_authenticates_a_non_browser_client() {
    let gw = setup("").await;
    let user = gw
        .user("ws-header@example.com", Authority::TenantAdmin)
        .await;
    let (_, key) = gw.api_key(&user, 0).await;
    let credential = common::api_key_header(&key);
    let mut socket = try_open(
        &gw,
        Scheme::Wss,
        "/api/ws",
        &[("X-Authorization", &credential)],
    )
    .await
    .unwrap();
    let described = round_trip(&mut socket, r#"{"cmds":[]}"#).await;
    assert_eq!(described["received"], json!({"cmds": []}));
    assert_eq!(header(&described, "x-auth-method"), Some("api-key"));
    assert_eq!(header(&described, "x-authorization"), None);
}

#[tokio::test]
async fn spoofed_identity_headers_on_the_upgrade_never_reach_the_upstream() {
    let gw = setup("").await;
    let (user, _, token) = user_with_token(&gw, "ws-spoof@example.com").await;
    let mut socket = try_open(
        &gw,
        Scheme::Wss,
        "/api/ws",
        &[
            ("X-Auth-User-Id", "evil"),
            ("x_auth_tenant_id", "evil"),
            ("X-Auth-Authority", "SYS_ADMIN"),
            ("X-Forwarded-For", "203.0.113.66"),
            ("Connection", "x-auth-user-id"),
        ],
    )
    .await
    .unwrap();
    let described = round_trip(&mut socket, &auth_cmd_token(&token, json!([{"cmdId": 1}]))).await;
    assert_eq!(
        header(&described, "x-auth-user-id"),
        Some(&*user.id.to_string())
    );
    assert_eq!(header(&described, "x-auth-authority"), Some("TENANT_ADMIN"));
    assert_eq!(header(&described, "x-forwarded-for"), Some("127.0.0.1"));
    assert!(!described.to_string().contains("evil"), "{described}");
}

/// Only `/api/ws/plugins/` is a platform WebSocket route: an upgrade on
/// `/api/ws` is one on a proxied route, checked like any request.
const ONE_SOCKET_ROUTE: &str = "[websocket]\nroutes = [\"/api/ws/plugins/\"]\n";

#[tokio::test]
async fn method_override_headers_on_the_upgrade_never_reach_the_upstream() {
    let gw = setup(ONE_SOCKET_ROUTE).await;
    let (_, _, token) = user_with_token(&gw, "ws-override@example.com").await;
    let bearer = format!("Bearer {token}");
    // A platform WebSocket route, and an upgrade on a proxied route.
    for path in ["/api/ws/plugins/telemetry", "/api/ws"] {
        let mut socket = try_open(
            &gw,
            Scheme::Wss,
            path,
            &[
                ("X-Authorization", &bearer),
                ("X-HTTP-Method-Override", "DELETE"),
                ("X-HTTP-Method", "DELETE"),
                ("X-Method-Override", "DELETE"),
                ("x_http_method_override", "DELETE"),
            ],
        )
        .await
        .unwrap();
        let described = round_trip(&mut socket, r#"{"cmds":[]}"#).await;
        assert_eq!(header(&described, "x-auth-method"), Some("jwt"), "{path}");
        assert!(
            !described.to_string().contains("DELETE"),
            "{path}: {described}"
        );
    }
}

#[tokio::test]
async fn an_upgrade_with_a_header_folding_to_a_framing_name_is_refused_with_400() {
    let (gw, upstream) = setup_counted(ONE_SOCKET_ROUTE).await;
    let (_, _, token) = user_with_token(&gw, "ws-folded@example.com").await;
    let bearer = format!("Bearer {token}");
    for (name, value) in [("Content_Length", "5"), ("Transfer_Encoding", "chunked")] {
        for path in ["/api/ws/plugins/telemetry", "/api/ws"] {
            let refused = try_open(
                &gw,
                Scheme::Wss,
                path,
                &[("X-Authorization", &bearer), (name, value)],
            )
            .await;
            match refused {
                Err(tungstenite::Error::Http(response)) => {
                    assert_eq!(response.status(), 400, "{name} {path}");
                    let body: Value =
                        serde_json::from_slice(response.body().as_deref().unwrap()).unwrap();
                    assert_eq!(body["status"], 400, "{body}");
                    assert_eq!(body["errorCode"], 31, "{body}");
                    assert!(body["message"].as_str().unwrap().contains("header name"));
                }
                other => panic!("{name} {path}: {:?}", other.map(|_| "a socket")),
            }
        }
    }
    assert_eq!(
        upstream.sockets(),
        0,
        "a refused upgrade reached the upstream"
    );
}

#[tokio::test]
async fn a_first_frame_without_auth_cmd_closes_1008() {
    let (gw, upstream) = setup_counted("").await;
    let mut socket = open(&gw, "/api/ws").await;
    send(&mut socket, r#"{"cmds":[{"cmdId":1}]}"#).await;
    let (code, _) = close_of(&mut socket).await;
    assert_eq!(code, 1008);
    assert_eq!(
        upstream.sockets(),
        0,
        "a refused socket reached the upstream"
    );
}

#[tokio::test]
async fn a_client_that_never_authenticates_is_closed_1008_at_the_deadline() {
    let (gw, upstream) = setup_counted("[websocket]\nauth_timeout = \"300ms\"\n").await;
    let started = Instant::now();
    let mut socket = open(&gw, "/api/ws").await;
    let (code, _) = close_of(&mut socket).await;
    let took = started.elapsed();
    println!("closed for the deadline after {took:?}");
    assert_eq!(code, 1008);
    assert!(took >= Duration::from_millis(300) && took < LOADED);
    assert_eq!(
        upstream.sockets(),
        0,
        "a refused socket reached the upstream"
    );
}

#[tokio::test]
async fn a_bad_credential_closes_1007_with_the_contract_message() {
    let (gw, upstream) = setup_counted("").await;
    let mut socket = open(&gw, "/api/ws").await;
    send(&mut socket, &auth_cmd_token("not.a.token", json!([]))).await;
    assert_eq!(
        close_of(&mut socket).await,
        (1007, "Invalid username or password".into())
    );

    let mut socket = open(&gw, "/api/ws").await;
    send(&mut socket, &auth_cmd_key("tb_guessed_key_value")).await;
    assert_eq!(
        close_of(&mut socket).await,
        (1007, "Invalid username or password".into())
    );
    assert_eq!(
        upstream.sockets(),
        0,
        "a refused socket reached the upstream"
    );
}

#[tokio::test]
async fn an_expired_jwt_in_the_query_closes_1011_and_in_auth_cmd_1007() {
    let (gw, upstream) = setup_counted("").await;
    let user = gw
        .user("ws-expired@example.com", Authority::TenantAdmin)
        .await;
    let expired = token_expiring_in(&gw, &user, -10).await;
    let mut socket = open(&gw, &format!("/api/ws/plugins/telemetry?token={expired}")).await;
    assert_eq!(
        close_of(&mut socket).await,
        (1011, "Token has expired".into())
    );
    let mut socket = open(&gw, "/api/ws").await;
    send(&mut socket, &auth_cmd_token(&expired, json!([]))).await;
    assert_eq!(
        close_of(&mut socket).await,
        (1007, "Token has expired".into())
    );
    assert_eq!(
        upstream.sockets(),
        0,
        "a refused socket reached the upstream"
    );
}

#[tokio::test]
async fn an_api_key_sent_over_plain_ws_is_refused_and_disabled() {
    let (gw, upstream) = setup_counted("[api_keys]\ndisable_on_plaintext = true\n").await;
    let user = gw
        .user("ws-clear@example.com", Authority::TenantAdmin)
        .await;
    let (_, key) = gw.api_key(&user, 0).await;
    let mut socket = try_open(&gw, Scheme::Ws, "/api/ws", &[]).await.unwrap();
    send(&mut socket, &auth_cmd_key(&key)).await;
    assert_eq!(
        close_of(&mut socket).await,
        (1008, "API keys are accepted only over HTTPS".into())
    );
    // The key crossed the wire in clear: it no longer works anywhere.
    let mut socket = open(&gw, "/api/ws").await;
    send(&mut socket, &auth_cmd_key(&key)).await;
    let (code, _) = close_of(&mut socket).await;
    assert_eq!(code, 1007);
    assert_eq!(
        upstream.sockets(),
        0,
        "a refused socket reached the upstream"
    );
}

#[tokio::test]
async fn a_jwt_over_plain_ws_from_loopback_is_accepted_as_over_http() {
    let gw = setup("").await;
    let (_, _, token) = user_with_token(&gw, "ws-loopback@example.com").await;
    let mut socket = try_open(&gw, Scheme::Ws, "/api/ws", &[]).await.unwrap();
    let described = round_trip(&mut socket, &auth_cmd_token(&token, json!([{"cmdId": 3}]))).await;
    assert_eq!(header(&described, "x-forwarded-proto"), Some("http"));
}

/// Waits for the close frame and prints how long it took since `since`.
async fn closed_after(socket: &mut Socket, since: Instant, what: &str) -> (u16, String) {
    let close = close_of(socket).await;
    println!("{what}: socket closed {:?} later", since.elapsed());
    close
}

#[tokio::test]
async fn disabling_the_key_closes_its_open_socket_with_1008() {
    let gw = setup(REVOCATION).await;
    let user = gw
        .user("ws-disable@example.com", Authority::TenantAdmin)
        .await;
    let (key_id, key) = gw.api_key(&user, 0).await;
    let (_, token) = gw.access_token(&user).await;
    let mut socket = keyed_socket(&gw, &key, "up").await;

    let started = Instant::now();
    assert_eq!(disable_key(&gw, key_id, &token).await, 200);
    let (code, reason) = closed_after(&mut socket, started, "key disabled").await;
    assert_eq!(code, 1008);
    assert_eq!(reason, "User account is not active");
    assert!(started.elapsed() < AT_ONCE);
}

#[tokio::test]
async fn logout_closes_the_sessions_socket_with_1008() {
    let gw = setup(REVOCATION).await;
    let user = gw
        .user("ws-logout@example.com", Authority::TenantAdmin)
        .await;
    let login: Value = gw
        .client()
        .post(gw.https("/api/auth/login"))
        .json(&json!({"username": user.email, "password": PASSWORD}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let token = login["token"].as_str().unwrap().to_owned();
    let mut socket = open(&gw, "/api/ws").await;
    round_trip(&mut socket, &auth_cmd_token(&token, json!([{"cmdId": 1}]))).await;

    let started = Instant::now();
    let logout = gw
        .client()
        .post(gw.https("/api/auth/logout"))
        .header("X-Authorization", format!("Bearer {token}"))
        .send()
        .await
        .unwrap();
    assert_eq!(logout.status(), 200);
    let (code, reason) = closed_after(&mut socket, started, "logout").await;
    assert_eq!((code, reason.as_str()), (1008, "Token has expired"));
    assert!(started.elapsed() < AT_ONCE);
}

#[tokio::test]
async fn a_jwt_reaching_exp_closes_its_socket_with_1008() {
    let gw = setup("").await;
    let user = gw.user("ws-exp@example.com", Authority::TenantAdmin).await;
    let token = token_expiring_in(&gw, &user, 5).await;
    let mut socket = open(&gw, "/api/ws").await;
    round_trip(&mut socket, &auth_cmd_token(&token, json!([{"cmdId": 1}]))).await;
    let started = Instant::now();
    let (code, reason) = closed_after(&mut socket, started, "JWT exp").await;
    assert_eq!((code, reason.as_str()), (1008, "Token has expired"));
    assert!(started.elapsed() < LOADED);
}

#[tokio::test]
async fn sockets_over_the_per_user_limit_are_closed_with_the_platforms_wording() {
    let (gw, upstream) = setup_counted("[websocket]\nmax_per_user = 20\n").await;
    let user = gw.user("ws-many@example.com", Authority::TenantAdmin).await;
    let (_, key) = gw.api_key(&user, 0).await;
    let mut open_sockets = Vec::new();
    for n in 0..20 {
        let mut socket = open(&gw, "/api/ws").await;
        send(&mut socket, &auth_cmd_key(&key)).await;
        let described = round_trip(&mut socket, &format!("socket {n}")).await;
        assert_eq!(described["received"], format!("socket {n}"));
        open_sockets.push(socket);
    }
    let mut extra = open(&gw, "/api/ws").await;
    send(&mut extra, &auth_cmd_key(&key)).await;
    assert_eq!(
        close_of(&mut extra).await,
        (1008, "Max regular user sessions limit reached!".into())
    );
    assert_eq!(
        upstream.sockets(),
        20,
        "the refused socket reached the upstream"
    );
    // Another user is not limited by this one's sockets.
    let other = gw
        .user("ws-other@example.com", Authority::TenantAdmin)
        .await;
    let (_, other_key) = gw.api_key(&other, 0).await;
    let mut socket = open(&gw, "/api/ws").await;
    send(&mut socket, &auth_cmd_key(&other_key)).await;
    round_trip(&mut socket, "other").await;
    // A closed socket frees its place (its seat goes before it stops
    // counting as open: 20 of this user's and the other's make 21).
    open_sockets.pop().unwrap().close(None).await.unwrap();
    common::wait_until("the closed socket is gone", LOADED, async || {
        gw.metrics()
            .await
            .contains("keygate_websocket_open{route=\"/api/ws\"} 20\n")
    })
    .await;
    let mut again = open(&gw, "/api/ws").await;
    send(&mut again, &auth_cmd_key(&key)).await;
    round_trip(&mut again, "again").await;
    let metrics = gw.metrics().await;
    assert!(
        metrics.contains("keygate_websocket_closes_total{reason=\"user_limit\"} 1"),
        "{metrics}"
    );
    // An upgraded connection still counts as open, and holds its place.
    let open_connections: i64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("keygate_open_connections{listener=\"https\"} "))
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        open_connections >= 21,
        "{open_connections} open connections"
    );
}

/// The config of a replica whose WebSocket limits are shared through
/// Redis at `redis` under `prefix`. Redis's answers get the time a loaded machine may take: with a short
/// command timeout a slow answer under the full suite made a replica decide
/// on its own count (the fallback), and admit a socket the other replica
/// held the seat for. A cut relay fails at once, whatever the timeout.
fn shared_seats(redis: &str, prefix: &Prefix) -> String {
    format!(
        "[redis]\nurl = \"{redis}\"\nkey_prefix = \"{}\"\ncommand_timeout = \"3s\"\n\
         [websocket]\nmax_per_user = 1\n",
        prefix.0
    )
}

/// Opens a socket authenticated with `key` and says whether it was admitted
/// (the closing message when it was not).
async fn admitted(gw: &Gateway, key: &str) -> Result<Socket, String> {
    let mut socket = open(gw, "/api/ws").await;
    send(&mut socket, &auth_cmd_key(key)).await;
    send(&mut socket, "ping").await;
    let answer = tokio::time::timeout(LOADED, socket.next()).await.unwrap();
    match answer {
        Some(Ok(Message::Text(_))) => Ok(socket),
        Some(Ok(Message::Close(Some(frame)))) => Err(frame.reason.to_string()),
        other => panic!("unexpected answer {other:?}"),
    }
}

/// A socket admitted once a seat is free (a closed socket frees its seat
/// when keygate has seen the close), within [`LOADED`].
async fn admitted_soon(gw: &Gateway, key: &str) -> Socket {
    let started = Instant::now();
    loop {
        match admitted(gw, key).await {
            Ok(socket) => return socket,
            Err(reason) => assert!(started.elapsed() < LOADED, "still refused: {reason}"),
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
#[ignore = "needs PostgreSQL: set KEYGATE_TEST_DATABASE_URL and run with --include-ignored"]
async fn a_user_over_the_socket_limit_at_one_replica_is_refused_at_the_other() {
    let base = common::test_database_url();
    let (url, schema) = common::fresh_schema(&base).await;
    let prefix = Prefix::new();
    let relay = common::Relay::start(common::shared_redis::redis_addr()).await;
    let config = shared_seats(&format!("redis://{}/", relay.addr), &prefix);
    let (upstream, counters) = reference_counted().await;
    let a = Gateway::start_on(&upstream, &config, Some(&url)).await;
    let b = Gateway::start_on(&upstream, &config, Some(&url)).await;
    for gw in [&a, &b] {
        common::wait_until("redis answers", LOADED, async || {
            gw.metrics().await.contains("keygate_redis_up 1")
        })
        .await;
    }
    let user = a
        .user("ws-shared@example.com", Authority::TenantAdmin)
        .await;
    let (_, key) = a.api_key(&user, 0).await;
    let full = "Max regular user sessions limit reached!".to_owned();

    let at_a = admitted(&a, &key)
        .await
        .expect("the first socket is admitted");
    assert_eq!(admitted(&b, &key).await.err(), Some(full.clone()));
    assert_eq!(
        counters.sockets(),
        1,
        "the refused socket reached the upstream"
    );
    // Closing it frees the seat for the other replica at once (a client
    // reconnecting through another replica is not refused).
    drop(at_a);
    let started = Instant::now();
    let at_b = admitted_soon(&b, &key).await;
    println!(
        "a closed socket's seat was free at the other replica after {:?}",
        started.elapsed()
    );
    assert_eq!(admitted(&a, &key).await.err(), Some(full.clone()));

    // Redis gone: each replica decides from its own count.
    relay.cut();
    let at_a = admitted(&a, &key)
        .await
        .expect("without Redis, A counts its own sockets only");
    let fallbacks: u64 = a
        .metrics()
        .await
        .lines()
        .find_map(|l| l.strip_prefix(r#"keygate_redis_fallbacks_total{limits="websocket"} "#))
        .unwrap()
        .parse()
        .unwrap();
    assert!(fallbacks >= 1, "the local decision is counted");
    assert_eq!(admitted(&a, &key).await.err(), Some(full.clone()));

    // Redis back: the counts are shared again.
    relay.restore();
    drop((at_a, at_b));
    let _held = admitted_soon(&a, &key).await;
    common::wait_until("B refuses again", LOADED, async || {
        admitted(&b, &key).await.err() == Some(full.clone())
    })
    .await;
    drop((a, b));
    common::drop_schema(&base, &schema).await;
}

#[tokio::test]
async fn messages_sent_together_all_arrive_in_order() {
    let gw = setup("").await;
    let user = gw
        .user("ws-burst@example.com", Authority::TenantAdmin)
        .await;
    let (_, key) = gw.api_key(&user, 0).await;
    let mut socket = keyed_socket(&gw, &key, "up").await;
    // More than keygate passes on in one write, fed without a flush between
    // them so that they arrive together.
    for i in 0u32..50 {
        socket
            .feed(Message::binary(i.to_be_bytes().repeat(256)))
            .await
            .unwrap();
    }
    socket.flush().await.unwrap();
    for i in 0u32..50 {
        let echoed = tokio::time::timeout(Duration::from_secs(10), socket.next())
            .await
            .expect("an echo within 10 s");
        match echoed {
            Some(Ok(Message::Binary(bytes))) => {
                assert_eq!(&bytes[..], &i.to_be_bytes().repeat(256)[..], "message {i}")
            }
            other => panic!("expected echo {i}, got {other:?}"),
        }
    }
}

#[tokio::test]
async fn an_oversized_message_closes_1009() {
    let gw = setup("[websocket]\nmax_message_bytes = 1024\n").await;
    let user = gw.user("ws-big@example.com", Authority::TenantAdmin).await;
    let (_, key) = gw.api_key(&user, 0).await;
    let mut socket = keyed_socket(&gw, &key, "small").await;
    send(&mut socket, &"x".repeat(2048)).await;
    let (code, _) = close_of(&mut socket).await;
    assert_eq!(code, 1009);
}

#[tokio::test]
async fn shutdown_closes_open_sockets_with_1001() {
    let gw = setup("").await;
    let user = gw
        .user("ws-drain@example.com", Authority::TenantAdmin)
        .await;
    let (_, key) = gw.api_key(&user, 0).await;
    let mut socket = keyed_socket(&gw, &key, "up").await;
    let mut waiting = open(&gw, "/api/ws").await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let started = Instant::now();
    gw.running.shutdown();
    let (code, _) = close_of(&mut socket).await;
    assert_eq!(code, 1001);
    // One still to authenticate is not waited for until its deadline.
    let (code, _) = close_of(&mut waiting).await;
    assert_eq!(code, 1001);
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[tokio::test]
async fn an_upgrade_on_another_route_is_checked_like_any_request() {
    let (gw, upstream) = setup_counted("[websocket]\nroutes = [\"/api/ws/plugins/\"]\n").await;
    let refused = try_open(&gw, Scheme::Wss, "/api/ws", &[]).await;
    match refused {
        Err(tungstenite::Error::Http(response)) => assert_eq!(response.status(), 401),
        other => panic!("expected a 401, got {:?}", other.map(|_| ())),
    }
    assert_eq!(
        upstream.sockets(),
        0,
        "a refused upgrade reached the upstream"
    );
    let user = gw
        .user("ws-plain@example.com", Authority::TenantAdmin)
        .await;
    let (_, key) = gw.api_key(&user, 0).await;
    let credential = common::api_key_header(&key);
    let mut socket = try_open(
        &gw,
        Scheme::Wss,
        "/api/ws",
        &[("X-Authorization", &credential)],
    )
    .await
    .unwrap();
    // No authCmd handling here: the first frame goes through as it is.
    let described = round_trip(&mut socket, r#"{"authCmd":{"cmdId":0}}"#).await;
    assert_eq!(described["received"], json!({"authCmd": {"cmdId": 0}}));
    assert_eq!(header(&described, "x-auth-method"), Some("api-key"));
}

#[tokio::test]
async fn a_silent_client_is_pinged_then_closed_1001_and_a_live_one_stays() {
    let gw = setup("[websocket]\nping_interval = \"200ms\"\nidle_timeout = \"300ms\"\n").await;
    let user = gw.user("ws-idle@example.com", Authority::TenantAdmin).await;
    let (_, key) = gw.api_key(&user, 0).await;
    let mut silent = open(&gw, "/api/ws").await;
    send(&mut silent, &auth_cmd_key(&key)).await;
    round_trip(&mut silent, "silent").await;
    let mut live = open(&gw, "/api/ws").await;
    send(&mut live, &auth_cmd_key(&key)).await;
    round_trip(&mut live, "live").await;
    // Reading answers pings (the client library sends the pong); the silent
    // socket reads nothing, so it never answers.
    let mut pings = 0;
    let until = Instant::now() + Duration::from_millis(1200);
    while let Ok(Some(Ok(message))) = tokio::time::timeout_at(until.into(), live.next()).await {
        pings += usize::from(matches!(message, Message::Ping(_)));
    }
    assert!(pings >= 1, "the live client was pinged");
    assert_eq!(close_of(&mut silent).await, (1001, "Idle timeout".into()));
    assert_eq!(
        round_trip(&mut live, "still here").await["received"],
        "still here"
    );
}

#[tokio::test]
async fn sigterm_closes_open_sockets_with_1001_and_the_log_never_shows_the_token() {
    let upstream = reference().await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("keygate.toml");
    let data = dir.path().display();
    std::fs::write(
        &config,
        format!(
            "[server]\ndata_dir = \"{data}\"\nshutdown_grace = \"10s\"\n\
             [listen]\nhttps = \"127.0.0.1:0\"\nhttp = \"127.0.0.1:0\"\nadmin = \"127.0.0.1:0\"\n\
             [store]\nurl = \"sqlite://{data}/k.db\"\n[[route]]\nprefix = \"/api/\"\nupstreams = [\"{upstream}\"]\n"
        ),
    )
    .unwrap();
    let mut process = common::Process::spawn(&config, "info");
    let login: Value = reqwest::Client::new()
        .post(format!("http://127.0.0.1:{}/api/auth/login", process.http))
        .json(&json!({"username": "sysadmin@keygate.local", "password": "bootstrap-password"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let token = login["token"].as_str().unwrap().to_owned();
    let path = format!("/api/ws/plugins/telemetry?token={token}");
    let mut by_query = open_plain(process.http, &path).await;
    round_trip(&mut by_query, r#"{"tsSubCmds":[]}"#).await;
    let mut by_frame = open_plain(process.http, "/api/ws").await;
    round_trip(
        &mut by_frame,
        &auth_cmd_token(&token, json!([{"cmdId": 1}])),
    )
    .await;

    let started = Instant::now();
    process.signal("TERM");
    for socket in [&mut by_query, &mut by_frame] {
        let (code, _) = closed_after(socket, started, "SIGTERM").await;
        assert_eq!(code, 1001);
    }
    let log_path = process.log.clone();
    let exit = tokio::task::spawn_blocking(move || process.child.wait().map(|e| (e, log_path)))
        .await
        .unwrap()
        .unwrap();
    assert!(exit.0.success(), "keygate exits 0 after draining");
    let log = std::fs::read_to_string(&exit.1).unwrap();
    assert!(!log.contains(&token), "the token reached the log");
    assert_eq!(
        log.lines()
            .filter(|line| line.contains(r#""websocket":"shutdown""#))
            .count(),
        2,
        "{log}"
    );
}

#[tokio::test]
#[ignore = "needs PostgreSQL: set KEYGATE_TEST_DATABASE_URL and run with --include-ignored"]
async fn a_key_disabled_through_one_replica_closes_its_socket_on_the_other() {
    let base = common::test_database_url();
    let (url, schema) = common::fresh_schema(&base).await;
    let upstream = reference().await;
    let a = Gateway::start_on(&upstream, REVOCATION, Some(&url)).await;
    let b = Gateway::start_on(&upstream, REVOCATION, Some(&url)).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while !b
        .metrics()
        .await
        .contains("keygate_revocation_listener_up 1")
    {
        assert!(Instant::now() < deadline, "replica B never listened");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let user = a
        .user("ws-replicas@example.com", Authority::TenantAdmin)
        .await;
    let (key_id, key) = a.api_key(&user, 0).await;
    let (_, token) = a.access_token(&user).await;
    let mut socket = keyed_socket(&b, &key, "on replica B").await;

    let started = Instant::now();
    assert_eq!(disable_key(&a, key_id, &token).await, 200);
    let (code, _) = closed_after(&mut socket, started, "key disabled on the other replica").await;
    assert_eq!(code, 1008);
    assert!(started.elapsed() < AT_ONCE);
    a.running.shutdown();
    b.running.shutdown();
    common::drop_schema(&base, &schema).await;
}

#[tokio::test]
async fn an_unreachable_upstream_closes_the_authenticated_socket_1011() {
    let gw = Gateway::start("http://127.0.0.1:1", "").await;
    let user = gw.user("ws-down@example.com", Authority::TenantAdmin).await;
    let (_, key) = gw.api_key(&user, 0).await;
    let mut socket = open(&gw, "/api/ws").await;
    send(&mut socket, &auth_cmd_key(&key)).await;
    assert_eq!(
        close_of(&mut socket).await,
        (1011, "Upstream is unavailable".into())
    );
}

/// Opens a socket on `/api/ws` authenticated by `frame`, and checks it is up.
async fn open_with(gw: &Gateway, frame: &str) -> Socket {
    let mut socket = open(gw, "/api/ws").await;
    send(&mut socket, frame).await;
    assert_eq!(round_trip(&mut socket, "up").await["received"], "up");
    socket
}

#[tokio::test]
async fn disabling_the_user_closes_every_socket_of_theirs_with_1008() {
    let gw = setup(REVOCATION).await;
    let admin = gw
        .user("ws-sysadmin@example.com", Authority::SysAdmin)
        .await;
    let (_, admin_token) = gw.access_token(&admin).await;
    let user = gw
        .user("ws-user-off@example.com", Authority::TenantAdmin)
        .await;
    let (_, key) = gw.api_key(&user, 0).await;
    let (_, token) = gw.access_token(&user).await;
    let mut by_key = open_with(&gw, &auth_cmd_key(&key)).await;
    let mut by_token = open_with(&gw, &auth_cmd_token(&token, json!([]))).await;

    let started = Instant::now();
    let disabled = gw
        .client()
        .post(gw.https(&format!(
            "/api/user/{}/userCredentialsEnabled?userCredentialsEnabled=false",
            user.id
        )))
        .header("X-Authorization", format!("Bearer {admin_token}"))
        .send()
        .await
        .unwrap();
    assert_eq!(disabled.status(), 200);
    for socket in [&mut by_key, &mut by_token] {
        let close = closed_after(socket, started, "user disabled").await;
        assert_eq!(close, (1008, "User account is not active".into()));
    }
    assert!(started.elapsed() < AT_ONCE);
}

#[tokio::test]
async fn an_api_key_reaching_its_expiration_time_closes_its_socket_with_1008() {
    let gw = setup("").await;
    let user = gw
        .user("ws-key-exp@example.com", Authority::TenantAdmin)
        .await;
    let (_, key) = gw.api_key(&user, keygate::clock::now_ms() + 5000).await;
    let mut socket = open_with(&gw, &auth_cmd_key(&key)).await;
    let started = Instant::now();
    let close = closed_after(&mut socket, started, "API key expiration").await;
    assert_eq!(close, (1008, "API key is expired".into()));
    assert!(started.elapsed() < LOADED);
}

#[tokio::test]
async fn a_password_change_closes_the_users_older_token_sockets_but_not_their_key_sockets() {
    let gw = setup("").await;
    let user = gw
        .user("ws-password@example.com", Authority::TenantAdmin)
        .await;
    let (_, key) = gw.api_key(&user, 0).await;
    // Issued a minute ago: strictly older than the change.
    let ttl = gw.running.app.settings().jwt.access_ttl.as_secs() as i64;
    let older = token_expiring_in(&gw, &user, ttl - 60).await;
    let mut by_token = open_with(&gw, &auth_cmd_token(&older, json!([]))).await;
    let mut by_key = open_with(&gw, &auth_cmd_key(&key)).await;

    let started = Instant::now();
    let changed = gw
        .client()
        .post(gw.https("/api/auth/changePassword"))
        .header("X-Authorization", format!("Bearer {older}"))
        .json(&json!({"currentPassword": PASSWORD, "newPassword": "another-horse-battery"}))
        .send()
        .await
        .unwrap();
    assert_eq!(changed.status(), 200);
    let close = closed_after(&mut by_token, started, "password change").await;
    assert_eq!(close, (1008, "Token has expired".into()));
    // An API key outlives a password change, over HTTP and here alike.
    assert_eq!(round_trip(&mut by_key, "key").await["received"], "key");
    let metrics = gw.metrics().await;
    for line in [
        "keygate_websocket_closes_total{reason=\"revoked\"} 1",
        "keygate_websocket_auth_total{form=\"auth_cmd\",result=\"accepted\"} 2",
        "keygate_websocket_open{route=\"/api/ws\"} 1",
    ] {
        assert!(metrics.contains(line), "{line} not in:\n{metrics}");
    }
}

#[tokio::test]
async fn sockets_over_the_per_tenant_limit_are_closed_with_the_platforms_wording() {
    let (gw, upstream) = setup_counted("[websocket]\nmax_per_tenant = 2\n").await;
    let first = gw
        .user("ws-tenant-a@example.com", Authority::TenantAdmin)
        .await;
    let colleague = keygate::accounts::NewUser {
        email: "ws-tenant-b@example.com".into(),
        authority: Authority::CustomerUser,
        tenant_id: Some(first.tenant_id),
        customer_id: Some(Uuid::new_v4()),
        first_name: "Colleague".into(),
        last_name: String::new(),
    };
    let policy = Default::default();
    let second =
        keygate::accounts::create_user(&gw.running.store, colleague, PASSWORD.into(), &policy)
            .await
            .unwrap();
    let (_, first_key) = gw.api_key(&first, 0).await;
    let (_, second_key) = gw.api_key(&second, 0).await;
    let _a = open_with(&gw, &auth_cmd_key(&first_key)).await;
    let _b = open_with(&gw, &auth_cmd_key(&second_key)).await;
    let mut over = open(&gw, "/api/ws").await;
    send(&mut over, &auth_cmd_key(&second_key)).await;
    assert_eq!(
        close_of(&mut over).await,
        (1008, "Max tenant sessions limit reached!".into())
    );
    assert_eq!(
        upstream.sockets(),
        2,
        "the refused socket reached the upstream"
    );
    // Another tenant is not limited by this one's sockets.
    let other = gw
        .user("ws-tenant-c@example.com", Authority::TenantAdmin)
        .await;
    let (_, other_key) = gw.api_key(&other, 0).await;
    open_with(&gw, &auth_cmd_key(&other_key)).await;
}

/// Resident memory of this test process (the gateway runs in it), in KiB.
fn own_rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// A client that sends and never reads: the upstream's answers pile up
/// towards it, and keygate must push back instead of buffering them.
#[tokio::test]
async fn a_socket_that_never_reads_is_held_back_not_buffered() {
    let gw = setup("").await;
    let user = gw
        .user("ws-greedy@example.com", Authority::TenantAdmin)
        .await;
    let (_, token) = gw.access_token(&user).await;
    let mut socket = open(&gw, "/api/ws").await;
    let auth_cmd = json!({"authCmd": {"cmdId": 0, "token": token}}).to_string();
    send(&mut socket, &auth_cmd).await;
    let before = own_rss_kib();

    // Each message makes the reference upstream answer with at least as much.
    // Writing stops when one message stays unsent for a while: keygate no
    // longer reads from us.
    let message = json!({"cmds": [{"cmdId": 1, "pad": "x".repeat(16 * 1024)}]}).to_string();
    let mut written = 0usize;
    let mut held_back = false;
    let started = Instant::now();
    while written < 256 << 20 && started.elapsed() < LOADED * 4 {
        match tokio::time::timeout(
            Duration::from_secs(2),
            socket.send(Message::text(message.clone())),
        )
        .await
        {
            Ok(Ok(())) => written += message.len(),
            Ok(Err(error)) => panic!("the socket failed instead of pushing back: {error}"),
            Err(_) => {
                held_back = true;
                break;
            }
        }
    }
    let during = own_rss_kib();
    println!(
        "a socket that never reads: {} KiB written in {:?} before keygate stopped reading; RSS {before} -> {during} KiB",
        written / 1024,
        started.elapsed()
    );
    assert!(
        held_back,
        "keygate never pushed back: {} KiB written",
        written / 1024
    );
    assert!(
        written < 64 << 20,
        "keygate kept reading {} MiB from a client that reads nothing",
        written >> 20
    );
    assert!(
        during < before + 128 * 1024,
        "memory grew from {before} KiB to {during} KiB"
    );
    // Others are served meanwhile.
    let (_, key) = gw.api_key(&user, 0).await;
    let mut other = open(&gw, "/api/ws").await;
    send(&mut other, &auth_cmd_key(&key)).await;
    send(&mut other, &json!({"cmds": [{"cmdId": 2}]}).to_string()).await;
    let reply = tokio::time::timeout(LOADED, next_json(&mut other))
        .await
        .expect("another socket answered meanwhile");
    assert_eq!(reply["received"]["cmds"][0]["cmdId"], 2);
}

/// An upgrade to `path` over TLS with `credential`, asking the connection to
/// close after the answer; the raw answer.
async fn raw_upgrade(gw: &Gateway, path: &str, credential: &str) -> String {
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
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nX-Authorization: {credential}\r\n\r\n"
    );
    tls.write_all(request.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), tls.read_to_end(&mut out)).await;
    String::from_utf8_lossy(&out).into_owned()
}

/// A day's quota, so no window ends while a test runs.
const QUOTA_OF_20: &str = "[quota]\nper_key = \"20/d\"\n";

/// keygate under [`QUOTA_OF_20`] in front of a recording upstream, and the
/// credential of an API key of a tenant administrator.
async fn quota_gateway() -> (common::Upstream, Gateway, String) {
    let (upstream, gw) = common::gateway(QUOTA_OF_20).await;
    let user = gw
        .user("ws-quota@example.com", Authority::TenantAdmin)
        .await;
    let (_, key) = gw.api_key(&user, 0).await;
    (upstream, gw, common::api_key_header(&key))
}

#[tokio::test]
async fn websocket_upgrades_with_one_key_reach_the_upstream_only_within_the_quota() {
    let (upstream, gw, credential) = quota_gateway().await;
    // `/api/stream` is a proxied route, not a WebSocket route. The first of
    // the hundred, read byte for byte: an admitted 101 tells the quota.
    let first = raw_upgrade(&gw, "/api/stream", &credential).await;
    assert!(first.starts_with("HTTP/1.1 101"), "{first}");
    let head = first
        .split("\r\n\r\n")
        .next()
        .unwrap_or_default()
        .to_lowercase();
    assert!(
        head.contains("ratelimit-policy: \"per-key\";q=20;w=86400"),
        "{head}"
    );
    let (mut upgraded, mut refused) = (1, 0);
    for _ in 1..100 {
        let headers = [("X-Authorization", credential.as_str())];
        match try_open(&gw, Scheme::Wss, "/api/stream", &headers).await {
            Ok(_) => upgraded += 1,
            Err(tungstenite::Error::Http(response)) => {
                assert_eq!(response.status(), 429);
                assert!(response.headers().contains_key("retry-after"));
                refused += 1;
            }
            Err(other) => panic!("expected a 101 or a 429, got {other}"),
        }
    }
    println!("{upgraded} upgrades answered 101, {refused} refused");
    assert_eq!((upgraded, refused), (20, 80));
    // One more, read byte for byte: the refusal is the contract's.
    let response = raw_upgrade(&gw, "/api/stream", &credential).await;
    assert!(response.starts_with("HTTP/1.1 429"), "{response}");
    let body = response.split("\r\n\r\n").nth(1).unwrap_or_default();
    let json: Value = serde_json::from_str(body).expect("the contract's JSON");
    assert_eq!(json["errorCode"], 33, "{json}");
    assert_eq!(json["status"], 429, "{json}");
    assert_eq!(json["message"], "Too many requests", "{json}");
    assert!(json["timestamp"].as_u64().is_some(), "{json}");
    let upgrades = || {
        upstream
            .requests()
            .iter()
            .filter(|r| r.path_and_query == "/api/stream")
            .count()
    };
    // Admitted sockets reach the upstream after their 101: wait for them all.
    common::wait_until(
        "the admitted upgrades reach the upstream",
        LOADED,
        async || upgrades() >= 20,
    )
    .await;
    assert_eq!(
        upgrades(),
        20,
        "only the quota's worth reached the upstream"
    );
}

#[tokio::test]
async fn platform_sockets_with_one_key_reach_the_upstream_only_within_the_quota() {
    let (upstream, gw, credential) = quota_gateway().await;
    let (mut admitted, mut refused) = (0, 0);
    for _ in 0..100 {
        let headers = [("X-Authorization", credential.as_str())];
        let mut socket = try_open(&gw, Scheme::Wss, "/api/ws", &headers)
            .await
            .unwrap();
        // The recording upstream speaks no WebSocket: an admitted socket
        // reaches it and closes 1011; a refused one never does.
        match close_of(&mut socket).await {
            (1011, _) => admitted += 1,
            (1008, reason) => {
                assert_eq!(reason, "Too many requests");
                refused += 1;
            }
            other => panic!("unexpected close {other:?}"),
        }
    }
    println!("{admitted} sockets admitted, {refused} refused");
    assert_eq!((admitted, refused), (20, 80));
    let upgrades = upstream
        .requests()
        .iter()
        .filter(|r| r.path_and_query == "/api/ws")
        .count();
    assert_eq!(upgrades, 20, "only the quota's worth reached the upstream");
    let metrics = gw.metrics().await;
    assert!(
        metrics.contains(r#"keygate_quota_rejected_total{dimension="key"} 80"#),
        "{metrics}"
    );
}

/// A WebSocket upstream that echoes every text frame and records when it
/// received each, and whether keygate closed its side.
struct EchoUpstream {
    url: String,
    frames: std::sync::Arc<std::sync::Mutex<Vec<(Instant, String)>>>,
    closed: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

async fn echo_upstream() -> EchoUpstream {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let frames = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let closed = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (recorded, ended) = (frames.clone(), closed.clone());
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let (recorded, ended) = (recorded.clone(), ended.clone());
            tokio::spawn(async move {
                let Ok(mut socket) = tokio_tungstenite::accept_async(stream).await else {
                    return;
                };
                while let Some(Ok(message)) = socket.next().await {
                    match message {
                        Message::Text(text) => {
                            let text = text.as_str().to_owned();
                            recorded
                                .lock()
                                .unwrap()
                                .push((Instant::now(), text.clone()));
                            let echo = json!({ "received": text }).to_string();
                            if socket.send(Message::text(echo)).await.is_err() {
                                break;
                            }
                        }
                        Message::Close(_) => break,
                        _ => {}
                    }
                }
                ended.store(true, std::sync::atomic::Ordering::SeqCst);
            });
        }
    });
    EchoUpstream {
        url,
        frames,
        closed,
    }
}

/// Runs the CLI against the gateway's own config (so its SQLite file), as
/// an operator on the same machine would: another process, whose change no
/// revocation announces to the server. `stdin` is its standard input.
async fn cli(gw: &Gateway, args: &[&str], stdin: &str) {
    use std::io::Write as _;
    let config = gw.dir.path().join("keygate.toml");
    let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
    let stdin = stdin.to_owned();
    let out = tokio::task::spawn_blocking(move || {
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_keygate"))
            .arg("--config")
            .arg(config)
            .args(&args)
            .env("RUST_LOG", "warn")
            .env_remove("KEYGATE_CONFIG")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut input = child.stdin.take().unwrap();
        input.write_all(stdin.as_bytes()).unwrap();
        drop(input);
        child.wait_with_output().unwrap()
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Keeps sending frames on `socket` until keygate closes it or `limit`
/// passes; the close frame and when it came.
/// Also returns the last frame sent: one frame at a time is in flight (the
/// next goes once the echo of the last came back).
async fn relay_until_closed(
    socket: &mut Socket,
    limit: Duration,
) -> ((u16, String), Instant, String) {
    let started = Instant::now();
    for n in 0.. {
        assert!(
            started.elapsed() < limit,
            "the socket still relayed {limit:?} after its credential died"
        );
        // Sending may fail once keygate has closed; the close frame is read below.
        let last = format!("after-{n}");
        let _ = socket.send(Message::text(last.clone())).await;
        let read = tokio::time::timeout(Duration::from_millis(50), socket.next()).await;
        match read {
            Ok(Some(Ok(Message::Close(Some(frame))))) => {
                let close = (u16::from(frame.code), frame.reason.to_string());
                return (close, Instant::now(), last);
            }
            Ok(Some(Ok(Message::Close(None)))) => {
                return ((1005, String::new()), Instant::now(), last);
            }
            Ok(Some(Ok(_))) | Err(_) => {}
            other => panic!("expected frames or a close, got {other:?}"),
        }
    }
    unreachable!()
}

/// The cache lifetime of the CLI tests: a change made by another process
/// reaches a socket within twice this.
const SHORT_TTL: Duration = Duration::from_secs(1);

/// Checks that a socket closed for a change made by the CLI closed within
/// the documented bound, and that its upstream got nothing after the close.
async fn closed_within_the_cache_bound(
    socket: &mut Socket,
    upstream: &EchoUpstream,
    changed: Instant,
) -> (u16, String) {
    // The bound is twice the TTL; the margin is for a loaded machine. Before
    // the periodic check, such a socket was never closed.
    let (close, closed_at, last) = relay_until_closed(socket, 2 * SHORT_TTL + LOADED).await;
    let took = closed_at - changed;
    println!("closed {took:?} after the CLI's change (cache.ttl {SHORT_TTL:?})");
    common::wait_until("the upstream socket is closed", LOADED, async || {
        upstream.closed.load(std::sync::atomic::Ordering::SeqCst)
    })
    .await;
    // The upstream's task stamps a frame when it gets to it, which on a
    // loaded machine can be after the client read the close although keygate
    // relayed it before: only the one frame in flight as the close crossed it
    // may be stamped later. Anything more was relayed after the close.
    let frames = upstream.frames.lock().unwrap().clone();
    let late: Vec<&str> = frames
        .iter()
        .filter(|(at, _)| *at > closed_at)
        .map(|(_, text)| text.as_str())
        .collect();
    assert!(
        late.is_empty() || late == [last.as_str()],
        "the upstream got frames after the close: {late:?} (the last sent before it: {last})"
    );
    close
}

#[tokio::test]
async fn a_key_disabled_by_the_cli_closes_its_open_socket_within_twice_the_cache_ttl() {
    let upstream = echo_upstream().await;
    let gw = Gateway::start(&upstream.url, "[cache]\nttl = \"1s\"\n").await;
    let user = gw
        .user("ws-cli-key@example.com", Authority::TenantAdmin)
        .await;
    let (key_id, key) = gw.api_key(&user, 0).await;
    let mut socket = open(&gw, "/api/ws").await;
    send(&mut socket, &auth_cmd_key(&key)).await;
    assert_eq!(
        round_trip(&mut socket, "before").await["received"],
        "before"
    );

    let changed = Instant::now();
    cli(&gw, &["apikey", "disable", &key_id.to_string()], "").await;
    let (code, reason) = closed_within_the_cache_bound(&mut socket, &upstream, changed).await;
    assert_eq!(
        (code, reason.as_str()),
        (1008, "User account is not active")
    );
}

#[tokio::test]
async fn a_user_disabled_deleted_or_given_a_password_by_the_cli_loses_token_sockets_in_2x_ttl() {
    let changes: [(&str, &[&str], &str); 3] = [
        ("ws-cli-disabled@example.com", &["user", "disable"], ""),
        ("ws-cli-deleted@example.com", &["user", "delete"], ""),
        (
            "ws-cli-password@example.com",
            &["user", "set-password"],
            "another-long-password\n",
        ),
    ];
    let upstream = echo_upstream().await;
    let gw = Gateway::start(&upstream.url, "[cache]\nttl = \"1s\"\n").await;
    for (email, command, stdin) in changes {
        let user = gw.user(email, Authority::TenantAdmin).await;
        // Issued a minute ago: strictly older than a password set now (`iat`
        // is in whole seconds).
        let ttl = gw.running.app.settings().jwt.access_ttl.as_secs() as i64;
        let token = token_expiring_in(&gw, &user, ttl - 60).await;
        let mut socket = open(&gw, "/api/ws").await;
        let auth_cmd = json!({"authCmd": {"cmdId": 0, "token": token}}).to_string();
        send(&mut socket, &auth_cmd).await;
        assert_eq!(
            round_trip(&mut socket, "before").await["received"],
            "before"
        );
        upstream
            .closed
            .store(false, std::sync::atomic::Ordering::SeqCst);

        let changed = Instant::now();
        let args: Vec<&str> = command.iter().copied().chain([email]).collect();
        cli(&gw, &args, stdin).await;
        let (code, reason) = closed_within_the_cache_bound(&mut socket, &upstream, changed).await;
        println!("{}: closed {code} {reason:?}", command.join(" "));
        assert_eq!(code, 1008, "{}", command.join(" "));
    }
}

#[tokio::test]
async fn random_api_keys_in_first_frames_stop_reaching_the_store_at_the_address_budget() {
    let (gw, upstream) = setup_counted("[api_keys]\nunknown_lookups_per_address = \"5/m\"\n").await;
    let lookups = r#"keygate_auth_store_lookups_total{kind="api_key"}"#;
    let before = common::counter(&gw.metrics().await, lookups);
    let mut codes = Vec::new();
    for i in 0..12 {
        let mut socket = open(&gw, "/api/ws").await;
        send(
            &mut socket,
            &auth_cmd_key(&format!("tb_sprayed-{i}-{}", Uuid::new_v4())),
        )
        .await;
        codes.push(close_of(&mut socket).await);
    }
    let after = common::counter(&gw.metrics().await, lookups);
    assert_eq!(
        after - before,
        5,
        "store lookups stop at the budget: {codes:?}"
    );
    assert!(
        codes[..5].iter().all(|(code, _)| *code == 1007),
        "{codes:?}"
    );
    assert!(
        codes[5..]
            .iter()
            .all(|close| *close == (1008, "Too many requests".to_string())),
        "{codes:?}"
    );
    assert_eq!(
        upstream.sockets(),
        0,
        "a refused socket reached the upstream"
    );
}
