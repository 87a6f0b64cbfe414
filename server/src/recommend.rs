//! Recommendations: inference sized for peak, GPUs that could be consolidated, and training on
//! on-demand capacity that could run on spot, each with a monthly saving in dollars.
//!
//! Right-sizing looks at each endpoint and each model over a look-back (default 7 days): its
//! peak GPU memory per process, its p95 GPU utilization, the GPU it runs on and what it cost.
//! A smaller GPU fits when peak memory plus headroom (20%) fits in it and the p95 utilization,
//! scaled by the two GPUs' relative compute, stays under a target (80%); the cheapest fitting
//! one is recommended, and the saving is the endpoint's monthly cost scaled by the price ratio.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use rust_decimal::prelude::*;
use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};

use crate::attribution::{Kind, Part};
use crate::billing::ratecard::RateCard;
use crate::store::{AttributionWindow, StoredProcessWindow, UsageRow, UsageTotal};

pub mod snapshots;

const GIB: f64 = 1024.0 * 1024.0 * 1024.0;
pub const HOURS_PER_MONTH: i64 = 730;

/// A GPU (or MIG profile) one could run on, with an approximate on-demand price per GPU-hour
/// and dense FP16 compute for comparing utilization.
#[derive(Debug, Clone, Serialize)]
pub struct CatalogGpu {
    pub name: &'static str,
    pub memory_gb: f64,
    pub tflops: f64,
    /// An instance type offering it, for the recommendation's wording.
    pub instance_type: &'static str,
    pub price_per_gpu_hour: &'static str,
}

/// Approximate public on-demand prices (AWS us-east-1 per GPU; MIG profiles as their slice of
/// the GPU). Relative compute matters more than exactness here.
pub const CATALOG: &[CatalogGpu] = &[
    CatalogGpu {
        name: "T4",
        memory_gb: 16.0,
        tflops: 65.0,
        instance_type: "g4dn.xlarge",
        price_per_gpu_hour: "0.526",
    },
    CatalogGpu {
        name: "L4",
        memory_gb: 24.0,
        tflops: 121.0,
        instance_type: "g6.xlarge",
        price_per_gpu_hour: "0.8048",
    },
    CatalogGpu {
        name: "A10G",
        memory_gb: 24.0,
        tflops: 125.0,
        instance_type: "g5.xlarge",
        price_per_gpu_hour: "1.006",
    },
    CatalogGpu {
        name: "L40S",
        memory_gb: 48.0,
        tflops: 362.0,
        instance_type: "g6e.xlarge",
        price_per_gpu_hour: "1.861",
    },
    CatalogGpu {
        name: "A100 40GB MIG 1g.5gb",
        memory_gb: 5.0,
        tflops: 312.0 / 7.0,
        instance_type: "p4d.24xlarge (MIG)",
        price_per_gpu_hour: "0.5852",
    },
    CatalogGpu {
        name: "A100 40GB MIG 2g.10gb",
        memory_gb: 10.0,
        tflops: 312.0 * 2.0 / 7.0,
        instance_type: "p4d.24xlarge (MIG)",
        price_per_gpu_hour: "1.1705",
    },
    CatalogGpu {
        name: "A100 40GB MIG 3g.20gb",
        memory_gb: 20.0,
        tflops: 312.0 * 3.0 / 7.0,
        instance_type: "p4d.24xlarge (MIG)",
        price_per_gpu_hour: "1.7557",
    },
    CatalogGpu {
        name: "A100 40GB",
        memory_gb: 40.0,
        tflops: 312.0,
        instance_type: "p4d.24xlarge",
        price_per_gpu_hour: "4.0966",
    },
    CatalogGpu {
        name: "A100 80GB MIG 1g.10gb",
        memory_gb: 10.0,
        tflops: 312.0 / 7.0,
        instance_type: "p4de.24xlarge (MIG)",
        price_per_gpu_hour: "0.7315",
    },
    CatalogGpu {
        name: "A100 80GB MIG 3g.40gb",
        memory_gb: 40.0,
        tflops: 312.0 * 3.0 / 7.0,
        instance_type: "p4de.24xlarge (MIG)",
        price_per_gpu_hour: "2.1946",
    },
    CatalogGpu {
        name: "A100 80GB",
        memory_gb: 80.0,
        tflops: 312.0,
        instance_type: "p4de.24xlarge",
        price_per_gpu_hour: "5.1207",
    },
    CatalogGpu {
        name: "H100 MIG 1g.10gb",
        memory_gb: 10.0,
        tflops: 989.0 / 7.0,
        instance_type: "p5.48xlarge (MIG)",
        price_per_gpu_hour: "0.9829",
    },
    CatalogGpu {
        name: "H100 MIG 3g.40gb",
        memory_gb: 40.0,
        tflops: 989.0 * 3.0 / 7.0,
        instance_type: "p5.48xlarge (MIG)",
        price_per_gpu_hour: "2.9486",
    },
    CatalogGpu {
        name: "H100 80GB",
        memory_gb: 80.0,
        tflops: 989.0,
        instance_type: "p5.48xlarge",
        price_per_gpu_hour: "6.88",
    },
    CatalogGpu {
        name: "H200 141GB",
        memory_gb: 141.0,
        tflops: 989.0,
        instance_type: "p5e.48xlarge",
        price_per_gpu_hour: "7.91",
    },
];

impl CatalogGpu {
    pub fn price(&self) -> Decimal {
        Decimal::from_str(self.price_per_gpu_hour).unwrap_or(Decimal::ZERO)
    }
}

/// The catalog entry an NVML name and memory size describe.
pub fn identify(nvml_name: &str, memory_total_bytes: Option<i64>) -> Option<&'static CatalogGpu> {
    let n = nvml_name.to_ascii_uppercase();
    let mem_gb = memory_total_bytes.map(|b| b as f64 / GIB);
    let family = ["H200", "H100", "A100", "L40S", "A10G", "L4", "T4"]
        .into_iter()
        .find(|f| n.contains(f))?;
    CATALOG
        .iter()
        .filter(|c| c.name.starts_with(family) && !c.name.contains("MIG"))
        .min_by(|a, b| {
            let d = |c: &CatalogGpu| mem_gb.map_or(0.0, |m| (c.memory_gb - m).abs());
            d(a).total_cmp(&d(b))
        })
}

#[derive(Debug, Clone, Copy)]
pub struct Options {
    pub headroom: f64,
    pub target_util: f64,
    pub consolidation_below: f64,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            headroom: 0.20,
            target_util: 80.0,
            consolidation_below: 50.0,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RightSize {
    /// `endpoint` or `model`.
    pub by: String,
    pub key: String,
    pub current_gpu: String,
    pub gpus: usize,
    pub peak_memory_gb: f64,
    pub p95_util: f64,
    #[serde(with = "rust_decimal::serde::str")]
    pub monthly_cost: Decimal,
    pub recommended_gpu: String,
    pub recommended_instance_type: String,
    pub projected_p95_util: f64,
    #[serde(with = "rust_decimal::serde::str")]
    pub monthly_saving: Decimal,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Consolidation {
    pub gpu_uuid: String,
    pub host: String,
    pub avg_util: f64,
    #[serde(with = "rust_decimal::serde::str")]
    pub monthly_cost: Decimal,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SpotCandidate {
    pub experiment: String,
    #[serde(with = "rust_decimal::serde::str")]
    pub on_demand_monthly_cost: Decimal,
    #[serde(with = "rust_decimal::serde::str")]
    pub monthly_saving: Decimal,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Recommendations {
    pub lookback_days: f64,
    pub right_size: Vec<RightSize>,
    pub consolidation: Vec<Consolidation>,
    pub spot: Vec<SpotCandidate>,
}

/// Width of a utilization band, in points: usage is kept as window counts per band.
pub const UTIL_BAND_POINTS: f64 = 5.0;
const BANDS: usize = 21;

/// The band a window's utilization falls in: 0 (under 5%) to 20 (100%).
pub fn util_band(util: f64) -> i64 {
    ((util / UTIL_BAND_POINTS).floor() as i64).clamp(0, BANDS as i64 - 1)
}

/// The 95th percentile of windows counted per band, as the top of its band (rounded up to the
/// next 5 points, so a smaller GPU is never chosen on a low reading); 0 with no windows.
fn p95_of_bands(bands: &[i64; BANDS]) -> f64 {
    let n: i64 = bands.iter().sum();
    let rank = ((n * 95 + 99) / 100).max(1);
    let mut seen = 0;
    for (band, count) in bands.iter().enumerate() {
        seen += count;
        if n > 0 && seen >= rank {
            return ((band + 1) as f64 * UTIL_BAND_POINTS).min(100.0);
        }
    }
    0.0
}

/// Scales a cost over `lookback_ms` to a 730-hour month (unrounded: round what is shown).
fn monthly(cost: Decimal, lookback_ms: i64) -> Decimal {
    cost * Decimal::from(HOURS_PER_MONTH * 3_600_000) / Decimal::from(lookback_ms.max(1))
}

/// Per hour, GPU and endpoint or model label: GPU windows per utilization band and the largest
/// GPU memory one of its processes held (what the roll-up keeps for right-sizing). A window
/// counts once per label however many of its processes carry it.
pub fn usage_rows(
    windows: &[AttributionWindow],
    processes: &[StoredProcessWindow],
) -> Vec<UsageRow> {
    let window_of: HashMap<(&str, i64), &AttributionWindow> = windows
        .iter()
        .map(|w| ((w.gpu_uuid.as_str(), w.start_ms), w))
        .collect();
    type Key<'a> = (i64, i64, &'a str, &'static str, &'a str, i64);
    let mut counted: BTreeMap<Key, (BTreeSet<i64>, i64)> = BTreeMap::new();
    for p in processes {
        let Some(w) = window_of.get(&(p.gpu_uuid.as_str(), p.start_ms)) else {
            continue;
        };
        let band = w.util_avg.map_or(-1, util_band);
        for (by, key) in [("endpoint", &p.endpoint), ("model", &p.model)] {
            let Some(key) = key else { continue };
            let hour = crate::attribution::hour_floor(w.start_ms);
            let e = counted
                .entry((hour, w.host_id, w.gpu_uuid.as_str(), by, key.as_str(), band))
                .or_default();
            e.0.insert(w.start_ms);
            e.1 = e.1.max(p.memory_used_max_bytes.unwrap_or(0));
        }
    }
    counted
        .into_iter()
        .map(
            |((period_ms, host_id, gpu, by, key, util_band), (starts, peak))| UsageRow {
                period_ms,
                host_id,
                gpu_uuid: gpu.to_owned(),
                owner_by: by.to_owned(),
                owner_key: key.to_owned(),
                util_band,
                windows: starts.len() as i64,
                peak_memory_bytes: peak,
            },
        )
        .collect()
}

/// What recommendations are drawn from: attributed cost (and GPU utilization) per GPU, owner,
/// kind and price over the look-back, and how each endpoint and model used its GPUs.
#[derive(Debug, Clone, Default)]
pub struct Evidence {
    pub parts: Vec<Part>,
    pub usage: Vec<UsageTotal>,
    /// MIG instances: never candidates for packing GPUs together.
    pub mig_instances: BTreeSet<String>,
    pub hostnames: HashMap<i64, String>,
}

#[cfg(test)]
impl Evidence {
    /// From raw windows and their attribution: what the rollups summarize, so tests can hold
    /// the two to the same answer.
    pub fn from_raw(
        attribution: &crate::attribution::Attribution,
        windows: &[AttributionWindow],
        processes: &[StoredProcessWindow],
    ) -> Evidence {
        let gpu_of: HashMap<&str, &AttributionWindow> =
            windows.iter().map(|w| (w.gpu_uuid.as_str(), w)).collect();
        let usage = usage_rows(windows, processes)
            .into_iter()
            .map(|u| {
                let w = gpu_of.get(u.gpu_uuid.as_str());
                UsageTotal {
                    host_id: u.host_id,
                    gpu_name: w.and_then(|w| w.gpu_name.clone()),
                    memory_total_bytes: w.and_then(|w| w.memory_total_bytes),
                    parent_uuid: w.and_then(|w| w.parent_uuid.clone()),
                    gpu_uuid: u.gpu_uuid,
                    owner_by: u.owner_by,
                    owner_key: u.owner_key,
                    util_band: u.util_band,
                    windows: u.windows,
                    peak_memory_bytes: u.peak_memory_bytes,
                }
            })
            .collect();
        Evidence {
            parts: attribution.parts.clone(),
            usage,
            mig_instances: windows
                .iter()
                .filter(|w| w.parent_uuid.is_some())
                .map(|w| w.gpu_uuid.clone())
                .collect(),
            hostnames: attribution
                .hosts
                .iter()
                .map(|(id, h)| (*id, h.hostname.clone()))
                .collect(),
        }
    }
}

pub fn recommend(
    evidence: &Evidence,
    card: &RateCard,
    lookback_ms: i64,
    options: Options,
) -> Recommendations {
    // Per endpoint and per model: peak process memory, windows per utilization band, GPUs,
    // GPU models (weighted by windows).
    #[derive(Default)]
    struct Usage<'a> {
        peak_bytes: i64,
        bands: [i64; BANDS],
        gpus: BTreeSet<&'a str>,
        gpu_models: BTreeMap<(&'a str, Option<i64>), i64>,
    }
    let mut usage: BTreeMap<(&'static str, &str), Usage> = BTreeMap::new();
    for u in &evidence.usage {
        let by = match u.owner_by.as_str() {
            "endpoint" => "endpoint",
            "model" => "model",
            _ => continue,
        };
        let e = usage.entry((by, u.owner_key.as_str())).or_default();
        e.peak_bytes = e.peak_bytes.max(u.peak_memory_bytes);
        if let Ok(band) = usize::try_from(u.util_band) {
            e.bands[band.min(BANDS - 1)] += u.windows;
        }
        e.gpus.insert(&u.gpu_uuid);
        *e.gpu_models
            .entry((u.gpu_name.as_deref().unwrap_or(""), u.memory_total_bytes))
            .or_default() += u.windows;
    }
    // What each endpoint and model cost, from the attribution (the bill, exactly), and each
    // GPU's cost and time-weighted utilization.
    let mut cost: HashMap<(&str, String), Decimal> = HashMap::new();
    let mut experiment_on_demand: BTreeMap<String, Decimal> = BTreeMap::new();
    #[derive(Default)]
    struct Gpu {
        cost: Decimal,
        util_gpu_seconds: f64,
        util_known_seconds: f64,
        host_id: i64,
        in_use: bool,
    }
    let mut gpus: BTreeMap<&str, Gpu> = BTreeMap::new();
    for part in &evidence.parts {
        if let Some(g) = &part.gpu_uuid {
            let e = gpus.entry(g).or_default();
            e.cost += part.cost;
            e.util_gpu_seconds += part.util_gpu_seconds;
            e.util_known_seconds += part.util_known_seconds;
            e.host_id = part.host_id;
            e.in_use |= matches!(part.kind, Kind::Used | Kind::HeldIdle);
        }
        if part.kind != Kind::Used && part.kind != Kind::HeldIdle {
            continue;
        }
        if let Some(e) = &part.owner.endpoint {
            *cost.entry(("endpoint", e.clone())).or_default() += part.cost;
        }
        if let Some(m) = &part.owner.model {
            *cost.entry(("model", m.clone())).or_default() += part.cost;
        }
        // Training: an experiment that serves no endpoint.
        if let (Some(e), None) = (&part.owner.experiment, &part.owner.endpoint) {
            if part.pricing_category == "on_demand" {
                *experiment_on_demand.entry(e.clone()).or_default() += part.cost;
            }
        }
    }

    let mut right_size = Vec::new();
    for ((by, key), u) in &usage {
        let Some(((name, mem), _)) = u.gpu_models.iter().max_by_key(|(_, n)| **n) else {
            continue;
        };
        let Some(current) = identify(name, *mem) else {
            continue;
        };
        let need_gb = u.peak_bytes as f64 / GIB * (1.0 + options.headroom);
        let p95_util = p95_of_bands(&u.bands);
        let best = CATALOG
            .iter()
            .filter(|c| c.memory_gb >= need_gb && c.price() < current.price())
            .map(|c| (c, p95_util * current.tflops / c.tflops))
            .filter(|(_, projected)| *projected <= options.target_util)
            .min_by(|a, b| a.0.price().cmp(&b.0.price()));
        let Some((rec, projected)) = best else {
            continue;
        };
        let monthly_cost = monthly(
            cost.get(&(*by, key.to_string()))
                .copied()
                .unwrap_or_default(),
            lookback_ms,
        );
        let ratio = rec.price() / current.price();
        right_size.push(RightSize {
            by: (*by).to_owned(),
            key: key.to_string(),
            current_gpu: current.name.to_owned(),
            gpus: u.gpus.len(),
            peak_memory_gb: (u.peak_bytes as f64 / GIB * 10.0).round() / 10.0,
            p95_util,
            monthly_cost: monthly_cost.round_dp(2),
            recommended_gpu: rec.name.to_owned(),
            recommended_instance_type: rec.instance_type.to_owned(),
            projected_p95_util: (projected * 10.0).round() / 10.0,
            monthly_saving: (monthly_cost * (Decimal::ONE - ratio)).round_dp(2),
        });
    }
    right_size.sort_by_key(|r| std::cmp::Reverse(r.monthly_saving));

    // Whole GPUs busy less than half the time, with work on them: candidates to pack together.
    let mut consolidation: Vec<Consolidation> = gpus
        .into_iter()
        .filter(|(g, u)| {
            u.in_use && u.util_known_seconds > 0.0 && !evidence.mig_instances.contains(*g)
        })
        .map(|(g, u)| (g, u.util_gpu_seconds / u.util_known_seconds, u))
        .filter(|(_, avg, _)| *avg < options.consolidation_below)
        .map(|(g, avg, u)| Consolidation {
            gpu_uuid: g.to_owned(),
            host: evidence
                .hostnames
                .get(&u.host_id)
                .cloned()
                .unwrap_or_default(),
            avg_util: (avg * 10.0).round() / 10.0,
            monthly_cost: monthly(u.cost, lookback_ms).round_dp(2),
        })
        .collect();
    consolidation.sort_by_key(|c| std::cmp::Reverse(c.monthly_cost));

    // Spot saves what the rate card says spot saves on average over its instance types.
    let (od, spot): (Decimal, Decimal) = card
        .instance_types
        .values()
        .filter_map(|r| r.spot.map(|s| (r.on_demand, s)))
        .fold((Decimal::ZERO, Decimal::ZERO), |(a, b), (o, s)| {
            (a + o, b + s)
        });
    let spot_ratio = if od.is_zero() {
        Decimal::from_str("0.4").unwrap_or_default()
    } else {
        spot / od
    };
    let spot_candidates = experiment_on_demand
        .into_iter()
        .map(|(experiment, c)| {
            let m = monthly(c, lookback_ms);
            SpotCandidate {
                experiment,
                on_demand_monthly_cost: m.round_dp(2),
                monthly_saving: (m * (Decimal::ONE - spot_ratio)).round_dp(2),
            }
        })
        .filter(|s| s.monthly_saving > Decimal::ZERO)
        .collect();

    Recommendations {
        lookback_days: lookback_ms as f64 / 86_400_000.0,
        right_size,
        consolidation,
        spot: spot_candidates,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    use crate::attribution::{attribute, HOUR_MS};
    use crate::store::{HostRow, StoredCostLine};

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
                energy_mj: None,
            });
            ps.push(StoredProcessWindow {
                gpu_uuid: gpu.into(),
                start_ms: start,
                pid: 1,
                process_name: None,
                memory_used_max_bytes: Some(mem_gib << 30),
                sm_util_avg: Some(u.max(2.0)),
                model: endpoint.map(|_| "mistral-7b".to_owned()),
                experiment: experiment.map(str::to_owned),
                endpoint: endpoint.map(str::to_owned),
                team: None,
                labels_json: "{}".into(),
                container_id: None,
                pod_uid: None,
            });
        }
        (ws, ps)
    }

    fn hourly_bill(key: &str, per_hour: &str) -> Vec<StoredCostLine> {
        (0..WEEK_HOURS)
            .map(|h| StoredCostLine {
                resource_key: Some(key.into()),
                charge_period_start_ms: H + h * HOUR_MS,
                charge_period_end_ms: H + (h + 1) * HOUR_MS,
                charge_category: "Usage".into(),
                billed_cost: per_hour.into(),
                effective_cost: per_hour.into(),
                currency: "USD".into(),
                pricing_category: "on_demand".into(),
                instance_type: None,
            })
            .collect()
    }

    /// An endpoint using 10 GB on an 80 GB A100 at ~20% is sent to an L4, saving the price
    /// difference for a month; a busy endpoint that needs the A100 is left alone.
    #[test]
    fn an_over_provisioned_endpoint_is_sent_to_an_l4_with_the_right_saving() {
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
            p.model = Some("llama-70b".into());
        }
        ps.extend(ps2);
        let mut lines = hourly_bill("i-a", "5.1207");
        lines.extend(hourly_bill("i-b", "5.1207"));
        let hosts = vec![host(1, "a"), host(2, "b")];
        let card = RateCard::default_card();
        let (from, to) = (H, H + WEEK_HOURS * HOUR_MS);
        let attribution = attribute(hosts, &ws, &ps, &lines, &card, from, to);
        let evidence = Evidence::from_raw(&attribution, &ws, &ps);
        let r = recommend(&evidence, &card, to - from, Options::default());
        let chat: Vec<&RightSize> = r.right_size.iter().filter(|x| x.key == "chat").collect();
        assert_eq!(chat.len(), 1, "{:?}", r.right_size);
        let c = chat[0];
        assert_eq!(
            (
                c.current_gpu.as_str(),
                c.recommended_gpu.as_str(),
                c.recommended_instance_type.as_str()
            ),
            ("A100 80GB", "L4", "g6.xlarge")
        );
        // The 95th window is at 20%: band 20–25, read as its top.
        assert_eq!(c.p95_util, 25.0);
        assert_eq!(c.peak_memory_gb, 10.0);
        // (5.1207 - 0.8048) $/h over a 730-hour month.
        assert_eq!(c.monthly_saving, Decimal::from_str("3150.61").unwrap());
        assert_eq!(c.monthly_cost, Decimal::from_str("3738.11").unwrap());
        assert!(
            r.right_size
                .iter()
                .all(|x| x.key != "big-llm" && x.key != "llama-70b"),
            "the busy one stays"
        );
        // The idle-ish chat GPU is a consolidation candidate; the busy one is not.
        let gpus: Vec<&str> = r
            .consolidation
            .iter()
            .map(|c| c.gpu_uuid.as_str())
            .collect();
        assert_eq!(gpus, vec!["GPU-chat"]);
    }

    /// A quiet MIG instance is not a GPU to pack elsewhere; a quiet whole GPU is.
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
            p.team = Some("research".into());
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
            &Evidence::from_raw(&a, &ws, &ps),
            &card,
            to - from,
            Options::default(),
        );
        let gpus: Vec<&str> = r
            .consolidation
            .iter()
            .map(|c| c.gpu_uuid.as_str())
            .collect();
        assert_eq!(gpus, vec!["GPU-w"]);
        assert_eq!(r.consolidation[0].host, "a");
        assert_eq!(r.consolidation[0].avg_util, 9.0);
    }

    #[test]
    fn training_on_on_demand_could_run_on_spot() {
        let (ws, ps) = week(
            1,
            "GPU-t",
            "NVIDIA H100 80GB HBM3",
            80,
            |_| 95.0,
            70,
            None,
            Some("sweep-7"),
        );
        let card = RateCard::default_card();
        let lines = hourly_bill("i-a", "6.88");
        let attribution = attribute(
            vec![host(1, "a")],
            &ws,
            &ps,
            &lines,
            &card,
            H,
            H + WEEK_HOURS * HOUR_MS,
        );
        let r = recommend(
            &Evidence::from_raw(&attribution, &ws, &ps),
            &card,
            WEEK_HOURS * HOUR_MS,
            Options::default(),
        );
        assert_eq!(r.spot.len(), 1);
        assert_eq!(r.spot[0].experiment, "sweep-7");
        assert_eq!(
            r.spot[0].on_demand_monthly_cost,
            Decimal::from_str("5022.40").unwrap()
        );
        assert!(
            r.spot[0].monthly_saving > Decimal::ZERO
                && r.spot[0].monthly_saving < r.spot[0].on_demand_monthly_cost
        );
    }

    #[test]
    fn p95_of_bands_is_the_top_of_the_band_holding_the_95th_percentile() {
        let mut bands = [0; BANDS];
        // 100 windows at 1..=100%: the 95th is 95% (band 19), read as its top, 100.
        for u in 1..=100 {
            bands[util_band(f64::from(u)) as usize] += 1;
        }
        assert_eq!(p95_of_bands(&bands), 100.0);
        let mut bands = [0; BANDS];
        bands[util_band(7.0) as usize] = 1;
        assert_eq!(p95_of_bands(&bands), 10.0);
        // 95 windows at 12%, 5 at 90%: the 95th window is still at 12%.
        let mut bands = [0; BANDS];
        bands[util_band(12.0) as usize] = 95;
        bands[util_band(90.0) as usize] = 5;
        assert_eq!(p95_of_bands(&bands), 15.0);
        bands[util_band(12.0) as usize] = 94;
        bands[util_band(90.0) as usize] = 6;
        assert_eq!(p95_of_bands(&bands), 95.0);
        assert_eq!(p95_of_bands(&[0; BANDS]), 0.0);
        assert_eq!(
            (util_band(-3.0), util_band(100.0), util_band(140.0)),
            (0, 20, 20)
        );
    }

    /// Two processes of one endpoint on one GPU window count it once, with the larger memory.
    #[test]
    fn usage_counts_a_window_once_per_label() {
        let (ws, mut ps) = week(1, "GPU-a", "NVIDIA L4", 24, |_| 42.0, 3, Some("chat"), None);
        let mut twin = ps[0].clone();
        twin.pid = 2;
        twin.memory_used_max_bytes = Some(5 << 30);
        ps.push(twin);
        let rows = usage_rows(&ws, &ps);
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
}
