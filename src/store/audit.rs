//! Audit events: who changed which user or API key, and when.
//!
//! A change made through a store returned by [`Store::audited`] writes its
//! event in the transaction of the change itself, so the two commit or fail
//! together: a full disk or a lost database never leaves a change without
//! its event, or an event for a change that did not happen. Once committed,
//! the event is also logged (target `keygate::audit`) for log pipelines.
//! Events never hold a secret.

use std::sync::Arc;

use sqlx::Row;
use sqlx::any::AnyRow;
use uuid::Uuid;

use super::rows::{Target, values};
use super::{Store, StoreError, uuid_col};
use crate::vocab::identity::{NULL_UUID, Principal};

/// Who makes a change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Actor {
    /// A user, through the REST API (or, activating their account, the user
    /// themself).
    User {
        id: Uuid,
        tenant_id: Uuid,
        email: String,
    },
    /// An operator, through keygate's command line.
    CommandLine,
    /// The platform, through the sync with its database
    /// (`[platform] database_url`).
    PlatformSync,
}

/// The change about to be made: its actor and action (`user.create`, ...).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Audit {
    actor: Actor,
    action: &'static str,
}

impl Audit {
    /// `principal` makes the change.
    pub fn by(principal: &Principal, action: &'static str) -> Audit {
        Audit {
            actor: Actor::User {
                id: principal.user_id,
                tenant_id: principal.tenant_id,
                email: principal.email.clone(),
            },
            action,
        }
    }

    /// A user makes the change without a verified identity of their own yet
    /// (activating their account with its token).
    pub(crate) fn by_user(id: Uuid, tenant_id: Uuid, email: &str, action: &'static str) -> Audit {
        Audit {
            actor: Actor::User {
                id,
                tenant_id,
                email: email.to_owned(),
            },
            action,
        }
    }

    /// An operator makes the change from the command line.
    pub fn command_line(action: &'static str) -> Audit {
        Audit {
            actor: Actor::CommandLine,
            action,
        }
    }

    /// The sync with the platform's database makes the change.
    pub fn platform_sync(action: &'static str) -> Audit {
        Audit {
            actor: Actor::PlatformSync,
            action,
        }
    }
}

/// One stored audit event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditEvent {
    pub id: Uuid,
    /// Epoch ms.
    pub created_time: i64,
    /// The acting user; the null UUID for the command line.
    pub actor_id: Uuid,
    /// The acting user's email, or `command-line`.
    pub actor: String,
    /// The acting user's tenant (the null UUID for none).
    pub tenant_id: Uuid,
    pub action: String,
    /// `USER`, `API_KEY` or `SIGNING_KEY`.
    pub target_type: String,
    pub target_id: Uuid,
    /// The grants of a key created scoped (JSON text); `None` otherwise.
    pub scopes: Option<String>,
}

impl AuditEvent {
    fn of(audit: &Audit, target: Target, scopes: Option<String>) -> AuditEvent {
        let (actor_id, actor, tenant_id) = match &audit.actor {
            Actor::User {
                id,
                tenant_id,
                email,
            } => (*id, email.clone(), *tenant_id),
            Actor::CommandLine => (NULL_UUID, "command-line".to_owned(), NULL_UUID),
            Actor::PlatformSync => (NULL_UUID, "platform-sync".to_owned(), NULL_UUID),
        };
        let (target_type, target_id) = match target {
            Target::User(id) => ("USER", id),
            Target::ApiKey(id) => ("API_KEY", id),
            Target::SigningKey(id) => ("SIGNING_KEY", id),
        };
        AuditEvent {
            id: Uuid::new_v4(),
            created_time: crate::clock::now_ms(),
            actor_id,
            actor,
            tenant_id,
            action: audit.action.to_owned(),
            target_type: target_type.to_owned(),
            target_id,
            scopes,
        }
    }

    /// The log line of a committed event.
    fn log(&self) {
        tracing::info!(
            target: "keygate::audit",
            event_id = %self.id,
            actor = %self.actor_id,
            actor_email = %self.actor,
            action = %self.action,
            target_type = %self.target_type,
            target = %self.target_id,
            scopes = self.scopes.as_deref(),
            at_ms = self.created_time,
            "audit"
        );
    }
}

/// The event written in a change's transaction, logged once it committed.
#[must_use]
pub(super) struct Pending(Option<AuditEvent>);

impl Pending {
    /// Commits the change's transaction, then logs its event.
    pub(super) async fn commit(
        self,
        tx: sqlx::Transaction<'_, sqlx::Any>,
    ) -> Result<(), StoreError> {
        tx.commit().await?;
        if let Some(event) = self.0 {
            event.log();
        }
        Ok(())
    }

    /// Commits a transaction of several changes, then logs their events.
    pub(super) async fn commit_all(
        events: Vec<Pending>,
        tx: sqlx::Transaction<'_, sqlx::Any>,
    ) -> Result<(), StoreError> {
        tx.commit().await?;
        for event in events.into_iter().filter_map(|p| p.0) {
            event.log();
        }
        Ok(())
    }
}

/// Which audit events a listing shows; `None` (or empty) matches all.
#[derive(Debug, Clone, Default)]
pub struct AuditFilter {
    /// Events at or after this epoch ms.
    pub since_ms: Option<i64>,
    /// Events of this action (`user.disable`, ...).
    pub action: Option<String>,
    /// Events whose actor has this email (any case).
    pub user_email: Option<String>,
    /// Events whose actor or target has this id.
    pub user_id: Option<Uuid>,
}

const AUDIT_COLUMNS: &str =
    "id, created_time, actor_id, actor, tenant_id, action, target_type, target_id, scopes";

impl Store {
    /// This store, recording `audit` with each change made through it.
    pub fn audited(&self, audit: Audit) -> Store {
        Store {
            audit: Some(Arc::new(audit)),
            ..self.clone()
        }
    }

    /// Records this store's audit event about a user on its own: something
    /// happened (a code was mailed, a second factor used) that changes no row.
    pub(crate) async fn record_user_event(&self, user_id: Uuid) -> Result<(), StoreError> {
        let mut tx = self.pool.begin().await?;
        let event = self.record(&mut tx, Target::User(user_id)).await?;
        event.commit(tx).await
    }

    /// [`Store::record_user_event`] about an API key.
    pub(crate) async fn record_key_event(&self, key_id: Uuid) -> Result<(), StoreError> {
        let mut tx = self.pool.begin().await?;
        let event = self.record(&mut tx, Target::ApiKey(key_id)).await?;
        event.commit(tx).await
    }

    /// Writes the audit event of a change to `target` in the change's
    /// transaction, when this store records one.
    pub(super) async fn record(
        &self,
        conn: &mut sqlx::AnyConnection,
        target: Target,
    ) -> Result<Pending, StoreError> {
        self.record_with_scopes(conn, target, None).await
    }

    /// [`Store::record`] of a key created with `scopes` (JSON text).
    pub(super) async fn record_with_scopes(
        &self,
        conn: &mut sqlx::AnyConnection,
        target: Target,
        scopes: Option<String>,
    ) -> Result<Pending, StoreError> {
        let Some(audit) = &self.audit else {
            return Ok(Pending(None));
        };
        let event = AuditEvent::of(audit, target, scopes);
        let sql = format!(
            "INSERT INTO audit_events ({AUDIT_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)"
        );
        sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(event.id.to_string())
            .bind(event.created_time)
            .bind(event.actor_id.to_string())
            .bind(&event.actor)
            .bind(event.tenant_id.to_string())
            .bind(&event.action)
            .bind(&event.target_type)
            .bind(event.target_id.to_string())
            .bind(event.scopes.clone())
            .execute(conn)
            .await?;
        Ok(Pending(Some(event)))
    }

    /// [`Store::record`] for several changes made in one transaction, in one
    /// statement.
    pub(super) async fn record_many(
        &self,
        conn: &mut sqlx::AnyConnection,
        targets: &[Target],
    ) -> Result<Vec<Pending>, StoreError> {
        let Some(audit) = &self.audit else {
            return Ok(Vec::new());
        };
        if targets.is_empty() {
            return Ok(Vec::new());
        }
        let events: Vec<AuditEvent> = targets
            .iter()
            .map(|target| AuditEvent::of(audit, *target, None))
            .collect();
        let sql = format!(
            "INSERT INTO audit_events ({AUDIT_COLUMNS}) VALUES {}",
            values(events.len(), 9)
        );
        let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
        for event in &events {
            query = query
                .bind(event.id.to_string())
                .bind(event.created_time)
                .bind(event.actor_id.to_string())
                .bind(event.actor.clone())
                .bind(event.tenant_id.to_string())
                .bind(event.action.clone())
                .bind(event.target_type.clone())
                .bind(event.target_id.to_string())
                .bind(event.scopes.clone());
        }
        query.execute(conn).await?;
        Ok(events.into_iter().map(|e| Pending(Some(e))).collect())
    }

    /// [`Store::record`] when the change happened (a row was affected).
    pub(super) async fn record_if(
        &self,
        conn: &mut sqlx::AnyConnection,
        changed: bool,
        target: Target,
    ) -> Result<Pending, StoreError> {
        if changed {
            self.record(conn, target).await
        } else {
            Ok(Pending(None))
        }
    }

    /// The latest `limit` audit events, newest first.
    pub async fn audit_events(&self, limit: u32) -> Result<Vec<AuditEvent>, StoreError> {
        let sql = format!("SELECT {AUDIT_COLUMNS} FROM audit_events ORDER BY seq DESC LIMIT $1");
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(i64::from(limit))
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(event_from_row).collect()
    }
}

impl Store {
    /// The latest `limit` audit events that `filter` matches, newest first.
    pub async fn audit_events_where(
        &self,
        filter: &AuditFilter,
        limit: u32,
    ) -> Result<Vec<AuditEvent>, StoreError> {
        let email = crate::email::fold(filter.user_email.as_deref().unwrap_or(""));
        let id = filter.user_id.map(|id| id.to_string()).unwrap_or_default();
        let any_user = email.is_empty() && id.is_empty();
        let action = filter.action.as_deref().unwrap_or("");
        let sql = format!(
            "SELECT {AUDIT_COLUMNS} FROM audit_events \
             WHERE created_time >= $1 AND ($2 = 1 OR action = $3) \
             AND ($4 = 1 OR LOWER(actor) = $5 OR actor_id = $6 OR target_id = $7) \
             ORDER BY seq DESC LIMIT $8"
        );
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(filter.since_ms.unwrap_or(i64::MIN))
            .bind(i64::from(action.is_empty()))
            .bind(action)
            .bind(i64::from(any_user))
            .bind(&email)
            .bind(&id)
            .bind(&id)
            .bind(i64::from(limit))
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(event_from_row).collect()
    }
}

fn event_from_row(row: &AnyRow) -> Result<AuditEvent, StoreError> {
    Ok(AuditEvent {
        id: uuid_col(row, 0)?,
        created_time: row.try_get(1)?,
        actor_id: uuid_col(row, 2)?,
        actor: row.try_get(3)?,
        tenant_id: uuid_col(row, 4)?,
        action: row.try_get(5)?,
        target_type: row.try_get(6)?,
        target_id: uuid_col(row, 7)?,
        scopes: row.try_get(8)?,
    })
}
