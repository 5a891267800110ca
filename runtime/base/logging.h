// Logging set-up over glog.
//
// Library code logs with glog's LOG/VLOG macros and never configures logging itself beyond the
// idempotent InitLogging below. In particular library code never installs signal handlers:
// a process embedding libchunkserve (a Go or Rust program) owns its signals. Executables that want
// glog's crash trace call InstallCrashHandlerForExecutable() from main() explicitly.
//
// LOG(FATAL) and CHECK are for broken invariants only; input errors are Status values.
#ifndef CHUNKSERVE_RUNTIME_BASE_LOGGING_H_
#define CHUNKSERVE_RUNTIME_BASE_LOGGING_H_

#include <glog/logging.h>

#include <functional>
#include <string>

namespace chunkserve {

struct LoggingOptions {
  std::string program_name = "chunkserve";
  int min_level = 0;      // glog severity: 0 INFO, 1 WARNING, 2 ERROR
  int verbosity = 0;      // VLOG level
  bool to_stderr = true;  // log to stderr rather than files
};

// Initializes glog once per process; later calls only adjust levels. Thread-safe. Does not touch
// signal handlers. Safe to call when the embedding program initialized glog itself.
void InitLogging(const LoggingOptions& options = {});

// Sends every log message to `sink` (severity 0 INFO, 1 WARNING, 2 ERROR, 3 FATAL; the text is
// "file.cc:123: message") instead of stderr; an empty function restores stderr. Process-wide, as
// glog is. The sink is called on the logging thread, possibly concurrently, and must not log
// itself. Thread-safe.
using LogSinkFunction = std::function<void(int severity, const std::string& text)>;
void SetLogSink(LogSinkFunction sink);

// For main() of chunkserve executables only: installs glog's failure signal handler so a crash
// prints a stack trace. Never called from library code.
void InstallCrashHandlerForExecutable();

}  // namespace chunkserve

#endif  // CHUNKSERVE_RUNTIME_BASE_LOGGING_H_
