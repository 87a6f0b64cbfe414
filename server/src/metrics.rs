//! Prometheus metrics of this server process (each replica exposes its own).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HostLabels {
    pub cluster: String,
    pub hostname: String,
}

pub struct Metrics {
    registry: Registry,
    pub reports_accepted: Counter,
    pub reports_duplicate: Counter,
    pub reports_rejected: Family<ReasonLabels, Counter>,
    pub windows_stored: Counter,
    pub batch_seconds: Histogram,
    pub agent_spool_depth: Family<HostLabels, Gauge>,
    pub agent_spool_dropped: Family<HostLabels, Gauge>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("gpuledger");
        let reports_accepted = Counter::default();
        let reports_duplicate = Counter::default();
        let reports_rejected = Family::<ReasonLabels, Counter>::default();
        let windows_stored = Counter::default();
        let batch_seconds = Histogram::new(exponential_buckets(0.001, 2.0, 14));
        let agent_spool_depth = Family::<HostLabels, Gauge>::default();
        let agent_spool_dropped = Family::<HostLabels, Gauge>::default();
        registry.register(
            "reports_accepted",
            "Reports stored",
            reports_accepted.clone(),
        );
        registry.register(
            "reports_duplicate",
            "Reports acknowledged as repeats of a stored batch",
            reports_duplicate.clone(),
        );
        registry.register(
            "reports_rejected",
            "Reports refused, by reason",
            reports_rejected.clone(),
        );
        registry.register(
            "windows_stored",
            "GPU windows stored",
            windows_stored.clone(),
        );
        registry.register(
            "ingest_batch_seconds",
            "Time to validate and store one report",
            batch_seconds.clone(),
        );
        registry.register(
            "agent_spool_depth",
            "Batches waiting in an agent's spool, as the agent last reported",
            agent_spool_depth.clone(),
        );
        registry.register(
            "agent_spool_dropped",
            "Batches an agent dropped because its spool was full, as it last reported",
            agent_spool_dropped.clone(),
        );
        Metrics {
            registry,
            reports_accepted,
            reports_duplicate,
            reports_rejected,
            windows_stored,
            batch_seconds,
            agent_spool_depth,
            agent_spool_dropped,
        }
    }

    pub fn reject(&self, reason: &str) {
        self.reports_rejected
            .get_or_create(&ReasonLabels {
                reason: reason.to_owned(),
            })
            .inc();
    }

    pub fn encode(&self) -> Result<String, std::fmt::Error> {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)?;
        Ok(out)
    }
}
