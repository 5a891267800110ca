//! Links libchunkserve.so. CHUNKSERVE_LIB_DIR names the directory that holds it (a build tree's
//! lib/ or an install prefix's lib); without it the system linker paths are searched. The
//! directory is also recorded as an rpath for this crate's tests and exported to dependents as
//! DEP_CHUNKSERVE_LIB_DIR (Cargo passes link-arg only to the package's own targets).
use std::env;

fn main() {
    println!("cargo:rerun-if-env-changed=CHUNKSERVE_LIB_DIR");
    if let Ok(dir) = env::var("CHUNKSERVE_LIB_DIR") {
        if !dir.is_empty() {
            println!("cargo:rustc-link-search=native={dir}");
            println!("cargo:rustc-link-arg=-Wl,-rpath,{dir}");
            println!("cargo:lib_dir={dir}");
        }
    }
    println!("cargo:rustc-link-lib=dylib=chunkserve");
}
