//! Slack app mode over HTTP, on both backends: requests signed as Slack signs them get the
//! team's idle GPUs, cost and budgets; the buttons snooze the cluster or mark the incident
//! intended and answer at the request's `response_url`; unsigned, badly signed and stale
//! requests are refused (401). Every answer passes Block Kit validation (scripts/slack-validate).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::Router;
use serde_json::{json, Value};

use super::scope_tests::two_teams;
use super::tests::{apis_with, Api};
use crate::clock::now_ms;
use crate::config::{Secret, SlackAppConfig};
use crate::slack_app::sign;

const SECRET: &str = "e2a5b7c1d9f04386a1b2c3d4e5f60718";

/// A stand-in for Slack's `response_url`s: what was posted to them.
#[derive(Clone, Default)]
struct Responses(Arc<Mutex<Vec<Value>>>);

async fn take(State(r): State<Responses>, body: String) -> StatusCode {
    r.0.lock()
        .unwrap()
        .push(serde_json::from_str(&body).unwrap());
    StatusCode::OK
}

async fn responses() -> (Responses, String) {
    let r = Responses::default();
    let app = Router::new().fallback(take).with_state(r.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (r, format!("http://{addr}/"))
}

/// POSTs `body` (form-encoded) to `path`, signed with `secret` at `at_s` (seconds) unless
/// `signed` is false.
async fn post(
    api: &Api,
    path: &str,
    body: &str,
    secret: &str,
    at_s: i64,
    signed: bool,
) -> (StatusCode, String) {
    let mut req =
        axum::http::Request::post(path).header("content-type", "application/x-www-form-urlencoded");
    if signed {
        let ts = at_s.to_string();
        req = req
            .header("x-slack-request-timestamp", &ts)
            .header("x-slack-signature", sign(secret, &ts, body.as_bytes()));
    }
    let resp = tower::ServiceExt::oneshot(
        api.app.clone(),
        req.body(axum::body::Body::from(body.to_owned())).unwrap(),
    )
    .await
    .unwrap();
    let status = resp.status();
    let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX)
        .await
        .unwrap();
    (status, String::from_utf8_lossy(&bytes).into_owned())
}

/// A slash command's body, as Slack posts it.
fn command_body(text: &str) -> String {
    form_urlencoded::Serializer::new(String::new())
        .append_pair("token", "gIkuvaNzQIHg97ATvDxqgjtO")
        .append_pair("team_id", "T0001")
        .append_pair("team_domain", "example")
        .append_pair("channel_id", "C2147483705")
        .append_pair("channel_name", "gpu-costs")
        .append_pair("user_id", "U2147483697")
        .append_pair("user_name", "ana")
        .append_pair("command", "/gpuledger")
        .append_pair("text", text)
        .append_pair("api_app_id", "A123456")
        .append_pair("response_url", "https://hooks.slack.com/commands/1234/5678")
        .append_pair("trigger_id", "13345224609.738474920.8088930838d88f008e0")
        .finish()
}

/// A button press's body: `payload=` JSON, as Slack posts `block_actions`.
fn button_body(action_id: &str, incident: i64, response_url: &str) -> String {
    let payload = json!({
        "type": "block_actions",
        "user": { "id": "U2147483697", "username": "ana", "name": "ana", "team_id": "T0001" },
        "api_app_id": "A123456",
        "token": "gIkuvaNzQIHg97ATvDxqgjtO",
        "container": { "type": "message", "message_ts": "1548261231.000200", "channel_id": "C2147483705" },
        "trigger_id": "12321423423.333649436676.d8c1bb837935619ccad0f624c448ffb3",
        "team": { "id": "T0001", "domain": "example" },
        "channel": { "id": "C2147483705", "name": "gpu-costs" },
        "response_url": response_url,
        "actions": [{
            "action_id": action_id,
            "block_id": "incident",
            "text": { "type": "plain_text", "text": "button", "emoji": true },
            "value": incident.to_string(),
            "type": "button",
            "action_ts": "1548426417.840180"
        }]
    });
    form_urlencoded::Serializer::new(String::new())
        .append_pair("payload", &payload.to_string())
        .finish()
}

/// Runs scripts/slack-validate over the answers.
fn validate(answers: &[Value]) {
    let dir = tempfile::tempdir().unwrap();
    let files: Vec<_> = answers
        .iter()
        .enumerate()
        .map(|(n, a)| {
            let p = dir.path().join(format!("answer-{n}.json"));
            std::fs::write(&p, a.to_string()).unwrap();
            p
        })
        .collect();
    crate::slack::assert_block_kit_valid(&files);
}

#[tokio::test]
async fn a_signed_slash_command_answers_with_the_teams_idle_gpus_and_buttons_act() {
    let (answered, prefix) = responses().await;
    let app_prefix = prefix.clone();
    for (api, _db) in apis_with(move |s| {
        let mut config = (*s.config).clone();
        config.slack.app = Some(SlackAppConfig {
            signing_secret: Secret(SECRET.into()),
            response_url_prefix: app_prefix.clone(),
        });
        s.config = Arc::new(config);
    })
    .await
    {
        let b = api.backend;
        let (admin, _) = api.session("admin").await;
        let (alpha_incident, _) = two_teams(&api, &admin).await;
        // Held idle by an alpha and a bravo process: the fleet's, on neither team's list (as
        // neither team's viewer may open it).
        super::scope_tests::incident_on(&api, 0, "alpha, bravo").await;
        let now_s = now_ms() / 1000;
        let ask = |text: &str| command_body(text);

        // Refused: unsigned, signed with another secret, signed ten minutes ago.
        for (secret, at, signed) in [
            (SECRET, now_s, false),
            ("not-the-secret", now_s, true),
            (SECRET, now_s - 600, true),
        ] {
            let (status, body) = post(
                &api,
                "/slack/commands",
                &ask("idle alpha"),
                secret,
                at,
                signed,
            )
            .await;
            assert_eq!(status, StatusCode::UNAUTHORIZED, "{b}: {body}");
            assert!(!body.contains("host-of"), "{b}");
        }

        let mut answers = Vec::new();
        let command = |text: &'static str| {
            let api = &api;
            async move {
                let (status, body) =
                    post(api, "/slack/commands", &ask(text), SECRET, now_s, true).await;
                assert_eq!(status, StatusCode::OK, "{b}: {text}: {body}");
                serde_json::from_str::<Value>(&body).unwrap()
            }
        };
        // Alpha's idle GPUs: its incident, not bravo's, with its cost per hour.
        let idle = command("idle alpha").await;
        let text = idle.to_string();
        assert_eq!(idle["response_type"], "ephemeral", "{b}");
        assert!(text.contains("host-of-alpha"), "{b}: {text}");
        assert!(!text.contains("host-of-bravo"), "{b}: {text}");
        assert!(
            idle["text"]
                .as_str()
                .unwrap()
                .starts_with("team alpha: 1 GPU idle in 1 incident, burning $1.00/h"),
            "{b}: {}",
            idle["text"]
        );
        assert!(
            text.contains(&format!("/incidents/{alpha_incident}")),
            "{b}: {text}"
        );
        answers.push(idle);
        // The fleet: all four.
        let all = command("idle").await;
        assert!(
            all["text"].as_str().unwrap().contains("in 4 incidents"),
            "{b}: {all}"
        );
        answers.push(all);
        // Alpha's month so far: four hours at $10, all used.
        let cost = command("cost alpha").await;
        assert!(
            cost["text"]
                .as_str()
                .unwrap()
                .contains("so far: $40.00 ($40.00 used, $0.00 held idle"),
            "{b}: {cost}"
        );
        answers.push(cost);
        let cost = command("cost bravo").await;
        assert!(
            cost["text"].as_str().unwrap().contains("$4.00 held idle"),
            "{b}: {cost}"
        );
        answers.push(cost);
        // Bravo's budget, and a team without one.
        let budget = command("budget bravo").await;
        let t = budget["text"].as_str().unwrap();
        assert!(
            t.contains("team bravo") && t.contains("of $500.00 spent"),
            "{b}: {t}"
        );
        assert!(!t.contains("alpha"), "{b}: {t}");
        answers.push(budget);
        let none = command("budget charlie").await;
        assert!(
            none["text"]
                .as_str()
                .unwrap()
                .contains("No budget for team charlie"),
            "{b}"
        );
        answers.push(none);
        let help = command("frobnicate <&>").await;
        assert!(
            help.to_string().contains("/gpuledger idle [team]"),
            "{b}: {help}"
        );
        answers.push(help);
        validate(&answers);

        // "Snooze 4h" on alpha's incident: its cluster is snoozed, and Slack hears who did it.
        let before = answered.0.lock().unwrap().len();
        let url = format!("{prefix}actions/1");
        let (status, _) = post(
            &api,
            "/slack/interactions",
            &button_body(crate::slack::SNOOZE_4H, alpha_incident, &url),
            SECRET,
            now_s,
            true,
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{b}");
        let snoozes = crate::incidents::active_snoozes(api.store.as_ref(), now_ms())
            .await
            .unwrap();
        let s = snoozes
            .iter()
            .find(|s| s.cluster == "c")
            .expect("cluster c snoozed");
        assert_eq!(s.by_user, "ana (Slack)", "{b}");
        let hours = (s.until_ms - now_ms()) as f64 / 3_600_000.0;
        assert!((3.9..=4.0).contains(&hours), "{b}: {hours}");
        // "It's intended": marked, and said.
        let (status, _) = post(
            &api,
            "/slack/interactions",
            &button_body(crate::slack::INTENDED, alpha_incident, &url),
            SECRET,
            now_s,
            true,
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{b}");
        let row = crate::incidents::with_messages(api.store.as_ref(), alpha_incident)
            .await
            .unwrap()
            .unwrap()
            .0;
        assert_eq!(row.intended_by.as_deref(), Some("ana (Slack)"), "{b}");
        let (_, page) = api
            .get_as(&format!("/incidents/{alpha_incident}"), Some(&admin))
            .await;
        assert!(
            page.contains("idle on purpose, said ana (Slack)"),
            "{b}: {page}"
        );
        // The answers arrive after the 200, at the response_url.
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while answered.0.lock().unwrap().len() < before + 2 && std::time::Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let said: Vec<String> = answered.0.lock().unwrap()[before..]
            .iter()
            .map(|v| v["text"].as_str().unwrap().to_owned())
            .collect();
        assert_eq!(said.len(), 2, "{b}: {said:?}");
        assert!(
            said.iter()
                .any(|t| t.contains("<@U2147483697> snoozed idle alerts of cluster c for 4 hours")),
            "{b}: {said:?}"
        );
        assert!(
            said.iter().any(|t| t.contains("idle on purpose")),
            "{b}: {said:?}"
        );

        // A press signed wrongly changes nothing; one whose response_url is not Slack's acts
        // but is answered nowhere.
        let (status, _) = post(
            &api,
            "/slack/interactions",
            &button_body(crate::slack::SNOOZE_1D, alpha_incident, &url),
            "not-the-secret",
            now_s,
            true,
        )
        .await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{b}");
        let s = crate::incidents::active_snoozes(api.store.as_ref(), now_ms())
            .await
            .unwrap();
        assert!(
            s.iter().all(|s| s.until_ms - now_ms() < 5 * 3_600_000),
            "{b}"
        );
        let (status, _) = post(
            &api,
            "/slack/interactions",
            &button_body(
                crate::slack::SNOOZE_1D,
                alpha_incident,
                "http://elsewhere.invalid/x",
            ),
            SECRET,
            now_s,
            true,
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{b}");
        // It acted: "Snooze 1 day" holds cluster c's alerts back for a day.
        let s = crate::incidents::active_snoozes(api.store.as_ref(), now_ms())
            .await
            .unwrap();
        let day = s
            .iter()
            .filter(|s| s.cluster == "c")
            .map(|s| (s.until_ms - now_ms()) as f64 / 3_600_000.0)
            .fold(0.0, f64::max);
        assert!((23.9..=24.0).contains(&day), "{b}: {day} hours");
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(answered.0.lock().unwrap().len(), before + 2, "{b}");
    }
}
