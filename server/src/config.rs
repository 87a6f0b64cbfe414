//! The server's optional TOML config file (`--config`): idle thresholds per cluster and Slack
//! routes. Webhook URLs are secrets: they never appear in logs, `Debug` output, or the database.

use std::path::Path;
use std::time::Duration;

use serde::Deserialize;

use gpuledger_core::idle::IdleConfig;
use gpuledger_core::owners::OwnerSchema;

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub idle: IdleConfig,
    #[serde(default)]
    pub slack: SlackConfig,
    /// The owner dimensions: the default four plus the `[owners]` table's.
    #[serde(default)]
    pub owners: OwnerSchema,
    #[serde(default)]
    pub budgets: BudgetAlerts,
    #[serde(default)]
    pub anomalies: AnomalyConfig,
    /// Sign-in through an OpenID Connect provider, besides local users.
    #[serde(default)]
    pub oidc: Option<OidcConfig>,
    /// The cost gauges `/metrics` adds for a read-only token.
    #[serde(default)]
    pub metrics: CostMetricsConfig,
    /// Scheduled exports of the allocation to object storage.
    #[serde(default)]
    pub export: Option<ExportConfig>,
    /// Grid carbon intensities per cluster and region, over the built-in table
    /// ([`crate::carbon`], docs/carbon.md).
    #[serde(default)]
    pub carbon: gpuledger_core::carbon::GridTable,
    /// What the bill does not say about commitments (docs/commitments.md).
    #[serde(default)]
    pub commitments: CommitmentsConfig,
}

impl Config {
    /// What attribution follows: the idle thresholds, the owner dimensions and who pays for
    /// unused commitments.
    pub fn attribution_rules(&self) -> gpuledger_core::attribution::Rules {
        gpuledger_core::attribution::Rules {
            busy: self.idle.clone(),
            owners: self.owners.clone(),
            unused_commitments: self.commitments.unused,
        }
    }
}

/// Commitment facts FOCUS 1.0–1.2 has no column for, and who pays for their unused parts.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct CommitmentsConfig {
    /// The last day (UTC, `YYYY-MM-DD`) each commitment applies, by its id as the bill's
    /// `CommitmentDiscountId` writes it: a bill states an end only in the month an upfront
    /// purchase was invoiced.
    #[serde(default)]
    pub ends: std::collections::BTreeMap<String, String>,
    /// Who pays for an hour's unused part: `"fleet"` (the default, nobody's usage) or
    /// `"covered_owners"` (the owners of what the commitment covered in that hour).
    #[serde(default)]
    pub unused: gpuledger_core::commitment::UnusedCharge,
}

impl CommitmentsConfig {
    /// Each configured commitment's end, exclusive: the day after its last day. Checked when
    /// the config loads, so a date that does not parse is left out here.
    pub fn ends_ms(&self) -> std::collections::BTreeMap<String, i64> {
        self.ends
            .iter()
            .filter_map(|(id, day)| Some((id.clone(), last_day_end_ms(day)?)))
            .collect()
    }
}

fn last_day_end_ms(day: &str) -> Option<i64> {
    let date = chrono::NaiveDate::parse_from_str(day.trim(), "%Y-%m-%d").ok()?;
    let next = date.succ_opt()?.and_hms_opt(0, 0, 0)?;
    Some(next.and_utc().timestamp_millis())
}

/// Each day's allocation (and each month's, once it closes) written as FOCUS to an S3 bucket
/// (AWS, or any S3-compatible store), with a manifest. Credentials come from the usual AWS
/// places (environment, profile, instance role).
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ExportConfig {
    pub bucket: String,
    /// Keys start with this (`finance/gpu` → `finance/gpu/daily/2026/11/24/…`).
    #[serde(default)]
    pub prefix: String,
    /// `csv`, `parquet` or both.
    #[serde(default = "default_export_formats")]
    pub formats: Vec<ExportFormat>,
    /// The bucket's region; the AWS configuration's otherwise.
    #[serde(default)]
    pub region: Option<String>,
    /// An S3-compatible store's address (MinIO, Ceph, a test server).
    #[serde(default)]
    pub endpoint_url: Option<String>,
    /// `bucket` in the path rather than the host name, as most S3-compatible stores want.
    #[serde(default)]
    pub force_path_style: bool,
    /// How many days back a day not yet exported is still caught up (after an outage).
    #[serde(default = "default_catch_up_days")]
    pub catch_up_days: u32,
    /// How long after a day ends it is exported: late windows and the roll-up come first.
    #[serde(default = "default_export_settle", with = "humantime_serde")]
    pub settle: Duration,
    /// How often the job looks for work.
    #[serde(default = "default_export_every", with = "humantime_serde")]
    pub check_every: Duration,
}

#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum ExportFormat {
    Csv,
    Parquet,
}

fn default_export_formats() -> Vec<ExportFormat> {
    vec![ExportFormat::Csv]
}
fn default_catch_up_days() -> u32 {
    7
}
fn default_export_settle() -> Duration {
    Duration::from_secs(2 * 3600)
}
fn default_export_every() -> Duration {
    Duration::from_secs(5 * 60)
}

/// Which owner dimensions label the cost gauges, and how many owner series at most (the rest
/// fold into one `(other)` series per cluster and state, so Prometheus stays bounded).
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct CostMetricsConfig {
    /// Owner dimensions as labels; empty: the team and model dimensions.
    #[serde(default)]
    pub dimensions: Vec<String>,
    #[serde(default = "default_max_series")]
    pub max_series: usize,
    /// One cost series per GPU, labelled as dcgm-exporter labels its (`UUID`, `Hostname`).
    #[serde(default = "default_per_gpu")]
    pub per_gpu: bool,
}

fn default_max_series() -> usize {
    500
}
fn default_per_gpu() -> bool {
    true
}

impl Default for CostMetricsConfig {
    fn default() -> Self {
        CostMetricsConfig {
            dimensions: Vec::new(),
            max_series: default_max_series(),
            per_gpu: default_per_gpu(),
        }
    }
}

impl CostMetricsConfig {
    /// The dimensions that label the gauges, as configured or the schema's team and model.
    pub fn dimensions(&self, schema: &OwnerSchema) -> Vec<String> {
        if !self.dimensions.is_empty() {
            return self.dimensions.clone();
        }
        [
            gpuledger_core::owners::Role::Team,
            gpuledger_core::owners::Role::Model,
        ]
        .into_iter()
        .filter_map(|r| schema.role(r).map(str::to_owned))
        .collect()
    }
}

/// Single sign-on through an OpenID Connect provider (authorization code with PKCE). Who may
/// sign in, and what they see, comes from the provider's groups claim at every sign-in.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct OidcConfig {
    /// The provider's issuer, exactly as its discovery document gives it.
    pub issuer: String,
    pub client_id: String,
    /// Better left out of the file: `GPULEDGER_OIDC_CLIENT_SECRET` is read where it is.
    #[serde(default)]
    pub client_secret: Option<Secret>,
    /// This server's `/login/oidc/callback` as browsers reach it, registered at the provider.
    pub redirect_url: String,
    /// What the sign-in button calls the provider.
    #[serde(default = "default_oidc_name")]
    pub name: String,
    /// Scopes asked for besides `openid`.
    #[serde(default = "default_oidc_scopes")]
    pub scopes: Vec<String>,
    /// The claim (in the ID token, else from the user-info endpoint) listing the groups.
    #[serde(default = "default_groups_claim")]
    pub groups_claim: String,
    /// Members are admins (and see every team).
    #[serde(default)]
    pub admin_groups: Vec<String>,
    /// Members are viewers of every team.
    #[serde(default)]
    pub viewer_groups: Vec<String>,
    /// Group → team: members are viewers of those teams only. Anybody in none of these
    /// groups is refused.
    #[serde(default)]
    pub team_groups: std::collections::BTreeMap<String, String>,
}

/// Checks a config's `[oidc]` table: URLs that parse, a callback at this server's path, and at
/// least one group that gives access.
pub fn check_oidc(c: &OidcConfig) -> Result<(), String> {
    let issuer = openidconnect::IssuerUrl::new(c.issuer.clone())
        .map_err(|e| format!("issuer {:?}: {e}", c.issuer))?;
    let loopback = matches!(
        issuer.url().host_str(),
        Some("127.0.0.1" | "localhost" | "[::1]")
    );
    if issuer.url().scheme() != "https" && !loopback {
        return Err(format!(
            "issuer {:?} is not https: tokens and keys would travel in the clear",
            c.issuer
        ));
    }
    let redirect = openidconnect::RedirectUrl::new(c.redirect_url.clone())
        .map_err(|e| format!("redirect_url {:?}: {e}", c.redirect_url))?;
    if redirect.url().path() != "/login/oidc/callback" {
        return Err(format!(
            "redirect_url {:?} must be this server's /login/oidc/callback",
            c.redirect_url
        ));
    }
    if c.client_id.trim().is_empty() {
        return Err("client_id is empty".into());
    }
    if c.admin_groups.is_empty() && c.viewer_groups.is_empty() && c.team_groups.is_empty() {
        return Err("no admin_groups, viewer_groups or team_groups: nobody could sign in".into());
    }
    if !c.team_groups.is_empty() {
        gpuledger_core::scope::Scope::teams(c.team_groups.values())
            .map_err(|e| format!("team_groups: {e}"))?;
    }
    Ok(())
}

fn default_oidc_name() -> String {
    "single sign-on".into()
}
fn default_oidc_scopes() -> Vec<String> {
    ["profile", "email", "groups"].map(String::from).to_vec()
}
fn default_groups_claim() -> String {
    "groups".into()
}

/// Which owners' daily spend is watched for anomalies, and how large a rise must be to count
/// (besides the usual noise, see [`gpuledger_core::anomaly`]).
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct AnomalyConfig {
    /// Owner dimensions watched; empty: the team dimension, else every owner dimension.
    #[serde(default)]
    pub dimensions: Vec<String>,
    /// A rise smaller than this amount a day (in the bill's currency) is never an anomaly.
    #[serde(default = "default_min_increase")]
    pub min_increase: rust_decimal::Decimal,
    /// Nor one smaller than this percent of what the day was expected to cost.
    #[serde(default = "default_min_increase_percent")]
    pub min_increase_percent: u32,
}

fn default_min_increase() -> rust_decimal::Decimal {
    rust_decimal::Decimal::from(50)
}
fn default_min_increase_percent() -> u32 {
    30
}

impl Default for AnomalyConfig {
    fn default() -> Self {
        AnomalyConfig {
            dimensions: Vec::new(),
            min_increase: default_min_increase(),
            min_increase_percent: default_min_increase_percent(),
        }
    }
}

impl AnomalyConfig {
    pub fn sensitivity(&self) -> gpuledger_core::anomaly::Sensitivity {
        gpuledger_core::anomaly::Sensitivity {
            min_increase: self.min_increase,
            min_increase_percent: self.min_increase_percent,
        }
    }
}

/// When a budget is announced in Slack: at these percents of it spent, and of it forecast for
/// the month's end. Each threshold once per owner and month.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct BudgetAlerts {
    #[serde(default = "default_spent_percents")]
    pub alert_spent_percent: Vec<u32>,
    #[serde(default = "default_forecast_percents")]
    pub alert_forecast_percent: Vec<u32>,
}

fn default_spent_percents() -> Vec<u32> {
    vec![80, 100]
}
fn default_forecast_percents() -> Vec<u32> {
    vec![100]
}

impl Default for BudgetAlerts {
    fn default() -> Self {
        BudgetAlerts {
            alert_spent_percent: default_spent_percents(),
            alert_forecast_percent: default_forecast_percents(),
        }
    }
}

/// A webhook URL or a client secret; shown as `<webhook>` anywhere it could be printed.
#[derive(Clone, Deserialize, PartialEq)]
#[serde(transparent)]
pub struct Secret(pub String);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<webhook>")
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SlackConfig {
    /// Where alerts go when no route matches.
    pub default_webhook: Option<Secret>,
    /// Matched in order; the first route whose team or cluster matches wins.
    #[serde(default)]
    pub routes: Vec<SlackRoute>,
    /// How often an open incident is brought up again.
    #[serde(default = "default_remind", with = "humantime_serde")]
    pub remind_every: Duration,
    /// The address people reach the server at, for links in messages.
    #[serde(default = "default_base_url")]
    pub base_url: String,
    /// A Slack app of the workspace: `/gpuledger` commands and buttons on idle alerts.
    #[serde(default)]
    pub app: Option<SlackAppConfig>,
}

/// Slack app mode: Slack signs each request it sends with the app's signing secret; the
/// commands and buttons answer only requests signed with it.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SlackAppConfig {
    /// The app's "Signing Secret" (Basic Information in the app's settings).
    pub signing_secret: Secret,
    /// Where Slack's `response_url`s point; a button's answer is posted nowhere else.
    #[serde(default = "default_response_url_prefix")]
    pub response_url_prefix: String,
}

/// Slack's own example secret, from its documentation: anyone can sign with it.
const EXAMPLE_SIGNING_SECRET: &str = "8f742231b10e8888abcd99yyyzzz85a5";

/// A signing secret anyone could guess signs anyone's requests: refuse an empty one (a variable
/// never filled in), a short one, and Slack's documented example.
fn check_signing_secret(secret: &str) -> Result<(), String> {
    let secret = secret.trim();
    if secret.len() < 16 {
        return Err(
            "signing_secret is empty or too short: copy the app's Signing Secret (Basic \
                    Information in the app's settings)"
                .into(),
        );
    }
    if secret == EXAMPLE_SIGNING_SECRET {
        return Err(
            "signing_secret is Slack's documented example, which anyone can sign with; \
                    copy your app's own"
                .into(),
        );
    }
    Ok(())
}

fn default_response_url_prefix() -> String {
    "https://hooks.slack.com/".into()
}

fn default_remind() -> Duration {
    Duration::from_secs(4 * 3600)
}
fn default_base_url() -> String {
    "http://127.0.0.1:8080".into()
}

impl Default for SlackConfig {
    fn default() -> Self {
        SlackConfig {
            default_webhook: None,
            routes: Vec::new(),
            remind_every: default_remind(),
            base_url: default_base_url(),
            app: None,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SlackRoute {
    /// A name for the history page and the "test" button; defaults to team:X / cluster:Y.
    pub name: Option<String>,
    pub team: Option<String>,
    pub cluster: Option<String>,
    pub webhook: Secret,
}

impl SlackRoute {
    pub fn label(&self) -> String {
        if let Some(n) = &self.name {
            return n.clone();
        }
        match (&self.team, &self.cluster) {
            (Some(t), Some(c)) => format!("team:{t} cluster:{c}"),
            (Some(t), None) => format!("team:{t}"),
            (None, Some(c)) => format!("cluster:{c}"),
            (None, None) => "route".into(),
        }
    }

    /// A team's route takes what is that team's alone (every team named is it), as a team's
    /// viewer sees it: one shared with another team is the fleet's, and its link would open
    /// for neither team.
    fn matches(&self, cluster: &str, teams: &[String]) -> bool {
        let team_ok = self
            .team
            .as_ref()
            .is_none_or(|t| !teams.is_empty() && teams.iter().all(|x| x == t));
        let cluster_ok = self.cluster.as_ref().is_none_or(|c| c == cluster);
        (self.team.is_some() || self.cluster.is_some()) && team_ok && cluster_ok
    }
}

pub const DEFAULT_ROUTE: &str = "default";

impl SlackConfig {
    /// The route an incident about `cluster` owned by `teams` goes to, by label.
    pub fn route_for(&self, cluster: &str, teams: &[String]) -> Option<String> {
        self.routes
            .iter()
            .find(|r| r.matches(cluster, teams))
            .map(SlackRoute::label)
            .or_else(|| {
                self.default_webhook
                    .as_ref()
                    .map(|_| DEFAULT_ROUTE.to_owned())
            })
    }

    /// The webhook behind a route label, looked up when sending so no URL is ever stored.
    pub fn webhook(&self, label: &str) -> Option<&str> {
        if label == DEFAULT_ROUTE {
            return self.default_webhook.as_ref().map(|s| s.0.as_str());
        }
        self.routes
            .iter()
            .find(|r| r.label() == label)
            .map(|r| r.webhook.0.as_str())
    }

    /// Every route label, the default first.
    pub fn labels(&self) -> Vec<String> {
        let mut out: Vec<String> = self
            .default_webhook
            .iter()
            .map(|_| DEFAULT_ROUTE.to_owned())
            .collect();
        out.extend(self.routes.iter().map(SlackRoute::label));
        out
    }
}

#[derive(Debug, thiserror::Error)]
#[error("{path}: {message}")]
pub struct ConfigError {
    pub path: String,
    pub message: String,
}

impl Config {
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
            path: path.display().to_string(),
            message: e.to_string(),
        })?;
        Config::parse(&text, &path.display().to_string())
    }

    /// A config file's text, checked as [`Config::load`] checks it; `path` names it in errors.
    pub fn parse(text: &str, path: &str) -> Result<Config, ConfigError> {
        let err = |message: String| ConfigError {
            path: path.to_owned(),
            message,
        };
        let config: Config = toml::from_str(text).map_err(|e| err(e.to_string()))?;
        let thresholds = std::iter::once(config.idle.threshold_percent).chain(
            config
                .idle
                .clusters
                .values()
                .filter_map(|o| o.threshold_percent),
        );
        for t in thresholds {
            if !(0.0..=100.0).contains(&t) {
                return Err(err(format!("threshold_percent {t} is not within 0..=100")));
            }
        }
        let b = &config.budgets;
        if let Some(p) = b
            .alert_spent_percent
            .iter()
            .chain(&b.alert_forecast_percent)
            .find(|p| !(1..=1000).contains(*p))
        {
            return Err(err(format!(
                "[budgets] alert percent {p} is not within 1..=1000"
            )));
        }
        let a = &config.anomalies;
        if a.min_increase <= rust_decimal::Decimal::ZERO {
            return Err(err(
                "[anomalies] min_increase must be more than 0: on a steady history any rise \
                 would be an anomaly"
                    .into(),
            ));
        }
        if a.min_increase_percent > 1000 {
            return Err(err(format!(
                "[anomalies] min_increase_percent {} is not within 0..=1000",
                a.min_increase_percent
            )));
        }
        config
            .carbon
            .check()
            .map_err(|e| err(format!("[carbon] {e}")))?;
        if let Some((id, day)) = config
            .commitments
            .ends
            .iter()
            .find(|(_, day)| last_day_end_ms(day).is_none())
        {
            return Err(err(format!(
                "[commitments.ends] {id:?} = {day:?} is not a date written YYYY-MM-DD"
            )));
        }
        if let Some(o) = &config.oidc {
            check_oidc(o).map_err(|m| err(format!("[oidc] {m}")))?;
        }
        let names: Vec<&str> = config.owners.names().collect();
        if let Some(d) = a.dimensions.iter().find(|d| !names.contains(&d.as_str())) {
            return Err(err(format!(
                "[anomalies] dimension {d:?} is none of the owner dimensions {}",
                names.join(", ")
            )));
        }
        if let Some(d) = config
            .metrics
            .dimensions
            .iter()
            .find(|d| !names.contains(&d.as_str()))
        {
            return Err(err(format!(
                "[metrics] dimension {d:?} is none of the owner dimensions {}",
                names.join(", ")
            )));
        }
        // The gauges' own labels: a dimension of that name would be two labels of one name.
        if let Some(d) = names.iter().find(|d| {
            ["state", "currency"].contains(d)
                && config
                    .metrics
                    .dimensions(&config.owners)
                    .iter()
                    .any(|x| x == *d)
        }) {
            return Err(err(format!(
                "[metrics] the owner dimension {d:?} cannot label the gauges (they have a label \
                 of that name); list the others in [metrics] dimensions"
            )));
        }
        if let Some(app) = &config.slack.app {
            check_signing_secret(&app.signing_secret.0)
                .map_err(|m| err(format!("[slack.app] {m}")))?;
            if reqwest::Url::parse(&app.response_url_prefix).is_err() {
                return Err(err(format!(
                    "[slack.app] response_url_prefix {:?} is not a URL",
                    app.response_url_prefix
                )));
            }
        }
        if let Some(e) = &config.export {
            if e.bucket.trim().is_empty() {
                return Err(err("[export] bucket is empty".into()));
            }
            if e.formats.is_empty() {
                return Err(err(
                    "[export] formats names none; give \"csv\", \"parquet\" or both".into(),
                ));
            }
            if !(1..=366).contains(&e.catch_up_days) {
                return Err(err(format!(
                    "[export] catch_up_days {} is not within 1..=366",
                    e.catch_up_days
                )));
            }
            if e.check_every < Duration::from_secs(1) {
                return Err(err("[export] check_every is under a second".into()));
            }
        }
        if config.metrics.max_series < 10 {
            return Err(err(format!(
                "[metrics] max_series {} is too few: each cluster, state and currency needs one",
                config.metrics.max_series
            )));
        }
        Ok(config)
    }
}

#[cfg(test)]
mod tests;
