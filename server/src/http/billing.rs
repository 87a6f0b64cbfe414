//! The billing page: what bills are in, with their exact totals, and (for admins) a form to
//! upload a FOCUS export.

use askama::Template;
use axum::extract::{DefaultBodyLimit, Multipart, State};
use axum::http::StatusCode;
use axum::response::Response;
use axum::routing::{get, post};
use axum::Router;

use super::page::{error_page, render_with_status, Chrome};
use super::AppState;
use crate::allocation::rfc3339;
use crate::billing::{self, ImportError};
use crate::now_ms;
use crate::session::{AdminOnly, SignedIn};
use crate::store::BillingImportRow;

pub fn router(max_upload_bytes: usize) -> Router<AppState> {
    Router::new().route("/billing", get(billing_page)).route(
        "/billing/import",
        post(upload).layer(DefaultBodyLimit::max(max_upload_bytes)),
    )
}

pub struct ImportView {
    pub name: String,
    pub source: String,
    pub imported_at: String,
    pub rows: i64,
    pub current_rows: i64,
    pub billed_total: String,
    pub effective_total: String,
}

#[derive(Template)]
#[template(path = "billing.html")]
struct BillingPage {
    chrome: Option<Chrome>,
    is_admin: bool,
    csrf: String,
    imports: Vec<ImportView>,
    notice: Option<String>,
    error: Option<String>,
}

fn view(r: BillingImportRow) -> ImportView {
    ImportView {
        name: r.name,
        source: r.source,
        imported_at: rfc3339(r.imported_ms),
        rows: r.row_count,
        current_rows: r.current_lines,
        billed_total: r.billed_total,
        effective_total: r.effective_total,
    }
}

async fn render(
    state: &AppState,
    user: &SignedIn,
    status: StatusCode,
    notice: Option<String>,
    error: Option<String>,
) -> Response {
    match state.store.billing_imports().await {
        Ok(rows) => render_with_status(
            status,
            &BillingPage {
                chrome: Some(Chrome::from(user)),
                is_admin: user.is_admin(),
                csrf: user.csrf.clone(),
                imports: rows.into_iter().map(view).collect(),
                notice,
                error,
            },
        ),
        Err(e) => {
            tracing::error!(error = %e, "billing page");
            error_page(
                StatusCode::SERVICE_UNAVAILABLE,
                "The database is unavailable",
                "Try again in a minute.",
            )
        }
    }
}

async fn billing_page(State(state): State<AppState>, user: SignedIn) -> Response {
    render(&state, &user, StatusCode::OK, None, None).await
}

async fn upload(
    State(state): State<AppState>,
    AdminOnly(user): AdminOnly,
    mut form: Multipart,
) -> Response {
    let mut csrf = String::new();
    // The file goes to a temporary file as it arrives, so a bill of any size is read from disk
    // in bounded memory.
    let mut file: Option<(String, tempfile::NamedTempFile)> = None;
    loop {
        match form.next_field().await {
            Ok(Some(mut field)) => {
                let name = field.name().unwrap_or("").to_owned();
                let file_name = field.file_name().unwrap_or("upload").to_owned();
                if name == "file" {
                    match spool(&mut field).await {
                        Ok(Some(tmp)) => file = Some((file_name, tmp)),
                        Ok(None) => {}
                        Err(Spool::Upload(e)) => {
                            return render(
                                &state,
                                &user,
                                e.status(),
                                None,
                                Some(format!("The upload failed: {}", e.body_text())),
                            )
                            .await
                        }
                        Err(Spool::Disk(e)) => {
                            tracing::error!(error = %e, "billing upload: writing a temporary file");
                            return error_page(
                                StatusCode::SERVICE_UNAVAILABLE,
                                "The upload could not be kept",
                                "The server could not write a temporary file. Nothing was stored.",
                            );
                        }
                    }
                    continue;
                }
                let bytes = match field.bytes().await {
                    Ok(b) => b,
                    Err(e) => {
                        return render(
                            &state,
                            &user,
                            e.status(),
                            None,
                            Some(format!("The upload failed: {}", e.body_text())),
                        )
                        .await
                    }
                };
                if name == "csrf" {
                    csrf = String::from_utf8_lossy(&bytes).into_owned();
                }
            }
            Ok(None) => break,
            Err(e) => {
                return render(
                    &state,
                    &user,
                    e.status(),
                    None,
                    Some(format!("The upload failed: {}", e.body_text())),
                )
                .await
            }
        }
    }
    if !user.csrf_ok(&csrf) {
        return crate::session::csrf_rejected();
    }
    let Some((name, tmp)) = file else {
        return render(
            &state,
            &user,
            StatusCode::BAD_REQUEST,
            None,
            Some("Choose a FOCUS export to upload.".into()),
        )
        .await;
    };
    match billing::import_focus_file(state.store.as_ref(), tmp.path(), &name, now_ms()).await {
        Ok(s) if s.new => {
            let notice = format!(
                "{name}: imported {} rows (billed {}, effective {}); replaced {} older rows.",
                s.rows, s.billed_total, s.effective_total, s.replaced_lines
            );
            render(&state, &user, StatusCode::OK, Some(notice), None).await
        }
        Ok(_) => {
            render(
                &state,
                &user,
                StatusCode::OK,
                Some(format!("{name} was imported before; nothing changed.")),
                None,
            )
            .await
        }
        Err(ImportError::Focus { error, .. }) => {
            render(
                &state,
                &user,
                StatusCode::UNPROCESSABLE_ENTITY,
                None,
                Some(format!(
                    "{name} was not imported, and nothing of it was stored: {error}"
                )),
            )
            .await
        }
        Err(ImportError::Store(e)) => {
            tracing::error!(error = %e, "billing upload");
            error_page(
                StatusCode::SERVICE_UNAVAILABLE,
                "The database is unavailable",
                "Nothing was stored. Try again in a minute.",
            )
        }
    }
}

enum Spool {
    Upload(axum::extract::multipart::MultipartError),
    Disk(std::io::Error),
}

/// Writes an upload's file field to a temporary file; `None` when the field is empty.
async fn spool(
    field: &mut axum::extract::multipart::Field<'_>,
) -> Result<Option<tempfile::NamedTempFile>, Spool> {
    use tokio::io::AsyncWriteExt;
    let tmp = tempfile::NamedTempFile::new().map_err(Spool::Disk)?;
    let mut out = tokio::fs::File::from_std(tmp.reopen().map_err(Spool::Disk)?);
    let mut len = 0usize;
    while let Some(chunk) = field.chunk().await.map_err(Spool::Upload)? {
        len += chunk.len();
        out.write_all(&chunk).await.map_err(Spool::Disk)?;
    }
    out.flush().await.map_err(Spool::Disk)?;
    Ok((len > 0).then_some(tmp))
}
