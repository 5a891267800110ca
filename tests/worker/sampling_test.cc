// A sampled request through chunkserve-worker streams exactly the tokens the in-process engine
// samples with the same temperature, top_k, top_p and seed: the worker must carry every sampling
// field from the wire into the engine (the other worker tests are greedy, where none matter).
#include <capnp/message.h>
#include <gtest/gtest.h>

#include <chrono>
#include <initializer_list>
#include <vector>

#include "runtime/engine/engine.h"
#include "runtime/wire/client.h"
#include "tests/testing/engine_fixture.h"
#include "tests/testing/status_matchers.h"
#include "tests/worker/worker_process.h"

namespace chunkserve::worker {
namespace {

using namespace std::chrono_literals;
using testing::WorkerProcess;
using wire::DecodedMessage;
using wire::WireClient;
using wire::schema::Envelope;

struct Sampling {
  float temperature;
  int32_t top_k;
  float top_p;
  uint64_t seed;
};

constexpr int32_t kMaxNew = 24;

std::vector<uint32_t> SampledPrompt() {
  std::vector<uint32_t> p;
  for (uint32_t i = 0; i < 40; ++i) p.push_back((i * 29 + 5) % 200);
  return p;
}

// The request's tokens as the worker streams them (empty on an error or a hang).
std::vector<uint32_t> ViaWorker(WireClient& c, uint64_t id, const Sampling& s) {
  capnp::MallocMessageBuilder b;
  auto g = b.initRoot<Envelope>().initGenerate();
  g.setRequestId(id);
  const std::vector<uint32_t> prompt = SampledPrompt();
  auto p = g.initPrompt(static_cast<unsigned>(prompt.size()));
  for (size_t i = 0; i < prompt.size(); ++i) p.set(static_cast<unsigned>(i), prompt[i]);
  g.setMaxNewTokens(kMaxNew);
  auto sampling = g.initSampling();
  sampling.setTemperature(s.temperature);
  sampling.setTopK(s.top_k);
  sampling.setTopP(s.top_p);
  sampling.setSeed(s.seed);
  EXPECT_OK(c.Send(b));
  std::vector<uint32_t> tokens;
  const auto give_up = std::chrono::steady_clock::now() + 120s;
  while (std::chrono::steady_clock::now() < give_up) {
    Result<DecodedMessage> m = c.Receive(30s);
    if (!m.ok()) {
      ADD_FAILURE() << m.status();
      return {};
    }
    auto root = m.value().root();
    if (root.which() == Envelope::TOKEN && root.getToken().getRequestId() == id) {
      tokens.push_back(root.getToken().getToken());
    } else if (root.which() == Envelope::FINISH && root.getFinish().getRequestId() == id) {
      return tokens;
    } else if (root.which() == Envelope::ERROR && root.getError().getRequestId() == id) {
      ADD_FAILURE() << "request " << id << " refused";
      return {};
    }
  }
  ADD_FAILURE() << "request " << id << " did not end";
  return {};
}

// The request's options on the in-process engine.
sched::RequestOptions InProcessRequest(const Sampling& s) {
  sched::RequestOptions r;
  for (uint32_t t : SampledPrompt()) r.prompt.push_back(static_cast<TokenId>(t));
  r.max_new_tokens = kMaxNew;
  r.sampling = {.temperature = s.temperature, .top_k = s.top_k, .top_p = s.top_p, .seed = s.seed};
  return r;
}

// The same requests, one after the other, on one in-process engine with the worker's defaults
// (the built-in tiny model), as the worker serves them: the second request finds the first one's
// prompt in the prefix cache and computes only its last token, which rounds differently from a
// full prefill, and a sampled token can flip on the last bit of a logit.
std::vector<std::vector<uint32_t>> InProcess(std::initializer_list<Sampling> requests) {
  engine::EngineOptions o;
  o.tiny_model = true;  // the worker's --tiny-model
  o.num_threads = 2;
  o.kv_cache_bytes = 64u << 20;
  std::vector<sched::RequestOptions> rs;
  for (const Sampling& s : requests) rs.push_back(InProcessRequest(s));
  std::vector<std::vector<uint32_t>> outputs;
  for (const auto& outcome : chunkserve::testing::RunEachAlone(o, rs)) {
    outputs.emplace_back(outcome.tokens.begin(), outcome.tokens.end());
  }
  return outputs;
}

// Kills the mutation worker-drops-sampling-seed (tests/mutation).
TEST(WorkerSamplingTest, SampledTokensEqualTheInProcessEnginesForEachSeed) {
  ASSERT_OK_AND_ASSIGN(auto worker, WorkerProcess::Start({"--threads", "2", "--kv-cache-mb", "64"}));
  ASSERT_OK_AND_ASSIGN(auto client, worker->Connect());
  const Sampling a{.temperature = 1.5f, .top_k = 50, .top_p = 0.95f, .seed = 1234};
  const Sampling b{.temperature = 1.5f, .top_k = 50, .top_p = 0.95f, .seed = 98765};
  const std::vector<std::vector<uint32_t>> want = InProcess({a, b});
  ASSERT_EQ(want.size(), 2u);
  const std::vector<uint32_t>& want_a = want[0];
  const std::vector<uint32_t>& want_b = want[1];
  ASSERT_EQ(want_a.size(), static_cast<size_t>(kMaxNew));
  ASSERT_NE(want_a, want_b) << "the two seeds should sample different streams";
  EXPECT_EQ(ViaWorker(*client, 1, a), want_a);
  EXPECT_EQ(ViaWorker(*client, 2, b), want_b);
}

}  // namespace
}  // namespace chunkserve::worker
