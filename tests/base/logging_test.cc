#include "runtime/base/logging.h"

#include <gtest/gtest.h>

#include <csignal>

namespace chunkserve {
namespace {

// Library code must leave the embedding program's signal handlers alone.
TEST(LoggingTest, InitLoggingInstallsNoSignalHandlers) {
  struct sigaction before {};
  sigaction(SIGSEGV, nullptr, &before);
  InitLogging({.program_name = "logging_test", .min_level = 0, .verbosity = 1});
  InitLogging({.program_name = "again", .min_level = 1});  // idempotent
  struct sigaction after {};
  sigaction(SIGSEGV, nullptr, &after);
  EXPECT_EQ(before.sa_handler, after.sa_handler);
  EXPECT_TRUE(google::IsGoogleLoggingInitialized());
  EXPECT_EQ(FLAGS_minloglevel, 1);
}

}  // namespace
}  // namespace chunkserve
