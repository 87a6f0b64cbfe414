use super::*;
use gpuledger_core::ratecard::RateCard;
use gpuledger_core::recommend::catalog::identify;
use rust_decimal::Decimal;
use std::str::FromStr;

#[test]
fn identifies_gpus_by_name_and_memory() {
    assert_eq!(
        identify("NVIDIA A100-SXM4-80GB", Some(85_899_345_920)).map(|c| c.name),
        Some("A100 80GB")
    );
    assert_eq!(
        identify("NVIDIA A100-SXM4-40GB", Some(42_949_672_960)).map(|c| c.name),
        Some("A100 40GB")
    );
    assert_eq!(
        identify("NVIDIA H100 80GB HBM3", None).map(|c| c.name),
        Some("H100 80GB")
    );
    assert_eq!(identify("Tesla T4", None).map(|c| c.name), Some("T4"));
    assert_eq!(identify("NVIDIA L4", None).map(|c| c.name), Some("L4"));
    assert!(identify("Quadro P1000", None).is_none());
}

use crate::rollup::usage_rows;
use crate::store::rollups::UsageRow;
use gpuledger_core::attribution::attribute;
use gpuledger_core::bill::StoredCostLine;
use gpuledger_core::telemetry::HostRow;
use gpuledger_core::time::HOUR_MS;

const H: i64 = 1_800_000_000_000 - 1_800_000_000_000 % HOUR_MS;
const WEEK_HOURS: i64 = 168;

fn host(id: i64, name: &str) -> HostRow {
    HostRow {
        id,
        cluster: "serve".into(),
        hostname: name.into(),
        provider: None,
        instance_id: Some(format!("i-{name}")),
        instance_key: Some(format!("i-{name}")),
        instance_type: Some("p4de.24xlarge".into()),
        lifecycle: None,
        region: None,
        from_bill: false,
    }
}

/// A week of hourly windows for one GPU with one process on it.
#[allow(clippy::too_many_arguments)]
fn week(
    host_id: i64,
    gpu: &str,
    gpu_name: &str,
    mem_total_gib: i64,
    util: impl Fn(i64) -> f64,
    mem_gib: i64,
    endpoint: Option<&str>,
    experiment: Option<&str>,
) -> (Vec<AttributionWindow>, Vec<StoredProcessWindow>) {
    let mut ws = Vec::new();
    let mut ps = Vec::new();
    for h in 0..WEEK_HOURS {
        let start = H + h * HOUR_MS;
        let u = util(h);
        ws.push(AttributionWindow {
            host_id,
            gpu_uuid: gpu.into(),
            parent_uuid: None,
            gpu_name: Some(gpu_name.into()),
            start_ms: start,
            end_ms: start + HOUR_MS,
            memory_total_bytes: Some(mem_total_gib << 30),
            util_avg: Some(u),
            util_histogram: None,
            energy_mj: None,
            ..Default::default()
        });
        ps.push(StoredProcessWindow {
            gpu_uuid: gpu.into(),
            start_ms: start,
            pid: 1,
            process_name: None,
            memory_used_max_bytes: Some(mem_gib << 30),
            sm_util_avg: Some(u.max(2.0)),
            labels_json: serde_json::to_string(
                &[
                    ("model", endpoint.map(|_| "mistral-7b")),
                    ("experiment", experiment),
                    ("endpoint", endpoint),
                ]
                .into_iter()
                .filter_map(|(k, v)| v.map(|v| (k, v)))
                .collect::<std::collections::BTreeMap<_, _>>(),
            )
            .unwrap(),
            container_id: None,
            pod_uid: None,
            user_name: None,
        });
    }
    (ws, ps)
}

/// Sets one of a process's environment labels.
fn set_label(p: &mut StoredProcessWindow, key: &str, value: &str) {
    let mut labels: std::collections::BTreeMap<String, String> =
        serde_json::from_str(&p.labels_json).unwrap();
    labels.insert(key.into(), value.into());
    p.labels_json = serde_json::to_string(&labels).unwrap();
}

fn hourly_bill(key: &str, per_hour: &str) -> Vec<StoredCostLine> {
    (0..WEEK_HOURS)
        .map(|h| StoredCostLine {
            tags_json: "{}".into(),
            commitment_id: None,
            commitment_part: None,
            resource_key: Some(key.into()),
            charge_period_start_ms: H + h * HOUR_MS,
            charge_period_end_ms: H + (h + 1) * HOUR_MS,
            charge_category: "Usage".into(),
            billed_cost: gpuledger_core::money::from_text(per_hour),
            effective_cost: gpuledger_core::money::from_text(per_hour),
            currency: "USD".into(),
            pricing_category: "on_demand".into(),
            instance_type: None,
        })
        .collect()
}

fn dec(s: &str) -> Decimal {
    Decimal::from_str(s).unwrap()
}

/// An endpoint using 10 GB on an 80 GB A100 at ~20% is sent to an L4, saving the price
/// difference (both prices from the rate card) over the week; its model covers the same
/// GPU and is not counted again, nor is the GPU as a packing candidate. A busy endpoint that
/// needs the A100 is left alone.
#[test]
fn an_over_provisioned_endpoint_is_sent_to_an_l4_and_counted_once() {
    let (mut ws, mut ps) = week(
        1,
        "GPU-chat",
        "NVIDIA A100-SXM4-80GB",
        80,
        |h| 10.0 + (h % 11) as f64,
        10,
        Some("chat"),
        None,
    );
    let (w2, p2) = week(
        2,
        "GPU-big",
        "NVIDIA A100-SXM4-80GB",
        80,
        |_| 85.0,
        70,
        Some("big-llm"),
        None,
    );
    ws.extend(w2);
    let mut ps2 = p2;
    for p in &mut ps2 {
        set_label(p, "model", "llama-70b");
    }
    ps.extend(ps2);
    let mut lines = hourly_bill("i-a", "5.1207");
    lines.extend(hourly_bill("i-b", "5.1207"));
    let hosts = vec![host(1, "a"), host(2, "b")];
    let card = RateCard::default_card();
    let (from, to) = (H, H + WEEK_HOURS * HOUR_MS);
    let attribution = attribute(hosts, &ws, &ps, &lines, &card, from, to);
    let evidence = evidence_from_raw(&attribution, &ws, &ps);
    let r = recommend(&evidence, &card, to - from, Options::default());
    assert_eq!(r.right_size.len(), 1, "{:?}", r.right_size);
    let c = &r.right_size[0];
    assert_eq!(
        (
            c.by.as_str(),
            c.key.as_str(),
            c.current_gpu.as_str(),
            c.recommended_gpu.as_str(),
            c.recommended_instance_type.as_str()
        ),
        ("endpoint", "chat", "A100 80GB", "L4", "g6.xlarge"),
        "the endpoint is kept, not also its model mistral-7b on the same GPU"
    );
    assert_eq!(c.gpus, ["GPU-chat"]);
    // The 95th window is at 20%: band 20–25, read as its top.
    assert_eq!(c.p95_util, 25.0);
    assert_eq!(c.peak_memory_gb, 10.0);
    // The week's bill for the GPU, and the rate card's prices: g6.xlarge for one L4,
    // p4de.24xlarge over its 8 A100s.
    let cost = dec("5.1207") * Decimal::from(WEEK_HOURS);
    let ratio = dec("0.8048") / (dec("40.9657") / Decimal::from(8));
    assert_eq!(c.cost, cost.round_dp(2));
    assert_eq!(c.saving, (cost * (Decimal::ONE - ratio)).round_dp(2));
    assert!(c.saving < c.cost);
    assert_eq!(
        c.monthly_saving,
        (cost * (Decimal::ONE - ratio) * Decimal::from(730) / Decimal::from(WEEK_HOURS))
            .round_dp(2)
    );
    assert!(
        r.consolidation.iter().all(|x| x.gpus != ["GPU-chat"]),
        "the GPU is in the right-size already: {:?}",
        r.consolidation
    );
    assert_eq!(r.total_in(&c.currency), c.saving);
}

/// Without a price for the smaller GPU's instance type, nothing is recommended onto it:
/// prices come from the rate card, never from code.
#[test]
fn a_gpu_the_rate_card_does_not_price_is_never_recommended() {
    let (ws, ps) = week(
        1,
        "GPU-chat",
        "NVIDIA A100-SXM4-80GB",
        80,
        |_| 12.0,
        10,
        Some("chat"),
        None,
    );
    let lines = hourly_bill("i-a", "5.1207");
    let mut card = RateCard::default_card();
    for t in ["g6.xlarge", "g5.xlarge", "g4dn.xlarge", "g6e.xlarge"] {
        card.instance_types.remove(t);
    }
    let (from, to) = (H, H + WEEK_HOURS * HOUR_MS);
    let a = attribute(vec![host(1, "a")], &ws, &ps, &lines, &card, from, to);
    let r = recommend(
        &evidence_from_raw(&a, &ws, &ps),
        &card,
        to - from,
        Options::default(),
    );
    assert!(
        r.right_size
            .iter()
            .all(|x| x.recommended_gpu.contains("MIG")),
        "only MIG slices of the priced A100 instances remain: {:?}",
        r.right_size
    );
}

/// A MIG instance is its profile: named, sized and priced as a slice of the GPU.
#[test]
fn mig_instances_are_priced_as_slices() {
    let card = RateCard::default_card();
    let slice = identify("NVIDIA A100-SXM4-80GB MIG 1g.10gb", Some(9_728 << 20)).unwrap();
    assert_eq!(slice.name, "A100 80GB MIG 1g.10gb");
    assert_eq!(
        slice.price(&card),
        Some(dec("40.9657") / Decimal::from(8) / Decimal::from(7))
    );
    let three = identify("NVIDIA H100 80GB HBM3 MIG 3g.40gb", None).unwrap();
    assert_eq!(three.name, "H100 MIG 3g.40gb");
    assert_eq!(
        three.price(&card),
        Some(dec("55.04") / Decimal::from(8) * Decimal::from(3) / Decimal::from(7))
    );
    assert_eq!(slice.offered_on(), "p4de.24xlarge (MIG)");
    assert!(identify("NVIDIA A100-SXM4-80GB MIG 7g.80gb", None).is_none());
}

/// A quiet MIG instance is not a GPU to pack elsewhere; a quiet whole GPU is, with the
/// saving of the share of it its work does not need.
#[test]
fn mig_instances_are_never_packing_candidates() {
    let (mut ws, mut ps) = week(1, "GPU-w", "NVIDIA L4", 24, |_| 9.0, 3, None, Some("nb"));
    let (mut mig, p2) = week(
        2,
        "MIG-m",
        "NVIDIA A100-SXM4-80GB",
        10,
        |_| 9.0,
        3,
        None,
        None,
    );
    for w in &mut mig {
        w.parent_uuid = Some("GPU-parent".into());
    }
    ws.extend(mig);
    ps.extend(p2.into_iter().map(|mut p| {
        set_label(&mut p, "team", "research");
        p
    }));
    let mut lines = hourly_bill("i-a", "0.8");
    lines.extend(hourly_bill("i-b", "4.1"));
    let card = RateCard::default_card();
    let (from, to) = (H, H + WEEK_HOURS * HOUR_MS);
    let a = attribute(
        vec![host(1, "a"), host(2, "b")],
        &ws,
        &ps,
        &lines,
        &card,
        from,
        to,
    );
    let r = recommend(
        &evidence_from_raw(&a, &ws, &ps),
        &card,
        to - from,
        Options::default(),
    );
    let gpus: Vec<&[String]> = r.consolidation.iter().map(|c| c.gpus.as_slice()).collect();
    assert_eq!(gpus, [["GPU-w".to_owned()]]);
    let c = &r.consolidation[0];
    assert_eq!((c.host.as_str(), c.avg_util), ("a", 9.0));
    // 9% busy against an 80% target: it needs 11.25% of a GPU; the rest is the saving.
    let cost = dec("0.8") * Decimal::from(WEEK_HOURS);
    assert_eq!(c.cost, cost.round_dp(2));
    assert_eq!(c.saving, (cost * dec("0.8875")).round_dp(2));
    assert!(c.action.contains("11%"), "{}", c.action);
}

/// Training on on-demand capacity: the saving is the hours it actually ran at the rate
/// card's spot discount for its instance type (p4de: 60%), never more than it cost and never
/// projected to a month. Held-idle time and committed capacity are not offered spot.
#[test]
fn training_on_on_demand_could_run_on_spot_for_the_hours_it_ran() {
    // A sweep that ran 104 of the week's 168 hours; then its notebook held the GPU idle.
    let (ws, mut ps) = week(
        1,
        "GPU-t",
        "NVIDIA A100-SXM4-80GB",
        80,
        |h| if h < 104 { 95.0 } else { 0.0 },
        70,
        None,
        Some("sweep-7"),
    );
    for p in ps.iter_mut().skip(104) {
        p.sm_util_avg = Some(0.0);
    }
    let card = RateCard::default_card();
    let lines = hourly_bill("i-a", "5.1207");
    let a = attribute(
        vec![host(1, "a")],
        &ws,
        &ps,
        &lines,
        &card,
        H,
        H + WEEK_HOURS * HOUR_MS,
    );
    let r = recommend(
        &evidence_from_raw(&a, &ws, &ps),
        &card,
        WEEK_HOURS * HOUR_MS,
        Options::default(),
    );
    assert_eq!(r.spot.len(), 1, "{r:?}");
    let s = &r.spot[0];
    assert_eq!(s.experiment, "sweep-7");
    assert_eq!(s.instance_types, ["p4de.24xlarge"]);
    assert_eq!(s.gpu_hours, 104.0);
    let ran = dec("5.1207") * Decimal::from(104);
    assert_eq!(s.cost, ran.round_dp(2));
    let discount = Decimal::ONE - dec("16.3863") / dec("40.9657");
    assert_eq!(s.saving, (ran * discount).round_dp(2));
    assert!(s.saving < s.cost);

    // The same sweep on committed capacity: nothing to move to spot.
    let committed: Vec<StoredCostLine> = lines
        .iter()
        .cloned()
        .map(|mut l| {
            l.pricing_category = "committed".into();
            l
        })
        .collect();
    let a = attribute(
        vec![host(1, "a")],
        &ws,
        &ps,
        &committed,
        &card,
        H,
        H + WEEK_HOURS * HOUR_MS,
    );
    let r = recommend(
        &evidence_from_raw(&a, &ws, &ps),
        &card,
        WEEK_HOURS * HOUR_MS,
        Options::default(),
    );
    assert!(r.spot.is_empty(), "{:?}", r.spot);
}

/// A week of a notebook holding one A100 of host `a` idle (labelled team research), billed
/// by `lines`: its recommendations.
fn held_notebook_week(lines: &[StoredCostLine]) -> Recommendations {
    let (ws, mut ps) = week(
        1,
        "GPU-nb",
        "NVIDIA A100-SXM4-80GB",
        80,
        |_| 0.0,
        30,
        None,
        Some("notebook"),
    );
    for p in &mut ps {
        p.sm_util_avg = Some(0.0);
        set_label(p, "team", "research");
    }
    let card = RateCard::default_card();
    let a = attribute(
        vec![host(1, "a")],
        &ws,
        &ps,
        lines,
        &card,
        H,
        H + WEEK_HOURS * HOUR_MS,
    );
    recommend(
        &evidence_from_raw(&a, &ws, &ps),
        &card,
        WEEK_HOURS * HOUR_MS,
        Options::default(),
    )
}

/// A notebook holding a GPU idle all week is told to stop or release it (saving all it
/// cost), not to pack it elsewhere nor to move it to spot.
#[test]
fn a_gpu_held_idle_all_along_is_to_release() {
    let r = held_notebook_week(&hourly_bill("i-a", "5.1207"));
    assert_eq!(r.release.len(), 1, "{r:?}");
    let x = &r.release[0];
    assert_eq!(
        (x.host.as_str(), x.gpus.as_slice()),
        ("a", ["GPU-nb".to_owned()].as_slice())
    );
    assert_eq!(x.owners["team"], "research");
    assert_eq!(
        x.saving,
        (dec("5.1207") * Decimal::from(WEEK_HOURS)).round_dp(2)
    );
    // Held all week, held all month: the same hourly cost over a 730-hour month.
    assert_eq!(
        x.monthly_saving,
        (dec("5.1207") * Decimal::from(730)).round_dp(2)
    );
    assert!(x
        .action
        .starts_with("stop the idle processes or release the GPU"));
    assert!(r.consolidation.is_empty() && r.spot.is_empty(), "{r:?}");
    assert_eq!(r.total_in(&x.currency), x.saving);
}

/// Two notebooks held idle all week, one on a host billed in dollars and one on a host billed
/// in euros: each release is in its own currency, and each currency's total is its own saving,
/// never a sum of the two.
#[test]
fn recommendations_in_two_currencies_are_drawn_and_added_up_apart() {
    let (mut ws, mut ps) = (Vec::new(), Vec::new());
    for (id, gpu) in [(1, "GPU-us"), (2, "GPU-eu")] {
        let (w, mut p) = week(
            id,
            gpu,
            "NVIDIA A100-SXM4-80GB",
            80,
            |_| 0.0,
            30,
            None,
            None,
        );
        for x in &mut p {
            x.sm_util_avg = Some(0.0);
            set_label(x, "team", "research");
        }
        ws.extend(w);
        ps.extend(p);
    }
    let mut lines = hourly_bill("i-a", "5.1207");
    lines.extend(hourly_bill("i-b", "4.5").into_iter().map(|mut l| {
        l.currency = "EUR".into();
        l
    }));
    let card = RateCard::default_card();
    let hosts = vec![host(1, "a"), host(2, "b")];
    let a = attribute(hosts, &ws, &ps, &lines, &card, H, H + WEEK_HOURS * HOUR_MS);
    let r = recommend(
        &evidence_from_raw(&a, &ws, &ps),
        &card,
        WEEK_HOURS * HOUR_MS,
        Options::default(),
    );
    assert_eq!(r.release.len(), 2, "{r:?}");
    for (currency, per_hour, gpu) in [("USD", "5.1207", "GPU-us"), ("EUR", "4.5", "GPU-eu")] {
        let x = r.release.iter().find(|x| x.currency == currency).unwrap();
        assert_eq!(x.gpus, [gpu.to_owned()], "{currency}");
        let week_cost = (dec(per_hour) * Decimal::from(WEEK_HOURS)).round_dp(2);
        assert_eq!(x.saving, week_cost, "{currency}");
        assert_eq!(r.total_in(currency), week_cost, "{currency}");
    }
    assert_eq!(r.total_saving.len(), 2, "{r:?}");
}

/// Two processes of one endpoint on one GPU window count it once, with the larger memory.
#[test]
fn usage_counts_a_window_once_per_label() {
    let (ws, mut ps) = week(1, "GPU-a", "NVIDIA L4", 24, |_| 42.0, 3, Some("chat"), None);
    let mut twin = ps[0].clone();
    twin.pid = 2;
    twin.memory_used_max_bytes = Some(5 << 30);
    ps.push(twin);
    let rows = usage_rows(&ws, &ps, &gpuledger_core::owners::OwnerSchema::default());
    let first: Vec<&UsageRow> = rows
        .iter()
        .filter(|r| r.period_ms == H && r.owner_by == "endpoint")
        .collect();
    assert_eq!(first.len(), 1);
    assert_eq!(
        (
            first[0].util_band,
            first[0].windows,
            first[0].peak_memory_bytes
        ),
        (8, 1, 5 << 30)
    );
    // One row per hour for the endpoint and one for the model.
    assert_eq!(rows.len() as i64, 2 * WEEK_HOURS);
}

/// A GPU held idle on hours a savings plan covered: releasing it frees commitment, paid for
/// either way, not cash. Half the week committed, half on demand: half of each, and the totals
/// keep them apart.
#[test]
fn held_idle_gpus_on_committed_hours_free_commitment_not_cash() {
    let mut lines = hourly_bill("i-a", "5.1207");
    for line in lines.iter_mut().take((WEEK_HOURS / 2) as usize) {
        line.pricing_category = "committed".into();
    }
    let r = held_notebook_week(&lines);
    assert_eq!(r.release.len(), 1, "{r:?}");
    let x = &r.release[0];
    let half = (dec("5.1207") * Decimal::from(WEEK_HOURS / 2)).round_dp(2);
    assert_eq!((x.saving, x.frees_commitment), (half, half), "{x:?}");
    assert_eq!(x.cost, x.saving + x.frees_commitment);
    assert_eq!(
        (x.monthly_saving, x.monthly_frees_commitment),
        (
            (dec("5.1207") * Decimal::from(365)).round_dp(2),
            (dec("5.1207") * Decimal::from(365)).round_dp(2)
        )
    );
    assert_eq!(
        r.total_in("USD"),
        half,
        "the cash total holds no commitment"
    );
    assert_eq!(r.frees_commitment_in("USD"), half);

    // All of it committed: no cash at all, and the recommendation is still made.
    for line in &mut lines {
        line.pricing_category = "committed".into();
    }
    let r = held_notebook_week(&lines);
    assert_eq!(r.release.len(), 1, "{r:?}");
    assert!(r.release[0].saving.is_zero(), "{r:?}");
    assert_eq!(r.release[0].frees_commitment, r.release[0].cost);
    assert!(r.total_in("USD").is_zero());
}

/// The demo's October: an endpoint serves from its A100 all week, and one day's load test ran
/// it on a host of H100s nobody uses otherwise. Each GPU model is sized apart: the load test
/// neither raises the endpoint's p95 nor joins its recommendation, so the endpoint goes to an
/// L4 for what its A100 cost alone, and the H100s get the advice that fits them: the host the
/// load test used is packed onto one GPU (its other GPU, which ran nothing, released with the
/// move), and a host nobody ran anything on all week is released.
#[test]
fn a_load_test_on_other_gpus_is_sized_apart_and_leaves_them_to_release() {
    let (mut ws, mut ps) = week(
        1,
        "GPU-chat",
        "NVIDIA A100-SXM4-80GB",
        80,
        |h| 10.0 + (h % 11) as f64,
        10,
        Some("chat"),
        None,
    );
    let (w, p) = week(
        2,
        "GPU-h1",
        "NVIDIA H100 80GB HBM3",
        80,
        |h| if h < 24 { 90.0 } else { 0.0 },
        10,
        Some("chat"),
        None,
    );
    ws.extend(w);
    // The load test's day only: no process the rest of the week.
    ps.extend(p.into_iter().filter(|p| p.start_ms < H + 24 * HOUR_MS));
    for (host_id, gpu) in [(2, "GPU-h2"), (3, "GPU-z")] {
        let (w, _) = week(
            host_id,
            gpu,
            "NVIDIA H100 80GB HBM3",
            80,
            |_| 0.0,
            0,
            None,
            None,
        );
        ws.extend(w);
    }
    let mut lines = hourly_bill("i-a", "5.1207");
    lines.extend(hourly_bill("i-h", "9.80"));
    lines.extend(hourly_bill("i-z", "4.90"));
    let card = RateCard::default_card();
    let (from, to) = (H, H + WEEK_HOURS * HOUR_MS);
    let a = attribute(
        vec![host(1, "a"), host(2, "h"), host(3, "z")],
        &ws,
        &ps,
        &lines,
        &card,
        from,
        to,
    );
    let r = recommend(
        &evidence_from_raw(&a, &ws, &ps),
        &card,
        to - from,
        Options::default(),
    );

    let chat: Vec<_> = r.right_size.iter().filter(|x| x.key == "chat").collect();
    assert_eq!(chat.len(), 1, "{r:?}");
    assert_eq!(
        (
            chat[0].current_gpu.as_str(),
            chat[0].gpus.as_slice(),
            chat[0].p95_util
        ),
        ("A100 80GB", ["GPU-chat".to_owned()].as_slice(), 25.0),
        "the load test's H100 is neither in the endpoint's GPUs nor in its p95"
    );
    assert_eq!(
        chat[0].cost,
        (dec("5.1207") * Decimal::from(WEEK_HOURS)).round_dp(2)
    );

    let packed: Vec<&Vec<String>> = r.consolidation.iter().map(|c| &c.gpus).collect();
    assert_eq!(
        packed,
        [&vec!["GPU-h1".to_owned(), "GPU-h2".to_owned()]],
        "{r:?}"
    );
    let h = &r.consolidation[0];
    assert!(
        h.action.starts_with("pack the work of its 2 GPUs onto one"),
        "{}",
        h.action
    );
    // GPU-h2's idle week is saved whole, GPU-h1's beyond the share of it its work needs.
    let half_week = dec("4.90") * Decimal::from(WEEK_HOURS);
    assert!(
        h.saving > half_week.round_dp(2) && h.saving < h.cost,
        "{h:?}"
    );
    let released: std::collections::BTreeMap<&str, (&[String], &str)> = (r.release.iter())
        .map(|x| (x.host.as_str(), (x.gpus.as_slice(), x.action.as_str())))
        .collect();
    assert_eq!(released.len(), 1, "{r:?}");
    assert_eq!(released["z"].0, ["GPU-z".to_owned()]);
    assert!(
        released["z"]
            .1
            .starts_with("release the GPU: no process ran"),
        "{r:?}"
    );
    let z = r.release.iter().find(|x| x.host == "z").unwrap();
    assert_eq!(
        z.saving,
        (dec("4.90") * Decimal::from(WEEK_HOURS)).round_dp(2)
    );
    assert!(z.owners.is_empty());
}

/// Several GPUs of a host, each a few percent busy, are one move: their work packed onto one
/// GPU, the others released, with the savings of each GPU added up.
#[test]
fn barely_busy_gpus_of_a_host_are_packed_in_one_recommendation() {
    let mut ws = Vec::new();
    let mut ps = Vec::new();
    for gpu in ["GPU-p1", "GPU-p2", "GPU-p3"] {
        let (w, p) = week(
            1,
            gpu,
            "NVIDIA H100 80GB HBM3",
            80,
            |_| 8.0,
            10,
            None,
            Some("sweep"),
        );
        ws.extend(w);
        ps.extend(p);
    }
    let lines = hourly_bill("i-a", "9.00");
    let card = RateCard::default_card();
    let (from, to) = (H, H + WEEK_HOURS * HOUR_MS);
    let a = attribute(vec![host(1, "a")], &ws, &ps, &lines, &card, from, to);
    let r = recommend(
        &evidence_from_raw(&a, &ws, &ps),
        &card,
        to - from,
        Options::default(),
    );
    assert_eq!(r.consolidation.len(), 1, "{r:?}");
    let c = &r.consolidation[0];
    assert_eq!(c.gpus, ["GPU-p1", "GPU-p2", "GPU-p3"]);
    assert_eq!(c.avg_util, 8.0);
    // 3 × 8% is 30% of one GPU kept 80% busy: each GPU's 90% spare.
    assert!(
        c.action.starts_with("pack the work of its 3 GPUs onto one"),
        "{}",
        c.action
    );
    assert!(c.action.contains("about 30% of one"), "{}", c.action);
    let week_cost = dec("9.00") * Decimal::from(WEEK_HOURS);
    assert_eq!(c.cost, week_cost.round_dp(2));
    assert_eq!(c.saving, (week_cost * dec("0.9")).round_dp(2));
}

/// A host whose working GPUs are too busy to pack, beside GPUs that ran no process all week, is
/// paid for whole: it gets advice all the same. A g5.48xlarge with 3 of its 8 A10Gs busy moves
/// to the g5.12xlarge (4 GPUs) the rate card has, saving the price difference on the whole
/// host; a p5.48xlarge with 2 of 8 H100s busy has no smaller p5, so the 6 idle GPUs' own cost
/// is what to win back, by giving them work or moving the busy ones' away.
#[test]
fn idle_gpus_beside_busy_ones_get_a_smaller_instance_or_their_cost_named() {
    let (mut ws, mut ps) = (Vec::new(), Vec::new());
    let busy = |host_id, gpu: &str, name, mem| {
        week(host_id, gpu, name, mem, |_| 90.0, 20, Some("chat"), None)
    };
    let idle =
        |host_id, gpu: &str, name, mem| week(host_id, gpu, name, mem, |_| 0.0, 0, None, None).0;
    for i in 0..8 {
        let gpu = format!("GPU-g{i}");
        if i < 3 {
            let (w, p) = busy(1, &gpu, "NVIDIA A10G", 24);
            ws.extend(w);
            ps.extend(p);
        } else {
            ws.extend(idle(1, &gpu, "NVIDIA A10G", 24));
        }
        let gpu = format!("GPU-p{i}");
        if i < 2 {
            let (w, p) = busy(2, &gpu, "NVIDIA H100 80GB HBM3", 80);
            ws.extend(w);
            ps.extend(p);
        } else {
            ws.extend(idle(2, &gpu, "NVIDIA H100 80GB HBM3", 80));
        }
    }
    let mut lines = hourly_bill("i-g", "16.288");
    lines.extend(hourly_bill("i-p", "55.04"));
    let card = RateCard::default_card();
    let (from, to) = (H, H + WEEK_HOURS * HOUR_MS);
    let hosts = vec![
        HostRow {
            instance_type: Some("g5.48xlarge".into()),
            ..host(1, "g")
        },
        HostRow {
            instance_type: Some("p5.48xlarge".into()),
            ..host(2, "p")
        },
    ];
    let a = attribute(hosts, &ws, &ps, &lines, &card, from, to);
    let r = recommend(
        &evidence_from_raw(&a, &ws, &ps),
        &card,
        to - from,
        Options::default(),
    );
    assert!(r.release.is_empty(), "{r:?}");
    let by_host: std::collections::BTreeMap<&str, &Consolidation> = r
        .consolidation
        .iter()
        .map(|c| (c.host.as_str(), c))
        .collect();
    assert_eq!(by_host.len(), 2, "{r:?}");

    let g = by_host["g"];
    assert!(
        g.action
            .starts_with("move to g5.12xlarge (4 GPUs): 5 of its 8 GPUs ran no process"),
        "{}",
        g.action
    );
    assert_eq!(g.gpus.len(), 8);
    let week_cost = dec("16.288") * Decimal::from(WEEK_HOURS);
    assert_eq!(g.cost, week_cost.round_dp(2));
    let share = Decimal::ONE - dec("5.672") / dec("16.288");
    assert_eq!(g.saving, (week_cost * share).round_dp(2));
    assert_eq!(g.frees_commitment, Decimal::ZERO);

    let p = by_host["p"];
    assert!(
        p.action
            .starts_with("give its 6 GPUs that ran no process work"),
        "{}",
        p.action
    );
    assert!(p.action.contains("no smaller p5.48xlarge"), "{}", p.action);
    assert_eq!(
        p.gpus,
        (2..8).map(|i| format!("GPU-p{i}")).collect::<Vec<_>>()
    );
    let week_cost = dec("55.04") * Decimal::from(WEEK_HOURS);
    assert_eq!(p.saving, (week_cost * dec("0.75")).round_dp(2));
    assert_eq!(
        p.monthly_saving,
        (week_cost * dec("0.75") * Decimal::from(730) / Decimal::from(WEEK_HOURS)).round_dp(2)
    );
}
