// Small helpers for absl::Status plumbing. Debian 12's abseil (20220623) predates
// abseil's own public macros, so cubist carries these two.
#ifndef CUBIST_BASE_STATUS_MACROS_H_
#define CUBIST_BASE_STATUS_MACROS_H_

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define CUBIST_STATUS_CONCAT_INNER_(a, b) a##b
#define CUBIST_STATUS_CONCAT_(a, b) CUBIST_STATUS_CONCAT_INNER_(a, b)

// Returns from the enclosing function when `expr` (an absl::Status) is not OK.
#define CUBIST_RETURN_IF_ERROR(expr)                      \
  do {                                                    \
    ::absl::Status cubist_status_ = (expr);               \
    if (!cubist_status_.ok()) return cubist_status_;      \
  } while (0)

// `CUBIST_ASSIGN_OR_RETURN(auto x, Foo());` evaluates the StatusOr, returns its
// status on error, and otherwise moves the value into the declared variable.
#define CUBIST_ASSIGN_OR_RETURN(lhs, rexpr)                                   \
  CUBIST_ASSIGN_OR_RETURN_IMPL_(                                              \
      CUBIST_STATUS_CONCAT_(cubist_statusor_, __LINE__), lhs, rexpr)

#define CUBIST_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, rexpr) \
  auto statusor = (rexpr);                                  \
  if (!statusor.ok()) return std::move(statusor).status();  \
  lhs = std::move(statusor).value()

namespace cubist {

// Prefixes a non-OK status message with context, keeping its code:
// "fetch x.cubin: " + "connection refused".
inline absl::Status Annotate(const absl::Status& status,
                             std::string_view context) {
  if (status.ok()) return status;
  return absl::Status(status.code(),
                      std::string(context) + ": " + std::string(status.message()));
}

}  // namespace cubist

#endif  // CUBIST_BASE_STATUS_MACROS_H_
