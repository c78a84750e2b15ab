#include "loader/module_cache.h"

#include <mutex>
#include <shared_mutex>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/file_util.h"
#include "base/sha256.h"
#include "base/status_macros.h"
#include "base/strings.h"
#include "base/unique_fd.h"
#include "loader/context.h"
#include "loader/cubin.h"

namespace cubist {
namespace {

// Above this, a launch must raise the function's dynamic shared memory limit first.
constexpr int kDefaultDynamicSharedLimit = 48 * 1024;

enum State : int { kUnloaded = 0, kLoaded = 1, kFailed = 2 };

}  // namespace

// The locks are std::mutex / std::shared_mutex rather than absl::Mutex: Debian's abseil
// is built without ThreadSanitizer annotations, so TSan cannot see absl::Mutex
// synchronise and reports false races; pthread-based locks it understands.
struct ModuleCache::ImageSlot {
  std::mutex mu;
  std::string name;   // the path for files; the caller's name otherwise
  std::string bytes;  // AddImage's bytes until loaded
  bool from_file = false;
  ImageOptions options;
  int state = kUnloaded;            // guarded by mu
  absl::Status error;               // guarded by mu; set when state == kFailed
  CUlibrary library = nullptr;      // guarded by mu
  CUmodule module = nullptr;        // guarded by mu
  std::vector<std::string> kernels; // names the image holds, for NotFound messages
  // Function name -> function index, guarded by Registry::mu. Keyed by std::string with
  // heterogeneous lookup, so that the by-name path finds a registered function without
  // allocating.
  absl::flat_hash_map<std::string, uint32_t> functions;
};

struct ModuleCache::FunctionSlot {
  // The only field the hot path reads; written once, with release, under the image's
  // mutex.
  std::atomic<CUfunction> function{nullptr};
  uint32_t image = 0;
  std::string name;
  int dynamic_shared_bytes = 0;  // guarded by the image's mutex
  bool failed = false;           // guarded by the image's mutex
  absl::Status error;            // guarded by the image's mutex
};

struct ModuleCache::Registry {
  std::shared_mutex mu;  // also guards every ImageSlot::functions
  absl::flat_hash_map<std::string, uint32_t> images_by_path;  // guarded by mu
};

absl::StatusOr<std::unique_ptr<ModuleCache>> ModuleCache::Create(DriverApi& driver,
                                                                 CUcontext context,
                                                                 Options options) {
  if (context == nullptr) {
    return absl::InvalidArgumentError("module cache: no context; retain one first "
                                      "(PrimaryContext::Retain)");
  }
  CUdevice device = 0;
  {
    CUBIST_ASSIGN_OR_RETURN(ScopedContext scope, ScopedContext::Enter(driver, context));
    CUBIST_RETURN_IF_ERROR(CuCheck(driver, driver.CtxGetDevice(&device), "cuCtxGetDevice"));
  }
  CUBIST_ASSIGN_OR_RETURN(DeviceSm sm, GetDeviceSm(driver, device));
  return std::unique_ptr<ModuleCache>(new ModuleCache(driver, context, sm, options));
}

ModuleCache::ModuleCache(DriverApi& driver, CUcontext context, DeviceSm sm,
                         Options options)
    : driver_(&driver),
      context_(context),
      device_sm_(sm),
      options_(options),
      registry_(std::make_unique<Registry>()),
      image_chunks_(new std::atomic<ImageSlot*>[kMaxChunks]),
      function_chunks_(new std::atomic<FunctionSlot*>[kMaxChunks]) {
  for (uint32_t i = 0; i < kMaxChunks; ++i) {
    image_chunks_[i].store(nullptr, std::memory_order_relaxed);
    function_chunks_[i].store(nullptr, std::memory_order_relaxed);
  }
  options_.prefer_library_api = options.prefer_library_api && driver.HasLibraryApi();
}

ModuleCache::~ModuleCache() {
  // Unload with our context current: modules belong to it.
  absl::StatusOr<ScopedContext> scope = ScopedContext::Enter(*driver_, context_);
  uint32_t n = num_images_.load(std::memory_order_acquire);
  for (uint32_t i = 0; i < n; ++i) {
    ImageSlot* img = image_slot(i);
    std::lock_guard<std::mutex> lock(img->mu);
    if (img->library != nullptr) (void)driver_->LibraryUnload(img->library);
    if (img->module != nullptr) (void)driver_->ModuleUnload(img->module);
    img->library = nullptr;
    img->module = nullptr;
  }
  for (uint32_t c = 0; c < kMaxChunks; ++c) {
    delete[] image_chunks_[c].load(std::memory_order_relaxed);
    delete[] function_chunks_[c].load(std::memory_order_relaxed);
  }
  delete[] image_chunks_;
  delete[] function_chunks_;
}

ModuleCache::ImageSlot* ModuleCache::image_slot(uint32_t index) const {
  ImageSlot* chunk = image_chunks_[index >> kChunkBits].load(std::memory_order_acquire);
  return &chunk[index & (kChunkSize - 1)];
}

ModuleCache::FunctionSlot* ModuleCache::function_slot(uint32_t index) const {
  FunctionSlot* chunk = function_chunks_[index >> kChunkBits].load(std::memory_order_acquire);
  return &chunk[index & (kChunkSize - 1)];
}

absl::StatusOr<ImageId> ModuleCache::AddImageSlot(std::string name, std::string bytes,
                                                  bool from_file, ImageOptions options) {
  if (options.expected_sha256.empty() && !options.from_verified_store &&
      !options.skip_hash_check) {
    return absl::InvalidArgumentError(absl::StrCat(
        "module cache: image ", name,
        ": no expected sha256; pass ImageOptions::expected_sha256, or set "
        "from_verified_store (bytes from the cache) or skip_hash_check (explicit opt-out)"));
  }
  if (!options.expected_sha256.empty() && !IsSha256Hex(options.expected_sha256)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "module cache: image ", name, ": expected sha256 '", options.expected_sha256,
        "' is not 64 lowercase hex characters"));
  }
  std::unique_lock<std::shared_mutex> lock(registry_->mu);
  if (from_file) {
    auto it = registry_->images_by_path.find(name);
    if (it != registry_->images_by_path.end()) return ImageId{it->second};
  }
  uint32_t index = num_images_.load(std::memory_order_relaxed);
  if (index >= kMaxChunks * kChunkSize) {
    return absl::ResourceExhaustedError("module cache: too many images");
  }
  uint32_t c = index >> kChunkBits;
  if (image_chunks_[c].load(std::memory_order_relaxed) == nullptr) {
    image_chunks_[c].store(new ImageSlot[kChunkSize], std::memory_order_release);
  }
  ImageSlot* slot = image_slot(index);
  slot->name = name;
  slot->bytes = std::move(bytes);
  slot->from_file = from_file;
  slot->options = std::move(options);
  if (from_file) registry_->images_by_path[std::move(name)] = index;
  num_images_.store(index + 1, std::memory_order_release);
  return ImageId{index};
}

absl::StatusOr<ImageId> ModuleCache::AddImage(std::string name, std::string bytes,
                                              ImageOptions options) {
  return AddImageSlot(std::move(name), std::move(bytes), /*from_file=*/false,
                      std::move(options));
}

absl::StatusOr<ImageId> ModuleCache::AddImageFile(std::string path, ImageOptions options) {
  if (path.empty()) return absl::InvalidArgumentError("module cache: empty image path");
  return AddImageSlot(std::move(path), std::string(), /*from_file=*/true, std::move(options));
}

absl::StatusOr<FunctionId> ModuleCache::AddFunction(ImageId image, std::string name,
                                                    int dynamic_shared_bytes) {
  if (!image.valid() || image.value >= num_images_.load(std::memory_order_acquire)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "module cache: function ", name, ": unknown image id ", image.value));
  }
  if (name.empty()) {
    return absl::InvalidArgumentError("module cache: empty function name");
  }
  if (dynamic_shared_bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "module cache: function ", name, ": negative dynamic shared memory ",
        dynamic_shared_bytes));
  }
  FunctionSlot* existing = nullptr;
  uint32_t index = 0;
  ImageSlot* image_slot_ptr = image_slot(image.value);
  {
    std::unique_lock<std::shared_mutex> lock(registry_->mu);
    auto it = image_slot_ptr->functions.find(name);
    if (it != image_slot_ptr->functions.end()) {
      index = it->second;
      existing = function_slot(index);
    } else {
      index = num_functions_.load(std::memory_order_relaxed);
      if (index >= kMaxChunks * kChunkSize) {
        return absl::ResourceExhaustedError("module cache: too many functions");
      }
      uint32_t c = index >> kChunkBits;
      if (function_chunks_[c].load(std::memory_order_relaxed) == nullptr) {
        function_chunks_[c].store(new FunctionSlot[kChunkSize], std::memory_order_release);
      }
      FunctionSlot* slot = function_slot(index);
      slot->image = image.value;
      slot->name = name;
      slot->dynamic_shared_bytes = dynamic_shared_bytes;
      image_slot_ptr->functions.emplace(std::move(name), index);
      num_functions_.store(index + 1, std::memory_order_release);
      return FunctionId{index};
    }
  }
  // Registered before: keep the larger shared-memory request, and apply it now if the
  // function is already resolved.
  ImageSlot* img = image_slot(existing->image);
  std::lock_guard<std::mutex> lock(img->mu);
  if (dynamic_shared_bytes > existing->dynamic_shared_bytes) {
    existing->dynamic_shared_bytes = dynamic_shared_bytes;
    CUfunction f = existing->function.load(std::memory_order_acquire);
    if (f != nullptr && dynamic_shared_bytes > kDefaultDynamicSharedLimit) {
      CUBIST_ASSIGN_OR_RETURN(ScopedContext scope, ScopedContext::Enter(*driver_, context_));
      CUBIST_RETURN_IF_ERROR(CuCheck(
          *driver_,
          driver_->FuncSetAttribute(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                    dynamic_shared_bytes),
          absl::StrCat("function ", existing->name,
                       ": cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES, ",
                       dynamic_shared_bytes, ")")));
      stat_attributes_set_.fetch_add(1, std::memory_order_relaxed);
    }
  }
  return FunctionId{index};
}

absl::Status ModuleCache::EnsureLoadedLocked(ImageSlot& img) {
  if (img.state == kLoaded) return absl::OkStatus();
  if (img.state == kFailed) return img.error;

  std::string file_bytes;
  std::string_view bytes = img.bytes;
  if (img.from_file) {
    // Not sticky: the file may appear (a fetch) or become readable later.
    absl::StatusOr<std::string> read = ReadFileToString(img.name);
    if (!read.ok()) return Annotate(read.status(), "load image");
    file_bytes = std::move(read).value();
    bytes = file_bytes;
  }
  // Everything from here on depends only on the bytes, so a failure is final.
  auto fail = [&](absl::Status s) {
    img.state = kFailed;
    img.error = s;
    img.bytes.clear();
    stat_load_failures_.fetch_add(1, std::memory_order_relaxed);
    return s;
  };
  if (!img.options.from_verified_store && !img.options.skip_hash_check) {
    std::string actual = Sha256Hex(bytes);
    stat_bytes_hashed_.fetch_add(bytes.size(), std::memory_order_relaxed);
    if (actual != img.options.expected_sha256) {
      absl::Status mismatch = absl::DataLossError(absl::StrCat(
          "load ", img.name, ": sha256 mismatch: expected ", img.options.expected_sha256,
          ", got ", actual, " (", bytes.size(),
          " bytes); the bytes changed after they were verified: fetch the artifact "
          "again (cubist fetch) or check who wrote them"));
      // Not sticky for a file: a fetch may repair it (the Runtime removes it for that).
      return img.from_file ? mismatch : fail(mismatch);
    }
  }
  absl::StatusOr<CubinInfo> info = InspectCubin(bytes);
  if (!info.ok()) return fail(Annotate(info.status(), absl::StrCat("load ", img.name)));
  absl::Status compat = CheckCompatible(*info, device_sm_, absl::StrCat("load ", img.name));
  if (!compat.ok()) return fail(compat);
  if (const ImageInfo* best = BestImageFor(*info, device_sm_)) {
    for (const KernelInfo& k : best->kernels) img.kernels.push_back(k.name);
  }

  absl::StatusOr<ScopedContext> scope = ScopedContext::Enter(*driver_, context_);
  if (!scope.ok()) return Annotate(scope.status(), absl::StrCat("load ", img.name));
  CUresult r;
  const char* call;
  if (options_.prefer_library_api) {
    call = "cuLibraryLoadData";
    r = driver_->LibraryLoadData(&img.library, bytes.data(), nullptr, nullptr, 0, nullptr,
                                 nullptr, 0);
  } else {
    call = "cuModuleLoadData";
    r = driver_->ModuleLoadData(&img.module, bytes.data());
  }
  if (r != CUDA_SUCCESS) {
    img.library = nullptr;
    img.module = nullptr;
    return fail(CuCheck(*driver_, r, absl::StrCat("load ", img.name, ": ", call)));
  }
  img.state = kLoaded;
  // The driver keeps its own copy (we never pass CU_LIBRARY_BINARY_IS_PRESERVED).
  std::string().swap(img.bytes);
  stat_images_loaded_.fetch_add(1, std::memory_order_relaxed);
  return absl::OkStatus();
}

absl::StatusOr<CUfunction> ModuleCache::ResolveLocked(ImageSlot& img, FunctionSlot& fn) {
  if (CUfunction f = fn.function.load(std::memory_order_acquire)) return f;
  if (fn.failed) return fn.error;
  CUBIST_RETURN_IF_ERROR(EnsureLoadedLocked(img));
  auto fail = [&](absl::Status s) {
    fn.failed = true;
    fn.error = s;
    return s;
  };
  CUBIST_ASSIGN_OR_RETURN(ScopedContext scope, ScopedContext::Enter(*driver_, context_));
  CUfunction f = nullptr;
  CUresult r;
  const char* call;
  if (img.library != nullptr) {
    call = "cuLibraryGetKernel";
    CUkernel kernel = nullptr;
    r = driver_->LibraryGetKernel(&kernel, img.library, fn.name.c_str());
    if (r == CUDA_SUCCESS) {
      call = "cuKernelGetFunction";
      r = driver_->KernelGetFunction(&f, kernel);
    }
  } else {
    call = "cuModuleGetFunction";
    r = driver_->ModuleGetFunction(&f, img.module, fn.name.c_str());
  }
  if (r == CUDA_ERROR_NOT_FOUND) {
    return fail(absl::NotFoundError(absl::StrCat(
        "function ", fn.name, ": not found in ", img.name, " (it has ",
        img.kernels.empty() ? "no kernels" : absl::StrJoin(img.kernels, ", "),
        "); the manifest's function must name a __global__ symbol of the cubin")));
  }
  if (r != CUDA_SUCCESS || f == nullptr) {
    return fail(CuCheck(*driver_, r == CUDA_SUCCESS ? CUDA_ERROR_UNKNOWN : r,
                        absl::StrCat("function ", fn.name, " in ", img.name, ": ", call)));
  }
  stat_functions_resolved_.fetch_add(1, std::memory_order_relaxed);
  if (fn.dynamic_shared_bytes > kDefaultDynamicSharedLimit) {
    absl::Status s = CuCheck(
        *driver_,
        driver_->FuncSetAttribute(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                  fn.dynamic_shared_bytes),
        absl::StrCat("function ", fn.name,
                     ": cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES, ",
                     fn.dynamic_shared_bytes, "); the device may have less shared memory "
                     "per block than the kernel needs"));
    if (!s.ok()) return fail(s);
    stat_attributes_set_.fetch_add(1, std::memory_order_relaxed);
  }
  fn.function.store(f, std::memory_order_release);
  return f;
}

absl::StatusOr<CUfunction> ModuleCache::ResolveSlow(FunctionSlot& fn) {
  ImageSlot* img = image_slot(fn.image);
  std::lock_guard<std::mutex> lock(img->mu);
  return ResolveLocked(*img, fn);
}

absl::StatusOr<CUfunction> ModuleCache::GetFunction(FunctionId id) {
  if (id.value >= num_functions_.load(std::memory_order_acquire)) {
    return absl::InvalidArgumentError(
        absl::StrCat("module cache: unknown function id ", id.value));
  }
  FunctionSlot* slot = function_slot(id.value);
  CUfunction f = slot->function.load(std::memory_order_acquire);
  if (f != nullptr) return f;
  return ResolveSlow(*slot);
}

absl::StatusOr<CUfunction> ModuleCache::GetFunction(ImageId image, std::string_view name) {
  if (image.valid() && image.value < num_images_.load(std::memory_order_acquire)) {
    ImageSlot* img = image_slot(image.value);
    uint32_t index = UINT32_MAX;
    {
      std::shared_lock<std::shared_mutex> lock(registry_->mu);
      auto it = img->functions.find(Sv(name));
      if (it != img->functions.end()) index = it->second;
    }
    if (index != UINT32_MAX) return GetFunction(FunctionId{index});
  }
  CUBIST_ASSIGN_OR_RETURN(FunctionId id, AddFunction(image, std::string(name)));
  return GetFunction(id);
}

absl::Status ModuleCache::LoadImage(ImageId image) {
  if (!image.valid() || image.value >= num_images_.load(std::memory_order_acquire)) {
    return absl::InvalidArgumentError(
        absl::StrCat("module cache: unknown image id ", image.value));
  }
  ImageSlot* img = image_slot(image.value);
  std::lock_guard<std::mutex> lock(img->mu);
  return EnsureLoadedLocked(*img);
}

absl::Status ModuleCache::Preload(absl::Span<const FunctionId> functions) {
  for (FunctionId id : functions) {
    CUBIST_RETURN_IF_ERROR(GetFunction(id).status());
  }
  return absl::OkStatus();
}

absl::Status ModuleCache::PreloadAll() {
  uint32_t n = num_functions_.load(std::memory_order_acquire);
  for (uint32_t i = 0; i < n; ++i) {
    CUBIST_RETURN_IF_ERROR(GetFunction(FunctionId{i}).status());
  }
  return absl::OkStatus();
}

ModuleCache::Stats ModuleCache::stats() const {
  Stats s;
  s.images_loaded = stat_images_loaded_.load(std::memory_order_relaxed);
  s.load_failures = stat_load_failures_.load(std::memory_order_relaxed);
  s.functions_resolved = stat_functions_resolved_.load(std::memory_order_relaxed);
  s.attributes_set = stat_attributes_set_.load(std::memory_order_relaxed);
  s.bytes_hashed = stat_bytes_hashed_.load(std::memory_order_relaxed);
  return s;
}

}  // namespace cubist
