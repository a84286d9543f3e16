//! What several of the store's tables share: the user and key records and
//! the columns they are read from, the audit event's target, and the values
//! of a multi-row insert. The files of the tables import it; it imports none
//! of them.

use std::sync::Arc;

use sqlx::Row;
use sqlx::any::AnyRow;
use uuid::Uuid;

use super::{StoreError, flag, uuid_col};
use crate::vocab::identity::Authority;
#[cfg(test)]
use crate::vocab::identity::NULL_UUID;
use crate::vocab::scope::Scopes;

/// A user as stored.
#[derive(Clone, PartialEq, Eq)]
pub struct UserRecord {
    pub id: Uuid,
    pub created_time: i64,
    pub tenant_id: Uuid,
    pub customer_id: Uuid,
    pub email: String,
    pub authority: Authority,
    pub first_name: String,
    pub last_name: String,
    pub phone: String,
    pub additional_info: Option<String>,
    pub version: i64,
    pub enabled: bool,
    pub password_hash: String,
    /// Tokens issued (in whole seconds) before this are outdated.
    pub tokens_valid_after: i64,
}

impl UserRecord {
    /// Whether the user has set a first password: a user invited (by
    /// `POST /api/user` or the import of a platform invitation) has none
    /// until they activate. The platform's `userActivated` (no activation
    /// token pending).
    pub fn activated(&self) -> bool {
        !self.password_hash.is_empty()
    }

    /// Whether the user can log in: enabled and activated. The platform's
    /// `UserCredentials.enabled`, which is false while an invitation is
    /// pending and for a disabled (or locked) user.
    pub fn credentials_enabled(&self) -> bool {
        self.enabled && self.activated()
    }
}

#[cfg(test)]
impl UserRecord {
    /// A TENANT_ADMIN of a tenant of its own, enabled, without a password:
    /// tests change what they need with `..UserRecord::test_user(email)`.
    pub(crate) fn test_user(email: &str) -> UserRecord {
        UserRecord {
            id: Uuid::new_v4(),
            created_time: 0,
            tenant_id: Uuid::new_v4(),
            customer_id: NULL_UUID,
            email: email.into(),
            authority: Authority::TenantAdmin,
            first_name: String::new(),
            last_name: String::new(),
            phone: String::new(),
            additional_info: None,
            version: 1,
            enabled: true,
            password_hash: String::new(),
            tokens_valid_after: 0,
        }
    }
}

impl std::fmt::Debug for UserRecord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UserRecord")
            .field("id", &self.id)
            .field("email", &self.email)
            .field("authority", &self.authority)
            .field("enabled", &self.enabled)
            .finish_non_exhaustive()
    }
}

pub(super) const USER_COLUMNS: &str = "id, created_time, tenant_id, customer_id, email, authority, first_name, \
     last_name, phone, additional_info, version, enabled, password_hash, tokens_valid_after";

pub(super) fn user_from_row(row: &AnyRow) -> Result<UserRecord, StoreError> {
    let authority: String = row.try_get(5)?;
    Ok(UserRecord {
        id: uuid_col(row, 0)?,
        created_time: row.try_get(1)?,
        tenant_id: uuid_col(row, 2)?,
        customer_id: uuid_col(row, 3)?,
        email: row.try_get(4)?,
        authority: Authority::parse(&authority)
            .ok_or_else(|| StoreError::Corrupt(format!("bad authority {authority:?}")))?,
        first_name: row.try_get(6)?,
        last_name: row.try_get(7)?,
        phone: row.try_get(8)?,
        additional_info: row.try_get(9)?,
        version: row.try_get(10)?,
        enabled: flag(row, 11)?,
        password_hash: row.try_get(12)?,
        tokens_valid_after: row.try_get(13)?,
    })
}

/// An API key as stored: never the value, only its digest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiKeyRecord {
    pub id: Uuid,
    pub created_time: i64,
    pub tenant_id: Uuid,
    pub user_id: Uuid,
    pub digest: String,
    pub description: String,
    pub enabled: bool,
    /// Epoch ms; 0 means never.
    pub expiration_time: i64,
    /// The grants the key is limited to, fixed at creation; `None`: its
    /// owner's full rights.
    pub scopes: Option<Arc<Scopes>>,
}

pub(super) const KEY_COLUMNS: &str =
    "id, created_time, tenant_id, user_id, digest, description, enabled, expiration_time, scopes";

pub(super) fn key_from_row(row: &AnyRow) -> Result<ApiKeyRecord, StoreError> {
    Ok(ApiKeyRecord {
        id: uuid_col(row, 0)?,
        created_time: row.try_get(1)?,
        tenant_id: uuid_col(row, 2)?,
        user_id: uuid_col(row, 3)?,
        digest: row.try_get(4)?,
        description: row.try_get(5)?,
        enabled: flag(row, 6)?,
        expiration_time: row.try_get(7)?,
        scopes: scopes_col(row, 8)?,
    })
}

/// A stored `scopes` column: NULL is unscoped. Text that does not read as
/// scopes is a corrupt row, never an unscoped key.
fn scopes_col(row: &AnyRow, index: usize) -> Result<Option<Arc<Scopes>>, StoreError> {
    let text: Option<String> = row.try_get(index)?;
    text.map(|text| {
        Scopes::from_stored(&text)
            .map(Arc::new)
            .map_err(|e| StoreError::Corrupt(format!("bad api key scopes: {e}")))
    })
    .transpose()
}

/// What is affected, as stored in `target_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    User(Uuid),
    ApiKey(Uuid),
    /// An assertion signing key made current.
    SigningKey(Uuid),
}

/// `($1, ..., $columns), (...), ...` for `rows` rows: the values of a
/// multi-row insert.
pub(super) fn values(rows: usize, columns: usize) -> String {
    let mut out = String::with_capacity(rows * columns * 5);
    for row in 0..rows {
        if row > 0 {
            out.push_str(", ");
        }
        out.push('(');
        for column in 0..columns {
            if column > 0 {
                out.push_str(", ");
            }
            out.push('$');
            out.push_str(&(row * columns + column + 1).to_string());
        }
        out.push(')');
    }
    out
}
