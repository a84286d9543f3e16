//! Routes with `identity = "platform"` end to end: the real server on port 0
//! in front of a double of the platform's authentication
//! (`common::platform`), which accepts only what the platform itself would.
//! A behaviour of requests runs its one body over both wires
//! ([`common::WIRES`]): HTTP/1.1 through the lean path, and HTTP/2.

mod common;

use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use common::platform::{NULL_UUID, PlatformDouble, Seen};
use common::{Gateway, PASSWORD, WIRES, Wire, api_key_header, counter, error_body};
use futures_util::{SinkExt, StreamExt};
use keygate::identity::Authority;
use keygate::store::UserRecord;
use serde_json::{Value, json};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::{self, Message};
use uuid::Uuid;

/// The platform's `tokenSigningKey` in these tests (512 bits).
fn platform_key() -> String {
    STANDARD.encode((0u8..64).map(|b| b.wrapping_mul(37)).collect::<Vec<_>>())
}

/// `[platform]` with the key and `platform` (more of that section), and
/// platform routes for the REST API (`/api/tb/`) and the sockets
/// (`/api/ws`), both to the double. `extra` is appended.
fn platform_config(double: &PlatformDouble, platform: &str, extra: &str) -> String {
    let url = double.url();
    format!(
        r#"
[platform]
signing_key = "{key}"
{platform}
[[route]]
name = "platform"
prefix = "/api/tb/"
identity = "platform"
upstreams = ["{url}"]
[[route]]
name = "platform-ws"
prefix = "/api/ws"
identity = "platform"
upstreams = ["{url}"]
{extra}"#,
        key = platform_key()
    )
}

/// keygate in front of the double; `platform` goes into `[platform]`.
async fn setup(platform: &str, extra: &str) -> (PlatformDouble, Gateway) {
    let double = PlatformDouble::start(&platform_key()).await;
    let gw = Gateway::start(&double.url(), &platform_config(&double, platform, extra)).await;
    (double, gw)
}

async fn get(gw: &Gateway, path: &str, headers: &[(&str, &str)]) -> reqwest::Response {
    get_over(gw, Wire::Http2, path, headers).await
}

/// `GET path` with `headers` over `wire`.
async fn get_over(
    gw: &Gateway,
    wire: Wire,
    path: &str,
    headers: &[(&str, &str)],
) -> reqwest::Response {
    let mut request = gw.client_over(wire).get(gw.https(path));
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = request.send().await.unwrap();
    assert_eq!(response.version(), wire.version(), "{path}");
    response
}

/// The user the double built, from a 200 of the platform route.
async fn platform_user(gw: &Gateway, headers: &[(&str, &str)]) -> Value {
    platform_user_over(gw, Wire::Http2, headers).await
}

/// [`platform_user`] over `wire`.
async fn platform_user_over(gw: &Gateway, wire: Wire, headers: &[(&str, &str)]) -> Value {
    let response = get_over(gw, wire, "/api/tb/user", headers).await;
    let status = response.status();
    let body: Value = response.json().await.unwrap();
    assert_eq!(status, 200, "{wire:?}: the platform accepted it: {body}");
    body
}

/// The tenant and customer the platform has for `user`: the null id where
/// it uses one.
fn expected_ids(user: &UserRecord) -> (String, String) {
    let null = NULL_UUID.to_owned();
    match user.authority {
        Authority::SysAdmin => (null.clone(), null),
        Authority::TenantAdmin => (user.tenant_id.to_string(), null),
        Authority::CustomerUser => (user.tenant_id.to_string(), user.customer_id.to_string()),
    }
}

/// A JWS of `claims` under `header`, signed with HMAC-SHA512 (or SHA-256
/// for `"HS256"`) of the Base64 key `key_b64`.
fn sign(header: &str, claims: &Value, key_b64: &str) -> String {
    let signed = format!(
        "{}.{}",
        URL_SAFE_NO_PAD.encode(header),
        URL_SAFE_NO_PAD.encode(claims.to_string())
    );
    let algorithm = if header.contains("HS256") {
        aws_lc_rs::hmac::HMAC_SHA256
    } else {
        aws_lc_rs::hmac::HMAC_SHA512
    };
    let key = aws_lc_rs::hmac::Key::new(algorithm, &STANDARD.decode(key_b64).unwrap());
    let tag = aws_lc_rs::hmac::sign(&key, signed.as_bytes());
    format!("{signed}.{}", URL_SAFE_NO_PAD.encode(tag.as_ref()))
}

/// The claims of a platform access token of `user`, issued now.
fn access_claims(user: &UserRecord) -> Value {
    let now = keygate::clock::now_secs();
    json!({
        "sub": user.email, "userId": user.id, "scopes": [user.authority.as_str()],
        "sessionId": Uuid::new_v4(), "exp": now + 600, "iss": "thingsboard.io", "iat": now,
        "enabled": true, "isPublic": false,
        "tenantId": user.tenant_id, "customerId": user.customer_id,
    })
}

/// A token in the platform's format, signed with the platform's key: what
/// someone holding that key could forge. Signed here with HMAC directly.
fn forge(user: &UserRecord, key_b64: &str) -> String {
    sign(r#"{"alg":"HS512"}"#, &access_claims(user), key_b64)
}

type Socket = tokio_tungstenite::WebSocketStream<tokio_rustls::client::TlsStream<TcpStream>>;

/// A socket over `wss://` to `path`, with `headers` on the upgrade.
async fn try_open(
    gw: &Gateway,
    path: &str,
    headers: &[(&str, &str)],
) -> Result<Socket, tungstenite::Error> {
    let port = gw.running.https.unwrap().port();
    let mut request = format!("wss://localhost:{port}{path}")
        .into_client_request()
        .unwrap();
    for (name, value) in headers {
        request.headers_mut().insert(
            http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
            value.parse().unwrap(),
        );
    }
    let tcp = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let name = rustls_pki_types::ServerName::try_from("localhost").unwrap();
    let tls = common::tls_connector(&gw.ca_pem)
        .connect(name, tcp)
        .await
        .unwrap();
    tokio_tungstenite::client_async(request, tls)
        .await
        .map(|(socket, _)| socket)
}

/// The next text message, as JSON.
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
    tokio::time::timeout(Duration::from_secs(15), read)
        .await
        .expect("a message in time")
}

/// Reads until the close frame; its code.
async fn close_code(socket: &mut Socket) -> u16 {
    let read = async {
        loop {
            match socket.next().await {
                Some(Ok(Message::Close(Some(frame)))) => return u16::from(frame.code),
                Some(Ok(Message::Close(None))) => return 1005,
                Some(Ok(_)) => {}
                other => panic!("expected a close frame, got {other:?}"),
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(60), read)
        .await
        .expect("a close frame in time")
}

async fn send(socket: &mut Socket, text: String) {
    socket.send(Message::text(text)).await.unwrap();
}

/// The sockets that reached the double.
fn sockets(double: &PlatformDouble) -> Vec<Seen> {
    double
        .seen()
        .into_iter()
        .filter(|seen| seen.uri.starts_with("/api/ws"))
        .collect()
}

/// Checks the user the double built against the stored one.
fn assert_platform_user(seen: &Value, user: &UserRecord, session_id: Uuid) {
    let (tenant, customer) = expected_ids(user);
    assert_eq!(seen["id"], user.id.to_string(), "{seen}");
    assert_eq!(seen["email"], user.email, "{seen}");
    assert_eq!(seen["authority"], user.authority.as_str(), "{seen}");
    assert_eq!(seen["tenantId"], tenant, "{seen}");
    assert_eq!(seen["customerId"], customer, "{seen}");
    assert_eq!(seen["sessionId"], session_id.to_string(), "{seen}");
    assert_eq!(seen["firstName"], "Test", "{seen}");
    assert_eq!(seen["lastName"], Value::Null, "{seen}");
    assert_eq!(seen["enabled"], true, "{seen}");
    assert_eq!(seen["isPublic"], false, "{seen}");
}

/// The acceptance check is only as good as its refusals: the double refuses
/// what the platform refuses, the way the platform answers.
#[tokio::test]
async fn the_platform_double_refuses_what_the_platform_refuses() {
    use common::platform::Refusal;
    let double = PlatformDouble::start(&platform_key()).await;
    let user = UserRecord {
        authority: Authority::SysAdmin,
        tenant_id: NULL_UUID.parse().unwrap(),
        customer_id: NULL_UUID.parse().unwrap(),
        ..common_user()
    };
    let key = platform_key();
    let good = access_claims(&user);
    let with = |edit: &dyn Fn(&mut serde_json::Map<String, Value>)| {
        let mut claims = good.as_object().unwrap().clone();
        edit(&mut claims);
        sign(r#"{"alg":"HS512"}"#, &Value::Object(claims), &key)
    };
    assert!(double.authenticate(&with(&|_| {})).is_ok());
    // A SYS_ADMIN without tenantId is in the system tenant
    // (parseAccessJwtToken); the issuer is not checked there.
    let lenient = double
        .authenticate(&with(&|c| {
            c.remove("tenantId");
            c.insert("iss".into(), json!("elsewhere"));
        }))
        .unwrap();
    assert_eq!(lenient["tenantId"], NULL_UUID);
    // jjwt verifies the algorithm the header names, when the key is long
    // enough for it.
    assert!(
        double
            .authenticate(&sign(r#"{"alg":"HS256"}"#, &good, &key))
            .is_ok()
    );
    let other_key = STANDARD.encode([1u8; 64]);
    let refusals: Vec<(&str, String)> = vec![
        ("another key", sign(r#"{"alg":"HS512"}"#, &good, &other_key)),
        (
            "unsigned",
            format!("{}.", with(&|_| {}).rsplit_once('.').unwrap().0),
        ),
        (
            "alg none",
            format!(
                "{}.{}.",
                URL_SAFE_NO_PAD.encode(r#"{"alg":"none"}"#),
                URL_SAFE_NO_PAD.encode(good.to_string())
            ),
        ),
        (
            "expired",
            with(&|c| {
                c.insert("exp".into(), json!(keygate::clock::now_secs() - 5));
            }),
        ),
        (
            "no isPublic",
            with(&|c| {
                c.remove("isPublic");
            }),
        ),
        (
            "no enabled",
            with(&|c| {
                c.remove("enabled");
            }),
        ),
        (
            "enabled as text",
            with(&|c| {
                c.insert("enabled".into(), json!("true"));
            }),
        ),
        (
            "no scopes",
            with(&|c| {
                c.insert("scopes".into(), json!([]));
            }),
        ),
        (
            "userId not a UUID",
            with(&|c| {
                c.insert("userId".into(), json!("1"));
            }),
        ),
        (
            "no iat",
            with(&|c| {
                c.remove("iat");
            }),
        ),
    ];
    for (why, token) in refusals {
        let refusal = double.authenticate(&token).expect_err(why);
        let expected = match why {
            "another key" | "expired" => matches!(refusal, Refusal::Expired(_)),
            "unsigned" | "alg none" => matches!(refusal, Refusal::BadCredentials(_)),
            _ => matches!(refusal, Refusal::ServerError(_)),
        };
        assert!(expected, "{why}: {refusal:?}");
    }
    // TokenOutdatingService: a token issued before the user's tokens were
    // outdated is refused; one issued in that second is not.
    let token = with(&|_| {});
    double.outdate(
        &user.id.to_string(),
        (keygate::clock::now_secs() + 1) * 1000,
    );
    assert!(matches!(
        double.authenticate(&token),
        Err(Refusal::Expired(_))
    ));
    double.outdate(&user.id.to_string(), keygate::clock::now_secs() * 1000);
    let fresh = with(&|_| {});
    assert!(double.authenticate(&fresh).is_ok());
    // Over HTTP: the platform's JSON error, and 401 without a Bearer token.
    let client = reqwest::Client::new();
    let answer = client
        .get(format!("{}/api/user", double.url()))
        .header("X-Authorization", "ApiKey tb_whatever")
        .send()
        .await
        .unwrap();
    let (status, json) = error_body(answer).await;
    assert_eq!((status, json["errorCode"].as_u64()), (401, Some(10)));
    let answer = client
        .get(format!("{}/api/user", double.url()))
        .header(
            "X-Authorization",
            format!("Bearer {}", sign(r#"{"alg":"HS512"}"#, &good, &other_key)),
        )
        .send()
        .await
        .unwrap();
    let (status, json) = error_body(answer).await;
    assert_eq!((status, json["errorCode"].as_u64()), (401, Some(11)));
}

/// A stored user as the double needs one: ids, e-mail, authority.
fn common_user() -> UserRecord {
    UserRecord {
        id: Uuid::new_v4(),
        created_time: 0,
        tenant_id: Uuid::new_v4(),
        customer_id: NULL_UUID.parse().unwrap(),
        email: "double@example.com".into(),
        authority: Authority::TenantAdmin,
        first_name: String::new(),
        last_name: String::new(),
        phone: String::new(),
        additional_info: None,
        version: 0,
        enabled: true,
        password_hash: String::new(),
        tokens_valid_after: 0,
    }
}

#[tokio::test]
async fn the_unmodified_platform_accepts_what_a_platform_route_sends() {
    let (double, gw) = setup("", "").await;
    for (email, authority) in [
        ("sys@example.com", Authority::SysAdmin),
        ("tenant@example.com", Authority::TenantAdmin),
        ("customer@example.com", Authority::CustomerUser),
    ] {
        let user = gw.user(email, authority).await;
        let (key_id, key) = gw.api_key(&user, 0).await;
        let (session_id, token) = gw.access_token(&user).await;
        let bearer = format!("Bearer {token}");
        for wire in WIRES {
            let declines = gw.declines().await;
            let key = api_key_header(&key);
            let seen = platform_user_over(&gw, wire, &[("X-Authorization", &key)]).await;
            assert_platform_user(&seen, &user, key_id);
            let seen = platform_user_over(&gw, wire, &[("X-Authorization", &bearer)]).await;
            assert_platform_user(&seen, &user, session_id);
            // The platform's other header works as well, as it does there.
            let seen = platform_user_over(&gw, wire, &[("Authorization", &bearer)]).await;
            assert_platform_user(&seen, &user, session_id);
            gw.assert_lean_path_took(&declines, &[], &format!("{wire:?} {email}"))
                .await;
        }
    }
    // A login through keygate is a session the platform sees too.
    let login: Value = gw
        .login("tenant@example.com", PASSWORD)
        .await
        .json()
        .await
        .unwrap();
    let bearer = format!("Bearer {}", login["token"].as_str().unwrap());
    let seen = platform_user(&gw, &[("X-Authorization", &bearer)]).await;
    assert_eq!(seen["email"], "tenant@example.com");
    // What arrived is the platform's token and nothing a client sent.
    let last = double.seen().pop().unwrap();
    let forwarded = last.header("x-authorization").unwrap();
    let token = forwarded.strip_prefix("Bearer ").unwrap();
    assert_ne!(forwarded, bearer);
    assert!(double.authenticate(token).is_ok());
    assert_eq!(last.header("authorization"), None);
}

#[tokio::test]
async fn the_clients_own_credential_never_reaches_a_platform_upstream() {
    let (double, gw) = setup("", "").await;
    let user = gw.user("leak@example.com", Authority::TenantAdmin).await;
    let (_, key) = gw.api_key(&user, 0).await;
    let (_, token) = gw.access_token(&user).await;
    let bearer = format!("Bearer {token}");
    let api_key = api_key_header(&key);
    for headers in [
        vec![("X-Authorization", api_key.as_str())],
        vec![("Authorization", bearer.as_str())],
        vec![("X-Authorization", bearer.as_str())],
        // A forged identity header besides a real credential.
        vec![
            ("X-Authorization", api_key.as_str()),
            ("X-Auth-User-Id", "00000000-0000-0000-0000-000000000001"),
        ],
    ] {
        for wire in WIRES {
            platform_user_over(&gw, wire, &headers).await;
        }
    }
    // Sockets (HTTP/1.1 upgrades): ?token=, the upgrade header, and the first frame's authCmd
    // (with commands, which go on without it).
    let mut by_query = try_open(&gw, &format!("/api/ws?token={token}&x=1"), &[])
        .await
        .unwrap();
    assert_eq!(
        next_json(&mut by_query).await["securityUser"]["id"],
        user.id.to_string()
    );
    let mut by_header = try_open(&gw, "/api/ws", &[("X-Authorization", &api_key)])
        .await
        .unwrap();
    assert_eq!(
        next_json(&mut by_header).await["securityUser"]["id"],
        user.id.to_string()
    );
    let mut by_frame = try_open(&gw, "/api/ws", &[]).await.unwrap();
    let cmds = json!([{"type": "ENTITY_COUNT", "cmdId": 1}]);
    send(
        &mut by_frame,
        json!({"authCmd": {"cmdId": 0, "apiKey": key}, "cmds": cmds}).to_string(),
    )
    .await;
    assert_eq!(
        next_json(&mut by_frame).await["securityUser"]["id"],
        user.id.to_string()
    );
    let echoed = next_json(&mut by_frame).await;
    let rest: Value = serde_json::from_str(echoed["echo"].as_str().unwrap()).unwrap();
    assert_eq!(rest, json!({ "cmds": cmds }));

    let seen = double.seen();
    assert_eq!(seen.len(), 4 * 2 + 3, "every request and socket arrived");
    for arrived in &seen {
        assert!(
            !arrived.contains(&key),
            "the key reached the platform: {arrived:?}"
        );
        assert!(
            !arrived.contains(&token),
            "the token reached the platform: {arrived:?}"
        );
        assert_eq!(arrived.header("authorization"), None, "{arrived:?}");
        assert_ne!(
            arrived.header("x-auth-user-id"),
            Some("00000000-0000-0000-0000-000000000001")
        );
    }
    let query_socket = &sockets(&double)[0];
    assert!(
        query_socket.uri.contains("x=1&token="),
        "{}",
        query_socket.uri
    );
    assert_eq!(query_socket.uri.matches("token=").count(), 1);
}

/// The name of a query pair with the escapes of the letters of `token`
/// decoded, as the platform's servlet decodes every escape.
fn decoded_name(pair: &str) -> String {
    let mut name = pair.split('=').next().unwrap_or_default().to_owned();
    for (escape, letter) in [
        ("%74", "t"),
        ("%6f", "o"),
        ("%6b", "k"),
        ("%65", "e"),
        ("%6e", "n"),
    ] {
        name = name
            .replace(escape, letter)
            .replace(&escape.to_ascii_uppercase(), letter);
    }
    name
}

#[tokio::test]
async fn a_token_parameter_in_any_escaped_spelling_never_reaches_the_platform_beside_keygates_own()
{
    let (double, gw) = setup("", "").await;
    let user = gw.user("query@example.com", Authority::TenantAdmin).await;
    let (_, key) = gw.api_key(&user, 0).await;
    let (_, token) = gw.access_token(&user).await;
    let api_key = api_key_header(&key);
    // An ordinary request to a platform route, over both wires: every
    // `token` goes, in any spelling the platform decodes; the rest stays.
    for wire in common::WIRES {
        let response = gw
            .client_over(wire)
            .get(gw.https(&format!(
                "/api/tb/user?a=1&token={token}&%74oken={token}&tok%65n={key}&Token=kept&b=2"
            )))
            .header("X-Authorization", &api_key)
            .send()
            .await
            .unwrap();
        assert_eq!(response.version(), wire.version());
        assert_eq!(response.status(), 200, "{wire:?}");
        let seen = double.seen().pop().unwrap();
        assert_eq!(seen.uri, "/api/tb/user?a=1&Token=kept&b=2", "{wire:?}");
        // On a `headers` route keygate reads no `token`: the name is the
        // upstream's own, and its parameter passes.
        let response = gw
            .client_over(wire)
            .get(gw.https("/api/other?token=theirs&a=1"))
            .header("X-Authorization", &api_key)
            .send()
            .await
            .unwrap();
        assert_eq!(response.version(), wire.version());
        assert_eq!(
            double.seen().pop().unwrap().uri,
            "/api/other?token=theirs&a=1"
        );
    }
    // A platform socket: an escaped `token` is the credential the platform
    // would read, and only keygate's own token goes on.
    let mut escaped = try_open(&gw, &format!("/api/ws?%74oken={token}&x=1"), &[])
        .await
        .unwrap();
    assert_eq!(
        next_json(&mut escaped).await["securityUser"]["id"],
        user.id.to_string()
    );
    // An upgrade on the REST route (a socket of another kind, checked like
    // any request): the client's spellings of `token` are replaced too.
    let path = format!("/api/tb/live?tok%65n={token}&%74%6F%6B%65%6E=x&y=1");
    let _other = try_open(&gw, &path, &[("X-Authorization", &api_key)]).await;
    common::wait_until(
        "the upgrade reached the platform",
        Duration::from_secs(10),
        async || {
            double
                .seen()
                .iter()
                .any(|seen| seen.uri.starts_with("/api/tb/live"))
        },
    )
    .await;
    let upgrades: Vec<Seen> = double
        .seen()
        .into_iter()
        .filter(|seen| seen.uri.starts_with("/api/ws") || seen.uri.starts_with("/api/tb/live"))
        .collect();
    assert_eq!(upgrades.len(), 2, "{upgrades:?}");
    for upgrade in &upgrades {
        assert!(!upgrade.contains(&token), "{upgrade:?}");
        assert!(!upgrade.uri.contains("oken=x"), "{}", upgrade.uri);
        let query = upgrade.uri.split_once('?').unwrap().1;
        let tokens: Vec<&str> = query
            .split('&')
            .filter(|pair| decoded_name(pair) == "token")
            .collect();
        assert_eq!(tokens.len(), 1, "one token, keygate's: {}", upgrade.uri);
        let minted = tokens[0].strip_prefix("token=").unwrap();
        assert_eq!(
            double.authenticate(minted).unwrap()["id"],
            user.id.to_string()
        );
    }
    assert!(
        upgrades[0].uri.contains("x=1&token="),
        "{}",
        upgrades[0].uri
    );
    assert!(
        upgrades[1].uri.contains("y=1&token="),
        "{}",
        upgrades[1].uri
    );
}

#[tokio::test]
async fn a_token_forged_with_the_platform_key_is_refused_by_keygate_and_never_forwarded() {
    let (double, gw) = setup("", "").await;
    let user = gw.user("forged@example.com", Authority::TenantAdmin).await;
    let forged = forge(&user, &platform_key());
    // It is a token the platform itself would take.
    assert!(double.authenticate(&forged).is_ok());
    let bearer = format!("Bearer {forged}");
    for (header, path) in [
        ("X-Authorization", "/api/tb/user"),
        ("Authorization", "/api/tb/user"),
        ("X-Authorization", "/api/auth/user"),
    ] {
        for wire in WIRES {
            let response = get_over(&gw, wire, path, &[(header, &bearer)]).await;
            let (status, json) = error_body(response).await;
            assert_eq!(status, 401, "{wire:?} {header} {path}: {json}");
        }
    }
    // A socket: refused at the upgrade (401), or closed for a bad
    // credential (1007).
    match try_open(&gw, &format!("/api/ws?token={forged}"), &[]).await {
        Err(tungstenite::Error::Http(response)) => assert_eq!(response.status(), 401),
        Err(other) => panic!("{other}"),
        Ok(mut socket) => assert_eq!(close_code(&mut socket).await, 1007),
    }
    let mut by_frame = try_open(&gw, "/api/ws", &[]).await.unwrap();
    send(
        &mut by_frame,
        json!({"authCmd": {"cmdId": 0, "token": forged}}).to_string(),
    )
    .await;
    assert_eq!(close_code(&mut by_frame).await, 1007, "a bad credential");
    assert!(double.seen().is_empty(), "nothing reached the platform");
}

/// The `issued` and `reused` counts of the platform route.
async fn passports(gw: &Gateway, route: &str) -> (u64, u64) {
    let metrics = gw.metrics().await;
    let series = |outcome: &str| {
        format!(
            "keygate_upstream_identity_total{{mode=\"platform\",outcome=\"{outcome}\",route=\"{route}\"}}"
        )
    };
    (
        counter(&metrics, &series("issued")),
        counter(&metrics, &series("reused")),
    )
}

#[tokio::test]
async fn a_disabled_key_a_logout_and_a_password_change_stop_the_next_request_on_a_platform_route() {
    let (double, gw) = setup("", "[cache]\nttl = \"300s\"\n").await;
    let user = gw.user("revoked@example.com", Authority::TenantAdmin).await;
    let (key_id, key) = gw.api_key(&user, 0).await;
    let api_key = api_key_header(&key);
    let (_, owner) = gw.access_token(&user).await;
    let owner = format!("Bearer {owner}");
    let login = || async {
        let login: Value = gw.login(&user.email, PASSWORD).await.json().await.unwrap();
        format!("Bearer {}", login["token"].as_str().unwrap())
    };

    let disable = gw
        .client()
        .put(gw.https(&format!("/api/apiKey/{key_id}/enabled/false")))
        .header("X-Authorization", &owner);
    serves_then_refuses(&gw, &double, &api_key, disable, "the disabled key's").await;
    assert!(
        passports(&gw, "platform").await.1 >= 1,
        "a token was reused"
    );

    let bearer = login().await;
    let logout = gw
        .client()
        .post(gw.https("/api/auth/logout"))
        .header("X-Authorization", &bearer);
    serves_then_refuses(&gw, &double, &bearer, logout, "the ended session's").await;

    let bearer = login().await;
    let change = gw
        .client()
        .post(gw.https("/api/auth/changePassword"))
        .header("X-Authorization", &bearer)
        .json(&json!({"currentPassword": PASSWORD, "newPassword": "another-horse-battery"}));
    serves_then_refuses(&gw, &double, &bearer, change, "the outdated token's").await;
}

/// `credential` reaches the platform route over HTTP/1.1 (a platform token
/// issued) and HTTP/2 (reused); then `kill` ends it, and its next request
/// over either wire is refused and never leaves.
async fn serves_then_refuses(
    gw: &Gateway,
    double: &PlatformDouble,
    credential: &str,
    kill: reqwest::RequestBuilder,
    whose: &str,
) {
    for wire in WIRES {
        platform_user_over(gw, wire, &[("X-Authorization", credential)]).await;
    }
    assert_eq!(kill.send().await.unwrap().status(), 200, "{whose}");
    let before = double.seen().len();
    for wire in WIRES {
        let headers = [("X-Authorization", credential)];
        let response = get_over(gw, wire, "/api/tb/user", &headers).await;
        assert_eq!(error_body(response).await.0, 401, "{wire:?}: {whose}");
    }
    assert_eq!(double.seen().len(), before, "{whose} request never left");
}

#[tokio::test]
async fn a_platform_token_is_reused_until_most_of_its_lifetime_is_spent() {
    let (double, gw) = setup("token_lifetime = \"2s\"", "").await;
    let user = gw.user("reuse@example.com", Authority::TenantAdmin).await;
    let (_, key) = gw.api_key(&user, 0).await;
    let api_key = api_key_header(&key);
    let forwarded = |double: &PlatformDouble| {
        double
            .seen()
            .last()
            .and_then(|s| s.header("x-authorization").map(str::to_owned))
            .unwrap()
    };
    // Issued over one wire, reused over both: one cache behind them.
    platform_user_over(&gw, Wire::Http1, &[("X-Authorization", &api_key)]).await;
    let first = forwarded(&double);
    for wire in WIRES {
        platform_user_over(&gw, wire, &[("X-Authorization", &api_key)]).await;
        assert_eq!(
            forwarded(&double),
            first,
            "{wire:?}: the same token, reused"
        );
    }
    assert_eq!(passports(&gw, "platform").await, (1, 2));
    // Past 90% of its 2 s, a new one is signed (and it is a new token: its
    // iat is at least a second later).
    tokio::time::sleep(Duration::from_millis(2200)).await;
    platform_user(&gw, &[("X-Authorization", &api_key)]).await;
    assert_ne!(forwarded(&double), first);
    assert_eq!(passports(&gw, "platform").await, (2, 2));
}

#[tokio::test]
async fn a_websocket_on_a_platform_route_authenticates_upstream_with_a_fresh_platform_token() {
    let (double, gw) = setup("", "[cache]\nttl = \"300s\"\n").await;
    let user = gw.user("socket@example.com", Authority::CustomerUser).await;
    let (key_id, key) = gw.api_key(&user, 0).await;
    let (_, owner) = gw.access_token(&user).await;
    let mut socket = try_open(&gw, "/api/ws", &[]).await.unwrap();
    send(
        &mut socket,
        json!({"authCmd": {"cmdId": 0, "apiKey": key}}).to_string(),
    )
    .await;
    let hello = next_json(&mut socket).await;
    assert_platform_user(&hello["securityUser"], &user, key_id);
    send(&mut socket, r#"{"cmds":[]}"#.into()).await;
    assert_eq!(next_json(&mut socket).await["echo"], r#"{"cmds":[]}"#);
    // The upgrade carried a valid platform token, and the platform reads it.
    let upstream = &sockets(&double)[0];
    let token = upstream.uri.split("token=").nth(1).unwrap();
    let claims = double.authenticate(token).unwrap();
    assert_eq!(claims["sessionId"], key_id.to_string());
    assert_eq!(upstream.header("x-authorization"), None);
    // The legacy endpoint, which reads no authCmd, takes it the same way.
    let mut legacy = try_open(
        &gw,
        "/api/ws/plugins/telemetry",
        &[("X-Authorization", &api_key_header(&key))],
    )
    .await
    .unwrap();
    assert_eq!(
        next_json(&mut legacy).await["securityUser"]["id"],
        user.id.to_string()
    );
    // When the key dies, keygate closes the socket.
    let disabled = gw
        .client()
        .put(gw.https(&format!("/api/apiKey/{key_id}/enabled/false")))
        .header("X-Authorization", format!("Bearer {owner}"))
        .send()
        .await
        .unwrap();
    assert_eq!(disabled.status(), 200);
    assert_eq!(close_code(&mut socket).await, 1008);
    assert_eq!(close_code(&mut legacy).await, 1008);
}

#[tokio::test]
async fn keygate_refuses_to_start_when_the_platform_key_equals_its_own() {
    // Configured: refused when the settings are read.
    let key = platform_key();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("keygate.toml");
    std::fs::write(
        &path,
        format!(
            "[jwt]\ntoken_signing_key = \"{key}\"\n[platform]\nsigning_key = \"{key}\"\n[[route]]\nname = \"api\"\nprefix = \"/api/\"\nupstreams = [\"http://127.0.0.1:9\"]\nidentity = \"platform\"\n"
        ),
    )
    .unwrap();
    let refused = keygate::config::load(&keygate::config::Source {
        file: Some(&path),
        env: vec![],
    })
    .unwrap_err()
    .to_string();
    assert!(
        refused.contains("must differ from jwt.token_signing_key"),
        "{refused}"
    );
    assert!(
        !refused.contains(&key),
        "the key is never printed: {refused}"
    );

    // Kept in the store (generated at first start): refused at start.
    let (_double, first) = setup("", "").await;
    let store_url = format!("sqlite://{}/keygate.db", first.dir.path().display());
    let pool = sqlx::sqlite::SqlitePool::connect(&store_url).await.unwrap();
    let stored: String =
        sqlx::query_scalar("SELECT value FROM settings WHERE name = 'jwt_signing_key'")
            .fetch_one(&pool)
            .await
            .expect("the generated key is stored");
    let double = PlatformDouble::start(&stored).await;
    let config = platform_config(&double, "", "").replace(&platform_key(), &stored);
    let second = tempfile::tempdir().unwrap();
    let path = second.path().join("keygate.toml");
    std::fs::write(
        &path,
        format!(
            "[server]\ndata_dir = \"{}\"\n[listen]\nhttps = \"127.0.0.1:0\"\nhttp = \"127.0.0.1:0\"\nadmin = \"127.0.0.1:0\"\n[store]\nurl = \"{store_url}\"\n{config}",
            second.path().display()
        ),
    )
    .unwrap();
    let settings = keygate::config::load(&keygate::config::Source {
        file: Some(&path),
        env: vec![],
    })
    .unwrap();
    let Err(error) = keygate::server::start(settings, Default::default()).await else {
        panic!("keygate started with its own key as the platform's");
    };
    let message = error.to_string();
    assert!(
        message.contains("platform.signing_key is keygate's own"),
        "{message}"
    );
    assert!(!message.contains(&stored));
}

#[tokio::test]
async fn a_reload_that_adds_a_platform_route_without_a_key_at_start_is_refused() {
    let double = PlatformDouble::start(&platform_key()).await;
    let gw = Gateway::start(&double.url(), "").await;
    let user = gw.user("reload@example.com", Authority::TenantAdmin).await;
    let (_, key) = gw.api_key(&user, 0).await;
    // The same configuration with the platform's key and routes: valid, but
    // the key is read only at start.
    let path = gw.dir.path().join("keygate.toml");
    let mut text = std::fs::read_to_string(&path).unwrap();
    text.push_str(&platform_config(&double, "", ""));
    std::fs::write(&path, text).unwrap();
    let settings = keygate::config::load(&keygate::config::Source {
        file: Some(&path),
        env: vec![],
    })
    .unwrap();
    gw.running.reload(&settings);
    // The routes stayed as they were: the request went out on the headers
    // route, with the identity headers and no token, rather than failing.
    let response = get(
        &gw,
        "/api/tb/user",
        &[("X-Authorization", &api_key_header(&key))],
    )
    .await;
    assert_eq!(
        response.status(),
        401,
        "the platform refuses X-Auth-* alone"
    );
    let seen = double.seen().pop().unwrap();
    assert_eq!(
        seen.header("x-auth-user-id"),
        Some(user.id.to_string().as_str())
    );
    assert_eq!(seen.header("x-authorization"), None);
    let metrics = gw.metrics().await;
    assert!(
        metrics
            .lines()
            .any(|line| line.starts_with("keygate_config_reloads_total")
                && line.contains("fail")
                && !line.ends_with(" 0")),
        "{metrics}"
    );
}

#[tokio::test]
async fn the_platform_key_imported_into_the_store_signs_when_none_is_configured() {
    let double = PlatformDouble::start(&platform_key()).await;
    let dir = tempfile::tempdir().unwrap();
    let store_url = format!("sqlite://{}/keygate.db", dir.path().display());
    let config = platform_config(&double, "", "").replace(&platform_key(), "");

    // Neither configured nor imported: refused at start, naming the route.
    let store = keygate::store::Store::connect(&store_url, 2).await.unwrap();
    let path = dir.path().join("refused.toml");
    std::fs::write(
        &path,
        format!(
            "[server]\ndata_dir = \"{}\"\n[listen]\nhttps = \"127.0.0.1:0\"\nhttp = \"127.0.0.1:0\"\nadmin = \"127.0.0.1:0\"\n[store]\nurl = \"{store_url}\"\n{config}",
            dir.path().display()
        ),
    )
    .unwrap();
    let settings = keygate::config::load(&keygate::config::Source {
        file: Some(&path),
        env: vec![],
    })
    .unwrap();
    let Err(error) = keygate::server::start(settings, Default::default()).await else {
        panic!("keygate started a platform route with no platform key");
    };
    let message = error.to_string();
    assert!(
        message.contains("\"platform\" has identity = \"platform\"")
            && message.contains("keygate import platform"),
        "{message}"
    );

    // Kept in the store as the import keeps it: the platform accepts the
    // tokens, with the issuer the platform had.
    store
        .set_platform_signing(&platform_key(), "platform.example")
        .await
        .unwrap();
    drop(store);
    let gw = Gateway::start_on(&double.url(), &config, Some(&store_url)).await;
    let user = gw
        .user("imported@example.com", Authority::TenantAdmin)
        .await;
    let (_, key) = gw.api_key(&user, 0).await;
    let seen = platform_user(&gw, &[("X-Authorization", &api_key_header(&key))]).await;
    assert_eq!(seen["id"], user.id.to_string(), "{seen}");
    let token = double.seen().pop().unwrap();
    let token = token
        .header("x-authorization")
        .and_then(|value| value.strip_prefix("Bearer "))
        .expect("a platform token")
        .to_owned();
    let claims: Value = serde_json::from_slice(
        &URL_SAFE_NO_PAD
            .decode(token.split('.').nth(1).unwrap())
            .unwrap(),
    )
    .unwrap();
    assert_eq!(claims["iss"], "platform.example");
}
