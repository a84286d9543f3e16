//! The `public_customers` table: the platform's customers marked public, as
//! `keygate import platform` last found them.

use uuid::Uuid;

use super::{Store, StoreError, uuid_col};
pub use crate::vocab::settings::PublicCustomer;

impl Store {
    /// The public customer `customer_id`, if it is one.
    pub async fn public_customer(
        &self,
        customer_id: Uuid,
    ) -> Result<Option<PublicCustomer>, StoreError> {
        let row = sqlx::query("SELECT tenant_id FROM public_customers WHERE customer_id = $1")
            .bind(customer_id.to_string())
            .fetch_optional(&self.pool)
            .await?;
        row.map(|row| {
            Ok(PublicCustomer {
                customer_id,
                tenant_id: uuid_col(&row, 0)?,
            })
        })
        .transpose()
    }

    /// Every public customer, by id.
    pub async fn public_customers(&self) -> Result<Vec<PublicCustomer>, StoreError> {
        let rows =
            sqlx::query("SELECT customer_id, tenant_id FROM public_customers ORDER BY customer_id")
                .fetch_all(&self.pool)
                .await?;
        rows.iter()
            .map(|row| {
                Ok(PublicCustomer {
                    customer_id: uuid_col(row, 0)?,
                    tenant_id: uuid_col(row, 1)?,
                })
            })
            .collect()
    }

    /// Makes `customers` the public ones, in one transaction: a customer the
    /// platform no longer marks public stops opening public logins. The
    /// count of rows is the outcome.
    pub async fn replace_public_customers(
        &self,
        customers: &[PublicCustomer],
        now_ms: i64,
    ) -> Result<usize, StoreError> {
        let mut tx = self.pool.begin().await?;
        sqlx::query("DELETE FROM public_customers")
            .execute(&mut *tx)
            .await?;
        for customer in customers {
            sqlx::query(
                "INSERT INTO public_customers (customer_id, tenant_id, imported_time) VALUES ($1, $2, $3)",
            )
            .bind(customer.customer_id.to_string())
            .bind(customer.tenant_id.to_string())
            .bind(now_ms)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(customers.len())
    }
}
