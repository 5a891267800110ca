#include "runtime/engine/engine.h"

#include <sched.h>
#include <stdlib.h>

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <filesystem>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <utility>

#include "runtime/base/logging.h"
#include "runtime/base/process_memory.h"
#include "runtime/engine/rate_window.h"
#include "runtime/kvcache/prefix_tree.h"
#include "runtime/model/model.h"
#include "runtime/model/tiny_model.h"
#include "runtime/sched/scheduler.h"

namespace chunkserve::engine {
namespace {

using sched::Clock;

// Writes the built-in tiny model into `dir` (a fresh temporary directory when empty) and returns
// the directory used.
Result<std::filesystem::path> MaterializeTinyModel(const std::string& dir) {
  std::filesystem::path path;
  if (dir.empty()) {
    std::string tmpl = (std::filesystem::temp_directory_path() / "chunkserve-tiny-XXXXXX").string();
    if (mkdtemp(tmpl.data()) == nullptr) {
      return Status::Unavailable("cannot create a temporary directory for the tiny model");
    }
    path = tmpl;
  } else {
    path = dir;
  }
  CHUNKSERVE_RETURN_IF_ERROR(model::WriteTinyModel(path, model::TinyModelOptions::Default()));
  return path;
}

// Records the prefix tree's KV events (on the step thread) for the engine's subscriber and
// snapshots; guarded by its own mutex so snapshots never wait for a step.
class KvEventLog final : public kv::KvEventObserver {
 public:
  void OnChunkStored(uint64_t hash, uint64_t parent_hash) override {
    std::lock_guard<std::mutex> lock(mu_);
    stored_[hash] = parent_hash;
    pending_.push_back({KvEvent::Kind::kStored, hash, parent_hash, ++sequence_});
  }
  void OnChunkEvicted(uint64_t hash) override {
    std::lock_guard<std::mutex> lock(mu_);
    stored_.erase(hash);
    pending_.push_back({KvEvent::Kind::kEvicted, hash, 0, ++sequence_});
  }

  // Hands the step's events to the callback (step thread).
  void Flush() {
    std::vector<KvEvent> events;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (pending_.empty()) return;
      events.swap(pending_);
    }
    std::lock_guard<std::mutex> lock(callback_mu_);
    if (callback_) callback_(events);
  }

  void SetCallback(KvEventCallback callback) {
    std::lock_guard<std::mutex> lock(callback_mu_);
    callback_ = std::move(callback);
  }

  KvSnapshot Snapshot() const {
    std::lock_guard<std::mutex> lock(mu_);
    KvSnapshot snapshot;
    snapshot.sequence = sequence_;
    snapshot.chunks.reserve(stored_.size());
    for (const auto& [hash, parent] : stored_) {
      snapshot.chunks.push_back({KvEvent::Kind::kStored, hash, parent, 0});
    }
    return snapshot;
  }

 private:
  mutable std::mutex mu_;
  std::unordered_map<uint64_t, uint64_t> stored_;  // hash -> parent hash
  std::vector<KvEvent> pending_;
  uint64_t sequence_ = 0;
  std::mutex callback_mu_;  // held while the callback runs
  KvEventCallback callback_;
};

class EngineImpl final : public Engine {
 public:
  EngineImpl(const EngineOptions& options, model::LoadedModel model, bool owns_model_dir)
      : options_(options), model_(std::move(model)), owns_model_dir_(owns_model_dir) {}

  ~EngineImpl() override {
    Shutdown(ShutdownMode::kAbort);
    RemoveOwnedModelDir();
  }

  // Removes the temporary directory the built-in tiny model was written to, once every reader
  // (this process's mappings, tensor-parallel ranks) has loaded it: the mapped files stay readable
  // after the unlink, and a process killed later (tests SIGKILL workers) leaves nothing behind.
  void RemoveOwnedModelDir() {
    if (!owns_model_dir_) return;
    owns_model_dir_ = false;
    std::error_code ec;  // best effort
    std::filesystem::remove_all(model_.dir(), ec);
  }

  Status Init() {
    const model::ModelConfig& c = model_.config();
    backend::KvArenaShape shape{.num_layers = c.num_layers,
                                .num_slots = 1,
                                .num_kv_heads = c.num_kv_heads,
                                .chunk_size = options_.chunk_size,
                                .head_dim = c.head_dim,
                                .dtype = options_.kv_dtype};
    const uint64_t slot_bytes = shape.slot_bytes();
    const uint64_t slots = options_.kv_cache_bytes / slot_bytes;
    if (slots < 2) {
      return Status::InvalidArgument("kv_cache_bytes " + std::to_string(options_.kv_cache_bytes) +
                                     " holds fewer than 2 chunks of " + std::to_string(slot_bytes) +
                                     " bytes");
    }
    if (slots > (1u << 24)) return Status::InvalidArgument("kv_cache_bytes is too large");
    num_slots_ = static_cast<int32_t>(slots);
    const forward::RunnerOptions runner_options{.backend = options_.backend,
                                                .cuda_device = options_.cuda_device,
                                                .num_threads = options_.num_threads,
                                                .num_slots = num_slots_,
                                                .chunk_size = options_.chunk_size,
                                                .kv_dtype = options_.kv_dtype};
    if (options_.runner_factory) {
      CHUNKSERVE_ASSIGN_OR_RETURN(runner_, options_.runner_factory(model_, runner_options));
      if (runner_ == nullptr) return Status::Internal("the runner factory returned no runner");
    } else {
      CHUNKSERVE_ASSIGN_OR_RETURN(runner_, forward::CreateLlamaModel(model_, runner_options));
    }
    // The runner holds its own copy now (packed host memory, or the device): the checkpoint's
    // mappings or dequantized tensors would only double the resident memory.
    model_.ReleaseWeights();
    stats_.weight_bytes = runner_->weight_bytes();
    const uint64_t h = c.hidden_size, q = c.q_dim(), kv = c.kv_dim(), inter = c.intermediate_size;
    stats_.projection_flops_per_token = 2 * c.num_layers * (2 * h * q + 2 * h * kv + 3 * h * inter);
    CHUNKSERVE_ASSIGN_OR_RETURN(
        kv::PrefixTree tree, kv::PrefixTree::Create({.chunk_size = options_.chunk_size,
                                                     .num_slots = num_slots_,
                                                     .slot_bytes = slot_bytes,
                                                     .model_fingerprint = model_.fingerprint()}));
    tree_ = std::make_unique<kv::PrefixTree>(std::move(tree));
    tree_->SetObserver(&kv_log_);
    scheduler_ = std::make_unique<sched::Scheduler>(
        sched::SchedulerOptions{.max_batch_size = options_.max_batch_size,
                                .token_budget = options_.prefill_token_budget,
                                .prefix_sharing = options_.enable_prefix_sharing,
                                .max_context = c.MaxContextLength()},
        tree_.get(), runner_.get(), [this](RequestId id) { OnFinished(id); });
    stats_.kv_bytes_capacity = slot_bytes * static_cast<uint64_t>(num_slots_);
    stats_.kv_slots_total = num_slots_;
    stats_.kv_bytes_per_slot = slot_bytes;
    stats_.kv_capacity_tokens = int64_t{num_slots_} * options_.chunk_size;
    if (const char* stall = std::getenv("CHUNKSERVE_TEST_STALL_FILE")) stall_file_ = stall;
    step_thread_ = std::thread([this] { StepLoop(); });
    return Status::Ok();
  }

  Result<std::shared_ptr<sched::RequestStream>> Submit(sched::RequestOptions request) override {
    CHUNKSERVE_RETURN_IF_ERROR(sched::ValidateRequest(request, vocab_size(), max_context()));
    // Reject what can never fit: the whole context in private chunks, plus one copy-on-write.
    const int64_t total = static_cast<int64_t>(request.prompt.size()) + request.max_new_tokens;
    const int64_t chunks =
        (std::min<int64_t>(total, max_context()) + options_.chunk_size - 1) / options_.chunk_size +
        1;
    if (chunks > num_slots_) {
      return Status::ResourceExhausted("request needs " + std::to_string(chunks) +
                                       " KV chunks but the cache has " +
                                       std::to_string(num_slots_) + "; it can never fit here");
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return Status::Unavailable("engine is shutting down");
    if (static_cast<int32_t>(incoming_.size()) + queued_ >= options_.max_queued_requests) {
      return Status::ResourceExhausted(
          "engine overloaded: " + std::to_string(options_.max_queued_requests) +
          " requests queued; retry later");
    }
    const RequestId id(next_id_++);
    auto stream = std::make_shared<sched::RequestStream>(id);
    live_.emplace(id.value(), stream);
    incoming_.push_back(sched::Scheduler::Request{
        .id = id, .options = std::move(request), .stream = stream, .arrival = Clock::now()});
    ++stats_.requests_submitted;
    cv_.notify_all();
    return stream;
  }

  Status Cancel(RequestId id) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = live_.find(id.value());
    if (it == live_.end() || it->second->finished()) {
      return Status::NotFound("no live request with id " + std::to_string(id.value()));
    }
    it->second->RequestCancel();
    cv_.notify_all();  // the step thread may be idle-waiting on a deadline
    return Status::Ok();
  }

  EngineStats Stats() const override {
    const uint64_t resident = ResidentBytes();  // a /proc read: not under the step's lock
    std::lock_guard<std::mutex> lock(mu_);
    EngineStats s = stats_;
    s.queued = queued_ + static_cast<int32_t>(incoming_.size());
    s.resident_bytes = resident;
    return s;
  }

  int32_t vocab_size() const override { return model_.config().vocab_size; }
  int32_t max_context() const override { return model_.config().MaxContextLength(); }
  uint64_t model_fingerprint() const override { return model_.fingerprint(); }
  int32_t chunk_size() const override { return options_.chunk_size; }

  void SetKvEventCallback(KvEventCallback callback) override {
    kv_log_.SetCallback(std::move(callback));
  }

  KvSnapshot GetKvSnapshot() const override { return kv_log_.Snapshot(); }

  void Shutdown(ShutdownMode mode) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
      if (mode == ShutdownMode::kAbort) abort_ = true;
      cv_.notify_all();
    }
    std::lock_guard<std::mutex> join_lock(join_mu_);
    if (step_thread_.joinable()) step_thread_.join();
  }

 private:
  void OnFinished(RequestId id) { finished_ids_.push_back(id); }

  // Test hook: while the file named by $CHUNKSERVE_TEST_STALL_FILE exists (read once, at
  // creation), the step thread takes no step (a frozen engine whose process and links are alive,
  // for the cluster's liveness tests). Shutdown still works. Unset: one branch per step.
  bool StalledForTesting() {
    if (stall_file_.empty()) return false;
    std::error_code ec;
    if (!std::filesystem::exists(stall_file_, ec)) return false;
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, std::chrono::milliseconds(20), [&] { return abort_ || stopping_; });
    return !abort_;
  }

  void StepLoop() {
    std::deque<sched::Scheduler::Request> batch;
    for (;;) {
      bool abort = false;
      {
        std::unique_lock<std::mutex> lock(mu_);
        const auto has_input = [&] { return !incoming_.empty() || abort_ || stopping_; };
        if (!scheduler_->has_work()) {
          cv_.wait(lock, has_input);
        } else if (!scheduler_->has_running()) {
          // Requests wait for slots, for a prefill they share, or for their deadline: poll.
          cv_.wait_for(lock, std::chrono::milliseconds(5), has_input);
        }
        batch.swap(incoming_);
        abort = abort_;
        for (RequestId id : finished_ids_) live_.erase(id.value());
        finished_ids_.clear();
      }
      for (auto& r : batch) scheduler_->Add(std::move(r));
      batch.clear();
      if (abort) {
        scheduler_->AbortAll(FinishReason::kUnavailable, Status::Unavailable("engine shut down"));
        PublishStats(Clock::now());
        scheduler_->DeliverFinished();
        return;
      }
      if (!scheduler_->has_work()) {
        std::lock_guard<std::mutex> lock(mu_);
        if (stopping_ && incoming_.empty()) {
          PublishStatsLocked(Clock::now());
          return;
        }
        continue;
      }
      if (StalledForTesting()) continue;
      const auto now = Clock::now();
      Status s = scheduler_->Step(now);
      if (!s.ok()) {
        // The KV written in a failed step is unknown: end everything rather than serve garbage.
        LOG(ERROR) << "engine step failed: " << s;
        scheduler_->AbortAll(FinishReason::kError, s);
      }
      busy_s_ += std::chrono::duration<double>(Clock::now() - now).count();
      PublishStats(now);
      kv_log_.Flush();
      scheduler_->DeliverFinished();
    }
  }

  void PublishStats(Clock::time_point now) {
    std::lock_guard<std::mutex> lock(mu_);
    PublishStatsLocked(now);
  }

  void PublishStatsLocked(Clock::time_point now) {
    for (RequestId id : finished_ids_) live_.erase(id.value());
    finished_ids_.clear();
    const sched::SchedulerCounters& c = scheduler_->counters();
    const kv::KvCacheStats kv = tree_->Stats();
    stats_.requests_finished = c.finished;
    stats_.prompt_tokens = c.prompt_tokens;
    stats_.prefix_hit_tokens = c.prefix_hit_tokens;
    stats_.prefill_tokens = c.prefill_tokens;
    stats_.generated_tokens = c.generated_tokens;
    stats_.steps = c.steps;
    stats_.evicted_chunks = kv.evictions;
    stats_.preemptions = c.preemptions;
    stats_.running = scheduler_->num_running();
    stats_.prefill_progress_tokens = scheduler_->PrefillProgressTokens();
    queued_ = scheduler_->num_waiting();
    stats_.last_batch_size = c.last_batch_tokens;
    stats_.kv_bytes_used = kv.bytes_used;
    stats_.kv_bytes_referenced = kv.bytes_referenced;
    stats_.kv_bytes_if_unshared = kv.bytes_if_unshared;
    stats_.kv_bytes_peak = std::max(stats_.kv_bytes_peak, kv.bytes_referenced);
    stats_.chunks_total = kv.used_slots;
    stats_.chunks_retained = kv.retained_chunks;
    stats_.chunks_shared = kv.shared_chunks;
    rates_.Add({.t = now, .busy_s = busy_s_, .decode = c.decode_tokens,
                .prefill = c.prefill_tokens});
    stats_.decode_tokens_per_s = rates_.rates().decode_per_s;
    stats_.prefill_tokens_per_s = rates_.rates().prefill_per_s;
    stats_.decode_tokens_per_busy_s = rates_.rates().decode_per_busy_s;
  }

  const EngineOptions options_;
  model::LoadedModel model_;
  bool owns_model_dir_;  // the tiny model's temporary directory, until RemoveOwnedModelDir
  int32_t num_slots_ = 0;
  std::filesystem::path stall_file_;  // test hook, see StalledForTesting
  std::unique_ptr<forward::StepRunner> runner_;
  KvEventLog kv_log_;  // declared before tree_: outlives it
  std::unique_ptr<kv::PrefixTree> tree_;
  std::unique_ptr<sched::Scheduler> scheduler_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<sched::Scheduler::Request> incoming_;
  std::unordered_map<uint64_t, std::shared_ptr<sched::RequestStream>> live_;
  std::vector<RequestId> finished_ids_;  // step thread only, drained under mu_
  uint64_t next_id_ = 1;
  int32_t queued_ = 0;
  bool stopping_ = false;
  bool abort_ = false;
  EngineStats stats_;
  RateWindow rates_;  // step thread, under mu_
  double busy_s_ = 0;  // seconds spent in Step, step thread only

  std::mutex join_mu_;
  std::thread step_thread_;
};

}  // namespace

namespace {

// The CPUs this process may run on (its affinity mask: taskset and cpusets count), at least 1.
int32_t AvailableCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return static_cast<int32_t>(std::max(1u, std::thread::hardware_concurrency()));
}

}  // namespace

Result<std::unique_ptr<Engine>> Engine::Create(const EngineOptions& options) {
  // More compute threads than CPUs only make the threads wait for each other at every barrier
  // (a 40-token request took 11 s with 256 threads on 2 CPUs, instead of 0.01 s).
  const int32_t cpus = AvailableCpus();
  if (options.num_threads < 0 || options.num_threads > cpus) {
    return Status::InvalidArgument("num_threads must be in [0, " + std::to_string(cpus) +
                                   "] (0: all " + std::to_string(cpus) +
                                   " CPUs this process may use), got " +
                                   std::to_string(options.num_threads));
  }
  if (options.chunk_size < 16 || options.chunk_size > 256) {
    return Status::InvalidArgument("chunk_size must be in [16, 256], got " +
                                   std::to_string(options.chunk_size));
  }
  if (options.max_batch_size < 1) return Status::InvalidArgument("max_batch_size must be >= 1");
  if (options.prefill_token_budget < 0) {
    return Status::InvalidArgument("prefill_token_budget must be >= 0");
  }
  if (options.max_queued_requests < 1) {
    return Status::InvalidArgument("max_queued_requests must be >= 1");
  }
  InitLogging();
  if (options.model_dir.empty() && !options.tiny_model) {
    return Status::InvalidArgument(
        "no model: set model_dir (a model folder or a .gguf file), or tiny_model for the built-in "
        "random-weight test model");
  }
  if (!options.model_dir.empty() && options.tiny_model) {
    return Status::InvalidArgument("model_dir and tiny_model exclude each other");
  }
  std::filesystem::path dir = options.model_dir;
  const bool tiny = options.tiny_model;
  if (tiny) {
    CHUNKSERVE_ASSIGN_OR_RETURN(dir, MaterializeTinyModel(options.tiny_model_dir));
  }
  model::LoadModelOptions load_options;
  load_options.gguf_dtype = options.gguf_dtype;
  Result<model::LoadedModel> loaded = model::LoadedModel::Load(dir, load_options);
  if (!loaded.ok()) {
    if (tiny && options.tiny_model_dir.empty()) {
      std::error_code ec;
      std::filesystem::remove_all(dir, ec);
    }
    return loaded.status();
  }
  auto engine = std::make_unique<EngineImpl>(options, std::move(loaded).value(),
                                             tiny && options.tiny_model_dir.empty());
  CHUNKSERVE_RETURN_IF_ERROR(engine->Init());
  engine->RemoveOwnedModelDir();
  ReturnFreeHeapToOs();  // the checkpoint's buffers, freed above, are most of the heap
  const EngineStats stats = engine->Stats();
  LOG(INFO) << "engine ready: " << (tiny ? std::string("built-in tiny model") : dir.string())
            << ", vocab " << engine->vocab_size() << ", context " << engine->max_context()
            << ", KV cache " << stats.kv_capacity_tokens << " tokens in " << stats.kv_slots_total
            << " chunks of " << engine->chunk_size() << ", prefix sharing "
            << (options.enable_prefix_sharing ? "on" : "off");
  return std::unique_ptr<Engine>(std::move(engine));
}

}  // namespace chunkserve::engine
