//! Records libchunkserve.so's directories (found by chunkserve-sys from CHUNKSERVE_LIB_DIR or
//! pkg-config, exported as DEP_CHUNKSERVE_RPATH) as rpaths for this crate's tests and examples;
//! Cargo does not forward link-arg to dependents.
fn main() {
    println!("cargo:rerun-if-env-changed=DEP_CHUNKSERVE_RPATH");
    if let Some(dirs) = std::env::var_os("DEP_CHUNKSERVE_RPATH") {
        for dir in std::env::split_paths(&dirs) {
            println!("cargo:rustc-link-arg=-Wl,-rpath,{}", dir.display());
        }
    }
}
