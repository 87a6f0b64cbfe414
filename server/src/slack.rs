//! Slack incoming webhooks: Block Kit messages about incidents, and the sender that drains the
//! outbox, honouring `Retry-After` on 429, retrying 5xx and timeouts with capped backoff, and
//! giving up (recorded, visible on the history page) on other answers.

use std::time::Duration;

use rust_decimal::Decimal;
use serde_json::{json, Value};

use crate::config::Config;
use crate::format::ago;
use crate::format::clip;
use crate::store;
use crate::store::alerts::IncidentRow;
use crate::store::{Store, StoreError};
use gpuledger_core::money::from_text;
use gpuledger_core::waste::IncidentKind;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    Opened,
    Reminder,
    /// The GPUs were seen busy or released.
    Resolved,
    /// The incident's hosts went silent: no longer seen idle, but not seen busy either.
    StoppedReporting,
    Test,
}

impl Event {
    pub fn as_str(self) -> &'static str {
        match self {
            Event::Opened => "opened",
            Event::Reminder => "reminder",
            Event::Resolved => "resolved",
            Event::StoppedReporting => "stopped_reporting",
            Event::Test => "test",
        }
    }
}

/// Slack mrkdwn treats `&`, `<` and `>` as control characters.
pub fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// Slack refuses a whole message when one text is over its limit, so every text is cut to fit.
/// Limits in characters, as Slack documents them for Block Kit.
pub mod limits {
    pub const HEADER: usize = 150;
    pub const SECTION_FIELD: usize = 2_000;
    pub const SECTION_TEXT: usize = 3_000;
    /// The notification fallback: Slack truncates beyond 40,000; a notification needs far less.
    pub const FALLBACK: usize = 3_000;
    /// A button's URL.
    pub const BUTTON_URL: usize = 3_000;
}

/// The Idle page's snooze form with `cluster` chosen, or without a choice where the cluster's
/// name would make the link longer than Slack takes.
fn snooze_link(base_url: &str, cluster: &str) -> String {
    let base = format!("{}/incidents", base_url.trim_end_matches('/'));
    let chosen = format!(
        "{base}?{}#snooze",
        form_urlencoded::Serializer::new(String::new())
            .append_pair("snooze", cluster)
            .finish()
    );
    if chosen.chars().count() <= limits::BUTTON_URL {
        chosen
    } else {
        format!("{base}#snooze")
    }
}

/// `text` escaped for mrkdwn and cut to at most `max` characters, never inside an entity.
pub fn clip_escaped(text: &str, max: usize) -> String {
    let mut out = String::new();
    let mut used = 0;
    let total: usize = text.chars().map(escape_len).sum();
    for c in text.chars() {
        let n = escape_len(c);
        if total > max && used + n > max.saturating_sub(1) {
            out.push('…');
            return out;
        }
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            c => out.push(c),
        }
        used += n;
    }
    out
}

fn escape_len(c: char) -> usize {
    match c {
        '&' => 5,
        '<' | '>' => 4,
        _ => 1,
    }
}

/// `1 GPU`, `8 GPUs`.
fn gpu_count(n: usize) -> String {
    if n == 1 {
        "1 GPU".to_owned()
    } else {
        format!("{n} GPUs")
    }
}

/// What to do about an incident, in a sentence: the suggested action its message carries.
pub fn suggestion(kind: Option<IncidentKind>, event: Event) -> &'static str {
    match (event, kind) {
        (Event::Resolved, Some(IncidentKind::GpuFault)) => "Nothing: the GPUs read again.",
        (Event::Resolved, _) => "Nothing: the GPUs are busy or released.",
        (Event::StoppedReporting, _) => {
            "Check the agents on these hosts (`gpuledger-agent once` prints what one reads): \
             while they are silent the GPUs' cost is unmonitored."
        }
        (_, Some(IncidentKind::ClusterIdle)) => {
            "Scale the cluster down or release its instances; if the capacity is kept idle on \
             purpose, snooze the cluster on the Idle page."
        }
        (_, Some(IncidentKind::HostIdle)) => {
            "Stop or release the host, or schedule work on it; snooze the cluster on the Idle page \
             if it is kept on purpose."
        }
        (_, Some(IncidentKind::HeldIdle)) => {
            "Ask the owner to stop the idle processes (a notebook kernel, a stuck job) so the GPUs \
             are free, or release them."
        }
        (_, Some(IncidentKind::GpuFault)) => {
            "Reset the GPU (`nvidia-smi -r`, with nothing running on it) or reboot the host; the \
             fault says what the driver reported. Until it reads again its cost counts as idle."
        }
        _ => "Pack the work onto fewer GPUs or move to a smaller instance.",
    }
}

/// The message for an incident event: `text` is the notification fallback, `blocks` the layout.
/// Buttons answered by the Slack app ([`crate::slack_app`]), each carrying the incident's id.
pub const SNOOZE_4H: &str = "snooze_4h";
pub const SNOOZE_1D: &str = "snooze_1d";
pub const INTENDED: &str = "intended";

/// An incident's message. With `interactive` (Slack app mode), an open incident's message also
/// has buttons to snooze its cluster for 4 hours or a day, and to say it is idle on purpose.
pub fn incident_message(
    i: &IncidentRow,
    event: Event,
    base_url: &str,
    now_ms: i64,
    interactive: bool,
) -> Value {
    let kind = IncidentKind::parse(&i.kind).map_or("Idle GPUs", IncidentKind::title);
    let gpus: Vec<String> = serde_json::from_str(&i.gpus_json).unwrap_or_default();
    let owners: std::collections::BTreeMap<String, String> =
        serde_json::from_str(&i.owners_json).unwrap_or_default();
    let owners_text = if owners.is_empty() {
        "nobody (no process)".to_owned()
    } else {
        owners
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let place = match &i.hostname {
        Some(h) => format!("{} / {}", i.cluster, h),
        None => i.cluster.clone(),
    };
    let end = i.ended_ms.unwrap_or(now_ms);
    let idle_for = ago(end - i.started_ms).trim_end_matches(" ago").to_owned();
    // In the incident's own currency: the bill's of its hosts, or the rate card's.
    let dollars = |d: Decimal| crate::format::money(d, &i.currency);
    let per_hour = from_text(&i.cost_per_hour);
    let wasted = from_text(&i.wasted);
    let est = if i.estimated != 0 { " (estimated)" } else { "" };
    let link = format!("{}/incidents/{}", base_url.trim_end_matches('/'), i.id);
    let (headline, text) = match event {
        Event::Resolved => (
            format!("Resolved: {kind} {place}"),
            if IncidentKind::parse(&i.kind) == Some(IncidentKind::GpuFault) {
                format!("Resolved: {kind} {place}: the GPUs read again after {idle_for}; {} idle while they could not{est}.", dollars(wasted))
            } else {
                format!("Resolved: {kind} {place}: the GPUs are busy or released after {idle_for} idle; {} wasted{est}.", dollars(wasted))
            },
        ),
        Event::StoppedReporting => (
            format!("Stopped reporting: {kind} {place}"),
            format!("Stopped reporting: {kind} {place}: its agents have sent nothing for {} minutes, so it is no longer seen idle (nor busy). {} wasted while it was seen idle for {idle_for}{est}. Check the agents.", gpuledger_core::waste::STALE_AFTER_MS / 60_000, dollars(wasted)),
        ),
        Event::Reminder => (
            format!("Still idle: {kind} {place}"),
            format!("Still idle: {kind} {place}, {} for {idle_for}, burning {}/h; {} wasted so far{est}.", gpu_count(gpus.len()), dollars(per_hour), dollars(wasted)),
        ),
        _ => (
            format!("{kind}: {place}"),
            format!("{kind}: {place}, {} idle for {idle_for}, burning {}/h; {} wasted so far{est}.", gpu_count(gpus.len()), dollars(per_hour), dollars(wasted)),
        ),
    };
    let mut buttons = vec![
        json!({ "type": "button", "text": { "type": "plain_text", "text": "Open incident" }, "url": link }),
    ];
    let open = matches!(event, Event::Opened | Event::Reminder | Event::Test);
    if interactive && open {
        let id = i.id.to_string();
        buttons.extend([
            json!({ "type": "button", "action_id": SNOOZE_4H, "value": id,
                    "text": { "type": "plain_text", "text": "Snooze 4h" } }),
            json!({ "type": "button", "action_id": SNOOZE_1D, "value": id,
                    "text": { "type": "plain_text", "text": "Snooze 1 day" } }),
            json!({ "type": "button", "action_id": INTENDED, "value": id,
                    "text": { "type": "plain_text", "text": "It's intended" },
                    "confirm": {
                        "title": { "type": "plain_text", "text": "Idle on purpose?" },
                        "text": { "type": "mrkdwn", "text": "No more reminders about this incident. It stays on the Idle page, marked with your name." },
                        "confirm": { "type": "plain_text", "text": "It's intended" },
                        "deny": { "type": "plain_text", "text": "Cancel" }
                    } }),
        ]);
    } else {
        buttons.push(json!({ "type": "button", "text": { "type": "plain_text", "text": "Snooze the cluster" },
                             "url": snooze_link(base_url, &i.cluster) }));
    }
    // A field's label takes a few characters of its limit.
    let field = |label: &str, value: &str| {
        let head = format!("*{label}*\n");
        let room = limits::SECTION_FIELD - head.chars().count();
        format!("{head}{}", clip_escaped(value, room))
    };
    json!({
        "text": clip_escaped(&text, limits::FALLBACK),
        "blocks": [
            { "type": "header", "text": { "type": "plain_text", "text": clip(&headline, limits::HEADER) } },
            { "type": "section", "fields": [
                { "type": "mrkdwn", "text": field("Where", &place) },
                { "type": "mrkdwn", "text": field("GPUs", &gpus.len().to_string()) },
                { "type": "mrkdwn", "text": field("Idle for", &idle_for) },
                { "type": "mrkdwn", "text": match event {
                    // Over: nothing burns any more.
                    Event::Resolved | Event::StoppedReporting => field("Ended", &event.as_str().replace('_', " ")),
                    _ => field("Burning", &format!("{}/h{est}", dollars(per_hour))),
                } },
                { "type": "mrkdwn", "text": field("Wasted", &dollars(wasted)) },
                { "type": "mrkdwn", "text": field("Owners", &owners_text) }
            ]},
            { "type": "section", "text": { "type": "mrkdwn", "text": devices_section(&i.devices_json) } },
            { "type": "section", "text": { "type": "mrkdwn", "text": clip_escaped(
                &format!("*Suggested:* {}", suggestion(IncidentKind::parse(&i.kind), event)),
                limits::SECTION_TEXT,
            ) } },
            { "type": "actions", "elements": buttons }
        ]
    })
}

/// Lines of a message's GPU list before the rest is counted instead of listed.
const DEVICE_LINES: usize = 12;

/// The incident's GPUs, one line per host or held process, within a section's limit.
fn devices_section(devices_json: &str) -> String {
    let devices: Vec<gpuledger_core::waste::IdleDevice> =
        serde_json::from_str(devices_json).unwrap_or_default();
    let lines = gpuledger_core::waste::describe_devices(&devices);
    if lines.is_empty() {
        return "*Which GPUs:* see the incident page.".into();
    }
    let mut shown: Vec<String> = lines
        .iter()
        .take(DEVICE_LINES)
        .map(|l| format!("• {l}"))
        .collect();
    if lines.len() > DEVICE_LINES {
        shown.push(format!(
            "…and {} more on the incident page",
            lines.len() - DEVICE_LINES
        ));
    }
    clip_escaped(
        &format!("*Which GPUs:*\n{}", shown.join("\n")),
        limits::SECTION_TEXT,
    )
}

/// A budget reaching a threshold: what is spent (or forecast) against it, and where to look.
pub fn budget_message(
    b: &gpuledger_core::budget::Budget,
    f: &gpuledger_core::budget::Forecast,
    basis: gpuledger_core::budget::Basis,
    percent: u32,
    month: &str,
    base_url: &str,
) -> Value {
    use gpuledger_core::budget::Basis;
    let m = |d: Decimal| crate::format::money(d, &b.currency);
    let who = format!("{} {}", b.dimension.replace('_', " "), b.key);
    let headline = match basis {
        Basis::Spent => format!("Budget {percent}% spent: {who}"),
        Basis::Forecast => format!("Budget heading to {percent}%: {who}"),
    };
    let text = format!(
        "{headline} in {month}: {} spent of {}; the month is heading for {} ({} to {}).",
        m(f.spent),
        m(b.amount),
        m(f.expected),
        m(f.low),
        m(f.high)
    );
    let field = |label: &str, value: &str| {
        let head = format!("*{label}*\n");
        let room = limits::SECTION_FIELD - head.chars().count();
        format!("{head}{}", clip_escaped(value, room))
    };
    let link = format!("{}/budgets?month={month}", base_url.trim_end_matches('/'));
    json!({
        "text": clip_escaped(&text, limits::FALLBACK),
        "blocks": [
            { "type": "header", "text": { "type": "plain_text", "text": clip(&headline, limits::HEADER) } },
            { "type": "section", "fields": [
                { "type": "mrkdwn", "text": field("Owner", &who) },
                { "type": "mrkdwn", "text": field("Budget", &format!("{} ({month})", m(b.amount))) },
                { "type": "mrkdwn", "text": field("Spent", &m(f.spent)) },
                { "type": "mrkdwn", "text": field("Forecast", &format!("{} ({} to {})", m(f.expected), m(f.low), m(f.high))) }
            ]},
            { "type": "actions", "elements": [
                { "type": "button", "text": { "type": "plain_text", "text": "Open budgets" },
                  "url": clip(&link, limits::BUTTON_URL) }
            ]}
        ]
    })
}

/// A day (`2026-11-23`) and its weekday, as a message names it.
fn day_name(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .map(|d| d.format("%a %Y-%m-%d").to_string())
        .unwrap_or_default()
}

/// An owner's spend anomaly: what it cost against what that weekday usually costs, and the
/// GPUs, hosts and processes behind it.
pub fn anomaly_message(
    (dimension, key, currency): (&str, &str, &str),
    a: &gpuledger_core::anomaly::Anomaly,
    drivers: &[gpuledger_core::anomaly::Driver],
    base_url: &str,
) -> Value {
    use gpuledger_core::anomaly::AnomalyKind;
    let m = |d: Decimal| crate::format::money(d, currency);
    let who = format!("{} {key}", dimension.replace('_', " "));
    let days = a.days.len() as i64;
    let (headline, text) = match a.kind {
        AnomalyKind::Spike if days == 1 => (
            format!("Spend spike: {who}"),
            format!(
                "{who} spent {} on {}{}, where that weekday usually costs {}: {} more.",
                m(a.actual),
                day_name(a.last_day_ms()),
                if a.days.last().is_some_and(|d| d.partial) {
                    " so far"
                } else {
                    ""
                },
                m(a.expected),
                m(a.excess())
            ),
        ),
        AnomalyKind::Spike => (
            format!("Spend spike: {who}"),
            format!(
                "{who} spent {} over {days} days since {}, where those days usually cost {}: \
                 {} more.",
                m(a.actual),
                day_name(a.start_ms),
                m(a.expected),
                m(a.excess())
            ),
        ),
        AnomalyKind::NewLevel => (
            format!("New spend level: {who}"),
            format!(
                "{who} has spent about {} a day since {}, where those days usually cost {}: \
                 {} more over {days} days.",
                m(a.actual / Decimal::from(days)),
                day_name(a.start_ms),
                m(a.expected / Decimal::from(days)),
                m(a.excess())
            ),
        ),
    };
    let field = |label: &str, value: &str| {
        let head = format!("*{label}*\n");
        let room = limits::SECTION_FIELD - head.chars().count();
        format!("{head}{}", clip_escaped(value, room))
    };
    let lines: Vec<String> = drivers
        .iter()
        .map(|d| format!("• {}", d.label(m)))
        .collect();
    let driven = if lines.is_empty() {
        "No host's cost to it rose on its own: the rise is spread thin.".to_owned()
    } else {
        format!(
            "*Driven by, on {}*\n{}",
            day_name(a.peak_day_ms()),
            lines.join("\n")
        )
    };
    let month = gpuledger_core::time::month_label(a.last_day_ms());
    let link = format!(
        "{}/review/{month}#anomalies",
        base_url.trim_end_matches('/')
    );
    json!({
        "text": clip_escaped(&text, limits::FALLBACK),
        "blocks": [
            { "type": "header", "text": { "type": "plain_text", "text": clip(&headline, limits::HEADER) } },
            { "type": "section", "text": { "type": "mrkdwn", "text": clip_escaped(&text, limits::SECTION_TEXT) } },
            { "type": "section", "fields": [
                { "type": "mrkdwn", "text": field("Owner", &who) },
                { "type": "mrkdwn", "text": field("Since", &day_name(a.start_ms)) },
                { "type": "mrkdwn", "text": field("Expected", &m(a.expected)) },
                { "type": "mrkdwn", "text": field("Actual", &m(a.actual)) }
            ]},
            { "type": "section", "text": { "type": "mrkdwn", "text": clip_escaped(&driven, limits::SECTION_TEXT) } },
            { "type": "actions", "elements": [
                { "type": "button", "text": { "type": "plain_text", "text": "Open the review" },
                  "url": clip(&link, limits::BUTTON_URL) }
            ]}
        ]
    })
}

pub fn test_message(route: &str, base_url: &str) -> Value {
    json!({
        "text": clip_escaped(&format!("gpuledger test message for route {route}"), limits::FALLBACK),
        "blocks": [
            { "type": "section", "text": { "type": "mrkdwn",
              "text": clip_escaped(
                  &format!("This route works: gpuledger at {base_url} will post idle-GPU alerts here."),
                  limits::SECTION_TEXT,
              ) } }
        ]
    })
}

/// After this many failed attempts a message is given up on.
pub const MAX_ATTEMPTS: i64 = 8;
const FIRST_RETRY_MS: i64 = 5_000;
const MAX_RETRY_MS: i64 = 10 * 60_000;

/// What to do after one attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Sent,
    RetryAt(i64),
    Failed(String),
}

/// Classifies Slack's answer: 200 is sent; 429 waits `Retry-After`; 5xx and no answer back off;
/// anything else (400 invalid_payload, 403, 404, 410 channel_is_archived…) will not get better.
pub fn classify(
    status: Option<u16>,
    retry_after_s: Option<i64>,
    body: &str,
    attempts: i64,
    now_ms: i64,
) -> Outcome {
    let backoff = (FIRST_RETRY_MS << (attempts - 1).clamp(0, 16)).min(MAX_RETRY_MS);
    match status {
        Some(200..=299) => Outcome::Sent,
        Some(429) => Outcome::RetryAt(now_ms + retry_after_s.unwrap_or(1).clamp(1, 3600) * 1000),
        Some(s) if s >= 500 || s == 408 => {
            if attempts >= MAX_ATTEMPTS {
                Outcome::Failed(format!(
                    "HTTP {s} {body}; gave up after {attempts} attempts"
                ))
            } else {
                Outcome::RetryAt(now_ms + backoff)
            }
        }
        Some(s) => Outcome::Failed(format!(
            "HTTP {s} {}",
            body.chars().take(200).collect::<String>()
        )),
        None if attempts >= MAX_ATTEMPTS => {
            Outcome::Failed(format!("{body}; gave up after {attempts} attempts"))
        }
        None => Outcome::RetryAt(now_ms + backoff),
    }
}

/// The latest `limit` Slack messages, newest first, whatever their state.
pub async fn history(
    store: &dyn Store,
    limit: i64,
) -> Result<Vec<crate::store::alerts::SlackMessageRow>, StoreError> {
    store::alerts::slack_history(store.db(), limit).await
}

/// Queues a test message to `route`, delivered like any other.
pub async fn send_test(
    store: &dyn Store,
    route: &str,
    base_url: &str,
    now_ms: i64,
) -> Result<(), StoreError> {
    let payload = test_message(route, base_url);
    store::alerts::enqueue_slack(
        store.db(),
        None,
        Event::Test.as_str(),
        route,
        &payload.to_string(),
        now_ms,
    )
    .await?;
    Ok(())
}

/// Sends what is due in the outbox. Returns how many messages were attempted.
pub async fn deliver_due(
    store: &dyn Store,
    config: &Config,
    client: &reqwest::Client,
    now_ms: i64,
) -> Result<usize, StoreError> {
    let due = store::alerts::due_slack_messages(store.db(), now_ms, 50).await?;
    let count = due.len();
    for mut m in due {
        m.attempts += 1;
        let outcome = match config.slack.webhook(&m.route) {
            None => Outcome::Failed(format!("route {:?} is not configured", m.route)),
            Some(url) => {
                let sent = client
                    .post(url)
                    .header(reqwest::header::CONTENT_TYPE, "application/json")
                    .body(m.payload.clone())
                    .send()
                    .await;
                match sent {
                    Ok(resp) => {
                        let status = resp.status().as_u16();
                        let retry_after = resp
                            .headers()
                            .get(reqwest::header::RETRY_AFTER)
                            .and_then(|v| v.to_str().ok())
                            .and_then(|v| v.trim().parse::<i64>().ok());
                        let body = resp.text().await.unwrap_or_default();
                        classify(Some(status), retry_after, body.trim(), m.attempts, now_ms)
                    }
                    // The URL is a secret: say what failed, not where.
                    Err(e) => classify(
                        None,
                        None,
                        &format!("no answer: {}", e.without_url()),
                        m.attempts,
                        now_ms,
                    ),
                }
            }
        };
        match outcome {
            Outcome::Sent => {
                m.status = "sent".into();
                m.sent_ms = Some(now_ms);
                m.last_error = None;
            }
            Outcome::RetryAt(at) => {
                m.next_attempt_ms = at;
                m.last_error = Some("will retry".into());
            }
            Outcome::Failed(why) => {
                tracing::warn!(message = m.id, route = %m.route, reason = %why, "Slack message given up");
                m.status = "failed".into();
                m.last_error = Some(why);
            }
        }
        store::alerts::record_slack_attempt(store.db(), &m).await?;
    }
    Ok(count)
}

pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        // Slack answers where it is asked; a redirect elsewhere is not Slack's.
        .redirect(reqwest::redirect::Policy::none())
        .user_agent(concat!("gpuledger/", env!("CARGO_PKG_VERSION")))
        .build()
        .unwrap_or_default()
}

/// Runs scripts/slack-validate (slack_sdk's Block Kit models and Slack's documented limits) over
/// payload files; panics with what it found.
#[cfg(test)]
pub(crate) fn assert_block_kit_valid(files: &[std::path::PathBuf]) {
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/slack-validate");
    let out = std::process::Command::new(script)
        .args(files)
        .output()
        .unwrap_or_else(|e| {
            panic!("scripts/slack-validate (scripts/python-env makes its venv): {e}")
        });
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[cfg(test)]
mod tests;
