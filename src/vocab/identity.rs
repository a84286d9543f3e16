//! Who a request is: the user ([`Principal`]), the credential that proved
//! it ([`AuthMethod`]), and both together ([`Identity`]); the platform's
//! authorities and its null id. Values only: how they reach an upstream is
//! `identity`'s, how they are verified `auth`'s.

use http::HeaderValue;
use uuid::Uuid;

use super::scope::{Effect, Scopes};
/// The first and last name of the platform's public user.
pub const PUBLIC_NAME: &str = "Public";

/// The "no tenant" / "no customer" id of the platform.
pub const NULL_UUID: Uuid = Uuid::from_u128(0x13814000_1dd2_11b2_8080_808080808080);

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Authority {
    SysAdmin,
    TenantAdmin,
    CustomerUser,
}

impl Authority {
    pub fn as_str(self) -> &'static str {
        match self {
            Authority::SysAdmin => "SYS_ADMIN",
            Authority::TenantAdmin => "TENANT_ADMIN",
            Authority::CustomerUser => "CUSTOMER_USER",
        }
    }

    pub fn parse(text: &str) -> Option<Authority> {
        match text {
            "SYS_ADMIN" => Some(Authority::SysAdmin),
            "TENANT_ADMIN" => Some(Authority::TenantAdmin),
            "CUSTOMER_USER" => Some(Authority::CustomerUser),
            _ => None,
        }
    }
}

impl std::fmt::Display for Authority {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How a request proved who it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthMethod {
    Jwt {
        session_id: Uuid,
    },
    ApiKey {
        key_id: Uuid,
    },
    /// A single sign-on provider's access token: a JWT, but of no session
    /// keygate opened. `token_id` names the token (derived from it), and
    /// stands for the session id where upstreams are told one.
    Provider {
        token_id: Uuid,
    },
}

impl AuthMethod {
    pub fn label(&self) -> &'static str {
        match self {
            AuthMethod::Jwt { .. } => "jwt",
            AuthMethod::ApiKey { .. } => "api-key",
            AuthMethod::Provider { .. } => "provider-token",
        }
    }
}

/// A user as far as forwarding needs it, with the header values built once
/// when the user is loaded, not per request.
#[derive(Debug, Clone)]
pub struct Principal {
    pub user_id: Uuid,
    pub tenant_id: Uuid,
    pub customer_id: Uuid,
    pub authority: Authority,
    pub email: String,
    /// The names the platform's own tokens carry; `None` when empty.
    pub first_name: Option<String>,
    pub last_name: Option<String>,
    /// The platform's public user of a public customer
    /// (`POST /api/auth/login/public`): no user of the store, its id is the
    /// null id and its e-mail the public id. It opens what a public user
    /// of the platform may open, never an account operation.
    pub is_public: bool,
    /// The header values of the five `X-Auth-*` names, built once.
    pub(crate) headers: [HeaderValue; 5],
}

impl Principal {
    pub fn new(
        user_id: Uuid,
        tenant_id: Uuid,
        customer_id: Uuid,
        authority: Authority,
        email: String,
    ) -> Principal {
        let uuid_value = |id: &Uuid| HeaderValue::from_str(&id.to_string()).expect("uuid is ASCII");
        // Emails are validated on the way into the store; an unusual byte still
        // never fails the request: it is percent-free ASCII or dropped to "".
        let email_value = HeaderValue::from_str(&email).unwrap_or(HeaderValue::from_static(""));
        Principal {
            headers: [
                uuid_value(&user_id),
                uuid_value(&tenant_id),
                uuid_value(&customer_id),
                HeaderValue::from_static(authority.as_str()),
                email_value,
            ],
            user_id,
            tenant_id,
            customer_id,
            authority,
            email,
            first_name: None,
            last_name: None,
            is_public: false,
        }
    }

    /// The public user of `customer_id` of `tenant_id`, as the platform
    /// builds it: CUSTOMER_USER, the null user id, the public id (the
    /// customer id) as its name, and "Public" as first and last name.
    pub fn public(customer_id: Uuid, tenant_id: Uuid) -> Principal {
        let mut principal = Principal::new(
            NULL_UUID,
            tenant_id,
            customer_id,
            Authority::CustomerUser,
            customer_id.to_string(),
        )
        .with_names(PUBLIC_NAME, PUBLIC_NAME);
        principal.is_public = true;
        principal
    }

    /// Whom per-user limits (quotas, open sockets) count this principal as:
    /// the user, or for a public user the customer whose public user it is,
    /// so that the public users of different customers never share a count.
    pub fn counted_as(&self) -> Uuid {
        if self.is_public {
            self.customer_id
        } else {
            self.user_id
        }
    }

    /// With the user's first and last names; an empty one is none.
    pub fn with_names(mut self, first: &str, last: &str) -> Principal {
        let named = |name: &str| (!name.is_empty()).then(|| name.to_owned());
        self.first_name = named(first);
        self.last_name = named(last);
        self
    }
}

/// A verified request identity: who, and by which credential.
#[derive(Debug, Clone)]
pub struct Identity {
    pub principal: std::sync::Arc<Principal>,
    pub method: AuthMethod,
    /// The key or session id, as a header value built once.
    pub(crate) method_id: HeaderValue,
    /// A scoped API key's grants; `None` for a token or an unscoped key.
    scopes: Option<std::sync::Arc<Scopes>>,
}

impl Identity {
    pub fn new(
        principal: std::sync::Arc<Principal>,
        method: AuthMethod,
        method_id: HeaderValue,
    ) -> Self {
        Identity {
            principal,
            method,
            method_id,
            scopes: None,
        }
    }

    /// The identity limited to `scopes` (a scoped API key's).
    pub fn with_scopes(mut self, scopes: Option<std::sync::Arc<Scopes>>) -> Self {
        self.scopes = scopes;
        self
    }

    /// The grants the credential is limited to: `None` when it carries its
    /// user's full rights (a token, an unscoped key).
    pub fn scopes(&self) -> Option<&Scopes> {
        self.scopes.as_deref()
    }

    /// Does the credential allow `method` on the normalised `path`, which
    /// does what `effect` says ([`Scopes::permit`])? Always, unless it is
    /// scoped; `effect` is worked out only for a scoped credential.
    pub fn permits(
        &self,
        method: &http::Method,
        path: &str,
        effect: impl FnOnce() -> Effect,
    ) -> bool {
        self.scopes
            .as_deref()
            .is_none_or(|scopes| scopes.permit(effect(), method, path))
    }

    /// Is the credential a token of a session keygate opened (every one of
    /// a user's sessions follows a password, and the second factor when one
    /// was due; a public user's follows a public login and opens no account
    /// endpoint), rather than an API key?
    pub fn is_session(&self) -> bool {
        matches!(self.method, AuthMethod::Jwt { .. })
    }

    /// The id of the credential: the key's, the session's or the provider
    /// token's.
    pub fn credential_id(&self) -> Uuid {
        match self.method {
            AuthMethod::ApiKey { key_id } => key_id,
            AuthMethod::Jwt { session_id } => session_id,
            AuthMethod::Provider { token_id } => token_id,
        }
    }

    pub(crate) fn api_key_id(&self) -> Option<Uuid> {
        match self.method {
            AuthMethod::ApiKey { key_id } => Some(key_id),
            AuthMethod::Jwt { .. } | AuthMethod::Provider { .. } => None,
        }
    }

    /// The session of a token's identity; none for an API key or a
    /// provider's token.
    pub(crate) fn session_id(&self) -> Option<Uuid> {
        match self.method {
            AuthMethod::ApiKey { .. } | AuthMethod::Provider { .. } => None,
            AuthMethod::Jwt { session_id } => Some(session_id),
        }
    }
}

/// Builds the header value of a key or session id.
/// Built per request for a cached API key (the key cache holds ids, not
/// header values: a third of its memory per key), so written into a stack
/// buffer and copied once.
pub fn id_header_value(id: &Uuid) -> HeaderValue {
    let mut buf = [0u8; uuid::fmt::Hyphenated::LENGTH];
    HeaderValue::from_bytes(id.hyphenated().encode_lower(&mut buf).as_bytes())
        .expect("uuid is ASCII")
}

/// A route's choice of how the identity reaches its upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum IdentityMode {
    /// The `X-Auth-*` headers, for services that trust keygate's network.
    #[default]
    Headers,
    /// The headers, and `X-Auth-Assertion`: a JWT signed with keygate's
    /// asymmetric key, verifiable against its JWKS.
    Assertion,
    /// `X-Authorization: Bearer <token>` in the platform's own access-token
    /// format, signed with the platform's key.
    Platform,
}

impl IdentityMode {
    /// The mode a route's `identity` setting names; "" is `headers`.
    pub fn parse(text: &str) -> Option<IdentityMode> {
        match text.trim() {
            "" | "headers" => Some(IdentityMode::Headers),
            "assertion" => Some(IdentityMode::Assertion),
            "platform" => Some(IdentityMode::Platform),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            IdentityMode::Headers => "headers",
            IdentityMode::Assertion => "assertion",
            IdentityMode::Platform => "platform",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn authority_round_trips() {
        for a in [
            Authority::SysAdmin,
            Authority::TenantAdmin,
            Authority::CustomerUser,
        ] {
            assert_eq!(Authority::parse(a.as_str()), Some(a));
        }
        assert_eq!(Authority::parse("sys_admin"), None);
    }
}
