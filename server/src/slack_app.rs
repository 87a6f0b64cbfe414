//! Slack app mode: `/gpuledger idle|cost|budget [team]` answered from the ledger and the open
//! incidents, and the buttons on idle alerts (snooze the cluster 4 hours or a day, "it's
//! intended"). Every request is checked against the app's signing secret first, as Slack
//! documents: `v0=` HMAC-SHA256 of `v0:{timestamp}:{body}`, the timestamp within five minutes.

use std::collections::BTreeMap;

use hmac::{Hmac, Mac};
use rust_decimal::Decimal;
use serde_json::{json, Value};
use sha2::Sha256;

use crate::config::Config;
use crate::format::money;
use crate::ledger;
use crate::slack::{clip_escaped, limits};
use crate::store::alerts::IncidentRow;
use crate::store::{RollupGrain, Store, StoreError};
use gpuledger_core::allocation::main_currency;
use gpuledger_core::attribution::Kind;
use gpuledger_core::money::from_text;
use gpuledger_core::owners::Role;
use gpuledger_core::scope::Scope;
use gpuledger_core::time::{month_label, month_of, HOUR_MS};

/// How far a request's timestamp may be from now: Slack's own advice against replays.
pub const SIGNATURE_WINDOW_MS: i64 = 5 * 60 * 1000;

/// Incidents listed in one answer; the rest are counted.
const LISTED: usize = 10;

/// Why a request is not Slack's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("no X-Slack-Request-Timestamp or X-Slack-Signature header")]
    Unsigned,
    #[error(
        "the request's timestamp is more than five minutes from now (a replay, or a clock off)"
    )]
    Stale,
    #[error("the signature is not the app's signing secret's")]
    BadSignature,
}

/// Checks that `body` was signed by Slack with `secret` at `timestamp` (seconds), near `now_ms`.
pub fn verify(
    secret: &str,
    timestamp: Option<&str>,
    signature: Option<&str>,
    body: &[u8],
    now_ms: i64,
) -> Result<(), Refusal> {
    let (Some(timestamp), Some(signature)) = (timestamp, signature) else {
        return Err(Refusal::Unsigned);
    };
    let seconds: i64 = timestamp.trim().parse().map_err(|_| Refusal::Stale)?;
    if now_ms.abs_diff(seconds.saturating_mul(1000)) > SIGNATURE_WINDOW_MS.unsigned_abs() {
        return Err(Refusal::Stale);
    }
    let given = signature
        .strip_prefix("v0=")
        .and_then(|h| hex::decode(h).ok())
        .ok_or(Refusal::BadSignature)?;
    let mut mac =
        Hmac::<Sha256>::new_from_slice(secret.as_bytes()).map_err(|_| Refusal::BadSignature)?;
    mac.update(format!("v0:{timestamp}:").as_bytes());
    mac.update(body);
    // Compared in constant time.
    mac.verify_slice(&given).map_err(|_| Refusal::BadSignature)
}

/// Whether `url` (a request's `response_url`) is under `prefix` (`[slack.app]
/// response_url_prefix`): the same scheme, host and port, and a path below the prefix's. A
/// host that merely starts like Slack's (`hooks.slack.com.example`) is not.
pub fn is_response_url(url: &str, prefix: &str) -> bool {
    let (Ok(url), Ok(prefix)) = (reqwest::Url::parse(url), reqwest::Url::parse(prefix)) else {
        return false;
    };
    url.scheme() == prefix.scheme()
        && url.host_str() == prefix.host_str()
        && url.port_or_known_default() == prefix.port_or_known_default()
        && url.path().starts_with(prefix.path())
}

/// A signature as Slack makes it, for tests and tools that speak as Slack does.
pub fn sign(secret: &str, timestamp: &str, body: &[u8]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes())
        .unwrap_or_else(|_| unreachable!("HMAC takes keys of any length"));
    mac.update(format!("v0:{timestamp}:").as_bytes());
    mac.update(body);
    format!("v0={}", hex::encode(mac.finalize().into_bytes()))
}

/// A message only the asker sees.
fn ephemeral(text: &str, blocks: Vec<Value>) -> Value {
    json!({
        "response_type": "ephemeral",
        "text": clip_escaped(text, limits::FALLBACK),
        "blocks": blocks,
    })
}

/// A one-line answer (nothing found, a name refused).
fn said(text: &str) -> Value {
    ephemeral(text, vec![section(&clip_escaped(text, 500))])
}

fn section(text: &str) -> Value {
    json!({ "type": "section", "text": { "type": "mrkdwn", "text": text } })
}

fn header(text: &str) -> Value {
    json!({ "type": "header", "text": { "type": "plain_text",
        "text": crate::format::clip(text, limits::HEADER) } })
}

const USAGE: &str = "`/gpuledger idle [team]`: GPUs idle now and what they burn\n\
                     `/gpuledger cost [team]`: this month so far, used and idle\n\
                     `/gpuledger budget [team]`: budgets, spent and the month-end forecast";

/// The answer to `/gpuledger <text>` at `now`.
pub async fn command(
    store: &dyn Store,
    config: &Config,
    text: &str,
    now: i64,
) -> Result<Value, StoreError> {
    let mut words = text.split_whitespace();
    let verb = words.next().unwrap_or("help").to_lowercase();
    let team = words.next();
    match verb.as_str() {
        "idle" => idle(store, config, team, now).await,
        "cost" => cost(store, config, team, now).await,
        "budget" | "budgets" => budget(store, config, team, now).await,
        _ => Ok(ephemeral(
            USAGE,
            vec![section(&format!(
                "{}{USAGE}",
                if verb == "help" {
                    String::new()
                } else {
                    format!("I don't know `{}`.\n", clip_escaped(&verb, 100))
                }
            ))],
        )),
    }
}

fn whose(team: Option<&str>) -> String {
    match team {
        Some(t) => format!("team {t}"),
        None => "the fleet".to_owned(),
    }
}

async fn idle(
    store: &dyn Store,
    config: &Config,
    team: Option<&str>,
    now: i64,
) -> Result<Value, StoreError> {
    let mut open: Vec<IncidentRow> = crate::incidents::open(store)
        .await?
        .into_iter()
        .filter(|i| team.is_none_or(|t| crate::incidents::is_teams_alone(i, &config.owners, t)))
        .collect();
    open.sort_by_key(|i| std::cmp::Reverse(from_text(&i.cost_per_hour)));
    let who = whose(team);
    if open.is_empty() {
        let text = format!("Nothing of {who} is idle now.");
        return Ok(said(&text));
    }
    let mut burning: BTreeMap<&str, Decimal> = BTreeMap::new();
    let mut gpus = 0;
    for i in &open {
        *burning.entry(i.currency.as_str()).or_default() += from_text(&i.cost_per_hour);
        gpus += serde_json::from_str::<Vec<String>>(&i.gpus_json)
            .map(|g| g.len())
            .unwrap_or(0);
    }
    let burning_text = burning
        .iter()
        .map(|(c, d)| format!("{}/h", money(*d, c)))
        .collect::<Vec<_>>()
        .join(" + ");
    let summary = format!(
        "{who}: {gpus} GPU{} idle in {} incident{}, burning {burning_text}.",
        if gpus == 1 { "" } else { "s" },
        open.len(),
        if open.len() == 1 { "" } else { "s" },
    );
    let base = config.slack.base_url.trim_end_matches('/');
    let mut blocks = vec![
        header(&format!("Idle now: {who}")),
        section(&clip_escaped(&summary, limits::SECTION_TEXT)),
    ];
    for i in open.iter().take(LISTED) {
        let kind = gpuledger_core::waste::IncidentKind::parse(&i.kind)
            .map_or("Idle GPUs", gpuledger_core::waste::IncidentKind::title);
        let place = match &i.hostname {
            Some(h) => format!("{} / {h}", i.cluster),
            None => i.cluster.clone(),
        };
        let n = serde_json::from_str::<Vec<String>>(&i.gpus_json)
            .map(|g| g.len())
            .unwrap_or(0);
        let since = crate::format::ago(now - i.started_ms);
        let line = format!(
            "*{}*: {}, {n} GPU{} since {}, {}/h",
            clip_escaped(kind, 100),
            clip_escaped(&place, 600),
            if n == 1 { "" } else { "s" },
            since.trim_end_matches(" ago"),
            money(from_text(&i.cost_per_hour), &i.currency),
        );
        blocks.push(json!({
            "type": "section",
            "text": { "type": "mrkdwn", "text": line },
            "accessory": { "type": "button", "text": { "type": "plain_text", "text": "Open" },
                "url": format!("{base}/incidents/{}", i.id) }
        }));
    }
    if open.len() > LISTED {
        blocks.push(json!({ "type": "context", "elements": [{ "type": "mrkdwn",
            "text": format!("and {} more on <{base}/incidents|the Idle page>", open.len() - LISTED) }] }));
    }
    Ok(ephemeral(&summary, blocks))
}

async fn cost(
    store: &dyn Store,
    config: &Config,
    team: Option<&str>,
    now: i64,
) -> Result<Value, StoreError> {
    let (from, _) = month_of(now);
    let month = ledger::load(store, from, now, RollupGrain::Day).await?;
    let scope = match team {
        Some(t) => match Scope::teams([t]) {
            Ok(s) => s,
            Err(e) => {
                let text = format!("{e}");
                return Ok(said(&text));
            }
        },
        None => Scope::all(),
    };
    let month = scope.restrict(month, &config.owners);
    let currency = main_currency(&month);
    let mut by_kind: BTreeMap<&str, Decimal> = BTreeMap::new();
    let mut by_model: BTreeMap<String, Decimal> = BTreeMap::new();
    let model = config.owners.role(Role::Model);
    for p in month.parts.iter().filter(|p| p.currency == currency) {
        *by_kind.entry(p.kind.as_str()).or_default() += p.cost;
        if p.kind == Kind::Used {
            let m = model.and_then(|m| p.owner.get(m)).unwrap_or("(unlabeled)");
            *by_model.entry(m.to_owned()).or_default() += p.cost;
        }
    }
    let outside: Decimal = month
        .unattributed
        .get(&currency)
        .copied()
        .unwrap_or_default();
    let total: Decimal = by_kind.values().copied().sum::<Decimal>() + outside;
    let who = whose(team);
    let label = month_label(now);
    if total.is_zero() {
        let text = format!("Nothing of {who} in the ledger for {label} yet.");
        return Ok(said(&text));
    }
    let of = |k: Kind| by_kind.get(k.as_str()).copied().unwrap_or_default();
    let summary = format!(
        "{who}, {label} so far: {} ({} used, {} held idle, {} idle, {} unwatched).",
        money(total, &currency),
        money(of(Kind::Used), &currency),
        money(of(Kind::HeldIdle), &currency),
        money(of(Kind::Idle), &currency),
        money(of(Kind::Unmonitored), &currency),
    );
    let mut models: Vec<(String, Decimal)> = by_model.into_iter().collect();
    models.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    let top = models
        .iter()
        .take(5)
        .map(|(m, d)| format!("• {}: {}", clip_escaped(m, 200), money(*d, &currency)))
        .collect::<Vec<_>>()
        .join("\n");
    let field = |label: &str, d: Decimal| json!({ "type": "mrkdwn", "text": format!("*{label}*\n{}", money(d, &currency)) });
    let mut blocks = vec![
        header(&format!("Cost {label}: {who}")),
        json!({ "type": "section", "fields": [
            field("So far", total),
            field("Used", of(Kind::Used)),
            field("Held idle", of(Kind::HeldIdle)),
            field("Idle", of(Kind::Idle)),
        ] }),
    ];
    if !top.is_empty() {
        blocks.push(section(&clip_escaped(
            &format!("Most used by model:\n{top}"),
            limits::SECTION_TEXT,
        )));
    }
    let base = config.slack.base_url.trim_end_matches('/');
    blocks.push(json!({ "type": "context", "elements": [{ "type": "mrkdwn",
        "text": format!("From the hourly ledger, up to the last hour rolled up. <{base}/review/{label}|The month's review>") }] }));
    Ok(ephemeral(&summary, blocks))
}

async fn budget(
    store: &dyn Store,
    config: &Config,
    team: Option<&str>,
    now: i64,
) -> Result<Value, StoreError> {
    let schema = &config.owners;
    let team_dimension = schema.role(Role::Team).unwrap_or("team");
    let all = crate::budgets::for_month(store, (schema, &Scope::all()), month_of(now), now).await?;
    let shown: Vec<_> = all
        .iter()
        .filter(|b| team.is_none_or(|t| b.dimension == team_dimension && b.key == t))
        .collect();
    let who = whose(team);
    let label = month_label(now);
    if shown.is_empty() {
        let text = format!("No budget for {who} in {label}.");
        return Ok(said(&text));
    }
    let lines: Vec<String> = shown
        .iter()
        .take(LISTED)
        .map(|b| {
            let standing = match b.standing {
                gpuledger_core::budget::Standing::Over => "over",
                gpuledger_core::budget::Standing::AtRisk => "heading over",
                gpuledger_core::budget::Standing::OnTrack => "on track",
                gpuledger_core::budget::Standing::NotBegun => "not begun",
            };
            format!(
                "*{} {}*: {} of {} spent, {} expected by the month's end ({standing})",
                clip_escaped(&b.dimension, 64),
                clip_escaped(&b.key, 200),
                money(b.forecast.spent, &b.currency),
                money(b.amount, &b.currency),
                money(b.forecast.expected, &b.currency),
            )
        })
        .collect();
    let summary = format!("Budgets of {who} in {label}: {}", lines.join("; "));
    let mut blocks = vec![header(&format!("Budgets {label}: {who}"))];
    blocks.extend(
        lines
            .iter()
            .map(|l| section(&crate::format::clip(l, limits::SECTION_TEXT))),
    );
    Ok(ephemeral(&summary, blocks))
}

/// How long a slash command may take before Slack gives up on it (it waits 3 seconds).
pub const ANSWER_WITHIN: std::time::Duration = std::time::Duration::from_millis(2_500);

/// A command's answer in time, or the work still under way.
pub enum InTime<T> {
    Ready(T),
    Late(tokio::task::JoinHandle<T>),
}

/// Waits up to `within` for `work`; past that, hands it back to be answered later (at the
/// command's `response_url`, which Slack keeps open for 30 minutes).
pub async fn in_time<T: Send + 'static>(
    mut work: tokio::task::JoinHandle<T>,
    within: std::time::Duration,
) -> Result<InTime<T>, tokio::task::JoinError> {
    match tokio::time::timeout(within, &mut work).await {
        Ok(done) => done.map(InTime::Ready),
        Err(_) => Ok(InTime::Late(work)),
    }
}

/// What Slack shows at once when the answer comes later.
pub fn answer_follows() -> Value {
    ephemeral(
        "Reading the ledger; the answer follows in a moment.",
        vec![section(
            "Reading the ledger; the answer follows in a moment.",
        )],
    )
}

/// What a button press did: the message to post to its `response_url`.
#[derive(Debug, Clone, PartialEq)]
pub struct Acted {
    pub response_url: String,
    pub message: Value,
}

/// Carries out a button press (`payload` as Slack posts it, `block_actions`) by `user`.
/// `Ok(None)` for anything that is not one of ours.
pub async fn act(
    store: &dyn Store,
    payload: &Value,
    now: i64,
) -> Result<Option<Acted>, StoreError> {
    if payload["type"] != "block_actions" {
        return Ok(None);
    }
    let Some(action) = payload["actions"].get(0) else {
        return Ok(None);
    };
    let Some(id) = action["value"].as_str().and_then(|v| v.parse::<i64>().ok()) else {
        return Ok(None);
    };
    let user = payload["user"]["username"]
        .as_str()
        .or_else(|| payload["user"]["name"].as_str())
        .or_else(|| payload["user"]["id"].as_str())
        .unwrap_or("someone");
    let by = format!("{user} (Slack)");
    let mention = payload["user"]["id"]
        .as_str()
        .map_or_else(|| clip_escaped(user, 100), |id| format!("<@{id}>"));
    let Some(response_url) = payload["response_url"].as_str() else {
        return Ok(None);
    };
    let action_id = action["action_id"].as_str().unwrap_or_default();
    let text = match action_id {
        crate::slack::SNOOZE_4H | crate::slack::SNOOZE_1D => {
            let Some(row) = incident(store, id).await?
            else {
                return Ok(None);
            };
            let (hours, said) = if action_id == crate::slack::SNOOZE_4H {
                (4, "4 hours")
            } else {
                (24, "a day")
            };
            // A longer snooze already set (an admin's week) stays.
            let until = crate::incidents::active_snoozes(store, now)
                .await?
                .into_iter()
                .filter(|s| s.cluster == row.cluster)
                .map(|s| s.until_ms)
                .fold(now + hours * HOUR_MS, i64::max);
            crate::incidents::snooze(store, &row.cluster, until, &by, now).await?;
            format!(
                "{mention} snoozed idle alerts of cluster {} for {said}.",
                clip_escaped(&row.cluster, 400)
            )
        }
        crate::slack::INTENDED => match crate::incidents::mark_intended(store, id, &by, now).await? {
            Some((_, true)) => format!(
                "{mention} says these GPUs are idle on purpose: no more reminders about this incident."
            ),
            Some((_, false)) => "This incident is already over.".to_owned(),
            None => return Ok(None),
        },
        _ => return Ok(None),
    };
    Ok(Some(Acted {
        response_url: response_url.to_owned(),
        message: json!({
            "response_type": "in_channel",
            "replace_original": false,
            "text": text,
        }),
    }))
}

async fn incident(store: &dyn Store, id: i64) -> Result<Option<IncidentRow>, StoreError> {
    Ok(crate::incidents::with_messages(store, id)
        .await?
        .map(|(row, _)| row))
}

/// Posts a button's answer to Slack; failures are logged (the press itself took effect).
pub async fn respond(acted: Acted) {
    let result = crate::slack::client()
        .post(&acted.response_url)
        .json(&acted.message)
        .send()
        .await
        .and_then(|r| r.error_for_status());
    if let Err(e) = result {
        tracing::warn!(error = %e, "answering a Slack button");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_slow_answer_is_handed_back_and_still_arrives() {
        let quick = tokio::spawn(async { 7 });
        let within = std::time::Duration::from_millis(200);
        assert!(matches!(in_time(quick, within).await, Ok(InTime::Ready(7))));
        let slow = tokio::spawn(async {
            tokio::time::sleep(std::time::Duration::from_millis(400)).await;
            8
        });
        match in_time(slow, within).await {
            Ok(InTime::Late(work)) => assert_eq!(work.await.unwrap(), 8),
            _ => panic!("the slow answer came in time"),
        }
        validate_follows();
    }

    fn validate_follows() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("follows.json");
        std::fs::write(&path, answer_follows().to_string()).unwrap();
        crate::slack::assert_block_kit_valid(&[path]);
    }

    #[test]
    fn a_response_url_is_slacks_by_host_not_by_prefix() {
        let slack = "https://hooks.slack.com/";
        assert!(is_response_url(
            "https://hooks.slack.com/actions/T1/2/x",
            slack
        ));
        for other in [
            "https://hooks.slack.com.example.org/actions/x",
            "http://hooks.slack.com/actions/x",
            "https://hooks.slack.com:8443/actions/x",
            "https://evil.example/https://hooks.slack.com/",
            "not a url",
        ] {
            assert!(!is_response_url(other, slack), "{other}");
            assert!(
                !is_response_url(other, "https://hooks.slack.com"),
                "{other}"
            );
        }
    }

    // Slack's documented example ("Verifying requests from Slack"): secret, timestamp, body and
    // the signature it gives; slack_sdk's SignatureVerifier gives the same.
    const SECRET: &str = "8f742231b10e8888abcd99yyyzzz85a5";
    const TIMESTAMP: &str = "1531420618";
    const BODY: &str = "token=xyzz0WbapA4vBCDEFasx0q6G&team_id=T1DC2JH3J&team_domain=testteamnow&channel_id=G8PSS9T3V&channel_name=foobar&user_id=U2CERLKJA&user_name=roadrunner&command=%2Fwebhook-collect&text=&response_url=https%3A%2F%2Fhooks.slack.com%2Fcommands%2FT1DC2JH3J%2F397700885554%2F96rGlfmibIGlgcZRskXaIFfN&trigger_id=398738663015.47445629121.803a0bc887a14d10d2c447fce8b6703c";
    const SIGNATURE: &str = "v0=a2114d57b48eac39b9ad189dd8316235a7b4a8d21a10bd27519666489c69b503";

    #[test]
    fn slacks_own_example_verifies() {
        let at = 1_531_420_618_000;
        assert_eq!(sign(SECRET, TIMESTAMP, BODY.as_bytes()), SIGNATURE);
        assert_eq!(
            verify(
                SECRET,
                Some(TIMESTAMP),
                Some(SIGNATURE),
                BODY.as_bytes(),
                at
            ),
            Ok(())
        );
        // One byte changed, another secret, a stale or missing timestamp: refused.
        let tampered = BODY.replace("roadrunner", "roadrunnex");
        for (secret, ts, sig, body, now, why) in [
            (
                SECRET,
                Some(TIMESTAMP),
                Some(SIGNATURE),
                tampered.as_str(),
                at,
                Refusal::BadSignature,
            ),
            (
                "another",
                Some(TIMESTAMP),
                Some(SIGNATURE),
                BODY,
                at,
                Refusal::BadSignature,
            ),
            (
                SECRET,
                Some(TIMESTAMP),
                Some("v0=zz"),
                BODY,
                at,
                Refusal::BadSignature,
            ),
            (
                SECRET,
                Some(TIMESTAMP),
                Some(SIGNATURE),
                BODY,
                at + 301_000,
                Refusal::Stale,
            ),
            (
                SECRET,
                Some(TIMESTAMP),
                Some(SIGNATURE),
                BODY,
                at - 301_000,
                Refusal::Stale,
            ),
            (
                SECRET,
                Some("soon"),
                Some(SIGNATURE),
                BODY,
                at,
                Refusal::Stale,
            ),
            (SECRET, None, Some(SIGNATURE), BODY, at, Refusal::Unsigned),
            (SECRET, Some(TIMESTAMP), None, BODY, at, Refusal::Unsigned),
        ] {
            assert_eq!(verify(secret, ts, sig, body.as_bytes(), now), Err(why));
        }
        // A timestamp far off either way is stale, not an overflow.
        for ts in ["-9223372036854775", "9223372036854775807"] {
            let refused = verify(SECRET, Some(ts), Some(SIGNATURE), BODY.as_bytes(), at);
            assert_eq!(refused, Err(Refusal::Stale), "{ts}");
        }
        // Within the window either way.
        assert!(verify(
            SECRET,
            Some(TIMESTAMP),
            Some(SIGNATURE),
            BODY.as_bytes(),
            at + 299_000
        )
        .is_ok());
    }
}
