//! chunkserve from Rust: several requests that share a system prompt, streamed token by token.
//!
//! Creates an engine on the built-in tiny model, submits four requests whose prompts start with
//! the same 64-token system prompt, streams each one on its own thread (the engine is shared by
//! reference: it is `Sync`), and reports how much of the prompts the prefix cache served.
use std::sync::Mutex;
use std::thread;

use chunkserve::{Engine, EngineOptions, Request};

const REQUESTS: usize = 4;
const SYSTEM_TOKENS: usize = 64;
const MAX_NEW_TOKENS: i32 = 12;

fn main() -> Result<(), chunkserve::Error> {
    println!(
        "libchunkserve {} (ABI {})",
        chunkserve::version(),
        chunkserve::abi_version()
    );
    // No model_path: the built-in tiny model.
    // The built-in tiny model (random weights): the example needs no download.
    let engine = Engine::new(&EngineOptions::new().tiny_model(true).kv_cache_bytes(32 << 20).chunk_size(16))?;

    let system: Vec<i32> = (0..SYSTEM_TOKENS)
        .map(|i| ((i * 29 + 3) % 1024) as i32)
        .collect();
    let out = Mutex::new(()); // keeps output lines whole
    thread::scope(|s| -> Result<(), chunkserve::Error> {
        for r in 0..REQUESTS {
            let mut prompt = system.clone();
            prompt.extend([500 + 10 * r as i32, 501 + 10 * r as i32]);
            let mut stream = engine.submit(
                &Request::new(&prompt)
                    .max_new_tokens(MAX_NEW_TOKENS)
                    .temperature(0.7)
                    .seed(r as u64),
            )?;
            let out = &out;
            s.spawn(move || {
                for (i, token) in stream.by_ref().enumerate() {
                    let _line = out.lock().unwrap();
                    match token {
                        Ok(t) => println!("request {r} token #{i}: {t}"),
                        Err(e) => println!("request {r} failed: {e}"),
                    }
                }
                let _line = out.lock().unwrap();
                if let Some(f) = stream.finish() {
                    println!(
                        "request {r} finished ({:?}): {} prompt tokens, {} from the prefix \
                         cache, {} generated",
                        f.reason, f.prompt_tokens, f.cached_tokens, f.generated_tokens
                    );
                }
            });
        }
        Ok(())
    })?;

    let stats = engine.stats()?;
    println!(
        "engine: {} requests, {} prompt tokens, {} served from the prefix cache, {} generated",
        stats.requests_finished,
        stats.prompt_tokens,
        stats.prefix_hit_tokens,
        stats.generated_tokens
    );
    Ok(())
}
