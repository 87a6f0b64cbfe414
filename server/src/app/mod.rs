//! The application layer: the use cases that pages, the API, the command line, the jobs and
//! the Slack app call. Each takes what it reads from and who is asking ([`ReadContext`],
//! [`Viewer`]) and returns data; none renders a template or speaks HTTP.

mod context;
pub mod review;
pub mod usage;

pub use context::{ReadContext, Viewer};
