//! The safe API end to end on the tiny model.
mod common;

use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use chunkserve::{Code, Engine, Event, FinishReason, Request, ShutdownMode};
use common::{engine, options, prompt};

#[test]
fn versions_match() {
    assert_eq!(chunkserve::abi_version(), chunkserve::HEADER_ABI_VERSION);
    assert_eq!(chunkserve::version().split('.').count(), 3);
    assert_eq!(Code::InvalidArgument.name(), "INVALID_ARGUMENT");
    assert_eq!(Code::from_raw(99), Code::Unknown(99));
}

#[test]
fn iterator_yields_tokens_then_finish() {
    let engine = engine();
    let info = engine.info().unwrap();
    assert_eq!(info.vocab_size, 1024);
    let p = prompt(20, 1);
    let mut stream = engine
        .submit(&Request {
            prompt: &p,
            max_new_tokens: 6,
            ..Default::default()
        })
        .unwrap();
    assert_ne!(stream.id(), 0);
    let tokens: Vec<i32> = stream.by_ref().collect::<Result<_, _>>().unwrap();
    assert_eq!(tokens.len(), 6);
    assert!(tokens.iter().all(|t| (0..1024).contains(t)));
    let finish = stream.finish().unwrap();
    assert_eq!(finish.reason, FinishReason::Length);
    assert_eq!(finish.generated_tokens, 6);
    assert_eq!(finish.prompt_tokens, 20);
    assert!(finish.error.is_none());
    assert_eq!(stream.next(), None);
    assert_eq!(stream.next_event(Some(Duration::ZERO)).unwrap(), None);
}

#[test]
fn shared_prefix_is_cached_and_counted() {
    let engine = engine();
    let system = prompt(64, 2);
    let mut first = engine
        .submit(&Request {
            prompt: &system,
            max_new_tokens: 2,
            ..Default::default()
        })
        .unwrap();
    first.wait().unwrap();
    let mut second_prompt = system.clone();
    second_prompt.extend([5, 6]);
    let mut second = engine
        .submit(&Request {
            prompt: &second_prompt,
            max_new_tokens: 2,
            ..Default::default()
        })
        .unwrap();
    let finish = second.wait().unwrap();
    assert!(finish.cached_tokens >= 48, "{finish:?}");
    let stats = engine.stats().unwrap();
    assert_eq!(stats.requests_finished, 2);
    assert!(stats.prefix_hit_tokens >= 48);
}

#[test]
fn concurrent_submissions_from_many_threads() {
    let engine = engine();
    let expected: Vec<Vec<i32>> = (0..8)
        .map(|t| {
            let p = prompt(16, t);
            engine
                .submit(&Request {
                    prompt: &p,
                    max_new_tokens: 5,
                    ..Default::default()
                })
                .unwrap()
                .collect::<Result<_, _>>()
                .unwrap()
        })
        .collect();
    thread::scope(|s| {
        for (t, want) in expected.iter().enumerate() {
            let engine = &engine;
            s.spawn(move || {
                for _ in 0..4 {
                    let p = prompt(16, t);
                    let stream = engine
                        .submit(&Request {
                            prompt: &p,
                            max_new_tokens: 5,
                            ..Default::default()
                        })
                        .unwrap();
                    let got: Vec<i32> = stream.collect::<Result<_, _>>().unwrap();
                    assert_eq!(&got, want, "greedy output differs under concurrency");
                }
            });
        }
    });
    assert_eq!(engine.stats().unwrap().requests_finished, 8 * 5);
}

#[test]
fn engine_moves_to_another_thread_and_streams_too() {
    let engine = engine();
    let p = prompt(8, 3);
    let stream = engine
        .submit(&Request {
            prompt: &p,
            max_new_tokens: 3,
            ..Default::default()
        })
        .unwrap();
    let handle = thread::spawn(move || stream.count());
    assert_eq!(handle.join().unwrap(), 3);
    let handle = thread::spawn(move || engine.info().unwrap().vocab_size);
    assert_eq!(handle.join().unwrap(), 1024);
}

#[test]
fn cancel_from_the_stream_and_from_another_thread() {
    let engine = engine();
    let p = prompt(8, 4);
    let mut stream = engine
        .submit(&Request {
            prompt: &p,
            max_new_tokens: 1000,
            ..Default::default()
        })
        .unwrap();
    stream.cancel().unwrap();
    let finish = stream.wait().unwrap();
    assert_eq!(finish.reason, FinishReason::Cancelled);
    assert!(stream.cancel().is_ok(), "cancel after finish is a no-op");

    let mut stream = engine
        .submit(&Request {
            prompt: &p,
            max_new_tokens: 1000,
            ..Default::default()
        })
        .unwrap();
    let id = stream.id();
    thread::scope(|s| {
        s.spawn(|| {
            thread::sleep(Duration::from_millis(10));
            engine.cancel(id).unwrap();
        });
        let n = stream.by_ref().count();
        assert!(n < 1000);
    });
    assert_eq!(stream.finish().unwrap().reason, FinishReason::Cancelled);
    let err = engine.cancel(id).unwrap_err();
    assert_eq!(err.code, Code::NotFound);
}

#[test]
fn errors_carry_codes() {
    let engine = engine();
    let err = engine
        .submit(&Request {
            prompt: &[1, 1024],
            ..Default::default()
        })
        .err()
        .unwrap();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message.contains("1024"), "{err}");
    assert!(err.to_string().starts_with("chunkserve: INVALID_ARGUMENT"));
    let err = engine.submit(&Request::default()).err().unwrap();
    assert_eq!(err.code, Code::InvalidArgument);
    let err = Engine::new(&chunkserve::EngineOptions {
        chunk_size: 7,
        ..options()
    })
    .err()
    .unwrap();
    assert_eq!(err.code, Code::InvalidArgument);
    let small = chunkserve::EngineOptions {
        kv_cache_bytes: 4 * (64 << 10),
        ..options()
    };
    let small = Engine::new(&small).unwrap();
    let p = prompt(200, 0);
    let err = small
        .submit(&Request {
            prompt: &p,
            ..Default::default()
        })
        .err()
        .unwrap();
    assert_eq!(err.code, Code::ResourceExhausted);
}

#[test]
fn timeout_on_next_event_is_deadline_exceeded() {
    let engine = Engine::new(&chunkserve::EngineOptions {
        prefill_token_budget: 16,
        ..options()
    })
    .unwrap();
    let p = prompt(512, 5);
    let mut stream = engine
        .submit(&Request {
            prompt: &p,
            max_new_tokens: 1,
            ..Default::default()
        })
        .unwrap();
    let err = stream.next_event(Some(Duration::ZERO)).unwrap_err();
    assert_eq!(err.code, Code::DeadlineExceeded);
    assert_eq!(stream.wait().unwrap().reason, FinishReason::Length);
}

#[test]
fn request_timeout_ends_with_deadline() {
    let engine = engine();
    let p = prompt(8, 6);
    let mut stream = engine
        .submit(&Request {
            prompt: &p,
            max_new_tokens: 1000,
            timeout: Some(Duration::from_millis(20)),
            ..Default::default()
        })
        .unwrap();
    assert_eq!(stream.wait().unwrap().reason, FinishReason::Deadline);
}

#[test]
fn dropping_the_engine_ends_streams_unavailable() {
    let engine = engine();
    let p = prompt(8, 7);
    let mut stream = engine
        .submit(&Request {
            prompt: &p,
            max_new_tokens: 1000,
            ..Default::default()
        })
        .unwrap();
    drop(engine);
    let results: Vec<_> = stream.by_ref().collect();
    let err = results.last().unwrap().clone().unwrap_err();
    assert_eq!(err.code, Code::Unavailable);
    let finish = stream.finish().unwrap();
    assert_eq!(finish.reason, FinishReason::Unavailable);
    assert!(stream.cancel().is_ok());
}

#[test]
fn shutdown_drain_then_submit_is_unavailable() {
    let engine = engine();
    let p = prompt(8, 8);
    let stream = engine
        .submit(&Request {
            prompt: &p,
            max_new_tokens: 3,
            ..Default::default()
        })
        .unwrap();
    engine.shutdown(ShutdownMode::Drain).unwrap();
    assert_eq!(stream.count(), 3);
    let err = engine
        .submit(&Request {
            prompt: &p,
            ..Default::default()
        })
        .err()
        .unwrap();
    assert_eq!(err.code, Code::Unavailable);
}

#[test]
fn callback_receives_every_event() {
    let engine = engine();
    let p = prompt(8, 9);
    let mut stream = engine
        .submit(&Request {
            prompt: &p,
            max_new_tokens: 4,
            ..Default::default()
        })
        .unwrap();
    let (tx, rx) = mpsc::channel();
    stream.set_callback(move |e| tx.send(e).unwrap()).unwrap();
    let mut tokens = 0;
    loop {
        match rx
            .recv_timeout(Duration::from_secs(30))
            .expect("callback events")
        {
            Event::Token { index, .. } => {
                assert_eq!(index, tokens);
                tokens += 1;
            }
            Event::Finished(f) => {
                assert_eq!(f.reason, FinishReason::Length);
                break;
            }
        }
    }
    assert_eq!(tokens, 4);
    assert_eq!(
        stream.next_event(Some(Duration::ZERO)).unwrap_err().code,
        Code::FailedPrecondition
    );
    assert_eq!(
        stream.set_callback(|_| {}).unwrap_err().code,
        Code::FailedPrecondition
    );
}

#[test]
fn dropping_a_callback_stream_in_flight_is_safe() {
    let engine = engine();
    for i in 0..10 {
        let p = prompt(8, i);
        let mut stream = engine
            .submit(&Request {
                prompt: &p,
                max_new_tokens: 1000,
                ..Default::default()
            })
            .unwrap();
        let (tx, rx) = mpsc::channel();
        stream
            .set_callback(move |e| {
                let _ = tx.send(e);
            })
            .unwrap();
        rx.recv_timeout(Duration::from_secs(30)).unwrap();
        drop(stream); // the closure (and its Sender) is freed only after no invocation can run
    }
}
