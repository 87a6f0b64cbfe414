//! The hourly ledger as it is read: every page, API answer, CSV and Slack message that states
//! an amount reads it here.

use super::db::{on_backend, On};
use super::StoreError;

/// The hours in one day in which an experiment (a value of the experiment's dimension) had GPU
/// work (busy or held idle).
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct ExperimentDayRow {
    pub day_ms: i64,
    pub experiment: String,
    pub first_hour_ms: i64,
    pub last_hour_ms: i64,
    pub hours: i64,
}

/// Cost and GPU time in one day, of one kind, price, currency and value of an owner dimension,
/// summed over hosts, GPUs and owners with that value.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow, serde::Serialize, serde::Deserialize)]
pub struct DimensionDayRow {
    pub day_ms: i64,
    /// The owners' value in the dimension; `None` for owners without one.
    pub value: Option<String>,
    pub kind: String,
    pub pricing_category: String,
    pub currency: String,
    pub estimated: i64,
    pub cost_nano: i64,
    pub cost_atto: i64,
    #[serde(with = "super::exact_f64")]
    pub gpu_seconds: f64,
}

/// Cost, GPU time, utilization and energy in one day of one value of an owner dimension, on the
/// hosts of one cluster and region (the grid they drew on), of one kind, price and currency:
/// summed over those hosts, their GPUs and the owners with that value.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow, serde::Serialize, serde::Deserialize)]
pub struct ValueDayRow {
    pub day_ms: i64,
    /// The owners' value in the dimension; `None` for owners without one.
    pub value: Option<String>,
    /// `None` for a host no longer known.
    pub cluster: Option<String>,
    pub region: Option<String>,
    pub kind: String,
    pub pricing_category: String,
    pub currency: String,
    pub estimated: i64,
    pub cost_nano: i64,
    pub cost_atto: i64,
    #[serde(with = "super::exact_f64")]
    pub gpu_seconds: f64,
    #[serde(with = "super::exact_f64")]
    pub util_gpu_seconds: f64,
    #[serde(with = "super::exact_f64")]
    pub util_known_seconds: f64,
    #[serde(with = "super::exact_f64")]
    pub energy_j: f64,
    #[serde(with = "super::exact_f64")]
    pub energy_known_seconds: f64,
}

/// Attributed cost in a currency over a range, summed in SQL.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct CurrencyCostRow {
    pub currency: String,
    pub cost_nano: i64,
    pub cost_atto: i64,
}

/// Per GPU, owner, kind and price: the rollup rows of `grain` (hour or day) in
/// `[from_ms, to_ms)` summed by the database (`period_ms` is `from_ms`), GPU rows only.
pub async fn rollup_gpu_owner_totals(
    on: impl Into<On<'_>>,
    grain: super::RollupGrain,
    from_ms: i64,
    to_ms: i64,
) -> Result<Vec<super::RollupRow>, StoreError> {
    let mut conn = on.into().read().await?;
    on_backend!(conn, |ex| {
        let (table, period) = if grain.is_daily() {
            ("rollup_days", "day_ms")
        } else {
            ("rollup_hours", "hour_ms")
        };
        // Sums stay exact: atto parts carry over into nano parts in integer math.
        let sql = format!(
            "SELECT CAST($1 AS BIGINT) AS period_ms, host_id, gpu_uuid, o.labels AS owner, kind,
                pricing_category, currency, estimated,
                CAST(SUM(cost_nano) AS BIGINT) + CAST(SUM(cost_atto) AS BIGINT) / 1000000000 AS cost_nano,
                CAST(SUM(cost_atto) AS BIGINT) % 1000000000 AS cost_atto,
                SUM(gpu_seconds) AS gpu_seconds, SUM(util_gpu_seconds) AS util_gpu_seconds,
                SUM(util_known_seconds) AS util_known_seconds, SUM(energy_j) AS energy_j,
                SUM(energy_known_seconds) AS energy_known_seconds
             FROM {table} JOIN owners o ON o.id = owner_id
             WHERE {period} >= $1 AND {period} < $2 AND gpu_uuid <> ''
             GROUP BY host_id, gpu_uuid, o.labels, kind, pricing_category, currency, estimated"
        );
        Ok(sqlx::query_as(&sql)
            .bind(from_ms)
            .bind(to_ms)
            .fetch_all(&mut *ex)
            .await?)
    })
}

/// The usage rows of `grain` (hour or day) in `[from_ms, to_ms)` summed per GPU, owner and
/// utilization band by the database.
pub async fn rollup_usage(
    on: impl Into<On<'_>>,
    grain: super::RollupGrain,
    from_ms: i64,
    to_ms: i64,
) -> Result<Vec<super::UsageTotal>, StoreError> {
    let mut conn = on.into().read().await?;
    on_backend!(conn, |ex| {
        let (table, period) = if grain.is_daily() {
            ("rollup_usage_days", "day_ms")
        } else {
            ("rollup_usage_hours", "hour_ms")
        };
        let sql = format!(
            "SELECT u.host_id, u.gpu_uuid, u.owner_by, u.owner_key, u.util_band,
                CAST(SUM(u.windows) AS BIGINT) AS windows,
                MAX(u.peak_memory_bytes) AS peak_memory_bytes,
                g.name AS gpu_name, g.memory_total_bytes, g.parent_uuid
             FROM {table} u LEFT JOIN gpus g ON g.uuid = u.gpu_uuid
             WHERE u.{period} >= $1 AND u.{period} < $2
             GROUP BY u.host_id, u.gpu_uuid, u.owner_by, u.owner_key, u.util_band, g.name,
                g.memory_total_bytes, g.parent_uuid"
        );
        type Columns = (
            i64,
            String,
            String,
            String,
            i64,
            i64,
            i64,
            Option<String>,
            Option<i64>,
            Option<String>,
        );
        let rows: Vec<Columns> = sqlx::query_as(&sql)
            .bind(from_ms)
            .bind(to_ms)
            .fetch_all(&mut *ex)
            .await?;
        Ok(rows
            .into_iter()
            .map(super::from_columns!(super::UsageTotal {
                host_id,
                gpu_uuid,
                owner_by,
                owner_key,
                util_band,
                windows,
                peak_memory_bytes,
                gpu_name,
                memory_total_bytes,
                parent_uuid
            }))
            .collect())
    })
}

/// GPU-seconds per hour, host instance type and owner value in `team_dimension`, summed by the
/// database over hosts, GPUs and kinds: the shape of the work, a row per hour, type and team
/// instead of one per GPU; with the GPU-seconds that owners with a value in
/// `experiment_dimension` used doing work (what could run on spot). Hosts of no known instance
/// type are left out.
pub async fn gpu_seconds_by_type(
    on: impl Into<On<'_>>,
    from_ms: i64,
    to_ms: i64,
    (team_dimension, experiment_dimension): (&str, &str),
) -> Result<Vec<gpuledger_core::shape::TypeHour>, StoreError> {
    let mut conn = on.into().read().await?;
    on_backend!(conn, |ex| {
        // Read from the hours summed per host, an owner's values from `owner_values` (never
        // by parsing its labels on each row), and summed once: a first sum per owner-hour
        // barely shrinks the rows and, past the database's work memory, spills to disk.
        let sql = "SELECT r.hour_ms, h.instance_type, ov.value AS owner_value,
                    SUM(r.gpu_seconds) AS gpu_seconds,
                    SUM(CASE WHEN r.kind = 'used' AND oe.value IS NOT NULL
                             THEN r.gpu_seconds ELSE 0.0 END)
             FROM rollup_host_hours r
                  JOIN hosts h ON h.id = r.host_id
                  LEFT JOIN owner_values ov ON ov.owner_id = r.owner_id AND ov.dimension = $3
                  LEFT JOIN owner_values oe ON oe.owner_id = r.owner_id AND oe.dimension = $4
             WHERE r.hour_ms >= $1 AND r.hour_ms < $2 AND h.instance_type IS NOT NULL
             GROUP BY r.hour_ms, h.instance_type, ov.value";
        let rows: Vec<(i64, String, Option<String>, f64, f64)> = sqlx::query_as(sql)
            .bind(from_ms)
            .bind(to_ms)
            .bind(team_dimension)
            .bind(experiment_dimension)
            .fetch_all(&mut *ex)
            .await?;
        Ok(rows
            .into_iter()
            .map(
                |(hour_ms, instance_type, owner, gpu_seconds, interruptible_seconds)| {
                    gpuledger_core::shape::TypeHour {
                        hour_ms,
                        instance_type,
                        owner: owner.filter(|o| !o.is_empty()),
                        gpu_seconds,
                        interruptible_seconds,
                    }
                },
            )
            .collect())
    })
}

/// Each owner's cost and GPU-seconds per hour, kind and currency in `[from_ms, to_ms)`, for the
/// owners with a value in `dimension`, summed by the database (a row per owner-hour, where the
/// hourly rollups hold one per GPU), each with its team's value in `team_dimension` (`None`
/// without one): what scale-to-zero reads, scoped by team.
pub async fn owner_hours(
    on: impl Into<On<'_>>,
    from_ms: i64,
    to_ms: i64,
    dimension: &str,
    team_dimension: &str,
) -> Result<Vec<(Option<String>, gpuledger_core::scale_to_zero::OwnerHour)>, StoreError> {
    let mut conn = on.into().read().await?;
    on_backend!(conn, |ex| {
        // Read from the hours summed per host, an owner's values from `owner_values` (never
        // by parsing its labels on each row), and summed once: a first sum per owner-hour
        // barely shrinks the rows and, past the database's work memory, spills to disk.
        // Of it, what hours a commitment covered cost: turning an owner off then frees
        // commitment, not cash.
        let sql = "SELECT r.hour_ms, ov.value, ot.value, r.kind, r.currency,
                    CAST(SUM(r.cost_nano) AS BIGINT), CAST(SUM(r.cost_atto) AS BIGINT),
                    SUM(r.gpu_seconds),
                    CAST(SUM(CASE WHEN r.pricing_category = 'committed' THEN r.cost_nano
                                  ELSE 0 END) AS BIGINT),
                    CAST(SUM(CASE WHEN r.pricing_category = 'committed' THEN r.cost_atto
                                  ELSE 0 END) AS BIGINT)
             FROM rollup_host_hours r
                  JOIN owner_values ov ON ov.owner_id = r.owner_id AND ov.dimension = $3
                  LEFT JOIN owner_values ot ON ot.owner_id = r.owner_id AND ot.dimension = $4
             WHERE r.hour_ms >= $1 AND r.hour_ms < $2
             GROUP BY r.hour_ms, ov.value, ot.value, r.kind, r.currency";
        type Row = (
            i64,
            String,
            Option<String>,
            String,
            String,
            i64,
            i64,
            f64,
            i64,
            i64,
        );
        let rows: Vec<Row> = sqlx::query_as(sql)
            .bind(from_ms)
            .bind(to_ms)
            .bind(dimension)
            .bind(team_dimension)
            .fetch_all(&mut *ex)
            .await?;
        Ok(rows
            .into_iter()
            .map(
                |(hour_ms, key, team, kind, currency, nano, atto, gpu_seconds, c_nano, c_atto)| {
                    let hour = gpuledger_core::scale_to_zero::OwnerHour {
                        key,
                        hour_ms,
                        currency,
                        // As the ledger reads it: a kind this build does not know is unwatched.
                        kind: gpuledger_core::attribution::Kind::parse(&kind)
                            .unwrap_or(gpuledger_core::attribution::Kind::Unmonitored),
                        cost: gpuledger_core::money::from_nano_atto(nano, atto),
                        committed: gpuledger_core::money::from_nano_atto(c_nano, c_atto),
                        gpu_seconds,
                    };
                    (team.filter(|t| !t.is_empty()), hour)
                },
            )
            .collect())
    })
}

/// Per host instance type, currency and pricing category, the billed cost and GPU-seconds of
/// `[from_ms, to_ms)` (rate-card estimates left out): how much of each type commitments
/// covered, and what a GPU-hour cost under them.
pub async fn cost_by_type(
    on: impl Into<On<'_>>,
    from_ms: i64,
    to_ms: i64,
) -> Result<Vec<gpuledger_core::commitment::TypeCost>, StoreError> {
    use gpuledger_core::time::DAY_MS;
    // Whole days from the days summed per host, the hours at either edge from the hours.
    let first_day = (from_ms + DAY_MS - 1).div_euclid(DAY_MS) * DAY_MS;
    let end_day = to_ms.div_euclid(DAY_MS) * DAY_MS;
    let (first_day, end_day) = if first_day < end_day {
        (first_day, end_day)
    } else {
        (to_ms, to_ms)
    };
    let mut conn = on.into().read().await?;
    on_backend!(conn, |ex| {
        let rows: Vec<(String, String, String, i64, i64, f64)> = sqlx::query_as(
            "SELECT h.instance_type, r.currency, r.pricing_category,
                    CAST(SUM(r.cost_nano) AS BIGINT), CAST(SUM(r.cost_atto) AS BIGINT),
                    SUM(r.gpu_seconds)
             FROM (SELECT host_id, currency, pricing_category, cost_nano, cost_atto, gpu_seconds
                   FROM rollup_host_hours
                   WHERE hour_ms >= $1 AND hour_ms < $2 AND (hour_ms < $3 OR hour_ms >= $4)
                     AND estimated = 0
                   UNION ALL
                   SELECT host_id, currency, pricing_category, cost_nano, cost_atto, gpu_seconds
                   FROM rollup_host_days
                   WHERE day_ms >= $3 AND day_ms < $4 AND estimated = 0) r
                  JOIN hosts h ON h.id = r.host_id
             WHERE h.instance_type IS NOT NULL
             GROUP BY h.instance_type, r.currency, r.pricing_category
             ORDER BY h.instance_type, r.currency, r.pricing_category",
        )
        .bind(from_ms)
        .bind(to_ms)
        .bind(first_day)
        .bind(end_day)
        .fetch_all(&mut *ex)
        .await?;
        Ok(rows
            .into_iter()
            .map(
                |(instance_type, currency, pricing_category, nano, atto, gpu_seconds)| {
                    gpuledger_core::commitment::TypeCost {
                        instance_type,
                        currency,
                        pricing_category,
                        cost: gpuledger_core::money::from_nano_atto(nano, atto),
                        gpu_seconds,
                    }
                },
            )
            .collect())
    })
}

/// What a rollup row reads after its period and GPU: its owner's text, then the rest.
pub(super) const OWNER_AND_AMOUNTS: &str =
    "o.labels AS owner, kind, pricing_category, currency, estimated,
    cost_nano, cost_atto, gpu_seconds, util_gpu_seconds, util_known_seconds, energy_j,
    energy_known_seconds";

/// Rollup rows with `period_ms` in `[from_ms, to_ms)`.
pub async fn rollup_rows(
    on: impl Into<On<'_>>,
    grain: super::RollupGrain,
    from_ms: i64,
    to_ms: i64,
) -> Result<Vec<super::RollupRow>, StoreError> {
    let mut conn = on.into().read().await?;
    on_backend!(conn, |ex, DB| {
        use super::RollupGrain::*;
        let hours = "SELECT hour_ms AS period_ms, host_id, gpu_uuid";
        let days = "SELECT day_ms AS period_ms, host_id, gpu_uuid";
        let (select, table, filter) = match grain {
            Hour => (
                hours,
                "rollup_hours",
                "hour_ms >= $1 AND hour_ms < $2".to_owned(),
            ),
            OwnerHour(dimension) => {
                // From the hours summed per host, the dimension's owners found by their values
                // (never by parsing labels on each row): a month's training runs read a row per
                // host-hour and owner, where the hourly rollups hold one per GPU.
                let sql = "SELECT r.hour_ms AS period_ms, r.host_id, '' AS gpu_uuid,
                        o.labels AS owner, r.kind, r.pricing_category, r.currency, r.estimated,
                        r.cost_nano, r.cost_atto, r.gpu_seconds,
                        CAST(0 AS DOUBLE PRECISION) AS util_gpu_seconds,
                        CAST(0 AS DOUBLE PRECISION) AS util_known_seconds,
                        CAST(0 AS DOUBLE PRECISION) AS energy_j,
                        CAST(0 AS DOUBLE PRECISION) AS energy_known_seconds
                     FROM rollup_host_hours r
                          JOIN owner_values ov ON ov.owner_id = r.owner_id AND ov.dimension = $3
                          JOIN owners o ON o.id = r.owner_id
                     WHERE r.hour_ms >= $1 AND r.hour_ms < $2";
                return Ok(sqlx::query_as(sql)
                    .bind(from_ms)
                    .bind(to_ms)
                    .bind(dimension)
                    .fetch_all(&mut *ex)
                    .await?);
            }
            Day => (
                days,
                "rollup_days",
                "day_ms >= $1 AND day_ms < $2".to_owned(),
            ),
            HostDay => (
                "SELECT day_ms AS period_ms, host_id, '' AS gpu_uuid",
                "rollup_host_days",
                "day_ms >= $1 AND day_ms < $2".to_owned(),
            ),
            HostRange => {
                // Sums stay exact: atto parts carry over into nano parts in integer math. Days
                // without GPU time (billed, nobody reported) stay apart from those with it:
                // variance tells cost without hours from cost per hour.
                let sql = "SELECT CAST($1 AS BIGINT) AS period_ms, host_id, '' AS gpu_uuid,
                        o.labels AS owner, kind, pricing_category, currency, estimated,
                        CAST(SUM(cost_nano) AS BIGINT)
                            + CAST(SUM(cost_atto) AS BIGINT) / 1000000000 AS cost_nano,
                        CAST(SUM(cost_atto) AS BIGINT) % 1000000000 AS cost_atto,
                        SUM(gpu_seconds) AS gpu_seconds, SUM(util_gpu_seconds) AS util_gpu_seconds,
                        SUM(util_known_seconds) AS util_known_seconds, SUM(energy_j) AS energy_j,
                        SUM(energy_known_seconds) AS energy_known_seconds
                     FROM rollup_host_days JOIN owners o ON o.id = owner_id
                     WHERE day_ms >= $1 AND day_ms < $2
                     GROUP BY host_id, o.id, o.labels, kind, pricing_category, currency, estimated,
                         CASE WHEN gpu_seconds = 0 THEN 1 ELSE 0 END";
                return Ok(sqlx::query_as(sql)
                    .bind(from_ms)
                    .bind(to_ms)
                    .fetch_all(&mut *ex)
                    .await?);
            }
            HostGroupRange => {
                // As HostRange, over hosts alike but for their names. A row of a host no
                // longer known (no `hosts` row) stays, in a group of its own kind.
                let sql = "SELECT CAST($1 AS BIGINT) AS period_ms, MIN(r.host_id) AS host_id,
                        '' AS gpu_uuid, o.labels AS owner, r.kind, r.pricing_category,
                        r.currency, r.estimated,
                        CAST(SUM(r.cost_nano) AS BIGINT)
                            + CAST(SUM(r.cost_atto) AS BIGINT) / 1000000000 AS cost_nano,
                        CAST(SUM(r.cost_atto) AS BIGINT) % 1000000000 AS cost_atto,
                        SUM(r.gpu_seconds) AS gpu_seconds,
                        SUM(r.util_gpu_seconds) AS util_gpu_seconds,
                        SUM(r.util_known_seconds) AS util_known_seconds,
                        SUM(r.energy_j) AS energy_j,
                        SUM(r.energy_known_seconds) AS energy_known_seconds
                     FROM rollup_host_days r JOIN owners o ON o.id = r.owner_id
                        LEFT JOIN hosts h ON h.id = r.host_id
                     WHERE r.day_ms >= $1 AND r.day_ms < $2
                     GROUP BY h.id IS NULL, h.cluster, h.provider, h.region, h.instance_type,
                         h.lifecycle, h.from_bill, o.id, o.labels, r.kind, r.pricing_category,
                         r.currency, r.estimated, CASE WHEN r.gpu_seconds = 0 THEN 1 ELSE 0 END";
                return Ok(sqlx::query_as(sql)
                    .bind(from_ms)
                    .bind(to_ms)
                    .fetch_all(&mut *ex)
                    .await?);
            }
        };
        let sql = format!(
            "{select}, {OWNER_AND_AMOUNTS}
             FROM {table} JOIN owners o ON o.id = owner_id WHERE {filter}"
        );
        Ok(sqlx::query_as(&sql)
            .bind(from_ms)
            .bind(to_ms)
            .fetch_all(&mut *ex)
            .await?)
    })
}

/// Whether the ledger holds anything for `[from_ms, to_ms)`: a rollup row or unattributed
/// cost in any hour of it; with `from_windows_only`, a row attributed to a GPU (which only
/// raw windows can give).
pub async fn has_rollups(
    on: impl Into<On<'_>>,
    from_ms: i64,
    to_ms: i64,
    from_windows_only: bool,
) -> Result<bool, StoreError> {
    let mut conn = on.into().read().await?;
    on_backend!(conn, |ex| {
        let sql = if from_windows_only {
            "SELECT EXISTS (SELECT 1 FROM rollup_hours
                            WHERE hour_ms >= $1 AND hour_ms < $2 AND gpu_uuid <> '')"
        } else {
            "SELECT EXISTS (SELECT 1 FROM rollup_hours WHERE hour_ms >= $1 AND hour_ms < $2)
                 OR EXISTS (SELECT 1 FROM rollup_unattributed
                            WHERE hour_ms >= $1 AND hour_ms < $2)"
        };
        let (any,): (bool,) = sqlx::query_as(sql)
            .bind(from_ms)
            .bind(to_ms)
            .fetch_one(&mut *ex)
            .await?;
        Ok(any)
    })
}

/// Unattributed cost per currency in `[from_ms, to_ms)` (hour_ms is `from_ms`).
pub async fn rollup_unattributed(
    on: impl Into<On<'_>>,
    from_ms: i64,
    to_ms: i64,
) -> Result<Vec<super::UnattributedRow>, StoreError> {
    let mut conn = on.into().read().await?;
    on_backend!(conn, |ex| {
        Ok(sqlx::query_as(
            "SELECT CAST($1 AS BIGINT) AS hour_ms, currency,
                    CAST(SUM(cost_nano) AS BIGINT) AS cost_nano,
                    CAST(SUM(cost_atto) AS BIGINT) AS cost_atto
             FROM rollup_unattributed WHERE hour_ms >= $1 AND hour_ms < $2
             GROUP BY currency ORDER BY currency",
        )
        .bind(from_ms)
        .bind(to_ms)
        .fetch_all(&mut *ex)
        .await?)
    })
}

/// The `limit` GPUs that cost most in the days of `[from_ms, to_ms)`, costliest first, and
/// how many GPUs have rows there.
pub async fn rollup_top_gpus(
    on: impl Into<On<'_>>,
    from_ms: i64,
    to_ms: i64,
    limit: i64,
) -> Result<(Vec<String>, i64), StoreError> {
    let mut conn = on.into().read().await?;
    on_backend!(conn, |ex| {
        // One pass: the window counts the grouped GPUs before the limit applies.
        let top: Vec<(String, i64)> = sqlx::query_as(
            "SELECT gpu_uuid, COUNT(*) OVER () FROM rollup_days
             WHERE day_ms >= $1 AND day_ms < $2 AND gpu_uuid <> ''
             GROUP BY gpu_uuid
             ORDER BY CAST(SUM(cost_nano) AS BIGINT) + CAST(SUM(cost_atto) AS BIGINT) / 1000000000 DESC,
                gpu_uuid
             LIMIT $3",
        )
        .bind(from_ms)
        .bind(to_ms)
        .bind(limit)
        .fetch_all(&mut *ex)
        .await?;
        let count = top.first().map_or(0, |(_, n)| *n);
        Ok((top.into_iter().map(|(g, _)| g).collect(), count))
    })
}

/// The daily rows of these GPUs in `[from_ms, to_ms)`.
pub async fn rollup_gpu_days(
    on: impl Into<On<'_>>,
    from_ms: i64,
    to_ms: i64,
    gpus: &[String],
) -> Result<Vec<super::RollupRow>, StoreError> {
    let mut conn = on.into().read().await?;
    on_backend!(conn, |ex, DB| {
        let mut rows = Vec::new();
        for chunk in gpus.chunks(500) {
            let mut q =
                sqlx::QueryBuilder::<DB>::new("SELECT day_ms AS period_ms, host_id, gpu_uuid, ");
            q.push(OWNER_AND_AMOUNTS)
                .push(" FROM rollup_days JOIN owners o ON o.id = owner_id WHERE day_ms >= ");
            q.push_bind(from_ms)
                .push(" AND day_ms < ")
                .push_bind(to_ms)
                .push(" AND gpu_uuid IN (");
            let mut list = q.separated(", ");
            for g in chunk {
                list.push_bind(g.clone());
            }
            list.push_unseparated(")");
            rows.extend(q.build_query_as().fetch_all(&mut *ex).await?);
        }
        Ok(rows)
    })
}

/// Per experiment, its active hours in the days that start in `[from_ms, to_ms)`.
pub async fn rollup_experiment_days(
    on: impl Into<On<'_>>,
    from_ms: i64,
    to_ms: i64,
) -> Result<Vec<super::ExperimentDayRow>, StoreError> {
    let mut conn = on.into().read().await?;
    on_backend!(conn, |ex| {
        Ok(sqlx::query_as(
            "SELECT day_ms, experiment, first_hour_ms, last_hour_ms, hours
             FROM rollup_experiment_days WHERE day_ms >= $1 AND day_ms < $2",
        )
        .bind(from_ms)
        .bind(to_ms)
        .fetch_all(&mut *ex)
        .await?)
    })
}

/// Cost and GPU time per day, kind, price, currency and value of `dimension` (an empty name:
/// none) in `[from_ms, to_ms)`, summed by the database: from the days summed per host for
/// [`RollupGrain::HostDay`](super::RollupGrain::HostDay), from the hours summed per host (into
/// the days they fall in) for [`RollupGrain::Hour`](super::RollupGrain::Hour). A few rows a day
/// per value, where host-days hold one per host and owner.
pub async fn dimension_days(
    on: impl Into<On<'_>>,
    grain: super::RollupGrain,
    from_ms: i64,
    to_ms: i64,
    dimension: &str,
) -> Result<Vec<DimensionDayRow>, StoreError> {
    let mut conn = on.into().read().await?;
    on_backend!(conn, |ex| {
        let (day, table, period) = if grain.is_daily() {
            ("r.day_ms", "rollup_host_days", "r.day_ms")
        } else {
            (
                "r.hour_ms - r.hour_ms % 86400000",
                "rollup_host_hours",
                "r.hour_ms",
            )
        };
        // Sums stay exact: atto parts carry over into nano parts in integer math.
        let sql = format!(
            "SELECT {day} AS day_ms, ov.value AS value, r.kind, r.pricing_category, r.currency,
                r.estimated,
                CAST(SUM(r.cost_nano) AS BIGINT)
                    + CAST(SUM(r.cost_atto) AS BIGINT) / 1000000000 AS cost_nano,
                CAST(SUM(r.cost_atto) AS BIGINT) % 1000000000 AS cost_atto,
                SUM(r.gpu_seconds) AS gpu_seconds
             FROM {table} r
                  LEFT JOIN owner_values ov ON ov.owner_id = r.owner_id AND ov.dimension = $3
             WHERE {period} >= $1 AND {period} < $2
             GROUP BY {day}, ov.value, r.kind, r.pricing_category, r.currency, r.estimated"
        );
        Ok(sqlx::query_as(&sql)
            .bind(from_ms)
            .bind(to_ms)
            .bind(dimension)
            .fetch_all(&mut *ex)
            .await?)
    })
}

/// [`ValueDayRow`]s of `[from_ms, to_ms)` summed by the database: from the days summed per
/// host for [`RollupGrain::HostDay`](super::RollupGrain::HostDay), from the hourly rows (into
/// the days they fall in) for [`RollupGrain::Hour`](super::RollupGrain::Hour). A few rows a day
/// per value and cluster, where host-days hold one per host and owner.
pub async fn value_days(
    on: impl Into<On<'_>>,
    grain: super::RollupGrain,
    from_ms: i64,
    to_ms: i64,
    dimension: &str,
) -> Result<Vec<ValueDayRow>, StoreError> {
    let mut conn = on.into().read().await?;
    on_backend!(conn, |ex| {
        // The hours per host carry no utilization or energy: the hours at a range's ends are
        // read per GPU, a day or two of rows.
        let (day, table, period) = if grain.is_daily() {
            ("r.day_ms", "rollup_host_days", "r.day_ms")
        } else {
            (
                "r.hour_ms - r.hour_ms % 86400000",
                "rollup_hours",
                "r.hour_ms",
            )
        };
        // Sums stay exact: atto parts carry over into nano parts in integer math.
        let sql = format!(
            "SELECT {day} AS day_ms, ov.value AS value, h.cluster AS cluster, h.region AS region,
                r.kind, r.pricing_category, r.currency, r.estimated,
                CAST(SUM(r.cost_nano) AS BIGINT)
                    + CAST(SUM(r.cost_atto) AS BIGINT) / 1000000000 AS cost_nano,
                CAST(SUM(r.cost_atto) AS BIGINT) % 1000000000 AS cost_atto,
                SUM(r.gpu_seconds) AS gpu_seconds, SUM(r.util_gpu_seconds) AS util_gpu_seconds,
                SUM(r.util_known_seconds) AS util_known_seconds, SUM(r.energy_j) AS energy_j,
                SUM(r.energy_known_seconds) AS energy_known_seconds
             FROM {table} r
                  LEFT JOIN hosts h ON h.id = r.host_id
                  LEFT JOIN owner_values ov ON ov.owner_id = r.owner_id AND ov.dimension = $3
             WHERE {period} >= $1 AND {period} < $2
             GROUP BY {day}, ov.value, h.cluster, h.region, r.kind, r.pricing_category,
                r.currency, r.estimated"
        );
        Ok(sqlx::query_as(&sql)
            .bind(from_ms)
            .bind(to_ms)
            .bind(dimension)
            .fetch_all(&mut *ex)
            .await?)
    })
}

/// Attributed cost per currency of the rows of `grain` (hour or day) in `[from_ms, to_ms)`.
pub async fn rollup_costs(
    on: impl Into<On<'_>>,
    grain: super::RollupGrain,
    from_ms: i64,
    to_ms: i64,
) -> Result<Vec<super::CurrencyCostRow>, StoreError> {
    let mut conn = on.into().read().await?;
    on_backend!(conn, |ex| {
        let (table, period) = if grain.is_daily() {
            ("rollup_days", "day_ms")
        } else {
            ("rollup_hours", "hour_ms")
        };
        // Sums stay exact: atto parts carry over into nano parts in integer math.
        let sql = format!(
            "SELECT currency,
                CAST(SUM(cost_nano) AS BIGINT) + CAST(SUM(cost_atto) AS BIGINT) / 1000000000 AS cost_nano,
                CAST(SUM(cost_atto) AS BIGINT) % 1000000000 AS cost_atto
             FROM {table} WHERE {period} >= $1 AND {period} < $2 GROUP BY currency"
        );
        Ok(sqlx::query_as(&sql)
            .bind(from_ms)
            .bind(to_ms)
            .fetch_all(&mut *ex)
            .await?)
    })
}

/// The first day the ledger holds a row for: where a pattern of past spend can begin.
pub async fn first_day(on: impl Into<On<'_>>) -> Result<Option<i64>, StoreError> {
    let mut conn = on.into().read().await?;
    on_backend!(conn, |ex| {
        let (first,): (Option<i64>,) = sqlx::query_as("SELECT MIN(day_ms) FROM rollup_days")
            .fetch_one(&mut *ex)
            .await?;
        Ok(first)
    })
}
