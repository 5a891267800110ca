//! The safe API end to end on the tiny model.
mod common;

use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use chunkserve::{Code, Engine, EngineStats, Event, FinishReason, Request, ShutdownMode};
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
    let mut stream = engine.submit(&Request::new(&p).max_new_tokens(6)).unwrap();
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
        .submit(&Request::new(&system).max_new_tokens(2))
        .unwrap();
    first.wait().unwrap();
    let mut second_prompt = system.clone();
    second_prompt.extend([5, 6]);
    let mut second = engine
        .submit(&Request::new(&second_prompt).max_new_tokens(2))
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
                .submit(&Request::new(&p).max_new_tokens(5))
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
                    let stream = engine.submit(&Request::new(&p).max_new_tokens(5)).unwrap();
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
    let stream = engine.submit(&Request::new(&p).max_new_tokens(3)).unwrap();
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
        .submit(&Request::new(&p).max_new_tokens(1000))
        .unwrap();
    stream.cancel().unwrap();
    let finish = stream.wait().unwrap();
    assert_eq!(finish.reason, FinishReason::Cancelled);
    assert!(stream.cancel().is_ok(), "cancel after finish is a no-op");

    let mut stream = engine
        .submit(&Request::new(&p).max_new_tokens(1000))
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
    let err = engine.submit(&Request::new(&[1, 1024])).err().unwrap();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message.contains("1024"), "{err}");
    assert!(err.to_string().starts_with("chunkserve: INVALID_ARGUMENT"));
    let err = engine.submit(&Request::default()).err().unwrap();
    assert_eq!(err.code, Code::InvalidArgument);
    let err = Engine::new(&options().chunk_size(7)).err().unwrap();
    assert_eq!(err.code, Code::InvalidArgument);
    let small = options().kv_cache_bytes(4 * (64 << 10));
    let small = Engine::new(&small).unwrap();
    let p = prompt(200, 0);
    let err = small.submit(&Request::new(&p)).err().unwrap();
    assert_eq!(err.code, Code::ResourceExhausted);
}

#[test]
fn timeout_on_next_event_is_deadline_exceeded() {
    let engine = Engine::new(&options().prefill_token_budget(16)).unwrap();
    let p = prompt(512, 5);
    let mut stream = engine.submit(&Request::new(&p).max_new_tokens(1)).unwrap();
    let err = stream.next_event(Some(Duration::ZERO)).unwrap_err();
    assert_eq!(err.code, Code::DeadlineExceeded);
    assert_eq!(stream.wait().unwrap().reason, FinishReason::Length);
}

#[test]
fn request_timeout_ends_with_deadline() {
    let engine = engine();
    let p = prompt(8, 6);
    let mut stream = engine
        .submit(
            &Request::new(&p)
                .max_new_tokens(1000)
                .timeout(Duration::from_millis(20)),
        )
        .unwrap();
    assert_eq!(stream.wait().unwrap().reason, FinishReason::Deadline);
}

#[test]
fn dropping_the_engine_ends_streams_unavailable() {
    let engine = engine();
    let p = prompt(8, 7);
    let mut stream = engine
        .submit(&Request::new(&p).max_new_tokens(1000))
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
    let stream = engine.submit(&Request::new(&p).max_new_tokens(3)).unwrap();
    engine.shutdown(ShutdownMode::Drain).unwrap();
    assert_eq!(stream.count(), 3);
    let err = engine.submit(&Request::new(&p)).err().unwrap();
    assert_eq!(err.code, Code::Unavailable);
}

#[test]
fn callback_receives_every_event() {
    let engine = engine();
    let p = prompt(8, 9);
    let mut stream = engine.submit(&Request::new(&p).max_new_tokens(4)).unwrap();
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
            other => panic!("an event this test does not know: {other:?}"),
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
            .submit(&Request::new(&p).max_new_tokens(1000))
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

/// The engine's stats once `ready` holds for them, else the last ones after 10 s: they are
/// published after each engine step, so they may trail the events a stream already delivered.
fn stats_once(engine: &Engine, ready: impl Fn(&EngineStats) -> bool) -> EngineStats {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let stats = engine.stats().unwrap();
        if ready(&stats) || Instant::now() > deadline {
            return stats;
        }
        thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn stats_count_requests_tokens_and_kv() {
    let engine = engine();
    let fresh = engine.stats().unwrap();
    assert_eq!(
        (
            fresh.requests_submitted,
            fresh.requests_finished,
            fresh.generated_tokens
        ),
        (0, 0, 0),
        "{fresh:?}"
    );
    assert_eq!(fresh.prompt_tokens, 0);
    assert!(
        fresh.kv_bytes_capacity > 0 && fresh.kv_bytes_capacity <= 8 << 20,
        "{fresh:?}"
    );

    // A long request, held mid-stream: the gauges see it.
    let long_prompt = prompt(40, 10);
    let mut long = engine
        .submit(&Request::new(&long_prompt).max_new_tokens(1000))
        .unwrap();
    assert!(matches!(
        long.next_event(None),
        Ok(Some(Event::Token { .. }))
    ));
    let live = stats_once(&engine, |s| s.steps >= 1);
    assert!(live.running >= 1, "{live:?}");
    assert!(live.kv_bytes_referenced > 0, "{live:?}");
    assert!(live.kv_bytes_used >= live.kv_bytes_referenced, "{live:?}");
    assert!(live.kv_bytes_peak >= live.kv_bytes_referenced, "{live:?}");
    assert!(live.kv_bytes_used <= live.kv_bytes_capacity, "{live:?}");
    assert!(live.chunks_total > 0, "{live:?}");
    long.cancel().unwrap();
    assert_eq!(long.wait().unwrap().reason, FinishReason::Cancelled);
    let generated_by_long = long.finish().unwrap().generated_tokens as u64;

    // Three requests with one system prompt: counters add up, the prefix cache is counted.
    let system = prompt(48, 11);
    for i in 0..3 {
        let mut p = system.clone();
        p.extend([100 + i, 200 + i]);
        let finish = engine
            .submit(&Request::new(&p).max_new_tokens(5))
            .unwrap()
            .wait()
            .unwrap();
        assert_eq!(finish.reason, FinishReason::Length);
    }
    let s = stats_once(&engine, |s| s.requests_finished == 4);
    assert_eq!(s.requests_submitted, 4, "{s:?}");
    assert_eq!(s.requests_finished, 4, "{s:?}");
    assert_eq!(s.prompt_tokens, 40 + 3 * 50, "{s:?}");
    assert_eq!(s.generated_tokens, generated_by_long + 3 * 5, "{s:?}");
    assert!(s.prefix_hit_tokens >= 2 * 48 - 2 * 16, "{s:?}"); // whole 16-token chunks
    assert!(
        s.prefill_tokens + s.prefix_hit_tokens >= s.prompt_tokens,
        "{s:?}"
    );
    assert!(s.steps >= 5, "{s:?}");
    assert_eq!(s.queued, 0, "{s:?}");
    assert!(s.kv_bytes_peak >= live.kv_bytes_peak, "{s:?}");
    assert!(
        s.decode_tokens_per_s >= 0.0 && s.prefill_tokens_per_s >= 0.0,
        "{s:?}"
    );

    // Also after shutdown.
    engine.shutdown(ShutdownMode::Drain).unwrap();
    assert_eq!(engine.stats().unwrap().requests_finished, 4);
}

#[test]
fn logprobs_come_with_every_token_when_asked() {
    let engine = engine();
    let p = prompt(24, 5);
    let mut plain = engine.submit(&Request::new(&p).max_new_tokens(5)).unwrap();
    let want: Vec<i32> = plain.by_ref().collect::<Result<_, _>>().unwrap();
    let mut stream = engine
        .submit(&Request::new(&p).max_new_tokens(5).logprobs(3))
        .unwrap();
    let mut got = Vec::new();
    while let Some(event) = stream.next_event(Some(Duration::from_secs(30))).unwrap() {
        match event {
            Event::Token {
                token, logprobs, ..
            } => {
                let l = logprobs.expect("asked for logprobs");
                assert_eq!(l.top.len(), 3);
                // Greedy: the token is the most likely one, and its logprob is the first's.
                assert_eq!(l.top[0].0, token);
                assert_eq!(l.top[0].1, l.logprob);
                assert!(l.logprob <= 0.0 && l.top[1].1 <= l.top[0].1 && l.top[2].1 <= l.top[1].1);
                got.push(token);
            }
            Event::Finished(_) => break,
            _ => {}
        }
    }
    assert_eq!(got, want);
    let bad = engine.submit(&Request::new(&p).logprobs(21));
    assert_eq!(bad.err().map(|e| e.code), Some(Code::InvalidArgument));
}
