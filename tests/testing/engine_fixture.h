// What the engine tests share: a tiny model on disk with the engine options that fit it, and
// Drain, which pulls a request's stream to its end under a deadline.
//
// TinyModelEngineTest writes SmallTestModel(seed) (tiny_models.h) to a scratch directory in
// SetUp; Options() gives an engine on it with 16-token chunks, 8 MiB of KV (1024 slots of 8 KiB
// for this model) and 2 threads; tests set anything else themselves.
//
// RunEachAlone gives the reference the worker tests compare a worker's streams with.
//
// Drain checks what every stream promises (token indices 0, 1, 2, ..., exactly one terminal
// event) and turns a stream that does not end within the deadline into a test failure, so a hang
// fails the test instead of blocking ctest.
#ifndef CHUNKSERVE_TESTS_TESTING_ENGINE_FIXTURE_H_
#define CHUNKSERVE_TESTS_TESTING_ENGINE_FIXTURE_H_

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <vector>

#include "runtime/engine/engine.h"
#include "runtime/sched/stream.h"
#include "tests/testing/temp_dir.h"

namespace chunkserve::testing {

// What one request's stream delivered.
struct StreamOutcome {
  std::vector<TokenId> tokens;
  std::vector<std::optional<TokenLogprobs>> logprobs;  // one per token
  sched::FinishInfo finish;
  int terminal_events = 0;
  bool ended = false;  // false: the deadline passed first (already reported as a failure)
};

StreamOutcome Drain(sched::RequestStream& stream,
                    std::chrono::seconds deadline = std::chrono::seconds(60));

// Runs each request alone (one at a time, in order) on one engine created from `options`, then
// drains it: what each request streams when nothing else runs. A Create or Submit error is a test
// failure and leaves that outcome empty.
std::vector<StreamOutcome> RunEachAlone(const engine::EngineOptions& options,
                                        const std::vector<sched::RequestOptions>& requests,
                                        std::chrono::seconds deadline = std::chrono::seconds(60));

class TinyModelEngineTest : public ::testing::Test {
 protected:
  explicit TinyModelEngineTest(uint64_t model_seed = 7) : model_seed_(model_seed) {}

  void SetUp() override;

  // model_dir = the tiny model, chunk_size 16, kv_cache_bytes 8 MiB, num_threads 2.
  engine::EngineOptions Options() const;

  const std::filesystem::path& model_dir() const { return dir_.path(); }

 private:
  uint64_t model_seed_;
  TempDir dir_;
};

}  // namespace chunkserve::testing

#endif  // CHUNKSERVE_TESTS_TESTING_ENGINE_FIXTURE_H_
