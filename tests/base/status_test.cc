#include "runtime/base/status.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "tests/testing/status_matchers.h"

namespace chunkserve {
namespace {

using ::chunkserve::testing::StatusIs;
using ::testing::HasSubstr;

TEST(StatusTest, DefaultIsOkWithEmptyMessage) {
  Status s;
  EXPECT_TRUE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kOk);
  EXPECT_EQ(s.message(), "");
  EXPECT_EQ(s.ToString(), "OK");
}

TEST(StatusTest, OkCodeNeverCarriesAMessage) {
  Status s(StatusCode::kOk, "ignored");
  EXPECT_TRUE(s.ok());
  EXPECT_EQ(s.message(), "");
}

TEST(StatusTest, ErrorKeepsCodeAndMessage) {
  Status s = Status::ResourceExhausted("no free slots: need 3, have 1");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(s.ToString(), "RESOURCE_EXHAUSTED: no free slots: need 3, have 1");
}

TEST(StatusTest, CopiesAreIndependent) {
  Status a = Status::NotFound("seq 4");
  Status b = a;
  a = Status::Ok();
  EXPECT_TRUE(a.ok());
  EXPECT_EQ(b, Status::NotFound("seq 4"));
}

TEST(StatusTest, AnnotatePrefixesContextAndKeepsCode) {
  EXPECT_EQ(Status::DataLoss("header truncated").Annotate("model.safetensors"),
            Status::DataLoss("model.safetensors: header truncated"));
  EXPECT_TRUE(Status::Ok().Annotate("ctx").ok());
}

TEST(StatusTest, EveryCodeHasAStableName) {
  EXPECT_EQ(StatusCodeName(StatusCode::kInvalidArgument), "INVALID_ARGUMENT");
  EXPECT_EQ(StatusCodeName(StatusCode::kAborted), "ABORTED");
  EXPECT_EQ(StatusCodeName(StatusCode::kUnauthenticated), "UNAUTHENTICATED");
  for (int c = 0; c <= static_cast<int>(StatusCode::kUnauthenticated); ++c) {
    EXPECT_NE(StatusCodeName(static_cast<StatusCode>(c)), "UNKNOWN") << c;
  }
}

Result<int> ParsePositive(int x) {
  if (x <= 0) return Status::InvalidArgument("not positive: " + std::to_string(x));
  return x;
}

Result<int> DoubleIt(int x) {
  CHUNKSERVE_ASSIGN_OR_RETURN(int v, ParsePositive(x));
  return 2 * v;
}

Status CheckBoth(int a, int b) {
  CHUNKSERVE_RETURN_IF_ERROR(ParsePositive(a));
  CHUNKSERVE_RETURN_IF_ERROR(DoubleIt(b).status());
  return Status::Ok();
}

TEST(ResultTest, HoldsValueOrError) {
  Result<int> ok = ParsePositive(3);
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(*ok, 3);
  Result<int> bad = ParsePositive(-1);
  EXPECT_THAT(bad, StatusIs(StatusCode::kInvalidArgument, HasSubstr("-1")));
  EXPECT_EQ(bad.value_or(7), 7);
}

TEST(ResultTest, MacrosPropagateTheFirstError) {
  EXPECT_EQ(*DoubleIt(21), 42);
  EXPECT_THAT(DoubleIt(0), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_OK(CheckBoth(1, 2));
  EXPECT_THAT(CheckBoth(1, -5), StatusIs(StatusCode::kInvalidArgument, HasSubstr("-5")));
}

TEST(ResultTest, OkStatusWithoutValueBecomesInternalError) {
  Result<int> r = Status::Ok();
  EXPECT_THAT(r, StatusIs(StatusCode::kInternal));
}

TEST(ResultTest, HoldsMoveOnlyTypes) {
  Result<std::unique_ptr<int>> r = std::make_unique<int>(5);
  ASSERT_TRUE(r.ok());
  std::unique_ptr<int> p = std::move(r).value();
  EXPECT_EQ(*p, 5);
}

}  // namespace
}  // namespace chunkserve
