//! Slack app mode over HTTP: `POST /slack/commands` (the `/gpuledger` slash command) and
//! `POST /slack/interactions` (buttons on idle alerts). Each request must carry Slack's
//! signature made with the app's signing secret ([`crate::slack_app::verify`]); a request
//! without it is refused (401) and logged. Without `[slack.app]` in the config, neither is there.

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;
use utoipa_axum::{router::OpenApiRouter, routes};

use super::AppState;
use crate::config::SlackAppConfig;
use crate::slack_app;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(command))
        .routes(routes!(interaction))
}

fn plain(status: StatusCode, text: &str) -> Response {
    (status, text.to_owned()).into_response()
}

/// The app's settings and a verified body, or the answer that refuses the request.
fn signed<'a>(
    state: &'a AppState,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<&'a SlackAppConfig, (StatusCode, String)> {
    let Some(app) = &state.config.slack.app else {
        return Err((
            StatusCode::NOT_FOUND,
            "Slack app mode is not set up on this server ([slack.app] in its config).".to_owned(),
        ));
    };
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    slack_app::verify(
        &app.signing_secret.0,
        header("x-slack-request-timestamp"),
        header("x-slack-signature"),
        body,
        crate::clock::now_ms(),
    )
    .map_err(|why| {
        tracing::warn!(reason = %why, "refused a request signed as from Slack");
        (
            StatusCode::UNAUTHORIZED,
            format!("Not signed by Slack: {why}."),
        )
    })?;
    Ok(app)
}

/// What Slack posts for a slash command (form-encoded; the fields read here, of the many it
/// sends).
#[derive(Debug, Default, serde::Deserialize, utoipa::ToSchema)]
struct SlashCommand {
    /// What follows `/gpuledger`: `idle [team]`, `cost [team]` or `budget [team]`.
    #[serde(default)]
    text: String,
    /// Where a late answer goes (Slack's own URL, valid 30 minutes).
    #[serde(default)]
    response_url: Option<String>,
}

/// What Slack posts when a button is pressed: the `block_actions` payload, as JSON in a form
/// field.
#[derive(Debug, serde::Deserialize, utoipa::ToSchema)]
struct Interaction {
    /// Slack's `block_actions` payload, JSON.
    payload: String,
}

/// A message for Slack to show: only to the asker (`ephemeral`), in Block Kit.
#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
#[allow(dead_code)] // describes the JSON slack_app builds
struct SlackMessage {
    /// `ephemeral`.
    response_type: String,
    /// The message as plain text, for notifications.
    text: String,
    /// Block Kit blocks.
    #[schema(value_type = Option<Vec<Object>>)]
    blocks: Option<Vec<serde_json::Value>>,
}

/// What Slack shows the asker when the database cannot be read: Slack takes only 200s.
fn unavailable(e: impl std::fmt::Display) -> Response {
    tracing::error!(error = %e, "answering Slack");
    Json(json!({
        "response_type": "ephemeral",
        "text": "gpuledger could not read its database just now; try again in a minute."
    }))
    .into_response()
}

#[utoipa::path(
    post,
    path = "/slack/commands",
    operation_id = "slack_command",
    tag = "slack",
    summary = "The /gpuledger slash command",
    description = "What Slack posts when someone types `/gpuledger idle|cost|budget [team]`: \
        answered within Slack's three seconds, or with a note and the answer at the command's \
        response_url after. Only with `[slack.app]` in the config; refused (401, logged) \
        without Slack's signature.",
    request_body(content = SlashCommand, content_type = "application/x-www-form-urlencoded"),
    responses(
        (status = 200, description = "The answer, or a note that it follows; also what Slack \
            shows when the database cannot be read (Slack shows only 200s).", body = SlackMessage),
        (status = 400, description = "Not a form Slack sends.", content_type = "text/plain", body = String),
        (status = 401, description = "Not signed by Slack, or signed too long ago.", content_type = "text/plain", body = String),
        (status = 404, description = "Slack app mode is not set up.", content_type = "text/plain", body = String),
        (status = 413, description = "A body over 2 MB (Slack sends a few KB).", content_type = "text/plain", body = String),
    ),
    security(("slack_signature" = [])),
)]
async fn command(State(state): State<AppState>, headers: HeaderMap, body: Bytes) -> Response {
    let app = match signed(&state, &headers, &body) {
        Ok(app) => app.clone(),
        Err(refused) => return refused.into_response(),
    };
    let Ok(form) = serde_urlencoded::from_bytes::<SlashCommand>(&body) else {
        return plain(StatusCode::BAD_REQUEST, "not a slash command's form");
    };
    let text = form.text;
    let (store, config) = (state.store.clone(), state.config.clone());
    let work = tokio::spawn(async move {
        slack_app::command(store.as_ref(), &config, &text, crate::clock::now_ms()).await
    });
    // A month of a large fleet may take longer than Slack waits: then the answer follows at
    // the command's response_url.
    match slack_app::in_time(work, slack_app::ANSWER_WITHIN).await {
        Ok(slack_app::InTime::Ready(Ok(answer))) => Json(answer).into_response(),
        Ok(slack_app::InTime::Ready(Err(e))) => unavailable(e),
        Ok(slack_app::InTime::Late(work)) => {
            let url = form
                .response_url
                .filter(|u| slack_app::is_response_url(u, &app.response_url_prefix));
            tokio::spawn(async move {
                match (work.await, url) {
                    (Ok(Ok(message)), Some(response_url)) => {
                        slack_app::respond(slack_app::Acted {
                            response_url,
                            message,
                        })
                        .await
                    }
                    (Ok(Err(e)), _) => tracing::error!(error = %e, "answering Slack late"),
                    _ => tracing::warn!("a late Slack answer had nowhere to go"),
                }
            });
            Json(slack_app::answer_follows()).into_response()
        }
        Err(e) => unavailable(e),
    }
}

#[utoipa::path(
    post,
    path = "/slack/interactions",
    operation_id = "slack_interaction",
    tag = "slack",
    summary = "Buttons on idle alerts",
    description = "What Slack posts when someone presses a button on an idle alert (snooze 4h \
        or 1d, \"it's intended\"): acted on, and the alert's message updated at the payload's \
        response_url. Only with `[slack.app]` in the config; refused (401, logged) without \
        Slack's signature.",
    request_body(content = Interaction, content_type = "application/x-www-form-urlencoded"),
    responses(
        (status = 200, description = "Acted on: no body. Only when the database cannot be \
            read, a message for Slack to show.", body = SlackMessage),
        (status = 400, description = "No JSON `payload` field.", content_type = "text/plain", body = String),
        (status = 401, description = "Not signed by Slack, or signed too long ago.", content_type = "text/plain", body = String),
        (status = 404, description = "Slack app mode is not set up.", content_type = "text/plain", body = String),
        (status = 413, description = "A body over 2 MB (Slack sends a few KB).", content_type = "text/plain", body = String),
    ),
    security(("slack_signature" = [])),
)]
async fn interaction(State(state): State<AppState>, headers: HeaderMap, body: Bytes) -> Response {
    let app = match signed(&state, &headers, &body) {
        Ok(app) => app,
        Err(refused) => return refused.into_response(),
    };
    let Some(payload) = serde_urlencoded::from_bytes::<Interaction>(&body)
        .ok()
        .and_then(|f| serde_json::from_str::<serde_json::Value>(&f.payload).ok())
    else {
        return plain(StatusCode::BAD_REQUEST, "no JSON `payload` field");
    };
    match slack_app::act(state.store.as_ref(), &payload, crate::clock::now_ms()).await {
        Ok(Some(acted)) => {
            // Only to Slack: a response_url elsewhere is not Slack's to give.
            if slack_app::is_response_url(&acted.response_url, &app.response_url_prefix) {
                // Slack wants the 200 within three seconds; the answer follows it.
                tokio::spawn(slack_app::respond(acted));
            } else {
                tracing::warn!("a Slack button's response_url is not Slack's; not answered");
            }
            StatusCode::OK.into_response()
        }
        Ok(None) => StatusCode::OK.into_response(),
        Err(e) => unavailable(e),
    }
}
