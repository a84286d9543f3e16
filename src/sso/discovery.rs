//! A provider's discovery document
//! (`{issuer}/.well-known/openid-configuration`): the endpoints keygate
//! uses, checked. Its `issuer` must be the configured one, byte for byte
//! (OpenID Connect Discovery 1.0, section 4.3), and every endpoint
//! `https://`, or `http://` to a loopback host.

use serde::Deserialize;

use crate::config::check_issuer;

/// The discovery document's URL for `issuer`.
pub fn url(issuer: &str) -> String {
    format!(
        "{}/.well-known/openid-configuration",
        issuer.trim_end_matches('/')
    )
}

/// How keygate authenticates at the token endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientAuth {
    /// HTTP Basic with the client id and secret (the default of the spec).
    Basic,
    /// `client_id` and `client_secret` in the form.
    Post,
}

/// The parts of a discovery document keygate uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Discovery {
    pub issuer: String,
    pub authorization_endpoint: String,
    pub token_endpoint: String,
    pub jwks_uri: String,
    pub client_auth: ClientAuth,
}

#[derive(Deserialize)]
struct Document {
    issuer: String,
    authorization_endpoint: String,
    token_endpoint: String,
    jwks_uri: String,
    #[serde(default)]
    token_endpoint_auth_methods_supported: Option<Vec<String>>,
    #[serde(default)]
    code_challenge_methods_supported: Option<Vec<String>>,
}

/// Reads `body` as the discovery document of `issuer`.
pub fn parse(issuer: &str, body: &[u8]) -> Result<Discovery, String> {
    let document: Document = serde_json::from_slice(body).map_err(|e| {
        let detail = e.to_string();
        format!("not a discovery document: {detail}")
    })?;
    if document.issuer != issuer {
        return Err(format!(
            "its issuer {:?} is not the configured {issuer:?} (they must be equal, byte for byte)",
            document.issuer
        ));
    }
    for (name, endpoint) in [
        ("authorization_endpoint", &document.authorization_endpoint),
        ("token_endpoint", &document.token_endpoint),
        ("jwks_uri", &document.jwks_uri),
    ] {
        check_issuer(endpoint).map_err(|e| format!("{name} {endpoint:?}: {e}"))?;
        if endpoint.contains('#') {
            return Err(format!("{name} {endpoint:?} has a fragment"));
        }
    }
    if let Some(methods) = &document.code_challenge_methods_supported
        && !methods.iter().any(|m| m == "S256")
    {
        return Err(
            "code_challenge_methods_supported does not list S256 (PKCE is required)".into(),
        );
    }
    let client_auth = match &document.token_endpoint_auth_methods_supported {
        None => ClientAuth::Basic,
        Some(methods) if methods.iter().any(|m| m == "client_secret_basic") => ClientAuth::Basic,
        Some(methods) if methods.iter().any(|m| m == "client_secret_post") => ClientAuth::Post,
        Some(methods) => {
            return Err(format!(
                "the token endpoint takes neither client_secret_basic nor client_secret_post ({methods:?})"
            ));
        }
    };
    Ok(Discovery {
        issuer: document.issuer,
        authorization_endpoint: document.authorization_endpoint,
        token_endpoint: document.token_endpoint,
        jwks_uri: document.jwks_uri,
        client_auth,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn document(issuer: &str, extra: &str) -> String {
        format!(
            r#"{{"issuer":"{issuer}","authorization_endpoint":"{issuer}/auth",
            "token_endpoint":"{issuer}/token","jwks_uri":"{issuer}/jwks"{extra}}}"#
        )
    }

    #[test]
    fn a_document_of_the_configured_issuer_is_read() {
        let issuer = "https://idp.example/realms/iot";
        let found = parse(issuer, document(issuer, "").as_bytes()).unwrap();
        assert_eq!(found.token_endpoint, "https://idp.example/realms/iot/token");
        assert_eq!(found.client_auth, ClientAuth::Basic);
        let post = document(
            issuer,
            r#","token_endpoint_auth_methods_supported":["client_secret_post"]"#,
        );
        assert_eq!(
            parse(issuer, post.as_bytes()).unwrap().client_auth,
            ClientAuth::Post
        );
        assert_eq!(
            url("https://idp.example/realms/iot/"),
            "https://idp.example/realms/iot/.well-known/openid-configuration"
        );
    }

    #[test]
    fn an_issuer_that_differs_in_any_byte_is_refused() {
        let body = document("https://idp.example/", "");
        let refused = parse("https://idp.example", body.as_bytes()).unwrap_err();
        assert!(refused.contains("is not the configured"), "{refused}");
        let body = document("https://IDP.example", "");
        assert!(parse("https://idp.example", body.as_bytes()).is_err());
    }

    #[test]
    fn endpoints_in_clear_or_without_pkce_or_usable_client_auth_are_refused() {
        let issuer = "https://idp.example";
        let clear = r#"{"issuer":"https://idp.example","authorization_endpoint":"http://idp.example/auth",
            "token_endpoint":"https://idp.example/token","jwks_uri":"https://idp.example/jwks"}"#;
        let refused = parse(issuer, clear.as_bytes()).unwrap_err();
        assert!(refused.contains("authorization_endpoint"), "{refused}");
        let plain = document(issuer, r#","code_challenge_methods_supported":["plain"]"#);
        assert!(
            parse(issuer, plain.as_bytes())
                .unwrap_err()
                .contains("S256")
        );
        let jwt_auth = document(
            issuer,
            r#","token_endpoint_auth_methods_supported":["private_key_jwt"]"#,
        );
        assert!(parse(issuer, jwt_auth.as_bytes()).is_err());
        assert!(
            parse(issuer, b"<html>")
                .unwrap_err()
                .contains("not a discovery document")
        );
        let local = "http://127.0.0.1:9400";
        assert!(parse(local, document(local, "").as_bytes()).is_ok());
    }
}
