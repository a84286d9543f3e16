//! Reading the platform's PostgreSQL database, read-only: one read-only
//! transaction (one consistent snapshot) from which users and keys are
//! streamed in id order, never held in memory all at once.

use std::str::FromStr;
use std::time::Duration;

use futures_util::{Stream, StreamExt};
use sqlx::postgres::{PgConnectOptions, PgConnection, PgRow};
use sqlx::{ConnectOptions, Connection, Row};

use super::ImportError;

/// A `tb_user` row with its `user_credentials`, as the platform stores them.
#[derive(Debug, Clone, Default)]
pub struct UserRow {
    pub id: String,
    pub created_time: i64,
    pub tenant_id: Option<String>,
    pub customer_id: Option<String>,
    pub email: Option<String>,
    pub authority: Option<String>,
    pub first_name: Option<String>,
    pub last_name: Option<String>,
    pub phone: Option<String>,
    pub additional_info: Option<String>,
    /// `None` when the user has no credentials row.
    pub enabled: Option<bool>,
    pub password: Option<String>,
    pub activate_token: Option<String>,
    pub activate_token_exp_time: Option<i64>,
    pub reset_token: Option<String>,
    pub reset_token_exp_time: Option<i64>,
    pub has_credentials: bool,
    /// Whether the platform's `customer` table holds the row's customer.
    pub customer_found: bool,
    /// That customer's `tenant_id`.
    pub customer_tenant_id: Option<String>,
}

/// A one-time token the platform mails, looked up by its value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenKind {
    /// `user_credentials.activate_token`: an invitation.
    Activation,
    /// `user_credentials.reset_token`: a password-reset link.
    Reset,
}

/// An `api_key` row, as the platform stores it (the value in plain text).
#[derive(Debug, Clone, Default)]
pub struct KeyRow {
    pub id: String,
    pub created_time: i64,
    pub tenant_id: Option<String>,
    pub user_id: Option<String>,
    pub value: Option<String>,
    pub enabled: bool,
    pub expiration_time: Option<i64>,
    pub description: Option<String>,
}

/// A `user_auth_settings` row: the user's second factors as the platform
/// keeps them (`AccountTwoFaSettings` JSON, secrets in plain text).
#[derive(Debug, Clone, Default)]
pub struct TwoFaRow {
    pub user_id: String,
    pub two_fa_settings: Option<String>,
}

/// The table of the platform's second factors, read when present (older
/// versions of the platform have none).
pub const TWO_FA_TABLE: (&str, &[&str]) = ("user_auth_settings", &["user_id", "two_fa_settings"]);

/// The tables and columns the import reads: a database without them is not
/// the platform's (or a version too old to import from).
pub const REQUIRED: &[(&str, &[&str])] = &[
    (
        "tb_user",
        &[
            "id",
            "created_time",
            "additional_info",
            "authority",
            "customer_id",
            "email",
            "first_name",
            "last_name",
            "phone",
            "tenant_id",
        ],
    ),
    (
        "user_credentials",
        &[
            "user_id",
            "enabled",
            "password",
            "activate_token",
            "activate_token_exp_time",
            "reset_token",
            "reset_token_exp_time",
        ],
    ),
    (
        "api_key",
        &[
            "id",
            "created_time",
            "tenant_id",
            "user_id",
            "value",
            "enabled",
            "expiration_time",
            "description",
        ],
    ),
    ("admin_settings", &["key", "json_value", "tenant_id"]),
    ("customer", &["id", "tenant_id", "is_public"]),
];

/// A user with their credentials, looked up by one token column.
macro_rules! user_by {
    ($column:literal) => {
        concat!(
            "SELECT u.id::text, u.created_time, u.tenant_id::text, u.customer_id::text, u.email, \
             u.authority, u.first_name, u.last_name, u.phone, u.additional_info, \
             c.enabled, c.password, c.activate_token, c.activate_token_exp_time, \
             c.reset_token, c.reset_token_exp_time, c.user_id IS NOT NULL, \
             cu.id IS NOT NULL, cu.tenant_id::text \
             FROM user_credentials c JOIN tb_user u ON u.id = c.user_id \
             LEFT JOIN customer cu ON cu.id = u.customer_id WHERE c.",
            $column,
            " = $1"
        )
    };
}

const USER_BY_ACTIVATION_TOKEN: &str = user_by!("activate_token");
const USER_BY_RESET_TOKEN: &str = user_by!("reset_token");

/// An open read-only snapshot of the platform's database.
pub struct Source {
    conn: PgConnection,
}

/// How long connecting may take before the database counts as unreachable.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

impl Source {
    /// Connects and opens a read-only, repeatable-read transaction: nothing
    /// read can be written, and users and keys come from one snapshot.
    pub async fn open(url: &str) -> Result<Source, ImportError> {
        let options =
            PgConnectOptions::from_str(url).map_err(|e| ImportError::Url(e.to_string()))?;
        let place = format!("{}:{}", options.get_host(), options.get_port());
        let unreachable = |cause: String| ImportError::Unreachable {
            place: place.clone(),
            database: options.get_database().unwrap_or("").to_owned(),
            cause,
        };
        let mut conn = match tokio::time::timeout(CONNECT_TIMEOUT, options.connect()).await {
            Ok(Ok(conn)) => conn,
            Ok(Err(e)) => return Err(unreachable(one_line(&e))),
            Err(_) => return Err(unreachable(format!("no answer within {CONNECT_TIMEOUT:?}"))),
        };
        sqlx::raw_sql("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            .execute(&mut conn)
            .await?;
        Ok(Source { conn })
    }

    /// Refuses a database that lacks a table or column the import reads,
    /// naming every one missing.
    pub async fn check_schema(&mut self) -> Result<(), ImportError> {
        let rows = sqlx::query(
            "SELECT table_name::text, column_name::text FROM information_schema.columns \
             WHERE table_schema = current_schema()",
        )
        .fetch_all(&mut self.conn)
        .await?;
        let present: std::collections::HashSet<(String, String)> = rows
            .iter()
            .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
            .collect::<Result<_, sqlx::Error>>()?;
        let tables: std::collections::HashSet<&str> =
            present.iter().map(|(t, _)| t.as_str()).collect();
        let mut missing = Vec::new();
        for (table, columns) in REQUIRED {
            if !tables.contains(table) {
                missing.push(format!("table {table}"));
                continue;
            }
            for column in *columns {
                if !present.contains(&((*table).to_owned(), (*column).to_owned())) {
                    missing.push(format!("column {table}.{column}"));
                }
            }
        }
        if missing.is_empty() {
            Ok(())
        } else {
            Err(ImportError::NotPlatform(missing))
        }
    }

    /// Whether the platform's database has the table of second factors
    /// with its columns.
    pub async fn has_two_fa(&mut self) -> Result<bool, ImportError> {
        let (table, columns) = TWO_FA_TABLE;
        let row = sqlx::query(
            "SELECT COUNT(*) FROM information_schema.columns \
             WHERE table_schema = current_schema() AND table_name = $1 AND column_name = ANY($2)",
        )
        .bind(table)
        .bind(columns)
        .fetch_one(&mut self.conn)
        .await?;
        let found: i64 = row.try_get(0)?;
        Ok(found == columns.len() as i64)
    }

    /// Every user's second-factor settings, by user id.
    pub fn two_fa_settings(&mut self) -> impl Stream<Item = Result<TwoFaRow, ImportError>> + '_ {
        sqlx::query(
            "SELECT user_id::text, two_fa_settings FROM user_auth_settings ORDER BY user_id",
        )
        .fetch(&mut self.conn)
        .map(|row| {
            let row = row?;
            Ok(TwoFaRow {
                user_id: row.try_get(0)?,
                two_fa_settings: row.try_get(1)?,
            })
        })
    }

    /// How many users and keys there are (for progress).
    pub async fn counts(&mut self) -> Result<(i64, i64), ImportError> {
        let row =
            sqlx::query("SELECT (SELECT COUNT(*) FROM tb_user), (SELECT COUNT(*) FROM api_key)")
                .fetch_one(&mut self.conn)
                .await?;
        Ok((row.try_get(0)?, row.try_get(1)?))
    }

    /// The `jwt` settings of the system (the JSON the platform stores).
    pub async fn jwt_settings(&mut self) -> Result<Option<String>, ImportError> {
        let row = sqlx::query(
            "SELECT json_value FROM admin_settings WHERE key = 'jwt' \
             ORDER BY (tenant_id = '13814000-1dd2-11b2-8080-808080808080') DESC LIMIT 1",
        )
        .fetch_optional(&mut self.conn)
        .await?;
        Ok(row.and_then(|r| r.try_get(0).ok()))
    }

    /// The customers marked public, with their tenants, by id (as text:
    /// a row that is not what keygate can use is the caller's to skip).
    pub async fn public_customers(&mut self) -> Result<Vec<(String, Option<String>)>, ImportError> {
        let rows = sqlx::query(
            "SELECT id::text, tenant_id::text FROM customer WHERE is_public ORDER BY id",
        )
        .fetch_all(&mut self.conn)
        .await?;
        rows.iter()
            .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
            .collect::<Result<_, sqlx::Error>>()
            .map_err(ImportError::from)
    }

    /// Every user with its credentials, by id.
    pub fn users(&mut self) -> impl Stream<Item = Result<UserRow, ImportError>> + '_ {
        sqlx::query(
            "SELECT u.id::text, u.created_time, u.tenant_id::text, u.customer_id::text, u.email, \
             u.authority, u.first_name, u.last_name, u.phone, u.additional_info, \
             c.enabled, c.password, c.activate_token, c.activate_token_exp_time, \
             c.reset_token, c.reset_token_exp_time, c.user_id IS NOT NULL, \
             cu.id IS NOT NULL, cu.tenant_id::text \
             FROM tb_user u LEFT JOIN user_credentials c ON c.user_id = u.id \
             LEFT JOIN customer cu ON cu.id = u.customer_id ORDER BY u.id",
        )
        .fetch(&mut self.conn)
        .map(|row| Ok(user_row(&row?)?))
    }

    /// Every user's id and e-mail address as stored, by id: the import folds
    /// them all before it maps a row, so that rows folding to one address
    /// are held back together wherever they fall in the batches.
    pub fn user_emails(
        &mut self,
    ) -> impl Stream<Item = Result<(String, String), ImportError>> + '_ {
        sqlx::query("SELECT id::text, email FROM tb_user WHERE email IS NOT NULL ORDER BY id")
            .fetch(&mut self.conn)
            .map(|row| {
                let row = row?;
                Ok((row.try_get(0)?, row.try_get(1)?))
            })
    }

    /// The user holding an activation or reset token on the platform, if any.
    pub async fn user_by_token(
        &mut self,
        kind: TokenKind,
        token: &str,
    ) -> Result<Option<UserRow>, ImportError> {
        let sql = match kind {
            TokenKind::Activation => USER_BY_ACTIVATION_TOKEN,
            TokenKind::Reset => USER_BY_RESET_TOKEN,
        };
        let row = sqlx::query(sql)
            .bind(token)
            .fetch_optional(&mut self.conn)
            .await?;
        Ok(row.as_ref().map(user_row).transpose()?)
    }

    /// A digest of every row and column the import reads, computed by the
    /// database: the row count and the sum of each row's 64-bit hash cross
    /// the wire, not the rows. A sum needs no sort, so it costs one scan of
    /// each table. Equal digests of two snapshots mean nothing the import
    /// reads changed between them (a row's `NULL` and empty text differ here
    /// too).
    pub async fn fingerprint(&mut self) -> Result<String, ImportError> {
        let row = sqlx::query(
            "SELECT count(*) || ':' || coalesce(sum(hashtextextended(r, 0)::numeric), 0) FROM ( \
               SELECT 'u' || ROW(u.id, u.created_time, u.tenant_id, u.customer_id, u.email, \
                 u.authority, u.first_name, u.last_name, u.phone, u.additional_info, \
                 c.enabled, c.password, c.activate_token, c.activate_token_exp_time, \
                 c.reset_token, c.reset_token_exp_time, c.user_id, cu.id, cu.tenant_id)::text AS r \
                 FROM tb_user u LEFT JOIN user_credentials c ON c.user_id = u.id \
                 LEFT JOIN customer cu ON cu.id = u.customer_id \
               UNION ALL SELECT 'k' || ROW(id, created_time, tenant_id, user_id, value, enabled, \
                 expiration_time, description)::text FROM api_key \
               UNION ALL SELECT 's' || ROW(tenant_id, json_value)::text \
                 FROM admin_settings WHERE key = 'jwt') rows",
        )
        .fetch_one(&mut self.conn)
        .await?;
        Ok(row.try_get(0)?)
    }

    /// Every API key, by id.
    pub fn keys(&mut self) -> impl Stream<Item = Result<KeyRow, ImportError>> + '_ {
        sqlx::query(
            "SELECT id::text, created_time, tenant_id::text, user_id::text, value, enabled, \
             expiration_time, description FROM api_key ORDER BY id",
        )
        .fetch(&mut self.conn)
        .map(|row| Ok(key_row(&row?)?))
    }

    /// Ends the read-only transaction and the connection.
    pub async fn close(mut self) {
        let _ = sqlx::raw_sql("ROLLBACK").execute(&mut self.conn).await;
        let _ = self.conn.close().await;
    }
}

fn user_row(row: &PgRow) -> Result<UserRow, sqlx::Error> {
    Ok(UserRow {
        id: row.try_get(0)?,
        created_time: row.try_get(1)?,
        tenant_id: row.try_get(2)?,
        customer_id: row.try_get(3)?,
        email: row.try_get(4)?,
        authority: row.try_get(5)?,
        first_name: row.try_get(6)?,
        last_name: row.try_get(7)?,
        phone: row.try_get(8)?,
        additional_info: row.try_get(9)?,
        enabled: row.try_get(10)?,
        password: row.try_get(11)?,
        activate_token: row.try_get(12)?,
        activate_token_exp_time: row.try_get(13)?,
        reset_token: row.try_get(14)?,
        reset_token_exp_time: row.try_get(15)?,
        has_credentials: row.try_get(16)?,
        customer_found: row.try_get(17)?,
        customer_tenant_id: row.try_get(18)?,
    })
}

fn key_row(row: &PgRow) -> Result<KeyRow, sqlx::Error> {
    Ok(KeyRow {
        id: row.try_get(0)?,
        created_time: row.try_get(1)?,
        tenant_id: row.try_get(2)?,
        user_id: row.try_get(3)?,
        value: row.try_get(4)?,
        enabled: row.try_get(5)?,
        expiration_time: row.try_get(6)?,
        description: row.try_get(7)?,
    })
}

/// An error's message and its causes on one line.
fn one_line(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause = cause.to_string();
        if !text.contains(&cause) {
            text.push_str(": ");
            text.push_str(&cause);
        }
        source = cause_of(source);
    }
    text.replace('\n', " ")
}

fn cause_of<'a>(
    error: Option<&'a (dyn std::error::Error + 'static)>,
) -> Option<&'a (dyn std::error::Error + 'static)> {
    error.and_then(|e| e.source())
}
