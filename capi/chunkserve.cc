// The C ABI over chunkserve::engine: handles, versioned structs and one guard per entry point.
//
// Every exported function runs its body inside Guard(), which turns a non-OK Status, a C++
// exception or an allocation failure into a status code plus an optional error object, so nothing
// but a code crosses the ABI. Versioned structs are copied through ReadVersioned / WriteVersioned,
// which touch only the bytes the caller's struct_size covers; their layouts are frozen in
// abi_layout.cc.
#include "capi/include/chunkserve/chunkserve.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <new>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "capi/abi_layout.h"
#include "capi/remote_client.h"
#include "runtime/base/finish_reason.h"
#include "runtime/base/logging.h"
#include "runtime/base/status.h"
#include "runtime/engine/engine.h"
#include "runtime/sched/request.h"
#include "runtime/sched/stream.h"
#include "runtime/tokenizer/model_text.h"
#include "runtime/tokenizer/stream_decoder.h"

namespace cs = ::chunkserve;

struct chunkserve_error {
  chunkserve_status_t code;
  std::string message;
};

struct chunkserve_engine {
  std::unique_ptr<cs::engine::Engine> engine;
  std::string model_path;  // as created; "" = the built-in tiny model
  // The model's text (tokenizer, chat template, EOS ids), loaded on the first text call. The
  // outcome, failure included, is kept: the files are read once.
  std::mutex text_mu;
  bool text_loaded = false;  // guarded by text_mu
  std::shared_ptr<const cs::tokenizer::ModelText> text;
  cs::Status text_status;
};

// Owns its ModelText (so its Tokenizer, which the StreamDecoder points to) independently of the
// engine: either may be destroyed first.
struct chunkserve_detokenizer {
  std::shared_ptr<const cs::tokenizer::ModelText> text;
  cs::tokenizer::StreamDecoder decoder;
};

struct chunkserve_client {
  std::unique_ptr<cs::capi::RemoteClient> client;
};

namespace {

using cs::Status;
using cs::sched::RequestStream;
using cs::sched::StreamEvent;

// Handed out when even the error object cannot be allocated; chunkserve_error_free ignores it.
// The message fits std::string's small buffer, so constructing it allocates nothing.
chunkserve_error g_out_of_memory{CHUNKSERVE_STATUS_RESOURCE_EXHAUSTED, "out of memory"};

chunkserve_status_t Report(chunkserve_error_t** out_error, chunkserve_status_t code,
                           std::string_view message) noexcept {
  if (out_error != nullptr) {
    try {
      *out_error = new chunkserve_error{code, std::string(message)};
    } catch (...) {
      *out_error = &g_out_of_memory;
    }
  }
  return code;
}

// Runs `body` (returning Status) and reports its outcome; nothing escapes.
template <typename Body>
chunkserve_status_t Guard(const char* function, chunkserve_error_t** out_error,
                          Body&& body) noexcept {
  if (out_error != nullptr) *out_error = nullptr;
  try {
    const Status s = body();
    if (s.ok()) return CHUNKSERVE_STATUS_OK;
    return Report(out_error, static_cast<chunkserve_status_t>(s.code()), s.message());
  } catch (const std::bad_alloc&) {
    return Report(out_error, CHUNKSERVE_STATUS_RESOURCE_EXHAUSTED, "out of memory");
  } catch (const std::exception& e) {
    try {
      return Report(out_error, CHUNKSERVE_STATUS_INTERNAL,
                    std::string(function) + ": unexpected exception: " + e.what());
    } catch (...) {
      return Report(out_error, CHUNKSERVE_STATUS_INTERNAL, "unexpected exception");
    }
  } catch (...) {
    return Report(out_error, CHUNKSERVE_STATUS_INTERNAL, "unexpected non-standard exception");
  }
}

// For the void entry points (*_destroy): swallow whatever a destructor might throw.
template <typename Body>
void GuardVoid(Body&& body) noexcept {
  try {
    body();
  } catch (...) {
  }
}

Status NullArgument(const char* function, const char* name) {
  return Status::InvalidArgument(std::string(function) + ": " + name + " is NULL");
}

// The largest struct_size accepted: a caller built against a newer header may pass a bigger
// struct than this library knows (its extra fields must then be zero when read), never an absurd
// one.
constexpr uint32_t kMaxStructSize = 4096;

Status CheckStructSize(const char* function, const char* type, uint32_t struct_size, size_t v1_size,
                       size_t current_size) {
  (void)current_size;
  if (struct_size >= v1_size && struct_size <= kMaxStructSize) return Status::Ok();
  return Status::InvalidArgument(std::string(function) + ": " + type + ".struct_size is " +
                                 std::to_string(struct_size) + ", expected " +
                                 std::to_string(v1_size) + ".." + std::to_string(current_size) +
                                 " (set it to sizeof(" + type + "))");
}

// Copies the caller's struct over `*out` (which holds the defaults): only the bytes the caller's
// struct_size covers are read, so fields newer than the caller keep their defaults.
// A struct larger than this library's (from a newer header) is read as far as this library
// knows it; its newer fields must be zero (their defaults), so that a request this library cannot
// honour fails instead of being silently changed.
template <typename T>
Status ReadVersioned(const char* function, const char* type, const T* in, size_t v1_size, T* out) {
  const uint32_t size = in->struct_size;
  CHUNKSERVE_RETURN_IF_ERROR(CheckStructSize(function, type, size, v1_size, sizeof(T)));
  if (size > sizeof(T)) {
    const auto* extra = reinterpret_cast<const unsigned char*>(in) + sizeof(T);
    for (size_t i = 0; i < size - sizeof(T); ++i) {
      if (extra[i] != 0) {
        return Status::InvalidArgument(
            std::string(function) + ": " + type + " sets fields this library (" +
            chunkserve::capi::kVersionString + ", " + std::to_string(sizeof(T)) +
            "-byte struct) does not know (byte " + std::to_string(sizeof(T) + i) +
            " of " + std::to_string(size) + " is not zero): use a library as new as the header");
      }
    }
  }
  std::memcpy(static_cast<void*>(out), in, std::min<size_t>(size, sizeof(T)));
  return Status::Ok();
}

// Writes `n` bytes of `value` to `out` and zeroes the caller's bytes past this library's struct.
template <typename T>
void CopyOut(const T& value, uint32_t size, T* out) {
  std::memcpy(static_cast<void*>(out), &value, std::min<size_t>(size, sizeof(T)));
  if (size > sizeof(T)) std::memset(reinterpret_cast<unsigned char*>(out) + sizeof(T), 0, size - sizeof(T));
}

// Writes `value` into the caller's struct, only as many bytes as its struct_size says; the
// caller's struct_size is kept.
template <typename T>
Status WriteVersioned(const char* function, const char* type, const T& value, size_t v1_size,
                      T* out) {
  const uint32_t size = out->struct_size;
  CHUNKSERVE_RETURN_IF_ERROR(CheckStructSize(function, type, size, v1_size, sizeof(T)));
  T copy = value;
  copy.struct_size = size;
  CopyOut(copy, size, out);
  return Status::Ok();
}

// Initialises a versioned struct whose caller-side size is `struct_size`.
template <typename T>
Status InitVersioned(const char* function, const char* type, const T& defaults,
                     uint32_t struct_size, size_t v1_size, T* out) {
  if (out == nullptr) return NullArgument(function, "options");
  CHUNKSERVE_RETURN_IF_ERROR(CheckStructSize(function, type, struct_size, v1_size, sizeof(T)));
  T copy = defaults;
  copy.struct_size = struct_size;
  CopyOut(copy, struct_size, out);
  return Status::Ok();
}

chunkserve_engine_options_t DefaultEngineOptions() {
  const cs::engine::EngineOptions d;
  chunkserve_engine_options_t o{};
  o.struct_size = sizeof(o);
  o.backend = static_cast<int32_t>(d.backend);
  o.model_path = nullptr;
  o.kv_cache_bytes = d.kv_cache_bytes;
  o.chunk_size = d.chunk_size;
  o.kv_dtype = static_cast<int32_t>(d.kv_dtype);
  o.enable_prefix_sharing = d.enable_prefix_sharing ? 1 : 0;
  o.num_threads = d.num_threads;
  o.max_batch_size = d.max_batch_size;
  o.prefill_token_budget = d.prefill_token_budget;
  o.max_queued_requests = d.max_queued_requests;
  o.reserved0 = 0;
  o.tiny_model = 0;
  o.gguf_dtype = static_cast<int32_t>(d.gguf_dtype);
  return o;
}

chunkserve_request_options_t DefaultRequestOptions() {
  const cs::sched::RequestOptions d;
  chunkserve_request_options_t o{};
  o.struct_size = sizeof(o);
  o.max_new_tokens = d.max_new_tokens;
  o.prompt_tokens = nullptr;
  o.num_prompt_tokens = 0;
  o.stop_tokens = nullptr;
  o.num_stop_tokens = 0;
  o.temperature = d.sampling.temperature;
  o.top_k = d.sampling.top_k;
  o.top_p = d.sampling.top_p;
  o.priority = d.priority;
  o.seed = d.sampling.seed;
  o.deadline_ms = 0;
  o.logprobs = d.logprobs;
  o.reserved0 = 0;
  return o;
}

Status ToEngineOptions(const chunkserve_engine_options_t& in, cs::engine::EngineOptions* out) {
  const cs::engine::EngineOptions d;
  constexpr const char* kFn = "chunkserve_engine_create";
  if (in.backend != CHUNKSERVE_BACKEND_CPU && in.backend != CHUNKSERVE_BACKEND_CUDA) {
    return Status::InvalidArgument(std::string(kFn) + ": unknown backend " +
                                   std::to_string(in.backend));
  }
  if (in.kv_dtype != CHUNKSERVE_DTYPE_F32 && in.kv_dtype != CHUNKSERVE_DTYPE_F16 &&
      in.kv_dtype != CHUNKSERVE_DTYPE_BF16) {
    return Status::InvalidArgument(std::string(kFn) + ": unknown kv_dtype " +
                                   std::to_string(in.kv_dtype));
  }
  if (in.enable_prefix_sharing != 0 && in.enable_prefix_sharing != 1) {
    return Status::InvalidArgument(std::string(kFn) +
                                   ": enable_prefix_sharing must be 0 or 1, got " +
                                   std::to_string(in.enable_prefix_sharing));
  }
  if (in.num_threads < 0) {
    return Status::InvalidArgument(std::string(kFn) + ": num_threads must be >= 0, got " +
                                   std::to_string(in.num_threads));
  }
  if (in.reserved0 != 0) return Status::InvalidArgument(std::string(kFn) + ": reserved0 must be 0");
  if (in.gguf_dtype != CHUNKSERVE_DTYPE_F32 && in.gguf_dtype != CHUNKSERVE_DTYPE_F16 &&
      in.gguf_dtype != CHUNKSERVE_DTYPE_BF16) {
    return Status::InvalidArgument(std::string(kFn) + ": unknown gguf_dtype " +
                                   std::to_string(in.gguf_dtype));
  }
  if (in.tiny_model != 0 && in.tiny_model != 1) {
    return Status::InvalidArgument(std::string(kFn) + ": tiny_model must be 0 or 1, got " +
                                   std::to_string(in.tiny_model));
  }
  out->model_dir = in.model_path != nullptr ? in.model_path : "";
  // Version 1 (56 bytes) had no tiny_model: a missing model_path meant the tiny model, and a
  // caller built then keeps that meaning. Version 2 asks for it explicitly.
  const bool v1 = in.struct_size < chunkserve::capi::kEngineOptionsV2Size;
  out->tiny_model = in.tiny_model == 1 || (v1 && out->model_dir.empty());
  if (out->model_dir.empty() && !out->tiny_model) {
    return Status::InvalidArgument(std::string(kFn) +
                                   ": no model: set model_path (a model folder or a .gguf file), "
                                   "or tiny_model = 1 for the built-in random-weight test model");
  }
  if (!out->model_dir.empty() && out->tiny_model) {
    return Status::InvalidArgument(std::string(kFn) + ": model_path and tiny_model exclude each "
                                   "other");
  }
  out->backend = static_cast<cs::engine::BackendKind>(in.backend);
  out->num_threads = in.num_threads;
  out->chunk_size = in.chunk_size != 0 ? in.chunk_size : d.chunk_size;
  out->kv_cache_bytes = in.kv_cache_bytes != 0 ? in.kv_cache_bytes : d.kv_cache_bytes;
  out->kv_dtype = static_cast<decltype(out->kv_dtype)>(in.kv_dtype);
  out->gguf_dtype = static_cast<decltype(out->gguf_dtype)>(in.gguf_dtype);
  out->enable_prefix_sharing = in.enable_prefix_sharing != 0;
  out->max_batch_size = in.max_batch_size != 0 ? in.max_batch_size : d.max_batch_size;
  out->prefill_token_budget = in.prefill_token_budget;
  out->max_queued_requests =
      in.max_queued_requests != 0 ? in.max_queued_requests : d.max_queued_requests;
  return Status::Ok();
}

// A deadline this far away is no deadline; it also keeps now() + deadline from overflowing.
constexpr uint64_t kMaxDeadlineMs = uint64_t{100} * 365 * 24 * 3600 * 1000;

// Prompt plus stop tokens of one remote request: 4 bytes each on the wire, under the servers'
// default 16 MiB frame limit.
constexpr uint64_t kMaxWireTokens = 4'000'000;

// `kFn` names the entry point in messages. max_context 0: not known (remote client).
Status ToRequestOptions(const char* kFn, const chunkserve_request_options_t& in,
                        int32_t max_context, cs::sched::RequestOptions* out) {
  if (in.prompt_tokens == nullptr && in.num_prompt_tokens != 0) {
    return NullArgument(kFn, "prompt_tokens (with num_prompt_tokens > 0)");
  }
  if (in.stop_tokens == nullptr && in.num_stop_tokens != 0) {
    return NullArgument(kFn, "stop_tokens (with num_stop_tokens > 0)");
  }
  // Checked before copying, so a wild count cannot make us allocate gigabytes.
  if (max_context > 0 && in.num_prompt_tokens >= static_cast<uint64_t>(max_context)) {
    return Status::InvalidArgument("prompt of " + std::to_string(in.num_prompt_tokens) +
                                   " tokens leaves no room in the context of " +
                                   std::to_string(max_context));
  }
  if (max_context <= 0 && (in.num_prompt_tokens > kMaxWireTokens ||
                           in.num_stop_tokens > kMaxWireTokens - in.num_prompt_tokens)) {
    // One wire frame carries the request (16 MiB by default on the server side).
    return Status::InvalidArgument(std::string(kFn) + ": more than " +
                                   std::to_string(kMaxWireTokens) +
                                   " prompt and stop tokens do not fit in one request message");
  }
  if (in.num_stop_tokens > static_cast<uint64_t>(INT32_MAX)) {
    return Status::InvalidArgument(std::string(kFn) + ": num_stop_tokens is too large");
  }
  if (in.logprobs < -1 || in.logprobs > CHUNKSERVE_MAX_TOP_LOGPROBS) {
    return Status::InvalidArgument(std::string(kFn) + ": logprobs must be -1 (none) or in [0, " +
                                   std::to_string(CHUNKSERVE_MAX_TOP_LOGPROBS) + "], got " +
                                   std::to_string(in.logprobs));
  }
  if (in.reserved0 != 0) return Status::InvalidArgument(std::string(kFn) + ": reserved0 must be 0");
  out->prompt.assign(in.prompt_tokens, in.prompt_tokens + in.num_prompt_tokens);
  out->stop_tokens.assign(in.stop_tokens, in.stop_tokens + in.num_stop_tokens);
  out->max_new_tokens = in.max_new_tokens;
  out->sampling.temperature = in.temperature;
  out->sampling.top_k = in.top_k;
  out->sampling.top_p = in.top_p;
  out->sampling.seed = in.seed;
  out->priority = in.priority;
  out->logprobs = in.logprobs;
  if (in.deadline_ms != 0 && in.deadline_ms <= kMaxDeadlineMs) {
    out->deadline =
        cs::sched::Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(in.deadline_ms));
  }
  return Status::Ok();
}

constexpr int32_t kDefaultConnectTimeoutMs = 5000;
constexpr int32_t kDefaultKeepaliveMs = 5000;

chunkserve_client_options_t DefaultClientOptions() {
  chunkserve_client_options_t o{};
  o.struct_size = sizeof(o);
  o.port = 0;
  o.host = nullptr;
  o.connect_timeout_ms = kDefaultConnectTimeoutMs;
  o.keepalive_interval_ms = kDefaultKeepaliveMs;
  o.tls_ca_file = nullptr;
  o.tls_cert_file = nullptr;
  o.tls_key_file = nullptr;
  return o;
}

Status ToClientOptions(const chunkserve_client_options_t& in, cs::capi::RemoteClientOptions* out) {
  constexpr const char* kFn = "chunkserve_client_create";
  if (in.host == nullptr) return NullArgument(kFn, "options->host");
  out->host = in.host;
  if (out->host.empty()) return Status::InvalidArgument(std::string(kFn) + ": host is empty");
  if (in.port < 1 || in.port > 65535) {
    return Status::InvalidArgument(std::string(kFn) + ": port must be in 1..65535, got " +
                                   std::to_string(in.port));
  }
  out->port = static_cast<uint16_t>(in.port);
  if (in.connect_timeout_ms < 0) {
    return Status::InvalidArgument(std::string(kFn) + ": connect_timeout_ms must be >= 0, got " +
                                   std::to_string(in.connect_timeout_ms));
  }
  out->connect_timeout = std::chrono::milliseconds(
      in.connect_timeout_ms != 0 ? in.connect_timeout_ms : kDefaultConnectTimeoutMs);
  if (in.keepalive_interval_ms < -1) {
    return Status::InvalidArgument(std::string(kFn) +
                                   ": keepalive_interval_ms must be >= 0 or -1 (off), got " +
                                   std::to_string(in.keepalive_interval_ms));
  }
  out->keepalive_interval =
      std::chrono::milliseconds(in.keepalive_interval_ms == -1  ? 0
                                : in.keepalive_interval_ms != 0 ? in.keepalive_interval_ms
                                                                : kDefaultKeepaliveMs);
  // Version 2: TLS (NULL in a version 1 caller's struct: the defaults).
  const auto text = [](const char* p) { return p != nullptr ? std::string(p) : std::string(); };
  out->tls.ca_file = text(in.tls_ca_file);
  out->tls.cert_file = text(in.tls_cert_file);
  out->tls.key_file = text(in.tls_key_file);
  if (!out->tls.enabled() && !(out->tls.cert_file.empty() && out->tls.key_file.empty())) {
    return Status::InvalidArgument(std::string(kFn) +
                                   ": tls_cert_file and tls_key_file need tls_ca_file");
  }
  // Version 3: the CA's revocation lists (NULL in an older caller's struct).
  out->tls.crl_file = text(in.tls_crl_file);
  if (!out->tls.enabled() && !out->tls.crl_file.empty()) {
    return Status::InvalidArgument(std::string(kFn) + ": tls_crl_file needs tls_ca_file");
  }
  return Status::Ok();
}

// The callback registered on a stream. `mu` is held while the user's function runs, so
// chunkserve_stream_destroy (which sets `detached` under it) waits for a running invocation and
// none starts afterwards. Recursive, so a callback that destroys its own stream against the
// header's advice does not deadlock.
struct CallbackSlot {
  std::recursive_mutex mu;
  chunkserve_stream_callback_t fn = nullptr;
  void* user_data = nullptr;
  const void* owner = nullptr;  // the stream's engine or client handle
  bool detached = false;
};

// The engine or client handle whose stream callback this thread is running (null outside
// callbacks): its own shutdown or destroy cannot wait for the thread that calls it.
thread_local const void* t_callback_owner = nullptr;

class InCallbackOf {
 public:
  explicit InCallbackOf(const void* owner) : saved_(t_callback_owner) { t_callback_owner = owner; }
  ~InCallbackOf() { t_callback_owner = saved_; }
  InCallbackOf(const InCallbackOf&) = delete;
  InCallbackOf& operator=(const InCallbackOf&) = delete;

 private:
  const void* saved_;
};

// Converts an engine event; `message` must outlive the use of the result.
chunkserve_stream_event_t ToCEvent(const StreamEvent& e, const std::string* message) {
  chunkserve_stream_event_t c{};
  c.struct_size = sizeof(c);
  c.finish_reason = 0;
  c.status = CHUNKSERVE_STATUS_OK;
  c.error_message = nullptr;
  c.num_top_logprobs = -1;
  if (e.kind == StreamEvent::Kind::kToken) {
    c.kind = CHUNKSERVE_EVENT_TOKEN;
    c.token = e.token;
    c.index = e.index;
    if (e.logprobs.has_value()) {
      const size_t n = std::min<size_t>(e.logprobs->top.size(), CHUNKSERVE_MAX_TOP_LOGPROBS);
      c.num_top_logprobs = static_cast<int32_t>(n);
      c.logprob = e.logprobs->logprob;
      for (size_t i = 0; i < n; ++i) {
        c.top_tokens[i] = e.logprobs->top[i].token;
        c.top_logprobs[i] = e.logprobs->top[i].logprob;
      }
    }
    return c;
  }
  c.kind = CHUNKSERVE_EVENT_FINISHED;
  c.token = -1;
  c.index = 0;
  c.finish_reason = static_cast<int32_t>(e.finish.reason);
  c.status = static_cast<chunkserve_status_t>(e.finish.error.code());
  c.prompt_tokens = e.finish.prompt_tokens;
  c.cached_tokens = e.finish.cached_tokens;
  c.generated_tokens = e.finish.generated_tokens;
  if (!e.finish.error.ok() && message != nullptr) c.error_message = message->c_str();
  return c;
}

}  // namespace

struct chunkserve_stream {
  std::shared_ptr<RequestStream> stream;
  // The engine or client handle that made it: whose thread runs its callback.
  const void* owner = nullptr;
  // Set for a remote client's stream: cancelling and destroying also tell the server. Weak, as
  // the stream may outlive its client.
  std::weak_ptr<cs::capi::ClientCore> remote;
  std::atomic<bool> has_callback{false};
  std::mutex mu;  // guards callback
  std::shared_ptr<CallbackSlot> callback;
  std::string finish_message;  // the FINISHED event's message, returned by next()
};

extern "C" {

// ---- Status, errors, versions ----------------------------------------------------------------

const char* chunkserve_status_name(chunkserve_status_t status) {
  switch (status) {
    case CHUNKSERVE_STATUS_OK:
      return "OK";
    case CHUNKSERVE_STATUS_INVALID_ARGUMENT:
      return "INVALID_ARGUMENT";
    case CHUNKSERVE_STATUS_NOT_FOUND:
      return "NOT_FOUND";
    case CHUNKSERVE_STATUS_ALREADY_EXISTS:
      return "ALREADY_EXISTS";
    case CHUNKSERVE_STATUS_RESOURCE_EXHAUSTED:
      return "RESOURCE_EXHAUSTED";
    case CHUNKSERVE_STATUS_FAILED_PRECONDITION:
      return "FAILED_PRECONDITION";
    case CHUNKSERVE_STATUS_OUT_OF_RANGE:
      return "OUT_OF_RANGE";
    case CHUNKSERVE_STATUS_UNAVAILABLE:
      return "UNAVAILABLE";
    case CHUNKSERVE_STATUS_DEADLINE_EXCEEDED:
      return "DEADLINE_EXCEEDED";
    case CHUNKSERVE_STATUS_CANCELLED:
      return "CANCELLED";
    case CHUNKSERVE_STATUS_INTERNAL:
      return "INTERNAL";
    case CHUNKSERVE_STATUS_UNIMPLEMENTED:
      return "UNIMPLEMENTED";
    case CHUNKSERVE_STATUS_DATA_LOSS:
      return "DATA_LOSS";
    case CHUNKSERVE_STATUS_ABORTED:
      return "ABORTED";
    case CHUNKSERVE_STATUS_UNAUTHENTICATED:
      return "UNAUTHENTICATED";
    default:
      return "UNKNOWN";
  }
}

chunkserve_status_t chunkserve_error_code(const chunkserve_error_t* error) {
  return error != nullptr ? error->code : CHUNKSERVE_STATUS_OK;
}

const char* chunkserve_error_message(const chunkserve_error_t* error) {
  return error != nullptr ? error->message.c_str() : "";
}

void chunkserve_error_free(chunkserve_error_t* error) {
  if (error == &g_out_of_memory) return;
  delete error;
}

const char* chunkserve_version(void) { return chunkserve::capi::kVersionString; }

int32_t chunkserve_abi_version(void) { return CHUNKSERVE_ABI_VERSION; }

const char* chunkserve_finish_reason_name(int32_t finish_reason) {
  switch (finish_reason) {
    case CHUNKSERVE_FINISH_STOP_TOKEN:
    case CHUNKSERVE_FINISH_LENGTH:
    case CHUNKSERVE_FINISH_CANCELLED:
    case CHUNKSERVE_FINISH_DEADLINE:
    case CHUNKSERVE_FINISH_ERROR:
    case CHUNKSERVE_FINISH_UNAVAILABLE:
      // FinishReasonName returns views of string literals, so data() is NUL-terminated.
      return cs::FinishReasonName(static_cast<cs::FinishReason>(finish_reason)).data();
    default:
      return "unknown";
  }
}

// ---- Engine ------------------------------------------------------------------------------------

chunkserve_status_t chunkserve_engine_options_init(chunkserve_engine_options_t* options,
                                                   uint32_t struct_size,
                                                   chunkserve_error_t** out_error) {
  const char* const fn = __func__;  // the C name, also inside the lambda
  return Guard(fn, out_error, [&] {
    return InitVersioned(fn, "chunkserve_engine_options_t", DefaultEngineOptions(),
                         struct_size, chunkserve::capi::kEngineOptionsV1Size, options);
  });
}

chunkserve_status_t chunkserve_engine_create(const chunkserve_engine_options_t* options,
                                             chunkserve_engine_t** out_engine,
                                             chunkserve_error_t** out_error) {
  const char* const fn = __func__;  // the C name, also inside the lambda
  return Guard(fn, out_error, [&]() -> Status {
    if (out_engine == nullptr) return NullArgument(fn, "out_engine");
    *out_engine = nullptr;
    chunkserve_engine_options_t c = DefaultEngineOptions();
    if (options == nullptr) {
      c.struct_size = chunkserve::capi::kEngineOptionsV1Size;  // NULL: version 1's defaults
    } else {
      CHUNKSERVE_RETURN_IF_ERROR(ReadVersioned(fn, "chunkserve_engine_options_t", options,
                                               chunkserve::capi::kEngineOptionsV1Size, &c));
    }
    cs::engine::EngineOptions eo;
    CHUNKSERVE_RETURN_IF_ERROR(ToEngineOptions(c, &eo));
    auto handle = std::make_unique<chunkserve_engine>();
    handle->model_path = eo.model_dir;
    CHUNKSERVE_ASSIGN_OR_RETURN(handle->engine, cs::engine::Engine::Create(eo));
    *out_engine = handle.release();
    return Status::Ok();
  });
}

void chunkserve_engine_destroy(chunkserve_engine_t* engine) {
  if (engine == nullptr) return;
  GuardVoid([&] {
    if (t_callback_owner == engine) {
      // From one of this engine's own callbacks: its step thread is this thread and cannot wait
      // for itself. Another thread destroys the engine; the step thread finishes this callback,
      // sees the shutdown and ends, and the destruction completes then.
      std::thread([engine] { GuardVoid([&] { delete engine; }); }).detach();
      return;
    }
    delete engine;
  });
}

chunkserve_status_t chunkserve_engine_shutdown(chunkserve_engine_t* engine, int32_t mode,
                                               chunkserve_error_t** out_error) {
  const char* const fn = __func__;  // the C name, also inside the lambda
  return Guard(fn, out_error, [&]() -> Status {
    if (engine == nullptr) return NullArgument(fn, "engine");
    if (mode != CHUNKSERVE_SHUTDOWN_DRAIN && mode != CHUNKSERVE_SHUTDOWN_ABORT) {
      return Status::InvalidArgument(std::string(fn) + ": unknown shutdown mode " +
                                     std::to_string(mode));
    }
    if (t_callback_owner == engine) {
      return Status::FailedPrecondition(
          std::string(fn) +
          ": called from a callback of this engine's streams, which runs on the step thread "
          "that shutdown waits for; call it from another thread (chunkserve_engine_destroy "
          "from a callback is deferred instead)");
    }
    engine->engine->Shutdown(static_cast<cs::engine::ShutdownMode>(mode));
    return Status::Ok();
  });
}

chunkserve_status_t chunkserve_request_options_init(chunkserve_request_options_t* options,
                                                    uint32_t struct_size,
                                                    chunkserve_error_t** out_error) {
  const char* const fn = __func__;  // the C name, also inside the lambda
  return Guard(fn, out_error, [&] {
    return InitVersioned(fn, "chunkserve_request_options_t", DefaultRequestOptions(),
                         struct_size, chunkserve::capi::kRequestOptionsV1Size, options);
  });
}

chunkserve_status_t chunkserve_engine_submit(chunkserve_engine_t* engine,
                                             const chunkserve_request_options_t* request,
                                             chunkserve_stream_t** out_stream,
                                             chunkserve_error_t** out_error) {
  const char* const fn = __func__;  // the C name, also inside the lambda
  return Guard(fn, out_error, [&]() -> Status {
    if (out_stream == nullptr) return NullArgument(fn, "out_stream");
    *out_stream = nullptr;
    if (engine == nullptr) return NullArgument(fn, "engine");
    if (request == nullptr) return NullArgument(fn, "request");
    chunkserve_request_options_t c = DefaultRequestOptions();
    CHUNKSERVE_RETURN_IF_ERROR(ReadVersioned(fn, "chunkserve_request_options_t", request,
                                             chunkserve::capi::kRequestOptionsV1Size, &c));
    cs::sched::RequestOptions ro;
    CHUNKSERVE_RETURN_IF_ERROR(ToRequestOptions(fn, c, engine->engine->max_context(), &ro));
    // Allocated first: once Submit succeeds nothing may fail, or the request would run unowned.
    auto handle = std::make_unique<chunkserve_stream>();
    handle->owner = engine;
    CHUNKSERVE_ASSIGN_OR_RETURN(handle->stream, engine->engine->Submit(std::move(ro)));
    *out_stream = handle.release();
    return Status::Ok();
  });
}

chunkserve_status_t chunkserve_engine_cancel(chunkserve_engine_t* engine, uint64_t request_id,
                                             chunkserve_error_t** out_error) {
  const char* const fn = __func__;  // the C name, also inside the lambda
  return Guard(fn, out_error, [&]() -> Status {
    if (engine == nullptr) return NullArgument(fn, "engine");
    return engine->engine->Cancel(cs::RequestId(request_id));
  });
}

chunkserve_status_t chunkserve_engine_stats(chunkserve_engine_t* engine,
                                            chunkserve_engine_stats_t* stats,
                                            chunkserve_error_t** out_error) {
  const char* const fn = __func__;  // the C name, also inside the lambda
  return Guard(fn, out_error, [&]() -> Status {
    if (engine == nullptr) return NullArgument(fn, "engine");
    if (stats == nullptr) return NullArgument(fn, "stats");
    // Checked before the engine is asked, so a bad size fails without side effects.
    CHUNKSERVE_RETURN_IF_ERROR(
        CheckStructSize(fn, "chunkserve_engine_stats_t", stats->struct_size,
                        chunkserve::capi::kEngineStatsV1Size, sizeof(chunkserve_engine_stats_t)));
    const cs::engine::EngineStats s = engine->engine->Stats();
    chunkserve_engine_stats_t c{};
    c.struct_size = sizeof(c);
    c.running = s.running;
    c.requests_submitted = s.requests_submitted;
    c.requests_finished = s.requests_finished;
    c.prompt_tokens = s.prompt_tokens;
    c.prefix_hit_tokens = s.prefix_hit_tokens;
    c.prefill_tokens = s.prefill_tokens;
    c.generated_tokens = s.generated_tokens;
    c.steps = s.steps;
    c.evicted_chunks = s.evicted_chunks;
    c.preemptions = s.preemptions;
    c.queued = s.queued;
    c.last_batch_size = s.last_batch_size;
    c.kv_bytes_used = s.kv_bytes_used;
    c.kv_bytes_referenced = s.kv_bytes_referenced;
    c.kv_bytes_if_unshared = s.kv_bytes_if_unshared;
    c.kv_bytes_capacity = s.kv_bytes_capacity;
    c.kv_bytes_peak = s.kv_bytes_peak;
    c.chunks_total = s.chunks_total;
    c.chunks_shared = s.chunks_shared;
    c.chunks_retained = s.chunks_retained;
    c.reserved0 = 0;
    c.decode_tokens_per_s = s.decode_tokens_per_s;
    c.prefill_tokens_per_s = s.prefill_tokens_per_s;
    return WriteVersioned(fn, "chunkserve_engine_stats_t", c,
                          chunkserve::capi::kEngineStatsV1Size, stats);
  });
}

chunkserve_status_t chunkserve_engine_info(chunkserve_engine_t* engine,
                                           chunkserve_engine_info_t* info,
                                           chunkserve_error_t** out_error) {
  const char* const fn = __func__;  // the C name, also inside the lambda
  return Guard(fn, out_error, [&]() -> Status {
    if (engine == nullptr) return NullArgument(fn, "engine");
    if (info == nullptr) return NullArgument(fn, "info");
    chunkserve_engine_info_t c{};
    c.struct_size = sizeof(c);
    c.vocab_size = engine->engine->vocab_size();
    c.max_context = engine->engine->max_context();
    c.chunk_size = engine->engine->chunk_size();
    c.model_fingerprint = engine->engine->model_fingerprint();
    return WriteVersioned(fn, "chunkserve_engine_info_t", c,
                          chunkserve::capi::kEngineInfoV1Size, info);
  });
}

// ---- Text --------------------------------------------------------------------------------------

namespace {

// The engine's ModelText, loaded from its model path on the first call (under text_mu, so once
// however many threads ask). A failure is kept as well: the same files would fail the same way,
// and a caller polling a tokenizer-less engine should not re-read them on every call.
cs::Result<std::shared_ptr<const cs::tokenizer::ModelText>> EngineText(const char* fn,
                                                                       chunkserve_engine* engine) {
  std::lock_guard<std::mutex> lock(engine->text_mu);
  if (!engine->text_loaded) {
    if (engine->model_path.empty()) {
      engine->text_status = Status::FailedPrecondition(
          "the engine serves the built-in tiny model (model_path NULL or \"\"), which has no "
          "tokenizer; create the engine with model_path set to a .gguf file or a model folder "
          "with tokenizer.json");
    } else {
      cs::Result<cs::tokenizer::ModelText> loaded =
          cs::tokenizer::LoadModelText(engine->model_path);
      if (loaded.ok()) {
        engine->text = std::make_shared<const cs::tokenizer::ModelText>(std::move(loaded).value());
      } else {
        Status s = loaded.status();
        // The loader calls malformed files InvalidArgument; to the caller of a text function
        // that would read as a bad argument of its own, so it is the header's DATA_LOSS.
        if (s.code() == cs::StatusCode::kInvalidArgument) s = Status::DataLoss(s.message());
        engine->text_status = s.Annotate("cannot load the model's tokenizer");
      }
    }
    engine->text_loaded = true;
  }
  if (engine->text != nullptr) return engine->text;
  return engine->text_status.Annotate(fn);
}

Status CheckFlag(const char* fn, const char* name, int32_t value) {
  if (value == 0 || value == 1) return Status::Ok();
  return Status::InvalidArgument(std::string(fn) + ": " + name + " must be 0 or 1, got " +
                                 std::to_string(value));
}

// A caller's output buffer: `data` of `capacity` elements, NULL only when capacity is 0.
Status CheckBuffer(const char* fn, const char* name, const void* data, size_t capacity,
                   const void* size_out, const char* size_name) {
  if (size_out == nullptr) return NullArgument(fn, size_name);
  if (data == nullptr && capacity > 0) {
    return NullArgument(fn, (std::string(name) + " (with capacity > 0)").c_str());
  }
  return Status::Ok();
}

// The sizing contract (header, "Text"): *size is the whole result's size; it is written only
// when it fits, else OUT_OF_RANGE says how much is needed.
Status TooSmall(const char* fn, const char* unit, size_t needed, size_t capacity) {
  return Status::OutOfRange(std::string(fn) + ": the result needs a capacity of " +
                            std::to_string(needed) + " " + unit + ", got " +
                            std::to_string(capacity) + " (call again with that capacity)");
}

Status WriteIds(const char* fn, const std::vector<int32_t>& ids, int32_t* out, size_t capacity,
                size_t* num_ids) {
  *num_ids = ids.size();
  if (ids.size() > capacity) return TooSmall(fn, "ids", ids.size(), capacity);
  if (!ids.empty()) std::memcpy(out, ids.data(), ids.size() * sizeof(int32_t));
  return Status::Ok();
}

Status WriteText(const char* fn, std::string_view text, char* out, size_t capacity,
                 size_t* text_len) {
  *text_len = text.size();
  if (text.size() > capacity) return TooSmall(fn, "bytes", text.size(), capacity);
  if (!text.empty()) std::memcpy(out, text.data(), text.size());
  if (capacity > text.size()) out[text.size()] = '\0';
  return Status::Ok();
}

}  // namespace

chunkserve_status_t chunkserve_tokenize(chunkserve_engine_t* engine, const char* text,
                                        size_t text_len, int32_t add_special_tokens, int32_t* ids,
                                        size_t capacity, size_t* num_ids,
                                        chunkserve_error_t** out_error) {
  const char* const fn = __func__;  // the C name, also inside the lambda
  return Guard(fn, out_error, [&]() -> Status {
    if (engine == nullptr) return NullArgument(fn, "engine");
    CHUNKSERVE_RETURN_IF_ERROR(CheckBuffer(fn, "ids", ids, capacity, num_ids, "num_ids"));
    *num_ids = 0;
    if (text == nullptr && text_len > 0) return NullArgument(fn, "text (with text_len > 0)");
    CHUNKSERVE_RETURN_IF_ERROR(CheckFlag(fn, "add_special_tokens", add_special_tokens));
    CHUNKSERVE_ASSIGN_OR_RETURN(auto model_text, EngineText(fn, engine));
    const std::string_view input = text_len > 0 ? std::string_view(text, text_len) : "";
    cs::Result<std::vector<int32_t>> encoded =
        model_text->tokenizer->Encode(input, add_special_tokens == 1);
    if (!encoded.ok()) return encoded.status().Annotate(fn);
    return WriteIds(fn, *encoded, ids, capacity, num_ids);
  });
}

chunkserve_status_t chunkserve_detokenize(chunkserve_engine_t* engine, const int32_t* ids,
                                          size_t num_ids, int32_t skip_special_tokens, char* text,
                                          size_t capacity, size_t* text_len,
                                          chunkserve_error_t** out_error) {
  const char* const fn = __func__;  // the C name, also inside the lambda
  return Guard(fn, out_error, [&]() -> Status {
    if (engine == nullptr) return NullArgument(fn, "engine");
    CHUNKSERVE_RETURN_IF_ERROR(CheckBuffer(fn, "text", text, capacity, text_len, "text_len"));
    *text_len = 0;
    if (ids == nullptr && num_ids > 0) return NullArgument(fn, "ids (with num_ids > 0)");
    CHUNKSERVE_RETURN_IF_ERROR(CheckFlag(fn, "skip_special_tokens", skip_special_tokens));
    CHUNKSERVE_ASSIGN_OR_RETURN(auto model_text, EngineText(fn, engine));
    const std::span<const int32_t> input =
        num_ids > 0 ? std::span<const int32_t>(ids, num_ids) : std::span<const int32_t>();
    cs::Result<std::string> decoded =
        model_text->tokenizer->Decode(input, skip_special_tokens == 1);
    if (!decoded.ok()) return decoded.status().Annotate(fn);
    return WriteText(fn, *decoded, text, capacity, text_len);
  });
}

chunkserve_status_t chunkserve_detokenizer_create(chunkserve_engine_t* engine,
                                                  int32_t skip_special_tokens,
                                                  chunkserve_detokenizer_t** out_detokenizer,
                                                  chunkserve_error_t** out_error) {
  const char* const fn = __func__;  // the C name, also inside the lambda
  return Guard(fn, out_error, [&]() -> Status {
    if (out_detokenizer == nullptr) return NullArgument(fn, "out_detokenizer");
    *out_detokenizer = nullptr;
    if (engine == nullptr) return NullArgument(fn, "engine");
    CHUNKSERVE_RETURN_IF_ERROR(CheckFlag(fn, "skip_special_tokens", skip_special_tokens));
    CHUNKSERVE_ASSIGN_OR_RETURN(auto model_text, EngineText(fn, engine));
    const cs::tokenizer::Tokenizer& tokenizer = *model_text->tokenizer;
    *out_detokenizer = new chunkserve_detokenizer{
        std::move(model_text), cs::tokenizer::StreamDecoder(tokenizer, skip_special_tokens == 1)};
    return Status::Ok();
  });
}

chunkserve_status_t chunkserve_detokenizer_push(chunkserve_detokenizer_t* detokenizer, int32_t id,
                                                char* text, size_t capacity, size_t* text_len,
                                                chunkserve_error_t** out_error) {
  const char* const fn = __func__;  // the C name, also inside the lambda
  return Guard(fn, out_error, [&]() -> Status {
    if (detokenizer == nullptr) return NullArgument(fn, "detokenizer");
    CHUNKSERVE_RETURN_IF_ERROR(CheckBuffer(fn, "text", text, capacity, text_len, "text_len"));
    *text_len = 0;
    // Pushed into a copy (a window of a few ids) and committed only when the piece is delivered:
    // on any error the caller may repeat the call, and the id must not have been taken twice.
    cs::tokenizer::StreamDecoder next = detokenizer->decoder;
    cs::Result<std::string> piece = next.Push(id);
    if (!piece.ok()) return piece.status().Annotate(fn);
    CHUNKSERVE_RETURN_IF_ERROR(WriteText(fn, *piece, text, capacity, text_len));
    detokenizer->decoder = std::move(next);
    return Status::Ok();
  });
}

chunkserve_status_t chunkserve_detokenizer_flush(chunkserve_detokenizer_t* detokenizer, char* text,
                                                 size_t capacity, size_t* text_len,
                                                 chunkserve_error_t** out_error) {
  const char* const fn = __func__;  // the C name, also inside the lambda
  return Guard(fn, out_error, [&]() -> Status {
    if (detokenizer == nullptr) return NullArgument(fn, "detokenizer");
    CHUNKSERVE_RETURN_IF_ERROR(CheckBuffer(fn, "text", text, capacity, text_len, "text_len"));
    *text_len = 0;
    cs::tokenizer::StreamDecoder next = detokenizer->decoder;  // as in push: commit on success
    const std::string rest = next.Flush();
    CHUNKSERVE_RETURN_IF_ERROR(WriteText(fn, rest, text, capacity, text_len));
    detokenizer->decoder = std::move(next);
    return Status::Ok();
  });
}

void chunkserve_detokenizer_destroy(chunkserve_detokenizer_t* detokenizer) {
  GuardVoid([&] { delete detokenizer; });
}

chunkserve_status_t chunkserve_apply_chat_template(chunkserve_engine_t* engine,
                                                   const char* const* roles,
                                                   const char* const* contents, size_t num_messages,
                                                   int32_t add_generation_prompt, char* text,
                                                   size_t capacity, size_t* text_len,
                                                   chunkserve_error_t** out_error) {
  const char* const fn = __func__;  // the C name, also inside the lambda
  return Guard(fn, out_error, [&]() -> Status {
    if (engine == nullptr) return NullArgument(fn, "engine");
    CHUNKSERVE_RETURN_IF_ERROR(CheckBuffer(fn, "text", text, capacity, text_len, "text_len"));
    *text_len = 0;
    if (num_messages > 0 && roles == nullptr) {
      return NullArgument(fn, "roles (with num_messages > 0)");
    }
    if (num_messages > 0 && contents == nullptr) {
      return NullArgument(fn, "contents (with num_messages > 0)");
    }
    CHUNKSERVE_RETURN_IF_ERROR(CheckFlag(fn, "add_generation_prompt", add_generation_prompt));
    // Checked before anything is copied, so a wild count fails here rather than in the copy.
    for (size_t i = 0; i < num_messages; ++i) {
      if (roles[i] == nullptr) {
        return NullArgument(fn, ("roles[" + std::to_string(i) + "]").c_str());
      }
      if (contents[i] == nullptr) {
        return NullArgument(fn, ("contents[" + std::to_string(i) + "]").c_str());
      }
    }
    CHUNKSERVE_ASSIGN_OR_RETURN(auto model_text, EngineText(fn, engine));
    if (model_text->chat_template == nullptr) {
      return Status::FailedPrecondition(std::string(fn) + ": model " + engine->model_path +
                                        " has no chat template");
    }
    std::vector<cs::tokenizer::ChatMessage> messages;
    messages.reserve(num_messages);
    for (size_t i = 0; i < num_messages; ++i) messages.push_back({roles[i], contents[i]});
    cs::Result<std::string> rendered =
        model_text->chat_template->Render(messages, add_generation_prompt == 1);
    if (!rendered.ok()) return rendered.status().Annotate(fn);
    return WriteText(fn, *rendered, text, capacity, text_len);
  });
}

chunkserve_status_t chunkserve_engine_eos_ids(chunkserve_engine_t* engine, int32_t* ids,
                                              size_t capacity, size_t* num_ids,
                                              chunkserve_error_t** out_error) {
  const char* const fn = __func__;  // the C name, also inside the lambda
  return Guard(fn, out_error, [&]() -> Status {
    if (engine == nullptr) return NullArgument(fn, "engine");
    CHUNKSERVE_RETURN_IF_ERROR(CheckBuffer(fn, "ids", ids, capacity, num_ids, "num_ids"));
    *num_ids = 0;
    CHUNKSERVE_ASSIGN_OR_RETURN(auto model_text, EngineText(fn, engine));
    return WriteIds(fn, model_text->eos_ids, ids, capacity, num_ids);
  });
}

// ---- Logging -----------------------------------------------------------------------------------

chunkserve_status_t chunkserve_set_log_callback(chunkserve_log_callback_t callback, void* user_data,
                                                chunkserve_error_t** out_error) {
  const char* const fn = __func__;  // the C name, also inside the lambda
  return Guard(fn, out_error, [&]() -> Status {
    if (callback == nullptr) {
      cs::SetLogSink(nullptr);
      return Status::Ok();
    }
    cs::SetLogSink([callback, user_data](int severity, const std::string& text) {
      callback(static_cast<int32_t>(severity), text.c_str(), user_data);
    });
    return Status::Ok();
  });
}

// ---- Streams -----------------------------------------------------------------------------------

uint64_t chunkserve_stream_id(const chunkserve_stream_t* stream) {
  return stream != nullptr ? stream->stream->id().value() : 0;
}

chunkserve_status_t chunkserve_stream_next(chunkserve_stream_t* stream, int64_t timeout_ms,
                                           chunkserve_stream_event_t* event,
                                           chunkserve_error_t** out_error) {
  const char* const fn = __func__;  // the C name, also inside the lambda
  return Guard(fn, out_error, [&]() -> Status {
    if (stream == nullptr) return NullArgument(fn, "stream");
    if (event == nullptr) return NullArgument(fn, "event");
    CHUNKSERVE_RETURN_IF_ERROR(
        CheckStructSize(fn, "chunkserve_stream_event_t", event->struct_size,
                        chunkserve::capi::kStreamEventV1Size, sizeof(chunkserve_stream_event_t)));
    const auto callback_set = [&] {
      return Status::FailedPrecondition(std::string(fn) +
                                        ": the stream delivers to a callback");
    };
    // Waited in slices so that a callback set meanwhile (which takes the events without waking
    // us) ends the wait promptly.
    constexpr auto kSlice = std::chrono::milliseconds(100);
    const bool forever = timeout_ms < 0;
    auto remaining = std::chrono::milliseconds(forever ? 0 : timeout_ms);
    StreamEvent e;
    for (;;) {
      if (stream->has_callback.load()) return callback_set();
      const auto slice = forever ? kSlice : std::min(remaining, kSlice);
      const RequestStream::NextResult r = stream->stream->Next(&e, slice);
      if (r == RequestStream::NextResult::kEvent) break;
      if (r == RequestStream::NextResult::kEnded) {
        if (stream->has_callback.load()) return callback_set();
        return Status::OutOfRange(std::string(fn) + ": the stream has ended");
      }
      if (!forever) {
        remaining -= slice;
        if (remaining.count() <= 0) {
          return Status::DeadlineExceeded(std::string(fn) + ": no event within " +
                                          std::to_string(timeout_ms) + " ms");
        }
      }
    }
    const std::string* message = nullptr;
    if (e.kind == StreamEvent::Kind::kFinished && !e.finish.error.ok()) {
      // Only the one thread that receives the FINISHED event writes this.
      stream->finish_message = std::string(e.finish.error.message());
      message = &stream->finish_message;
    }
    return WriteVersioned(fn, "chunkserve_stream_event_t", ToCEvent(e, message),
                          chunkserve::capi::kStreamEventV1Size, event);
  });
}

chunkserve_status_t chunkserve_stream_set_callback(chunkserve_stream_t* stream,
                                                   chunkserve_stream_callback_t callback,
                                                   void* user_data,
                                                   chunkserve_error_t** out_error) {
  const char* const fn = __func__;  // the C name, also inside the lambda
  return Guard(fn, out_error, [&]() -> Status {
    if (stream == nullptr) return NullArgument(fn, "stream");
    if (callback == nullptr) return NullArgument(fn, "callback");
    auto slot = std::make_shared<CallbackSlot>();
    slot->fn = callback;
    slot->user_data = user_data;
    slot->owner = stream->owner;
    {
      std::lock_guard<std::mutex> lock(stream->mu);
      if (stream->callback != nullptr) {
        return Status::FailedPrecondition(std::string(fn) + ": callback already set");
      }
      stream->callback = slot;
    }
    Status s = stream->stream->SetCallback([slot](const StreamEvent& e) {
      std::lock_guard<std::recursive_mutex> lock(slot->mu);
      if (slot->detached) return;
      try {
        std::string message;
        if (e.kind == StreamEvent::Kind::kFinished) message = e.finish.error.message();
        const chunkserve_stream_event_t c = ToCEvent(e, &message);
        const InCallbackOf in_callback(slot->owner);
        slot->fn(&c, slot->user_data);
      } catch (...) {
        // The engine's step thread must survive a failing conversion or a throwing callback.
      }
    });
    if (!s.ok()) {
      std::lock_guard<std::mutex> lock(stream->mu);
      stream->callback.reset();
      return s;
    }
    stream->has_callback.store(true);
    return Status::Ok();
  });
}

chunkserve_status_t chunkserve_stream_cancel(chunkserve_stream_t* stream,
                                             chunkserve_error_t** out_error) {
  const char* const fn = __func__;  // the C name, also inside the lambda
  return Guard(fn, out_error, [&]() -> Status {
    if (stream == nullptr) return NullArgument(fn, "stream");
    stream->stream->RequestCancel();
    if (auto core = stream->remote.lock())
      cs::capi::CoreCancel(*core, stream->stream->id().value());
    return Status::Ok();
  });
}

void chunkserve_stream_destroy(chunkserve_stream_t* stream) {
  if (stream == nullptr) return;
  GuardVoid([&] {
    // Cancelling a finished request is a no-op, so this is unconditional.
    stream->stream->RequestCancel();
    // A remote request is cancelled on the server and no longer delivered to this stream.
    if (auto core = stream->remote.lock())
      cs::capi::CoreForget(*core, stream->stream->id().value());
    std::shared_ptr<CallbackSlot> slot;
    {
      std::lock_guard<std::mutex> lock(stream->mu);
      slot = stream->callback;
    }
    if (slot != nullptr) {
      std::lock_guard<std::recursive_mutex> lock(slot->mu);  // waits for a running invocation
      slot->detached = true;
    }
  });
  delete stream;
}

// ---- Remote client -----------------------------------------------------------------------------

chunkserve_status_t chunkserve_client_options_init(chunkserve_client_options_t* options,
                                                   uint32_t struct_size,
                                                   chunkserve_error_t** out_error) {
  const char* const fn = __func__;  // the C name, also inside the lambda
  return Guard(fn, out_error, [&] {
    return InitVersioned(fn, "chunkserve_client_options_t", DefaultClientOptions(),
                         struct_size, chunkserve::capi::kClientOptionsV1Size, options);
  });
}

chunkserve_status_t chunkserve_client_create(const chunkserve_client_options_t* options,
                                             chunkserve_client_t** out_client,
                                             chunkserve_error_t** out_error) {
  const char* const fn = __func__;  // the C name, also inside the lambda
  return Guard(fn, out_error, [&]() -> Status {
    if (out_client == nullptr) return NullArgument(fn, "out_client");
    *out_client = nullptr;
    if (options == nullptr) return NullArgument(fn, "options");
    chunkserve_client_options_t c = DefaultClientOptions();
    CHUNKSERVE_RETURN_IF_ERROR(ReadVersioned(fn, "chunkserve_client_options_t", options,
                                             chunkserve::capi::kClientOptionsV1Size, &c));
    cs::capi::RemoteClientOptions ro;
    CHUNKSERVE_RETURN_IF_ERROR(ToClientOptions(c, &ro));
    auto handle = std::make_unique<chunkserve_client>();
    CHUNKSERVE_ASSIGN_OR_RETURN(handle->client, cs::capi::RemoteClient::Connect(ro));
    *out_client = handle.release();
    return Status::Ok();
  });
}

void chunkserve_client_destroy(chunkserve_client_t* client) {
  GuardVoid([&] { delete client; });
}

chunkserve_status_t chunkserve_client_submit(chunkserve_client_t* client,
                                             const chunkserve_request_options_t* request,
                                             chunkserve_stream_t** out_stream,
                                             chunkserve_error_t** out_error) {
  const char* const fn = __func__;  // the C name, also inside the lambda
  return Guard(fn, out_error, [&]() -> Status {
    if (out_stream == nullptr) return NullArgument(fn, "out_stream");
    *out_stream = nullptr;
    if (client == nullptr) return NullArgument(fn, "client");
    if (request == nullptr) return NullArgument(fn, "request");
    chunkserve_request_options_t c = DefaultRequestOptions();
    CHUNKSERVE_RETURN_IF_ERROR(ReadVersioned(fn, "chunkserve_request_options_t", request,
                                             chunkserve::capi::kRequestOptionsV1Size, &c));
    cs::capi::RemoteRequest rr;
    CHUNKSERVE_RETURN_IF_ERROR(ToRequestOptions(fn, c, 0, &rr.options));
    // What the server would reject anyway is rejected here, synchronously, as the engine does;
    // the vocabulary and the context are checked by the server.
    // Negative ids first: the wire carries unsigned ids.
    for (const std::vector<cs::TokenId>* ids : {&rr.options.prompt, &rr.options.stop_tokens}) {
      for (size_t i = 0; i < ids->size(); ++i) {
        if ((*ids)[i] < 0) {
          return Status::InvalidArgument(std::string(fn) + ": " +
                                         (ids == &rr.options.prompt ? "prompt" : "stop") +
                                         " token " + std::to_string(i) + " has id " +
                                         std::to_string((*ids)[i]) + "; token ids are >= 0");
        }
      }
    }
    Status valid = cs::sched::ValidateRequest(rr.options, INT32_MAX, 0);
    if (!valid.ok()) {
      return Status::InvalidArgument(std::string(fn) + ": " + std::string(valid.message()));
    }
    rr.options.deadline.reset();
    if (c.deadline_ms != 0) {
      rr.deadline_ms = static_cast<uint32_t>(std::min<uint64_t>(c.deadline_ms, UINT32_MAX));
    }
    auto handle = std::make_unique<chunkserve_stream>();
    handle->owner = client;
    CHUNKSERVE_ASSIGN_OR_RETURN(handle->stream, client->client->Submit(rr));
    handle->remote = client->client->core();
    *out_stream = handle.release();
    return Status::Ok();
  });
}

chunkserve_status_t chunkserve_client_cancel(chunkserve_client_t* client, uint64_t request_id,
                                             chunkserve_error_t** out_error) {
  const char* const fn = __func__;  // the C name, also inside the lambda
  return Guard(fn, out_error, [&]() -> Status {
    if (client == nullptr) return NullArgument(fn, "client");
    return client->client->Cancel(request_id);
  });
}

}  // extern "C"
