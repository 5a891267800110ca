/* chunkserve.h: the stable C ABI of chunkserve (libchunkserve.so).
 *
 * chunkserve serves a language model in-process: an engine owns the model, a KV cache shaped as a
 * prefix tree of fixed-size chunks (requests that share a prompt prefix share its keys and values)
 * and one step thread that batches every running request. A request is a prompt of token ids plus
 * sampling rules; its answer is a stream of generated tokens followed by exactly one terminal
 * event.
 *
 *   chunkserve_engine_options_t eo;
 *   chunkserve_engine_options_init(&eo, sizeof eo, NULL);
 *   eo.model_path = "/models/smollm2.gguf";             (or eo.tiny_model = 1: random weights)
 *   eo.kv_cache_bytes = 64u << 20;
 *   chunkserve_engine_t* engine;
 *   chunkserve_error_t* err;
 *   if (chunkserve_engine_create(&eo, &engine, &err) != CHUNKSERVE_STATUS_OK) {
 *     fprintf(stderr, "%s\n", chunkserve_error_message(err));
 *     chunkserve_error_free(err);
 *   }
 *   chunkserve_request_options_t ro;
 *   chunkserve_request_options_init(&ro, sizeof ro, NULL);
 *   ro.prompt_tokens = prompt; ro.num_prompt_tokens = n;
 *   chunkserve_stream_t* stream;
 *   chunkserve_engine_submit(engine, &ro, &stream, NULL);
 *   chunkserve_stream_event_t ev;
 *   ev.struct_size = sizeof ev;
 *   while (chunkserve_stream_next(stream, CHUNKSERVE_WAIT_FOREVER, &ev, NULL) ==
 *          CHUNKSERVE_STATUS_OK && ev.kind == CHUNKSERVE_EVENT_TOKEN) use(ev.token);
 *   chunkserve_stream_destroy(stream);
 *   chunkserve_engine_destroy(engine);
 *
 * ABI rules (see capi/README.md):
 *  - Only chunkserve_* symbols are exported; the library's soname carries CHUNKSERVE_ABI_VERSION.
 *  - Handles are opaque. Structs never change layout: fields are only appended, and every struct
 *    starts with `uint32_t struct_size` that the caller sets (the *_options_init functions do it
 *    for options). The library reads or writes only the bytes struct_size covers, so a program
 *    built against an older header keeps working with a newer library. A program built against a
 *    newer header may pass a larger struct_size (up to 4096): the library reads the fields it
 *    knows and requires the newer ones to be zero (their defaults; INVALID_ARGUMENT otherwise),
 *    and zeroes the newer fields of what it writes. struct_size smaller than the first published
 *    version of the struct, or above 4096, is rejected with CHUNKSERVE_STATUS_INVALID_ARGUMENT.
 *  - Fields are fixed-width integers, float/double and pointers; "enums" are int32_t fields with
 *    #defined values. Values are only added, never renumbered.
 *
 * Errors. Every fallible function returns a chunkserve_status_t (CHUNKSERVE_STATUS_OK == 0) and
 * takes a last parameter `chunkserve_error_t** out_error` that may be NULL. When out_error is not
 * NULL, *out_error is set to NULL on success and to a new error object (code + message) on
 * failure; the caller owns it and frees it with chunkserve_error_free. There is no thread-local
 * "last error". No C++ exception and no abort escapes an entry point on bad input: failures,
 * including running out of memory, become status codes.
 *
 * Threading. Every function may be called from any thread. An engine handle may be used by many
 * threads at once (submit, cancel, stats, shutdown); a stream handle's next, cancel, id and
 * set_callback may also overlap. A *_destroy call must not overlap any other call on the same
 * handle. Blocking: chunkserve_engine_destroy / _shutdown wait for the engine's step thread (and
 * so for a stream callback it is running); chunkserve_client_destroy waits for the client's
 * network thread (and so for a callback of one of its streams); chunkserve_stream_destroy waits
 * for a running callback of that stream; nothing else waits on another handle. A client handle,
 * like an engine handle, may be used by many threads at once (submit, cancel).
 *
 * Ownership. Every object a function creates (engine, client, stream, detokenizer, error) is
 * owned by the caller and freed by its *_destroy / *_free function; *_destroy(NULL) and
 * *_free(NULL) are no-ops. Pointers passed in (options, token arrays, strings) are borrowed for
 * the duration of the call only.
 * Streams and the engine (or client) are independent objects: either may be destroyed first;
 * so are detokenizers and their engine.
 */
#ifndef CHUNKSERVE_CHUNKSERVE_H_
#define CHUNKSERVE_CHUNKSERVE_H_

#include <stddef.h>
#include <stdint.h>

/* ---- Versions ------------------------------------------------------------------------------ */

/* The release this header belongs to. */
#define CHUNKSERVE_VERSION_MAJOR 0
#define CHUNKSERVE_VERSION_MINOR 6
#define CHUNKSERVE_VERSION_PATCH 0

/* The ABI generation: the soname is libchunkserve.so.<CHUNKSERVE_ABI_VERSION>. It changes only on
 * an incompatible change (a removed function, a changed layout or meaning); additions keep it. A
 * program compares it with chunkserve_abi_version() to detect a mismatched library at run time. */
#define CHUNKSERVE_ABI_VERSION 0

/* Symbol visibility: the library is built with -fvisibility=hidden and exports exactly the
 * functions marked CHUNKSERVE_API (see capi/chunkserve.map). */
#if defined(__GNUC__) || defined(__clang__)
#define CHUNKSERVE_API __attribute__((visibility("default")))
#else
#define CHUNKSERVE_API
#endif

/* Deprecation: a declaration marked CHUNKSERVE_DEPRECATED("use ... instead") makes the compiler
 * warn at each use, naming the replacement. A deprecated function stays exported, with its
 * behaviour, until the next ABI generation. Define CHUNKSERVE_NO_DEPRECATION_WARNINGS before
 * including this header to silence the warnings. */
#if defined(CHUNKSERVE_NO_DEPRECATION_WARNINGS)
#define CHUNKSERVE_DEPRECATED(message)
#elif defined(__GNUC__) || defined(__clang__)
#define CHUNKSERVE_DEPRECATED(message) __attribute__((deprecated(message)))
#elif defined(_MSC_VER)
#define CHUNKSERVE_DEPRECATED(message) __declspec(deprecated(message))
#else
#define CHUNKSERVE_DEPRECATED(message)
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ---- Status codes -------------------------------------------------------------------------- */

/* A status code. Values equal chunkserve::StatusCode and never change; new codes are only
 * appended, so treat an unknown value like CHUNKSERVE_STATUS_INTERNAL. */
typedef int32_t chunkserve_status_t;

#define CHUNKSERVE_STATUS_OK 0
#define CHUNKSERVE_STATUS_INVALID_ARGUMENT 1    /* malformed or out-of-range input */
#define CHUNKSERVE_STATUS_NOT_FOUND 2           /* no such request / file */
#define CHUNKSERVE_STATUS_ALREADY_EXISTS 3
#define CHUNKSERVE_STATUS_RESOURCE_EXHAUSTED 4  /* queue full, KV cache too small, out of memory */
#define CHUNKSERVE_STATUS_FAILED_PRECONDITION 5 /* call not valid in this state */
#define CHUNKSERVE_STATUS_OUT_OF_RANGE 6        /* stream_next past the terminal event; a
                                                   caller's buffer too small (text functions) */
#define CHUNKSERVE_STATUS_UNAVAILABLE 7         /* engine shut down; retryable elsewhere */
#define CHUNKSERVE_STATUS_DEADLINE_EXCEEDED 8   /* stream_next timed out */
#define CHUNKSERVE_STATUS_CANCELLED 9
#define CHUNKSERVE_STATUS_INTERNAL 10           /* a bug in chunkserve */
#define CHUNKSERVE_STATUS_UNIMPLEMENTED 11      /* not available in this build */
#define CHUNKSERVE_STATUS_DATA_LOSS 12          /* corrupt or truncated model files */
#define CHUNKSERVE_STATUS_ABORTED 13
#define CHUNKSERVE_STATUS_UNAUTHENTICATED 14    /* missing or wrong cluster secret / client token */

/* The stable upper-case name of a code ("INVALID_ARGUMENT"); "UNKNOWN" for other values. The
 * string is static; never free it. */
CHUNKSERVE_API const char* chunkserve_status_name(chunkserve_status_t status);

/* ---- Error objects ------------------------------------------------------------------------- */

/* An error: a status code and a UTF-8 message. Created by the library, owned by the caller. */
typedef struct chunkserve_error chunkserve_error_t;

/* The error's code; CHUNKSERVE_STATUS_OK when error is NULL. */
CHUNKSERVE_API chunkserve_status_t chunkserve_error_code(const chunkserve_error_t* error);

/* The error's message, NUL-terminated, owned by the error (valid until chunkserve_error_free).
 * "" when error is NULL. */
CHUNKSERVE_API const char* chunkserve_error_message(const chunkserve_error_t* error);

/* Frees an error. NULL: no-op. */
CHUNKSERVE_API void chunkserve_error_free(chunkserve_error_t* error);

/* ---- Version queries ----------------------------------------------------------------------- */

/* The library's release, "MAJOR.MINOR.PATCH" (static string). May be newer than the header's
 * CHUNKSERVE_VERSION_* when the program runs against a later compatible library. */
CHUNKSERVE_API const char* chunkserve_version(void);

/* The library's ABI generation (CHUNKSERVE_ABI_VERSION it was built with). */
CHUNKSERVE_API int32_t chunkserve_abi_version(void);

/* ---- Logging (since 0.2) ------------------------------------------------------------------- */

/* Severities of log messages. */
#define CHUNKSERVE_LOG_INFO 0
#define CHUNKSERVE_LOG_WARNING 1
#define CHUNKSERVE_LOG_ERROR 2
#define CHUNKSERVE_LOG_FATAL 3 /* a broken internal invariant; the process is about to end */

/* Receives one log message: its severity (CHUNKSERVE_LOG_*) and its text ("file.cc:123: ...",
 * NUL-terminated, valid only during the call). */
typedef void (*chunkserve_log_callback_t)(int32_t severity, const char* message, void* user_data);

/* Routes every log message of the library to callback(severity, message, user_data) instead of
 * stderr; callback NULL restores stderr. Process-wide (the library logs through glog, shared by
 * the whole process: a program that uses glog itself gets its own messages routed too). The
 * callback may run on any library thread, concurrently, and must not call back into chunkserve;
 * user_data must stay valid until the callback is replaced. Safe from any thread.
 * Errors: none today (OK); INTERNAL is reserved. */
CHUNKSERVE_API chunkserve_status_t chunkserve_set_log_callback(chunkserve_log_callback_t callback,
                                                               void* user_data,
                                                               chunkserve_error_t** out_error);

/* ---- Enumerations (int32_t fields) --------------------------------------------------------- */

/* Why a request ended (chunkserve_stream_event_t.finish_reason). Values equal
 * chunkserve::FinishReason; unknown future values should be treated as CHUNKSERVE_FINISH_ERROR. */
#define CHUNKSERVE_FINISH_STOP_TOKEN 0  /* a stop token was generated (it is in the stream) */
#define CHUNKSERVE_FINISH_LENGTH 1      /* max_new_tokens generated, or the context is full */
#define CHUNKSERVE_FINISH_CANCELLED 2   /* chunkserve_stream_cancel / chunkserve_engine_cancel */
#define CHUNKSERVE_FINISH_DEADLINE 3    /* the request's deadline passed */
#define CHUNKSERVE_FINISH_ERROR 4       /* the request failed; see the event's status */
#define CHUNKSERVE_FINISH_UNAVAILABLE 5 /* the engine shut down or was destroyed; retryable */

/* The name of a finish reason ("stop", "length", "cancelled", ...); static string. */
CHUNKSERVE_API const char* chunkserve_finish_reason_name(int32_t finish_reason);

/* Engine backends (chunkserve_engine_options_t.backend). */
#define CHUNKSERVE_BACKEND_CPU 0
#define CHUNKSERVE_BACKEND_CUDA 1 /* CHUNKSERVE_STATUS_UNIMPLEMENTED where not built */

/* KV cache element types (chunkserve_engine_options_t.kv_dtype). */
#define CHUNKSERVE_DTYPE_F32 0
#define CHUNKSERVE_DTYPE_F16 1
#define CHUNKSERVE_DTYPE_BF16 2

/* Shutdown modes (chunkserve_engine_shutdown). */
#define CHUNKSERVE_SHUTDOWN_DRAIN 0 /* stop admitting; finish every submitted request; then stop */
#define CHUNKSERVE_SHUTDOWN_ABORT 1 /* end every request now with FINISH_UNAVAILABLE; then stop */

/* Stream event kinds (chunkserve_stream_event_t.kind). */
#define CHUNKSERVE_EVENT_TOKEN 0    /* one generated token */
#define CHUNKSERVE_EVENT_FINISHED 1 /* the terminal event; nothing follows it */

/* chunkserve_stream_next's timeout that never expires. */
#define CHUNKSERVE_WAIT_FOREVER (-1)

/* ---- Engine -------------------------------------------------------------------------------- */

/* An in-process engine: one model replica, its KV cache and its step thread. Thread-safe. */
typedef struct chunkserve_engine chunkserve_engine_t;

/* Engine options. Fill with chunkserve_engine_options_init, then change what you need.
 * Version 1 (chunkserve 0.1): 56 bytes on LP64. Version 2 (chunkserve 0.4): 64 bytes, +
 * tiny_model, reserved1: a model is required unless tiny_model asks for random weights. Since
 * 0.5 the last field is gguf_dtype (0.4 required 0 there, which is F32: same size, same meaning
 * for every caller; a 0.4 library refuses any other value with INVALID_ARGUMENT). */
typedef struct chunkserve_engine_options {
  uint32_t struct_size;          /* sizeof(chunkserve_engine_options_t) the caller was built with */
  int32_t backend;               /* CHUNKSERVE_BACKEND_*; default CPU */
  const char* model_path;        /* directory with config.json + safetensors, or a llama .gguf
                                    file, UTF-8, borrowed for the call. Required (version 2)
                                    unless tiny_model. Version 1 callers (struct_size 56) and
                                    options == NULL keep version 1's meaning: NULL or "" is the
                                    built-in tiny model */
  uint64_t kv_cache_bytes;       /* KV cache size; must hold >= 2 chunks. 0: default 256 MiB */
  int32_t chunk_size;            /* tokens per KV chunk, 16..256. 0: default 64 */
  int32_t kv_dtype;              /* CHUNKSERVE_DTYPE_*; default F32 */
  int32_t enable_prefix_sharing; /* 1 (default): requests share cached prompt prefixes; 0: off */
  int32_t num_threads;           /* CPU backend threads, 0..CPUs this process may use (more is
                                    INVALID_ARGUMENT); 0 (default): all of them */
  int32_t max_batch_size;        /* sequences per step, >= 1. 0: default 64 */
  int32_t prefill_token_budget;  /* tokens per step (decode + prefill); 0: unlimited; default 512 */
  int32_t max_queued_requests;   /* submit fails with RESOURCE_EXHAUSTED beyond it. 0: default
                                    4096 */
  int32_t reserved0;             /* must be 0 */
  /* Version 2. */
  int32_t tiny_model;            /* 1: the built-in tiny random-weight model (vocab 1024; tests,
                                    demos), written to a temporary directory that the engine
                                    removes when destroyed; model_path must then be NULL or "".
                                    0 (default): serve model_path */
  int32_t gguf_dtype;            /* since 0.5: CHUNKSERVE_DTYPE_* a .gguf model's tensors are
                                    dequantized to; default F32. The CPU backend keeps F16 /
                                    BF16 weights half-size (half the memory; decode reads half
                                    the bytes). Ignored for safetensors, which keep their dtype */
} chunkserve_engine_options_t;

/* Fills *options with the defaults and sets options->struct_size = struct_size. Pass
 * sizeof(chunkserve_engine_options_t) as struct_size: the library writes only that many bytes, so
 * this is safe against a newer library. Errors: INVALID_ARGUMENT (options NULL, struct_size out of
 * range). */
CHUNKSERVE_API chunkserve_status_t chunkserve_engine_options_init(
    chunkserve_engine_options_t* options, uint32_t struct_size, chunkserve_error_t** out_error);

/* Creates an engine and starts its step thread. options may be NULL (version 1 defaults: the
 * built-in tiny model). On success
 * *out_engine is a new engine the caller destroys with chunkserve_engine_destroy; on failure it is
 * set to NULL. Blocks while the model loads (the built-in tiny model is first written out: tens
 * of ms; a model directory is memory-mapped).
 * Errors: INVALID_ARGUMENT (NULL out_engine, bad struct_size or field, no model_path without
 * tiny_model), NOT_FOUND / DATA_LOSS
 * (model files), UNIMPLEMENTED (backend), UNAVAILABLE (I/O), RESOURCE_EXHAUSTED (memory). */
CHUNKSERVE_API chunkserve_status_t chunkserve_engine_create(
    const chunkserve_engine_options_t* options, chunkserve_engine_t** out_engine,
    chunkserve_error_t** out_error);

/* Stops the engine (if not already stopped) with CHUNKSERVE_SHUTDOWN_ABORT semantics, joins its
 * step thread and frees it. Every request still running ends with CHUNKSERVE_FINISH_UNAVAILABLE
 * (status UNAVAILABLE); streams stay valid and must still be destroyed by the caller. Blocks until
 * the step thread has stopped; called from a callback of this engine's streams (which runs on
 * that thread) it returns at once and another thread completes the destruction after the
 * callback returns. NULL: no-op. */
CHUNKSERVE_API void chunkserve_engine_destroy(chunkserve_engine_t* engine);

/* Stops the engine; idempotent. CHUNKSERVE_SHUTDOWN_DRAIN blocks until every submitted request
 * has finished; CHUNKSERVE_SHUTDOWN_ABORT ends them with FINISH_UNAVAILABLE. Afterwards submit
 * fails with UNAVAILABLE while stats and cancel keep working. Errors: INVALID_ARGUMENT (NULL
 * engine, unknown mode), FAILED_PRECONDITION (called from a callback of this engine's streams:
 * it would wait for the thread running it). */
CHUNKSERVE_API chunkserve_status_t chunkserve_engine_shutdown(chunkserve_engine_t* engine,
                                                              int32_t mode,
                                                              chunkserve_error_t** out_error);

/* The most alternatives a request may ask for with `logprobs` (OpenAI's top_logprobs limit). */
#define CHUNKSERVE_MAX_TOP_LOGPROBS 20

/* Request options. Fill with chunkserve_request_options_init, then set the prompt.
 * Version 1 (chunkserve 0.1): 72 bytes on LP64. Version 2 (chunkserve 0.4): 80 bytes, + logprobs,
 * reserved0. */
typedef struct chunkserve_request_options {
  uint32_t struct_size;         /* sizeof(chunkserve_request_options_t) the caller was built with */
  int32_t max_new_tokens;       /* >= 1; default 16 */
  const int32_t* prompt_tokens; /* token ids in [0, vocab), borrowed for the submit call */
  uint64_t num_prompt_tokens;   /* >= 1, shorter than the model's context */
  const int32_t* stop_tokens;   /* generating one of these ends the request (FINISH_STOP_TOKEN);
                                   borrowed for the call; may be NULL when num_stop_tokens is 0 */
  uint64_t num_stop_tokens;
  float temperature;            /* 0 (default): greedy; > 0: sample from softmax(logits / t) */
  int32_t top_k;                /* 0 (default): no limit */
  float top_p;                  /* (0, 1]; default 1 */
  int32_t priority;             /* higher runs first and is preempted last; default 0 */
  uint64_t seed;                /* sampling seed: equal requests + equal seeds = equal tokens */
  uint64_t deadline_ms;         /* 0 (default): none; else the request ends with FINISH_DEADLINE
                                   this many milliseconds after submit */
  /* Version 2. */
  int32_t logprobs;             /* -1 (default): none; k in [0, CHUNKSERVE_MAX_TOP_LOGPROBS]:
                                   every TOKEN event carries the token's log-probability and the
                                   k most likely tokens at its position (see the event) */
  int32_t reserved0;            /* must be 0 */
} chunkserve_request_options_t;

/* Fills *options with the defaults (empty prompt) and sets struct_size, as
 * chunkserve_engine_options_init does. Errors: INVALID_ARGUMENT. */
CHUNKSERVE_API chunkserve_status_t chunkserve_request_options_init(
    chunkserve_request_options_t* options, uint32_t struct_size, chunkserve_error_t** out_error);

/* A request's stream: its generated tokens, then one terminal event. */
typedef struct chunkserve_stream chunkserve_stream_t;

/* Validates and enqueues a request. The prompt and stop token arrays are copied; they may be
 * freed when this returns. On success *out_stream is a new stream the caller destroys with
 * chunkserve_stream_destroy; on failure it is set to NULL. Safe from any thread concurrently.
 * Errors: INVALID_ARGUMENT (NULL arguments, bad struct_size, empty prompt, a token id outside
 * [0, vocab), max_new_tokens < 1, bad sampling values, prompt longer than the context),
 * RESOURCE_EXHAUSTED (queue full, or the request can never fit in the KV cache), UNAVAILABLE
 * (the engine is shut down). */
CHUNKSERVE_API chunkserve_status_t chunkserve_engine_submit(
    chunkserve_engine_t* engine, const chunkserve_request_options_t* request,
    chunkserve_stream_t** out_stream, chunkserve_error_t** out_error);

/* Cancels the live request with that id (chunkserve_stream_id); its stream then ends with
 * FINISH_CANCELLED unless it ended first. Errors: INVALID_ARGUMENT (NULL engine), NOT_FOUND (no
 * live request has that id: unknown, or already finished). */
CHUNKSERVE_API chunkserve_status_t chunkserve_engine_cancel(chunkserve_engine_t* engine,
                                                            uint64_t request_id,
                                                            chunkserve_error_t** out_error);

/* Engine counters and gauges. The caller sets struct_size; the library fills the fields it
 * covers. Version 1 (chunkserve 0.1): 160 bytes. */
typedef struct chunkserve_engine_stats {
  uint32_t struct_size;          /* set by the caller: sizeof(chunkserve_engine_stats_t) */
  int32_t running;               /* sequences in the running batch at the last step */
  /* Counters since creation. */
  uint64_t requests_submitted;
  uint64_t requests_finished;
  uint64_t prompt_tokens;        /* prompt tokens of admitted requests */
  uint64_t prefix_hit_tokens;    /* prompt tokens whose KV came from the prefix cache */
  uint64_t prefill_tokens;       /* tokens run through prefill */
  uint64_t generated_tokens;     /* tokens streamed out */
  uint64_t steps;
  uint64_t evicted_chunks;
  uint64_t preemptions;
  /* Gauges at the last step. */
  int32_t queued;                /* submitted, not yet admitted */
  int32_t last_batch_size;
  uint64_t kv_bytes_used;        /* referenced + retained, shared chunks counted once */
  uint64_t kv_bytes_referenced;  /* referenced by live sequences */
  uint64_t kv_bytes_if_unshared; /* what live sequences would use without prefix sharing */
  uint64_t kv_bytes_capacity;
  uint64_t kv_bytes_peak;        /* max of kv_bytes_referenced over time */
  int32_t chunks_total;
  int32_t chunks_shared;         /* referenced by >= 2 live sequences */
  int32_t chunks_retained;       /* unreferenced, kept for reuse */
  int32_t reserved0;
  /* Throughput over the last few seconds. */
  double decode_tokens_per_s;
  double prefill_tokens_per_s;
} chunkserve_engine_stats_t;

/* Fills *stats (struct_size set by the caller). Safe from any thread, also after shutdown.
 * Errors: INVALID_ARGUMENT (NULL, bad struct_size). */
CHUNKSERVE_API chunkserve_status_t chunkserve_engine_stats(chunkserve_engine_t* engine,
                                                           chunkserve_engine_stats_t* stats,
                                                           chunkserve_error_t** out_error);

/* Facts about the served model, for building valid requests. The caller sets struct_size.
 * Version 1 (chunkserve 0.1): 24 bytes. */
typedef struct chunkserve_engine_info {
  uint32_t struct_size;       /* set by the caller: sizeof(chunkserve_engine_info_t) */
  int32_t vocab_size;         /* token ids are in [0, vocab_size) */
  int32_t max_context;        /* prompt + generated tokens per request */
  int32_t chunk_size;         /* tokens per KV chunk */
  uint64_t model_fingerprint; /* equal for equal weights and config */
} chunkserve_engine_info_t;

/* Fills *info. Errors: INVALID_ARGUMENT (NULL, bad struct_size). */
CHUNKSERVE_API chunkserve_status_t chunkserve_engine_info(chunkserve_engine_t* engine,
                                                          chunkserve_engine_info_t* info,
                                                          chunkserve_error_t** out_error);

/* ---- Text (since 0.3) ---------------------------------------------------------------------- */

/* Text <-> token ids with the served model's own tokenizer, its chat template and its
 * end-of-answer ids, so that a caller can build prompts and read answers without a tokenizer of
 * its own.
 *
 * Where the text comes from: the files at the engine's model_path, loaded on the first text call
 * of the engine (once, thread-safe; later calls reuse it, and a failure is remembered and
 * returned again): a .gguf file's tokenizer.ggml.* metadata and tokenizer.chat_template, or a
 * model folder's tokenizer.json (+ tokenizer_config.json, generation_config.json, config.json).
 * Results equal Hugging Face tokenizers / transformers for the supported vocabularies
 * (runtime/tokenizer/README.md). An engine without them fails every text call:
 *   FAILED_PRECONDITION  the built-in tiny model (model_path NULL or ""), which has no tokenizer;
 *   NOT_FOUND            a model folder without tokenizer.json (e.g. safetensors weights only);
 *   DATA_LOSS            malformed tokenizer files;  UNIMPLEMENTED  an unsupported tokenizer.
 * The message names the function, the model path and what is missing. The remote client
 * (chunkserve_client_t) has no text functions yet: a caller of a remote server tokenizes with a
 * local engine on the same model files, or uses the server's OpenAI-compatible HTTP API.
 *
 * Sizing contract, the same for every function below that fills a caller's buffer: the caller
 * passes the buffer and its capacity (ids: int32_t elements; text: bytes); the function always
 * sets *num_ids / *text_len to the size of the whole result. When it fits, the result is written
 * and the status is OK; when it does not, nothing is written and the status is
 * CHUNKSERVE_STATUS_OUT_OF_RANGE with *num_ids / *text_len the capacity needed, so the caller
 * can allocate that much and call again. A buffer may be NULL when its capacity is 0 (a pure size
 * query). Text is UTF-8; *text_len excludes the terminating NUL, which is written after the text
 * only when capacity > *text_len (pass *text_len + 1 to get a C string). The text itself may
 * contain NUL bytes when the ids decode to them: use *text_len, not strlen. Pass out_error NULL
 * for a size query that is expected to fail, to avoid allocating the error object.
 *
 * Threading: every function taking the engine may run on many threads at once. */

/* Encodes text_len bytes of UTF-8 text (no NUL needed; text may be NULL when text_len is 0) into
 * token ids. Special tokens written in the text ("<|im_start|>") become their ids.
 * add_special_tokens 1 adds what the tokenizer's post-processor adds (a BOS token for Llama-style
 * vocabularies; nothing for SmolLM2), 0 adds nothing. Sizing contract above.
 * Errors: INVALID_ARGUMENT (NULL engine or num_ids, NULL text with text_len > 0, NULL ids with
 * capacity > 0, add_special_tokens not 0 or 1, text that is not valid UTF-8: the message gives
 * the byte offset), OUT_OF_RANGE (capacity < *num_ids), and the loading errors above. */
CHUNKSERVE_API chunkserve_status_t chunkserve_tokenize(chunkserve_engine_t* engine,
                                                       const char* text, size_t text_len,
                                                       int32_t add_special_tokens, int32_t* ids,
                                                       size_t capacity, size_t* num_ids,
                                                       chunkserve_error_t** out_error);

/* Decodes num_ids token ids (ids may be NULL when num_ids is 0) into UTF-8 text.
 * skip_special_tokens 1 leaves out special tokens (<|im_end|>, BOS/EOS), 0 keeps their text. The
 * result is always valid UTF-8 (an incomplete character becomes U+FFFD). Sizing contract above:
 * capacity in bytes, NUL written when capacity > *text_len.
 * Errors: INVALID_ARGUMENT (NULL engine or text_len, NULL ids with num_ids > 0, NULL text with
 * capacity > 0, skip_special_tokens not 0 or 1, an id outside [0, the tokenizer's vocabulary):
 * the message gives the id and its position), OUT_OF_RANGE (capacity < *text_len), and the
 * loading errors above. */
CHUNKSERVE_API chunkserve_status_t chunkserve_detokenize(chunkserve_engine_t* engine,
                                                         const int32_t* ids, size_t num_ids,
                                                         int32_t skip_special_tokens, char* text,
                                                         size_t capacity, size_t* text_len,
                                                         chunkserve_error_t** out_error);

/* A streaming detokenizer: the ids of one generated sequence go in one at a time, text comes out
 * as soon as it is complete. Every piece is valid UTF-8 and never ends in half a character (the
 * bytes of a character spread over several tokens are held back until it is complete), and the
 * concatenation of every push's and the final flush's text equals chunkserve_detokenize of all
 * the ids with the same skip_special_tokens. One per sequence; not thread-safe (one thread at a
 * time). It holds the engine's tokenizer itself, so it stays usable after the engine is destroyed,
 * and either may be destroyed first. */
typedef struct chunkserve_detokenizer chunkserve_detokenizer_t;

/* Creates a detokenizer over the engine's tokenizer (loading it if this is the engine's first text
 * call). skip_special_tokens: 1 leaves special tokens out of the text, 0 keeps them. On success
 * *out_detokenizer is a new detokenizer the caller destroys with chunkserve_detokenizer_destroy;
 * on failure it is set to NULL.
 * Errors: INVALID_ARGUMENT (NULL engine or out_detokenizer, skip_special_tokens not 0 or 1), and
 * the loading errors above. */
CHUNKSERVE_API chunkserve_status_t chunkserve_detokenizer_create(
    chunkserve_engine_t* engine, int32_t skip_special_tokens,
    chunkserve_detokenizer_t** out_detokenizer, chunkserve_error_t** out_error);

/* Adds one id and writes the text it completes (often a word piece; possibly empty, when the id
 * ends in the middle of a character). Sizing contract above (a piece is rarely longer than a few
 * dozen bytes; 256 bytes hold nearly all). On any error, OUT_OF_RANGE included, the detokenizer is
 * left exactly as it was (the id is not taken), so the same call can be repeated with a larger
 * buffer. Errors: INVALID_ARGUMENT (NULL detokenizer or text_len, NULL text with capacity > 0, an
 * id outside the vocabulary), OUT_OF_RANGE (capacity < *text_len). */
CHUNKSERVE_API chunkserve_status_t chunkserve_detokenizer_push(
    chunkserve_detokenizer_t* detokenizer, int32_t id, char* text, size_t capacity,
    size_t* text_len, chunkserve_error_t** out_error);

/* Writes the text still held back (bytes of an unfinished character become U+FFFD; usually empty)
 * and empties the detokenizer, which may then start a new sequence. Sizing contract above; on
 * OUT_OF_RANGE nothing is taken, so the call can be repeated.
 * Errors: INVALID_ARGUMENT (NULL detokenizer or text_len, NULL text with capacity > 0),
 * OUT_OF_RANGE (capacity < *text_len). */
CHUNKSERVE_API chunkserve_status_t chunkserve_detokenizer_flush(
    chunkserve_detokenizer_t* detokenizer, char* text, size_t capacity, size_t* text_len,
    chunkserve_error_t** out_error);

/* Frees the detokenizer (text still held back is dropped). NULL: no-op. */
CHUNKSERVE_API void chunkserve_detokenizer_destroy(chunkserve_detokenizer_t* detokenizer);

/* Renders a conversation with the model's chat template, as transformers' apply_chat_template
 * does: message i has role roles[i] ("system", "user", "assistant") and content contents[i], both
 * NUL-terminated UTF-8 (the arrays may be NULL when num_messages is 0). add_generation_prompt 1
 * appends the start of an assistant turn (for ChatML models "<|im_start|>assistant\n"), 0 does
 * not. The text is a prompt for chunkserve_tokenize (it already holds the special tokens as text;
 * tokenize it with add_special_tokens 0). Sizing contract above: capacity in bytes.
 * Errors: INVALID_ARGUMENT (NULL engine or text_len, NULL roles or contents with num_messages > 0,
 * a NULL role or content: the message gives its index, NULL text with capacity > 0,
 * add_generation_prompt not 0 or 1, a conversation the template refuses, e.g. roles that do not
 * alternate for Llama 2 / Mistral: the template's own message), FAILED_PRECONDITION (the model has
 * no chat template), UNIMPLEMENTED (a template of a family chunkserve does not render),
 * OUT_OF_RANGE (capacity < *text_len), and the loading errors above. */
CHUNKSERVE_API chunkserve_status_t chunkserve_apply_chat_template(
    chunkserve_engine_t* engine, const char* const* roles, const char* const* contents,
    size_t num_messages, int32_t add_generation_prompt, char* text, size_t capacity,
    size_t* text_len, chunkserve_error_t** out_error);

/* The ids that end an answer (the model's EOS token plus its chat template's end-of-turn token,
 * e.g. <|im_end|> or <|eot_id|>), sorted and unique: pass them as the request's stop_tokens to end
 * generation at the end of the answer. Sizing contract above (capacity in ids; models have a
 * handful). Errors: INVALID_ARGUMENT (NULL engine or num_ids, NULL ids with capacity > 0),
 * OUT_OF_RANGE (capacity < *num_ids), and the loading errors above. */
CHUNKSERVE_API chunkserve_status_t chunkserve_engine_eos_ids(chunkserve_engine_t* engine,
                                                             int32_t* ids, size_t capacity,
                                                             size_t* num_ids,
                                                             chunkserve_error_t** out_error);

/* ---- Streams ------------------------------------------------------------------------------- */

/* One event of a stream. Version 1 (chunkserve 0.1): 48 bytes on LP64. Version 2 (chunkserve
 * 0.4): 216 bytes, + the logprobs of TOKEN events. Log-probabilities are under the model's own
 * distribution softmax(logits), before temperature and top-k / top-p (what OpenAI's API reports),
 * computed in double precision and rounded to float; a token of probability 0 has -INFINITY. */
typedef struct chunkserve_stream_event {
  uint32_t struct_size;      /* next(): set by the caller; callbacks: the library's size */
  int32_t kind;              /* CHUNKSERVE_EVENT_TOKEN or CHUNKSERVE_EVENT_FINISHED */
  int32_t token;             /* TOKEN: the generated token id (FINISHED: -1) */
  int32_t index;             /* TOKEN: 0-based position among the generated tokens (FINISHED: 0) */
  int32_t finish_reason;     /* FINISHED: CHUNKSERVE_FINISH_* */
  chunkserve_status_t status; /* FINISHED: OK, or why it failed (FINISH_ERROR / _UNAVAILABLE) */
  int32_t prompt_tokens;     /* FINISHED: tokens in the prompt */
  int32_t cached_tokens;     /* FINISHED: prompt tokens whose KV came from the prefix cache */
  int32_t generated_tokens;  /* FINISHED: tokens streamed */
  int32_t reserved0;
  const char* error_message; /* FINISHED with status != OK: the message, else NULL. Owned by the
                                library: valid until the stream is destroyed (next()) or until
                                the callback returns (callbacks) */
  /* Version 2. */
  int32_t num_top_logprobs;  /* TOKEN of a request with logprobs = k >= 0: the entries in
                                top_tokens / top_logprobs (k, or fewer when fewer tokens have a
                                finite logit); -1 otherwise (and on FINISHED) */
  float logprob;             /* TOKEN with num_top_logprobs >= 0: log p(token); else 0 */
  int32_t top_tokens[CHUNKSERVE_MAX_TOP_LOGPROBS];  /* most likely first; ties: lower id first */
  float top_logprobs[CHUNKSERVE_MAX_TOP_LOGPROBS];  /* log p(top_tokens[i]) */
} chunkserve_stream_event_t;

/* The stream's request id (for chunkserve_engine_cancel); ids start at 1. 0 when NULL. */
CHUNKSERVE_API uint64_t chunkserve_stream_id(const chunkserve_stream_t* stream);

/* Waits up to timeout_ms (0: just poll; CHUNKSERVE_WAIT_FOREVER: no limit) for the stream's next
 * event and writes it to *event (the caller sets event->struct_size). Returns:
 *   OK                  *event holds a TOKEN or the FINISHED event;
 *   DEADLINE_EXCEEDED   the timeout passed without an event (try again);
 *   OUT_OF_RANGE        the FINISHED event was already returned: the stream has ended;
 *   FAILED_PRECONDITION a callback is set (a next() blocked when it was set returns this within
 *                       about 100 ms);
 *   INVALID_ARGUMENT    NULL stream or event, bad struct_size.
 * Every request gets a FINISHED event, including after chunkserve_engine_destroy, so waiting
 * forever terminates. Several threads may wait on one stream; each event goes to one of them. */
CHUNKSERVE_API chunkserve_status_t chunkserve_stream_next(chunkserve_stream_t* stream,
                                                          int64_t timeout_ms,
                                                          chunkserve_stream_event_t* event,
                                                          chunkserve_error_t** out_error);

/* A stream callback: receives one event (valid only during the call) and the user_data given to
 * chunkserve_stream_set_callback. */
typedef void (*chunkserve_stream_callback_t)(const chunkserve_stream_event_t* event,
                                             void* user_data);

/* Delivers every event of the stream to callback(event, user_data) instead of chunkserve_stream_
 * next, in order, starting with the events already queued (those are delivered on the calling
 * thread before this returns). Later events are delivered on the engine's step thread: the
 * callback must return quickly and must not block. It may call chunkserve_engine_submit,
 * chunkserve_engine_cancel and chunkserve_stream_destroy of other streams; chunkserve_engine_
 * shutdown of its engine fails with FAILED_PRECONDITION, and chunkserve_engine_destroy of its
 * engine is completed by another thread once the callback returns (both would otherwise wait
 * for the step thread, which is running the callback). Callback invocations for one stream never overlap. After
 * chunkserve_stream_destroy returns, the callback is never invoked again (destroy waits for a
 * running invocation), so user_data may then be freed. Set at most once.
 * Errors: INVALID_ARGUMENT (NULL stream or callback), FAILED_PRECONDITION (already set). */
CHUNKSERVE_API chunkserve_status_t chunkserve_stream_set_callback(
    chunkserve_stream_t* stream, chunkserve_stream_callback_t callback, void* user_data,
    chunkserve_error_t** out_error);

/* Asks the engine to cancel the request; the FINISHED event (FINISH_CANCELLED, or whatever ended
 * it first) still arrives through the stream, at the engine's next step. Idempotent; OK also
 * after the stream finished (no effect) and after the engine was destroyed.
 * Errors: INVALID_ARGUMENT (NULL stream). */
CHUNKSERVE_API chunkserve_status_t chunkserve_stream_cancel(chunkserve_stream_t* stream,
                                                            chunkserve_error_t** out_error);

/* Frees the stream. A request still running is cancelled (its KV is released at the engine's
 * next step). Safe while the engine runs and after it was destroyed. Must not overlap another
 * call on this stream. NULL: no-op. */
CHUNKSERVE_API void chunkserve_stream_destroy(chunkserve_stream_t* stream);

/* ---- Remote client (added in chunkserve 0.1, after the engine) ----------------------------- */

/* A connection to a remote chunkserve-router or chunkserve-worker (both speak the same client
 * protocol, runtime/wire/chunkserve.capnp: Generate / Token / Finish / Cancel / Error). Requests
 * submitted through it return the same chunkserve_stream_t as the in-process engine: next with a
 * timeout, callbacks, cancel, id and destroy behave as documented above, with these differences:
 *  - Validation that needs the model (token ids below the vocabulary size, prompt length against
 *    the context) and admission (queue full, draining server) happen on the server. Such a
 *    rejection does not fail chunkserve_client_submit; it ends the stream at once with
 *    CHUNKSERVE_FINISH_ERROR and the server's status (INVALID_ARGUMENT, RESOURCE_EXHAUSTED for
 *    "overloaded", ...) and message, or CHUNKSERVE_FINISH_UNAVAILABLE with status UNAVAILABLE
 *    (retryable: the server drains or shuts down).
 *  - When the connection fails or the server goes away, every live stream ends with
 *    CHUNKSERVE_FINISH_UNAVAILABLE, status UNAVAILABLE and a message naming the server and the
 *    cause (the FINISHED event counts the tokens already delivered, so the caller knows what it
 *    has; the request is safe to submit again). The client then reconnects by itself, with
 *    backoff from 100 ms doubling to 5 s, until it is destroyed; submits meanwhile fail at once
 *    with UNAVAILABLE ("not connected: ...; reconnecting") and succeed again once it is back.
 *  - A request with deadline_ms that the server has not ended a second after its deadline is
 *    ended here with FINISH_DEADLINE: no stream waits past its deadline on any server.
 *  - Authentication: a server with a cluster secret challenges every connection; the client
 *    answers with $CHUNKSERVE_CLIENT_TOKEN, else $CHUNKSERVE_CLUSTER_SECRET (an HMAC proof; the
 *    key never crosses the wire). Without a key, or with a wrong one, live streams end with
 *    CHUNKSERVE_FINISH_ERROR and status UNAUTHENTICATED, and submits fail with UNAUTHENTICATED.
 *  - Stream callbacks run on the client's network thread (one per client) instead of an engine's
 *    step thread; the same rules apply, and a callback must not call chunkserve_client_destroy.
 *  - chunkserve_stream_id is the id the client gave the request (unique per client, from 1);
 *    chunkserve_stream_cancel sends a Cancel and the FINISHED event (FINISH_CANCELLED, or
 *    whatever ended the request first) arrives when the server answers; a server that does not
 *    answer within 5 s gets the stream ended here with FINISH_CANCELLED, so cancelling never
 *    leaves a stream waiting on an unresponsive server.
 * Thread-safe: submit and cancel may be called from any number of threads at once. */
typedef struct chunkserve_client chunkserve_client_t;

/* Client options. Fill with chunkserve_client_options_init, then set host and port.
 * Version 1 (chunkserve 0.1): 24 bytes on LP64. Version 2 (TLS fields): 48 bytes. Version 3
 * (tls_crl_file): 56 bytes. */
typedef struct chunkserve_client_options {
  uint32_t struct_size;          /* sizeof(chunkserve_client_options_t) the caller was built with */
  int32_t port;                  /* TCP port of the router or worker, 1..65535; no default */
  const char* host;              /* IPv4 / IPv6 address or host name, UTF-8, borrowed for the
                                    create call; required, non-empty */
  int32_t connect_timeout_ms;    /* bound on connecting, >= 0; 0: default 5000 (a host
                                    name is resolved by the system resolver first) */
  int32_t keepalive_interval_ms; /* a health probe is sent this often so that servers with an
                                    idle deadline keep the connection; 0: default 5000; -1: off */
  /* Version 2. TLS to a router or worker started with --tls-ca/--tls-cert/--tls-key. Paths are
   * borrowed for the create call; the files are read then. */
  const char* tls_ca_file;       /* PEM CA certificate(s) that must have signed the server's
                                    certificate, whose names must cover `host`; NULL or "":
                                    plaintext */
  const char* tls_cert_file;     /* optional PEM certificate this client presents (with
                                    tls_key_file; a client needs none); NULL or "": none */
  const char* tls_key_file;      /* its PEM private key; NULL or "": none */
  /* Version 3. */
  const char* tls_crl_file;      /* optional PEM certificate revocation list(s) of the CA (needs
                                    tls_ca_file): a server whose certificate it lists is refused;
                                    re-read within a second of the file changing, and a
                                    connection to a server it newly lists closes (reconnects are
                                    refused); NULL or "": no revocation check */
} chunkserve_client_options_t;

/* Fills *options with the defaults (no host, port 0) and sets struct_size, as
 * chunkserve_engine_options_init does. Errors: INVALID_ARGUMENT. */
CHUNKSERVE_API chunkserve_status_t chunkserve_client_options_init(
    chunkserve_client_options_t* options, uint32_t struct_size, chunkserve_error_t** out_error);

/* Resolves options->host, connects to it within connect_timeout_ms and starts the client's
 * network thread. On success *out_client is a new client the caller destroys with
 * chunkserve_client_destroy; on failure it is set to NULL. With tls_ca_file the TLS handshake
 * completes within connect_timeout_ms as well.
 * Errors: INVALID_ARGUMENT (NULL options or out_client, bad struct_size, empty host, port out of
 * range, negative timeout, a TLS file that cannot be read or a certificate without its key, a
 * revocation list not signed by the CA or past its next update),
 * UNAVAILABLE (the host does not resolve, the connection is refused or does not complete within
 * the timeout; the message says which), UNAUTHENTICATED (the TLS handshake failed: the server's
 * certificate is not from that CA or does not name `host`, or the server does not speak TLS). */
CHUNKSERVE_API chunkserve_status_t chunkserve_client_create(
    const chunkserve_client_options_t* options, chunkserve_client_t** out_client,
    chunkserve_error_t** out_error);

/* Closes the connection (the server cancels the client's requests), stops the network thread and
 * frees the client. Every stream still live ends with CHUNKSERVE_FINISH_UNAVAILABLE (status
 * UNAVAILABLE); streams stay valid and must still be destroyed by the caller. Must not be called
 * from a stream callback. NULL: no-op. */
CHUNKSERVE_API void chunkserve_client_destroy(chunkserve_client_t* client);

/* Validates the request as far as possible without the model and sends it. The token arrays are
 * copied. On success *out_stream is a new stream the caller destroys with
 * chunkserve_stream_destroy; on failure it is set to NULL. Safe from any thread concurrently.
 * Errors: INVALID_ARGUMENT (NULL arguments, bad struct_size, empty prompt, a negative token id,
 * max_new_tokens < 1, bad sampling values, more than 4,000,000 prompt and stop tokens),
 * RESOURCE_EXHAUSTED (the connection's send queue is full), UNAVAILABLE (not connected). */
CHUNKSERVE_API chunkserve_status_t chunkserve_client_submit(
    chunkserve_client_t* client, const chunkserve_request_options_t* request,
    chunkserve_stream_t** out_stream, chunkserve_error_t** out_error);

/* Cancels the live request with that id (chunkserve_stream_id of one of this client's streams);
 * its stream then ends with FINISH_CANCELLED unless it ended first. Errors: INVALID_ARGUMENT
 * (NULL client), NOT_FOUND (no live request of this client has that id). */
CHUNKSERVE_API chunkserve_status_t chunkserve_client_cancel(chunkserve_client_t* client,
                                                            uint64_t request_id,
                                                            chunkserve_error_t** out_error);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* CHUNKSERVE_CHUNKSERVE_H_ */
