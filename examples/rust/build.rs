//! Records the directories of libchunkserve.so as rpaths, so the example runs without
//! LD_LIBRARY_PATH: those chunkserve-sys found (CHUNKSERVE_LIB_DIR or pkg-config), which it exports
//! to its direct dependents as DEP_CHUNKSERVE_RPATH (Cargo passes link-arg only to the package's
//! own targets, so a program has to record them itself).
fn main() {
    println!("cargo:rerun-if-env-changed=DEP_CHUNKSERVE_RPATH");
    if let Some(dirs) = std::env::var_os("DEP_CHUNKSERVE_RPATH") {
        for dir in std::env::split_paths(&dirs) {
            println!("cargo:rustc-link-arg=-Wl,-rpath,{}", dir.display());
        }
    }
}
