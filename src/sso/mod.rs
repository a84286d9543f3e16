//! Single sign-on through OpenID Connect: the providers (`[[oidc]]`), their
//! discovery documents and keys, verifying their tokens, a sign-in's state
//! in the browser and the rules that map claims onto keygate's users. The
//! endpoints that run a sign-in are `api::sso`'s; a provider's access
//! tokens on the API are verified by `auth` through [`Provider`].
//!
//! - `fetch`: the bounded HTTPS client that talks to providers;
//! - `discovery`: the discovery document, its issuer checked;
//! - `jwks`: the provider's keys, each deciding its algorithms, and their
//!   cache (one fetch per period, whatever the number of unknown `kid`s);
//! - `token`: ID and access token verification, and the unverified `iss`
//!   that picks the verifier;
//! - `flow`: the signed cookie between the redirect and the callback;
//! - `mapping`: from claims to a user.
//!
//! A provider whose discovery fails at start does not stop keygate: its
//! sign-ins fail (the failure redirect) and discovery is tried again on
//! use, waiting longer after each failure ([`backoff`]).

pub mod discovery;
pub mod fetch;
pub mod flow;
pub mod jwks;
pub mod mapping;
pub mod token;

#[cfg(test)]
mod tests;

use std::sync::Arc;
use std::time::{Duration, Instant};

use http::Method;

use self::discovery::{ClientAuth, Discovery};
use self::fetch::{Client, Outgoing};
use self::flow::{CookieKey, Flow};
use self::jwks::{KeyCache, KeySource, ProviderKey};
use self::token::{Claims, Expected, IdToken, TokenRefusal};
use crate::config::OidcSettings;
use crate::tls_client::ClientTls;

/// The callback's path: the platform's `loginProcessingUrl`.
pub const CALLBACK_PATH: &str = "/login/oauth2/code/";

/// The authorization redirect's path prefix.
pub const AUTHORIZATION_PATH: &str = "/oauth2/authorization/";

/// Longest wait before discovery is tried again after failures.
const MAX_BACKOFF: Duration = Duration::from_secs(300);

/// How long to wait after `failures` failed discoveries in a row: 1 s,
/// doubling, at most [`MAX_BACKOFF`].
pub fn backoff(failures: u32) -> Duration {
    Duration::from_secs(1u64 << failures.saturating_sub(1).min(16)).min(MAX_BACKOFF)
}

/// One provider.
pub struct Provider {
    pub settings: OidcSettings,
    client: Client,
    discovery: tokio::sync::Mutex<DiscoveryState>,
    keys: KeyCache,
}

#[derive(Default)]
struct DiscoveryState {
    found: Option<Arc<Discovery>>,
    failures: u32,
    next_try: Option<Instant>,
    last_error: String,
}

/// Why a provider could not be reached or did not answer as it should.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProviderError {
    /// Discovery failed (now or recently: the error then is the last one).
    #[error("discovery: {0}")]
    Discovery(String),
    /// The token endpoint could not be reached or answered no tokens.
    #[error("token endpoint: {0}")]
    Unavailable(String),
    /// The token endpoint refused the code (its `error`, if it named one).
    #[error("the code exchange was refused: {0}")]
    Refused(String),
}

impl Provider {
    /// A provider for `settings`; fails when its CA file does not load.
    pub fn new(settings: OidcSettings) -> Result<Provider, String> {
        crate::tls::install_crypto_provider();
        let tls = ClientTls {
            ca_file: settings.ca_file.clone(),
            identity: None,
            // The provider client speaks HTTP/1.1 only.
            alpn: vec![b"http/1.1".to_vec()],
        }
        .client_config()
        .map_err(|e| format!("oidc {}: {e}", settings.name))?;
        Ok(Provider {
            settings,
            client: Client::new(tls),
            discovery: tokio::sync::Mutex::new(DiscoveryState::default()),
            keys: KeyCache::new(jwks::REFETCH_PERIOD),
        })
    }

    pub fn name(&self) -> &str {
        &self.settings.name
    }

    /// The discovery document: fetched once; after a failure, fetched again
    /// only once its backoff has passed, the last error answered meanwhile.
    pub async fn discovery(&self) -> Result<Arc<Discovery>, ProviderError> {
        let mut state = self.discovery.lock().await;
        if let Some(found) = &state.found {
            return Ok(found.clone());
        }
        if state.next_try.is_some_and(|at| Instant::now() < at) {
            return Err(ProviderError::Discovery(state.last_error.clone()));
        }
        match self.fetch_discovery().await {
            Ok(found) => {
                let found = Arc::new(found);
                state.found = Some(found.clone());
                state.failures = 0;
                tracing::info!(provider = %self.settings.name, issuer = %found.issuer, "single sign-on provider discovered");
                Ok(found)
            }
            Err(error) => {
                state.failures = state.failures.saturating_add(1);
                let wait = backoff(state.failures);
                state.next_try = Some(Instant::now() + wait);
                state.last_error = error.clone();
                tracing::warn!(provider = %self.settings.name, %error, retry_in = ?wait, "single sign-on provider discovery failed");
                Err(ProviderError::Discovery(error))
            }
        }
    }

    async fn fetch_discovery(&self) -> Result<Discovery, String> {
        let url = discovery::url(&self.settings.issuer);
        let body = self.client.get(&url).await.map_err(|e| e.to_string())?;
        discovery::parse(&self.settings.issuer, &body).map_err(|e| format!("{url}: {e}"))
    }

    /// The URL the browser is sent to, to sign in for `flow`.
    pub fn authorization_url(&self, found: &Discovery, flow: &Flow, redirect_uri: &str) -> String {
        let endpoint = &found.authorization_endpoint;
        let joiner = if endpoint.contains('?') { '&' } else { '?' };
        let params: [(&str, &str); 8] = [
            ("response_type", "code"),
            ("client_id", &self.settings.client_id),
            ("redirect_uri", redirect_uri),
            ("scope", &self.settings.scopes.join(" ")),
            ("state", &flow.state),
            ("nonce", &flow.nonce),
            ("code_challenge", &flow.challenge()),
            ("code_challenge_method", "S256"),
        ];
        format!("{endpoint}{joiner}{}", fetch::form(&params))
    }

    /// Exchanges `code` for the ID token at the token endpoint.
    pub async fn exchange(
        &self,
        code: &str,
        verifier: &str,
        redirect_uri: &str,
    ) -> Result<String, ProviderError> {
        let found = self
            .discovery()
            .await
            .map_err(|e| ProviderError::Unavailable(e.to_string()))?;
        let settings = &self.settings;
        let secret = settings.client_secret.expose();
        let mut params = vec![
            ("grant_type", "authorization_code"),
            ("code", code),
            ("redirect_uri", redirect_uri),
            ("code_verifier", verifier),
        ];
        let authorization = match found.client_auth {
            ClientAuth::Basic => Some(fetch::basic(&settings.client_id, secret)),
            ClientAuth::Post => {
                params.push(("client_id", &settings.client_id));
                params.push(("client_secret", secret));
                None
            }
        };
        let answer = self
            .client
            .send(Outgoing {
                method: Method::POST,
                url: &found.token_endpoint,
                form: Some(fetch::form(&params)),
                authorization,
            })
            .await
            .map_err(|e| ProviderError::Unavailable(e.to_string()))?;
        token_answer(answer)
    }

    /// The claims of a sign-in's ID token, verified ([`token`]) for `nonce`.
    pub async fn verify_id_token(
        &self,
        id_token: &str,
        nonce: &str,
        now: i64,
    ) -> Result<Claims, TokenRefusal> {
        let expected = Expected {
            issuer: &self.settings.issuer,
            audience: &self.settings.client_id,
            id_token: Some(IdToken {
                client_id: &self.settings.client_id,
                nonce,
            }),
        };
        token::verify(id_token, &self.keys, &KeysOf(self), &expected, now).await
    }

    /// The claims of one of the provider's access tokens, verified for its
    /// `audience`; `None` when the provider's access tokens are not accepted.
    pub async fn verify_access_token(
        &self,
        access_token: &str,
        now: i64,
    ) -> Option<Result<Claims, TokenRefusal>> {
        let audience = self.settings.access_token_audience.as_deref()?;
        let expected = Expected {
            issuer: &self.settings.issuer,
            audience,
            id_token: None,
        };
        Some(token::verify(access_token, &self.keys, &KeysOf(self), &expected, now).await)
    }

    /// Fetches the discovery document and the keys now, for a report of
    /// what is wrong (`check-config --connect`): the number of usable keys.
    pub async fn check(&self) -> Result<usize, String> {
        let found = self.fetch_discovery().await?;
        let body = self
            .client
            .get(&found.jwks_uri)
            .await
            .map_err(|e| e.to_string())?;
        let keys = jwks::parse_set(&body).map_err(|e| format!("{}: {e}", found.jwks_uri))?;
        if keys.is_empty() {
            return Err(format!("{}: no usable signing key", found.jwks_uri));
        }
        Ok(keys.len())
    }

    /// Discovers the provider and loads its keys, logging what fails (at
    /// start, in the background).
    pub async fn warm(&self) {
        if self.discovery().await.is_ok()
            && let Err(error) = self.keys.load(&KeysOf(self)).await
        {
            tracing::warn!(provider = %self.settings.name, %error, "single sign-on provider keys could not be fetched");
        }
    }
}

/// The ID token of a token endpoint's answer.
fn token_answer(answer: fetch::Answer) -> Result<String, ProviderError> {
    #[derive(serde::Deserialize)]
    struct Tokens {
        id_token: Option<String>,
        error: Option<String>,
    }
    let tokens: Option<Tokens> = serde_json::from_slice(&answer.body).ok();
    if !answer.status.is_success() {
        // The provider's error code (`invalid_grant`...), never its text.
        let code = tokens
            .and_then(|t| t.error)
            .filter(|e| e.len() <= 64 && e.bytes().all(|b| b.is_ascii_graphic()))
            .unwrap_or_else(|| answer.status.to_string());
        return Err(ProviderError::Refused(code));
    }
    tokens
        .and_then(|t| t.id_token)
        .ok_or_else(|| ProviderError::Unavailable("the answer holds no id_token".into()))
}

/// The provider's keys, fetched from its `jwks_uri`.
struct KeysOf<'a>(&'a Provider);

impl KeySource for KeysOf<'_> {
    async fn fetch_keys(&self) -> Result<Vec<ProviderKey>, String> {
        let found = self.0.discovery().await.map_err(|e| e.to_string())?;
        let body = self
            .0
            .client
            .get(&found.jwks_uri)
            .await
            .map_err(|e| e.to_string())?;
        jwks::parse_set(&body)
    }
}

/// Every provider, the cookie key and where the browser comes back to.
pub struct Providers {
    list: Vec<Arc<Provider>>,
    cookie_key: CookieKey,
    /// `server.public_base_url`, without a trailing `/`.
    public_base_url: String,
    /// Code exchanges under way at once: each holds a request to a
    /// provider, so a flood of callbacks cannot hold more.
    exchanges: tokio::sync::Semaphore,
}

/// Code exchanges under way at once, over every provider.
const MAX_EXCHANGES: usize = 64;

impl Providers {
    /// The providers of `settings`, signing cookies with a key derived from
    /// `signing_key` (keygate's token signing key).
    pub fn new(
        settings: &[OidcSettings],
        public_base_url: Option<&str>,
        signing_key: &[u8],
    ) -> Result<Providers, String> {
        let list = settings
            .iter()
            .map(|s| Provider::new(s.clone()).map(Arc::new))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Providers {
            list,
            cookie_key: CookieKey::derive(signing_key),
            public_base_url: public_base_url.unwrap_or_default().to_owned(),
            exchanges: tokio::sync::Semaphore::new(MAX_EXCHANGES),
        })
    }

    /// No provider: single sign-on off.
    pub fn none() -> Providers {
        Providers {
            list: Vec::new(),
            cookie_key: CookieKey::derive(b""),
            public_base_url: String::new(),
            exchanges: tokio::sync::Semaphore::new(0),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = &Arc<Provider>> {
        self.list.iter()
    }

    pub fn by_name(&self, name: &str) -> Option<&Arc<Provider>> {
        self.list.iter().find(|p| p.settings.name == name)
    }

    /// The provider whose access tokens are accepted and whose issuer is
    /// `issuer`, exactly.
    pub fn accepting_access_tokens_of(&self, issuer: &str) -> Option<&Arc<Provider>> {
        self.list
            .iter()
            .find(|p| p.settings.access_token_audience.is_some() && p.settings.issuer == issuer)
    }

    /// Whether any provider's access tokens are accepted.
    pub fn accept_access_tokens(&self) -> bool {
        self.list
            .iter()
            .any(|p| p.settings.access_token_audience.is_some())
    }

    /// A turn to exchange a code, if one is free now.
    pub fn exchange_turn(&self) -> Option<tokio::sync::SemaphorePermit<'_>> {
        self.exchanges.try_acquire().ok()
    }

    pub fn cookie_key(&self) -> &CookieKey {
        &self.cookie_key
    }

    /// `{public_base_url}{path_and_query}`: every place a sign-in sends the
    /// browser back to.
    pub fn link(&self, path_and_query: &str) -> String {
        format!("{}{path_and_query}", self.public_base_url)
    }

    /// The redirect URI registered with every provider.
    pub fn redirect_uri(&self) -> String {
        self.link(CALLBACK_PATH)
    }

    /// Warms every provider in the background.
    pub fn warm_in_background(self: &Arc<Self>) {
        for provider in &self.list {
            let provider = provider.clone();
            tokio::spawn(async move { provider.warm().await });
        }
    }
}
