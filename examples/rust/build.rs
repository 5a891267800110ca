//! Records CHUNKSERVE_LIB_DIR as an rpath so the example runs without LD_LIBRARY_PATH.
fn main() {
    println!("cargo:rerun-if-env-changed=CHUNKSERVE_LIB_DIR");
    if let Ok(dir) = std::env::var("CHUNKSERVE_LIB_DIR") {
        if !dir.is_empty() {
            println!("cargo:rustc-link-arg=-Wl,-rpath,{dir}");
        }
    }
}
