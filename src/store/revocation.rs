//! Revocations: the payload published when a change can end credentials, what
//! such a change returns, and the one way to make it (a revoking write).

use std::future::Future;

use sqlx::Row;
use uuid::Uuid;

use super::rows::Target;
use super::{Dialect, Store, StoreError, uuid_col};
use crate::vocab::revocation::{Published, REVOCATION_CHANNEL, Revocation};

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
    /// A change to `user_id` that happened or not (`changed`): when it did,
    /// it revokes what the user holds and is audited as theirs.
    pub fn of_user(tx: Tx, user_id: Uuid, changed: bool) -> Result<Change<bool>, StoreError> {
        Change::new(
            tx,
            changed,
            changed.then_some(Revocation::User(user_id)),
            changed.then_some(Target::User(user_id)),
        )
    }

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

/// At most this many audit events are read by one poll of
/// [`Store::revocations_after`]; the rest come at the next.
const POLL_BATCH: i64 = 1000;

impl Store {
    /// The sequence number of the newest audit event (0 for none): where a
    /// poll of [`Store::revocations_after`] starts.
    pub(crate) async fn last_audit_seq(&self) -> Result<i64, StoreError> {
        let row = sqlx::query("SELECT COALESCE(MAX(seq), 0) FROM audit_events")
            .fetch_one(&self.pool)
            .await?;
        Ok(row.try_get::<i64, _>(0)?)
    }

    /// The revocations the audit events written after `seq` can mean (a
    /// change to a user ends its credentials, a change to a key ends the
    /// key), with the sequence number to poll from next. On SQLite, where no
    /// notification crosses processes, this is how a server learns of a
    /// change another process (the command line) made: every change that can
    /// end a credential writes its event in its own transaction. One range
    /// read of the table's primary key; nothing new costs one index probe.
    pub(crate) async fn revocations_after(
        &self,
        seq: i64,
    ) -> Result<(i64, Vec<Revocation>), StoreError> {
        let rows = sqlx::query(
            "SELECT seq, target_type, target_id FROM audit_events \
             WHERE seq > $1 ORDER BY seq LIMIT $2",
        )
        .bind(seq)
        .bind(POLL_BATCH)
        .fetch_all(&self.pool)
        .await?;
        let mut last = seq;
        let mut revocations = Vec::new();
        for row in &rows {
            last = last.max(row.try_get::<i64, _>(0)?);
            let target_type: String = row.try_get(1)?;
            let target = uuid_col(row, 2)?;
            let revocation = match target_type.as_str() {
                "USER" => Revocation::User(target),
                "API_KEY" => Revocation::Key(target),
                _ => continue,
            };
            if !revocations.contains(&revocation) {
                revocations.push(revocation);
            }
        }
        Ok((last, revocations))
    }
}
