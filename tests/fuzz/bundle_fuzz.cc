// libFuzzer target: ImportBundleFrom on arbitrary bytes must never crash, never write
// outside the cache it was given, and fail only with InvalidArgument, DataLoss,
// PermissionDenied or FailedPrecondition; what it accepts is a bundle whose every
// object hashes to its name.
#include <stdlib.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <string_view>

#include "artifacts/bundle.h"
#include "base/sha256.h"

namespace {

[[noreturn]] void Fail(const char* what, const std::string& detail) {
  std::fprintf(stderr, "bundle_fuzz: %s\n%s\n", what, detail.c_str());
  std::abort();
}

// One scratch directory per process: the cache, and a sibling that must stay empty.
const std::string& Scratch() {
  static const std::string dir = [] {
    std::string t = (std::filesystem::temp_directory_path() / "cubist-bundle-fuzz-XXXXXX").string();
    if (::mkdtemp(t.data()) == nullptr) Fail("mkdtemp", t);
    std::filesystem::create_directories(t + "/outside");
    return t;
  }();
  static const bool cleanup_registered = [] {
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(Scratch(), ec);
    });
    return true;
  }();
  (void)cleanup_registered;
  return dir;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace cubist;
  const std::string cache = Scratch() + "/cache";
  std::error_code ec;
  std::filesystem::remove_all(cache, ec);
  absl::StatusOr<Store> store = Store::Open(cache);
  if (!store.ok()) Fail("store", std::string(store.status().message()));
  size_t at = 0;
  ByteSource source = [&](char* buf, size_t n) -> absl::StatusOr<size_t> {
    const size_t k = std::min(n, size - at);
    std::memcpy(buf, data + at, k);
    at += k;
    return k;
  };
  ImportBundleOptions options;
  options.max_manifest_bytes = 1 << 20;
  options.max_object_bytes = 1 << 20;
  absl::StatusOr<BundleReport> r = ImportBundleFrom(*store, source, "fuzz.tar", options);
  if (!r.ok()) {
    const absl::StatusCode c = r.status().code();
    if (c != absl::StatusCode::kInvalidArgument && c != absl::StatusCode::kDataLoss &&
        c != absl::StatusCode::kPermissionDenied && c != absl::StatusCode::kFailedPrecondition) {
      Fail("unexpected error code", std::string(r.status().message()));
    }
  } else {
    auto objects = store->ListObjects();
    if (!objects.ok()) Fail("list", std::string(objects.status().message()));
    for (const std::string& sha : *objects) {
      auto actual = Sha256File(store->ObjectPath(sha));
      if (!actual.ok() || *actual != sha) Fail("published an object that does not hash", sha);
    }
  }
  if (!std::filesystem::is_empty(Scratch() + "/outside", ec) || ec) {
    Fail("wrote outside the cache", Scratch());
  }
  return 0;
}
