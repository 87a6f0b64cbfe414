//! The HTTP API through the real router (no socket), on both storage backends.

use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::Router;
use gpuledger_proto::{
    ApiErrorBody, GpuWindow, HostInfo, IngestAck, ProcessWindow, Report, Window,
};
use tower::ServiceExt;

use super::{router, AppState};
use crate::auth::{generate_token, hash_token};
use crate::store::Store;
use crate::{now_ms, test_support};

struct Api {
    app: Router,
    store: std::sync::Arc<dyn Store>,
    token: String,
    backend: &'static str,
}

async fn apis() -> Vec<(Api, test_support::TestDb)> {
    let mut out = Vec::new();
    for db in test_support::both().await {
        let store = db.open().await;
        let token = generate_token();
        store
            .create_token("agent", &hash_token(&token), now_ms())
            .await
            .unwrap();
        let mut state = AppState::new(store.clone());
        state.max_body_bytes = 64 * 1024;
        out.push((
            Api {
                app: router(state),
                store,
                token,
                backend: db.backend,
            },
            db,
        ));
    }
    out
}

fn report(batch: &str) -> Report {
    let now = now_ms();
    Report {
        batch_id: batch.into(),
        agent_version: "test".into(),
        host: HostInfo {
            hostname: "h1".into(),
            cluster: "c1".into(),
            ..Default::default()
        },
        windows: vec![Window {
            start_ms: now - 15_000,
            end_ms: now,
            samples: 15,
            gpus: vec![GpuWindow {
                uuid: "GPU-1".into(),
                name: "NVIDIA L4".into(),
                memory_total_bytes: Some(24_000_000_000),
                memory_used_max_bytes: Some(1_000_000_000),
                util_avg: Some(33.0),
                util_max: Some(50.0),
                processes: vec![ProcessWindow {
                    pid: 1,
                    name: Some("<b>srv</b>".into()),
                    memory_used_max_bytes: Some(1_000_000_000),
                    sm_util_avg: Some(30.0),
                    labels: [("model".to_string(), "<script>alert(1)</script>".to_string())].into(),
                    ..Default::default()
                }],
                ..Default::default()
            }],
        }],
    }
}

impl Api {
    async fn post(&self, token: Option<&str>, body: Vec<u8>) -> (StatusCode, Vec<u8>) {
        let mut req = Request::post("/api/v1/reports").header("content-type", "application/json");
        if let Some(t) = token {
            req = req.header("authorization", format!("Bearer {t}"));
        }
        let resp = self
            .app
            .clone()
            .oneshot(req.body(Body::from(body)).unwrap())
            .await
            .unwrap();
        let status = resp.status();
        let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX)
            .await
            .unwrap();
        (status, bytes.to_vec())
    }

    async fn get(&self, path: &str) -> (StatusCode, String) {
        let resp = self
            .app
            .clone()
            .oneshot(Request::get(path).body(Body::empty()).unwrap())
            .await
            .unwrap();
        let status = resp.status();
        let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX)
            .await
            .unwrap();
        (status, String::from_utf8_lossy(&bytes).into_owned())
    }

    async fn stored_nothing(&self) {
        assert_eq!(
            self.store.batch_count().await.unwrap(),
            0,
            "{}",
            self.backend
        );
        assert!(
            self.store.fleet().await.unwrap().is_empty(),
            "{}",
            self.backend
        );
    }
}

fn error_of(body: &[u8]) -> ApiErrorBody {
    serde_json::from_slice(body)
        .unwrap_or_else(|e| panic!("not a JSON error ({e}): {}", String::from_utf8_lossy(body)))
}

#[tokio::test]
async fn missing_wrong_or_revoked_tokens_get_401() {
    for (api, _db) in apis().await {
        let body = serde_json::to_vec(&report("b1")).unwrap();
        let (status, resp) = api.post(None, body.clone()).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{}", api.backend);
        assert_eq!(error_of(&resp).error, "unauthorized");
        let (status, _) = api.post(Some("gpl_wrong"), body.clone()).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{}", api.backend);
        api.store.revoke_token("agent", now_ms()).await.unwrap();
        let (status, _) = api.post(Some(&api.token), body).await;
        assert_eq!(
            status,
            StatusCode::UNAUTHORIZED,
            "{}: a revoked token",
            api.backend
        );
        api.stored_nothing().await;
    }
}

#[tokio::test]
async fn a_good_report_is_stored_and_a_repeat_acknowledged() {
    for (api, _db) in apis().await {
        let body = serde_json::to_vec(&report("b1")).unwrap();
        let (status, resp) = api.post(Some(&api.token), body.clone()).await;
        assert_eq!(
            status,
            StatusCode::OK,
            "{}: {}",
            api.backend,
            String::from_utf8_lossy(&resp)
        );
        let ack: IngestAck = serde_json::from_slice(&resp).unwrap();
        assert_eq!((ack.status.as_str(), ack.windows), ("stored", 1));
        let (status, resp) = api.post(Some(&api.token), body).await;
        assert_eq!(status, StatusCode::OK);
        let ack: IngestAck = serde_json::from_slice(&resp).unwrap();
        assert_eq!(ack.status, "duplicate", "{}", api.backend);
        assert_eq!(api.store.batch_count().await.unwrap(), 1);

        let (_, metrics) = api.get("/metrics").await;
        assert!(
            metrics.contains("gpuledger_reports_accepted_total 1"),
            "{metrics}"
        );
        assert!(
            metrics.contains("gpuledger_reports_duplicate_total 1"),
            "{metrics}"
        );
    }
}

#[tokio::test]
async fn bad_reports_name_the_field_and_store_nothing() {
    for (api, _db) in apis().await {
        let mut r = report("b1");
        r.windows[0].gpus[0].util_avg = Some(140.0);
        let (status, resp) = api
            .post(Some(&api.token), serde_json::to_vec(&r).unwrap())
            .await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{}", api.backend);
        let e = error_of(&resp);
        assert_eq!(e.field.as_deref(), Some("windows[0].gpus[0].util_avg"));
        assert!(e.message.contains("0..=100"), "{}", e.message);

        let mut r = report("b2");
        r.windows[0].gpus[0].memory_used_max_bytes = Some(25_000_000_000);
        let (status, resp) = api
            .post(Some(&api.token), serde_json::to_vec(&r).unwrap())
            .await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
        assert_eq!(
            error_of(&resp).field.as_deref(),
            Some("windows[0].gpus[0].memory_used_max_bytes")
        );

        // A wrong type is named by its path too.
        let mut v = serde_json::to_value(report("b3")).unwrap();
        v["windows"][0]["gpus"][0]["util_max"] = serde_json::json!("high");
        let (status, resp) = api
            .post(Some(&api.token), serde_json::to_vec(&v).unwrap())
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert_eq!(
            error_of(&resp).field.as_deref(),
            Some("windows[0].gpus[0].util_max")
        );

        let (status, resp) = api.post(Some(&api.token), b"{not json".to_vec()).await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert_eq!(error_of(&resp).error, "bad_request");

        let (status, resp) = api.post(Some(&api.token), vec![b' '; 100 * 1024]).await;
        assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
        assert_eq!(error_of(&resp).error, "too_large");

        api.stored_nothing().await;
        let (_, metrics) = api.get("/metrics").await;
        assert!(
            metrics.contains("gpuledger_reports_rejected_total{reason=\"invalid\"} 2"),
            "{metrics}"
        );
    }
}

#[tokio::test]
async fn fleet_page_shows_gpus_and_escapes_labels() {
    for (api, _db) in apis().await {
        let (status, html) = api.get("/").await;
        assert_eq!(status, StatusCode::OK);
        assert!(html.contains("No agent has reported yet"));

        api.post(Some(&api.token), serde_json::to_vec(&report("b1")).unwrap())
            .await;
        let (status, html) = api.get("/").await;
        assert_eq!(status, StatusCode::OK, "{}", api.backend);
        assert!(html.contains("NVIDIA L4"));
        assert!(html.contains("33%"));
        assert!(html.contains("c1") && html.contains("h1"));
        assert!(
            !html.contains("<script>alert(1)</script>"),
            "labels must be escaped"
        );
        assert!(
            html.contains("&lt;script&gt;alert(1)&lt;/script&gt;")
                || html.contains("&#60;script&#62;"),
            "{html}"
        );
        assert!(!html.contains("<b>srv</b>"));

        let (status, css) = api.get("/static/app.css").await;
        assert_eq!(status, StatusCode::OK);
        assert!(css.contains("@media print"));
        let (status, health) = api.get("/healthz").await;
        assert_eq!(status, StatusCode::OK);
        assert!(health.contains(api.backend));
        let (status, page) = api.get("/no/such/page").await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        assert!(page.contains("Not found"));
    }
}
