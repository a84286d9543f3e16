//! The `users` table: the user record, its reads, writes and listing, and
//! the binding of a customer id to the tenant that first used it.

use sqlx::{AssertSqlSafe, Row};
use uuid::Uuid;

use super::paging::{Listing, Sort, like_pattern};
use super::revocation::Change;
use super::rows::{Target, USER_COLUMNS, UserRecord, user_from_row};
use super::sessions::outdate_user;
use super::{Page, PageRequest, Store, StoreError, conflict_on, uuid_col};
use crate::vocab::identity::{Authority, NULL_UUID};
use crate::vocab::revocation::{Published, Revocation};

/// Which users a listing holds: each `Some` narrows it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UserScope {
    pub tenant_id: Option<Uuid>,
    pub customer_id: Option<Uuid>,
    pub authority: Option<Authority>,
}

/// The `sortProperty` values a user listing orders by, as the platform
/// names them, and their columns.
pub const USER_SORT_PROPERTIES: [(&str, &str); 4] = [
    ("createdTime", "created_time"),
    ("firstName", "first_name"),
    ("lastName", "last_name"),
    ("email", "email"),
];

/// The `ORDER BY` of a user listing: the asked column, then the e-mail
/// (unique) so that pages never overlap; creation time by default.
fn user_order(sort: Option<&Sort>) -> String {
    let column = sort.and_then(|sort| {
        USER_SORT_PROPERTIES
            .iter()
            .find(|(name, _)| *name == sort.property)
            .map(|(_, column)| (*column, sort.descending))
    });
    match column {
        None => "created_time, email".into(),
        Some((column, descending)) => {
            let direction = if descending { "DESC" } else { "ASC" };
            if column == "email" {
                format!("email {direction}")
            } else {
                format!("{column} {direction}, email {direction}")
            }
        }
    }
}

impl Store {
    pub(crate) async fn user_count(&self) -> Result<i64, StoreError> {
        let row = sqlx::query("SELECT COUNT(*) FROM users")
            .fetch_one(&self.pool)
            .await?;
        Ok(row.try_get::<i64, _>(0)?)
    }

    pub async fn insert_user(&self, user: &UserRecord) -> Result<(), StoreError> {
        let sql = format!(
            "INSERT INTO users ({USER_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)"
        );
        let mut tx = self.pool.begin().await?;
        let result = sqlx::query(AssertSqlSafe(sql))
            .bind(user.id.to_string())
            .bind(user.created_time)
            .bind(user.tenant_id.to_string())
            .bind(user.customer_id.to_string())
            .bind(crate::email::fold(&user.email))
            .bind(user.authority.as_str())
            .bind(&user.first_name)
            .bind(&user.last_name)
            .bind(&user.phone)
            .bind(user.additional_info.clone())
            .bind(user.version)
            .bind(i64::from(user.enabled))
            .bind(&user.password_hash)
            .bind(user.tokens_valid_after)
            .execute(&mut *tx)
            .await;
        result.map_err(conflict_on("email"))?;
        if user.customer_id != NULL_UUID {
            claim_customer(&mut tx, user).await?;
        }
        let event = self.record(&mut tx, Target::User(user.id)).await?;
        event.commit(tx).await?;
        Ok(())
    }

    pub(crate) async fn user_by_id(&self, id: Uuid) -> Result<Option<UserRecord>, StoreError> {
        let sql = format!("SELECT {USER_COLUMNS} FROM users WHERE id = $1");
        let row = sqlx::query(AssertSqlSafe(sql))
            .bind(id.to_string())
            .fetch_optional(&self.pool)
            .await?;
        row.map(|r| user_from_row(&r)).transpose()
    }

    /// Emails are stored folded ([`crate::email::fold`]); the lookup folds too.
    pub async fn user_by_email(&self, email: &str) -> Result<Option<UserRecord>, StoreError> {
        let sql = format!("SELECT {USER_COLUMNS} FROM users WHERE email = $1");
        let row = sqlx::query(AssertSqlSafe(sql))
            .bind(crate::email::fold(email))
            .fetch_optional(&self.pool)
            .await?;
        row.map(|r| user_from_row(&r)).transpose()
    }

    pub async fn list_users(&self) -> Result<Vec<UserRecord>, StoreError> {
        let sql = format!("SELECT {USER_COLUMNS} FROM users ORDER BY created_time, email");
        let rows = sqlx::query(AssertSqlSafe(sql))
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(user_from_row).collect()
    }

    /// Enables or disables a user. Disabling outdates every token of the user
    /// and ends their sessions, in one transaction. The outcome is false when no such user.
    pub async fn set_user_enabled(
        &self,
        id: Uuid,
        enabled: bool,
        now_secs: i64,
    ) -> Result<Published<bool>, StoreError> {
        self.revoking_write(|mut tx| async move {
            let updated = if enabled {
                sqlx::query("UPDATE users SET enabled = $1, version = version + 1 WHERE id = $2")
                    .bind(1_i64)
                    .bind(id.to_string())
                    .execute(&mut *tx)
                    .await?
            } else {
                sqlx::query("UPDATE users SET enabled = $1, version = version + 1 WHERE id = $2")
                    .bind(0_i64)
                    .bind(id.to_string())
                    .execute(&mut *tx)
                    .await?
            };
            if enabled {
                // An administrator enabling an account also lifts a lockout.
                sqlx::query("DELETE FROM login_lockouts WHERE user_id = $1")
                    .bind(id.to_string())
                    .execute(&mut *tx)
                    .await?;
            } else {
                outdate_user(&mut tx, id, now_secs).await?;
            }
            let changed = updated.rows_affected() > 0;
            Change::audited(tx, changed, Revocation::User(id), Target::User(id))
        })
        .await
    }

    /// Deletes a user with their keys and sessions. The outcome is false when no such user.
    pub async fn delete_user(&self, id: Uuid) -> Result<Published<bool>, StoreError> {
        self.revoking_write(|mut tx| async move {
            for sql in [
                "DELETE FROM api_keys WHERE user_id = $1",
                "DELETE FROM sessions WHERE user_id = $1",
                "DELETE FROM login_lockouts WHERE user_id = $1",
                "DELETE FROM two_factor WHERE user_id = $1",
            ] {
                sqlx::query(sql)
                    .bind(id.to_string())
                    .execute(&mut *tx)
                    .await?;
            }
            let deleted = sqlx::query("DELETE FROM users WHERE id = $1")
                .bind(id.to_string())
                .execute(&mut *tx)
                .await?;
            let changed = deleted.rows_affected() > 0;
            Change::audited(tx, changed, Revocation::User(id), Target::User(id))
        })
        .await
    }

    /// The users in `scope`, by creation time or in the order `page` asks
    /// for ([`USER_SORT_PROPERTIES`]; another property reads as the default).
    pub(crate) async fn users_page(
        &self,
        scope: &UserScope,
        page: &PageRequest,
    ) -> Result<Page<UserRecord>, StoreError> {
        let mut filter = String::from(" WHERE 1 = 1");
        let mut binds: Vec<String> = Vec::new();
        let mut equal = |column: &str, value: String, filter: &mut String| {
            binds.push(value);
            filter.push_str(&format!(" AND {column} = ${}", binds.len()));
        };
        if let Some(tenant) = scope.tenant_id {
            equal("tenant_id", tenant.to_string(), &mut filter);
        }
        if let Some(customer) = scope.customer_id {
            equal("customer_id", customer.to_string(), &mut filter);
        }
        if let Some(authority) = scope.authority {
            equal("authority", authority.as_str().to_string(), &mut filter);
        }
        if let Some(text) = page.text_search.as_deref().filter(|t| !t.is_empty()) {
            binds.push(like_pattern(text));
            let n = binds.len();
            filter.push_str(&format!(
                " AND (LOWER(email) LIKE ${n} ESCAPE '\\' OR LOWER(first_name) LIKE ${n} ESCAPE '\\' OR LOWER(last_name) LIKE ${n} ESCAPE '\\')"
            ));
        }
        let listing = Listing {
            table: "users",
            columns: USER_COLUMNS,
            filter,
            binds,
            order: user_order(page.sort.as_ref()),
        };
        self.page(listing, page, user_from_row).await
    }

    /// The tenant a customer id belongs to, as far as keygate knows: the
    /// tenant of its users ([`claim_customer`]), or of the public customer.
    pub(crate) async fn customer_tenant(
        &self,
        customer_id: Uuid,
    ) -> Result<Option<Uuid>, StoreError> {
        let row = sqlx::query(
            "SELECT tenant_id FROM customer_tenants WHERE customer_id = $1 \
             UNION SELECT tenant_id FROM public_customers WHERE customer_id = $1",
        )
        .bind(customer_id.to_string())
        .fetch_optional(&self.pool)
        .await?;
        row.map(|r| uuid_col(&r, 0)).transpose()
    }

    /// Updates the editable profile fields. Returns false when no such user.
    pub(crate) async fn update_user_profile(&self, user: &UserRecord) -> Result<bool, StoreError> {
        let mut tx = self.pool.begin().await?;
        let result = sqlx::query(
            "UPDATE users SET first_name = $1, last_name = $2, phone = $3, additional_info = $4, \
             version = version + 1 WHERE id = $5",
        )
        .bind(&user.first_name)
        .bind(&user.last_name)
        .bind(&user.phone)
        .bind(user.additional_info.clone())
        .bind(user.id.to_string())
        .execute(&mut *tx)
        .await?;
        let changed = result.rows_affected() > 0;
        let event = self
            .record_if(&mut tx, changed, Target::User(user.id))
            .await?;
        event.commit(tx).await?;
        Ok(changed)
    }
}

/// Binds `user`'s customer id to their tenant when no tenant used it before;
/// refuses it ([`StoreError::ForeignCustomer`]) when another tenant did. Two
/// tenants racing for a new id: the second insert waits on the first's row
/// (PostgreSQL) or its write lock (SQLite), then reads the first's tenant.
async fn claim_customer(
    conn: &mut sqlx::AnyConnection,
    user: &UserRecord,
) -> Result<(), StoreError> {
    let customer = user.customer_id.to_string();
    let tenant = user.tenant_id.to_string();
    sqlx::query(
        "INSERT INTO customer_tenants (customer_id, tenant_id, created_time) \
         VALUES ($1, $2, $3) ON CONFLICT (customer_id) DO NOTHING",
    )
    .bind(&customer)
    .bind(&tenant)
    .bind(user.created_time)
    .execute(&mut *conn)
    .await?;
    let owner: String =
        sqlx::query_scalar("SELECT tenant_id FROM customer_tenants WHERE customer_id = $1")
            .bind(&customer)
            .fetch_one(&mut *conn)
            .await?;
    if owner != tenant {
        return Err(StoreError::ForeignCustomer);
    }
    Ok(())
}
