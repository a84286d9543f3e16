//! The links keygate mails, followed as a browser follows them: the
//! invitation (`GET /api/noauth/activate?activateToken=`) and the reset link
//! (`GET /api/noauth/resetPassword?resetToken=`) answer as the platform's
//! `checkActivateToken` and `checkResetToken` do, over HTTP/1.1 and HTTP/2,
//! without using up the token; and every link and `Location` keygate writes
//! is on the configured public base URL, or else on the listener's.

mod common;

use std::net::SocketAddr;

use common::smtp::SmtpSink;
use common::{Gateway, PASSWORD, WIRES, Wire, error_body};
use keygate::identity::Authority;
use serde_json::{Value, json};
use uuid::Uuid;

const PUBLIC: &str = "https://gw.example.com";
const NEW_PASSWORD: &str = "a-new-password-2026";

/// A client as a browser following a mailed link is: no cookies, no
/// redirects followed, speaking `wire`.
fn browser(gw: &Gateway, wire: Wire) -> reqwest::Client {
    let builder = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(&gw.ca_pem).unwrap())
        .resolve("localhost", SocketAddr::from(([127, 0, 0, 1], 0)))
        .redirect(reqwest::redirect::Policy::none());
    match wire {
        Wire::Http1 => builder.http1_only(),
        Wire::Http2 => builder,
    }
    .build()
    .unwrap()
}

/// What keygate's links start with when no public base URL is set: its
/// HTTPS listener.
fn listener_base(gw: &Gateway) -> String {
    format!("https://{}", gw.running.https.unwrap())
}

/// `GET path` as a browser over `wire`: the status, `Location` and
/// `Cache-Control` (empty when absent), and the response.
async fn follow(gw: &Gateway, wire: Wire, path: &str) -> (u16, String, String, reqwest::Response) {
    let response = browser(gw, wire).get(gw.https(path)).send().await.unwrap();
    assert_eq!(response.version(), wire.version(), "{path}");
    let header = |name: &str| {
        response
            .headers()
            .get(name)
            .map(|v| v.to_str().unwrap().to_string())
            .unwrap_or_default()
    };
    let (location, cache) = (header("location"), header("cache-control"));
    (response.status().as_u16(), location, cache, response)
}

async fn admin_bearer(gw: &Gateway) -> String {
    let response = gw.login(keygate::accounts::BOOTSTRAP_EMAIL, PASSWORD).await;
    assert_eq!(response.status(), 200);
    let pair: Value = response.json().await.unwrap();
    format!("Bearer {}", pair["token"].as_str().unwrap())
}

/// A tenant administrator created over REST: no password yet.
async fn pending_user(gw: &Gateway, bearer: &str, email: &str) -> Uuid {
    let response = gw
        .client()
        .post(gw.https("/api/user?sendActivationMail=false"))
        .header("X-Authorization", bearer)
        .json(&json!({"email": email, "authority": "TENANT_ADMIN",
            "tenantId": {"entityType": "TENANT", "id": Uuid::new_v4()}}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200, "{}", response.text().await.unwrap());
    let created: Value = response.json().await.unwrap();
    created["id"]["id"].as_str().unwrap().parse().unwrap()
}

/// The user's activation link, as `GET /api/user/{id}/activationLink` shows it.
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

/// The path and query of `link`, which must start with `base`.
fn path_of<'l>(link: &'l str, base: &str) -> &'l str {
    link.strip_prefix(base)
        .unwrap_or_else(|| panic!("{link} is not on {base}"))
}

fn token_in(link: &str, name: &str) -> String {
    link.split_once(&format!("{name}="))
        .unwrap_or_else(|| panic!("no {name} in {link}"))
        .1
        .to_string()
}

async fn activate(gw: &Gateway, token: &str) -> reqwest::Response {
    gw.client()
        .post(gw.https("/api/noauth/activate"))
        .json(&json!({"activateToken": token, "password": NEW_PASSWORD}))
        .send()
        .await
        .unwrap()
}

async fn store_pool(gw: &Gateway) -> sqlx::SqlitePool {
    let url = format!("sqlite://{}/keygate.db", gw.dir.path().display());
    sqlx::sqlite::SqlitePool::connect(&url).await.unwrap()
}

/// Moves every activation (`reset`: reset) token of `user` into the past,
/// as time passing would.
async fn expire_tokens(gw: &Gateway, reset: bool, user: Uuid) {
    let sql = if reset {
        "UPDATE reset_tokens SET expires_at = 1 WHERE user_id = $1"
    } else {
        "UPDATE activation_tokens SET expires_at = 1 WHERE user_id = $1"
    };
    let updated = sqlx::query(sql)
        .bind(user.to_string())
        .execute(&store_pool(gw).await)
        .await
        .unwrap();
    assert!(updated.rows_affected() > 0, "{user} has a token to expire");
}

async fn request_reset(gw: &Gateway, email: &str) {
    let response = gw
        .client()
        .post(gw.https("/api/noauth/resetPasswordByEmail"))
        .json(&json!({ "email": email }))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
}

async fn assert_conflict(response: reqwest::Response, what: &str) {
    let (status, body) = error_body(response).await;
    assert_eq!(status, 409, "{what}: {body}");
    assert_eq!(body["errorCode"], json!(31), "{what}: {body}");
}

#[tokio::test]
async fn an_invitation_link_redirects_to_the_create_password_page_and_the_token_still_activates() {
    let (upstream, gw) = common::gateway("").await;
    let admin = admin_bearer(&gw).await;
    let base = listener_base(&gw);
    for wire in WIRES {
        let user = pending_user(&gw, &admin, &format!("invited-{wire:?}@example.com")).await;
        let link = activation_link(&gw, &admin, user).await;
        let token = token_in(&link, "activateToken");
        let path = path_of(&link, &base).to_string();

        // Followed twice, as a mail client's preview and then the user do:
        // the same redirect each time, nothing used up.
        for _ in 0..2 {
            let (status, location, cache, _) = follow(&gw, wire, &path).await;
            assert_eq!(status, 303, "{wire:?}");
            assert_eq!(
                location,
                format!("{base}/login/createPassword?activateToken={token}"),
                "{wire:?}"
            );
            assert_eq!(cache, "no-store");
        }
        let response = activate(&gw, &token).await;
        assert_eq!(response.status(), 200, "{wire:?}");
        let pair: Value = response.json().await.unwrap();
        assert!(pair["token"].is_string() && pair["refreshToken"].is_string());

        // Used: the platform's answer for a token it does not hold.
        let (status, _, _, response) = follow(&gw, wire, &path).await;
        assert_eq!(status, 409);
        assert_conflict(response, "a used invitation").await;
    }
    assert!(
        upstream.requests().is_empty(),
        "keygate answers the links itself"
    );
}

#[tokio::test]
async fn an_expired_invitation_goes_to_the_expired_page_an_unknown_one_is_409_and_neither_activates()
 {
    let (_upstream, gw) = common::gateway("").await;
    let admin = admin_bearer(&gw).await;
    let base = listener_base(&gw);
    let user = pending_user(&gw, &admin, "late@example.com").await;
    let link = activation_link(&gw, &admin, user).await;
    let token = token_in(&link, "activateToken");
    expire_tokens(&gw, false, user).await;
    for wire in WIRES {
        let (status, location, _, _) = follow(&gw, wire, path_of(&link, &base)).await;
        assert_eq!(
            (status, location.as_str()),
            (303, format!("{base}/activationLinkExpired").as_str()),
            "{wire:?}"
        );
        let (status, location, _, response) =
            follow(&gw, wire, "/api/noauth/activate?activateToken=forged").await;
        assert_eq!((status, location.as_str()), (409, ""), "{wire:?}");
        assert_conflict(response, "an unknown invitation").await;
        let (_, _, _, response) = follow(&gw, wire, "/api/noauth/activate").await;
        let (status, body) = error_body(response).await;
        assert_eq!(
            (status, body["message"].as_str()),
            (
                400,
                Some("Required request parameter 'activateToken' is not present")
            )
        );
    }
    let (status, body) = error_body(activate(&gw, &token).await).await;
    assert_eq!(
        (status, body["message"].as_str()),
        (400, Some("Activation token is invalid or expired"))
    );
}

#[tokio::test]
async fn unknown_link_tokens_count_against_the_address_like_failed_activations() {
    let (_upstream, gw) = common::gateway("[login]\naddress_max_failures = 3\n").await;
    let mut asked = 0;
    for wire in WIRES {
        for path in [
            "/api/noauth/activate?activateToken=forged",
            "/api/noauth/resetPassword?resetToken=forged",
            "/api/noauth/activate?activateToken=forged-too",
        ] {
            let (status, _, _, response) = follow(&gw, wire, path).await;
            asked += 1;
            if asked <= 3 {
                assert_conflict(response, path).await;
            } else {
                // Past the limit, both links answer 429 before any lookup.
                assert!(response.headers().contains_key("retry-after"), "{path}");
                assert_eq!(status, 429, "{wire:?} {path}");
            }
        }
    }
}

#[tokio::test]
async fn a_reset_link_redirects_on_the_listener_and_the_token_still_resets_then_expired_and_unknown_answer_as_the_platform()
 {
    let sink = SmtpSink::start().await;
    let (upstream, gw) = common::gateway(&sink.config()).await;
    let base = listener_base(&gw);
    let user = gw.user("forgot@example.com", Authority::TenantAdmin).await;

    request_reset(&gw, "forgot@example.com").await;
    let mail = sink.wait_for("forgot@example.com", 0).await;
    let link = mail.link_with("/api/noauth/resetPassword?resetToken=");
    // Without a public base URL, the mailed link is on the listener.
    let path = path_of(&link, &base).to_string();
    let token = token_in(&link, "resetToken");
    for wire in WIRES {
        let (status, location, cache, _) = follow(&gw, wire, &path).await;
        assert_eq!(status, 303, "{wire:?}");
        assert_eq!(
            location,
            format!("{base}/login/resetPassword?resetToken={token}")
        );
        assert_eq!(cache, "no-store");
    }
    let response = gw
        .client()
        .post(gw.https("/api/noauth/resetPassword"))
        .json(&json!({"resetToken": token, "password": NEW_PASSWORD}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(
        gw.login("forgot@example.com", NEW_PASSWORD).await.status(),
        200
    );
    // The notice after the reset links to the login page on the listener.
    let notice = sink.wait_for("forgot@example.com", 1).await;
    assert_eq!(notice.link_with("/login"), format!("{base}/login"));

    request_reset(&gw, "forgot@example.com").await;
    let mail = sink.wait_for("forgot@example.com", 2).await;
    let late = mail.link_with("/api/noauth/resetPassword?resetToken=");
    expire_tokens(&gw, true, user.id).await;
    for wire in WIRES {
        let (status, location, _, _) = follow(&gw, wire, path_of(&late, &base)).await;
        assert_eq!(
            (status, location),
            (303, format!("{base}/passwordResetLinkExpired")),
            "{wire:?}"
        );
        // The used one is unknown now.
        let (status, _, _, response) = follow(&gw, wire, &path).await;
        assert_eq!(status, 409);
        assert_conflict(response, "a used reset link").await;
    }
    assert!(upstream.requests().is_empty());
}

#[tokio::test]
async fn with_a_public_base_url_every_mailed_link_and_redirect_points_there_whatever_host_the_client_names()
 {
    let sink = SmtpSink::start().await;
    let (_upstream, gw) = common::gateway(&format!(
        "[server]\npublic_base_url = \"{PUBLIC}\"\n{}",
        sink.config()
    ))
    .await;
    let admin = admin_bearer(&gw).await;
    gw.user("member@example.com", Authority::TenantAdmin).await;

    // The invitation mail and the link the API shows.
    let response = gw
        .client()
        .post(gw.https("/api/user?sendActivationMail=true"))
        .header("X-Authorization", &admin)
        .header("X-Forwarded-Host", "evil.example")
        .json(
            &json!({"email": "new@example.com", "authority": "TENANT_ADMIN",
            "tenantId": {"entityType": "TENANT", "id": Uuid::new_v4()}}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let invitation = sink.wait_for("new@example.com", 0).await;
    let invitation = invitation.link_with("/api/noauth/activate?activateToken=");
    let activate_token = token_in(&invitation, "activateToken");
    request_reset(&gw, "member@example.com").await;
    let reset = sink.wait_for("member@example.com", 0).await;
    let reset = reset.link_with("/api/noauth/resetPassword?resetToken=");
    let reset_token = token_in(&reset, "resetToken");

    for wire in WIRES {
        let client = browser(&gw, wire);
        for (link, expected) in [
            (
                &invitation,
                format!("{PUBLIC}/login/createPassword?activateToken={activate_token}"),
            ),
            (
                &reset,
                format!("{PUBLIC}/login/resetPassword?resetToken={reset_token}"),
            ),
        ] {
            let response = client
                .get(gw.https(path_of(link, PUBLIC)))
                .header("X-Forwarded-Host", "evil.example")
                .send()
                .await
                .unwrap();
            assert_eq!(response.version(), wire.version());
            assert_eq!(response.status(), 303, "{link}");
            assert_eq!(response.headers()["location"].to_str().unwrap(), expected);
        }
    }
    let response = activate(&gw, &activate_token).await;
    assert_eq!(response.status(), 200);
}

#[tokio::test]
async fn behind_a_trusted_proxy_the_redirect_points_at_the_forwarded_host_and_elsewhere_never() {
    let (_up, trusting) = common::gateway("[proxy]\ntrusted_proxies = [\"127.0.0.1/32\"]\n").await;
    let (_up2, wary) = common::gateway("").await;
    for (gw, base) in [
        (&trusting, "https://iot.example.net".to_owned()),
        (&wary, listener_base(&wary)),
    ] {
        let admin = admin_bearer(gw).await;
        let user = pending_user(gw, &admin, "proxied@example.com").await;
        let link = activation_link(gw, &admin, user).await;
        let token = token_in(&link, "activateToken");
        let path = format!("/api/noauth/activate?activateToken={token}");
        for wire in WIRES {
            let response = browser(gw, wire)
                .get(gw.https(&path))
                .header("X-Forwarded-Host", "iot.example.net")
                .header("X-Forwarded-Proto", "https")
                .send()
                .await
                .unwrap();
            assert_eq!(response.version(), wire.version());
            assert_eq!(response.status(), 303);
            assert_eq!(
                response.headers()["location"].to_str().unwrap(),
                format!("{base}/login/createPassword?activateToken={token}"),
                "{wire:?}"
            );
        }
    }
}

/// The fenced block between `<!-- NAME:begin -->` and `<!-- NAME:end -->`
/// of `text`, without its fences.
fn marked_block(text: &str, name: &str) -> String {
    let begin = format!("<!-- {name}:begin -->");
    let end = format!("<!-- {name}:end -->");
    let start = text.find(&begin).expect("the block's begin mark") + begin.len();
    let stop = start + text[start..].find(&end).expect("the block's end mark");
    let inner: Vec<&str> = text[start..stop].trim().lines().collect();
    assert!(inner.len() > 2 && inner[0].starts_with("```") && inner[inner.len() - 1] == "```");
    inner[1..inner.len() - 1].join("\n")
}

fn repo_file(path: &str) -> String {
    std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(path)).unwrap()
}

/// Asserts the upstream's last request was `path_and_query`, carrying no
/// identity and no credential of any kind.
fn assert_reached_without_identity(upstream: &common::Upstream, path_and_query: &str) {
    let seen = upstream.last();
    assert_eq!(seen.path_and_query, path_and_query);
    for name in seen.headers.keys() {
        let name = name.as_str();
        assert!(
            !name.starts_with("x-auth") && name != "authorization" && name != "cookie",
            "{path_and_query} reached the platform with {name}"
        );
    }
}

#[tokio::test]
async fn the_documented_platform_routes_carry_the_web_ui_without_any_identity_and_keygate_keeps_its_endpoints()
 {
    use base64::Engine;
    // The routes as the guide shows them, which the example file must hold.
    let block = marked_block(
        &repo_file("docs/moving-from-the-platform.md"),
        "front-of-platform-routes",
    );
    let documented: toml::Table = block.parse().unwrap();
    let example: toml::Table = repo_file("config/front-of-platform.toml").parse().unwrap();
    assert_eq!(documented["route"], example["route"]);

    let upstream = common::Upstream::start().await;
    let key = base64::engine::general_purpose::STANDARD.encode([7u8; 64]);
    let config = format!(
        "{}\n[platform]\nsigning_key = \"{key}\"\n",
        block.replace("http://platform:8080", &upstream.url())
    );
    let gw = Gateway::start_with_routes(&config).await;
    let admin = admin_bearer(&gw).await;
    let forged = format!("Bearer {}", "e30.e30.forged");
    for wire in WIRES {
        let client = browser(&gw, wire);
        // The UI's pages, the page a reset link redirects to among them, with
        // every credential and identity a client could send.
        for path in ["/login/resetPassword?resetToken=x", "/", "/home?token=abc"] {
            for credential in [&admin, &forged] {
                let response = client
                    .get(gw.https(path))
                    .header("X-Authorization", credential)
                    .header("Authorization", credential)
                    .header("X-Auth-User-Id", Uuid::new_v4().to_string())
                    .header("X-Auth-Authority", "SYS_ADMIN")
                    .send()
                    .await
                    .unwrap();
                assert_eq!(response.version(), wire.version());
                assert_eq!(response.status(), 200, "{wire:?} {path}");
                // A platform route's `token` parameter never reaches it.
                let expected = path.replace("?token=abc", "");
                assert_reached_without_identity(&upstream, &expected);
            }
        }
        let forwarded = upstream.requests().len();

        // keygate still answers its own endpoints: logins, the mailed links;
        // also spelt with escaped letters, which the platform's server
        // would decode to its own `/api/` endpoints if the UI route took them.
        for login in ["/api/auth/login", "/%61pi/auth/login", "/api/auth/l%6Fgin"] {
            let response = client
                .post(gw.https(login))
                .json(
                    &json!({"username": keygate::accounts::BOOTSTRAP_EMAIL, "password": PASSWORD}),
                )
                .send()
                .await
                .unwrap();
            assert_eq!(response.status(), 200, "{login}");
            let pair: Value = response.json().await.unwrap();
            assert!(pair["token"].is_string(), "{login}");
        }
        let (status, _, _, _) = follow(&gw, wire, "/api/noauth/activate?activateToken=x").await;
        assert_eq!(status, 409);
        // A credential endpoint of the platform is on the authenticated
        // route, never on the public UI route.
        for token in ["/api/user/{}/token", "/%61pi/user/{}/token"] {
            let path = token.replace("{}", &Uuid::new_v4().to_string());
            let response = client.get(gw.https(&path)).send().await.unwrap();
            assert_eq!(response.status(), 401, "{path}");
        }
        assert_eq!(upstream.requests().len(), forwarded, "{wire:?}");
    }
}
