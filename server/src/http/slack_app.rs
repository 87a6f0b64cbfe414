//! Slack app mode over HTTP: `POST /slack/commands` (the `/gpuledger` slash command) and
//! `POST /slack/interactions` (buttons on idle alerts). Each request must carry Slack's
//! signature made with the app's signing secret ([`crate::slack_app::verify`]); a request
//! without it is refused (401) and logged. Without `[slack.app]` in the config, neither is there.

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use serde_json::json;

use super::AppState;
use crate::config::SlackAppConfig;
use crate::slack_app;

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/slack/commands", post(command))
        .route("/slack/interactions", post(interaction))
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
        crate::now_ms(),
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

fn field(body: &[u8], name: &str) -> Option<String> {
    form_urlencoded::parse(body)
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.into_owned())
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

async fn command(State(state): State<AppState>, headers: HeaderMap, body: Bytes) -> Response {
    let app = match signed(&state, &headers, &body) {
        Ok(app) => app.clone(),
        Err(refused) => return refused.into_response(),
    };
    let text = field(&body, "text").unwrap_or_default();
    let (store, config) = (state.store.clone(), state.config.clone());
    let work = tokio::spawn(async move {
        slack_app::command(store.as_ref(), &config, &text, crate::now_ms()).await
    });
    // A month of a large fleet may take longer than Slack waits: then the answer follows at
    // the command's response_url.
    match slack_app::in_time(work, slack_app::ANSWER_WITHIN).await {
        Ok(slack_app::InTime::Ready(Ok(answer))) => Json(answer).into_response(),
        Ok(slack_app::InTime::Ready(Err(e))) => unavailable(e),
        Ok(slack_app::InTime::Late(work)) => {
            let url = field(&body, "response_url")
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

async fn interaction(State(state): State<AppState>, headers: HeaderMap, body: Bytes) -> Response {
    let app = match signed(&state, &headers, &body) {
        Ok(app) => app,
        Err(refused) => return refused.into_response(),
    };
    let Some(payload) =
        field(&body, "payload").and_then(|p| serde_json::from_str::<serde_json::Value>(&p).ok())
    else {
        return plain(StatusCode::BAD_REQUEST, "no JSON `payload` field");
    };
    match slack_app::act(state.store.as_ref(), &payload, crate::now_ms()).await {
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
