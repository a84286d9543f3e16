//! Values the configuration and the store share: how dead rows are pruned
//! (read from the configuration, applied by the store), the public
//! customers (kept by the store, named by the configuration) and what
//! stands between keygate and PostgreSQL (`store.pooler`).

use std::time::Duration;

use uuid::Uuid;

/// How dead store rows are pruned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetentionSettings {
    /// Time between runs; `None` turns pruning off.
    pub interval: Option<Duration>,
    /// How long a session is kept once it is dead (ended, or its refresh
    /// token expired).
    pub sessions: Duration,
    /// How long an activation token is kept once it expired.
    pub activation_tokens: Duration,
    /// How long an audit event is kept.
    pub audit_events: Duration,
    /// Rows deleted by one statement.
    pub batch_size: u32,
    /// Rows of one kind deleted by one run.
    pub max_rows_per_run: u64,
}

/// A customer whose id opens a public login, and its tenant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PublicCustomer {
    pub customer_id: Uuid,
    pub tenant_id: Uuid,
}

/// What `store.url` reaches (`store.pooler`): PostgreSQL itself, or a pooler
/// that lends a server connection for one transaction at a time (PgBouncer's
/// `pool_mode = transaction`), where nothing may outlive a transaction: no
/// named prepared statement, no session setting, no `LISTEN`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Pooler {
    /// A session of its own per connection (PostgreSQL, or a pooler in
    /// session mode).
    #[default]
    None,
    /// A server connection per transaction.
    Transaction,
}

impl Pooler {
    /// The setting's value from its text; `None` when it is neither.
    pub fn parse(text: &str) -> Option<Pooler> {
        match text.trim() {
            "none" => Some(Pooler::None),
            "transaction" => Some(Pooler::Transaction),
            _ => None,
        }
    }
}
