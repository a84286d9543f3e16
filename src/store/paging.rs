//! Paged listings: which slice a caller asks for, the page it gets, and the
//! one query that counts the matches and reads the slice.

use sqlx::any::AnyRow;
use sqlx::{AssertSqlSafe, Row};

use super::{Store, StoreError};

/// Which slice of a listing to return.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PageRequest {
    pub page_size: i64,
    pub page: i64,
    /// Case-insensitive substring filter.
    pub text_search: Option<String>,
    /// The order asked for; `None`: the listing's own.
    pub sort: Option<Sort>,
}

/// A `sortProperty` (as the platform names it) and its direction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sort {
    pub property: String,
    pub descending: bool,
}

/// One page of a listing and the total count of matching items.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Page<T> {
    pub data: Vec<T>,
    pub total: i64,
}

/// What a listing reads: `columns` of the rows of `table` that match
/// `filter` (` WHERE ...`, with `$n` placeholders for `binds`), in `order`.
pub(super) struct Listing {
    pub table: &'static str,
    pub columns: &'static str,
    pub filter: String,
    pub binds: Vec<String>,
    /// `ORDER BY` text built only from the listing's own column names.
    pub order: String,
}

/// `%text%` for `LIKE ... ESCAPE '\'`, with the pattern characters escaped.
pub(super) fn like_pattern(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('%');
    for c in text.to_lowercase().chars() {
        if matches!(c, '%' | '_' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('%');
    out
}

impl Store {
    /// The page `page` asks for of `listing`, each row read by `from_row`,
    /// with the count of every matching row.
    pub(super) async fn page<T>(
        &self,
        listing: Listing,
        page: &PageRequest,
        from_row: fn(&AnyRow) -> Result<T, StoreError>,
    ) -> Result<Page<T>, StoreError> {
        let Listing {
            table,
            columns,
            filter,
            binds,
            order,
        } = listing;
        let total = self.count(table, &filter, &binds).await?;
        let sql = format!(
            "SELECT {columns} FROM {table}{filter} ORDER BY {order} LIMIT {} OFFSET {}",
            page.page_size,
            page.page_size.saturating_mul(page.page)
        );
        let mut query = sqlx::query(AssertSqlSafe(sql));
        for bind in &binds {
            query = query.bind(bind.clone());
        }
        let rows = query.fetch_all(&self.pool).await?;
        let data = rows.iter().map(from_row).collect::<Result<_, _>>()?;
        Ok(Page { data, total })
    }

    async fn count(
        &self,
        table: &'static str,
        filter: &str,
        binds: &[String],
    ) -> Result<i64, StoreError> {
        let sql = format!("SELECT COUNT(*) FROM {table}{filter}");
        let mut query = sqlx::query(AssertSqlSafe(sql));
        for bind in binds {
            query = query.bind(bind.clone());
        }
        Ok(query.fetch_one(&self.pool).await?.try_get::<i64, _>(0)?)
    }
}

#[cfg(test)]
mod tests {
    use super::like_pattern;

    #[test]
    fn like_patterns_escape_wildcards() {
        assert_eq!(like_pattern("Ab"), "%ab%");
        assert_eq!(like_pattern("50%_x\\"), "%50\\%\\_x\\\\%");
    }
}
