#include "base/unique_fd.h"

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "base/strings.h"

namespace cubist {

absl::Status ErrnoToStatus(int err, std::string_view context) {
  std::string msg = absl::StrCat(Sv(context), ": ", std::strerror(err));
  switch (err) {
    case ENOENT:
    case ENOTDIR:
      return absl::NotFoundError(msg);
    case EACCES:
    case EPERM:
    case EROFS:
      return absl::PermissionDeniedError(msg);
    case ENOSPC:
    case EDQUOT:
      return absl::ResourceExhaustedError(msg);
    default:
      return absl::InternalError(msg);
  }
}

}  // namespace cubist
