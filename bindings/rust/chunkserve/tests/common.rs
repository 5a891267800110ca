//! Shared by the integration tests (included with `mod common;`).
#![allow(dead_code)]

use chunkserve::{Engine, EngineOptions};

/// CHUNKSERVE_TEST_MODEL_DIR (set by ctest) points at a pre-written tiny model so engines load in
/// milliseconds; without it every engine writes the built-in model to a temporary directory.
pub fn options() -> EngineOptions {
    EngineOptions {
        model_path: std::env::var_os("CHUNKSERVE_TEST_MODEL_DIR").map(Into::into),
        kv_cache_bytes: 8 << 20,
        chunk_size: 16,
        num_threads: 1,
        ..Default::default()
    }
}

pub fn engine() -> Engine {
    Engine::new(&options()).expect("Engine::new")
}

pub fn prompt(n: usize, salt: usize) -> Vec<i32> {
    (0..n)
        .map(|i| ((i * 131 + salt * 977 + 7) % 1024) as i32)
        .collect()
}
