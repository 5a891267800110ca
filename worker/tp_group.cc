#include "worker/tp_group.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <thread>
#include <utility>

#include "runtime/base/logging.h"
#include "runtime/parallel/gloo_communicator.h"
#if defined(CHUNKSERVE_HAVE_NCCL)
#include "runtime/parallel/nccl_communicator.h"
#endif
#include "runtime/parallel/tcp_store.h"
#include "runtime/parallel/tp_runner.h"

namespace chunkserve::worker {

namespace par = ::chunkserve::parallel;

struct TpGroup::State {
  TpGroupOptions options;
  std::unique_ptr<par::TcpStoreServer> store;
  std::unique_ptr<par::Communicator> comm;
  std::vector<pid_t> pids;  // rank r is pids[r - 1]

  std::mutex mu;
  par::TpLeaderRunner* leader = nullptr;  // while the engine's runner lives
  bool shutting_down = false;             // the runner was destroyed: exits are expected
  std::function<void(const Status&)> on_failure;
  bool failure_reported = false;
  std::vector<bool> exited;
  Status rank_exit;  // the first rank that exited while serving

  std::atomic<bool> stop_monitor{false};
  std::thread monitor;

  // A rank died: fail the group (through the leader when it exists, so in-flight steps end).
  void RankExited(int32_t rank, pid_t pid, int status) {
    std::string how = WIFEXITED(status) ? "exited with code " + std::to_string(WEXITSTATUS(status))
                      : WIFSIGNALED(status) ? std::string("was killed by signal ") +
                                                  std::to_string(WTERMSIG(status)) + " (" +
                                                  strsignal(WTERMSIG(status)) + ")"
                                            : "stopped";
    const Status reason = Status::Unavailable("tensor-parallel rank " + std::to_string(rank) +
                                              " (pid " + std::to_string(pid) + ") " + how);
    std::function<void(const Status&)> callback;
    {
      std::lock_guard<std::mutex> lock(mu);
      if (shutting_down) return;
      if (rank_exit.ok()) rank_exit = reason;
      if (leader != nullptr) {
        par::TpLeaderRunner* l = leader;
        // Fail runs the callback the leader holds (set in RunnerFactory).
        l->Fail(reason);
        return;
      }
      comm->Abort(reason);
      if (!failure_reported && on_failure) {
        failure_reported = true;
        callback = on_failure;
      }
    }
    LOG(ERROR) << reason;
    if (callback) callback(reason);
  }

  void Monitor() {
    while (!stop_monitor) {
      for (size_t i = 0; i < pids.size(); ++i) {
        if (exited[i]) continue;
        int status = 0;
        if (::waitpid(pids[i], &status, WNOHANG) == pids[i]) {
          exited[i] = true;
          RankExited(static_cast<int32_t>(i + 1), pids[i], status);
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
};

namespace {

// The engine's runner: the leader, unregistered from the group before it is destroyed so the
// monitor never touches a dead leader and the ranks' clean exit is not taken for a failure.
class GroupRunner final : public forward::StepRunner {
 public:
  GroupRunner(std::shared_ptr<TpGroup::State> state, std::unique_ptr<par::TpLeaderRunner> leader)
      : state_(std::move(state)), leader_(std::move(leader)) {}
  ~GroupRunner() override {
    {
      std::lock_guard<std::mutex> lock(state_->mu);
      state_->leader = nullptr;
      state_->shutting_down = true;
    }
    leader_.reset();  // sends the followers shutdown
  }
  std::string name() const override { return leader_->name(); }
  const backend::KvArenaShape& kv_shape() const override { return leader_->kv_shape(); }
  int32_t vocab_size() const override { return leader_->vocab_size(); }
  uint64_t weight_bytes() const override { return leader_->weight_bytes(); }
  Status Forward(const forward::StepBatch& batch, std::span<float> logits) override {
    return NameTheRank(leader_->Forward(batch, logits));
  }
  Status ForwardSample(const forward::StepBatch& batch, std::span<const backend::SampleRow> rows,
                       std::span<TokenId> tokens, std::span<TokenLogprobs> logprobs) override {
    return NameTheRank(leader_->ForwardSample(batch, rows, tokens, logprobs));
  }

 private:
  Status NameTheRank(const Status& s) {
    if (s.ok()) return s;
    // A lost peer is usually a rank that died, and its sockets tell Gloo before waitpid tells
    // the monitor (20 ms polls): give the monitor a moment to name the rank for the error.
    for (int i = 0; i < 25; ++i) {
      {
        std::lock_guard<std::mutex> lock(state_->mu);
        if (!state_->rank_exit.ok()) {
          return Status::Unavailable(std::string(state_->rank_exit.message()) + " (" +
                                     std::string(s.message()) + ")");
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return s;
  }

  std::shared_ptr<TpGroup::State> state_;
  std::unique_ptr<par::TpLeaderRunner> leader_;
};

std::string SelfExe() {
  std::error_code ec;
  const std::filesystem::path p = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string() : p.string();
}

bool ParseIntFlag(const char* s, long long lo, long long hi, long long* out) {
  char* end = nullptr;
  const long long v = std::strtoll(s, &end, 10);
  if (end == s || *end != '\0' || v < lo || v > hi) return false;
  *out = v;
  return true;
}

// Joins rank `rank` of the group: Gloo, or NCCL on device `rank` with the unique id exchanged
// through the rendezvous store.
Result<std::unique_ptr<par::Communicator>> JoinGroup(TpComm kind, int32_t rank, int32_t size,
                                                     const std::string& host, uint16_t port,
                                                     std::chrono::milliseconds timeout) {
  if (kind == TpComm::kNccl) {
#if defined(CHUNKSERVE_HAVE_NCCL)
    const par::Deadline deadline = par::Deadline::After(timeout);
    CHUNKSERVE_ASSIGN_OR_RETURN(std::unique_ptr<par::TcpStoreClient> store,
                                par::TcpStoreClient::Connect(host, port, deadline));
    CHUNKSERVE_ASSIGN_OR_RETURN(std::vector<char> id,
                                par::ExchangeNcclUniqueId(store.get(), rank, "nccl_id", deadline));
    par::NcclOptions o;
    o.rank = rank;
    o.size = size;
    o.device = rank;
    o.unique_id = std::move(id);
    o.timeout = deadline.Remaining();
    CHUNKSERVE_ASSIGN_OR_RETURN(std::unique_ptr<par::NcclCommunicator> c,
                                par::NcclCommunicator::Create(o));
    return std::unique_ptr<par::Communicator>(std::move(c));
#else
    return Status::Unimplemented("this build has no NCCL");
#endif
  }
  par::GlooOptions gloo;
  gloo.rank = rank;
  gloo.size = size;
  gloo.store_host = host;
  gloo.store_port = port;
  gloo.hostname = host;
  gloo.timeout = timeout;
  CHUNKSERVE_ASSIGN_OR_RETURN(std::unique_ptr<par::GlooCommunicator> c,
                              par::GlooCommunicator::Create(gloo));
  return std::unique_ptr<par::Communicator>(std::move(c));
}

}  // namespace

Status ParseTpFlag(const std::string& flag, const std::string& value, TpGroupOptions* options) {
  long long n = 0;
  if (flag == "--tp") {
    if (!ParseIntFlag(value.c_str(), 1, 64, &n)) {
      return Status::InvalidArgument("--tp must be an integer in [1, 64], got '" + value + "'");
    }
    options->size = static_cast<int32_t>(n);
  } else if (flag == "--tp-rendezvous") {
    return par::ParseHostPort(value, &options->host, &options->port);
  } else if (flag == "--tp-comm") {
    if (value == "gloo") {
      options->comm = TpComm::kGloo;
    } else if (value == "nccl") {
#if defined(CHUNKSERVE_HAVE_NCCL)
      options->comm = TpComm::kNccl;
#else
      return Status::Unimplemented("--tp-comm nccl: this build has no NCCL");
#endif
    } else {
      return Status::InvalidArgument("--tp-comm must be gloo or nccl");
    }
  } else if (flag == "--tp-timeout-ms") {
    if (!ParseIntFlag(value.c_str(), 100, 86400000, &n)) {
      return Status::InvalidArgument("--tp-timeout-ms must be in [100, 86400000]");
    }
    options->timeout = std::chrono::milliseconds(n);
  } else {
    return Status::InvalidArgument("unknown tensor-parallel flag " + flag);
  }
  return Status::Ok();
}

Result<std::unique_ptr<TpGroup>> TpGroup::Start(const TpGroupOptions& options) {
  if (options.size < 2) return Status::InvalidArgument("a tensor-parallel group needs >= 2 ranks");
  auto state = std::make_shared<State>();
  state->options = options;
  const std::string binary = options.rank_binary.empty() ? SelfExe() : options.rank_binary;
  if (binary.empty()) return Status::Internal("cannot find this process's executable");
  CHUNKSERVE_ASSIGN_OR_RETURN(state->store, par::TcpStoreServer::Start(options.host, options.port));
  const std::string rendezvous = options.host + ":" + std::to_string(state->store->port());

  const pid_t parent = ::getpid();
  for (int32_t r = 1; r < options.size; ++r) {
    std::vector<std::string> args = {binary,
                                     "--tp-rank",
                                     std::to_string(r),
                                     "--tp-size",
                                     std::to_string(options.size),
                                     "--tp-rendezvous",
                                     rendezvous,
                                     "--tp-timeout-ms",
                                     std::to_string(options.timeout.count()),
                                     "--tp-parent-pid",
                                     std::to_string(parent),
                                     "--tp-comm",
                                     options.comm == TpComm::kNccl ? "nccl" : "gloo"};
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    const pid_t pid = ::fork();
    if (pid < 0) {
      for (pid_t p : state->pids) ::kill(p, SIGKILL);
      for (pid_t p : state->pids) ::waitpid(p, nullptr, 0);
      return Status::Unavailable(std::string("fork failed: ") + std::strerror(errno));
    }
    if (pid == 0) {
      // Only async-signal-safe calls between fork and exec. The rank dies with the thread that
      // forked it (this one: main, which lives as long as the worker).
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(1);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    state->pids.push_back(pid);
  }
  state->exited.assign(state->pids.size(), false);
  state->monitor = std::thread([s = state.get()] { s->Monitor(); });

  Result<std::unique_ptr<par::Communicator>> comm =
      JoinGroup(options.comm, 0, options.size, options.host, state->store->port(), options.timeout);
  std::unique_ptr<TpGroup> group(new TpGroup());
  group->state_ = state;  // the destructor reaps the children on every path from here
  if (!comm.ok()) return comm.status();
  state->comm = std::move(comm).value();
  return group;
}

TpGroup::~TpGroup() {
  if (!state_) return;
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->shutting_down = true;
  }
  state_->stop_monitor = true;
  if (state_->monitor.joinable()) state_->monitor.join();
  // Healthy ranks exit on the shutdown message; after a failure they can only wait for a
  // leader that is gone, so they are killed at once.
  const bool healthy = state_->comm != nullptr && state_->comm->health().ok();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(healthy ? 5 : 0);
  for (size_t i = 0; i < state_->pids.size(); ++i) {
    if (state_->exited[i]) continue;
    while (::waitpid(state_->pids[i], nullptr, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > deadline) {
        ::kill(state_->pids[i], SIGKILL);
        ::waitpid(state_->pids[i], nullptr, 0);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  // The communicator and the store go with the state, which a still-living engine runner
  // shares: destroying the group first is a misuse that must not leave it a dangling pointer.
}

engine::RunnerFactory TpGroup::RunnerFactory() {
  std::shared_ptr<State> state = state_;
  return [state](const model::LoadedModel& model, const forward::RunnerOptions& options)
             -> Result<std::unique_ptr<forward::StepRunner>> {
    // Gloo ranks reduce host memory (CPU backend), NCCL ranks device memory (CUDA backend).
    const bool gpu_ranks = state->options.comm == TpComm::kNccl;
    if (gpu_ranks != (options.backend == forward::BackendKind::kCuda)) {
      return Status::InvalidArgument(
          gpu_ranks ? "NCCL ranks are GPU ranks: the engine needs the CUDA backend"
                    : "the CUDA backend's ranks reduce over NCCL (--tp-comm nccl)");
    }
    par::TpOptions tp;
    tp.op_timeout = state->options.timeout;
    tp.heartbeat_interval = state->options.heartbeat;
    CHUNKSERVE_ASSIGN_OR_RETURN(std::unique_ptr<par::TpLeaderRunner> leader,
                                par::TpLeaderRunner::Create(model, options, state->comm.get(), tp));
    std::lock_guard<std::mutex> lock(state->mu);
    if (state->on_failure) leader->SetFailureCallback(state->on_failure);
    // Reported while there was no leader yet (an early rank exit): the leader starts failed.
    if (!state->comm->health().ok()) leader->Fail(state->comm->health());
    state->leader = leader.get();
    return std::unique_ptr<forward::StepRunner>(
        std::make_unique<GroupRunner>(state, std::move(leader)));
  };
}

void TpGroup::SetFailureCallback(std::function<void(const Status&)> callback) {
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->on_failure = callback;
  if (state_->leader != nullptr) state_->leader->SetFailureCallback(std::move(callback));
}

std::vector<pid_t> TpGroup::rank_pids() const { return state_->pids; }

bool MaybeRunTpRank(int argc, char** argv, int* exit_code) {
  bool is_rank = false;
  for (int i = 1; i < argc; ++i) is_rank |= std::strcmp(argv[i], "--tp-rank") == 0;
  if (!is_rank) return false;
  *exit_code = 2;
  long long rank = -1, size = 0, timeout_ms = 30000, parent = 0;
  std::string rendezvous;
  TpComm kind = TpComm::kGloo;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const char* value = argv[i + 1];
    bool ok = true;
    if (flag == "--tp-rank") {
      ok = ParseIntFlag(value, 1, 63, &rank);
    } else if (flag == "--tp-size") {
      ok = ParseIntFlag(value, 2, 64, &size);
    } else if (flag == "--tp-rendezvous") {
      rendezvous = value;
    } else if (flag == "--tp-timeout-ms") {
      ok = ParseIntFlag(value, 1, 86400000, &timeout_ms);
    } else if (flag == "--tp-parent-pid") {
      ok = ParseIntFlag(value, 1, 1ll << 31, &parent);
    } else if (flag == "--tp-comm") {
      TpGroupOptions o;
      ok = ParseTpFlag(flag, value, &o).ok();
      kind = o.comm;
    } else {
      ok = false;
    }
    if (!ok) {
      std::fprintf(stderr, "chunkserve tp rank: bad flag %s %s\n", flag.c_str(), value);
      return true;
    }
  }
  std::string host;
  uint16_t port = 0;
  if (rank < 1 || rank >= size || !par::ParseHostPort(rendezvous, &host, &port).ok()) {
    std::fprintf(stderr,
                 "chunkserve tp rank: needs --tp-rank r --tp-size N --tp-rendezvous "
                 "HOST:PORT with 1 <= r < N\n");
    return true;
  }
  // This is the rank process's main: a dead peer must be an error, not SIGPIPE (the communicator
  // also blocks it per thread). Started by hand or not, die with the parent.
  ::signal(SIGPIPE, SIG_IGN);
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (parent != 0 && ::getppid() != static_cast<pid_t>(parent)) {
    *exit_code = 1;
    return true;
  }
  InitLogging();
  Result<std::unique_ptr<par::Communicator>> comm =
      JoinGroup(kind, static_cast<int32_t>(rank), static_cast<int32_t>(size), host, port,
                std::chrono::milliseconds(timeout_ms));
  Status s = comm.status();
  // Rank 0 loads its model before it sends the init message: allow it several timeouts.
  if (s.ok()) s = par::RunTpFollower(comm.value().get(), std::chrono::milliseconds(timeout_ms) * 4);
  if (!s.ok()) {
    std::fprintf(stderr, "chunkserve tp rank %lld: %s\n", rank, s.ToString().c_str());
    *exit_code = 1;
    return true;
  }
  *exit_code = 0;
  return true;
}

}  // namespace chunkserve::worker
