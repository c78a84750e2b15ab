// Status assertions for cubist's tests: a matcher on code and message, and OK checks
// that print the status when they fail.
#ifndef CUBIST_TESTS_TESTLIB_STATUS_MATCHERS_H_
#define CUBIST_TESTS_TESTLIB_STATUS_MATCHERS_H_

#include <string>
#include <type_traits>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace cubist::testing {

// Matches an absl::Status or absl::StatusOr<T> whose code is `code` and whose message
// matches `msg` (e.g. HasSubstr("sha256")):
//   EXPECT_THAT(Parse(x), StatusIs(absl::StatusCode::kInvalidArgument,
//                                  HasSubstr("artifacts[0].sha256")));
MATCHER_P2(StatusIs, code, msg, "") {
  const absl::Status& s = [](const auto& v) -> const absl::Status& {
    if constexpr (std::is_same_v<std::decay_t<decltype(v)>, absl::Status>) {
      return v;
    } else {
      return v.status();
    }
  }(arg);
  *result_listener << "status is " << s;
  return s.code() == code &&
         ::testing::ExplainMatchResult(msg, std::string(s.message()), result_listener);
}

// The status of an absl::Status or an absl::StatusOr<T>.
inline const absl::Status& StatusOf(const absl::Status& s) { return s; }
template <typename T>
const absl::Status& StatusOf(const absl::StatusOr<T>& s) {
  return s.status();
}

#define CUBIST_ASSERT_OK(expr)                                           \
  do {                                                                   \
    const auto& _st = (expr);                                            \
    ASSERT_TRUE(_st.ok()) << ::cubist::testing::StatusOf(_st);           \
  } while (0)
#define CUBIST_EXPECT_OK(expr)                                           \
  do {                                                                   \
    const auto& _st = (expr);                                            \
    EXPECT_TRUE(_st.ok()) << ::cubist::testing::StatusOf(_st);           \
  } while (0)

}  // namespace cubist::testing

#endif  // CUBIST_TESTS_TESTLIB_STATUS_MATCHERS_H_
