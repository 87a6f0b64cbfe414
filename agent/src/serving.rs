//! Requests and tokens from the LLM serving engines on the host: each window, the agent reads
//! each configured engine's Prometheus endpoint and reports how much its counters rose since
//! the last reading, per endpoint and model. The server turns them into cost per 1M tokens.
//!
//! What each engine writes (its documentation and exporter, read as they render):
//! - **vLLM** (`:8000/metrics`, prometheus_client): counters `vllm:prompt_tokens_total`,
//!   `vllm:generation_tokens_total` and `vllm:request_success_total` (label `finished_reason`:
//!   `stop`, `length`, `abort`, and in newer versions `error` and `repetition`), each labelled
//!   `model_name` (and `engine` in the V1 engine, one series per data-parallel engine), with a
//!   `…_created` gauge per series that changes when the engine restarts. Every series exists
//!   from start-up.
//! - **TGI** (`/metrics` on its port, metrics-exporter-prometheus): counter
//!   `tgi_request_success` (no `_total`) and histograms `tgi_request_input_length` and
//!   `tgi_request_generated_tokens` whose `_sum` is the tokens; no labels, so no model. A
//!   series appears only once first incremented: missing is 0.
//! - **Triton** (`:8002/metrics`, prometheus-cpp): counter `nv_inference_request_success`
//!   (labels `model`, `version`, sometimes `gpu_uuid`), and with the TensorRT-LLM backend the
//!   histograms `nv_llm_input_token_len` and `nv_llm_output_token_len` (label
//!   `response_metric_type`), whose `_sum` is the tokens. An ensemble and each model in it count
//!   a request each: name the model that runs the LLM (`chat@tensorrt_llm=…`) so it is counted
//!   once.
//!
//! All are counters since the process started (or the model loaded). A value that went down,
//! or a `_created` that changed, is a restart: what it counts now was counted since. A series
//! that appeared since the last reading counts whole. The first reading of an engine is only a
//! baseline, but the last readings are kept in the spool directory, so a restarted agent goes on
//! from where it stopped. An engine that cannot be read counts nothing until it can; its work
//! in between is counted then, in one window. Nothing is invented: a count the engine does not
//! expose is absent.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use gpuledger_proto::ServingWindow;
use serde::{Deserialize, Serialize};

use crate::exposition::{self, Sample};

/// One engine's metrics endpoint and the endpoint (owner value) its work belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServingTarget {
    /// The value of the endpoint dimension its work is counted under (`chat-api`).
    pub endpoint: String,
    /// Only this model's series (vLLM's `model_name`, Triton's `model`); all, if `None`.
    pub model: Option<String>,
    pub url: String,
}

impl FromStr for ServingTarget {
    type Err = String;

    /// `ENDPOINT=URL` or `ENDPOINT@MODEL=URL`.
    fn from_str(text: &str) -> Result<Self, String> {
        let usage = "expected ENDPOINT=URL or ENDPOINT@MODEL=URL, e.g. \
            chat-api=http://127.0.0.1:8000/metrics";
        let (name, url) = text.split_once('=').ok_or(usage)?;
        let (endpoint, model) = match name.split_once('@') {
            Some((e, m)) => (e.trim(), Some(m.trim())),
            None => (name.trim(), None),
        };
        if endpoint.is_empty() || model.is_some_and(str::is_empty) {
            return Err(usage.to_owned());
        }
        let url = url.trim();
        let parsed = reqwest::Url::parse(url).map_err(|e| format!("{url:?}: {e}"))?;
        if !matches!(parsed.scheme(), "http" | "https") {
            return Err(format!("{url:?}: must be an http or https URL"));
        }
        Ok(ServingTarget {
            endpoint: endpoint.to_owned(),
            model: model.map(str::to_owned),
            url: url.to_owned(),
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Engine {
    Vllm,
    Tgi,
    Triton,
}

impl Engine {
    pub fn as_str(self) -> &'static str {
        match self {
            Engine::Vllm => "vllm",
            Engine::Tgi => "tgi",
            Engine::Triton => "triton",
        }
    }

    /// Which engine wrote `samples`, by its metric names.
    fn of(samples: &[Sample]) -> Option<Engine> {
        let has = |prefix: &str| samples.iter().any(|s| s.name.starts_with(prefix));
        if has("vllm:") {
            Some(Engine::Vllm)
        } else if has("tgi_") {
            Some(Engine::Tgi)
        } else if has("nv_") {
            Some(Engine::Triton)
        } else {
            None
        }
    }

    /// The label naming the model, where the engine has one.
    fn model_label(self) -> Option<&'static str> {
        match self {
            Engine::Vllm => Some("model_name"),
            Engine::Tgi => None,
            Engine::Triton => Some("model"),
        }
    }

    /// What a sample counts, if anything.
    fn measure(self, s: &Sample) -> Option<Measure> {
        let label = |k: &str| s.labels.get(k).map(String::as_str);
        match (self, s.name.as_str()) {
            // Aborted and failed requests served nobody.
            (Engine::Vllm, "vllm:request_success_total") => {
                (!matches!(label("finished_reason"), Some("abort" | "error")))
                    .then_some(Measure::Requests)
            }
            (Engine::Vllm, "vllm:prompt_tokens_total") => Some(Measure::InputTokens),
            (Engine::Vllm, "vllm:generation_tokens_total") => Some(Measure::OutputTokens),
            (Engine::Tgi, "tgi_request_success") => Some(Measure::Requests),
            (Engine::Tgi, "tgi_request_input_length_sum") => Some(Measure::InputTokens),
            (Engine::Tgi, "tgi_request_generated_tokens_sum") => Some(Measure::OutputTokens),
            (Engine::Triton, "nv_inference_request_success") => Some(Measure::Requests),
            (Engine::Triton, "nv_llm_input_token_len_sum") => Some(Measure::InputTokens),
            (Engine::Triton, "nv_llm_output_token_len_sum") => Some(Measure::OutputTokens),
            _ => None,
        }
    }

    /// The `_created` series of a counter sample, where the engine writes one (vLLM through
    /// prometheus_client: `vllm:prompt_tokens_total` → `vllm:prompt_tokens_created`).
    fn created_name(self, name: &str) -> Option<String> {
        match self {
            Engine::Vllm => name
                .strip_suffix("_total")
                .map(|base| format!("{base}_created")),
            Engine::Tgi | Engine::Triton => None,
        }
    }

    /// Whether a count with no series is 0 (the exporter writes a series once it is first
    /// incremented) rather than not exposed.
    fn missing_is_zero(self) -> bool {
        self == Engine::Tgi
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
enum Measure {
    Requests,
    InputTokens,
    OutputTokens,
}

const MEASURES: [Measure; 3] = [
    Measure::Requests,
    Measure::InputTokens,
    Measure::OutputTokens,
];

/// A counter series' last value, and its `_created` where it has one.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
struct Last {
    value: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    created: Option<f64>,
}

/// A series: its name and labels, as one text.
fn series_id(s: &Sample) -> String {
    let labels: Vec<String> = s.labels.iter().map(|(k, v)| format!("{k}={v:?}")).collect();
    format!("{}{{{}}}", s.name, labels.join(","))
}

/// One reading of an engine: its counter series (by series id: measure, model, value,
/// created) and which measures it exposes per model.
#[derive(Debug, Clone, PartialEq)]
pub struct Reading {
    pub engine: Engine,
    series: BTreeMap<String, (Measure, Option<String>, Last)>,
    exposed: BTreeMap<Option<String>, BTreeSet<Measure>>,
}

/// Reads an engine's exposition text: which engine, and its counters of requests and tokens
/// (of `model` only, where given). Garbage, another exporter, or a count that is negative or
/// not a number is an error naming it.
pub fn read(text: &str, model: Option<&str>) -> Result<Reading, String> {
    let samples = exposition::parse(text).map_err(|e| e.to_string())?;
    let engine = Engine::of(&samples)
        .ok_or("no vLLM, TGI or Triton metrics there (names vllm:*, tgi_*, nv_*)")?;
    let created: BTreeMap<String, f64> = samples
        .iter()
        .filter(|s| s.name.ends_with("_created"))
        .map(|s| (series_id(s), s.value))
        .collect();
    let mut reading = Reading {
        engine,
        series: BTreeMap::new(),
        exposed: BTreeMap::new(),
    };
    for s in &samples {
        let name_of_model = engine.model_label().and_then(|l| s.labels.get(l)).cloned();
        if model.is_some_and(|m| name_of_model.as_deref() != Some(m)) {
            continue;
        }
        let measure = match s.name.as_str() {
            // A vLLM request count that is not a success still says requests are exposed.
            "vllm:request_success_total" => Some(Measure::Requests),
            _ => engine.measure(s),
        };
        let Some(exposed) = measure else {
            continue;
        };
        reading
            .exposed
            .entry(name_of_model.clone())
            .or_default()
            .insert(exposed);
        let Some(measure) = engine.measure(s) else {
            continue;
        };
        if !s.value.is_finite() || s.value < 0.0 {
            return Err(format!(
                "{} is {}: a count cannot be",
                series_id(s),
                s.value
            ));
        }
        let created = engine.created_name(&s.name).and_then(|c| {
            let id = series_id(&Sample {
                name: c,
                labels: s.labels.clone(),
                value: 0.0,
            });
            created.get(&id).copied()
        });
        reading.series.insert(
            series_id(s),
            (
                measure,
                name_of_model,
                Last {
                    value: s.value,
                    created,
                },
            ),
        );
    }
    if engine.missing_is_zero() {
        reading.exposed.entry(None).or_default().extend(MEASURES);
    }
    if let Some(m) = model {
        if !reading.exposed.contains_key(&Some(m.to_owned())) {
            return Err(format!(
                "the {} metrics there name no model {m:?}",
                engine.as_str()
            ));
        }
    }
    Ok(reading)
}

/// What one engine's counters rose by since the last reading (`last`), per model, as the
/// report carries it; and the readings to keep for next time. `None` for `last`: this is the
/// first reading, a baseline.
fn increase(
    endpoint: &str,
    reading: &Reading,
    last: Option<&BTreeMap<String, Last>>,
) -> (Vec<ServingWindow>, BTreeMap<String, Last>) {
    let keep: BTreeMap<String, Last> = reading
        .series
        .iter()
        .map(|(id, (_, _, now))| (id.clone(), *now))
        .collect();
    let Some(last) = last else {
        return (Vec::new(), keep);
    };
    let mut rose: BTreeMap<(Option<String>, Measure), f64> = BTreeMap::new();
    for (id, (measure, model, now)) in &reading.series {
        let restarted = |before: &Last| {
            now.value < before.value
                || matches!((now.created, before.created), (Some(a), Some(b)) if a != b)
        };
        let by = match last.get(id) {
            Some(before) if restarted(before) => now.value,
            Some(before) => now.value - before.value,
            // A series born since (a model loaded, a first request on TGI): all of it is new.
            None => now.value,
        };
        *rose.entry((model.clone(), *measure)).or_default() += by;
    }
    let windows = reading
        .exposed
        .iter()
        .map(|(model, exposed)| {
            let count = |m: Measure| {
                exposed.contains(&m).then(|| {
                    let v = rose.get(&(model.clone(), m)).copied().unwrap_or(0.0);
                    v.round().max(0.0) as u64
                })
            };
            ServingWindow {
                endpoint: endpoint.to_owned(),
                model: model.clone(),
                engine: reading.engine.as_str().to_owned(),
                requests: count(Measure::Requests),
                input_tokens: count(Measure::InputTokens),
                output_tokens: count(Measure::OutputTokens),
            }
        })
        .collect();
    (windows, keep)
}

/// How one target's last reading went, for `gpuledger-agent once` and the logs.
#[derive(Debug, Clone, PartialEq)]
pub enum Status {
    /// Read: the engine, and the models its counts are under (`None`: it names none).
    Read {
        engine: Engine,
        models: Vec<Option<String>>,
    },
    Failed(String),
}

/// The targets' last readings as the spool directory keeps them.
#[derive(Debug, Default, Serialize, Deserialize)]
struct Saved {
    /// By target (`ENDPOINT@MODEL=URL`), by series.
    targets: BTreeMap<String, BTreeMap<String, Last>>,
}

/// Beside the spool's batches, not among them (every `.json` at its top is a batch to send).
const SAVED_FILE: &str = "state/serving-counters.json";

fn target_key(t: &ServingTarget) -> String {
    match &t.model {
        Some(m) => format!("{}@{m}={}", t.endpoint, t.url),
        None => format!("{}={}", t.endpoint, t.url),
    }
}

/// The configured engines, read each window.
pub struct ServingReader {
    targets: Vec<ServingTarget>,
    client: reqwest::Client,
    last: BTreeMap<String, BTreeMap<String, Last>>,
    /// Where the last readings are kept (`None`: not kept, as in `once`).
    saved: Option<PathBuf>,
    status: BTreeMap<String, Status>,
}

impl ServingReader {
    /// Reads back the last readings kept in `spool_dir`, if any (a damaged file is a fresh
    /// start, said in the log).
    pub fn new(
        targets: Vec<ServingTarget>,
        timeout: Duration,
        spool_dir: Option<&Path>,
    ) -> anyhow::Result<Self> {
        let saved = spool_dir.map(|d| d.join(SAVED_FILE));
        let last = match saved.as_deref().map(std::fs::read) {
            Some(Ok(bytes)) => match serde_json::from_slice::<Saved>(&bytes) {
                Ok(s) => s.targets,
                Err(e) => {
                    tracing::warn!(error = %e, "the serving engines' last readings cannot be read; starting from the next reading");
                    BTreeMap::new()
                }
            },
            _ => BTreeMap::new(),
        };
        Ok(ServingReader {
            targets,
            client: reqwest::Client::builder().timeout(timeout).build()?,
            last,
            saved,
            status: BTreeMap::new(),
        })
    }

    pub fn is_empty(&self) -> bool {
        self.targets.is_empty()
    }

    /// Each target's last status, in the order configured.
    pub fn status(&self) -> Vec<(&ServingTarget, Option<&Status>)> {
        self.targets
            .iter()
            .map(|t| (t, self.status.get(&target_key(t))))
            .collect()
    }

    /// Reads every target, all at once, and returns what each counted since its last reading.
    pub async fn read(&mut self) -> Vec<ServingWindow> {
        let fetched = futures::future::join_all(
            self.targets
                .iter()
                .map(|t| exposition::fetch(&self.client, &t.url)),
        )
        .await;
        let mut windows = Vec::new();
        for (t, text) in self.targets.iter().zip(fetched) {
            let key = target_key(t);
            let reading = text.and_then(|text| read(&text, t.model.as_deref()));
            let status = match reading {
                Ok(reading) => {
                    let (counted, keep) = increase(&t.endpoint, &reading, self.last.get(&key));
                    windows.extend(counted);
                    self.last.insert(key.clone(), keep);
                    Status::Read {
                        engine: reading.engine,
                        models: reading.exposed.keys().cloned().collect(),
                    }
                }
                Err(e) => Status::Failed(e),
            };
            log_change(t, self.status.get(&key), &status);
            self.status.insert(key, status);
        }
        windows
    }

    /// Keeps the last readings in the spool directory (written aside and renamed, so a crash
    /// leaves the old file or the new one).
    pub fn save(&self) {
        let Some(path) = &self.saved else {
            return;
        };
        let saved = Saved {
            targets: self.last.clone(),
        };
        let write = || -> std::io::Result<()> {
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir)?;
            }
            let aside = path.with_extension("json.new");
            std::fs::write(&aside, serde_json::to_vec(&saved)?)?;
            std::fs::rename(&aside, path)
        };
        if let Err(e) = write() {
            tracing::warn!(path = %path.display(), error = %e, "could not keep the serving engines' last readings");
        }
    }
}

/// A failure is logged when it starts (or changes), and the recovery: not every window.
fn log_change(t: &ServingTarget, before: Option<&Status>, now: &Status) {
    match (before, now) {
        (Some(Status::Failed(_)), Status::Read { engine, .. }) => {
            tracing::info!(endpoint = %t.endpoint, url = %t.url, engine = engine.as_str(), "serving engine read again; its work since is counted now");
        }
        (None, Status::Read { engine, models }) if t.model.is_none() && models.len() > 1 => {
            tracing::warn!(endpoint = %t.endpoint, url = %t.url, engine = engine.as_str(), models = ?models, "several models counted under one endpoint: a Triton ensemble counts each request once per model in it; name the model that serves (ENDPOINT@MODEL=URL)");
        }
        (Some(Status::Failed(old)), Status::Failed(new)) if old == new => {}
        (_, Status::Failed(e)) => {
            tracing::warn!(endpoint = %t.endpoint, url = %t.url, error = %e, "serving engine cannot be read; its requests and tokens are counted once it can");
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests;
