//! Secrets sent in clear: the one rule for requests and WebSockets alike.
//!
//! An API key that did not arrive over HTTPS is refused always, on every
//! route, and when configured disabled as well: it crossed the wire in clear,
//! whatever it was sent to. A single sign-on provider's access token
//! ([`InClear::provider_issuers`]) is refused always too: like a key, it is
//! a credential keygate cannot end, valid until its provider says. Any other
//! token is refused unless the sender may send secrets in clear
//! ([`Sender::may_send_secrets`]).
//!
//! The rule itself is pure ([`exposure`]); what follows a refusal (the
//! security log line, disabling the key) is [`Authenticator::refuse_in_clear`].

use std::net::SocketAddr;

use crate::address::AddressKey;
use crate::error::ApiError;

use super::Authenticator;
use super::credential::Credential;

/// The settings the rule reads.
#[derive(Debug, Clone, Default)]
pub struct InClear {
    /// `api_keys.disable_on_plaintext`.
    pub disable_keys: bool,
    /// `listen.allow_plaintext_credentials`.
    pub allow_plaintext: bool,
    /// The issuers of the providers whose access tokens are accepted
    /// (`[[oidc]] accept_access_tokens`); empty: none, and no bearer token
    /// is looked into.
    pub provider_issuers: std::sync::Arc<[String]>,
}

impl InClear {
    /// Whether `token` claims a provider's issuer (unverified: it only
    /// decides that the token is refused in clear).
    fn is_provider_token(&self, token: &str) -> bool {
        !self.provider_issuers.is_empty()
            && crate::sso::token::claimed_issuer(token)
                .is_some_and(|iss| self.provider_issuers.contains(&iss))
    }
}

/// What the rule knows of who sent a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sender {
    /// The request reached keygate over HTTPS: TLS here, or a trusted
    /// proxy that reports `X-Forwarded-Proto: https`.
    pub secure: bool,
    /// The peer is a trusted proxy.
    pub trusted: bool,
    /// The peer's address is a loopback one.
    pub loopback: bool,
}

impl Sender {
    /// May this request carry a password or a token? Over HTTPS always; in
    /// clear only from a loopback peer that is not a proxy (a sidecar's
    /// neighbour: the secret never left the machine), or when allowed. A
    /// trusted proxy that reports plain HTTP saw the secret cross the network
    /// in clear, wherever the proxy itself runs.
    pub fn may_send_secrets(self, allow_plaintext: bool) -> bool {
        self.secure || (!self.trusted && self.loopback) || allow_plaintext
    }
}

/// A credential that must not be taken as it was sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exposure {
    /// An API key sent in clear: refused, and disabled when configured.
    ApiKey,
    /// A token sent in clear by a sender that may not.
    Token,
    /// A provider's access token sent in clear: refused always.
    ProviderToken,
}

/// The rule: which credential sent by `sender` is refused, if any.
pub fn exposure(credential: &Credential, sender: Sender, rule: &InClear) -> Option<Exposure> {
    if sender.secure {
        return None;
    }
    match credential {
        Credential::ApiKey(_) => Some(Exposure::ApiKey),
        Credential::Bearer(token) if rule.is_provider_token(token.expose()) => {
            Some(Exposure::ProviderToken)
        }
        Credential::Bearer(_) if !sender.may_send_secrets(rule.allow_plaintext) => {
            Some(Exposure::Token)
        }
        Credential::Bearer(_) => None,
    }
}

impl Authenticator {
    /// What follows a refusal by [`exposure`]: logs it (`channel` says how
    /// it came: "HTTP", "ws://"), disables an API key when configured (a key
    /// that turns out unknown is paid from `from`'s budget), and returns the
    /// refusal the client gets. The caller counts it.
    pub async fn refuse_in_clear(
        &self,
        credential: &Credential,
        exposure: Exposure,
        peer: SocketAddr,
        rule: &InClear,
        from: Option<AddressKey>,
        channel: &str,
    ) -> ApiError {
        match (exposure, credential) {
            (Exposure::ApiKey, Credential::ApiKey(key)) => {
                tracing::warn!(target: "keygate::security", %peer, channel, "refused an API key sent in clear");
                if rule.disable_keys {
                    self.disable_exposed_key(key, from).await;
                }
                ApiError::api_key_over_plain_http()
            }
            (Exposure::ApiKey, _) => ApiError::api_key_over_plain_http(),
            (Exposure::Token, _) => {
                tracing::warn!(target: "keygate::security", %peer, channel, "refused a token sent in clear");
                ApiError::credentials_over_plain_http()
            }
            (Exposure::ProviderToken, _) => {
                tracing::warn!(target: "keygate::security", %peer, channel, "refused an identity provider's access token sent in clear");
                ApiError::credentials_over_plain_http()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::credential::Secret;

    #[test]
    fn keys_in_clear_are_refused_always_and_tokens_unless_the_sender_may() {
        let key = Credential::ApiKey(Secret::new("k"));
        let token = Credential::Bearer(Secret::new("t"));
        let strict = InClear {
            disable_keys: false,
            allow_plaintext: false,
            provider_issuers: std::sync::Arc::from(["https://idp.example".to_owned()]),
        };
        let allowing = InClear {
            allow_plaintext: true,
            ..strict.clone()
        };
        let provider = Credential::Bearer(Secret::new(jwt(r#"{"iss":"https://idp.example"}"#)));
        let own = Credential::Bearer(Secret::new(jwt(r#"{"iss":"thingsboard.io"}"#)));
        let remote = Sender {
            secure: false,
            trusted: false,
            loopback: false,
        };
        let neighbour = Sender {
            loopback: true,
            ..remote
        };
        let proxy_on_loopback = Sender {
            trusted: true,
            ..neighbour
        };
        let tls = Sender {
            secure: true,
            ..remote
        };
        let (strict, allowing) = (&strict, &allowing);
        for (credential, sender, rule, expected) in [
            (&key, tls, strict, None),
            (&token, tls, strict, None),
            (&key, remote, strict, Some(Exposure::ApiKey)),
            (&key, neighbour, allowing, Some(Exposure::ApiKey)),
            (&token, remote, strict, Some(Exposure::Token)),
            (&token, remote, allowing, None),
            (&token, neighbour, strict, None),
            (&token, proxy_on_loopback, strict, Some(Exposure::Token)),
            (&provider, tls, strict, None),
            (&provider, remote, strict, Some(Exposure::ProviderToken)),
            (
                &provider,
                neighbour,
                allowing,
                Some(Exposure::ProviderToken),
            ),
            (&own, neighbour, strict, None),
            (&own, remote, allowing, None),
        ] {
            assert_eq!(exposure(credential, sender, rule), expected, "{sender:?}");
        }
    }

    /// An unsigned token with `claims`: only its claimed issuer is read.
    fn jwt(claims: &str) -> String {
        use base64::Engine;
        let b64 = |s: &str| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s);
        format!("{}.{}.c2ln", b64(r#"{"alg":"ES256"}"#), b64(claims))
    }
}
