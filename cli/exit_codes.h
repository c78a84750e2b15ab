// The `cubist` command's exit codes. Each means one thing, so that CI and scripts can
// branch on them; README.md documents the same table.
#ifndef CUBIST_CLI_EXIT_CODES_H_
#define CUBIST_CLI_EXIT_CODES_H_

#include "absl/status/status.h"

namespace cubist::cli {

enum ExitCode : int {
  kExitOk = 0,
  kExitFailure = 1,        // internal or unclassified error
  kExitUsage = 2,          // bad flag, bad argument, unknown command
  kExitIntegrity = 3,      // hash or size mismatch, corrupt cache (DataLoss)
  kExitNetwork = 4,        // network failure after retries (Unavailable, DeadlineExceeded)
  kExitNotFound = 5,       // artifact missing (offline, 404 everywhere), no kernel found
  kExitPrecondition = 6,   // no driver/GPU, wrong SM, rollback or expiry refused
  kExitPermission = 7,     // signature missing or bad, unwritable cache
  kExitInvalidInput = 8,   // malformed manifest, cubin or other input file
  kExitResource = 9,       // local resources: disk full, quota, out of memory
};

// Maps a status to the exit code its caller should see.
inline int ExitCodeFor(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kOk: return kExitOk;
    case absl::StatusCode::kDataLoss: return kExitIntegrity;
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kDeadlineExceeded: return kExitNetwork;
    case absl::StatusCode::kNotFound: return kExitNotFound;
    case absl::StatusCode::kFailedPrecondition: return kExitPrecondition;
    case absl::StatusCode::kPermissionDenied: return kExitPermission;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange: return kExitInvalidInput;
    case absl::StatusCode::kResourceExhausted: return kExitResource;
    default: return kExitFailure;
  }
}

}  // namespace cubist::cli

#endif  // CUBIST_CLI_EXIT_CODES_H_
