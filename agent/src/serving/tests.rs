//! Each engine's metrics written as it writes them (names, labels, types, number formats and
//! the lines around them, from its exporter and documentation), read across restarts.

use super::*;

const LLAMA: &str = "meta-llama/Llama-3.1-8B-Instruct";

/// vLLM's V1 engine through prometheus_client's text format: every counter with `_total` and a
/// `_created` gauge after it, labels sorted, floats with `.0`; with the process, Python and
/// histogram families around them that any scrape holds.
/// A data-parallel engine's counters: its index, prompt and generation tokens, and requests
/// finished by abort, length and stop.
type VllmEngine<'a> = (&'a str, f64, f64, [f64; 3]);

fn vllm(engines: &[VllmEngine], created: &str, with_created: bool) -> String {
    let mut t = String::from(
        "# HELP python_gc_objects_collected_total Objects collected during gc\n\
         # TYPE python_gc_objects_collected_total counter\n\
         python_gc_objects_collected_total{generation=\"0\"} 12886.0\n\
         # HELP process_start_time_seconds Start time of the process since unix epoch in seconds.\n\
         # TYPE process_start_time_seconds gauge\n\
         process_start_time_seconds 1.75379515847e+09\n\
         # HELP vllm:num_requests_running Number of requests in model execution batches.\n\
         # TYPE vllm:num_requests_running gauge\n",
    );
    for (engine, ..) in engines {
        t.push_str(&format!(
            "vllm:num_requests_running{{engine=\"{engine}\",model_name=\"{LLAMA}\"}} 3.0\n"
        ));
    }
    let family = |t: &mut String, name: &str, help: &str, rows: &[(String, f64)]| {
        t.push_str(&format!(
            "# HELP {name}_total {help}\n# TYPE {name}_total counter\n"
        ));
        for (labels, v) in rows {
            t.push_str(&format!("{name}_total{{{labels}}} {v:?}\n"));
        }
        if with_created {
            t.push_str(&format!(
                "# HELP {name}_created {help}\n# TYPE {name}_created gauge\n"
            ));
            for (labels, _) in rows {
                t.push_str(&format!("{name}_created{{{labels}}} {created}\n"));
            }
        }
    };
    let per_engine = |f: &dyn Fn(&VllmEngine) -> f64| -> Vec<(String, f64)> {
        engines
            .iter()
            .map(|e| (format!("engine=\"{}\",model_name=\"{LLAMA}\"", e.0), f(e)))
            .collect()
    };
    family(
        &mut t,
        "vllm:prompt_tokens",
        "Number of prefill tokens processed.",
        &per_engine(&|e| e.1),
    );
    family(
        &mut t,
        "vllm:generation_tokens",
        "Number of generation tokens processed.",
        &per_engine(&|e| e.2),
    );
    let mut success = Vec::new();
    for e in engines {
        for (i, reason) in ["abort", "length", "stop"].iter().enumerate() {
            success.push((
                format!(
                    "engine=\"{}\",finished_reason=\"{reason}\",model_name=\"{LLAMA}\"",
                    e.0
                ),
                e.3[i],
            ));
        }
    }
    family(
        &mut t,
        "vllm:request_success",
        "Count of successfully processed requests.",
        &success,
    );
    t.push_str(&format!(
        "# HELP vllm:request_prompt_tokens Number of prefill tokens processed.\n\
         # TYPE vllm:request_prompt_tokens histogram\n\
         vllm:request_prompt_tokens_bucket{{engine=\"0\",le=\"1.0\",model_name=\"{LLAMA}\"}} 0.0\n\
         vllm:request_prompt_tokens_bucket{{engine=\"0\",le=\"+Inf\",model_name=\"{LLAMA}\"}} 4.0\n\
         vllm:request_prompt_tokens_count{{engine=\"0\",model_name=\"{LLAMA}\"}} 4.0\n\
         vllm:request_prompt_tokens_sum{{engine=\"0\",model_name=\"{LLAMA}\"}} 988.0\n"
    ));
    t
}

/// TGI's router through metrics-exporter-prometheus: no `_total`, integer counters, a blank
/// line after each family, families in no set order, and a series only once first touched.
fn tgi(served: Option<(u64, u64, u64)>) -> String {
    let mut t = String::from(
        "# TYPE tgi_queue_size gauge\ntgi_queue_size 0\n\n\
         # TYPE tgi_batch_current_size gauge\ntgi_batch_current_size 0\n\n",
    );
    if let Some((requests, input, generated)) = served {
        t.push_str(&format!(
            "# HELP tgi_request_generated_tokens Generated tokens per request\n\
             # TYPE tgi_request_generated_tokens histogram\n\
             tgi_request_generated_tokens_bucket{{le=\"20.48\"}} 1\n\
             tgi_request_generated_tokens_bucket{{le=\"+Inf\"}} {requests}\n\
             tgi_request_generated_tokens_sum {generated}\n\
             tgi_request_generated_tokens_count {requests}\n\n\
             # HELP tgi_request_success Number of successful requests\n\
             # TYPE tgi_request_success counter\n\
             tgi_request_success {requests}\n\n\
             # HELP tgi_request_count Total number of requests\n\
             # TYPE tgi_request_count counter\n\
             tgi_request_count {}\n\n\
             # HELP tgi_request_input_length Input token length per request\n\
             # TYPE tgi_request_input_length histogram\n\
             tgi_request_input_length_bucket{{le=\"40.95\"}} 0\n\
             tgi_request_input_length_bucket{{le=\"+Inf\"}} {requests}\n\
             tgi_request_input_length_sum {input}\n\
             tgi_request_input_length_count {requests}\n\n",
            requests + 1
        ));
    }
    t
}

/// Triton with the TensorRT-LLM ensemble (prometheus-cpp: no `_total`, labels sorted, `le`
/// last): each model of the ensemble counts each request; the token histograms are the
/// `tensorrt_llm` model's. `None`: the models are not loaded.
fn triton(served: Option<(u64, u64, u64)>) -> String {
    let mut t = String::from(
        "# HELP nv_gpu_utilization GPU utilization rate [0.0 - 1.0)\n\
         # TYPE nv_gpu_utilization gauge\n\
         nv_gpu_utilization{gpu_uuid=\"GPU-57cd6b41-5313-5467-653c-f2a699e9028f\"} 0.41\n",
    );
    let Some((requests, input, output)) = served else {
        return t;
    };
    t.push_str(
        "# HELP nv_inference_request_success Number of successful inference requests, all batch sizes\n\
         # TYPE nv_inference_request_success counter\n",
    );
    for model in [
        "ensemble",
        "postprocessing",
        "preprocessing",
        "tensorrt_llm",
    ] {
        t.push_str(&format!(
            "nv_inference_request_success{{model=\"{model}\",version=\"1\"}} {requests}\n"
        ));
    }
    t.push_str(&format!(
        "# HELP nv_inference_count Number of inferences performed (does not include cached requests)\n\
         # TYPE nv_inference_count counter\n\
         nv_inference_count{{model=\"tensorrt_llm\",version=\"1\"}} {requests}\n\
         # HELP nv_llm_input_token_len TRT LLM response metrics\n\
         # TYPE nv_llm_input_token_len histogram\n\
         nv_llm_input_token_len_count{{model=\"tensorrt_llm\",response_metric_type=\"total_input_tokens\",version=\"1\"}} {requests}\n\
         nv_llm_input_token_len_sum{{model=\"tensorrt_llm\",response_metric_type=\"total_input_tokens\",version=\"1\"}} {input}\n\
         nv_llm_input_token_len_bucket{{model=\"tensorrt_llm\",response_metric_type=\"total_input_tokens\",version=\"1\",le=\"10\"}} 0\n\
         nv_llm_input_token_len_bucket{{model=\"tensorrt_llm\",response_metric_type=\"total_input_tokens\",version=\"1\",le=\"+Inf\"}} {requests}\n\
         # HELP nv_llm_output_token_len TRT LLM response metrics\n\
         # TYPE nv_llm_output_token_len histogram\n\
         nv_llm_output_token_len_count{{model=\"tensorrt_llm\",response_metric_type=\"total_output_tokens\",version=\"1\"}} {requests}\n\
         nv_llm_output_token_len_sum{{model=\"tensorrt_llm\",response_metric_type=\"total_output_tokens\",version=\"1\"}} {output}\n\
         nv_llm_output_token_len_bucket{{model=\"tensorrt_llm\",response_metric_type=\"total_output_tokens\",version=\"1\",le=\"+Inf\"}} {requests}\n\
         # HELP nv_trt_llm_v1_metrics TRT LLM v1-specific metrics\n\
         # TYPE nv_trt_llm_v1_metrics gauge\n\
         nv_trt_llm_v1_metrics{{model=\"tensorrt_llm\",v1_specific_metric=\"total_generation_tokens\",version=\"1\"}} 20\n"
    ));
    t
}

/// Reads `texts` one after another as the agent would, returning what each reading counted.
fn counted(endpoint: &str, model: Option<&str>, texts: &[String]) -> Vec<Vec<ServingWindow>> {
    let mut last: Option<BTreeMap<String, Last>> = None;
    texts
        .iter()
        .map(|text| {
            let reading = read(text, model).unwrap();
            let (windows, keep) = increase(endpoint, &reading, last.as_ref());
            last = Some(keep);
            windows
        })
        .collect()
}

fn window(
    model: Option<&str>,
    engine: &str,
    counts: (Option<u64>, Option<u64>, Option<u64>),
) -> ServingWindow {
    ServingWindow {
        endpoint: "chat-api".into(),
        model: model.map(str::to_owned),
        engine: engine.into(),
        requests: counts.0,
        input_tokens: counts.1,
        output_tokens: counts.2,
    }
}

#[test]
fn vllm_counts_what_rose_since_the_last_reading_and_leaves_aborts_out() {
    const T0: &str = "1.7537953269354987e+09";
    let texts = [
        vllm(&[("0", 1196.0, 218152.0, [2.0, 131.0, 1.0])], T0, true),
        vllm(&[("0", 3196.0, 219152.0, [5.0, 133.0, 9.0])], T0, true),
    ];
    let c = counted("chat-api", None, &texts);
    assert!(c[0].is_empty(), "the first reading is a baseline");
    assert_eq!(
        c[1],
        [window(
            Some(LLAMA),
            "vllm",
            (Some(10), Some(2000), Some(1000))
        )]
    );
}

#[test]
fn vllm_data_parallel_engines_add_up() {
    let texts = [
        vllm(
            &[
                ("0", 100.0, 10.0, [0.0, 0.0, 1.0]),
                ("1", 50.0, 5.0, [0.0, 0.0, 1.0]),
            ],
            "1.7537953269354987e+09",
            true,
        ),
        vllm(
            &[
                ("0", 400.0, 30.0, [0.0, 1.0, 3.0]),
                ("1", 250.0, 25.0, [0.0, 0.0, 4.0]),
            ],
            "1.7537953269354987e+09",
            true,
        ),
    ];
    let c = counted("chat-api", None, &texts);
    assert_eq!(c[1][0].requests, Some(6));
    assert_eq!(c[1][0].input_tokens, Some(500));
    assert_eq!(c[1][0].output_tokens, Some(40));
}

#[test]
fn a_restart_counts_from_zero_whether_seen_by_created_or_by_a_fall() {
    // Restarted and already past where it was: only `_created` tells.
    let texts = [
        vllm(
            &[("0", 1000.0, 100.0, [0.0, 0.0, 10.0])],
            "1.7537953269354987e+09",
            true,
        ),
        vllm(
            &[("0", 1500.0, 150.0, [0.0, 0.0, 12.0])],
            "1.7539001234567891e+09",
            true,
        ),
    ];
    let c = counted("chat-api", None, &texts);
    assert_eq!(
        (c[1][0].requests, c[1][0].input_tokens),
        (Some(12), Some(1500))
    );
    // An older vLLM writes no `_created`: a counter that fell restarted.
    let texts = [
        vllm(&[("0", 1000.0, 100.0, [0.0, 0.0, 10.0])], "", false),
        vllm(&[("0", 200.0, 20.0, [0.0, 0.0, 2.0])], "", false),
        vllm(&[("0", 260.0, 26.0, [0.0, 0.0, 3.0])], "", false),
    ];
    let c = counted("chat-api", None, &texts);
    assert_eq!(
        (c[1][0].requests, c[1][0].input_tokens),
        (Some(2), Some(200))
    );
    assert_eq!(
        (c[2][0].requests, c[2][0].input_tokens),
        (Some(1), Some(60))
    );
}

#[test]
fn tgi_before_its_first_request_counts_zero_then_all_of_it() {
    let texts = [tgi(None), tgi(None), tgi(Some((3, 1200, 450)))];
    let c = counted("chat-api", None, &texts);
    assert!(c[0].is_empty());
    assert_eq!(c[1], [window(None, "tgi", (Some(0), Some(0), Some(0)))]);
    assert_eq!(
        c[2],
        [window(None, "tgi", (Some(3), Some(1200), Some(450)))]
    );
}

#[test]
fn triton_counts_the_named_model_once_and_every_model_unnamed() {
    let texts = [
        triton(Some((10, 5000, 800))),
        triton(Some((14, 7000, 1000))),
    ];
    let c = counted("chat-api", Some("tensorrt_llm"), &texts);
    assert_eq!(
        c[1],
        [window(
            Some("tensorrt_llm"),
            "triton",
            (Some(4), Some(2000), Some(200))
        )]
    );
    // Unnamed: each model of the ensemble counted its requests; tokens are known of the one
    // that runs the LLM only (the others expose none: absent, not 0).
    let c = counted("chat-api", None, &texts);
    let models: Vec<(Option<&str>, Option<u64>, Option<u64>)> = c[1]
        .iter()
        .map(|w| (w.model.as_deref(), w.requests, w.input_tokens))
        .collect();
    assert_eq!(
        models,
        [
            (Some("ensemble"), Some(4), None),
            (Some("postprocessing"), Some(4), None),
            (Some("preprocessing"), Some(4), None),
            (Some("tensorrt_llm"), Some(4), Some(2000)),
        ]
    );
}

#[test]
fn a_model_unloaded_and_loaded_again_counts_from_zero() {
    let texts = [
        triton(Some((10, 5000, 800))),
        triton(None),
        triton(Some((2, 300, 40))),
    ];
    let mut last = None;
    let mut out = Vec::new();
    for (i, text) in texts.iter().enumerate() {
        // While unloaded the model is not there to name: the reading says so, and the last
        // good one stays the baseline.
        match read(text, Some("tensorrt_llm")) {
            Ok(reading) => {
                let (w, keep) = increase("chat-api", &reading, last.as_ref());
                last = Some(keep);
                out.push(w);
            }
            Err(e) => {
                assert_eq!(i, 1);
                assert!(e.contains("no model \"tensorrt_llm\""), "{e}");
            }
        }
    }
    // Loaded again: its series start at 0 and fell below the last good reading.
    assert_eq!(out[1][0].requests, Some(2));
    assert_eq!(out[1][0].input_tokens, Some(300));
}

#[test]
fn garbage_another_exporter_and_impossible_counts_are_errors() {
    let e = read("<html><body>Bad gateway</body></html>\n", None).unwrap_err();
    assert!(e.starts_with("line 1, column 1"), "{e}");
    let e = read(
        "# TYPE DCGM_FI_DEV_GPU_UTIL gauge\nDCGM_FI_DEV_GPU_UTIL{gpu=\"0\"} 70\n",
        None,
    )
    .unwrap_err();
    assert!(e.contains("no vLLM, TGI or Triton metrics"), "{e}");
    let e = read("tgi_request_success -3\n", None).unwrap_err();
    assert!(e.contains("tgi_request_success{} is -3"), "{e}");
    let e = read("tgi_request_success NaN\n", None).unwrap_err();
    assert!(e.contains("is NaN"), "{e}");
    let e = read(
        &vllm(&[("0", 1.0, 1.0, [0.0; 3])], "1.7537953269354987e+09", true),
        Some("mistral"),
    )
    .unwrap_err();
    assert!(e.contains("no model \"mistral\""), "{e}");
}

#[test]
fn targets_are_endpoint_model_and_url() {
    let t: ServingTarget = "chat-api=http://127.0.0.1:8000/metrics".parse().unwrap();
    assert_eq!(
        (t.endpoint.as_str(), t.model, t.url.as_str()),
        ("chat-api", None, "http://127.0.0.1:8000/metrics")
    );
    let t: ServingTarget = "chat@tensorrt_llm=http://localhost:8002/metrics"
        .parse()
        .unwrap();
    assert_eq!(t.model.as_deref(), Some("tensorrt_llm"));
    for bad in [
        "http://127.0.0.1:8000/metrics",
        "=http://x/metrics",
        "chat@=http://x/metrics",
        "chat=localhost:8000",
        "chat=ftp://x/metrics",
    ] {
        assert!(bad.parse::<ServingTarget>().is_err(), "{bad}");
    }
}

/// An engine on a real port: read over HTTP, its last readings kept across an agent restart,
/// and an outage's work counted once it answers again.
#[tokio::test]
async fn over_http_across_an_agent_restart_and_an_outage() {
    use std::sync::{Arc, Mutex};
    let body = Arc::new(Mutex::new(Some(tgi(Some((1, 100, 10))))));
    let served = body.clone();
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let text = served.lock().unwrap().clone();
            async move {
                match text {
                    Some(t) => (axum::http::StatusCode::OK, t),
                    None => (axum::http::StatusCode::BAD_GATEWAY, "down".to_owned()),
                }
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/metrics", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    let spool = tempfile::tempdir().unwrap();
    let target: ServingTarget = format!("chat-api={url}").parse().unwrap();
    let reader = |dir: &Path| {
        ServingReader::new(vec![target.clone()], Duration::from_secs(2), Some(dir)).unwrap()
    };

    let mut r = reader(spool.path());
    assert!(r.read().await.is_empty(), "a baseline");
    r.save();
    drop(r);
    // The agent restarts; the engine served two more requests meanwhile.
    *body.lock().unwrap() = Some(tgi(Some((3, 300, 30))));
    let mut r = reader(spool.path());
    assert_eq!(
        r.read().await,
        [window(None, "tgi", (Some(2), Some(200), Some(20)))]
    );
    // Down: nothing counted, the failure said.
    *body.lock().unwrap() = None;
    assert!(r.read().await.is_empty());
    assert!(
        matches!(r.status()[0].1, Some(Status::Failed(e)) if e.contains("502")),
        "{:?}",
        r.status()
    );
    // Back: what it served while down is counted now.
    *body.lock().unwrap() = Some(tgi(Some((7, 700, 70))));
    assert_eq!(
        r.read().await,
        [window(None, "tgi", (Some(4), Some(400), Some(40)))]
    );
    // A damaged file is a fresh start, not an error.
    let saved = spool.path().join(SAVED_FILE);
    assert!(saved.exists());
    // Nothing beside the spool's batches that the deliverer would take for one.
    let top: Vec<_> = std::fs::read_dir(spool.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(top, [std::ffi::OsString::from("state")]);
    std::fs::write(saved, b"{not json").unwrap();
    let mut r = reader(spool.path());
    assert!(r.read().await.is_empty());
}
