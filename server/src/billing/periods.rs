//! What makes up each billing period: the files of each (provider, billing account, period,
//! currency), which of them are in force and which were replaced, when and by what. The billing
//! page and `GET /api/v1/billing/periods` both read this.

use rust_decimal::Decimal;

use crate::store::bills::BillingFilePeriodRow;
use crate::store::{self, Store, StoreError};
use gpuledger_core::money::from_text;

#[derive(Debug, Clone, PartialEq)]
pub struct BillingPeriod {
    pub provider: String,
    pub billing_account_id: String,
    pub period_start_ms: i64,
    pub currency: String,
    /// In the order they were imported.
    pub files: Vec<BillingFilePeriodRow>,
    /// Over the files in force.
    pub rows: i64,
    pub billed_total: Decimal,
    pub effective_total: Decimal,
}

/// Groups per-file rows (as the store orders them: newest period first) into periods.
pub fn periods_of(rows: Vec<BillingFilePeriodRow>) -> Vec<BillingPeriod> {
    let mut out: Vec<BillingPeriod> = Vec::new();
    for row in rows {
        let same = |p: &BillingPeriod| {
            p.provider == row.provider
                && p.billing_account_id == row.billing_account_id
                && p.period_start_ms == row.billing_period_start_ms
                && p.currency == row.currency
        };
        let idx = match out.iter().position(same) {
            Some(i) => i,
            None => {
                out.push(BillingPeriod {
                    provider: row.provider.clone(),
                    billing_account_id: row.billing_account_id.clone(),
                    period_start_ms: row.billing_period_start_ms,
                    currency: row.currency.clone(),
                    files: Vec::new(),
                    rows: 0,
                    billed_total: Decimal::ZERO,
                    effective_total: Decimal::ZERO,
                });
                out.len() - 1
            }
        };
        let period = &mut out[idx];
        if row.replaced_ms.is_none() {
            period.rows += row.row_count;
            period.billed_total += row.billed_total.as_deref().map_or(Decimal::ZERO, from_text);
            period.effective_total += row
                .effective_total
                .as_deref()
                .map_or(Decimal::ZERO, from_text);
        }
        period.files.push(row);
    }
    out
}

/// Every billing period with the files that make it up.
pub async fn all(store: &dyn Store) -> Result<Vec<BillingPeriod>, StoreError> {
    Ok(periods_of(
        store::bills::billing_file_periods(store.db()).await?,
    ))
}

/// Every billing period's files, one row per file and period (what the billing page lists).
pub async fn file_rows(store: &dyn Store) -> Result<Vec<BillingFilePeriodRow>, StoreError> {
    store::bills::billing_file_periods(store.db()).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(id: i64, period: i64, cost: &str, replaced: Option<i64>) -> BillingFilePeriodRow {
        BillingFilePeriodRow {
            import_id: id,
            name: format!("part-{id}.csv"),
            source: "focus".into(),
            imported_ms: id,
            delivery: None,
            provider: "AWS".into(),
            billing_account_id: "1".into(),
            billing_period_start_ms: period,
            currency: "USD".into(),
            row_count: 2,
            billed_total: Some(cost.into()),
            effective_total: Some(cost.into()),
            replaced_ms: replaced,
            replaced_by: replaced.map(|_| 9),
        }
    }

    #[test]
    fn a_period_sums_only_the_files_in_force() {
        let periods = periods_of(vec![
            row(1, 200, "10.5", Some(7)),
            row(2, 200, "1.25", None),
            row(3, 200, "2", None),
            row(4, 100, "99", None),
        ]);
        assert_eq!(periods.len(), 2);
        assert_eq!(periods[0].files.len(), 3);
        assert_eq!(periods[0].billed_total, Decimal::new(325, 2));
        assert_eq!(periods[0].rows, 4);
        assert_eq!(periods[1].billed_total, Decimal::new(99, 0));
    }
}
