#include "tests/worker/worker_process.h"

namespace chunkserve::worker::testing {

Result<std::unique_ptr<WorkerProcess>> WorkerProcess::Start(const std::vector<std::string>& args) {
  std::unique_ptr<WorkerProcess> p(new WorkerProcess());
  CHUNKSERVE_RETURN_IF_ERROR(p->Launch(CHUNKSERVE_WORKER_BIN, "worker", args));
  return p;
}

}  // namespace chunkserve::worker::testing
