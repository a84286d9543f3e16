//! Tokens signed with keygate's own key whose header asks the verifier for
//! more than HS512 under that key: each is refused with 401 before its
//! signature is checked (a forged signature under that header is never
//! counted as one), and nothing reaches the upstream; over HTTP/1.1 through
//! the lean path and over HTTP/2 alike.

mod common;

use aws_lc_rs::hmac;
use base64::Engine;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use common::{Gateway, Upstream, WIRES, counter, error_body};
use keygate::identity::Authority;
use serde_json::json;

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

/// `token` with its signature replaced by one under another key: what a
/// signature check refuses (`bad_signature`, error code 11).
fn forged(token: &str) -> String {
    let signing = token.rsplit_once('.').unwrap().0;
    let mac = hmac::sign(
        &hmac::Key::new(hmac::HMAC_SHA512, &[8u8; 64]),
        signing.as_bytes(),
    );
    format!("{signing}.{}", URL_SAFE_NO_PAD.encode(mac.as_ref()))
}

async fn status_of(client: &reqwest::Client, gw: &Gateway, token: &str) -> reqwest::Response {
    client
        .get(gw.https("/api/tenant/devices"))
        .header("X-Authorization", format!("Bearer {token}"))
        .send()
        .await
        .unwrap()
}

/// `keygate_auth_total{method="jwt",result=...}` now.
async fn jwt_results(gw: &Gateway, result: &str) -> u64 {
    let series = format!("keygate_auth_total{{method=\"jwt\",result=\"{result}\"}}");
    counter(&gw.metrics().await, &series)
}

/// Over each wire (HTTP/1.1 through the lean path, HTTP/2): the same claims
/// under a plain header pass, and with a forged signature are counted as a
/// bad signature (so the counter sees signature checks). Under `header`,
/// with the right signature and with a forged one alike, they get the same
/// 401 as an unusable token, never a bad signature's: the header was refused
/// before the signature was looked at. Nothing of those reaches the upstream.
async fn refused_before_its_signature_is_checked(header: &str) {
    let (upstream, gw, token) = gateway().await;
    let plain = resigned(&token, r#"{"alg":"HS512","typ":"JWT"}"#);
    let hostile = resigned(&token, header);
    for wire in WIRES {
        let client = gw.client_over(wire);
        let declines = gw.declines().await;
        let forwarded = upstream.requests().len();
        let response = status_of(&client, &gw, &plain).await;
        assert_eq!(response.version(), wire.version());
        assert_eq!(response.status(), 200, "{wire:?}: control");
        assert_eq!(upstream.requests().len(), forwarded + 1);

        let bad_signatures = jwt_results(&gw, "bad_signature").await;
        let (status, body) = error_body(status_of(&client, &gw, &forged(&plain)).await).await;
        assert_eq!((status, &body["errorCode"]), (401, &json!(11)), "{body}");
        assert_eq!(
            jwt_results(&gw, "bad_signature").await,
            bad_signatures + 1,
            "{wire:?}: a forged signature under a plain header is checked and counted"
        );

        let unusable = jwt_results(&gw, "unknown").await;
        for (what, token) in [("signed", hostile.clone()), ("forged", forged(&hostile))] {
            let (status, body) = error_body(status_of(&client, &gw, &token).await).await;
            assert_eq!(status, 401, "{wire:?} {what} {header}: {body}");
            assert_eq!(body["errorCode"], 10, "{wire:?} {what} {header}: {body}");
        }
        assert_eq!(
            jwt_results(&gw, "bad_signature").await,
            bad_signatures + 1,
            "{wire:?} {header}: a forged signature was never looked at"
        );
        assert_eq!(
            jwt_results(&gw, "unknown").await,
            unusable + 2,
            "{wire:?}: both counted as an unusable token"
        );
        assert_eq!(
            upstream.requests().len(),
            forwarded + 1,
            "{wire:?}: {header} reached the upstream"
        );
        gw.assert_lean_path_took(&declines, &[], &format!("{wire:?} {header}"))
            .await;
    }
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
