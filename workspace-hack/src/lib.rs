//! No code: see this crate's `Cargo.toml` for why it exists.
