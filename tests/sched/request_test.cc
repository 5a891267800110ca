#include "runtime/sched/request.h"

#include <gtest/gtest.h>

#include <limits>

#include "tests/testing/status_matchers.h"

namespace chunkserve::sched {
namespace {

using ::chunkserve::testing::StatusIs;
using ::testing::HasSubstr;

RequestOptions Valid() {
  RequestOptions r;
  r.prompt = {1, 2, 3};
  r.max_new_tokens = 4;
  return r;
}

TEST(ValidateRequestTest, AcceptsAValidRequest) { EXPECT_OK(ValidateRequest(Valid(), 100, 64)); }

TEST(ValidateRequestTest, RejectsEmptyPrompt) {
  RequestOptions r = Valid();
  r.prompt.clear();
  EXPECT_THAT(ValidateRequest(r, 100, 64), StatusIs(StatusCode::kInvalidArgument, HasSubstr("empty")));
}

TEST(ValidateRequestTest, RejectsTokenIdOutsideVocab) {
  RequestOptions r = Valid();
  r.prompt[1] = 100;
  EXPECT_THAT(ValidateRequest(r, 100, 64),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("id 100")));
  r.prompt[1] = -1;
  EXPECT_THAT(ValidateRequest(r, 100, 64), StatusIs(StatusCode::kInvalidArgument));
  r = Valid();
  r.stop_tokens = {1000};
  EXPECT_THAT(ValidateRequest(r, 100, 64), StatusIs(StatusCode::kInvalidArgument));
}

TEST(ValidateRequestTest, RejectsZeroMaxNewTokens) {
  RequestOptions r = Valid();
  r.max_new_tokens = 0;
  EXPECT_THAT(ValidateRequest(r, 100, 64),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("max_new_tokens")));
}

TEST(ValidateRequestTest, RejectsPromptFillingTheContext) {
  RequestOptions r = Valid();
  r.prompt.assign(64, 1);
  EXPECT_THAT(ValidateRequest(r, 100, 64), StatusIs(StatusCode::kInvalidArgument));
}

TEST(ValidateRequestTest, RejectsBadSamplingParameters) {
  RequestOptions r = Valid();
  r.sampling.temperature = -1.0f;
  EXPECT_THAT(ValidateRequest(r, 100, 64), StatusIs(StatusCode::kInvalidArgument));
  r.sampling.temperature = std::numeric_limits<float>::quiet_NaN();
  EXPECT_THAT(ValidateRequest(r, 100, 64), StatusIs(StatusCode::kInvalidArgument));
  r = Valid();
  r.sampling.top_p = 0.0f;
  EXPECT_THAT(ValidateRequest(r, 100, 64), StatusIs(StatusCode::kInvalidArgument));
  r = Valid();
  r.sampling.top_k = -2;
  EXPECT_THAT(ValidateRequest(r, 100, 64), StatusIs(StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace chunkserve::sched
