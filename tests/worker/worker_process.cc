#include "tests/worker/worker_process.h"

#include <algorithm>
#include <string>
#include <vector>

namespace chunkserve::worker::testing {

std::string WorkerProcess::Binary() { return CHUNKSERVE_WORKER_BIN; }

Result<std::unique_ptr<WorkerProcess>> WorkerProcess::Start(const std::vector<std::string>& args) {
  std::unique_ptr<WorkerProcess> p(new WorkerProcess());
  // The built-in tiny model unless the test names a model (a worker needs one or the other).
  std::vector<std::string> argv = args;
  if (std::find(args.begin(), args.end(), "--model") == args.end() &&
      std::find(args.begin(), args.end(), "--tiny-model") == args.end()) {
    argv.insert(argv.begin(), "--tiny-model");
  }
  CHUNKSERVE_RETURN_IF_ERROR(p->Launch(CHUNKSERVE_WORKER_BIN, "worker", argv));
  return p;
}

}  // namespace chunkserve::worker::testing
