// Engine::Submit's queue limit at its exact boundary. The worker's overload test only checks that
// some requests are refused, which an off-by-one limit passes too.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "runtime/engine/engine.h"
#include "tests/testing/status_matchers.h"

namespace chunkserve::engine {
namespace {

using namespace std::chrono_literals;
using ::chunkserve::testing::StatusIs;
using sched::RequestOptions;
using sched::RequestStream;
using sched::StreamEvent;

RequestOptions Prompt(int32_t max_new_tokens) {
  RequestOptions r;
  r.prompt = {1, 2, 3};
  r.max_new_tokens = max_new_tokens;
  return r;
}

// With one batch slot taken by a long request, max_queued_requests = 2 admits two waiting
// requests and refuses the third, retryably. Kills the mutation engine-queue-limit-off-by-one.
TEST(EngineQueueLimitTest, TheLimitIsTheNumberOfWaitingRequests) {
  EngineOptions o;
  o.tiny_model = true;
  o.num_threads = 1;
  o.max_batch_size = 1;
  o.max_queued_requests = 2;
  ASSERT_OK_AND_ASSIGN(auto engine, Engine::Create(o));

  // Occupies the only batch slot for thousands of steps; cancelled at the end.
  ASSERT_OK_AND_ASSIGN(auto busy, engine->Submit(Prompt(8000)));
  StreamEvent e;
  ASSERT_EQ(busy->Next(&e, 60s), RequestStream::NextResult::kEvent);  // running

  ASSERT_OK_AND_ASSIGN(auto first, engine->Submit(Prompt(2)));
  ASSERT_OK_AND_ASSIGN(auto second, engine->Submit(Prompt(2)));
  // Poll, not sleep: the count is exact once the step thread has moved both into its queue.
  const auto give_up = std::chrono::steady_clock::now() + 60s;
  while (engine->Stats().queued != 2 && std::chrono::steady_clock::now() < give_up) {
    std::this_thread::sleep_for(1ms);
  }
  ASSERT_EQ(engine->Stats().queued, 2);
  EXPECT_THAT(engine->Submit(Prompt(2)).status(), StatusIs(StatusCode::kResourceExhausted));

  // Freeing the slot lets the queue drain: the two waiting requests run to completion.
  ASSERT_OK(engine->Cancel(busy->id()));
  for (const auto& s : {first, second}) {
    int tokens = 0;
    bool finished = false;
    while (!finished && s->Next(&e, 60s) == RequestStream::NextResult::kEvent) {
      if (e.kind == StreamEvent::Kind::kToken) ++tokens;
      finished = e.kind == StreamEvent::Kind::kFinished;
    }
    EXPECT_TRUE(finished);
    EXPECT_EQ(tokens, 2);
  }
  engine->Shutdown(ShutdownMode::kAbort);
}

}  // namespace
}  // namespace chunkserve::engine
