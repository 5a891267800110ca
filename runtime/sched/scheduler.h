// Scheduler: iteration-level (continuous) batching over a prefix tree and a backend.
//
// Each Step():
//  1. ends requests that were cancelled or whose deadline passed (their private chunks are
//     released in this step);
//  2. admits waiting requests, highest priority then earliest arrival, while the batch has room
//     and the KV slots suffice for the request's uncached tokens plus what running prefills still
//     need (free + retained slots; shared chunks are counted once because only uncached tokens
//     need new slots). The prompt's longest cached prefix goes straight onto the new sequence's
//     path (PrefixTree::Insert), so those tokens are never projected nor attended as queries;
//  3. composes one batch: every decoding sequence contributes its pending token, then prefilling
//     sequences contribute prompt tokens in admission order until the per-step token budget is
//     spent (chunked prefill, so a long prompt never stalls decoding);
//  4. appends those tokens to the tree; when slots run out the tree has already evicted retained
//     chunks, and the scheduler preempts by recompute (lowest priority, latest arrival first): the
//     victim's sequence is released (its chunks stay retained, so re-admission usually finds most
//     of them again) and it goes back to the queue with prompt plus generated tokens as its
//     context;
//  5. builds or updates the TPP plan for the decode rows, runs the step on the runner, which
//     samples next to the logits (each request's Sampler draws the uniform on the host, so the
//     tokens do not depend on the backend), streams tokens and ends requests on a stop token,
//     max_new_tokens or a full context.
//
// Duplicate prefills are avoided: a waiting request whose prompt shares at least one more chunk
// with a sequence that is still prefilling than the cache holds now is deferred until that prefill
// has written the shared chunks, then admitted with them cached. Requests that can never fit (their
// prompt plus max_new_tokens needs more chunks than the pool has) are rejected by Engine::Submit.
//
// Thread safety: none; owned by the engine's step thread.
#ifndef CHUNKSERVE_RUNTIME_SCHED_SCHEDULER_H_
#define CHUNKSERVE_RUNTIME_SCHED_SCHEDULER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "runtime/backend/backend.h"
#include "runtime/base/status.h"
#include "runtime/forward/step_runner.h"
#include "runtime/kvcache/prefix_tree.h"
#include "runtime/plan/tpp_plan.h"
#include "runtime/sched/request.h"
#include "runtime/sched/sampler.h"
#include "runtime/sched/stream.h"

namespace chunkserve::sched {

struct SchedulerOptions {
  int32_t max_batch_size = 64;
  int32_t token_budget = 512;  // tokens per step, decode included; 0 = unlimited
  bool prefix_sharing = true;
  int32_t max_context = 0;  // the model's context length; sequences stop there (kLength)
};

// Counters the engine exports (cumulative unless noted).
struct SchedulerCounters {
  uint64_t admitted = 0;
  uint64_t finished = 0;
  uint64_t prompt_tokens = 0;
  uint64_t prefix_hit_tokens = 0;
  uint64_t prefill_tokens = 0;
  uint64_t decode_tokens = 0;
  uint64_t generated_tokens = 0;
  uint64_t preemptions = 0;
  uint64_t deferred = 0;  // admissions deferred to reuse a prefix being prefilled
  uint64_t steps = 0;
  int32_t last_batch_tokens = 0;
  int32_t last_decode_rows = 0;
};

class Scheduler {
 public:
  struct Request {
    RequestId id;
    RequestOptions options;
    std::shared_ptr<RequestStream> stream;
    Clock::time_point arrival;
    uint64_t arrival_seq = 0;
  };
  // Called once per finished request, after its terminal event was pushed.
  using FinishHook = std::function<void(RequestId)>;

  // Borrows tree and runner, which must outlive the scheduler.
  Scheduler(const SchedulerOptions& options, kv::PrefixTree* tree, forward::StepRunner* runner,
            FinishHook on_finish);

  void Add(Request request);

  // One iteration. Returns the runner's error when the forward pass fails; the caller then ends
  // every request (AbortAll) since the KV written this step is unknown.
  Status Step(Clock::time_point now);

  // Ends every request with `reason` (and `error`), releasing their sequences.
  void AbortAll(FinishReason reason, const Status& error);

  // Pushes the terminal events of the requests that ended since the last call. Step() and
  // AbortAll() release a finished request's chunks at once but hold its terminal event until
  // this call, so the engine can publish its statistics first: a client that has seen its
  // terminal event sees the release in the engine's stats too.
  void DeliverFinished();

  bool has_work() const { return !running_.empty() || !waiting_.empty(); }
  bool has_running() const { return !running_.empty(); }
  int32_t num_running() const { return static_cast<int32_t>(running_.size()); }
  int32_t num_waiting() const { return static_cast<int32_t>(waiting_.size()); }
  const SchedulerCounters& counters() const { return counters_; }
  // Prompt tokens computed so far for running requests without a first token yet (past what
  // was cached when each was admitted): how far their prefills got. A worker reports the
  // prefill still queued as what its requests need minus this.
  int64_t PrefillProgressTokens() const;

 private:
  struct Live {
    explicit Live(Request r) : req(std::move(r)), sampler(req.options.sampling) {}

    Request req;
    Sampler sampler;
    std::vector<TokenId> tokens;  // prompt, then generated tokens
    int32_t num_prompt = 0;
    int32_t generated = 0;
    SeqId seq;                   // valid while running
    int32_t computed = 0;        // leading tokens whose K/V are in the tree (== the path length)
    int32_t cached_tokens = -1;  // prompt tokens found cached at first admission
    double queue_seconds = -1;   // submission -> first admission; negative until admitted
    bool running = false;
    bool finished = false;
    int32_t append_index = -1;  // this step's entry in the Append batch

    bool decoding() const { return computed == static_cast<int32_t>(tokens.size()) - 1; }
  };

  void EndExpired(Clock::time_point now);
  void Admit();
  bool ShouldDefer(const Live& r, int32_t cached) const;
  Status Compose(std::vector<Live*>* decode, std::vector<Live*>* prefill,
                 std::vector<int32_t>* prefill_take);
  void Preempt(Live* victim);
  void Finish(Live* r, FinishReason reason, const Status& error = Status());
  void EraseFinished();
  int32_t SlotsFor(int32_t tokens) const;

  const SchedulerOptions options_;
  kv::PrefixTree* tree_;
  forward::StepRunner* runner_;
  FinishHook on_finish_;
  SchedulerCounters counters_;

  std::vector<std::pair<std::shared_ptr<RequestStream>, FinishInfo>> pending_finish_;
  std::vector<std::unique_ptr<Live>> waiting_;
  std::vector<std::unique_ptr<Live>> running_;  // admission order
  uint64_t next_arrival_ = 0;

  // Reused per step.
  plan::TppPlan plan_;
  kv::AppendResult append_;
  std::vector<kv::SeqTokens> append_batch_;
  std::vector<kv::KvCopy> pending_copies_;
  std::vector<forward::KvCopyOp> copy_ops_;
  std::vector<SeqId> decode_seqs_;
  std::vector<TokenId> step_tokens_;
  std::vector<int32_t> step_pos_, step_slot_, step_offset_, logit_rows_;
  std::vector<Live*> logit_owner_;
  std::vector<Live*> row_owner_;  // decode rows in plan order
  std::vector<forward::PrefillSegment> segments_;
  std::vector<int32_t> path_slots_, path_lens_;
  std::vector<backend::SampleRow> sample_rows_;
  std::vector<TokenId> sampled_;
  std::vector<TokenLogprobs> sampled_logprobs_;  // [logit rows]; filled where a request asks
};

}  // namespace chunkserve::sched

#endif  // CHUNKSERVE_RUNTIME_SCHED_SCHEDULER_H_
