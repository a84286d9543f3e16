//! Issuing and verifying the platform's HS512 JWTs.
//!
//! The algorithm is pinned: a token whose header names any other algorithm
//! (`none`, HS256, RS256 with a public key as HMAC secret, ...) is refused
//! before its signature is looked at, and so is a header that asks the verifier
//! for more than HS512 under keygate's own key ([`check_header`]). `exp` and
//! `iss` are required; a refresh
//! token is never an access token and the other way round. Outdating (logout,
//! password change, disabled user) is checked by the caller against the store's
//! state, see `auth::Authenticator`.

use std::time::Duration;

use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::identity::{Authority, NULL_UUID, PUBLIC_NAME};
use crate::store::UserRecord;
pub(crate) use crate::tls::install_crypto_provider;

pub const REFRESH_SCOPE: &str = "REFRESH_TOKEN";
/// The only scope of the token a password login answers when the user has
/// a second factor: it opens the second-factor check and nothing else.
pub const PRE_VERIFICATION_SCOPE: &str = "PRE_VERIFICATION_TOKEN";
/// The only scope of the token a password login answers when a second
/// factor is enforced for a user who has none: it opens configuring one
/// and nothing else.
pub const MFA_CONFIGURATION_SCOPE: &str = "MFA_CONFIGURATION_TOKEN";

/// Claims of an access token, named as the platform's clients decode them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AccessClaims {
    pub sub: String,
    pub user_id: Uuid,
    pub scopes: Vec<String>,
    pub session_id: Uuid,
    pub iss: String,
    pub iat: i64,
    pub exp: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_name: Option<String>,
    // Defaults let a refresh token decode here, so that it is refused for its
    // scope rather than as malformed.
    #[serde(default)]
    pub enabled: bool,
    pub is_public: bool,
    #[serde(default)]
    pub tenant_id: Uuid,
    #[serde(default)]
    pub customer_id: Uuid,
}

impl AccessClaims {
    /// The single authority of a valid access token.
    pub fn authority(&self) -> Option<Authority> {
        match self.scopes.as_slice() {
            [one] => Authority::parse(one),
            _ => None,
        }
    }

    /// Has the token the shape of a public user's, as the platform issues
    /// it: CUSTOMER_USER, the null user id, and its customer id as `sub`?
    fn is_public_shape(&self) -> bool {
        self.authority() == Some(Authority::CustomerUser)
            && self.user_id == NULL_UUID
            && self.customer_id != NULL_UUID
            && Uuid::parse_str(&self.sub).is_ok_and(|sub| sub == self.customer_id)
    }
}

/// Claims of a refresh token.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RefreshClaims {
    pub sub: String,
    pub user_id: Uuid,
    pub scopes: Vec<String>,
    pub session_id: Uuid,
    pub iss: String,
    pub iat: i64,
    pub exp: i64,
    pub is_public: bool,
    pub jti: String,
}

impl RefreshClaims {
    /// The public id (customer id) of a public user's refresh token.
    pub fn public_id(&self) -> Option<Uuid> {
        if !self.is_public {
            return None;
        }
        Uuid::parse_str(&self.sub)
            .ok()
            .filter(|id| *id != NULL_UUID)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    #[error("token expired")]
    Expired,
    #[error("token signature does not match")]
    BadSignature,
    #[error("malformed token")]
    Malformed,
    #[error("token has the wrong scope for this use")]
    WrongScope,
    /// A pre-verification token where an access token is needed: the
    /// login's second factor is still to be checked.
    #[error("the login's second factor is still to be checked")]
    SecondFactorPending,
}

/// Signs and verifies tokens with one key.
pub struct TokenKeys {
    encoding: EncodingKey,
    decoding: DecodingKey,
    validation: Validation,
    issuer: String,
    access_ttl: Duration,
    refresh_ttl: Duration,
}

impl std::fmt::Debug for TokenKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenKeys")
            .field("issuer", &self.issuer)
            .finish_non_exhaustive()
    }
}

/// A signed token and when it expires (epoch seconds).
#[derive(Debug, Clone)]
pub struct Signed {
    pub token: String,
    pub exp: i64,
}

impl TokenKeys {
    pub fn new(
        secret: &[u8],
        issuer: &str,
        access_ttl: Duration,
        refresh_ttl: Duration,
    ) -> TokenKeys {
        install_crypto_provider();
        let mut validation = Validation::new(Algorithm::HS512);
        validation.leeway = 0;
        validation.validate_exp = true;
        validation.set_issuer(&[issuer]);
        validation.set_required_spec_claims(&["exp", "iss", "sub"]);
        TokenKeys {
            encoding: EncodingKey::from_secret(secret),
            decoding: DecodingKey::from_secret(secret),
            validation,
            issuer: issuer.to_string(),
            access_ttl,
            refresh_ttl,
        }
    }

    /// The `iss` of keygate's tokens.
    pub fn issuer(&self) -> &str {
        &self.issuer
    }

    pub fn access_ttl(&self) -> Duration {
        self.access_ttl
    }

    pub fn sign_access(
        &self,
        user: &UserRecord,
        session_id: Uuid,
        now_secs: i64,
    ) -> Result<Signed, TokenError> {
        let non_empty = |s: &str| (!s.is_empty()).then(|| s.to_string());
        let exp = now_secs + self.access_ttl.as_secs() as i64;
        let claims = AccessClaims {
            sub: user.email.clone(),
            user_id: user.id,
            scopes: vec![user.authority.as_str().to_string()],
            session_id,
            iss: self.issuer.clone(),
            iat: now_secs,
            exp,
            first_name: non_empty(&user.first_name),
            last_name: non_empty(&user.last_name),
            enabled: user.enabled,
            is_public: false,
            tenant_id: user.tenant_id,
            customer_id: user.customer_id,
        };
        self.sign(&claims).map(|token| Signed { token, exp })
    }

    pub fn sign_refresh(
        &self,
        user: &UserRecord,
        session_id: Uuid,
        jti: &str,
        now_secs: i64,
    ) -> Result<Signed, TokenError> {
        let exp = now_secs + self.refresh_ttl.as_secs() as i64;
        let claims = RefreshClaims {
            sub: user.email.clone(),
            user_id: user.id,
            scopes: vec![REFRESH_SCOPE.to_string()],
            session_id,
            iss: self.issuer.clone(),
            iat: now_secs,
            exp,
            is_public: false,
            jti: jti.to_string(),
        };
        self.sign(&claims).map(|token| Signed { token, exp })
    }

    /// Signs the access token of the public user of `customer_id`, exactly
    /// as the platform signs one: `sub` the public id (the customer id),
    /// the null user id, CUSTOMER_USER, "Public" "Public", `isPublic`.
    pub fn sign_public_access(
        &self,
        customer_id: Uuid,
        tenant_id: Uuid,
        session_id: Uuid,
        now_secs: i64,
    ) -> Result<Signed, TokenError> {
        let exp = now_secs + self.access_ttl.as_secs() as i64;
        let claims = AccessClaims {
            sub: customer_id.to_string(),
            user_id: NULL_UUID,
            scopes: vec![Authority::CustomerUser.as_str().to_string()],
            session_id,
            iss: self.issuer.clone(),
            iat: now_secs,
            exp,
            first_name: Some(PUBLIC_NAME.into()),
            last_name: Some(PUBLIC_NAME.into()),
            enabled: true,
            is_public: true,
            tenant_id,
            customer_id,
        };
        self.sign(&claims).map(|token| Signed { token, exp })
    }

    /// Signs the refresh token of the public user of `customer_id`.
    pub fn sign_public_refresh(
        &self,
        customer_id: Uuid,
        session_id: Uuid,
        jti: &str,
        now_secs: i64,
    ) -> Result<Signed, TokenError> {
        let exp = now_secs + self.refresh_ttl.as_secs() as i64;
        let claims = RefreshClaims {
            sub: customer_id.to_string(),
            user_id: NULL_UUID,
            scopes: vec![REFRESH_SCOPE.to_string()],
            session_id,
            iss: self.issuer.clone(),
            iat: now_secs,
            exp,
            is_public: true,
            jti: jti.to_string(),
        };
        self.sign(&claims).map(|token| Signed { token, exp })
    }

    /// Signs a pre-verification token: the user's claims with the single
    /// scope [`PRE_VERIFICATION_SCOPE`], living `ttl`. `attempt_id` names
    /// this login attempt (its wrong codes are counted against it).
    pub fn sign_pre_verification(
        &self,
        user: &UserRecord,
        attempt_id: Uuid,
        now_secs: i64,
        ttl: Duration,
    ) -> Result<Signed, TokenError> {
        self.sign_second_factor(user, PRE_VERIFICATION_SCOPE, attempt_id, now_secs, ttl)
    }

    /// Signs a token of a login waiting for a second factor: the user's
    /// claims with the single `scope` ([`PRE_VERIFICATION_SCOPE`] or
    /// [`MFA_CONFIGURATION_SCOPE`]), living `ttl`.
    pub fn sign_second_factor(
        &self,
        user: &UserRecord,
        scope: &'static str,
        attempt_id: Uuid,
        now_secs: i64,
        ttl: Duration,
    ) -> Result<Signed, TokenError> {
        let exp = now_secs + ttl.as_secs() as i64;
        let claims = AccessClaims {
            sub: user.email.clone(),
            user_id: user.id,
            scopes: vec![scope.to_string()],
            session_id: attempt_id,
            iss: self.issuer.clone(),
            iat: now_secs,
            exp,
            first_name: None,
            last_name: None,
            enabled: user.enabled,
            is_public: false,
            tenant_id: user.tenant_id,
            customer_id: user.customer_id,
        };
        self.sign(&claims).map(|token| Signed { token, exp })
    }

    /// Verifies a pre-verification token; any other token is refused here.
    pub(crate) fn verify_pre_verification(&self, token: &str) -> Result<AccessClaims, TokenError> {
        self.verify_second_factor(token, PRE_VERIFICATION_SCOPE)
    }

    /// Verifies an MFA configuration token; any other token is refused here.
    pub(crate) fn verify_mfa_configuration(&self, token: &str) -> Result<AccessClaims, TokenError> {
        self.verify_second_factor(token, MFA_CONFIGURATION_SCOPE)
    }

    fn verify_second_factor(&self, token: &str, scope: &str) -> Result<AccessClaims, TokenError> {
        let claims: AccessClaims = self.decode(token)?;
        if claims.scopes.as_slice() != [scope] || claims.is_public {
            return Err(TokenError::WrongScope);
        }
        Ok(claims)
    }

    fn sign<T: Serialize>(&self, claims: &T) -> Result<String, TokenError> {
        jsonwebtoken::encode(&Header::new(Algorithm::HS512), claims, &self.encoding)
            .map_err(|_| TokenError::Malformed)
    }

    /// Verifies an access token: signature, algorithm, `exp`, `iss`, and an
    /// authority scope. A refresh token and a pre-verification token are
    /// refused here: this is where every endpoint and every proxied route
    /// accepts a token, so neither opens any of them.
    pub(crate) fn verify_access(&self, token: &str) -> Result<AccessClaims, TokenError> {
        let claims: AccessClaims = self.decode(token)?;
        if claims.authority().is_none() {
            let wrong = |s: &String| {
                s == REFRESH_SCOPE || s == PRE_VERIFICATION_SCOPE || s == MFA_CONFIGURATION_SCOPE
            };
            return Err(if claims.scopes.as_slice() == [PRE_VERIFICATION_SCOPE] {
                TokenError::SecondFactorPending
            } else if claims.scopes.iter().any(wrong) {
                TokenError::WrongScope
            } else {
                TokenError::Malformed
            });
        }
        // A public user's token is accepted only in the exact shape the
        // platform gives it: never as a real user, never naming a user.
        if claims.is_public && !claims.is_public_shape() {
            return Err(TokenError::WrongScope);
        }
        Ok(claims)
    }

    /// Verifies a refresh token; an access token is refused here. A public
    /// user's must name the null user and a customer id as `sub`.
    pub(crate) fn verify_refresh(&self, token: &str) -> Result<RefreshClaims, TokenError> {
        let claims: RefreshClaims = self.decode(token)?;
        if claims.scopes.as_slice() != [REFRESH_SCOPE] {
            return Err(TokenError::WrongScope);
        }
        if claims.is_public && (claims.user_id != NULL_UUID || claims.public_id().is_none()) {
            return Err(TokenError::WrongScope);
        }
        Ok(claims)
    }

    fn decode<T: serde::de::DeserializeOwned>(&self, token: &str) -> Result<T, TokenError> {
        check_header(token)?;
        jsonwebtoken::decode::<T>(token, &self.decoding, &self.validation)
            .map(|data| data.claims)
            .map_err(|e| match e.kind() {
                ErrorKind::ExpiredSignature => TokenError::Expired,
                ErrorKind::InvalidSignature => TokenError::BadSignature,
                _ => TokenError::Malformed,
            })
    }
}

/// Header members that would have the verifier fetch or trust a key named by
/// the token itself (`jku`, `x5u`, `x5c`, `jwk`), or obey extensions it does
/// not know (`crit`, which RFC 7515 says must then be refused).
const REFUSED_HEADER_MEMBERS: [&str; 5] = ["crit", "jku", "x5u", "x5c", "jwk"];

/// Refuses, before any signature is checked, a token whose header carries a
/// member of [`REFUSED_HEADER_MEMBERS`], a `typ` other than `JWT`, or any
/// `cty` (a nested token). keygate's own tokens carry `alg` and `typ` only.
pub(crate) fn check_header(token: &str) -> Result<(), TokenError> {
    use base64::Engine;
    let encoded = token.split_once('.').ok_or(TokenError::Malformed)?.0;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(encoded)
        .map_err(|_| TokenError::Malformed)?;
    let header: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(&bytes).map_err(|_| TokenError::Malformed)?;
    let refused = REFUSED_HEADER_MEMBERS
        .iter()
        .any(|name| header.contains_key(*name));
    let typ_ok = header.get("typ").is_none_or(|typ| typ == "JWT");
    if refused || !typ_ok || header.contains_key("cty") {
        return Err(TokenError::Malformed);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::NULL_UUID;
    use base64::Engine;
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;

    const KEY: &[u8] = &[42u8; 64];

    fn keys() -> TokenKeys {
        TokenKeys::new(
            KEY,
            "thingsboard.io",
            Duration::from_secs(9000),
            Duration::from_secs(604_800),
        )
    }

    fn user() -> UserRecord {
        UserRecord {
            id: Uuid::from_u128(10),
            tenant_id: Uuid::from_u128(20),
            first_name: "Ten".into(),
            ..UserRecord::test_user("tenant@example.com")
        }
    }

    fn now() -> i64 {
        crate::clock::now_secs()
    }

    fn payload(token: &str) -> serde_json::Value {
        let part = token.split('.').nth(1).unwrap();
        serde_json::from_slice(&URL_SAFE_NO_PAD.decode(part).unwrap()).unwrap()
    }

    #[test]
    fn access_token_has_the_platform_claims() {
        let signed = keys()
            .sign_access(&user(), Uuid::from_u128(5), now())
            .unwrap();
        let header: serde_json::Value = serde_json::from_slice(
            &URL_SAFE_NO_PAD
                .decode(signed.token.split('.').next().unwrap())
                .unwrap(),
        )
        .unwrap();
        assert_eq!(header["alg"], "HS512");
        let claims = payload(&signed.token);
        assert_eq!(claims["sub"], "tenant@example.com");
        assert_eq!(claims["scopes"], serde_json::json!(["TENANT_ADMIN"]));
        assert_eq!(claims["iss"], "thingsboard.io");
        assert_eq!(claims["firstName"], "Ten");
        assert!(claims.get("lastName").is_none(), "empty names are omitted");
        assert_eq!(claims["customerId"], NULL_UUID.to_string());
        assert_eq!(claims["isPublic"], false);
        assert_eq!(
            claims["exp"].as_i64().unwrap() - claims["iat"].as_i64().unwrap(),
            9000
        );
        let verified = keys().verify_access(&signed.token).unwrap();
        assert_eq!(verified.session_id, Uuid::from_u128(5));
    }

    #[test]
    fn refresh_token_is_not_an_access_token_and_vice_versa() {
        let k = keys();
        let refresh = k
            .sign_refresh(&user(), Uuid::from_u128(5), "jti-1", now())
            .unwrap();
        assert_eq!(k.verify_access(&refresh.token), Err(TokenError::WrongScope));
        assert_eq!(k.verify_refresh(&refresh.token).unwrap().jti, "jti-1");
        let access = k.sign_access(&user(), Uuid::from_u128(5), now()).unwrap();
        assert!(k.verify_refresh(&access.token).is_err());
    }

    #[test]
    fn a_public_users_tokens_verify_only_in_the_platforms_shape() {
        let k = keys();
        let (customer, tenant) = (Uuid::from_u128(30), Uuid::from_u128(20));
        let access = k
            .sign_public_access(customer, tenant, Uuid::from_u128(5), now())
            .unwrap();
        let claims = k.verify_access(&access.token).unwrap();
        assert!(claims.is_public);
        assert_eq!(claims.user_id, NULL_UUID);
        assert_eq!(claims.customer_id, customer);
        let refresh = k
            .sign_public_refresh(customer, Uuid::from_u128(5), "jti-p", now())
            .unwrap();
        assert_eq!(
            k.verify_refresh(&refresh.token).unwrap().public_id(),
            Some(customer)
        );
        assert_eq!(k.verify_access(&refresh.token), Err(TokenError::WrongScope));
        // `isPublic` on a token that names a real user, another authority,
        // or a `sub` other than its customer is never a public user's.
        let now = now();
        let shaped = |edit: &dyn Fn(&mut AccessClaims)| {
            let mut claims = AccessClaims {
                sub: customer.to_string(),
                user_id: NULL_UUID,
                scopes: vec!["CUSTOMER_USER".into()],
                session_id: Uuid::from_u128(5),
                iss: "thingsboard.io".into(),
                iat: now,
                exp: now + 60,
                first_name: None,
                last_name: None,
                enabled: true,
                is_public: true,
                tenant_id: tenant,
                customer_id: customer,
            };
            edit(&mut claims);
            k.sign(&claims).unwrap()
        };
        assert!(k.verify_access(&shaped(&|_| {})).is_ok());
        for edit in [
            &(|c: &mut AccessClaims| c.user_id = Uuid::from_u128(10)) as &dyn Fn(&mut AccessClaims),
            &|c: &mut AccessClaims| c.scopes = vec!["TENANT_ADMIN".into()],
            &|c: &mut AccessClaims| c.sub = "tenant@example.com".into(),
            &|c: &mut AccessClaims| c.sub = Uuid::from_u128(31).to_string(),
            &|c: &mut AccessClaims| c.customer_id = NULL_UUID,
        ] {
            assert_eq!(k.verify_access(&shaped(edit)), Err(TokenError::WrongScope));
        }
        let mut user_refresh = k
            .verify_refresh(
                &k.sign_refresh(&user(), Uuid::from_u128(5), "j", now)
                    .unwrap()
                    .token,
            )
            .unwrap();
        assert_eq!(
            user_refresh.public_id(),
            None,
            "a user's refresh token is no public one"
        );
        user_refresh.is_public = true;
        assert_eq!(user_refresh.public_id(), None, "its sub is no customer id");
    }

    #[test]
    fn token_signed_with_another_key_is_a_bad_signature() {
        let other = TokenKeys::new(
            &[1u8; 64],
            "thingsboard.io",
            Duration::from_secs(9000),
            Duration::from_secs(604_800),
        );
        let token = other
            .sign_access(&user(), Uuid::nil(), now())
            .unwrap()
            .token;
        assert_eq!(keys().verify_access(&token), Err(TokenError::BadSignature));
    }

    #[test]
    fn pre_verification_token_is_no_access_token_and_an_access_token_is_none() {
        let k = keys();
        let signed = k
            .sign_pre_verification(&user(), Uuid::from_u128(9), now(), Duration::from_secs(300))
            .unwrap();
        let claims = payload(&signed.token);
        assert_eq!(
            claims["scopes"],
            serde_json::json!([PRE_VERIFICATION_SCOPE])
        );
        assert_eq!(
            claims["exp"].as_i64().unwrap() - claims["iat"].as_i64().unwrap(),
            300
        );
        assert_eq!(
            k.verify_access(&signed.token),
            Err(TokenError::SecondFactorPending)
        );
        assert_eq!(
            k.verify_pre_verification(&signed.token).unwrap().session_id,
            Uuid::from_u128(9)
        );
        let access = k.sign_access(&user(), Uuid::nil(), now()).unwrap();
        assert_eq!(
            k.verify_pre_verification(&access.token),
            Err(TokenError::WrongScope)
        );
        let expired = k
            .sign_pre_verification(&user(), Uuid::nil(), now() - 400, Duration::from_secs(300))
            .unwrap();
        assert_eq!(
            k.verify_pre_verification(&expired.token),
            Err(TokenError::Expired)
        );
    }

    #[test]
    fn expired_token_is_refused() {
        let token = keys()
            .sign_access(&user(), Uuid::nil(), now() - 10_000)
            .unwrap()
            .token;
        assert_eq!(keys().verify_access(&token), Err(TokenError::Expired));
    }

    #[test]
    fn alg_none_token_is_refused() {
        let good = keys()
            .sign_access(&user(), Uuid::nil(), now())
            .unwrap()
            .token;
        let body = good.split('.').nth(1).unwrap();
        let header = URL_SAFE_NO_PAD.encode(br#"{"alg":"none","typ":"JWT"}"#);
        for token in [format!("{header}.{body}."), format!("{header}.{body}")] {
            assert_eq!(keys().verify_access(&token), Err(TokenError::Malformed));
        }
    }

    #[test]
    fn hs256_token_with_the_same_secret_is_refused() {
        let claims = payload(
            &keys()
                .sign_access(&user(), Uuid::nil(), now())
                .unwrap()
                .token,
        );
        let token = jsonwebtoken::encode(
            &Header::new(Algorithm::HS256),
            &claims,
            &EncodingKey::from_secret(KEY),
        )
        .unwrap();
        assert_eq!(keys().verify_access(&token), Err(TokenError::Malformed));
    }

    #[test]
    fn token_without_exp_or_from_another_issuer_is_refused() {
        let mut claims = payload(
            &keys()
                .sign_access(&user(), Uuid::nil(), now())
                .unwrap()
                .token,
        );
        claims.as_object_mut().unwrap().remove("exp");
        let no_exp = jsonwebtoken::encode(
            &Header::new(Algorithm::HS512),
            &claims,
            &EncodingKey::from_secret(KEY),
        )
        .unwrap();
        assert_eq!(keys().verify_access(&no_exp), Err(TokenError::Malformed));
        let foreign = TokenKeys::new(
            KEY,
            "evil.example",
            Duration::from_secs(9000),
            Duration::from_secs(604_800),
        );
        let token = foreign
            .sign_access(&user(), Uuid::nil(), now())
            .unwrap()
            .token;
        assert_eq!(keys().verify_access(&token), Err(TokenError::Malformed));
    }

    #[test]
    fn garbage_is_malformed() {
        for token in ["", "abc", "a.b.c", "....", "eyJhbGciOiJIUzUxMiJ9.e30.x"] {
            assert_eq!(
                keys().verify_access(token),
                Err(TokenError::Malformed),
                "{token}"
            );
        }
    }

    /// A token signed with the right key under `header`.
    fn signed_with_header(header: &str) -> String {
        let good = keys()
            .sign_access(&user(), Uuid::nil(), now())
            .unwrap()
            .token;
        let body = good.split('.').nth(1).unwrap();
        let head = URL_SAFE_NO_PAD.encode(header.as_bytes());
        let signing = format!("{head}.{body}");
        let mac = aws_lc_rs::hmac::sign(
            &aws_lc_rs::hmac::Key::new(aws_lc_rs::hmac::HMAC_SHA512, KEY),
            signing.as_bytes(),
        );
        format!("{signing}.{}", URL_SAFE_NO_PAD.encode(mac.as_ref()))
    }

    #[test]
    fn a_correctly_signed_token_verifies_with_or_without_typ() {
        for header in [r#"{"alg":"HS512","typ":"JWT"}"#, r#"{"alg":"HS512"}"#] {
            assert!(keys().verify_access(&signed_with_header(header)).is_ok());
        }
    }

    #[test]
    fn a_correctly_signed_token_with_a_key_or_extension_header_is_refused() {
        for header in [
            r#"{"alg":"HS512","typ":"JWT","crit":["exp"],"exp":1}"#,
            r#"{"alg":"HS512","crit":[]}"#,
            r#"{"alg":"HS512","jku":"https://evil.example/jwks.json"}"#,
            r#"{"alg":"HS512","x5u":"https://evil.example/cert.pem"}"#,
            r#"{"alg":"HS512","x5c":["MIIB"]}"#,
            r#"{"alg":"HS512","jwk":{"kty":"oct","k":"AAAA"}}"#,
            r#"{"alg":"HS512","typ":"at+jwt"}"#,
            r#"{"alg":"HS512","typ":"jwt"}"#,
            r#"{"alg":"HS512","typ":null}"#,
            r#"{"alg":"HS512","cty":"JWT"}"#,
            r#"{"alg":"HS512","typ":"JWT","cty":"application/json"}"#,
        ] {
            let token = signed_with_header(header);
            assert_eq!(check_header(&token), Err(TokenError::Malformed), "{header}");
            assert_eq!(
                keys().verify_access(&token),
                Err(TokenError::Malformed),
                "{header}"
            );
            assert_eq!(
                keys().verify_refresh(&token),
                Err(TokenError::Malformed),
                "{header}"
            );
        }
    }

    #[test]
    fn a_forbidden_header_is_refused_before_the_signature_is_looked_at() {
        let forged = signed_with_header(r#"{"alg":"HS512","jku":"https://evil.example/k"}"#);
        let (signing, _) = forged.rsplit_once('.').unwrap();
        let unsigned = format!("{signing}.AAAA");
        // A bad signature would say BadSignature: the header decides first.
        assert_eq!(keys().verify_access(&unsigned), Err(TokenError::Malformed));
    }

    /// The last character of each part carries unused bits: a decoder
    /// that ignored them would accept a second spelling of the same token.
    #[test]
    fn every_other_spelling_of_a_token_is_refused() {
        let keys = keys();
        let token = keys.sign_access(&user(), Uuid::nil(), now()).unwrap().token;
        let ends: Vec<usize> = token
            .match_indices('.')
            .map(|(at, _)| at - 1)
            .chain([token.len() - 1])
            .collect();
        for at in ends {
            for replacement in (b'0'..=b'9').chain(b'A'..=b'Z').chain(b'a'..=b'z') {
                if token.as_bytes()[at] == replacement {
                    continue;
                }
                let mut changed = token.clone().into_bytes();
                changed[at] = replacement;
                let changed = String::from_utf8(changed).unwrap();
                assert!(keys.verify_access(&changed).is_err(), "{changed}");
            }
        }
    }

    /// Hostile tokens, for the property tests and `fuzz/run`.
    mod properties {
        use super::*;
        use proptest::prelude::*;

        fn token_like() -> impl Strategy<Value = String> {
            prop_oneof![
                any::<String>(),
                "[A-Za-z0-9_-]{0,40}\\.[A-Za-z0-9_-]{0,80}\\.[A-Za-z0-9_-]{0,90}",
                // A real header and payload with a forged signature.
                "[A-Za-z0-9_-]{86}".prop_map(|signature| {
                    let token = keys()
                        .sign_access(&user(), Uuid::nil(), now())
                        .unwrap()
                        .token;
                    let (signed, _) = token.rsplit_once('.').unwrap();
                    format!("{signed}.{signature}")
                }),
            ]
        }

        proptest! {
            #[test]
            fn no_forged_or_garbled_token_verifies(token in token_like()) {
                let keys = keys();
                prop_assert!(keys.verify_access(&token).is_err());
                prop_assert!(keys.verify_refresh(&token).is_err());
            }

            #[test]
            fn any_one_character_changed_in_a_token_is_refused(
                position in any::<proptest::sample::Index>(),
                replacement in proptest::char::range('!', '~'),
            ) {
                let keys = keys();
                let token = keys.sign_access(&user(), Uuid::nil(), now()).unwrap().token;
                let at = position.index(token.len());
                prop_assume!(token.as_bytes()[at] != replacement as u8);
                let mut changed = token.clone().into_bytes();
                changed[at] = replacement as u8;
                let changed = String::from_utf8(changed).unwrap();
                prop_assert!(keys.verify_access(&changed).is_err(), "{changed}");
            }
        }
    }
}
