#include "runtime/parallel/gloo_communicator.h"

#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>

#include <pthread.h>
#include <signal.h>

#include <exception>
#include <string>
#include <utility>
#include <vector>

#include "runtime/parallel/tcp_store.h"

namespace chunkserve::parallel {
namespace {

// Gloo's view of our TcpStoreClient. Gloo expects a store to throw on failure; the exception
// carries our Status message and is caught in Create.
class GlooStore final : public gloo::rendezvous::Store {
 public:
  GlooStore(TcpStoreClient* client, std::string prefix, Deadline deadline)
      : client_(client), prefix_(std::move(prefix)), deadline_(deadline) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    Check(client_->Set(prefix_ + "/" + key, data, deadline_));
  }
  std::vector<char> get(const std::string& key) override {
    Result<std::vector<char>> v = client_->Get(prefix_ + "/" + key, deadline_);
    Check(v.status());
    return std::move(v).value();
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, deadline_.Remaining()); }
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    const Deadline d{std::min(deadline_.at, Clock::now() + timeout)};
    for (const std::string& k : keys) Check(client_->Get(prefix_ + "/" + k, d).status());
  }

 private:
  static void Check(const Status& s) {
    if (!s.ok()) throw gloo::IoException(s.ToString());
  }
  TcpStoreClient* client_;
  std::string prefix_;
  Deadline deadline_;
};

// Gloo writes to its sockets without MSG_NOSIGNAL, so a write to a peer that just died raises
// SIGPIPE, whose default action kills the whole process (the worker, when one rank dies). A
// library must not change process-wide signal dispositions, so SIGPIPE is blocked in the threads
// that talk to Gloo instead: the device's event-loop thread inherits the mask of the thread that
// creates it (Create runs under this guard), and every operation blocks it on its own thread,
// then consumes any SIGPIPE it raised (the write already reported EPIPE to Gloo) before
// restoring the mask.
class ScopedSigpipeBlock {
 public:
  ScopedSigpipeBlock() {
    sigset_t set = Set();
    pthread_sigmask(SIG_BLOCK, &set, &old_);
  }
  ~ScopedSigpipeBlock() {
    sigset_t set = Set();
    const timespec zero{0, 0};
    while (sigtimedwait(&set, nullptr, &zero) > 0) {
    }
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }
  ScopedSigpipeBlock(const ScopedSigpipeBlock&) = delete;
  ScopedSigpipeBlock& operator=(const ScopedSigpipeBlock&) = delete;

 private:
  static sigset_t Set() {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGPIPE);
    return set;
  }
  sigset_t old_;
};

// Gloo names its timeouts in the message; everything else is a lost or failed peer.
Status FromGlooException(const char* what, const std::exception& e) {
  const std::string msg = std::string("gloo ") + what + " failed: " + e.what();
  if (msg.find("imed out") != std::string::npos || msg.find("imeout") != std::string::npos) {
    return Status::DeadlineExceeded(msg);
  }
  return Status::Unavailable(msg);
}

}  // namespace

Result<std::unique_ptr<GlooCommunicator>> GlooCommunicator::Create(const GlooOptions& options) {
  if (options.size < 1 || options.rank < 0 || options.rank >= options.size) {
    return Status::InvalidArgument("gloo: rank " + std::to_string(options.rank) +
                                   " outside a group of " + std::to_string(options.size));
  }
  const Deadline deadline = Deadline::After(options.timeout);
  std::unique_ptr<GlooCommunicator> comm(new GlooCommunicator(options.rank, options.size));
  CHUNKSERVE_ASSIGN_OR_RETURN(
      std::unique_ptr<TcpStoreClient> client,
      TcpStoreClient::Connect(options.store_host, options.store_port, deadline));
  const ScopedSigpipeBlock no_sigpipe;
  try {
    gloo::transport::tcp::attr attr;
    if (options.iface.empty()) {
      attr.hostname = options.hostname;
    } else {
      attr.iface = options.iface;
    }
    auto device = gloo::transport::tcp::CreateDevice(attr);
    auto context = std::make_shared<gloo::rendezvous::Context>(options.rank, options.size);
    context->setTimeout(deadline.Remaining());
    GlooStore store(client.get(), options.prefix, deadline);
    context->connectFullMesh(store, device);
    comm->context_ = std::move(context);
  } catch (const std::exception& e) {
    Status s = FromGlooException("rendezvous", e);
    return Status(s.code(), std::string(s.message()) + " (rank " + std::to_string(options.rank) +
                                " of " + std::to_string(options.size) + ", store " +
                                options.store_host + ":" + std::to_string(options.store_port) +
                                ")");
  }
  return comm;
}

GlooCommunicator::~GlooCommunicator() {
  const ScopedSigpipeBlock no_sigpipe;  // closing the pairs may still write
  context_.reset();
}

template <typename Op>
Status GlooCommunicator::Run(const char* what, Deadline deadline, Op&& op) {
  std::lock_guard<std::mutex> lock(op_mu_);
  {
    std::lock_guard<std::mutex> state(state_mu_);
    if (!broken_.ok()) return broken_;
  }
  if (deadline.Passed()) {
    const Status s = Status::DeadlineExceeded(std::string("gloo ") + what +
                                              ": deadline passed before the operation started");
    Abort(s);
    return s;
  }
  const ScopedSigpipeBlock no_sigpipe;
  try {
    op(deadline.Remaining());
    return Status::Ok();
  } catch (const std::exception& e) {
    const Status s = FromGlooException(what, e);
    Abort(s);
    return health();
  }
}

Status GlooCommunicator::AllReduceSum(std::span<float> data, Deadline deadline) {
  if (data.empty()) return health();
  return Run("all-reduce", deadline, [&](std::chrono::milliseconds timeout) {
    gloo::AllreduceOptions opts(context_);
    opts.setOutput(data.data(), data.size());
    opts.setReduceFunction(
        static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
    opts.setTimeout(timeout);
    gloo::allreduce(opts);
  });
}

Status GlooCommunicator::Broadcast(std::span<std::byte> data, int32_t root, Deadline deadline) {
  if (root < 0 || root >= size_) return Status::InvalidArgument("gloo broadcast: bad root");
  if (data.empty()) return health();
  return Run("broadcast", deadline, [&](std::chrono::milliseconds timeout) {
    gloo::BroadcastOptions opts(context_);
    auto* bytes = reinterpret_cast<uint8_t*>(data.data());
    if (rank_ == root) opts.setInput(bytes, data.size());
    opts.setOutput(bytes, data.size());
    opts.setRoot(root);
    opts.setTimeout(timeout);
    gloo::broadcast(opts);
  });
}

Status GlooCommunicator::Barrier(Deadline deadline) {
  return Run("barrier", deadline, [&](std::chrono::milliseconds timeout) {
    gloo::BarrierOptions opts(context_);
    opts.setTimeout(timeout);
    gloo::barrier(opts);
  });
}

void GlooCommunicator::Abort(const Status& reason) {
  std::lock_guard<std::mutex> state(state_mu_);
  if (broken_.ok()) {
    broken_ = reason.ok() ? Status::Aborted("gloo communicator aborted") : reason;
  }
}

Status GlooCommunicator::health() const {
  std::lock_guard<std::mutex> state(state_mu_);
  return broken_;
}

}  // namespace chunkserve::parallel
