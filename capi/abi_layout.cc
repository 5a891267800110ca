// The ABI freeze: every published struct's size, alignment and field offsets, and every published
// constant, pinned at compile time. A failing assert here means an ABI break; see capi/README.md
// ("Changing the ABI") for what is allowed. The values are LP64 (x86-64 and AArch64 Linux), the
// only data model chunkserve is built for.
#include "capi/abi_layout.h"

#include <cstddef>
#include <cstdint>

#include "capi/include/chunkserve/chunkserve.h"
#include "runtime/base/finish_reason.h"
#include "runtime/base/logprobs.h"
#include "runtime/base/status.h"
#include "runtime/engine/engine.h"

namespace chunkserve::capi {
namespace {

static_assert(sizeof(void*) == 8 && sizeof(float) == 4 && sizeof(double) == 8,
              "the frozen layouts below are for LP64 targets");

// The header's version macros are the project's version, and its ABI version is the soname's.
static_assert(CHUNKSERVE_VERSION_MAJOR == CHUNKSERVE_PROJECT_VERSION_MAJOR &&
                  CHUNKSERVE_VERSION_MINOR == CHUNKSERVE_PROJECT_VERSION_MINOR &&
                  CHUNKSERVE_VERSION_PATCH == CHUNKSERVE_PROJECT_VERSION_PATCH,
              "CHUNKSERVE_VERSION_* in chunkserve.h must match project(VERSION) in CMakeLists.txt");
static_assert(CHUNKSERVE_ABI_VERSION == CHUNKSERVE_CAPI_SOVERSION,
              "CHUNKSERVE_ABI_VERSION must equal the library's SOVERSION");

#define CHUNKSERVE_FIELD_AT(type, field, offset, size)                         \
  static_assert(offsetof(type, field) == (offset), #type "." #field " moved"); \
  static_assert(sizeof(type::field) == (size), #type "." #field " resized")

// chunkserve_engine_options_t, version 1 (56 bytes) plus the version 2 tiny_model fields.
static_assert(sizeof(chunkserve_engine_options_t) == kEngineOptionsV2Size);
static_assert(alignof(chunkserve_engine_options_t) == 8);
CHUNKSERVE_FIELD_AT(chunkserve_engine_options_t, struct_size, 0, 4);
CHUNKSERVE_FIELD_AT(chunkserve_engine_options_t, backend, 4, 4);
CHUNKSERVE_FIELD_AT(chunkserve_engine_options_t, model_path, 8, 8);
CHUNKSERVE_FIELD_AT(chunkserve_engine_options_t, kv_cache_bytes, 16, 8);
CHUNKSERVE_FIELD_AT(chunkserve_engine_options_t, chunk_size, 24, 4);
CHUNKSERVE_FIELD_AT(chunkserve_engine_options_t, kv_dtype, 28, 4);
CHUNKSERVE_FIELD_AT(chunkserve_engine_options_t, enable_prefix_sharing, 32, 4);
CHUNKSERVE_FIELD_AT(chunkserve_engine_options_t, num_threads, 36, 4);
CHUNKSERVE_FIELD_AT(chunkserve_engine_options_t, max_batch_size, 40, 4);
CHUNKSERVE_FIELD_AT(chunkserve_engine_options_t, prefill_token_budget, 44, 4);
CHUNKSERVE_FIELD_AT(chunkserve_engine_options_t, max_queued_requests, 48, 4);
CHUNKSERVE_FIELD_AT(chunkserve_engine_options_t, reserved0, 52, 4);
CHUNKSERVE_FIELD_AT(chunkserve_engine_options_t, tiny_model, 56, 4);
CHUNKSERVE_FIELD_AT(chunkserve_engine_options_t, gguf_dtype, 60, 4);

// chunkserve_request_options_t, version 1 (72 bytes) plus the version 2 logprobs fields.
static_assert(sizeof(chunkserve_request_options_t) == kRequestOptionsV2Size);
static_assert(alignof(chunkserve_request_options_t) == 8);
CHUNKSERVE_FIELD_AT(chunkserve_request_options_t, struct_size, 0, 4);
CHUNKSERVE_FIELD_AT(chunkserve_request_options_t, max_new_tokens, 4, 4);
CHUNKSERVE_FIELD_AT(chunkserve_request_options_t, prompt_tokens, 8, 8);
CHUNKSERVE_FIELD_AT(chunkserve_request_options_t, num_prompt_tokens, 16, 8);
CHUNKSERVE_FIELD_AT(chunkserve_request_options_t, stop_tokens, 24, 8);
CHUNKSERVE_FIELD_AT(chunkserve_request_options_t, num_stop_tokens, 32, 8);
CHUNKSERVE_FIELD_AT(chunkserve_request_options_t, temperature, 40, 4);
CHUNKSERVE_FIELD_AT(chunkserve_request_options_t, top_k, 44, 4);
CHUNKSERVE_FIELD_AT(chunkserve_request_options_t, top_p, 48, 4);
CHUNKSERVE_FIELD_AT(chunkserve_request_options_t, priority, 52, 4);
CHUNKSERVE_FIELD_AT(chunkserve_request_options_t, seed, 56, 8);
CHUNKSERVE_FIELD_AT(chunkserve_request_options_t, deadline_ms, 64, 8);
CHUNKSERVE_FIELD_AT(chunkserve_request_options_t, logprobs, 72, 4);
CHUNKSERVE_FIELD_AT(chunkserve_request_options_t, reserved0, 76, 4);

// chunkserve_engine_stats_t, version 1.
static_assert(sizeof(chunkserve_engine_stats_t) == kEngineStatsV1Size);
static_assert(alignof(chunkserve_engine_stats_t) == 8);
CHUNKSERVE_FIELD_AT(chunkserve_engine_stats_t, struct_size, 0, 4);
CHUNKSERVE_FIELD_AT(chunkserve_engine_stats_t, running, 4, 4);
CHUNKSERVE_FIELD_AT(chunkserve_engine_stats_t, requests_submitted, 8, 8);
CHUNKSERVE_FIELD_AT(chunkserve_engine_stats_t, requests_finished, 16, 8);
CHUNKSERVE_FIELD_AT(chunkserve_engine_stats_t, prompt_tokens, 24, 8);
CHUNKSERVE_FIELD_AT(chunkserve_engine_stats_t, prefix_hit_tokens, 32, 8);
CHUNKSERVE_FIELD_AT(chunkserve_engine_stats_t, prefill_tokens, 40, 8);
CHUNKSERVE_FIELD_AT(chunkserve_engine_stats_t, generated_tokens, 48, 8);
CHUNKSERVE_FIELD_AT(chunkserve_engine_stats_t, steps, 56, 8);
CHUNKSERVE_FIELD_AT(chunkserve_engine_stats_t, evicted_chunks, 64, 8);
CHUNKSERVE_FIELD_AT(chunkserve_engine_stats_t, preemptions, 72, 8);
CHUNKSERVE_FIELD_AT(chunkserve_engine_stats_t, queued, 80, 4);
CHUNKSERVE_FIELD_AT(chunkserve_engine_stats_t, last_batch_size, 84, 4);
CHUNKSERVE_FIELD_AT(chunkserve_engine_stats_t, kv_bytes_used, 88, 8);
CHUNKSERVE_FIELD_AT(chunkserve_engine_stats_t, kv_bytes_referenced, 96, 8);
CHUNKSERVE_FIELD_AT(chunkserve_engine_stats_t, kv_bytes_if_unshared, 104, 8);
CHUNKSERVE_FIELD_AT(chunkserve_engine_stats_t, kv_bytes_capacity, 112, 8);
CHUNKSERVE_FIELD_AT(chunkserve_engine_stats_t, kv_bytes_peak, 120, 8);
CHUNKSERVE_FIELD_AT(chunkserve_engine_stats_t, chunks_total, 128, 4);
CHUNKSERVE_FIELD_AT(chunkserve_engine_stats_t, chunks_shared, 132, 4);
CHUNKSERVE_FIELD_AT(chunkserve_engine_stats_t, chunks_retained, 136, 4);
CHUNKSERVE_FIELD_AT(chunkserve_engine_stats_t, reserved0, 140, 4);
CHUNKSERVE_FIELD_AT(chunkserve_engine_stats_t, decode_tokens_per_s, 144, 8);
CHUNKSERVE_FIELD_AT(chunkserve_engine_stats_t, prefill_tokens_per_s, 152, 8);

// chunkserve_engine_info_t, version 1.
static_assert(sizeof(chunkserve_engine_info_t) == kEngineInfoV1Size);
static_assert(alignof(chunkserve_engine_info_t) == 8);
CHUNKSERVE_FIELD_AT(chunkserve_engine_info_t, struct_size, 0, 4);
CHUNKSERVE_FIELD_AT(chunkserve_engine_info_t, vocab_size, 4, 4);
CHUNKSERVE_FIELD_AT(chunkserve_engine_info_t, max_context, 8, 4);
CHUNKSERVE_FIELD_AT(chunkserve_engine_info_t, chunk_size, 12, 4);
CHUNKSERVE_FIELD_AT(chunkserve_engine_info_t, model_fingerprint, 16, 8);

// chunkserve_stream_event_t, version 1 (48 bytes) plus the version 2 logprobs fields.
static_assert(sizeof(chunkserve_stream_event_t) == kStreamEventV2Size);
static_assert(alignof(chunkserve_stream_event_t) == 8);
CHUNKSERVE_FIELD_AT(chunkserve_stream_event_t, struct_size, 0, 4);
CHUNKSERVE_FIELD_AT(chunkserve_stream_event_t, kind, 4, 4);
CHUNKSERVE_FIELD_AT(chunkserve_stream_event_t, token, 8, 4);
CHUNKSERVE_FIELD_AT(chunkserve_stream_event_t, index, 12, 4);
CHUNKSERVE_FIELD_AT(chunkserve_stream_event_t, finish_reason, 16, 4);
CHUNKSERVE_FIELD_AT(chunkserve_stream_event_t, status, 20, 4);
CHUNKSERVE_FIELD_AT(chunkserve_stream_event_t, prompt_tokens, 24, 4);
CHUNKSERVE_FIELD_AT(chunkserve_stream_event_t, cached_tokens, 28, 4);
CHUNKSERVE_FIELD_AT(chunkserve_stream_event_t, generated_tokens, 32, 4);
CHUNKSERVE_FIELD_AT(chunkserve_stream_event_t, reserved0, 36, 4);
CHUNKSERVE_FIELD_AT(chunkserve_stream_event_t, error_message, 40, 8);
CHUNKSERVE_FIELD_AT(chunkserve_stream_event_t, num_top_logprobs, 48, 4);
CHUNKSERVE_FIELD_AT(chunkserve_stream_event_t, logprob, 52, 4);
CHUNKSERVE_FIELD_AT(chunkserve_stream_event_t, top_tokens, 56, 80);
CHUNKSERVE_FIELD_AT(chunkserve_stream_event_t, top_logprobs, 136, 80);
static_assert(CHUNKSERVE_MAX_TOP_LOGPROBS == kMaxTopLogprobs);

// chunkserve_client_options_t, version 1 (24 bytes) plus the version 2 TLS fields and the
// version 3 revocation list.
static_assert(sizeof(chunkserve_client_options_t) == kClientOptionsV3Size);
static_assert(alignof(chunkserve_client_options_t) == 8);
CHUNKSERVE_FIELD_AT(chunkserve_client_options_t, struct_size, 0, 4);
CHUNKSERVE_FIELD_AT(chunkserve_client_options_t, port, 4, 4);
CHUNKSERVE_FIELD_AT(chunkserve_client_options_t, host, 8, 8);
CHUNKSERVE_FIELD_AT(chunkserve_client_options_t, connect_timeout_ms, 16, 4);
CHUNKSERVE_FIELD_AT(chunkserve_client_options_t, keepalive_interval_ms, 20, 4);
CHUNKSERVE_FIELD_AT(chunkserve_client_options_t, tls_ca_file, 24, 8);
CHUNKSERVE_FIELD_AT(chunkserve_client_options_t, tls_cert_file, 32, 8);
CHUNKSERVE_FIELD_AT(chunkserve_client_options_t, tls_key_file, 40, 8);
CHUNKSERVE_FIELD_AT(chunkserve_client_options_t, tls_crl_file, 48, 8);

#undef CHUNKSERVE_FIELD_AT

// Scalar typedefs.
static_assert(sizeof(chunkserve_status_t) == 4);

// Status codes: the C values are chunkserve::StatusCode's, and both are frozen.
#define CHUNKSERVE_CODE(c_name, cpp_name, value)                                          \
  static_assert(CHUNKSERVE_STATUS_##c_name == (value), "CHUNKSERVE_STATUS_" #c_name);     \
  static_assert(static_cast<int32_t>(StatusCode::cpp_name) == CHUNKSERVE_STATUS_##c_name, \
                "StatusCode::" #cpp_name " differs from CHUNKSERVE_STATUS_" #c_name)
CHUNKSERVE_CODE(OK, kOk, 0);
CHUNKSERVE_CODE(INVALID_ARGUMENT, kInvalidArgument, 1);
CHUNKSERVE_CODE(NOT_FOUND, kNotFound, 2);
CHUNKSERVE_CODE(ALREADY_EXISTS, kAlreadyExists, 3);
CHUNKSERVE_CODE(RESOURCE_EXHAUSTED, kResourceExhausted, 4);
CHUNKSERVE_CODE(FAILED_PRECONDITION, kFailedPrecondition, 5);
CHUNKSERVE_CODE(OUT_OF_RANGE, kOutOfRange, 6);
CHUNKSERVE_CODE(UNAVAILABLE, kUnavailable, 7);
CHUNKSERVE_CODE(DEADLINE_EXCEEDED, kDeadlineExceeded, 8);
CHUNKSERVE_CODE(CANCELLED, kCancelled, 9);
CHUNKSERVE_CODE(INTERNAL, kInternal, 10);
CHUNKSERVE_CODE(UNIMPLEMENTED, kUnimplemented, 11);
CHUNKSERVE_CODE(DATA_LOSS, kDataLoss, 12);
CHUNKSERVE_CODE(ABORTED, kAborted, 13);
CHUNKSERVE_CODE(UNAUTHENTICATED, kUnauthenticated, 14);
#undef CHUNKSERVE_CODE

// Finish reasons.
#define CHUNKSERVE_FINISH(c_name, cpp_name, value)                                          \
  static_assert(CHUNKSERVE_FINISH_##c_name == (value), "CHUNKSERVE_FINISH_" #c_name);       \
  static_assert(static_cast<int32_t>(FinishReason::cpp_name) == CHUNKSERVE_FINISH_##c_name, \
                "FinishReason::" #cpp_name " differs from CHUNKSERVE_FINISH_" #c_name)
CHUNKSERVE_FINISH(STOP_TOKEN, kStopToken, 0);
CHUNKSERVE_FINISH(LENGTH, kLength, 1);
CHUNKSERVE_FINISH(CANCELLED, kCancelled, 2);
CHUNKSERVE_FINISH(DEADLINE, kDeadline, 3);
CHUNKSERVE_FINISH(ERROR, kError, 4);
CHUNKSERVE_FINISH(UNAVAILABLE, kUnavailable, 5);
#undef CHUNKSERVE_FINISH

// Option values, which the implementation converts with static_cast. (The KV dtype enum lives in
// kernels/, which capi/ does not include directly.)
using KvDType = decltype(engine::EngineOptions::kv_dtype);
static_assert(CHUNKSERVE_BACKEND_CPU == 0 &&
              static_cast<int32_t>(engine::BackendKind::kCpu) == CHUNKSERVE_BACKEND_CPU);
static_assert(CHUNKSERVE_BACKEND_CUDA == 1 &&
              static_cast<int32_t>(engine::BackendKind::kCuda) == CHUNKSERVE_BACKEND_CUDA);
static_assert(CHUNKSERVE_DTYPE_F32 == 0 &&
              static_cast<int32_t>(KvDType::kF32) == CHUNKSERVE_DTYPE_F32);
static_assert(CHUNKSERVE_DTYPE_F16 == 1 &&
              static_cast<int32_t>(KvDType::kF16) == CHUNKSERVE_DTYPE_F16);
static_assert(CHUNKSERVE_DTYPE_BF16 == 2 &&
              static_cast<int32_t>(KvDType::kBF16) == CHUNKSERVE_DTYPE_BF16);
static_assert(CHUNKSERVE_SHUTDOWN_DRAIN == 0 &&
              static_cast<int32_t>(engine::ShutdownMode::kDrain) == CHUNKSERVE_SHUTDOWN_DRAIN);
static_assert(CHUNKSERVE_SHUTDOWN_ABORT == 1 &&
              static_cast<int32_t>(engine::ShutdownMode::kAbort) == CHUNKSERVE_SHUTDOWN_ABORT);
static_assert(CHUNKSERVE_EVENT_TOKEN == 0 && CHUNKSERVE_EVENT_FINISHED == 1);
static_assert(CHUNKSERVE_WAIT_FOREVER == -1);
static_assert(CHUNKSERVE_ABI_VERSION == 0);

}  // namespace
}  // namespace chunkserve::capi
