// Move-only owner of a dlopen() handle.
//
// For libraries cubist reaches at run time instead of at link time, so that a command
// that never needs them does not pay for loading them (artifacts/curl_library.h).
#ifndef CUBIST_BASE_SHARED_LIBRARY_H_
#define CUBIST_BASE_SHARED_LIBRARY_H_

#include <string>
#include <utility>

#include "absl/status/statusor.h"

namespace cubist {

class SharedLibrary {
 public:
  // dlopen(name, RTLD_NOW | RTLD_LOCAL): every symbol the library needs is bound now
  // (a broken installation fails here, not at some later call), and none of its symbols
  // joins the process's global namespace. FailedPrecondition "dlopen <name>: <dlerror>"
  // when the loader cannot open it.
  [[nodiscard]] static absl::StatusOr<SharedLibrary> Open(const std::string& name);

  SharedLibrary() = default;
  ~SharedLibrary() { Close(); }
  SharedLibrary(SharedLibrary&& other) noexcept : handle_(std::exchange(other.handle_, nullptr)) {}
  SharedLibrary& operator=(SharedLibrary&& other) noexcept {
    if (this != &other) {
      Close();
      handle_ = std::exchange(other.handle_, nullptr);
    }
    return *this;
  }
  SharedLibrary(const SharedLibrary&) = delete;
  SharedLibrary& operator=(const SharedLibrary&) = delete;

  bool loaded() const { return handle_ != nullptr; }
  // The address of `symbol`, or nullptr when the library does not define it.
  void* Symbol(const char* symbol) const;

 private:
  explicit SharedLibrary(void* handle) : handle_(handle) {}
  void Close();

  void* handle_ = nullptr;
};

}  // namespace cubist

#endif  // CUBIST_BASE_SHARED_LIBRARY_H_
