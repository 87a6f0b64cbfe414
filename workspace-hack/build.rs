// Cargo reads build-dependencies only for a package with a build script: this one makes the
// host-side features in Cargo.toml count.
fn main() {}
