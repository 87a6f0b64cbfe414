//! The month's review and its drill-downs as pages: each handler asks the application layer
//! ([`crate::app::review`]) and renders what it answers, or says why there is nothing to show.

use std::ops::Deref;

use askama::Template;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;
use serde::Deserialize;
use utoipa_axum::router::OpenApiRouter;

use super::page::{error_page, render, Chrome};
use super::session::{database_unavailable, TeamScoped};
use super::AppState;
// The templates draw with the charts' measures (`charts::AXIS_WIDTH`).
use crate::app::review::charts;
use crate::app::review::{day_and_time, DrillDown, DrillDownError, MonthReview, ReviewError};
use crate::app::Viewer;
use crate::clock::now_ms;
use gpuledger_core::time::month_label;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .route("/review", get(this_review))
        .route("/review/{month}", get(review))
        .route("/review/{month}/{dimension}", get(drill_down))
}

#[derive(Template)]
#[template(path = "review.html")]
struct ReviewPage {
    chrome: Option<Chrome>,
    /// Admins see a button to dismiss each anomaly.
    is_admin: bool,
    csrf: String,
    review: MonthReview,
}

/// The review's fields read as the page's own in the template (`month`, `savings`, …).
impl Deref for ReviewPage {
    type Target = MonthReview;

    fn deref(&self) -> &MonthReview {
        &self.review
    }
}

#[derive(Template)]
#[template(path = "drilldown.html")]
struct DrillDownPage {
    chrome: Option<Chrome>,
    drill: DrillDown,
}

impl Deref for DrillDownPage {
    type Target = DrillDown;

    fn deref(&self) -> &DrillDown {
        &self.drill
    }
}

async fn this_review() -> Redirect {
    Redirect::to(&format!("/review/{}", month_label(now_ms())))
}

/// `GET /review/YYYY-MM`.
async fn review(
    State(state): State<AppState>,
    TeamScoped(user): TeamScoped,
    Path(month): Path<String>,
) -> Response {
    let cx = state.read_context(user.reads.store());
    let viewer = Viewer {
        schema: &state.config.owners,
        scope: &user.scope,
    };
    match MonthReview::load(cx, viewer, &month).await {
        Ok(review) => render(&ReviewPage {
            chrome: Some(Chrome::from(&user)),
            is_admin: user.is_admin(),
            csrf: user.csrf.clone(),
            review,
        })
        .into_response(),
        Err(ReviewError::NoSuchMonth) => no_such_month(),
        Err(ReviewError::NotBegun { from, now }) => not_begun(from, now),
        Err(ReviewError::Unavailable(e)) => database_unavailable("review page", e),
    }
}

#[derive(Deserialize)]
struct KeyQuery {
    key: Option<String>,
}

/// `GET /review/YYYY-MM/DIMENSION?key=…`.
async fn drill_down(
    State(state): State<AppState>,
    TeamScoped(user): TeamScoped,
    Path((month, dimension)): Path<(String, String)>,
    Query(q): Query<KeyQuery>,
) -> Response {
    let cx = state.read_context(user.reads.store());
    let viewer = Viewer {
        schema: &state.config.owners,
        scope: &user.scope,
    };
    match DrillDown::load(cx, viewer, (&month, &dimension), q.key).await {
        Ok(drill) => render(&DrillDownPage {
            chrome: Some(Chrome::from(&user)),
            drill,
        })
        .into_response(),
        Err(DrillDownError::NoSuchMonth) => no_such_month(),
        Err(DrillDownError::NotBegun { from, now }) => not_begun(from, now),
        Err(DrillDownError::NoSuchBreakdown(names)) => error_page(
            StatusCode::NOT_FOUND,
            "No such breakdown",
            &format!("Drill-downs are by {}.", names.join(", ")),
        ),
        Err(DrillDownError::NoKey) => error_page(
            StatusCode::BAD_REQUEST,
            "Which one?",
            "Add ?key=… to the address: the model, team, host or other name to look at.",
        ),
        Err(DrillDownError::NothingOfYourTeams {
            dimension,
            teams,
            month,
        }) => error_page(
            StatusCode::NOT_FOUND,
            "Nothing of your teams here",
            &format!("This {dimension} has no spend of {teams} in {month}."),
        ),
        Err(DrillDownError::Unavailable(e)) => database_unavailable("review page", e),
    }
}

/// A month still to come has no review: no figures, no comparison, no forecast.
fn not_begun(from: i64, now: i64) -> Response {
    error_page(
        StatusCode::NOT_FOUND,
        "This month has not begun",
        &format!(
            "{} begins on {}; its review opens then. The month under way is /review/{}.",
            month_label(from),
            day_and_time(from),
            month_label(now)
        ),
    )
}

fn no_such_month() -> Response {
    error_page(
        StatusCode::NOT_FOUND,
        "No such month",
        "Months are written YYYY-MM, e.g. /review/2026-11.",
    )
}
