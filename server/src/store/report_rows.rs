//! A report flattened into columns, the shape bulk inserts bind: PostgreSQL passes each column
//! as one array to `UNNEST`, SQLite writes multi-row `VALUES`. Built once per report, outside
//! any transaction.

use std::collections::{BTreeMap, HashMap};

use gpuledger_proto::Report;
use sha2::{Digest, Sha256};

use super::{to_i64, StoreError};

/// `gpu_windows` rows, column by column.
#[derive(Debug, Default)]
pub(crate) struct GpuWindowColumns {
    pub uuid: Vec<String>,
    pub start_ms: Vec<i64>,
    pub end_ms: Vec<i64>,
    pub samples: Vec<i64>,
    pub memory_total_bytes: Vec<Option<i64>>,
    pub memory_used_max_bytes: Vec<Option<i64>>,
    pub util_avg: Vec<Option<f64>>,
    pub util_max: Vec<Option<f64>>,
    /// `[[percent, samples], …]` as JSON, where the sender measured it.
    pub util_histogram: Vec<Option<String>>,
    pub mem_util_avg: Vec<Option<f64>>,
    pub power_avg_watts: Vec<Option<f64>>,
    pub temperature_max_c: Vec<Option<f64>>,
    pub energy_mj: Vec<Option<i64>>,
    pub mig_gpu_slices: Vec<Option<i64>>,
    pub mig_gpu_instance_id: Vec<Option<i64>>,
    pub mig_instance_slices: Vec<Option<i64>>,
    pub mig_compute_slices: Vec<Option<i64>>,
    pub unseen_memory_bytes: Vec<Option<i64>>,
    pub unseen_cause: Vec<Option<String>>,
    pub fault_code: Vec<Option<String>>,
    pub fault_detail: Vec<Option<String>>,
}

/// `process_windows` rows, column by column.
#[derive(Debug, Default)]
pub(crate) struct ProcessColumns {
    pub gpu_uuid: Vec<String>,
    pub start_ms: Vec<i64>,
    pub pid: Vec<i64>,
    pub end_ms: Vec<i64>,
    pub process_name: Vec<Option<String>>,
    pub memory_used_max_bytes: Vec<Option<i64>>,
    pub sm_util_avg: Vec<Option<f64>>,
    pub labels_json: Vec<String>,
    pub container_id: Vec<Option<String>>,
    pub pod_uid: Vec<Option<String>>,
    pub user_name: Vec<Option<String>>,
}

/// The newest window of one GPU in the report: what the `gpus` row (the fleet page) shows.
#[derive(Debug)]
pub(crate) struct GpuIdentity {
    pub uuid: String,
    pub gpu_index: i64,
    pub name: String,
    pub parent_uuid: Option<String>,
    pub memory_total_bytes: Option<i64>,
    /// The window it was read from: a report's newest window says what the GPU is now.
    pub start_ms: i64,
}

/// `serving_counts` rows, column by column: the report's serving counts summed per endpoint,
/// model and hour (an upsert may touch a row once per statement). A count some window lacks
/// is unknown for the hour.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct ServingColumns {
    pub endpoint: Vec<String>,
    /// `""` where the engine names no model.
    pub model: Vec<String>,
    pub hour_ms: Vec<i64>,
    pub engine: Vec<String>,
    pub requests: Vec<Option<i64>>,
    pub input_tokens: Vec<Option<i64>>,
    pub output_tokens: Vec<Option<i64>>,
}

impl ServingColumns {
    fn extend(&mut self, other: ServingColumns) {
        self.endpoint.extend(other.endpoint);
        self.model.extend(other.model);
        self.hour_ms.extend(other.hour_ms);
        self.engine.extend(other.engine);
        self.requests.extend(other.requests);
        self.input_tokens.extend(other.input_tokens);
        self.output_tokens.extend(other.output_tokens);
    }

    fn of(report: &Report) -> Self {
        type Counts = (String, Option<i64>, Option<i64>, Option<i64>);
        let add = |a: Option<i64>, b: Option<u64>| Some(a?.saturating_add(to_i64(b)?));
        let mut summed: BTreeMap<(&str, &str, i64), Counts> = BTreeMap::new();
        for w in &report.windows {
            let hour = gpuledger_core::time::hour_floor(w.start_ms);
            for s in &w.serving {
                let key = (s.endpoint.as_str(), s.model.as_deref().unwrap_or(""), hour);
                summed
                    .entry(key)
                    .and_modify(|c| {
                        c.0.clone_from(&s.engine);
                        c.1 = add(c.1, s.requests);
                        c.2 = add(c.2, s.input_tokens);
                        c.3 = add(c.3, s.output_tokens);
                    })
                    .or_insert_with(|| {
                        (
                            s.engine.clone(),
                            to_i64(s.requests),
                            to_i64(s.input_tokens),
                            to_i64(s.output_tokens),
                        )
                    });
            }
        }
        let mut c = ServingColumns::default();
        for ((endpoint, model, hour), (engine, requests, input, output)) in summed {
            c.endpoint.push(endpoint.to_owned());
            c.model.push(model.to_owned());
            c.hour_ms.push(hour);
            c.engine.push(engine);
            c.requests.push(requests);
            c.input_tokens.push(input);
            c.output_tokens.push(output);
        }
        c
    }
}

#[derive(Debug, Default)]
pub(crate) struct ReportRows {
    pub gpus: GpuWindowColumns,
    pub processes: ProcessColumns,
    pub serving: ServingColumns,
    /// One per GPU (an upsert may touch a row once per statement), in report order.
    pub identities: Vec<GpuIdentity>,
    /// The hours to roll up again, each once, in order: a window belongs to the hour it starts
    /// in (as attribution counts it).
    pub hours: Vec<i64>,
}

impl ReportRows {
    pub fn of(report: &Report) -> Result<Self, StoreError> {
        let mut rows = ReportRows::default();
        rows.push(report)?;
        Ok(rows)
    }

    /// Several reports' rows in one set of columns, each row tagged with its report's place in
    /// `reports` (PostgreSQL's group-commit statement joins them back to their report).
    pub fn of_group(reports: &[&Report]) -> Result<(Self, GroupIndex), StoreError> {
        let mut rows = ReportRows::default();
        let mut index = GroupIndex::default();
        for (at, report) in reports.iter().enumerate() {
            let before = rows.counts();
            rows.push(report)?;
            let after = rows.counts();
            let at = at as i64;
            let tag = |v: &mut Vec<i64>, from: usize, to: usize| v.extend((from..to).map(|_| at));
            tag(&mut index.gpus, before.0, after.0);
            tag(&mut index.processes, before.1, after.1);
            tag(&mut index.identities, before.2, after.2);
            tag(&mut index.hours, before.3, after.3);
            tag(&mut index.serving, before.4, after.4);
        }
        Ok((rows, index))
    }

    fn counts(&self) -> (usize, usize, usize, usize, usize) {
        (
            self.gpus.uuid.len(),
            self.processes.gpu_uuid.len(),
            self.identities.len(),
            self.hours.len(),
            self.serving.endpoint.len(),
        )
    }

    /// Appends a report's rows. Identities and hours are each once per report.
    fn push(&mut self, report: &Report) -> Result<(), StoreError> {
        let rows = self;
        let mut identity_at: HashMap<&str, usize> = HashMap::new();
        for w in &report.windows {
            for g in &w.gpus {
                let c = &mut rows.gpus;
                c.uuid.push(g.uuid.clone());
                c.start_ms.push(w.start_ms);
                c.end_ms.push(w.end_ms);
                c.samples.push(i64::from(w.samples));
                c.memory_total_bytes.push(to_i64(g.memory_total_bytes));
                c.memory_used_max_bytes
                    .push(to_i64(g.memory_used_max_bytes));
                c.util_avg.push(g.util_avg);
                c.util_max.push(g.util_max);
                c.util_histogram.push(if g.util_histogram.is_empty() {
                    None
                } else {
                    Some(
                        serde_json::to_string(&g.util_histogram)
                            .map_err(|e| StoreError::Invalid(format!("util_histogram: {e}")))?,
                    )
                });
                c.mem_util_avg.push(g.mem_util_avg);
                c.power_avg_watts.push(g.power_avg_watts);
                c.temperature_max_c.push(g.temperature_max_c);
                c.energy_mj.push(to_i64(g.energy_mj));
                let mig = g.mig.as_ref();
                c.mig_gpu_slices.push(g.mig_compute_slices.map(i64::from));
                c.mig_gpu_instance_id
                    .push(mig.map(|m| i64::from(m.gpu_instance_id)));
                c.mig_instance_slices
                    .push(mig.map(|m| i64::from(m.gpu_instance_slices)));
                c.mig_compute_slices
                    .push(mig.map(|m| i64::from(m.compute_instance_slices)));
                c.unseen_memory_bytes.push(to_i64(g.unseen_memory_bytes));
                c.unseen_cause.push(g.unseen_cause.clone());
                c.fault_code.push(g.fault.as_ref().map(|f| f.code.clone()));
                c.fault_detail
                    .push(g.fault.as_ref().map(|f| f.detail.clone()));

                let identity = GpuIdentity {
                    uuid: g.uuid.clone(),
                    gpu_index: i64::from(g.index),
                    name: g.name.clone(),
                    parent_uuid: g.parent_uuid.clone(),
                    memory_total_bytes: to_i64(g.memory_total_bytes),
                    start_ms: w.start_ms,
                };
                match identity_at.get(g.uuid.as_str()) {
                    Some(&i) if rows.identities[i].start_ms >= w.start_ms => {}
                    Some(&i) => rows.identities[i] = identity,
                    None => {
                        identity_at.insert(&g.uuid, rows.identities.len());
                        rows.identities.push(identity);
                    }
                }

                for p in &g.processes {
                    let c = &mut rows.processes;
                    c.gpu_uuid.push(g.uuid.clone());
                    c.start_ms.push(w.start_ms);
                    c.pid.push(i64::from(p.pid));
                    c.end_ms.push(w.end_ms);
                    c.process_name.push(p.name.clone());
                    c.memory_used_max_bytes
                        .push(to_i64(p.memory_used_max_bytes));
                    c.sm_util_avg.push(p.sm_util_avg);
                    c.labels_json.push(
                        serde_json::to_string(&p.labels)
                            .map_err(|e| StoreError::Invalid(e.to_string()))?,
                    );
                    c.container_id.push(p.container_id.clone());
                    c.pod_uid.push(p.pod_uid.clone());
                    c.user_name.push(p.user.clone());
                }
            }
        }
        rows.hours.extend(
            report
                .windows
                .iter()
                .map(|w| gpuledger_core::time::hour_floor(w.start_ms))
                .collect::<std::collections::BTreeSet<_>>(),
        );
        rows.serving.extend(ServingColumns::of(report));
        Ok(())
    }
}

/// For each row of a group's [`ReportRows`], the place of its report in the group.
#[derive(Debug, Default)]
pub(crate) struct GroupIndex {
    pub gpus: Vec<i64>,
    pub processes: Vec<i64>,
    pub identities: Vec<i64>,
    pub hours: Vec<i64>,
    pub serving: Vec<i64>,
}

/// What a retried batch must repeat exactly to be a duplicate: the SHA-256 of the report as
/// decoded (so a re-encoding of the same content matches; labels are ordered maps).
pub(crate) fn content_sha256(report: &Report) -> Result<String, StoreError> {
    let bytes = serde_json::to_vec(report)
        .map_err(|e| StoreError::Invalid(format!("report cannot be encoded: {e}")))?;
    Ok(hex::encode(Sha256::digest(&bytes)))
}
