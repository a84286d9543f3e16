//! The verified identity of a request, and the one place where identity headers
//! are removed from what a client sent and set from what keygate verified.

use http::{HeaderName, HeaderValue};
use uuid::Uuid;

use crate::auth::scope::Scopes;

pub mod assertion;
pub mod passport;
pub mod platform;
pub use passport::{IdentityMode, Passport, Passports};

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
    Jwt { session_id: Uuid },
    ApiKey { key_id: Uuid },
}

impl AuthMethod {
    pub fn label(&self) -> &'static str {
        match self {
            AuthMethod::Jwt { .. } => "jwt",
            AuthMethod::ApiKey { .. } => "api-key",
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
    headers: [HeaderValue; 5],
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
    method_id: HeaderValue,
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
        effect: impl FnOnce() -> crate::auth::scope::Effect,
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

    /// The id of the credential: the key's or the session's.
    pub fn credential_id(&self) -> Uuid {
        match self.method {
            AuthMethod::ApiKey { key_id } => key_id,
            AuthMethod::Jwt { session_id } => session_id,
        }
    }

    pub(crate) fn api_key_id(&self) -> Option<Uuid> {
        match self.method {
            AuthMethod::ApiKey { key_id } => Some(key_id),
            AuthMethod::Jwt { .. } => None,
        }
    }

    /// The session of a token's identity; none for an API key.
    pub(crate) fn session_id(&self) -> Option<Uuid> {
        match self.method {
            AuthMethod::ApiKey { .. } => None,
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

pub static X_AUTH_USER_ID: HeaderName = HeaderName::from_static("x-auth-user-id");
pub static X_AUTH_TENANT_ID: HeaderName = HeaderName::from_static("x-auth-tenant-id");
pub static X_AUTH_CUSTOMER_ID: HeaderName = HeaderName::from_static("x-auth-customer-id");
pub static X_AUTH_AUTHORITY: HeaderName = HeaderName::from_static("x-auth-authority");
pub static X_AUTH_EMAIL: HeaderName = HeaderName::from_static("x-auth-email");
pub static X_AUTH_METHOD: HeaderName = HeaderName::from_static("x-auth-method");
pub static X_AUTH_API_KEY_ID: HeaderName = HeaderName::from_static("x-auth-api-key-id");
pub static X_AUTH_SESSION_ID: HeaderName = HeaderName::from_static("x-auth-session-id");
/// `true` on a request of a public customer's public user; absent otherwise.
pub static X_AUTH_PUBLIC: HeaderName = HeaderName::from_static("x-auth-public");

const RESERVED_PREFIX: &[u8] = b"x-auth-";

/// True when a header name is in the reserved `X-Auth-` space, folded as
/// [`folded_eq`] folds: `X.Auth.User-Id` and `x_auth_user_id` are reserved too.
pub(crate) fn is_reserved(name: &HeaderName) -> bool {
    folded_starts_with(name.as_str().as_bytes(), RESERVED_PREFIX)
}

/// True for the credential headers, in any folded spelling.
pub(crate) fn is_credential(name: &HeaderName) -> bool {
    let bytes = name.as_str().as_bytes();
    folded_eq(bytes, b"x-authorization") || folded_eq(bytes, b"authorization")
}

/// A header-name byte as servers behind keygate may read it: lower-cased, and
/// every non-alphanumeric separator (`_`, `.`, `~`, ...) read as `-`.
fn fold(b: u8) -> u8 {
    if b.is_ascii_alphanumeric() {
        b.to_ascii_lowercase()
    } else {
        b'-'
    }
}

/// Does `name`, folded, start with `prefix` (lower case, `-` separated)?
pub(crate) fn folded_starts_with(name: &[u8], prefix: &[u8]) -> bool {
    name.len() >= prefix.len() && name.iter().zip(prefix).all(|(a, b)| fold(*a) == *b)
}

/// Is `name`, folded, equal to `other` (lower case, `-` separated)?
pub(crate) fn folded_eq(name: &[u8], other: &[u8]) -> bool {
    name.len() == other.len() && folded_starts_with(name, other)
}

/// The names that frame a request or belong to one connection: a header
/// spelled so that a server behind keygate folds it into one of these
/// (`Content_Length`, `transfer.encoding`: `_` or another separator read as
/// `-`, as CGI-style servers read names) would frame or steer the request
/// there differently from how keygate framed it. Such a request is refused
/// (`crate::proxy::headers::refuse_folded_framing`); only names with a separator can be spelled
/// so.
const FRAMING: [&str; 6] = [
    "content-length",
    "transfer-encoding",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
];

/// The lengths of [`FRAMING`]'s names, one bit each: most names are
/// answered by one test of their length.
const FRAMING_LENGTHS: u32 = {
    let mut mask = 0u32;
    let mut i = 0;
    while i < FRAMING.len() {
        mask |= 1 << FRAMING[i].len();
        i += 1;
    }
    mask
};

/// Does `name` fold to one of [`FRAMING`] without being it: a separator
/// other than `-` where the name has one? (A `HeaderName` is lower case, so
/// a name equal to one of them byte for byte is that header itself.)
pub fn folds_to_framing(name: &http::HeaderName) -> bool {
    let bytes = name.as_str().as_bytes();
    bytes.len() < 32
        && FRAMING_LENGTHS & (1 << bytes.len()) != 0
        && bytes
            .iter()
            .any(|b| !b.is_ascii_alphanumeric() && *b != b'-')
        && FRAMING
            .iter()
            .any(|known| folded_eq(bytes, known.as_bytes()))
}

impl Identity {
    /// The identity headers of this identity, in the order they are sent.
    /// `proxy::headers::to_upstream` sends them after the client's own
    /// headers, from which every reserved `X-Auth-*` name was removed, so
    /// nothing a client sent can remove or shadow them.
    pub(crate) fn each_header(&self, mut header: impl FnMut(&HeaderName, &HeaderValue)) {
        let p = &self.principal;
        let [user, tenant, customer, authority, email] = &p.headers;
        header(&X_AUTH_USER_ID, user);
        header(&X_AUTH_TENANT_ID, tenant);
        header(&X_AUTH_CUSTOMER_ID, customer);
        header(&X_AUTH_AUTHORITY, authority);
        header(&X_AUTH_EMAIL, email);
        match self.method {
            AuthMethod::Jwt { .. } => {
                header(&X_AUTH_METHOD, &HeaderValue::from_static("jwt"));
                header(&X_AUTH_SESSION_ID, &self.method_id);
            }
            AuthMethod::ApiKey { .. } => {
                header(&X_AUTH_METHOD, &HeaderValue::from_static("api-key"));
                header(&X_AUTH_API_KEY_ID, &self.method_id);
            }
        }
        if p.is_public {
            header(&X_AUTH_PUBLIC, &HeaderValue::from_static("true"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderMap;
    use std::sync::Arc;

    fn identity() -> Identity {
        let principal = Arc::new(Principal::new(
            Uuid::from_u128(1),
            Uuid::from_u128(2),
            NULL_UUID,
            Authority::TenantAdmin,
            "ta@example.com".into(),
        ));
        let key_id = Uuid::from_u128(3);
        Identity::new(
            principal,
            AuthMethod::ApiKey { key_id },
            id_header_value(&key_id),
        )
    }

    #[test]
    fn spoofed_identity_headers_in_any_spelling_are_reserved() {
        for name in [
            "x-auth-user-id",
            "x_auth_user_id",
            "X-AUTH-EMAIL",
            "x-Auth_Tenant-Id",
            "X.Auth.User-Id",
            "x~auth|user-id",
            "x!auth#email",
        ] {
            let name = HeaderName::from_bytes(name.as_bytes()).unwrap();
            assert!(is_reserved(&name), "{name}");
        }
        for name in ["x_authorization", "authorization", "X.Authorization"] {
            let name = HeaderName::from_bytes(name.as_bytes()).unwrap();
            assert!(is_credential(&name), "{name}");
        }
        for name in ["x-authx", "accept", "xauth-user-id"] {
            let name = HeaderName::from_bytes(name.as_bytes()).unwrap();
            assert!(!is_reserved(&name) && !is_credential(&name), "{name}");
        }
    }

    fn injected(identity: &Identity) -> HeaderMap {
        let mut headers = HeaderMap::new();
        identity.each_header(|name, value| {
            headers.append(name.clone(), value.clone());
        });
        headers
    }

    #[test]
    fn injected_headers_carry_the_verified_identity() {
        let headers = injected(&identity());
        assert_eq!(headers[&X_AUTH_USER_ID], Uuid::from_u128(1).to_string());
        assert_eq!(
            headers[&X_AUTH_CUSTOMER_ID],
            "13814000-1dd2-11b2-8080-808080808080"
        );
        assert_eq!(headers[&X_AUTH_AUTHORITY], "TENANT_ADMIN");
        assert_eq!(headers[&X_AUTH_EMAIL], "ta@example.com");
        assert_eq!(headers[&X_AUTH_METHOD], "api-key");
        assert_eq!(headers[&X_AUTH_API_KEY_ID], Uuid::from_u128(3).to_string());
        assert!(!headers.contains_key(&X_AUTH_SESSION_ID));
        assert!(!headers.contains_key(&X_AUTH_PUBLIC));
        assert_eq!(headers.get_all(&X_AUTH_USER_ID).iter().count(), 1);
    }

    #[test]
    fn a_public_identity_goes_out_as_the_customers_public_user_marked_public() {
        let customer = Uuid::from_u128(7);
        let session_id = Uuid::from_u128(8);
        let identity = Identity::new(
            Arc::new(Principal::public(customer, Uuid::from_u128(2))),
            AuthMethod::Jwt { session_id },
            id_header_value(&session_id),
        );
        let headers = injected(&identity);
        assert_eq!(headers[&X_AUTH_PUBLIC], "true");
        assert_eq!(headers.get_all(&X_AUTH_PUBLIC).iter().count(), 1);
        assert_eq!(headers[&X_AUTH_USER_ID], NULL_UUID.to_string());
        assert_eq!(headers[&X_AUTH_CUSTOMER_ID], customer.to_string());
        assert_eq!(headers[&X_AUTH_AUTHORITY], "CUSTOMER_USER");
        assert_eq!(headers[&X_AUTH_EMAIL], customer.to_string());
    }

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
