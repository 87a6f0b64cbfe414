//! Page sections kept as computed ([`crate::sections`]), and the count of
//! each day's roll-up rewrites they are checked against.

use super::db::{on_backend, On};
use super::StoreError;

/// How many times the roll-up has rewritten hours of the days `[from_ms, to_ms)` overlaps,
/// summed (0 for never): bumped in the same transaction as the rewrite. Each day's count only
/// grows, so the sum moves whenever one of them does.
pub async fn rollup_generation(
    on: impl Into<On<'_>>,
    (from_ms, to_ms): (i64, i64),
) -> Result<i64, StoreError> {
    let mut conn = on.into().read().await?;
    on_backend!(conn, |ex| {
        let sum: i64 = sqlx::query_scalar(
            "SELECT CAST(COALESCE(SUM(generation), 0) AS BIGINT) FROM rollup_day_generations
             WHERE day_ms >= $1 AND day_ms < $2",
        )
        .bind(gpuledger_core::time::day_floor(from_ms))
        .bind(to_ms)
        .fetch_one(&mut *ex)
        .await?;
        Ok(sum)
    })
}

/// 1 when a row's `generation` is the sum of the roll-up generations of the days from the
/// parameter `$from_day` (a day's start) up to `$to`, else 0, as SQL: whether what the row
/// keeps was drawn from those days' rollups as they are now.
macro_rules! generation_current_sql {
    ($from_day:literal, $to:literal) => {
        concat!(
            "CAST(CASE WHEN generation = (SELECT CAST(COALESCE(SUM(generation), 0) AS BIGINT)
                                          FROM rollup_day_generations
                                          WHERE day_ms >= ",
            $from_day,
            " AND day_ms < ",
            $to,
            ")
                  THEN 1 ELSE 0 END AS BIGINT)"
        )
    };
}
pub(crate) use generation_current_sql;

/// A section as stored: its body, when it was computed, and whether it was drawn from the
/// rollups of the days it overlaps as they are now ([`rollup_generation`]).
#[derive(Debug, Clone, PartialEq)]
pub struct StoredSection {
    pub body: String,
    pub computed_ms: i64,
    pub current: bool,
}

/// The stored `section` for `key` over `[from_ms, to_ms)`, if any.
pub async fn stored_section(
    on: impl Into<On<'_>>,
    (section, key): (&str, &str),
    (from_ms, to_ms): (i64, i64),
) -> Result<Option<StoredSection>, StoreError> {
    let mut conn = on.into().read().await?;
    let row: Option<(String, i64, i64)> = on_backend!(conn, |ex| {
        sqlx::query_as(concat!(
            "SELECT body, computed_ms, ",
            generation_current_sql!("$5", "$4"),
            " FROM kept_sections
             WHERE section = $1 AND key = $2 AND from_ms = $3 AND to_ms = $4"
        ))
        .bind(section)
        .bind(key)
        .bind(from_ms)
        .bind(to_ms)
        .bind(gpuledger_core::time::day_floor(from_ms))
        .fetch_optional(&mut *ex)
        .await
    })?;
    Ok(row.map(|(body, computed_ms, current)| StoredSection {
        body,
        computed_ms,
        current: current != 0,
    }))
}

/// The stored body of `section` for `key` over `[from_ms, to_ms)`, if it was drawn from the
/// rollups of the days it overlaps as they are now ([`rollup_generation`]).
pub async fn section_snapshot(
    on: impl Into<On<'_>>,
    section: (&str, &str),
    range: (i64, i64),
) -> Result<Option<String>, StoreError> {
    Ok(stored_section(on, section, range)
        .await?
        .filter(|s| s.current)
        .map(|s| s.body))
}

/// Stores (or replaces one of no later generation) a section's body, drawn from the rollups
/// of `generation`. One over a range that `grows` (its end moves on each day: the month under
/// way's days so far) replaces the shorter ones of the same start that grew before it.
pub async fn put_section_snapshot(
    on: impl Into<On<'_>>,
    (section, key): (&str, &str),
    (from_ms, to_ms, grows): (i64, i64, bool),
    (generation, computed_ms): (i64, i64),
    body: &str,
) -> Result<(), StoreError> {
    let mut conn = on.into().write().await?;
    on_backend!(conn, |ex| {
        let mut tx = crate::store::db::begin_write(&mut *ex).await?;
        sqlx::query(
            "INSERT INTO kept_sections
                (section, key, from_ms, to_ms, generation, computed_ms, grows, body)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
             ON CONFLICT (section, key, from_ms, to_ms)
             DO UPDATE SET generation = EXCLUDED.generation,
                           computed_ms = EXCLUDED.computed_ms, grows = EXCLUDED.grows,
                           body = EXCLUDED.body
             -- One drawn from a replica behind the primary never replaces a newer one.
             WHERE EXCLUDED.generation >= kept_sections.generation",
        )
        .bind(section)
        .bind(key)
        .bind(from_ms)
        .bind(to_ms)
        .bind(generation)
        .bind(computed_ms)
        .bind(i32::from(grows))
        .bind(body)
        .execute(&mut *tx)
        .await?;
        if grows {
            sqlx::query(
                "DELETE FROM kept_sections
                 WHERE section = $1 AND key = $2 AND from_ms = $3 AND to_ms < $4 AND grows = 1",
            )
            .bind(section)
            .bind(key)
            .bind(from_ms)
            .bind(to_ms)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(())
    })
}

/// Deletes what was kept (sections, the sections of the version before migration 0042, and
/// recommendation snapshots) that was computed before `before_ms`: a range read once is not
/// kept for ever. Returns how many rows went.
pub async fn prune_kept(on: impl Into<On<'_>>, before_ms: i64) -> Result<u64, StoreError> {
    let mut conn = on.into().write().await?;
    on_backend!(conn, |ex| {
        let mut tx = crate::store::db::begin_write(&mut *ex).await?;
        let mut n = 0;
        for table in [
            "kept_sections",
            "section_snapshots",
            "recommendation_snapshots",
        ] {
            n += sqlx::query(&format!("DELETE FROM {table} WHERE computed_ms < $1"))
                .bind(before_ms)
                .execute(&mut *tx)
                .await?
                .rows_affected();
        }
        tx.commit().await?;
        Ok(n)
    })
}

/// Retires what was kept from `days` (start of each day, epoch ms), which a roll-up rewrote: a
/// kept section of an ended range over a day is deleted, and the day's generation moves on, so
/// that one a view is computing now is not kept either (those of a range still under way are
/// served by their age, and replaced when computed again). Recommendation snapshots of ended
/// ranges over the days go too: they were drawn from the old rows.
pub async fn retire_days(on: impl Into<On<'_>>, days: &[i64]) -> Result<(), StoreError> {
    use gpuledger_core::time::DAY_MS;
    let mut conn = on.into().write().await?;
    on_backend!(conn, |ex| {
        let mut tx = crate::store::db::begin_write(&mut *ex).await?;
        for &day in days {
            for table in ["recommendation_snapshots", "kept_sections"] {
                sqlx::query(&format!(
                    "DELETE FROM {table} WHERE from_ms < $2 AND to_ms > $1 AND computed_ms >= to_ms"
                ))
                .bind(day)
                .bind(day + DAY_MS)
                .execute(&mut *tx)
                .await?;
            }
            sqlx::query(
                "INSERT INTO rollup_day_generations (day_ms, generation) VALUES ($1, 1)
                 ON CONFLICT (day_ms)
                 DO UPDATE SET generation = rollup_day_generations.generation + 1",
            )
            .bind(day)
            .execute(&mut *tx)
            .await?;
            // The same by month for replicas of the version before migration 0042 while a
            // rolling upgrade runs them beside this one (a later migration drops both tables).
            sqlx::query(
                "INSERT INTO rollup_generations (month_ms, generation) VALUES ($1, 1)
                 ON CONFLICT (month_ms)
                 DO UPDATE SET generation = rollup_generations.generation + 1",
            )
            .bind(gpuledger_core::time::month_start_ms(day))
            .execute(&mut *tx)
            .await?;
            sqlx::query(
                "DELETE FROM section_snapshots
                 WHERE from_ms < $2 AND to_ms > $1 AND computed_ms >= to_ms",
            )
            .bind(day)
            .bind(day + DAY_MS)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(())
    })
}
