//! Shared by the integration tests (included with `mod common;`).
#![allow(dead_code)]

use std::ffi::OsString;

use chunkserve::{Engine, EngineOptions};

/// CHUNKSERVE_TEST_MODEL_DIR (set by ctest) points at a pre-written tiny model so engines load in
/// milliseconds; without it every engine writes the built-in model to a temporary directory.
pub fn options() -> EngineOptions {
    let mut options = EngineOptions::new()
        .kv_cache_bytes(8 << 20)
        .chunk_size(16)
        .num_threads(1);
    options.model_path = std::env::var_os("CHUNKSERVE_TEST_MODEL_DIR").map(Into::into);
    options.tiny_model = options.model_path.is_none();
    options
}

pub fn engine() -> Engine {
    Engine::new(&options()).expect("Engine::new")
}

pub fn prompt(n: usize, salt: usize) -> Vec<i32> {
    (0..n)
        .map(|i| ((i * 131 + salt * 977 + 7) % 1024) as i32)
        .collect()
}

/// The value of `var`, which an `#[ignore = "needs ..."]` test cannot run without: a missing
/// variable fails the test (run with --ignored / --include-ignored) with a message that says what
/// to set, instead of passing without testing anything. `example` is a typical value.
#[track_caller]
pub fn required_env(var: &str, example: &str) -> OsString {
    match std::env::var_os(var) {
        Some(value) if !value.is_empty() => value,
        _ => panic!(
            "{var} is not set, and this test needs it: set it (e.g. {var}={example}; ctest sets \
             it), or run without --ignored / --include-ignored to skip the tests that need it"
        ),
    }
}
