//! Secrets sent in clear: the one rule for requests and WebSockets alike.
//!
//! An API key that did not arrive over HTTPS is refused always, on every
//! route, and when configured disabled as well: it crossed the wire in clear,
//! whatever it was sent to. A token is refused unless the peer may send
//! secrets in clear ([`Client::may_send_secrets`]).

use crate::address::AddressKey;
use crate::error::ApiError;
use crate::listener::peer::Client;

use super::Authenticator;
use super::credential::Credential;

/// The settings the rule reads.
#[derive(Debug, Clone, Copy)]
pub struct InClear {
    /// `api_keys.disable_on_plaintext`.
    pub disable_keys: bool,
    /// `listen.allow_plaintext_credentials`.
    pub allow_plaintext: bool,
}

impl Authenticator {
    /// `Ok` when `credential` may travel as `client` sent it. Otherwise logs
    /// the refusal (`channel` says how it came: "HTTP", "ws://"), disables an
    /// API key when configured (a key that turns out unknown is paid from
    /// `from`'s budget), and returns the refusal the client gets. The caller
    /// counts it.
    pub async fn refuse_in_clear(
        &self,
        credential: &Credential,
        client: &Client<'_>,
        rule: InClear,
        from: Option<AddressKey>,
        channel: &str,
    ) -> Result<(), ApiError> {
        if client.secure {
            return Ok(());
        }
        let peer = client.conn.peer;
        match credential {
            Credential::ApiKey(key) => {
                tracing::warn!(target: "keygate::security", %peer, channel, "refused an API key sent in clear");
                if rule.disable_keys {
                    self.disable_exposed_key(key, from).await;
                }
                Err(ApiError::api_key_over_plain_http())
            }
            Credential::Bearer(_) if !client.may_send_secrets(rule.allow_plaintext) => {
                tracing::warn!(target: "keygate::security", %peer, channel, "refused a token sent in clear");
                Err(ApiError::credentials_over_plain_http())
            }
            Credential::Bearer(_) => Ok(()),
        }
    }
}
