//! Mail end to end against an SMTP sink started by each test: invitations,
//! password reset by mail, e-mail codes for two-factor login, and a mail
//! server that is down or slow never making an endpoint slow or fail.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::smtp::SmtpSink;
use common::{Gateway, PASSWORD, api_key_header, counter, error_body};
use keygate::identity::Authority;
use serde_json::{Value, json};

const PUBLIC: &str = "https://gw.example.com";
const NEW_PASSWORD: &str = "a-new-password-2026";
const TENANT: &str = "7c1f9a52-3b4e-4d1a-9f0e-2a6b8c4d5e6f";

async fn gateway_mailing_to(mail: &str) -> (common::Upstream, Gateway) {
    common::gateway(&format!("[server]\npublic_base_url = \"{PUBLIC}\"\n{mail}")).await
}

async fn token_of(gw: &Gateway, email: &str, password: &str) -> Value {
    let response = gw.login(email, password).await;
    assert_eq!(response.status(), 200);
    response.json().await.unwrap()
}

async fn admin_token(gw: &Gateway) -> String {
    token_of(gw, keygate::accounts::BOOTSTRAP_EMAIL, PASSWORD).await["token"]
        .as_str()
        .unwrap()
        .to_string()
}

async fn call(
    gw: &Gateway,
    method: reqwest::Method,
    path: &str,
    token: Option<&str>,
    body: Option<Value>,
) -> reqwest::Response {
    let mut request = gw.client().request(method, gw.https(path));
    if let Some(token) = token {
        request = request.header("X-Authorization", format!("Bearer {token}"));
    }
    if let Some(body) = body {
        request = request.json(&body);
    }
    request.send().await.unwrap()
}

/// The same link on the gateway under test (links carry the public base URL).
fn on_gateway(gw: &Gateway, link: &str) -> String {
    let path = link
        .strip_prefix(PUBLIC)
        .unwrap_or_else(|| panic!("{link} is not on {PUBLIC}"));
    gw.https(path)
}

fn query_value(link: &str, name: &str) -> String {
    link.split_once(&format!("{name}="))
        .unwrap_or_else(|| panic!("no {name} in {link}"))
        .1
        .split('&')
        .next()
        .unwrap()
        .to_string()
}

async fn request_reset(gw: &Gateway, email: &str) -> (u16, String) {
    let response = call(
        gw,
        reqwest::Method::POST,
        "/api/noauth/resetPasswordByEmail",
        None,
        Some(json!({ "email": email })),
    )
    .await;
    let status = response.status().as_u16();
    (status, response.text().await.unwrap())
}

fn no_redirects(gw: &Gateway) -> reqwest::Client {
    reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(&gw.ca_pem).unwrap())
        .resolve("localhost", std::net::SocketAddr::from(([127, 0, 0, 1], 0)))
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
}

// --- invitations -------------------------------------------------------------------

#[tokio::test]
async fn invitation_mail_carries_an_activation_link_on_the_public_url_that_activates() {
    let sink = SmtpSink::start().await;
    let (_up, gw) = gateway_mailing_to(&sink.config()).await;
    let admin = admin_token(&gw).await;
    let response = gw
        .client()
        .post(gw.https("/api/user?sendActivationMail=true"))
        .header("X-Authorization", format!("Bearer {admin}"))
        // The client's Host never makes the link.
        .header("X-Forwarded-Host", "evil.example")
        .json(&json!({"email": "invited@example.com", "authority": "TENANT_ADMIN", "tenantId": {"entityType": "TENANT", "id": TENANT}}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200, "{}", response.text().await.unwrap());
    let first = sink.wait_for("invited@example.com", 0).await;
    assert_eq!(first.subject, "Your account activation on Thingsboard");
    assert_eq!(first.from, "noreply@example.com");
    assert!(
        first.body.contains("The link will expire in 24 hours."),
        "{}",
        first.body
    );
    let first_link = first.link_with("/api/noauth/activate?activateToken=");
    assert!(first_link.starts_with(PUBLIC), "{first_link}");

    // Sent again: the same link (it is far from expiring), as the platform
    // mails it again; the one in the first mail keeps working.
    let response = call(
        &gw,
        reqwest::Method::POST,
        "/api/user/sendActivationMail?email=invited@example.com",
        Some(&admin),
        None,
    )
    .await;
    assert_eq!(response.status(), 200);
    let second = sink.wait_for("invited@example.com", 1).await;
    let second_link = second.link_with("/api/noauth/activate?activateToken=");
    assert_eq!(first_link, second_link);
    assert!(second.body.contains("The link will expire in 24 hours."));

    let activate = |token: String| {
        let gw = &gw;
        async move {
            call(
                gw,
                reqwest::Method::POST,
                "/api/noauth/activate",
                None,
                Some(json!({"activateToken": token, "password": NEW_PASSWORD})),
            )
            .await
        }
    };
    let response = activate(query_value(&first_link, "activateToken")).await;
    assert_eq!(response.status(), 200);
    let pair: Value = response.json().await.unwrap();
    assert!(pair["token"].is_string() && pair["refreshToken"].is_string());
    token_of(&gw, "invited@example.com", NEW_PASSWORD).await;
    let (status, _) = error_body(activate(query_value(&second_link, "activateToken")).await).await;
    assert_eq!(status, 400, "a used link is void");

    // An active user gets no invitation.
    let response = call(
        &gw,
        reqwest::Method::POST,
        "/api/user/sendActivationMail?email=invited@example.com",
        Some(&admin),
        None,
    )
    .await;
    let (status, body) = error_body(response).await;
    assert_eq!(
        (status, body["message"].as_str()),
        (400, Some("User is already active"))
    );
}

#[tokio::test]
async fn invitation_without_mail_configured_is_refused_before_the_user_is_created() {
    let (_up, gw) = common::gateway("").await;
    let admin = admin_token(&gw).await;
    let response = call(
        &gw,
        reqwest::Method::POST,
        "/api/user?sendActivationMail=true",
        Some(&admin),
        Some(json!({"email": "nomail@example.com", "authority": "TENANT_ADMIN", "tenantId": {"entityType": "TENANT", "id": TENANT}})),
    )
    .await;
    let (status, body) = error_body(response).await;
    assert_eq!(status, 400);
    assert!(
        body["message"].as_str().unwrap().contains("[mail]"),
        "{body}"
    );
    assert!(
        gw.running
            .store
            .user_by_email("nomail@example.com")
            .await
            .unwrap()
            .is_none()
    );
    // Left out, the parameter sends nothing and creates the user as before.
    let response = call(
        &gw,
        reqwest::Method::POST,
        "/api/user",
        Some(&admin),
        Some(json!({"email": "nomail@example.com", "authority": "TENANT_ADMIN", "tenantId": {"entityType": "TENANT", "id": TENANT}})),
    )
    .await;
    assert_eq!(response.status(), 200);
}

// --- password reset ------------------------------------------------------------------

#[tokio::test]
async fn reset_mail_link_sets_the_password_ends_sessions_keeps_keys_and_works_once() {
    let sink = SmtpSink::start().await;
    let (_up, gw) = gateway_mailing_to(&sink.config()).await;
    let user = gw.user("forgot@example.com", Authority::TenantAdmin).await;
    let (_, key) = gw.api_key(&user, 0).await;
    let old = token_of(&gw, "forgot@example.com", PASSWORD).await;
    let old_token = old["token"].as_str().unwrap().to_string();

    let (status, body) = request_reset(&gw, "Forgot@Example.com").await;
    assert_eq!((status, body.as_str()), (200, ""));
    let mail = sink.wait_for("forgot@example.com", 0).await;
    assert_eq!(
        mail.subject,
        "Thingsboard - Password reset has been requested"
    );
    assert!(
        mail.body.contains("The link will expire in 1 hours."),
        "{}",
        mail.body
    );
    let link = mail.link_with("/api/noauth/resetPassword?resetToken=");
    let token = query_value(&link, "resetToken");

    // The link answers the platform's redirect to its reset page.
    let response = no_redirects(&gw)
        .get(on_gateway(&gw, &link))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 303);
    assert_eq!(
        response.headers()["location"].to_str().unwrap(),
        format!("{PUBLIC}/login/resetPassword?resetToken={token}")
    );

    // The password policy holds here too.
    let response = call(
        &gw,
        reqwest::Method::POST,
        "/api/noauth/resetPassword",
        None,
        Some(json!({"resetToken": token, "password": "short"})),
    )
    .await;
    assert_eq!(error_body(response).await.0, 400);

    let reset = |password: &'static str| {
        let (gw, token) = (&gw, token.clone());
        async move {
            call(
                gw,
                reqwest::Method::POST,
                "/api/noauth/resetPassword",
                None,
                Some(json!({"resetToken": token, "password": password})),
            )
            .await
        }
    };
    let response = reset(NEW_PASSWORD).await;
    assert_eq!(response.status(), 200);
    assert_eq!(response.text().await.unwrap(), "");

    // Every earlier session ends; the key stays; the new password logs in.
    let response = call(
        &gw,
        reqwest::Method::GET,
        "/api/auth/user",
        Some(&old_token),
        None,
    )
    .await;
    assert_eq!(response.status(), 401);
    let response = call(
        &gw,
        reqwest::Method::POST,
        "/api/auth/token",
        None,
        Some(json!({"refreshToken": old["refreshToken"]})),
    )
    .await;
    assert_eq!(response.status(), 401);
    let response = gw
        .client()
        .get(gw.https("/api/auth/user"))
        .header("X-Authorization", api_key_header(&key))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    token_of(&gw, "forgot@example.com", NEW_PASSWORD).await;
    assert_eq!(gw.login("forgot@example.com", PASSWORD).await.status(), 401);

    // Once: the token is gone.
    let (status, body) = error_body(reset("yet-another-password-1").await).await;
    assert_eq!(
        (status, body["message"].as_str()),
        (400, Some("Invalid reset token!"))
    );
    let response = no_redirects(&gw)
        .get(on_gateway(&gw, &link))
        .send()
        .await
        .unwrap();
    assert_eq!(error_body(response).await.0, 409);

    let notice = sink.wait_for("forgot@example.com", 1).await;
    assert_eq!(
        notice.subject,
        "Thingsboard - your account password has been reset"
    );
    assert!(notice.link_with("/login").starts_with(PUBLIC));
}

#[tokio::test]
async fn reset_request_for_unknown_or_disabled_addresses_answers_exactly_as_for_an_active_one() {
    let sink = SmtpSink::start().await;
    let (_up, gw) = gateway_mailing_to(&sink.config()).await;
    gw.user("active@example.com", Authority::TenantAdmin).await;
    gw.user("barrier@example.com", Authority::TenantAdmin).await;
    let disabled = gw
        .user("disabled@example.com", Authority::TenantAdmin)
        .await;
    // No request has cached the user yet: nothing to revoke.
    let _ = gw
        .running
        .store
        .set_user_enabled(disabled.id, false, keygate::clock::now_secs())
        .await
        .unwrap();

    // The connection is set up first, so the times below compare the answers.
    request_reset(&gw, "warm-up@example.com").await;
    let mut answers = Vec::new();
    let mut times = Vec::new();
    for email in [
        "active@example.com",
        "nobody@example.com",
        "disabled@example.com",
    ] {
        let started = Instant::now();
        let response = call(
            &gw,
            reqwest::Method::POST,
            "/api/noauth/resetPasswordByEmail",
            None,
            Some(json!({ "email": email })),
        )
        .await;
        times.push(started.elapsed());
        let mut headers: Vec<(String, String)> = response
            .headers()
            .iter()
            // The date and the request's own id differ by nature.
            .filter(|(name, _)| *name != "date" && *name != "x-request-id")
            .map(|(n, v)| (n.to_string(), v.to_str().unwrap().to_string()))
            .collect();
        headers.sort();
        answers.push((
            response.status().as_u16(),
            headers,
            response.text().await.unwrap(),
        ));
    }
    assert_eq!(answers[0].0, 200);
    assert_eq!(answers[1], answers[0], "unknown address");
    assert_eq!(answers[1], answers[2], "disabled account");
    eprintln!("resetPasswordByEmail answer times (unknown, active, disabled): {times:?}");

    sink.wait_for("active@example.com", 0).await;
    // A barrier: one more reset, for an active account, after the others.
    // Each request's mail work starts before its answer and one worker sends
    // in order, so once this one is in, whatever the others sent is too.
    assert_eq!(request_reset(&gw, "barrier@example.com").await.0, 200);
    sink.wait_for("barrier@example.com", 0).await;
    assert_eq!(sink.count_to("active@example.com"), 1);
    assert_eq!(sink.count_to("nobody@example.com"), 0);
    assert_eq!(sink.count_to("disabled@example.com"), 0);
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

#[tokio::test]
async fn reset_request_timing_never_tells_a_known_address_from_an_unknown_one() {
    let sink = SmtpSink::start().await;
    // Every request keeps its limiter slot: room for all of them.
    let (_up, gw) = gateway_mailing_to(&format!(
        "{}[login]\naccount_address_max_failures = 1000\naccount_max_failures = 1000\n\
         address_max_failures = 5000\n",
        sink.config()
    ))
    .await;
    gw.user("known@example.com", Authority::TenantAdmin).await;
    for wire in common::WIRES {
        // One keep-alive connection: the times compare the answers alone.
        let client = gw.client_over(wire);
        let timed = async |email: &str| {
            let started = Instant::now();
            let response = client
                .post(gw.https("/api/noauth/resetPasswordByEmail"))
                .json(&json!({ "email": email }))
                .send()
                .await
                .unwrap();
            let elapsed = started.elapsed();
            assert_eq!(response.status(), 200);
            assert_eq!(response.version(), wire.version());
            response.bytes().await.unwrap();
            elapsed
        };
        for _ in 0..10 {
            timed("known@example.com").await;
            timed("warm-up@example.com").await;
        }
        let (mut known, mut unknown) = (Vec::new(), Vec::new());
        for i in 0..200 {
            let nobody = format!("nobody-{i}@example.com");
            // Interleaved, each first in turn: neither rides on the other's wake.
            if i % 2 == 0 {
                known.push(timed("known@example.com").await);
                unknown.push(timed(&nobody).await);
            } else {
                unknown.push(timed(&nobody).await);
                known.push(timed("known@example.com").await);
            }
        }
        let (known, unknown) = (median(known), median(unknown));
        eprintln!("{wire:?}: median answer known {known:?}, unknown {unknown:?}");
        let (low, high) = (known.min(unknown), known.max(unknown));
        assert!(
            high.as_secs_f64() <= low.as_secs_f64() * 1.10,
            "{wire:?}: medians known {known:?} and unknown {unknown:?} differ by more than 10%"
        );
    }
    // The known address was mailed: the work happened, after the answers.
    sink.wait_for("known@example.com", 0).await;
}

#[tokio::test]
async fn reset_token_is_stored_only_as_its_digest() {
    use sqlx::Row;
    let sink = SmtpSink::start().await;
    let (_up, gw) = gateway_mailing_to(&sink.config()).await;
    gw.user("digest@example.com", Authority::TenantAdmin).await;
    request_reset(&gw, "digest@example.com").await;
    let mail = sink.wait_for("digest@example.com", 0).await;
    let token = query_value(&mail.link_with("resetToken="), "resetToken");
    let db = format!("sqlite://{}/keygate.db", gw.dir.path().display());
    sqlx::any::install_default_drivers();
    let pool = sqlx::AnyPool::connect(&db).await.unwrap();
    let rows = sqlx::query("SELECT digest FROM reset_tokens")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(rows.len(), 1);
    let stored: String = rows[0].try_get(0).unwrap();
    assert_ne!(stored, token);
    assert!(!stored.contains(&token));
    let sha256 = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, token.as_bytes());
    let hex: String = sha256.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(stored, hex);
}

#[tokio::test]
async fn reset_requests_are_limited_per_address_and_account() {
    let sink = SmtpSink::start().await;
    let (_up, gw) = gateway_mailing_to(&format!(
        "{}[login]\naccount_address_max_failures = 3\n",
        sink.config()
    ))
    .await;
    gw.user("limited@example.com", Authority::TenantAdmin).await;
    for _ in 0..3 {
        assert_eq!(request_reset(&gw, "limited@example.com").await.0, 200);
    }
    let response = call(
        &gw,
        reqwest::Method::POST,
        "/api/noauth/resetPasswordByEmail",
        None,
        Some(json!({"email": "limited@example.com"})),
    )
    .await;
    assert!(response.headers().contains_key("retry-after"));
    assert_eq!(error_body(response).await.0, 429);
    // An unknown address is limited the same way: the limit tells nothing.
    for _ in 0..3 {
        assert_eq!(request_reset(&gw, "ghost@example.com").await.0, 200);
    }
    assert_eq!(request_reset(&gw, "ghost@example.com").await.0, 429);
}

#[tokio::test]
async fn forged_or_missing_reset_tokens_are_refused_with_contract_errors() {
    let sink = SmtpSink::start().await;
    let (_up, gw) = gateway_mailing_to(&sink.config()).await;
    let response = no_redirects(&gw)
        .get(gw.https("/api/noauth/resetPassword?resetToken=forged"))
        .send()
        .await
        .unwrap();
    assert_eq!(error_body(response).await.0, 409);
    let response = no_redirects(&gw)
        .get(gw.https("/api/noauth/resetPassword"))
        .send()
        .await
        .unwrap();
    assert_eq!(error_body(response).await.0, 400);
    let response = call(
        &gw,
        reqwest::Method::POST,
        "/api/noauth/resetPassword",
        None,
        Some(json!({"resetToken": "forged", "password": NEW_PASSWORD})),
    )
    .await;
    let (status, body) = error_body(response).await;
    assert_eq!(
        (status, body["message"].as_str()),
        (400, Some("Invalid reset token!"))
    );
    let (status, _) = error_body(
        call(
            &gw,
            reqwest::Method::POST,
            "/api/noauth/resetPasswordByEmail",
            None,
            Some(json!({"mail": "x@example.com"})),
        )
        .await,
    )
    .await;
    assert_eq!(status, 400);
}

// --- a mail server that is down or slow -------------------------------------------------

/// A mail server that takes each connection and says nothing until
/// released; from then on it closes every connection at once. Returns its
/// port, how many connections it took, and the release.
async fn stalling_mail_server() -> (u16, Arc<AtomicUsize>, tokio::sync::watch::Sender<bool>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let accepted = Arc::new(AtomicUsize::new(0));
    let (release, released) = tokio::sync::watch::channel(false);
    let counted = accepted.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            counted.fetch_add(1, Ordering::SeqCst);
            let mut released = released.clone();
            tokio::spawn(async move {
                let _ = released.wait_for(|released| *released).await;
                drop(stream);
            });
        }
    });
    (port, accepted, release)
}

#[tokio::test]
async fn a_stalled_then_failing_mail_server_never_holds_an_endpoint_and_the_failure_is_counted() {
    let (port, accepted, release) = stalling_mail_server().await;
    let (_up, gw) = gateway_mailing_to(&format!(
        "[mail]\nhost = \"127.0.0.1\"\nport = {port}\ntls = \"none\"\nfrom = \"noreply@example.com\"\ntimeout = \"5s\"\nretries = 1\nretry_backoff = \"100ms\"\n"
    ))
    .await;
    gw.user("down@example.com", Authority::TenantAdmin).await;
    let admin = admin_token(&gw).await;

    let started = Instant::now();
    let response = call(
        &gw,
        reqwest::Method::POST,
        "/api/user?sendActivationMail=true",
        Some(&admin),
        Some(json!({"email": "invite-down@example.com", "authority": "TENANT_ADMIN", "tenantId": {"entityType": "TENANT", "id": TENANT}})),
    )
    .await;
    assert_eq!(response.status(), 200);
    assert_eq!(request_reset(&gw, "down@example.com").await.0, 200);
    let took = started.elapsed();
    eprintln!("two mailing endpoints with the mail server stalled: {took:?}");
    // Sent inline, the invitation alone would wait for the 5 s mail timeout.
    assert!(took < Duration::from_secs(2), "{took:?}");

    // Both answered while the mail was still on its way: the worker reaches
    // the server, which holds it until released, after the answers.
    common::wait_until(
        "the worker reached the mail server",
        Duration::from_secs(5),
        async || accepted.load(Ordering::SeqCst) >= 1,
    )
    .await;
    let metrics = gw.metrics().await;
    for outcome in ["sent", "dead_letter"] {
        assert_eq!(
            counter(
                &metrics,
                &format!("keygate_mail_sent_total{{kind=\"activation\",outcome=\"{outcome}\"}}")
            ),
            0,
            "the invitation's mail is not through before the server answers"
        );
    }
    release.send_replace(true);

    common::wait_until("both dead-lettered", Duration::from_secs(10), async || {
        let metrics = gw.metrics().await;
        counter(
            &metrics,
            "keygate_mail_sent_total{kind=\"activation\",outcome=\"dead_letter\"}",
        ) == 1
            && counter(
                &metrics,
                "keygate_mail_sent_total{kind=\"reset\",outcome=\"dead_letter\"}",
            ) == 1
    })
    .await;
    let metrics = gw.metrics().await;
    assert_eq!(
        counter(
            &metrics,
            "keygate_mail_sent_total{kind=\"activation\",outcome=\"retried\"}"
        ),
        1
    );
    assert_eq!(
        counter(
            &metrics,
            "keygate_mail_sent_total{kind=\"activation\",outcome=\"sent\"}"
        ),
        0
    );
}

#[tokio::test]
async fn full_mail_queue_drops_mail_and_never_slows_an_endpoint() {
    // A server that takes the connection and never says a word: the worker
    // waits for its timeout while the queue fills.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = silent.local_addr().unwrap().port();
    let held = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((stream, _)) = silent.accept().await {
            open.push(stream);
        }
    });
    let (_up, gw) = gateway_mailing_to(&format!(
        "[mail]\nhost = \"127.0.0.1\"\nport = {port}\ntls = \"none\"\nfrom = \"noreply@example.com\"\ntimeout = \"5s\"\nqueue_size = 1\nretries = 0\n"
    ))
    .await;
    let admin = admin_token(&gw).await;
    let started = Instant::now();
    for n in 0..5 {
        let response = call(
            &gw,
            reqwest::Method::POST,
            "/api/user?sendActivationMail=true",
            Some(&admin),
            Some(json!({"email": format!("queued{n}@example.com"), "authority": "TENANT_ADMIN", "tenantId": {"entityType": "TENANT", "id": TENANT}})),
        )
        .await;
        assert_eq!(response.status(), 200);
    }
    let took = started.elapsed();
    eprintln!("five invitations with a silent mail server and a queue of 1: {took:?}");
    assert!(took < Duration::from_secs(3), "{took:?}");
    let metrics = gw.metrics().await;
    let dropped = counter(
        &metrics,
        "keygate_mail_sent_total{kind=\"activation\",outcome=\"dropped\"}",
    );
    assert!(dropped >= 3, "{dropped} dropped");
    assert!(
        metrics.contains("keygate_mail_queue_depth 1"),
        "the queue is full"
    );
    held.abort();
}

// --- EMAIL second factor ----------------------------------------------------------------

async fn pre_token(gw: &Gateway, email: &str) -> String {
    let body = token_of(gw, email, PASSWORD).await;
    assert_eq!(body["scope"], "PRE_VERIFICATION_TOKEN", "{body}");
    body["token"].as_str().unwrap().to_string()
}

async fn send_code(gw: &Gateway, pre: &str) -> reqwest::Response {
    call(
        gw,
        reqwest::Method::POST,
        "/api/auth/2fa/verification/send?providerType=EMAIL",
        Some(pre),
        None,
    )
    .await
}

async fn check_code(gw: &Gateway, pre: &str, code: &str) -> reqwest::Response {
    call(
        gw,
        reqwest::Method::POST,
        &format!("/api/auth/2fa/verification/check?providerType=EMAIL&verificationCode={code}"),
        Some(pre),
        None,
    )
    .await
}

/// Configures EMAIL for `email`, the code read from the mail.
async fn configure_email(gw: &Gateway, sink: &SmtpSink, email: &str) {
    let token = token_of(gw, email, PASSWORD).await["token"]
        .as_str()
        .unwrap()
        .to_string();
    let providers: Value = call(
        gw,
        reqwest::Method::GET,
        "/api/2fa/providers",
        Some(&token),
        None,
    )
    .await
    .json()
    .await
    .unwrap();
    assert_eq!(providers, json!(["TOTP", "BACKUP_CODE", "EMAIL"]));
    let config: Value = call(
        gw,
        reqwest::Method::POST,
        "/api/2fa/account/config/generate?providerType=EMAIL",
        Some(&token),
        None,
    )
    .await
    .json()
    .await
    .unwrap();
    assert_eq!(
        config,
        json!({"providerType": "EMAIL", "useByDefault": false, "email": email})
    );
    let before = sink.count_to(email);
    let response = call(
        gw,
        reqwest::Method::POST,
        "/api/2fa/account/config/submit",
        Some(&token),
        Some(config.clone()),
    )
    .await;
    assert_eq!(response.status(), 200);
    let mail = sink.wait_for(email, before).await;
    assert_eq!(mail.subject, "ThingsBoard - 2FA verification code");
    assert!(
        mail.body.contains("This code will expire in 120 seconds."),
        "{}",
        mail.body
    );
    let response = call(
        gw,
        reqwest::Method::POST,
        &format!("/api/2fa/account/config?verificationCode={}", mail.code()),
        Some(&token),
        Some(config),
    )
    .await;
    assert_eq!(response.status(), 200);
    let settings: Value = response.json().await.unwrap();
    assert_eq!(
        settings["configs"]["EMAIL"],
        json!({"providerType": "EMAIL", "useByDefault": true})
    );
}

#[tokio::test]
async fn email_second_factor_logs_in_with_the_code_from_the_mail_once() {
    let sink = SmtpSink::start().await;
    let (_up, gw) = gateway_mailing_to(&sink.config()).await;
    gw.user("code@example.com", Authority::TenantAdmin).await;
    configure_email(&gw, &sink, "code@example.com").await;

    let pre = pre_token(&gw, "code@example.com").await;
    let providers: Value = call(
        &gw,
        reqwest::Method::GET,
        "/api/auth/2fa/providers",
        Some(&pre),
        None,
    )
    .await
    .json()
    .await
    .unwrap();
    assert_eq!(providers[0]["type"], "EMAIL");
    assert_eq!(providers[0]["contact"], "c***@example.com");
    let sent = sink.count_to("code@example.com");
    assert_eq!(send_code(&gw, &pre).await.status(), 200);
    let first = sink.wait_for("code@example.com", sent).await.code();
    // One code per send period.
    let response = send_code(&gw, &pre).await;
    assert!(response.headers().contains_key("retry-after"));
    assert_eq!(error_body(response).await.0, 429);

    let response = check_code(&gw, &pre, &first).await;
    assert_eq!(response.status(), 200);
    let pair: Value = response.json().await.unwrap();
    assert!(pair["refreshToken"].is_string(), "{pair}");
    let response = call(
        &gw,
        reqwest::Method::GET,
        "/api/auth/user",
        Some(pair["token"].as_str().unwrap()),
        None,
    )
    .await;
    assert_eq!(response.status(), 200);

    // The code was used: a new login cannot use it again.
    let pre = pre_token(&gw, "code@example.com").await;
    let (status, _) = error_body(check_code(&gw, &pre, &first).await).await;
    assert_eq!(status, 400);
    let sent = sink.count_to("code@example.com");
    assert_eq!(send_code(&gw, &pre).await.status(), 200);
    let second = sink.wait_for("code@example.com", sent).await.code();
    assert_eq!(check_code(&gw, &pre, &second).await.status(), 200);
}

#[tokio::test]
async fn email_code_to_an_address_the_client_names_is_refused() {
    let sink = SmtpSink::start().await;
    let (_up, gw) = gateway_mailing_to(&sink.config()).await;
    gw.user("owner@example.com", Authority::TenantAdmin).await;
    let token = token_of(&gw, "owner@example.com", PASSWORD).await["token"]
        .as_str()
        .unwrap()
        .to_string();
    call(
        &gw,
        reqwest::Method::POST,
        "/api/2fa/account/config/generate?providerType=EMAIL",
        Some(&token),
        None,
    )
    .await;
    let forged =
        json!({"providerType": "EMAIL", "useByDefault": true, "email": "attacker@example.com"});
    let response = call(
        &gw,
        reqwest::Method::POST,
        "/api/2fa/account/config/submit",
        Some(&token),
        Some(forged.clone()),
    )
    .await;
    assert_eq!(error_body(response).await.0, 400);
    let response = call(
        &gw,
        reqwest::Method::POST,
        "/api/2fa/account/config?verificationCode=000000",
        Some(&token),
        Some(forged),
    )
    .await;
    assert_eq!(error_body(response).await.0, 400);
    // A barrier: a reset mail to the owner, asked for after the refusals.
    // Mail goes out in order through one worker, so once it is in, any mail
    // the refused requests had queued would be in too.
    assert_eq!(request_reset(&gw, "owner@example.com").await.0, 200);
    sink.wait_for("owner@example.com", 0).await;
    assert_eq!(sink.count_to("attacker@example.com"), 0);
}
