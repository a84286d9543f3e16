//! The `assertion` identity mode end to end: the real server on port 0, the
//! reference entity service verifying every assertion against keygate's own
//! JWKS (or a recording upstream, where a test must see exactly what
//! arrived). A behaviour of requests runs its one body over both wires
//! ([`common::WIRES`]): HTTP/1.1 through the lean path, and HTTP/2.

mod common;

use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use jsonwebtoken::jwk::JwkSet;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use keygate::config::AssertionAlgorithm;
use keygate::dev::AssertionCheck;
use keygate::identity::Authority;
use serde_json::{Value, json};
use tokio::net::{TcpListener, TcpStream};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

use common::{
    Gateway, PASSWORD, Upstream, WIRES, Wire, api_key_header, plain_client_over, wait_until,
};

/// The assertion settings of every test: the JWKS cached 2 s, so a
/// rotation reaches a replica within a second; the `checked` route (the
/// reference's `/api/echo`) and the platform WebSocket path sign
/// assertions for the audience `checked`.
fn asserted(upstream: &str) -> String {
    format!(
        r#"
[assertion]
issuer = "https://gw.example"
jwks_max_age = "2s"
[[route]]
name = "checked"
prefix = "/api/echo"
upstreams = ["{upstream}"]
identity = "assertion"
[[route]]
name = "sockets"
prefix = "/api/ws"
upstreams = ["{upstream}"]
identity = "assertion"
audience = "checked"
"#
    )
}

/// A route `checked` on `/api/checked/` to `upstream` that signs assertions.
fn checked_route(upstream: &str) -> String {
    format!(
        "[[route]]\nname = \"checked\"\nprefix = \"/api/checked/\"\nupstreams = [\"{upstream}\"]\nidentity = \"assertion\"\n"
    )
}

/// keygate in front of the reference entity service, which verifies the
/// assertion of every request against keygate's JWKS (refetched on an
/// unknown kid at once); `assertion`: more settings of `[assertion]`.
async fn verified(assertion: &str) -> Gateway {
    verified_at(assertion).await.0
}

/// [`verified`], with the URL of the reference service.
async fn verified_at(assertion: &str) -> (Gateway, String) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream = format!("http://{}", listener.local_addr().unwrap());
    let config =
        asserted(&upstream).replacen("[assertion]\n", &format!("[assertion]\n{assertion}"), 1);
    let gw = Gateway::start(&upstream, &config).await;
    let check = AssertionCheck {
        jwks_url: gw.http("/.well-known/jwks.json").parse().unwrap(),
        issuer: "https://gw.example".into(),
        audience: "checked".into(),
        refetch_after: Duration::ZERO,
    };
    tokio::spawn(keygate::dev::serve_reference_upstream_verifying(
        listener,
        std::future::pending(),
        check,
    ));
    (gw, upstream)
}

async fn jwks(gw: &Gateway) -> JwkSet {
    reqwest::get(gw.http("/.well-known/jwks.json"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// Verifies `token` as an upstream must: by kid against keygate's JWKS, the
/// algorithm the key names, `iss`, `aud`, `exp` and `nbf`.
async fn verify(gw: &Gateway, token: &str) -> Value {
    let set = jwks(gw).await;
    let header = jsonwebtoken::decode_header(token).unwrap();
    assert_eq!(header.alg, Algorithm::ES256);
    assert_eq!(header.typ.as_deref(), Some("JWT"));
    let jwk = set
        .find(header.kid.as_deref().unwrap())
        .expect("kid in the JWKS");
    let mut validation = Validation::new(Algorithm::ES256);
    validation.set_issuer(&["https://gw.example"]);
    validation.set_audience(&["checked"]);
    validation.set_required_spec_claims(&["exp", "nbf", "iss", "aud", "sub"]);
    let key = DecodingKey::from_jwk(jwk).unwrap();
    let claims = jsonwebtoken::decode::<Value>(token, &key, &validation)
        .unwrap()
        .claims;
    assert!(claims["iat"].is_u64(), "{claims}");
    assert!(uuid::Uuid::parse_str(claims["jti"].as_str().unwrap()).is_ok());
    claims
}

/// `GET /api/echo` through keygate with `credential`; the reference's
/// description of what it received (it answered only after verifying).
async fn echo(gw: &Gateway, credential: &str) -> Value {
    echo_over(gw, Wire::Http2, credential).await
}

/// [`echo`] over `wire`.
async fn echo_over(gw: &Gateway, wire: Wire, credential: &str) -> Value {
    let response = gw
        .client_over(wire)
        .get(gw.https("/api/echo"))
        .header("X-Authorization", credential)
        .send()
        .await
        .unwrap();
    assert_eq!(response.version(), wire.version());
    assert_eq!(response.status(), 200, "{wire:?}");
    response.json().await.unwrap()
}

fn assertion_of(described: &Value) -> String {
    described["headers"]["x-auth-assertion"]
        .as_str()
        .expect("an assertion reached the upstream")
        .to_owned()
}

fn kid_of(token: &str) -> String {
    jsonwebtoken::decode_header(token).unwrap().kid.unwrap()
}

#[tokio::test]
async fn an_assertion_route_sends_a_signed_assertion_that_verifies_against_the_jwks() {
    let (gw, upstream) = verified_at("").await;
    let user = gw
        .user("asserted@example.com", Authority::TenantAdmin)
        .await;
    let (key_id, key) = gw.api_key(&user, 0).await;
    for wire in WIRES {
        let declines = gw.declines().await;
        let (session_id, token) = gw.access_token(&user).await;
        signed_for_each_credential(&gw, wire, &user, (key_id, &key), (session_id, &token)).await;
        // The JWKS fetches are keygate's own endpoint, hyper's.
        gw.assert_lean_path_took(&declines, &["not_proxied"], &format!("{wire:?}"))
            .await;
    }

    // The upstream itself refuses a request that did not come through keygate.
    let around = reqwest::Client::new()
        .get(format!("{upstream}/api/echo"))
        .header("X-Auth-User-Id", user.id.to_string())
        .header("X-Auth-Tenant-Id", user.tenant_id.to_string())
        .header("X-Auth-Authority", "TENANT_ADMIN")
        .header("X-Auth-Assertion", "eyJhbGciOiJub25lIn0.e30.")
        .send()
        .await
        .unwrap();
    assert_eq!(around.status(), 401);
}

/// Over `wire`, a request with the key and one with the session's token
/// each carry an assertion of `user` that verifies.
async fn signed_for_each_credential(
    gw: &Gateway,
    wire: Wire,
    user: &keygate::store::UserRecord,
    (key_id, key): (uuid::Uuid, &str),
    (session_id, token): (uuid::Uuid, &str),
) {
    let described = echo_over(gw, wire, &api_key_header(key)).await;
    let claims = verify(gw, &assertion_of(&described)).await;
    assert_eq!(claims["iss"], "https://gw.example");
    assert_eq!(claims["aud"], "checked");
    assert_eq!(claims["sub"], user.id.to_string());
    assert_eq!(claims["email"], "asserted@example.com");
    assert_eq!(claims["tenant_id"], user.tenant_id.to_string());
    assert_eq!(claims["customer_id"], user.customer_id.to_string());
    assert_eq!(claims["authority"], "TENANT_ADMIN");
    assert_eq!(claims["auth_method"], "api-key");
    assert_eq!(claims["key_id"], key_id.to_string());
    assert!(claims.get("session_id").is_none());
    let iat = claims["iat"].as_u64().unwrap();
    assert_eq!(claims["nbf"].as_u64(), Some(iat));
    assert_eq!(claims["exp"].as_u64(), Some(iat + 300));
    let now = keygate::clock::now_secs() as u64;
    assert!(iat <= now && now - iat < 60, "iat {iat}, now {now}");
    // The headers still travel beside it.
    assert_eq!(described["headers"]["x-auth-user-id"], user.id.to_string());

    let described = echo_over(gw, wire, &format!("Bearer {token}")).await;
    let claims = verify(gw, &assertion_of(&described)).await;
    assert_eq!(claims["auth_method"], "jwt", "{wire:?}");
    assert_eq!(claims["session_id"], session_id.to_string());
    assert!(claims.get("key_id").is_none());
}

#[tokio::test]
async fn a_scoped_keys_assertion_carries_its_grants_and_an_unscoped_one_none() {
    let (gw, _upstream) = verified_at("").await;
    let user = gw.user("grants@example.com", Authority::TenantAdmin).await;
    let (_, whole) = gw.api_key(&user, 0).await;
    let grants = serde_json::json!([
        {"path": "/api/echo", "methods": ["GET"]},
        {"path": "/api/device/", "methods": ["GET", "POST"]},
    ]);
    let response = gw
        .client()
        .post(gw.https("/api/apiKey"))
        .header("X-Authorization", api_key_header(&whole))
        .json(&serde_json::json!({
            "userId": {"id": user.id, "entityType": "USER"},
            "description": "narrow",
            "scopes": grants,
        }))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let created: Value = response.json().await.unwrap();
    let scoped = created["value"].as_str().unwrap().to_owned();

    for wire in WIRES {
        let described = echo_over(&gw, wire, &api_key_header(&scoped)).await;
        let claims = verify(&gw, &assertion_of(&described)).await;
        assert_eq!(
            claims["scopes"], grants,
            "{wire:?}: the upstream can narrow further"
        );
        let described = echo_over(&gw, wire, &api_key_header(&whole)).await;
        let claims = verify(&gw, &assertion_of(&described)).await;
        assert!(claims.get("scopes").is_none(), "{wire:?}: {claims}");
    }
}

#[tokio::test]
async fn a_client_sent_x_auth_assertion_never_reaches_an_upstream() {
    let upstream = Upstream::start().await;
    let gw = Gateway::start(&upstream.url(), &checked_route(&upstream.url())).await;
    let user = gw.user("forger@example.com", Authority::TenantAdmin).await;
    let (_, key) = gw.api_key(&user, 0).await;
    let paths = ["/api/plain/x", "/api/checked/x", "/api/noauth/x"];
    for (wire, path) in WIRES
        .into_iter()
        .flat_map(|wire| paths.map(|path| (wire, path)))
    {
        for spelling in ["X-Auth-Assertion", "x_auth_assertion", "X.Auth.Assertion"] {
            let response = gw
                .client_over(wire)
                .get(gw.https(path))
                .header("X-Authorization", api_key_header(&key))
                .header(spelling, "forged.assertion.value")
                .send()
                .await
                .unwrap();
            assert_eq!(response.version(), wire.version());
            assert_eq!(response.status(), 200, "{wire:?} {path} {spelling}");
            let seen = upstream.last_to(path);
            let folded: Vec<(String, String)> = seen
                .headers
                .iter()
                .filter(|(name, _)| {
                    name.as_str()
                        .replace(['_', '.'], "-")
                        .eq_ignore_ascii_case("x-auth-assertion")
                })
                .map(|(name, value)| (name.to_string(), value.to_str().unwrap().to_owned()))
                .collect();
            if path == "/api/checked/x" {
                assert_eq!(folded.len(), 1, "{wire:?} {path} {spelling}: {folded:?}");
                assert_eq!(folded[0].0, "x-auth-assertion");
                assert_ne!(folded[0].1, "forged.assertion.value");
                assert_eq!(folded[0].1.split('.').count(), 3);
            } else {
                assert!(folded.is_empty(), "{wire:?} {path} {spelling}: {folded:?}");
            }
        }
    }
}

#[tokio::test]
async fn the_jwks_never_contains_private_key_material() {
    let (_up, gw) = common::gateway("[assertion]\njwks_max_age = \"90s\"\n").await;
    let over = |wire: Wire| {
        [
            (plain_client_over(wire), gw.http("/.well-known/jwks.json")),
            (gw.client_over(wire), gw.https("/.well-known/jwks.json")),
        ]
        .map(move |(client, url)| (wire, client, url))
    };
    for (wire, client, url) in WIRES.into_iter().flat_map(over) {
        let response = client.get(&url).send().await.unwrap();
        assert_eq!(response.version(), wire.version());
        assert_eq!(response.status(), 200, "{wire:?} {url}");
        let headers = response.headers();
        assert_eq!(headers["content-type"], "application/json");
        assert_eq!(headers["cache-control"], "public, max-age=90");
        let text = response.text().await.unwrap();
        let document: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(document.as_object().unwrap().len(), 1, "{text}");
        let keys = document["keys"].as_array().unwrap();
        assert_eq!(keys.len(), 1, "{text}");
        for key in keys {
            let mut names: Vec<&str> = key
                .as_object()
                .unwrap()
                .keys()
                .map(|k| k.as_str())
                .collect();
            names.sort_unstable();
            assert_eq!(
                names,
                ["alg", "crv", "kid", "kty", "use", "x", "y"],
                "{text}"
            );
            assert_eq!(key["kty"], "EC");
            assert_eq!(key["crv"], "P-256");
            assert_eq!(key["alg"], "ES256");
            assert_eq!(key["use"], "sig");
        }
        for private in [
            "\"d\"", "\"p\"", "\"q\"", "\"dp\"", "\"dq\"", "\"qi\"", "\"k\"",
        ] {
            assert!(!text.contains(private), "{private} in {text}");
        }
    }
    // The metric series of the endpoint is its own.
    let metrics = gw.metrics().await;
    assert!(
        metrics.contains("/.well-known/jwks.json"),
        "no series for the JWKS"
    );
}

/// The value of the `keygate_upstream_identity_total` series of `route` and
/// `outcome`.
fn identity_count(metrics: &str, route: &str, outcome: &str) -> u64 {
    metrics
        .lines()
        .filter(|line| line.starts_with("keygate_upstream_identity_total{"))
        .find(|line| {
            line.contains(&format!("route=\"{route}\""))
                && line.contains(&format!("outcome=\"{outcome}\""))
                && line.contains("mode=\"assertion\"")
        })
        .and_then(|line| line.rsplit(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

#[tokio::test]
async fn the_assertion_is_reused_until_most_of_its_lifetime_is_spent() {
    let gw = verified("").await;
    let user = gw.user("reused@example.com", Authority::TenantAdmin).await;
    let (_, key) = gw.api_key(&user, 0).await;
    // Issued over one wire, reused over the other: one cache behind both.
    let first = assertion_of(&echo_over(&gw, Wire::Http1, &api_key_header(&key)).await);
    let second = assertion_of(&echo_over(&gw, Wire::Http2, &api_key_header(&key)).await);
    assert_eq!(first, second);
    let metrics = gw.metrics().await;
    assert_eq!(
        identity_count(&metrics, "checked", "issued"),
        1,
        "{metrics}"
    );
    assert_eq!(
        identity_count(&metrics, "checked", "reused"),
        1,
        "{metrics}"
    );
    // Another credential of the same user has its own.
    let (_, other) = gw.api_key(&user, 0).await;
    let third = assertion_of(&echo(&gw, &api_key_header(&other)).await);
    assert_ne!(third, first);
}

#[tokio::test]
async fn with_assertion_reuse_off_every_request_carries_a_fresh_assertion_and_jti() {
    let gw = verified("reuse = false\n").await;
    let user = gw.user("fresh@example.com", Authority::TenantAdmin).await;
    let (_, key) = gw.api_key(&user, 0).await;
    let mut jtis = std::collections::HashSet::new();
    let mut sent = 0;
    for wire in common::WIRES {
        let client = gw.client_over(wire);
        for _ in 0..3 {
            let response = client
                .get(gw.https("/api/echo"))
                .header("X-Authorization", api_key_header(&key))
                .send()
                .await
                .unwrap();
            assert_eq!(response.status(), 200, "{wire:?}");
            assert_eq!(response.version(), wire.version());
            let described: Value = response.json().await.unwrap();
            // The reference verified it before answering; so does this.
            let claims = verify(&gw, &assertion_of(&described)).await;
            assert!(
                jtis.insert(claims["jti"].as_str().unwrap().to_owned()),
                "a jti came twice over {wire:?}: {claims}"
            );
            sent += 1;
        }
    }
    let metrics = gw.metrics().await;
    assert_eq!(
        identity_count(&metrics, "checked", "issued"),
        sent,
        "{metrics}"
    );
    assert_eq!(
        identity_count(&metrics, "checked", "reused"),
        0,
        "{metrics}"
    );
}

#[tokio::test]
async fn a_disabled_key_a_logout_and_a_password_change_stop_the_next_request_on_an_assertion_route()
{
    let upstream = Upstream::start().await;
    let extra = format!(
        "[cache]\nttl = \"300s\"\n{}",
        checked_route(&upstream.url())
    );
    let gw = Gateway::start(&upstream.url(), &extra).await;
    let user = gw.user("revoked@example.com", Authority::TenantAdmin).await;
    let login = || async {
        let response = gw.login("revoked@example.com", PASSWORD).await;
        assert_eq!(response.status(), 200);
        let body: Value = response.json().await.unwrap();
        body["token"].as_str().unwrap().to_owned()
    };
    let bearer = |token: &str| format!("Bearer {token}");
    let (key_id, key) = gw.api_key(&user, 0).await;
    let admin_token = login().await;
    let disable = gw
        .client()
        .put(gw.https(&format!("/api/apiKey/{key_id}/enabled/false")))
        .header("X-Authorization", bearer(&admin_token));
    let credential = api_key_header(&key);
    serves_then_refuses(&gw, &upstream, &credential, disable, "a disabled key").await;

    let token = login().await;
    let logout = gw
        .client()
        .post(gw.https("/api/auth/logout"))
        .header("X-Authorization", bearer(&token));
    serves_then_refuses(
        &gw,
        &upstream,
        &bearer(&token),
        logout,
        "a logged-out token",
    )
    .await;

    let token = login().await;
    let change = gw
        .client()
        .post(gw.https("/api/auth/changePassword"))
        .header("X-Authorization", bearer(&token))
        .json(&json!({ "currentPassword": PASSWORD, "newPassword": "a-brand-new-password" }));
    serves_then_refuses(&gw, &upstream, &bearer(&token), change, "an outdated token").await;
}

/// `credential`'s assertion on the `checked` route is issued (over
/// HTTP/1.1), then reused (over HTTP/2); then `kill` ends the credential,
/// and the next request over either wire is refused before the upstream.
async fn serves_then_refuses(
    gw: &Gateway,
    upstream: &Upstream,
    credential: &str,
    kill: reqwest::RequestBuilder,
    what: &str,
) {
    let get = |wire: Wire| {
        gw.client_over(wire)
            .get(gw.https("/api/checked/x"))
            .header("X-Authorization", credential)
            .send()
    };
    for wire in WIRES {
        let response = get(wire).await.unwrap();
        assert_eq!(response.version(), wire.version());
        assert_eq!(response.status(), 200, "{wire:?}: {what} while alive");
    }
    assert_eq!(kill.send().await.unwrap().status(), 200, "{what}");
    let arrived = upstream.arrived();
    for wire in WIRES {
        let response = get(wire).await.unwrap();
        assert_eq!(
            common::error_body(response).await.0,
            401,
            "{wire:?}: {what}"
        );
    }
    assert_eq!(upstream.arrived(), arrived, "{what} reached the upstream");
}

#[tokio::test]
async fn a_rotated_key_signs_new_assertions_while_the_old_one_stays_in_the_jwks() {
    let gw = verified("").await;
    let user = gw.user("rotated@example.com", Authority::TenantAdmin).await;
    let (_, key) = gw.api_key(&user, 0).await;
    let before = assertion_of(&echo(&gw, &api_key_header(&key)).await);
    let old_kid = kid_of(&before);
    let rotated =
        keygate::identity::assertion::ring::rotate(&gw.running.store, AssertionAlgorithm::Es256)
            .await
            .unwrap();
    assert_eq!(rotated.retired.as_deref(), Some(old_kid.as_str()));
    assert_ne!(rotated.current, old_kid);
    // Within one reload (1 s here), new assertions carry the new kid, and
    // the upstream, which refetches the JWKS on an unknown kid, accepts them.
    wait_until("the new key signs", Duration::from_secs(15), async || {
        let (_, fresh) = gw.api_key(&user, 0).await;
        kid_of(&assertion_of(&echo(&gw, &api_key_header(&fresh)).await)) == rotated.current
    })
    .await;
    let kids: Vec<String> = jwks(&gw)
        .await
        .keys
        .iter()
        .map(|k| k.common.key_id.clone().unwrap())
        .collect();
    assert_eq!(kids, [rotated.current.clone(), old_kid.clone()]);
    // The assertion signed before the rotation is still good: reused, and
    // still verifiable.
    let reused = assertion_of(&echo(&gw, &api_key_header(&key)).await);
    assert_eq!(reused, before);
    verify(&gw, &before).await;
}

#[tokio::test]
async fn two_replicas_on_one_store_sign_with_the_same_key() {
    let upstream = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    // PostgreSQL when the test database is given (a schema of its own),
    // else one SQLite file.
    let postgres = std::env::var("KEYGATE_TEST_DATABASE_URL").ok();
    let (store, schema) = match &postgres {
        Some(base) => {
            let (url, schema) = common::fresh_schema(base).await;
            (url, Some(schema))
        }
        None => (format!("sqlite://{}/shared.db", dir.path().display()), None),
    };
    let url = upstream.url();
    let extra = checked_route(&url);
    let (a, b) = tokio::join!(
        Gateway::start_on(&url, &extra, Some(&store)),
        Gateway::start_on(&url, &extra, Some(&store)),
    );
    let (set_a, set_b) = (jwks(&a).await, jwks(&b).await);
    assert_eq!(set_a.keys.len(), 1);
    assert_eq!(set_a, set_b);
    let kid = set_a.keys[0].common.key_id.clone().unwrap();
    let user = a.user("replicas@example.com", Authority::TenantAdmin).await;
    let (_, key) = a.api_key(&user, 0).await;
    for gw in [&a, &b] {
        let response = gw
            .client()
            .get(gw.https("/api/checked/x"))
            .header("X-Authorization", api_key_header(&key))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        let seen = upstream.last_to("/api/checked/x");
        let assertion = seen.headers["x-auth-assertion"].to_str().unwrap();
        assert_eq!(kid_of(assertion), kid);
    }
    if let (Some(base), Some(schema)) = (postgres, schema) {
        a.running.store.close().await;
        b.running.store.close().await;
        common::drop_schema(&base, &schema).await;
    }
}

#[tokio::test]
async fn a_websocket_upgrade_on_an_assertion_route_carries_the_assertion_to_the_upstream() {
    let gw = verified("").await;
    let user = gw.user("socket@example.com", Authority::TenantAdmin).await;
    let (key_id, key) = gw.api_key(&user, 0).await;
    let port = gw.running.https.unwrap().port();
    let request = format!("wss://localhost:{port}/api/ws")
        .into_client_request()
        .unwrap();
    let tcp = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let server_name = rustls_pki_types::ServerName::try_from("localhost").unwrap();
    let tls = common::tls_connector(&gw.ca_pem)
        .connect(server_name, tcp)
        .await
        .unwrap();
    let (mut socket, _) = tokio_tungstenite::client_async(request, tls).await.unwrap();
    let auth = json!({"authCmd": {"cmdId": 0, "apiKey": key}}).to_string();
    socket.send(Message::text(auth)).await.unwrap();
    socket.send(Message::text("hello")).await.unwrap();
    // The reference accepted the upstream socket only with a valid
    // assertion; it answers with the request it was opened with.
    let described: Value = loop {
        let next = tokio::time::timeout(Duration::from_secs(10), socket.next())
            .await
            .expect("an answer within 10 s");
        match next {
            Some(Ok(Message::Text(text))) => break serde_json::from_str(&text).unwrap(),
            Some(Ok(Message::Ping(_) | Message::Pong(_))) => {}
            other => panic!("expected a text message, got {other:?}"),
        }
    };
    let token = described["headers"]["x-auth-assertion"]
        .as_str()
        .unwrap_or_else(|| panic!("no assertion in {described}"));
    let claims = verify(&gw, token).await;
    assert_eq!(claims["key_id"], key_id.to_string());
    assert_eq!(claims["aud"], "checked");
}

/// A compact JWS of `header` and `claims`, signed by `key`.
fn forge(
    header: Value,
    claims: &Value,
    key: &keygate::identity::assertion::keys::SigningKey,
) -> String {
    use base64::Engine;
    let b64 = |bytes: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes);
    let signing_input = format!(
        "{}.{}",
        b64(header.to_string().as_bytes()),
        b64(claims.to_string().as_bytes())
    );
    let signature = key.sign(signing_input.as_bytes()).unwrap();
    format!("{signing_input}.{}", b64(&signature))
}

#[tokio::test]
async fn forged_assertions_an_unknown_kid_a_foreign_key_or_alg_none_are_refused_by_the_upstream() {
    use keygate::identity::assertion::keys::SigningKey;
    let (gw, upstream) = verified_at("").await;
    let user = gw.user("forged@example.com", Authority::TenantAdmin).await;
    let (_, key) = gw.api_key(&user, 0).await;
    let genuine = assertion_of(&echo(&gw, &api_key_header(&key)).await);
    let claims = verify(&gw, &genuine).await;
    let real_kid = kid_of(&genuine);
    let attacker = SigningKey::generate(AssertionAlgorithm::Es256).unwrap();
    let forgeries = [
        // A kid no JWKS lists: refetched once, still unknown, refused.
        forge(
            json!({"alg": "ES256", "typ": "JWT", "kid": "made-up"}),
            &claims,
            &attacker,
        ),
        // The attacker's own key, offered in the token's header.
        forge(
            json!({"alg": "ES256", "typ": "JWT", "kid": attacker.public.kid, "jwk": attacker.public.jwk()}),
            &claims,
            &attacker,
        ),
        // keygate's kid, the attacker's signature.
        forge(
            json!({"alg": "ES256", "typ": "JWT", "kid": real_kid}),
            &claims,
            &attacker,
        ),
        // No signature at all.
        {
            use base64::Engine;
            let b64 =
                |v: &Value| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string());
            format!(
                "{}.{}.",
                b64(&json!({"alg": "none", "typ": "JWT", "kid": real_kid})),
                b64(&claims)
            )
        },
    ];
    let client = reqwest::Client::new();
    for forged in forgeries {
        let response = client
            .get(format!("{upstream}/api/echo"))
            .header("X-Auth-User-Id", user.id.to_string())
            .header("X-Auth-Tenant-Id", user.tenant_id.to_string())
            .header("X-Auth-Authority", "TENANT_ADMIN")
            .header("X-Auth-Assertion", &forged)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 401, "{forged}");
    }
    // The genuine one, sent around keygate while valid, is the one the
    // upstream takes: an assertion is a bearer statement for its audience.
    let response = client
        .get(format!("{upstream}/api/echo"))
        .header("X-Auth-Assertion", &genuine)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
}

/// `keygate --config <config> <args>`: its status, stdout and stderr.
fn keygate_cli(config: &std::path::Path, args: &[&str]) -> (bool, String, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_keygate"))
        .arg("--config")
        .arg(config)
        .args(args)
        .env("RUST_LOG", "warn")
        .env_remove("KEYGATE_CONFIG")
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test]
async fn assertion_rotate_makes_a_new_key_current_and_the_listing_never_shows_a_private_key() {
    let dir = tempfile::tempdir().unwrap();
    let store_url = format!("sqlite://{}/cli.db", dir.path().display());
    let config = dir.path().join("keygate.toml");
    std::fs::write(&config, format!("[store]\nurl = \"{store_url}\"\n")).unwrap();
    // Management commands work on a store `keygate serve` made; they never
    // create one.
    keygate::store::Store::connect(&store_url, 1).await.unwrap();
    let (ok, first, err) = keygate_cli(&config, &["assertion", "rotate"]);
    assert!(ok, "{err}");
    let first = first.trim().to_owned();
    let (ok, second, err) = keygate_cli(&config, &["assertion", "rotate", "--algorithm", "EdDSA"]);
    assert!(ok, "{err}");
    let second = second.trim().to_owned();
    assert_ne!(first, second);
    assert!(err.contains(&format!("key {first} retired")), "{err}");
    let (ok, listing, err) = keygate_cli(&config, &["assertion", "keys"]);
    assert!(ok, "{err}");
    let lines: Vec<&str> = listing.lines().collect();
    assert_eq!(lines.len(), 2, "{listing}");
    assert!(
        lines[0].starts_with(&second)
            && lines[0].contains("EdDSA")
            && lines[0].ends_with("current"),
        "{listing}"
    );
    assert!(
        lines[1].starts_with(&first) && lines[1].contains("ES256") && lines[1].contains("retired"),
        "{listing}"
    );
    let store = keygate::store::Store::connect(&store_url, 1).await.unwrap();
    for key in store.signing_keys().await.unwrap() {
        assert!(!key.private_key.is_empty());
        assert!(
            !listing.contains(&key.private_key[..40]),
            "a private key was printed"
        );
    }
    let events = store.audit_events(10).await.unwrap();
    assert_eq!(
        events
            .iter()
            .filter(|e| e.action == "signing_key.rotate" && e.target_type == "SIGNING_KEY")
            .count(),
        2
    );
    store.close().await;
    // With a key file, the file is the key: rotating in the store is refused.
    let pem = dir.path().join("assertion.pem");
    std::fs::write(&pem, pem_of_new_p256_key()).unwrap();
    std::fs::write(
        &config,
        format!(
            "[store]\nurl = \"{store_url}\"\n[assertion]\nsigning_key_file = \"{}\"\n",
            pem.display()
        ),
    )
    .unwrap();
    let (ok, _, err) = keygate_cli(&config, &["assertion", "rotate"]);
    assert!(!ok);
    assert!(err.contains("assertion.signing_key_file"), "{err}");
}

/// A new P-256 private key as PKCS#8 PEM.
fn pem_of_new_p256_key() -> String {
    use aws_lc_rs::signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair};
    use base64::Engine;
    let rng = aws_lc_rs::rand::SystemRandom::new();
    let der = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).unwrap();
    let body = base64::engine::general_purpose::STANDARD.encode(der.as_ref());
    let lines: Vec<String> = body
        .as_bytes()
        .chunks(64)
        .map(|c| String::from_utf8(c.to_vec()).unwrap())
        .collect();
    format!(
        "-----BEGIN PRIVATE KEY-----\n{}\n-----END PRIVATE KEY-----\n",
        lines.join("\n")
    )
}

#[tokio::test]
async fn a_key_file_signs_the_assertions_and_the_generated_key_it_replaced_stays_published() {
    let upstream = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite://{}/file.db", dir.path().display());
    let extra = checked_route(&upstream.url());
    // First start: a generated key.
    let generated = {
        let gw = Gateway::start_on(&upstream.url(), &extra, Some(&store)).await;
        let set = jwks(&gw).await;
        gw.running.shutdown();
        gw.running.store.close().await;
        set.keys[0].common.key_id.clone().unwrap()
    };
    let pem = dir.path().join("assertion.pem");
    std::fs::write(&pem, pem_of_new_p256_key()).unwrap();
    let with_file = format!(
        "{extra}[assertion]\nsigning_key_file = \"{}\"\n",
        pem.display()
    );
    let gw = Gateway::start_on(&upstream.url(), &with_file, Some(&store)).await;
    let kids: Vec<String> = jwks(&gw)
        .await
        .keys
        .iter()
        .map(|k| k.common.key_id.clone().unwrap())
        .collect();
    assert_eq!(kids.len(), 2, "{kids:?}");
    assert_eq!(kids[1], generated);
    let user = gw.user("filed@example.com", Authority::TenantAdmin).await;
    let (_, key) = gw.api_key(&user, 0).await;
    let response = gw
        .client()
        .get(gw.https("/api/checked/x"))
        .header("X-Authorization", api_key_header(&key))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let seen = upstream.last_to("/api/checked/x");
    let assertion = seen.headers["x-auth-assertion"].to_str().unwrap();
    assert_eq!(kid_of(assertion), kids[0], "signed with the file's key");
    assert_ne!(kids[0], generated);
}
