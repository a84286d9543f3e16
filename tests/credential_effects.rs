//! Endpoints classed by what they do, not by their method, end to end: a
//! scoped key never reaches an endpoint that mints, reveals, replaces or
//! removes a credential (keygate's own or the platform's, forwarded); an API
//! key never changes its owner's second factor; a pre-verification token is
//! told that its second factor is pending; and asking for an activation link
//! never replaces the one already sent.

mod common;

use std::time::Duration;

use common::{Gateway, PASSWORD, Upstream, WIRES, api_key_header, counter, error_body};
use keygate::identity::Authority;
use keygate::store::UserRecord;
use serde_json::{Value, json};
use uuid::Uuid;

const OUT_OF_SCOPE: &str = "This API key's scopes do not allow this request";
const OUT_OF_SCOPE_SERIES: &str = r#"keygate_auth_total{method="api-key",result="out_of_scope"}"#;
const SESSION_REQUIRED: &str =
    "Second-factor settings change only in a signed-in session: an API key cannot change them";
const PENDING: &str =
    "A second factor is pending: finish the login at /api/auth/2fa/verification/check first";

/// A key of `user` with `scopes`, created with the unscoped key `with`.
async fn scoped_key(gw: &Gateway, with: &str, user: &UserRecord, scopes: Value) -> String {
    let response = gw
        .client()
        .post(gw.https("/api/apiKey"))
        .header("X-Authorization", api_key_header(with))
        .json(&json!({
            "userId": {"id": user.id, "entityType": "USER"},
            "description": "scoped",
            "scopes": scopes,
        }))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let record: Value = response.json().await.unwrap();
    record["value"].as_str().unwrap().to_string()
}

/// Every method on every path: the widest grant there is.
fn every_grant() -> Value {
    json!([{"path": "/", "methods": ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]}])
}

/// A user created over REST by `bearer` (a SYS_ADMIN's session): no
/// password yet, waiting for its activation link.
async fn pending_user(gw: &Gateway, bearer: &str, email: &str, authority: &str) -> Uuid {
    let mut body = json!({"email": email, "authority": authority});
    if authority != "SYS_ADMIN" {
        body["tenantId"] = json!({"entityType": "TENANT", "id": Uuid::new_v4()});
    }
    let response = gw
        .client()
        .post(gw.https("/api/user"))
        .header("X-Authorization", bearer)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let created: Value = response.json().await.unwrap();
    created["id"]["id"].as_str().unwrap().parse().unwrap()
}

async fn assert_out_of_scope(response: reqwest::Response, what: &str) {
    let (status, body) = error_body(response).await;
    assert_eq!(
        (status, &body["errorCode"]),
        (403, &json!(20)),
        "{what}: {body}"
    );
    assert_eq!(body["message"], OUT_OF_SCOPE, "{what}");
}

#[tokio::test]
async fn a_read_only_key_cannot_turn_an_activation_link_into_a_sys_admin_session() {
    let (upstream, gw) = common::gateway("").await;
    let sys = gw.user("sys-chain@example.com", Authority::SysAdmin).await;
    let (_, unscoped) = gw.api_key(&sys, 0).await;
    let (_, session) = gw.access_token(&sys).await;
    let bearer = format!("Bearer {session}");
    let pending = pending_user(&gw, &bearer, "pending-sys@example.com", "SYS_ADMIN").await;
    let read_only = scoped_key(
        &gw,
        &unscoped,
        &sys,
        json!([{"path": "/", "methods": ["GET"]}]),
    )
    .await;
    let everything = scoped_key(&gw, &unscoped, &sys, every_grant()).await;
    let keys_before = gw.running.store.list_api_keys(sys.id).await.unwrap().len();

    for wire in WIRES {
        let client = gw.client_over(wire);
        for key in [&read_only, &everything] {
            // Each step of the chain: the link (keygate's own endpoint and
            // the platform's forms of it, forwarded), logging in as the
            // user, mailing the link, and the unscoped key at the end.
            for (method, path, body) in [
                ("GET", format!("/api/user/{pending}/activationLink"), None),
                (
                    "GET",
                    format!("/api/user/{pending}/activationLinkInfo"),
                    None,
                ),
                ("GET", format!("/api/user/{pending}/token"), None),
                // Spellings the platform's server reads as the same
                // endpoints: doubled slashes and escaped letters.
                ("GET", format!("//api/user//{pending}/activationLink"), None),
                ("GET", format!("/%61pi/user/{pending}/t%6Fken"), None),
                (
                    "POST",
                    "/api/user/sendActivationMail?email=pending-sys@example.com".to_owned(),
                    None,
                ),
                (
                    "POST",
                    "/api/apiKey".to_owned(),
                    Some(
                        json!({"userId": {"id": sys.id, "entityType": "USER"}, "description": "escalated"}),
                    ),
                ),
            ] {
                let mut request = client
                    .request(method.parse().unwrap(), gw.https(&path))
                    .header("X-Authorization", api_key_header(key));
                if let Some(body) = body {
                    request = request.json(&body);
                }
                let response = request.send().await.unwrap();
                assert_eq!(response.version(), wire.version());
                assert_out_of_scope(response, &format!("{wire:?} {method} {path}")).await;
            }
        }
    }
    assert_eq!(upstream.arrived(), 0, "nothing was forwarded");
    assert_eq!(
        gw.running.store.list_api_keys(sys.id).await.unwrap().len(),
        keys_before,
        "no key was created"
    );
    assert_eq!(
        activation_tokens_of(&gw, pending).await,
        0,
        "no activation token was minted for a scoped key"
    );
    assert_eq!(counter(&gw.metrics().await, OUT_OF_SCOPE_SERIES), 2 * 2 * 7);

    // The same link stays the SYS_ADMIN session's to ask for.
    let link = gw
        .client()
        .get(gw.https(&format!("/api/user/{pending}/activationLink")))
        .header("X-Authorization", &bearer)
        .send()
        .await
        .unwrap();
    assert_eq!(link.status(), 200);
}

#[tokio::test]
async fn a_scoped_key_never_creates_a_key_for_another_user_and_a_session_still_does() {
    let (upstream, gw) = common::gateway("").await;
    let admin = gw
        .user("keys-admin@example.com", Authority::TenantAdmin)
        .await;
    let (_, unscoped) = gw.api_key(&admin, 0).await;
    let other = common_user_in(&gw, "keys-other@example.com", admin.tenant_id).await;
    let grants = json!([
        {"path": "/api/apiKey", "methods": ["POST"]},
        {"path": "/", "methods": ["GET"]},
    ]);
    let key_maker = scoped_key(&gw, &unscoped, &admin, grants).await;
    let (_, session) = gw.access_token(&admin).await;

    for wire in WIRES {
        let client = gw.client_over(wire);
        let create = |credential: String, owner: Uuid| {
            client
                .post(gw.https("/api/apiKey"))
                .header("X-Authorization", credential)
                .json(&json!({
                    "userId": {"id": owner, "entityType": "USER"},
                    "description": "for someone",
                    "scopes": [{"path": "/api/device", "methods": ["GET"]}],
                }))
                .send()
        };
        for owner in [other.id, admin.id] {
            let response = create(api_key_header(&key_maker), owner).await.unwrap();
            assert_out_of_scope(response, &format!("{wire:?} a key for {owner}")).await;
        }
        let made = create(format!("Bearer {session}"), other.id).await.unwrap();
        assert_eq!(
            made.status(),
            200,
            "{wire:?}: a session makes keys for its users"
        );
        let made: Value = made.json().await.unwrap();
        assert!(made["value"].is_string());
    }
    assert_eq!(
        gw.running
            .store
            .list_api_keys(other.id)
            .await
            .unwrap()
            .len(),
        2
    );
    assert_eq!(upstream.arrived(), 0);
}

/// A CUSTOMER_USER of `tenant`, which a TENANT_ADMIN of it manages.
async fn common_user_in(gw: &Gateway, email: &str, tenant: Uuid) -> UserRecord {
    let new = keygate::accounts::NewUser {
        email: email.into(),
        authority: Authority::CustomerUser,
        tenant_id: Some(tenant),
        customer_id: Some(Uuid::new_v4()),
        first_name: "Other".into(),
        last_name: String::new(),
    };
    keygate::accounts::create_user(&gw.running.store, new, PASSWORD.into(), &Default::default())
        .await
        .unwrap()
}

async fn send(
    client: &reqwest::Client,
    gw: &Gateway,
    method: &str,
    path: &str,
    credential: &str,
    body: Option<Value>,
) -> reqwest::Response {
    let mut request = client
        .request(method.parse().unwrap(), gw.https(path))
        .header("X-Authorization", credential);
    if let Some(body) = body {
        request = request.json(&body);
    }
    request.send().await.unwrap()
}

/// The TOTP secret of a config `generate` answered.
fn secret_of(config: &Value) -> String {
    let url = config["authUrl"].as_str().unwrap();
    let secret = url.split_once("secret=").unwrap().1;
    secret.split('&').next().unwrap().to_string()
}

/// Configures TOTP with the session `bearer`; its secret.
async fn configure_totp(client: &reqwest::Client, gw: &Gateway, bearer: &str) -> String {
    let generate = "/api/2fa/account/config/generate?providerType=TOTP";
    let response = send(client, gw, "POST", generate, bearer, None).await;
    assert_eq!(response.status(), 200);
    let config: Value = response.json().await.unwrap();
    let secret = secret_of(&config);
    let code = common::totp::totp_at(&secret, common::totp::step_now());
    let save = format!("/api/2fa/account/config?verificationCode={code}");
    let response = send(client, gw, "POST", &save, bearer, Some(config)).await;
    assert_eq!(response.status(), 200);
    secret
}

#[tokio::test]
async fn an_api_key_cannot_remove_or_replace_its_owners_second_factor() {
    let (_upstream, gw) = common::gateway("").await;
    for wire in WIRES {
        let client = gw.client_over(wire);
        let email = format!("factor-{wire:?}@example.com").to_lowercase();
        let user = gw.user(&email, Authority::TenantAdmin).await;
        let (_, key) = gw.api_key(&user, 0).await;
        let key = api_key_header(&key);
        let (_, session) = gw.access_token(&user).await;
        let bearer = format!("Bearer {session}");
        configure_totp(&client, &gw, &bearer).await;

        let config = json!({"providerType": "TOTP", "useByDefault": true, "authUrl": "otpauth://totp/x?secret=AAAAAAAAAAAAAAAA"});
        for (method, path, body) in [
            (
                "POST",
                "/api/2fa/account/config/generate?providerType=TOTP",
                None,
            ),
            (
                "POST",
                "/api/2fa/account/config?verificationCode=000000",
                Some(config.clone()),
            ),
            (
                "POST",
                "/api/2fa/account/config/submit",
                Some(config.clone()),
            ),
            (
                "PUT",
                "/api/2fa/account/config?providerType=TOTP",
                Some(json!({"useByDefault": false})),
            ),
            ("DELETE", "/api/2fa/account/config?providerType=TOTP", None),
        ] {
            let response = send(&client, &gw, method, path, &key, body).await;
            assert_eq!(response.version(), wire.version());
            let (status, body) = error_body(response).await;
            assert_eq!(
                (status, &body["errorCode"], &body["message"]),
                (403, &json!(20), &json!(SESSION_REQUIRED)),
                "{wire:?} {method} {path}: {body}"
            );
        }
        // The factor is still there, the default unchanged; the session
        // changes it.
        let settings = send(
            &client,
            &gw,
            "GET",
            "/api/2fa/account/settings",
            &bearer,
            None,
        )
        .await;
        let settings: Value = settings.json().await.unwrap();
        assert_eq!(
            settings["configs"]["TOTP"],
            json!({"providerType": "TOTP", "useByDefault": true}),
            "{wire:?}"
        );
        let path = "/api/2fa/account/config?providerType=TOTP";
        let removed = send(&client, &gw, "DELETE", path, &bearer, None).await;
        assert_eq!(removed.status(), 200, "{wire:?}");
    }
}

#[tokio::test]
async fn an_api_key_and_the_password_get_no_session_past_the_second_factor() {
    let (_upstream, gw) = common::gateway("").await;
    for wire in WIRES {
        let client = gw.client_over(wire);
        let email = format!("change-{wire:?}@example.com").to_lowercase();
        let user = gw.user(&email, Authority::TenantAdmin).await;
        let (_, key) = gw.api_key(&user, 0).await;
        let (_, session) = gw.access_token(&user).await;
        configure_totp(&client, &gw, &format!("Bearer {session}")).await;

        let change = json!({"currentPassword": PASSWORD, "newPassword": "another-long-password"});
        let path = "/api/auth/changePassword";
        let response = send(
            &client,
            &gw,
            "POST",
            path,
            &api_key_header(&key),
            Some(change),
        )
        .await;
        assert_eq!(response.status(), 200, "{wire:?}");
        let body: Value = response.json().await.unwrap();
        assert_eq!(body["scope"], "PRE_VERIFICATION_TOKEN", "{wire:?}: {body}");
        assert!(body["refreshToken"].is_null(), "{wire:?}: no pair: {body}");
        // The token opens nothing but the second step.
        let bearer = format!("Bearer {}", body["token"].as_str().unwrap());
        let generate = "/api/2fa/account/config/generate?providerType=TOTP";
        let refused = send(&client, &gw, "POST", generate, &bearer, None).await;
        assert_eq!(refused.status(), 401, "{wire:?}");
        // A session changing its password gets its pair, as before.
        let (_, session) = gw.access_token(&user).await;
        let back = json!({"currentPassword": "another-long-password", "newPassword": PASSWORD});
        let response = send(
            &client,
            &gw,
            "POST",
            path,
            &format!("Bearer {session}"),
            Some(back),
        )
        .await;
        assert_eq!(response.status(), 200, "{wire:?}");
        let body: Value = response.json().await.unwrap();
        assert!(body["refreshToken"].is_string(), "{wire:?}: {body}");
    }
}

/// A pre-verification token of `email`, who has TOTP configured.
async fn pre_verification_token(gw: &Gateway, email: &str) -> String {
    let response = gw.login(email, PASSWORD).await;
    assert_eq!(response.status(), 200);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["scope"], "PRE_VERIFICATION_TOKEN", "{body}");
    body["token"].as_str().unwrap().to_string()
}

#[tokio::test]
async fn a_pre_verification_token_is_told_its_second_factor_is_pending() {
    let (upstream, gw) = common::gateway("").await;
    let user = gw
        .user("pending-factor@example.com", Authority::TenantAdmin)
        .await;
    let (_, session) = gw.access_token(&user).await;
    configure_totp(&gw.client(), &gw, &format!("Bearer {session}")).await;
    let pre = pre_verification_token(&gw, "pending-factor@example.com").await;
    let bearer = format!("Bearer {pre}");

    for wire in WIRES {
        let client = gw.client_over(wire);
        for path in [
            "/api/tenant/devices?pageSize=10&page=0",
            "/api/users?pageSize=10&page=0",
        ] {
            let response = send(&client, &gw, "GET", path, &bearer, None).await;
            assert_eq!(response.version(), wire.version());
            let (status, body) = error_body(response).await;
            assert_eq!(
                (status, &body["errorCode"], &body["message"]),
                (401, &json!(10), &json!(PENDING)),
                "{wire:?} {path}: {body}"
            );
        }
    }
    assert_eq!(upstream.arrived(), 0, "nothing was forwarded");
    assert_eq!(
        counter(
            &gw.metrics().await,
            r#"keygate_auth_total{method="jwt",result="second_factor_pending"}"#
        ),
        4
    );
}

#[tokio::test]
async fn a_pre_verification_token_on_a_websocket_is_told_its_second_factor_is_pending() {
    use futures_util::StreamExt;
    use tokio_tungstenite::tungstenite::Message;
    let gw = Gateway::start(&common::reference_upstream().await, "").await;
    let user = gw
        .user("socket-factor@example.com", Authority::TenantAdmin)
        .await;
    let (_, session) = gw.access_token(&user).await;
    configure_totp(&gw.client(), &gw, &format!("Bearer {session}")).await;
    let pre = pre_verification_token(&gw, "socket-factor@example.com").await;

    let mut socket = common::open_socket(&gw, &format!("/api/ws?token={pre}")).await;
    let closed = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            match socket.next().await {
                Some(Ok(Message::Close(Some(frame)))) => {
                    return (u16::from(frame.code), frame.reason.to_string());
                }
                Some(Ok(_)) => {}
                other => panic!("expected a close, got {other:?}"),
            }
        }
    })
    .await
    .expect("a close in time");
    assert_eq!(closed, (1007, PENDING.to_string()));
}

/// The activation token of a link.
fn token_of(link: &str) -> String {
    link.split("activateToken=").nth(1).unwrap().to_string()
}

async fn activation_link(gw: &Gateway, bearer: &str, user: Uuid) -> String {
    let response = gw
        .client()
        .get(gw.https(&format!("/api/user/{user}/activationLink")))
        .header("X-Authorization", bearer)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    response.text().await.unwrap()
}

async fn activate(gw: &Gateway, token: &str) -> reqwest::Response {
    gw.client()
        .post(gw.https("/api/noauth/activate"))
        .json(&json!({"activateToken": token, "password": "a-new-password-1"}))
        .send()
        .await
        .unwrap()
}

async fn store_pool(gw: &Gateway) -> sqlx::SqlitePool {
    let url = format!("sqlite://{}/keygate.db", gw.dir.path().display());
    sqlx::sqlite::SqlitePool::connect(&url).await.unwrap()
}

/// How many activation tokens `user` has in the store.
async fn activation_tokens_of(gw: &Gateway, user: Uuid) -> i64 {
    sqlx::query_scalar("SELECT COUNT(*) FROM activation_tokens WHERE user_id = $1")
        .bind(user.to_string())
        .fetch_one(&store_pool(gw).await)
        .await
        .unwrap()
}

/// Moves every activation token of `user` to expire at `expires_at` (epoch
/// ms), as time passing would.
async fn age_activation(gw: &Gateway, user: Uuid, expires_at: i64) {
    let pool = store_pool(gw).await;
    sqlx::query("UPDATE activation_tokens SET expires_at = $1 WHERE user_id = $2")
        .bind(expires_at)
        .bind(user.to_string())
        .execute(&pool)
        .await
        .unwrap();
}

#[tokio::test]
async fn asking_for_an_activation_link_twice_never_replaces_the_pending_one() {
    let upstream = Upstream::start().await;
    let gw = Gateway::start(&upstream.url(), "").await;
    let sys = gw.user("sys-links@example.com", Authority::SysAdmin).await;
    let bearer = format!("Bearer {}", gw.access_token(&sys).await.1);

    // While valid, the same link, token and all.
    let user = pending_user(&gw, &bearer, "twice@example.com", "TENANT_ADMIN").await;
    let first = activation_link(&gw, &bearer, user).await;
    assert_eq!(activation_link(&gw, &bearer, user).await, first);

    // Close to its end (under 15 minutes left) a new one is issued, and the
    // one already sent still works until then.
    let soon = keygate::clock::now_ms() + 10 * 60 * 1000;
    age_activation(&gw, user, soon).await;
    let renewed = activation_link(&gw, &bearer, user).await;
    assert_ne!(token_of(&renewed), token_of(&first));
    assert_eq!(activation_link(&gw, &bearer, user).await, renewed);
    assert_eq!(activate(&gw, &token_of(&first)).await.status(), 200);
    assert_eq!(
        activate(&gw, &token_of(&renewed)).await.status(),
        400,
        "activating consumes every token of the user"
    );

    // Expired: a fresh one, which activates; the expired one does not.
    let other = pending_user(&gw, &bearer, "expired@example.com", "TENANT_ADMIN").await;
    let old = activation_link(&gw, &bearer, other).await;
    age_activation(&gw, other, keygate::clock::now_ms() - 1).await;
    let fresh = activation_link(&gw, &bearer, other).await;
    assert_ne!(token_of(&fresh), token_of(&old));
    assert_eq!(activate(&gw, &token_of(&old)).await.status(), 400);
    assert_eq!(activate(&gw, &token_of(&fresh)).await.status(), 200);
}
