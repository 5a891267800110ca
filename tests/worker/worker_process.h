// Test helper: a chunkserve-worker child process on 127.0.0.1 with ephemeral ports (see
// tests/testing/server_process.h), and the HTTP probe helper.
#ifndef CHUNKSERVE_TESTS_WORKER_WORKER_PROCESS_H_
#define CHUNKSERVE_TESTS_WORKER_WORKER_PROCESS_H_

#include <memory>
#include <string>
#include <vector>

#include "runtime/base/status.h"
#include "tests/testing/server_process.h"

namespace chunkserve::worker::testing {

using ::chunkserve::testing::HttpGet;
using ::chunkserve::testing::HttpResponse;

class WorkerProcess : public ::chunkserve::testing::ServerProcess {
 public:
  // Starts chunkserve-worker with `args` plus --listen/--http on 127.0.0.1:0 (and --tiny-model
  // unless `args` name --model or --tiny-model) and waits (deadline) for it to print its ports.
  static Result<std::unique_ptr<WorkerProcess>> Start(const std::vector<std::string>& args);
  // The chunkserve-worker binary of this build.
  static std::string Binary();
};

}  // namespace chunkserve::worker::testing

#endif  // CHUNKSERVE_TESTS_WORKER_WORKER_PROCESS_H_
