#include "base/shared_library.h"

#include <dlfcn.h>

#include "absl/strings/str_cat.h"

namespace cubist {

absl::StatusOr<SharedLibrary> SharedLibrary::Open(const std::string& name) {
  dlerror();  // clear a stale error, so the one below is ours
  void* handle = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* err = dlerror();
    return absl::FailedPreconditionError(
        absl::StrCat("dlopen ", name, ": ", err != nullptr ? err : "unknown error"));
  }
  return SharedLibrary(handle);
}

void* SharedLibrary::Symbol(const char* symbol) const {
  return handle_ != nullptr ? dlsym(handle_, symbol) : nullptr;
}

void SharedLibrary::Close() {
  if (handle_ != nullptr) dlclose(handle_);
  handle_ = nullptr;
}

}  // namespace cubist
