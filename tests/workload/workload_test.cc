// The workload generator (runtime/workload/workload.h): determinism pinned to values, the
// multi-tenant shape and its control, exact prefix lengths and the paper's n_p / n_s shape that the
// demo and `chunkserve-bench engine` use, and JSONL traces.
#include "runtime/workload/workload.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "runtime/kvcache/chunk_hash.h"
#include "tests/testing/status_matchers.h"

namespace chunkserve::workload {
namespace {

constexpr int32_t kChunk = 64;
const uint64_t kChainSeed = kv::ChunkHashSeed(0xfeed, kChunk);

std::vector<WorkloadRequest> Generate(const WorkloadOptions& o) {
  Result<std::vector<WorkloadRequest>> all = GenerateWorkload(o);
  EXPECT_TRUE(all.ok()) << all.status();
  return all.ok() ? std::move(all).value() : std::vector<WorkloadRequest>{};
}

bool SameRequests(const std::vector<WorkloadRequest>& a, const std::vector<WorkloadRequest>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].arrival_s != b[i].arrival_s || a[i].tenant != b[i].tenant ||
        a[i].prefix_tokens != b[i].prefix_tokens || a[i].prompt != b[i].prompt ||
        a[i].output_tokens != b[i].output_tokens) {
      return false;
    }
  }
  return true;
}

TEST(WorkloadTest, RngIsSplitmix64) {
  // The reference splitmix64 stream from state 0 (Vigna's splitmix64.c): the generator's streams
  // depend on nothing but this and explicit formulas, so they are equal on every platform.
  Rng rng(0);
  EXPECT_EQ(rng.NextU64(), 0xe220a8397b1dcdafull);
  EXPECT_EQ(rng.NextU64(), 0x6e789e6aa1b965f4ull);
  EXPECT_EQ(rng.NextU64(), 0x06c45d188009454full);
}

TEST(WorkloadTest, ASeededRunGivesThesePinnedValues) {
  // Pinned from one run: a change here changes every recorded demo, bench and sim result.
  WorkloadOptions o;
  o.num_requests = 3;
  o.tenants = 4;
  o.vocab_size = 1000;
  o.seed = 7;
  const std::vector<WorkloadRequest> w = Generate(o);
  ASSERT_EQ(w.size(), 3u);
  const std::vector<int32_t> tenants = {w[0].tenant, w[1].tenant, w[2].tenant};
  const std::vector<size_t> lengths = {w[0].prompt.size(), w[1].prompt.size(), w[2].prompt.size()};
  const std::vector<int32_t> outputs = {w[0].output_tokens, w[1].output_tokens, w[2].output_tokens};
  const std::vector<TokenId> head(w[0].prompt.begin(), w[0].prompt.begin() + 4);
  EXPECT_EQ(tenants, (std::vector<int32_t>{1, 0, 3}));
  EXPECT_EQ(lengths, (std::vector<size_t>{1441, 1836, 1972}));
  EXPECT_EQ(outputs, (std::vector<int32_t>{167, 110, 98}));
  EXPECT_EQ(head, (std::vector<TokenId>{768, 114, 702, 400}));
  // Exponential gaps go through std::log1p, which libms may round differently in the last bit.
  EXPECT_NEAR(w[0].arrival_s, 0.12783665938522143, 1e-12);
  EXPECT_NEAR(w[2].arrival_s, 0.17485399273674307, 1e-12);
}

TEST(WorkloadTest, OneSeedGivesOneWorkloadOtherSeedsAnother) {
  for (WorkloadFamily f : AllWorkloadFamilies()) {
    SCOPED_TRACE(std::string(WorkloadFamilyName(f)));
    WorkloadOptions o = ForFamily(f);
    o.num_requests = 40;
    o.seed = 5;
    const auto a = Generate(o), b = Generate(o);
    ASSERT_EQ(a.size(), 40u);
    EXPECT_TRUE(SameRequests(a, b));
    o.seed = 6;
    const auto c = Generate(o);
    ASSERT_EQ(c.size(), 40u);
    EXPECT_FALSE(SameRequests(a, c));
    EXPECT_NE(a[0].prompt, c[0].prompt);
    EXPECT_NE(a[0].arrival_s, c[0].arrival_s);
  }
}

TEST(WorkloadTest, SyntheticIsDeterministicAndShared) {
  WorkloadOptions o;
  o.num_requests = 200;
  o.tenants = 8;
  o.seed = 42;
  ASSERT_OK_AND_ASSIGN(auto a, MakeSyntheticWorkload(o));
  ASSERT_OK_AND_ASSIGN(auto b, MakeSyntheticWorkload(o));
  std::map<int32_t, int> per_tenant;
  double last = 0;
  for (int i = 0; i < 200; ++i) {
    auto ra = a->Next();
    auto rb = b->Next();
    ASSERT_TRUE(ra && rb);
    EXPECT_EQ(ra->prompt, rb->prompt);
    EXPECT_EQ(ra->arrival_s, rb->arrival_s);
    EXPECT_GE(ra->arrival_s, last);
    last = ra->arrival_s;
    ++per_tenant[ra->tenant];
    EXPECT_GE(static_cast<int32_t>(ra->prompt.size()), ra->prefix_tokens + o.min_suffix_tokens);
  }
  EXPECT_FALSE(a->Next().has_value());
  EXPECT_GT(per_tenant[0], per_tenant[7]);  // Zipf: tenant 0 is the most popular
}

TEST(WorkloadTest, ControlSharesNoFirstChunk) {
  WorkloadOptions o;
  o.num_requests = 300;
  o.shared_prefixes = false;
  ASSERT_OK_AND_ASSIGN(auto src, MakeSyntheticWorkload(o));
  std::set<uint64_t> firsts;
  while (auto r = src->Next()) {
    EXPECT_EQ(r->tenant, -1);
    ASSERT_OK_AND_ASSIGN(auto h, kv::FullChunkHashes(kChainSeed, kChunk, r->prompt));
    ASSERT_FALSE(h.empty());
    EXPECT_TRUE(firsts.insert(h[0]).second);
  }
}

TEST(WorkloadTest, ExactPrefixLengthsAreOneTenantEach) {
  // The demo's shape: three fixed system prompts (Table 2 lengths), Zipf popularity.
  WorkloadOptions o;
  o.num_requests = 60;
  o.prefix_lengths = {1324, 879, 1432};
  o.min_suffix_tokens = 16;
  o.max_suffix_tokens = 64;
  o.min_output_tokens = o.max_output_tokens = 32;
  o.vocab_size = 256;
  std::map<int32_t, std::vector<TokenId>> prefix_of;
  for (const WorkloadRequest& r : Generate(o)) {
    ASSERT_GE(r.tenant, 0);
    ASSERT_LT(r.tenant, 3);
    EXPECT_EQ(r.prefix_tokens, o.prefix_lengths[static_cast<size_t>(r.tenant)]);
    EXPECT_GE(r.prompt.size(), static_cast<size_t>(r.prefix_tokens + 16));
    EXPECT_LE(r.prompt.size(), static_cast<size_t>(r.prefix_tokens + 64));
    EXPECT_EQ(r.output_tokens, 32);
    const std::vector<TokenId> prefix(r.prompt.begin(), r.prompt.begin() + r.prefix_tokens);
    auto [it, inserted] = prefix_of.emplace(r.tenant, prefix);
    if (!inserted) {
      EXPECT_EQ(it->second, prefix);
    }
  }
  EXPECT_EQ(prefix_of.size(), 3u);
}

TEST(WorkloadTest, SharedPrefixShapeOfThePaper) {
  // n_p = 512 prompt tokens, the first n_s shared by all, n_c = 8 output tokens.
  for (int32_t ns : {0, 256, 512}) {
    SCOPED_TRACE(ns);
    WorkloadOptions o = ForSharedPrefix(512, ns, 8);
    o.num_requests = 20;
    o.vocab_size = 1000;
    const std::vector<WorkloadRequest> w = Generate(o);
    ASSERT_EQ(w.size(), 20u);
    std::set<std::vector<TokenId>> suffixes;
    for (const WorkloadRequest& r : w) {
      EXPECT_EQ(r.prompt.size(), 512u);
      EXPECT_EQ(r.output_tokens, 8);
      EXPECT_EQ(r.tenant, ns > 0 ? 0 : -1);
      EXPECT_EQ(r.prefix_tokens, ns);
      EXPECT_TRUE(std::equal(w[0].prompt.begin(), w[0].prompt.begin() + ns, r.prompt.begin()));
      suffixes.emplace(r.prompt.begin() + ns, r.prompt.end());
    }
    // Unique user parts (none at all when everything is shared).
    EXPECT_EQ(suffixes.size(), ns == 512 ? 1u : 20u);
  }
  EXPECT_EQ(GenerateWorkload(ForSharedPrefix(100, 200, 8)).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(GenerateWorkload(ForSharedPrefix(0, 0, 8)).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(GenerateWorkload(ForSharedPrefix(64, 0, 0)).status().code(),
            StatusCode::kInvalidArgument);
}

TEST(WorkloadTest, RateZeroPutsEveryArrivalAtTimeZero) {
  WorkloadOptions o;
  o.num_requests = 10;
  o.arrival_rate = 0;
  for (const WorkloadRequest& r : Generate(o)) EXPECT_EQ(r.arrival_s, 0.0);
  o.arrival_rate = -1;
  EXPECT_EQ(MakeSyntheticWorkload(o).status().code(), StatusCode::kInvalidArgument);
}

TEST(WorkloadTest, BadExactLengthsAreRejected) {
  WorkloadOptions o;
  o.prefix_lengths = {64, -1};
  EXPECT_EQ(MakeSyntheticWorkload(o).status().code(), StatusCode::kInvalidArgument);
  o.prefix_lengths = {64, 0};  // a request could have an empty prompt
  o.min_suffix_tokens = 0;
  EXPECT_EQ(MakeSyntheticWorkload(o).status().code(), StatusCode::kInvalidArgument);
  o.min_suffix_tokens = 1;
  EXPECT_OK(MakeSyntheticWorkload(o).status());
}

TEST(WorkloadTest, JsonlTraceRoundTripsAndRejectsBadLines) {
  WorkloadRequest r;
  r.arrival_s = 0.5;
  r.tenant = 3;
  r.prefix_tokens = 100;
  r.output_tokens = 7;
  r.prompt.assign(130, 1);
  const std::string text = ToJsonlLine(r, false) + "\n\n" +
                           R"({"arrival_s": 0.75, "prompt": [1, 2, 3], "output_tokens": 2})";
  ASSERT_OK_AND_ASSIGN(auto src, ParseJsonlTrace(text));
  auto a = src->Next();
  ASSERT_TRUE(a);
  EXPECT_EQ(a->tenant, 3);
  EXPECT_EQ(a->prompt.size(), 130u);
  EXPECT_EQ(a->output_tokens, 7);
  auto b = src->Next();
  ASSERT_TRUE(b);
  EXPECT_EQ(b->prompt, (std::vector<TokenId>{1, 2, 3}));
  EXPECT_FALSE(src->Next());
  // Two compact lines of one prefix id share their prefix tokens.
  ASSERT_OK_AND_ASSIGN(auto two,
                       ParseJsonlTrace(ToJsonlLine(r, false) + "\n" + ToJsonlLine(r, false)));
  auto x = two->Next(), y = two->Next();
  EXPECT_TRUE(std::equal(x->prompt.begin(), x->prompt.begin() + 100, y->prompt.begin()));
  EXPECT_NE(x->prompt, y->prompt);
  for (const char* bad : {"not json", R"({"arrival_s": 1})",
                          R"({"arrival_s": 1, "output_tokens": 1, "prompt": [-1]})",
                          R"({"arrival_s": -1, "output_tokens": 1, "prompt": [1]})",
                          R"({"arrival_s": 1, "output_tokens": 1, "prefix_id": 1})"}) {
    EXPECT_EQ(ParseJsonlTrace(bad).status().code(), StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_EQ(LoadJsonlTrace("/nonexistent/trace.jsonl").status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace chunkserve::workload
