//! Bills: imported files, the billing periods each delivers (a newer delivery replaces an
//! older one), and their cost lines.

use super::db::{on_backend, On};
use super::StoreError;
use gpuledger_core::bill::{CommitmentPart, CostLine, FocusError};

/// Parsed lines on their way to storage, in chunks, with the first parse error last.
pub type LineChunks = tokio::sync::mpsc::Receiver<Result<Vec<CostLine>, FocusError>>;

/// The files of one delivery on their way to storage, each with its lines, one file at a time.
pub type BillFiles = tokio::sync::mpsc::Receiver<(NewImport, LineChunks)>;

/// A bill about to be stored.
#[derive(Debug, Clone)]
pub struct NewImport {
    pub source: String,
    pub name: String,
    pub content_sha256: String,
    pub imported_ms: i64,
    /// The export run the file came in (a manifest's execution or assembly id), if known.
    pub delivery: Option<String>,
}

/// One file's share of one billing period, for the billing page.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct BillingFilePeriodRow {
    pub import_id: i64,
    pub name: String,
    pub source: String,
    pub imported_ms: i64,
    pub delivery: Option<String>,
    pub provider: String,
    pub billing_account_id: String,
    pub billing_period_start_ms: i64,
    pub currency: String,
    pub row_count: i64,
    pub billed_total: Option<String>,
    pub effective_total: Option<String>,
    pub replaced_ms: Option<i64>,
    pub replaced_by: Option<i64>,
}

#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct BillingImportRow {
    pub id: i64,
    pub source: String,
    pub name: String,
    pub imported_ms: i64,
    pub row_count: i64,
    /// Lines of this import still in force (a newer export of a period replaces them).
    pub current_lines: i64,
    /// Its totals in each currency it was billed in, as imported.
    #[sqlx(skip)]
    pub totals: super::CurrencyTotals,
}

/// A stored cost line with every column it came with, for the FOCUS export.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct BillLine {
    pub provider: String,
    pub billing_account_id: String,
    pub billing_period_start_ms: i64,
    pub charge_period_start_ms: i64,
    pub charge_period_end_ms: i64,
    pub charge_category: String,
    pub resource_id: Option<String>,
    pub resource_key: Option<String>,
    pub billed_cost: String,
    pub effective_cost: String,
    pub list_cost: String,
    pub currency: String,
    pub pricing_category: String,
    pub commitment_discount_id: Option<String>,
    pub commitment_discount_status: Option<String>,
    pub service_name: Option<String>,
    pub sku_id: Option<String>,
    pub region: Option<String>,
    pub tags_json: String,
    pub extra_json: String,
}

/// Sums, once, the per-period totals of files imported before `billing_file_periods`
/// existed (its migration could count their lines but not sum decimal text exactly): done when
/// the database is opened, after its migrations, so that reading them never writes (pages may
/// read from a replica).
pub(crate) async fn backfill_file_period_totals(on: impl Into<On<'_>>) -> Result<(), StoreError> {
    let mut conn = on.into().write().await?;
    on_backend!(conn, |ex| {
        use gpuledger_core::money::{from_text, to_text};
        let missing: Vec<(i64, String, String, i64, String)> = sqlx::query_as(
            "SELECT import_id, provider, billing_account_id, billing_period_start_ms, currency
             FROM billing_file_periods WHERE billed_total IS NULL",
        )
        .fetch_all(&mut *ex)
        .await?;
        for (import_id, provider, account, period, currency) in missing {
            let amounts: Vec<(String, String)> = sqlx::query_as(
                "SELECT billed_cost, effective_cost FROM cost_lines
                 WHERE import_id = $1 AND provider = $2 AND billing_account_id = $3
                   AND billing_period_start_ms = $4 AND currency = $5",
            )
            .bind(import_id)
            .bind(&provider)
            .bind(&account)
            .bind(period)
            .bind(&currency)
            .fetch_all(&mut *ex)
            .await?;
            let billed: rust_decimal::Decimal = amounts.iter().map(|a| from_text(&a.0)).sum();
            let effective: rust_decimal::Decimal = amounts.iter().map(|a| from_text(&a.1)).sum();
            sqlx::query(
                "UPDATE billing_file_periods SET billed_total = $1, effective_total = $2
                 WHERE import_id = $3 AND provider = $4 AND billing_account_id = $5
                   AND billing_period_start_ms = $6 AND currency = $7",
            )
            .bind(to_text(billed))
            .bind(to_text(effective))
            .bind(import_id)
            .bind(&provider)
            .bind(&account)
            .bind(period)
            .bind(&currency)
            .execute(&mut *ex)
            .await?;
        }
        Ok(())
    })
}

/// Inserts one file's lines as they arrive; returns its per-period counts and totals.
pub(crate) async fn insert_bill_file(
    on: impl Into<On<'_>>,
    import_id: i64,
    file: &str,
    lines: &mut LineChunks,
    spans: &mut std::collections::HashSet<(i64, i64)>,
) -> Result<super::FilePeriods, StoreError> {
    let mut conn = on.into().write().await?;
    on_backend!(conn, |ex, DB| {
        use gpuledger_core::money::to_text;
        let mut periods = super::FilePeriods::new();
        while let Some(chunk) = lines.recv().await {
            let chunk = chunk.map_err(|error| StoreError::Rejected {
                file: file.to_owned(),
                error,
            })?;
            for l in &chunk {
                // Distinct charge periods: a month of hourly lines has a few hundred.
                spans.insert((l.charge_period_start_ms, l.charge_period_end_ms));
                let key = (
                    l.provider.as_str(),
                    l.billing_account_id.as_str(),
                    l.billing_period_start_ms,
                    l.currency.as_str(),
                );
                match periods
                    .iter_mut()
                    .find(|(p, _)| (p.0.as_str(), p.1.as_str(), p.2, p.3.as_str()) == key)
                {
                    Some((_, t)) => t.add(l),
                    None => {
                        let mut t = super::PeriodTotals::default();
                        t.add(l);
                        let key = (key.0.to_owned(), key.1.to_owned(), key.2, key.3.to_owned());
                        periods.push((key, t));
                    }
                }
            }
            // Multi-row inserts: 23 parameters a row stays under both backends' limits.
            for part in chunk.chunks(500) {
                let mut q = sqlx::QueryBuilder::<DB>::new(
                    "INSERT INTO cost_lines (import_id, line_no, provider, billing_account_id,
                        billing_period_start_ms, charge_period_start_ms, charge_period_end_ms,
                        charge_category, resource_id, resource_key, billed_cost, effective_cost,
                        list_cost, currency, pricing_category, commitment_discount_id,
                        commitment_discount_status, service_name, sku_id, region, instance_type,
                        tags_json, extra_json) ",
                );
                q.push_values(part, |mut b, l| {
                    b.push_bind(import_id)
                        .push_bind(l.line_no as i64)
                        .push_bind(&l.provider)
                        .push_bind(&l.billing_account_id)
                        .push_bind(l.billing_period_start_ms)
                        .push_bind(l.charge_period_start_ms)
                        .push_bind(l.charge_period_end_ms)
                        .push_bind(&l.charge_category)
                        .push_bind(&l.resource_id)
                        .push_bind(&l.resource_key)
                        .push_bind(to_text(l.billed_cost))
                        .push_bind(to_text(l.effective_cost))
                        .push_bind(to_text(l.list_cost))
                        .push_bind(&l.currency)
                        .push_bind(&l.pricing_category)
                        .push_bind(&l.commitment_discount_id)
                        .push_bind(&l.commitment_discount_status)
                        .push_bind(&l.service_name)
                        .push_bind(&l.sku_id)
                        .push_bind(&l.region)
                        .push_bind(&l.instance_type)
                        .push_bind(&l.tags_json)
                        .push_bind(&l.extra_json);
                });
                q.build().execute(&mut *ex).await?;
            }
        }
        for ((provider, account, period, currency), t) in &periods {
            sqlx::query(
                "INSERT INTO billing_file_periods (import_id, provider, billing_account_id,
                     billing_period_start_ms, currency, row_count, billed_total,
                     effective_total)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
            )
            .bind(import_id)
            .bind(provider)
            .bind(account)
            .bind(*period)
            .bind(currency)
            .bind(t.rows as i64)
            .bind(to_text(t.billed))
            .bind(to_text(t.effective))
            .execute(&mut *ex)
            .await?;
        }
        Ok(periods)
    })
}

/// A billing period as files cover it: provider, billing account, period start.
pub type Period = (String, String, i64);

/// One file of a delivery as stored: new, or imported before with the same content (then
/// nothing of it was stored again), with the periods it covers.
pub struct DeliveredFile {
    pub import_id: i64,
    pub name: String,
    pub source: String,
    pub periods: Vec<Period>,
}

/// What [`store_files`] stored: each file and what came of it, the charge periods of its new
/// lines, and when the newest file was imported.
pub struct StoredDelivery {
    pub files: Vec<DeliveredFile>,
    pub outcomes: Vec<super::ImportOutcome>,
    pub spans: std::collections::HashSet<(i64, i64)>,
    pub imported_ms: i64,
}

/// Stores the files of one delivery, each file's lines read as they are parsed, in one
/// transaction (a savepoint inside the caller's): what replaces what is the caller's to
/// decide ([`files_in_force`], [`replace_file_period`]). A file whose content was imported
/// before changes nothing (but counts as part of the delivery). A parse error rolls everything
/// back and comes back as [`StoreError::Rejected`].
pub async fn store_files(
    on: impl Into<On<'_>>,
    files: &mut BillFiles,
) -> Result<StoredDelivery, StoreError> {
    let mut conn = on.into().write().await?;
    on_backend!(conn, |ex| {
        use super::ImportOutcome;
        let mut tx = crate::store::db::begin_write(&mut *ex).await?;
        backfill_file_period_totals(&mut *tx).await?;
        let mut stored = StoredDelivery {
            files: Vec::new(),
            outcomes: Vec::new(),
            spans: Default::default(),
            imported_ms: 0,
        };
        while let Some((import, mut lines)) = files.recv().await {
            stored.imported_ms = stored.imported_ms.max(import.imported_ms);
            let existing: Option<(i64,)> =
                sqlx::query_as("SELECT id FROM billing_imports WHERE content_sha256 = $1")
                    .bind(&import.content_sha256)
                    .fetch_optional(&mut *tx)
                    .await?;
            if let Some((import_id,)) = existing {
                // Dropping `lines` stops its parser.
                let periods: Vec<Period> = sqlx::query_as(
                    "SELECT DISTINCT provider, billing_account_id, billing_period_start_ms
                     FROM billing_file_periods WHERE import_id = $1 AND replaced_ms IS NULL",
                )
                .bind(import_id)
                .fetch_all(&mut *tx)
                .await?;
                stored.files.push(DeliveredFile {
                    import_id,
                    name: import.name.clone(),
                    source: import.source.clone(),
                    periods,
                });
                stored
                    .outcomes
                    .push(ImportOutcome::AlreadyImported { import_id });
                continue;
            }
            // Counts and totals are known once the last line is read: written at the end.
            let (import_id,): (i64,) = sqlx::query_as(
                "INSERT INTO billing_imports (source, name, content_sha256, imported_ms,
                     row_count, delivery)
                 VALUES ($1, $2, $3, $4, 0, $5) RETURNING id",
            )
            .bind(&import.source)
            .bind(&import.name)
            .bind(&import.content_sha256)
            .bind(import.imported_ms)
            .bind(&import.delivery)
            .fetch_one(&mut *tx)
            .await?;
            let periods = insert_bill_file(
                &mut *tx,
                import_id,
                &import.name,
                &mut lines,
                &mut stored.spans,
            )
            .await?;
            let mut totals = super::CurrencyTotals::new();
            for ((_, _, _, currency), t) in &periods {
                let sum = totals.entry(currency.clone()).or_default();
                sum.rows += t.rows;
                sum.billed += t.billed;
                sum.effective += t.effective;
            }
            let rows: u64 = totals.values().map(|t| t.rows).sum();
            sqlx::query("UPDATE billing_imports SET row_count = $1 WHERE id = $2")
                .bind(rows as i64)
                .bind(import_id)
                .execute(&mut *tx)
                .await?;
            let mut covered: Vec<Period> =
                periods.into_iter().map(|(p, _)| (p.0, p.1, p.2)).collect();
            covered.sort();
            covered.dedup();
            stored.files.push(DeliveredFile {
                import_id,
                name: import.name.clone(),
                source: import.source.clone(),
                periods: covered,
            });
            stored.outcomes.push(ImportOutcome::Imported {
                import_id,
                replaced_lines: 0,
                rows,
                totals,
            });
        }
        tx.commit().await?;
        Ok(stored)
    })
}

/// The files in force (not replaced) for `period`: id, name and source.
pub async fn files_in_force(
    on: impl Into<On<'_>>,
    period: &Period,
) -> Result<Vec<(i64, String, String)>, StoreError> {
    let mut conn = on.into().read().await?;
    let (provider, account, start) = period;
    on_backend!(conn, |ex| {
        Ok(sqlx::query_as(
            "SELECT DISTINCT p.import_id, i.name, i.source
             FROM billing_file_periods p JOIN billing_imports i ON i.id = p.import_id
             WHERE p.provider = $1 AND p.billing_account_id = $2
               AND p.billing_period_start_ms = $3 AND p.replaced_ms IS NULL",
        )
        .bind(provider)
        .bind(account)
        .bind(*start)
        .fetch_all(&mut *ex)
        .await?)
    })
}

/// Replaces file `victim`'s part of `period` by file `by`, as of `now_ms`: its lines of the
/// period deleted, its share of the period marked replaced. How many lines went, and the charge
/// span they covered (whose hours are to be attributed again).
pub async fn replace_file_period(
    on: impl Into<On<'_>>,
    (victim, period): (i64, &Period),
    by: i64,
    now_ms: i64,
) -> Result<(u64, Option<(i64, i64)>), StoreError> {
    let mut conn = on.into().write().await?;
    let (provider, account, start) = period;
    on_backend!(conn, |ex| {
        let mut tx = crate::store::db::begin_write(&mut *ex).await?;
        let old: (Option<i64>, Option<i64>) = sqlx::query_as(
            "SELECT MIN(charge_period_start_ms), MAX(charge_period_end_ms) FROM cost_lines
             WHERE import_id = $1 AND provider = $2 AND billing_account_id = $3
               AND billing_period_start_ms = $4",
        )
        .bind(victim)
        .bind(provider)
        .bind(account)
        .bind(*start)
        .fetch_one(&mut *tx)
        .await?;
        let deleted = sqlx::query(
            "DELETE FROM cost_lines
             WHERE import_id = $1 AND provider = $2 AND billing_account_id = $3
               AND billing_period_start_ms = $4",
        )
        .bind(victim)
        .bind(provider)
        .bind(account)
        .bind(*start)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        sqlx::query(
            "UPDATE billing_file_periods SET replaced_ms = $1, replaced_by = $2
             WHERE import_id = $3 AND provider = $4 AND billing_account_id = $5
               AND billing_period_start_ms = $6",
        )
        .bind(now_ms)
        .bind(by)
        .bind(victim)
        .bind(provider)
        .bind(account)
        .bind(*start)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        let span = match old {
            (Some(a), Some(b)) => Some((a, b)),
            _ => None,
        };
        Ok((deleted, span))
    })
}

/// Of the first `sample` lines of file `import_id`, how many repeat a line of file `other` (the
/// same charge, resource, SKU, amounts, tags and columns), by the (import, charge period) index:
/// a few look-ups a sampled line.
pub async fn repeated_lines(
    on: impl Into<On<'_>>,
    (import_id, other): (i64, i64),
    sample: u32,
) -> Result<i64, StoreError> {
    let mut conn = on.into().read().await?;
    on_backend!(conn, |ex| {
        let (repeated,): (i64,) = sqlx::query_as(
            "SELECT COUNT(*) FROM cost_lines n
             WHERE n.import_id = $1 AND n.line_no <= $2 AND EXISTS (
               SELECT 1 FROM cost_lines o
               WHERE o.import_id = $3
                 AND o.charge_period_start_ms = n.charge_period_start_ms
                 AND o.charge_period_end_ms = n.charge_period_end_ms
                 AND o.provider = n.provider
                 AND o.billing_account_id = n.billing_account_id
                 AND COALESCE(o.resource_id, '') = COALESCE(n.resource_id, '')
                 AND COALESCE(o.sku_id, '') = COALESCE(n.sku_id, '')
                 AND o.charge_category = n.charge_category
                 AND o.billed_cost = n.billed_cost
                 AND o.effective_cost = n.effective_cost
                 AND o.tags_json = n.tags_json
                 AND o.extra_json = n.extra_json)",
        )
        .bind(import_id)
        .bind(i64::from(sample) + 1)
        .bind(other)
        .fetch_one(&mut *ex)
        .await?;
        Ok(repeated)
    })
}

/// Marks to be attributed again the hours whose attribution a bill's change moves: those of
/// the charge `spans` (new lines and replaced ones), and the estimated hours after them (each
/// estimated at what the bill last charged its host, which these lines may have moved).
pub async fn mark_hours_of_spans(
    on: impl Into<On<'_>>,
    spans: &[(i64, i64)],
) -> Result<(), StoreError> {
    let mut conn = on.into().write().await?;
    on_backend!(conn, |ex| {
        let mut tx = crate::store::db::begin_write(&mut *ex).await?;
        let mut hours = super::hours_of_spans(spans);
        if let Some(last_end) = spans.iter().map(|s| s.1).max() {
            let estimated: Vec<(i64,)> = sqlx::query_as(
                "SELECT DISTINCT hour_ms FROM rollup_host_hours
                 WHERE hour_ms >= $1 AND hour_ms < $2 AND estimated = 1",
            )
            .bind(gpuledger_core::time::hour_floor(last_end))
            .bind(last_end + gpuledger_core::bill::LAST_BILLED_LOOKBACK_MS)
            .fetch_all(&mut *tx)
            .await?;
            hours.extend(estimated.into_iter().map(|(h,)| h));
            hours.sort_unstable();
            hours.dedup();
        }
        super::rollups::mark_dirty(&mut *tx, &hours, super::BILLING_MARK_HOST).await?;
        tx.commit().await?;
        Ok(())
    })
}

/// Every file's share of every billing period, by provider, account and period.
pub async fn billing_file_periods(
    on: impl Into<On<'_>>,
) -> Result<Vec<super::BillingFilePeriodRow>, StoreError> {
    let mut conn = on.into().read().await?;
    on_backend!(conn, |ex| {
        Ok(sqlx::query_as(
            "SELECT p.import_id, i.name, i.source, i.imported_ms, i.delivery, p.provider,
                    p.billing_account_id, p.billing_period_start_ms, p.currency, p.row_count,
                    p.billed_total, p.effective_total, p.replaced_ms, p.replaced_by
             FROM billing_file_periods p JOIN billing_imports i ON i.id = p.import_id
             ORDER BY p.billing_period_start_ms DESC, p.provider, p.billing_account_id,
                      i.imported_ms, i.id",
        )
        .fetch_all(&mut *ex)
        .await?)
    })
}

pub async fn billing_imports(
    on: impl Into<On<'_>>,
) -> Result<Vec<super::BillingImportRow>, StoreError> {
    let mut conn = on.into().read().await?;
    type PeriodRow = (i64, String, i64, Option<String>, Option<String>);
    let (mut imports, periods, unsummed): (Vec<super::BillingImportRow>, Vec<PeriodRow>, _) =
        on_backend!(conn, |ex| {
            let imports = sqlx::query_as(
                "SELECT i.id, i.source, i.name, i.imported_ms, i.row_count,
                        (SELECT COUNT(*) FROM cost_lines c WHERE c.import_id = i.id)
                            AS current_lines
                 FROM billing_imports i ORDER BY i.id",
            )
            .fetch_all(&mut *ex)
            .await?;
            let periods = sqlx::query_as(
                "SELECT import_id, currency, row_count, billed_total, effective_total
                 FROM billing_file_periods",
            )
            .fetch_all(&mut *ex)
            .await?;
            // Periods stored before their totals were (summed at the next import): their lines.
            let unsummed: Vec<(i64, String, String, String)> = sqlx::query_as(
                "SELECT c.import_id, c.currency, c.billed_cost, c.effective_cost
                 FROM cost_lines c JOIN billing_file_periods p
                   ON p.import_id = c.import_id AND p.provider = c.provider
                  AND p.billing_account_id = c.billing_account_id
                  AND p.billing_period_start_ms = c.billing_period_start_ms
                  AND p.currency = c.currency
                 WHERE p.billed_total IS NULL",
            )
            .fetch_all(&mut *ex)
            .await?;
            Ok::<_, StoreError>((imports, periods, unsummed))
        })?;
    // Summed exactly here: the totals are decimal text.
    use gpuledger_core::money::from_text;
    let mut add = |import_id: i64, currency: String, rows: i64, billed: &str, effective: &str| {
        if let Ok(at) = imports.binary_search_by_key(&import_id, |i| i.id) {
            let sum = imports[at].totals.entry(currency).or_default();
            sum.rows += u64::try_from(rows).unwrap_or_default();
            sum.billed += from_text(billed);
            sum.effective += from_text(effective);
        }
    };
    for (import_id, currency, rows, billed, effective) in periods {
        if let (Some(billed), Some(effective)) = (billed, effective) {
            add(import_id, currency, rows, &billed, &effective);
        }
    }
    for (import_id, currency, billed, effective) in unsummed {
        add(import_id, currency, 1, &billed, &effective);
    }
    Ok(imports)
}

/// A stored cost line as commitments read it (amounts as their exact decimal text).
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct CommitmentRow {
    pub resource_key: Option<String>,
    pub charge_category: String,
    pub charge_period_start_ms: i64,
    pub charge_period_end_ms: i64,
    pub billed_cost: String,
    pub effective_cost: String,
    pub currency: String,
    pub commitment_discount_id: Option<String>,
    pub commitment_discount_status: Option<String>,
    pub instance_type: Option<String>,
    /// Holds `CommitmentDiscountName`, `CommitmentDiscountType` and `ChargeFrequency`.
    pub extra_json: String,
}

macro_rules! commitment_columns_sql {
    () => {
        "SELECT resource_key, charge_category, charge_period_start_ms, charge_period_end_ms,
                billed_cost, effective_cost, currency, commitment_discount_id,
                commitment_discount_status, instance_type, extra_json "
    };
}

/// The lines of `[from_ms, to_ms)` naming a commitment.
pub async fn commitment_lines(
    on: impl Into<On<'_>>,
    from_ms: i64,
    to_ms: i64,
) -> Result<Vec<CommitmentRow>, StoreError> {
    let mut conn = on.into().read().await?;
    on_backend!(conn, |ex| {
        Ok(sqlx::query_as(concat!(
            commitment_columns_sql!(),
            "FROM cost_lines
             WHERE charge_period_start_ms < $2 AND charge_period_end_ms > $1
               AND commitment_discount_id IS NOT NULL
             ORDER BY charge_period_start_ms, id"
        ))
        .bind(from_ms)
        .bind(to_ms)
        .fetch_all(&mut *ex)
        .await?)
    })
}

/// Every commitment purchase row ever imported, whatever its period: an upfront one, invoiced
/// in the month it was bought, is what states when the term ends.
pub async fn commitment_purchases(on: impl Into<On<'_>>) -> Result<Vec<CommitmentRow>, StoreError> {
    let mut conn = on.into().read().await?;
    on_backend!(conn, |ex| {
        Ok(sqlx::query_as(concat!(
            commitment_columns_sql!(),
            "FROM cost_lines
             WHERE charge_category = 'Purchase' AND commitment_discount_id IS NOT NULL
             ORDER BY charge_period_start_ms, id"
        ))
        .fetch_all(&mut *ex)
        .await?)
    })
}

/// A cost line's columns as [`cost_lines`] and [`last_billed_lines`] read them.
type CostLineColumns = (
    Option<String>,
    i64,
    i64,
    String,
    String,
    String,
    String,
    String,
    Option<String>,
    String,
    Option<String>,
    Option<String>,
);

/// A cost line from its columns; amounts are stored as the exact decimal text they were
/// imported as.
fn stored_cost_line(
    (
        resource_key,
        charge_period_start_ms,
        charge_period_end_ms,
        charge_category,
        billed_cost,
        effective_cost,
        currency,
        pricing_category,
        instance_type,
        tags_json,
        commitment_id,
        commitment_status,
    ): CostLineColumns,
) -> super::StoredCostLine {
    let amount = |text: String| gpuledger_core::money::from_text(&text);
    super::StoredCostLine {
        resource_key,
        charge_period_start_ms,
        charge_period_end_ms,
        charge_category,
        billed_cost: amount(billed_cost),
        effective_cost: amount(effective_cost),
        currency,
        pricing_category,
        instance_type,
        tags_json,
        commitment_id: commitment_id.filter(|id| !id.is_empty()),
        commitment_part: commitment_status
            .as_deref()
            .and_then(gpuledger_core::commitment::Status::parse)
            .map(|status| match status {
                gpuledger_core::commitment::Status::Used => CommitmentPart::Used,
                gpuledger_core::commitment::Status::Unused => CommitmentPart::Unused,
            }),
    }
}

/// Cost lines whose charge period overlaps `[from_ms, to_ms)`.
pub async fn cost_lines(
    on: impl Into<On<'_>>,
    from_ms: i64,
    to_ms: i64,
) -> Result<Vec<super::StoredCostLine>, StoreError> {
    let mut conn = on.into().read().await?;
    on_backend!(conn, |ex| {
        let rows: Vec<CostLineColumns> = sqlx::query_as(concat!(
            "SELECT resource_key, charge_period_start_ms, charge_period_end_ms, charge_category,
                    billed_cost, effective_cost, currency, pricing_category, instance_type,
                    tags_json, commitment_discount_id, commitment_discount_status ",
            super::cost_lines_in_range_sql!()
        ))
        .bind(from_ms)
        .bind(to_ms)
        .fetch_all(&mut *ex)
        .await?;
        Ok(rows.into_iter().map(stored_cost_line).collect())
    })
}

/// For the hours after the bill's last line: of each resource in `resource_keys`, the lines
/// covering its newest billed hour that ends by `before_ms` and after `since_ms` (a
/// commitment's unused part left out: it is not what the resource costs to run). Each
/// resource's newest end is one probe of the `(resource_key, charge_period_end_ms)` index.
pub async fn last_billed_lines(
    on: impl Into<On<'_>>,
    resource_keys: &[&str],
    since_ms: i64,
    before_ms: i64,
) -> Result<Vec<super::StoredCostLine>, StoreError> {
    if resource_keys.is_empty() {
        return Ok(Vec::new());
    }
    let keys = serde_json::to_string(resource_keys)
        .map_err(|e| StoreError::Invalid(format!("resource keys cannot be encoded: {e}")))?;
    let mut conn = on.into().read().await?;
    on_backend!(conn, |ex, DB| {
        let (open, close) = <DB as super::db::Dialect>::JSON_ARRAY_VALUES;
        let not_unused = "COALESCE(LOWER(TRIM({t}.commitment_discount_status)), '') <> 'unused'";
        let sql = format!(
            "SELECT c.resource_key, c.charge_period_start_ms, c.charge_period_end_ms,
                    c.charge_category, c.billed_cost, c.effective_cost, c.currency,
                    c.pricing_category, c.instance_type, c.tags_json,
                    c.commitment_discount_id, c.commitment_discount_status
             FROM (SELECT v.value AS resource_key,
                          (SELECT MAX(x.charge_period_end_ms) FROM cost_lines x
                           WHERE x.resource_key = v.value
                             AND x.charge_period_end_ms <= $3 AND x.charge_period_end_ms > $2
                             AND {x_not_unused}) AS last_end
                   FROM ({open}$1{close}) v) l
             JOIN cost_lines c ON c.resource_key = l.resource_key
             WHERE c.charge_period_end_ms <= l.last_end
               AND c.charge_period_end_ms > l.last_end - {HOUR}
               AND c.charge_period_start_ms < l.last_end
               AND {c_not_unused}
             ORDER BY c.charge_period_start_ms, c.resource_key",
            x_not_unused = not_unused.replace("{t}", "x"),
            c_not_unused = not_unused.replace("{t}", "c"),
            HOUR = gpuledger_core::time::HOUR_MS,
        );
        let rows: Vec<CostLineColumns> = sqlx::query_as(&sql)
            .bind(&keys)
            .bind(since_ms)
            .bind(before_ms)
            .fetch_all(&mut *ex)
            .await?;
        Ok(rows.into_iter().map(stored_cost_line).collect())
    })
}

/// The same lines as [`Store::cost_lines`], with every column, for the FOCUS export.
pub async fn bill_lines(
    on: impl Into<On<'_>>,
    from_ms: i64,
    to_ms: i64,
) -> Result<Vec<super::BillLine>, StoreError> {
    let mut conn = on.into().read().await?;
    on_backend!(conn, |ex| {
        Ok(sqlx::query_as(concat!(
            "SELECT provider, billing_account_id, billing_period_start_ms,
                    charge_period_start_ms, charge_period_end_ms, charge_category, resource_id,
                    resource_key, billed_cost, effective_cost, list_cost, currency,
                    pricing_category, commitment_discount_id, commitment_discount_status,
                    service_name, sku_id, region, tags_json, extra_json ",
            super::cost_lines_in_range_sql!()
        ))
        .bind(from_ms)
        .bind(to_ms)
        .fetch_all(&mut *ex)
        .await?)
    })
}
