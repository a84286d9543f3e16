//! Tokens signed with keygate's own key whose header asks the verifier for
//! more than HS512 under that key: each is refused with 401 before its
//! signature is checked, and nothing reaches the upstream.

mod common;

use aws_lc_rs::hmac;
use base64::Engine;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use common::{Gateway, Upstream, error_body};
use keygate::identity::Authority;

const SIGNING_KEY: [u8; 64] = [7u8; 64];

/// A gateway signing with [`SIGNING_KEY`], its upstream, and an access token
/// of a live session.
async fn gateway() -> (Upstream, Gateway, String) {
    let upstream = Upstream::start().await;
    let key = STANDARD.encode(SIGNING_KEY);
    let gw = Gateway::start(
        &upstream.url(),
        &format!("[jwt]\ntoken_signing_key = \"{key}\"\n"),
    )
    .await;
    let user = gw.user("tenant@example.com", Authority::TenantAdmin).await;
    let (_, token) = gw.access_token(&user).await;
    (upstream, gw, token)
}

/// `token`'s claims under `header`, signed with the gateway's own key: the
/// signature is right, only the header is hostile.
fn resigned(token: &str, header: &str) -> String {
    let claims = token.split('.').nth(1).unwrap();
    let signing = format!("{}.{claims}", URL_SAFE_NO_PAD.encode(header));
    let mac = hmac::sign(
        &hmac::Key::new(hmac::HMAC_SHA512, &SIGNING_KEY),
        signing.as_bytes(),
    );
    format!("{signing}.{}", URL_SAFE_NO_PAD.encode(mac.as_ref()))
}

async fn status_of(gw: &Gateway, token: &str) -> reqwest::Response {
    gw.client()
        .get(gw.https("/api/tenant/devices"))
        .header("X-Authorization", format!("Bearer {token}"))
        .send()
        .await
        .unwrap()
}

/// The same claims under a plain header pass (so the refusal is the
/// header's doing); under `header` they get 401 and reach nothing.
async fn refused_before_its_signature_is_checked(header: &str) {
    let (upstream, gw, token) = gateway().await;
    let plain = resigned(&token, r#"{"alg":"HS512","typ":"JWT"}"#);
    assert_eq!(status_of(&gw, &plain).await.status(), 200, "control");
    assert_eq!(upstream.requests().len(), 1);
    let (status, body) = error_body(status_of(&gw, &resigned(&token, header)).await).await;
    assert_eq!(status, 401, "{header}: {body}");
    assert_eq!(body["errorCode"], 10, "{body}");
    assert_eq!(
        upstream.requests().len(),
        1,
        "{header} reached the upstream"
    );
    let metrics = gw.metrics().await;
    assert!(
        metrics.contains(r#"keygate_auth_total{method="jwt",result="unknown"} 1"#),
        "counted as an unusable token"
    );
}

#[tokio::test]
async fn a_token_with_a_crit_header_is_refused_before_its_signature_is_checked() {
    refused_before_its_signature_is_checked(
        r#"{"alg":"HS512","typ":"JWT","crit":["http://evil.example/ext"]}"#,
    )
    .await;
}

#[tokio::test]
async fn a_token_naming_its_own_key_set_by_jku_is_refused_before_its_signature_is_checked() {
    refused_before_its_signature_is_checked(
        r#"{"alg":"HS512","typ":"JWT","jku":"https://evil.example/jwks.json"}"#,
    )
    .await;
}

#[tokio::test]
async fn a_token_naming_its_own_certificate_by_x5u_is_refused_before_its_signature_is_checked() {
    refused_before_its_signature_is_checked(
        r#"{"alg":"HS512","typ":"JWT","x5u":"https://evil.example/cert.pem"}"#,
    )
    .await;
}

#[tokio::test]
async fn a_token_carrying_its_own_certificate_in_x5c_is_refused_before_its_signature_is_checked() {
    refused_before_its_signature_is_checked(
        r#"{"alg":"HS512","typ":"JWT","x5c":["MIIBszCCAVmg"]}"#,
    )
    .await;
}

#[tokio::test]
async fn a_token_carrying_its_own_key_in_jwk_is_refused_before_its_signature_is_checked() {
    refused_before_its_signature_is_checked(
        r#"{"alg":"HS512","typ":"JWT","jwk":{"kty":"oct","k":"BwcHBwcH"}}"#,
    )
    .await;
}

#[tokio::test]
async fn a_token_of_another_type_is_refused_before_its_signature_is_checked() {
    refused_before_its_signature_is_checked(r#"{"alg":"HS512","typ":"at+jwt"}"#).await;
}

#[tokio::test]
async fn a_nested_token_by_cty_is_refused_before_its_signature_is_checked() {
    refused_before_its_signature_is_checked(r#"{"alg":"HS512","typ":"JWT","cty":"JWT"}"#).await;
}
