//! AWS Cost Explorer, through the official SDK.
//!
//! - The last 14 days come per instance from `GetCostAndUsageWithResources` (hourly where the
//!   account has hourly data, else daily), filtered on EC2 compute and grouped by resource id
//!   and purchase type, so each line joins a host and knows its pricing category.
//! - Older days come from `GetCostAndUsage`, grouped by instance type and a cost-allocation tag
//!   whose value names the instance (`--tag-key`); without the tag they count in totals only.
//!
//! - Commitments come from `GetCostAndUsage` grouped by record type, in the amortized view:
//!   usage a Savings Plan or reservation covered is a `Used` line (its purchase type says which),
//!   each day's recurring and upfront fees are `Purchase` lines (what the invoice says), and the
//!   amortized cost of a fee line is the commitment nobody used that day, an `Unused` line. Cost
//!   Explorer cannot group by plan or reservation, so all the account's Savings Plans are one
//!   commitment and all its reservations another; a FOCUS export tells each apart.
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

/// All of an account's Savings Plans, or all its reservations, as Cost Explorer sums them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CeCommitment {
    /// The commitment id its lines carry.
    pub id: &'static str,
    pub name: &'static str,
    /// As FOCUS words `CommitmentDiscountType`.
    pub kind: &'static str,
    service: &'static str,
}

pub const SAVINGS_PLANS: CeCommitment = CeCommitment {
    id: "aws-savings-plans",
    name: "All Savings Plans (Cost Explorer)",
    kind: "Savings Plan",
    service: "Savings Plans for AWS Compute usage",
};

pub const RESERVED_INSTANCES: CeCommitment = CeCommitment {
    id: "aws-reserved-instances",
    name: "All Reserved Instances (Cost Explorer)",
    kind: "Reserved Instance",
    service: EC2_COMPUTE,
};

/// The commitment a purchase type's usage ran under, if any.
pub fn commitment_of_purchase_type(purchase_type: &str) -> Option<CeCommitment> {
    let p = purchase_type.to_ascii_lowercase();
    if p.contains("savings plan") {
        Some(SAVINGS_PLANS)
    } else if p.contains("reserved") || p.contains("reservation") {
        Some(RESERVED_INSTANCES)
    } else {
        None
    }
}

/// The record types of commitment fees, with the commitment, how often each is charged (an
/// upfront fee says nothing of its term here, so no end is read from it), and whether its
/// amortized cost is the part nobody used (upfront fees are amortized into usage).
const FEE_RECORD_TYPES: [(&str, CeCommitment, Option<&str>, bool); 3] = [
    (
        "SavingsPlanRecurringFee",
        SAVINGS_PLANS,
        Some("Recurring"),
        true,
    ),
    ("SavingsPlanUpfrontFee", SAVINGS_PLANS, None, false),
    ("RIFee", RESERVED_INSTANCES, Some("Recurring"), true),
];

/// Whether a fee of `c` charged under `service` is for what the usage lines cover: EC2's own
/// reservations (not RDS's or ElastiCache's), and compute Savings Plans (not SageMaker's).
fn fee_covers_compute(c: &CeCommitment, service: &str) -> bool {
    if c.id == RESERVED_INSTANCES.id {
        service == EC2_COMPUTE
    } else {
        service.to_ascii_lowercase().contains("compute")
    }
}

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

/// EC2 compute less the commitments' fees: a reservation's fee is charged under EC2 too, and
/// [`CostExplorer::commitment_fees`] reads the fees on their own (counted twice otherwise).
fn ec2_usage_filter() -> Expression {
    let service = Expression::builder()
        .dimensions(
            DimensionValues::builder()
                .key(Dimension::Service)
                .values(EC2_COMPUTE)
                .build(),
        )
        .build();
    let not_fees = Expression::builder().not(fee_record_types()).build();
    Expression::builder().and(service).and(not_fees).build()
}

/// The record types of commitments' fees.
fn fee_record_types() -> Expression {
    Expression::builder()
        .dimensions(
            DimensionValues::builder()
                .key(Dimension::RecordType)
                .set_values(Some(
                    FEE_RECORD_TYPES.iter().map(|f| f.0.to_owned()).collect(),
                ))
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
                        .filter(ec2_usage_filter())
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
                    let purchase = keys.get(1).map_or("", String::as_str);
                    Described {
                        resource_id: keys.first().cloned(),
                        instance_type: None,
                        pricing: pricing_from_purchase_type(purchase),
                        commitment: commitment_of_purchase_type(purchase),
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

    /// Every time bucket of a daily `GetCostAndUsage` over `[from, to)`, page after page,
    /// filtered by `filter` and grouped by `groups`.
    async fn daily_cost_and_usage(
        &self,
        (from, to): (NaiveDate, NaiveDate),
        filter: Expression,
        groups: [GroupDefinition; 2],
    ) -> Result<Vec<ResultByTime>, CeError> {
        let period = interval(&from.to_string(), &to.to_string())?;
        let mut token: Option<String> = None;
        let mut results = Vec::new();
        loop {
            let page = self
                .with_backoff("GetCostAndUsage", || {
                    let req = self
                        .client
                        .get_cost_and_usage()
                        .time_period(period.clone())
                        .granularity(Granularity::Daily)
                        .filter(filter.clone())
                        .set_metrics(Some(METRICS.iter().map(|m| m.to_string()).collect()))
                        .set_group_by(Some(groups.to_vec()))
                        .set_next_page_token(token.clone());
                    async move {
                        req.send().await.map(|o| Page {
                            results: o.results_by_time().to_vec(),
                            next: o.next_page_token().map(str::to_owned),
                        })
                    }
                })
                .await?;
            results.extend(page.results);
            match page.next {
                Some(t) if !t.is_empty() => token = Some(t),
                _ => break,
            }
        }
        Ok(results)
    }

    /// Daily lines for `[from, to)` grouped by instance type and the host tag.
    pub async fn grouped_lines(
        &self,
        from: NaiveDate,
        to: NaiveDate,
    ) -> Result<Vec<CostLine>, CeError> {
        let second = match &self.options.tag_key {
            Some(tag) => group(GroupDefinitionType::Tag, tag),
            None => group(GroupDefinitionType::Dimension, "PURCHASE_TYPE"),
        };
        let by_tag = self.options.tag_key.is_some();
        let instance_type = group(GroupDefinitionType::Dimension, "INSTANCE_TYPE");
        let results = self
            .daily_cost_and_usage((from, to), ec2_usage_filter(), [instance_type, second])
            .await?;
        let mut lines = Vec::new();
        for result in &results {
            convert(result, "GetCostAndUsage", &mut lines, |keys| {
                let instance_type = keys.first().cloned();
                let second = keys.get(1).map_or("", String::as_str);
                if by_tag {
                    // Tags come back as `key$value`; an empty value means untagged.
                    let value = second.split_once('$').map_or("", |(_, v)| v);
                    Described {
                        resource_id: (!value.is_empty()).then(|| value.to_owned()),
                        instance_type,
                        pricing: "other",
                        commitment: None,
                    }
                } else {
                    Described {
                        resource_id: None,
                        instance_type,
                        pricing: pricing_from_purchase_type(second),
                        commitment: commitment_of_purchase_type(second),
                    }
                }
            })?;
        }
        Ok(lines)
    }

    /// Daily commitment fee lines for `[from, to)`: what the invoice says of each fee (a
    /// `Purchase` line), and the part of it nobody used (an `Unused` line).
    pub async fn commitment_fees(
        &self,
        from: NaiveDate,
        to: NaiveDate,
    ) -> Result<Vec<CostLine>, CeError> {
        let groups = [
            group(GroupDefinitionType::Dimension, "RECORD_TYPE"),
            group(GroupDefinitionType::Dimension, "SERVICE"),
        ];
        let results = self
            .daily_cost_and_usage((from, to), fee_record_types(), groups)
            .await?;
        let mut lines = Vec::new();
        for result in &results {
            fee_lines(result, &mut lines)?;
        }
        Ok(lines)
    }

    /// Everything for `[from, to)`: per resource where Cost Explorer has it (the last 14 days
    /// before `today`), grouped before that, and the commitments' fees.
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
        // Fees only for the days whose usage says which commitment covered it: grouped by the
        // host tag, older days cannot, and a fee without its used part would read as unused.
        let fees_from = if self.options.tag_key.is_some() {
            resource_start.max(from)
        } else {
            from
        };
        if to > fees_from {
            lines.extend(self.commitment_fees(fees_from, to).await?);
        }
        for (i, l) in lines.iter_mut().enumerate() {
            l.line_no = i as u64 + 1;
        }
        Ok(lines)
    }
}

/// What a group's keys say of its cost.
struct Described {
    resource_id: Option<String>,
    instance_type: Option<String>,
    pricing: &'static str,
    /// The commitment that covered it, whose `Used` part it is.
    commitment: Option<CeCommitment>,
}

/// A time bucket's period, or `None` for a bucket without one.
fn bucket_period(result: &ResultByTime) -> Option<(i64, i64)> {
    let period = result.time_period()?;
    Some((parse_time_ms(period.start())?, parse_time_ms(period.end())?))
}

/// A group's billed (unblended) and effective (amortized) cost, and their currency.
fn amounts(
    g: &aws_sdk_costexplorer::types::Group,
) -> Result<(rust_decimal::Decimal, rust_decimal::Decimal, String), CeError> {
    let metrics = g.metrics();
    let amount = |name: &str| -> Result<(rust_decimal::Decimal, String), CeError> {
        match metrics.and_then(|m| m.get(name)) {
            Some(v) => {
                let text = v.amount().unwrap_or("0");
                let a = parse_amount(text).ok_or_else(|| CeError::BadAmount(text.to_owned()))?;
                Ok((a, v.unit().unwrap_or("USD").to_owned()))
            }
            None => Ok((rust_decimal::Decimal::ZERO, "USD".to_owned())),
        }
    };
    let (billed, unit) = amount("UnblendedCost")?;
    let (effective, _) = amount("AmortizedCost")?;
    Ok((billed, effective, unit.to_ascii_uppercase()))
}

/// A Cost Explorer line of `[start, end)`, usage of EC2 compute unless changed.
fn ce_line(
    (start, end): (i64, i64),
    (billed, effective, currency): (rust_decimal::Decimal, rust_decimal::Decimal, String),
    extra: serde_json::Value,
) -> CostLine {
    CostLine {
        line_no: 0,
        provider: "AWS".into(),
        billing_account_id: CE_ACCOUNT.into(),
        billing_period_start_ms: gpuledger_core::time::day_floor(start),
        charge_period_start_ms: start,
        charge_period_end_ms: end,
        charge_category: "Usage".into(),
        resource_id: None,
        resource_key: None,
        billed_cost: billed,
        effective_cost: effective,
        list_cost: billed,
        currency,
        pricing_category: "other".into(),
        commitment_discount_id: None,
        commitment_discount_status: None,
        service_name: Some(EC2_COMPUTE.into()),
        sku_id: None,
        region: None,
        instance_type: None,
        tags_json: "{}".into(),
        // Texts only: commitments read these columns back as a map of texts.
        extra_json: extra.to_string(),
    }
}

/// The columns a commitment's lines keep beside the line model's.
fn commitment_extra(
    operation: &str,
    estimated: bool,
    c: &CeCommitment,
    frequency: Option<&str>,
) -> serde_json::Value {
    let mut extra = serde_json::json!({
        "x_Source": operation,
        "x_Estimated": estimated.to_string(),
        "CommitmentDiscountName": c.name,
        "CommitmentDiscountType": c.kind,
    });
    if let Some(f) = frequency {
        extra["ChargeFrequency"] = f.into();
    }
    extra
}

/// Turns one time bucket's groups into cost lines. `describe` says what a group's keys mean.
fn convert(
    result: &ResultByTime,
    operation: &str,
    out: &mut Vec<CostLine>,
    describe: impl Fn(&[String]) -> Described,
) -> Result<(), CeError> {
    let Some(period) = bucket_period(result) else {
        return Ok(());
    };
    for g in result.groups() {
        let d = describe(g.keys());
        let extra = match &d.commitment {
            Some(c) => commitment_extra(operation, result.estimated(), c, Some("Usage-Based")),
            None => serde_json::json!({
                "x_Source": operation,
                "x_Estimated": result.estimated().to_string(),
            }),
        };
        let mut line = ce_line(period, amounts(g)?, extra);
        let resource_id = d
            .resource_id
            .filter(|r| !r.is_empty() && r != "NoResourceId");
        line.resource_key = resource_id.as_deref().map(normalize_resource_id);
        line.resource_id = resource_id;
        line.pricing_category = d.pricing.into();
        line.instance_type = d
            .instance_type
            .filter(|t| !t.is_empty() && t != "NoInstanceType");
        if let Some(c) = d.commitment {
            line.commitment_discount_id = Some(c.id.into());
            line.commitment_discount_status = Some("Used".into());
        }
        out.push(line);
    }
    Ok(())
}

/// One time bucket's commitment fees, grouped by record type: a `Purchase` line of what was
/// invoiced and, for fees whose amortized cost is the unused part, an `Unused` line of it.
fn fee_lines(result: &ResultByTime, out: &mut Vec<CostLine>) -> Result<(), CeError> {
    let Some(period) = bucket_period(result) else {
        return Ok(());
    };
    for g in result.groups() {
        let record_type = g.keys().first().map_or("", String::as_str);
        let service = g.keys().get(1).map_or("", String::as_str);
        let Some((_, c, frequency, unused)) = FEE_RECORD_TYPES
            .iter()
            .find(|f| f.0 == record_type && fee_covers_compute(&f.1, service))
        else {
            continue;
        };
        let (billed, effective, currency) = amounts(g)?;
        let extra = commitment_extra("GetCostAndUsage", result.estimated(), c, *frequency);
        let zero = rust_decimal::Decimal::ZERO;
        let mut purchase = ce_line(period, (billed, zero, currency.clone()), extra.clone());
        purchase.charge_category = "Purchase".into();
        let mut lines = vec![purchase];
        if *unused {
            let mut line = ce_line(period, (zero, effective, currency), extra);
            line.commitment_discount_status = Some("Unused".into());
            line.pricing_category = "committed".into();
            lines.push(line);
        }
        for mut line in lines {
            line.resource_id = Some(c.id.into());
            line.resource_key = Some(normalize_resource_id(c.id));
            line.commitment_discount_id = Some(c.id.into());
            line.service_name = Some(c.service.into());
            out.push(line);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;

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
