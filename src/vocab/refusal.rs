//! Why a credential was refused: the reasons every floor above names (the
//! contract's errors, the metrics' labels, the access log's field).

use uuid::Uuid;

/// Why a request was not authenticated. Each maps to one contract error and one
/// bounded metric label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthFailure {
    Missing,
    Malformed,
    Unknown,
    Disabled,
    Expired,
    Outdated,
    TokenExpired,
    BadSignature,
    WrongScope,
    PlaintextRefused,
    StoreUnavailable,
    /// The client's budget of unknown-API-key lookups is spent for now.
    LookupsSpent,
    /// A valid scoped API key whose grants do not hold the request.
    OutOfScope,
    /// A pre-verification token: a password login whose second factor is
    /// still to be checked.
    SecondFactorPending,
}

/// A refused credential: why, and whose it is when that is known: the key's
/// id once the key was found, the user's id once a token's signature or a
/// key's record named them. Never the credential itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AuthRefusal {
    pub failure: AuthFailure,
    pub key_id: Option<Uuid>,
    pub user_id: Option<Uuid>,
}

impl From<AuthFailure> for AuthRefusal {
    fn from(failure: AuthFailure) -> AuthRefusal {
        AuthRefusal {
            failure,
            key_id: None,
            user_id: None,
        }
    }
}

impl AuthFailure {
    /// Every failure, for creating each metric series up front.
    pub const ALL: [AuthFailure; 14] = [
        AuthFailure::Missing,
        AuthFailure::Malformed,
        AuthFailure::Unknown,
        AuthFailure::Disabled,
        AuthFailure::Expired,
        AuthFailure::Outdated,
        AuthFailure::TokenExpired,
        AuthFailure::BadSignature,
        AuthFailure::WrongScope,
        AuthFailure::PlaintextRefused,
        AuthFailure::StoreUnavailable,
        AuthFailure::LookupsSpent,
        AuthFailure::OutOfScope,
        AuthFailure::SecondFactorPending,
    ];

    /// No credential could be read, so it is counted under method `none`.
    pub(crate) fn is_parse_failure(self) -> bool {
        matches!(self, AuthFailure::Missing | AuthFailure::Malformed)
    }

    pub fn label(self) -> &'static str {
        match self {
            AuthFailure::Missing => "missing",
            AuthFailure::Malformed => "malformed",
            AuthFailure::Unknown => "unknown",
            AuthFailure::Disabled => "disabled",
            AuthFailure::Expired | AuthFailure::TokenExpired => "expired",
            AuthFailure::Outdated => "outdated",
            AuthFailure::BadSignature => "bad_signature",
            AuthFailure::WrongScope => "wrong_scope",
            AuthFailure::PlaintextRefused => "plaintext_refused",
            AuthFailure::StoreUnavailable => "store_error",
            AuthFailure::LookupsSpent => "rate_limited",
            AuthFailure::OutOfScope => "out_of_scope",
            AuthFailure::SecondFactorPending => "second_factor_pending",
        }
    }
}
