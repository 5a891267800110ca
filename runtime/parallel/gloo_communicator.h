// GlooCommunicator: the Communicator of CPU ranks, on Gloo's TCP transport.
//
// Rendezvous: rank 0 hosts a TcpStoreServer; every rank connects to it with a TcpStoreClient,
// publishes its transport address and connects a full mesh (gloo::rendezvous::Context::
// connectFullMesh). Each operation runs Gloo's algorithm with the operation's deadline as its
// Gloo timeout (all-reduce: ring reduce-scatter + all-gather, so every rank receives the same
// bits). Gloo reports failures by throwing (gloo::IoException for a lost peer, a timeout
// exception past the deadline, EnforceNotMet for broken invariants): every exception is caught
// here and becomes the Status that breaks the communicator; none escapes.
//
// Gloo writes without MSG_NOSIGNAL; SIGPIPE is blocked (per thread, never process-wide) in every
// thread that talks to Gloo, so a dead peer is an error, not the end of this process.
//
// Abort() marks the communicator broken; an operation in flight ends when Gloo notices the lost
// peer (a killed process closes its sockets: immediately) or at its deadline.
//
// Thread safety: as Communicator.
#ifndef CHUNKSERVE_RUNTIME_PARALLEL_GLOO_COMMUNICATOR_H_
#define CHUNKSERVE_RUNTIME_PARALLEL_GLOO_COMMUNICATOR_H_

#include <chrono>
#include <memory>
#include <mutex>
#include <string>

#include "runtime/parallel/communicator.h"

namespace gloo {
class Context;
}  // namespace gloo

namespace chunkserve::parallel {

struct GlooOptions {
  int32_t rank = 0;
  int32_t size = 1;
  // The rendezvous store (a TcpStoreServer, normally in rank 0's process).
  std::string store_host = "127.0.0.1";
  uint16_t store_port = 0;
  // Where this rank accepts its peers' connections: an address or host name of this machine
  // (127.0.0.1 for ranks on one machine) or, when `iface` is set, a network interface (eth0).
  std::string hostname = "127.0.0.1";
  std::string iface;
  // Key namespace in the store, so one store can serve several groups.
  std::string prefix = "tp";
  // Deadline for the whole rendezvous (every rank must arrive within it).
  std::chrono::milliseconds timeout{30000};
};

class GlooCommunicator final : public Communicator {
 public:
  // InvalidArgument for bad ranks; Unavailable / DeadlineExceeded when the rendezvous fails.
  static Result<std::unique_ptr<GlooCommunicator>> Create(const GlooOptions& options);
  ~GlooCommunicator() override;

  int32_t rank() const override { return rank_; }
  int32_t size() const override { return size_; }
  std::string name() const override { return "gloo"; }
  Status AllReduceSum(std::span<float> data, Deadline deadline) override;
  Status Broadcast(std::span<std::byte> data, int32_t root, Deadline deadline) override;
  Status Barrier(Deadline deadline) override;
  void Abort(const Status& reason) override;
  Status health() const override;

 private:
  GlooCommunicator(int32_t rank, int32_t size) : rank_(rank), size_(size) {}
  // Runs `op` under the operation lock with exceptions turned into a broken communicator.
  template <typename Op>
  Status Run(const char* what, Deadline deadline, Op&& op);

  const int32_t rank_;
  const int32_t size_;
  std::shared_ptr<gloo::Context> context_;
  std::mutex op_mu_;             // one operation at a time
  mutable std::mutex state_mu_;  // guards broken_
  Status broken_;
};

}  // namespace chunkserve::parallel

#endif  // CHUNKSERVE_RUNTIME_PARALLEL_GLOO_COMMUNICATOR_H_
