//! Real `nvidia-smi -q` captures (`../shared/nvml-captures/`, read in place): what each GPU's
//! driver answered, and the fake-NVML scenario of the same machine.
//!
//! A scenario names the machine's *state* (which model each GPU is, what runs on it, its MIG
//! layout, the memory the driver reserved); what NVML then answers about it comes from the
//! fake's model catalogue. Where the capture shows N/A, the scenario still gives a value, so a
//! matching "not supported" proves the catalogue knows the board, not that the scenario was
//! silent.

use std::path::{Path, PathBuf};

use serde_json::{json, Value};

const MIB: u64 = 1 << 20;

/// The captures folder beside the repository.
pub fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/nvml-captures")
}

/// A reading as `nvidia-smi -q` shows it: a value, `N/A` (NVML answered NOT_SUPPORTED), or no
/// element at all.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Reading<T> {
    Value(T),
    NotAvailable,
    Absent,
}

impl<T: Copy> Reading<T> {
    pub fn value(&self) -> Option<T> {
        match self {
            Reading::Value(v) => Some(*v),
            _ => None,
        }
    }
}

#[derive(Debug, Clone)]
pub struct Capture {
    pub file: PathBuf,
    pub driver_version: Option<String>,
    pub gpus: Vec<CapturedGpu>,
}

#[derive(Debug, Clone)]
pub struct CapturedGpu {
    pub name: String,
    pub uuid: String,
    pub memory_total_mib: u64,
    /// Absent before drivers reported reserved memory.
    pub memory_reserved_mib: Option<u64>,
    pub memory_used_mib: u64,
    pub memory_free_mib: u64,
    pub gpu_util: Reading<u32>,
    pub memory_util: Reading<u32>,
    /// Watts: the one-second average where the driver shows one (what NVML's power usage
    /// answers on these boards), else the draw.
    pub power_w: Reading<f64>,
    pub temperature_c: Reading<u32>,
    /// Current MIG mode; `NotAvailable`/`Absent` where the board has no MIG.
    pub mig_mode: Reading<bool>,
    pub mig: Vec<CapturedMig>,
    pub processes: Vec<CapturedProcess>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct CapturedMig {
    pub index: u32,
    pub gpu_instance_id: u32,
    pub compute_instance_id: u32,
    pub multiprocessors: u32,
    pub copy_engines: u32,
    pub decoders: u32,
    pub encoders: u32,
    pub jpegs: u32,
    pub ofas: u32,
    pub memory_total_mib: u64,
    pub memory_used_mib: u64,
}

#[derive(Debug, Clone, PartialEq)]
pub struct CapturedProcess {
    pub pid: u32,
    /// `C`, `G` or `C+G`.
    pub kind: String,
    pub name: String,
    pub used_mib: Option<u64>,
    pub gpu_instance_id: Option<u32>,
    pub compute_instance_id: Option<u32>,
}

/// Every capture of a GPU's state: the telegraf XML files and the gpud text files.
pub fn all() -> Vec<Capture> {
    let mut out = Vec::new();
    for (sub, ext) in [("telegraf", "xml"), ("gpud", "txt")] {
        let mut files: Vec<PathBuf> = std::fs::read_dir(dir().join(sub))
            .unwrap_or_else(|e| panic!("{}: {e}", dir().join(sub).display()))
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|x| x == ext))
            .collect();
        files.sort();
        for f in files {
            let text = std::fs::read_to_string(&f).unwrap();
            let capture = if ext == "xml" {
                from_xml(&f, &text)
            } else {
                from_text(&f, &text)
            };
            out.push(capture);
        }
    }
    out
}

/// "81920 MiB" → 81920, "27 C" → 27, "67.03 W" → 67.03; `N/A` and unreadable text are N/A.
fn reading<T: std::str::FromStr>(text: Option<&str>) -> Reading<T> {
    match text.map(str::trim) {
        None => Reading::Absent,
        Some(t) => t
            .split_whitespace()
            .next()
            .and_then(|n| n.parse().ok())
            .map_or(Reading::NotAvailable, Reading::Value),
    }
}

fn number<T: std::str::FromStr + Copy>(text: Option<&str>, what: &str, file: &Path) -> T {
    reading(text)
        .value()
        .unwrap_or_else(|| panic!("{}: {what}: {text:?}", file.display()))
}

fn mode(text: Option<&str>) -> Reading<bool> {
    match text.map(str::trim) {
        None => Reading::Absent,
        Some("Enabled") => Reading::Value(true),
        Some("Disabled") => Reading::Value(false),
        Some(_) => Reading::NotAvailable,
    }
}

fn instance_id(text: Option<&str>) -> Option<u32> {
    reading(text).value()
}

fn from_xml(file: &Path, text: &str) -> Capture {
    // The old DTD declarations name files that are not here; roxmltree skips them when allowed.
    let options = roxmltree::ParsingOptions {
        allow_dtd: true,
        ..Default::default()
    };
    let doc = roxmltree::Document::parse_with_options(text, options)
        .unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    let root = doc.root_element();
    fn child<'a, 'i>(n: roxmltree::Node<'a, 'i>, name: &str) -> Option<roxmltree::Node<'a, 'i>> {
        n.children().find(|c| c.has_tag_name(name))
    }
    let path = |n: roxmltree::Node<'_, '_>, names: &[&str]| -> Option<String> {
        let mut at = n;
        for name in names {
            at = at.children().find(|c| c.has_tag_name(*name))?;
        }
        Some(at.text().unwrap_or("").to_owned())
    };
    let mut gpus = Vec::new();
    for g in root.children().filter(|c| c.has_tag_name("gpu")) {
        let fb = |k: &str| path(g, &["fb_memory_usage", k]);
        let power = path(g, &["gpu_power_readings", "average_power_draw"])
            .or_else(|| path(g, &["gpu_power_readings", "power_draw"]))
            .or_else(|| path(g, &["power_readings", "power_draw"]));
        let mig = child(g, "mig_devices")
            .into_iter()
            .flat_map(|m| m.children().filter(|c| c.has_tag_name("mig_device")))
            .map(|m| {
                let shared = |k: &str| {
                    number(
                        path(m, &["device_attributes", "shared", k]).as_deref(),
                        k,
                        file,
                    )
                };
                CapturedMig {
                    index: number(path(m, &["index"]).as_deref(), "index", file),
                    gpu_instance_id: number(path(m, &["gpu_instance_id"]).as_deref(), "gi", file),
                    compute_instance_id: number(
                        path(m, &["compute_instance_id"]).as_deref(),
                        "ci",
                        file,
                    ),
                    multiprocessors: shared("multiprocessor_count"),
                    copy_engines: shared("copy_engine_count"),
                    decoders: shared("decoder_count"),
                    encoders: shared("encoder_count"),
                    jpegs: shared("jpg_count"),
                    ofas: shared("ofa_count"),
                    memory_total_mib: number(
                        path(m, &["fb_memory_usage", "total"]).as_deref(),
                        "total",
                        file,
                    ),
                    memory_used_mib: number(
                        path(m, &["fb_memory_usage", "used"]).as_deref(),
                        "used",
                        file,
                    ),
                }
            })
            .collect();
        let processes = child(g, "processes")
            .into_iter()
            .flat_map(|p| p.children().filter(|c| c.has_tag_name("process_info")))
            .map(|p| CapturedProcess {
                pid: number(path(p, &["pid"]).as_deref(), "pid", file),
                kind: path(p, &["type"]).unwrap_or_default(),
                name: path(p, &["process_name"]).unwrap_or_default(),
                used_mib: reading(path(p, &["used_memory"]).as_deref()).value(),
                gpu_instance_id: instance_id(path(p, &["gpu_instance_id"]).as_deref()),
                compute_instance_id: instance_id(path(p, &["compute_instance_id"]).as_deref()),
            })
            .collect();
        gpus.push(CapturedGpu {
            name: path(g, &["product_name"]).unwrap_or_default(),
            uuid: path(g, &["uuid"]).unwrap_or_default(),
            memory_total_mib: number(fb("total").as_deref(), "fb total", file),
            memory_reserved_mib: reading(fb("reserved").as_deref()).value(),
            memory_used_mib: number(fb("used").as_deref(), "fb used", file),
            memory_free_mib: number(fb("free").as_deref(), "fb free", file),
            gpu_util: reading(path(g, &["utilization", "gpu_util"]).as_deref()),
            memory_util: reading(path(g, &["utilization", "memory_util"]).as_deref()),
            power_w: reading(power.as_deref()),
            temperature_c: reading(path(g, &["temperature", "gpu_temp"]).as_deref()),
            mig_mode: mode(path(g, &["mig_mode", "current_mig"]).as_deref()),
            mig,
            processes,
        });
    }
    Capture {
        file: file.to_owned(),
        driver_version: path(root, &["driver_version"]),
        gpus,
    }
}

/// One `Key : Value` line of `nvidia-smi -q` text with the lines indented under it.
#[derive(Debug, Default)]
struct Node {
    key: String,
    value: Option<String>,
    children: Vec<Node>,
}

impl Node {
    fn get(&self, key: &str) -> Option<&Node> {
        self.children.iter().find(|c| c.key == key)
    }

    fn at(&self, keys: &[&str]) -> Option<&str> {
        let mut n = self;
        for k in keys {
            n = n.get(k)?;
        }
        n.value.as_deref()
    }
}

/// The text's indentation as a tree.
fn tree(text: &str) -> Node {
    let mut stack: Vec<(usize, Node)> = vec![(0, Node::default())];
    for line in text.lines() {
        if line.trim().is_empty() || line.starts_with('=') {
            continue;
        }
        let indent = line.len() - line.trim_start().len() + 1;
        let (key, value) = match line.split_once(" : ") {
            Some((k, v)) => (k.trim().to_owned(), Some(v.trim().to_owned())),
            None => (line.trim().trim_end_matches(':').trim().to_owned(), None),
        };
        while stack.len() > 1 && stack.last().is_some_and(|(i, _)| *i >= indent) {
            let (_, done) = stack.pop().unwrap();
            stack.last_mut().unwrap().1.children.push(done);
        }
        stack.push((
            indent,
            Node {
                key,
                value,
                children: Vec::new(),
            },
        ));
    }
    while stack.len() > 1 {
        let (_, done) = stack.pop().unwrap();
        stack.last_mut().unwrap().1.children.push(done);
    }
    stack.pop().unwrap().1
}

fn from_text(file: &Path, text: &str) -> Capture {
    let root = tree(text);
    let mut gpus = Vec::new();
    for g in root.children.iter().filter(|c| c.key.starts_with("GPU 0")) {
        let fb = |k: &str| g.at(&["FB Memory Usage", k]);
        let mut processes = Vec::new();
        if let Some(list) = g.get("Processes").filter(|p| p.value.is_none()) {
            let mut current: Option<CapturedProcess> = None;
            for n in &list.children {
                match n.key.as_str() {
                    "GPU instance ID" => {
                        processes.extend(current.take());
                        current = Some(CapturedProcess {
                            pid: 0,
                            kind: String::new(),
                            name: String::new(),
                            used_mib: None,
                            gpu_instance_id: instance_id(n.value.as_deref()),
                            compute_instance_id: None,
                        });
                    }
                    "Compute instance ID" => {
                        if let Some(p) = current.as_mut() {
                            p.compute_instance_id = instance_id(n.value.as_deref());
                        }
                    }
                    "Process ID" => {
                        if let Some(p) = current.as_mut() {
                            p.pid = number(n.value.as_deref(), "pid", file);
                            p.kind = n.at(&["Type"]).unwrap_or_default().to_owned();
                            p.name = n.at(&["Name"]).unwrap_or_default().to_owned();
                            p.used_mib = reading(n.at(&["Used GPU Memory"])).value();
                        }
                    }
                    _ => {}
                }
            }
            processes.extend(current);
        }
        gpus.push(CapturedGpu {
            name: g.at(&["Product Name"]).unwrap_or_default().to_owned(),
            uuid: g.at(&["GPU UUID"]).unwrap_or_default().to_owned(),
            memory_total_mib: number(fb("Total"), "fb total", file),
            memory_reserved_mib: reading(fb("Reserved")).value(),
            memory_used_mib: number(fb("Used"), "fb used", file),
            memory_free_mib: number(fb("Free"), "fb free", file),
            gpu_util: reading(g.at(&["Utilization", "Gpu"])),
            memory_util: reading(g.at(&["Utilization", "Memory"])),
            power_w: reading(
                g.at(&["GPU Power Readings", "Average Power Draw"])
                    .or_else(|| g.at(&["GPU Power Readings", "Power Draw"])),
            ),
            temperature_c: reading(g.at(&["Temperature", "GPU Current Temp"])),
            mig_mode: mode(g.at(&["MIG Mode", "Current"])),
            mig: Vec::new(),
            processes,
        });
    }
    Capture {
        file: file.to_owned(),
        driver_version: root.at(&["Driver Version"]).map(str::to_owned),
        gpus,
    }
}

/// The catalogue model a captured board is: its own name, except where an old driver named it
/// otherwise.
pub fn model_of(gpu: &CapturedGpu) -> &str {
    match gpu.name.as_str() {
        // Driver 418 did not know the GTX 1660 Ti by name.
        "Graphics Device" => "NVIDIA GeForce GTX 1660 Ti",
        name => name,
    }
}

/// Where a capture reports a total the catalogue's board does not have, with why: the machine
/// is configured as captured and the difference named here.
pub fn total_as_captured(file: &Path, gpu: &CapturedGpu) -> Option<&'static str> {
    let name = file.file_name()?.to_str()?;
    (name == "gtx-1070-ti.xml" && gpu.memory_total_mib == 4096)
        .then_some("telegraf's minimal GTX 1070 Ti fragment reports 4,096 MiB of the board's 8,192")
}

/// A MIG profile of `model` by what a captured MIG device shows (memory and SMs), through the
/// fake's own profile query so the test never names a profile table of its own.
pub fn profile_name(profiles: &[(String, u64, u32)], mig: &CapturedMig) -> Option<String> {
    profiles
        .iter()
        .find(|(_, mib, sms)| *mib == mig.memory_total_mib && *sms == mig.multiprocessors)
        .map(|(name, _, _)| name.clone())
}

/// The scenario of a captured machine. `profiles` maps each MIG profile name of a GPU's model
/// to (memory MiB, SMs), for naming its captured instances.
pub fn scenario(
    capture: &Capture,
    profiles: impl Fn(&CapturedGpu) -> Vec<(String, u64, u32)>,
) -> Value {
    let gpus: Vec<Value> = capture
        .gpus
        .iter()
        .enumerate()
        .map(|(i, g)| {
            let process = |p: &CapturedProcess| {
                json!({
                    "pid": p.pid, "name": p.name, "type": p.kind,
                    "memory_used_bytes": p.used_mib.unwrap_or(0) * MIB,
                })
            };
            let in_instance = |m: &CapturedMig, p: &&CapturedProcess| {
                p.gpu_instance_id == Some(m.gpu_instance_id)
                    && p.compute_instance_id == Some(m.compute_instance_id)
            };
            let instances_used: u64 = g.mig.iter().map(|m| m.memory_used_mib).sum();
            let known = if g.mig_mode == Reading::Value(true) {
                profiles(g)
            } else {
                Vec::new()
            };
            let mig: Vec<Value> = g
                .mig
                .iter()
                .map(|m| {
                    let profile = profile_name(&known, m).unwrap_or_else(|| {
                        panic!("{}: no profile of {} fits {m:?}", capture.file.display(), g.name)
                    });
                    let procs: Vec<Value> =
                        g.processes.iter().filter(|p| in_instance(m, p)).map(process).collect();
                    json!({
                        "profile": profile, "gpu_instance_id": m.gpu_instance_id,
                        "uuid": format!("MIG-{}-{}", g.uuid.trim_start_matches("GPU-"), m.index),
                        "phases": [{ "memory_used_bytes": m.memory_used_mib * MIB, "processes": procs }],
                    })
                })
                .collect();
            let own: Vec<Value> = g
                .processes
                .iter()
                .filter(|p| p.gpu_instance_id.is_none())
                .map(process)
                .collect();
            // Values even where the capture shows N/A: the model must refuse them itself.
            let mut gpu = json!({
                "model": model_of(g),
                "uuid": if g.uuid.is_empty() { format!("GPU-capture-{i}") } else { g.uuid.clone() },
                "memory_reserved_bytes": g.memory_reserved_mib.unwrap_or(0) * MIB,
                "temperature_c": g.temperature_c.value().unwrap_or(41),
                "energy_start_mj": 1_000_000,
                "phases": [{
                    "gpu_util": g.gpu_util.value().unwrap_or(37),
                    "mem_util": g.memory_util.value().unwrap_or(11),
                    "power_mw": (g.power_w.value().unwrap_or(61.0) * 1000.0).round() as u64,
                    // In MIG mode the GPU's own use is what its instances do not account for.
                    "memory_used_bytes": g.memory_used_mib.saturating_sub(instances_used) * MIB,
                    "processes": own,
                }],
            });
            if model_of(g) != g.name {
                gpu["name"] = json!(g.name);
            }
            if total_as_captured(&capture.file, g).is_some() {
                gpu["memory_total_bytes"] = json!(g.memory_total_mib * MIB);
            }
            if g.mig_mode == Reading::Value(true) {
                gpu["mig_mode"] = json!(true);
                gpu["mig"] = json!(mig);
            }
            gpu
        })
        .collect();
    json!({
        "driver_version": capture.driver_version.clone().unwrap_or_else(|| "418.43".into()),
        "gpus": gpus,
    })
}

/// One row of `nvidia-smi mig -lgip`.
#[derive(Debug, Clone, PartialEq)]
pub struct LgipRow {
    pub gpu: u32,
    pub name: String,
    pub id: u32,
    pub instances_total: u32,
    pub memory_gib: f64,
    pub multiprocessors: u32,
    pub decoders: u32,
    pub encoders: u32,
    pub copy_engines: u32,
    pub jpegs: u32,
    pub ofas: u32,
}

/// The profile table of a real `nvidia-smi mig -lgip` capture: each profile is a row
/// (`| 0 MIG 1g.10gb 19 7/7 9.75 No 16 1 0 |`) and the line after it (`| 1 1 0 |`: CE, JPEG,
/// OFA).
pub fn lgip(text: &str) -> Vec<LgipRow> {
    let cells = |line: &str| -> Vec<String> {
        line.trim()
            .trim_matches('|')
            .split_whitespace()
            .map(str::to_owned)
            .collect()
    };
    let lines: Vec<&str> = text.lines().filter(|l| l.starts_with('|')).collect();
    let mut rows = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let c = cells(line);
        if c.len() != 10 || c[1] != "MIG" {
            continue;
        }
        let next = cells(lines[i + 1]);
        let n = |s: &str| s.parse::<u32>().unwrap_or_else(|_| panic!("{line}: {s}"));
        rows.push(LgipRow {
            gpu: n(&c[0]),
            name: c[2].clone(),
            id: n(&c[3]),
            instances_total: n(c[4].split('/').nth(1).unwrap()),
            memory_gib: c[5].parse().unwrap(),
            multiprocessors: n(&c[7]),
            decoders: n(&c[8]),
            encoders: n(&c[9]),
            copy_engines: n(&next[0]),
            jpegs: n(&next[1]),
            ofas: n(&next[2]),
        });
    }
    rows
}
