//! Idle incidents and Slack, on both backends, against a local HTTP receiver that records what
//! it is sent and answers as scripted (429 with Retry-After, 500, 410, or 200 "ok").

use std::collections::VecDeque;
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Router;
use gpuledger_proto::{GpuWindow, HostInfo, ProcessWindow, Report, Window};

use super::*;
use crate::config::{Config, Secret, SlackConfig, SlackRoute};
use crate::store;
use crate::store::AgentStatus;
use crate::test_support;
use gpuledger_core::money::from_text;

const T: i64 = 1_800_000_000_000; // a whole minute
const MIN: i64 = 60_000;

/// Status, Retry-After and body of one scripted answer.
type Answer = (u16, Option<&'static str>, &'static str);

#[derive(Clone, Default)]
struct Receiver {
    posts: Arc<Mutex<Vec<serde_json::Value>>>,
    script: Arc<Mutex<VecDeque<Answer>>>,
}

async fn receive(State(r): State<Receiver>, body: String) -> Response {
    let (status, retry_after, text) = r
        .script
        .lock()
        .unwrap()
        .pop_front()
        .unwrap_or((200, None, "ok"));
    if status == 200 {
        r.posts
            .lock()
            .unwrap()
            .push(serde_json::from_str(&body).unwrap());
    }
    let mut resp = (StatusCode::from_u16(status).unwrap(), text).into_response();
    if let Some(s) = retry_after {
        resp.headers_mut().insert("retry-after", s.parse().unwrap());
    }
    resp
}

async fn receiver() -> (Receiver, String) {
    let r = Receiver::default();
    let app = Router::new().fallback(receive).with_state(r.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (r, format!("http://{addr}/services/T/B/x"))
}

fn config(webhook: &str, remind: Duration) -> Config {
    Config {
        idle: Default::default(),
        budgets: Default::default(),
        anomalies: Default::default(),
        owners: Default::default(),
        oidc: None,
        metrics: Default::default(),
        export: None,
        slack: SlackConfig {
            default_webhook: Some(Secret(webhook.to_owned())),
            routes: vec![SlackRoute {
                name: None,
                team: Some("archived".into()),
                cluster: None,
                webhook: Secret(format!("{webhook}/archived")),
            }],
            remind_every: remind,
            base_url: "https://gpuledger.example.com".into(),
            app: None,
        },
        ..Default::default()
    }
}

/// The agent token every test's windows are reported with.
async fn agent_token(store: &dyn Store) {
    store::tokens::create_token(
        store.db(),
        &crate::store::tokens::NewToken::for_cluster("agent", "h", "*-*"),
        T,
    )
    .await
    .unwrap();
}

/// One-minute windows over `[from, to)` for `hosts` GPUs each, at `util`, with an optional
/// process that holds memory.
async fn windows(
    store: &dyn Store,
    cluster: &str,
    host: &str,
    from: i64,
    to: i64,
    util: f64,
    holder: Option<&str>,
) {
    let mut t = from;
    while t < to {
        let gpus = (0..2)
            .map(|g| GpuWindow {
                uuid: format!("GPU-{host}-{g}"),
                index: g,
                name: "NVIDIA A100-SXM4-40GB".into(),
                memory_total_bytes: Some(40 << 30),
                memory_used_max_bytes: Some(0),
                util_avg: Some(util),
                util_max: Some(util),
                processes: holder
                    .map(|team| {
                        vec![ProcessWindow {
                            pid: 100 + g,
                            name: Some("jupyter".into()),
                            user: Some("ana".into()),
                            memory_used_max_bytes: Some(8 << 30),
                            sm_util_avg: Some(0.0),
                            labels: [("team".to_string(), team.to_string())].into(),
                            ..Default::default()
                        }]
                    })
                    .unwrap_or_default(),
                ..Default::default()
            })
            .collect();
        let report = Report {
            batch_id: format!("{host}-{t}"),
            agent_version: "test".into(),
            host: HostInfo {
                hostname: host.into(),
                cluster: cluster.into(),
                instance_type: Some("p4d.24xlarge".into()),
                ..Default::default()
            },
            windows: vec![Window {
                serving: Vec::new(),
                start_ms: t,
                end_ms: t + MIN,
                samples: 60,
                gpus,
            }],
        };
        store
            .ingest(&report, 1, AgentStatus::default(), t)
            .await
            .unwrap();
        t += MIN;
    }
}

async fn deliver(store: &dyn Store, cfg: &Config, now: i64) -> usize {
    crate::slack::deliver_due(store, cfg, &crate::slack::client(), now)
        .await
        .unwrap()
}

fn d(s: &str) -> Decimal {
    Decimal::from_str(s).unwrap()
}

/// An incident someone said is idle on purpose (the Slack button) stays open and marked, and is
/// not brought up again at the cadence.
#[tokio::test]
async fn an_intended_incident_gets_no_reminders() {
    for db in test_support::both().await {
        let store = db.open().await;
        let b = db.backend;
        agent_token(store.as_ref()).await;
        let (rx, url) = receiver().await;
        let cfg = config(&url, Duration::from_secs(10 * 60));
        let card = RateCard::default_card();
        windows(
            store.as_ref(),
            "standby",
            "s-1",
            T - 45 * MIN,
            T + 30 * MIN,
            0.0,
            None,
        )
        .await;
        let s = evaluate(store.as_ref(), &card, &cfg, T).await.unwrap();
        assert_eq!(s.opened, 1, "{b}");
        let id = store::alerts::open_incidents(store.db()).await.unwrap()[0].id;
        let marked = crate::incidents::mark_intended(store.as_ref(), id, "ana (Slack)", T + MIN)
            .await
            .unwrap();
        assert!(marked.is_some_and(|(_, open)| open), "{b}");
        for at in [T + 10 * MIN, T + 20 * MIN] {
            let s = evaluate(store.as_ref(), &card, &cfg, at).await.unwrap();
            assert_eq!((s.opened, s.reminders), (0, 0), "{b}");
        }
        let i = &store::alerts::open_incidents(store.db()).await.unwrap()[0];
        assert_eq!(
            (i.intended_by.as_deref(), i.intended_ms),
            (Some("ana (Slack)"), Some(T + MIN)),
            "{b}"
        );
        deliver(store.as_ref(), &cfg, T + 20 * MIN).await;
        assert_eq!(rx.posts.lock().unwrap().len(), 1, "{b}: the opening only");
        // No such incident: nothing marked.
        let none = crate::incidents::mark_intended(store.as_ref(), id + 99, "x", T).await;
        assert!(none.unwrap().is_none(), "{b}");
    }
}

/// Retention shorter than the look-back: a cluster idle since before the oldest raw window
/// kept starts where the ledger's run began, not at the retention's edge.
#[tokio::test]
async fn an_idle_run_older_than_the_raw_windows_kept_starts_where_the_ledger_says() {
    for db in test_support::both().await {
        let store = db.open().await;
        let b = db.backend;
        agent_token(store.as_ref()).await;
        let (cfg, card) = (Config::default(), RateCard::default_card());
        let day = gpuledger_core::time::day_floor(T);
        let began = day - 6 * 60 * MIN;
        windows(
            store.as_ref(),
            "old-c",
            "old-1",
            began,
            T + 15 * MIN,
            0.0,
            None,
        )
        .await;
        test_support::roll_up(store.as_ref()).await;
        // Windows before today's start deleted, as a retention of hours would.
        crate::rollup::enforce_retention(store.as_ref(), T, T - day, T)
            .await
            .unwrap();
        assert_eq!(
            store::telemetry::raw_deleted_before(store.db())
                .await
                .unwrap(),
            Some(day),
            "{b}"
        );
        evaluate(store.as_ref(), &card, &cfg, T + 15 * MIN)
            .await
            .unwrap();
        let i = store::alerts::open_incidents(store.db())
            .await
            .unwrap()
            .remove(0);
        assert_eq!(i.started_ms, began, "{b}: the ledger's start, not the edge");
    }
}

/// A cluster idle for 45 minutes alerts once, reminds at the cadence, resolves once; a busy
/// cluster never alerts; the dollars are the rate card's p4d price for the idle GPUs.
#[tokio::test]
async fn an_idle_cluster_opens_reminds_and_resolves_once() {
    for db in test_support::both().await {
        let store = db.open().await;
        let b = db.backend;
        agent_token(store.as_ref()).await;
        let (rx, url) = receiver().await;
        let cfg = config(&url, Duration::from_secs(10 * 60));
        let card = RateCard::default_card();
        windows(
            store.as_ref(),
            "idle-c",
            "idle-1",
            T - 45 * MIN,
            T + 15 * MIN,
            0.0,
            None,
        )
        .await;
        windows(
            store.as_ref(),
            "idle-c",
            "idle-2",
            T - 45 * MIN,
            T + 15 * MIN,
            1.0,
            None,
        )
        .await;
        windows(
            store.as_ref(),
            "busy-c",
            "busy-1",
            T - 45 * MIN,
            T + 20 * MIN,
            85.0,
            None,
        )
        .await;

        let s = evaluate(store.as_ref(), &card, &cfg, T).await.unwrap();
        assert_eq!((s.opened, s.resolved, s.reminders), (1, 0, 0), "{b}");
        let open = store::alerts::open_incidents(store.db()).await.unwrap();
        assert_eq!(open.len(), 1, "{b}");
        let i = &open[0];
        assert_eq!(
            (i.incident_key.as_str(), i.kind.as_str()),
            ("cluster:idle-c", "cluster_idle"),
            "{b}"
        );
        // Two p4d.24xlarge hosts fully idle: 2 × $32.7726/h, for 45 minutes.
        assert_eq!(from_text(&i.cost_per_hour), d("65.5452"), "{b}");
        assert_eq!(from_text(&i.wasted), d("49.1589"), "{b}");
        assert_eq!(i.estimated, 1);
        assert_eq!(deliver(store.as_ref(), &cfg, T).await, 1);

        // Nothing new a few minutes on; a reminder once the cadence has passed.
        let s = evaluate(store.as_ref(), &card, &cfg, T + 5 * MIN)
            .await
            .unwrap();
        assert_eq!((s.opened, s.resolved, s.reminders), (0, 0, 0), "{b}");
        let s = evaluate(store.as_ref(), &card, &cfg, T + 10 * MIN)
            .await
            .unwrap();
        assert_eq!(s.reminders, 1, "{b}");
        deliver(store.as_ref(), &cfg, T + 10 * MIN).await;

        // The cluster gets busy: resolved, once.
        windows(
            store.as_ref(),
            "idle-c",
            "idle-1",
            T + 15 * MIN,
            T + 18 * MIN,
            70.0,
            None,
        )
        .await;
        windows(
            store.as_ref(),
            "idle-c",
            "idle-2",
            T + 15 * MIN,
            T + 18 * MIN,
            70.0,
            None,
        )
        .await;
        let s = evaluate(store.as_ref(), &card, &cfg, T + 18 * MIN)
            .await
            .unwrap();
        assert_eq!(s.resolved, 1, "{b}");
        let s = evaluate(store.as_ref(), &card, &cfg, T + 19 * MIN)
            .await
            .unwrap();
        assert_eq!((s.opened, s.resolved, s.reminders), (0, 0, 0), "{b}");
        deliver(store.as_ref(), &cfg, T + 19 * MIN).await;

        let posts = rx.posts.lock().unwrap().clone();
        let texts: Vec<&str> = posts.iter().map(|p| p["text"].as_str().unwrap()).collect();
        assert_eq!(
            texts.len(),
            3,
            "{b}: exactly opened, reminder, resolved: {texts:?}"
        );
        assert!(
            texts[0].starts_with(
                "Idle cluster: idle-c, 4 GPUs idle for 45 min, burning $65.55/h; $49.16 wasted"
            ),
            "{}",
            texts[0]
        );
        assert!(
            texts[1].starts_with("Still idle: Idle cluster idle-c"),
            "{}",
            texts[1]
        );
        assert!(
            texts[2].starts_with("Resolved: Idle cluster idle-c"),
            "{}",
            texts[2]
        );
        assert!(
            texts.iter().all(|t| !t.contains("busy-c")),
            "{b}: the busy cluster never alerts"
        );
        assert_eq!(
            posts[0]["blocks"][4]["elements"][0]["url"],
            format!("https://gpuledger.example.com/incidents/{}", i.id)
        );
        // "Snooze the cluster" opens the snooze form with the cluster chosen.
        assert_eq!(
            posts[0]["blocks"][4]["elements"][1]["url"],
            "https://gpuledger.example.com/incidents?snooze=idle-c#snooze"
        );
        // Which GPUs, as nvidia-smi names them on each host.
        assert_eq!(
            posts[0]["blocks"][2]["text"]["text"],
            "*Which GPUs:*\n• idle-1: GPU #0, #1\n• idle-2: GPU #0, #1",
            "{b}"
        );
        assert!(
            posts[0]["blocks"][3]["text"]["text"]
                .as_str()
                .unwrap()
                .starts_with("*Suggested:* Scale the cluster down"),
            "{b}: {}",
            posts[0]["blocks"][3]
        );
        let history = store::alerts::slack_history(store.db(), 10).await.unwrap();
        assert!(history.iter().all(|m| m.status == "sent"), "{b}");
        let about: Vec<String> = store::alerts::incident_messages(store.db(), i.id)
            .await
            .unwrap()
            .into_iter()
            .map(|m| m.event)
            .collect();
        assert_eq!(about, ["opened", "reminder", "resolved"], "{b}");
    }
}

/// 429 waits Retry-After, 500 backs off, both end delivered; 410 gives up and is recorded.
#[tokio::test]
async fn slack_delivery_retries_what_may_succeed_and_records_what_cannot() {
    for db in test_support::both().await {
        let store = db.open().await;
        let b = db.backend;
        let (rx, url) = receiver().await;
        let cfg = config(&url, Duration::from_secs(3600));
        rx.script.lock().unwrap().extend([
            (429, Some("2"), "rate_limited"),
            (500, None, "rollup_error"),
        ]);
        let payload = crate::slack::test_message("default", "x").to_string();
        let id = store::alerts::enqueue_slack(store.db(), None, "test", "default", &payload, T)
            .await
            .unwrap();

        assert_eq!(deliver(store.as_ref(), &cfg, T).await, 1);
        assert_eq!(
            deliver(store.as_ref(), &cfg, T + 1_000).await,
            0,
            "{b}: Retry-After is honoured"
        );
        assert_eq!(
            deliver(store.as_ref(), &cfg, T + 2_000).await,
            1,
            "{b}: retried after 2 s"
        );
        assert_eq!(
            deliver(store.as_ref(), &cfg, T + 2_000 + 9_000).await,
            0,
            "{b}: backing off after a 500"
        );
        assert_eq!(
            deliver(store.as_ref(), &cfg, T + 2_000 + 10_000).await,
            1,
            "{b}: 500 retried after backoff"
        );
        let m = store::alerts::slack_history(store.db(), 10)
            .await
            .unwrap()
            .into_iter()
            .find(|m| m.id == id)
            .unwrap();
        assert_eq!((m.status.as_str(), m.attempts), ("sent", 3), "{b}");
        assert_eq!(rx.posts.lock().unwrap().len(), 1);

        rx.script
            .lock()
            .unwrap()
            .push_back((410, None, "channel_is_archived"));
        let id =
            store::alerts::enqueue_slack(store.db(), None, "test", "default", &payload, T + 10_000)
                .await
                .unwrap();
        deliver(store.as_ref(), &cfg, T + 10_000).await;
        let m = store::alerts::slack_history(store.db(), 10)
            .await
            .unwrap()
            .into_iter()
            .find(|m| m.id == id)
            .unwrap();
        assert_eq!(m.status, "failed", "{b}");
        assert!(m
            .last_error
            .as_deref()
            .unwrap_or("")
            .contains("channel_is_archived"));
        assert_eq!(
            deliver(store.as_ref(), &cfg, T + 60_000).await,
            0,
            "{b}: not retried"
        );

        // A route that is gone from the config fails without a request.
        store::alerts::enqueue_slack(store.db(), None, "test", "team:gone", &payload, T + 70_000)
            .await
            .unwrap();
        deliver(store.as_ref(), &cfg, T + 70_000).await;
        let m = &store::alerts::slack_history(store.db(), 1).await.unwrap()[0];
        assert!(
            m.last_error
                .as_deref()
                .unwrap_or("")
                .contains("not configured"),
            "{b}"
        );
    }
}

/// Held-idle notebooks name their owner and go to the owning team's route; a snoozed cluster
/// stays quiet until the snooze ends.
#[tokio::test]
async fn held_idle_routes_to_the_team_and_snoozes_hold_alerts_back() {
    for db in test_support::both().await {
        let store = db.open().await;
        let b = db.backend;
        agent_token(store.as_ref()).await;
        let (rx, url) = receiver().await;
        let mut cfg = config(&url, Duration::from_secs(3600));
        cfg.slack.routes[0].team = Some("research".into());
        let card = RateCard::default_card();
        windows(
            store.as_ref(),
            "nb-c",
            "nb-1",
            T - 40 * MIN,
            T,
            0.0,
            Some("research"),
        )
        .await;
        windows(
            store.as_ref(),
            "quiet-c",
            "q-1",
            T - 40 * MIN,
            T + 2 * MIN,
            0.0,
            None,
        )
        .await;
        store::alerts::snooze(store.db(), "quiet-c", T + MIN, "ana", T)
            .await
            .unwrap();

        let s = evaluate(store.as_ref(), &card, &cfg, T).await.unwrap();
        assert_eq!(
            s.opened, 2,
            "{b}: the notebook host (its two held-idle processes together) and the quiet cluster"
        );
        deliver(store.as_ref(), &cfg, T).await;
        let history = store::alerts::slack_history(store.db(), 10).await.unwrap();
        assert_eq!(
            history.len(),
            1,
            "{b}: one message for the notebook host; the snoozed cluster said nothing"
        );
        assert!(
            history
                .iter()
                .all(|m| m.route == "team:research" && m.event == "opened"),
            "{b}: {history:?}"
        );
        let posts = rx.posts.lock().unwrap().clone();
        assert!(
            posts[0]["text"]
                .as_str()
                .unwrap()
                .starts_with("GPU held idle: nb-c / nb-1"),
            "{}",
            posts[0]["text"]
        );
        assert!(posts[0]["blocks"][1]["fields"][5]["text"]
            .as_str()
            .unwrap()
            .contains("team=research"));
        // One message for the host, each GPU with the process holding it and who runs it.
        assert_eq!(
            posts[0]["blocks"][2]["text"]["text"],
            "*Which GPUs:*\n• nb-1 GPU #0: pid 100 jupyter, user ana, team=research\n\
             • nb-1 GPU #1: pid 101 jupyter, user ana, team=research",
            "{b}"
        );

        // The snooze ends: the still-idle cluster is announced.
        evaluate(store.as_ref(), &card, &cfg, T + 2 * MIN)
            .await
            .unwrap();
        let history = store::alerts::slack_history(store.db(), 10).await.unwrap();
        assert!(
            history
                .iter()
                .any(|m| m.route == "default" && m.event == "opened"),
            "{b}: {history:?}"
        );
    }
}

/// An idle cluster whose agents go silent is not "resolved": the message says it stopped
/// reporting, and no longer shows what it burns.
#[tokio::test]
async fn a_cluster_that_stops_reporting_is_said_so_not_resolved() {
    for db in test_support::both().await {
        let store = db.open().await;
        let b = db.backend;
        agent_token(store.as_ref()).await;
        let (rx, url) = receiver().await;
        let cfg = config(&url, Duration::from_secs(3600));
        let card = RateCard::default_card();
        windows(
            store.as_ref(),
            "gone-c",
            "gone-1",
            T - 45 * MIN,
            T,
            0.0,
            None,
        )
        .await;
        let s = evaluate(store.as_ref(), &card, &cfg, T).await.unwrap();
        assert_eq!(s.opened, 1, "{b}");
        deliver(store.as_ref(), &cfg, T).await;
        // Ten minutes without a window.
        let s = evaluate(store.as_ref(), &card, &cfg, T + 10 * MIN)
            .await
            .unwrap();
        assert_eq!(s.resolved, 1, "{b}");
        deliver(store.as_ref(), &cfg, T + 10 * MIN).await;
        let posts = rx.posts.lock().unwrap().clone();
        assert_eq!(posts.len(), 2, "{b}");
        let last = &posts[1];
        assert!(
            last["text"]
                .as_str()
                .unwrap()
                .starts_with("Stopped reporting: Idle cluster gone-c"),
            "{b}: {}",
            last["text"]
        );
        assert!(!last.to_string().contains("Burning"), "{b}: {last}");
        let history = store::alerts::slack_history(store.db(), 10).await.unwrap();
        assert!(
            history.iter().any(|m| m.event == "stopped_reporting"),
            "{b}"
        );
    }
}

/// One ledger: an incident's dollars are the ledger's idle dollars of its GPUs for every hour
/// rolled up, and the current price only for the hour under way; once resolved and rolled up
/// it carries exactly what the idle history holds for the same GPUs and hours.
#[tokio::test]
async fn an_incident_carries_the_ledgers_idle_dollars_of_its_gpu_hours() {
    for db in test_support::both().await {
        let store = db.open().await;
        let b = db.backend;
        agent_token(store.as_ref()).await;
        let cfg = Config::default();
        let card = RateCard::default_card();
        for host in ["idle-1", "idle-2"] {
            let (from, to) = (T - 3 * 60 * MIN, T + 15 * MIN);
            windows(store.as_ref(), "idle-c", host, from, to, 0.0, None).await;
        }
        test_support::roll_up(store.as_ref()).await;

        // Open: three whole hours from the ledger, the quarter hour under way at the price.
        evaluate(store.as_ref(), &card, &cfg, T + 15 * MIN)
            .await
            .unwrap();
        let i = store::alerts::open_incidents(store.db())
            .await
            .unwrap()
            .remove(0);
        assert_eq!(i.started_ms, T - 3 * 60 * MIN, "{b}");
        let per_hour = from_text(&i.cost_per_hour);
        let ledger = |to: i64| {
            let store = store.clone();
            async move {
                crate::idle_history::load(store.as_ref(), T - 3 * 60 * MIN, to)
                    .await
                    .unwrap()
                    .iter()
                    .filter(|e| e.cluster == "idle-c")
                    .map(|e| e.cost)
                    .sum::<Decimal>()
            }
        };
        let whole_hours = ledger(T).await;
        assert_eq!(whole_hours, d("196.6356"), "{b}: 2 idle p4d hosts × 3 h");
        assert_eq!(
            from_text(&i.wasted),
            whole_hours + wasted(per_hour, T, T + 15 * MIN),
            "{b}"
        );

        // Busy again: resolved. Once its last hour is rolled up, its dollars are the ledger's.
        for host in ["idle-1", "idle-2"] {
            let (from, to) = (T + 15 * MIN, T + 18 * MIN);
            windows(store.as_ref(), "idle-c", host, from, to, 70.0, None).await;
        }
        let s = evaluate(store.as_ref(), &card, &cfg, T + 18 * MIN)
            .await
            .unwrap();
        assert_eq!(s.resolved, 1, "{b}");
        test_support::roll_up(store.as_ref()).await;
        evaluate(store.as_ref(), &card, &cfg, T + 65 * MIN)
            .await
            .unwrap();
        let settled = store::alerts::incident(store.db(), i.id)
            .await
            .unwrap()
            .unwrap();
        let all_hours = ledger(T + 60 * MIN).await;
        assert_eq!(all_hours, d("213.0219"), "{b}: 3 h and the idle quarter");
        assert_eq!(from_text(&settled.wasted), all_hours, "{b}");
    }
}

/// A cluster billed in euros alerts in euros: its price and its dollars come from the same
/// currency's ledger rows, stored with the incident on both backends.
#[tokio::test]
async fn an_incident_is_in_its_clusters_currency() {
    for db in test_support::both().await {
        let store = db.open().await;
        let b = db.backend;
        agent_token(store.as_ref()).await;
        let cfg = Config::default();
        let card = RateCard {
            currency: "EUR".into(),
            ..RateCard::default_card()
        };
        windows(
            store.as_ref(),
            "eu-c",
            "idle-eu",
            T - 2 * 60 * MIN,
            T + 15 * MIN,
            0.0,
            None,
        )
        .await;
        crate::rollup::run(store.as_ref(), &card, &Default::default(), usize::MAX)
            .await
            .unwrap();
        evaluate(store.as_ref(), &card, &cfg, T + 15 * MIN)
            .await
            .unwrap();
        let i = store::alerts::open_incidents(store.db())
            .await
            .unwrap()
            .remove(0);
        assert_eq!(i.currency, "EUR", "{b}");
        let episodes = crate::idle_history::load(store.as_ref(), T - 2 * 60 * MIN, T)
            .await
            .unwrap();
        assert!(episodes.iter().all(|e| e.currency == "EUR"), "{b}");
        let whole_hours: Decimal = episodes.iter().map(|e| e.cost).sum();
        assert!(whole_hours > Decimal::ZERO, "{b}");
        assert_eq!(
            from_text(&i.wasted),
            whole_hours + wasted(from_text(&i.cost_per_hour), T, T + 15 * MIN),
            "{b}"
        );
    }
}

/// Minute windows over `[from, to)` of two A100s, GPU 0 at work and GPU 1 lost (no readings,
/// the agent's fault), or both at work with `lost` false.
async fn one_lost(store: &dyn Store, from: i64, to: i64, lost: bool) {
    let mut t = from;
    while t < to {
        let gpu = |g: u32| GpuWindow {
            uuid: format!("GPU-f-{g}"),
            index: g,
            name: "NVIDIA A100-SXM4-40GB".into(),
            memory_total_bytes: Some(40 << 30),
            util_avg: Some(80.0),
            util_max: Some(80.0),
            ..Default::default()
        };
        let mut second = gpu(1);
        if lost {
            second.util_avg = None;
            second.util_max = None;
            second.fault = Some(gpuledger_proto::DeviceFault {
                code: "gpu_lost".into(),
                detail: "the GPU is lost after XID 79: the GPU has fallen off the bus; the GPU needs a reset".into(),
            });
        }
        let report = Report {
            batch_id: format!("f-{t}-{lost}"),
            agent_version: "test".into(),
            host: HostInfo {
                hostname: "f-1".into(),
                cluster: "fault-c".into(),
                instance_type: Some("p4d.24xlarge".into()),
                ..Default::default()
            },
            windows: vec![Window {
                serving: Vec::new(),
                start_ms: t,
                end_ms: t + MIN,
                samples: 60,
                gpus: vec![gpu(0), second],
            }],
        };
        store
            .ingest(&report, 1, AgentStatus::default(), t)
            .await
            .unwrap();
        t += MIN;
    }
}

/// A GPU that fell off the bus is a "GPU fault" incident once it has been unreadable for five
/// minutes: its message names the GPU with what the driver reported and says what to do, its
/// dollars are its idle dollars; when it reads again the incident resolves.
#[tokio::test]
async fn a_lost_gpu_is_a_fault_incident_naming_what_the_driver_said() {
    for db in test_support::both().await {
        let store = db.open().await;
        let b = db.backend;
        agent_token(store.as_ref()).await;
        let (rx, url) = receiver().await;
        let cfg = config(&url, Duration::from_secs(3600));
        let card = RateCard::default_card();
        one_lost(store.as_ref(), T - 4 * MIN, T, true).await;
        let s = evaluate(store.as_ref(), &card, &cfg, T).await.unwrap();
        assert_eq!(s.opened, 0, "{b}: four minutes is not yet a fault");
        one_lost(store.as_ref(), T, T + 2 * MIN, true).await;
        let s = evaluate(store.as_ref(), &card, &cfg, T + 2 * MIN)
            .await
            .unwrap();
        assert_eq!(s.opened, 1, "{b}");
        let open = store::alerts::open_incidents(store.db()).await.unwrap();
        assert_eq!(
            (open[0].kind.as_str(), open[0].gpus_json.as_str()),
            ("gpu_fault", r#"["GPU-f-1"]"#),
            "{b}"
        );
        assert!(from_text(&open[0].cost_per_hour) > Decimal::ZERO, "{b}");
        deliver(store.as_ref(), &cfg, T + 2 * MIN).await;
        let posts = rx.posts.lock().unwrap().clone();
        assert!(
            posts[0]["text"]
                .as_str()
                .unwrap()
                .starts_with("GPU fault: fault-c / f-1"),
            "{}",
            posts[0]["text"]
        );
        assert_eq!(
            posts[0]["blocks"][2]["text"]["text"],
            "*Which GPUs:*\n• f-1 GPU #1: the GPU is lost after XID 79: the GPU has fallen off the bus; the GPU needs a reset",
            "{b}"
        );
        assert!(
            posts[0]["blocks"][3]["text"]["text"]
                .as_str()
                .unwrap()
                .contains("Reset the GPU"),
            "{b}: {}",
            posts[0]["blocks"][3]
        );

        // Reset: it reads again, and the incident resolves.
        one_lost(store.as_ref(), T + 2 * MIN, T + 4 * MIN, false).await;
        let s = evaluate(store.as_ref(), &card, &cfg, T + 4 * MIN)
            .await
            .unwrap();
        assert_eq!(s.resolved, 1, "{b}");
    }
}
