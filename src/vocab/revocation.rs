//! Revocations: what a change that can end credentials publishes, and what
//! it returns to its caller. The store makes and publishes them, `auth`
//! applies them to its caches and open sockets.

use uuid::Uuid;

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
#[must_use = "a revocation this replica has not applied leaves its caches and sockets serving it"]
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
