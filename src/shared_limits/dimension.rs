//! What a quota counts by: the API key, the user, or the tenant.

use uuid::Uuid;

use crate::vocab::identity::{Identity, NULL_UUID};

/// What a quota counts by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Dimension {
    Key = 0,
    User = 1,
    Tenant = 2,
}

impl Dimension {
    pub const ALL: [Dimension; 3] = [Dimension::Key, Dimension::User, Dimension::Tenant];

    /// The metric label.
    pub fn label(self) -> &'static str {
        ["key", "user", "tenant"][self as usize]
    }

    /// The policy name in the `RateLimit` headers.
    pub(super) fn policy(self) -> &'static str {
        ["per-key", "per-user", "per-tenant"][self as usize]
    }

    /// Whom the request counts against, if the dimension applies: a JWT
    /// names no key, and a system administrator belongs to no tenant.
    pub(super) fn subject(self, identity: &Identity) -> Option<Uuid> {
        match self {
            Dimension::Key => identity.api_key_id(),
            Dimension::User => Some(identity.principal.counted_as()),
            Dimension::Tenant => Some(identity.principal.tenant_id).filter(|t| *t != NULL_UUID),
        }
    }
}
