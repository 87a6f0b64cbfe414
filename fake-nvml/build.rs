// The library stays loaded once loaded (`-z nodelete`), as a driver's library does: nvml-wrapper
// unloads it when an `Nvml` is dropped (a failed init, a re-initialisation after a driver
// reload), and unloading would restart the scenario's clock and forget what it delivered.
fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-z,nodelete");
}
