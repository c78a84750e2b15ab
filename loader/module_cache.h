// The per-context module cache: verified bytes in, launchable CUfunctions out.
//
// Usage:
//   CUBIST_ASSIGN_OR_RETURN(auto cache, ModuleCache::Create(*driver, ctx.get()));
//   CUBIST_ASSIGN_OR_RETURN(ImageId img, cache->AddImageFile(path, {.from_verified_store = true}));
//   CUBIST_ASSIGN_OR_RETURN(FunctionId fn, cache->AddFunction(img, "moe_gemm_...", 98304));
//   ...
//   CUBIST_ASSIGN_OR_RETURN(CUfunction f, cache->GetFunction(fn));   // hot path
//
// Registration (AddImage*, AddFunction) is cheap and touches neither the file nor the
// driver. Loading is lazy: the first GetFunction of an image's function
//   1. reads the bytes (AddImageFile) or takes the registered ones (AddImage),
//   2. checks their SHA-256 against ImageOptions::expected_sha256 unless they came from
//      the verified store or the caller opted out (DataLoss on mismatch),
//   3. inspects the ELF/fatbin and refuses an image that cannot run on this context's
//      device (FailedPrecondition naming both SMs) before any driver call,
//   4. loads it with cuLibraryLoadData (context independent; preferred when the driver
//      has it) or cuModuleLoadData,
// once per image, however many threads ask at the same time. The function lookup and,
// when the requested dynamic shared memory exceeds 48 KiB,
// cuFuncSetAttribute(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES) also happen once
// per function. Failures are sticky: a failed image or function returns the same status
// on every later call without retrying (the inputs have not changed); except for a file
// that could not be read or did not hash to its name, which a fetch may repair.
//
// Preload() does all of that up front, for engines that must not load during CUDA-graph
// capture (lazy loading may synchronise the context).
//
// Hot path: GetFunction(FunctionId) on a loaded function is three atomic loads (count,
// chunk, slot) and no allocation, lock or hashing (ids index a chunked array); 3.8 ns
// on the H200 machine, against 46 ns for cuModuleGetFunction (docs/benchmarks.md).
//
// Ownership: the cache owns every CUlibrary/CUmodule it loads and unloads them on
// destruction (with its context made current). It does not own the context or the
// driver table; both must outlive it.
//
// Thread safety: every method may be called from any thread concurrently.
#ifndef CUBIST_LOADER_MODULE_CACHE_H_
#define CUBIST_LOADER_MODULE_CACHE_H_

#include <cuda.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "loader/compat.h"
#include "loader/driver_api.h"

namespace cubist {

// Identifies an image registered with one ModuleCache. Dense, small, cheap to copy.
struct ImageId {
  uint32_t value = UINT32_MAX;
  bool valid() const { return value != UINT32_MAX; }
  bool operator==(const ImageId&) const = default;
};

// Identifies a function (image + symbol) registered with one ModuleCache.
struct FunctionId {
  uint32_t value = UINT32_MAX;
  bool valid() const { return value != UINT32_MAX; }
  bool operator==(const FunctionId&) const = default;
};

struct ImageOptions {
  // Lowercase hex SHA-256 the bytes must have. Required unless one of the flags below
  // is set; AddImage* without it is InvalidArgument.
  std::string expected_sha256;
  // The bytes come from the content-addressed store (artifacts/), which only holds
  // verified content: no second hash at load.
  bool from_verified_store = false;
  // The caller explicitly opts out of hashing (bytes embedded in its own binary, say).
  bool skip_hash_check = false;
};

class ModuleCache {
 public:
  struct Options {
    // Use cuLibraryLoadData when the driver has it (CUDA 12.0+); else cuModuleLoadData.
    bool prefer_library_api = true;
  };

  struct Stats {
    uint64_t images_loaded = 0;      // successful driver loads
    uint64_t load_failures = 0;      // images refused or failed
    uint64_t functions_resolved = 0; // successful function lookups (driver calls)
    uint64_t attributes_set = 0;     // cuFuncSetAttribute calls
    uint64_t bytes_hashed = 0;       // bytes checked against expected_sha256
  };

  // Binds the cache to `context` (made current around every driver call it makes) and
  // reads the context's device SM. `driver` and `context` must outlive the cache.
  // Errors: driver errors through CuCheck.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<ModuleCache>> Create(
      DriverApi& driver, CUcontext context, Options options);
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<ModuleCache>> Create(
      DriverApi& driver, CUcontext context) {
    return Create(driver, context, Options());
  }

  ~ModuleCache();
  ModuleCache(const ModuleCache&) = delete;
  ModuleCache& operator=(const ModuleCache&) = delete;

  // Registers bytes the cache keeps (moved in). `name` appears in error messages.
  [[nodiscard]] absl::StatusOr<ImageId> AddImage(std::string name, std::string bytes,
                                                 ImageOptions options);
  // Registers a file read at first load (and released after it). Registering the same
  // path twice returns the same id.
  [[nodiscard]] absl::StatusOr<ImageId> AddImageFile(std::string path,
                                                     ImageOptions options);

  // Registers a function of `image`. `dynamic_shared_bytes` is the most dynamic shared
  // memory its launches will request (KernelSpec::shared_mem_bytes); above 48 KiB the
  // cache raises the function's limit once. Registering the same (image, name) again
  // returns the same id (and keeps the larger shared-memory request if not yet loaded).
  // Errors: InvalidArgument for an unknown image or an empty name.
  [[nodiscard]] absl::StatusOr<FunctionId> AddFunction(ImageId image, std::string name,
                                                       int dynamic_shared_bytes = 0);

  // The function, loading its image and resolving it on first use. Errors: NotFound
  // (no such function in the image), DataLoss (hash mismatch), FailedPrecondition
  // (image cannot run on this device), InvalidArgument (malformed image or bad id),
  // driver errors through CuCheck.
  [[nodiscard]] absl::StatusOr<CUfunction> GetFunction(FunctionId id);

  // Convenience: finds (image, name) under a shared lock (no allocation once registered;
  // about 0.1-0.2 us), registering it on first use, then GetFunction. Prefer ids on hot
  // paths.
  [[nodiscard]] absl::StatusOr<CUfunction> GetFunction(ImageId image,
                                                       std::string_view name);

  // Loads an image now (without resolving functions).
  [[nodiscard]] absl::Status LoadImage(ImageId image);

  // Loads the images of these functions and resolves them now; stops at the first
  // error and returns it.
  [[nodiscard]] absl::Status Preload(absl::Span<const FunctionId> functions);
  // Preload of every function registered so far.
  [[nodiscard]] absl::Status PreloadAll();

  CUcontext context() const { return context_; }
  DeviceSm device_sm() const { return device_sm_; }
  DriverApi& driver() const { return *driver_; }
  Stats stats() const;

 private:
  struct ImageSlot;
  struct FunctionSlot;
  static constexpr uint32_t kChunkBits = 10;
  static constexpr uint32_t kChunkSize = 1u << kChunkBits;
  static constexpr uint32_t kMaxChunks = 4096;  // about 4 million ids of each kind

  ModuleCache(DriverApi& driver, CUcontext context, DeviceSm sm, Options options);
  absl::StatusOr<ImageId> AddImageSlot(std::string name, std::string bytes, bool from_file,
                                       ImageOptions options);
  ImageSlot* image_slot(uint32_t index) const;
  FunctionSlot* function_slot(uint32_t index) const;
  // Both run with the image's mutex held.
  absl::Status EnsureLoadedLocked(ImageSlot& image);
  absl::StatusOr<CUfunction> ResolveLocked(ImageSlot& image, FunctionSlot& fn);
  absl::StatusOr<CUfunction> ResolveSlow(FunctionSlot& fn);

  DriverApi* driver_;
  CUcontext context_;
  DeviceSm device_sm_;
  Options options_;

  struct Registry;  // the mutex-protected registration maps (names -> ids)
  std::unique_ptr<Registry> registry_;

  std::atomic<ImageSlot*>* image_chunks_;        // kMaxChunks entries
  std::atomic<FunctionSlot*>* function_chunks_;  // kMaxChunks entries
  std::atomic<uint32_t> num_images_{0};
  std::atomic<uint32_t> num_functions_{0};

  mutable std::atomic<uint64_t> stat_images_loaded_{0};
  mutable std::atomic<uint64_t> stat_load_failures_{0};
  mutable std::atomic<uint64_t> stat_functions_resolved_{0};
  mutable std::atomic<uint64_t> stat_attributes_set_{0};
  mutable std::atomic<uint64_t> stat_bytes_hashed_{0};
};

}  // namespace cubist

#endif  // CUBIST_LOADER_MODULE_CACHE_H_
