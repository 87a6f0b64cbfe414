//! Allocation: the ledger's parts grouped by an owner dimension and period, per currency. The
//! rules are the core's ([`gpuledger_core::allocation`]); the CSV is written here.

pub use gpuledger_core::allocation::*;

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
            format!("{:.4}", r.energy_kwh),
            r.estimated.to_string(),
        ])?;
    }
    w.into_string()
}
