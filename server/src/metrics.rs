//! Prometheus metrics of this server process (each replica exposes its own), in the Prometheus
//! text exposition format; and the scheduled exports' state, read from the database
//! ([`export_gauges`]).

use prometheus::{
    exponential_buckets, Encoder, Gauge, Histogram, HistogramOpts, IntCounter, IntCounterVec,
    IntGauge, IntGaugeVec, Opts, Registry, TextEncoder,
};

use crate::store::exports::ExportHealth;

pub struct Metrics {
    registry: Registry,
    pub reports_accepted: IntCounter,
    pub reports_duplicate: IntCounter,
    pub reports_rejected: IntCounterVec,
    pub windows_stored: IntCounter,
    pub batch_seconds: Histogram,
    pub agent_spool_depth: IntGaugeVec,
    pub agent_spool_dropped: IntGaugeVec,
    pub exports: IntCounterVec,
    pub owners_unknown: IntCounterVec,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

fn counter(registry: &Registry, name: &str, help: &str) -> IntCounter {
    let c = IntCounter::with_opts(Opts::new(name, help).namespace("gpuledger"))
        .unwrap_or_else(|e| panic!("metric {name}: {e}"));
    let _ = registry.register(Box::new(c.clone()));
    c
}

fn gauge_vec(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
    let g = IntGaugeVec::new(Opts::new(name, help).namespace("gpuledger"), labels)
        .unwrap_or_else(|e| panic!("metric {name}: {e}"));
    let _ = registry.register(Box::new(g.clone()));
    g
}

impl Metrics {
    /// The metric definitions are fixed at compile time; a bad one is a programming error.
    pub fn new() -> Self {
        let registry = Registry::new();
        let reports_rejected = IntCounterVec::new(
            Opts::new("reports_rejected_total", "Reports refused, by reason")
                .namespace("gpuledger"),
            &["reason"],
        )
        .unwrap_or_else(|e| panic!("metric reports_rejected_total: {e}"));
        let _ = registry.register(Box::new(reports_rejected.clone()));
        let batch_seconds = Histogram::with_opts(
            HistogramOpts::new(
                "ingest_batch_seconds",
                "Time to validate and store one report",
            )
            .namespace("gpuledger")
            .buckets(exponential_buckets(0.001, 2.0, 14).unwrap_or_default()),
        )
        .unwrap_or_else(|e| panic!("metric ingest_batch_seconds: {e}"));
        let _ = registry.register(Box::new(batch_seconds.clone()));
        let exports = IntCounterVec::new(
            Opts::new(
                "exports_total",
                "Scheduled exports to object storage tried by this replica, by result (done, failed)",
            )
            .namespace("gpuledger"),
            &["result"],
        )
        .unwrap_or_else(|e| panic!("metric exports_total: {e}"));
        let _ = registry.register(Box::new(exports.clone()));
        let owners_unknown = IntCounterVec::new(
            Opts::new(
                "process_windows_owner_unknown_total",
                "Process windows stored whose owner an agent could not read fully, by cluster and \
                 cause (docs/owners.md: cgroup_unreadable, kubelet_*, k8s_gpu_shared, slurm_*, \
                 other)",
            )
            .namespace("gpuledger"),
            &["cluster", "cause"],
        )
        .unwrap_or_else(|e| panic!("metric process_windows_owner_unknown_total: {e}"));
        let _ = registry.register(Box::new(owners_unknown.clone()));
        Metrics {
            reports_accepted: counter(&registry, "reports_accepted_total", "Reports stored"),
            reports_duplicate: counter(
                &registry,
                "reports_duplicate_total",
                "Reports acknowledged as repeats of a stored batch",
            ),
            windows_stored: counter(&registry, "windows_stored_total", "GPU windows stored"),
            agent_spool_depth: gauge_vec(
                &registry,
                "agent_spool_depth",
                "Batches waiting in an agent's spool, as the agent last reported",
                &["cluster", "hostname"],
            ),
            agent_spool_dropped: gauge_vec(
                &registry,
                "agent_spool_dropped",
                "Batches an agent dropped because its spool was full, as it last reported",
                &["cluster", "hostname"],
            ),
            reports_rejected,
            batch_seconds,
            exports,
            owners_unknown,
            registry,
        }
    }

    /// Exposes the store's ingest group counters beside this process's own.
    pub fn register_ingest_groups(&self, counters: &crate::store::GroupCounters) {
        let _ = self.registry.register(Box::new(counters.groups.clone()));
        let _ = self.registry.register(Box::new(counters.reports.clone()));
        let _ = self.registry.register(Box::new(counters.alone.clone()));
    }

    /// Counts the stored report's process windows that carry an `owner_unknown`.
    pub fn count_owners_unknown(&self, report: &gpuledger_proto::Report) {
        let causes = report
            .windows
            .iter()
            .flat_map(|w| &w.gpus)
            .flat_map(|g| &g.processes)
            .filter_map(|p| p.owner_unknown.as_deref());
        for cause in causes {
            let cause = gpuledger_proto::OWNER_UNKNOWN_CAUSES
                .into_iter()
                .find(|c| *c == cause)
                .unwrap_or("other");
            self.owners_unknown
                .with_label_values(&[&report.host.cluster, cause])
                .inc();
        }
    }

    /// One period's export tried: `done` or `failed`.
    pub fn export_outcome(&self, result: &str) {
        self.exports.with_label_values(&[result]).inc();
    }

    pub fn reject(&self, reason: &str) {
        self.reports_rejected.with_label_values(&[reason]).inc();
    }

    pub fn set_agent_spool(
        &self,
        cluster: &str,
        hostname: &str,
        depth: Option<i64>,
        dropped: Option<i64>,
    ) {
        if let Some(d) = depth {
            self.agent_spool_depth
                .with_label_values(&[cluster, hostname])
                .set(d);
        }
        if let Some(d) = dropped {
            self.agent_spool_dropped
                .with_label_values(&[cluster, hostname])
                .set(d);
        }
    }

    pub fn encode(&self) -> Result<String, prometheus::Error> {
        let mut out = Vec::new();
        TextEncoder::new().encode(&self.registry.gather(), &mut out)?;
        Ok(String::from_utf8_lossy(&out).into_owned())
    }
}

/// The scheduled exports' state as gauges. Read from the database, not counted here, so every
/// replica says the same, and a failure stays visible after the replica that saw it restarts
/// or another one takes the job.
pub fn export_gauges(health: &ExportHealth) -> Result<String, prometheus::Error> {
    let registry = Registry::new();
    let failing = IntGauge::with_opts(
        Opts::new(
            "exports_failing",
            "Scheduled export periods whose last try failed and that are not written yet",
        )
        .namespace("gpuledger"),
    )?;
    failing.set(health.failing);
    registry.register(Box::new(failing))?;
    // Absent until a first export is written: 0 would read as "failing since 1970".
    if let Some(ms) = health.last_done_ms {
        let last = Gauge::with_opts(
            Opts::new(
                "exports_last_success_timestamp_seconds",
                "When the latest scheduled export period was written to object storage",
            )
            .namespace("gpuledger"),
        )?;
        last.set(ms as f64 / 1000.0);
        registry.register(Box::new(last))?;
    }
    let mut out = Vec::new();
    TextEncoder::new().encode(&registry.gather(), &mut out)?;
    Ok(String::from_utf8_lossy(&out).into_owned())
}
