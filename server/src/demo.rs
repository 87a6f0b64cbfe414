//! A simulated fleet for `gpuledger-server demo`: a few clusters of hosts whose windows go
//! through the same validation and ingest code as real agent reports.

use std::collections::BTreeMap;

use gpuledger_proto::{GpuWindow, HostInfo, ProcessWindow, Report, Window};

use rust_decimal::Decimal;

use crate::billing::ratecard::RateCard;
use crate::store;
use crate::store::{AgentStatus, Store, StoreError};
use crate::validate::{self, Limits};
use gpuledger_core::time::month_start_ms;

const GIB: u64 = 1024 * 1024 * 1024;
use gpuledger_core::time::{DAY_MS, HOUR_MS};

struct HostSpec {
    cluster: &'static str,
    hostname: String,
    instance_type: &'static str,
    gpu_name: &'static str,
    gpu_mem: u64,
    gpus: u32,
    workload: Workload,
    /// on_demand or spot.
    lifecycle: &'static str,
}

#[derive(Clone, Copy)]
enum Workload {
    /// A training run keeping every GPU busy.
    Training(&'static str, &'static str),
    /// An inference endpoint following the day: busy by day, quiet at night.
    Inference(&'static str, &'static str),
    /// A notebook holding memory and doing nothing.
    HeldIdle(&'static str),
    /// Nothing at all.
    Idle,
}

fn fleet() -> Vec<HostSpec> {
    let mut hosts = Vec::new();
    for i in 0..8 {
        hosts.push(HostSpec {
            cluster: "train-east",
            hostname: format!("train-east-{i:02}"),
            instance_type: "p4d.24xlarge",
            gpu_name: "NVIDIA A100-SXM4-80GB",
            gpu_mem: 80 * GIB,
            gpus: 8,
            workload: if i < 6 {
                Workload::Training("llama-70b-ft", "exp-lr-sweep")
            } else {
                Workload::HeldIdle("research")
            },
            lifecycle: "on_demand",
        });
    }
    for i in 0..6 {
        hosts.push(HostSpec {
            cluster: "serve-west",
            hostname: format!("serve-west-{i:02}"),
            instance_type: "g5.12xlarge",
            gpu_name: "NVIDIA A10G",
            gpu_mem: 24 * GIB,
            gpus: 4,
            workload: Workload::Inference("chat-api", "mistral-7b"),
            lifecycle: if i >= 4 { "spot" } else { "on_demand" },
        });
    }
    for i in 0..4 {
        hosts.push(HostSpec {
            cluster: "serve-eu",
            hostname: format!("serve-eu-{i:02}"),
            instance_type: "g6.xlarge",
            gpu_name: "NVIDIA L4",
            gpu_mem: 24 * GIB,
            gpus: 1,
            workload: Workload::Inference("rerank", "bge-reranker"),
            lifecycle: "on_demand",
        });
    }
    hosts.push(HostSpec {
        cluster: "serve-west",
        hostname: "serve-west-big".into(),
        instance_type: "p4de.24xlarge",
        gpu_name: "NVIDIA A100-SXM4-80GB",
        gpu_mem: 80 * GIB,
        gpus: 8,
        workload: Workload::Inference("embeddings", "bge-large"),
        lifecycle: "on_demand",
    });
    for i in 0..2 {
        hosts.push(HostSpec {
            cluster: "scratch",
            hostname: format!("scratch-{i:02}"),
            instance_type: "p5.48xlarge",
            gpu_name: "NVIDIA H100 80GB HBM3",
            gpu_mem: 80 * GIB,
            gpus: 8,
            workload: Workload::Idle,
            lifecycle: "on_demand",
        });
    }
    hosts
}

/// Weekdays 08:00–20:00 UTC.
fn office_hours(t_ms: i64) -> bool {
    let hour = t_ms.rem_euclid(DAY_MS) / HOUR_MS;
    gpuledger_core::time::weekday(t_ms) < 5 && (8..20).contains(&hour)
}

/// A cheap deterministic wobble in [0, 1) so the demo looks alive but is reproducible.
fn wobble(seed: u64) -> f64 {
    let x = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    ((x >> 33) % 1000) as f64 / 1000.0
}

/// The day the serving team borrowed the idle H100 cluster for a load test: the day before the
/// demo starts, so its spend spike is on the review and in Slack. It ends at midnight, or at
/// least two whole hours before the demo starts, so the cluster has been idle longer than any
/// idle duration and is an incident at once whatever the time of day.
fn load_test_day(now_ms: i64) -> (i64, i64) {
    let today = gpuledger_core::time::day_floor(now_ms);
    let quiet_from = now_ms - now_ms.rem_euclid(HOUR_MS) - 2 * HOUR_MS;
    (today - DAY_MS, today.min(quiet_from))
}

/// What a host runs at `t_ms`: its own workload, but serving's load test on the idle cluster's
/// hosts during `load_test`.
fn workload_at(spec: &HostSpec, t_ms: i64, load_test: Option<(i64, i64)>) -> Workload {
    match (spec.workload, load_test) {
        (Workload::Idle, Some((from, to))) if (from..to).contains(&t_ms) => {
            Workload::Inference("chat-api", "mistral-7b")
        }
        (w, _) => w,
    }
}

fn gpu_window(
    spec: &HostSpec,
    g: u32,
    t_ms: i64,
    len_ms: i64,
    load_test: Option<(i64, i64)>,
) -> GpuWindow {
    let seed = (t_ms as u64 / 1000) ^ (u64::from(g) << 40) ^ spec.hostname.len() as u64;
    let hour = (t_ms / 3_600_000) % 24;
    let workload = workload_at(spec, t_ms, load_test);
    let (util, mem, proc_labels): (f64, u64, Option<BTreeMap<String, String>>) = match workload {
        Workload::Training(model, exp) => (
            85.0 + 10.0 * wobble(seed),
            spec.gpu_mem * 9 / 10,
            Some(BTreeMap::from([
                ("model".into(), model.into()),
                // A new sweep each week.
                (
                    "experiment".into(),
                    format!("{exp}-{}", t_ms / (7 * DAY_MS) % 10),
                ),
                ("team".into(), "foundation".into()),
            ])),
        ),
        Workload::Inference(endpoint, model) => {
            let daytime = (8..20).contains(&hour);
            let base = if daytime { 55.0 } else { 12.0 };
            // The reranker serves the office only: nobody calls it at night or at weekends,
            // and it holds its GPU all the same (a scale-to-zero window).
            let quiet = endpoint == "rerank" && !office_hours(t_ms);
            (
                if quiet {
                    0.5 * wobble(seed)
                } else {
                    base + 15.0 * wobble(seed)
                },
                if spec.gpu_mem > 40 * GIB {
                    10 * GIB
                } else {
                    14 * GIB
                },
                Some(BTreeMap::from([
                    ("endpoint".into(), endpoint.into()),
                    ("model".into(), model.into()),
                    ("team".into(), "applied".into()),
                ])),
            )
        }
        Workload::HeldIdle(team) => (
            0.5 * wobble(seed),
            30 * GIB,
            Some(BTreeMap::from([
                ("team".into(), team.into()),
                ("experiment".into(), "notebook".into()),
            ])),
        ),
        Workload::Idle => (0.0, 0, None),
    };
    // Who runs each kind of work: service accounts for jobs, a person for the notebook.
    let user = match workload {
        Workload::Training(..) => "svc-train",
        Workload::Inference(..) => "svc-serve",
        _ => "maria",
    };
    let processes = proc_labels
        .map(|labels| {
            vec![ProcessWindow {
                pid: 10_000 + g,
                name: Some(
                    match workload {
                        Workload::HeldIdle(_) => "jupyter-kernel",
                        _ => "python3",
                    }
                    .into(),
                ),
                user: Some(user.into()),
                memory_used_max_bytes: Some(mem),
                sm_util_avg: Some((util - 2.0).max(0.0)),
                labels,
                ..Default::default()
            }]
        })
        .unwrap_or_default();
    let watts = 60.0 + 3.2 * util;
    GpuWindow {
        uuid: format!("GPU-demo-{}-{g}", spec.hostname),
        index: g,
        name: spec.gpu_name.into(),
        parent_uuid: None,
        memory_total_bytes: Some(spec.gpu_mem),
        memory_used_max_bytes: Some(mem),
        util_avg: Some(util),
        util_max: Some((util + 5.0).min(100.0)),
        util_histogram: Vec::new(),
        mem_util_avg: Some(util / 2.0),
        power_avg_watts: Some(watts),
        temperature_max_c: Some(35.0 + util / 3.0),
        energy_mj: Some((watts * len_ms as f64) as u64),
        processes,
        ..Default::default()
    }
}

/// The hourly price the demo's bill charges a host: the rate card's, at spot for spot hosts
/// and 40% off on-demand under a savings plan for the training cluster.
fn billed_hourly(
    spec: &HostSpec,
    card: &RateCard,
) -> (Decimal, &'static str, Option<&'static str>) {
    let rate = card.instance_types.get(spec.instance_type);
    let on_demand = rate.map_or(Decimal::ZERO, |r| r.on_demand);
    match spec.lifecycle {
        "spot" => (
            rate.and_then(|r| r.spot).unwrap_or(on_demand),
            "Dynamic",
            None,
        ),
        _ if spec.cluster == "train-east" => {
            (on_demand * Decimal::new(6, 1), "Committed", Some("Used"))
        }
        _ => (on_demand, "Standard", None),
    }
}

/// The demo bill's compute savings plan, covering the training cluster.
pub const DEMO_SAVINGS_PLAN: &str = "arn:aws:savingsplans::111122223333:savingsplan/demo-sp";

/// The demo bill's GPU instance that no agent reports.
pub const FORGOTTEN_INSTANCE: &str = "i-0f0e0d0c0b0a09080";

fn instance_id(spec: &HostSpec) -> String {
    format!(
        "i-0{:0>16x}",
        spec.hostname
            .bytes()
            .fold(0u64, |h, b| h.wrapping_mul(31).wrapping_add(u64::from(b)))
    )
}

/// One demo bill line: what differs between lines; the rest is the same for the whole bill.
struct DemoLine<'a> {
    start: i64,
    len: i64,
    billed: Decimal,
    effective: Decimal,
    list_unit: Decimal,
    pricing: &'a str,
    commitment: Option<&'a str>,
    /// The line's part of its commitment: `Used` on a resource it covered, `Unused` on the
    /// commitment itself, none on its purchase.
    commitment_status: Option<&'a str>,
    /// `Usage`, or `Purchase` for a commitment's recurring fee.
    charge: &'a str,
    service: (&'a str, &'a str, &'a str),
    sku: &'a str,
    details: String,
    resource: (String, String, &'a str),
    description: String,
    unit: &'a str,
    /// The resource's tags, as a FOCUS `Tags` JSON object.
    tags: &'a str,
}

/// A FOCUS 1.2 export as AWS Data Exports writes it ("FOCUS 1.2 with AWS columns"): every GPU
/// host-hour up to `billed_until`, plus storage lines that are not GPU hosts, with every
/// column FOCUS 1.2 defines filled as AWS fills it.
fn focus_bill(card: &RateCard, start: i64, billed_until: i64) -> String {
    let iso = gpuledger_core::time::rfc3339;
    let month_end = |ms: i64| gpuledger_core::time::month_of(ms).1;
    let mut w = csv::Writer::from_writer(Vec::new());
    let columns: Vec<&str> = crate::focus_export::COLUMNS
        .iter()
        .copied()
        .filter(|c| !c.starts_with("Allocated"))
        .chain(["x_ServiceCode", "x_UsageType"])
        .collect();
    let _ = w.write_record(&columns);
    let mut row = |l: DemoLine| {
        let period = month_start_ms(l.start);
        let quantity = Decimal::from(l.len / HOUR_MS);
        let list = l.list_unit * quantity;
        let text = |d: Decimal| gpuledger_core::money::to_text(d);
        let used = l.commitment.is_some();
        let purchase = l.charge == "Purchase";
        let unused = l.commitment_status == Some("Unused");
        let value = |col: &str| -> String {
            match col {
                "AvailabilityZone" => "us-east-1a".into(),
                "BilledCost" => text(l.billed),
                "BillingAccountId" => "111122223333".into(),
                "BillingAccountName" => "gpuledger-demo-payer".into(),
                "BillingAccountType" => "Billing Account".into(),
                "BillingCurrency" | "PricingCurrency" => "USD".into(),
                "BillingPeriodEnd" => iso(month_end(l.start)),
                "BillingPeriodStart" => iso(period),
                "ChargeCategory" => l.charge.into(),
                "ChargeDescription" => l.description.clone(),
                "ChargeFrequency" if purchase => "Recurring".into(),
                "ChargeFrequency" => "Usage-Based".into(),
                "ChargePeriodEnd" => iso(l.start + l.len),
                "ChargePeriodStart" => iso(l.start),
                "CommitmentDiscountCategory" if used => "Spend".into(),
                "CommitmentDiscountId" => l.commitment.unwrap_or_default().into(),
                "CommitmentDiscountName" if used => "demo-compute-savings-plan".into(),
                "CommitmentDiscountQuantity" if purchase => text(l.billed),
                "CommitmentDiscountQuantity" if used => text(l.effective),
                "CommitmentDiscountStatus" => l.commitment_status.unwrap_or_default().into(),
                "CommitmentDiscountType" if used => "Compute Savings Plan".into(),
                "CommitmentDiscountUnit" if used => "USD".into(),
                // An unused commitment consumed nothing.
                "ConsumedQuantity" | "ConsumedUnit" if unused => String::new(),
                "ConsumedQuantity" | "PricingQuantity" => text(quantity),
                "ConsumedUnit" | "PricingUnit" => l.unit.into(),
                "ContractedCost" if purchase => text(l.billed),
                "ContractedCost" | "PricingCurrencyEffectiveCost" if used => text(l.effective),
                "ContractedCost" => text(list),
                "ContractedUnitPrice" | "PricingCurrencyContractedUnitPrice" if used => {
                    text(l.effective / quantity.max(Decimal::ONE))
                }
                "ContractedUnitPrice" | "PricingCurrencyContractedUnitPrice" => text(l.list_unit),
                "PricingCurrencyEffectiveCost" | "EffectiveCost" => text(l.effective),
                // Bought from AWS itself, not through a marketplace: AWS issues the invoice. No
                // invoice id: the simulated months are not invoiced.
                "InvoiceIssuerName" | "PublisherName" => "AWS".into(),
                "ListCost" => text(list),
                "ListUnitPrice" | "PricingCurrencyListUnitPrice" => text(l.list_unit),
                "PricingCategory" => l.pricing.into(),
                "ProviderName" => "AWS".into(),
                "RegionId" => "us-east-1".into(),
                "RegionName" => "US East (N. Virginia)".into(),
                "ResourceId" => l.resource.0.clone(),
                "ResourceName" => l.resource.1.clone(),
                "ResourceType" => l.resource.2.into(),
                "ServiceCategory" => l.service.0.into(),
                "ServiceName" => l.service.1.into(),
                "ServiceSubcategory" => l.service.2.into(),
                "SkuId" => l.sku.into(),
                "SkuMeter" => "Usage".into(),
                "SkuPriceDetails" => l.details.clone(),
                "SkuPriceId" => format!("{}.JRTCKXETXF.6YS6EN2CT7", l.sku),
                "SubAccountId" => "444455556666".into(),
                "SubAccountName" => "ml-platform".into(),
                "SubAccountType" => "Linked Account".into(),
                "Tags" => l.tags.into(),
                "x_ServiceCode" => l.service.1.replace(' ', ""),
                "x_UsageType" => format!("USE1-{}", l.sku),
                _ => String::new(),
            }
        };
        let _ = w.write_record(columns.iter().map(|c| value(c)));
    };
    for spec in fleet() {
        let (hourly, pricing, status) = billed_hourly(&spec, card);
        let list_unit = card
            .instance_types
            .get(spec.instance_type)
            .map_or(Decimal::ZERO, |r| r.on_demand);
        let commitment = status.map(|_| DEMO_SAVINGS_PLAN);
        let billed = if commitment.is_some() {
            Decimal::ZERO
        } else {
            hourly
        };
        let arn = format!(
            "arn:aws:ec2:us-east-1:111122223333:instance/{}",
            instance_id(&spec)
        );
        let how = match pricing {
            "Dynamic" => "Spot",
            "Committed" => "Savings Plan covered",
            _ => "On Demand",
        };
        let mut t = start;
        while t + HOUR_MS <= billed_until {
            row(DemoLine {
                start: t,
                len: HOUR_MS,
                billed,
                effective: hourly,
                list_unit,
                pricing,
                commitment,
                commitment_status: status,
                charge: "Usage",
                service: (
                    "Compute",
                    "Amazon Elastic Compute Cloud",
                    "Virtual Machines",
                ),
                sku: "DEMOEC2SKU",
                details: format!("{{\"InstanceType\":\"{}\"}}", spec.instance_type),
                resource: (arn.clone(), spec.hostname.clone(), "Instance"),
                description: format!(
                    "${hourly} per {how} Linux {} Instance Hour",
                    spec.instance_type
                ),
                unit: "Hours",
                tags: "{}",
            });
            t += HOUR_MS;
        }
    }
    // The savings plan was bought for nine training hosts and one has since been released: its
    // hourly fee is invoiced on the plan itself (a recurring purchase, amortized as usage), and
    // what the eight left of it each hour is its unused part.
    let covered: Decimal = fleet()
        .iter()
        .filter_map(|spec| {
            let (hourly, _, status) = billed_hourly(spec, card);
            status.map(|_| hourly)
        })
        .sum();
    let fee = covered * Decimal::new(1125, 3);
    let plan = (
        DEMO_SAVINGS_PLAN.to_owned(),
        "demo-compute-savings-plan".to_owned(),
        "Savings Plan",
    );
    let mut t = start;
    while t + HOUR_MS <= billed_until {
        for (charge, status, billed, effective, pricing, description) in [
            (
                "Purchase",
                None,
                fee,
                Decimal::ZERO,
                "Standard",
                format!("Savings Plan recurring fee: ${fee} per hour"),
            ),
            (
                "Usage",
                Some("Unused"),
                Decimal::ZERO,
                fee - covered,
                "Committed",
                "Savings Plan commitment not used".to_owned(),
            ),
        ] {
            row(DemoLine {
                start: t,
                len: HOUR_MS,
                billed,
                effective,
                list_unit: billed.max(effective),
                pricing,
                commitment: Some(DEMO_SAVINGS_PLAN),
                commitment_status: status,
                charge,
                service: ("Compute", "Savings Plans for AWS Compute usage", "Other"),
                sku: "DEMOSPSKU",
                details: "{}".into(),
                resource: plan.clone(),
                description,
                unit: "Hours",
                tags: "{}",
            });
        }
        t += HOUR_MS;
    }
    // A GPU dev box somebody started and nobody installed the agent on: billed every hour,
    // known only from the bill, its tags saying whose it is.
    let (box_type, box_id) = ("g5.xlarge", FORGOTTEN_INSTANCE);
    let box_rate = card
        .instance_types
        .get(box_type)
        .map_or(Decimal::ZERO, |r| r.on_demand);
    let mut t = start;
    while t + HOUR_MS <= billed_until {
        row(DemoLine {
            start: t,
            len: HOUR_MS,
            billed: box_rate,
            effective: box_rate,
            list_unit: box_rate,
            pricing: "Standard",
            commitment: None,
            commitment_status: None,
            charge: "Usage",
            service: (
                "Compute",
                "Amazon Elastic Compute Cloud",
                "Virtual Machines",
            ),
            sku: "DEMOEC2SKU",
            details: format!("{{\"InstanceType\":\"{box_type}\"}}"),
            resource: (
                format!("arn:aws:ec2:us-east-1:111122223333:instance/{box_id}"),
                "vision-devbox".into(),
                "Instance",
            ),
            description: format!("${box_rate} per On Demand Linux {box_type} Instance Hour"),
            unit: "Hours",
            tags: r#"{"team":"vision","owner":"dana"}"#,
        });
        t += HOUR_MS;
    }
    // Shared storage: on the bill, no GPU host's.
    let mut t = start;
    while t + DAY_MS <= billed_until {
        let cost = Decimal::new(411_237, 4);
        row(DemoLine {
            start: t,
            len: DAY_MS,
            billed: cost,
            effective: cost,
            list_unit: cost / Decimal::from(24),
            pricing: "Standard",
            commitment: None,
            commitment_status: None,
            charge: "Usage",
            service: ("Storage", "Amazon Simple Storage Service", "Object Storage"),
            sku: "DEMOS3SKU",
            details: "{}".into(),
            resource: (
                "arn:aws:s3:::demo-datasets".into(),
                "demo-datasets".into(),
                "Bucket",
            ),
            description: "$0.023 per GB-Mo for storage used in US East (N. Virginia)".into(),
            unit: "Hours",
            tags: r#"{"team":"data-platform"}"#,
        });
        t += DAY_MS;
    }
    w.into_inner()
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default()
}

/// Fills `store` with the simulated fleet from the first day of the previous month until now,
/// in one-hour windows sent as agents send reports, and imports its FOCUS bill (the last two
/// days not billed yet, so they show as estimates). Each cluster's agents report with their own
/// token (`demo-CLUSTER`), scoped to that cluster as a real fleet's would be. Returns how many
/// reports went in.
pub async fn seed(
    store: &dyn Store,
    card: &RateCard,
    rules: &crate::attribution::Rules,
    now_ms: i64,
) -> Result<usize, DemoError> {
    seed_reporting(store, card, rules, now_ms, &crate::progress::Silent).await
}

/// [`seed`], saying how far it is: each host's days of reports, then the bill and the roll-up.
pub async fn seed_reporting(
    store: &dyn Store,
    card: &RateCard,
    rules: &crate::attribution::Rules,
    now_ms: i64,
    progress: &dyn crate::progress::Progress,
) -> Result<usize, DemoError> {
    let this_month = month_start_ms(now_ms);
    let start = month_start_ms(this_month - 1);
    let end = now_ms - now_ms % 60_000;
    let load_test = load_test_day(now_ms);
    // The demo carries two months of history, more than the default 35-day ingest window.
    let limits = Limits {
        retention_ms: end - start + HOUR_MS,
        ..Limits::default()
    };
    let mut batches = 0;
    let mut tokens: std::collections::HashMap<&str, i64> = std::collections::HashMap::new();
    let days = u64::try_from((end - start + DAY_MS - 1) / DAY_MS).unwrap_or_default();
    progress.total(days * fleet().len() as u64);
    for spec in fleet() {
        progress.part(&spec.hostname);
        let token_id = match tokens.get(spec.cluster) {
            Some(&id) => id,
            None => {
                let name = format!("demo-{}", spec.cluster);
                let hash = crate::auth::hash_token(&crate::auth::generate_token());
                store::tokens::create_token(
                    store.db(),
                    &crate::store::NewToken::for_cluster(&name, &hash, spec.cluster),
                    now_ms,
                )
                .await?;
                let id = store::tokens::token_by_name(store.db(), &name)
                    .await?
                    .ok_or_else(|| DemoError::Invalid(format!("token {name} was not stored")))?
                    .id;
                tokens.insert(spec.cluster, id);
                id
            }
        };
        let host = HostInfo {
            hostname: spec.hostname.clone(),
            cluster: spec.cluster.into(),
            provider: Some("aws".into()),
            instance_id: Some(instance_id(&spec)),
            instance_type: Some(spec.instance_type.into()),
            region: Some("us-east-1".into()),
            lifecycle: Some(spec.lifecycle.into()),
        };
        // One report per day of hourly windows, as an agent catching up after an outage would.
        let mut t = start;
        let mut requests = Vec::new();
        let mut run_progress = Vec::new();
        while t < end {
            let day_end = (t + DAY_MS).min(end);
            let mut windows = Vec::new();
            while t < day_end {
                let w_end = (t + HOUR_MS).min(day_end);
                let gpus: Vec<GpuWindow> = (0..spec.gpus)
                    .map(|g| gpu_window(&spec, g, t, w_end - t, Some(load_test)))
                    .collect();
                if let Workload::Training(_, exp) = workload_at(&spec, t, Some(load_test)) {
                    // The training code's progress: each week's sweep makes 1,200 optimizer
                    // steps an hour (every rank reports the same step), an epoch each 50,000.
                    let week = 7 * DAY_MS;
                    let step = ((w_end - (t - t % week)) / HOUR_MS) * 1_200;
                    run_progress.push(serde_json::json!({
                        "experiment": format!("{exp}-{}", t / week % 10),
                        "at": gpuledger_core::time::rfc3339(w_end),
                        "step": step,
                        "epoch": step / 50_000,
                    }));
                }
                if let Workload::Inference(endpoint, _) = spec.workload {
                    // The serving code's request counter: requests follow the load.
                    let per_util = if endpoint == "embeddings" {
                        900.0
                    } else {
                        160.0
                    };
                    // A GPU held idle serves nobody.
                    let busy: f64 = gpus
                        .iter()
                        .filter_map(|g| g.util_avg)
                        .filter(|u| *u >= 1.0)
                        .sum();
                    let served = (busy * per_util) as u64;
                    // And its token counters: chat prompts of about 600 tokens answered in
                    // about 250; embeddings read about 300 and generate none.
                    let (input, output) = if endpoint == "embeddings" {
                        (300, 0)
                    } else {
                        (600, 250)
                    };
                    requests.push(serde_json::json!({
                        "endpoint": endpoint,
                        "start": gpuledger_core::time::rfc3339(t),
                        "end": gpuledger_core::time::rfc3339(w_end),
                        "requests": served,
                        "input_tokens": served * input,
                        "output_tokens": served * output,
                    }));
                }
                windows.push(Window {
                    serving: Vec::new(),
                    start_ms: t,
                    end_ms: w_end,
                    samples: ((w_end - t) / 1000) as u32,
                    gpus,
                });
                t = w_end;
            }
            let report = Report {
                batch_id: format!("demo-{}-{}", spec.hostname, t),
                agent_version: "demo".into(),
                host: host.clone(),
                windows,
            };
            validate::validate(&report, now_ms, &limits)
                .map_err(|e| DemoError::Invalid(e.to_string()))?;
            let outcome = store
                .ingest(&report, token_id, AgentStatus::default(), now_ms)
                .await?;
            if outcome != crate::store::IngestOutcome::Stored {
                return Err(DemoError::Invalid(format!(
                    "report {} was not stored: {outcome:?}",
                    report.batch_id
                )));
            }
            batches += 1;
            progress.advance(1);
        }
        if !requests.is_empty() || !run_progress.is_empty() {
            let body = serde_json::json!({
                "source": spec.hostname, "counts": requests, "progress": run_progress
            });
            let (source, counts, run_progress) = crate::http::usage::parse(
                body.to_string().as_bytes(),
                now_ms,
                limits.retention_ms,
                limits.max_clock_skew_ms,
            )
            .map_err(|e| DemoError::Invalid(format!("usage counts: {e:?}")))?;
            if let Some(refusal) = store::usage::record(
                store.db(),
                &source,
                (&counts, &run_progress),
                token_id,
                now_ms,
            )
            .await?
            {
                return Err(DemoError::Invalid(refusal.message));
            }
        }
    }
    let billed_until = (end - 2 * DAY_MS) - (end - 2 * DAY_MS).rem_euclid(HOUR_MS);
    progress.part("the bill");
    let bill = focus_bill(card, start, billed_until);
    crate::billing::import_focus(store, "demo-focus-export.csv", bill.into_bytes(), now_ms)
        .await
        .map_err(|e| DemoError::Invalid(e.to_string()))?;
    // Roll it all up now, so the first page opened shows everything.
    progress.part("rolling up");
    crate::rollup::run(store, card, rules, usize::MAX).await?;
    set_budgets(store, &rules.owners, now_ms).await?;
    Ok(batches)
}

/// This month's budgets for the demo's teams, from what each spent last month: training a
/// little above it, serving below it (heading over), research well above.
async fn set_budgets(
    store: &dyn Store,
    owners: &crate::config::OwnerSchema,
    now_ms: i64,
) -> Result<(), StoreError> {
    use crate::allocation::{key_of, GroupBy};
    let Some(team) = GroupBy::role(owners, gpuledger_core::owners::Role::Team) else {
        return Ok(());
    };
    let this = month_start_ms(now_ms);
    let (from, to) = gpuledger_core::time::month_of(this - 1);
    let last = crate::ledger::load(store, from, to, crate::store::RollupGrain::HostRange).await?;
    for (name, percent) in [("foundation", 110), ("applied", 85), ("research", 150)] {
        let spent: Decimal = last
            .parts
            .iter()
            .filter(|p| p.currency == "USD" && key_of(p, team, &last) == name)
            .map(|p| p.cost)
            .sum();
        // In round hundreds, as a finance lead would set it.
        let amount =
            (spent * Decimal::from(percent) / Decimal::from(10_000)).round() * Decimal::from(100);
        if amount.is_zero() {
            continue;
        }
        store::budgets::set_budget(
            store.db(),
            &store::budgets::BudgetRow {
                dimension: team.as_str().to_owned(),
                owner_key: name.to_owned(),
                from_month_ms: this,
                amount: gpuledger_core::money::to_text(amount),
                currency: "USD".into(),
                set_by: "demo".into(),
                set_ms: now_ms,
            },
        )
        .await?;
    }
    Ok(())
}

/// Keeps the simulated fleet reporting while the demo serves, as its agents would: the windows
/// of `[from_ms, to_ms)` for every host, one report per host, with each cluster's token. The
/// Idle page and Slack then see a live fleet (a fleet that stopped reporting is not idle, it is
/// unmonitored). Returns how many windows went in.
pub async fn report_live(store: &dyn Store, from_ms: i64, to_ms: i64) -> Result<usize, DemoError> {
    if to_ms <= from_ms {
        return Ok(0);
    }
    let mut stored = 0;
    for spec in fleet() {
        let name = format!("demo-{}", spec.cluster);
        let Some(token) = store::tokens::token_by_name(store.db(), &name).await? else {
            return Err(DemoError::Invalid(format!("token {name} is missing")));
        };
        let report = Report {
            batch_id: format!("demo-live-{}-{from_ms}", spec.hostname),
            agent_version: "demo".into(),
            host: HostInfo {
                hostname: spec.hostname.clone(),
                cluster: spec.cluster.into(),
                provider: Some("aws".into()),
                instance_id: Some(instance_id(&spec)),
                instance_type: Some(spec.instance_type.into()),
                region: Some("us-east-1".into()),
                lifecycle: Some(spec.lifecycle.into()),
            },
            windows: vec![Window {
                serving: Vec::new(),
                start_ms: from_ms,
                end_ms: to_ms,
                samples: ((to_ms - from_ms) / 1000) as u32,
                gpus: (0..spec.gpus)
                    .map(|g| gpu_window(&spec, g, from_ms, to_ms - from_ms, None))
                    .collect(),
            }],
        };
        match store
            .ingest(&report, token.id, AgentStatus::default(), to_ms)
            .await?
        {
            crate::store::IngestOutcome::Refused(r) => {
                return Err(DemoError::Invalid(format!(
                    "live report refused: {}",
                    r.message
                )))
            }
            _ => stored += report.windows[0].gpus.len(),
        }
    }
    Ok(stored)
}

#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    #[error("the simulated data was refused: {0}")]
    Invalid(String),
    #[error("{0}")]
    Store(#[from] StoreError),
}

#[cfg(test)]
mod tests;
