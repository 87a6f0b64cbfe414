//! Request and token counts per inference endpoint, as serving code posts them and as agents
//! read them from serving engines: what cost per request and per token divide by.

use super::db::{on_backend, On};
use super::StoreError;

/// Requests an endpoint served in `[start_ms, end_ms)`, as counted by one source.
#[derive(Debug, Clone, PartialEq)]
pub struct UsageCount {
    pub endpoint: String,
    pub start_ms: i64,
    pub end_ms: i64,
    pub requests: i64,
    /// Tokens read and generated in the period, where the serving code counts them.
    pub input_tokens: Option<i64>,
    pub output_tokens: Option<i64>,
}

/// How far a training run had got at a time, as one source (a rank, a trainer) saw it.
#[derive(Debug, Clone, PartialEq)]
pub struct RunProgress {
    /// The value of the experiment dimension.
    pub experiment: String,
    pub at_ms: i64,
    /// Optimizer steps done since the run began (not since a resume).
    pub step: i64,
    /// Whole epochs done, where the run counts them.
    pub epoch: Option<i64>,
}

/// Stores usage counts from `source` in one transaction; a count for the same endpoint,
/// source and period start replaces the earlier one, when it came from the same token (or
/// one no longer active). A count another active token sent is never replaced: the whole
/// post is refused, naming it.
pub async fn upsert_usage(
    on: impl Into<On<'_>>,
    source: &str,
    counts: &[UsageCount],
    token_id: i64,
    now_ms: i64,
) -> Result<Option<super::Refusal>, StoreError> {
    record(on, source, (counts, &[]), token_id, now_ms).await
}

/// Stores a post's counts and runs' progress from `source` in one transaction, as
/// [`upsert_usage`] stores counts: a progress report for the same run, source and time
/// replaces the earlier one only from the same token (or one no longer active); otherwise the
/// whole post is refused, naming it, and nothing of it is kept.
pub async fn record(
    on: impl Into<On<'_>>,
    source: &str,
    (counts, progress): (&[UsageCount], &[RunProgress]),
    token_id: i64,
    now_ms: i64,
) -> Result<Option<super::Refusal>, StoreError> {
    let mut conn = on.into().write().await?;
    on_backend!(conn, |ex| {
        let mut tx = crate::store::db::begin_write(&mut *ex).await?;
        for (i, c) in counts.iter().enumerate() {
            let written = sqlx::query(concat!(
                "INSERT INTO usage_counts
                   (endpoint, source, start_ms, end_ms, requests, token_id, received_ms,
                    input_tokens, output_tokens)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
                 ON CONFLICT (endpoint, source, start_ms) DO UPDATE SET
                   end_ms = excluded.end_ms, requests = excluded.requests,
                   input_tokens = excluded.input_tokens, output_tokens = excluded.output_tokens,
                   token_id = excluded.token_id, received_ms = excluded.received_ms
                 WHERE usage_counts.token_id = excluded.token_id
                    OR NOT EXISTS (SELECT 1 FROM api_tokens t
                                   WHERE t.id = usage_counts.token_id AND ",
                super::tokens::token_active_sql!("t", "$7"),
                ")"
            ))
            .bind(&c.endpoint)
            .bind(source)
            .bind(c.start_ms)
            .bind(c.end_ms)
            .bind(c.requests)
            .bind(token_id)
            .bind(now_ms)
            .bind(c.input_tokens)
            .bind(c.output_tokens)
            .execute(&mut *tx)
            .await?;
            if written.rows_affected() == 0 {
                tx.rollback().await?;
                return Ok(Some(super::Refusal {
                    kind: super::RefusalKind::SourceOfAnotherToken,
                    field: format!("counts[{i}]"),
                    message: format!(
                        "source {source:?}'s count for {} from {} ms came from another \
                         token; a source's counts are replaced only by the token that sent \
                         them",
                        c.endpoint, c.start_ms
                    ),
                }));
            }
        }
        for (i, p) in progress.iter().enumerate() {
            let written = sqlx::query(concat!(
                "INSERT INTO run_progress
                   (experiment, source, at_ms, step, epoch, token_id, received_ms)
                 VALUES ($1, $2, $3, $4, $5, $6, $7)
                 ON CONFLICT (experiment, source, at_ms) DO UPDATE SET
                   step = excluded.step, epoch = excluded.epoch,
                   token_id = excluded.token_id, received_ms = excluded.received_ms
                 WHERE run_progress.token_id = excluded.token_id
                    OR NOT EXISTS (SELECT 1 FROM api_tokens t
                                   WHERE t.id = run_progress.token_id AND ",
                super::tokens::token_active_sql!("t", "$7"),
                ")"
            ))
            .bind(&p.experiment)
            .bind(source)
            .bind(p.at_ms)
            .bind(p.step)
            .bind(p.epoch)
            .bind(token_id)
            .bind(now_ms)
            .execute(&mut *tx)
            .await?;
            if written.rows_affected() == 0 {
                tx.rollback().await?;
                return Ok(Some(super::Refusal {
                    kind: super::RefusalKind::SourceOfAnotherToken,
                    field: format!("progress[{i}]"),
                    message: format!(
                        "source {source:?}'s progress of {} at {} ms came from another \
                         token; a source's reports are replaced only by the token that sent \
                         them",
                        p.experiment, p.at_ms
                    ),
                }));
            }
        }
        tx.commit().await?;
        Ok(None)
    })
}

/// Which owner a usage post names, and where to look for it.
#[derive(Debug, Clone, Copy)]
pub struct NamedOwners<'a> {
    /// `endpoint` or `experiment`: the role bindings are kept under.
    pub role: &'a str,
    /// The owner dimension that has the role in the schema, where one does.
    pub dimension: Option<&'a str>,
    /// UTC days `[from_ms, to_ms)` in which a process of the owner counts.
    pub days: (i64, i64),
}

/// Of `names`, those token `token_id` may post counts or progress for: values of `owners.role`
/// an admin bound to the token, and values of its dimension that a process had on one of the
/// token's hosts on a day of `owners.days` (the hourly ledger's host days, rebuilt with each
/// hour's roll-up).
pub async fn owners_of_token(
    on: impl Into<On<'_>>,
    token_id: i64,
    owners: NamedOwners<'_>,
    names: &[&str],
) -> Result<std::collections::HashSet<String>, StoreError> {
    if names.is_empty() {
        return Ok(Default::default());
    }
    let names = serde_json::to_string(names)
        .map_err(|e| StoreError::Invalid(format!("owner names cannot be encoded: {e}")))?;
    let mut conn = on.into().read().await?;
    let found: Vec<(String,)> = on_backend!(conn, |ex, DB| {
        let (open, close) = <DB as super::db::Dialect>::JSON_ARRAY_TEXTS;
        let sql = format!(
            "SELECT b.value FROM token_owner_bindings b
             WHERE b.token_id = $1 AND b.role = $2 AND b.value IN ({open}$3{close})
             UNION
             SELECT v.value FROM owner_values v
             JOIN rollup_host_days r ON r.owner_id = v.owner_id
             JOIN hosts h ON h.id = r.host_id
             WHERE h.token_id = $1 AND v.dimension = $4 AND v.value IN ({open}$3{close})
               AND r.day_ms >= $5 AND r.day_ms < $6"
        );
        sqlx::query_as(&sql)
            .bind(token_id)
            .bind(owners.role)
            .bind(&names)
            .bind(owners.dimension)
            .bind(owners.days.0)
            .bind(owners.days.1)
            .fetch_all(&mut *ex)
            .await
    })?;
    Ok(found.into_iter().map(|(v,)| v).collect())
}

/// Every count of `[from_ms, to_ms)`: the periods serving code posted that start in it, and the
/// hours agents read from serving engines in it, as one relation (endpoint, requests,
/// input_tokens, output_tokens).
const COUNTS_SQL: &str = "(SELECT endpoint, requests, input_tokens, output_tokens
       FROM usage_counts WHERE start_ms >= $1 AND start_ms < $2
     UNION ALL
     SELECT endpoint, requests, input_tokens, output_tokens
       FROM serving_counts WHERE hour_ms >= $1 AND hour_ms < $2) c";

/// Requests per endpoint in `[from_ms, to_ms)`, all sources summed (posted counts by period
/// start, engines' by hour); an endpoint some engine could not count requests of in an hour
/// is left out, as its requests are not known.
pub async fn usage_totals(
    on: impl Into<On<'_>>,
    from_ms: i64,
    to_ms: i64,
) -> Result<Vec<(String, i64)>, StoreError> {
    let mut conn = on.into().read().await?;
    on_backend!(conn, |ex, DB| {
        // Capped, never an overflow: one source's absurd count must not fail every reader.
        let (sum, end) = <DB as super::db::Dialect>::CAPPED_SUM;
        Ok(sqlx::query_as(&format!(
            "SELECT endpoint, {sum}requests{end} FROM {COUNTS_SQL}
             GROUP BY endpoint HAVING COUNT(requests) = COUNT(*) ORDER BY endpoint"
        ))
        .bind(from_ms)
        .bind(to_ms)
        .fetch_all(&mut *ex)
        .await?)
    })
}

/// Who counted each endpoint's work in `[from_ms, to_ms)`: `posted` (serving code, `POST
/// /api/v1/usage`) and each engine the agents read (`vllm`, `tgi`, `triton`). An endpoint
/// counted both ways is counted twice: the pages say so.
pub async fn usage_sources(
    on: impl Into<On<'_>>,
    from_ms: i64,
    to_ms: i64,
) -> Result<Vec<(String, String)>, StoreError> {
    let mut conn = on.into().read().await?;
    on_backend!(conn, |ex| {
        Ok(sqlx::query_as(
            "SELECT DISTINCT endpoint, 'posted' FROM usage_counts
               WHERE start_ms >= $1 AND start_ms < $2
             UNION
             SELECT DISTINCT endpoint, engine FROM serving_counts
               WHERE hour_ms >= $1 AND hour_ms < $2
             ORDER BY 1, 2",
        )
        .bind(from_ms)
        .bind(to_ms)
        .fetch_all(&mut *ex)
        .await?)
    })
}

/// Input and output tokens per endpoint in `[from_ms, to_ms)`, all sources summed as
/// [`usage_totals`] sums requests; each `None` unless every count of the endpoint in the range carries it (a sum over
/// part of the periods would make each token look dearer than it was). Endpoints without any
/// are left out.
pub async fn token_totals(
    on: impl Into<On<'_>>,
    from_ms: i64,
    to_ms: i64,
) -> Result<Vec<(String, Option<i64>, Option<i64>)>, StoreError> {
    let mut conn = on.into().read().await?;
    let rows: Vec<(String, Option<i64>, Option<i64>)> = on_backend!(conn, |ex, DB| {
        let (sum, end) = <DB as super::db::Dialect>::CAPPED_SUM;
        Ok::<_, StoreError>(
            sqlx::query_as(&format!(
                "SELECT endpoint,
                    CASE WHEN COUNT(input_tokens) = COUNT(*)
                         THEN {sum}input_tokens{end} END,
                    CASE WHEN COUNT(output_tokens) = COUNT(*)
                         THEN {sum}output_tokens{end} END
                 FROM {COUNTS_SQL}
                 GROUP BY endpoint ORDER BY endpoint"
            ))
            .bind(from_ms)
            .bind(to_ms)
            .fetch_all(&mut *ex)
            .await?,
        )
    })?;
    Ok(rows
        .into_iter()
        .filter(|(_, input, output)| input.is_some() || output.is_some())
        .collect())
}

/// Each run's progress in `[from_ms, to_ms)`: the steps (and epochs) it advanced, its highest
/// reported in the range less its highest reported before it (0 for a run that began in it).
/// Epochs are `None` where no report in the range carries one. Runs with no report in the
/// range are left out.
pub async fn progress_totals(
    on: impl Into<On<'_>>,
    from_ms: i64,
    to_ms: i64,
) -> Result<Vec<(String, i64, Option<i64>)>, StoreError> {
    let mut conn = on.into().read().await?;
    type Row = (String, Option<i64>, Option<i64>, Option<i64>, Option<i64>);
    let rows: Vec<Row> = on_backend!(conn, |ex| {
        Ok::<_, StoreError>(
            sqlx::query_as(
                "SELECT experiment,
                    MAX(CASE WHEN at_ms >= $1 THEN step END),
                    MAX(CASE WHEN at_ms < $1 THEN step END),
                    MAX(CASE WHEN at_ms >= $1 THEN epoch END),
                    MAX(CASE WHEN at_ms < $1 THEN epoch END)
                 FROM run_progress
                 WHERE at_ms < $2 AND experiment IN (
                     SELECT experiment FROM run_progress WHERE at_ms >= $1 AND at_ms < $2)
                 GROUP BY experiment ORDER BY experiment",
            )
            .bind(from_ms)
            .bind(to_ms)
            .fetch_all(&mut *ex)
            .await?,
        )
    })?;
    Ok(rows
        .into_iter()
        .filter_map(|(experiment, last, before, last_epoch, before_epoch)| {
            let steps = (last? - before.unwrap_or(0)).max(0);
            let epochs = last_epoch.map(|e| (e - before_epoch.unwrap_or(0)).max(0));
            Some((experiment, steps, epochs))
        })
        .collect())
}

/// A source of posted counts and runs' progress, as an admin lists it: the token that last
/// sent it, how much it holds and over when.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct PostedSource {
    pub source: String,
    /// The token's name; `None` if the token was deleted.
    pub token: Option<String>,
    pub counts: i64,
    /// Requests in its counts, capped as every sum of counts is.
    pub requests: i64,
    pub progress: i64,
    pub first_ms: i64,
    pub last_ms: i64,
}

/// Every source that posted counts or progress, per token that sent it (a source two tokens
/// sent is listed twice), optionally only one token's; by source.
pub async fn posted_sources(
    on: impl Into<On<'_>>,
    token_id: Option<i64>,
) -> Result<Vec<PostedSource>, StoreError> {
    let mut conn = on.into().read().await?;
    on_backend!(conn, |ex, DB| {
        let (sum, end) = <DB as super::db::Dialect>::CAPPED_SUM;
        Ok(sqlx::query_as(&format!(
            "SELECT x.source, t.name AS token, CAST(SUM(x.counts) AS BIGINT) AS counts,
                    {sum}x.requests{end} AS requests,
                    CAST(SUM(x.progress) AS BIGINT) AS progress,
                    MIN(x.first_ms) AS first_ms, MAX(x.last_ms) AS last_ms
             FROM (SELECT source, token_id, COUNT(*) AS counts, {sum}requests{end} AS requests,
                          0 AS progress, MIN(start_ms) AS first_ms, MAX(end_ms) AS last_ms
                   FROM usage_counts GROUP BY source, token_id
                   UNION ALL
                   SELECT source, token_id, 0, 0, COUNT(*), MIN(at_ms), MAX(at_ms)
                   FROM run_progress GROUP BY source, token_id) x
             LEFT JOIN api_tokens t ON t.id = x.token_id
             WHERE $1 IS NULL OR x.token_id = $1
             GROUP BY x.source, x.token_id, t.name
             ORDER BY x.source, t.name"
        ))
        .bind(token_id)
        .fetch_all(&mut *ex)
        .await?)
    })
}

/// Deletes a source's counts and progress (only those `token_id` sent, if given), in one
/// transaction; answers how many counts and progress reports went.
pub async fn delete_posted(
    on: impl Into<On<'_>>,
    source: Option<&str>,
    token_id: Option<i64>,
) -> Result<(u64, u64), StoreError> {
    let mut conn = on.into().write().await?;
    on_backend!(conn, |ex| {
        let mut tx = crate::store::db::begin_write(&mut *ex).await?;
        let mut gone = [0u64; 2];
        for (i, table) in ["usage_counts", "run_progress"].iter().enumerate() {
            gone[i] = sqlx::query(&format!(
                "DELETE FROM {table}
                 WHERE ($1 IS NULL OR source = $1) AND ($2 IS NULL OR token_id = $2)"
            ))
            .bind(source)
            .bind(token_id)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        }
        tx.commit().await?;
        Ok((gone[0], gone[1]))
    })
}
