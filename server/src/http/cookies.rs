//! The cookies the server sets, by name: read where a request is routed (`reads`) and where a
//! person signs in (`session`, `login`).

/// The signed-in person's session.
pub const SESSION_COOKIE: &str = "gpl_session";
/// The log position of the browser's last change, so its next reads see it (`reads`).
pub const WRITTEN_COOKIE: &str = "gpl_written";
