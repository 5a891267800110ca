#include "runtime/base/logging.h"

#include <mutex>

namespace chunkserve {

void InitLogging(const LoggingOptions& options) {
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  // The embedding program may own glog already; initializing twice would be fatal in glog.
  if (!google::IsGoogleLoggingInitialized()) {
    // glog keeps the pointer, so the name must outlive the process' logging.
    static const std::string* name = new std::string(options.program_name);
    google::InitGoogleLogging(name->c_str());
  }
  FLAGS_logtostderr = options.to_stderr;
  FLAGS_minloglevel = options.min_level;
  FLAGS_v = options.verbosity;
}

void InstallCrashHandlerForExecutable() { google::InstallFailureSignalHandler(); }

}  // namespace chunkserve
