//! Allocation reports: attributed parts grouped by an owner label or a fleet dimension, per
//! hour, day or month, as JSON rows, CSV, or FOCUS 1.3 allocation rows for finance tools.

use std::collections::BTreeMap;

use chrono::{DateTime, NaiveDate, TimeZone, Utc};
use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};

use crate::attribution::{Attribution, Kind, Part};
use crate::carbon::{Footprint, Grid};
use crate::figures::Sum;
use crate::owners::{intern, OwnerSchema, Role};
use crate::time::{month_of, rfc3339, HOUR_MS};

/// What allocation rows are keyed by: an owner dimension of the schema, or a fleet dimension.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum GroupBy {
    /// An owner dimension, by name (see [`crate::owners`]).
    Owner(&'static str),
    Cluster,
    Host,
    /// A GPU or MIG instance, by UUID.
    Gpu,
    InstanceType,
    PricingCategory,
}

impl GroupBy {
    /// The default owner dimensions, where code means them by name.
    pub const MODEL: GroupBy = GroupBy::Owner("model");
    pub const EXPERIMENT: GroupBy = GroupBy::Owner("experiment");
    pub const ENDPOINT: GroupBy = GroupBy::Owner("endpoint");
    pub const TEAM: GroupBy = GroupBy::Owner("team");

    /// The dimensions every fleet has, whatever its owner schema.
    pub const FLEET: [GroupBy; 5] = [
        GroupBy::Cluster,
        GroupBy::Host,
        GroupBy::Gpu,
        GroupBy::InstanceType,
        GroupBy::PricingCategory,
    ];

    /// The schema's owner dimensions, then the fleet's.
    pub fn all(schema: &OwnerSchema) -> Vec<GroupBy> {
        schema
            .names()
            .map(|n| GroupBy::Owner(intern(n)))
            .chain(GroupBy::FLEET)
            .collect()
    }

    /// The owner dimension playing `role`, if the schema has one.
    pub fn role(schema: &OwnerSchema, role: Role) -> Option<GroupBy> {
        schema.role(role).map(|n| GroupBy::Owner(intern(n)))
    }

    pub fn as_str(self) -> &'static str {
        match self {
            GroupBy::Owner(name) => name,
            GroupBy::Cluster => "cluster",
            GroupBy::Host => "host",
            GroupBy::Gpu => "gpu",
            GroupBy::InstanceType => "instance_type",
            GroupBy::PricingCategory => "pricing_category",
        }
    }

    /// A dimension by name: one of the schema's or the fleet's.
    pub fn parse(s: &str, schema: &OwnerSchema) -> Option<GroupBy> {
        GroupBy::all(schema).into_iter().find(|g| g.as_str() == s)
    }

    pub fn is_owner(self) -> bool {
        matches!(self, GroupBy::Owner(_))
    }
}

impl Serialize for GroupBy {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

/// A name, as serialized: the owner dimensions come from each server's config, so the
/// description lists the fleet ones and the default owner ones rather than a closed enum.
#[cfg(feature = "openapi")]
impl utoipa::PartialSchema for GroupBy {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        utoipa::openapi::ObjectBuilder::new()
            .schema_type(utoipa::openapi::schema::Type::String)
            .description(Some(
                "A dimension by name: an owner dimension of the server's owner schema (model, \
                 experiment, endpoint and team unless configured otherwise) or a fleet \
                 dimension: cluster, host, gpu, instance_type, pricing_category.",
            ))
            .examples(["team"])
            .into()
    }
}

#[cfg(feature = "openapi")]
impl utoipa::ToSchema for GroupBy {}

/// Keeps the parts whose key under each `(dimension, value)` equals the value: the parts a
/// drill-down page (and the API's filter parameters) are about. Bill lines that are not GPU
/// hosts belong to no key, so a filtered view has none.
pub fn filtered(attribution: &Attribution, filters: &[(GroupBy, String)]) -> Attribution {
    if filters.is_empty() {
        return attribution.clone();
    }
    Attribution {
        parts: attribution
            .parts
            .iter()
            .filter(|p| {
                filters
                    .iter()
                    .all(|(by, value)| key_of(p, *by, attribution) == *value)
            })
            .cloned()
            .collect(),
        unattributed: BTreeMap::new(),
        unattributed_hours: BTreeMap::new(),
        hosts: attribution.hosts.clone(),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum Step {
    Hour,
    Day,
    Month,
}

/// Keys for costs that belong to nobody in particular.
pub const IDLE_KEY: &str = "(idle)";
pub const UNMONITORED_KEY: &str = "(unmonitored)";
pub const UNLABELED_KEY: &str = "(unlabeled)";
/// Work or memory of processes the agent cannot see (an owner, not a bucket of time).
pub use crate::owners::UNSEEN_OWNER as UNSEEN_KEY;

#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AllocationRow {
    /// RFC 3339, UTC.
    pub period_start: String,
    pub key: String,
    pub currency: String,
    /// Everything attributed to this key: used + held idle + idle + unmonitored.
    #[serde(with = "rust_decimal::serde::str")]
    pub cost: Decimal,
    #[serde(with = "rust_decimal::serde::str")]
    pub used_cost: Decimal,
    #[serde(with = "rust_decimal::serde::str")]
    pub held_idle_cost: Decimal,
    #[serde(with = "rust_decimal::serde::str")]
    pub idle_cost: Decimal,
    #[serde(with = "rust_decimal::serde::str")]
    pub unmonitored_cost: Decimal,
    #[serde(serialize_with = "crate::figures::four")]
    pub gpu_hours: f64,
    /// GPU utilization (%) averaged over this key's GPU time, where known.
    #[serde(serialize_with = "crate::figures::two_or_null")]
    pub avg_util: Option<f64>,
    /// Used GPU-hours measured by presence: on devices nothing measures the activity of (an
    /// A100's or A30's MIG devices), where a process holding the device counts as using it.
    #[serde(serialize_with = "crate::figures::four")]
    pub presence_gpu_hours: f64,
    /// Energy measured by NVML for this key's GPU time, in kWh: null where none of it was
    /// measured (GPUs without an energy counter), a floor where only part was
    /// (`energy_measured_share` below 1).
    #[serde(serialize_with = "crate::figures::four_or_null")]
    pub energy_kwh: Option<f64>,
    /// The share of this key's GPU time (0 to 1) whose energy was measured.
    #[serde(serialize_with = "crate::figures::four_or_null")]
    pub energy_measured_share: Option<f64>,
    /// kg CO2e of the measured energy, from the grid intensity where each host runs
    /// (docs/carbon.md): null where no energy was measured or some was drawn where the grid's
    /// intensity is unknown.
    #[serde(serialize_with = "crate::figures::four_or_null")]
    pub kg_co2e: Option<f64>,
    /// Whether any part comes from the rate card rather than a bill.
    pub estimated: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Totals {
    pub currency: String,
    #[serde(with = "rust_decimal::serde::str")]
    pub cost: Decimal,
    #[serde(with = "rust_decimal::serde::str")]
    pub held_idle_cost: Decimal,
    #[serde(with = "rust_decimal::serde::str")]
    pub idle_cost: Decimal,
    #[serde(with = "rust_decimal::serde::str")]
    pub unmonitored_cost: Decimal,
    /// On the bill in this range but for resources that are not GPU hosts gpuledger knows.
    #[serde(with = "rust_decimal::serde::str")]
    pub unattributed_cost: Decimal,
    #[serde(serialize_with = "crate::figures::four")]
    pub gpu_hours: f64,
    /// As the rows': null where nothing was measured.
    #[serde(serialize_with = "crate::figures::four_or_null")]
    pub energy_kwh: Option<f64>,
    #[serde(serialize_with = "crate::figures::four_or_null")]
    pub energy_measured_share: Option<f64>,
    #[serde(serialize_with = "crate::figures::four_or_null")]
    pub kg_co2e: Option<f64>,
}

pub fn period_start(ms: i64, step: Step) -> i64 {
    match step {
        Step::Hour => ms.div_euclid(HOUR_MS) * HOUR_MS,
        Step::Day => ms.div_euclid(24 * HOUR_MS) * 24 * HOUR_MS,
        Step::Month => crate::time::month_start_ms(ms),
    }
}

/// The key a part counts under.
pub fn key_of(part: &Part, by: GroupBy, attribution: &Attribution) -> String {
    key_str(part, by, attribution).to_owned()
}

/// [`key_of`], borrowed from the part or its host: what a sum over many parts compares without
/// copying a text per part.
pub fn key_str<'a>(part: &'a Part, by: GroupBy, attribution: &'a Attribution) -> &'a str {
    let host = attribution.hosts.get(&part.host_id);
    let label = |v: Option<&'a str>| match part.kind {
        Kind::Idle => IDLE_KEY,
        // Time nobody watched belongs to whom the bill's tag or the cluster map names as the
        // machine's owner (no process label reaches it); to the bucket where neither does.
        Kind::Unmonitored => v.unwrap_or(UNMONITORED_KEY),
        Kind::Used | Kind::HeldIdle => v.unwrap_or(UNLABELED_KEY),
    };
    match by {
        GroupBy::Owner(name) => label(part.owner.get(name)),
        GroupBy::Cluster => host.map_or("?", |h| h.cluster.as_str()),
        GroupBy::Host => host.map_or("?", |h| h.hostname.as_str()),
        GroupBy::Gpu => part.gpu_uuid.as_deref().unwrap_or("(no GPU data)"),
        GroupBy::InstanceType => host
            .and_then(|h| h.instance_type.as_deref())
            .unwrap_or("(unknown)"),
        GroupBy::PricingCategory => part.pricing_category.as_str(),
    }
}

#[derive(Default)]
struct Acc {
    cost: Decimal,
    used: Decimal,
    held: Decimal,
    idle: Decimal,
    unmonitored: Decimal,
    gpu_seconds: Sum,
    util_gpu_seconds: Sum,
    util_known_seconds: Sum,
    /// Used GPU time with no utilization behind it.
    presence_seconds: Sum,
    footprint: Footprint,
    estimated: bool,
}

impl Acc {
    fn add(&mut self, p: &Part, grid: &Grid) {
        self.cost += p.cost;
        match p.kind {
            Kind::Used => {
                self.used += p.cost;
                self.presence_seconds += (p.gpu_seconds - p.util_known_seconds).max(0.0);
            }
            Kind::HeldIdle => self.held += p.cost,
            Kind::Idle => self.idle += p.cost,
            Kind::Unmonitored => self.unmonitored += p.cost,
        }
        self.gpu_seconds += p.gpu_seconds;
        self.util_gpu_seconds += p.util_gpu_seconds;
        self.util_known_seconds += p.util_known_seconds;
        self.footprint.add(
            p.energy_j,
            p.energy_known_seconds,
            p.gpu_seconds,
            grid.of(p.host_id),
        );
        self.estimated |= p.estimated;
    }

    fn merge(&mut self, o: &Acc) {
        self.cost += o.cost;
        self.used += o.used;
        self.held += o.held;
        self.idle += o.idle;
        self.unmonitored += o.unmonitored;
        self.gpu_seconds += o.gpu_seconds;
        self.util_gpu_seconds += o.util_gpu_seconds;
        self.util_known_seconds += o.util_known_seconds;
        self.presence_seconds += o.presence_seconds;
        self.footprint.merge(&o.footprint);
        self.estimated |= o.estimated;
    }

    fn row(&self, period: i64, key: &str, currency: &str) -> AllocationRow {
        AllocationRow {
            period_start: rfc3339(period),
            key: key.to_owned(),
            currency: currency.to_owned(),
            cost: self.cost,
            used_cost: self.used,
            held_idle_cost: self.held,
            idle_cost: self.idle,
            unmonitored_cost: self.unmonitored,
            gpu_hours: self.gpu_seconds.get() / 3600.0,
            avg_util: (self.util_known_seconds.get() > 0.0)
                .then(|| self.util_gpu_seconds.get() / self.util_known_seconds.get()),
            presence_gpu_hours: presence_hours(self.presence_seconds.get()),
            energy_kwh: self.footprint.energy_kwh(),
            energy_measured_share: self.footprint.measured_share(),
            kg_co2e: self.footprint.kg_co2e(),
            estimated: self.estimated,
        }
    }
}

/// GPU-hours from seconds, where a few float crumbs of time measured elsewhere are nothing.
fn presence_hours(seconds: f64) -> f64 {
    if seconds < 1e-6 {
        0.0
    } else {
        seconds / 3600.0
    }
}

/// Rows ordered by period, then by cost (largest first), then key; emissions from each host's
/// intensity in `grid`.
pub fn group(
    attribution: &Attribution,
    by: GroupBy,
    step: Step,
    grid: &Grid,
) -> Vec<AllocationRow> {
    // Borrowed keys: a month of a large fleet has a part per host and owner, and this runs once
    // per table.
    let mut acc: BTreeMap<(i64, &str, &str), Acc> = BTreeMap::new();
    for p in &attribution.parts {
        let k = (
            period_start(p.hour_ms, step),
            key_str(p, by, attribution),
            p.currency.as_str(),
        );
        acc.entry(k).or_default().add(p, grid);
    }
    let mut rows: Vec<(i64, AllocationRow)> = acc
        .into_iter()
        .map(|((period, key, currency), a)| (period, a.row(period, key, currency)))
        .collect();
    rows.sort_by(|(pa, a), (pb, b)| pa.cmp(pb).then(b.cost.cmp(&a.cost)).then(a.key.cmp(&b.key)));
    rows.into_iter().map(|(_, r)| r).collect()
}

/// A table as a page shows it: the costliest keys, and the others summed into one row.
#[derive(Debug, Clone, PartialEq)]
pub struct Costliest {
    pub rows: Vec<AllocationRow>,
    /// The keys past the first ones, summed (their key is empty), and how many they are.
    pub rest: Option<(usize, AllocationRow)>,
}

/// The `keep` costliest keys of `by` in `currency` over the whole of `attribution` (one period:
/// a page's month), largest first, then by key, as [`group`] orders them; the rest (two or more)
/// summed exactly into one row, so the table still adds up to its total. The API and CSV list
/// every key.
pub fn costliest(
    attribution: &Attribution,
    by: GroupBy,
    currency: &str,
    grid: &Grid,
    keep: usize,
) -> Costliest {
    let mut acc: BTreeMap<&str, Acc> = BTreeMap::new();
    let mut first_hour = None::<i64>;
    for p in attribution.parts.iter().filter(|p| p.currency == currency) {
        first_hour = Some(first_hour.map_or(p.hour_ms, |h| h.min(p.hour_ms)));
        acc.entry(key_str(p, by, attribution))
            .or_default()
            .add(p, grid);
    }
    let period = period_start(first_hour.unwrap_or(0), Step::Month);
    let mut keys: Vec<(&str, Acc)> = acc.into_iter().collect();
    keys.sort_by(|(ka, a), (kb, b)| b.cost.cmp(&a.cost).then(ka.cmp(kb)));
    // One key left over is shown as itself: "1 more" would hide its name and save no row.
    let cut = if keys.len() == keep + 1 {
        keys.len()
    } else {
        keep.min(keys.len())
    };
    let others = keys.split_off(cut);
    let rest = (!others.is_empty()).then(|| {
        let mut sum = Acc::default();
        for (_, a) in &others {
            sum.merge(a);
        }
        (others.len(), sum.row(period, "", currency))
    });
    Costliest {
        rows: keys
            .iter()
            .map(|(key, a)| a.row(period, key, currency))
            .collect(),
        rest,
    }
}

/// The currency pages about `attribution` show: the one carrying the most of its money,
/// attributed or not ([`crate::money::main_currency`]).
pub fn main_currency(attribution: &Attribution) -> String {
    crate::money::main_currency(
        attribution
            .parts
            .iter()
            .map(|p| (p.currency.as_str(), p.cost))
            .chain(
                attribution
                    .unattributed
                    .iter()
                    .map(|(c, d)| (c.as_str(), *d)),
            ),
    )
}

/// A range's attribution in the one currency a page shows, and what the bill carries in each
/// other currency (attributed and not): listed apart, never added in.
pub struct InCurrency {
    pub currency: String,
    pub attribution: Attribution,
    pub others: Vec<(String, Decimal)>,
}

/// [`InCurrency`] for the range's main currency.
pub fn in_main_currency(attribution: &Attribution) -> InCurrency {
    in_currency(attribution, &main_currency(attribution))
}

/// [`InCurrency`] for `currency`.
pub fn in_currency(attribution: &Attribution, currency: &str) -> InCurrency {
    let mut others: BTreeMap<String, Decimal> = BTreeMap::new();
    for p in attribution.parts.iter().filter(|p| p.currency != currency) {
        *others.entry(p.currency.clone()).or_default() += p.cost;
    }
    for (c, d) in attribution
        .unattributed
        .iter()
        .filter(|(c, _)| *c != currency)
    {
        *others.entry(c.clone()).or_default() += *d;
    }
    InCurrency {
        currency: currency.to_owned(),
        attribution: Attribution {
            parts: attribution
                .parts
                .iter()
                .filter(|p| p.currency == currency)
                .cloned()
                .collect(),
            unattributed: attribution
                .unattributed
                .iter()
                .filter(|(c, _)| *c == currency)
                .map(|(c, d)| (c.clone(), *d))
                .collect(),
            unattributed_hours: attribution
                .unattributed_hours
                .iter()
                .filter(|((_, c), _)| c == currency)
                .map(|(k, d)| (k.clone(), *d))
                .collect(),
            hosts: attribution.hosts.clone(),
        },
        others: others.into_iter().collect(),
    }
}

pub fn totals(attribution: &Attribution, grid: &Grid) -> Vec<Totals> {
    let mut acc: BTreeMap<String, Acc> = BTreeMap::new();
    for p in &attribution.parts {
        acc.entry(p.currency.clone()).or_default().add(p, grid);
    }
    for currency in attribution.unattributed.keys() {
        acc.entry(currency.clone()).or_default();
    }
    acc.into_iter()
        .map(|(currency, a)| Totals {
            unattributed_cost: attribution
                .unattributed
                .get(&currency)
                .copied()
                .unwrap_or_default(),
            currency,
            cost: a.cost,
            held_idle_cost: a.held,
            idle_cost: a.idle,
            unmonitored_cost: a.unmonitored,
            gpu_hours: a.gpu_seconds.get() / 3600.0,
            energy_kwh: a.footprint.energy_kwh(),
            energy_measured_share: a.footprint.measured_share(),
            kg_co2e: a.footprint.kg_co2e(),
        })
        .collect()
}

/// Parses a range bound: `YYYY-MM`, `YYYY-MM-DD` or RFC 3339.
pub fn parse_bound(text: &str) -> Option<i64> {
    let t = text.trim();
    if let Ok(d) = DateTime::parse_from_rfc3339(t) {
        return Some(d.timestamp_millis());
    }
    if let Ok(d) = NaiveDate::parse_from_str(t, "%Y-%m-%d") {
        return Some(
            Utc.from_utc_datetime(&d.and_hms_opt(0, 0, 0)?)
                .timestamp_millis(),
        );
    }
    let (y, m) = t.split_once('-')?;
    let d = NaiveDate::from_ymd_opt(y.parse().ok()?, m.parse().ok()?, 1)?;
    Some(
        Utc.from_utc_datetime(&d.and_hms_opt(0, 0, 0)?)
            .timestamp_millis(),
    )
}

/// `[start, end)` of a calendar month written `YYYY-MM`; `None` for anything else.
pub fn calendar_month(text: &str) -> Option<(i64, i64)> {
    if text.len() != 7 {
        return None;
    }
    Some(month_of(parse_bound(text)?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::HostRow;
    use std::collections::HashMap;

    /// `hours` GPU-hours at `util` % for `team`, costing `cost`, in `currency`.
    fn part(team: &str, kind: Kind, cost: &str, hours: f64, util: f64, currency: &str) -> Part {
        Part {
            hour_ms: 1_777_593_600_000 + 3 * HOUR_MS,
            host_id: 1,
            gpu_uuid: Some("GPU-1".into()),
            owner: [("team", team)].into_iter().collect(),
            kind,
            pricing_category: "on_demand".into(),
            currency: currency.into(),
            cost: cost.parse().unwrap(),
            estimated: false,
            gpu_seconds: hours * 3600.0,
            util_gpu_seconds: util * hours * 3600.0,
            util_known_seconds: hours * 3600.0,
            energy_j: hours * 3.6e6,
            energy_known_seconds: hours * 3600.0,
        }
    }

    fn attribution(parts: Vec<Part>) -> Attribution {
        let host = HostRow {
            id: 1,
            cluster: "c".into(),
            hostname: "h1".into(),
            ..Default::default()
        };
        Attribution {
            parts,
            unattributed: BTreeMap::new(),
            unattributed_hours: BTreeMap::new(),
            hosts: HashMap::from([(1, host)]),
        }
    }

    /// A float sum depends on its order: `(0.1 + 0.2) + 0.3` and `0.1 + (0.2 + 0.3)` differ in
    /// the last bit. A kept copy that reads the same hours in another order must still say the
    /// same GPU-hours, utilization and energy, to the bit.
    #[test]
    fn a_rows_figures_do_not_depend_on_the_order_of_its_parts() {
        assert_ne!((0.1 + 0.2) + 0.3, 0.1 + (0.2 + 0.3));
        // GPU-seconds whose float sum forward and backward differ.
        let hours = [1.62, 2.06, 2.178, 0.67, 2.818, 0.7];
        let seconds = hours.map(|h| h * 3600.0);
        assert_ne!(
            seconds.iter().fold(0.0, |s, x| s + x),
            seconds.iter().rev().fold(0.0, |s, x| s + x)
        );
        let parts: Vec<Part> = hours
            .iter()
            .map(|&h| part("t", Kind::Used, "1", h, 37.0, "USD"))
            .collect();
        let grid = Grid::unknown();
        let forward = group(
            &attribution(parts.clone()),
            GroupBy::TEAM,
            Step::Month,
            &grid,
        );
        let mut reversed = parts;
        reversed.reverse();
        let backward = group(
            &attribution(reversed.clone()),
            GroupBy::TEAM,
            Step::Month,
            &grid,
        );
        assert_eq!(forward, backward);
        let rotated: Vec<Part> = reversed[2..]
            .iter()
            .chain(&reversed[..2])
            .cloned()
            .collect();
        let r = group(&attribution(rotated), GroupBy::TEAM, Step::Month, &grid);
        for row in [&backward[0], &r[0]] {
            assert_eq!(
                (row.gpu_hours.to_bits(), row.avg_util.map(f64::to_bits)),
                (
                    forward[0].gpu_hours.to_bits(),
                    forward[0].avg_util.map(f64::to_bits)
                )
            );
            assert_eq!(
                row.energy_kwh.map(f64::to_bits),
                forward[0].energy_kwh.map(f64::to_bits)
            );
        }
        assert_eq!(
            totals(&attribution(reversed.clone()), &grid),
            totals(&attribution(reversed.into_iter().rev().collect()), &grid)
        );
    }

    #[test]
    fn the_costliest_keys_are_shown_and_the_rest_summed_to_the_cent() {
        let a = attribution(vec![
            part("a", Kind::Used, "0.10", 1.0, 10.0, "USD"),
            part("b", Kind::Used, "5.00", 2.0, 50.0, "USD"),
            part("c", Kind::HeldIdle, "0.333333", 3.0, 0.0, "USD"),
            part("c", Kind::Used, "0.666667", 1.0, 90.0, "USD"),
            part("d", Kind::Used, "3.00", 1.0, 30.0, "USD"),
            part("e", Kind::Used, "0.10", 1.0, 20.0, "USD"),
            // Another currency is not this table's.
            part("f", Kind::Used, "99", 1.0, 20.0, "EUR"),
        ]);
        let grid = Grid::unknown();
        let t = costliest(&a, GroupBy::TEAM, "USD", &grid, 2);
        let keys: Vec<_> = t.rows.iter().map(|r| r.key.as_str()).collect();
        assert_eq!(keys, ["b", "d"]);
        let (n, rest) = t.rest.clone().unwrap();
        assert_eq!(n, 3);
        // c (1.00 with 0.333333 held idle), a and e: exactly, and with their own utilization.
        assert_eq!(rest.cost, "1.200000".parse::<Decimal>().unwrap());
        assert_eq!(rest.held_idle_cost, "0.333333".parse::<Decimal>().unwrap());
        assert_eq!(rest.gpu_hours, 6.0);
        assert_eq!(rest.avg_util, Some((90.0 + 10.0 + 20.0) / 6.0));
        assert_eq!(rest.energy_kwh, Some(6.0));
        // Every key of the full grouping is in the table or the rest, to the same total.
        let all = group(&a, GroupBy::TEAM, Step::Month, &grid);
        let usd: Vec<_> = all.iter().filter(|r| r.currency == "USD").collect();
        let shown: Decimal = t.rows.iter().map(|r| r.cost).sum::<Decimal>() + rest.cost;
        assert_eq!(shown, usd.iter().map(|r| r.cost).sum::<Decimal>());
        assert_eq!(&t.rows[0], usd[0]);
        // Ties go by key; keeping as many as there are, or all but one, leaves no rest.
        for keep in [4, 5, 10] {
            let t = costliest(&a, GroupBy::TEAM, "USD", &grid, keep);
            let keys: Vec<_> = t.rows.iter().map(|r| r.key.as_str()).collect();
            assert_eq!(keys, ["b", "d", "c", "a", "e"], "keeping {keep}");
            assert_eq!(t.rest, None);
        }
    }

    #[test]
    fn bounds_and_periods() {
        assert_eq!(parse_bound("2026-05"), Some(1_777_593_600_000));
        assert_eq!(parse_bound("2026-05-01"), Some(1_777_593_600_000));
        assert_eq!(parse_bound("2026-05-01T00:00:00Z"), Some(1_777_593_600_000));
        assert_eq!(parse_bound("May"), None);
        let (s, e) = month_of(1_777_593_600_000 + 5 * 86_400_000);
        assert_eq!(
            (s, e),
            (1_777_593_600_000, 1_777_593_600_000 + 31 * 86_400_000)
        );
        assert_eq!(
            rfc3339(period_start(1_777_593_600_000 + 90 * 60_000, Step::Hour)),
            "2026-05-01T01:00:00Z"
        );
        assert_eq!(
            rfc3339(period_start(1_777_593_600_000 + 30 * 3_600_000, Step::Day)),
            "2026-05-02T00:00:00Z"
        );
    }
}
