//! Revocations: the payload published when a change can end credentials, and
//! what such a change returns.

use uuid::Uuid;

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

impl<T> Published<T> {
    pub(super) fn revoking(outcome: T, revocation: Revocation) -> Published<T> {
        Published {
            outcome,
            revocation: Some(revocation),
        }
    }
}

impl Store {
    /// Publishes a revocation inside a transaction (PostgreSQL only: an
    /// SQLite store serves one replica, which invalidates its own caches) and
    /// returns it, for the caller to apply here.
    pub(super) async fn publish(
        &self,
        conn: &mut sqlx::AnyConnection,
        revocation: Revocation,
    ) -> Result<Revocation, StoreError> {
        if self.dialect == Dialect::Postgres {
            sqlx::query("SELECT pg_notify($1, $2)")
                .bind(REVOCATION_CHANNEL)
                .bind(revocation.payload())
                .execute(conn)
                .await?;
        }
        Ok(revocation)
    }
}
