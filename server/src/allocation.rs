//! Allocation: the ledger's parts grouped by an owner dimension and period, per currency. The
//! rules are the core's ([`gpuledger_core::allocation`]); the CSV is written here.

use gpuledger_core::allocation::*;

pub fn to_csv(rows: &[AllocationRow]) -> Result<String, csv::Error> {
    let mut w = crate::csv_out::SafeCsv::in_memory();
    w.write_record([
        "period_start",
        "key",
        "currency",
        "cost",
        "used_cost",
        "held_idle_cost",
        "idle_cost",
        "unmonitored_cost",
        "gpu_hours",
        "avg_util",
        "presence_gpu_hours",
        "energy_kwh",
        "energy_measured_share",
        "kg_co2e",
        "estimated",
    ])?;
    for r in rows {
        w.write_record([
            r.period_start.clone(),
            r.key.clone(),
            r.currency.clone(),
            r.cost.to_string(),
            r.used_cost.to_string(),
            r.held_idle_cost.to_string(),
            r.idle_cost.to_string(),
            r.unmonitored_cost.to_string(),
            format!("{:.4}", r.gpu_hours),
            r.avg_util.map(|u| format!("{u:.2}")).unwrap_or_default(),
            format!("{:.4}", r.presence_gpu_hours),
            // Unknown is an empty cell, never 0.
            r.energy_kwh.map(|e| format!("{e:.4}")).unwrap_or_default(),
            r.energy_measured_share
                .map(|m| format!("{m:.4}"))
                .unwrap_or_default(),
            r.kg_co2e.map(|k| format!("{k:.4}")).unwrap_or_default(),
            r.estimated.to_string(),
        ])?;
    }
    w.into_string()
}
