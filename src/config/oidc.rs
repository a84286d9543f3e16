//! `[[oidc]]`: single sign-on providers, each checking itself into an
//! [`OidcSettings`]. A secret is never part of a message.

use std::path::{Path, PathBuf};

use uuid::Uuid;

use super::file::OidcSection;
use super::url::{ISSUER_URL, check_url};
use crate::vocab::identity::Authority;

/// A provider's client secret. `Debug` never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct ClientSecret(String);

impl ClientSecret {
    pub fn new(value: impl Into<String>) -> Self {
        ClientSecret(value.into())
    }
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for ClientSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClientSecret(<redacted>)")
    }
}

/// One validated `[[oidc]]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OidcSettings {
    /// The registration id: `/oauth2/authorization/{name}`.
    pub name: String,
    /// Exactly as written: the discovery document's `issuer` must equal it.
    pub issuer: String,
    pub client_id: String,
    pub client_secret: ClientSecret,
    /// Always holds `openid`.
    pub scopes: Vec<String>,
    pub button_label: String,
    pub icon: Option<String>,
    pub email_claim: String,
    pub first_name_claim: String,
    pub last_name_claim: String,
    pub require_verified_email: bool,
    /// Who a sign-in of an unknown e-mail creates; `None`: nobody.
    pub creation: Option<Creation>,
    /// `authority_claim` and `authority_map`: the claim whose values decide
    /// the authority, and the values that do; `None`: no mapping.
    pub authority_rule: Option<AuthorityRule>,
    pub trust_provider_mfa: bool,
    /// `audience` when `accept_access_tokens`: provider access tokens for it
    /// authenticate API calls; `None`: they do not.
    pub access_token_audience: Option<String>,
    /// A private CA for the provider's certificates, besides the system's.
    pub ca_file: Option<PathBuf>,
}

/// Where a user created by a sign-in goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Creation {
    /// The authority when no [`AuthorityRule`] decides it.
    pub authority: Authority,
    pub tenant_id: Uuid,
    /// Required when a created user may be a customer user.
    pub customer_id: Option<Uuid>,
}

/// `authority_claim` with `authority_map`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthorityRule {
    pub claim: String,
    /// Claim value and the authority it gives, in the file's (sorted) order.
    pub map: Vec<(String, Authority)>,
}

/// Every `[[oidc]]`; `public_base_url` is `server.public_base_url` as
/// validated, `own_issuer` the `iss` of keygate's tokens (`jwt.token_issuer`).
pub(super) fn validate(
    sections: &[OidcSection],
    public_base_url: Option<&str>,
    own_issuer: &str,
    errors: &mut Vec<String>,
) -> Vec<OidcSettings> {
    if !sections.is_empty() && public_base_url.is_none() {
        errors.push(
            "server.public_base_url: required with [[oidc]] (the redirect URI and the sign-in's redirects are built on it)"
                .into(),
        );
    }
    let mut out: Vec<OidcSettings> = Vec::with_capacity(sections.len());
    for (i, section) in sections.iter().enumerate() {
        let settings = section.validate(&format!("oidc[{i}]"), errors);
        if settings.issuer == own_issuer {
            errors.push(format!(
                "oidc[{i}].issuer: {own_issuer:?} is keygate's own token issuer (jwt.token_issuer); the issuer decides which key verifies a token, so they must differ"
            ));
        }
        if out.iter().any(|other| other.name == settings.name) {
            errors.push(format!(
                "oidc[{i}].name: {:?} is used by another [[oidc]]",
                settings.name
            ));
        }
        out.push(settings);
    }
    out
}

impl OidcSection {
    fn validate(&self, here: &str, errors: &mut Vec<String>) -> OidcSettings {
        let name = self.name.trim().to_owned();
        let name_ok = !name.is_empty()
            && name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_');
        if !name_ok {
            errors.push(format!(
                "{here}.name: {name:?} must be one or more of a-z 0-9 - _"
            ));
        }
        let issuer = self.issuer.trim().to_owned();
        if let Err(e) = check_issuer(&issuer) {
            errors.push(format!("{here}.issuer: {issuer:?}: {e}"));
        }
        let client_id = self.client_id.trim().to_owned();
        if client_id.is_empty() {
            errors.push(format!("{here}.client_id: required"));
        }
        let client_secret = self.client_secret(here, errors);
        let scopes = self.scopes(here, errors);
        let claim = |key: &str, value: &str, errors: &mut Vec<String>| {
            let value = value.trim().to_owned();
            if value.is_empty() {
                errors.push(format!("{here}.{key}: must not be empty"));
            }
            value
        };
        let email_claim = claim("email_claim", &self.email_claim, errors);
        let first_name_claim = claim("first_name_claim", &self.first_name_claim, errors);
        let last_name_claim = claim("last_name_claim", &self.last_name_claim, errors);
        let authority_rule = self.authority_rule(here, errors);
        let creation = self.creation(here, authority_rule.as_ref(), errors);
        let access_token_audience = self.access_token_audience(here, errors);
        let ca_file = existing_file(here, "ca_file", &self.ca_file, errors);
        let button_label = match self.button_label.trim() {
            "" => name.clone(),
            label => label.to_owned(),
        };
        let icon = Some(self.icon.trim().to_owned()).filter(|icon| !icon.is_empty());
        OidcSettings {
            name,
            issuer,
            client_id,
            client_secret,
            scopes,
            button_label,
            icon,
            email_claim,
            first_name_claim,
            last_name_claim,
            require_verified_email: self.require_verified_email,
            creation,
            authority_rule,
            trust_provider_mfa: self.trust_provider_mfa,
            access_token_audience,
            ca_file,
        }
    }

    /// Exactly one of `client_secret` and `client_secret_file`; the file's
    /// content without its surrounding white space.
    fn client_secret(&self, here: &str, errors: &mut Vec<String>) -> ClientSecret {
        let inline = self.client_secret.trim();
        let file = self.client_secret_file.trim();
        match (inline.is_empty(), file.is_empty()) {
            (false, true) => ClientSecret::new(inline),
            (true, false) => match std::fs::read_to_string(file) {
                Ok(text) if !text.trim().is_empty() => ClientSecret::new(text.trim()),
                Ok(_) => {
                    errors.push(format!("{here}.client_secret_file: {file:?} is empty"));
                    ClientSecret::new("")
                }
                Err(e) => {
                    errors.push(format!(
                        "{here}.client_secret_file: cannot read {file:?}: {e}"
                    ));
                    ClientSecret::new("")
                }
            },
            (true, true) => {
                errors.push(format!(
                    "{here}.client_secret: required (or client_secret_file)"
                ));
                ClientSecret::new("")
            }
            (false, false) => {
                errors.push(format!(
                    "{here}.client_secret: set either client_secret or client_secret_file, not both"
                ));
                ClientSecret::new("")
            }
        }
    }

    fn scopes(&self, here: &str, errors: &mut Vec<String>) -> Vec<String> {
        let scopes: Vec<String> = self.scopes.iter().map(|s| s.trim().to_owned()).collect();
        if let Some(bad) = scopes
            .iter()
            .find(|s| s.is_empty() || !s.bytes().all(|b| b.is_ascii_graphic() && b != b'"'))
        {
            errors.push(format!("{here}.scopes: {bad:?} is not a scope"));
        }
        if !scopes.iter().any(|s| s == "openid") {
            errors.push(format!(
                "{here}.scopes: must include \"openid\" (an ID token is what signs the user in)"
            ));
        }
        scopes
    }

    fn authority_rule(&self, here: &str, errors: &mut Vec<String>) -> Option<AuthorityRule> {
        let claim = self.authority_claim.trim();
        match (claim.is_empty(), self.authority_map.is_empty()) {
            (true, true) => return None,
            (true, false) => {
                errors.push(format!("{here}.authority_map: needs authority_claim"));
                return None;
            }
            (false, true) => {
                errors.push(format!("{here}.authority_claim: needs authority_map"));
                return None;
            }
            (false, false) => {}
        }
        let mut map = Vec::with_capacity(self.authority_map.len());
        for (value, authority) in &self.authority_map {
            match created_authority(authority) {
                Some(authority) => map.push((value.clone(), authority)),
                None => errors.push(format!(
                    "{here}.authority_map.{value}: {authority:?} is not TENANT_ADMIN or CUSTOMER_USER"
                )),
            }
        }
        Some(AuthorityRule {
            claim: claim.to_owned(),
            map,
        })
    }

    fn creation(
        &self,
        here: &str,
        rule: Option<&AuthorityRule>,
        errors: &mut Vec<String>,
    ) -> Option<Creation> {
        let authority = created_authority(self.authority.trim()).unwrap_or_else(|| {
            errors.push(format!(
                "{here}.authority: {:?} is not TENANT_ADMIN or CUSTOMER_USER",
                self.authority
            ));
            Authority::CustomerUser
        });
        let tenant_id = uuid_setting(here, "tenant_id", &self.tenant_id, errors);
        let customer_id = uuid_setting(here, "customer_id", &self.customer_id, errors);
        if !self.allow_user_creation {
            return None;
        }
        let Some(tenant_id) = tenant_id else {
            errors.push(format!(
                "{here}.tenant_id: required with allow_user_creation"
            ));
            return None;
        };
        let may_be_customer = match rule {
            Some(rule) => rule.map.iter().any(|(_, a)| *a == Authority::CustomerUser),
            None => authority == Authority::CustomerUser,
        };
        if may_be_customer && customer_id.is_none() {
            errors.push(format!(
                "{here}.customer_id: required with allow_user_creation when created users may be CUSTOMER_USER"
            ));
        }
        Some(Creation {
            authority,
            tenant_id,
            customer_id,
        })
    }

    fn access_token_audience(&self, here: &str, errors: &mut Vec<String>) -> Option<String> {
        let audience = self.audience.trim();
        if !self.accept_access_tokens {
            return None;
        }
        if audience.is_empty() {
            errors.push(format!(
                "{here}.audience: required with accept_access_tokens"
            ));
            return None;
        }
        Some(audience.to_owned())
    }
}

/// The authorities a sign-in may create.
fn created_authority(text: &str) -> Option<Authority> {
    match Authority::parse(text) {
        Some(Authority::SysAdmin) | None => None,
        other => other,
    }
}

fn uuid_setting(here: &str, key: &str, text: &str, errors: &mut Vec<String>) -> Option<Uuid> {
    let text = text.trim();
    if text.is_empty() {
        return None;
    }
    match Uuid::parse_str(text) {
        Ok(id) => Some(id),
        Err(_) => {
            errors.push(format!("{here}.{key}: {text:?} is not a UUID"));
            None
        }
    }
}

fn existing_file(here: &str, key: &str, text: &str, errors: &mut Vec<String>) -> Option<PathBuf> {
    let text = text.trim();
    if text.is_empty() {
        return None;
    }
    if !Path::new(text).is_file() {
        errors.push(format!("{here}.{key}: file {text:?} does not exist"));
    }
    Some(PathBuf::from(text))
}

/// An issuer: `https://`, or `http://` to a loopback host only (a provider
/// on the same machine, as in tests); a path is allowed, a query is not.
pub fn check_issuer(text: &str) -> Result<http::Uri, String> {
    let uri = check_url(text, &ISSUER_URL)?;
    if uri.scheme_str() == Some("http") && !is_loopback_host(uri.host().unwrap_or("")) {
        return Err("http:// is allowed only for a loopback host (localhost, 127.0.0.1, [::1]); use https://".into());
    }
    Ok(uri)
}

/// `localhost`, an address in 127.0.0.0/8, or `::1`.
pub fn is_loopback_host(host: &str) -> bool {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}
