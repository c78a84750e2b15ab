#include "tests/testlib/fake_driver.h"

#include <algorithm>
#include <cstring>
#include <string_view>

#include "absl/time/clock.h"
#include "loader/cubin.h"

namespace cubist::testing {
namespace {

// The current context of this thread, per fake (so that one test's leftovers do not leak
// into the next fake).
struct Current {
  const FakeDriver* owner = nullptr;
  CUcontext context = nullptr;
};
thread_local Current current;

// The extent of an ELF image given only its start, as the real driver must work it out:
// the furthest of the section table and every section's bytes. Only used on images the
// module cache has already inspected.
size_t ElfExtent(const char* p) {
  uint64_t shoff;
  uint16_t shnum;
  std::memcpy(&shoff, p + 40, 8);
  std::memcpy(&shnum, p + 60, 2);
  size_t end = shoff + size_t{shnum} * 64;
  for (uint16_t i = 0; i < shnum; ++i) {
    const char* h = p + shoff + size_t{i} * 64;
    uint32_t type;
    uint64_t off, size;
    std::memcpy(&type, h + 4, 4);
    std::memcpy(&off, h + 24, 8);
    std::memcpy(&size, h + 32, 8);
    if (type != 8) end = std::max<size_t>(end, off + size);
  }
  return end;
}

}  // namespace

FakeDriver::FakeDriver(std::vector<Device> devices, bool library_api)
    : devices_(std::move(devices)), library_api_(library_api) {
  for (size_t i = 0; i < devices_.size(); ++i) contexts_.push_back(std::make_unique<char>());
}

FakeDriver::~FakeDriver() {
  if (current.owner == this) current = Current{};
}

int FakeDriver::live_images() const {
  std::lock_guard<std::mutex> lock(mu_);
  int n = 0;
  for (const auto& [h, img] : images_) n += img->unloaded ? 0 : 1;
  return n;
}

int FakeDriver::dynamic_shared_limit(CUfunction f) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = smem_limit_.find(f);
  return it == smem_limit_.end() ? -1 : it->second;
}

CUcontext FakeDriver::context_of(int ordinal) const {
  return reinterpret_cast<CUcontext>(contexts_.at(ordinal).get());
}

CUresult FakeDriver::DeviceGet(CUdevice* d, int ordinal) {
  if (ordinal < 0 || ordinal >= static_cast<int>(devices_.size())) {
    return CUDA_ERROR_INVALID_DEVICE;
  }
  *d = ordinal;
  return CUDA_SUCCESS;
}

CUresult FakeDriver::DeviceGetCount(int* n) {
  *n = static_cast<int>(devices_.size());
  return CUDA_SUCCESS;
}

CUresult FakeDriver::DeviceGetName(char* name, int len, CUdevice d) {
  if (d < 0 || d >= static_cast<int>(devices_.size()) || len <= 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  std::snprintf(name, static_cast<size_t>(len), "%s", devices_[d].name.c_str());
  return CUDA_SUCCESS;
}

CUresult FakeDriver::DeviceGetAttribute(int* v, CUdevice_attribute a, CUdevice d) {
  if (d < 0 || d >= static_cast<int>(devices_.size())) return CUDA_ERROR_INVALID_DEVICE;
  switch (a) {
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: *v = devices_[d].major; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: *v = devices_[d].minor; break;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: *v = 132; break;
    default: return CUDA_ERROR_NOT_SUPPORTED;
  }
  return CUDA_SUCCESS;
}

CUresult FakeDriver::DeviceTotalMem(size_t* bytes, CUdevice d) {
  if (d < 0 || d >= static_cast<int>(devices_.size())) return CUDA_ERROR_INVALID_DEVICE;
  *bytes = devices_[d].total_mem;
  return CUDA_SUCCESS;
}

CUresult FakeDriver::DevicePrimaryCtxRetain(CUcontext* c, CUdevice d) {
  if (d < 0 || d >= static_cast<int>(devices_.size())) return CUDA_ERROR_INVALID_DEVICE;
  *c = context_of(d);
  ++retains_;
  return CUDA_SUCCESS;
}

CUresult FakeDriver::DevicePrimaryCtxRelease(CUdevice d) {
  if (d < 0 || d >= static_cast<int>(devices_.size())) return CUDA_ERROR_INVALID_DEVICE;
  ++releases_;
  return CUDA_SUCCESS;
}

CUresult FakeDriver::CtxSetCurrent(CUcontext c) {
  if (c != nullptr) {
    bool ours = false;
    for (const auto& p : contexts_) ours |= reinterpret_cast<CUcontext>(p.get()) == c;
    if (!ours) return CUDA_ERROR_INVALID_CONTEXT;
  }
  current = Current{this, c};
  return CUDA_SUCCESS;
}

CUresult FakeDriver::CtxGetCurrent(CUcontext* c) {
  *c = current.owner == this ? current.context : nullptr;
  return CUDA_SUCCESS;
}

CUresult FakeDriver::CtxGetDevice(CUdevice* d) {
  CUcontext c = current.owner == this ? current.context : nullptr;
  for (size_t i = 0; i < contexts_.size(); ++i) {
    if (reinterpret_cast<CUcontext>(contexts_[i].get()) == c) {
      *d = static_cast<CUdevice>(i);
      return CUDA_SUCCESS;
    }
  }
  return CUDA_ERROR_INVALID_CONTEXT;
}

CUresult FakeDriver::Load(void** handle, const void* code) {
  ++load_calls_;
  if (absl::ZeroDuration() < load_delay_) absl::SleepFor(load_delay_);
  CUresult injected = fail_next_load_.exchange(CUDA_SUCCESS);
  if (injected != CUDA_SUCCESS) return injected;
  const char* p = static_cast<const char*>(code);
  absl::StatusOr<CubinInfo> info = InspectCubin(std::string_view(p, ElfExtent(p)));
  if (!info.ok() || info->images.empty()) return CUDA_ERROR_INVALID_IMAGE;
  auto img = std::make_unique<Image>();
  for (const KernelInfo& k : info->images[0].kernels) img->kernels.insert(k.name);
  img->context = current.owner == this ? current.context : nullptr;
  void* h = img.get();
  {
    std::lock_guard<std::mutex> lock(mu_);
    images_[h] = std::move(img);
  }
  *handle = h;
  ++loads_;
  return CUDA_SUCCESS;
}

CUresult FakeDriver::Lookup(CUfunction* f, void* handle, const char* name) {
  ++lookups_;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = images_.find(handle);
  if (it == images_.end() || it->second->unloaded) return CUDA_ERROR_INVALID_HANDLE;
  if (it->second->kernels.count(name) == 0) return CUDA_ERROR_NOT_FOUND;
  auto& fn = functions_[{handle, name}];
  if (!fn) fn = std::make_unique<char>();
  *f = reinterpret_cast<CUfunction>(fn.get());
  return CUDA_SUCCESS;
}

CUresult FakeDriver::TensorMapEncodeTiled(CUtensorMap* map, CUtensorMapDataType, cuuint32_t rank,
                                          void* global_address, const cuuint64_t* global_dim,
                                          const cuuint64_t* global_strides, const cuuint32_t*,
                                          const cuuint32_t*, CUtensorMapInterleave,
                                          CUtensorMapSwizzle, CUtensorMapL2promotion,
                                          CUtensorMapFloatOOBfill) {
  if (map == nullptr || rank != 2) return CUDA_ERROR_INVALID_VALUE;
  std::memset(map, 0, sizeof(*map));
  std::lock_guard<std::mutex> lock(mu_);
  tensor_maps_.push_back(
      {reinterpret_cast<uintptr_t>(global_address), global_dim[1], global_strides[0]});
  return CUDA_SUCCESS;
}

std::vector<FakeDriver::TensorMap> FakeDriver::tensor_maps() const {
  std::lock_guard<std::mutex> lock(mu_);
  return tensor_maps_;
}

std::string FakeDriver::FunctionName(CUfunction f) const {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [key, fn] : functions_) {
    if (reinterpret_cast<CUfunction>(fn.get()) == f) return key.second;
  }
  return "";
}

CUresult FakeDriver::LibraryLoadData(CUlibrary* lib, const void* code, CUjit_option*,
                                     void**, unsigned int, CUlibraryOption*, void**,
                                     unsigned int) {
  if (!library_api_) return CUDA_ERROR_NOT_SUPPORTED;
  void* h = nullptr;
  CUresult r = Load(&h, code);
  if (r == CUDA_SUCCESS) {
    ++library_loads_;
    *lib = static_cast<CUlibrary>(h);
  }
  return r;
}

CUresult FakeDriver::ModuleLoadData(CUmodule* m, const void* image) {
  if (current.owner != this || current.context == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  void* h = nullptr;
  CUresult r = Load(&h, image);
  if (r == CUDA_SUCCESS) {
    ++module_loads_;
    *m = static_cast<CUmodule>(h);
  }
  return r;
}

CUresult FakeDriver::LibraryUnload(CUlibrary lib) { return ModuleUnload(reinterpret_cast<CUmodule>(lib)); }

CUresult FakeDriver::ModuleUnload(CUmodule m) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = images_.find(static_cast<void*>(m));
  if (it == images_.end() || it->second->unloaded) return CUDA_ERROR_INVALID_HANDLE;
  it->second->unloaded = true;
  ++unloads_;
  return CUDA_SUCCESS;
}

CUresult FakeDriver::LibraryGetKernel(CUkernel* k, CUlibrary lib, const char* name) {
  CUfunction f = nullptr;
  CUresult r = Lookup(&f, lib, name);
  if (r == CUDA_SUCCESS) *k = reinterpret_cast<CUkernel>(f);
  return r;
}

CUresult FakeDriver::KernelGetFunction(CUfunction* f, CUkernel k) {
  if (current.owner != this || current.context == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  *f = reinterpret_cast<CUfunction>(k);
  return CUDA_SUCCESS;
}

CUresult FakeDriver::ModuleGetFunction(CUfunction* f, CUmodule m, const char* name) {
  return Lookup(f, m, name);
}

CUresult FakeDriver::FuncSetAttribute(CUfunction f, CUfunction_attribute a, int v) {
  ++set_attribute_calls_;
  CUresult injected = fail_set_attribute_.load();
  if (injected != CUDA_SUCCESS) return injected;
  if (a == CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES) {
    std::lock_guard<std::mutex> lock(mu_);
    smem_limit_[f] = v;
  }
  return CUDA_SUCCESS;
}

}  // namespace cubist::testing
