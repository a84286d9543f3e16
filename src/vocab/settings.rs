//! Values the configuration and the store share: how dead rows are pruned
//! (read from the configuration, applied by the store) and the public
//! customers (kept by the store, named by the configuration).

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
