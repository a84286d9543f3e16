//! Schema migrations, embedded in the binary, applied in order at start.

use sqlx::Row;

use super::db::Db;

use super::{Dialect, StoreError};

/// (version, name, SQL) per dialect. Append only: never edit an applied one.
const SQLITE: &[(i64, &str, &str)] = &[
    (
        1,
        "init",
        include_str!("../../migrations/sqlite/0001_init.sql"),
    ),
    (
        2,
        "login_lockouts",
        include_str!("../../migrations/sqlite/0002_login_lockouts.sql"),
    ),
    (
        3,
        "activation_tokens",
        include_str!("../../migrations/sqlite/0003_activation_tokens.sql"),
    ),
    (
        4,
        "session_times",
        include_str!("../../migrations/sqlite/0004_session_times.sql"),
    ),
    (
        5,
        "audit_events",
        include_str!("../../migrations/sqlite/0005_audit_events.sql"),
    ),
    (
        6,
        "customer_tenants",
        include_str!("../../migrations/sqlite/0006_customer_tenants.sql"),
    ),
    (
        7,
        "signing_keys",
        include_str!("../../migrations/sqlite/0007_signing_keys.sql"),
    ),
    (
        8,
        "platform_rows",
        include_str!("../../migrations/sqlite/0008_platform_rows.sql"),
    ),
    (
        9,
        "two_factor",
        include_str!("../../migrations/sqlite/0009_two_factor.sql"),
    ),
    (
        10,
        "api_key_scopes",
        include_str!("../../migrations/sqlite/0010_api_key_scopes.sql"),
    ),
    (
        11,
        "public_customers",
        include_str!("../../migrations/sqlite/0011_public_customers.sql"),
    ),
    (
        12,
        "reset_tokens",
        include_str!("../../migrations/sqlite/0012_reset_tokens.sql"),
    ),
    (
        13,
        "password_rehashed_from",
        include_str!("../../migrations/sqlite/0013_password_rehashed_from.sql"),
    ),
    (
        14,
        "sso_used_states",
        include_str!("../../migrations/sqlite/0014_sso_used_states.sql"),
    ),
];
const POSTGRES: &[(i64, &str, &str)] = &[
    (
        1,
        "init",
        include_str!("../../migrations/postgres/0001_init.sql"),
    ),
    (
        2,
        "login_lockouts",
        include_str!("../../migrations/postgres/0002_login_lockouts.sql"),
    ),
    (
        3,
        "activation_tokens",
        include_str!("../../migrations/postgres/0003_activation_tokens.sql"),
    ),
    (
        4,
        "session_times",
        include_str!("../../migrations/postgres/0004_session_times.sql"),
    ),
    (
        5,
        "audit_events",
        include_str!("../../migrations/postgres/0005_audit_events.sql"),
    ),
    (
        6,
        "customer_tenants",
        include_str!("../../migrations/postgres/0006_customer_tenants.sql"),
    ),
    (
        7,
        "signing_keys",
        include_str!("../../migrations/postgres/0007_signing_keys.sql"),
    ),
    (
        8,
        "platform_rows",
        include_str!("../../migrations/postgres/0008_platform_rows.sql"),
    ),
    (
        9,
        "two_factor",
        include_str!("../../migrations/postgres/0009_two_factor.sql"),
    ),
    (
        10,
        "api_key_scopes",
        include_str!("../../migrations/postgres/0010_api_key_scopes.sql"),
    ),
    (
        11,
        "public_customers",
        include_str!("../../migrations/postgres/0011_public_customers.sql"),
    ),
    (
        12,
        "reset_tokens",
        include_str!("../../migrations/postgres/0012_reset_tokens.sql"),
    ),
    (
        13,
        "password_rehashed_from",
        include_str!("../../migrations/postgres/0013_password_rehashed_from.sql"),
    ),
    (
        14,
        "sso_used_states",
        include_str!("../../migrations/postgres/0014_sso_used_states.sql"),
    ),
];

/// How many migrations the dialect has.
#[cfg(test)]
pub fn count(dialect: Dialect) -> usize {
    all(dialect).len()
}

/// Every migration of the dialect, in order.
fn all(dialect: Dialect) -> &'static [(i64, &'static str, &'static str)] {
    match dialect {
        Dialect::Sqlite => SQLITE,
        Dialect::Postgres => POSTGRES,
    }
}

/// Every migration of the dialect, as names.
pub(crate) fn every(dialect: Dialect) -> Vec<Pending> {
    all(dialect)
        .iter()
        .map(|&(version, name, _)| Pending { version, name })
        .collect()
}

/// One migration the store has not applied yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pending {
    pub version: i64,
    pub name: &'static str,
}

impl std::fmt::Display for Pending {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:04}_{}", self.version, self.name)
    }
}

/// The migrations not yet recorded as applied, in order; every one on a
/// store that has none (no migrations table). Reads only: takes no lock
/// and creates nothing.
pub(crate) async fn pending(pool: &Db, dialect: Dialect) -> Result<Vec<Pending>, StoreError> {
    let exists = sqlx::query(table_exists(dialect))
        .fetch_one(pool)
        .await?
        .try_get::<i64, _>(0)?
        > 0;
    let applied: Vec<i64> = if exists {
        sqlx::query("SELECT version FROM keygate_migrations")
            .fetch_all(pool)
            .await?
            .iter()
            .map(|row| row.try_get::<i64, _>(0))
            .collect::<Result<_, _>>()?
    } else {
        Vec::new()
    };
    Ok(all(dialect)
        .iter()
        .filter(|(version, _, _)| !applied.contains(version))
        .map(|&(version, name, _)| Pending { version, name })
        .collect())
}

/// Counts the migrations table (0 or 1) in the store's schema.
fn table_exists(dialect: Dialect) -> &'static str {
    match dialect {
        Dialect::Sqlite => {
            "SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = 'keygate_migrations'"
        }
        Dialect::Postgres => {
            "SELECT COUNT(*) FROM pg_catalog.pg_tables WHERE tablename = 'keygate_migrations' AND schemaname = current_schema()"
        }
    }
}

/// Serialises replicas that migrate one PostgreSQL database at the same time.
const ADVISORY_LOCK: i64 = 7302154627;

/// Applies every migration up to version `last` (`i64::MAX`: all) not yet
/// recorded, each in its own transaction.
///
/// Replicas starting together apply each migration once: every step, the
/// creation of the migrations table included, runs in a transaction that
/// first takes the lock. PostgreSQL serialises on an advisory lock (a
/// `CREATE TABLE IF NOT EXISTS` run by two sessions at once is not safe:
/// both may find no table and one fails on the catalog's unique index);
/// SQLite takes the write lock up front (a deferred transaction could not
/// upgrade its read lock and would fail).
pub(crate) async fn run_through(pool: &Db, dialect: Dialect, last: i64) -> Result<(), StoreError> {
    let migrations = all(dialect);
    let mut tx = locked(pool, dialect).await?;
    // Created only when missing: PostgreSQL answers `CREATE TABLE IF NOT
    // EXISTS` on an existing table with a notice, logged on every start.
    let exists = sqlx::query(table_exists(dialect))
        .fetch_one(&mut *tx)
        .await?
        .try_get::<i64, _>(0)?
        > 0;
    if !exists {
        sqlx::raw_sql(
            "CREATE TABLE keygate_migrations (version BIGINT PRIMARY KEY, name TEXT NOT NULL, applied_at BIGINT NOT NULL)",
        )
        .execute(&mut *tx)
        .await?;
    }
    tx.commit().await?;
    for (version, name, sql) in migrations.iter().filter(|(version, _, _)| *version <= last) {
        let mut tx = locked(pool, dialect).await?;
        let applied = sqlx::query("SELECT COUNT(*) FROM keygate_migrations WHERE version = $1")
            .bind(*version)
            .fetch_one(&mut *tx)
            .await?
            .try_get::<i64, _>(0)?;
        if applied > 0 {
            tx.rollback().await?;
            continue;
        }
        sqlx::raw_sql(*sql).execute(&mut *tx).await?;
        sqlx::query(
            "INSERT INTO keygate_migrations (version, name, applied_at) VALUES ($1, $2, $3)",
        )
        .bind(*version)
        .bind(*name)
        .bind(crate::clock::now_ms())
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        tracing::info!(version, name, "applied store migration");
    }
    Ok(())
}

/// A transaction that holds the migration lock until it ends.
async fn locked(
    pool: &Db,
    dialect: Dialect,
) -> Result<sqlx::Transaction<'static, sqlx::Any>, StoreError> {
    let mut tx = match dialect {
        Dialect::Sqlite => pool.begin_with("BEGIN IMMEDIATE").await?,
        Dialect::Postgres => pool.begin().await?,
    };
    if dialect == Dialect::Postgres {
        sqlx::query("SELECT pg_advisory_xact_lock($1)")
            .bind(ADVISORY_LOCK)
            .execute(&mut *tx)
            .await?;
    }
    Ok(tx)
}
