// `sqlx::migrate!` embeds the migration folders at compile time; a new migration file must
// rebuild the server.
fn main() {
    println!("cargo:rerun-if-changed=../migrations");
}
