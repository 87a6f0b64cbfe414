//! gpuledger's domain core: rules with no I/O, used by the server's attribution, incidents,
//! recommendations and pages alike. It depends on no database, web or async crate, and nothing
//! of the server: the server depends on it.
//!
//! - [`time`]: hours, days and calendar months in epoch milliseconds (UTC).
//! - [`money`]: exact amounts, their text and integer forms, and exact splits.
//! - [`activity`]: the one definition of busy, held idle and idle.
//! - [`bill`]: bill lines as every bill source produces them, and why a bill file is refused.

pub mod activity;
pub mod bill;
pub mod money;
pub mod time;
