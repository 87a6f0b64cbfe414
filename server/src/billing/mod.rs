//! Billing sources, all producing [`CostLine`]s: FOCUS exports (`focus`, with `parquet`), AWS
//! Cost Explorer (`aws`), and the rate card for hosts with no bill (`ratecard`).

pub mod aws;
pub mod focus;
mod parquet;
pub mod ratecard;

use rust_decimal::Decimal;
use sha2::{Digest, Sha256};

use crate::store::{ImportOutcome, NewImport, Store, StoreError};

/// One line of a bill: what one resource cost over one charge period.
#[derive(Debug, Clone, PartialEq)]
pub struct CostLine {
    /// Where it came from in its file (header = line 1), or its position in an API answer.
    pub line_no: u64,
    pub provider: String,
    pub billing_account_id: String,
    pub billing_period_start_ms: i64,
    pub charge_period_start_ms: i64,
    /// Exclusive.
    pub charge_period_end_ms: i64,
    /// Usage, Purchase, Tax, Credit or Adjustment.
    pub charge_category: String,
    pub resource_id: Option<String>,
    /// `resource_id` normalised for joining with hosts' instance ids.
    pub resource_key: Option<String>,
    /// What the invoice says.
    pub billed_cost: Decimal,
    /// Amortized after discounts: what chargeback uses.
    pub effective_cost: Decimal,
    pub list_cost: Decimal,
    pub currency: String,
    /// on_demand, spot, committed or other.
    pub pricing_category: String,
    pub commitment_discount_id: Option<String>,
    pub commitment_discount_status: Option<String>,
    pub service_name: Option<String>,
    pub sku_id: Option<String>,
    pub region: Option<String>,
    pub instance_type: Option<String>,
    pub tags_json: String,
    /// Provider (`x_`) columns and other details kept as they came.
    pub extra_json: String,
}

/// The key a resource joins on: an ARN's resource id (`arn:…:instance/i-0abc` → `i-0abc`), the
/// last segment of a path-like id (Azure, GCP), lower-cased since Azure ids ignore case.
pub fn normalize_resource_id(id: &str) -> String {
    let id = id.trim();
    let last = if id.starts_with("arn:") {
        id.rsplit(['/', ':']).next().unwrap_or(id)
    } else if id.contains('/') {
        id.trim_end_matches('/').rsplit('/').next().unwrap_or(id)
    } else {
        id
    };
    last.to_ascii_lowercase()
}

/// FOCUS 1.0 says On-Demand / Commitment-Based / Dynamic; 1.1+ says Standard / Committed /
/// Dynamic. Usage covered by a commitment counts as committed whatever the column says.
pub fn pricing_category(focus: &str, commitment_status: Option<&str>) -> String {
    if commitment_status.is_some_and(|s| s.eq_ignore_ascii_case("used")) {
        return "committed".into();
    }
    match focus.trim().to_ascii_lowercase().as_str() {
        "standard" | "on-demand" | "ondemand" | "on_demand" => "on_demand",
        "committed" | "commitment-based" => "committed",
        "dynamic" | "spot" => "spot",
        _ => "other",
    }
    .into()
}

/// What an import did, for the CLI and the API.
#[derive(Debug, Clone, PartialEq)]
pub struct ImportSummary {
    pub import_id: i64,
    /// False when this exact file had been imported before: nothing changed.
    pub new: bool,
    pub rows: usize,
    pub billed_total: Decimal,
    pub effective_total: Decimal,
    /// Lines of earlier imports for the same billing periods that this one replaced.
    pub replaced_lines: u64,
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// Stores parsed lines in one transaction: all of them, or (on any error) none.
pub async fn store_lines(
    store: &dyn Store,
    source: &str,
    name: &str,
    content_sha256: String,
    lines: Vec<CostLine>,
    now_ms: i64,
) -> Result<ImportSummary, StoreError> {
    let billed_total: Decimal = lines.iter().map(|l| l.billed_cost).sum();
    let effective_total: Decimal = lines.iter().map(|l| l.effective_cost).sum();
    let import = NewImport {
        source: source.to_owned(),
        name: name.to_owned(),
        content_sha256,
        imported_ms: now_ms,
        billed_total,
        effective_total,
    };
    let rows = lines.len();
    let outcome = store.import_cost_lines(&import, &lines).await?;
    Ok(match outcome {
        ImportOutcome::Imported {
            import_id,
            replaced_lines,
        } => ImportSummary {
            import_id,
            new: true,
            rows,
            billed_total,
            effective_total,
            replaced_lines,
        },
        ImportOutcome::AlreadyImported { import_id } => ImportSummary {
            import_id,
            new: false,
            rows,
            billed_total,
            effective_total,
            replaced_lines: 0,
        },
    })
}

#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    #[error("{0}")]
    Focus(#[from] focus::FocusError),
    #[error("{0}")]
    Store(#[from] StoreError),
}

/// Imports one FOCUS file (CSV, CSV.gz or Parquet) given its bytes.
pub async fn import_focus(
    store: &dyn Store,
    name: &str,
    bytes: Vec<u8>,
    now_ms: i64,
) -> Result<ImportSummary, ImportError> {
    let sha = sha256_hex(&bytes);
    let csv = focus::decompress(bytes)?;
    let lines = focus::parse(&csv)?;
    Ok(store_lines(store, "focus", name, sha, lines, now_ms).await?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resource_ids_normalise_for_joining() {
        assert_eq!(
            normalize_resource_id("arn:aws:ec2:us-east-1:1111:instance/i-0ABC"),
            "i-0abc"
        );
        assert_eq!(normalize_resource_id("i-0abc"), "i-0abc");
        assert_eq!(
            normalize_resource_id("/subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/virtualMachines/GPU-VM-1"),
            "gpu-vm-1"
        );
        assert_eq!(
            normalize_resource_id(
                "//compute.googleapis.com/projects/p/zones/us-central1-a/instances/a3-node-7"
            ),
            "a3-node-7"
        );
    }

    #[test]
    fn pricing_categories_across_focus_versions() {
        assert_eq!(pricing_category("Standard", None), "on_demand");
        assert_eq!(pricing_category("On-Demand", None), "on_demand");
        assert_eq!(pricing_category("Dynamic", None), "spot");
        assert_eq!(pricing_category("Commitment-Based", None), "committed");
        assert_eq!(pricing_category("Standard", Some("Used")), "committed");
        assert_eq!(pricing_category("", None), "other");
    }
}
