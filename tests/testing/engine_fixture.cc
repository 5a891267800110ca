#include "tests/testing/engine_fixture.h"

#include "runtime/model/tiny_model.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/tiny_models.h"

namespace chunkserve::testing {

StreamOutcome Drain(sched::RequestStream& stream, std::chrono::seconds deadline) {
  using sched::RequestStream;
  using sched::StreamEvent;
  StreamOutcome out;
  const auto give_up = std::chrono::steady_clock::now() + deadline;
  StreamEvent e;
  while (std::chrono::steady_clock::now() < give_up) {
    const RequestStream::NextResult r = stream.Next(&e, std::chrono::milliseconds(100));
    if (r == RequestStream::NextResult::kEnded) {
      out.ended = true;
      EXPECT_EQ(out.terminal_events, 1) << "a stream ended without exactly one terminal event";
      return out;
    }
    if (r == RequestStream::NextResult::kTimeout) continue;
    if (e.kind == StreamEvent::Kind::kToken) {
      EXPECT_EQ(e.index, static_cast<int32_t>(out.tokens.size()));
      out.tokens.push_back(e.token);
      out.logprobs.push_back(e.logprobs);
    } else {
      out.finish = e.finish;
      ++out.terminal_events;
    }
  }
  ADD_FAILURE() << "a request did not end within " << deadline.count() << " s";
  return out;
}

std::vector<StreamOutcome> RunEachAlone(const engine::EngineOptions& options,
                                        const std::vector<sched::RequestOptions>& requests,
                                        std::chrono::seconds deadline) {
  std::vector<StreamOutcome> out(requests.size());
  auto engine = engine::Engine::Create(options);
  EXPECT_OK(engine.status());
  if (!engine.ok()) return out;
  for (size_t i = 0; i < requests.size(); ++i) {
    auto stream = (*engine)->Submit(requests[i]);
    EXPECT_OK(stream.status()) << "request " << i;
    if (stream.ok()) out[i] = Drain(**stream, deadline);
  }
  (*engine)->Shutdown(engine::ShutdownMode::kDrain);
  return out;
}

void TinyModelEngineTest::SetUp() {
  ASSERT_OK(model::WriteTinyModel(dir_.path(), SmallTestModel(model_seed_)));
}

engine::EngineOptions TinyModelEngineTest::Options() const {
  engine::EngineOptions o;
  o.model_dir = dir_.path().string();
  o.chunk_size = 16;
  o.kv_cache_bytes = 8u << 20;
  o.num_threads = 2;
  return o;
}

}  // namespace chunkserve::testing
