//! `GET /.well-known/jwks.json`: the public keys that verify the identity
//! assertions keygate sends upstreams, with no credential needed. Only
//! public members are ever in it: the document is built from public keys
//! alone ([`crate::identity::assertion::keys::PublicKey::jwk`]).

use http::{HeaderValue, Response, header};

use super::{EndpointRequest, Endpoints};
use crate::body::{self, Body};
use crate::error::ApiError;

/// The JWKS: the current signing key, and each retired key until every
/// assertion it signed has expired. Cacheable for `assertion.jwks_max_age`.
#[utoipa::path(
    get,
    path = "/.well-known/jwks.json",
    tag = "noauth-controller",
    operation_id = "getJwks",
    summary = "The public keys that verify identity assertions (JWKS, RFC 7517)",
    responses(
        (status = 200, description = "The key set: {\"keys\": [JWK, ...]}, public members only", content_type = "application/json")
    )
)]
pub async fn jwks(api: &Endpoints, _req: EndpointRequest) -> Result<Response<Body>, ApiError> {
    let document = api.key_ring.load().jwks.clone();
    let mut response = Response::new(body::full(document));
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    let max_age = api.settings.assertion.jwks_max_age.as_secs();
    if let Ok(value) = HeaderValue::from_str(&format!("public, max-age={max_age}")) {
        headers.insert(header::CACHE_CONTROL, value);
    }
    Ok(response)
}
