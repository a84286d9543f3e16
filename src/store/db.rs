//! The store's connection pool, and how its queries keep to one transaction
//! when `store.url` reaches a transaction pooler (`store.pooler =
//! "transaction"`, PgBouncer's `pool_mode = transaction`).
//!
//! Such a pooler lends a server connection for one transaction and takes it
//! back at the first `ReadyForQuery` outside one. sqlx (0.9) runs a query
//! with arguments in two exchanges, each ended by a `Sync`: `Parse` and
//! `Describe`, then `Bind` and `Execute`. Outside a transaction the second
//! may reach another server connection than the first: there the statement
//! does not exist, or, unnamed, is another client's. And sqlx names the
//! statement (`sqlx_s_N`, counted per client connection) even with
//! `statement_cache_capacity(0)`: the cache is then off, but the statement
//! is still named, and never closed, so another client counting the same
//! names meets it on that server connection ("already exists").
//!
//! So, behind a transaction pooler:
//! - a query made on the pool runs in a transaction of its own, its
//!   statement unnamed ([`Unnamed`]): two more round trips, both
//!   exchanges on one server connection, nothing left behind;
//! - a transaction of the store's own begins with `DEALLOCATE ALL`: the
//!   named statements earlier transactions left on the server connection it
//!   was lent are gone before any of its own is parsed;
//! - the client's statement cache is off (`statement-cache-capacity=0`): a
//!   statement prepared on one server connection is not looked for on
//!   another.
//!
//! Without a pooler every call goes to sqlx's pool as it is.

use futures_util::{StreamExt, TryStreamExt};
use sqlx::any::{AnyArguments, AnyQueryResult, AnyRow, AnyStatement, AnyTypeInfo};
use sqlx::error::BoxDynError;
use sqlx::{Any, AnyPool, Either, Error, Execute, Executor, SqlStr, Transaction};

use crate::vocab::settings::Pooler;

/// What a store transaction begins with behind a transaction pooler.
const POOLED_BEGIN: &str = "BEGIN; DEALLOCATE ALL";

/// The store's pool, and whether it reaches a transaction pooler.
#[derive(Clone)]
pub(super) struct Db {
    pool: AnyPool,
    pooler: Pooler,
}

impl std::fmt::Debug for Db {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Db").field("pooler", &self.pooler).finish()
    }
}

impl Db {
    pub(super) fn new(pool: AnyPool, pooler: Pooler) -> Db {
        Db { pool, pooler }
    }

    /// A transaction; behind a transaction pooler one that starts clear of
    /// named statements.
    pub(super) async fn begin(&self) -> Result<Transaction<'static, Any>, Error> {
        match self.pooler {
            Pooler::None => self.pool.begin().await,
            Pooler::Transaction => self.pool.begin_with(POOLED_BEGIN).await,
        }
    }

    pub(super) fn pooler(&self) -> Pooler {
        self.pooler
    }

    /// A connection of the pool's own, for a session's work (not behind
    /// a transaction pooler, where the session is lent per transaction).
    pub(super) async fn acquire(&self) -> Result<sqlx::pool::PoolConnection<Any>, Error> {
        debug_assert_eq!(self.pooler, Pooler::None);
        self.pool.acquire().await
    }

    /// A transaction begun with `statement` (SQLite's `BEGIN IMMEDIATE`).
    pub(super) async fn begin_with(
        &self,
        statement: &'static str,
    ) -> Result<Transaction<'static, Any>, Error> {
        self.pool.begin_with(statement).await
    }

    pub(super) async fn close(&self) {
        self.pool.close().await;
    }
}

/// The SQL the URL of a pool behind a transaction pooler needs: the
/// client's statement cache off.
pub(super) fn pooled_url(url: &str) -> String {
    let separator = if url.contains('?') { '&' } else { '?' };
    format!("{url}{separator}statement-cache-capacity=0")
}

/// A query as it was asked, its statement unnamed: prepared, run and
/// forgotten within one exchange's transaction.
struct Unnamed<E>(E);

impl<'q, E: Execute<'q, Any>> Execute<'q, Any> for Unnamed<E> {
    fn sql(self) -> SqlStr {
        self.0.sql()
    }

    fn statement(&self) -> Option<&AnyStatement> {
        self.0.statement()
    }

    fn take_arguments(&mut self) -> Result<Option<AnyArguments>, BoxDynError> {
        self.0.take_arguments()
    }

    fn persistent(&self) -> bool {
        false
    }
}

type Item = Either<AnyQueryResult, AnyRow>;

/// Runs `query` in a transaction of its own, unnamed; the results are
/// collected before the transaction ends (the store's queries read pages).
async fn in_own_transaction<'q, E>(pool: AnyPool, query: E) -> Result<Vec<Item>, Error>
where
    E: 'q + Execute<'q, Any>,
{
    let mut tx = pool.begin().await?;
    let items = tx.fetch_many(Unnamed(query)).try_collect().await?;
    tx.commit().await?;
    Ok(items)
}

impl<'p> Executor<'p> for &'_ Db {
    type Database = Any;

    fn fetch_many<'e, 'q: 'e, E>(
        self,
        query: E,
    ) -> futures_util::stream::BoxStream<'e, Result<Item, Error>>
    where
        E: 'q + Execute<'q, Any>,
    {
        match self.pooler {
            Pooler::None => (&self.pool).fetch_many(query),
            Pooler::Transaction => {
                let pool = self.pool.clone();
                futures_util::stream::once(in_own_transaction(pool, query))
                    .map_ok(|items| futures_util::stream::iter(items.into_iter().map(Ok)))
                    .try_flatten()
                    .boxed()
            }
        }
    }

    fn fetch_optional<'e, 'q: 'e, E>(
        self,
        query: E,
    ) -> futures_util::future::BoxFuture<'e, Result<Option<AnyRow>, Error>>
    where
        E: 'q + Execute<'q, Any>,
    {
        match self.pooler {
            Pooler::None => (&self.pool).fetch_optional(query),
            Pooler::Transaction => {
                let pool = self.pool.clone();
                Box::pin(async move {
                    let items = in_own_transaction(pool, query).await?;
                    Ok(items.into_iter().find_map(|item| item.right()))
                })
            }
        }
    }

    fn prepare_with<'e>(
        self,
        sql: SqlStr,
        parameters: &'e [AnyTypeInfo],
    ) -> futures_util::future::BoxFuture<'e, Result<AnyStatement, Error>>
    where
        'p: 'e,
    {
        (&self.pool).prepare_with(sql, parameters)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pooled_url_turns_the_statement_cache_off_keeping_its_query() {
        assert_eq!(
            pooled_url("postgres://kg@pgbouncer:6432/keygate"),
            "postgres://kg@pgbouncer:6432/keygate?statement-cache-capacity=0"
        );
        assert_eq!(
            pooled_url("postgres://kg@pgbouncer/keygate?sslmode=require"),
            "postgres://kg@pgbouncer/keygate?sslmode=require&statement-cache-capacity=0"
        );
    }
}
