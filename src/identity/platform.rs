//! The platform's own access token, minted for `identity = "platform"`
//! routes so that an unmodified platform accepts what keygate forwards.
//!
//! The format is the one the platform writes itself
//! (`JwtTokenFactory.createAccessJwtToken`): an HS512 JWT whose header is
//! `{"alg":"HS512"}`, signed with the Base64-decoded `tokenSigningKey` of
//! the platform, with the claims `sub` (the e-mail), `userId`, `scopes` (the
//! authority), `sessionId`, `exp`, `iss`, `iat`, `firstName` and `lastName`
//! (left out when the user has none, as the platform leaves out a null
//! claim), `enabled`, `isPublic`, `tenantId` and `customerId`.
//!
//! The platform does not load the user on this path
//! (`JwtAuthenticationProvider`): the claims are the identity, so the ids
//! must be the platform's own. What it checks besides the signature and
//! `exp` is `iat`, against the moments it outdated the user's or the
//! session's tokens (`TokenOutdatingService.isOutdated`).
//!
//! A public customer's public user (`POST /api/auth/login/public`) goes
//! out as the platform writes it: `isPublic: true`, `sub` the public id,
//! `userId` the null id, CUSTOMER_USER, named "Public" "Public".
//!
//! `sessionId` is keygate's session id for a request with a JWT, and the
//! key's id for a request with an API key: stable per credential, so the
//! platform's per-session outdating and accounting see one session per key.

use std::time::Duration;

use arc_swap::ArcSwap;
use http::HeaderValue;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde::Serialize;
use uuid::Uuid;

use super::Identity;
use super::passport::Minter;
use crate::error::ApiError;

/// The claims of a platform access token, in the order the platform writes
/// them.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Claims<'a> {
    sub: &'a str,
    user_id: Uuid,
    scopes: [&'static str; 1],
    session_id: Uuid,
    exp: i64,
    iss: &'a str,
    iat: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    first_name: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    last_name: Option<&'a str>,
    enabled: bool,
    is_public: bool,
    tenant_id: Uuid,
    customer_id: Uuid,
}

/// The platform's signing key and issuer, swapped whole when the platform
/// rotates its key ([`PlatformTokens::rekey`]).
struct Signer {
    /// The decoded key, to tell a new key from the one in use.
    secret: Vec<u8>,
    key: EncodingKey,
    issuer: String,
}

/// Mints the platform's access tokens with its signing key.
pub struct PlatformTokens {
    signer: ArcSwap<Signer>,
    header: Header,
    lifetime: Duration,
}

impl PlatformTokens {
    /// `key` is the decoded `tokenSigningKey`; `lifetime` whole seconds.
    pub fn new(key: &[u8], issuer: &str, lifetime: Duration) -> PlatformTokens {
        crate::tls::install_crypto_provider();
        // The platform's tokens name their algorithm and nothing else.
        let mut header = Header::new(Algorithm::HS512);
        header.typ = None;
        PlatformTokens {
            signer: ArcSwap::from_pointee(Signer::new(key, issuer)),
            header,
            lifetime,
        }
    }

    fn claims<'a>(&self, identity: &'a Identity, issuer: &'a str, now_secs: i64) -> Claims<'a> {
        let p = &identity.principal;
        Claims {
            sub: &p.email,
            user_id: p.user_id,
            scopes: [p.authority.as_str()],
            session_id: identity.credential_id(),
            exp: now_secs + self.lifetime.as_secs() as i64,
            iss: issuer,
            iat: now_secs,
            first_name: p.first_name.as_deref(),
            last_name: p.last_name.as_deref(),
            // Only a verified identity of an enabled user is ever forwarded.
            enabled: true,
            // A public customer's public user: `sub` is its public id.
            is_public: p.is_public,
            // The store holds the platform's "null" id where the platform
            // has one (a SYS_ADMIN's tenant and customer, a TENANT_ADMIN's
            // customer), so the ids go out as they are.
            tenant_id: p.tenant_id,
            customer_id: p.customer_id,
        }
    }

    /// A signed token of `identity`, issued at `now_secs`.
    pub(crate) fn token(&self, identity: &Identity, now_secs: i64) -> Result<String, ApiError> {
        let signer = self.signer.load();
        let claims = self.claims(identity, &signer.issuer, now_secs);
        jsonwebtoken::encode(&self.header, &claims, &signer.key).map_err(|error| {
            tracing::error!(%error, "signing a platform token failed");
            ApiError::internal()
        })
    }
}

impl Signer {
    fn new(key: &[u8], issuer: &str) -> Signer {
        Signer {
            secret: key.to_vec(),
            key: EncodingKey::from_secret(key),
            issuer: issuer.to_owned(),
        }
    }
}

impl Minter for PlatformTokens {
    fn mint(&self, _audience: &str, identity: &Identity) -> Result<HeaderValue, ApiError> {
        let token = self.token(identity, crate::clock::now_secs())?;
        HeaderValue::try_from(format!("Bearer {token}")).map_err(|_| ApiError::internal())
    }

    fn lifetime(&self) -> Duration {
        self.lifetime
    }

    /// Signs with `key` and `issuer` from now on; false when they are the
    /// ones in use.
    fn rekey(&self, key: &[u8], issuer: &str) -> bool {
        let current = self.signer.load();
        if current.secret == key && current.issuer == issuer {
            return false;
        }
        self.signer
            .store(std::sync::Arc::new(Signer::new(key, issuer)));
        true
    }
}

/// The query parameter the platform reads a token from
/// (`JwtQueryTokenExtractor`: `getParameterMap().get("token")`, exactly one
/// value). The servlet decodes `%XX` escapes in a parameter's name as in
/// its value, so `%74oken` and `tok%65n` are that parameter too; the name
/// is compared with its case.
const TOKEN_PARAMETER: &str = "token";

/// The name of one `name=value` pair of a query (the whole pair when it has
/// no `=`).
fn parameter_name(pair: &str) -> &str {
    pair.split_once('=').map_or(pair, |(name, _)| name)
}

/// Is `name`, decoded, the platform's `token`? Nothing is decoded (or
/// allocated) for a name without an escape or longer than `token` fully
/// escaped.
pub fn is_token_parameter(name: &str) -> bool {
    name == TOKEN_PARAMETER
        || (name.len() <= 3 * TOKEN_PARAMETER.len()
            && name.contains('%')
            && crate::path::percent_decode(name).as_deref() == Some(TOKEN_PARAMETER))
}

/// Every `token` parameter of `query`, in any spelling
/// ([`is_token_parameter`]), with its value as sent.
pub fn token_parameters(query: &str) -> impl Iterator<Item = &str> {
    query
        .split('&')
        .filter(|pair| is_token_parameter(parameter_name(pair)))
        .map(|pair| pair.split_once('=').map_or("", |(_, value)| value))
}

/// Takes every `token` parameter ([`is_token_parameter`]) out of `uri`'s
/// query, keeping the others in their order; `true` when there was one.
/// A query without one is left as it is, without an allocation: the check
/// runs on every request to a platform route.
pub fn strip_token_parameters(uri: &mut http::Uri) -> bool {
    let Some(query) = uri.query() else {
        return false;
    };
    if token_parameters(query).next().is_none() {
        return false;
    }
    let rest: Vec<&str> = query
        .split('&')
        .filter(|pair| !is_token_parameter(parameter_name(pair)))
        .collect();
    let target = match rest.is_empty() {
        true => uri.path().to_owned(),
        false => format!("{}?{}", uri.path(), rest.join("&")),
    };
    let mut parts = std::mem::take(uri).into_parts();
    // The path and the kept pairs come from a valid target: they parse.
    parts.path_and_query = target.parse().ok();
    *uri = http::Uri::from_parts(parts).unwrap_or_default();
    true
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use base64::Engine;
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;
    use serde_json::{Value, json};

    use super::*;
    use crate::identity::{AuthMethod, Authority, NULL_UUID, Principal, id_header_value};

    const KEY: [u8; 64] = [42; 64];

    fn identity(method: AuthMethod, names: (&str, &str)) -> Identity {
        let principal = Principal::new(
            Uuid::from_u128(1),
            Uuid::from_u128(2),
            NULL_UUID,
            Authority::TenantAdmin,
            "ta@example.com".into(),
        )
        .with_names(names.0, names.1);
        let id = match method {
            AuthMethod::Jwt { session_id } => session_id,
            AuthMethod::ApiKey { key_id } => key_id,
            AuthMethod::Provider { token_id } => token_id,
        };
        Identity::new(Arc::new(principal), method, id_header_value(&id))
    }

    fn part(token: &str, index: usize) -> Value {
        let text = token.split('.').nth(index).unwrap();
        serde_json::from_slice(&URL_SAFE_NO_PAD.decode(text).unwrap()).unwrap()
    }

    fn tokens() -> PlatformTokens {
        PlatformTokens::new(&KEY, "thingsboard.io", Duration::from_secs(300))
    }

    #[test]
    fn the_header_names_hs512_and_nothing_else() {
        let session_id = Uuid::from_u128(9);
        let token = tokens()
            .token(&identity(AuthMethod::Jwt { session_id }, ("", "")), 1000)
            .unwrap();
        assert_eq!(part(&token, 0), json!({"alg": "HS512"}));
        assert_eq!(token.split('.').count(), 3);
    }

    #[test]
    fn the_claims_are_the_platforms_access_token_claims() {
        let session_id = Uuid::from_u128(9);
        let token = tokens()
            .token(
                &identity(AuthMethod::Jwt { session_id }, ("Ada", "Lovelace")),
                1000,
            )
            .unwrap();
        let text = URL_SAFE_NO_PAD
            .decode(token.split('.').nth(1).unwrap())
            .unwrap();
        assert_eq!(
            String::from_utf8(text).unwrap(),
            concat!(
                r#"{"sub":"ta@example.com","userId":"00000000-0000-0000-0000-000000000001","#,
                r#""scopes":["TENANT_ADMIN"],"sessionId":"00000000-0000-0000-0000-000000000009","#,
                r#""exp":1300,"iss":"thingsboard.io","iat":1000,"firstName":"Ada","lastName":"Lovelace","#,
                r#""enabled":true,"isPublic":false,"tenantId":"00000000-0000-0000-0000-000000000002","#,
                r#""customerId":"13814000-1dd2-11b2-8080-808080808080"}"#
            )
        );
    }

    #[test]
    fn absent_names_are_left_out_as_the_platform_leaves_out_null_claims() {
        let key_id = Uuid::from_u128(7);
        let token = tokens()
            .token(&identity(AuthMethod::ApiKey { key_id }, ("", "")), 1000)
            .unwrap();
        let claims = part(&token, 1);
        assert!(claims.get("firstName").is_none(), "{claims}");
        assert!(claims.get("lastName").is_none(), "{claims}");
        // An API key's requests are one platform session: the key's.
        assert_eq!(claims["sessionId"], key_id.to_string());
    }

    #[test]
    fn a_public_identity_is_minted_as_the_platforms_public_user() {
        let customer = Uuid::from_u128(5);
        let session_id = Uuid::from_u128(9);
        let identity = Identity::new(
            Arc::new(Principal::public(customer, Uuid::from_u128(2))),
            AuthMethod::Jwt { session_id },
            id_header_value(&session_id),
        );
        let token = tokens().token(&identity, 1000).unwrap();
        let claims = part(&token, 1);
        assert_eq!(claims["isPublic"], true);
        assert_eq!(claims["sub"], customer.to_string());
        assert_eq!(claims["userId"], NULL_UUID.to_string());
        assert_eq!(claims["scopes"], json!(["CUSTOMER_USER"]));
        assert_eq!(claims["customerId"], customer.to_string());
        assert_eq!(claims["tenantId"], Uuid::from_u128(2).to_string());
        assert_eq!(claims["firstName"], "Public");
        assert_eq!(claims["lastName"], "Public");
    }

    #[test]
    fn the_signature_is_hmac_sha512_of_the_decoded_key_over_header_and_claims() {
        let session_id = Uuid::from_u128(9);
        let token = tokens()
            .token(&identity(AuthMethod::Jwt { session_id }, ("", "")), 1000)
            .unwrap();
        let (signed, signature) = token.rsplit_once('.').unwrap();
        let key = aws_lc_rs::hmac::Key::new(aws_lc_rs::hmac::HMAC_SHA512, &KEY);
        let expected = aws_lc_rs::hmac::sign(&key, signed.as_bytes());
        assert_eq!(
            URL_SAFE_NO_PAD.decode(signature).unwrap(),
            expected.as_ref()
        );
    }

    #[test]
    fn a_minted_token_is_a_bearer_value_valid_for_its_lifetime() {
        let minter = PlatformTokens::new(&KEY, "platform.example", Duration::from_secs(60));
        assert_eq!(minter.lifetime(), Duration::from_secs(60));
        let session_id = Uuid::from_u128(9);
        let before = crate::clock::now_secs();
        let value = minter
            .mint("api", &identity(AuthMethod::Jwt { session_id }, ("", "")))
            .unwrap();
        let token = value.to_str().unwrap().strip_prefix("Bearer ").unwrap();
        let claims = part(token, 1);
        let iat = claims["iat"].as_i64().unwrap();
        assert!(iat >= before && iat <= crate::clock::now_secs());
        assert_eq!(claims["exp"].as_i64().unwrap() - iat, 60);
        assert_eq!(claims["iss"], "platform.example");
    }

    #[test]
    fn a_token_parameter_is_recognised_in_any_escaped_spelling_and_only_there() {
        for name in [
            "token",
            "%74oken",
            "tok%65n",
            "%74%6F%6B%65%6E",
            "%74%6f%6b%65%6e",
        ] {
            assert!(is_token_parameter(name), "{name}");
        }
        for name in [
            "Token",
            "TOKEN",
            "tokens",
            "x-token",
            "%2574oken",
            "tok%zzn",
            "",
            "%74oke",
        ] {
            assert!(!is_token_parameter(name), "{name}");
        }
    }

    #[test]
    fn every_spelling_of_token_leaves_the_query_and_the_rest_keeps_its_order() {
        let mut uri: http::Uri = "/api/tb/x?a=1&%74oken=t1&b=2&tok%65n=t2&token&c=%74oken"
            .parse()
            .unwrap();
        assert!(strip_token_parameters(&mut uri));
        assert_eq!(uri, "/api/tb/x?a=1&b=2&c=%74oken");
        let mut only: http::Uri = "http://up:8080/api/tb/x?token=t".parse().unwrap();
        assert!(strip_token_parameters(&mut only));
        assert_eq!(only, "http://up:8080/api/tb/x");
        for kept in ["/api/tb/x?a=1&Token=t&tokens=2", "/api/tb/x"] {
            let mut uri: http::Uri = kept.parse().unwrap();
            assert!(!strip_token_parameters(&mut uri));
            assert_eq!(uri, kept);
        }
    }
}
