//! Storage: one [`Store`] trait, with a SQLite implementation (the embedded default) and a
//! PostgreSQL one (production, shared by several server replicas), chosen by URL scheme.
//!
//! Both run the same SQL where the dialects agree (`$N` placeholders work on both through sqlx);
//! each backend owns its migrations folder. The contract tests in `tests.rs` run every case on
//! both backends so they cannot drift apart.

mod postgres;
mod sqlite;
#[cfg(test)]
mod tests;

use std::sync::Arc;

use async_trait::async_trait;
use gpuledger_proto::Report;

pub use postgres::PostgresStore;
pub use sqlite::SqliteStore;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{0} already exists")]
    Conflict(String),
    #[error("database: {0}")]
    Database(#[from] sqlx::Error),
    #[error("migrations: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error("unsupported database URL {0:?}: use sqlite:PATH or postgres://...")]
    UnsupportedUrl(String),
    #[error("{0}")]
    Invalid(String),
}

#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct TokenRow {
    pub id: i64,
    pub name: String,
    pub created_ms: i64,
    pub revoked_ms: Option<i64>,
}

/// What the agent said about itself beside the report (spool headers).
#[derive(Debug, Clone, Copy, Default)]
pub struct AgentStatus {
    pub spool_depth: Option<i64>,
    pub spool_dropped: Option<i64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IngestOutcome {
    Stored,
    /// This batch id was stored before; nothing changed.
    Duplicate,
}

/// One GPU on the fleet page, with its host.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct FleetRow {
    pub cluster: String,
    pub hostname: String,
    pub instance_type: Option<String>,
    pub last_report_ms: i64,
    pub spool_depth: Option<i64>,
    pub uuid: Option<String>,
    pub gpu_index: Option<i64>,
    pub name: Option<String>,
    pub parent_uuid: Option<String>,
    pub memory_total_bytes: Option<i64>,
    pub last_util_avg: Option<f64>,
    pub last_memory_used_bytes: Option<i64>,
    pub last_window_end_ms: Option<i64>,
}

/// A process in the latest window of its GPU.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct FleetProcess {
    pub gpu_uuid: String,
    pub pid: i64,
    pub process_name: Option<String>,
    pub memory_used_max_bytes: Option<i64>,
    pub sm_util_avg: Option<f64>,
    pub labels_json: String,
}

/// A stored GPU window, as read back.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct StoredGpuWindow {
    pub gpu_uuid: String,
    pub start_ms: i64,
    pub end_ms: i64,
    pub samples: i64,
    pub memory_total_bytes: Option<i64>,
    pub memory_used_max_bytes: Option<i64>,
    pub util_avg: Option<f64>,
    pub util_max: Option<f64>,
    pub mem_util_avg: Option<f64>,
    pub power_avg_watts: Option<f64>,
    pub temperature_max_c: Option<f64>,
    pub energy_mj: Option<i64>,
}

#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct StoredProcessWindow {
    pub gpu_uuid: String,
    pub start_ms: i64,
    pub pid: i64,
    pub process_name: Option<String>,
    pub memory_used_max_bytes: Option<i64>,
    pub sm_util_avg: Option<f64>,
    pub model: Option<String>,
    pub experiment: Option<String>,
    pub endpoint: Option<String>,
    pub team: Option<String>,
    pub labels_json: String,
    pub container_id: Option<String>,
    pub pod_uid: Option<String>,
}

#[async_trait]
pub trait Store: Send + Sync {
    /// `sqlite` or `postgres`.
    fn backend(&self) -> &'static str;
    async fn ping(&self) -> Result<(), StoreError>;

    async fn create_token(&self, name: &str, hash: &str, now_ms: i64) -> Result<(), StoreError>;
    async fn list_tokens(&self) -> Result<Vec<TokenRow>, StoreError>;
    /// Returns whether an active token by that name was revoked.
    async fn revoke_token(&self, name: &str, now_ms: i64) -> Result<bool, StoreError>;
    /// An active (not revoked) token with this hash.
    async fn active_token(&self, hash: &str) -> Result<Option<TokenRow>, StoreError>;

    /// Stores a validated report in one transaction, at most once per batch id.
    async fn ingest(
        &self,
        report: &Report,
        token_id: i64,
        agent: AgentStatus,
        now_ms: i64,
    ) -> Result<IngestOutcome, StoreError>;

    async fn fleet(&self) -> Result<Vec<FleetRow>, StoreError>;
    async fn fleet_processes(&self) -> Result<Vec<FleetProcess>, StoreError>;

    /// Windows that start in `[from_ms, to_ms)`, ordered by GPU and time.
    async fn gpu_windows(
        &self,
        from_ms: i64,
        to_ms: i64,
    ) -> Result<Vec<StoredGpuWindow>, StoreError>;
    async fn process_windows(
        &self,
        from_ms: i64,
        to_ms: i64,
    ) -> Result<Vec<StoredProcessWindow>, StoreError>;
    async fn batch_count(&self) -> Result<i64, StoreError>;
}

/// Opens the database named by `url` and brings its schema up to date.
pub async fn connect(url: &str) -> Result<Arc<dyn Store>, StoreError> {
    if url.starts_with("sqlite:") {
        Ok(Arc::new(SqliteStore::connect(url).await?))
    } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        Ok(Arc::new(PostgresStore::connect(url).await?))
    } else {
        Err(StoreError::UnsupportedUrl(url.to_owned()))
    }
}

/// Converts a byte or counter value that validation has already bounded.
pub(crate) fn to_i64(v: Option<u64>) -> Option<i64> {
    v.map(|v| i64::try_from(v).unwrap_or(i64::MAX))
}

/// The SQL both backends share. Written once, expanded once per backend, because sqlx's
/// executor types differ per database while the statements do not.
macro_rules! shared_sql_impl {
    ($db:ty) => {
        async fn create_token_sql(
            pool: &sqlx::Pool<$db>,
            name: &str,
            hash: &str,
            now_ms: i64,
        ) -> Result<(), $crate::store::StoreError> {
            let result = sqlx::query(
                "INSERT INTO api_tokens (name, token_hash, created_ms) VALUES ($1, $2, $3)
                 ON CONFLICT DO NOTHING",
            )
            .bind(name)
            .bind(hash)
            .bind(now_ms)
            .execute(pool)
            .await?;
            if result.rows_affected() == 0 {
                return Err($crate::store::StoreError::Conflict(format!("token {name:?}")));
            }
            Ok(())
        }

        async fn list_tokens_sql(
            pool: &sqlx::Pool<$db>,
        ) -> Result<Vec<$crate::store::TokenRow>, $crate::store::StoreError> {
            Ok(sqlx::query_as(
                "SELECT id, name, created_ms, revoked_ms FROM api_tokens ORDER BY name",
            )
            .fetch_all(pool)
            .await?)
        }

        async fn revoke_token_sql(
            pool: &sqlx::Pool<$db>,
            name: &str,
            now_ms: i64,
        ) -> Result<bool, $crate::store::StoreError> {
            let result = sqlx::query(
                "UPDATE api_tokens SET revoked_ms = $2 WHERE name = $1 AND revoked_ms IS NULL",
            )
            .bind(name)
            .bind(now_ms)
            .execute(pool)
            .await?;
            Ok(result.rows_affected() > 0)
        }

        async fn active_token_sql(
            pool: &sqlx::Pool<$db>,
            hash: &str,
        ) -> Result<Option<$crate::store::TokenRow>, $crate::store::StoreError> {
            Ok(sqlx::query_as(
                "SELECT id, name, created_ms, revoked_ms FROM api_tokens
                 WHERE token_hash = $1 AND revoked_ms IS NULL",
            )
            .bind(hash)
            .fetch_optional(pool)
            .await?)
        }

        async fn ingest_sql(
            tx: &mut sqlx::Transaction<'_, $db>,
            report: &gpuledger_proto::Report,
            token_id: i64,
            agent: $crate::store::AgentStatus,
            now_ms: i64,
        ) -> Result<$crate::store::IngestOutcome, $crate::store::StoreError> {
            use $crate::store::to_i64;
            let h = &report.host;
            let (host_id,): (i64,) = sqlx::query_as(
                "INSERT INTO hosts (cluster, hostname, provider, instance_id, instance_type, region,
                                    agent_version, last_report_ms, spool_depth, spool_dropped)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
                 ON CONFLICT (cluster, hostname) DO UPDATE SET
                    provider = COALESCE(excluded.provider, hosts.provider),
                    instance_id = COALESCE(excluded.instance_id, hosts.instance_id),
                    instance_type = COALESCE(excluded.instance_type, hosts.instance_type),
                    region = COALESCE(excluded.region, hosts.region),
                    agent_version = excluded.agent_version,
                    last_report_ms = CASE WHEN excluded.last_report_ms > hosts.last_report_ms
                                          THEN excluded.last_report_ms ELSE hosts.last_report_ms END,
                    spool_depth = COALESCE(excluded.spool_depth, hosts.spool_depth),
                    spool_dropped = COALESCE(excluded.spool_dropped, hosts.spool_dropped)
                 RETURNING id",
            )
            .bind(&h.cluster)
            .bind(&h.hostname)
            .bind(&h.provider)
            .bind(&h.instance_id)
            .bind(&h.instance_type)
            .bind(&h.region)
            .bind(&report.agent_version)
            .bind(now_ms)
            .bind(agent.spool_depth)
            .bind(agent.spool_dropped)
            .fetch_one(&mut **tx)
            .await?;

            let inserted = sqlx::query(
                "INSERT INTO ingested_batches (batch_id, host_id, token_id, received_ms, windows)
                 VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING",
            )
            .bind(&report.batch_id)
            .bind(host_id)
            .bind(token_id)
            .bind(now_ms)
            .bind(report.windows.len() as i64)
            .execute(&mut **tx)
            .await?;
            if inserted.rows_affected() == 0 {
                return Ok($crate::store::IngestOutcome::Duplicate);
            }

            for w in &report.windows {
                for g in &w.gpus {
                    sqlx::query(
                        "INSERT INTO gpu_windows (gpu_uuid, start_ms, end_ms, host_id, batch_id, samples,
                            memory_total_bytes, memory_used_max_bytes, util_avg, util_max, mem_util_avg,
                            power_avg_watts, temperature_max_c, energy_mj)
                         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)
                         ON CONFLICT DO NOTHING",
                    )
                    .bind(&g.uuid)
                    .bind(w.start_ms)
                    .bind(w.end_ms)
                    .bind(host_id)
                    .bind(&report.batch_id)
                    .bind(i64::from(w.samples))
                    .bind(to_i64(g.memory_total_bytes))
                    .bind(to_i64(g.memory_used_max_bytes))
                    .bind(g.util_avg)
                    .bind(g.util_max)
                    .bind(g.mem_util_avg)
                    .bind(g.power_avg_watts)
                    .bind(g.temperature_max_c)
                    .bind(to_i64(g.energy_mj))
                    .execute(&mut **tx)
                    .await?;

                    sqlx::query(
                        "INSERT INTO gpus (uuid, host_id, gpu_index, name, parent_uuid, memory_total_bytes,
                            last_window_start_ms, last_window_end_ms, last_util_avg, last_memory_used_bytes)
                         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
                         ON CONFLICT (uuid) DO UPDATE SET
                            host_id = excluded.host_id,
                            gpu_index = excluded.gpu_index,
                            name = excluded.name,
                            parent_uuid = excluded.parent_uuid,
                            memory_total_bytes = excluded.memory_total_bytes,
                            last_window_start_ms = excluded.last_window_start_ms,
                            last_window_end_ms = excluded.last_window_end_ms,
                            last_util_avg = excluded.last_util_avg,
                            last_memory_used_bytes = excluded.last_memory_used_bytes
                         WHERE excluded.last_window_start_ms > gpus.last_window_start_ms",
                    )
                    .bind(&g.uuid)
                    .bind(host_id)
                    .bind(i64::from(g.index))
                    .bind(&g.name)
                    .bind(&g.parent_uuid)
                    .bind(to_i64(g.memory_total_bytes))
                    .bind(w.start_ms)
                    .bind(w.end_ms)
                    .bind(g.util_avg)
                    .bind(to_i64(g.memory_used_max_bytes))
                    .execute(&mut **tx)
                    .await?;

                    for p in &g.processes {
                        let label = |k: &str| p.labels.get(k).cloned();
                        let labels_json = serde_json::to_string(&p.labels)
                            .map_err(|e| $crate::store::StoreError::Invalid(e.to_string()))?;
                        sqlx::query(
                            "INSERT INTO process_windows (gpu_uuid, start_ms, pid, end_ms, process_name,
                                memory_used_max_bytes, sm_util_avg, model, experiment, endpoint, team,
                                labels_json, container_id, pod_uid)
                             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)
                             ON CONFLICT DO NOTHING",
                        )
                        .bind(&g.uuid)
                        .bind(w.start_ms)
                        .bind(i64::from(p.pid))
                        .bind(w.end_ms)
                        .bind(&p.name)
                        .bind(to_i64(p.memory_used_max_bytes))
                        .bind(p.sm_util_avg)
                        .bind(label("model"))
                        .bind(label("experiment"))
                        .bind(label("endpoint"))
                        .bind(label("team"))
                        .bind(labels_json)
                        .bind(&p.container_id)
                        .bind(&p.pod_uid)
                        .execute(&mut **tx)
                        .await?;
                    }
                }
            }
            Ok($crate::store::IngestOutcome::Stored)
        }

        /// One transaction per batch: all of it is stored, or (a repeat) none of it.
        async fn ingest_tx(
            pool: &sqlx::Pool<$db>,
            report: &gpuledger_proto::Report,
            token_id: i64,
            agent: $crate::store::AgentStatus,
            now_ms: i64,
        ) -> Result<$crate::store::IngestOutcome, $crate::store::StoreError> {
            let mut tx = pool.begin().await?;
            let outcome = ingest_sql(&mut tx, report, token_id, agent, now_ms).await?;
            match outcome {
                $crate::store::IngestOutcome::Stored => tx.commit().await?,
                $crate::store::IngestOutcome::Duplicate => tx.rollback().await?,
            }
            Ok(outcome)
        }

        async fn fleet_sql(
            pool: &sqlx::Pool<$db>,
        ) -> Result<Vec<$crate::store::FleetRow>, $crate::store::StoreError> {
            Ok(sqlx::query_as(
                "SELECT h.cluster, h.hostname, h.instance_type, h.last_report_ms, h.spool_depth,
                        g.uuid, g.gpu_index, g.name, g.parent_uuid, g.memory_total_bytes,
                        g.last_util_avg, g.last_memory_used_bytes, g.last_window_end_ms
                 FROM hosts h LEFT JOIN gpus g ON g.host_id = h.id
                 ORDER BY h.cluster, h.hostname, g.gpu_index, g.uuid",
            )
            .fetch_all(pool)
            .await?)
        }

        async fn fleet_processes_sql(
            pool: &sqlx::Pool<$db>,
        ) -> Result<Vec<$crate::store::FleetProcess>, $crate::store::StoreError> {
            Ok(sqlx::query_as(
                "SELECT p.gpu_uuid, p.pid, p.process_name, p.memory_used_max_bytes, p.sm_util_avg,
                        p.labels_json
                 FROM process_windows p
                 JOIN gpus g ON g.uuid = p.gpu_uuid AND p.start_ms = g.last_window_start_ms
                 ORDER BY p.gpu_uuid, p.pid",
            )
            .fetch_all(pool)
            .await?)
        }

        async fn gpu_windows_sql(
            pool: &sqlx::Pool<$db>,
            from_ms: i64,
            to_ms: i64,
        ) -> Result<Vec<$crate::store::StoredGpuWindow>, $crate::store::StoreError> {
            Ok(sqlx::query_as(
                "SELECT gpu_uuid, start_ms, end_ms, samples, memory_total_bytes, memory_used_max_bytes,
                        util_avg, util_max, mem_util_avg, power_avg_watts, temperature_max_c, energy_mj
                 FROM gpu_windows WHERE start_ms >= $1 AND start_ms < $2
                 ORDER BY gpu_uuid, start_ms",
            )
            .bind(from_ms)
            .bind(to_ms)
            .fetch_all(pool)
            .await?)
        }

        async fn process_windows_sql(
            pool: &sqlx::Pool<$db>,
            from_ms: i64,
            to_ms: i64,
        ) -> Result<Vec<$crate::store::StoredProcessWindow>, $crate::store::StoreError> {
            Ok(sqlx::query_as(
                "SELECT gpu_uuid, start_ms, pid, process_name, memory_used_max_bytes, sm_util_avg,
                        model, experiment, endpoint, team, labels_json, container_id, pod_uid
                 FROM process_windows WHERE start_ms >= $1 AND start_ms < $2
                 ORDER BY gpu_uuid, start_ms, pid",
            )
            .bind(from_ms)
            .bind(to_ms)
            .fetch_all(pool)
            .await?)
        }

        async fn batch_count_sql(pool: &sqlx::Pool<$db>) -> Result<i64, $crate::store::StoreError> {
            let (n,): (i64,) = sqlx::query_as("SELECT COUNT(*) FROM ingested_batches")
                .fetch_one(pool)
                .await?;
            Ok(n)
        }
    };
}
pub(crate) use shared_sql_impl;

/// The whole `Store` impl for a backend type with a `pool` field: every method forwards to the
/// shared SQL except `ingest`, which calls the backend's own `ingest_batch` (SQLite serialises
/// writers; PostgreSQL does not need to).
macro_rules! store_impl {
    ($store:ty, $name:literal) => {
        #[async_trait::async_trait]
        impl $crate::store::Store for $store {
            fn backend(&self) -> &'static str {
                $name
            }
            async fn ping(&self) -> Result<(), $crate::store::StoreError> {
                sqlx::query("SELECT 1").execute(&self.pool).await?;
                Ok(())
            }
            async fn create_token(
                &self,
                name: &str,
                hash: &str,
                now_ms: i64,
            ) -> Result<(), $crate::store::StoreError> {
                create_token_sql(&self.pool, name, hash, now_ms).await
            }
            async fn list_tokens(
                &self,
            ) -> Result<Vec<$crate::store::TokenRow>, $crate::store::StoreError> {
                list_tokens_sql(&self.pool).await
            }
            async fn revoke_token(
                &self,
                name: &str,
                now_ms: i64,
            ) -> Result<bool, $crate::store::StoreError> {
                revoke_token_sql(&self.pool, name, now_ms).await
            }
            async fn active_token(
                &self,
                hash: &str,
            ) -> Result<Option<$crate::store::TokenRow>, $crate::store::StoreError> {
                active_token_sql(&self.pool, hash).await
            }
            async fn ingest(
                &self,
                report: &gpuledger_proto::Report,
                token_id: i64,
                agent: $crate::store::AgentStatus,
                now_ms: i64,
            ) -> Result<$crate::store::IngestOutcome, $crate::store::StoreError> {
                self.ingest_batch(report, token_id, agent, now_ms).await
            }
            async fn fleet(
                &self,
            ) -> Result<Vec<$crate::store::FleetRow>, $crate::store::StoreError> {
                fleet_sql(&self.pool).await
            }
            async fn fleet_processes(
                &self,
            ) -> Result<Vec<$crate::store::FleetProcess>, $crate::store::StoreError> {
                fleet_processes_sql(&self.pool).await
            }
            async fn gpu_windows(
                &self,
                from_ms: i64,
                to_ms: i64,
            ) -> Result<Vec<$crate::store::StoredGpuWindow>, $crate::store::StoreError> {
                gpu_windows_sql(&self.pool, from_ms, to_ms).await
            }
            async fn process_windows(
                &self,
                from_ms: i64,
                to_ms: i64,
            ) -> Result<Vec<$crate::store::StoredProcessWindow>, $crate::store::StoreError> {
                process_windows_sql(&self.pool, from_ms, to_ms).await
            }
            async fn batch_count(&self) -> Result<i64, $crate::store::StoreError> {
                batch_count_sql(&self.pool).await
            }
        }
    };
}
pub(crate) use store_impl;
