//! The `sessions` table: login sessions, their refresh-token rotation, and
//! ending them.

use sqlx::{AssertSqlSafe, Row};
use uuid::Uuid;

use super::revocation::Change;
use super::{Store, StoreError, flag, uuid_col};
use crate::vocab::revocation::{Published, Revocation};

/// A login session. Times are epoch ms.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionRecord {
    pub id: Uuid,
    pub user_id: Uuid,
    pub created_time: i64,
    pub ended: bool,
    pub refresh_jti: String,
    /// When the refresh token last rotated (at first, the creation time): the
    /// current refresh token expires one refresh lifetime after it.
    pub refreshed_time: i64,
    /// When the session ended; 0 while it is live.
    pub ended_time: i64,
}

impl SessionRecord {
    /// A new live session of `user_id`, opened at `now_ms`.
    pub fn open(user_id: Uuid, now_ms: i64, refresh_jti: String) -> SessionRecord {
        SessionRecord {
            id: Uuid::new_v4(),
            user_id,
            created_time: now_ms,
            ended: false,
            refresh_jti,
            refreshed_time: now_ms,
            ended_time: 0,
        }
    }
}

const SESSION_COLUMNS: &str =
    "id, user_id, created_time, ended, refresh_jti, refreshed_time, ended_time";
/// Ends every live session of `user_id` at `now_ms`, but `keep` (the session
/// that made the change, which goes on), in the caller's transaction.
/// Sessions that ended before keep their own end time. The one way a change
/// to a user (password, lockout, disabling, second factor, ...) ends their
/// sessions; the caller publishes [`Revocation::User`] so that every replica
/// drops what it cached of them.
pub(super) async fn end_sessions_of_user(
    conn: &mut sqlx::AnyConnection,
    user_id: Uuid,
    now_ms: i64,
    keep: Option<Uuid>,
) -> Result<(), StoreError> {
    sqlx::query(
        "UPDATE sessions SET ended = 1, ended_time = $1 \
         WHERE user_id = $2 AND ended = 0 AND id <> $3",
    )
    .bind(now_ms)
    .bind(user_id.to_string())
    .bind(keep.map(|id| id.to_string()).unwrap_or_default())
    .execute(conn)
    .await?;
    Ok(())
}

/// Outdates what `user_id` holds but their API keys, in the caller's
/// transaction: every token issued before `now_secs` is outdated and every
/// session ends then. The one way a change to a user (a password set, a
/// lockout, disabling, an activation, a change the platform made) ends
/// their tokens; the caller publishes [`Revocation::User`] so that every
/// replica drops what it cached of them.
pub(super) async fn outdate_user(
    conn: &mut sqlx::AnyConnection,
    user_id: Uuid,
    now_secs: i64,
) -> Result<(), StoreError> {
    sqlx::query("UPDATE users SET tokens_valid_after = $1 WHERE id = $2")
        .bind(now_secs)
        .bind(user_id.to_string())
        .execute(&mut *conn)
        .await?;
    end_sessions_of_user(conn, user_id, now_secs.saturating_mul(1000), None).await
}

impl Store {
    pub async fn insert_session(&self, session: &SessionRecord) -> Result<(), StoreError> {
        let sql =
            format!("INSERT INTO sessions ({SESSION_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7)");
        sqlx::query(AssertSqlSafe(sql))
            .bind(session.id.to_string())
            .bind(session.user_id.to_string())
            .bind(session.created_time)
            .bind(i64::from(session.ended))
            .bind(&session.refresh_jti)
            .bind(session.refreshed_time)
            .bind(session.ended_time)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// `None` for a session that never existed and for one that was pruned:
    /// callers must treat both exactly like an ended session.
    pub async fn session_by_id(&self, id: Uuid) -> Result<Option<SessionRecord>, StoreError> {
        let sql = format!("SELECT {SESSION_COLUMNS} FROM sessions WHERE id = $1");
        let row = sqlx::query(AssertSqlSafe(sql))
            .bind(id.to_string())
            .fetch_optional(&self.pool)
            .await?;
        row.map(|r| {
            Ok(SessionRecord {
                id: uuid_col(&r, 0)?,
                user_id: uuid_col(&r, 1)?,
                created_time: r.try_get(2)?,
                ended: flag(&r, 3)?,
                refresh_jti: r.try_get(4)?,
                refreshed_time: r.try_get(5)?,
                ended_time: r.try_get(6)?,
            })
        })
        .transpose()
    }

    /// Ends a session at `now_ms`: every token of it stops working. A session
    /// that had ended already keeps its first end time.
    pub async fn end_session(&self, id: Uuid, now_ms: i64) -> Result<Published<bool>, StoreError> {
        self.revoking_write(|mut tx| async move {
            let result = sqlx::query(
                "UPDATE sessions SET ended = 1, \
                 ended_time = CASE WHEN ended = 1 THEN ended_time ELSE $1 END WHERE id = $2",
            )
            .bind(now_ms)
            .bind(id.to_string())
            .execute(&mut *tx)
            .await?;
            Change::unaudited(tx, result.rows_affected() > 0, Revocation::Session(id))
        })
        .await
    }

    /// Moves a live session from refresh token `old_jti` to `new_jti`, issued
    /// at `now_ms`. False when the session is ended or gone, or `old_jti` is no
    /// longer current (a retired refresh token came back, or a concurrent
    /// refresh won).
    pub(crate) async fn rotate_refresh(
        &self,
        session_id: Uuid,
        old_jti: &str,
        new_jti: &str,
        now_ms: i64,
    ) -> Result<bool, StoreError> {
        let result = sqlx::query(
            "UPDATE sessions SET refresh_jti = $1, refreshed_time = $4 \
             WHERE id = $2 AND refresh_jti = $3 AND ended = 0",
        )
        .bind(new_jti)
        .bind(session_id.to_string())
        .bind(old_jti)
        .bind(now_ms)
        .execute(&self.pool)
        .await?;
        Ok(result.rows_affected() == 1)
    }
}
