// Workload families (workload.h, WorkloadFamily): shapes, determinism, limits, controls.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <vector>

#include "runtime/workload/workload.h"
#include "tests/testing/status_matchers.h"

namespace chunkserve::workload {
namespace {

std::vector<WorkloadRequest> Generate(const WorkloadOptions& o) {
  Result<std::vector<WorkloadRequest>> all = GenerateWorkload(o);
  EXPECT_TRUE(all.ok()) << all.status();
  return all.ok() ? std::move(all).value() : std::vector<WorkloadRequest>{};
}

bool StartsWith(const std::vector<TokenId>& a, const std::vector<TokenId>& prefix) {
  return a.size() >= prefix.size() && std::equal(prefix.begin(), prefix.end(), a.begin());
}

TEST(WorkloadFamilyTest, NamesRoundTrip) {
  for (WorkloadFamily f : AllWorkloadFamilies()) {
    ASSERT_OK_AND_ASSIGN(WorkloadFamily g, ParseWorkloadFamily(WorkloadFamilyName(f)));
    EXPECT_EQ(f, g);
    EXPECT_EQ(ForFamily(f).family, f);
  }
  EXPECT_EQ(ParseWorkloadFamily("chat").status().code(), StatusCode::kInvalidArgument);
}

TEST(WorkloadFamilyTest, EveryFamilyIsDeterministicAndHasItsControl) {
  for (WorkloadFamily f : AllWorkloadFamilies()) {
    WorkloadOptions o = ForFamily(f);
    o.num_requests = 200;
    o.seed = 3;
    const auto a = Generate(o), b = Generate(o);
    ASSERT_EQ(a.size(), 200u) << WorkloadFamilyName(f);
    for (size_t i = 0; i < a.size(); ++i) {
      ASSERT_EQ(a[i].prompt, b[i].prompt);
      ASSERT_EQ(a[i].arrival_s, b[i].arrival_s);
      ASSERT_EQ(a[i].output_tokens, b[i].output_tokens);
    }
    // The control: no two prompts share a first token run of 16. Conversation families keep
    // every length and arrival; multi_tenant and long_doc (one generator) keep the length
    // distributions (their control draws tokens from the same stream).
    o.shared_prefixes = false;
    const auto c = Generate(o);
    ASSERT_EQ(c.size(), a.size());
    const bool same = f == WorkloadFamily::kMultiTurn || f == WorkloadFamily::kAgent;
    std::set<std::vector<TokenId>> firsts;
    for (size_t i = 0; i < c.size(); ++i) {
      if (same) {
        EXPECT_EQ(c[i].prompt.size(), a[i].prompt.size());
        EXPECT_EQ(c[i].arrival_s, a[i].arrival_s);
      }
      EXPECT_TRUE(
          firsts.insert(std::vector<TokenId>(c[i].prompt.begin(), c[i].prompt.begin() + 16)).second)
          << WorkloadFamilyName(f) << " " << i;
    }
  }
}

TEST(WorkloadFamilyTest, MultiTurnPromptsExtendThePreviousTurn) {
  WorkloadOptions o = ForFamily(WorkloadFamily::kMultiTurn);
  o.num_requests = 600;
  o.active_conversations = 16;
  o.max_prompt_tokens = 8192;
  const auto all = Generate(o);
  ASSERT_EQ(all.size(), 600u);
  int64_t continuations = 0;
  for (size_t i = 0; i < all.size(); ++i) {
    const WorkloadRequest& r = all[i];
    EXPECT_LE(static_cast<int64_t>(r.prompt.size()), o.max_prompt_tokens);
    // Everyone starts with the same system prompt.
    EXPECT_TRUE(StartsWith(
        r.prompt, std::vector<TokenId>(all[0].prompt.begin(), all[0].prompt.begin() + 256)));
    // A continuation = an earlier prompt + its answer + a new message.
    for (size_t j = i; j-- > 0;) {
      const WorkloadRequest& p = all[j];
      if (r.prompt.size() > p.prompt.size() + 256 && StartsWith(r.prompt, p.prompt)) {
        const int64_t message =
            static_cast<int64_t>(r.prompt.size() - p.prompt.size()) - p.output_tokens;
        EXPECT_GE(message, o.min_suffix_tokens);
        EXPECT_LE(message, o.max_suffix_tokens);
        ++continuations;
        break;
      }
    }
  }
  // 2-12 turns: most requests continue a conversation.
  EXPECT_GT(continuations, 300);
}

TEST(WorkloadFamilyTest, AgentAndLongDocShapes) {
  WorkloadOptions a = ForFamily(WorkloadFamily::kAgent);
  a.num_requests = 300;
  std::set<int32_t> toolsets;
  int64_t max_len = 0;
  for (const WorkloadRequest& r : Generate(a)) {
    EXPECT_GE(r.prefix_tokens, a.min_prefix_tokens);
    EXPECT_LE(r.prefix_tokens, a.max_prefix_tokens);
    EXPECT_LE(r.output_tokens, a.max_output_tokens);
    toolsets.insert(r.tenant);
    max_len = std::max<int64_t>(max_len, static_cast<int64_t>(r.prompt.size()));
  }
  EXPECT_GT(toolsets.size(), 1u);
  EXPECT_LE(toolsets.size(), 8u);
  EXPECT_LE(max_len, a.max_prompt_tokens);
  WorkloadOptions d = ForFamily(WorkloadFamily::kLongDoc);
  d.num_requests = 50;
  std::set<int32_t> docs;
  int64_t longest = 0;
  for (const WorkloadRequest& r : Generate(d)) {
    docs.insert(r.tenant);
    longest = std::max<int64_t>(longest, static_cast<int64_t>(r.prompt.size()));
    EXPECT_GE(r.prefix_tokens, 16000);
  }
  EXPECT_LE(docs.size(), 8u);
  EXPECT_GT(longest, 64000);   // documents go far past 16k tokens
  EXPECT_LE(longest, 120512);  // up to 120k + a question
}

TEST(WorkloadFamilyTest, BadFamilyOptionsAreErrors) {
  WorkloadOptions o = ForFamily(WorkloadFamily::kMultiTurn);
  o.min_turns = 0;
  EXPECT_EQ(MakeSyntheticWorkload(o).status().code(), StatusCode::kInvalidArgument);
  o = ForFamily(WorkloadFamily::kAgent);
  o.max_prompt_tokens = 1000;  // tool definitions alone are longer
  EXPECT_EQ(MakeSyntheticWorkload(o).status().code(), StatusCode::kInvalidArgument);
  o = ForFamily(WorkloadFamily::kMultiTurn);
  o.active_conversations = 0;
  EXPECT_EQ(MakeSyntheticWorkload(o).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace chunkserve::workload
