//! AWS Cost Explorer, through the official SDK.
//!
//! - The last 14 days come per instance from `GetCostAndUsageWithResources` (hourly where the
//!   account has hourly data, else daily), filtered on EC2 compute and grouped by resource id
//!   and purchase type, so each line joins a host and knows its pricing category.
//! - Older days come from `GetCostAndUsage`, grouped by instance type and a cost-allocation tag
//!   whose value names the instance (`--tag-key`); without the tag they count in totals only.
//!
//! Each Cost Explorer request costs the account $0.01, so days that are final (ended more than
//! [`FINAL_AFTER_DAYS`] days ago) and already synced are not asked for again.

use std::time::Duration;

use aws_sdk_costexplorer::config::{BehaviorVersion, Credentials, Region};
use aws_sdk_costexplorer::error::{DisplayErrorContext, ProvideErrorMetadata};
use aws_sdk_costexplorer::types::{
    DateInterval, Dimension, DimensionValues, Expression, Granularity, GroupDefinition,
    GroupDefinitionType, ResultByTime,
};
use aws_sdk_costexplorer::Client;
use chrono::{Duration as ChronoDuration, NaiveDate};

use super::{normalize_resource_id, CostLine};
use crate::billing::focus::parse_time_ms;
use crate::store;
use gpuledger_core::money::parse_amount;

/// How far back per-resource data reaches.
pub const RESOURCE_DAYS: i64 = 14;
/// AWS revises costs for a few days after they accrue; after this, a day is final.
pub const FINAL_AFTER_DAYS: i64 = 3;
const EC2_COMPUTE: &str = "Amazon Elastic Compute Cloud - Compute";
const METRICS: [&str; 2] = ["UnblendedCost", "AmortizedCost"];
/// The replacement key of Cost Explorer lines: each synced day replaces what an earlier sync
/// said about that day (FOCUS exports replace whole billing periods instead).
pub const CE_ACCOUNT: &str = "cost-explorer";

#[derive(Debug, thiserror::Error)]
pub enum CeError {
    #[error("Cost Explorer {operation}: {message}")]
    Api {
        operation: &'static str,
        message: String,
    },
    #[error("Cost Explorer {operation}: still throttled after {attempts} attempts")]
    Throttled {
        operation: &'static str,
        attempts: u32,
    },
    #[error("Cost Explorer answered an amount that is not a decimal: {0:?}")]
    BadAmount(String),
}

/// A client from the standard AWS chain (environment, profile, SSO, instance role).
pub async fn client_from_environment(endpoint_url: Option<&str>) -> Client {
    let shared = aws_config::defaults(BehaviorVersion::latest()).load().await;
    let mut builder = aws_sdk_costexplorer::config::Builder::from(&shared);
    // Cost Explorer lives in us-east-1 whatever the profile says.
    builder = builder.region(Region::new("us-east-1"));
    if let Some(url) = endpoint_url {
        builder = builder.endpoint_url(url);
    }
    Client::from_conf(builder.build())
}

/// A client with static credentials and no SDK retries, for a local endpoint.
pub fn client_for_endpoint(endpoint_url: &str, access_key: &str, secret_key: &str) -> Client {
    let conf = aws_sdk_costexplorer::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .endpoint_url(endpoint_url)
        .credentials_provider(Credentials::new(
            access_key, secret_key, None, None, "static",
        ))
        .retry_config(aws_smithy_types::retry::RetryConfig::disabled())
        .build();
    Client::from_conf(conf)
}

#[derive(Debug, Clone)]
pub struct SyncOptions {
    /// Cost-allocation tag whose value is the instance id, for days older than 14.
    pub tag_key: Option<String>,
    /// First wait after a throttling answer; doubles each time.
    pub throttle_backoff: Duration,
    pub max_attempts: u32,
}

impl Default for SyncOptions {
    fn default() -> Self {
        SyncOptions {
            tag_key: None,
            throttle_backoff: Duration::from_secs(2),
            max_attempts: 6,
        }
    }
}

/// Maps Cost Explorer's purchase types to gpuledger's pricing categories.
pub fn pricing_from_purchase_type(purchase_type: &str) -> &'static str {
    let p = purchase_type.to_ascii_lowercase();
    if p.contains("spot") {
        "spot"
    } else if p.contains("savings plan") || p.contains("reserved") || p.contains("reservation") {
        "committed"
    } else if p.contains("on demand") || p.contains("on-demand") {
        "on_demand"
    } else {
        "other"
    }
}

fn ec2_compute_filter() -> Expression {
    Expression::builder()
        .dimensions(
            DimensionValues::builder()
                .key(Dimension::Service)
                .values(EC2_COMPUTE)
                .build(),
        )
        .build()
}

fn group(kind: GroupDefinitionType, key: &str) -> GroupDefinition {
    GroupDefinition::builder().r#type(kind).key(key).build()
}

fn is_throttled(code: Option<&str>) -> bool {
    matches!(
        code,
        Some("LimitExceededException" | "ThrottlingException" | "TooManyRequestsException")
    )
}

/// Days in `[from, to)` as Cost Explorer writes them.
fn interval(from: &str, to: &str) -> Result<DateInterval, CeError> {
    DateInterval::builder()
        .start(from)
        .end(to)
        .build()
        .map_err(|e| CeError::Api {
            operation: "request",
            message: e.to_string(),
        })
}

struct Page {
    results: Vec<ResultByTime>,
    next: Option<String>,
}

pub struct CostExplorer {
    client: Client,
    options: SyncOptions,
}

impl CostExplorer {
    pub fn new(client: Client, options: SyncOptions) -> Self {
        CostExplorer { client, options }
    }

    async fn with_backoff<F, Fut, E>(
        &self,
        operation: &'static str,
        mut call: F,
    ) -> Result<Page, CeError>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<
            Output = Result<
                Page,
                aws_sdk_costexplorer::error::SdkError<E, aws_smithy_runtime_api::http::Response>,
            >,
        >,
        E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
    {
        let mut wait = self.options.throttle_backoff;
        for attempt in 1..=self.options.max_attempts {
            match call().await {
                Ok(page) => return Ok(page),
                Err(e) if is_throttled(e.code()) && attempt < self.options.max_attempts => {
                    tracing::warn!(
                        operation,
                        attempt,
                        wait_ms = wait.as_millis() as u64,
                        "Cost Explorer throttled; backing off"
                    );
                    tokio::time::sleep(wait).await;
                    wait = wait.saturating_mul(2);
                }
                Err(e) if is_throttled(e.code()) => {
                    return Err(CeError::Throttled {
                        operation,
                        attempts: attempt,
                    })
                }
                Err(e) => {
                    return Err(CeError::Api {
                        operation,
                        message: DisplayErrorContext(&e).to_string(),
                    })
                }
            }
        }
        Err(CeError::Throttled {
            operation,
            attempts: self.options.max_attempts,
        })
    }

    /// Per-instance lines for `[from, to)` (dates), hourly if the account has hourly data.
    pub async fn resource_lines(
        &self,
        from: NaiveDate,
        to: NaiveDate,
    ) -> Result<Vec<CostLine>, CeError> {
        match self.resource_lines_at(from, to, Granularity::Hourly).await {
            Err(CeError::Api { message, .. })
                if message.contains("DataUnavailable")
                    || message.to_ascii_lowercase().contains("hourly") =>
            {
                tracing::info!("no hourly resource-level data on this account; using daily");
                self.resource_lines_at(from, to, Granularity::Daily).await
            }
            other => other,
        }
    }

    async fn resource_lines_at(
        &self,
        from: NaiveDate,
        to: NaiveDate,
        granularity: Granularity,
    ) -> Result<Vec<CostLine>, CeError> {
        let (start, end) = match granularity {
            Granularity::Hourly => (format!("{from}T00:00:00Z"), format!("{to}T00:00:00Z")),
            _ => (from.to_string(), to.to_string()),
        };
        let period = interval(&start, &end)?;
        let mut token: Option<String> = None;
        let mut lines = Vec::new();
        loop {
            let page = self
                .with_backoff("GetCostAndUsageWithResources", || {
                    let req = self
                        .client
                        .get_cost_and_usage_with_resources()
                        .time_period(period.clone())
                        .granularity(granularity.clone())
                        .filter(ec2_compute_filter())
                        .set_metrics(Some(METRICS.iter().map(|m| m.to_string()).collect()))
                        .group_by(group(GroupDefinitionType::Dimension, "RESOURCE_ID"))
                        .group_by(group(GroupDefinitionType::Dimension, "PURCHASE_TYPE"))
                        .set_next_page_token(token.clone());
                    async move {
                        req.send().await.map(|o| Page {
                            results: o.results_by_time().to_vec(),
                            next: o.next_page_token().map(str::to_owned),
                        })
                    }
                })
                .await?;
            for result in &page.results {
                convert(result, "GetCostAndUsageWithResources", &mut lines, |keys| {
                    let resource = keys.first().cloned().unwrap_or_default();
                    let purchase = keys.get(1).cloned().unwrap_or_default();
                    (Some(resource), None, pricing_from_purchase_type(&purchase))
                })?;
            }
            match page.next {
                Some(t) if !t.is_empty() => token = Some(t),
                _ => break,
            }
        }
        Ok(lines)
    }

    /// Daily lines for `[from, to)` grouped by instance type and the host tag.
    pub async fn grouped_lines(
        &self,
        from: NaiveDate,
        to: NaiveDate,
    ) -> Result<Vec<CostLine>, CeError> {
        let period = interval(&from.to_string(), &to.to_string())?;
        let second = match &self.options.tag_key {
            Some(tag) => group(GroupDefinitionType::Tag, tag),
            None => group(GroupDefinitionType::Dimension, "PURCHASE_TYPE"),
        };
        let by_tag = self.options.tag_key.is_some();
        let mut token: Option<String> = None;
        let mut lines = Vec::new();
        loop {
            let page = self
                .with_backoff("GetCostAndUsage", || {
                    let req = self
                        .client
                        .get_cost_and_usage()
                        .time_period(period.clone())
                        .granularity(Granularity::Daily)
                        .filter(ec2_compute_filter())
                        .set_metrics(Some(METRICS.iter().map(|m| m.to_string()).collect()))
                        .group_by(group(GroupDefinitionType::Dimension, "INSTANCE_TYPE"))
                        .group_by(second.clone())
                        .set_next_page_token(token.clone());
                    async move {
                        req.send().await.map(|o| Page {
                            results: o.results_by_time().to_vec(),
                            next: o.next_page_token().map(str::to_owned),
                        })
                    }
                })
                .await?;
            for result in &page.results {
                convert(result, "GetCostAndUsage", &mut lines, |keys| {
                    let instance_type = keys.first().cloned();
                    let second = keys.get(1).cloned().unwrap_or_default();
                    if by_tag {
                        // Tags come back as `key$value`; an empty value means untagged.
                        let value = second
                            .split_once('$')
                            .map(|(_, v)| v.to_owned())
                            .unwrap_or_default();
                        ((!value.is_empty()).then_some(value), instance_type, "other")
                    } else {
                        (None, instance_type, pricing_from_purchase_type(&second))
                    }
                })?;
            }
            match page.next {
                Some(t) if !t.is_empty() => token = Some(t),
                _ => break,
            }
        }
        Ok(lines)
    }

    /// Everything for `[from, to)`: per resource where Cost Explorer has it (the last 14 days
    /// before `today`), grouped before that.
    pub async fn lines(
        &self,
        from: NaiveDate,
        to: NaiveDate,
        today: NaiveDate,
    ) -> Result<Vec<CostLine>, CeError> {
        let resource_start = today - ChronoDuration::days(RESOURCE_DAYS);
        let mut lines = Vec::new();
        if from < resource_start.min(to) {
            lines.extend(self.grouped_lines(from, resource_start.min(to)).await?);
        }
        if to > resource_start.max(from) {
            lines.extend(self.resource_lines(resource_start.max(from), to).await?);
        }
        for (i, l) in lines.iter_mut().enumerate() {
            l.line_no = i as u64 + 1;
        }
        Ok(lines)
    }
}

/// Turns one time bucket's groups into cost lines. `describe` maps a group's keys to
/// (resource id, instance type, pricing category).
fn convert(
    result: &ResultByTime,
    operation: &str,
    out: &mut Vec<CostLine>,
    describe: impl Fn(&[String]) -> (Option<String>, Option<String>, &'static str),
) -> Result<(), CeError> {
    let Some(period) = result.time_period() else {
        return Ok(());
    };
    let (Some(start), Some(end)) = (parse_time_ms(period.start()), parse_time_ms(period.end()))
    else {
        return Ok(());
    };
    for g in result.groups() {
        let metrics = g.metrics();
        let amount = |name: &str| -> Result<(rust_decimal::Decimal, String), CeError> {
            match metrics.and_then(|m| m.get(name)) {
                Some(v) => {
                    let text = v.amount().unwrap_or("0");
                    let a =
                        parse_amount(text).ok_or_else(|| CeError::BadAmount(text.to_owned()))?;
                    Ok((a, v.unit().unwrap_or("USD").to_owned()))
                }
                None => Ok((rust_decimal::Decimal::ZERO, "USD".to_owned())),
            }
        };
        let (billed, unit) = amount("UnblendedCost")?;
        let (effective, _) = amount("AmortizedCost")?;
        let (resource_id, instance_type, pricing) = describe(g.keys());
        let resource_id = resource_id.filter(|r| !r.is_empty() && r != "NoResourceId");
        out.push(CostLine {
            line_no: 0,
            provider: "AWS".into(),
            billing_account_id: CE_ACCOUNT.into(),
            billing_period_start_ms: gpuledger_core::time::day_floor(start),
            charge_period_start_ms: start,
            charge_period_end_ms: end,
            charge_category: "Usage".into(),
            resource_key: resource_id.as_deref().map(normalize_resource_id),
            resource_id,
            billed_cost: billed,
            effective_cost: effective,
            list_cost: billed,
            currency: unit.to_ascii_uppercase(),
            pricing_category: pricing.into(),
            commitment_discount_id: None,
            commitment_discount_status: None,
            service_name: Some(EC2_COMPUTE.into()),
            sku_id: None,
            region: None,
            instance_type: instance_type.filter(|t| !t.is_empty() && t != "NoInstanceType"),
            tags_json: "{}".into(),
            extra_json:
                serde_json::json!({ "x_Source": operation, "x_Estimated": result.estimated() })
                    .to_string(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn purchase_types() {
        assert_eq!(
            pricing_from_purchase_type("On Demand Instances"),
            "on_demand"
        );
        assert_eq!(pricing_from_purchase_type("Spot Instances"), "spot");
        assert_eq!(pricing_from_purchase_type("Savings Plans"), "committed");
        assert_eq!(
            pricing_from_purchase_type("Standard Reserved Instances"),
            "committed"
        );
        assert_eq!(pricing_from_purchase_type("Dedicated Usage"), "other");
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    #[error("{0}")]
    CostExplorer(#[from] CeError),
    #[error("{0}")]
    Store(#[from] crate::store::StoreError),
    #[error(transparent)]
    Import(#[from] super::ImportError),
    #[error("--to must be after --from")]
    EmptyRange,
}

#[derive(Debug, Clone, PartialEq)]
pub struct SyncSummary {
    pub fetched_days: usize,
    /// Final days fetched before, not paid for again.
    pub skipped_days: usize,
    pub import: Option<super::ImportSummary>,
}

fn day_ms(d: NaiveDate) -> i64 {
    d.and_hms_opt(0, 0, 0)
        .map_or(0, |t| t.and_utc().timestamp_millis())
}

/// Fetches `[from, to)` from Cost Explorer, skipping final days already synced unless `force`,
/// and stores what came back as one import (a re-synced day replaces that day's lines).
pub async fn sync(
    store: &dyn crate::store::Store,
    ce: &CostExplorer,
    (from, to): (NaiveDate, NaiveDate),
    today: NaiveDate,
    now_ms: i64,
    force: bool,
    progress: &dyn crate::progress::Progress,
) -> Result<SyncSummary, SyncError> {
    if to <= from {
        return Err(SyncError::EmptyRange);
    }
    let synced: std::collections::HashSet<i64> =
        store::jobs::ce_synced_days(store.db(), day_ms(from), day_ms(to))
            .await?
            .into_iter()
            .collect();
    let final_before = today - ChronoDuration::days(FINAL_AFTER_DAYS);
    let mut runs: Vec<(NaiveDate, NaiveDate)> = Vec::new();
    let mut skipped = 0;
    let mut fetched_days = Vec::new();
    let mut day = from;
    while day < to {
        let next = day + ChronoDuration::days(1);
        let is_final = next <= final_before;
        if is_final && synced.contains(&day_ms(day)) && !force {
            skipped += 1;
        } else {
            fetched_days.push(day_ms(day));
            match runs.last_mut() {
                Some((_, end)) if *end == day => *end = next,
                _ => runs.push((day, next)),
            }
        }
        day = next;
    }
    progress.total(fetched_days.len() as u64);
    let mut lines = Vec::new();
    for (start, end) in &runs {
        progress.part(&format!("{start} to {end}"));
        lines.extend(ce.lines(*start, *end, today).await?);
        progress.advance(u64::try_from((*end - *start).num_days()).unwrap_or_default());
    }
    progress.part(&format!("storing {} lines", lines.len()));
    let import = if lines.is_empty() {
        None
    } else {
        for (i, l) in lines.iter_mut().enumerate() {
            l.line_no = i as u64 + 1;
        }
        let sha = super::sha256_hex(format!("{lines:?}").as_bytes());
        let name = format!("Cost Explorer {from}..{to}");
        Some(super::store_lines(store, "aws-cost-explorer", &name, sha, lines, now_ms).await?)
    };
    store::jobs::mark_ce_synced(store.db(), &fetched_days, now_ms).await?;
    Ok(SyncSummary {
        fetched_days: fetched_days.len(),
        skipped_days: skipped,
        import,
    })
}
