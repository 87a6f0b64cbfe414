use std::collections::BTreeMap;

use proptest::prelude::*;

use super::fixtures::*;
use super::*;
use crate::activity::Activity;
use crate::idle::IdleOverride;
use crate::money::split_exact;
use crate::time::{hour_floor, HOUR_MS};
use rust_decimal::Decimal;

fn cost_where(a: &Attribution, f: impl Fn(&Part) -> bool) -> Decimal {
    a.parts.iter().filter(|p| f(p)).map(|p| p.cost).sum()
}

fn model_is(p: &Part, m: &str) -> bool {
    p.owner.get("model") == Some(m)
}

/// Two GPUs, one hour, a $10 bill, usage known by construction.
#[test]
fn a_known_hour_splits_to_the_cent() {
    let mut windows = Vec::new();
    let mut procs = Vec::new();
    for q in 0..4 {
        let t = H + q * 15 * MIN;
        windows.push(window(1, "GPU-0", None, t, 15, Some(80.0)));
        procs.push(process("GPU-0", t, 1, "a", 30, Some(60.0)));
        procs.push(process("GPU-0", t, 2, "b", 10, Some(20.0)));
        windows.push(window(1, "GPU-1", None, t, 15, Some(0.0)));
        if q < 2 {
            // A notebook holds memory for the first half hour and does nothing.
            procs.push(process("GPU-1", t, 3, "nb", 10, Some(0.0)));
        }
    }
    let lines = [line("i-1", H, H + HOUR_MS, "10.00", "on_demand")];
    let a = attribute(
        vec![host(1, "i-1", "p4d.24xlarge")],
        &windows,
        &procs,
        &lines,
        &RateCard::default_card(),
        H,
        H + HOUR_MS,
    );
    assert_eq!(cost_where(&a, |p| model_is(p, "a")), d("3.75"));
    assert_eq!(cost_where(&a, |p| model_is(p, "b")), d("1.25"));
    assert_eq!(
        cost_where(&a, |p| model_is(p, "nb") && p.kind == Kind::HeldIdle),
        d("2.5")
    );
    assert_eq!(cost_where(&a, |p| p.kind == Kind::Idle), d("2.5"));
    assert_eq!(
        cost_where(&a, |p| p.kind == Kind::Unmonitored),
        Decimal::ZERO
    );
    assert_eq!(cost_where(&a, |_| true), d("10"));
    assert!(a
        .parts
        .iter()
        .all(|p| !p.estimated && p.pricing_category == "on_demand"));
    // GPU time: model a had 3/4 of GPU-0 for the hour.
    let a_secs: f64 = a
        .parts
        .iter()
        .filter(|p| model_is(p, "a"))
        .map(|p| p.gpu_seconds)
        .sum();
    assert!((a_secs - 2700.0).abs() < 1e-6, "{a_secs}");
    let total_secs: f64 = a.parts.iter().map(|p| p.gpu_seconds).sum();
    assert!(
        (total_secs - 7200.0).abs() < 1e-6,
        "two GPUs for an hour: {total_secs}"
    );
}

#[test]
fn time_without_telemetry_is_unmonitored_not_idle() {
    let windows = [window(1, "GPU-0", None, H, 45, Some(50.0))];
    let procs = [process("GPU-0", H, 1, "a", 10, Some(50.0))];
    let lines = [line("i-1", H, H + HOUR_MS, "4", "spot")];
    let a = attribute(
        vec![host(1, "i-1", "g5.xlarge")],
        &windows,
        &procs,
        &lines,
        &RateCard::default_card(),
        H,
        H + HOUR_MS,
    );
    assert_eq!(cost_where(&a, |p| model_is(p, "a")), d("3"));
    assert_eq!(cost_where(&a, |p| p.kind == Kind::Unmonitored), d("1"));
    assert!(a.parts.iter().all(|p| p.pricing_category == "spot"));
}

#[test]
fn a_billed_host_without_any_telemetry_is_unmonitored() {
    let lines = [line("i-1", H, H + HOUR_MS, "7.5", "on_demand")];
    let a = attribute(
        vec![host(1, "i-1", "g5.xlarge")],
        &[],
        &[],
        &lines,
        &RateCard::default_card(),
        H,
        H + HOUR_MS,
    );
    assert_eq!(a.parts.len(), 1);
    assert_eq!(
        (a.parts[0].kind, a.parts[0].cost),
        (Kind::Unmonitored, d("7.5"))
    );
}

#[test]
fn a_commitments_unused_part_is_the_fleets_even_on_a_hosts_resource() {
    // FOCUS 1.2's flexibility example writes an Unused row on the resource it could have
    // covered: its dollars are still nobody's, never the host's owners'.
    let lines = [
        line("i-1", H, H + HOUR_MS, "1.5", "committed"),
        StoredCostLine {
            commitment_id: None,
            commitment_part: Some(crate::bill::CommitmentPart::Unused),
            ..line("i-1", H, H + HOUR_MS, "0.5", "committed")
        },
    ];
    let a = attribute(
        vec![host(1, "i-1", "p4d.24xlarge")],
        &[],
        &[],
        &lines,
        &RateCard::default_card(),
        H,
        H + HOUR_MS,
    );
    assert_eq!(cost_where(&a, |_| true), d("1.5"));
    assert_eq!(a.unattributed["USD"], d("0.5"));
}

/// Reports of agents that predate MIG slices: instances share their GPU by memory size.
#[test]
fn mig_instances_without_slices_share_their_gpu_by_size() {
    let mut small = window(1, "MIG-a", Some("GPU-0"), H, 60, Some(90.0));
    small.memory_total_bytes = Some(20 * GIB);
    let mut big = window(1, "MIG-b", Some("GPU-0"), H, 60, Some(10.0));
    big.memory_total_bytes = Some(60 * GIB);
    let parent = window(1, "GPU-0", None, H, 60, None);
    let procs = [
        process("MIG-a", H, 1, "a", 5, Some(90.0)),
        process("MIG-b", H, 2, "b", 5, Some(10.0)),
    ];
    let lines = [line("i-1", H, H + HOUR_MS, "8", "on_demand")];
    let a = attribute(
        vec![host(1, "i-1", "x")],
        &[parent, small, big],
        &procs,
        &lines,
        &RateCard::default_card(),
        H,
        H + HOUR_MS,
    );
    assert_eq!(cost_where(&a, |p| model_is(p, "a")), d("2"));
    assert_eq!(cost_where(&a, |p| model_is(p, "b")), d("6"));
}

/// A GPU in MIG mode with `slices` compute slices, and its devices: (uuid, GPU instance id,
/// its slices, the compute instance's slices, memory GiB), each reporting every quarter hour
/// (as the agent does) with no utilization (an A100: no GPM).
fn mig_gpu(slices: i64, devices: &[(&str, i64, i64, i64, i64)]) -> Vec<AttributionWindow> {
    let mut out = Vec::new();
    for q in 0..4 {
        let t = H + q * 15 * MIN;
        let mut parent = window(1, "GPU-0", None, t, 15, None);
        parent.mig.gpu_slices = Some(slices);
        out.push(parent);
        for (uuid, gi, gi_slices, ci_slices, mem) in devices {
            let mut w = window(1, uuid, Some("GPU-0"), t, 15, None);
            w.memory_total_bytes = Some(mem * GIB);
            w.mig.gpu_instance_id = Some(*gi);
            w.mig.instance_slices = Some(*gi_slices);
            w.mig.compute_slices = Some(*ci_slices);
            out.push(w);
        }
    }
    out
}

/// One process per device per window, holding `GIB` with no SM figure (as under MIG).
fn tenants(windows: &[AttributionWindow], models: &[(&str, &str)]) -> Vec<StoredProcessWindow> {
    let mut out = Vec::new();
    for w in windows {
        for (uuid, model) in models {
            if w.gpu_uuid == *uuid {
                out.push(process(uuid, w.start_ms, 1, model, 1, None));
            }
        }
    }
    out
}

fn attribute_hour(
    windows: &[AttributionWindow],
    procs: &[StoredProcessWindow],
    cost: &str,
) -> Attribution {
    attribute(
        vec![host(1, "i-1", "p4d.24xlarge")],
        windows,
        procs,
        &[line("i-1", H, H + HOUR_MS, cost, "on_demand")],
        &RateCard::default_card(),
        H,
        H + HOUR_MS,
    )
}

/// An A100 in MIG mode with a 3g.40gb and a 2g.20gb instance, both at work: each pays its
/// compute slices of the GPU (3/7 and 2/7 of $7), and the 2 slices no instance holds are idle on
/// the GPU itself, never charged to the tenants (by memory they would have paid $4.68 and $2.32
/// and left nothing idle). Their work is used by presence: no GPM on an A100, so nothing
/// measures it, and a process holding an instance is never held idle on no evidence.
#[test]
fn mig_devices_pay_their_compute_slices_and_empty_slices_are_idle() {
    let windows = mig_gpu(7, &[("MIG-3g", 1, 3, 3, 40), ("MIG-2g", 2, 2, 2, 20)]);
    let procs = tenants(&windows, &[("MIG-3g", "train"), ("MIG-2g", "serve")]);
    let a = attribute_hour(&windows, &procs, "7.00");
    assert_eq!(
        cost_where(&a, |p| model_is(p, "train") && p.kind == Kind::Used),
        d("3.00")
    );
    assert_eq!(
        cost_where(&a, |p| model_is(p, "serve") && p.kind == Kind::Used),
        d("2.00")
    );
    let idle = |p: &Part| p.kind == Kind::Idle && p.gpu_uuid.as_deref() == Some("GPU-0");
    assert_eq!(cost_where(&a, idle), d("2.00"));
    assert_eq!(cost_where(&a, |p| p.kind == Kind::HeldIdle), d("0"));
    assert_eq!(cost_where(&a, |_| true), d("7.00"));
    // Measured by presence: GPU time with no utilization behind it.
    let train: Vec<&Part> = a.parts.iter().filter(|p| model_is(p, "train")).collect();
    let secs: f64 = train.iter().map(|p| p.gpu_seconds).sum();
    assert!((secs - 3600.0 * 3.0 / 7.0).abs() < 1e-6, "{secs}");
    assert!(train.iter().all(|p| p.util_known_seconds == 0.0));
}

/// Compute instances of one GPU instance share its slices (a 3g split into 1c and 2c pays 1/7
/// and 2/7), never the whole instance each; and memory does not decide it: on an A100 40GB a
/// 4g.20gb and a 3g.20gb have the same memory and pay 4/7 and 3/7.
#[test]
fn compute_instances_share_their_gpu_instance_and_slices_not_memory_decide() {
    let windows = mig_gpu(7, &[("MIG-1c", 1, 3, 1, 40), ("MIG-2c", 1, 3, 2, 40)]);
    let procs = tenants(&windows, &[("MIG-1c", "one"), ("MIG-2c", "two")]);
    let a = attribute_hour(&windows, &procs, "7.00");
    assert_eq!(cost_where(&a, |p| model_is(p, "one")), d("1.00"));
    assert_eq!(cost_where(&a, |p| model_is(p, "two")), d("2.00"));
    assert_eq!(cost_where(&a, |p| p.kind == Kind::Idle), d("4.00"));

    let windows = mig_gpu(7, &[("MIG-4g", 1, 4, 4, 20), ("MIG-3g", 2, 3, 3, 20)]);
    let procs = tenants(&windows, &[("MIG-4g", "four"), ("MIG-3g", "three")]);
    let a = attribute_hour(&windows, &procs, "7.00");
    assert_eq!(cost_where(&a, |p| model_is(p, "four")), d("4.00"));
    assert_eq!(cost_where(&a, |p| model_is(p, "three")), d("3.00"));
    assert_eq!(cost_where(&a, |p| p.kind == Kind::Idle), d("0"));
    // An A30 has four compute slices: its 2g.12gb is half the GPU.
    let windows = mig_gpu(4, &[("MIG-a30", 1, 2, 2, 12)]);
    let procs = tenants(&windows, &[("MIG-a30", "half")]);
    let a = attribute_hour(&windows, &procs, "4.00");
    assert_eq!(cost_where(&a, |p| model_is(p, "half")), d("2.00"));
    assert_eq!(cost_where(&a, |p| p.kind == Kind::Idle), d("2.00"));
}

/// An instance with no process is idle (NVML lists every process it has); a report claiming
/// more slices than the GPU has is scaled into the GPU, never past the bill.
#[test]
fn an_empty_instance_is_idle_and_a_bad_report_never_bills_more_than_the_gpu() {
    let windows = mig_gpu(7, &[("MIG-busy", 1, 3, 3, 40), ("MIG-empty", 2, 3, 3, 40)]);
    let procs = tenants(&windows, &[("MIG-busy", "busy")]);
    let a = attribute_hour(&windows, &procs, "7.00");
    assert_eq!(cost_where(&a, |p| model_is(p, "busy")), d("3.00"));
    assert_eq!(cost_where(&a, |p| p.kind == Kind::Idle), d("4.00"));

    let windows = mig_gpu(7, &[("MIG-x", 1, 7, 7, 40), ("MIG-y", 2, 7, 7, 40)]);
    let procs = tenants(&windows, &[("MIG-x", "x"), ("MIG-y", "y")]);
    let a = attribute_hour(&windows, &procs, "7.00");
    assert_eq!(cost_where(&a, |p| model_is(p, "x")), d("3.50"));
    assert_eq!(cost_where(&a, |p| model_is(p, "y")), d("3.50"));
    assert_eq!(cost_where(&a, |_| true), d("7.00"));
}

/// Memory held by processes the agent cannot see holds the GPU like a process: at 0% it is
/// held idle by "(unseen process)", busy it is used by it; a lost GPU's time is idle.
#[test]
fn unseen_memory_is_held_by_unseen_processes_and_a_lost_gpu_is_idle() {
    let mut quiet = window(1, "GPU-0", None, H, 60, Some(0.0));
    quiet.unseen_memory_bytes = Some(9 * GIB);
    let mut busy = window(1, "GPU-1", None, H, 60, Some(65.0));
    busy.unseen_memory_bytes = Some(9 * GIB);
    let mut lost = window(1, "GPU-2", None, H, 60, None);
    lost.fault = Some(crate::telemetry::Fault {
        code: "gpu_lost".into(),
        detail: "XID 79".into(),
    });
    let a = attribute_hour(&[quiet, busy, lost], &[], "9.00");
    let on = |gpu: &'static str| move |p: &Part| p.gpu_uuid.as_deref() == Some(gpu);
    assert_eq!(
        cost_where(&a, |p| on("GPU-0")(p)
            && p.kind == Kind::HeldIdle
            && by_unseen(p)),
        d("3.00")
    );
    assert_eq!(
        cost_where(&a, |p| on("GPU-1")(p)
            && p.kind == Kind::Used
            && by_unseen(p)),
        d("3.00")
    );
    assert_eq!(
        cost_where(&a, |p| on("GPU-2")(p) && p.kind == Kind::Idle),
        d("3.00")
    );

    // Beside a process measured at 90% SM on a GPU at 92%, the unseen processes did the 2%
    // the seen one does not account for: $0.20 of a $9.20 hour, not half of it.
    let mut shared = window(1, "GPU-0", None, H, 60, Some(92.0));
    shared.unseen_memory_bytes = Some(2 * GIB);
    let procs = [process("GPU-0", H, 1, "train", 30, Some(90.0))];
    let a = attribute_hour(&[shared], &procs, "9.20");
    assert_eq!(cost_where(&a, |p| model_is(p, "train")), d("9.00"));
    assert_eq!(cost_where(&a, by_unseen), d("0.20"));
}

#[test]
fn without_per_process_utilization_a_busy_gpu_is_shared_by_memory() {
    let windows = [window(1, "GPU-0", None, H, 60, Some(70.0))];
    let procs = [
        process("GPU-0", H, 1, "a", 30, None),
        process("GPU-0", H, 2, "b", 10, None),
    ];
    let lines = [line("i-1", H, H + HOUR_MS, "4", "on_demand")];
    let a = attribute(
        vec![host(1, "i-1", "x")],
        &windows,
        &procs,
        &lines,
        &RateCard::default_card(),
        H,
        H + HOUR_MS,
    );
    assert_eq!(
        cost_where(&a, |p| model_is(p, "a") && p.kind == Kind::Used),
        d("3")
    );
    assert_eq!(
        cost_where(&a, |p| model_is(p, "b") && p.kind == Kind::Used),
        d("1")
    );
}

#[test]
fn a_daily_line_spreads_over_its_hours_exactly() {
    let day = H - H % (24 * HOUR_MS);
    let lines = [line("i-1", day, day + 24 * HOUR_MS, "100", "committed")];
    let a = attribute(
        vec![host(1, "i-1", "x")],
        &[],
        &[],
        &lines,
        &RateCard::default_card(),
        day,
        day + 24 * HOUR_MS,
    );
    assert_eq!(a.parts.len(), 24);
    assert_eq!(cost_where(&a, |_| true), d("100"));
    // Only the first six hours asked for: their exact portion.
    let a6 = attribute(
        vec![host(1, "i-1", "x")],
        &[],
        &[],
        &lines,
        &RateCard::default_card(),
        day,
        day + 6 * HOUR_MS,
    );
    let six: Decimal = split_exact(d("100"), &[1.0; 24])[..6].iter().sum();
    assert_eq!(cost_where(&a6, |_| true), six);
}

#[test]
fn no_bill_means_a_rate_card_estimate() {
    let windows: Vec<_> = (0..4)
        .map(|q| window(1, "GPU-0", None, H + q * 15 * MIN, 15, Some(50.0)))
        .collect();
    let a = attribute(
        vec![host(1, "i-1", "p4d.24xlarge")],
        &windows,
        &[],
        &[],
        &RateCard::default_card(),
        H,
        H + HOUR_MS,
    );
    assert_eq!(cost_where(&a, |_| true), d("32.7726"));
    assert!(a
        .parts
        .iter()
        .all(|p| p.estimated && p.pricing_category == "on_demand"));
    // A spot host is estimated at the spot rate.
    let mut spot = host(1, "i-1", "p4d.24xlarge");
    spot.lifecycle = Some("spot".into());
    let a_spot = attribute(
        vec![spot],
        &windows,
        &[],
        &[],
        &RateCard::default_card(),
        H,
        H + HOUR_MS,
    );
    assert_eq!(cost_where(&a_spot, |_| true), d("13.109"));
    assert!(a_spot.parts.iter().all(|p| p.pricing_category == "spot"));
    // The bill arrives: the estimate is gone.
    let lines = [line("i-1", H, H + HOUR_MS, "30", "on_demand")];
    let a = attribute(
        vec![host(1, "i-1", "p4d.24xlarge")],
        &windows,
        &[],
        &lines,
        &RateCard::default_card(),
        H,
        H + HOUR_MS,
    );
    assert_eq!(cost_where(&a, |_| true), d("30"));
    assert!(a.parts.iter().all(|p| !p.estimated));
}

/// An hour after the bill's last line is priced as the bill priced the host's last billed hour
/// (a savings plan's committed rate, not the rate card's on-demand one): from a line before the
/// range or from the range's own billed hours, for the time the host was seen; a host the bill
/// has not charged within the look-back is priced from the rate card.
#[test]
fn an_hour_after_the_bills_last_line_is_priced_as_the_bill_priced_the_host() {
    let seen = |hour: i64, quarters: i64| -> Vec<AttributionWindow> {
        (0..quarters)
            .map(|q| window(1, "GPU-0", None, hour + q * 15 * MIN, 15, Some(90.0)))
            .collect()
    };
    // Covered by a savings plan at 60% of on demand: the committed hour and its plan's fee.
    let committed = |start: i64| {
        let mut used = line("i-1", start, start + HOUR_MS, "19.66356", "committed");
        used.commitment_id = Some("sp-1".into());
        used.commitment_part = Some(crate::bill::CommitmentPart::Used);
        used
    };
    let card = RateCard::default_card();
    let p4d = || vec![host(1, "i-1", "p4d.24xlarge")];
    // The bill's last line an hour before the range, passed as the loaders pass it.
    let a = attribute(
        p4d(),
        &seen(H, 4),
        &[],
        &[committed(H - HOUR_MS)],
        &card,
        H,
        H + HOUR_MS,
    );
    assert_eq!(cost_where(&a, |_| true), d("19.66356"));
    assert!(a
        .parts
        .iter()
        .all(|p| p.estimated && p.pricing_category == "committed"));
    // Billed in the range's first hour, seen for half of its third: the same rate, for the half.
    let mut windows = seen(H, 4);
    windows.extend(seen(H + 2 * HOUR_MS, 2));
    let a = attribute(
        p4d(),
        &windows,
        &[],
        &[committed(H)],
        &card,
        H,
        H + 3 * HOUR_MS,
    );
    let third = |p: &Part| p.hour_ms == H + 2 * HOUR_MS;
    assert_eq!(cost_where(&a, third), d("9.83178"));
    assert!(a.parts.iter().filter(|p| third(p)).all(|p| p.estimated));
    assert!(a.parts.iter().filter(|p| !third(p)).all(|p| !p.estimated));
    // The bill last charged the host longer ago than the look-back: the rate card again.
    let long_ago = hour_floor(H - crate::bill::LAST_BILLED_LOOKBACK_MS) - HOUR_MS;
    let a = attribute(
        p4d(),
        &seen(H, 4),
        &[],
        &[committed(long_ago)],
        &card,
        H,
        H + HOUR_MS,
    );
    assert_eq!(cost_where(&a, |_| true), d("32.7726"));
    assert!(a.parts.iter().all(|p| p.pricing_category == "on_demand"));
    // A commitment's unused part on the host's resource is not its rate.
    let mut unused = committed(H - HOUR_MS);
    unused.commitment_part = Some(crate::bill::CommitmentPart::Unused);
    let a = attribute(p4d(), &seen(H, 4), &[], &[unused], &card, H, H + HOUR_MS);
    assert_eq!(cost_where(&a, |_| true), d("32.7726"));
}

#[test]
fn a_half_seen_hour_is_estimated_for_that_half_with_nothing_unmonitored() {
    let windows: Vec<_> = (2..4)
        .map(|q| window(1, "GPU-0", None, H + q * 15 * MIN, 15, Some(50.0)))
        .collect();
    let procs: Vec<_> = windows
        .iter()
        .map(|w| process("GPU-0", w.start_ms, 1, "a", 10, Some(50.0)))
        .collect();
    let a = attribute(
        vec![host(1, "i-1", "p4d.24xlarge")],
        &windows,
        &procs,
        &[],
        &RateCard::default_card(),
        H,
        H + HOUR_MS,
    );
    assert_eq!(cost_where(&a, |_| true), d("16.3863"));
    assert_eq!(cost_where(&a, |p| model_is(p, "a")), d("16.3863"));
    assert!(
        a.parts.iter().all(|p| p.kind != Kind::Unmonitored),
        "{:?}",
        a.parts
    );
}

#[test]
fn lines_for_other_resources_are_counted_not_attributed() {
    let lines = [
        line("vol-9", H, H + HOUR_MS, "1.25", "on_demand"),
        line("i-1", H, H + HOUR_MS, "2", "on_demand"),
    ];
    let a = attribute(
        vec![host(1, "i-1", "x")],
        &[],
        &[],
        &lines,
        &RateCard::default_card(),
        H,
        H + HOUR_MS,
    );
    assert_eq!(a.unattributed.get("USD"), Some(&d("1.25")));
    assert_eq!(cost_where(&a, |_| true), d("2"));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]
    /// The invariant: per host and hour, the parts add up exactly to that hour's bill.
    #[test]
    fn parts_sum_exactly_to_each_host_hour_bill(seed in any::<u64>()) {
        let (hosts, windows, procs, lines) = random_fleet(seed);
        let hours = 4;
        let (from, to) = (H, H + hours * HOUR_MS);
        let a = attribute(hosts, &windows, &procs, &lines, &RateCard::default_card(), from, to);
        let mut expected: BTreeMap<(i64, i64), Decimal> = BTreeMap::new();
        for l in &lines {
            let host_id: i64 = l.resource_key.as_deref().unwrap()[2..].parse().unwrap();
            for (hour, amount) in line_hours(l, from, to) {
                *expected.entry((host_id, hour)).or_default() += amount;
            }
        }
        let mut got: BTreeMap<(i64, i64), Decimal> = BTreeMap::new();
        for p in a.parts.iter().filter(|p| !p.estimated) {
            *got.entry((p.host_id, p.hour_ms)).or_default() += p.cost;
        }
        for (k, v) in &expected {
            prop_assert_eq!(got.get(k).copied().unwrap_or_default(), *v, "host-hour {:?}", k);
        }
        prop_assert_eq!(got.len(), expected.len());
        // GPU time never exceeds what the GPUs had.
        for p in &a.parts {
            prop_assert!(p.gpu_seconds >= 0.0 && p.gpu_seconds <= 3600.0 * 5.0 + 1e-6);
        }
    }
}

/// One definition of busy: for every kind of window, the kind attribution charges equals what
/// the idle finder and the fleet page read from [`crate::activity`], with each cluster's own
/// thresholds.
#[test]
fn attribution_and_idle_detection_agree_window_by_window() {
    let strict = IdleConfig {
        held_sm_percent: 5.0,
        clusters: [(
            "strict".to_owned(),
            IdleOverride {
                threshold_percent: Some(30.0),
                duration: None,
            },
        )]
        .into(),
        ..Default::default()
    };
    // (GPU utilization, processes (memory GiB, SM)) for one hour-long window.
    type Case = (Option<f64>, Vec<(i64, Option<f64>)>);
    let cases: Vec<Case> = vec![
        (Some(0.0), vec![]),
        (Some(20.0), vec![]),
        (Some(50.0), vec![]),
        (None, vec![]),
        (Some(0.0), vec![(10, Some(0.0))]),
        (Some(20.0), vec![(10, Some(3.0))]),
        (Some(60.0), vec![(10, Some(40.0)), (5, Some(2.0))]),
        (Some(20.0), vec![(10, None)]),
        (Some(60.0), vec![(10, None), (30, None)]),
        // A MIG device without GPM: used by presence.
        (None, vec![(10, None)]),
    ];
    for cluster in ["c", "strict"] {
        for (util, procs) in &cases {
            let mut h = host(1, "i-1", "p4d.24xlarge");
            h.cluster = cluster.into();
            let w = window(1, "GPU-0", None, H, 60, *util);
            let ps: Vec<StoredProcessWindow> = procs
                .iter()
                .enumerate()
                .map(|(i, (mem, sm))| process("GPU-0", H, i as i64, "m", *mem, *sm))
                .collect();
            let lines = [line("i-1", H, H + HOUR_MS, "8.00", "on_demand")];
            let a = attribute_by(
                vec![h],
                std::slice::from_ref(&w),
                &ps,
                &lines,
                &RateCard::default_card(),
                &strict,
                &crate::owners::OwnerSchema::default(),
                H,
                H + HOUR_MS,
            );
            let kinds: std::collections::BTreeSet<Kind> = a.parts.iter().map(|p| p.kind).collect();
            let rules = strict.thresholds(cluster);
            let held: Vec<&StoredProcessWindow> = ps.iter().collect();
            let want = match rules.of_window(&w, &held) {
                Activity::Busy | Activity::Present => Kind::Used,
                Activity::HeldIdle => Kind::HeldIdle,
                Activity::Idle | Activity::Unknown => Kind::Idle,
            };
            assert_eq!(
                kinds,
                [want].into(),
                "{cluster}: {util:?} {procs:?} -> {:?}",
                a.parts
            );
            assert_eq!(cost_where(&a, |_| true), d("8.00"), "to the cent");
        }
    }
    // Where the thresholds differ, so does the answer: 20% is busy by default, idle at 30%;
    // a process at 3% SM works by default, holds the GPU idle at 5%.
    let default = strict.thresholds("c");
    let thirty = strict.thresholds("strict");
    assert_eq!(default.busy_gpu_percent, 5.0);
    assert_eq!(thirty.busy_gpu_percent, 30.0);
    assert_eq!(thirty.activity(Some(20.0), []), Activity::Idle);
    assert_eq!(default.activity(Some(20.0), []), Activity::Busy);
    assert_eq!(
        thirty.activity(Some(20.0), [(Some(GIB), Some(3.0))]),
        Activity::HeldIdle
    );
}

/// A GPU working with no process in sight (another container's, without hostPID) is used, by
/// "(unseen process)": never idle, so its dollars are not idle waste, and named as what it is.
#[test]
fn a_busy_gpu_with_no_visible_process_is_used_not_idle() {
    let w = window(1, "GPU-0", None, H, 60, Some(85.0));
    let lines = [line("i-1", H, H + HOUR_MS, "8.00", "on_demand")];
    let a = attribute(
        vec![host(1, "i-1", "p4d.24xlarge")],
        &[w],
        &[],
        &lines,
        &RateCard::default_card(),
        H,
        H + HOUR_MS,
    );
    assert_eq!(
        cost_where(&a, |p| p.kind == Kind::Used && by_unseen(p)),
        d("8.00")
    );
}

/// Work or memory of processes the agent cannot see, in every owner dimension.
fn by_unseen(p: &Part) -> bool {
    p.owner == crate::owners::OwnerSchema::default().unseen_owner("")
        && p.owner.get("team") == Some(crate::allocation::UNSEEN_KEY)
}

/// The second worked example in docs/billing.md ("A partly busy window"): a window whose
/// samples were busy part of the time is split by them, at the cluster's threshold.
#[test]
fn a_partly_busy_window_is_split_by_its_samples() {
    let mut notebook = window(1, "GPU-0", None, H, 60, Some(15.0));
    // A notebook cell ran 10 of the hour's 60 samples at 90 %.
    notebook.util_histogram = Some("[[0,50],[90,10]]".into());
    let mut unseen = window(1, "GPU-1", None, H, 60, Some(20.0));
    // Someone else's container worked 15 of 60 samples at 80 %.
    unseen.util_histogram = Some("[[0,45],[80,15]]".into());
    let mut steady = window(1, "GPU-2", None, H, 60, Some(70.0));
    // Every sample busy: no split.
    steady.util_histogram = Some("[[60,30],[80,30]]".into());
    let procs = [
        process("GPU-0", H, 1, "notebook", 10, Some(15.0)),
        process("GPU-2", H, 2, "train", 40, Some(70.0)),
    ];
    let a = attribute(
        vec![host(1, "i-1", "p4d.24xlarge")],
        &[notebook, unseen, steady],
        &procs,
        &[line("i-1", H, H + HOUR_MS, "18.00", "on_demand")],
        &RateCard::default_card(),
        H,
        H + HOUR_MS,
    );
    let notebook = |kind: Kind| cost_where(&a, |p| model_is(p, "notebook") && p.kind == kind);
    assert_eq!(notebook(Kind::Used), d("1.00"));
    assert_eq!(notebook(Kind::HeldIdle), d("5.00"));
    assert_eq!(
        cost_where(&a, |p| p.kind == Kind::Used && by_unseen(p)),
        d("1.50")
    );
    assert_eq!(cost_where(&a, |p| p.kind == Kind::Idle), d("4.50"));
    assert_eq!(cost_where(&a, |p| model_is(p, "train")), d("6.00"));
    assert_eq!(cost_where(&a, |_| true), d("18.00"));
    // Each part keeps its own utilization: the notebook's used hour ran at 90 %.
    let used: Vec<&Part> = a
        .parts
        .iter()
        .filter(|p| model_is(p, "notebook") && p.kind == Kind::Used)
        .collect();
    let (util, secs) = used.iter().fold((0.0, 0.0), |(u, s), p| {
        (u + p.util_gpu_seconds, s + p.util_known_seconds)
    });
    assert!((util / secs - 90.0).abs() < 1e-9, "{}", util / secs);
}

/// The worked example in docs/billing.md ("How a host-hour is split"), to the cent.
#[test]
fn the_documented_worked_example() {
    let mut config = IdleConfig {
        held_sm_percent: 5.0,
        ..Default::default()
    };
    config.clusters.insert(
        "c".into(),
        IdleOverride {
            threshold_percent: Some(30.0),
            duration: None,
        },
    );
    let q = |i: i64| H + i * 15 * MIN;
    let windows = [
        window(1, "GPU-0", None, q(0), 15, Some(60.0)),
        window(1, "GPU-0", None, q(1), 15, Some(20.0)),
        window(1, "GPU-0", None, q(2), 15, Some(20.0)),
        window(1, "GPU-0", None, q(3), 15, Some(0.0)),
    ];
    let procs = [
        process("GPU-0", q(0), 1, "train", 40, Some(40.0)),
        process("GPU-0", q(0), 2, "notebook", 10, Some(2.0)),
        process("GPU-0", q(1), 2, "notebook", 10, Some(3.0)),
        process("GPU-0", q(3), 2, "notebook", 10, Some(0.0)),
    ];
    let a = attribute_by(
        vec![host(1, "i-1", "p4d.24xlarge")],
        &windows,
        &procs,
        &[line("i-1", H, H + HOUR_MS, "8.00", "on_demand")],
        &RateCard::default_card(),
        &config,
        &crate::owners::OwnerSchema::default(),
        H,
        H + HOUR_MS,
    );
    assert_eq!(
        cost_where(&a, |p| model_is(p, "train") && p.kind == Kind::Used),
        d("2.00")
    );
    assert_eq!(
        cost_where(&a, |p| model_is(p, "notebook") && p.kind == Kind::HeldIdle),
        d("4.00")
    );
    assert_eq!(cost_where(&a, |p| p.kind == Kind::Idle), d("2.00"));
    assert_eq!(cost_where(&a, |_| true), d("8.00"));
}

/// A billed host whose agent was away half the hour: the bill line's tag says whose machine it
/// is, so its unmonitored half counts under that team (as unmonitored cost) while its idle half
/// stays "(idle)". A host whose line has no tag keeps its cost under "(unmonitored)".
#[test]
fn a_bill_tag_names_the_owner_of_unmonitored_time_never_of_idle() {
    use crate::allocation::{group, GroupBy, Step, IDLE_KEY, UNMONITORED_KEY};
    let schema: crate::owners::OwnerSchema =
        toml::from_str(r#"team = { from = ["label:team", "tag:team"] }"#).unwrap();
    let mut tagged = line("i-1", H, H + HOUR_MS, "6", "on_demand");
    tagged.tags_json = r#"{"team":"search"}"#.into();
    let untagged = line("i-2", H, H + HOUR_MS, "4", "on_demand");
    let windows = [window(1, "GPU-0", None, H, 30, Some(0.0))];
    let a = attribute_by(
        vec![host(1, "i-1", "g5.xlarge"), host(2, "i-2", "g5.xlarge")],
        &windows,
        &[],
        &[tagged, untagged],
        &RateCard::default_card(),
        &IdleConfig::default(),
        &schema,
        H,
        H + HOUR_MS,
    );
    let rows = group(
        &a,
        GroupBy::TEAM,
        Step::Month,
        &crate::carbon::Grid::unknown(),
    );
    let by_key: BTreeMap<&str, (Decimal, Decimal, Decimal)> = rows
        .iter()
        .map(|r| (r.key.as_str(), (r.cost, r.unmonitored_cost, r.idle_cost)))
        .collect();
    assert_eq!(by_key["search"], (d("3"), d("3"), d("0")), "{rows:?}");
    assert_eq!(by_key[IDLE_KEY], (d("3"), d("0"), d("3")), "{rows:?}");
    assert_eq!(
        by_key[UNMONITORED_KEY],
        (d("4"), d("4"), d("0")),
        "{rows:?}"
    );
    assert_eq!(by_key.len(), 3, "{rows:?}");
}

/// Each bill line has one host: an agent's host over one known from the bill alone for the
/// same instance (whatever their order), and of two agents' hosts the newer.
#[test]
fn a_line_belongs_to_the_agent_host_over_the_bill_host() {
    let billed = HostRow {
        from_bill: true,
        ..host(1, "i-a", "p4d.24xlarge")
    };
    let agent = host(5, "i-a", "p4d.24xlarge");
    let renamed = host(9, "i-a", "p4d.24xlarge");
    let only_billed = HostRow {
        from_bill: true,
        ..host(3, "i-b", "p4d.24xlarge")
    };
    for hosts in [
        vec![billed.clone(), agent.clone(), only_billed.clone()],
        vec![only_billed.clone(), agent.clone(), billed.clone()],
    ] {
        let by_key = hosts_by_instance_key(&hosts);
        assert_eq!(by_key.get("i-a"), Some(&5));
        assert_eq!(by_key.get("i-b"), Some(&3));
    }
    let hosts = [agent, billed, renamed];
    assert_eq!(hosts_by_instance_key(&hosts).get("i-a"), Some(&9));
}
