//! Revocations: the payload published when a change can end credentials, what
//! such a change returns, and the one way to make it (a revoking write).

use std::future::Future;

use uuid::Uuid;

use super::audit::Target;
use super::{Dialect, Store, StoreError};

/// A change that can end a credential. Published on PostgreSQL with
/// `NOTIFY` in the transaction that makes the change, so every replica drops
/// the affected cache entries when (and only when) it commits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Revocation {
    Key(Uuid),
    User(Uuid),
    Session(Uuid),
}

/// What a change that can end credentials did, and the revocation it
/// published, if any: other replicas get it by notification, this one applies
/// it to its own caches (`auth::revocation::apply`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Published<T> {
    pub outcome: T,
    pub revocation: Option<Revocation>,
}

/// The `LISTEN` / `NOTIFY` channel of revocations.
pub const REVOCATION_CHANNEL: &str = "keygate_revocations";

impl Revocation {
    pub fn payload(&self) -> String {
        match self {
            Revocation::Key(id) => format!("key:{id}"),
            Revocation::User(id) => format!("user:{id}"),
            Revocation::Session(id) => format!("session:{id}"),
        }
    }

    pub fn parse(payload: &str) -> Option<Revocation> {
        let (kind, id) = payload.split_once(':')?;
        let id = Uuid::parse_str(id).ok()?;
        match kind {
            "key" => Some(Revocation::Key(id)),
            "user" => Some(Revocation::User(id)),
            "session" => Some(Revocation::Session(id)),
            _ => None,
        }
    }
}

/// The transaction of a write.
pub(super) type Tx = sqlx::Transaction<'static, sqlx::Any>;

/// What the work of a revoking write did, with its transaction: the
/// outcome, the revocation to publish (if any) and the target whose audit
/// event to record (if any: when a row changed).
pub(super) struct Change<T> {
    tx: Tx,
    outcome: T,
    revocation: Option<Revocation>,
    audit: Option<Target>,
}

impl<T> Change<T> {
    /// The work's result. Returned as a `Result` so that the work's async
    /// block, which uses `?` on its statements, has its error type.
    pub fn new(
        tx: Tx,
        outcome: T,
        revocation: Option<Revocation>,
        audit: Option<Target>,
    ) -> Result<Change<T>, StoreError> {
        Ok(Change {
            tx,
            outcome,
            revocation,
            audit,
        })
    }
}

impl Change<bool> {
    /// `changed` (a row was affected) is the outcome; `revocation` is
    /// published either way, the event of `target` recorded only if changed.
    pub fn audited(
        tx: Tx,
        changed: bool,
        revocation: Revocation,
        target: Target,
    ) -> Result<Change<bool>, StoreError> {
        Change::new(tx, changed, Some(revocation), changed.then_some(target))
    }

    /// Like [`Change::audited`], for a change that records no audit event.
    pub(crate) fn unaudited(
        tx: Tx,
        changed: bool,
        revocation: Revocation,
    ) -> Result<Change<bool>, StoreError> {
        Change::new(tx, changed, Some(revocation), None)
    }
}

impl Store {
    /// Makes a change that can end credentials, in one transaction: `work`
    /// runs its statements and says what it did, then the revocation is
    /// published (PostgreSQL only: an SQLite store serves one replica, which
    /// invalidates its own caches), the audit event recorded, and all of it
    /// committed together. An error anywhere rolls everything back. Returns
    /// the revocation for the caller to apply here.
    pub(super) async fn revoking_write<T, F, Fut>(
        &self,
        work: F,
    ) -> Result<Published<T>, StoreError>
    where
        F: FnOnce(Tx) -> Fut,
        Fut: Future<Output = Result<Change<T>, StoreError>>,
    {
        let change = work(self.pool.begin().await?).await?;
        let mut tx = change.tx;
        if let Some(revocation) = change.revocation {
            self.publish(&mut tx, revocation).await?;
        }
        match change.audit {
            Some(target) => self.record(&mut tx, target).await?.commit(tx).await?,
            None => tx.commit().await?,
        }
        Ok(Published {
            outcome: change.outcome,
            revocation: change.revocation,
        })
    }

    /// Publishes a revocation inside a transaction (PostgreSQL only).
    async fn publish(
        &self,
        conn: &mut sqlx::AnyConnection,
        revocation: Revocation,
    ) -> Result<(), StoreError> {
        if self.dialect == Dialect::Postgres {
            sqlx::query("SELECT pg_notify($1, $2)")
                .bind(REVOCATION_CHANNEL)
                .bind(revocation.payload())
                .execute(conn)
                .await?;
        }
        Ok(())
    }
}
