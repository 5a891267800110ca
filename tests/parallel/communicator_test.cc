// runtime/parallel: the rendezvous store, the Gloo communicator across threads (2 and 4 ranks)
// against a plain reference, dead and hung peers as real processes (errors within the deadline),
// the step descriptor codec and the tensor-parallel sharding rules.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "runtime/model/tensor_parallel.h"
#include "runtime/model/tiny_model.h"
#include "runtime/parallel/gloo_communicator.h"
#include "runtime/parallel/step_codec.h"
#include "runtime/parallel/tcp_store.h"
#include "tests/testing/random.h"
#include "tests/testing/status_matchers.h"

namespace chunkserve::parallel {
namespace {

using namespace std::chrono_literals;

// Helper mode: this test binary re-executed as a Gloo rank (the dead-peer tests need a peer they
// can SIGKILL). It joins the group and runs barriers until one fails, then exits 1. Runs from a
// static initializer, before GoogleTest parses anything.
const bool kHelperMode = [] {
  const char* rank = std::getenv("CHUNKSERVE_TEST_GLOO_RANK");
  if (rank == nullptr) return false;
  GlooOptions o;
  o.rank = std::atoi(rank);
  o.size = std::atoi(std::getenv("CHUNKSERVE_TEST_GLOO_SIZE"));
  o.store_port = static_cast<uint16_t>(std::atoi(std::getenv("CHUNKSERVE_TEST_GLOO_PORT")));
  o.timeout = 30s;
  Result<std::unique_ptr<GlooCommunicator>> comm = GlooCommunicator::Create(o);
  if (!comm.ok()) ::_exit(2);
  while (comm.value()->Barrier(Deadline::After(60s)).ok()) {
  }
  ::_exit(1);
}();

// Runs fn(rank) on `size` threads and joins them.
template <typename Fn>
void OnRanks(int32_t size, Fn fn) {
  std::vector<std::thread> threads;
  for (int32_t r = 0; r < size; ++r) threads.emplace_back([&, r] { fn(r); });
  for (std::thread& t : threads) t.join();
}

// A group of `size` Gloo communicators in this process, one per rank, over a fresh store.
std::vector<std::unique_ptr<GlooCommunicator>> MakeGroup(int32_t size, TcpStoreServer* store) {
  std::vector<std::unique_ptr<GlooCommunicator>> comms(size);
  std::vector<Status> status(size);
  OnRanks(size, [&](int32_t r) {
    GlooOptions o;
    o.rank = r;
    o.size = size;
    o.store_port = store->port();
    o.timeout = 60s;
    Result<std::unique_ptr<GlooCommunicator>> c = GlooCommunicator::Create(o);
    status[r] = c.status();
    if (c.ok()) comms[r] = std::move(c).value();
  });
  for (const Status& s : status) EXPECT_OK(s);
  return comms;
}

TEST(TcpStoreTest, SetThenGetAndGetWaitsForALaterSet) {
  ASSERT_OK_AND_ASSIGN(auto server, TcpStoreServer::Start("127.0.0.1", 0));
  ASSERT_OK_AND_ASSIGN(auto a,
                       TcpStoreClient::Connect("127.0.0.1", server->port(), Deadline::After(10s)));
  ASSERT_OK_AND_ASSIGN(auto b,
                       TcpStoreClient::Connect("127.0.0.1", server->port(), Deadline::After(10s)));
  ASSERT_OK(a->Set("k", {'x', 'y'}, Deadline::After(10s)));
  ASSERT_OK_AND_ASSIGN(std::vector<char> v, b->Get("k", Deadline::After(10s)));
  EXPECT_EQ(v, (std::vector<char>{'x', 'y'}));
  std::thread later([&] {
    std::this_thread::sleep_for(100ms);
    EXPECT_OK(a->Set("late", {'z'}, Deadline::After(10s)));
  });
  ASSERT_OK_AND_ASSIGN(v, b->Get("late", Deadline::After(20s)));
  later.join();
  EXPECT_EQ(v, std::vector<char>{'z'});
}

TEST(TcpStoreTest, MissingKeyTimesOut) {
  ASSERT_OK_AND_ASSIGN(auto server, TcpStoreServer::Start("127.0.0.1", 0));
  ASSERT_OK_AND_ASSIGN(auto c,
                       TcpStoreClient::Connect("127.0.0.1", server->port(), Deadline::After(10s)));
  const Result<std::vector<char>> v = c->Get("never", Deadline::After(200ms));
  EXPECT_EQ(v.status().code(), StatusCode::kDeadlineExceeded);
}

TEST(TcpStoreTest, ConnectToNothingFailsAtTheDeadline) {
  // A port that was just free: bind one, note it, close it.
  ASSERT_OK_AND_ASSIGN(auto server, TcpStoreServer::Start("127.0.0.1", 0));
  const uint16_t port = server->port();
  server.reset();
  const Result<std::unique_ptr<TcpStoreClient>> c =
      TcpStoreClient::Connect("127.0.0.1", port, Deadline::After(300ms));
  EXPECT_EQ(c.status().code(), StatusCode::kDeadlineExceeded);
}

TEST(TcpStoreTest, ParseHostPort) {
  std::string host;
  uint16_t port = 0;
  ASSERT_OK(ParseHostPort("10.0.0.2:7100", &host, &port));
  EXPECT_EQ(host, "10.0.0.2");
  EXPECT_EQ(port, 7100);
  EXPECT_FALSE(ParseHostPort("nohost", &host, &port).ok());
  EXPECT_FALSE(ParseHostPort(":80", &host, &port).ok());
  EXPECT_FALSE(ParseHostPort("h:99999", &host, &port).ok());
}

class GlooGroupTest : public ::testing::TestWithParam<int32_t> {};

TEST_P(GlooGroupTest, AllReduceMatchesReferenceAndIsBitIdenticalOnEveryRank) {
  const int32_t size = GetParam();
  ASSERT_OK_AND_ASSIGN(auto store, TcpStoreServer::Start("127.0.0.1", 0));
  auto comms = MakeGroup(size, store.get());
  ASSERT_FALSE(HasFailure());
  testing::Random rng(testing::TestSeed());
  // Sizes around Gloo's segmenting, including fewer elements than ranks.
  for (size_t n : {size_t{1}, size_t{3}, size_t{1000}, size_t{256 * 64 + 7}}) {
    std::vector<std::vector<float>> data(size);
    for (auto& d : data) d = rng.Floats(n);
    std::vector<double> expected(n, 0.0);
    for (const auto& d : data) {
      for (size_t i = 0; i < n; ++i) expected[i] += d[i];
    }
    std::vector<Status> status(size);
    OnRanks(size,
            [&](int32_t r) { status[r] = comms[r]->AllReduceSum(data[r], Deadline::After(60s)); });
    for (const Status& s : status) ASSERT_OK(s);
    for (size_t i = 0; i < n; ++i) {
      // fp32 sums of `size` values in [-1, 1): error below size * 2^-23 * size.
      ASSERT_NEAR(data[0][i], expected[i], 1e-5 * size) << "n " << n << " i " << i;
      for (int32_t r = 1; r < size; ++r) {
        ASSERT_EQ(std::memcmp(&data[r][i], &data[0][i], sizeof(float)), 0)
            << "rank " << r << " differs at " << i;
      }
    }
  }
}

TEST_P(GlooGroupTest, BroadcastFromEveryRoot) {
  const int32_t size = GetParam();
  ASSERT_OK_AND_ASSIGN(auto store, TcpStoreServer::Start("127.0.0.1", 0));
  auto comms = MakeGroup(size, store.get());
  ASSERT_FALSE(HasFailure());
  for (int32_t root = 0; root < size; ++root) {
    std::vector<std::vector<std::byte>> buf(size, std::vector<std::byte>(5000));
    for (size_t i = 0; i < buf[root].size(); ++i) {
      buf[root][i] = static_cast<std::byte>((i * 7 + root) & 0xff);
    }
    const std::vector<std::byte> expected = buf[root];
    std::vector<Status> status(size);
    OnRanks(size, [&](int32_t r) {
      status[r] = comms[r]->Broadcast(buf[r], root, Deadline::After(60s));
    });
    for (int32_t r = 0; r < size; ++r) {
      ASSERT_OK(status[r]);
      EXPECT_EQ(buf[r], expected) << "rank " << r << " root " << root;
    }
  }
}

TEST_P(GlooGroupTest, BarrierWaitsForTheLastRank) {
  const int32_t size = GetParam();
  ASSERT_OK_AND_ASSIGN(auto store, TcpStoreServer::Start("127.0.0.1", 0));
  auto comms = MakeGroup(size, store.get());
  ASSERT_FALSE(HasFailure());
  std::atomic<bool> last_arrived{false};
  std::vector<Status> status(size);
  std::vector<bool> saw_last(size, false);
  OnRanks(size, [&](int32_t r) {
    if (r == size - 1) {
      std::this_thread::sleep_for(300ms);
      last_arrived = true;
    }
    status[r] = comms[r]->Barrier(Deadline::After(60s));
    saw_last[r] = last_arrived.load();
  });
  for (int32_t r = 0; r < size; ++r) {
    ASSERT_OK(status[r]);
    EXPECT_TRUE(saw_last[r]) << "rank " << r << " left the barrier early";
  }
}

TEST_P(GlooGroupTest, MissingRankGivesDeadlineExceededAndBreaksTheCommunicator) {
  const int32_t size = GetParam();
  ASSERT_OK_AND_ASSIGN(auto store, TcpStoreServer::Start("127.0.0.1", 0));
  auto comms = MakeGroup(size, store.get());
  ASSERT_FALSE(HasFailure());
  // Every rank but the last enters; the last never does.
  std::vector<Status> status(size - 1);
  const auto start = Clock::now();
  OnRanks(size - 1, [&](int32_t r) {
    float x = 1.0f;
    status[r] = comms[r]->AllReduceSum(std::span<float>(&x, 1), Deadline::After(500ms));
  });
  const auto elapsed = Clock::now() - start;
  for (const Status& s : status) {
    EXPECT_FALSE(s.ok());
    EXPECT_EQ(comms[0]->health().ok(), false);
  }
  EXPECT_LT(elapsed, 20s);  // bounded, not hanging (500 ms deadline; generous for a loaded CI)
  float x = 1.0f;
  EXPECT_FALSE(comms[0]->AllReduceSum(std::span<float>(&x, 1), Deadline::After(60s)).ok());
}

TEST_P(GlooGroupTest, AbortFailsLaterOperationsAtOnce) {
  const int32_t size = GetParam();
  ASSERT_OK_AND_ASSIGN(auto store, TcpStoreServer::Start("127.0.0.1", 0));
  auto comms = MakeGroup(size, store.get());
  ASSERT_FALSE(HasFailure());
  comms[0]->Abort(Status::Unavailable("rank 3 died"));
  const Status s = comms[0]->Barrier(Deadline::After(60s));
  EXPECT_EQ(s.code(), StatusCode::kUnavailable);
  EXPECT_NE(std::string(s.message()).find("rank 3 died"), std::string::npos);
}

INSTANTIATE_TEST_SUITE_P(Ranks, GlooGroupTest, ::testing::Values(2, 4),
                         [](const auto& info) { return "tp" + std::to_string(info.param); });

// Rank 1 as a real process (this binary in helper mode), rank 0 here.
class GlooPeerProcessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_OK_AND_ASSIGN(store_, TcpStoreServer::Start("127.0.0.1", 0));
    const std::string port = std::to_string(store_->port());
    pid_ = ::fork();
    ASSERT_GE(pid_, 0);
    if (pid_ == 0) {
      ::setenv("CHUNKSERVE_TEST_GLOO_RANK", "1", 1);
      ::setenv("CHUNKSERVE_TEST_GLOO_SIZE", "2", 1);
      ::setenv("CHUNKSERVE_TEST_GLOO_PORT", port.c_str(), 1);
      char exe[] = "/proc/self/exe";
      char* argv[] = {exe, nullptr};
      ::execv(exe, argv);
      ::_exit(127);
    }
    GlooOptions o;
    o.size = 2;
    o.store_port = store_->port();
    o.timeout = 60s;
    ASSERT_OK_AND_ASSIGN(comm_, GlooCommunicator::Create(o));
    ASSERT_OK(comm_->Barrier(Deadline::After(60s)));  // the peer is up and in its loop
  }
  void TearDown() override {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }

  std::unique_ptr<TcpStoreServer> store_;
  std::unique_ptr<GlooCommunicator> comm_;
  pid_t pid_ = -1;
};

TEST_F(GlooPeerProcessTest, KilledPeerGivesAnErrorWellBeforeTheDeadline) {
  ::kill(pid_, SIGKILL);
  ::waitpid(pid_, nullptr, 0);
  pid_ = -1;
  const auto start = Clock::now();
  const Status s = comm_->Barrier(Deadline::After(60s));
  EXPECT_FALSE(s.ok());
  // A killed process closes its sockets: Gloo notices without waiting for the deadline.
  EXPECT_LT(Clock::now() - start, 30s) << s;
}

TEST_F(GlooPeerProcessTest, LargeOperationsAfterAKilledPeerKeepFailing) {
  ::kill(pid_, SIGKILL);
  ::waitpid(pid_, nullptr, 0);
  pid_ = -1;
  // Megabytes towards a closed socket. A write that races the peer's death gets EPIPE, which
  // would raise SIGPIPE (and end this process) unless the communicator blocks it; the race is
  // rare (about 1 in 40 runs of the test above before the fix), so this test only covers it
  // sometimes.
  std::vector<float> big(4 << 20, 1.0f);
  for (int i = 0; i < 3; ++i) {
    EXPECT_FALSE(comm_->AllReduceSum(big, Deadline::After(30s)).ok());
  }
}

TEST_F(GlooPeerProcessTest, HungPeerGivesDeadlineExceeded) {
  ::kill(pid_, SIGSTOP);  // alive, sockets open, never answers
  const auto start = Clock::now();
  // The peer may have sent its next barrier's message before it was stopped, so the first
  // barrier may still complete; the second cannot.
  const Status s = comm_->Barrier(Deadline::After(1s));
  const Status t = s.ok() ? comm_->Barrier(Deadline::After(1s)) : s;
  EXPECT_EQ(t.code(), StatusCode::kDeadlineExceeded) << t;
  EXPECT_LT(Clock::now() - start, 30s);
}

TEST(GlooCommunicatorTest, RendezvousWithoutPeersTimesOut) {
  ASSERT_OK_AND_ASSIGN(auto store, TcpStoreServer::Start("127.0.0.1", 0));
  GlooOptions o;
  o.size = 2;
  o.store_port = store->port();
  o.timeout = 500ms;
  const auto start = Clock::now();
  const Result<std::unique_ptr<GlooCommunicator>> c = GlooCommunicator::Create(o);
  EXPECT_FALSE(c.ok());
  EXPECT_LT(Clock::now() - start, 20s);
}

TEST(GlooCommunicatorTest, BadRankIsInvalidArgument) {
  GlooOptions o;
  o.rank = 2;
  o.size = 2;
  EXPECT_EQ(GlooCommunicator::Create(o).status().code(), StatusCode::kInvalidArgument);
}

// --- step descriptors ---

TEST(StepCodecTest, RoundTripsEveryField) {
  const std::vector<TokenId> tokens = {5, 6, 7, 8, 9, 10};
  const std::vector<int32_t> pos = {40, 41, 0, 1, 2, 3};
  const std::vector<int32_t> slot = {3, 4, 5, 5, 5, 5};
  const std::vector<int32_t> off = {8, 9, 0, 1, 2, 3};
  const std::vector<int32_t> path_slots = {1, 5}, path_lens = {16, 4};
  forward::PrefillSegment seg;
  seg.token_begin = 2;
  seg.num_tokens = 4;
  seg.chunk_slots = path_slots;
  seg.chunk_lens = path_lens;
  const std::vector<forward::PrefillSegment> segs = {seg};
  const std::vector<forward::KvCopyOp> copies = {{1, 2, 7}};
  // Two decode rows sharing slot 1, each with one private chunk.
  const std::vector<int32_t> shared_slot = {1}, shared_len = {16}, sb = {0}, se = {2}, spo = {0};
  const std::vector<int32_t> ssi = {0, 1, 2}, ssid = {0, 0}, pi = {0, 1, 2}, ps = {3, 4},
                             pl = {9, 10};
  kernels::TppPlanView plan;
  plan.num_seqs = 2;
  plan.num_shared = 1;
  plan.shared_slot = shared_slot.data();
  plan.shared_len = shared_len.data();
  plan.shared_seq_begin = sb.data();
  plan.shared_seq_end = se.data();
  plan.shared_partial_offset = spo.data();
  plan.num_partial_rows = 2;
  plan.seq_shared_indptr = ssi.data();
  plan.seq_shared_ids = ssid.data();
  plan.private_indptr = pi.data();
  plan.private_slot = ps.data();
  plan.private_len = pl.data();
  const std::vector<int32_t> logit_rows = {0, 1, 5};
  forward::StepBatch b;
  b.tokens = tokens;
  b.positions = pos;
  b.kv_slot = slot;
  b.kv_offset = off;
  b.num_decode = 2;
  b.decode_plan = plan;
  b.prefill = segs;
  b.logit_rows = logit_rows;
  b.kv_copies = copies;

  const std::vector<std::byte> bytes = EncodeStep(b);
  DecodedStep d;
  ASSERT_OK(DecodeStep(bytes, &d));
  const forward::StepBatch& o = d.batch();
  auto vec = [](auto span) { return std::vector<int32_t>(span.begin(), span.end()); };
  EXPECT_EQ(vec(o.tokens), tokens);
  EXPECT_EQ(vec(o.positions), pos);
  EXPECT_EQ(vec(o.kv_slot), slot);
  EXPECT_EQ(vec(o.kv_offset), off);
  EXPECT_EQ(o.num_decode, 2);
  ASSERT_EQ(o.prefill.size(), 1u);
  EXPECT_EQ(o.prefill[0].token_begin, 2);
  EXPECT_EQ(o.prefill[0].num_tokens, 4);
  EXPECT_EQ(vec(o.prefill[0].chunk_slots), path_slots);
  EXPECT_EQ(vec(o.prefill[0].chunk_lens), path_lens);
  ASSERT_EQ(o.kv_copies.size(), 1u);
  EXPECT_EQ(o.kv_copies[0].src_slot, 1);
  EXPECT_EQ(o.kv_copies[0].dst_slot, 2);
  EXPECT_EQ(o.kv_copies[0].num_tokens, 7);
  EXPECT_TRUE(o.logit_rows.empty());  // followers never sample
  const kernels::TppPlanView& p = o.decode_plan;
  ASSERT_EQ(p.num_seqs, 2);
  ASSERT_EQ(p.num_shared, 1);
  EXPECT_EQ(p.num_partial_rows, 2);
  EXPECT_EQ(p.shared_slot[0], 1);
  EXPECT_EQ(p.shared_len[0], 16);
  EXPECT_EQ(p.shared_seq_end[0], 2);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(p.seq_shared_indptr[i], ssi[i]);
    EXPECT_EQ(p.private_indptr[i], pi[i]);
  }
  EXPECT_EQ(p.private_slot[1], 4);
  EXPECT_EQ(p.private_len[1], 10);

  // Every truncation and a trailing byte are rejected, never read past.
  for (size_t n = 0; n < bytes.size(); ++n) {
    EXPECT_EQ(DecodeStep(std::span<const std::byte>(bytes).first(n), &d).code(),
              StatusCode::kDataLoss)
        << "length " << n;
  }
  std::vector<std::byte> longer = bytes;
  longer.resize(bytes.size() + 4);
  EXPECT_EQ(DecodeStep(longer, &d).code(), StatusCode::kDataLoss);
}

TEST(StepCodecTest, CopiesOnlyStep) {
  const std::vector<forward::KvCopyOp> copies = {{3, 4, 16}, {5, 6, 1}};
  forward::StepBatch b;
  b.kv_copies = copies;
  DecodedStep d;
  ASSERT_OK(DecodeStep(EncodeStep(b), &d));
  EXPECT_TRUE(d.batch().tokens.empty());
  EXPECT_EQ(d.batch().kv_copies.size(), 2u);
}

TEST(StepCodecTest, InitRoundTrip) {
  TpInit init;
  init.model_dir = "/models/llama 3";
  init.model_fingerprint = 0x0123456789abcdefull;
  init.num_slots = 4096;
  init.chunk_size = 64;
  init.kv_dtype = 2;
  init.num_threads = 3;
  init.op_timeout_ms = 30000;
  init.heartbeat_ms = 1000;
  init.backend = 1;  // CUDA
  init.weight_dtype = 2;  // bf16: followers dequantize a GGUF as the leader did
  ASSERT_OK_AND_ASSIGN(TpInit o, DecodeTpInit(EncodeTpInit(init)));
  EXPECT_EQ(o.weight_dtype, 2);
  EXPECT_EQ(o.model_dir, init.model_dir);
  EXPECT_EQ(o.model_fingerprint, init.model_fingerprint);
  EXPECT_EQ(o.num_slots, 4096);
  EXPECT_EQ(o.kv_dtype, 2);
  EXPECT_EQ(o.heartbeat_ms, 1000);
  EXPECT_EQ(o.backend, 1);
  std::vector<std::byte> bad = EncodeTpInit(init);
  bad.pop_back();
  EXPECT_EQ(DecodeTpInit(bad).status().code(), StatusCode::kDataLoss);
}

// --- sharding rules ---

TEST(TensorParallelShardTest, SplitsHeadsAndMlpEvenly) {
  model::TinyModelOptions t;
  t.num_kv_heads = 4;
  ASSERT_OK_AND_ASSIGN(model::ModelConfig c, model::TinyModelConfig(t));
  ASSERT_OK_AND_ASSIGN(model::TensorParallelShard s, model::ShardForRank(c, 3, 4));
  EXPECT_EQ(s.qo_heads.begin, 6);
  EXPECT_EQ(s.qo_heads.count, 2);
  EXPECT_EQ(s.kv_heads.begin, 3);
  EXPECT_EQ(s.kv_heads.count, 1);
  EXPECT_EQ(s.q_rows.begin, 6 * 64);
  EXPECT_EQ(s.kv_rows.count, 64);
  EXPECT_EQ(s.intermediate.begin, 3 * 172);
  EXPECT_EQ(s.intermediate.count, 172);
}

TEST(TensorParallelShardTest, IndivisibleSizesAreClearErrors) {
  ASSERT_OK_AND_ASSIGN(model::ModelConfig c,
                       model::TinyModelConfig(model::TinyModelOptions::Default()));  // 8 / 2 heads
  const Status s = model::ValidateTensorParallel(c, 4);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(s.message()).find("num_key_value_heads = 2"), std::string::npos) << s;
  EXPECT_NE(std::string(s.message()).find("1, 2"), std::string::npos) << s;
  EXPECT_EQ(model::ValidateTensorParallel(c, 3).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(model::ValidateTensorParallel(c, 0).code(), StatusCode::kInvalidArgument);
  EXPECT_OK(model::ValidateTensorParallel(c, 2));
  EXPECT_EQ(model::ShardForRank(c, 2, 2).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace chunkserve::parallel
