// Tensor-parallel execution behind the StepRunner interface.
//
// Rank 0 (the leader) runs the engine: scheduler, prefix tree and sampling. Its runner is a
// TpLeaderRunner: each step broadcasts the step's descriptor (step_codec.h) to the group, then
// runs rank 0's shard of the model (forward::LlamaModel with tp rank 0, on the CPU or CUDA
// backend), whose all-reduces after the o and down projections meet the followers' in the same
// order. Ranks 1..T-1 run RunTpFollower: receive a descriptor, run their shard, repeat. The model
// definition is the same on every rank and backend (forward/llama.h): every rank computes the
// same hidden states (the all-reduce hands all ranks the same sums); only rank 0 runs the LM head
// and samples, on rows the followers are never told about, so nothing but the all-reduces
// crosses ranks. CPU ranks reduce host memory over Gloo; CUDA ranks (rank r on device r) reduce
// device memory over NCCL on their backend's stream.
//
// Wire of one step: one broadcast of a fixed 4 KiB frame (header + the descriptor when it fits;
// a second broadcast carries larger descriptors), then 2 all-reduces of [tokens, hidden] fp32 per
// layer.
//
// Liveness and failure (fail fast, never hang). Every collective has a deadline (op_timeout).
// While the engine is idle the leader sends a heartbeat every heartbeat_interval (a broadcast and
// a one-float all-reduce, so a dead or stuck follower is noticed within op_timeout even with no
// traffic); a follower that hears nothing for heartbeat_interval + op_timeout gives up. Any
// failure (a collective's error, a follower's shard that could not be built, Fail() from a
// process monitor) breaks the communicator and makes the leader *failed*: Forward returns the
// failure (Unavailable, naming the cause) from then on, so the engine ends every request with an
// error, and the failure callback runs once so the owner can report itself unavailable and exit.
//
// Thread safety: StepRunner's contract for Forward and ForwardSample (the engine's step thread);
// Fail and SetFailureCallback from any thread.
#ifndef CHUNKSERVE_RUNTIME_PARALLEL_TP_RUNNER_H_
#define CHUNKSERVE_RUNTIME_PARALLEL_TP_RUNNER_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include "runtime/forward/llama.h"
#include "runtime/forward/step_runner.h"
#include "runtime/model/model.h"
#include "runtime/parallel/communicator.h"
#include "runtime/parallel/step_codec.h"

namespace chunkserve::parallel {

struct TpOptions {
  std::chrono::milliseconds op_timeout{30000};         // each collective
  std::chrono::milliseconds heartbeat_interval{1000};  // leader -> followers while idle
};

class TpLeaderRunner final : public forward::StepRunner {
 public:
  // Rank 0 of `comm` (borrowed; must outlive the runner). Sends the followers the init message
  // (model directory, fingerprint, backend, slots, chunk size, KV dtype, threads, timeouts),
  // builds rank 0's shard (on device 0 for CUDA), and waits until every rank reports its shard
  // built (a one-float all-reduce of failures). InvalidArgument when the model does not split
  // into comm->size() ranks; Unavailable when a follower fails or the group breaks.
  static Result<std::unique_ptr<TpLeaderRunner>> Create(const model::LoadedModel& model,
                                                        const forward::RunnerOptions& options,
                                                        Communicator* comm,
                                                        const TpOptions& tp_options);
  // Stops the heartbeat and, when the group is healthy, tells the followers to exit.
  ~TpLeaderRunner() override;

  std::string name() const override {
    return local_->name() + "-tp" + std::to_string(comm_->size());
  }
  const backend::KvArenaShape& kv_shape() const override { return local_->kv_shape(); }
  int32_t vocab_size() const override { return local_->vocab_size(); }
  uint64_t weight_bytes() const override { return local_->weight_bytes(); }
  Status Forward(const forward::StepBatch& batch, std::span<float> logits) override;
  Status ForwardSample(const forward::StepBatch& batch, std::span<const backend::SampleRow> rows,
                       std::span<TokenId> tokens, std::span<TokenLogprobs> logprobs) override;

  // Marks the group failed (first reason wins), aborts the communicator and runs the callback.
  void Fail(const Status& reason);
  // Called once, with the first failure, on the thread that observed it; set before serving.
  void SetFailureCallback(std::function<void(const Status&)> callback);
  Status health() const;

 private:
  TpLeaderRunner(Communicator* comm, const TpOptions& options) : comm_(comm), options_(options) {}
  Status SendLocked(TpMessageKind kind, std::span<const std::byte> payload);
  // Sends the step, then runs `local` (this rank's shard); a failure breaks the group.
  template <typename Run>
  Status Step(const forward::StepBatch& batch, Run&& local);
  void HeartbeatLoop();

  Communicator* comm_;
  const TpOptions options_;
  std::unique_ptr<forward::LlamaModel> local_;
  bool serving_ = false;  // Create succeeded

  std::mutex mu_;  // one group operation (step or heartbeat) at a time
  Clock::time_point last_op_;
  std::condition_variable stop_cv_;
  bool stop_ = false;  // guarded by mu_
  std::thread heartbeat_;

  mutable std::mutex fail_mu_;
  Status failed_;
  std::function<void(const Status&)> on_failure_;
  bool callback_ran_ = false;
};

// Runs follower rank comm->rank() (> 0): waits for the init message (up to `init_timeout`), loads
// the model directory it names, builds its shard (threads, slots and timeouts as the leader's),
// reports, then runs every step it is sent. Returns OK when the leader sends shutdown; an error
// when anything fails (the communicator is then aborted, so the leader sees the failure at its
// next collective).
Status RunTpFollower(Communicator* comm, std::chrono::milliseconds init_timeout);

}  // namespace chunkserve::parallel

#endif  // CHUNKSERVE_RUNTIME_PARALLEL_TP_RUNNER_H_
