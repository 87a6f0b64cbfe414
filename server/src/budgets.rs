//! Budgets against the month: each budget in force, what its owner has spent, and where the
//! month is heading ([`gpuledger_core::budget`]), all from the hourly ledger.

use std::collections::{BTreeMap, BTreeSet};

use rust_decimal::Decimal;
use serde::Serialize;

use crate::ledger;
use crate::store::budgets::BudgetRow;
use crate::store::{RollupGrain, Store, StoreError};
use gpuledger_core::allocation::key_of;
use gpuledger_core::allocation::GroupBy;
use gpuledger_core::budget::{forecast, in_force, PATTERN_WEEKS};
use gpuledger_core::budget::{Budget, Forecast, Standing};
use gpuledger_core::owners::OwnerSchema;
use gpuledger_core::owners::Role;
use gpuledger_core::scope::Scope;
use gpuledger_core::time::{day_floor, month_label, DAY_MS};

/// One budget in force, against its owner's month.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct BudgetStatus {
    pub dimension: String,
    pub key: String,
    /// The month it was set from (`YYYY-MM`).
    pub from_month: String,
    #[serde(with = "rust_decimal::serde::str")]
    pub amount: Decimal,
    pub currency: String,
    pub set_by: String,
    #[serde(flatten)]
    pub forecast: Forecast,
    pub standing: Standing,
}

impl BudgetStatus {
    /// How far the month is heading past the budget: the page's order (most at risk first).
    pub fn risk(&self) -> Decimal {
        if self.forecast.expected.is_zero() {
            return Decimal::ZERO;
        }
        self.forecast
            .expected
            .checked_div(self.amount)
            .unwrap_or(Decimal::MAX)
    }
}

fn budget_of(row: &BudgetRow) -> Option<Budget> {
    Some(Budget {
        dimension: row.dimension.clone(),
        key: row.owner_key.clone(),
        from_month_ms: row.from_month_ms,
        amount: row.amount.parse().ok()?,
        currency: row.currency.clone(),
    })
}

/// The budgets in force in the month `[from, to)` at `now`, each with its owner's spend and
/// forecast; most at risk first. A team-scoped reader sees its teams' budgets, and those of
/// other owners (a model, an endpoint) whose spend in the months read is all its teams': never
/// a figure that includes another team's spend.
pub async fn for_month(
    store: &dyn Store,
    (schema, scope): (&OwnerSchema, &Scope),
    (from, to): (i64, i64),
    now: i64,
) -> Result<Vec<BudgetStatus>, StoreError> {
    let rows = crate::store::budgets::budgets(store.db()).await?;
    let budgets: Vec<(Budget, &BudgetRow)> = rows
        .iter()
        .filter_map(|r| budget_of(r).map(|b| (b, r)))
        .collect();
    let all: Vec<Budget> = budgets.iter().map(|(b, _)| b.clone()).collect();
    let held = in_force(&all, from);
    if held.is_empty() {
        return Ok(Vec::new());
    }
    let until = now.min(to).max(from);
    // The weeks before today are the pattern, whichever month is asked for.
    let load_from = (day_floor(now) - PATTERN_WEEKS * 7 * DAY_MS).min(from);
    // Cost per (dimension, key, currency, day), for the dimensions budgets name.
    let mut dimensions: Vec<(String, GroupBy)> = held
        .iter()
        .filter_map(|b| GroupBy::parse(&b.dimension, schema).map(|g| (b.dimension.clone(), g)))
        .collect();
    dimensions.sort();
    dimensions.dedup();
    let by: Vec<GroupBy> = dimensions.iter().map(|(_, g)| *g).collect();
    // Which keys a scoped reader holds needs no day: the range summed per host.
    let held_in_range = async {
        if scope.is_all() {
            return Ok(None);
        }
        ledger::load(store, load_from, until, RollupGrain::HostRange)
            .await
            .map(Some)
    };
    let (daily, first, ranged) = tokio::try_join!(
        ledger::daily_spend(store, &by, (load_from, until), ledger::Keep::NOTHING),
        crate::store::ledger::first_day(store.db()),
        held_in_range,
    )?;
    // What a scoped reader sees: its teams' budgets, and the owners wholly its teams'.
    let wholly: BTreeMap<&str, Option<BTreeSet<String>>> = dimensions
        .iter()
        .map(|(name, by)| {
            let held = ranged
                .as_ref()
                .and_then(|ledger| scope.held_keys(ledger, *by, schema));
            (name.as_str(), held)
        })
        .collect();
    let team = schema.role(Role::Team);
    let visible = |b: &Budget| {
        scope.is_all()
            || (Some(b.dimension.as_str()) == team && scope.admits_team(&b.key))
            || wholly
                .get(b.dimension.as_str())
                .is_some_and(|keys| keys.as_ref().is_none_or(|k| k.contains(&b.key)))
    };
    let mut out: Vec<BudgetStatus> = held
        .into_iter()
        .filter(|b| visible(b))
        .map(|b| {
            let days: BTreeMap<i64, Decimal> = GroupBy::parse(&b.dimension, schema)
                .and_then(|by| daily.get(&(by, b.key.clone(), b.currency.clone())))
                .map(|days| days.iter().map(|(d, spend)| (*d, spend.cost)).collect())
                .unwrap_or_default();
            let f = forecast(&days, (from, to), first.unwrap_or(from), now);
            let set_by = budgets
                .iter()
                .find(|(x, _)| x == b)
                .map_or_else(String::new, |(_, r)| r.set_by.clone());
            BudgetStatus {
                dimension: b.dimension.clone(),
                key: b.key.clone(),
                from_month: month_label(b.from_month_ms),
                amount: b.amount,
                currency: b.currency.clone(),
                set_by,
                standing: if now < from {
                    Standing::NotBegun
                } else {
                    Standing::of(b.amount, &f)
                },
                forecast: f,
            }
        })
        .collect();
    out.sort_by(|a, b| {
        a.standing
            .cmp(&b.standing)
            .then(b.risk().cmp(&a.risk()))
            .then(a.key.cmp(&b.key))
    });
    Ok(out)
}

/// Why a budget cannot be set as asked.
#[derive(Debug, thiserror::Error)]
pub enum BudgetError {
    #[error("{message}")]
    Invalid {
        field: &'static str,
        message: String,
    },
    #[error(transparent)]
    Store(#[from] StoreError),
}

fn invalid(field: &'static str, message: impl Into<String>) -> BudgetError {
    BudgetError::Invalid {
        field,
        message: message.into(),
    }
}

/// A budget as an admin asks for it, checked: a known dimension, a key the ledger has seen in
/// the two months before `from_month` or since, an amount that is a decimal ≥ 0 with at most six
/// decimals, a currency code the key is billed in. Nothing is stored when any of it is wrong.
pub struct SetBudget<'a> {
    pub dimension: &'a str,
    pub key: &'a str,
    pub amount: &'a str,
    pub currency: &'a str,
    pub from_month: &'a str,
}

/// A budget as asked, its fields checked on their own (before the ledger is asked about its
/// key): what the fuzz target drives.
#[derive(Debug, Clone, PartialEq)]
pub struct CheckedBudget {
    pub by: GroupBy,
    pub key: String,
    pub amount: Decimal,
    pub currency: String,
    pub month_from: i64,
    pub month_to: i64,
}

/// Checks a budget's fields, naming the one at fault.
pub fn check(schema: &OwnerSchema, ask: &SetBudget<'_>) -> Result<CheckedBudget, BudgetError> {
    let by = GroupBy::parse(ask.dimension, schema).ok_or_else(|| {
        let names: Vec<&str> = GroupBy::all(schema).iter().map(|g| g.as_str()).collect();
        invalid(
            "dimension",
            format!("{:?} is none of {}", ask.dimension, names.join(", ")),
        )
    })?;
    let key = ask.key.trim();
    if key.is_empty() || key.chars().count() > 200 || key.chars().any(char::is_control) {
        return Err(invalid(
            "key",
            "a key is 1 to 200 characters without control characters",
        ));
    }
    let amount: Decimal = ask.amount.trim().parse().map_err(|_| {
        invalid(
            "amount",
            format!("{:?} is not a decimal amount", ask.amount),
        )
    })?;
    if amount.is_sign_negative() && !amount.is_zero() {
        return Err(invalid("amount", "a budget cannot be negative"));
    }
    if amount.normalize().scale() > 6 {
        return Err(invalid(
            "amount",
            "a budget has at most six decimals (cents are two)",
        ));
    }
    let currency = gpuledger_core::money::currency_code(ask.currency).ok_or_else(|| {
        invalid(
            "currency",
            format!("{:?} is not a three-letter currency code", ask.currency),
        )
    })?;
    let (month_from, month_to) = gpuledger_core::allocation::calendar_month(ask.from_month.trim())
        .ok_or_else(|| {
            invalid(
                "from_month",
                format!(
                    "must be a calendar month, YYYY-MM, got {:?}",
                    ask.from_month
                ),
            )
        })?;
    Ok(CheckedBudget {
        by,
        key: key.to_owned(),
        amount,
        currency,
        month_from,
        month_to,
    })
}

pub async fn set(
    store: &dyn Store,
    schema: &OwnerSchema,
    ask: SetBudget<'_>,
    by_user: &str,
    now: i64,
) -> Result<BudgetStatus, BudgetError> {
    let CheckedBudget {
        by,
        key,
        amount,
        currency,
        month_from,
        month_to,
    } = check(schema, &ask)?;
    let key = key.as_str();
    // The key must be one the ledger knows: a typo would otherwise be a budget nobody spends.
    let seen_from = gpuledger_core::time::month_start_ms(
        gpuledger_core::time::month_start_ms(month_from - 1) - 1,
    );
    let seen = ledger::load(store, seen_from, now.max(month_to), RollupGrain::HostRange).await?;
    let mut keys: Vec<String> = seen.parts.iter().map(|p| key_of(p, by, &seen)).collect();
    keys.sort();
    keys.dedup();
    let mut currencies: Vec<&str> = seen
        .parts
        .iter()
        .filter(|p| key_of(p, by, &seen) == key)
        .map(|p| p.currency.as_str())
        .collect();
    currencies.sort_unstable();
    currencies.dedup();
    if !currencies.is_empty() && !currencies.contains(&currency.as_str()) {
        return Err(invalid(
            "currency",
            format!(
                "{} {key:?} is billed in {}, not {currency}: a budget in {currency} would never be spent",
                by.as_str(),
                currencies.join(", ")
            ),
        ));
    }
    if !keys.iter().any(|k| k == key) {
        let some: Vec<&str> = keys.iter().take(8).map(String::as_str).collect();
        return Err(invalid(
            "key",
            format!(
                "no cost was attributed to {} {key:?} from {} on; known: {}",
                by.as_str(),
                month_label(seen_from),
                if some.is_empty() {
                    "none yet".to_owned()
                } else {
                    some.join(", ")
                }
            ),
        ));
    }
    crate::store::budgets::set_budget(
        store.db(),
        &BudgetRow {
            dimension: by.as_str().to_owned(),
            owner_key: key.to_owned(),
            from_month_ms: month_from,
            amount: gpuledger_core::money::to_text(amount),
            currency: currency.clone(),
            set_by: by_user.to_owned(),
            set_ms: now,
        },
    )
    .await?;
    // As it stands in its first month (it is the one in force there, whatever is set later).
    let shown = for_month(store, (schema, &Scope::all()), (month_from, month_to), now).await?;
    shown
        .into_iter()
        .find(|s| s.dimension == by.as_str() && s.key == key)
        .ok_or_else(|| {
            BudgetError::Store(StoreError::Invalid(
                "a budget just stored is not in force in its own month".into(),
            ))
        })
}

/// Removes the budget set for a key and dimension from a month; false where there was none.
pub async fn remove(
    store: &dyn Store,
    dimension: &str,
    key: &str,
    from_month_ms: i64,
) -> Result<bool, StoreError> {
    crate::store::budgets::delete_budget(store.db(), dimension.trim(), key.trim(), from_month_ms)
        .await
}

/// Announces in Slack each budget threshold this month has reached (`[budgets]` in the config:
/// percents of the budget spent, and of it forecast), each once per owner and month: the
/// threshold is claimed in the transaction that queues the message, so with several replicas
/// one announces it. A budget on a team goes to the team's route, on a cluster to the cluster's,
/// others to the default; with no route, nothing is claimed. Several thresholds reached at once
/// make one message, about the highest. Returns how many messages were queued.
pub async fn alert(
    store: &dyn Store,
    config: &crate::config::Config,
    now: i64,
) -> Result<usize, StoreError> {
    use gpuledger_core::budget::{crossed, Basis};
    let (from, to) = gpuledger_core::time::month_of(now);
    let month = month_label(from);
    let team = config
        .owners
        .role(gpuledger_core::owners::Role::Team)
        .map(str::to_owned);
    let mut queued = 0;
    for b in for_month(store, (&config.owners, &Scope::all()), (from, to), now).await? {
        let reached = crossed(
            b.amount,
            &b.forecast,
            &config.budgets.alert_spent_percent,
            &config.budgets.alert_forecast_percent,
        );
        if reached.is_empty() {
            continue;
        }
        let (cluster, teams) = if team.as_deref() == Some(b.dimension.as_str()) {
            ("", vec![b.key.clone()])
        } else if b.dimension == GroupBy::Cluster.as_str() {
            (b.key.as_str(), Vec::new())
        } else {
            ("", Vec::new())
        };
        let Some(route) = config.slack.route_for(cluster, &teams) else {
            continue;
        };
        for basis in [Basis::Spent, Basis::Forecast] {
            let mut tx = store.db().begin().await?;
            let mut newest = None;
            for (_, percent) in reached.iter().filter(|(x, _)| *x == basis) {
                let claimed = crate::store::budgets::claim_alert(
                    &mut tx,
                    (&b.dimension, &b.key, from),
                    basis.as_str(),
                    i64::from(*percent),
                    now,
                )
                .await?;
                if claimed {
                    newest = Some(*percent);
                }
            }
            if let Some(percent) = newest {
                let budget = Budget {
                    dimension: b.dimension.clone(),
                    key: b.key.clone(),
                    from_month_ms: from,
                    amount: b.amount,
                    currency: b.currency.clone(),
                };
                let payload = crate::slack::budget_message(
                    &budget,
                    &b.forecast,
                    basis,
                    percent,
                    &month,
                    &config.slack.base_url,
                );
                crate::store::alerts::enqueue_slack(
                    &mut tx,
                    None,
                    "budget",
                    &route,
                    &payload.to_string(),
                    now,
                )
                .await?;
                queued += 1;
            }
            tx.commit().await?;
        }
    }
    Ok(queued)
}
