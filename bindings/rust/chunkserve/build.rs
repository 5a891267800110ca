//! Records libchunkserve.so's directory (found by chunkserve-sys from CHUNKSERVE_LIB_DIR) as an
//! rpath for this crate's tests and examples; Cargo does not forward link-arg to dependents.
fn main() {
    println!("cargo:rerun-if-env-changed=DEP_CHUNKSERVE_LIB_DIR");
    if let Ok(dir) = std::env::var("DEP_CHUNKSERVE_LIB_DIR") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{dir}");
    }
}
