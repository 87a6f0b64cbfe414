//! gpuledger's domain core: rules with no I/O, used by the server's attribution, incidents,
//! recommendations and pages alike. It depends on no database, web or async crate, and nothing
//! of the server: the server depends on it.
//!
//! - [`time`]: hours, days and calendar months in epoch milliseconds (UTC).
//! - [`money`]: exact amounts, their text and integer forms, and exact splits.
//! - [`activity`]: the one definition of busy, held idle and idle.
//! - [`bill`]: bill lines as every bill source produces them, and why a bill file is refused.
//! - [`carbon`]: emissions of the measured energy from each host's grid intensity.
//! - [`commitment`]: each commitment discount's use, unused dollars, coverage and end.
//! - [`budget`]: budgets in force per owner and month-end forecasts from the weekday pattern.
//! - [`anomaly`]: days an owner spent well above what that weekday usually costs it.
//! - [`idle`]: the idle thresholds per cluster; [`ratecard`]: prices for hosts with no bill.
//! - [`owners`]: the owner dimensions as data: their names, roles and sources.
//! - [`telemetry`]: hosts, GPU and process windows as attribution reads them.
//! - [`attribution`]: every dollar of a host-hour to who used its GPUs, exactly to the bill.
//! - [`allocation`]: the parts grouped by owner and period, per currency, and which currency a
//!   page speaks.
//! - [`recommend`]: right-sizing, packing, spot and release, each GPU's saving counted once.
//! - [`waste`]: idle GPUs, hosts and clusters, and processes holding GPUs idle.
//! - [`scale_to_zero`]: hours of the week an endpoint or notebook holds GPUs idle, every week.
//! - [`shape`]: GPUs held per instance type by hour of the week, the always-on floor and the peak.
//! - [`purchase`]: each instance type's month priced all on demand and with its floor committed.
//! - [`variance`]: why each owner's spend changed from one period to the next (volume, idle,
//!   mix, price), the parts adding up exactly to the change.

pub mod activity;
pub mod allocation;
pub mod anomaly;
pub mod attribution;
pub mod bill;
pub mod budget;
pub mod carbon;
pub mod commitment;
pub mod cost_metrics;
pub mod figures;
pub mod idle;
pub mod money;
pub mod owners;
pub mod purchase;
pub mod ratecard;
pub mod recommend;
pub mod scale_to_zero;
pub mod scope;
pub mod shape;
pub mod telemetry;
pub mod time;
pub mod variance;
pub mod waste;
