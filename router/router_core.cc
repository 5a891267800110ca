// RouterCore: membership + index + load tracker + policy, as one router uses them (routing.h).
#include <algorithm>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>

#include "router/routing.h"
#include "runtime/kvcache/chunk_hash.h"

namespace chunkserve::router {

Result<RoutingRequest> MakeRoutingRequest(uint64_t chain_seed, int32_t chunk_size,
                                          std::span<const TokenId> prompt, int32_t max_new_tokens) {
  RoutingRequest r;
  CHUNKSERVE_ASSIGN_OR_RETURN(r.chunk_hashes, kv::FullChunkHashes(chain_seed, chunk_size, prompt));
  r.prompt = prompt;
  r.prompt_tokens = static_cast<int64_t>(prompt.size());
  r.chunk_size = chunk_size;
  r.max_new_tokens = max_new_tokens;
  return r;
}

struct RouterCore::State {
  RouterCoreOptions options;
  std::unique_ptr<PrefixIndex> index;
  std::unique_ptr<Policy> policy;
  LoadTracker loads;
  // Kept in a vector so a pick reads them without lookups; effective loads are refreshed
  // whenever one of their inputs changes, not per pick.
  std::vector<WorkerState> workers;
  std::unordered_map<WorkerId, size_t> position;
  std::unordered_map<RequestId, int64_t> predicted;  // from Route until OnFinished
  PrecisionStats precision;
  // Output lengths: the plain mean of the first kOutputWindow, then an exponential average
  // with weight 1 / kOutputWindow (recent traffic counts most; no history to store).
  static constexpr int64_t kOutputWindow = 256;
  double mean_output = 0;
  int64_t outputs_seen = 0;

  WorkerState* Find(WorkerId id) {
    auto it = position.find(id);
    return it == position.end() ? nullptr : &workers[it->second];
  }
  void Refresh(WorkerId id) {
    if (WorkerState* w = Find(id)) w->load = loads.Effective(id);
  }
};

static Status UnknownWorker(WorkerId id) {
  return Status::NotFound("unknown worker " + std::to_string(id.value()));
}

RouterCore::RouterCore() : state_(std::make_unique<State>()) {}
RouterCore::~RouterCore() = default;

Result<std::unique_ptr<RouterCore>> RouterCore::Create(const RouterCoreOptions& options) {
  std::unique_ptr<RouterCore> core(new RouterCore());
  core->state_->options = options;
  CHUNKSERVE_ASSIGN_OR_RETURN(core->state_->index, PrefixIndex::Create(options.index));
  core->state_->index->SetChainSeeds(options.chain_seeds);
  CHUNKSERVE_ASSIGN_OR_RETURN(core->state_->policy,
                              MakePolicy(options.policy_kind, options.policy));
  return core;
}

Status RouterCore::AddWorker(const WorkerInfo& info) {
  if (!info.id.valid()) return Status::InvalidArgument("worker id is invalid");
  if (info.max_batch_size < 1) {
    return Status::InvalidArgument("worker " + std::to_string(info.id.value()) +
                                   " max_batch_size " + std::to_string(info.max_batch_size) +
                                   " < 1");
  }
  State& s = *state_;
  if (WorkerState* w = s.Find(info.id)) {
    // A new process behind the same id: its KV cache is new, nothing we knew holds.
    if (w->info.generation != info.generation) s.index->DropWorker(info.id);
    w->info = info;
    return Status::Ok();
  }
  s.position.emplace(info.id, s.workers.size());
  s.workers.push_back(WorkerState{.info = info, .load = s.loads.Effective(info.id)});
  return Status::Ok();
}

Status RouterCore::RemoveWorker(WorkerId worker) {
  State& s = *state_;
  auto it = s.position.find(worker);
  if (it == s.position.end()) return UnknownWorker(worker);
  const size_t pos = it->second;
  s.position.erase(it);
  if (pos + 1 != s.workers.size()) {
    s.workers[pos] = std::move(s.workers.back());
    s.position[s.workers[pos].info.id] = pos;
  }
  s.workers.pop_back();
  s.index->DropWorker(worker);
  s.loads.DropWorker(worker);
  return Status::Ok();
}

Status RouterCore::SetAccepting(WorkerId worker, bool accepting) {
  WorkerState* w = state_->Find(worker);
  if (w == nullptr) return UnknownWorker(worker);
  w->accepting = accepting;
  return Status::Ok();
}

Status RouterCore::UpdateLoad(WorkerId worker, const WorkerLoad& load, bool fresh) {
  if (state_->Find(worker) == nullptr) return UnknownWorker(worker);
  state_->loads.SetReported(worker, load, fresh);
  state_->Refresh(worker);
  return Status::Ok();
}

Result<KvApplyOutcome> RouterCore::ApplyKvEvents(WorkerId worker, const KvEventBatch& batch) {
  if (state_->Find(worker) == nullptr) return UnknownWorker(worker);
  return state_->index->ApplyKvEvents(worker, batch);
}

Result<RoutingDecision> RouterCore::Route(RequestId request, const RoutingRequest& routing_request,
                                          RouterTime now) {
  State& s = *state_;
  if (s.loads.WorkerOf(request).valid()) {
    return Status::AlreadyExists("request " + std::to_string(request.value()) +
                                 " is already in flight");
  }
  const PickContext context{.workers = s.workers,
                            .index = s.index.get(),
                            .now = now,
                            .mean_output_tokens = s.mean_output};
  CHUNKSERVE_ASSIGN_OR_RETURN(RoutingDecision decision, s.policy->Pick(routing_request, context));
  const int64_t prompt = std::max<int64_t>(routing_request.prompt_tokens,
                                           static_cast<int64_t>(routing_request.prompt.size()));
  CHUNKSERVE_RETURN_IF_ERROR(
      s.loads.OnPicked(request, decision.worker, prompt - decision.predicted_cached_tokens));
  s.Refresh(decision.worker);
  // Remembered until the predicted first token (when the worker stores the prefix) + the TTL.
  const auto extra = std::chrono::duration_cast<RouterTime>(
      std::chrono::duration<double>(std::clamp(decision.predicted_ttft_s, 0.0, 60.0)));
  s.index->RecordDecision(decision.worker, routing_request.chunk_hashes, now, extra);
  s.predicted[request] = decision.predicted_cached_tokens;
  return decision;
}

Status RouterCore::OnFirstToken(RequestId request) {
  State& s = *state_;
  const WorkerId worker = s.loads.WorkerOf(request);
  CHUNKSERVE_RETURN_IF_ERROR(s.loads.OnFirstToken(request));
  s.Refresh(worker);
  return Status::Ok();
}

Status RouterCore::OnFinished(RequestId request, std::optional<int64_t> reported_cached_tokens,
                              std::optional<int32_t> output_tokens) {
  State& s = *state_;
  const WorkerId worker = s.loads.WorkerOf(request);
  CHUNKSERVE_RETURN_IF_ERROR(s.loads.OnFinished(request));
  if (output_tokens.has_value() && *output_tokens > 0) {
    s.outputs_seen = std::min(s.outputs_seen + 1, State::kOutputWindow);
    s.mean_output += (static_cast<double>(*output_tokens) - s.mean_output) /
                     static_cast<double>(s.outputs_seen);
  }
  if (auto it = s.predicted.find(request); it != s.predicted.end()) {
    if (reported_cached_tokens.has_value()) s.precision.Add(it->second, *reported_cached_tokens);
    s.predicted.erase(it);
  }
  s.Refresh(worker);
  return Status::Ok();
}

const std::vector<WorkerState>& RouterCore::workers() const { return state_->workers; }
PrefixIndex& RouterCore::index() { return *state_->index; }
const LoadTracker& RouterCore::loads() const { return state_->loads; }
Policy& RouterCore::policy() { return *state_->policy; }
const PrecisionStats& RouterCore::precision() const { return state_->precision; }

}  // namespace chunkserve::router
