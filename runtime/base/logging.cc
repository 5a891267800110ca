#include "runtime/base/logging.h"

#include <memory>
#include <mutex>
#include <shared_mutex>
#include <utility>

namespace chunkserve {
namespace {

std::mutex& InitMutex() {
  static std::mutex mu;
  return mu;
}

// The embedder's sink, when set (SetLogSink). Guarded by SinkMutex(); read on every message.
class ForwardingSink final : public google::LogSink {
 public:
  void send(google::LogSeverity severity, const char* /*full_filename*/,
            const char* base_filename, int line, const google::LogMessageTime& /*time*/,
            const char* message, size_t message_len) override {
    std::shared_lock<std::shared_mutex> lock(mu_);
    if (!sink_) return;
    std::string text = std::string(base_filename) + ":" + std::to_string(line) + ": ";
    text.append(message, message_len);
    try {
      sink_(static_cast<int>(severity), text);
    } catch (...) {
      // An embedder's sink must not take the logging thread down.
    }
  }
  void Set(LogSinkFunction sink) {
    std::unique_lock<std::shared_mutex> lock(mu_);
    sink_ = std::move(sink);
  }
  bool active() {
    std::shared_lock<std::shared_mutex> lock(mu_);
    return static_cast<bool>(sink_);
  }

 private:
  std::shared_mutex mu_;
  LogSinkFunction sink_;
};

ForwardingSink& Forwarder() {
  static ForwardingSink* sink = new ForwardingSink();  // never destroyed: glog may outlive us
  return *sink;
}

// Where glog writes when no sink is set: stderr (the default) or, with a sink, nowhere else.
void ApplyOutput(bool to_stderr) {
  if (Forwarder().active()) {
    FLAGS_logtostderr = false;
    FLAGS_alsologtostderr = false;
    FLAGS_stderrthreshold = google::NUM_SEVERITIES;  // nothing to stderr
    for (int s = 0; s < google::NUM_SEVERITIES; ++s) {
      google::SetLogDestination(static_cast<google::LogSeverity>(s), "");  // no log files
    }
  } else {
    FLAGS_logtostderr = to_stderr;
    FLAGS_stderrthreshold = google::GLOG_ERROR;
  }
}

bool g_to_stderr = true;  // guarded by InitMutex(): the last InitLogging's choice

}  // namespace

void InitLogging(const LoggingOptions& options) {
  std::lock_guard<std::mutex> lock(InitMutex());
  // The embedding program may own glog already; initializing twice would be fatal in glog.
  if (!google::IsGoogleLoggingInitialized()) {
    // glog keeps the pointer, so the name must outlive the process' logging.
    static const std::string* name = new std::string(options.program_name);
    google::InitGoogleLogging(name->c_str());
  }
  g_to_stderr = options.to_stderr;
  ApplyOutput(g_to_stderr);
  FLAGS_minloglevel = options.min_level;
  FLAGS_v = options.verbosity;
}

void SetLogSink(LogSinkFunction sink) {
  std::lock_guard<std::mutex> lock(InitMutex());
  if (!google::IsGoogleLoggingInitialized()) {
    static const std::string* name = new std::string("chunkserve");
    google::InitGoogleLogging(name->c_str());
  }
  static bool added = false;
  if (!added) {
    google::AddLogSink(&Forwarder());
    added = true;
  }
  Forwarder().Set(std::move(sink));
  ApplyOutput(g_to_stderr);
}

void InstallCrashHandlerForExecutable() { google::InstallFailureSignalHandler(); }

}  // namespace chunkserve
