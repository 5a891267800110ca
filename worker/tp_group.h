// Tensor parallelism in the worker process (runtime/parallel; worker/README.md).
//
// `chunkserve-worker --tp N` makes the worker rank 0 of a group of N ranks on this machine: CPU
// ranks over Gloo, or with `--backend cuda` GPU ranks over NCCL (rank r on CUDA device r).
// TpGroup::Start (rank 0, from main() before any engine exists):
//   1. hosts the rendezvous store (runtime/parallel/tcp_store.h) on --tp-rendezvous HOST:PORT
//      (default 127.0.0.1, ephemeral port);
//   2. spawns ranks 1..N-1 as child processes of the same binary with the hidden flags
//      `--tp-rank r --tp-size N --tp-rendezvous HOST:PORT --tp-timeout-ms T --tp-parent-pid P`;
//      each child sets PR_SET_PDEATHSIG (SIGKILL) before exec, so it dies with rank 0;
//   3. joins the group within the timeout: Gloo (CPU ranks), or NCCL (GPU ranks, one device
//      each; rank 0 publishes the ncclUniqueId in the rendezvous store, the worker's control
//      channel, and the others read it there);
//   4. watches the children (waitpid every 20 ms): a rank that exits while serving fails the
//      group at once, naming the rank, its pid and its exit code or signal.
// RunnerFactory() is then passed as EngineOptions::runner_factory: it builds the TpLeaderRunner,
// which sends the followers the model directory, the backend and the engine's KV layout.
// The failure callback runs once, on the thread that noticed (the step thread, the heartbeat
// or the monitor): the worker then drains (readiness off) and exits non-zero.
//
// A rank process (MaybeRunTpRank) joins the group, runs RunTpFollower until rank 0 sends
// shutdown (exit 0) or anything fails (exit 1, error on stderr); it also exits when rank 0 dies
// (the parent-death signal, and failing collectives as a second line).
//
// Thread safety: Start and the destructor on one thread; the rest from any thread.
#ifndef CHUNKSERVE_WORKER_TP_GROUP_H_
#define CHUNKSERVE_WORKER_TP_GROUP_H_

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "runtime/base/status.h"
#include "runtime/engine/engine.h"

namespace chunkserve::worker {

enum class TpComm : int32_t {
  kGloo = 0,  // CPU ranks, TCP
  kNccl = 1,  // GPU ranks: rank r uses CUDA device r (as numbered under CUDA_VISIBLE_DEVICES)
};

struct TpGroupOptions {
  int32_t size = 1;  // Start needs >= 2
  TpComm comm = TpComm::kGloo;
  // Rendezvous store and Gloo address of this machine; port 0 = ephemeral.
  std::string host = "127.0.0.1";
  uint16_t port = 0;
  // Binary the ranks run (it must understand --tp-rank); empty: this process's executable.
  std::string rank_binary;
  // Rendezvous deadline and the deadline of every collective.
  std::chrono::milliseconds timeout{30000};
  // Leader heartbeat while idle; a follower that hears nothing for heartbeat + timeout exits.
  std::chrono::milliseconds heartbeat{1000};
};

class TpGroup {
 public:
  static Result<std::unique_ptr<TpGroup>> Start(const TpGroupOptions& options);
  // Waits up to 5 s for the ranks to exit (they do once the engine's runner is destroyed and
  // sent them shutdown), then SIGKILLs what is left. Destroy the engine first.
  ~TpGroup();

  engine::RunnerFactory RunnerFactory();
  void SetFailureCallback(std::function<void(const Status&)> callback);
  std::vector<pid_t> rank_pids() const;

  struct State;

 private:
  TpGroup() = default;
  std::shared_ptr<State> state_;
};

// When argv holds --tp-rank, runs this process as that rank and returns true with the process
// exit code in *exit_code; otherwise returns false.
bool MaybeRunTpRank(int argc, char** argv, int* exit_code);

// Applies one of worker_main's flags to *options: --tp N (1..64; 1 = no group),
// --tp-rendezvous HOST:PORT, --tp-timeout-ms N, --tp-comm gloo|nccl. InvalidArgument on a bad
// value (nccl in a build without NCCL included).
Status ParseTpFlag(const std::string& flag, const std::string& value, TpGroupOptions* options);

}  // namespace chunkserve::worker

#endif  // CHUNKSERVE_WORKER_TP_GROUP_H_
