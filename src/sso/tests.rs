//! Token verification and user mapping, against a provider made up here:
//! an EC P-256 key whose public half is its JWKS.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::{Value, json};
use uuid::Uuid;

use super::jwks::{KeyCache, KeySource, ProviderKey, parse_set};
use super::mapping::{Decision, Refusal, decide, person, shows_second_factor};
use super::token::{Claims, Expected, IdToken, TokenRefusal, claimed_issuer, verify};
use crate::config::{AuthorityRule, ClientSecret, Creation, OidcSettings};
use crate::store::UserRecord;
use crate::vocab::identity::Authority;

const ISSUER: &str = "https://idp.example/realms/iot";
const CLIENT: &str = "keygate";
const NONCE: &str = "n-0S6_WzA2Mj";
const NOW: i64 = 1_900_000_000;

/// A made-up provider: its private key, and its JWKS.
struct Idp {
    private_der: Vec<u8>,
    jwks: String,
    fetches: AtomicUsize,
}

impl Idp {
    fn new() -> Idp {
        let pair = rcgen::KeyPair::generate().unwrap();
        let raw = pair.public_key_raw();
        assert_eq!(raw.len(), 65, "an uncompressed P-256 point");
        let jwks = json!({"keys": [{
            "kty": "EC", "crv": "P-256", "kid": "k1", "use": "sig",
            "x": URL_SAFE_NO_PAD.encode(&raw[1..33]),
            "y": URL_SAFE_NO_PAD.encode(&raw[33..]),
        }]})
        .to_string();
        Idp {
            private_der: pair.serialize_der(),
            jwks,
            fetches: AtomicUsize::new(0),
        }
    }

    fn sign(&self, claims: &Value) -> String {
        let mut header = Header::new(Algorithm::ES256);
        header.kid = Some("k1".into());
        let key = EncodingKey::from_ec_der(&self.private_der);
        jsonwebtoken::encode(&header, claims, &key).unwrap()
    }
}

impl KeySource for Idp {
    async fn fetch_keys(&self) -> Result<Vec<ProviderKey>, String> {
        self.fetches.fetch_add(1, Ordering::SeqCst);
        parse_set(self.jwks.as_bytes())
    }
}

fn id_claims() -> Value {
    json!({
        "iss": ISSUER, "sub": "248289761001", "aud": CLIENT, "nonce": NONCE,
        "iat": NOW - 5, "exp": NOW + 300, "email": "Jane.Doe@Example.com",
        "email_verified": true, "given_name": "Jane", "family_name": "Doe",
    })
}

fn with(mut claims: Value, key: &str, value: Value) -> Value {
    claims[key] = value;
    claims
}

fn without(mut claims: Value, key: &str) -> Value {
    claims.as_object_mut().unwrap().remove(key);
    claims
}

async fn check_id(idp: &Idp, token: &str) -> Result<Claims, TokenRefusal> {
    crate::tls::install_crypto_provider();
    let cache = KeyCache::new(Duration::from_secs(60));
    let expected = Expected {
        issuer: ISSUER,
        audience: CLIENT,
        id_token: Some(IdToken {
            client_id: CLIENT,
            nonce: NONCE,
        }),
    };
    verify(token, &cache, idp, &expected, NOW).await
}

#[tokio::test]
async fn a_good_id_token_verifies() {
    let idp = Idp::new();
    let claims = check_id(&idp, &idp.sign(&id_claims())).await.unwrap();
    assert_eq!(claims["email"], "Jane.Doe@Example.com");
    assert_eq!(
        claimed_issuer(&idp.sign(&id_claims())).as_deref(),
        Some(ISSUER)
    );
}

#[tokio::test]
async fn alg_none_and_hs256_over_the_public_key_are_refused() {
    let idp = Idp::new();
    let body = URL_SAFE_NO_PAD.encode(id_claims().to_string());
    for header in [r#"{"alg":"none"}"#, r#"{"alg":"none","kid":"k1"}"#] {
        let token = format!("{}.{body}.", URL_SAFE_NO_PAD.encode(header));
        assert_eq!(
            check_id(&idp, &token).await.unwrap_err(),
            TokenRefusal::Malformed
        );
    }
    // The classic confusion: the public key's own bytes as an HMAC secret.
    for secret in [idp.jwks.as_bytes(), idp.private_der.as_slice()] {
        let mut header = Header::new(Algorithm::HS256);
        header.kid = Some("k1".into());
        let token =
            jsonwebtoken::encode(&header, &id_claims(), &EncodingKey::from_secret(secret)).unwrap();
        assert_eq!(
            check_id(&idp, &token).await.unwrap_err(),
            TokenRefusal::Algorithm
        );
    }
    // A header naming its own key is refused before any key is looked up.
    let mut header = Header::new(Algorithm::ES256);
    header.kid = Some("k1".into());
    header.jku = Some("https://evil.example/jwks".into());
    let key = EncodingKey::from_ec_der(&idp.private_der);
    let token = jsonwebtoken::encode(&header, &id_claims(), &key).unwrap();
    assert_eq!(
        check_id(&idp, &token).await.unwrap_err(),
        TokenRefusal::Malformed
    );
}

#[tokio::test]
async fn a_token_signed_by_another_key_is_refused() {
    let idp = Idp::new();
    let other = Idp::new();
    let token = other.sign(&id_claims());
    assert_eq!(
        check_id(&idp, &token).await.unwrap_err(),
        TokenRefusal::Signature
    );
}

#[tokio::test]
async fn issuer_audience_and_authorized_party_are_checked() {
    let idp = Idp::new();
    let cases = [
        (
            with(
                id_claims(),
                "iss",
                json!("https://idp.example/realms/other"),
            ),
            TokenRefusal::Issuer,
        ),
        (
            with(id_claims(), "iss", json!("https://idp.example/realms/iot/")),
            TokenRefusal::Issuer,
        ),
        (
            with(id_claims(), "aud", json!("another-client")),
            TokenRefusal::Audience,
        ),
        (
            with(id_claims(), "azp", json!("another-client")),
            TokenRefusal::AuthorizedParty,
        ),
        (
            with(id_claims(), "aud", json!([CLIENT, "another-client"])),
            TokenRefusal::AuthorizedParty,
        ),
    ];
    for (claims, refusal) in cases {
        let token = idp.sign(&claims);
        assert_eq!(
            check_id(&idp, &token).await.unwrap_err(),
            refusal,
            "{claims}"
        );
    }
    let several = with(
        with(id_claims(), "aud", json!([CLIENT, "another-client"])),
        "azp",
        json!(CLIENT),
    );
    assert!(check_id(&idp, &idp.sign(&several)).await.is_ok());
}

#[tokio::test]
async fn expiry_issue_time_and_nonce_are_checked() {
    let idp = Idp::new();
    let cases = [
        (
            with(id_claims(), "exp", json!(NOW - 61)),
            TokenRefusal::Expired,
        ),
        (
            with(id_claims(), "nbf", json!(NOW + 120)),
            TokenRefusal::NotYetValid,
        ),
        (
            with(id_claims(), "iat", json!(NOW + 3600)),
            TokenRefusal::IssuedAt,
        ),
        (without(id_claims(), "iat"), TokenRefusal::Malformed),
        (
            with(id_claims(), "nonce", json!("another")),
            TokenRefusal::Nonce,
        ),
        (without(id_claims(), "nonce"), TokenRefusal::Nonce),
    ];
    for (claims, refusal) in cases {
        // Real clocks: the library checks exp and nbf against the time now.
        let claims = shift_to_now(claims);
        let token = idp.sign(&claims);
        let got = check_id_now(&idp, &token).await.unwrap_err();
        assert_eq!(got, refusal, "{claims}");
    }
}

/// `claims` with every time moved from [`NOW`] to the real time.
fn shift_to_now(mut claims: Value) -> Value {
    let delta = crate::clock::now_secs() - NOW;
    for key in ["iat", "exp", "nbf"] {
        if let Some(t) = claims.get(key).and_then(Value::as_i64) {
            claims[key] = json!(t + delta);
        }
    }
    claims
}

async fn check_id_now(idp: &Idp, token: &str) -> Result<Claims, TokenRefusal> {
    crate::tls::install_crypto_provider();
    let cache = KeyCache::new(Duration::from_secs(60));
    let expected = Expected {
        issuer: ISSUER,
        audience: CLIENT,
        id_token: Some(IdToken {
            client_id: CLIENT,
            nonce: NONCE,
        }),
    };
    verify(token, &cache, idp, &expected, crate::clock::now_secs()).await
}

#[tokio::test]
async fn an_access_token_needs_the_api_audience_and_no_nonce() {
    let idp = Idp::new();
    crate::tls::install_crypto_provider();
    let cache = KeyCache::new(Duration::from_secs(60));
    let expected = Expected {
        issuer: ISSUER,
        audience: "https://api.keygate.test",
        id_token: None,
    };
    let claims = without(
        with(
            id_claims(),
            "aud",
            json!(["https://api.keygate.test", "account"]),
        ),
        "nonce",
    );
    let claims = shift_to_now(claims);
    let now = crate::clock::now_secs();
    let mut header = Header::new(Algorithm::ES256);
    header.kid = Some("k1".into());
    header.typ = Some("at+jwt".into());
    let key = EncodingKey::from_ec_der(&idp.private_der);
    let token = jsonwebtoken::encode(&header, &claims, &key).unwrap();
    assert!(verify(&token, &cache, &idp, &expected, now).await.is_ok());
    // The ID token (audience: the client) is no access token.
    let id_token = idp.sign(&shift_to_now(id_claims()));
    assert_eq!(
        verify(&id_token, &cache, &idp, &expected, now)
            .await
            .unwrap_err(),
        TokenRefusal::Audience
    );
    assert_eq!(idp.fetches.load(Ordering::SeqCst), 1, "the keys are cached");
}

// ---------------------------------------------------------------------------
// Mapping
// ---------------------------------------------------------------------------

const TENANT: Uuid = Uuid::from_u128(0x11);
const CUSTOMER: Uuid = Uuid::from_u128(0x22);

fn settings() -> OidcSettings {
    OidcSettings {
        name: "corp".into(),
        issuer: ISSUER.into(),
        client_id: CLIENT.into(),
        client_secret: ClientSecret::new("s3cret"),
        scopes: vec!["openid".into()],
        button_label: "Corp".into(),
        icon: None,
        email_claim: "email".into(),
        first_name_claim: "given_name".into(),
        last_name_claim: "family_name".into(),
        require_verified_email: true,
        creation: None,
        authority_rule: None,
        trust_provider_mfa: false,
        access_token_audience: None,
        ca_file: None,
    }
}

fn claims(value: Value) -> Claims {
    value.as_object().unwrap().clone()
}

fn user(enabled: bool) -> UserRecord {
    UserRecord {
        id: Uuid::from_u128(0x33),
        created_time: 0,
        tenant_id: TENANT,
        customer_id: CUSTOMER,
        email: "jane.doe@example.com".into(),
        authority: Authority::CustomerUser,
        first_name: String::new(),
        last_name: String::new(),
        phone: String::new(),
        additional_info: None,
        version: 1,
        enabled,
        password_hash: String::new(),
        tokens_valid_after: 0,
    }
}

#[test]
fn the_email_is_folded_by_the_one_rule_and_must_be_verified() {
    let found = person(&claims(id_claims()), &settings()).unwrap();
    assert_eq!(found.email, "jane.doe@example.com");
    assert_eq!(
        (found.first_name.as_str(), found.last_name.as_str()),
        ("Jane", "Doe")
    );
    for unverified in [json!(false), json!("false"), Value::Null] {
        let c = with(id_claims(), "email_verified", unverified);
        assert_eq!(person(&claims(c), &settings()), Err(Refusal::Unverified));
    }
    assert!(
        person(
            &claims(with(id_claims(), "email_verified", json!("true"))),
            &settings()
        )
        .is_ok()
    );
    let lax = OidcSettings {
        require_verified_email: false,
        ..settings()
    };
    assert!(person(&claims(without(id_claims(), "email_verified")), &lax).is_ok());
}

#[test]
fn a_non_ascii_or_missing_email_is_refused_never_folded_onto_another() {
    for email in [
        json!("\u{212A}elvin@example.com"),
        json!("j\u{e4}ne@example.com"),
        json!("not-an-address"),
        json!(42),
    ] {
        let c = with(id_claims(), "email", email.clone());
        assert_eq!(
            person(&claims(c), &settings()),
            Err(Refusal::NoEmail),
            "{email}"
        );
    }
    assert_eq!(
        person(&claims(without(id_claims(), "email")), &settings()),
        Err(Refusal::NoEmail)
    );
}

#[test]
fn the_authority_map_admits_only_mapped_values_and_takes_the_highest() {
    let mapped = OidcSettings {
        authority_rule: Some(AuthorityRule {
            claim: "groups".into(),
            map: vec![
                ("iot-admins".into(), Authority::TenantAdmin),
                ("iot-users".into(), Authority::CustomerUser),
            ],
        }),
        ..settings()
    };
    let with_groups = |groups: Value| claims(with(id_claims(), "groups", groups));
    assert_eq!(
        person(&with_groups(json!(["staff"])), &mapped),
        Err(Refusal::NotMapped)
    );
    assert_eq!(
        person(&claims(id_claims()), &mapped),
        Err(Refusal::NotMapped)
    );
    let user_only = person(&with_groups(json!("iot-users")), &mapped).unwrap();
    assert_eq!(user_only.mapped, Some(Authority::CustomerUser));
    let both = person(&with_groups(json!(["iot-users", "iot-admins"])), &mapped).unwrap();
    assert_eq!(both.mapped, Some(Authority::TenantAdmin));
}

#[test]
fn an_unknown_user_is_created_only_when_allowed_and_a_disabled_one_is_refused() {
    let found = person(&claims(id_claims()), &settings()).unwrap();
    assert_eq!(
        decide(found.clone(), None, &settings()),
        Err(Refusal::NotFound("jane.doe@example.com".into()))
    );
    assert_eq!(
        Refusal::NotFound("jane.doe@example.com".into()).message(),
        "User not found: jane.doe@example.com"
    );
    let creating = OidcSettings {
        creation: Some(Creation {
            authority: Authority::CustomerUser,
            tenant_id: TENANT,
            customer_id: Some(CUSTOMER),
        }),
        ..settings()
    };
    match decide(found.clone(), None, &creating).unwrap() {
        Decision::Create(new) => {
            assert_eq!(new.email, "jane.doe@example.com");
            assert_eq!(new.authority, Authority::CustomerUser);
            assert_eq!((new.tenant_id, new.customer_id), (TENANT, Some(CUSTOMER)));
        }
        other => panic!("{other:?}"),
    }
    let admin = super::mapping::Person {
        mapped: Some(Authority::TenantAdmin),
        ..found.clone()
    };
    assert!(matches!(
        decide(admin, None, &creating),
        Ok(Decision::Create(new)) if new.authority == Authority::TenantAdmin
    ));
    assert!(matches!(
        decide(found.clone(), Some(user(true)), &creating),
        Ok(Decision::Existing(u)) if u.id == Uuid::from_u128(0x33)
    ));
    assert_eq!(
        decide(found, Some(user(false)), &creating),
        Err(Refusal::Disabled)
    );
}

#[test]
fn only_an_amr_naming_another_factor_shows_a_second_factor() {
    assert!(!shows_second_factor(&claims(id_claims())));
    assert!(!shows_second_factor(&claims(with(
        id_claims(),
        "amr",
        json!(["pwd"])
    ))));
    assert!(!shows_second_factor(&claims(with(
        id_claims(),
        "amr",
        json!("pwd")
    ))));
    assert!(shows_second_factor(&claims(with(
        id_claims(),
        "amr",
        json!(["pwd", "otp"])
    ))));
    assert!(shows_second_factor(&claims(with(
        id_claims(),
        "amr",
        json!(["mfa"])
    ))));
}

#[test]
fn discovery_backs_off_doubling_to_five_minutes() {
    assert_eq!(super::backoff(1), Duration::from_secs(1));
    assert_eq!(super::backoff(2), Duration::from_secs(2));
    assert_eq!(super::backoff(5), Duration::from_secs(16));
    assert_eq!(super::backoff(10), Duration::from_secs(300));
    assert_eq!(super::backoff(u32::MAX), Duration::from_secs(300));
}
