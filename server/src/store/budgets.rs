//! Budgets as admins set them: one row per owner key, dimension and first month.

use super::db::{on_backend, On};
use super::StoreError;

/// A budget row as stored (the amount is an exact decimal text).
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct BudgetRow {
    pub dimension: String,
    pub owner_key: String,
    pub from_month_ms: i64,
    pub amount: String,
    pub currency: String,
    pub set_by: String,
    pub set_ms: i64,
}

/// Sets a budget, replacing one for the same key, dimension and month.
pub async fn set_budget(on: impl Into<On<'_>>, b: &BudgetRow) -> Result<(), StoreError> {
    let mut conn = on.into().write().await?;
    on_backend!(conn, |ex| {
        sqlx::query(
            "INSERT INTO budgets (dimension, owner_key, from_month_ms, amount, currency, set_by,
                                  set_ms)
             VALUES ($1, $2, $3, $4, $5, $6, $7)
             ON CONFLICT (dimension, owner_key, from_month_ms) DO UPDATE SET
                amount = excluded.amount, currency = excluded.currency,
                set_by = excluded.set_by, set_ms = excluded.set_ms",
        )
        .bind(&b.dimension)
        .bind(&b.owner_key)
        .bind(b.from_month_ms)
        .bind(&b.amount)
        .bind(&b.currency)
        .bind(&b.set_by)
        .bind(b.set_ms)
        .execute(&mut *ex)
        .await?;
        Ok(())
    })
}

/// Removes the budget set for a key, dimension and month; false where there was none.
pub async fn delete_budget(
    on: impl Into<On<'_>>,
    dimension: &str,
    owner_key: &str,
    from_month_ms: i64,
) -> Result<bool, StoreError> {
    let mut conn = on.into().write().await?;
    on_backend!(conn, |ex| {
        let done = sqlx::query(
            "DELETE FROM budgets WHERE dimension = $1 AND owner_key = $2 AND from_month_ms = $3",
        )
        .bind(dimension)
        .bind(owner_key)
        .bind(from_month_ms)
        .execute(&mut *ex)
        .await?;
        Ok(done.rows_affected() == 1)
    })
}

/// Every budget set, by dimension, key and month.
pub async fn budgets(on: impl Into<On<'_>>) -> Result<Vec<BudgetRow>, StoreError> {
    let mut conn = on.into().read().await?;
    on_backend!(conn, |ex| {
        Ok(sqlx::query_as(
            "SELECT dimension, owner_key, from_month_ms, amount, currency, set_by, set_ms
             FROM budgets ORDER BY dimension, owner_key, from_month_ms",
        )
        .fetch_all(&mut *ex)
        .await?)
    })
}

/// Claims a budget threshold's alert for an owner's month: true only the first time, so one
/// replica announces it once.
pub async fn claim_alert(
    on: impl Into<On<'_>>,
    (dimension, owner_key, month_ms): (&str, &str, i64),
    basis: &str,
    percent: i64,
    now_ms: i64,
) -> Result<bool, StoreError> {
    let mut conn = on.into().write().await?;
    on_backend!(conn, |ex| {
        let done = sqlx::query(
            "INSERT INTO budget_alerts (dimension, owner_key, month_ms, basis, percent, sent_ms)
             VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT DO NOTHING",
        )
        .bind(dimension)
        .bind(owner_key)
        .bind(month_ms)
        .bind(basis)
        .bind(percent)
        .bind(now_ms)
        .execute(&mut *ex)
        .await?;
        Ok(done.rows_affected() == 1)
    })
}
