// Engine: one model replica serving many requests with continuous batching and prefix reuse.
//
//   ASSIGN_OR_RETURN(auto engine, Engine::Create(options));
//   ASSIGN_OR_RETURN(auto stream, engine->Submit(request));   // any thread
//   while (stream->Next(&event, timeout) == kEvent) ...        // any thread
//   engine->Shutdown(ShutdownMode::kDrain);
//
// One step thread runs the scheduler: each step it admits waiting requests (by free KV slots,
// counting shared chunks once), forms one batch that mixes decode tokens with chunked-prefill
// tokens under a per-step token budget, runs the model forward on the backend, samples, and
// streams tokens out. Prompt tokens whose KV is already in the prefix tree are never recomputed.
// When KV slots run out it evicts retained chunks, then preempts running requests by recompute
// (lowest priority, latest arrival first); it rejects only requests that can never fit.
//
// Every request gets exactly one terminal event (FinishInfo). Cancellation and deadlines take
// effect at the next step boundary, which frees the request's private chunks.
//
// Thread safety: every public method is safe from any thread. Shutdown joins the step thread;
// the destructor calls Shutdown(kAbort) when it was not called.
#ifndef CHUNKSERVE_RUNTIME_ENGINE_ENGINE_H_
#define CHUNKSERVE_RUNTIME_ENGINE_ENGINE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kernels/attention_params.h"
#include "runtime/base/ids.h"
#include "runtime/base/status.h"
#include "runtime/forward/llama.h"
#include "runtime/forward/step_runner.h"
#include "runtime/sched/request.h"
#include "runtime/sched/stream.h"

namespace chunkserve::engine {

// Builds the engine's step runner in place of the one-rank model (forward::CreateLlamaModel);
// tensor parallelism (runtime/parallel) uses it to put a group of ranks behind the StepRunner
// interface. Called once, from Engine::Create on the caller's thread, with the loaded model (it
// outlives the runner, but its weights are released when the factory returns: the runner must
// have uploaded or copied them by then) and the options the one-rank model would have been given (num_slots from
// kv_cache_bytes computed for the whole model, so a tensor-parallel group schedules exactly like
// one rank and each rank's arena holds 1 / T of kv_cache_bytes).
using RunnerFactory = std::function<Result<std::unique_ptr<forward::StepRunner>>(
    const model::LoadedModel& model, const forward::RunnerOptions& options)>;

using BackendKind = forward::BackendKind;
enum class ShutdownMode : int32_t {
  kDrain = 0,  // stop admitting; finish every request already submitted, then stop
  kAbort = 1,  // end every request now with kUnavailable, then stop
};

struct EngineOptions {
  // Directory with config.json and safetensors weights, or a llama.cpp .gguf file (dequantized to
  // gguf_dtype at load; model::LoadedModel::Load). Required unless `tiny_model`.
  std::string model_dir;
  // What a GGUF's tensors are dequantized to: f32, f16 or bf16. The CPU backend keeps f16 / bf16
  // weights half-size (runtime/backend/cpu_backend.h). Safetensors weights keep the file's dtype.
  kernels::DType gguf_dtype = kernels::DType::kF32;
  // The built-in tiny model (random weights from a fixed seed: tests, benchmarks, offline
  // demos), written into `tiny_model_dir` (a temporary directory when that is empty). Only when
  // asked for: a missing model_dir is an error, never random weights in its place.
  bool tiny_model = false;
  std::string tiny_model_dir;

  // kCuda: runtime/backend/cuda_backend.h, in builds configured with CUDA (Unimplemented
  // otherwise); it needs kv_dtype kF16 or kBF16 (its weights and activations use that dtype too)
  // and chunk_size a multiple of 16 up to 128. Without a device Engine::Create is Unavailable.
  BackendKind backend = BackendKind::kCpu;
  int32_t cuda_device = 0;  // CUDA device ordinal (kCuda)
  int32_t num_threads = 0;  // CPU backend threads; 0 = hardware concurrency

  int32_t chunk_size = 64;               // tokens per KV chunk (16..256)
  uint64_t kv_cache_bytes = 256u << 20;  // KV arena size; the slot count follows from it
  kernels::DType kv_dtype = kernels::DType::kF32;
  bool enable_prefix_sharing = true;  // off: every request computes and stores its own KV

  int32_t max_batch_size = 64;         // sequences per step
  int32_t prefill_token_budget = 512;  // tokens per step (decode + prefill); 0 = unlimited
  int32_t max_queued_requests = 4096;  // Submit returns ResourceExhausted beyond this

  // Empty: the model on `backend` (forward::CreateLlamaModel). Set: this builds the runner.
  RunnerFactory runner_factory = nullptr;
};

struct EngineStats {
  // Counters since creation.
  uint64_t requests_submitted = 0;
  uint64_t requests_finished = 0;
  uint64_t prompt_tokens = 0;      // prompt tokens of admitted requests
  uint64_t prefix_hit_tokens = 0;  // prompt tokens whose KV came from the cache
  uint64_t prefill_tokens = 0;     // tokens run through prefill
  uint64_t generated_tokens = 0;   // tokens streamed out
  uint64_t steps = 0;
  uint64_t evicted_chunks = 0;
  uint64_t preemptions = 0;
  // Gauges at the last step.
  int32_t running = 0;  // sequences in the running batch
  int32_t queued = 0;   // submitted, not yet admitted
  // Prompt tokens computed so far for running requests that have no first token yet, past what
  // was cached at their admission (Scheduler::PrefillProgressTokens).
  int64_t prefill_progress_tokens = 0;
  int32_t last_batch_size = 0;
  uint64_t kv_bytes_used = 0;         // slots in use (referenced + retained), shared counted once
  uint64_t kv_bytes_referenced = 0;   // slots referenced by live sequences
  uint64_t kv_bytes_if_unshared = 0;  // what the live sequences would use without sharing
  uint64_t kv_bytes_capacity = 0;
  uint64_t kv_bytes_peak = 0;  // max of kv_bytes_referenced over time
  // KV arena geometry, fixed at creation: a slot holds one chunk (chunk_size tokens, every
  // layer's K and V), so kv_capacity_tokens = kv_slots_total * chunk_size and
  // kv_bytes_capacity = kv_slots_total * kv_bytes_per_slot.
  int32_t kv_slots_total = 0;
  uint64_t kv_bytes_per_slot = 0;
  int64_t kv_capacity_tokens = 0;
  int32_t chunks_total = 0;
  int32_t chunks_shared = 0;    // referenced by >= 2 live sequences
  int32_t chunks_retained = 0;  // unreferenced, kept for reuse
  // Throughput over the last few seconds.
  double decode_tokens_per_s = 0.0;
  double prefill_tokens_per_s = 0.0;
  // Decode tokens per second spent in steps over the same window, idle time excluded: how fast
  // the engine decodes while it runs (rate_window.h). Worker load reports carry this one.
  double decode_tokens_per_busy_s = 0.0;
  // Memory: the runner's resident weights (fixed at creation; the checkpoint itself is released
  // once they are uploaded) and this process's resident set (VmRSS) when Stats() was called.
  uint64_t weight_bytes = 0;
  uint64_t resident_bytes = 0;
  // 2 x the projection weights one token multiplies (every layer's q, k, v, o, gate, up, down;
  // not attention, not the LM head): prefill and decode tokens times this over a time is the
  // rate the GEMMs ran at.
  uint64_t projection_flops_per_token = 0;
};

// KV events (runtime/kvcache/kv_events.h; router/README.md): which full-chunk hashes the
// engine's prefix tree holds. Sequence numbers start at 1 and increase by one per event, so a
// subscriber detects loss by a gap.
struct KvEvent {
  enum class Kind : int32_t { kStored = 0, kEvicted = 1 };
  Kind kind = Kind::kStored;
  uint64_t hash = 0;         // chained chunk hash
  uint64_t parent_hash = 0;  // kStored: the hash it was chained from
  uint64_t sequence = 0;
};

// Every hash held as of event `sequence` (kind is always kStored).
struct KvSnapshot {
  uint64_t sequence = 0;
  std::vector<KvEvent> chunks;
};

// Receives the events of one engine step, in sequence order, on the step thread: it must be
// quick and must not call the engine's blocking methods (Shutdown). It may see events that a
// snapshot taken meanwhile already reflects: skip those with sequence <= snapshot.sequence.
using KvEventCallback = std::function<void(const std::vector<KvEvent>& events)>;

class Engine {
 public:
  static Result<std::unique_ptr<Engine>> Create(const EngineOptions& options);
  virtual ~Engine() = default;

  // Validates and enqueues a request. Errors: InvalidArgument (bad tokens, empty prompt,
  // max_new_tokens 0, ...), ResourceExhausted (queue full, or the request can never fit in the
  // KV cache: retry elsewhere), Unavailable (shutting down).
  virtual Result<std::shared_ptr<sched::RequestStream>> Submit(sched::RequestOptions request) = 0;

  // Cancels a request; its stream then ends with kCancelled (unless it already ended).
  // NotFound when no live request has that id.
  virtual Status Cancel(RequestId id) = 0;

  virtual EngineStats Stats() const = 0;

  // Model facts for clients and routers.
  virtual int32_t vocab_size() const = 0;
  virtual int32_t max_context() const = 0;
  virtual uint64_t model_fingerprint() const = 0;
  virtual int32_t chunk_size() const = 0;

  // Sets (replaces; nullptr clears) the one KV event callback. Returns after any call of the
  // previous callback has finished, so the caller may then destroy what it captured. Must not
  // be called from inside the callback, nor while holding a lock the callback takes.
  virtual void SetKvEventCallback(KvEventCallback callback) = 0;

  // A consistent snapshot of the stored hashes: the state after event `sequence`.
  virtual KvSnapshot GetKvSnapshot() const = 0;

  // Stops the engine (idempotent). kDrain blocks until every submitted request has finished.
  virtual void Shutdown(ShutdownMode mode) = 0;
};

}  // namespace chunkserve::engine

#endif  // CHUNKSERVE_RUNTIME_ENGINE_ENGINE_H_
