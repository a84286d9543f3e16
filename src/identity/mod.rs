//! The verified identity of a request, and the one place where identity headers
//! are removed from what a client sent and set from what keygate verified.

use http::{HeaderName, HeaderValue};

pub mod assertion;
pub mod passport;
pub mod platform;
pub use crate::vocab::identity::{
    AuthMethod, Authority, Identity, IdentityMode, NULL_UUID, PUBLIC_NAME, Principal,
    id_header_value,
};
pub use passport::{Passport, Passports};

/// The header a client sends its credential in (besides `Authorization`),
/// and the one a platform-mode route's token goes upstream in.
pub static X_AUTHORIZATION: HeaderName = HeaderName::from_static("x-authorization");

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
/// (by the proxy's header step, before anything goes upstream); only names
/// with a separator can be spelled so.
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
            // A provider's token is a JWT too; its id stands for the session.
            AuthMethod::Jwt { .. } | AuthMethod::Provider { .. } => {
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
    use uuid::Uuid;

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
}
