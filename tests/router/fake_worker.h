// FakeWorker: a scripted worker for router tests that must say exactly what a worker reports and
// when it answers. It speaks the real wire protocol over real sockets: a control link to the
// router (Register, KvEvents, LoadReport) and a listener the router's data link connects to
// (Generate in; Token and Finish out). A real worker (WorkerProcess) reports what its engine
// measured, which a test cannot pin to a number; this one reports what the test tells it to.
//
//   ASSIGN_OR_RETURN(auto w, FakeWorker::Register(router->port(), {.name = "w0"}));
//   RETURN_IF_ERROR(w->SendKvSnapshot(prefix));             // holds prefix's full chunks
//   RETURN_IF_ERROR(w->SendLoadReport({.queued_prefill_tokens = 1000}));
//   ASSIGN_OR_RETURN(wire::GenerateMessage g, w->NextGenerate(30s));
//   RETURN_IF_ERROR(w->SendToken(g.request_id, 7, 0));
//
// It sends nothing unasked (no keepalive Ping, no periodic LoadReport), so the router under test
// needs a lease, link idle timeout and stall timeout longer than the test (--lease-ms,
// --link-idle-timeout-ms, --stall-timeout-ms 0). The router's Pings on the data link are answered.
//
// Thread safety: one test thread drives it; the data link runs on an internal thread.
#ifndef CHUNKSERVE_TESTS_ROUTER_FAKE_WORKER_H_
#define CHUNKSERVE_TESTS_ROUTER_FAKE_WORKER_H_

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "runtime/base/ids.h"
#include "runtime/base/status.h"
#include "runtime/wire/asio.h"
#include "runtime/wire/client.h"
#include "runtime/wire/client_protocol.h"
#include "runtime/wire/connection.h"

namespace chunkserve::router::testing {

class FakeWorker {
 public:
  struct Options {
    std::string name = "fake";
    uint64_t model_fingerprint = 0x5eed5eed;
    int32_t chunk_size = 64;
    int32_t capacity_tokens = 1 << 20;
    int32_t max_batch_size = 8;
  };
  // The LoadReport fields a test sets; engineProgress advances by one with every report, so the
  // router's liveness check never sees this worker as frozen.
  struct Load {
    uint64_t queued_prefill_tokens = 0;
    int32_t running_sequences = 0;
    int32_t queued_requests = 0;
    double prefill_tokens_per_s = 10000;
  };

  // Registers with the router at 127.0.0.1:router_port and returns once it accepted (its
  // RegisterAck came after it connected the data link). Unavailable / FailedPrecondition when
  // the router cannot be reached or refuses.
  static Result<std::unique_ptr<FakeWorker>> Register(uint16_t router_port, Options options);
  ~FakeWorker();
  FakeWorker(const FakeWorker&) = delete;
  FakeWorker& operator=(const FakeWorker&) = delete;

  // The chained hashes of `tokens`' full chunks as the router computes them for this model.
  std::vector<uint64_t> ChunkHashes(const std::vector<TokenId>& tokens) const;
  // A KvEvents snapshot: this worker holds exactly the full chunks of `tokens`.
  Status SendKvSnapshot(const std::vector<TokenId>& tokens);
  Status SendLoadReport(const Load& load);

  // The next Generate the router sent on the data link; DeadlineExceeded after `timeout`.
  Result<wire::GenerateMessage> NextGenerate(std::chrono::milliseconds timeout);
  Status SendToken(uint64_t request_id, TokenId token, int32_t index);
  Status SendFinish(const wire::FinishMessage& finish);

 private:
  static constexpr std::chrono::milliseconds kTimeout{30000};  // connect and registration
  explicit FakeWorker(Options options);

  const Options options_;
  const uint64_t generation_;
  uint64_t seed_ = 0;
  uint64_t kv_sequence_ = 0;
  uint64_t progress_ = 0;
  std::unique_ptr<wire::WireClient> control_;

  asio::io_context io_;
  asio::ip::tcp::acceptor acceptor_{io_};
  std::thread loop_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::shared_ptr<wire::Connection> data_;       // guarded by mu_
  std::deque<wire::GenerateMessage> generates_;  // guarded by mu_
};

}  // namespace chunkserve::router::testing

#endif  // CHUNKSERVE_TESTS_ROUTER_FAKE_WORKER_H_
