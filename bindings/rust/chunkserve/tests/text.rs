//! The text methods (C ABI 0.3) on SmolLM2-135M-Instruct's GGUF from the model cache
//! ($CHUNKSERVE_MODEL_CACHE, else ~/.cache/chunkserve/models, which .ci/fetch-models fills). The
//! model test returns early, printing why, when the file is absent (it is not `#[ignore]`d, so
//! that `--include-ignored` does not turn a missing model into a failure); the tiny model's clear
//! error is always checked.
mod common;

use std::path::PathBuf;

use chunkserve::{ChatMessage, Code, Engine};

fn smollm2_path() -> Option<PathBuf> {
    let dir = match std::env::var_os("CHUNKSERVE_MODEL_CACHE") {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => PathBuf::from(std::env::var_os("HOME").unwrap_or_default())
            .join(".cache/chunkserve/models"),
    };
    let path = dir.join("SmolLM2-135M-Instruct.Q4_1.gguf");
    if path.is_file() {
        Some(path)
    } else {
        eprintln!(
            "skipped: {} is absent (run .ci/fetch-models, or set CHUNKSERVE_MODEL_CACHE)",
            path.display()
        );
        None
    }
}

#[test]
fn text_round_trips_on_smollm2() {
    let Some(path) = smollm2_path() else { return };
    let engine = Engine::new(&common::options().model_path(path)).expect("Engine::new");
    // transformers' ids for this text.
    assert_eq!(
        engine.tokenize("Hello, world!", false).unwrap(),
        vec![19556, 28, 905, 17]
    );

    let text = "Hello 👋 world 🌍, 你好，世界！";
    let ids = engine.tokenize(text, true).unwrap();
    assert_eq!(engine.detokenize(&ids, false).unwrap(), text);

    let mut detokenizer = engine.detokenizer(true).unwrap();
    drop(engine); // the detokenizer keeps the tokenizer alive
    let mut streamed = String::new();
    for &id in &ids {
        streamed += &detokenizer.push(id).unwrap(); // a String: valid UTF-8 by construction
    }
    streamed += &detokenizer.flush().unwrap();
    assert_eq!(streamed, text);
    assert_eq!(
        detokenizer.push(-1).unwrap_err().code(),
        Code::InvalidArgument
    );

    let engine = Engine::new(&common::options().model_path(smollm2_path().unwrap())).unwrap();
    let prompt = engine
        .apply_chat_template(&[ChatMessage::new("user", "What is 2+2?")], true)
        .unwrap();
    assert!(
        prompt.contains("<|im_start|>user\nWhat is 2+2?<|im_end|>\n"),
        "{prompt:?}"
    );
    assert!(prompt.ends_with("<|im_start|>assistant\n"), "{prompt:?}");
    let im_end = engine.tokenize("<|im_end|>", false).unwrap();
    assert_eq!(im_end.len(), 1);
    assert!(engine.eos_ids().unwrap().contains(&im_end[0]));
    assert_eq!(
        engine
            .apply_chat_template(&[ChatMessage::new("user", "a\0b")], true)
            .unwrap_err()
            .code(),
        Code::InvalidArgument
    );
}

#[test]
fn text_without_a_tokenizer_is_a_clear_error() {
    let engine = common::engine();
    let err = engine.tokenize("hi", false).unwrap_err();
    // ctest's tiny model is a folder without tokenizer.json; the built-in one has no path at all.
    assert!(
        matches!(err.code(), Code::NotFound | Code::FailedPrecondition),
        "{err}"
    );
    assert!(err.to_string().contains("chunkserve_tokenize"), "{err}");
    assert_eq!(engine.detokenizer(true).err().unwrap().code(), err.code());
    assert_eq!(engine.eos_ids().unwrap_err().code(), err.code());
}
