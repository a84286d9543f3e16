//! The credential store: users, API keys (digests only), sessions and settings.
//!
//! One implementation over sqlx's `Any` driver serves both SQLite (the embedded
//! default) and PostgreSQL; the SQL is written once in the common dialect, and
//! each dialect has its own migrations. Multi-row changes run in transactions.
//!
//! This file holds the [`Store`] itself (connecting, the runtime it lives on,
//! closing, health), its errors and the `settings` table. Each other table
//! has a home of its own:
//!
//! - `users.rs`: users, and the customer id each tenant claims;
//! - `keys.rs`: API keys;
//! - `sessions.rs`: login sessions and their refresh tokens;
//! - `logins.rs`: password changes and the lockouts of failed logins;
//! - `activation.rs`: one-time activation tokens;
//! - `sso_states.rs`: the single sign-on states already used;
//! - `two_factor.rs`: users' second factors (sealed or digested);
//! - `audit.rs`: audit events, written in the transaction of their change;
//! - `signing_keys.rs`: the keys that sign identity assertions to upstreams;
//! - `revocation.rs`: what a change that ends credentials publishes, and the
//!   one helper every such change goes through;
//! - `paging.rs`: paged listings;
//! - `platform.rs`: what was imported from the platform, and its signing
//!   settings;
//! - `migrate.rs`, `prune.rs` and `retention.rs`: the schema, and deleting
//!   dead rows.
//!
//! Beneath them, `db.rs` holds the pool and keeps each query to one
//! transaction when `store.url` reaches a transaction pooler.

mod activation;
mod audit;
mod db;
mod first_run;
mod keys;
mod logins;
mod migrate;
mod paging;
mod platform;
mod postgres_tls;
mod prune;
mod public_customers;
mod reset;
pub mod retention;
mod revocation;
mod rows;
mod sessions;
mod signing_keys;
mod sso_states;
mod two_factor;
mod users;

pub use crate::vocab::revocation::{Published, REVOCATION_CHANNEL, Revocation};
pub use activation::{ACTIVATION_RENEW_MS, ACTIVATION_TTL_MS, ActivationToken};
pub use audit::{Actor, Audit, AuditEvent, AuditFilter};
pub use migrate::Pending;
pub use paging::{Page, PageRequest, Sort};
pub use platform::{
    KeyUpdate, PlatformKey, PlatformUser, ResetUpdate, RowKind, SyncLock, UserUpdate,
};
pub use prune::PruneKind;
pub use public_customers::PublicCustomer;
pub use reset::{MailedToken, ResetToken};
pub use rows::{ApiKeyRecord, UserRecord};
pub use sessions::SessionRecord;
pub use signing_keys::SigningKeyRecord;
pub use two_factor::TwoFactorRecord;
pub use users::{USER_SORT_PROPERTIES, UserScope};

use std::path::Path;
use std::time::Duration;

use sqlx::Row;
use sqlx::any::{AnyPoolOptions, AnyRow};
use uuid::Uuid;

use crate::vocab::settings::Pooler;
use db::Db;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("store: {0}")]
    Db(#[from] sqlx::Error),
    #[error("store: a record with this {0} already exists")]
    Conflict(&'static str),
    #[error("store: corrupt row: {0}")]
    Corrupt(String),
    #[error("store: {0}")]
    Setup(String),
    #[error("store: the customer id belongs to another tenant")]
    ForeignCustomer,
    /// The SQLite file to open does not exist and was not to be created.
    #[error("no store at {0}")]
    Missing(String),
    /// PostgreSQL could not be reached: where, and why, in one line.
    #[error("{0}")]
    Unreachable(String),
    /// The schema lacks migrations that were not to be applied here.
    #[error("store: the schema is behind, {} pending: {}", .0.len(), pending_list(.0))]
    Behind(Vec<Pending>),
}

/// `0012_reset_tokens, 0013_password_rehashed_from`.
pub fn pending_list(pending: &[Pending]) -> String {
    pending
        .iter()
        .map(Pending::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// How [`Store::open`] connects.
#[derive(Debug, Clone)]
pub struct OpenOptions {
    pub max_connections: u32,
    /// Create a missing SQLite file and its directory (the server), or
    /// refuse (the management commands, which must not work on a new,
    /// empty store by mistake).
    pub create: bool,
    /// How long reaching PostgreSQL may take.
    pub connect_timeout: Duration,
    /// What the URL reaches: PostgreSQL, or a transaction pooler
    /// (`store.pooler`).
    pub pooler: Pooler,
    /// A direct PostgreSQL URL migrations run over (`store.notify_url`);
    /// `None`: the store's own URL.
    pub direct_url: Option<String>,
}

impl OpenOptions {
    /// What the server uses: create the store when missing, wait 10 s.
    pub fn server(max_connections: u32) -> OpenOptions {
        OpenOptions {
            max_connections,
            create: true,
            connect_timeout: Duration::from_secs(10),
            pooler: Pooler::None,
            direct_url: None,
        }
    }

    /// The same, reaching the store through `pooler`, migrating over
    /// `direct_url` when there is one.
    pub fn through(mut self, pooler: Pooler, direct_url: Option<String>) -> OpenOptions {
        self.pooler = pooler;
        self.direct_url = direct_url;
        self
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    Sqlite,
    Postgres,
}

#[derive(Clone)]
pub struct Store {
    pool: Db,
    dialect: Dialect,
    /// Recorded with each change made through this store ([`Store::audited`]).
    audit: Option<std::sync::Arc<Audit>>,
    /// The runtime the store was opened on ([`Store::at_home`]).
    home: Option<tokio::runtime::Handle>,
    /// PostgreSQL: the URL's `sslmode`.
    ssl_mode: Option<&'static str>,
    /// A direct PostgreSQL URL migrations run over (`store.notify_url`).
    direct_url: Option<String>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("dialect", &self.dialect)
            .finish()
    }
}

impl Store {
    /// Connects, creating the SQLite file and its directory when needed, and
    /// applies pending migrations.
    pub async fn connect(url: &str, max_connections: u32) -> Result<Store, StoreError> {
        Store::open(url, OpenOptions::server(max_connections)).await
    }

    /// Connects as `options` say and applies pending migrations.
    pub async fn open(url: &str, options: OpenOptions) -> Result<Store, StoreError> {
        Store::connect_through(url, options, i64::MAX).await
    }

    /// Like [`Store::open`], applying migrations up to version `last` only.
    async fn connect_through(url: &str, open: OpenOptions, last: i64) -> Result<Store, StoreError> {
        let store = Store::open_as_is(url, open).await?;
        store.migrate_through(last).await?;
        Ok(store)
    }

    /// Applies the pending migrations up to version `last`: over the direct
    /// URL when there is one (a pool of one connection, closed after),
    /// else over the store's pool.
    async fn migrate_through(&self, last: i64) -> Result<(), StoreError> {
        let Some(direct) = &self.direct_url else {
            return migrate::run_through(&self.pool, self.dialect, last).await;
        };
        let options = OpenOptions::server(1);
        let direct = Store::open_as_is(direct, options).await?;
        let applied = migrate::run_through(&direct.pool, direct.dialect, last).await;
        direct.close().await;
        applied
    }

    /// Connects as `options` say and applies nothing: a schema that lacks
    /// migrations is refused with [`StoreError::Behind`], naming them. For a
    /// server whose migrations run as their own step before it starts.
    pub async fn open_current(url: &str, options: OpenOptions) -> Result<Store, StoreError> {
        let store = Store::open_as_is(url, options).await?;
        let pending = store.pending_migrations().await?;
        if pending.is_empty() {
            return Ok(store);
        }
        store.close().await;
        Err(StoreError::Behind(pending))
    }

    /// Applies every pending migration; returns those it found pending (a
    /// replica migrating at the same time may have applied some of them).
    pub async fn migrate(&self) -> Result<Vec<Pending>, StoreError> {
        let pending = self.pending_migrations().await?;
        self.migrate_through(i64::MAX).await?;
        Ok(pending)
    }

    /// The migrations this binary has that the store lacks, in order.
    pub async fn pending_migrations(&self) -> Result<Vec<Pending>, StoreError> {
        migrate::pending(&self.pool, self.dialect).await
    }

    /// Checks what can be checked of `store.notify_url` before connecting:
    /// the CA file its `sslrootcert` names, read as `store.url`'s is.
    pub fn check_notify_url(url: &str) -> Result<(), StoreError> {
        postgres_tls::check_root_cert(url)
            .map_err(|error| StoreError::Setup(format!("store.notify_url: {error}")))
    }

    /// Every migration this binary has for the store at `url` (by its
    /// scheme): what a store that does not exist yet lacks.
    pub fn migrations_for(url: &str) -> Vec<Pending> {
        let dialect = if url.starts_with("sqlite:") {
            Dialect::Sqlite
        } else {
            Dialect::Postgres
        };
        migrate::every(dialect)
    }

    /// Connects as `options` say, without touching the schema.
    pub async fn open_as_is(url: &str, open: OpenOptions) -> Result<Store, StoreError> {
        sqlx::any::install_default_drivers();
        let (dialect, url) = if let Some(rest) = url.strip_prefix("sqlite:") {
            let path = rest.trim_start_matches("//");
            let file = path.split('?').next().unwrap_or_default();
            let on_disk = !file.is_empty() && file != ":memory:";
            if on_disk && !open.create && !Path::new(file).is_file() {
                return Err(StoreError::Missing(file.to_owned()));
            }
            if on_disk
                && open.create
                && let Some(parent) = Path::new(file)
                    .parent()
                    .filter(|p| !p.as_os_str().is_empty())
            {
                std::fs::create_dir_all(parent).map_err(|e| {
                    StoreError::Setup(format!("creating {}: {e}", parent.display()))
                })?;
            }
            let url = if path.contains("mode=") {
                format!("sqlite://{path}")
            } else if path.contains('?') {
                format!("sqlite://{path}&mode=rwc")
            } else {
                format!("sqlite://{path}?mode=rwc")
            };
            (Dialect::Sqlite, url)
        } else {
            (Dialect::Postgres, url.to_string())
        };
        let ssl_mode = match dialect {
            Dialect::Postgres => {
                Some(reach_postgres(&url, open.connect_timeout, open.pooler).await?)
            }
            Dialect::Sqlite => None,
        };
        let pooler = match dialect {
            Dialect::Postgres => open.pooler,
            Dialect::Sqlite => Pooler::None,
        };
        let url = match pooler {
            Pooler::Transaction => db::pooled_url(&url),
            Pooler::None => url,
        };
        let mut options = AnyPoolOptions::new()
            .max_connections(open.max_connections)
            .acquire_timeout(open.connect_timeout);
        if dialect == Dialect::Sqlite {
            options = options.after_connect(|conn, _meta| {
                Box::pin(async move {
                    sqlx::raw_sql("PRAGMA busy_timeout = 5000; PRAGMA foreign_keys = ON;")
                        .execute(conn)
                        .await?;
                    Ok(())
                })
            });
        }
        let pool = options.connect(&url).await?;
        if dialect == Dialect::Sqlite {
            sqlx::raw_sql("PRAGMA journal_mode = WAL;")
                .execute(&pool)
                .await?;
        }
        Ok(Store {
            pool: Db::new(pool, pooler),
            dialect,
            audit: None,
            home: tokio::runtime::Handle::try_current().ok(),
            ssl_mode,
            direct_url: open.direct_url.filter(|_| dialect == Dialect::Postgres),
        })
    }

    pub(crate) fn dialect(&self) -> Dialect {
        self.dialect
    }

    /// Runs `work`, which uses this store, on the runtime the store was
    /// opened on. A PostgreSQL connection's socket belongs to the reactor of
    /// the runtime that opened it; connections are served on worker threads
    /// with runtimes of their own (`listener::workers`), which stop with the
    /// server, and a connection opened there would die with them while the
    /// pool still holds it. Work runs to its end even when its caller goes
    /// away (a client hanging up), so a change is never cut off halfway.
    /// Costs one task per call, against a store round trip.
    pub(crate) async fn at_home<T, F>(&self, work: F) -> Result<T, StoreError>
    where
        F: std::future::Future<Output = T> + Send + 'static,
        T: Send + 'static,
    {
        let Some(home) = &self.home else {
            return Ok(work.await);
        };
        match home.spawn(work).await {
            Ok(done) => Ok(done),
            Err(error) if error.is_panic() => std::panic::resume_unwind(error.into_panic()),
            Err(_) => Err(StoreError::Setup("the server is stopping".into())),
        }
    }

    /// Closes every connection; later queries fail. For shutdown and tests.
    pub async fn close(&self) {
        self.pool.close().await;
    }

    /// How the store is reached, for `check-config --connect`: "as a local
    /// file", or "over TLS (TLSv1.3, sslmode=verify-full)" / "without TLS
    /// (sslmode=prefer)" as a connection of the pool found it.
    pub async fn transport(&self) -> Result<String, StoreError> {
        let Some(mode) = self.ssl_mode else {
            return Ok("as a local file".into());
        };
        let version: String = sqlx::query(postgres_tls::TLS_VERSION_QUERY)
            .fetch_one(&self.pool)
            .await?
            .try_get(0)?;
        Ok(if version.is_empty() {
            format!("without TLS (sslmode={mode})")
        } else {
            format!("over TLS ({version}, sslmode={mode})")
        })
    }

    /// Answers when the store can serve a query.
    pub async fn ping(&self) -> Result<(), StoreError> {
        sqlx::query("SELECT 1").execute(&self.pool).await?;
        Ok(())
    }

    // --- settings -------------------------------------------------------------

    /// Returns the stored value, or stores `generated` when none exists yet.
    /// Safe when several replicas race: the first insert wins and all read it.
    pub(crate) async fn get_or_create_setting(
        &self,
        name: &str,
        generated: &str,
    ) -> Result<String, StoreError> {
        sqlx::query(
            "INSERT INTO settings (name, value) VALUES ($1, $2) ON CONFLICT (name) DO NOTHING",
        )
        .bind(name)
        .bind(generated)
        .execute(&self.pool)
        .await?;
        let row = sqlx::query("SELECT value FROM settings WHERE name = $1")
            .bind(name)
            .fetch_one(&self.pool)
            .await?;
        Ok(row.try_get::<String, _>(0)?)
    }
}

impl Store {
    /// A stored setting's value.
    pub(crate) async fn setting(&self, name: &str) -> Result<Option<String>, StoreError> {
        let row = sqlx::query("SELECT value FROM settings WHERE name = $1")
            .bind(name)
            .fetch_optional(&self.pool)
            .await?;
        row.map(|row| row.try_get::<String, _>(0))
            .transpose()
            .map_err(Into::into)
    }

    /// Stores a setting, replacing its value.
    pub(crate) async fn put_setting(&self, name: &str, value: &str) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO settings (name, value) VALUES ($1, $2) \
             ON CONFLICT (name) DO UPDATE SET value = excluded.value",
        )
        .bind(name)
        .bind(value)
        .execute(&self.pool)
        .await?;
        Ok(())
    }
}

/// Opens one connection to PostgreSQL first, within the connect timeout:
/// the pool would retry until its own timeout and then say only that it
/// timed out, naming neither the server nor the cause (a certificate that
/// does not verify included). Returns the URL's `sslmode`.
async fn reach_postgres(
    url: &str,
    timeout: Duration,
    pooler: Pooler,
) -> Result<&'static str, StoreError> {
    use sqlx::Connection;
    use sqlx::postgres::{PgConnectOptions, PgConnection};
    let options: PgConnectOptions = url
        .parse()
        .map_err(|e| StoreError::Setup(format!("the store URL is not a PostgreSQL URL: {e}")))?;
    // Reaching the server is what is checked here.
    let options = quiet(options, pooler);
    postgres_tls::check_root_cert(url)?;
    let place = postgres_place(&options);
    let cause = match tokio::time::timeout(timeout, PgConnection::connect_with(&options)).await {
        Ok(Ok(connection)) => {
            let _ = connection.close().await;
            return Ok(postgres_tls::mode_name(&options));
        }
        Ok(Err(error)) => connect_cause(&error),
        Err(_) => format!("no answer within {} s", timeout.as_secs_f32()),
    };
    Err(StoreError::Unreachable(format!(
        "cannot reach PostgreSQL at {place}: {cause}"
    )))
}

/// A connection's notices are not news: only warnings and worse are sent,
/// unless a transaction pooler (which refuses the `options` startup
/// parameter) stands between.
fn quiet(
    options: sqlx::postgres::PgConnectOptions,
    pooler: Pooler,
) -> sqlx::postgres::PgConnectOptions {
    match pooler {
        Pooler::None => options.options([("client_min_messages", "warning")]),
        Pooler::Transaction => options,
    }
}

/// `host:port, database "name"`: where a PostgreSQL URL points.
fn postgres_place(options: &sqlx::postgres::PgConnectOptions) -> String {
    let database = options.get_database().unwrap_or("(the user's default)");
    format!(
        "{}:{}, database \"{database}\"",
        options.get_host(),
        options.get_port()
    )
}

/// The cause of a failed connection in a few words: "connection refused",
/// or the server's own message (`database "x" does not exist`).
fn connect_cause(error: &sqlx::Error) -> String {
    match error {
        sqlx::Error::Io(io) => {
            let text = io.to_string();
            let text = text
                .rfind(" (os error ")
                .map_or(text.as_str(), |end| &text[..end]);
            let mut chars = text.chars();
            chars
                .next()
                .map(|first| first.to_lowercase().chain(chars).collect())
                .unwrap_or_default()
        }
        sqlx::Error::Database(db) => db.message().to_owned(),
        other => other.to_string(),
    }
}

/// Flags are stored as 0/1 integers in both dialects.
fn flag(row: &AnyRow, index: usize) -> Result<bool, StoreError> {
    Ok(row.try_get::<i64, _>(index)? != 0)
}

/// A unique-constraint violation as a conflict on `what`; any other error
/// as it is.
fn conflict_on(what: &'static str) -> impl Fn(sqlx::Error) -> StoreError {
    move |error| match error {
        sqlx::Error::Database(e) if e.is_unique_violation() => StoreError::Conflict(what),
        other => other.into(),
    }
}

fn uuid_col(row: &AnyRow, index: usize) -> Result<Uuid, StoreError> {
    let text: String = row.try_get(index)?;
    Uuid::parse_str(&text).map_err(|_| StoreError::Corrupt(format!("bad uuid {text:?}")))
}

#[cfg(test)]
mod tests;
