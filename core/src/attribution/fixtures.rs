//! Hosts, windows, processes and bill lines for attribution's tests, in the core's and in
//! the server's (whose reconciliation checks the same random fleets): behind the
//! `test-support` feature, never in a build that serves.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rust_decimal::Decimal;
use std::str::FromStr;

use crate::bill::StoredCostLine;
use crate::telemetry::{AttributionWindow, HostRow, StoredProcessWindow};
use crate::time::HOUR_MS;

pub const H: i64 = 1_800_000_000_000 - 1_800_000_000_000 % HOUR_MS;
pub const MIN: i64 = 60_000;
pub const GIB: i64 = 1 << 30;

pub fn d(s: &str) -> Decimal {
    Decimal::from_str(s).unwrap()
}

pub fn host(id: i64, key: &str, instance_type: &str) -> HostRow {
    HostRow {
        id,
        cluster: "c".into(),
        hostname: format!("h{id}"),
        provider: Some("aws".into()),
        instance_id: Some(key.into()),
        instance_key: Some(key.into()),
        instance_type: Some(instance_type.into()),
        lifecycle: None,
        region: None,
        from_bill: false,
    }
}

pub fn window(
    host_id: i64,
    uuid: &str,
    parent: Option<&str>,
    start: i64,
    mins: i64,
    util: Option<f64>,
) -> AttributionWindow {
    AttributionWindow {
        host_id,
        gpu_uuid: uuid.into(),
        parent_uuid: parent.map(Into::into),
        gpu_name: Some("NVIDIA A100-SXM4-80GB".into()),
        start_ms: start,
        end_ms: start + mins * MIN,
        memory_total_bytes: Some(80 * GIB),
        util_avg: util,
        util_histogram: None,
        energy_mj: None,
        ..Default::default()
    }
}

pub fn process(
    uuid: &str,
    start: i64,
    pid: i64,
    model: &str,
    mem_gib: i64,
    sm: Option<f64>,
) -> StoredProcessWindow {
    StoredProcessWindow {
        gpu_uuid: uuid.into(),
        start_ms: start,
        pid,
        process_name: None,
        memory_used_max_bytes: Some(mem_gib * GIB),
        sm_util_avg: sm,
        labels_json: serde_json::json!({"model": model, "team": format!("team-{model}")})
            .to_string(),
        container_id: None,
        pod_uid: None,
        user_name: None,
    }
}

pub fn line(key: &str, start: i64, end: i64, cost: &str, category: &str) -> StoredCostLine {
    StoredCostLine {
        resource_key: Some(key.into()),
        charge_period_start_ms: start,
        charge_period_end_ms: end,
        charge_category: "Usage".into(),
        billed_cost: crate::money::from_text(cost),
        effective_cost: crate::money::from_text(cost),
        currency: "USD".into(),
        pricing_category: category.into(),
        instance_type: None,
        tags_json: "{}".into(),
        commitment_id: None,
        commitment_part: None,
    }
}

/// A random fleet: hosts with GPUs (some in MIG mode), windows with gaps, processes with and
/// without utilization, and bills with several lines per hour, daily lines and odd decimals.
pub fn random_fleet(
    seed: u64,
) -> (
    Vec<HostRow>,
    Vec<AttributionWindow>,
    Vec<StoredProcessWindow>,
    Vec<StoredCostLine>,
) {
    let mut rng = StdRng::seed_from_u64(seed);
    let hours = rng.random_range(1..4);
    let mut hosts = Vec::new();
    let mut windows = Vec::new();
    let mut procs = Vec::new();
    let mut lines = Vec::new();
    for h in 0..rng.random_range(1..5) {
        let key = format!("i-{h}");
        hosts.push(host(h, &key, "x"));
        for g in 0..rng.random_range(0..5) {
            let uuid = format!("GPU-{h}-{g}");
            let mig = rng.random_bool(0.3);
            let leaves: Vec<(String, Option<String>)> = if mig {
                (0..rng.random_range(1..4))
                    .map(|m| (format!("MIG-{h}-{g}-{m}"), Some(uuid.clone())))
                    .collect()
            } else {
                vec![(uuid.clone(), None)]
            };
            for hour in 0..hours {
                let mut t = H + hour * HOUR_MS;
                while t < H + (hour + 1) * HOUR_MS {
                    let mins = rng
                        .random_range(1..20)
                        .min((H + (hour + 1) * HOUR_MS - t) / MIN);
                    if mins == 0 {
                        break;
                    }
                    if rng.random_bool(0.8) {
                        if mig {
                            windows.push(window(h, &uuid, None, t, mins, None));
                        }
                        for (leaf, parent) in &leaves {
                            let mut w = window(
                                h,
                                leaf,
                                parent.as_deref(),
                                t,
                                mins,
                                rng.random_bool(0.9).then(|| rng.random_range(0.0..100.0)),
                            );
                            w.memory_total_bytes = Some(rng.random_range(1..80) * GIB);
                            if rng.random_bool(0.4) {
                                let quiet = rng.random_range(0..30);
                                let busy = rng.random_range(0..30);
                                w.util_histogram = Some(format!(
                                    "[[0,{}],[{}, {}]]",
                                    quiet.max(1),
                                    rng.random_range(1..=100),
                                    busy.max(1)
                                ));
                            }
                            windows.push(w);
                            for pid in 0..rng.random_range(0..4) {
                                let sm = rng.random_bool(0.8).then(|| {
                                    if rng.random_bool(0.3) {
                                        0.0
                                    } else {
                                        rng.random_range(0.0..100.0)
                                    }
                                });
                                procs.push(process(
                                    leaf,
                                    t,
                                    pid,
                                    &format!("m{pid}"),
                                    rng.random_range(0..40),
                                    sm,
                                ));
                            }
                        }
                    }
                    t += mins * MIN;
                }
            }
        }
        for hour in 0..hours {
            for _ in 0..rng.random_range(0..3) {
                let cents = rng.random_range(-500i64..100_000);
                let amount = Decimal::new(cents * 1_000_003, 8 + rng.random_range(0..7));
                let start = H + hour * HOUR_MS;
                lines.push(line(
                    &key,
                    start,
                    start + HOUR_MS,
                    &amount.to_string(),
                    "on_demand",
                ));
            }
        }
        if rng.random_bool(0.3) {
            lines.push(line(
                &key,
                H,
                H + 24 * HOUR_MS,
                "123.456789012345",
                "committed",
            ));
        }
    }
    (hosts, windows, procs, lines)
}
