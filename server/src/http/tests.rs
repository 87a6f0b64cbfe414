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
use crate::store;
use crate::store::tokens::NewToken;
use crate::store::Store;
use crate::{clock::now_ms, test_support};

pub(super) struct Api {
    pub(super) app: Router,
    pub(super) store: std::sync::Arc<dyn Store>,
    pub(super) token: String,
    pub(super) backend: &'static str,
}

pub(super) async fn apis() -> Vec<(Api, test_support::TestDb)> {
    apis_with(|_| {}).await
}

/// Writes the ledger's hourly rows as the roll-up would (and the days from them): for tests
/// of pages that read months no agent could report any more. Each entry is `(hour, host, team,
/// kind, cost)`, one GPU-hour each; an idle row belongs to nobody.
pub(super) async fn write_ledger(
    api: &Api,
    entries: &[(i64, i64, &str, &str, rust_decimal::Decimal)],
) {
    let mut rows = Vec::new();
    let mut marks = Vec::new();
    for &(hour, host, team, kind, cost) in entries {
        let (cost_nano, cost_atto) = gpuledger_core::money::to_nano_atto(cost);
        marks.push(crate::store::rollups::DirtyMark {
            hour_ms: hour,
            host_id: host,
            generation: 0,
        });
        rows.push(store::RollupRow {
            period_ms: hour,
            host_id: host,
            gpu_uuid: format!("GPU-{host}"),
            owner: if kind == "idle" {
                "{}".to_owned()
            } else {
                format!("{{\"team\":\"{team}\"}}")
            },
            kind: kind.to_owned(),
            pricing_category: "on_demand".into(),
            currency: "USD".into(),
            estimated: 0,
            cost_nano,
            cost_atto,
            gpu_seconds: 3600.0,
            util_gpu_seconds: 0.0,
            util_known_seconds: 0.0,
            energy_j: 0.0,
            energy_known_seconds: 0.0,
        });
    }
    crate::rollup::write(
        api.store.as_ref(),
        &marks,
        crate::rollup::Written {
            rows: &rows,
            unattributed: &[],
            usage: &[],
        },
        None,
    )
    .await
    .unwrap();
}

/// [`apis`] with the state changed by `change` first.
pub(super) async fn apis_with(change: impl Fn(&mut AppState)) -> Vec<(Api, test_support::TestDb)> {
    let mut out = Vec::new();
    for db in test_support::both().await {
        let store = db.open().await;
        let token = generate_token();
        store::tokens::create_token(
            store.db(),
            &NewToken::for_cluster("agent", &hash_token(&token), "c1"),
            now_ms(),
        )
        .await
        .unwrap();
        let mut state = AppState::new(store.clone());
        state.max_body_bytes = 64 * 1024;
        change(&mut state);
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

pub(super) fn report(batch: &str) -> Report {
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
            serving: Vec::new(),
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
    pub(super) async fn post(&self, token: Option<&str>, body: Vec<u8>) -> (StatusCode, Vec<u8>) {
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

    pub(super) async fn get(&self, path: &str) -> (StatusCode, String) {
        self.get_as(path, None).await
    }

    /// GET with a session cookie; a redirect answers its Location instead of a body.
    pub(super) async fn get_as(&self, path: &str, cookie: Option<&str>) -> (StatusCode, String) {
        let mut req = Request::get(path);
        if let Some(c) = cookie {
            req = req.header("cookie", c);
        }
        let resp = self
            .app
            .clone()
            .oneshot(req.body(Body::empty()).unwrap())
            .await
            .unwrap();
        let status = resp.status();
        let location = resp
            .headers()
            .get("location")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned();
        let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX)
            .await
            .unwrap();
        let body = String::from_utf8_lossy(&bytes).into_owned();
        (
            status,
            if status.is_redirection() {
                location
            } else {
                body
            },
        )
    }

    /// A signed-in person with `role`; returns the Cookie header value and their CSRF token.
    pub(super) async fn session(&self, role: &str) -> (String, String) {
        let name = format!("{role}-user");
        let hash = crate::session::hash_password("correct horse battery").unwrap();
        store::accounts::create_user(self.store.db(), &name, &hash, role, None, now_ms())
            .await
            .unwrap();
        let user = store::accounts::user_by_name(self.store.db(), &name)
            .await
            .unwrap()
            .unwrap();
        let token = generate_token();
        let csrf = generate_token();
        store::accounts::create_session(
            self.store.db(),
            &hash_token(&token),
            user.id,
            &csrf,
            now_ms(),
            now_ms() + 60_000,
        )
        .await
        .unwrap();
        (format!("gpl_session={token}"), csrf)
    }

    pub(super) async fn post_form(
        &self,
        path: &str,
        cookie: &str,
        body: &str,
    ) -> (StatusCode, axum::http::HeaderMap, String) {
        let req = Request::post(path)
            .header("content-type", "application/x-www-form-urlencoded")
            .header("cookie", cookie)
            .body(Body::from(body.to_owned()))
            .unwrap();
        let resp = self.app.clone().oneshot(req).await.unwrap();
        let (status, headers) = (resp.status(), resp.headers().clone());
        let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX)
            .await
            .unwrap();
        (
            status,
            headers,
            String::from_utf8_lossy(&bytes).into_owned(),
        )
    }

    async fn stored_nothing(&self) {
        assert_eq!(
            store::telemetry::batch_count(self.store.db())
                .await
                .unwrap(),
            0,
            "{}",
            self.backend
        );
        assert!(
            store::telemetry::fleet(self.store.db())
                .await
                .unwrap()
                .is_empty(),
            "{}",
            self.backend
        );
    }
}

pub(super) fn error_of(body: &[u8]) -> ApiErrorBody {
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
        store::tokens::revoke_token(api.store.db(), "agent", now_ms())
            .await
            .unwrap();
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
        assert_eq!(
            store::telemetry::batch_count(api.store.db()).await.unwrap(),
            1
        );

        let (_, metrics) = api.get("/metrics").await;
        assert!(
            metrics.contains("gpuledger_reports_accepted_total 1"),
            "{metrics}"
        );
        assert!(
            metrics.contains("gpuledger_reports_duplicate_total 1"),
            "{metrics}"
        );
        // Sent one after the other, each report is a group of its own, none written alone.
        for line in [
            "gpuledger_ingest_groups_total 2",
            "gpuledger_ingest_grouped_reports_total 2",
            "gpuledger_ingest_reports_written_alone_total 0",
        ] {
            assert!(metrics.contains(line), "{line}: {metrics}");
        }
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
        let (cookie, _) = api.session("viewer").await;
        let (status, html) = api.get_as("/", Some(&cookie)).await;
        assert_eq!(status, StatusCode::OK);
        assert!(html.contains("No agent has reported yet"));

        api.post(Some(&api.token), serde_json::to_vec(&report("b1")).unwrap())
            .await;
        let (status, html) = api.get_as("/", Some(&cookie)).await;
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

/// The fleet page says what each GPU does now and what it costs per hour, with totals and the
/// part burning on idle GPUs, priced by the rate card while no bill covers the host.
#[tokio::test]
async fn fleet_page_prices_gpus_and_says_what_they_do() {
    for (api, _db) in apis().await {
        let (cookie, _) = api.session("viewer").await;
        // h1: a g6.xlarge (one L4, $0.8048/h on the default rate card) working at 30 % SM.
        let mut busy = report("b1");
        busy.host.instance_type = Some("g6.xlarge".into());
        // h2: the same, its process holding memory at 0 % SM.
        let mut held = report("b2");
        held.host.hostname = "h2".into();
        held.host.instance_type = Some("g6.xlarge".into());
        held.windows[0].gpus[0].uuid = "GPU-2".into();
        held.windows[0].gpus[0].util_avg = Some(0.0);
        held.windows[0].gpus[0].processes[0].sm_util_avg = Some(0.0);
        // h3: an instance type no rate card knows.
        let mut unknown = report("b3");
        unknown.host.hostname = "h3".into();
        unknown.host.instance_type = Some("x9.mystery".into());
        unknown.windows[0].gpus[0].uuid = "GPU-3".into();
        unknown.windows[0].gpus[0].name = "Mystery GPU".into();
        for r in [&busy, &held, &unknown] {
            let (status, body) = api
                .post(Some(&api.token), serde_json::to_vec(r).unwrap())
                .await;
            assert!(status.is_success(), "{}", String::from_utf8_lossy(&body));
        }
        let (status, html) = api.get_as("/", Some(&cookie)).await;
        assert_eq!(status, StatusCode::OK, "{}", api.backend);
        let doc = scraper::Html::parse_document(&html);
        let sel = |s: &str| scraper::Selector::parse(s).unwrap();
        let text = |e: scraper::ElementRef| e.text().collect::<String>();
        let states: Vec<String> = doc.select(&sel("span.state")).map(text).collect();
        assert_eq!(states, ["busy", "held idle", "busy"], "{}", api.backend);
        assert!(doc.select(&sel("span.state.held")).next().is_some());
        let summary = text(doc.select(&sel("p.summary")).next().unwrap());
        // Two priced GPUs cost $1.61 an hour; the held one, $0.80, is burning idle.
        assert!(summary.contains("$1.61/h"), "{summary}");
        assert!(
            summary.contains("$0.80/h on GPUs idle or held idle"),
            "{summary}"
        );
        assert!(summary.contains("1 hosts have no price"), "{summary}");
        let cluster = text(doc.select(&sel("section.cluster h2")).next().unwrap());
        assert!(cluster.contains("2 of 3 GPUs busy"), "{cluster}");
        assert!(cluster.contains("$1.61/h, idle $0.80/h"), "{cluster}");
        let costs: Vec<String> = doc
            .select(&sel("table.gpus td.num"))
            .map(|e| text(e).trim().to_owned())
            .collect();
        assert_eq!(costs, ["$0.80/h", "$0.80/h", ""], "{}", api.backend);
        assert_eq!(
            doc.select(&sel("h3 .tag[title]")).count(),
            2,
            "two estimates"
        );
    }
}

#[tokio::test]
async fn pages_and_read_apis_need_a_session() {
    for (api, _db) in apis().await {
        let (status, location) = api.get("/").await;
        assert_eq!(status, StatusCode::SEE_OTHER, "{}", api.backend);
        assert_eq!(location, "/login?next=%2F");
        let (status, location) = api.get("/billing").await;
        assert_eq!(
            (status, location.as_str()),
            (StatusCode::SEE_OTHER, "/login?next=%2Fbilling")
        );
        let (status, body) = api.get("/api/v1/allocation").await;
        assert_eq!(status, StatusCode::UNAUTHORIZED);
        assert_eq!(error_of(body.as_bytes()).error, "unauthorized");
        let (status, _) = api.get_as("/", Some("gpl_session=forged")).await;
        assert_eq!(
            status,
            StatusCode::SEE_OTHER,
            "an unknown session is no session"
        );
        // An agent token reads nothing.
        let req = Request::get("/api/v1/allocation")
            .header("authorization", format!("Bearer {}", api.token));
        let resp = api
            .app
            .clone()
            .oneshot(req.body(Body::empty()).unwrap())
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
        // Health and metrics stay open for load balancers and Prometheus.
        assert_eq!(api.get("/healthz").await.0, StatusCode::OK);
        assert_eq!(api.get("/metrics").await.0, StatusCode::OK);
        let (cookie, _) = api.session("viewer").await;
        assert_eq!(
            api.get_as("/api/v1/allocation", Some(&cookie)).await.0,
            StatusCode::OK
        );
        assert_eq!(
            api.get_as("/billing", Some(&cookie)).await.0,
            StatusCode::OK
        );
    }
}

#[tokio::test]
async fn sign_in_sets_a_hardened_cookie_and_checks_the_form_token() {
    for (api, _db) in apis().await {
        let hash = crate::session::hash_password("correct horse battery").unwrap();
        store::accounts::create_user(api.store.db(), "ana", &hash, "admin", None, now_ms())
            .await
            .unwrap();
        let resp = api
            .app
            .clone()
            .oneshot(
                Request::get("/login?next=/billing")
                    .body(Body::empty())
                    .unwrap(),
            )
            .await
            .unwrap();
        let set = resp
            .headers()
            .get("set-cookie")
            .unwrap()
            .to_str()
            .unwrap()
            .to_owned();
        let login_cookie = set.split(';').next().unwrap().to_owned();
        assert!(
            set.contains("HttpOnly") && set.contains("SameSite=Strict"),
            "{set}"
        );
        let html = String::from_utf8_lossy(
            &axum::body::to_bytes(resp.into_body(), usize::MAX)
                .await
                .unwrap(),
        )
        .into_owned();
        let csrf = html
            .split("name=\"csrf\" value=\"")
            .nth(1)
            .unwrap()
            .split('"')
            .next()
            .unwrap()
            .to_owned();

        let (status, _, _) = api
            .post_form(
                "/login",
                &login_cookie,
                "username=ana&password=correct+horse+battery&csrf=wrong&next=/",
            )
            .await;
        assert_eq!(
            status,
            StatusCode::FORBIDDEN,
            "{}: a forged form",
            api.backend
        );
        let (status, _, page) = api
            .post_form(
                "/login",
                &login_cookie,
                &format!("username=ana&password=nope-nope-nope&csrf={csrf}&next=/"),
            )
            .await;
        assert_eq!(status, StatusCode::UNAUTHORIZED);
        assert!(page.contains("Wrong username or password"));
        let (status, _, page) = api
            .post_form(
                "/login",
                &login_cookie,
                &format!("username=nobody&password=nope-nope-nope&csrf={csrf}&next=/"),
            )
            .await;
        assert_eq!(status, StatusCode::UNAUTHORIZED);
        assert!(
            page.contains("Wrong username or password"),
            "no hint whether the name exists"
        );

        let (status, headers, _) = api
            .post_form(
                "/login",
                &login_cookie,
                &format!("username=ana&password=correct+horse+battery&csrf={csrf}&next=/billing"),
            )
            .await;
        assert_eq!(status, StatusCode::SEE_OTHER);
        assert_eq!(headers.get("location").unwrap(), "/billing");
        let session = headers
            .get_all("set-cookie")
            .iter()
            .map(|v| v.to_str().unwrap().to_owned())
            .find(|c| c.starts_with("gpl_session="))
            .unwrap();
        assert!(
            session.contains("HttpOnly")
                && session.contains("SameSite=Lax")
                && session.contains("Path=/"),
            "{session}"
        );
        let cookie = session.split(';').next().unwrap().to_owned();
        let (status, page) = api.get_as("/billing", Some(&cookie)).await;
        assert_eq!(status, StatusCode::OK);
        assert!(page.contains("ana (admin)") && page.contains("Upload a FOCUS export"));

        // Signing out needs the session's form token, then the session is gone.
        let (status, _, _) = api.post_form("/logout", &cookie, "csrf=wrong").await;
        assert_eq!(status, StatusCode::FORBIDDEN);
        let page_csrf = page
            .split("name=\"csrf\" value=\"")
            .nth(1)
            .unwrap()
            .split('"')
            .next()
            .unwrap()
            .to_owned();
        let (status, _, _) = api
            .post_form("/logout", &cookie, &format!("csrf={page_csrf}"))
            .await;
        assert_eq!(status, StatusCode::SEE_OTHER);
        assert_eq!(
            api.get_as("/billing", Some(&cookie)).await.0,
            StatusCode::SEE_OTHER
        );
    }
}

fn multipart(csrf: &str, file: &[u8]) -> (String, Vec<u8>) {
    multipart_named(csrf, "bill.csv", &[], file)
}

/// A form upload as a browser sends it: the form token, other fields, then the file.
fn multipart_named(
    csrf: &str,
    file_name: &str,
    fields: &[(&str, &str)],
    file: &[u8],
) -> (String, Vec<u8>) {
    multipart_files(csrf, fields, &[("file", file_name, file)])
}

const BILL: &str = "ProviderName,BillingAccountId,ChargePeriodStart,ChargePeriodEnd,ChargeCategory,BilledCost,EffectiveCost,ListCost,BillingCurrency\nAWS,1,2026-05-01T00:00:00Z,2026-05-01T01:00:00Z,Usage,1.5,1.25,1.5,USD\n";

#[tokio::test]
async fn only_admins_upload_bills_and_only_with_the_form_token() {
    for (api, _db) in apis().await {
        let upload = |cookie: String, csrf: String, file: Vec<u8>| {
            let app = api.app.clone();
            async move {
                let (ct, body) = multipart(&csrf, &file);
                let req = Request::post("/billing/import")
                    .header("content-type", ct)
                    .header("cookie", cookie)
                    .body(Body::from(body))
                    .unwrap();
                let resp = app.oneshot(req).await.unwrap();
                let status = resp.status();
                let text = String::from_utf8_lossy(
                    &axum::body::to_bytes(resp.into_body(), usize::MAX)
                        .await
                        .unwrap(),
                )
                .into_owned();
                (status, text)
            }
        };
        let (viewer, viewer_csrf) = api.session("viewer").await;
        let (status, page) = upload(viewer, viewer_csrf, BILL.as_bytes().to_vec()).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{}", api.backend);
        assert!(page.contains("Admins only"));
        let (admin, admin_csrf) = api.session("admin").await;
        let (status, _) = upload(admin.clone(), "forged".into(), BILL.as_bytes().to_vec()).await;
        assert_eq!(status, StatusCode::FORBIDDEN);
        assert!(
            store::bills::billing_imports(api.store.db())
                .await
                .unwrap()
                .is_empty(),
            "nothing stored on refusal"
        );

        let bad = BILL.replace("1.25", "one");
        let (status, page) = upload(admin.clone(), admin_csrf.clone(), bad.into_bytes()).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
        assert!(page.contains("line 2, column EffectiveCost"), "{page}");
        assert!(store::bills::billing_imports(api.store.db())
            .await
            .unwrap()
            .is_empty());

        let (status, page) =
            upload(admin.clone(), admin_csrf.clone(), BILL.as_bytes().to_vec()).await;
        assert_eq!(status, StatusCode::OK, "{page}");
        assert!(page.contains("imported 1 rows"), "{page}");
        let imports = store::bills::billing_imports(api.store.db()).await.unwrap();
        assert_eq!(imports.len(), 1);
        assert_eq!(
            imports[0].totals["USD"].effective,
            gpuledger_core::money::from_text("1.25")
        );
        let (_, page) = upload(admin.clone(), admin_csrf.clone(), BILL.as_bytes().to_vec()).await;
        assert!(page.contains("was imported before; nothing changed"));
    }
}

/// May delivered in two parts, then again as one file that is the whole period: the billing
/// page and the periods API show which files make up the period and which were replaced.
/// A finance lead signs off a month that has ended and reconciles to the cent: it closes at
/// once, the review says so, and it cannot be signed off twice; a month not ended or one that
/// does not reconcile cannot be.
#[tokio::test]
async fn a_month_that_reconciles_can_be_signed_off_once() {
    // Months close long after they end here, so May 2026 is still open.
    let far = crate::closing::ClosePolicy {
        after_ms: 100 * 365 * 86_400_000,
        signed_off_through: None,
    };
    for (api, _db) in apis_with(|s| s.close = far).await {
        let b = api.backend;
        let (admin, csrf) = api.session("admin").await;
        let (viewer, viewer_csrf) = api.session("viewer").await;
        let (ct, body) = multipart_named(&csrf, "may.csv", &[], BILL.as_bytes());
        let req = Request::post("/billing/import")
            .header("content-type", ct)
            .header("cookie", admin.clone())
            .body(Body::from(body))
            .unwrap();
        assert_eq!(
            api.app.clone().oneshot(req).await.unwrap().status(),
            StatusCode::OK
        );
        // Before the roll-up the ledger does not hold the bill yet.
        let (status, _, page) = api
            .post_form("/billing/2026-05/sign-off", &admin, &format!("csrf={csrf}"))
            .await;
        assert_eq!(status, StatusCode::CONFLICT, "{b}: {page}");
        crate::test_support::roll_up(api.store.as_ref()).await;
        let (_, page) = api.get_as("/billing/2026-05", Some(&admin)).await;
        assert!(
            page.contains("action=\"/billing/2026-05/sign-off\""),
            "{b}: {page}"
        );
        let (_, page) = api.get_as("/billing/2026-05", Some(&viewer)).await;
        assert!(!page.contains("sign-off\" "), "{b}: viewers get no form");
        let (status, _, _) = api
            .post_form(
                "/billing/2026-05/sign-off",
                &viewer,
                &format!("csrf={viewer_csrf}"),
            )
            .await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{b}");
        let (status, headers, _) = api
            .post_form(
                "/billing/2026-05/sign-off",
                &admin,
                &format!("csrf={csrf}&note=invoice+received"),
            )
            .await;
        assert_eq!(status, StatusCode::SEE_OTHER, "{b}");
        assert_eq!(headers["location"], "/billing/2026-05");
        let offs = store::closing::sign_offs(api.store.db()).await.unwrap();
        assert_eq!(offs.len(), 1, "{b}");
        assert_eq!(offs[0].note, "invoice received");
        let (_, page) = api.get_as("/billing/2026-05", Some(&viewer)).await;
        assert!(page.contains("Signed off by"), "{b}: {page}");
        let (_, review) = api.get_as("/review/2026-05", Some(&viewer)).await;
        assert!(
            review.contains("signed off with its final bill"),
            "{b}: the month is closed"
        );
        let (status, _, page) = api
            .post_form("/billing/2026-05/sign-off", &admin, &format!("csrf={csrf}"))
            .await;
        assert_eq!(status, StatusCode::CONFLICT, "{b}");
        assert!(page.contains("closed already"), "{b}: {page}");
        let (status, _, page) = api
            .post_form("/billing/2099-01/sign-off", &admin, &format!("csrf={csrf}"))
            .await;
        assert_eq!(status, StatusCode::CONFLICT, "{b}");
        assert!(page.contains("has not ended"), "{b}: {page}");
        assert_eq!(
            store::closing::sign_offs(api.store.db())
                .await
                .unwrap()
                .len(),
            1
        );
    }
}

#[tokio::test]
async fn the_billing_page_shows_the_files_of_each_period() {
    for (api, _db) in apis().await {
        let (admin, csrf) = api.session("admin").await;
        let upload =
            |name: &'static str, fields: &'static [(&'static str, &'static str)], file: String| {
                let app = api.app.clone();
                let (admin, csrf) = (admin.clone(), csrf.clone());
                async move {
                    let (ct, body) = multipart_named(&csrf, name, fields, file.as_bytes());
                    let req = Request::post("/billing/import")
                        .header("content-type", ct)
                        .header("cookie", admin)
                        .body(Body::from(body))
                        .unwrap();
                    let resp = app.oneshot(req).await.unwrap();
                    let status = resp.status();
                    let body = axum::body::to_bytes(resp.into_body(), usize::MAX)
                        .await
                        .unwrap();
                    (status, String::from_utf8_lossy(&body).into_owned())
                }
            };
        let b = api.backend;
        let (status, _) = upload("may-00001.csv", &[], BILL.to_owned()).await;
        assert_eq!(status, StatusCode::OK, "{b}");
        let part2 = BILL.replace("1.5,1.25,1.5", "1234.5,1000,1234.5");
        let (_, page) = upload("may-00002.csv", &[], part2).await;
        assert!(
            page.contains("replaced 0 older rows"),
            "{b}: part 2 adds to part 1"
        );
        assert!(
            page.contains("May 2026 · AWS · billing account 1 · USD"),
            "{b}: {page}"
        );
        assert!(
            page.contains("2 of 2 files in force: 2 rows, billed $1,236.00, effective $1,001.25."),
            "{b}: {page}"
        );

        let whole = BILL.replace("1.5,1.25,1.5", "7,7,7");
        let (_, page) = upload("may-final.csv", &[("whole_periods", "1")], whole).await;
        assert!(page.contains("replaced 2 older rows"), "{b}: {page}");
        assert!(
            page.contains("1 of 3 files in force: 1 rows, billed $7.00, effective $7.00."),
            "{b}: {page}"
        );
        assert_eq!(page.matches("by may-final.csv").count(), 2, "{b}: {page}");

        let (status, body) = api.get_as("/api/v1/billing/periods", Some(&admin)).await;
        assert_eq!(status, StatusCode::OK, "{b}");
        let periods: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(periods.as_array().unwrap().len(), 1, "{b}");
        assert_eq!(periods[0]["billed_total"], "7", "{b}");
        assert_eq!(
            periods[0]["billing_period_start"], "2026-05-01T00:00:00Z",
            "{b}"
        );
        let files = periods[0]["files"].as_array().unwrap();
        assert_eq!(files.len(), 3, "{b}");
        assert!(
            files[0]["replaced_at"].is_string() && files[2]["replaced_at"].is_null(),
            "{b}"
        );
        assert_eq!(files[0]["replaced_by"], files[2]["import_id"], "{b}");
    }
}

/// An incident's page, API and CSV name its GPUs as people do (host, NVML index) and the
/// processes holding them: pid, name, user and owners.
#[tokio::test]
async fn an_incident_names_its_gpus_processes_and_users() {
    for (api, _db) in apis().await {
        let (viewer, _) = api.session("viewer").await;
        let devices = serde_json::json!([
            {"host": "nb-1", "uuid": "GPU-nb-0", "index": 0, "processes": [
                {"gpu_uuid": "GPU-nb-0", "pid": 4242, "name": "jupyter", "user": "ana",
                 "owners": {"team": "research"}}]},
            {"host": "nb-1", "uuid": "GPU-nb-1", "index": 1}
        ]);
        let now = now_ms();
        let id = store::alerts::insert_incident(
            api.store.db(),
            &crate::store::alerts::IncidentUpdate {
                incident_key: "held:c1/nb-1".into(),
                kind: "held_idle".into(),
                cluster: "c1".into(),
                hostname: Some("nb-1".into()),
                gpus_json: r#"["GPU-nb-0","GPU-nb-1"]"#.into(),
                owners_json: r#"{"team":"research"}"#.into(),
                devices_json: devices.to_string(),
                started_ms: now - 3_600_000,
                last_seen_ms: now,
                cost_per_hour: "4.10".into(),
                currency: "USD".into(),
                estimated: false,
                wasted: "4.10".into(),
            },
        )
        .await
        .unwrap();
        let (status, html) = api.get_as(&format!("/incidents/{id}"), Some(&viewer)).await;
        assert_eq!(status, StatusCode::OK, "{}", api.backend);
        let doc = scraper::Html::parse_document(&html);
        let lines: Vec<String> = doc
            .select(&scraper::Selector::parse("ul.devices li").unwrap())
            .map(|e| e.text().collect())
            .collect();
        assert_eq!(
            lines,
            [
                "nb-1: GPU #1",
                "nb-1 GPU #0: pid 4242 jupyter, user ana, team=research"
            ],
            "{}",
            api.backend
        );
        let (_, body) = api.get_as("/api/v1/incidents", Some(&viewer)).await;
        let json: serde_json::Value = serde_json::from_str(&body).unwrap();
        let mine = json
            .as_array()
            .or_else(|| json["incidents"].as_array())
            .unwrap()
            .iter()
            .find(|i| i["id"] == id)
            .unwrap()
            .clone();
        assert_eq!(mine["devices"][0]["processes"][0]["user"], "ana");
        assert_eq!(mine["devices"][1]["index"], 1);
        let (_, csv) = api
            .get_as("/api/v1/incidents?format=csv", Some(&viewer))
            .await;
        assert!(
            csv.contains("nb-1: GPU #1; nb-1 GPU #0: pid 4242 jupyter, user ana, team=research"),
            "{csv}"
        );
    }
}

#[tokio::test]
async fn incidents_alerts_and_snoozes_by_role() {
    for (api, _db) in apis().await {
        let (viewer, viewer_csrf) = api.session("viewer").await;
        let (admin, admin_csrf) = api.session("admin").await;
        api.post(Some(&api.token), serde_json::to_vec(&report("s1")).unwrap())
            .await;
        let (_, page) = api.get_as("/incidents?snooze=c1", Some(&admin)).await;
        assert!(
            page.contains("<option selected>c1</option>"),
            "{}: Slack's snooze link preselects the cluster: {page}",
            api.backend
        );
        for path in ["/incidents", "/alerts", "/api/v1/incidents"] {
            assert_eq!(
                api.get_as(path, Some(&viewer)).await.0,
                StatusCode::OK,
                "{path}"
            );
            assert!(
                !api.get(path).await.0.is_success(),
                "{path} needs a session"
            );
        }
        let (status, _, page) = api
            .post_form(
                "/snoozes",
                &viewer,
                &format!("csrf={viewer_csrf}&cluster=c1&hours=4"),
            )
            .await;
        assert_eq!(
            status,
            StatusCode::FORBIDDEN,
            "{}: viewers cannot snooze",
            api.backend
        );
        assert!(page.contains("Admins only"));
        let (status, _, _) = api
            .post_form("/snoozes", &admin, "csrf=forged&cluster=c1&hours=4")
            .await;
        assert_eq!(status, StatusCode::FORBIDDEN);
        assert!(store::alerts::active_snoozes(api.store.db(), now_ms())
            .await
            .unwrap()
            .is_empty());
        let (status, _, _) = api
            .post_form(
                "/snoozes",
                &admin,
                &format!("csrf={admin_csrf}&cluster=c1&hours=4"),
            )
            .await;
        assert_eq!(status, StatusCode::SEE_OTHER);
        let snoozes = store::alerts::active_snoozes(api.store.db(), now_ms())
            .await
            .unwrap();
        assert_eq!(
            (snoozes.len(), snoozes[0].by_user.as_str()),
            (1, "admin-user")
        );
        let (_, page) = api.get_as("/incidents", Some(&viewer)).await;
        assert!(page.contains("c1 until"), "{page}");

        // No Slack route in this server's config: testing one is refused clearly.
        let (status, _, page) = api
            .post_form(
                "/alerts/test",
                &admin,
                &format!("csrf={admin_csrf}&route=default"),
            )
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert!(page.contains("No such route"));
        let (status, _, _) = api
            .post_form(
                "/alerts/test",
                &viewer,
                &format!("csrf={viewer_csrf}&route=default"),
            )
            .await;
        assert_eq!(status, StatusCode::FORBIDDEN);
        assert!(store::alerts::slack_history(api.store.db(), 10)
            .await
            .unwrap()
            .is_empty());
    }
}

#[tokio::test]
async fn recommendations_answer_for_viewers_and_name_bad_parameters() {
    for (api, _db) in apis().await {
        let (viewer, _) = api.session("viewer").await;
        let (status, body) = api
            .get_as("/api/v1/recommendations?lookback=3d", Some(&viewer))
            .await;
        assert_eq!(status, StatusCode::OK, "{}: {body}", api.backend);
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["lookback_days"], 3.0);
        assert!(
            v["right_size"].is_array() && v["consolidation"].is_array() && v["spot"].is_array()
        );
        let (status, body) = api
            .get_as("/api/v1/recommendations?lookback=soon", Some(&viewer))
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert_eq!(error_of(body.as_bytes()).field.as_deref(), Some("lookback"));
        // A month's review range: the month under way's so far; a month to come, a month
        // misspelt or a month with a look-back are refused, the field named.
        let this = gpuledger_core::time::month_label(now_ms());
        let (status, body) = api
            .get_as(
                &format!("/api/v1/recommendations?month={this}&format=csv"),
                Some(&viewer),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{}: {body}", api.backend);
        assert!(body.starts_with("kind,key,"), "{body}");
        let next = gpuledger_core::time::month_label(gpuledger_core::time::next_month_start(
            gpuledger_core::time::month_start_ms(now_ms()),
        ));
        for query in [
            format!("month={next}"),
            "month=2026-13".to_owned(),
            format!("month={this}&lookback=3d"),
        ] {
            let (status, body) = api
                .get_as(&format!("/api/v1/recommendations?{query}"), Some(&viewer))
                .await;
            assert_eq!(status, StatusCode::BAD_REQUEST, "{query}: {body}");
            assert_eq!(
                error_of(body.as_bytes()).field.as_deref(),
                Some("month"),
                "{query}"
            );
        }
        let (status, page) = api.get_as("/recommendations", Some(&viewer)).await;
        assert_eq!(status, StatusCode::OK);
        assert!(page.contains("Right-size inference"));
        assert_eq!(
            api.get("/api/v1/recommendations").await.0,
            StatusCode::UNAUTHORIZED
        );
    }
}

/// A form upload with several files: `(field, file name, content)` each, after the form token
/// and `fields`.
fn multipart_files(
    csrf: &str,
    fields: &[(&str, &str)],
    files: &[(&str, &str, &[u8])],
) -> (String, Vec<u8>) {
    let boundary = "gpl-test-boundary";
    let mut body = Vec::new();
    for (name, value) in [("csrf", csrf)].iter().chain(fields) {
        body.extend_from_slice(
            format!("--{boundary}\r\nContent-Disposition: form-data; name=\"{name}\"\r\n\r\n{value}\r\n")
                .as_bytes(),
        );
    }
    for (field, file_name, content) in files {
        body.extend_from_slice(format!("--{boundary}\r\nContent-Disposition: form-data; name=\"{field}\"; filename=\"{file_name}\"\r\nContent-Type: application/octet-stream\r\n\r\n").as_bytes());
        body.extend_from_slice(content);
        body.extend_from_slice(b"\r\n");
    }
    body.extend_from_slice(format!("--{boundary}--\r\n").as_bytes());
    (format!("multipart/form-data; boundary={boundary}"), body)
}

/// An export run uploaded through the form with its manifest: exactly the files it lists,
/// each with the rows it says, imported as one delivery; a file missing, one not listed, one
/// cut short, or a bad row in any of several files chosen together: nothing stored.
#[tokio::test]
async fn an_export_run_uploads_with_its_manifest() {
    for (api, _db) in apis().await {
        let b = api.backend;
        let (admin, csrf) = api.session("admin").await;
        let upload = |files: Vec<(&'static str, &'static str, Vec<u8>)>| {
            let app = api.app.clone();
            let (admin, csrf) = (admin.clone(), csrf.clone());
            async move {
                let parts: Vec<(&str, &str, &[u8])> = files
                    .iter()
                    .map(|(f, n, c)| (*f, *n, c.as_slice()))
                    .collect();
                let (ct, body) = multipart_files(&csrf, &[], &parts);
                let req = Request::post("/billing/import")
                    .header("content-type", ct)
                    .header("cookie", admin)
                    .body(Body::from(body))
                    .unwrap();
                let resp = app.oneshot(req).await.unwrap();
                let status = resp.status();
                let body = axum::body::to_bytes(resp.into_body(), usize::MAX)
                    .await
                    .unwrap();
                (status, String::from_utf8_lossy(&body).into_owned())
            }
        };
        let manifest = |rows: [u64; 2]| {
            format!(
                r#"{{"runInfo":{{"runId":"run-9"}},"blobs":[
                    {{"blobName":"x/20260501-20260531/run-9/part_0_0001.csv","dataRowCount":{}}},
                    {{"blobName":"x/20260501-20260531/run-9/part_0_0002.csv","dataRowCount":{}}}]}}"#,
                rows[0], rows[1]
            )
            .into_bytes()
        };
        let part1 = BILL.as_bytes().to_vec();
        let part2 = BILL.replace("1.5,1.25,1.5", "3,3,3").into_bytes();
        let file = |n: &'static str, c: &Vec<u8>| ("file", n, c.clone());

        let (status, page) = upload(vec![
            file("part_0_0001.csv", &part1),
            ("manifest", "manifest.json", manifest([1, 1])),
        ])
        .await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{b}");
        assert!(
            page.contains("lists part_0_0002.csv, which was not uploaded"),
            "{b}: {page}"
        );
        let (status, page) = upload(vec![
            file("part_0_0001.csv", &part1),
            file("part_0_0002.csv", &part2),
            file("extra.csv", &part2),
            ("manifest", "manifest.json", manifest([1, 1])),
        ])
        .await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{b}");
        assert!(
            page.contains("extra.csv is not listed in manifest.json"),
            "{b}: {page}"
        );
        let (status, page) = upload(vec![
            file("part_0_0001.csv", &part1),
            file("part_0_0002.csv", &part2),
            ("manifest", "manifest.json", manifest([1, 2])),
        ])
        .await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{b}");
        assert!(
            page.contains("None of the 2 files was imported")
                && page.contains("part_0_0002.csv: the export")
                && page.contains("cut short"),
            "{b}: {page}"
        );
        // Every bad file is named with its first error, and the good ones said to be fine.
        let broken = BILL.replace("1.25", "one").into_bytes();
        let (status, page) = upload(vec![
            file("a.csv", &part1),
            file("b.csv", &broken),
            file("c.csv", &broken),
        ])
        .await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{b}");
        assert!(
            page.contains("None of the 3 files was imported")
                && page.contains("b.csv: line 2, column EffectiveCost")
                && page.contains("c.csv: line 2, column EffectiveCost")
                && page.contains("Without error: a.csv"),
            "{b}: {page}"
        );
        assert!(
            store::bills::billing_imports(api.store.db())
                .await
                .unwrap()
                .is_empty(),
            "{b}"
        );

        let (status, page) = upload(vec![
            file("part_0_0001.csv", &part1),
            file("part_0_0002.csv", &part2),
            ("manifest", "manifest.json", manifest([1, 1])),
        ])
        .await;
        assert_eq!(status, StatusCode::OK, "{b}: {page}");
        assert_eq!(page.matches("imported 1 rows").count(), 2, "{b}: {page}");
        let periods = store::bills::billing_file_periods(api.store.db())
            .await
            .unwrap();
        assert_eq!(periods.len(), 2, "{b}");
        assert!(
            periods
                .iter()
                .all(|p| p.delivery.as_deref() == Some("run-9")),
            "{b}"
        );
    }
}

/// A body holding two JSON documents (two reports sent as one) is refused whole: the first was
/// answered as stored and the second dropped. Reports and usage counts alike.
#[tokio::test]
async fn a_body_of_two_json_documents_is_refused_whole() {
    for (api, _db) in apis().await {
        let b = api.backend;
        let first = serde_json::to_vec(&report("two-a")).unwrap();
        let mut both = first.clone();
        both.extend(serde_json::to_vec(&report("two-b")).unwrap());
        let (status, body) = api.post(Some(&api.token), both).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{b}");
        assert!(
            error_of(&body).message.contains("one JSON document"),
            "{b}: {}",
            String::from_utf8_lossy(&body)
        );
        // Nothing of it was kept: the first alone is stored now, not a duplicate.
        let (status, body) = api.post(Some(&api.token), first).await;
        assert_eq!(status, StatusCode::OK, "{b}");
        let ack: IngestAck = serde_json::from_slice(&body).unwrap();
        assert_eq!(ack.status, "stored", "{b}");

        let now = now_ms();
        let count = serde_json::json!({
            "source": "pod-1",
            "counts": [{
                "endpoint": "chat",
                "start": gpuledger_core::time::rfc3339(now - 3_600_000),
                "end": gpuledger_core::time::rfc3339(now - 60_000),
                "requests": 10
            }]
        })
        .to_string();
        let req = Request::post("/api/v1/usage")
            .header("content-type", "application/json")
            .header("authorization", format!("Bearer {}", api.token))
            .body(Body::from(format!("{count}{count}")))
            .unwrap();
        let resp = api.app.clone().oneshot(req).await.unwrap();
        assert_eq!(resp.status(), StatusCode::BAD_REQUEST, "{b}");
        let totals = store::usage::usage_totals(api.store.db(), now - 7_200_000, now)
            .await
            .unwrap();
        assert!(totals.is_empty(), "{b}: {totals:?}");
    }
}

/// A window overlapping one another batch stored for the same GPU is refused with 409 naming
/// the GPU, nothing stored; a window that follows it, and the same batch sent again, are not.
#[tokio::test]
async fn a_window_overlapping_a_stored_one_of_its_gpu_is_refused() {
    for (api, _db) in apis().await {
        let b = api.backend;
        let first = report("overlap-a");
        let (start, end) = (first.windows[0].start_ms, first.windows[0].end_ms);
        let (status, _) = api
            .post(Some(&api.token), serde_json::to_vec(&first).unwrap())
            .await;
        assert_eq!(status, StatusCode::OK, "{b}");
        let at = |batch: &str, from: i64, to: i64| {
            let mut r = report(batch);
            (r.windows[0].start_ms, r.windows[0].end_ms) = (from, to);
            serde_json::to_vec(&r).unwrap()
        };
        let (status, body) = api
            .post(
                Some(&api.token),
                at("overlap-b", start - 5_000, end - 5_000),
            )
            .await;
        assert_eq!(
            status,
            StatusCode::CONFLICT,
            "{b}: {}",
            String::from_utf8_lossy(&body)
        );
        let err = error_of(&body);
        assert_eq!(err.field.as_deref(), Some("windows[0].gpus[0]"), "{b}");
        assert!(
            err.message.contains("overlaps its window"),
            "{b}: {}",
            err.message
        );
        // Nothing of the refused batch was kept: sent again later it is refused again, not
        // taken for a duplicate.
        let (status, _) = api
            .post(
                Some(&api.token),
                at("overlap-b", start - 5_000, end - 5_000),
            )
            .await;
        assert_eq!(status, StatusCode::CONFLICT, "{b}");
        let (status, body) = api
            .post(Some(&api.token), at("overlap-c", start - 15_000, start))
            .await;
        assert_eq!(
            status,
            StatusCode::OK,
            "{b}: {}",
            String::from_utf8_lossy(&body)
        );
        let (status, body) = api
            .post(Some(&api.token), serde_json::to_vec(&first).unwrap())
            .await;
        assert_eq!(status, StatusCode::OK, "{b}");
        let ack: IngestAck = serde_json::from_slice(&body).unwrap();
        assert_eq!(ack.status, "duplicate", "{b}");
    }
}

/// A window for a month whose figures are final is refused (409 naming the window, and why the
/// month is closed), nothing of its batch stored, whether the month closed by time or was
/// signed off; a window of a month still open is taken.
#[tokio::test]
async fn a_window_for_a_closed_month_is_refused() {
    let ms = |t: &str| crate::billing::focus::parse_time_ms(t).unwrap();
    let now = ms("2026-11-03T12:00:00Z");
    for (api, _db) in apis().await {
        let b = api.backend;
        let at = |batch: &str, start: i64| {
            let mut r = report(batch);
            (r.windows[0].start_ms, r.windows[0].end_ms) = (start, start + 15_000);
            serde_json::to_vec(&r).unwrap()
        };
        let post = |body: Vec<u8>| crate::clock::at(now, api.post(Some(&api.token), body));
        // September closed on October 6 (five days after it ended); October is open until November 6.
        for _ in 0..2 {
            let (status, body) = post(at("late-september", ms("2026-09-30T20:00:00Z"))).await;
            assert_eq!(
                status,
                StatusCode::CONFLICT,
                "{b}: {}",
                String::from_utf8_lossy(&body)
            );
            let err = error_of(&body);
            assert_eq!(err.field.as_deref(), Some("windows[0].start_ms"), "{b}");
            assert!(
                err.message
                    .starts_with("2026-09 is closed (it closed 2026-10-06 00:00 UTC)"),
                "{b}: {}",
                err.message
            );
        }
        let (status, body) = post(at("late-october", ms("2026-10-30T10:00:00Z"))).await;
        assert_eq!(
            status,
            StatusCode::OK,
            "{b}: {}",
            String::from_utf8_lossy(&body)
        );
        // Signed off, October closes at once.
        store::closing::sign_off_month(
            api.store.db(),
            &crate::store::closing::SignOffRow {
                month_ms: ms("2026-10-01T00:00:00Z"),
                signed_ms: now,
                by_user: "finance".into(),
                note: String::new(),
            },
        )
        .await
        .unwrap();
        let (status, body) = post(at("later-october", ms("2026-10-31T10:00:00Z"))).await;
        assert_eq!(status, StatusCode::CONFLICT, "{b}");
        assert!(
            error_of(&body)
                .message
                .contains("2026-10 is closed (it was signed off)"),
            "{b}"
        );
        let (status, _) = post(at("november", ms("2026-11-03T10:00:00Z"))).await;
        assert_eq!(status, StatusCode::OK, "{b}");
    }
}
