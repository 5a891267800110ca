// Shared pieces of the router process tests: worker/router start-up with the test settings,
// wire-client helpers that track token streams per request, and metric shortcuts.
#ifndef CHUNKSERVE_TESTS_ROUTER_ROUTER_TEST_UTIL_H_
#define CHUNKSERVE_TESTS_ROUTER_ROUTER_TEST_UTIL_H_

#include <capnp/message.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "runtime/wire/client.h"
#include "tests/router/router_process.h"
#include "tests/testing/status_matchers.h"
#include "tests/worker/worker_process.h"

namespace chunkserve::router::testing {

using namespace std::chrono_literals;
using wire::DecodedMessage;
using wire::WireClient;
using wire::schema::Envelope;
using wire::schema::FinishReason;
using worker::testing::WorkerProcess;

// One CPU thread per worker: the test machine has 2 cores shared by everything.
inline const std::vector<std::string> kWorkerArgs = {
    "--threads", "1", "--kv-cache-mb", "64", "--load-report-ms", "100"};

inline std::vector<uint32_t> Tokens(int n, int salt) {
  std::vector<uint32_t> p;
  for (int i = 0; i < n; ++i) {
    p.push_back(static_cast<uint32_t>((i * 31 + salt * 977 + (i * salt) % 17 + 3) % 1000));
  }
  return p;
}

inline std::vector<uint32_t> Concat(std::vector<uint32_t> a, const std::vector<uint32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

inline Result<std::unique_ptr<WorkerProcess>> StartWorker(const std::string& routers,
                                                          const std::string& name,
                                                          std::vector<std::string> extra = {}) {
  std::vector<std::string> args = kWorkerArgs;
  args.insert(args.end(), {"--router", routers, "--worker-id", name});
  args.insert(args.end(), extra.begin(), extra.end());
  return WorkerProcess::Start(args);
}

// Waits until the router counts `n` routable workers.
inline void ExpectWorkersAlive(const RouterProcess& router, double n) {
  Result<double> alive = WaitForMetric(
      router.http_port(), "chunkserve_router_workers_alive", [n](double v) { return v == n; }, 60s);
  ASSERT_OK(alive.status());
  ASSERT_EQ(alive.value(), n);
}

inline std::string WorkerName(int i) {
  std::string name = "w";
  name += std::to_string(i);
  return name;
}

inline std::string Routed(const std::string& worker) {
  return "chunkserve_router_worker_routed_total{worker=\"" + worker + "\"}";
}

inline double RoutedTo(const RouterProcess& router, const std::string& worker) {
  Result<double> v = Metric(router.http_port(), Routed(worker));
  return v.ok() ? v.value() : 0;
}

inline Status SendGenerate(WireClient& c, uint64_t id, const std::vector<uint32_t>& prompt,
                           int32_t max_new) {
  capnp::MallocMessageBuilder b;
  auto g = b.initRoot<Envelope>().initGenerate();
  g.setRequestId(id);
  auto p = g.initPrompt(static_cast<unsigned>(prompt.size()));
  for (size_t i = 0; i < prompt.size(); ++i) p.set(static_cast<unsigned>(i), prompt[i]);
  g.setMaxNewTokens(max_new);
  return c.Send(b);
}

// Sends a Register as a (fake) worker would and returns the router's RegisterAck reason, or
// the status when the answer is not a refusal: for tests that expect the registration refused.
inline Result<std::string> RegisterRefusedFor(WireClient& c, const std::string& worker_id,
                                               const std::string& address) {
  capnp::MallocMessageBuilder b;
  auto r = b.initRoot<Envelope>().initRegister();
  r.setWorkerId(worker_id);
  r.setChunkSize(64);
  r.setChunkHashVersion(1);
  r.setAddress(address);
  CHUNKSERVE_RETURN_IF_ERROR(c.Send(b));
  CHUNKSERVE_ASSIGN_OR_RETURN(DecodedMessage ack, c.Receive(std::chrono::seconds(30)));
  if (ack.root().which() != Envelope::REGISTER_ACK) {
    return Status::Internal("expected a RegisterAck");
  }
  if (ack.root().getRegisterAck().getAccepted()) return Status::Internal("registration accepted");
  return std::string(ack.root().getRegisterAck().getReason().cStr());
}

inline Status SendCancel(WireClient& c, uint64_t id) {
  capnp::MallocMessageBuilder b;
  b.initRoot<Envelope>().initCancel().setRequestId(id);
  return c.Send(b);
}

struct Outcome {
  std::vector<uint32_t> tokens;
  bool finished = false;
  FinishReason reason = FinishReason::ERROR;
  int32_t cached = -1;
  int32_t prompt_tokens = -1;
  int32_t generated = -1;
  bool error = false;
  wire::schema::ErrorCode error_code = wire::schema::ErrorCode::OK;
  bool retryable = false;
  bool indices_continuous = true;
};

// Applies one message to the outcomes of the requests it concerns; true when it ended one.
inline bool Apply(DecodedMessage& m, std::map<uint64_t, Outcome>* outcomes) {
  auto root = m.root();
  if (root.which() == Envelope::TOKEN) {
    Outcome& o = (*outcomes)[root.getToken().getRequestId()];
    if (root.getToken().getIndex() != static_cast<int32_t>(o.tokens.size())) {
      o.indices_continuous = false;
    }
    o.tokens.push_back(root.getToken().getToken());
  } else if (root.which() == Envelope::FINISH) {
    Outcome& o = (*outcomes)[root.getFinish().getRequestId()];
    o.finished = true;
    o.reason = root.getFinish().getReason();
    o.cached = root.getFinish().getCachedTokens();
    o.prompt_tokens = root.getFinish().getPromptTokens();
    o.generated = root.getFinish().getGeneratedTokens();
    return true;
  } else if (root.which() == Envelope::ERROR && root.getError().getRequestId() != 0) {
    Outcome& o = (*outcomes)[root.getError().getRequestId()];
    o.error = true;
    o.error_code = root.getError().getCode();
    o.retryable = root.getError().getRetryable();
    return true;
  }
  return false;
}

// Receives until every id in `ids` ended.
inline std::map<uint64_t, Outcome> ReceiveAll(WireClient& c, const std::vector<uint64_t>& ids,
                                              std::map<uint64_t, Outcome> outcomes = {}) {
  const auto give_up = std::chrono::steady_clock::now() + 240s;
  auto all_ended = [&] {
    for (uint64_t id : ids) {
      const Outcome& o = outcomes[id];
      if (!o.finished && !o.error) return false;
    }
    return true;
  };
  while (!all_ended() && std::chrono::steady_clock::now() < give_up) {
    Result<DecodedMessage> m = c.Receive(60s);
    if (!m.ok()) {
      ADD_FAILURE() << m.status();
      break;
    }
    Apply(m.value(), &outcomes);
  }
  EXPECT_TRUE(all_ended()) << "requests did not end";
  return outcomes;
}

inline Outcome RunOne(WireClient& c, uint64_t id, const std::vector<uint32_t>& prompt,
                      int32_t max_new) {
  EXPECT_OK(SendGenerate(c, id, prompt, max_new));
  return ReceiveAll(c, {id})[id];
}

// The greedy tokens of each prompt (max_new[i] for prompt i) from one worker alone, with no
// router, one request at a time: what a run through the router must reproduce token for token,
// whatever else runs beside it and whatever happens to its workers.
inline Result<std::vector<std::vector<uint32_t>>> SoloGreedy(
    const std::vector<std::vector<uint32_t>>& prompts, const std::vector<int32_t>& max_new) {
  if (max_new.size() != prompts.size()) return Status::InvalidArgument("one max_new per prompt");
  CHUNKSERVE_ASSIGN_OR_RETURN(auto solo, WorkerProcess::Start(kWorkerArgs));
  CHUNKSERVE_ASSIGN_OR_RETURN(auto c, solo->Connect());
  std::vector<std::vector<uint32_t>> out;
  for (size_t i = 0; i < prompts.size(); ++i) {
    Outcome o = RunOne(*c, 1 + i, prompts[i], max_new[i]);
    if (o.tokens.size() != static_cast<size_t>(max_new[i])) {
      return Status::Internal("solo run of prompt " + std::to_string(i) + " produced " +
                              std::to_string(o.tokens.size()) + " tokens");
    }
    out.push_back(std::move(o.tokens));
  }
  return out;
}

inline Result<std::vector<std::vector<uint32_t>>> SoloGreedy(
    const std::vector<std::vector<uint32_t>>& prompts, int32_t max_new) {
  return SoloGreedy(prompts, std::vector<int32_t>(prompts.size(), max_new));
}

// Whether `tokens` (a stream cut short, or whole) is where `solo` starts.
inline bool StartsLike(const std::vector<uint32_t>& tokens, const std::vector<uint32_t>& solo) {
  return tokens.size() <= solo.size() && std::equal(tokens.begin(), tokens.end(), solo.begin());
}

// Receives until request `id` has at least `n` tokens (or ended).
inline void ReceiveTokens(WireClient& c, uint64_t id, size_t n,
                          std::map<uint64_t, Outcome>* outcomes) {
  const auto give_up = std::chrono::steady_clock::now() + 120s;
  while (std::chrono::steady_clock::now() < give_up) {
    const Outcome& o = (*outcomes)[id];
    if (o.tokens.size() >= n || o.finished || o.error) return;
    Result<DecodedMessage> m = c.Receive(60s);
    if (!m.ok()) {
      ADD_FAILURE() << m.status();
      return;
    }
    Apply(m.value(), outcomes);
  }
  ADD_FAILURE() << "request " << id << " did not stream " << n << " tokens";
}

inline Result<wire::schema::Stats::Reader> Stats(WireClient& c, DecodedMessage* holder) {
  capnp::MallocMessageBuilder b;
  b.initRoot<Envelope>().initStatsRequest();
  CHUNKSERVE_RETURN_IF_ERROR(c.Send(b));
  const auto give_up = std::chrono::steady_clock::now() + 30s;
  while (std::chrono::steady_clock::now() < give_up) {
    CHUNKSERVE_ASSIGN_OR_RETURN(*holder, c.Receive(30s));
    if (holder->root().which() == Envelope::STATS) return holder->root().getStats();
  }
  return Status::DeadlineExceeded("no Stats reply");
}

// Runs one request with a unique 200-token prompt directly on the worker, so its load reports
// carry a measured prefill rate (routers assume a default rate for unmeasured workers, which on
// a loaded test machine can make a cold worker look faster than a measured one).
inline void WarmUp(WorkerProcess& w, int salt) {
  auto c = w.Connect();
  ASSERT_OK(c.status());
  EXPECT_TRUE(RunOne(*c.value(), 1, Tokens(200, 5000 + salt), 1).finished);
}

// Polls a worker until it runs nothing and references no KV.
inline bool WorkerIdle(WorkerProcess& w) {
  auto client = w.Connect();
  if (!client.ok()) return false;
  return WaitFor(
      [&] {
        DecodedMessage holder;
        auto s = Stats(*client.value(), &holder);
        return s.ok() && s.value().getRunning() == 0 && s.value().getQueued() == 0 &&
               s.value().getKvBytesReferenced() == 0;
      },
      60s);
}

}  // namespace chunkserve::router::testing

#endif  // CHUNKSERVE_TESTS_ROUTER_ROUTER_TEST_UTIL_H_
