//! Attacks found in review, each replayed against the real server on loopback:
//! the test is named after the attack it stops. An attack made of requests
//! runs its one body over both wires ([`common::WIRES`]): HTTP/1.1 (the lean
//! path for a proxied route, hyper's for keygate's own endpoints) and
//! HTTP/2; one sent byte for byte is HTTP/1.1's, and says so.

mod common;

use std::time::Duration;

use common::{
    Gateway, PASSWORD, Upstream, WIRES, Wire, counter, error_body, plain_client_over, raw_http,
};
use keygate::accounts::{self, NewUser};
use keygate::identity::Authority;
use keygate::store::UserRecord;
use serde_json::{Value, json};
use uuid::Uuid;

async fn user_in(
    gw: &Gateway,
    email: &str,
    authority: Authority,
    tenant: Uuid,
    customer: Option<Uuid>,
) -> UserRecord {
    let new = NewUser {
        email: email.into(),
        authority,
        tenant_id: Some(tenant),
        customer_id: customer,
        first_name: String::new(),
        last_name: String::new(),
    };
    accounts::create_user(&gw.running.store, new, PASSWORD.into(), &Default::default())
        .await
        .unwrap()
}

async fn get(gw: &Gateway, path: &str, credential: &str) -> reqwest::Response {
    get_over(gw, Wire::Http2, path, credential).await
}

/// `GET path` with `credential` over `wire`.
async fn get_over(gw: &Gateway, wire: Wire, path: &str, credential: &str) -> reqwest::Response {
    let response = gw
        .client_over(wire)
        .get(gw.https(path))
        .header("X-Authorization", credential)
        .send()
        .await
        .unwrap();
    assert_eq!(response.version(), wire.version(), "{path}");
    response
}

#[tokio::test]
async fn activation_link_cannot_reset_an_active_account() {
    let (_upstream, gw) = common::gateway("").await;
    let tenant = Uuid::new_v4();
    let victim = user_in(
        &gw,
        "victim@example.com",
        Authority::TenantAdmin,
        tenant,
        None,
    )
    .await;
    let peer = user_in(
        &gw,
        "peer@example.com",
        Authority::TenantAdmin,
        tenant,
        None,
    )
    .await;
    let customer = user_in(
        &gw,
        "customer@example.com",
        Authority::CustomerUser,
        tenant,
        Some(Uuid::new_v4()),
    )
    .await;
    let (_, victim_token) = gw.access_token(&victim).await;
    let (_, peer_token) = gw.access_token(&peer).await;
    let (_, customer_key) = gw.api_key(&customer, 0).await;

    // Another TENANT_ADMIN of the same tenant, and a key holder for itself.
    for wire in WIRES {
        for (path, credential) in [
            (
                format!("/api/user/{}/activationLink", victim.id),
                format!("Bearer {peer_token}"),
            ),
            (
                format!("/api/user/{}/activationLink", customer.id),
                common::api_key_header(&customer_key),
            ),
        ] {
            let response = get_over(&gw, wire, &path, &credential).await;
            let (code, json) = error_body(response).await;
            assert_eq!(
                (code, json["errorCode"].as_u64()),
                (400, Some(31)),
                "{wire:?} {json}"
            );
            assert_eq!(json["message"], "User is already active");
        }
    }
    // The owner is not locked out and keeps working.
    assert_eq!(
        gw.login_at(gw.https("/api/auth/login"), "victim@example.com", PASSWORD)
            .await
            .status(),
        200
    );
    assert_eq!(
        get(&gw, "/api/devices", &format!("Bearer {victim_token}"))
            .await
            .status(),
        200
    );
}

/// An access token of the bootstrap SYS_ADMIN.
async fn sys_admin_token(gw: &Gateway) -> String {
    let sys = gw
        .running
        .store
        .user_by_email("sysadmin@keygate.local")
        .await
        .unwrap()
        .unwrap();
    gw.access_token(&sys).await.1
}

/// A pending user created over REST, and its activation token.
async fn pending_user_with_token(gw: &Gateway) -> (Uuid, String) {
    let token = sys_admin_token(gw).await;
    let bearer = format!("Bearer {token}");
    let created: Value = gw
        .client()
        .post(gw.https("/api/user"))
        .header("X-Authorization", &bearer)
        .json(&json!({"email": "pending@example.com", "authority": "TENANT_ADMIN", "tenantId": {"entityType": "TENANT", "id": Uuid::new_v4()}}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let id: Uuid = created["id"]["id"].as_str().unwrap().parse().unwrap();
    let link = get(gw, &format!("/api/user/{id}/activationLink"), &bearer)
        .await
        .text()
        .await
        .unwrap();
    let token = link.split("activateToken=").nth(1).unwrap().to_string();
    (id, token)
}

/// `POST /api/noauth/activate` over `wire`.
async fn activate(gw: &Gateway, wire: Wire, token: &str, password: &str) -> reqwest::Response {
    let response = gw
        .client_over(wire)
        .post(gw.https("/api/noauth/activate"))
        .json(&json!({"activateToken": token, "password": password}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.version(), wire.version());
    response
}

#[tokio::test]
async fn activation_token_raced_twice_sets_one_password() {
    let (_upstream, gw) = common::gateway("").await;
    let (_, token) = pending_user_with_token(&gw).await;
    // One racer over each wire.
    let (a, b) = tokio::join!(
        activate(&gw, Wire::Http1, &token, "first-password-a"),
        activate(&gw, Wire::Http2, &token, "first-password-b"),
    );
    let mut statuses = [a.status().as_u16(), b.status().as_u16()];
    statuses.sort();
    assert_eq!(statuses, [200, 400]);
    let winners = [
        gw.login_at(
            gw.https("/api/auth/login"),
            "pending@example.com",
            "first-password-a",
        )
        .await,
        gw.login_at(
            gw.https("/api/auth/login"),
            "pending@example.com",
            "first-password-b",
        )
        .await,
    ];
    let ok = winners.iter().filter(|r| r.status() == 200).count();
    assert_eq!(ok, 1, "exactly one of the racing passwords was set");
}

#[tokio::test]
async fn activation_flood_with_bogus_tokens_never_hashes_and_is_limited_per_address() {
    let (_upstream, gw) = common::gateway("[login]\naddress_max_failures = 20\n").await;
    let before = gw.metrics().await;
    let mut statuses = Vec::new();
    for i in 0..30 {
        // The wires take turns: one address, one window.
        let token = format!("bogus-token-{i}");
        let response = activate(&gw, WIRES[i % 2], &token, "a-long-enough-password").await;
        statuses.push(response.status().as_u16());
    }
    assert!(statuses[..20].iter().all(|s| *s == 400), "{statuses:?}");
    assert!(statuses[20..].iter().all(|s| *s == 429), "{statuses:?}");
    let after = gw.metrics().await;
    let hashes = r#"keygate_password_hashes_total{purpose="other"}"#;
    assert_eq!(
        counter(&after, hashes),
        counter(&before, hashes),
        "a bogus token costs no hash"
    );
    // The limit is the flooder's address: its logins are limited too.
    assert_eq!(
        gw.login_at(
            gw.https("/api/auth/login"),
            "sysadmin@keygate.local",
            PASSWORD
        )
        .await
        .status(),
        429,
        "the flooding address itself is limited for logins too"
    );
}

#[tokio::test]
async fn activation_with_a_valid_token_sets_the_password_once() {
    let (_upstream, gw) = common::gateway("").await;
    let (_, token) = pending_user_with_token(&gw).await;
    let response = activate(&gw, Wire::Http1, &token, "chosen-password").await;
    assert_eq!(response.status(), 200);
    // Spent, over either wire.
    for wire in WIRES {
        let again = activate(&gw, wire, &token, "attacker-password").await;
        assert_eq!(error_body(again).await.0, 400, "{wire:?}");
    }
    assert_eq!(
        gw.login_at(
            gw.https("/api/auth/login"),
            "pending@example.com",
            "chosen-password"
        )
        .await
        .status(),
        200
    );
}

#[tokio::test]
async fn parallel_wrong_passwords_never_exceed_the_login_limit() {
    let (_upstream, gw) = common::gateway("").await;
    gw.user("target@example.com", Authority::TenantAdmin).await;
    let before = gw.metrics().await;
    // The wires take turns: one address, one window.
    let clients = WIRES.map(|wire| gw.client_over(wire));
    let guesses = (0..40).map(|i| {
        let (gw, client) = (&gw, &clients[i % 2]);
        async move {
            let guess = format!("wrong-guess-{i}");
            let body = json!({"username": "target@example.com", "password": guess});
            let url = gw.https("/api/auth/login");
            let response = client.post(url).json(&body).send().await.unwrap();
            assert_eq!(response.version(), WIRES[i % 2].version());
            response
        }
    });
    let responses = futures_util::future::join_all(guesses).await;
    let evaluated = responses.iter().filter(|r| r.status() == 401).count();
    let limited = responses.iter().filter(|r| r.status() == 429).count();
    assert_eq!((evaluated, limited), (10, 30));
    let after = gw.metrics().await;
    let hashes = r#"keygate_password_hashes_total{purpose="login"}"#;
    assert_eq!(counter(&after, hashes) - counter(&before, hashes), 10);
}

const TRUSTING_LOOPBACK: &str = "[proxy]\ntrusted_proxies = [\"127.0.0.1/32\"]\n";

/// The wire of a test's `n`-th request, the two taking turns: a limit
/// counts both wires' requests alike.
fn turn(n: usize) -> Wire {
    WIRES[n % 2]
}

/// A login for the owner from `client_ip` over `wire`, as forwarded by a
/// trusted proxy.
async fn login_from(gw: &Gateway, wire: Wire, client_ip: &str, password: &str) -> u16 {
    login_as_from(gw, wire, "owner@example.com", client_ip, password).await
}

#[tokio::test]
async fn password_guesses_from_one_address_do_not_lock_the_owner_out() {
    let (_upstream, gw) = common::gateway(TRUSTING_LOOPBACK).await;
    gw.user("owner@example.com", Authority::TenantAdmin).await;
    for i in 0..10 {
        assert_eq!(login_from(&gw, turn(i), "198.51.100.7", "guess").await, 401);
    }
    for wire in WIRES {
        assert_eq!(login_from(&gw, wire, "198.51.100.7", PASSWORD).await, 429);
    }
    assert_eq!(login_from(&gw, turn(0), "203.0.113.5", PASSWORD).await, 200);
}

#[tokio::test]
async fn password_guesses_spread_over_addresses_reach_the_account_ceiling() {
    let upstream = Upstream::start().await;
    let gw = Gateway::start(
        &upstream.url(),
        &format!("{TRUSTING_LOOPBACK}[login]\naccount_max_failures = 6\naccount_address_max_failures = 3\n"),
    )
    .await;
    gw.user("owner@example.com", Authority::TenantAdmin).await;
    for i in 0..6 {
        assert_eq!(
            login_from(&gw, turn(i), &format!("198.51.100.{i}"), "guess").await,
            401
        );
    }
    for wire in WIRES {
        assert_eq!(login_from(&gw, wire, "203.0.113.5", PASSWORD).await, 429);
    }
}

/// The `i`-th address of the attacker's one /64 (as a trusted proxy reports it).
fn in_one_64(i: usize) -> String {
    format!(
        "2001:db8:1:2:{:x}:{:x}::{:x}",
        (i * 7919) % 0x10000,
        i,
        i + 1
    )
}

/// A login for `username` from `client_ip`, as forwarded by a trusted proxy.
async fn login_as_from(
    gw: &Gateway,
    wire: Wire,
    username: &str,
    client_ip: &str,
    password: &str,
) -> u16 {
    let response = gw
        .client_over(wire)
        .post(gw.https("/api/auth/login"))
        .header("X-Forwarded-For", client_ip)
        .json(&json!({"username": username, "password": password}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.version(), wire.version());
    response.status().as_u16()
}

#[tokio::test]
async fn ipv6_rotation_within_one_64_hits_the_per_address_login_limit() {
    let upstream = Upstream::start().await;
    let gw = Gateway::start(
        &upstream.url(),
        &format!("{TRUSTING_LOOPBACK}[login]\naccount_max_failures = 30\naccount_address_max_failures = 3\n"),
    )
    .await;
    gw.user("owner@example.com", Authority::TenantAdmin).await;
    let before = gw.metrics().await;
    let mut statuses = Vec::new();
    for i in 0..40 {
        statuses.push(login_from(&gw, turn(i), &in_one_64(i), "guess").await);
    }
    assert!(statuses[..3].iter().all(|s| *s == 401), "{statuses:?}");
    assert!(statuses[3..].iter().all(|s| *s == 429), "{statuses:?}");
    let after = gw.metrics().await;
    let hashes = r#"keygate_password_hashes_total{purpose="login"}"#;
    assert_eq!(counter(&after, hashes) - counter(&before, hashes), 3);
    // The account ceiling (30) was never reached: the owner, elsewhere, is in.
    assert_eq!(
        login_from(&gw, turn(0), "2001:db8:1:3::1", PASSWORD).await,
        200
    );
    // An IPv4-mapped address counts as its IPv4 address.
    for i in 0..3 {
        assert_eq!(login_from(&gw, turn(i), "198.51.100.9", "guess").await, 401);
    }
    for wire in WIRES {
        assert_eq!(
            login_from(&gw, wire, "::ffff:198.51.100.9", "guess").await,
            429
        );
    }
}

#[tokio::test]
async fn unknown_name_spray_from_one_64_stops_at_the_per_address_limit() {
    let upstream = Upstream::start().await;
    let gw = Gateway::start(
        &upstream.url(),
        &format!("{TRUSTING_LOOPBACK}[login]\naddress_max_failures = 5\n"),
    )
    .await;
    let before = gw.metrics().await;
    let mut statuses = Vec::new();
    for i in 0..30 {
        let name = format!("nobody-{i}@example.com");
        statuses.push(login_as_from(&gw, turn(i), &name, &in_one_64(i), "guess").await);
    }
    assert!(statuses[..5].iter().all(|s| *s == 401), "{statuses:?}");
    assert!(statuses[5..].iter().all(|s| *s == 429), "{statuses:?}");
    let after = gw.metrics().await;
    let hashes = r#"keygate_password_hashes_total{purpose="login"}"#;
    assert_eq!(
        counter(&after, hashes) - counter(&before, hashes),
        5,
        "one hash per attempt the address limit let through"
    );
    // Bogus activation tokens from the same /64 meet the same spent window.
    let activation = gw
        .client()
        .post(gw.https("/api/noauth/activate"))
        .header("X-Forwarded-For", in_one_64(99))
        .json(&json!({"activateToken": "bogus", "password": "a-long-enough-password"}))
        .send()
        .await
        .unwrap();
    assert_eq!(activation.status(), 429);
    // Another /64 has its own window.
    let other = login_as_from(
        &gw,
        turn(1),
        "nobody@example.com",
        "2001:db8:1:3::1",
        "guess",
    )
    .await;
    assert_eq!(other, 401);
}

#[tokio::test]
async fn change_password_cannot_be_used_to_brute_force_the_account_password() {
    let (_upstream, gw) = common::gateway("").await;
    let user = gw
        .user("keyholder@example.com", Authority::TenantAdmin)
        .await;
    let (_, key) = gw.api_key(&user, 0).await;
    // The wires take turns: one account, one window.
    let clients = WIRES.map(|wire| gw.client_over(wire));
    let attempt = |n: usize, current: &'static str| {
        clients[n % 2]
            .post(gw.https("/api/auth/changePassword"))
            .header("X-Authorization", common::api_key_header(&key))
            .json(&json!({"currentPassword": current, "newPassword": "brand-new-password"}))
            .send()
    };
    for n in 0..10 {
        let response = attempt(n, "wrong-guess").await.unwrap();
        assert_eq!(response.version(), turn(n).version());
        assert_eq!(response.status(), 400, "{:?}", turn(n));
    }
    for n in 0..2 {
        let (code, json) = error_body(attempt(n, PASSWORD).await.unwrap()).await;
        assert_eq!(
            (code, json["errorCode"].as_u64()),
            (429, Some(33)),
            "{:?}",
            turn(n)
        );
    }
}

#[tokio::test]
async fn forwarding_headers_from_an_untrusted_client_never_reach_the_upstream() {
    let (upstream, gw) = common::gateway("").await;
    let user = gw.user("fwd@example.com", Authority::TenantAdmin).await;
    let (_, key) = gw.api_key(&user, 0).await;
    let spoofed = [
        "X-Forwarded-For",
        "X-Forwarded-Proto",
        "X-Forwarded-Host",
        "X-Forwarded-Prefix",
        "X-Forwarded-Port",
        "X-Forwarded-Ssl",
        "X-Forwarded-Server",
        "X-Forwarded-Scheme",
        "Forwarded",
        "X-Real-IP",
        "True-Client-IP",
        "X-Client-IP",
        "X-Original-URL",
        "X-Rewrite-URL",
        "X_Real_IP",
    ];
    let declines = gw.declines().await;
    for (wire, path) in WIRES
        .into_iter()
        .flat_map(|wire| [(wire, "/api/devices"), (wire, "/api/noauth/info")])
    {
        let mut request = gw
            .client_over(wire)
            .get(gw.https(path))
            .header("X-Authorization", common::api_key_header(&key));
        for name in spoofed {
            request = request.header(name, "spoofed");
        }
        let response = request.send().await.unwrap();
        assert_eq!(response.version(), wire.version());
        assert_eq!(response.status(), 200, "{wire:?} {path}");
        let seen = upstream.last_to(path);
        let leaked: Vec<_> = seen
            .headers
            .iter()
            .filter(|(_, v)| v.as_bytes() == b"spoofed")
            .map(|(n, _)| n.as_str().to_string())
            .collect();
        assert!(
            leaked.is_empty(),
            "{wire:?} {path}: {leaked:?} reached the upstream"
        );
        assert_eq!(seen.headers["x-forwarded-for"], "127.0.0.1");
        assert_eq!(seen.headers["x-forwarded-proto"], "https");
    }
    gw.assert_lean_path_took(&declines, &[], "untrusted forwarding headers")
        .await;
}

#[tokio::test]
async fn forwarding_headers_from_a_trusted_proxy_pass() {
    let (upstream, gw) = common::gateway(TRUSTING_LOOPBACK).await;
    for wire in WIRES {
        upstream.seen.lock().unwrap().clear();
        let response = gw
            .client_over(wire)
            .get(gw.https("/api/noauth/info"))
            .header("X-Forwarded-Prefix", "/edge")
            .header("X-Real-IP", "203.0.113.5")
            .send()
            .await
            .unwrap();
        assert_eq!(response.version(), wire.version());
        assert_eq!(response.status(), 200, "{wire:?}");
        let seen = upstream.last_to("/api/noauth/info");
        assert_eq!(seen.headers["x-forwarded-prefix"], "/edge", "{wire:?}");
        assert_eq!(seen.headers["x-real-ip"], "203.0.113.5", "{wire:?}");
    }
}

#[tokio::test]
async fn separator_spelled_identity_headers_cannot_spoof_a_user() {
    let (upstream, gw) = common::gateway("").await;
    let user = gw.user("spoof@example.com", Authority::CustomerUser).await;
    let (_, key) = gw.api_key(&user, 0).await;
    for (wire, path) in WIRES
        .into_iter()
        .flat_map(|wire| [(wire, "/api/devices"), (wire, "/api/noauth/info")])
    {
        upstream.seen.lock().unwrap().clear();
        let response = gw
            .client_over(wire)
            .get(gw.https(path))
            .header("X-Authorization", common::api_key_header(&key))
            .header("X.Auth.User-Id", "evil")
            .header("X~Auth~Authority", "SYS_ADMIN")
            .header("x_auth_email", "evil@example.com")
            .send()
            .await
            .unwrap();
        assert_eq!(response.version(), wire.version());
        assert_eq!(response.status(), 200, "{wire:?} {path}");
        let seen = upstream.last_to(path);
        assert!(
            seen.headers.values().all(|v| v.as_bytes() != b"evil"
                && v.as_bytes() != b"SYS_ADMIN"
                && v.as_bytes() != b"evil@example.com"),
            "{wire:?} {path}: {:?}",
            seen.headers
        );
    }
}

#[tokio::test]
async fn semicolon_and_double_encoded_paths_cannot_reach_a_protected_route_as_public() {
    let (upstream, gw) = common::gateway("").await;
    for wire in WIRES {
        for path in [
            "/api/noauth/..;/tenant/devices",
            "/api/noauth/..;jsessionid=x/tenant/devices",
            "/api/noauth/%252e%252e/tenant/devices",
            "/api/noauth/%c0%ae%c0%ae/tenant/devices",
            "/api/noauth/%ef%bc%8e%ef%bc%8e/tenant/devices",
        ] {
            let response = gw
                .client_over(wire)
                .get(format!("{}{path}", gw.https("")))
                .send()
                .await
                .unwrap();
            assert_eq!(response.version(), wire.version());
            let (code, json) = error_body(response).await;
            assert_eq!(
                (code, json["errorCode"].as_u64()),
                (400, Some(31)),
                "{wire:?} {path}"
            );
        }
    }
    assert!(upstream.requests().is_empty(), "nothing was forwarded");
}

/// Sent byte for byte (an HTTP client would percent-encode them): raw
/// Unicode look-alike dots, and `;` encoded in both cases. HTTP/1.1 only,
/// as a raw request line is.
#[tokio::test]
async fn raw_unicode_dots_and_encoded_semicolons_cannot_reach_a_protected_route_as_public() {
    let (upstream, gw) = common::gateway("").await;
    for path in [
        "/api/noauth/\u{FF0E}\u{FF0E}/tenant/devices",
        "/api/noauth/\u{2024}\u{2024}/tenant/devices",
        "/api/noauth/\u{FE52}\u{FE52}/tenant/devices",
        "/api/noauth/..%3B/device/x",
        "/api/noauth/..%3bjsessionid=1/device/x",
    ] {
        let request =
            format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
        let response = raw_http(gw.running.http.unwrap(), &request).await;
        assert!(response.starts_with("HTTP/1.1 400"), "{path}: {response}");
        let body = response.split("\r\n\r\n").nth(1).unwrap_or_default();
        let json: serde_json::Value = serde_json::from_str(body)
            .unwrap_or_else(|e| panic!("{path}: not the contract's JSON ({e}): {response}"));
        assert_eq!(json["status"], 400, "{path}: {json}");
        assert_eq!(json["errorCode"], 31, "{path}: {json}");
        assert!(json["timestamp"].as_u64().is_some(), "{path}: {json}");
    }
    assert!(upstream.requests().is_empty(), "nothing was forwarded");
    // The same request with a plain name is forwarded: the refusals above
    // are the path's, not the raw client's.
    let request = "GET /api/noauth/info HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";
    let response = raw_http(gw.running.http.unwrap(), request).await;
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    assert_eq!(upstream.requests().len(), 1);
}

#[tokio::test]
async fn api_key_sent_in_clear_to_a_public_route_is_refused_and_disabled() {
    let (upstream, gw) = common::gateway("[api_keys]\ndisable_on_plaintext = true\n").await;
    let user = gw.user("clear@example.com", Authority::TenantAdmin).await;
    for wire in WIRES {
        let (_, key) = gw.api_key(&user, 0).await;
        let response = plain_client_over(wire)
            .get(gw.http("/api/noauth/info"))
            .header("X-Authorization", common::api_key_header(&key))
            .send()
            .await
            .unwrap();
        assert_eq!(response.version(), wire.version());
        let (code, json) = error_body(response).await;
        assert_eq!(
            (code, json["errorCode"].as_u64()),
            (403, Some(20)),
            "{wire:?}"
        );
        assert!(upstream.requests().is_empty());
        let over_tls = get_over(&gw, wire, "/api/devices", &common::api_key_header(&key)).await;
        let (code, json) = error_body(over_tls).await;
        assert_eq!(
            (code, json["message"].as_str()),
            (401, Some("User account is not active")),
            "{wire:?}: the exposed key was disabled"
        );
    }
}

#[tokio::test]
async fn passwords_and_tokens_in_clear_are_refused_when_a_proxy_saw_them_cross_in_clear() {
    let (upstream, gw) = common::gateway(TRUSTING_LOOPBACK).await;
    let user = gw.user("clear@example.com", Authority::TenantAdmin).await;
    let (_, token) = gw.access_token(&user).await;
    for wire in WIRES {
        refused_when_seen_in_clear(&gw, wire, &token).await;
    }
    assert!(upstream.requests().is_empty());
    // A loopback client that is not a proxy (a sidecar's neighbour) may.
    let plain = Gateway::start(&upstream.url(), "").await;
    let user = plain.user("side@example.com", Authority::TenantAdmin).await;
    let (_, token) = plain.access_token(&user).await;
    for wire in WIRES {
        let response = plain_client_over(wire)
            .get(plain.http("/api/devices"))
            .header("X-Authorization", format!("Bearer {token}"))
            .send()
            .await
            .unwrap();
        assert_eq!(response.version(), wire.version());
        assert_eq!(response.status(), 200, "{wire:?}");
    }
}

/// Through a trusting gateway's plain listener over `wire`: what a proxy
/// reports as crossing in clear is refused, the same login reported as
/// https passes.
async fn refused_when_seen_in_clear(gw: &Gateway, wire: Wire, token: &str) {
    let client = plain_client_over(wire);
    let over = |proto: &'static str, path: &str| {
        client
            .post(gw.http(path))
            .header("X-Forwarded-Proto", proto)
    };
    let login_body = json!({"username": "clear@example.com", "password": PASSWORD});
    let response = over("http", "/api/auth/login")
        .json(&login_body)
        .send()
        .await
        .unwrap();
    assert_eq!(response.version(), wire.version());
    let (code, json) = error_body(response).await;
    assert_eq!(
        (code, json["errorCode"].as_u64()),
        (403, Some(20)),
        "{wire:?}"
    );
    let (code, _) = error_body(
        over("http", "/api/devices")
            .header("X-Authorization", format!("Bearer {token}"))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(code, 403, "{wire:?}");
    let (code, _) = error_body(
        over("http", "/api/auth/token")
            .json(&json!({"refreshToken": "x.y.z"}))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(code, 403, "{wire:?}");
    // The same proxy reporting https: accepted.
    let response = over("https", "/api/auth/login")
        .json(&login_body)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200, "{wire:?}");
}

#[tokio::test]
async fn customer_user_cannot_learn_that_another_user_exists() {
    let (_upstream, gw) = common::gateway("").await;
    let tenant = Uuid::new_v4();
    let admin = user_in(
        &gw,
        "admin@example.com",
        Authority::TenantAdmin,
        tenant,
        None,
    )
    .await;
    let customer = user_in(
        &gw,
        "cu@example.com",
        Authority::CustomerUser,
        tenant,
        Some(Uuid::new_v4()),
    )
    .await;
    let (_, key) = gw.api_key(&customer, 0).await;
    let credential = common::api_key_header(&key);
    for wire in WIRES {
        let user = |id: Uuid| format!("/api/user/{id}");
        let existing = get_over(&gw, wire, &user(admin.id), &credential).await;
        let existing = error_body(existing).await;
        let unknown = get_over(&gw, wire, &user(Uuid::new_v4()), &credential).await;
        let unknown = error_body(unknown).await;
        assert_eq!(existing.0, 404, "{wire:?}");
        assert_eq!(
            (existing.0, &existing.1["message"], &existing.1["errorCode"]),
            (unknown.0, &unknown.1["message"], &unknown.1["errorCode"]),
            "{wire:?}"
        );
        let own = get_over(&gw, wire, &user(customer.id), &credential).await;
        assert_eq!(own.status(), 200, "{wire:?}");
    }
}

/// HTTP/1.1 only: sent byte for byte, as HTTP/1.1 frames it.
#[tokio::test]
async fn malformed_chunked_body_is_the_clients_400_not_the_upstreams_502() {
    let (_upstream, gw) = common::gateway("").await;
    let request = "POST /api/noauth/upload HTTP/1.1\r\nHost: localhost\r\n\
                   Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\nzz\r\nbroken\r\n0\r\n\r\n";
    let response = raw_http(gw.running.http.unwrap(), request).await;
    assert!(response.starts_with("HTTP/1.1 400"), "{response}");
    assert!(response.contains(r#""errorCode":31"#), "{response}");
    let metrics = gw.metrics().await;
    let blamed: Vec<&str> = metrics
        .lines()
        .filter(|line| line.starts_with("keygate_upstream_errors_total{") && !line.ends_with(" 0"))
        .collect();
    assert!(blamed.is_empty(), "no upstream was blamed: {blamed:?}");
}

#[tokio::test]
async fn activation_link_ignores_a_spoofed_host_header() {
    let (_upstream, gw) = common::gateway("").await;
    let (id, _) = pending_user_with_token(&gw).await;
    let token = sys_admin_token(&gw).await;
    let link_for = |gw: &Gateway, wire: Wire, host: Option<&'static str>| {
        let mut request = gw
            .client_over(wire)
            .get(gw.https(&format!("/api/user/{id}/activationLink")))
            .header("X-Authorization", format!("Bearer {token}"));
        if let Some(host) = host {
            request = request
                .header("Host", host)
                .header("X-Forwarded-Host", host);
        }
        request.send()
    };
    for wire in WIRES {
        let response = link_for(&gw, wire, Some("evil.example")).await.unwrap();
        assert_eq!(response.version(), wire.version());
        let link = response.text().await.unwrap();
        assert!(!link.contains("evil.example"), "{wire:?}: {link}");
        assert!(
            link.starts_with(&format!("https://{}/", gw.running.https.unwrap())),
            "{wire:?}: {link}"
        );
    }
}

#[tokio::test]
async fn activation_links_use_the_configured_public_base_url() {
    let upstream = Upstream::start().await;
    let gw = Gateway::start(
        &upstream.url(),
        "[server]\npublic_base_url = \"https://gw.example.com/\"\n",
    )
    .await;
    let (id, _) = pending_user_with_token(&gw).await;
    let token = sys_admin_token(&gw).await;
    for wire in WIRES {
        let path = format!("/api/user/{id}/activationLink");
        let response = get_over(&gw, wire, &path, &format!("Bearer {token}")).await;
        let link = response.text().await.unwrap();
        assert!(
            link.starts_with("https://gw.example.com/api/noauth/activate?activateToken="),
            "{wire:?}: {link}"
        );
    }
}

/// HTTP/1.1 only: sent byte for byte, as HTTP/1.1 frames it.
#[tokio::test]
async fn content_length_with_transfer_encoding_is_refused_and_the_connection_closed() {
    let (upstream, gw) = common::gateway("").await;
    // The smuggled second request must never be read.
    let request = "POST /api/noauth/upload HTTP/1.1\r\nHost: localhost\r\n\
                   Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n\
                   0\r\n\r\nGET /api/noauth/smuggled HTTP/1.1\r\nHost: localhost\r\n\r\n";
    let started = std::time::Instant::now();
    let response = raw_http(gw.running.http.unwrap(), request).await;
    assert!(response.starts_with("HTTP/1.1 400"), "{response}");
    assert!(response.contains("connection: close"), "{response}");
    assert_eq!(response.matches("HTTP/1.1").count(), 1, "{response}");
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "the connection closed"
    );
    assert!(upstream.requests().is_empty());
}

/// HTTP/1.1 only: sent byte for byte, as HTTP/1.1 frames it.
#[tokio::test]
async fn a_plain_chunked_request_still_passes_the_framing_check() {
    let (upstream, gw) = common::gateway("").await;
    let request = "POST /api/noauth/upload HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\
                   Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n";
    let response = raw_http(gw.running.http.unwrap(), request).await;
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    assert_eq!(upstream.last_to("/api/noauth/upload").body_len, 5);
}

/// An upstream on raw TCP that answers `101 Switching Protocols` to any
/// request whose path holds `/switch` (and then holds the connection, as
/// an upgraded one), and `200` to the rest; counts the requests it read.
async fn switching_upstream() -> (
    std::net::SocketAddr,
    std::sync::Arc<std::sync::atomic::AtomicUsize>,
) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = std::sync::Arc::new(AtomicUsize::new(0));
    let counted = seen.clone();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let counted = counted.clone();
            tokio::spawn(async move {
                let mut buffer = Vec::new();
                let mut chunk = [0u8; 4096];
                loop {
                    let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") else {
                        match stream.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buffer.extend_from_slice(&chunk[..n]),
                        }
                        continue;
                    };
                    let head = String::from_utf8_lossy(&buffer[..end]).into_owned();
                    buffer.drain(..end + 4);
                    counted.fetch_add(1, Ordering::SeqCst);
                    if head.lines().next().unwrap_or("").contains("/switch") {
                        let _ = stream
                            .write_all(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: raw\r\nConnection: Upgrade\r\n\r\n")
                            .await;
                        // Upgraded, as far as this side knows: read and ignore.
                        while matches!(stream.read(&mut chunk).await, Ok(n) if n > 0) {}
                        return;
                    }
                    let body = r#"{"ok":true}"#;
                    let answer = format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                        body.len()
                    );
                    if stream.write_all(answer.as_bytes()).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (addr, seen)
}

/// HTTP/1.1 only: sent byte for byte, as HTTP/1.1 frames it.
#[tokio::test]
async fn upstream_101_on_a_plain_request_is_a_502_and_the_pipelined_request_after_it_is_answered() {
    let (upstream, seen) = switching_upstream().await;
    let gw = Gateway::start(&format!("http://{upstream}"), "").await;
    let request = "GET /api/noauth/switch HTTP/1.1\r\nHost: localhost\r\n\r\n\
                   GET /api/noauth/after HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";
    let response = raw_http(gw.running.http.unwrap(), request).await;
    assert!(response.starts_with("HTTP/1.1 502"), "{response}");
    assert!(
        !response.contains("HTTP/1.1 101"),
        "no 101 reached the client: {response}"
    );
    let first = response.split("HTTP/1.1 ").nth(1).unwrap_or_default();
    assert!(first.contains(r#""errorCode":2"#), "{response}");
    assert!(first.contains(r#""status":502"#), "{response}");
    assert_eq!(
        response.matches("HTTP/1.1 ").count(),
        2,
        "both requests were answered: {response}"
    );
    let second = response.split("HTTP/1.1 ").nth(2).unwrap_or_default();
    assert!(second.starts_with("200"), "{response}");
    assert!(second.contains(r#"{"ok":true}"#), "{response}");
    assert_eq!(seen.load(std::sync::atomic::Ordering::SeqCst), 2);
    let metrics = gw.metrics().await;
    let reset =
        format!(r#"keygate_upstream_errors_total{{kind="reset",upstream="http://{upstream}"}} 1"#);
    assert!(
        metrics.contains(&reset),
        "counted as an upstream error:\n{metrics}"
    );
}

#[tokio::test]
async fn sprayed_random_api_keys_stop_reaching_the_store_at_the_address_budget() {
    let upstream = Upstream::start().await;
    let gw = Gateway::start(
        &upstream.url(),
        "[api_keys]\nunknown_lookups_per_address = \"20/m\"\n",
    )
    .await;
    let user = gw.user("cached@example.com", Authority::TenantAdmin).await;
    let (_, valid) = gw.api_key(&user, 0).await;
    let valid = common::api_key_header(&valid);
    assert_eq!(get(&gw, "/api/devices", &valid).await.status(), 200);
    let lookups = r#"keygate_auth_store_lookups_total{kind="api_key"}"#;
    let before = counter(&gw.metrics().await, lookups);
    // Both wires take turns: one address, one budget.
    let clients = WIRES.map(|wire| (wire, gw.client_over(wire)));
    let mut statuses = Vec::new();
    for i in 0..100 {
        let (wire, client) = &clients[i % 2];
        let response = client
            .get(gw.https("/api/devices"))
            .header(
                "X-Authorization",
                format!("ApiKey tb_random-{i}-{}", Uuid::new_v4()),
            )
            .send()
            .await
            .unwrap();
        assert_eq!(response.version(), wire.version());
        if response.status() == 429 {
            let (_, body) = error_body(response).await;
            assert_eq!(body["errorCode"], 33, "{body}");
            statuses.push(429);
        } else {
            statuses.push(response.status().as_u16());
        }
    }
    assert!(statuses[..20].iter().all(|s| *s == 401), "{statuses:?}");
    assert!(statuses[20..].iter().all(|s| *s == 429), "{statuses:?}");
    let metrics = gw.metrics().await;
    assert_eq!(
        counter(&metrics, lookups) - before,
        20,
        "store lookups stop at the budget"
    );
    assert_eq!(
        counter(
            &metrics,
            r#"keygate_rate_limited_total{limiter="unknown_api_keys"}"#
        ),
        80
    );
    // The cached key still answers from the same address, and only its
    // requests ever reached the upstream.
    assert_eq!(get(&gw, "/api/devices", &valid).await.status(), 200);
    assert_eq!(upstream.requests().len(), 2);
}

#[tokio::test]
async fn random_api_keys_sent_in_clear_stop_reaching_the_store_at_the_address_budget() {
    let upstream = Upstream::start().await;
    let gw = Gateway::start(
        &upstream.url(),
        "[api_keys]\ndisable_on_plaintext = true\nunknown_lookups_per_address = \"10/m\"\n",
    )
    .await;
    let lookups = r#"keygate_auth_store_lookups_total{kind="api_key"}"#;
    let before = counter(&gw.metrics().await, lookups);
    // Both wires take turns: one address, one budget.
    let clients = WIRES.map(|wire| (wire, plain_client_over(wire)));
    for i in 0..40 {
        let (wire, client) = &clients[i % 2];
        let response = client
            .get(gw.http("/api/noauth/devices"))
            .header("X-Authorization", format!("ApiKey tb_clear-{i}"))
            .send()
            .await
            .unwrap();
        assert_eq!(response.version(), wire.version());
        assert_eq!(response.status(), 403, "{wire:?}");
    }
    let after = counter(&gw.metrics().await, lookups);
    assert_eq!(after - before, 10, "store lookups stop at the budget");
    assert!(upstream.requests().is_empty());
}
