//! The OpenAPI description against the server it describes, on both storage backends: a real
//! server (TCP, HTTP/1.1) holding the demo's two months answers every documented operation, and
//! each answer's status, content type and JSON body are checked against the document, where an
//! object may carry no property the document does not name. Requests the document does not
//! allow (an unknown parameter or path, a wrong method, a value of the wrong kind, a broken
//! body) get the API's JSON error with a documented 4xx. `docs/openapi.json` is the document
//! the code generates.

use std::collections::BTreeSet;
use std::sync::Arc;

use serde_json::{json, Value};

use super::AppState;
use crate::auth::{generate_token, hash_token};
use crate::config::{Secret, SlackAppConfig};
use crate::store::tokens::NewToken;
use crate::store::{self, Store};
use crate::{clock::now_ms, test_support};
use gpuledger_core::time::{day_floor, month_label, month_of, rfc3339, DAY_MS};

const SLACK_SECRET: &str = "4b1d9e07c2a85f36e1d0c9b8a7f60512";
const DOC_URI: &str = "urn:gpuledger:openapi";

fn committed_path() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/openapi.json")
}

/// `docs/openapi.json` is what the handlers' types and attributes describe; `UPDATE_OPENAPI=1`
/// rewrites it.
#[test]
fn the_committed_document_is_the_generated_one() {
    let generated = super::openapi::document().to_pretty_json().unwrap() + "\n";
    let path = committed_path();
    if std::env::var_os("UPDATE_OPENAPI").is_some() {
        std::fs::write(&path, &generated).unwrap();
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == generated,
        "docs/openapi.json is not what the code describes; run \
         `UPDATE_OPENAPI=1 cargo test -p gpuledger-server committed_document` and commit it"
    );
}

/// The document is OpenAPI 3.1 as its schema says, every operation is named, and every
/// `$ref` points at a component that is there.
#[test]
fn the_document_is_well_formed() {
    let doc = serde_json::to_value(super::openapi::document()).unwrap();
    assert_eq!(doc["openapi"], "3.1.0");
    let mut ids = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            let id = op["operationId"].as_str().unwrap_or_default();
            assert!(
                ids.insert(id.to_owned()),
                "{method} {path}: operationId {id:?} twice"
            );
            assert!(op["responses"].as_object().is_some_and(|r| !r.is_empty()));
        }
    }
    let schemas = doc["components"]["schemas"].as_object().unwrap();
    let mut refs = Vec::new();
    collect_refs(&doc, &mut refs);
    for r in refs {
        let name = r
            .strip_prefix("#/components/schemas/")
            .unwrap_or_else(|| panic!("{r}"));
        assert!(schemas.contains_key(name), "{r} points nowhere");
    }
}

/// The document passes openapi-spec-validator (the OpenAPI 3.1 specification's own schema, and
/// its rules beyond it), which refuses a document that breaks them.
#[test]
fn the_document_passes_openapi_spec_validator() {
    let validator = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../.venv/bin/openapi-spec-validator");
    let dir = tempfile::tempdir().unwrap();
    let run = |doc: &Value| {
        let file = dir.path().join("openapi.json");
        std::fs::write(&file, doc.to_string()).unwrap();
        std::process::Command::new(&validator)
            .arg(&file)
            .output()
            .unwrap_or_else(|e| {
                panic!(
                    "{} (scripts/python-env installs it): {e}",
                    validator.display()
                )
            })
    };
    let doc = serde_json::to_value(super::openapi::document()).unwrap();
    let out = run(&doc);
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let mut broken = doc;
    broken["paths"]["/healthz"]["get"]["responses"]["200"] = json!({ "content": {} });
    assert!(
        !run(&broken).status.success(),
        "a response without a description passed"
    );
}

/// The checks below can fail: what the document does not allow is refused (a property it does
/// not name, one missing, a decimal as a number, a status or content type it does not list),
/// flattened structs included.
#[test]
fn the_checker_refuses_what_the_document_does_not_allow() {
    let checker = Checker::new();
    let json = |status: u16, body: Value| Answer {
        status,
        content_type: "application/json".into(),
        allow: None,
        bytes: body.to_string().into_bytes(),
        body: body.to_string(),
    };
    let ack = json!({ "batch_id": "b1", "status": "stored", "windows": 1 });
    let reports = |a: &Answer| checker.allows("post", "/api/v1/reports", a);
    assert_eq!(reports(&json(200, ack.clone())), Ok(()));
    let mut extra = ack.clone();
    extra["surprise"] = json!(true);
    assert!(reports(&json(200, extra)).is_err());
    assert!(reports(&json(200, json!({ "batch_id": "b1", "status": "stored" }))).is_err());
    assert!(reports(&json(
        200,
        json!({ "batch_id": 1, "status": "stored", "windows": 1 })
    ))
    .is_err());
    assert!(reports(&json(418, ack.clone())).is_err());
    let text = Answer {
        content_type: "text/plain".into(),
        ..json(200, ack)
    };
    assert!(reports(&text).is_err());
    let error = json!({ "error": "bad_request", "message": "no", "field": "batch_id" });
    assert_eq!(reports(&json(400, error)), Ok(()));

    // A budget: a forecast's fields and its own, flattened into one object.
    let budget = json!({
        "dimension": "team", "key": "research", "from_month": "2026-11", "amount": "100",
        "currency": "USD", "set_by": "ana", "spent": "50", "expected": "90", "low": "80",
        "high": "100", "basis_days": 20, "standing": "on_track"
    });
    let set = |a: &Answer| checker.allows("put", "/api/v1/budgets", a);
    assert_eq!(set(&json(200, budget.clone())), Ok(()));
    let mut extra = budget.clone();
    extra["surprise"] = json!(1);
    assert!(set(&json(200, extra)).is_err());
    let mut number = budget.clone();
    number["spent"] = json!(50.0);
    assert!(set(&json(200, number)).is_err());
    let mut standing = budget;
    standing["standing"] = json!("fine");
    assert!(set(&json(200, standing)).is_err());
}

fn collect_refs(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            if let Some(Value::String(r)) = m.get("$ref") {
                out.push(r.clone());
            }
            m.values().for_each(|v| collect_refs(v, out));
        }
        Value::Array(a) => a.iter().for_each(|v| collect_refs(v, out)),
        _ => {}
    }
}

/// The document as the test validates with: every component object closed to properties it
/// does not name (`unevaluatedProperties: false`), except those only ever part of another
/// (`allOf`, a flattened struct), which the whole closes instead.
fn strict(doc: &Value) -> Value {
    let mut doc = doc.clone();
    let mut parts = Vec::new();
    collect_all_of_refs(&doc, &mut parts);
    if let Some(schemas) = doc["components"]["schemas"].as_object_mut() {
        for (name, schema) in schemas.iter_mut() {
            let is_object = schema.get("properties").is_some() || schema.get("allOf").is_some();
            if is_object && !parts.contains(&format!("#/components/schemas/{name}")) {
                schema["unevaluatedProperties"] = json!(false);
            }
        }
    }
    doc
}

fn collect_all_of_refs(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            if let Some(Value::Array(branches)) = m.get("allOf") {
                for b in branches {
                    if let Some(Value::String(r)) = b.get("$ref") {
                        out.push(r.clone());
                    }
                }
            }
            m.values().for_each(|v| collect_all_of_refs(v, out));
        }
        Value::Array(a) => a.iter().for_each(|v| collect_all_of_refs(v, out)),
        _ => {}
    }
}

/// A JSON pointer's token: `/` and `~` escaped.
fn token(s: &str) -> String {
    s.replace('~', "~0").replace('/', "~1")
}

/// Checks answers against the document.
struct Checker {
    doc: Value,
    registry: jsonschema::Registry<'static>,
}

impl Checker {
    fn new() -> Self {
        let doc = serde_json::to_value(super::openapi::document()).unwrap();
        let registry = jsonschema::Registry::new()
            .add(DOC_URI, strict(&doc))
            .unwrap()
            .prepare()
            .unwrap();
        Checker { doc, registry }
    }

    /// `status`, `content_type` and `body` are an answer the document allows `method path`.
    fn check(&self, method: &str, path: &str, answer: &Answer, context: &str) {
        if let Err(why) = self.allows(method, path, answer) {
            panic!("{context}: {method} {path}: {why}");
        }
    }

    /// Whether the document allows `answer` to `method path`, and if not why.
    fn allows(&self, method: &str, path: &str, answer: &Answer) -> Result<(), String> {
        let op = &self.doc["paths"][path][method];
        if !op.is_object() {
            return Err("not documented".into());
        }
        let status = answer.status.to_string();
        let response = &op["responses"][&status];
        if !response.is_object() {
            return Err(format!(
                "answered {status}, which it does not document: {}",
                clip(&answer.body)
            ));
        }
        let media = answer
            .content_type
            .split(';')
            .next()
            .unwrap_or_default()
            .trim()
            .to_owned();
        let Some(content) = response.get("content").and_then(Value::as_object) else {
            return match answer.body.is_empty() {
                true => Ok(()),
                false => Err(format!(
                    "{status} documents no body, got {}",
                    clip(&answer.body)
                )),
            };
        };
        if answer.body.is_empty() && method == "post" && path == "/slack/interactions" {
            // A button acted on: Slack wants only the 200.
            return Ok(());
        }
        if !content.contains_key(&media) {
            return Err(format!(
                "{status} answered {media:?}, documented {:?}",
                content.keys().collect::<Vec<_>>()
            ));
        }
        if media != "application/json" {
            return match answer.body.is_empty() {
                true => Err(format!("an empty {media}")),
                false => Ok(()),
            };
        }
        let pointer = format!(
            "{DOC_URI}#/paths/{}/{method}/responses/{status}/content/application~1json/schema",
            token(path)
        );
        let validator = jsonschema::options()
            .with_registry(&self.registry)
            .build(&json!({ "$ref": pointer }))
            .map_err(|e| format!("{pointer}: {e}"))?;
        let value: Value = serde_json::from_str(&answer.body)
            .map_err(|e| format!("not JSON ({e}): {}", clip(&answer.body)))?;
        let errors: Vec<String> = validator
            .iter_errors(&value)
            .map(|e| format!("{} at {}", e, e.instance_path()))
            .collect();
        match errors.is_empty() {
            true => Ok(()),
            false => Err(format!(
                "{status} does not match the document:\n{}\n{}",
                errors.join("\n"),
                clip(&answer.body)
            )),
        }
    }

    /// Every documented operation, as `(method, path)`.
    fn operations(&self) -> BTreeSet<(String, String)> {
        let mut out = BTreeSet::new();
        for (path, item) in self.doc["paths"].as_object().unwrap() {
            for method in item.as_object().unwrap().keys() {
                out.insert((method.clone(), path.clone()));
            }
        }
        out
    }
}

fn clip(s: &str) -> &str {
    s.get(..2000).unwrap_or(s)
}

#[derive(Clone)]
struct Answer {
    status: u16,
    content_type: String,
    allow: Option<String>,
    bytes: Vec<u8>,
    /// `bytes` as text (a Parquet body lossily).
    body: String,
}

/// A real server on a port of its own, holding the demo's fleet and bill, and who may
/// call it.
struct Live {
    base: String,
    http: reqwest::Client,
    store: Arc<dyn Store>,
    /// When the demo was seeded.
    now: i64,
    read_token: String,
    team_token: String,
    agent_token: String,
    admin_cookie: String,
}

#[derive(Clone, Copy)]
enum Caller {
    Nobody,
    /// A BI tool's read-only token that sees every team.
    Reader,
    /// A read-only token of team `applied` alone.
    TeamReader,
    /// An admin's browser, on the server's own page.
    Admin,
    Agent,
}

/// The team the scoped token reads (one of the demo's).
const TEAM: &str = "applied";

impl Live {
    async fn start(db: &test_support::TestDb) -> Live {
        let store = db.open().await;
        let mut state = AppState::new(store.clone());
        let mut config = (*state.config).clone();
        config.slack.app = Some(SlackAppConfig {
            signing_secret: Secret(SLACK_SECRET.into()),
            // Nowhere: a late answer or a button's must not leave this machine.
            response_url_prefix: "http://127.0.0.1:9/".into(),
        });
        state.config = Arc::new(config);
        let now = now_ms();
        crate::demo::seed(
            store.as_ref(),
            &state.rate_card,
            &state.config.attribution_rules(),
            now,
        )
        .await
        .unwrap();
        // What the server's job would find in it: the idle cluster, the held-idle notebooks.
        crate::incidents::evaluate(store.as_ref(), &state.rate_card, &state.config, now)
            .await
            .unwrap();
        let agent_token = generate_token();
        store::tokens::create_token(
            store.db(),
            &NewToken::for_cluster("openapi-agent", &hash_token(&agent_token), "openapi"),
            now,
        )
        .await
        .unwrap();
        // Its counts are for the demo's chat-api, which runs on hosts of other tokens: bound
        // as an admin binds serving code that has no agent on its hosts.
        crate::agent_tokens::bind_owner(
            store.as_ref(),
            "openapi-agent",
            (crate::agent_tokens::BoundRole::Endpoint, "chat-api"),
            now,
        )
        .await
        .unwrap();
        let read = |name: &'static str, scope: gpuledger_core::scope::Scope| {
            let store = store.clone();
            async move {
                crate::read_tokens::create(store.as_ref(), name, &scope, "admin-user", now)
                    .await
                    .unwrap()
            }
        };
        let read_token = read("openapi", gpuledger_core::scope::Scope::all()).await;
        let team_token = read(
            "openapi-team",
            gpuledger_core::scope::Scope::teams([TEAM]).unwrap(),
        )
        .await;
        let admin_cookie = admin_session(store.as_ref()).await;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(crate::serve(
            listener,
            state,
            Default::default(),
            std::future::pending(),
        ));
        Live {
            base,
            http: reqwest::Client::new(),
            store,
            now,
            read_token,
            team_token,
            agent_token,
            admin_cookie,
        }
    }

    async fn call(
        &self,
        method: &str,
        path_and_query: &str,
        caller: Caller,
        body: Option<(&str, String)>,
    ) -> Answer {
        let method = reqwest::Method::from_bytes(method.to_uppercase().as_bytes()).unwrap();
        let mut req = self
            .http
            .request(method, format!("{}{path_and_query}", self.base));
        req = match caller {
            Caller::Nobody => req,
            Caller::Reader => req.bearer_auth(&self.read_token),
            Caller::TeamReader => req.bearer_auth(&self.team_token),
            Caller::Agent => req.bearer_auth(&self.agent_token),
            Caller::Admin => req
                .header("cookie", &self.admin_cookie)
                .header("origin", &self.base)
                .header("sec-fetch-site", "same-origin"),
        };
        if let Some((content_type, body)) = body {
            req = req.header("content-type", content_type).body(body);
        }
        answer(req.send().await.unwrap()).await
    }

    /// POSTs a form to a Slack route, signed as Slack signs (`signature` given: as forged).
    async fn slack(&self, path: &str, body: &str, signature: Option<&str>) -> Answer {
        let ts = (now_ms() / 1000).to_string();
        let signed = crate::slack_app::sign(SLACK_SECRET, &ts, body.as_bytes());
        let resp = self
            .http
            .post(format!("{}{path}", self.base))
            .header("content-type", "application/x-www-form-urlencoded")
            .header("x-slack-request-timestamp", ts)
            .header("x-slack-signature", signature.unwrap_or(&signed))
            .body(body.to_owned())
            .send()
            .await
            .unwrap();
        answer(resp).await
    }
}

async fn answer(resp: reqwest::Response) -> Answer {
    let header = |name: &str| {
        resp.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let content_type = header("content-type").unwrap_or_default();
    let allow = header("allow");
    let status = resp.status().as_u16();
    let bytes = resp.bytes().await.unwrap().to_vec();
    Answer {
        status,
        content_type,
        allow,
        body: String::from_utf8_lossy(&bytes).into_owned(),
        bytes,
    }
}

/// An admin's session cookie, as signing in makes one.
async fn admin_session(store: &dyn Store) -> String {
    let hash = crate::session::hash_password("correct horse battery").unwrap();
    store::accounts::create_user(store.db(), "admin-user", &hash, "admin", None, now_ms())
        .await
        .unwrap();
    let user = store::accounts::user_by_name(store.db(), "admin-user")
        .await
        .unwrap()
        .unwrap();
    let token = generate_token();
    store::accounts::create_session(
        store.db(),
        &hash_token(&token),
        user.id,
        &generate_token(),
        now_ms(),
        now_ms() + 3_600_000,
    )
    .await
    .unwrap();
    format!("{}={token}", super::cookies::SESSION_COOKIE)
}

/// A report from the openapi cluster's one host, its last 15 seconds.
fn report(batch: &str, util: f64) -> String {
    let now = now_ms();
    json!({
        "batch_id": batch,
        "agent_version": "openapi-test",
        "host": { "hostname": "oa-0", "cluster": "openapi", "instance_type": "g6.xlarge" },
        "windows": [{
            "start_ms": now - 15_000, "end_ms": now, "samples": 15,
            "gpus": [{
                "uuid": "GPU-0a0a0a0a-0000-4000-8000-000000000001", "index": 0,
                "name": "NVIDIA L4", "memory_total_bytes": 24_000_000_000_u64,
                "memory_used_max_bytes": 4_000_000_000_u64, "util_avg": util, "util_max": util,
                "util_histogram": [[util as u32, 15]],
                "processes": [{ "pid": 4242, "name": "python3",
                    "memory_used_max_bytes": 4_000_000_000_u64, "sm_util_avg": 40.0,
                    "labels": { "team": "research", "model": "llama-3-8b" } }]
            }]
        }]
    })
    .to_string()
}

/// A slash command's form as Slack posts it.
fn slash_command(text: &str) -> String {
    form_urlencoded::Serializer::new(String::new())
        .append_pair("token", "gIkuvaNzQIHg97ATvDxqgjtO")
        .append_pair("team_id", "T0001")
        .append_pair("user_name", "ana")
        .append_pair("command", "/gpuledger")
        .append_pair("text", text)
        .append_pair("response_url", "http://127.0.0.1:9/commands/1234/5678")
        .finish()
}

/// A button press's form: Slack's `block_actions` payload as JSON in `payload`.
fn button_press(action_id: &str, value: &str) -> String {
    let payload = json!({
        "type": "block_actions",
        "user": { "id": "U2147483697", "username": "ana", "name": "ana", "team_id": "T0001" },
        "response_url": "http://127.0.0.1:9/actions/1/2",
        "actions": [{ "action_id": action_id, "block_id": "incident", "value": value,
                      "type": "button", "action_ts": "1548426417.840180" }]
    });
    form_urlencoded::Serializer::new(String::new())
        .append_pair("payload", &payload.to_string())
        .finish()
}

/// What a non-JSON answer must hold to be what its content type says: a CSV table with a
/// header row (the FOCUS export's with its columns), a Parquet file, a Prometheus exposition.
fn check_body(path: &str, a: &Answer, context: &str) {
    let media = a.content_type.split(';').next().unwrap_or_default().trim();
    match media {
        "text/csv" => {
            let mut rows = csv::Reader::from_reader(a.bytes.as_slice());
            let header = rows.headers().unwrap().clone();
            assert!(header.len() > 1, "{context}: {path}: {header:?}");
            let width = header.len();
            for row in rows.records() {
                assert_eq!(row.unwrap().len(), width, "{context}: {path}: a ragged row");
            }
            if path.contains("format=focus") {
                for column in [
                    "BilledCost",
                    "EffectiveCost",
                    "ChargePeriodStart",
                    "x_GpuledgerKind",
                ] {
                    assert!(
                        header.iter().any(|h| h == column),
                        "{context}: {path}: {column}"
                    );
                }
            }
        }
        "application/vnd.apache.parquet" => {
            // Whole: Parquet begins and ends with its magic (a stream cut half-way does not).
            assert!(
                a.bytes.starts_with(b"PAR1") && a.bytes.ends_with(b"PAR1"),
                "{context}: {path}"
            );
        }
        "text/plain" if path.starts_with("/metrics") => {
            assert!(a.body.contains("# TYPE gpuledger_"), "{context}: {path}")
        }
        _ => {}
    }
}

#[tokio::test]
async fn every_documented_operation_answers_as_documented() {
    let checker = Checker::new();
    let committed: Value =
        serde_json::from_str(&std::fs::read_to_string(committed_path()).unwrap()).unwrap();
    for db in test_support::both().await {
        let b = db.backend;
        let live = Live::start(&db).await;
        let now = live.now;
        let this_month = month_label(now);
        let last_month = month_label(month_of(now).0 - 1);
        let yesterday = &rfc3339(day_floor(now) - DAY_MS)[..10];
        let today = &rfc3339(day_floor(now))[..10];
        // The demo's load test was yesterday: the anomaly is in yesterday's month.
        let anomaly_month = month_label(day_floor(now) - DAY_MS);
        let mut called = BTreeSet::new();
        let mut expect = |method: &str, path: &str, answer: &Answer, status: u16| {
            assert_eq!(
                answer.status,
                status,
                "{b}: {method} {path}: {}",
                clip(&answer.body)
            );
            let bare = path.split('?').next().unwrap_or_default();
            checker.check(method, bare, answer, b);
            check_body(path, answer, b);
            if (200..300).contains(&status) {
                called.insert((method.to_owned(), bare.to_owned()));
            }
        };
        use Caller::*;

        // Every read, as a BI tool reads it, in each format it comes in.
        let reads: Vec<String> = vec![
            format!("/api/v1/allocation?from={last_month}&to={this_month}&by=model&step=month"),
            "/api/v1/allocation".into(),
            format!("/api/v1/allocation?step=hour&from={yesterday}&to={today}&team={TEAM}"),
            format!("/api/v1/allocation?format=csv&by=gpu&from={yesterday}&to={today}"),
            format!("/api/v1/allocation?format=focus&from={yesterday}&to={today}"),
            format!("/api/v1/allocation?format=focus-parquet&from={yesterday}&to={today}"),
            "/api/v1/billing/imports".into(),
            "/api/v1/billing/periods".into(),
            format!("/api/v1/billing/reconciliation?month={last_month}"),
            "/api/v1/billing/reconciliation".into(),
            format!("/api/v1/billing/commitments?month={last_month}"),
            "/api/v1/billing/commitments".into(),
            format!("/api/v1/variance?month={last_month}&by=cluster"),
            "/api/v1/variance?format=csv".into(),
            "/api/v1/budgets".into(),
            format!("/api/v1/anomalies?month={anomaly_month}"),
            "/api/v1/incidents".into(),
            format!("/api/v1/incidents?from={last_month}&format=csv"),
            "/api/v1/idle/history".into(),
            format!("/api/v1/idle/history?from={last_month}&to={this_month}&format=csv"),
            "/api/v1/recommendations".into(),
            "/api/v1/recommendations?lookback=72h&format=csv".into(),
            format!("/api/v1/scale-to-zero?month={last_month}"),
            "/api/v1/scale-to-zero".into(),
            format!("/api/v1/shape?month={last_month}"),
            "/api/v1/shape".into(),
            format!("/api/v1/usage?from={last_month}"),
            "/api/v1/usage?format=csv".into(),
            format!("/api/v1/runs?from={last_month}"),
            "/api/v1/runs?format=csv".into(),
            "/healthz".into(),
            "/metrics".into(),
            "/api/v1/openapi.json".into(),
        ];
        for path in &reads {
            let answer = live.call("get", path, Reader, None).await;
            expect("get", path, &answer, 200);
        }
        // A team's token: its figures where the operation narrows them, 403 where it covers
        // every team.
        let every_team = [
            "/api/v1/billing/imports",
            "/api/v1/billing/periods",
            "/api/v1/billing/commitments",
        ];
        for path in &reads {
            let answer = live.call("get", path, TeamReader, None).await;
            let status = match every_team.iter().any(|p| path.starts_with(p))
                || path.starts_with("/api/v1/billing/reconciliation")
            {
                true => 403,
                false => 200,
            };
            expect("get", path, &answer, status);
        }
        let scoped = live
            .call(
                "get",
                "/api/v1/allocation?by=team&step=month",
                TeamReader,
                None,
            )
            .await;
        let scoped: Value = serde_json::from_str(&scoped.body).unwrap();
        let keys: BTreeSet<&str> = scoped["rows"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|r| r["key"].as_str())
            .collect();
        assert_eq!(
            keys,
            BTreeSet::from([TEAM]),
            "{b}: a team's token reads its team"
        );
        // A person's browser reads too.
        let by_session = live.call("get", "/api/v1/budgets", Admin, None).await;
        expect("get", "/api/v1/budgets", &by_session, 200);
        let metrics = live.call("get", "/metrics", Nobody, None).await;
        expect("get", "/metrics", &metrics, 200);
        assert!(
            !metrics.body.contains("gpuledger_cost_month_to_date"),
            "{b}"
        );
        // The document served is the one committed.
        let served = live.call("get", "/api/v1/openapi.json", Nobody, None).await;
        let served: Value = serde_json::from_str(&served.body).unwrap();
        assert!(
            served == committed,
            "{b}: docs/openapi.json is not what is served (the_committed_document_is_the_generated_one says how to renew it)"
        );

        // What the demo holds is in the answers, so the schemas met real figures.
        let anomalies = live
            .call(
                "get",
                &format!("/api/v1/anomalies?month={anomaly_month}"),
                Reader,
                None,
            )
            .await;
        let anomalies: Value = serde_json::from_str(&anomalies.body).unwrap();
        let first = &anomalies["anomalies"][0];
        assert!(
            first.is_object(),
            "{b}: the demo's load test is an anomaly: {anomalies}"
        );
        let allocation = live
            .call(
                "get",
                &format!("/api/v1/allocation?from={last_month}"),
                Reader,
                None,
            )
            .await;
        let allocation: Value = serde_json::from_str(&allocation.body).unwrap();
        assert!(
            allocation["rows"].as_array().is_some_and(|r| !r.is_empty()),
            "{b}"
        );
        // The demo's hosts are in us-east-1 and measure energy; its chat endpoint counts tokens.
        assert!(
            allocation["rows"]
                .as_array()
                .unwrap()
                .iter()
                .any(|r| r["kg_co2e"].as_f64().is_some_and(|kg| kg > 0.0)),
            "{b}: emissions in the allocation"
        );
        let usage = live.call("get", "/api/v1/usage", Reader, None).await;
        let usage: Value = serde_json::from_str(&usage.body).unwrap();
        assert!(
            usage["endpoints"]
                .as_array()
                .unwrap()
                .iter()
                .any(|e| e["cost_per_1m_tokens"].is_string()),
            "{b}: cost per 1M tokens: {usage}"
        );
        let incidents = live.call("get", "/api/v1/incidents", Reader, None).await;
        let incidents: Value = serde_json::from_str(&incidents.body).unwrap();
        let incident = incidents[0]["id"]
            .as_i64()
            .unwrap_or_else(|| panic!("{b}: no incident"));

        // Writes, as an admin's browser makes them.
        let json_body = |v: Value| Some(("application/json", v.to_string()));
        let budget = json!({ "dimension": "team", "key": "research", "amount": "12000.50",
                             "from_month": this_month });
        let set = live
            .call("put", "/api/v1/budgets", Admin, json_body(budget.clone()))
            .await;
        expect("put", "/api/v1/budgets", &set, 200);
        let listed = live.call("get", "/api/v1/budgets", Reader, None).await;
        expect("get", "/api/v1/budgets", &listed, 200);
        assert!(listed.body.contains("\"12000.5\""), "{b}: {}", listed.body);
        let gone = json!({ "dimension": "team", "key": "research", "from_month": this_month });
        let deleted = live
            .call("delete", "/api/v1/budgets", Admin, json_body(gone.clone()))
            .await;
        expect("delete", "/api/v1/budgets", &deleted, 204);
        let again = live
            .call("delete", "/api/v1/budgets", Admin, json_body(gone))
            .await;
        expect("delete", "/api/v1/budgets", &again, 404);
        let dismiss = json!({
            "dimension": first["dimension"], "key": first["key"], "currency": first["currency"],
            "start": rfc3339(first["start_ms"].as_i64().unwrap())[..10].to_owned(),
            "reason": "the serving team's planned load test",
        });
        let dismissed = live
            .call(
                "post",
                "/api/v1/anomalies/dismiss",
                Admin,
                json_body(dismiss.clone()),
            )
            .await;
        expect("post", "/api/v1/anomalies/dismiss", &dismissed, 200);
        let twice = live
            .call(
                "post",
                "/api/v1/anomalies/dismiss",
                Admin,
                json_body(dismiss),
            )
            .await;
        expect("post", "/api/v1/anomalies/dismiss", &twice, 409);

        // What agents and serving code send.
        let batch = report("oa-1", 40.0);
        let stored = live
            .call(
                "post",
                "/api/v1/reports",
                Agent,
                Some(("application/json", batch.clone())),
            )
            .await;
        expect("post", "/api/v1/reports", &stored, 200);
        assert!(stored.body.contains("\"stored\""), "{b}: {}", stored.body);
        // Sent again (a retry after a lost acknowledgement): acknowledged, not stored twice.
        let repeat = live
            .call(
                "post",
                "/api/v1/reports",
                Agent,
                Some(("application/json", batch)),
            )
            .await;
        expect("post", "/api/v1/reports", &repeat, 200);
        assert!(
            repeat.body.contains("\"duplicate\""),
            "{b}: {}",
            repeat.body
        );
        let counts = json!({ "source": "chat-api-0", "counts": [{
            "endpoint": "chat-api", "start": rfc3339(now - 3_600_000), "end": rfc3339(now - 60_000),
            "requests": 1200, "input_tokens": 720_000, "output_tokens": 300_000 }] });
        let usage = live
            .call("post", "/api/v1/usage", Agent, json_body(counts))
            .await;
        expect("post", "/api/v1/usage", &usage, 200);

        // Slack, signed as Slack signs.
        for text in ["idle", "cost research", "budget", "help"] {
            let answer = live
                .slack("/slack/commands", &slash_command(text), None)
                .await;
            expect("post", "/slack/commands", &answer, 200);
        }
        let snooze = button_press(crate::slack::SNOOZE_4H, &incident.to_string());
        let pressed = live.slack("/slack/interactions", &snooze, None).await;
        expect("post", "/slack/interactions", &pressed, 200);
        let forged = live
            .slack("/slack/interactions", &snooze, Some("v0=00"))
            .await;
        expect("post", "/slack/interactions", &forged, 401);
        let unsigned = live
            .slack("/slack/commands", &slash_command("idle"), Some(""))
            .await;
        expect("post", "/slack/commands", &unsigned, 401);

        let missing: Vec<_> = checker.operations().difference(&called).cloned().collect();
        assert!(missing.is_empty(), "{b}: never answered 2xx: {missing:?}");
    }
}

/// Every route of the API (what is not a page) is in the document, with its method.
#[test]
fn every_api_route_is_documented() {
    let checker = Checker::new();
    let documented = checker.operations();
    let api = |path: &str| {
        path.starts_with("/api/")
            || ["/healthz", "/metrics"].contains(&path)
            || path.starts_with("/slack/")
    };
    let routes: Vec<_> = super::security_tests::ROUTES
        .iter()
        .filter(|(_, path, _)| api(path))
        .map(|(method, path, _)| (method.to_lowercase(), path.to_string()))
        .collect();
    assert!(routes.len() >= 20, "{routes:?}");
    for route in &routes {
        assert!(
            documented.contains(route),
            "{route:?} is not in the OpenAPI document"
        );
    }
    for op in &documented {
        assert!(routes.contains(op), "{op:?} is documented but not routed");
    }
}

/// Sends `request` and checks the answer is `status` with the API's JSON error, as the document
/// says for the operation, naming `field` (or none).
async fn refused(
    checker: &Checker,
    live: &Live,
    (method, path, caller, body): (&str, &str, Caller, Option<(&str, String)>),
    status: u16,
    field: Option<&str>,
) {
    let answer = live.call(method, path, caller, body).await;
    let context = format!("{method} {path}");
    assert_eq!(answer.status, status, "{context}: {}", answer.body);
    let bare = path.split('?').next().unwrap_or_default();
    checker.check(method, bare, &answer, &context);
    let error: gpuledger_proto::ApiErrorBody = serde_json::from_str(&answer.body).unwrap();
    assert!(!error.message.is_empty(), "{context}");
    assert_eq!(
        error.field.as_deref(),
        field,
        "{context}: {}",
        error.message
    );
}

/// Requests the document does not allow, each with the JSON error and 4xx it documents for the
/// operation (the field at fault named where there is one), on both backends; none stores
/// anything.
#[tokio::test]
async fn requests_the_document_does_not_allow_get_a_clear_4xx() {
    let checker = Checker::new();
    for db in test_support::both().await {
        let b = db.backend;
        // The demo's ledger: a budget may only be set for an owner that has cost.
        let live = Live::start(&db).await;
        use Caller::*;
        // What is there before: the fleet, a budget and a source's count, which refused writes
        // must not change.
        let json = |s: &str| Some(("application/json", s.to_owned()));
        let month = month_label(live.now);
        let budget = format!(
            r#"{{"dimension": "team", "key": "research", "amount": "100", "from_month": "{month}"}}"#
        );
        let set = live
            .call("put", "/api/v1/budgets", Admin, json(&budget))
            .await;
        assert_eq!(set.status, 200, "{b}: {}", set.body);
        let counts = format!(
            r#"{{"source": "s", "counts": [{{"endpoint": "chat-api", "start": "{}", "end": "{}", "requests": 5}}]}}"#,
            rfc3339(live.now - 3_600_000),
            rfc3339(live.now - 60_000)
        );
        let counted = live
            .call("post", "/api/v1/usage", Agent, json(&counts))
            .await;
        assert_eq!(counted.status, 200, "{b}: {}", counted.body);
        let before = (
            store::telemetry::fleet(live.store.db()).await.unwrap(),
            live.call("get", "/api/v1/budgets", Reader, None).await.body,
            live.call("get", "/api/v1/usage", Reader, None).await.body,
        );

        // Reads whose query the document does not allow, with the parameter at fault.
        let reads = [
            ("/api/v1/allocation?step=week", Some("step")),
            ("/api/v1/allocation?format=xml", Some("format")),
            ("/api/v1/allocation?from=yesterday", Some("from")),
            ("/api/v1/allocation?colour=red", Some("colour")),
            ("/api/v1/allocation?team=a&team=b", Some("team")),
            ("/api/v1/billing/reconciliation?mnth=2026-10", None),
            (
                "/api/v1/billing/reconciliation?month=2026-13",
                Some("month"),
            ),
            ("/api/v1/variance?month=last", Some("month")),
            ("/api/v1/variance?by=colour", Some("by")),
            ("/api/v1/variance?format=pdf", Some("format")),
            ("/api/v1/variance?months=2026-10", None),
            ("/api/v1/budgets?month=10/2026", Some("month")),
            ("/api/v1/budgets?team=research", None),
            ("/api/v1/anomalies?month=2026-10&x=1", None),
            ("/api/v1/incidents?format=xls", Some("format")),
            ("/api/v1/idle/history?to=2026-13-01", Some("to")),
            ("/api/v1/recommendations?lookback=forever", Some("lookback")),
            ("/api/v1/usage?from=2026-11&to=2026-10", Some("to")),
            ("/api/v1/runs?page=2", None),
        ];
        for (path, field) in reads {
            refused(&checker, &live, ("get", path, Reader, None), 400, field).await;
        }
        refused(
            &checker,
            &live,
            ("get", "/api/v1/allocation", Nobody, None),
            401,
            None,
        )
        .await;
        refused(
            &checker,
            &live,
            ("get", "/api/v1/billing/periods", TeamReader, None),
            403,
            None,
        )
        .await;

        // Bodies the document does not allow, and callers it does not admit.
        let writes = [
            (
                "put",
                "/api/v1/budgets",
                Admin,
                json(r#"{"dimension": "team", "key": "research", "amount": 12}"#),
                400,
                None,
            ),
            (
                "put",
                "/api/v1/budgets",
                Admin,
                json(r#"{"dimension": "team", "key": "research", "amount": "lots"}"#),
                400,
                Some("amount"),
            ),
            ("put", "/api/v1/budgets", Admin, json("{"), 400, None),
            (
                "put",
                "/api/v1/budgets",
                Admin,
                Some(("text/plain", budget.clone())),
                400,
                None,
            ),
            ("put", "/api/v1/budgets", Reader, json(&budget), 403, None),
            ("put", "/api/v1/budgets", Nobody, json(&budget), 401, None),
            (
                "delete",
                "/api/v1/budgets",
                Admin,
                json(r#"{"dimension": "team"}"#),
                400,
                None,
            ),
            (
                "post",
                "/api/v1/anomalies/dismiss",
                Admin,
                json(
                    r#"{"dimension": "team", "key": "research", "currency": "USD", "start": "someday"}"#,
                ),
                400,
                Some("start"),
            ),
            (
                "post",
                "/api/v1/reports",
                Agent,
                json(r#"{"batch_id": "x"}"#),
                400,
                None,
            ),
            (
                "post",
                "/api/v1/reports",
                Agent,
                json(&report("oa-bad", 150.0)),
                422,
                Some("windows[0].gpus[0].util_avg"),
            ),
            (
                "post",
                "/api/v1/reports",
                Nobody,
                json(&report("oa-nobody", 10.0)),
                401,
                None,
            ),
            (
                "post",
                "/api/v1/reports",
                Reader,
                json(&report("oa-reader", 10.0)),
                401,
                None,
            ),
            (
                "post",
                "/api/v1/usage",
                Agent,
                json(
                    r#"{"source": "s", "counts": [{"endpoint": "chat-api", "start": "now", "end": "later", "requests": 1}]}"#,
                ),
                400,
                Some("counts[0].start"),
            ),
            (
                "post",
                "/api/v1/usage",
                Agent,
                json(r#"{"source": "s", "counts": [], "extra": 1}"#),
                400,
                Some("extra"),
            ),
        ];
        for (method, path, caller, body, status, field) in writes {
            refused(&checker, &live, (method, path, caller, body), status, field).await;
        }
        // Nothing refused was stored: the fleet (no report), the budget and the count as they
        // were.
        let after = (
            store::telemetry::fleet(live.store.db()).await.unwrap(),
            live.call("get", "/api/v1/budgets", Reader, None).await.body,
            live.call("get", "/api/v1/usage", Reader, None).await.body,
        );
        assert_eq!(before, after, "{b}: a refused write changed something");

        // Outside the document: an address it does not name, a method an operation does not
        // take.
        let unknown = live.call("get", "/api/v1/allocations", Reader, None).await;
        assert_eq!(unknown.status, 404, "{b}");
        assert!(unknown.content_type.starts_with("application/json"), "{b}");
        let error: gpuledger_proto::ApiErrorBody = serde_json::from_str(&unknown.body).unwrap();
        assert_eq!(error.error, "not_found");
        assert!(
            error.message.contains("/api/v1/openapi.json"),
            "{}",
            error.message
        );
        let wrong = live.call("post", "/api/v1/allocation", Reader, None).await;
        assert_eq!(wrong.status, 405, "{b}");
        assert!(wrong.content_type.starts_with("application/json"), "{b}");
        assert_eq!(wrong.allow.as_deref(), Some("GET,HEAD"), "{b}");
        let error: gpuledger_proto::ApiErrorBody = serde_json::from_str(&wrong.body).unwrap();
        assert_eq!(error.error, "method_not_allowed");
        // Pages stay pages.
        let page = live.call("get", "/no-such-page", Nobody, None).await;
        assert_eq!(page.status, 404, "{b}");
        assert!(page.content_type.starts_with("text/html"), "{b}");
        let page = live.call("delete", "/budgets", Nobody, None).await;
        assert_eq!(page.status, 405, "{b}");
        assert!(page.content_type.starts_with("text/html"), "{b}");
    }
}
