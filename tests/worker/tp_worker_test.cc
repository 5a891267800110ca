// chunkserve-worker --tp 2 as real processes: a SIGKILLed rank ends the in-flight request with an
// error naming the rank within a bounded time, the worker stops being ready and exits non-zero;
// a killed worker takes its rank processes with it; SIGTERM drains and exits 0.
#include <capnp/message.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "runtime/wire/client.h"
#include "tests/testing/status_matchers.h"
#include "tests/worker/worker_process.h"

namespace chunkserve::worker {
namespace {

using namespace std::chrono_literals;
using testing::HttpGet;
using testing::WorkerProcess;
using wire::DecodedMessage;
using wire::WireClient;
using wire::schema::Envelope;

const std::vector<std::string> kArgs = {"--tp",
                                        "2",
                                        "--threads",
                                        "1",
                                        "--kv-cache-mb",
                                        "64",
                                        "--tp-timeout-ms",
                                        "10000",
                                        "--drain-timeout-ms",
                                        "5000"};

Status SendGenerate(WireClient& c, uint64_t id, int32_t prompt_len, int32_t max_new) {
  capnp::MallocMessageBuilder b;
  auto g = b.initRoot<Envelope>().initGenerate();
  g.setRequestId(id);
  auto p = g.initPrompt(static_cast<unsigned>(prompt_len));
  for (int i = 0; i < prompt_len; ++i) p.set(static_cast<unsigned>(i), (i * 13 + 5) % 200);
  g.setMaxNewTokens(max_new);
  return c.Send(b);
}

// Children of `parent` (the rank processes), from /proc.
std::vector<pid_t> ChildrenOf(pid_t parent) {
  std::vector<pid_t> out;
  for (const auto& e : std::filesystem::directory_iterator("/proc")) {
    const std::string name = e.path().filename().string();
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream stat(e.path() / "stat");
    std::string line;
    std::getline(stat, line);
    const size_t close = line.rfind(')');
    if (close == std::string::npos) continue;
    char state = 0;
    int ppid = 0;
    if (std::sscanf(line.c_str() + close + 1, " %c %d", &state, &ppid) == 2 && ppid == parent) {
      out.push_back(static_cast<pid_t>(std::stoi(name)));
    }
  }
  return out;
}

// Gone, or a zombie nobody reaped yet (PID 1 of a container may not reap).
bool ProcessEnded(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return true;
  const size_t close = line.rfind(')');
  return close != std::string::npos && line.size() > close + 2 && line[close + 2] == 'Z';
}

Result<std::vector<pid_t>> WaitForRanks(pid_t worker, size_t n) {
  const auto give_up = std::chrono::steady_clock::now() + 30s;
  while (std::chrono::steady_clock::now() < give_up) {
    std::vector<pid_t> kids = ChildrenOf(worker);
    if (kids.size() >= n) return kids;
    std::this_thread::sleep_for(20ms);
  }
  return Status::DeadlineExceeded("rank processes not found");
}

TEST(TpWorkerTest, KilledRankFailsInFlightRequestsAndTheWorkerExitsNonZero) {
  ASSERT_OK_AND_ASSIGN(auto worker, WorkerProcess::Start(kArgs));
  ASSERT_OK_AND_ASSIGN(std::vector<pid_t> ranks, WaitForRanks(worker->pid(), 1));
  ASSERT_OK_AND_ASSIGN(testing::HttpResponse ready, HttpGet(worker->http_port(), "/readyz"));
  EXPECT_EQ(ready.status, 200) << ready.body;
  ASSERT_OK_AND_ASSIGN(auto client, worker->Connect());
  ASSERT_OK(SendGenerate(*client, 7, 50, 6000));
  // The request is streaming.
  for (;;) {
    ASSERT_OK_AND_ASSIGN(DecodedMessage m, client->Receive(60s));
    if (m.root().which() == Envelope::TOKEN) break;
    ASSERT_NE(m.root().which(), Envelope::FINISH) << m.root().getFinish().getErrorMessage().cStr();
  }
  ASSERT_EQ(::kill(ranks[0], SIGKILL), 0);
  const auto killed = std::chrono::steady_clock::now();
  bool ended = false;
  while (!ended) {
    Result<DecodedMessage> m = client->Receive(60s);
    ASSERT_OK(m.status()) << "no terminal event after the rank was killed";
    auto root = m.value().root();
    if (root.which() == Envelope::FINISH) {
      EXPECT_EQ(root.getFinish().getReason(), wire::schema::FinishReason::ERROR);
      const std::string msg = root.getFinish().getErrorMessage().cStr();
      EXPECT_NE(msg.find("rank 1"), std::string::npos) << msg;
      ended = true;
    } else if (root.which() == Envelope::ERROR) {
      ended = true;
    }
  }
  // Bounded: the monitor notices the exit in milliseconds; 30 s allows for a loaded machine.
  EXPECT_LT(std::chrono::steady_clock::now() - killed, 30s);
  // Not ready any more: draining (503) or already gone.
  Result<testing::HttpResponse> after = HttpGet(worker->http_port(), "/readyz");
  if (after.ok()) {
    EXPECT_NE(after.value().status, 200);
  }
  ASSERT_OK_AND_ASSIGN(int code, worker->Wait(60s));
  EXPECT_NE(code, 0);
}

TEST(TpWorkerTest, HungRankFailsInFlightRequestsAtTheCollectiveDeadline) {
  std::vector<std::string> args = kArgs;
  args[7] = "2000";  // --tp-timeout-ms
  ASSERT_OK_AND_ASSIGN(auto worker, WorkerProcess::Start(args));
  ASSERT_OK_AND_ASSIGN(std::vector<pid_t> ranks, WaitForRanks(worker->pid(), 1));
  ASSERT_OK_AND_ASSIGN(auto client, worker->Connect());
  ASSERT_OK(SendGenerate(*client, 9, 40, 6000));
  for (;;) {
    ASSERT_OK_AND_ASSIGN(DecodedMessage m, client->Receive(60s));
    if (m.root().which() == Envelope::TOKEN) break;
    ASSERT_NE(m.root().which(), Envelope::FINISH) << m.root().getFinish().getErrorMessage().cStr();
  }
  ASSERT_EQ(::kill(ranks[0], SIGSTOP), 0);  // alive, sockets open, silent
  const auto stopped = std::chrono::steady_clock::now();
  for (;;) {
    Result<DecodedMessage> m = client->Receive(60s);
    ASSERT_OK(m.status()) << "no terminal event after the rank hung";
    auto root = m.value().root();
    if (root.which() == Envelope::FINISH) {
      EXPECT_EQ(root.getFinish().getReason(), wire::schema::FinishReason::ERROR);
      EXPECT_FALSE(std::string(root.getFinish().getErrorMessage().cStr()).empty());
      break;
    }
    ASSERT_NE(root.which(), Envelope::ERROR);
  }
  // The 2 s collective deadline, plus slack for a loaded machine.
  EXPECT_LT(std::chrono::steady_clock::now() - stopped, 40s);
  ASSERT_OK_AND_ASSIGN(int code, worker->Wait(60s));
  EXPECT_NE(code, 0);
  ::kill(ranks[0], SIGKILL);  // the worker kills it on exit; make sure
}

TEST(TpWorkerTest, RanksExitWhenTheWorkerDies) {
  ASSERT_OK_AND_ASSIGN(
      auto worker, WorkerProcess::Start({"--tp", "2", "--threads", "1", "--kv-cache-mb", "64"}));
  ASSERT_OK_AND_ASSIGN(std::vector<pid_t> ranks, WaitForRanks(worker->pid(), 1));
  ASSERT_OK(worker->Signal(SIGKILL));
  ASSERT_OK(worker->Wait(30s).status());
  const auto give_up = std::chrono::steady_clock::now() + 30s;
  while (!ProcessEnded(ranks[0]) && std::chrono::steady_clock::now() < give_up) {
    std::this_thread::sleep_for(20ms);
  }
  EXPECT_TRUE(ProcessEnded(ranks[0])) << "rank process " << ranks[0] << " outlived its worker";
}

TEST(TpWorkerTest, SigtermDrainsAndExitsZeroWithTheRanks) {
  ASSERT_OK_AND_ASSIGN(auto worker, WorkerProcess::Start(kArgs));
  ASSERT_OK_AND_ASSIGN(std::vector<pid_t> ranks, WaitForRanks(worker->pid(), 1));
  ASSERT_OK_AND_ASSIGN(auto client, worker->Connect());
  ASSERT_OK(SendGenerate(*client, 1, 30, 8));
  int tokens = 0;
  for (;;) {
    ASSERT_OK_AND_ASSIGN(DecodedMessage m, client->Receive(60s));
    if (m.root().which() == Envelope::TOKEN) ++tokens;
    if (m.root().which() == Envelope::FINISH) {
      EXPECT_EQ(m.root().getFinish().getReason(), wire::schema::FinishReason::LENGTH);
      break;
    }
  }
  EXPECT_EQ(tokens, 8);
  ASSERT_OK(worker->Signal(SIGTERM));
  ASSERT_OK_AND_ASSIGN(int code, worker->Wait(60s));
  EXPECT_EQ(code, 0);
  EXPECT_TRUE(ProcessEnded(ranks[0]));
}

}  // namespace
}  // namespace chunkserve::worker
