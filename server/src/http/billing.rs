//! The billing page: what bills are in, with their exact totals, and (for admins) a form to
//! upload a FOCUS export.

use askama::Template;
use axum::extract::{DefaultBodyLimit, Multipart, State};
use axum::http::StatusCode;
use axum::response::Response;
use axum::routing::{get, post};
use utoipa_axum::router::OpenApiRouter;

use super::page::{error_page, render_with_status, Chrome};
use super::AppState;
use std::collections::HashMap;

use rust_decimal::Decimal;

use super::session::{AdminOnly, SignedIn};
use crate::billing::periods::{periods_of, BillingPeriod};
use crate::billing::{self, BillFile, ImportError};
use crate::store::Replaces;
use crate::{clock::now_ms, format};
use gpuledger_core::money::from_text;
use gpuledger_core::time::month_label;

pub fn router(max_upload_bytes: usize) -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .route("/billing", get(billing_page))
        .route(
            "/billing/import",
            post(upload).layer(DefaultBodyLimit::max(max_upload_bytes)),
        )
}

/// One billing period as the page shows it.
pub struct PeriodView {
    pub title: String,
    pub summary: String,
    pub rows: String,
    pub billed: String,
    pub effective: String,
    pub files: Vec<FileView>,
    /// `/billing/YYYY-MM`: the month against the ledger.
    pub reconcile: String,
}

pub struct FileView {
    pub name: String,
    pub source: String,
    pub imported_at: String,
    pub rows: String,
    pub billed: String,
    pub effective: String,
    pub status: String,
    pub in_force: bool,
}

#[derive(Template)]
#[template(path = "billing.html")]
struct BillingPage {
    chrome: Option<Chrome>,
    is_admin: bool,
    csrf: String,
    periods: Vec<PeriodView>,
    notice: Option<String>,
    error: Option<String>,
    /// Scheduled exports to object storage, latest first (empty when none are set up).
    exports: Vec<ExportView>,
}

/// One period's scheduled export, as the billing page lists it.
struct ExportView {
    period: String,
    done: bool,
    attempts: i64,
    updated: String,
    /// The manifest's key, or the last error.
    detail: String,
    next_try: Option<String>,
}

fn export_views(rows: Vec<crate::store::exports::ExportRow>) -> Vec<ExportView> {
    rows.into_iter()
        .map(|r| {
            let done = r.status == "done";
            ExportView {
                period: crate::exports::label(&r),
                done,
                attempts: r.attempts,
                updated: crate::format::utc_minute(r.updated_ms),
                detail: if done {
                    r.manifest_key.unwrap_or_default()
                } else {
                    r.last_error.unwrap_or_default()
                },
                next_try: (!done).then(|| crate::format::utc_minute(r.next_attempt_ms)),
            }
        })
        .collect()
}

/// `September 2024` for a calendar month's bill; the day for a daily one (Cost Explorer).
fn period_label(start_ms: i64) -> String {
    use chrono::Datelike;
    match chrono::DateTime::from_timestamp_millis(start_ms) {
        Some(d) if d.day() == 1 && d.timestamp() % 86_400 == 0 => d.format("%B %Y").to_string(),
        Some(d) => d.format("%Y-%m-%d").to_string(),
        None => start_ms.to_string(),
    }
}

pub(super) fn views(periods: Vec<BillingPeriod>) -> Vec<PeriodView> {
    let names: HashMap<i64, String> = periods
        .iter()
        .flat_map(|p| p.files.iter().map(|f| (f.import_id, f.name.clone())))
        .collect();
    periods
        .into_iter()
        .map(|p| {
            let money = |d: Decimal| format::money(d, &p.currency);
            let text_money = |t: &Option<String>| {
                t.as_deref()
                    .map_or_else(|| "—".to_owned(), |t| money(from_text(t)))
            };
            let in_force = p.files.iter().filter(|f| f.replaced_ms.is_none()).count();
            let files = p
                .files
                .iter()
                .map(|f| FileView {
                    name: f.name.clone(),
                    source: match &f.delivery {
                        Some(d) => format!("{} (run {d})", f.source),
                        None => f.source.clone(),
                    },
                    imported_at: crate::format::utc_minute(f.imported_ms),
                    rows: format::thousands(f.row_count),
                    billed: text_money(&f.billed_total),
                    effective: text_money(&f.effective_total),
                    status: match (f.replaced_ms, f.replaced_by) {
                        (None, _) => "in force".into(),
                        (Some(at), Some(by)) => format!(
                            "replaced {} by {}",
                            crate::format::utc_minute(at),
                            names
                                .get(&by)
                                .map_or_else(|| format!("import {by}"), Clone::clone)
                        ),
                        (Some(at), None) => format!("replaced {}", crate::format::utc_minute(at)),
                    },
                    in_force: f.replaced_ms.is_none(),
                })
                .collect();
            PeriodView {
                title: format!(
                    "{} · {} · billing account {} · {}",
                    period_label(p.period_start_ms),
                    p.provider,
                    p.billing_account_id,
                    p.currency
                ),
                summary: format!(
                    "{} of {} {} in force: {} rows, billed {}, effective {}.",
                    in_force,
                    p.files.len(),
                    if p.files.len() == 1 { "file" } else { "files" },
                    format::thousands(p.rows),
                    money(p.billed_total),
                    money(p.effective_total)
                ),
                rows: format::thousands(p.rows),
                billed: money(p.billed_total),
                effective: money(p.effective_total),
                reconcile: format!("/billing/{}", month_label(p.period_start_ms)),
                files,
            }
        })
        .collect()
}

async fn render(
    user: &SignedIn,
    status: StatusCode,
    notice: Option<String>,
    error: Option<String>,
) -> Response {
    let read = tokio::try_join!(
        crate::billing::periods::file_rows(user.reads.store()),
        crate::exports::recent(user.reads.store(), 14),
    );
    match read {
        Ok((rows, exports)) => render_with_status(
            status,
            &BillingPage {
                chrome: Some(Chrome::from(user)),
                is_admin: user.is_admin(),
                csrf: user.csrf.clone(),
                periods: views(periods_of(rows)),
                notice,
                error,
                exports: export_views(exports),
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

async fn billing_page(user: SignedIn) -> Response {
    render(&user, StatusCode::OK, None, None).await
}

async fn upload(
    State(state): State<AppState>,
    AdminOnly(user): AdminOnly,
    form: Multipart,
) -> Response {
    let Upload {
        csrf,
        whole_periods,
        files,
        manifest,
    } = match read_upload(form).await {
        Ok(upload) => upload,
        Err(Spool::Upload(e)) => return upload_failed(&user, e).await,
        Err(Spool::Disk(e)) => {
            tracing::error!(error = %e, "billing upload: writing a temporary file");
            return error_page(
                StatusCode::SERVICE_UNAVAILABLE,
                "The upload could not be kept",
                "The server could not write a temporary file. Nothing was stored.",
            );
        }
    };
    // A multipart upload streams its files before the token field can be read, so the check
    // comes after them (no other form is multipart: `AdminForm` checks every other one).
    if !user.csrf_ok(&csrf) {
        return super::session::csrf_rejected();
    }
    if files.is_empty() {
        return render(
            &user,
            StatusCode::BAD_REQUEST,
            None,
            Some("Choose a FOCUS export to upload.".into()),
        )
        .await;
    }
    let what = match files.as_slice() {
        [(name, _)] => format!("{name} was not imported, and nothing of it was stored"),
        _ => format!(
            "None of the {} files was imported; nothing was stored",
            files.len()
        ),
    };
    let refuse = |why: String| {
        render(
            &user,
            StatusCode::UNPROCESSABLE_ENTITY,
            None,
            Some(format!("{what}: {why}")),
        )
    };
    let (delivery, expected, replaces) = match delivery_of(manifest.as_ref(), &files, whole_periods)
    {
        Ok(d) => d,
        Err(why) => return refuse(why).await,
    };
    let bill_files: Vec<BillFile> = files
        .iter()
        .map(|(name, tmp)| BillFile::FocusPath {
            path: tmp.path().to_owned(),
            name: name.clone(),
            expected_rows: expected.get(name).copied().flatten(),
        })
        .collect();
    let imported = billing::import_files(
        state.store.as_ref(),
        replaces,
        delivery,
        bill_files,
        now_ms(),
    )
    .await;
    match imported {
        Ok(summaries) => {
            let notice: Vec<String> = files
                .iter()
                .zip(summaries)
                .map(|((name, _), s)| {
                    if s.new {
                        format!(
                            "{name}: imported {} rows ({}); replaced {} older rows.",
                            s.rows,
                            s.totals_text(),
                            s.replaced_lines
                        )
                    } else {
                        format!("{name} was imported before; nothing changed.")
                    }
                })
                .collect();
            render(&user, StatusCode::OK, Some(notice.join(" ")), None).await
        }
        Err(ImportError::Focus { file, error }) if files.len() > 1 => {
            refuse(what_each_file_has(&files, &expected, (&file, &error.to_string())).await).await
        }
        Err(ImportError::Focus { error, .. }) => refuse(error.to_string()).await,
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

/// What the billing form sent: its token, whether the files are whole periods, the files (each
/// written to a temporary file as it arrived, so a bill of any size is read from disk in bounded
/// memory) and an export run's manifest, by name and text.
struct Upload {
    csrf: String,
    whole_periods: bool,
    files: Vec<(String, tempfile::NamedTempFile)>,
    manifest: Option<(String, String)>,
}

async fn read_upload(mut form: Multipart) -> Result<Upload, Spool> {
    let mut upload = Upload {
        csrf: String::new(),
        whole_periods: false,
        files: Vec::new(),
        manifest: None,
    };
    while let Some(mut field) = form.next_field().await.map_err(Spool::Upload)? {
        let name = field.name().unwrap_or("").to_owned();
        let file_name = field.file_name().unwrap_or("upload").to_owned();
        if name == "file" {
            if let Some(tmp) = spool(&mut field).await? {
                upload.files.push((file_name, tmp));
            }
            continue;
        }
        let bytes = field.bytes().await.map_err(Spool::Upload)?;
        match name.as_str() {
            "csrf" => upload.csrf = String::from_utf8_lossy(&bytes).into_owned(),
            "whole_periods" => upload.whole_periods = !bytes.is_empty(),
            "manifest" if !bytes.is_empty() => {
                upload.manifest = Some((file_name, String::from_utf8_lossy(&bytes).into_owned()))
            }
            _ => {}
        }
    }
    Ok(upload)
}

/// Rows each uploaded file is expected to hold, by name.
type ExpectedRows = std::collections::HashMap<String, Option<u64>>;

/// How the files are imported: with a manifest, exactly the files it lists, one delivery
/// replacing its periods whole, each file holding the rows the manifest says; without one, the
/// files replace what came under the same names (or their periods whole, if asked). Why not,
/// where the files do not match their manifest.
fn delivery_of(
    manifest: Option<&(String, String)>,
    files: &[(String, tempfile::NamedTempFile)],
    whole_periods: bool,
) -> Result<(Option<String>, ExpectedRows, Replaces), String> {
    let Some((manifest_name, text)) = manifest else {
        let replaces = if whole_periods {
            Replaces::WholePeriods
        } else {
            Replaces::SameName
        };
        return Ok((None, Default::default(), replaces));
    };
    let listing = billing::manifest::parse(manifest_name, text)?;
    let listed = listing.file_names();
    if let Some(missing) = listed.iter().find(|l| !files.iter().any(|(n, _)| n == *l)) {
        return Err(format!(
            "{manifest_name} lists {missing}, which was not uploaded: choose every file of the \
             export run together with its manifest"
        ));
    }
    if let Some((extra, _)) = files.iter().find(|(n, _)| !listed.contains(&n.as_str())) {
        return Err(format!("{extra} is not listed in {manifest_name}"));
    }
    let expected = (listed.iter().map(|l| (*l).to_owned()))
        .zip(listing.row_counts.iter().copied())
        .collect();
    Ok((
        Some(listing.delivery.clone()),
        expected,
        Replaces::WholePeriods,
    ))
}

/// What is wrong with each of several files, where their import stopped at the first bad one
/// (`file`, for `error`): every file read again, and those without error named.
async fn what_each_file_has(
    files: &[(String, tempfile::NamedTempFile)],
    expected: &ExpectedRows,
    (file, error): (&str, &str),
) -> String {
    let checked = billing::first_errors(
        (files.iter())
            .map(|(name, tmp)| {
                let rows = expected.get(name).copied().flatten();
                (name.clone(), tmp.path().to_owned(), rows)
            })
            .collect(),
    )
    .await;
    let mut wrong = Vec::new();
    let mut fine = Vec::new();
    for (name, checked) in checked {
        // The import's own reason for the file it stopped at, whatever a re-read says.
        let why = if name == file {
            Some(error.to_owned())
        } else {
            checked
        };
        match why {
            Some(why) => wrong.push(format!("{name}: {why}")),
            None => fine.push(name),
        }
    }
    let mut why = wrong.join("; ");
    if !fine.is_empty() {
        why.push_str(&format!(". Without error: {}", fine.join(", ")));
    }
    why
}

async fn upload_failed(user: &SignedIn, e: axum::extract::multipart::MultipartError) -> Response {
    let message = format!("The upload failed: {}", e.body_text());
    render(user, e.status(), None, Some(message)).await
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
