// GoogleTest helpers for Status and Result<T>.
//
//   EXPECT_OK(tree.Release(seq));
//   ASSERT_OK_AND_ASSIGN(MatchResult m, tree.Insert(seq, prompt));
//   EXPECT_THAT(tree.Append(seq, tokens), StatusIs(StatusCode::kResourceExhausted));
//   EXPECT_THAT(parse(text), StatusIs(StatusCode::kInvalidArgument, HasSubstr("vocab")));
#ifndef CHUNKSERVE_TESTS_TESTING_STATUS_MATCHERS_H_
#define CHUNKSERVE_TESTS_TESTING_STATUS_MATCHERS_H_

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "runtime/base/status.h"

namespace chunkserve::testing {

inline const Status& GetStatus(const Status& s) { return s; }
template <typename T>
Status GetStatus(const Result<T>& r) {
  return r.status();
}

MATCHER_P(StatusIsImpl, code, "") {
  const Status s = GetStatus(arg);
  *result_listener << "status is " << s;
  return s.code() == code;
}

MATCHER_P2(StatusIsWithMessageImpl, code, message_matcher, "") {
  const Status s = GetStatus(arg);
  *result_listener << "status is " << s;
  return s.code() == code &&
         ::testing::ExplainMatchResult(message_matcher, std::string(s.message()), result_listener);
}

inline auto StatusIs(StatusCode code) { return StatusIsImpl(code); }
template <typename M>
auto StatusIs(StatusCode code, M message_matcher) {
  return StatusIsWithMessageImpl(code, message_matcher);
}

MATCHER(IsOk, "") {
  const Status s = GetStatus(arg);
  *result_listener << "status is " << s;
  return s.ok();
}

}  // namespace chunkserve::testing

#define EXPECT_OK(expr) EXPECT_THAT((expr), ::chunkserve::testing::IsOk())
#define ASSERT_OK(expr) ASSERT_THAT((expr), ::chunkserve::testing::IsOk())

#define ASSERT_OK_AND_ASSIGN(lhs, rexpr)                                                       \
  ASSERT_OK_AND_ASSIGN_IMPL_(CHUNKSERVE_CONCAT_(chunkserve_test_result_, __LINE__), lhs, rexpr)
#define ASSERT_OK_AND_ASSIGN_IMPL_(result, lhs, rexpr) \
  auto result = (rexpr);                               \
  ASSERT_TRUE(result.ok()) << result.status();         \
  lhs = std::move(result).value()

#endif  // CHUNKSERVE_TESTS_TESTING_STATUS_MATCHERS_H_
