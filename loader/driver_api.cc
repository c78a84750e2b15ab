#include "loader/driver_api.h"

#include <cudaTypedefs.h>
#include <dlfcn.h>

#include <cstdlib>
#include <initializer_list>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "base/strings.h"

namespace cubist {

// ---------------------------------------------------------------------------------------
// Default bodies: a fake overrides only what it uses; anything else answers "not
// supported" instead of crashing, so a test that strays shows up as a clear error.
CUresult DriverApi::Init(unsigned int) { return CUDA_ERROR_NOT_SUPPORTED; }
CUresult DriverApi::DriverGetVersion(int*) { return CUDA_ERROR_NOT_SUPPORTED; }
CUresult DriverApi::DeviceGet(CUdevice*, int) { return CUDA_ERROR_NOT_SUPPORTED; }
CUresult DriverApi::DeviceGetCount(int*) { return CUDA_ERROR_NOT_SUPPORTED; }
CUresult DriverApi::DeviceGetName(char*, int, CUdevice) { return CUDA_ERROR_NOT_SUPPORTED; }
CUresult DriverApi::DeviceGetAttribute(int*, CUdevice_attribute, CUdevice) {
  return CUDA_ERROR_NOT_SUPPORTED;
}
CUresult DriverApi::DeviceTotalMem(size_t*, CUdevice) { return CUDA_ERROR_NOT_SUPPORTED; }
CUresult DriverApi::DeviceGetPCIBusId(char*, int, CUdevice) {
  return CUDA_ERROR_NOT_SUPPORTED;
}
CUresult DriverApi::DevicePrimaryCtxRetain(CUcontext*, CUdevice) {
  return CUDA_ERROR_NOT_SUPPORTED;
}
CUresult DriverApi::DevicePrimaryCtxRelease(CUdevice) { return CUDA_ERROR_NOT_SUPPORTED; }
CUresult DriverApi::CtxSetCurrent(CUcontext) { return CUDA_ERROR_NOT_SUPPORTED; }
CUresult DriverApi::CtxGetCurrent(CUcontext*) { return CUDA_ERROR_NOT_SUPPORTED; }
CUresult DriverApi::CtxGetDevice(CUdevice*) { return CUDA_ERROR_NOT_SUPPORTED; }
CUresult DriverApi::CtxSynchronize() { return CUDA_ERROR_NOT_SUPPORTED; }
CUresult DriverApi::MemAlloc(CUdeviceptr*, size_t) { return CUDA_ERROR_NOT_SUPPORTED; }
CUresult DriverApi::MemFree(CUdeviceptr) { return CUDA_ERROR_NOT_SUPPORTED; }
CUresult DriverApi::MemGetInfo(size_t*, size_t*) { return CUDA_ERROR_NOT_SUPPORTED; }
CUresult DriverApi::MemcpyHtoD(CUdeviceptr, const void*, size_t) {
  return CUDA_ERROR_NOT_SUPPORTED;
}
CUresult DriverApi::MemcpyDtoH(void*, CUdeviceptr, size_t) { return CUDA_ERROR_NOT_SUPPORTED; }
CUresult DriverApi::MemcpyDtoD(CUdeviceptr, CUdeviceptr, size_t) {
  return CUDA_ERROR_NOT_SUPPORTED;
}
CUresult DriverApi::MemsetD8(CUdeviceptr, unsigned char, size_t) {
  return CUDA_ERROR_NOT_SUPPORTED;
}
CUresult DriverApi::MemcpyHtoDAsync(CUdeviceptr, const void*, size_t, CUstream) {
  return CUDA_ERROR_NOT_SUPPORTED;
}
CUresult DriverApi::MemcpyDtoHAsync(void*, CUdeviceptr, size_t, CUstream) {
  return CUDA_ERROR_NOT_SUPPORTED;
}
CUresult DriverApi::MemcpyDtoDAsync(CUdeviceptr, CUdeviceptr, size_t, CUstream) {
  return CUDA_ERROR_NOT_SUPPORTED;
}
CUresult DriverApi::MemsetD8Async(CUdeviceptr, unsigned char, size_t, CUstream) {
  return CUDA_ERROR_NOT_SUPPORTED;
}
CUresult DriverApi::StreamCreate(CUstream*, unsigned int) { return CUDA_ERROR_NOT_SUPPORTED; }
CUresult DriverApi::StreamDestroy(CUstream) { return CUDA_ERROR_NOT_SUPPORTED; }
CUresult DriverApi::StreamSynchronize(CUstream) { return CUDA_ERROR_NOT_SUPPORTED; }
CUresult DriverApi::StreamWaitEvent(CUstream, CUevent, unsigned int) {
  return CUDA_ERROR_NOT_SUPPORTED;
}
CUresult DriverApi::EventCreate(CUevent*, unsigned int) { return CUDA_ERROR_NOT_SUPPORTED; }
CUresult DriverApi::EventRecord(CUevent, CUstream) { return CUDA_ERROR_NOT_SUPPORTED; }
CUresult DriverApi::EventSynchronize(CUevent) { return CUDA_ERROR_NOT_SUPPORTED; }
CUresult DriverApi::EventElapsedTime(float*, CUevent, CUevent) {
  return CUDA_ERROR_NOT_SUPPORTED;
}
CUresult DriverApi::EventDestroy(CUevent) { return CUDA_ERROR_NOT_SUPPORTED; }
CUresult DriverApi::LaunchKernel(CUfunction, unsigned int, unsigned int, unsigned int,
                                 unsigned int, unsigned int, unsigned int, unsigned int,
                                 CUstream, void**, void**) {
  return CUDA_ERROR_NOT_SUPPORTED;
}
CUresult DriverApi::LaunchKernelEx(const CUlaunchConfig*, CUfunction, void**, void**) {
  return CUDA_ERROR_NOT_SUPPORTED;
}
CUresult DriverApi::FuncSetAttribute(CUfunction, CUfunction_attribute, int) {
  return CUDA_ERROR_NOT_SUPPORTED;
}
CUresult DriverApi::FuncGetAttribute(int*, CUfunction_attribute, CUfunction) {
  return CUDA_ERROR_NOT_SUPPORTED;
}
CUresult DriverApi::OccupancyMaxActiveBlocksPerMultiprocessor(int*, CUfunction, int,
                                                              size_t) {
  return CUDA_ERROR_NOT_SUPPORTED;
}
CUresult DriverApi::TensorMapEncodeTiled(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*,
                                         const cuuint64_t*, const cuuint64_t*,
                                         const cuuint32_t*, const cuuint32_t*,
                                         CUtensorMapInterleave, CUtensorMapSwizzle,
                                         CUtensorMapL2promotion, CUtensorMapFloatOOBfill) {
  return CUDA_ERROR_NOT_SUPPORTED;
}
CUresult DriverApi::LibraryLoadData(CUlibrary*, const void*, CUjit_option*, void**,
                                    unsigned int, CUlibraryOption*, void**, unsigned int) {
  return CUDA_ERROR_NOT_SUPPORTED;
}
CUresult DriverApi::LibraryUnload(CUlibrary) { return CUDA_ERROR_NOT_SUPPORTED; }
CUresult DriverApi::LibraryGetKernel(CUkernel*, CUlibrary, const char*) {
  return CUDA_ERROR_NOT_SUPPORTED;
}
CUresult DriverApi::KernelGetFunction(CUfunction*, CUkernel) {
  return CUDA_ERROR_NOT_SUPPORTED;
}
CUresult DriverApi::ModuleLoadData(CUmodule*, const void*) { return CUDA_ERROR_NOT_SUPPORTED; }
CUresult DriverApi::ModuleUnload(CUmodule) { return CUDA_ERROR_NOT_SUPPORTED; }
CUresult DriverApi::ModuleGetFunction(CUfunction*, CUmodule, const char*) {
  return CUDA_ERROR_NOT_SUPPORTED;
}

namespace {

// Names for the codes a fake is likely to return, so that its errors read like the
// real driver's.
const char* KnownErrorName(CUresult r) {
  switch (r) {
    case CUDA_SUCCESS: return "CUDA_SUCCESS";
    case CUDA_ERROR_INVALID_VALUE: return "CUDA_ERROR_INVALID_VALUE";
    case CUDA_ERROR_OUT_OF_MEMORY: return "CUDA_ERROR_OUT_OF_MEMORY";
    case CUDA_ERROR_NOT_INITIALIZED: return "CUDA_ERROR_NOT_INITIALIZED";
    case CUDA_ERROR_DEINITIALIZED: return "CUDA_ERROR_DEINITIALIZED";
    case CUDA_ERROR_NO_DEVICE: return "CUDA_ERROR_NO_DEVICE";
    case CUDA_ERROR_INVALID_DEVICE: return "CUDA_ERROR_INVALID_DEVICE";
    case CUDA_ERROR_INVALID_IMAGE: return "CUDA_ERROR_INVALID_IMAGE";
    case CUDA_ERROR_INVALID_CONTEXT: return "CUDA_ERROR_INVALID_CONTEXT";
    case CUDA_ERROR_NO_BINARY_FOR_GPU: return "CUDA_ERROR_NO_BINARY_FOR_GPU";
    case CUDA_ERROR_INVALID_PTX: return "CUDA_ERROR_INVALID_PTX";
    case CUDA_ERROR_UNSUPPORTED_PTX_VERSION: return "CUDA_ERROR_UNSUPPORTED_PTX_VERSION";
    case CUDA_ERROR_INVALID_HANDLE: return "CUDA_ERROR_INVALID_HANDLE";
    case CUDA_ERROR_NOT_FOUND: return "CUDA_ERROR_NOT_FOUND";
    case CUDA_ERROR_LAUNCH_FAILED: return "CUDA_ERROR_LAUNCH_FAILED";
    case CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES: return "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES";
    case CUDA_ERROR_SYSTEM_DRIVER_MISMATCH: return "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH";
    case CUDA_ERROR_NOT_SUPPORTED: return "CUDA_ERROR_NOT_SUPPORTED";
    case CUDA_ERROR_UNKNOWN: return "CUDA_ERROR_UNKNOWN";
    default: return nullptr;
  }
}

}  // namespace

CUresult DriverApi::GetErrorName(CUresult error, const char** name) {
  const char* n = KnownErrorName(error);
  if (n == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *name = n;
  return CUDA_SUCCESS;
}

CUresult DriverApi::GetErrorString(CUresult, const char**) {
  return CUDA_ERROR_NOT_SUPPORTED;
}

std::string CuResultToString(DriverApi& driver, CUresult result) {
  const char* name = nullptr;
  const char* text = nullptr;
  std::string out;
  if (driver.GetErrorName(result, &name) == CUDA_SUCCESS && name != nullptr) {
    out = name;
  } else {
    out = absl::StrCat("CUresult ", static_cast<int>(result));
  }
  if (driver.GetErrorString(result, &text) == CUDA_SUCCESS && text != nullptr) {
    absl::StrAppend(&out, " (", text, ")");
  }
  return out;
}

absl::Status CuCheck(DriverApi& driver, CUresult result, std::string_view context) {
  if (result == CUDA_SUCCESS) return absl::OkStatus();
  std::string message = absl::StrCat(Sv(context), ": ", CuResultToString(driver, result));
  switch (result) {
    case CUDA_ERROR_NO_DEVICE:
    case CUDA_ERROR_NOT_INITIALIZED:
    case CUDA_ERROR_DEINITIALIZED:
    case CUDA_ERROR_SYSTEM_DRIVER_MISMATCH:
    case CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE:
    case CUDA_ERROR_NO_BINARY_FOR_GPU:
    case CUDA_ERROR_UNSUPPORTED_PTX_VERSION:
    case CUDA_ERROR_INVALID_DEVICE:
      return absl::FailedPreconditionError(message);
    case CUDA_ERROR_OUT_OF_MEMORY:
      return absl::ResourceExhaustedError(message);
    case CUDA_ERROR_NOT_FOUND:
      return absl::NotFoundError(message);
    case CUDA_ERROR_INVALID_IMAGE:
    case CUDA_ERROR_INVALID_PTX:
    case CUDA_ERROR_INVALID_VALUE:
      return absl::InvalidArgumentError(message);
    case CUDA_ERROR_NOT_SUPPORTED:
      return absl::UnimplementedError(message);
    default:
      return absl::InternalError(message);
  }
}

namespace {

constexpr char kDefaultLibrary[] = "libcuda.so.1";

// The real table: function pointers resolved through cuGetProcAddress, each at the CUDA
// version whose signature matches the declaration in DriverApi (cudaTypedefs.h names
// them PFN_<symbol>_v<version>). Asking for a newer version would hand back a different
// ABI for some symbols (cuCtxSynchronize_v13000 takes a context, for one).
class CudaDriver final : public DriverApi {
 public:
  explicit CudaDriver(void* handle) : handle_(handle) {}
  ~CudaDriver() override {
    // Unloading libcuda while other static destructors may still call into it is
    // worse than the leak; only tables opened explicitly (OpenDriverLibrary) close.
    if (handle_ != nullptr && close_on_destroy_) dlclose(handle_);
  }

  absl::Status Resolve(const std::string& library);
  void set_close_on_destroy(bool v) { close_on_destroy_ = v; }

  CUresult Init(unsigned int flags) override { return init_(flags); }
  CUresult DriverGetVersion(int* v) override { return driver_get_version_(v); }
  CUresult DeviceGet(CUdevice* d, int ordinal) override { return device_get_(d, ordinal); }
  CUresult DeviceGetCount(int* n) override { return device_get_count_(n); }
  CUresult DeviceGetName(char* name, int len, CUdevice d) override {
    return device_get_name_(name, len, d);
  }
  CUresult DeviceGetAttribute(int* v, CUdevice_attribute a, CUdevice d) override {
    return device_get_attribute_(v, a, d);
  }
  CUresult DeviceTotalMem(size_t* bytes, CUdevice d) override {
    return device_total_mem_(bytes, d);
  }
  CUresult DeviceGetPCIBusId(char* id, int len, CUdevice d) override {
    return device_get_pci_bus_id_(id, len, d);
  }
  CUresult DevicePrimaryCtxRetain(CUcontext* c, CUdevice d) override {
    return primary_ctx_retain_(c, d);
  }
  CUresult DevicePrimaryCtxRelease(CUdevice d) override { return primary_ctx_release_(d); }
  CUresult CtxSetCurrent(CUcontext c) override { return ctx_set_current_(c); }
  CUresult CtxGetCurrent(CUcontext* c) override { return ctx_get_current_(c); }
  CUresult CtxGetDevice(CUdevice* d) override { return ctx_get_device_(d); }
  CUresult CtxSynchronize() override { return ctx_synchronize_(); }
  CUresult MemAlloc(CUdeviceptr* p, size_t n) override { return mem_alloc_(p, n); }
  CUresult MemFree(CUdeviceptr p) override { return mem_free_(p); }
  CUresult MemGetInfo(size_t* f, size_t* t) override { return mem_get_info_(f, t); }
  CUresult MemcpyHtoD(CUdeviceptr dst, const void* src, size_t n) override {
    return memcpy_htod_(dst, src, n);
  }
  CUresult MemcpyDtoH(void* dst, CUdeviceptr src, size_t n) override {
    return memcpy_dtoh_(dst, src, n);
  }
  CUresult MemcpyDtoD(CUdeviceptr dst, CUdeviceptr src, size_t n) override {
    return memcpy_dtod_(dst, src, n);
  }
  CUresult MemsetD8(CUdeviceptr dst, unsigned char v, size_t n) override {
    return memset_d8_(dst, v, n);
  }
  CUresult MemcpyHtoDAsync(CUdeviceptr dst, const void* src, size_t n, CUstream s) override {
    return memcpy_htod_async_(dst, src, n, s);
  }
  CUresult MemcpyDtoHAsync(void* dst, CUdeviceptr src, size_t n, CUstream s) override {
    return memcpy_dtoh_async_(dst, src, n, s);
  }
  CUresult MemcpyDtoDAsync(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s) override {
    return memcpy_dtod_async_(dst, src, n, s);
  }
  CUresult MemsetD8Async(CUdeviceptr dst, unsigned char v, size_t n, CUstream s) override {
    return memset_d8_async_(dst, v, n, s);
  }
  CUresult StreamCreate(CUstream* s, unsigned int flags) override {
    return stream_create_(s, flags);
  }
  CUresult StreamDestroy(CUstream s) override { return stream_destroy_(s); }
  CUresult StreamSynchronize(CUstream s) override { return stream_synchronize_(s); }
  CUresult StreamWaitEvent(CUstream s, CUevent e, unsigned int flags) override {
    return stream_wait_event_(s, e, flags);
  }
  CUresult EventCreate(CUevent* e, unsigned int flags) override {
    return event_create_(e, flags);
  }
  CUresult EventRecord(CUevent e, CUstream s) override { return event_record_(e, s); }
  CUresult EventSynchronize(CUevent e) override { return event_synchronize_(e); }
  CUresult EventElapsedTime(float* ms, CUevent a, CUevent b) override {
    return event_elapsed_time_(ms, a, b);
  }
  CUresult EventDestroy(CUevent e) override { return event_destroy_(e); }
  CUresult LaunchKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
                        unsigned int bx, unsigned int by, unsigned int bz,
                        unsigned int smem, CUstream s, void** params,
                        void** extra) override {
    return launch_kernel_(f, gx, gy, gz, bx, by, bz, smem, s, params, extra);
  }
  CUresult LaunchKernelEx(const CUlaunchConfig* config, CUfunction f, void** params,
                          void** extra) override {
    return launch_kernel_ex_(config, f, params, extra);
  }
  CUresult FuncSetAttribute(CUfunction f, CUfunction_attribute a, int v) override {
    return func_set_attribute_(f, a, v);
  }
  CUresult FuncGetAttribute(int* v, CUfunction_attribute a, CUfunction f) override {
    return func_get_attribute_(v, a, f);
  }
  CUresult OccupancyMaxActiveBlocksPerMultiprocessor(int* n, CUfunction f, int block,
                                                     size_t smem) override {
    return occupancy_(n, f, block, smem);
  }
  CUresult TensorMapEncodeTiled(CUtensorMap* map, CUtensorMapDataType type, cuuint32_t rank,
                                void* addr, const cuuint64_t* dim, const cuuint64_t* strides,
                                const cuuint32_t* box, const cuuint32_t* elem_strides,
                                CUtensorMapInterleave il, CUtensorMapSwizzle sw,
                                CUtensorMapL2promotion l2, CUtensorMapFloatOOBfill oob) override {
    if (tensor_map_encode_tiled_ == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
    return tensor_map_encode_tiled_(map, type, rank, addr, dim, strides, box, elem_strides,
                                    il, sw, l2, oob);
  }
  CUresult LibraryLoadData(CUlibrary* lib, const void* code, CUjit_option* jo,
                           void** jv, unsigned int nj, CUlibraryOption* lo, void** lv,
                           unsigned int nl) override {
    if (library_load_data_ == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
    return library_load_data_(lib, code, jo, jv, nj, lo, lv, nl);
  }
  CUresult LibraryUnload(CUlibrary lib) override {
    if (library_unload_ == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
    return library_unload_(lib);
  }
  CUresult LibraryGetKernel(CUkernel* k, CUlibrary lib, const char* name) override {
    if (library_get_kernel_ == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
    return library_get_kernel_(k, lib, name);
  }
  CUresult KernelGetFunction(CUfunction* f, CUkernel k) override {
    if (kernel_get_function_ == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
    return kernel_get_function_(f, k);
  }
  CUresult ModuleLoadData(CUmodule* m, const void* image) override {
    return module_load_data_(m, image);
  }
  CUresult ModuleUnload(CUmodule m) override { return module_unload_(m); }
  CUresult ModuleGetFunction(CUfunction* f, CUmodule m, const char* name) override {
    return module_get_function_(f, m, name);
  }
  CUresult GetErrorName(CUresult e, const char** name) override {
    return get_error_name_(e, name);
  }
  CUresult GetErrorString(CUresult e, const char** text) override {
    return get_error_string_(e, text);
  }
  bool HasLibraryApi() const override {
    return library_load_data_ != nullptr && library_unload_ != nullptr &&
           library_get_kernel_ != nullptr && kernel_get_function_ != nullptr;
  }

 private:
  // Resolves `symbol` at `version` into *slot. A missing symbol is an error naming it
  // unless `optional`.
  template <typename Fn>
  absl::Status Get(const char* symbol, int version, Fn* slot, bool optional = false);

  void* handle_;
  bool close_on_destroy_ = false;
  PFN_cuGetProcAddress_v12000 get_proc_v2_ = nullptr;
  PFN_cuGetProcAddress_v11030 get_proc_v1_ = nullptr;
  int driver_version_ = 0;

  PFN_cuInit_v2000 init_ = nullptr;
  PFN_cuDriverGetVersion_v2020 driver_get_version_ = nullptr;
  PFN_cuDeviceGet_v2000 device_get_ = nullptr;
  PFN_cuDeviceGetCount_v2000 device_get_count_ = nullptr;
  PFN_cuDeviceGetName_v2000 device_get_name_ = nullptr;
  PFN_cuDeviceGetAttribute_v2000 device_get_attribute_ = nullptr;
  PFN_cuDeviceTotalMem_v3020 device_total_mem_ = nullptr;
  PFN_cuDeviceGetPCIBusId_v4010 device_get_pci_bus_id_ = nullptr;
  PFN_cuDevicePrimaryCtxRetain_v7000 primary_ctx_retain_ = nullptr;
  PFN_cuDevicePrimaryCtxRelease_v11000 primary_ctx_release_ = nullptr;
  PFN_cuCtxSetCurrent_v4000 ctx_set_current_ = nullptr;
  PFN_cuCtxGetCurrent_v4000 ctx_get_current_ = nullptr;
  PFN_cuCtxGetDevice_v2000 ctx_get_device_ = nullptr;
  PFN_cuCtxSynchronize_v2000 ctx_synchronize_ = nullptr;
  PFN_cuMemAlloc_v3020 mem_alloc_ = nullptr;
  PFN_cuMemFree_v3020 mem_free_ = nullptr;
  PFN_cuMemGetInfo_v3020 mem_get_info_ = nullptr;
  PFN_cuMemcpyHtoD_v3020 memcpy_htod_ = nullptr;
  PFN_cuMemcpyDtoH_v3020 memcpy_dtoh_ = nullptr;
  PFN_cuMemcpyDtoD_v3020 memcpy_dtod_ = nullptr;
  PFN_cuMemsetD8_v3020 memset_d8_ = nullptr;
  PFN_cuMemcpyHtoDAsync_v3020 memcpy_htod_async_ = nullptr;
  PFN_cuMemcpyDtoHAsync_v3020 memcpy_dtoh_async_ = nullptr;
  PFN_cuMemcpyDtoDAsync_v3020 memcpy_dtod_async_ = nullptr;
  PFN_cuMemsetD8Async_v3020 memset_d8_async_ = nullptr;
  PFN_cuStreamCreate_v2000 stream_create_ = nullptr;
  PFN_cuStreamDestroy_v4000 stream_destroy_ = nullptr;
  PFN_cuStreamSynchronize_v2000 stream_synchronize_ = nullptr;
  PFN_cuStreamWaitEvent_v3020 stream_wait_event_ = nullptr;
  PFN_cuEventCreate_v2000 event_create_ = nullptr;
  PFN_cuEventRecord_v2000 event_record_ = nullptr;
  PFN_cuEventSynchronize_v2000 event_synchronize_ = nullptr;
  PFN_cuEventElapsedTime_v2000 event_elapsed_time_ = nullptr;
  PFN_cuEventDestroy_v4000 event_destroy_ = nullptr;
  PFN_cuLaunchKernel_v4000 launch_kernel_ = nullptr;
  PFN_cuLaunchKernelEx_v11060 launch_kernel_ex_ = nullptr;
  PFN_cuFuncSetAttribute_v9000 func_set_attribute_ = nullptr;
  PFN_cuFuncGetAttribute_v2020 func_get_attribute_ = nullptr;
  PFN_cuOccupancyMaxActiveBlocksPerMultiprocessor_v6050 occupancy_ = nullptr;
  PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encode_tiled_ = nullptr;
  PFN_cuLibraryLoadData_v12000 library_load_data_ = nullptr;
  PFN_cuLibraryUnload_v12000 library_unload_ = nullptr;
  PFN_cuLibraryGetKernel_v12000 library_get_kernel_ = nullptr;
  PFN_cuKernelGetFunction_v12000 kernel_get_function_ = nullptr;
  PFN_cuModuleLoadData_v2000 module_load_data_ = nullptr;
  PFN_cuModuleUnload_v2000 module_unload_ = nullptr;
  PFN_cuModuleGetFunction_v2000 module_get_function_ = nullptr;
  PFN_cuGetErrorName_v6000 get_error_name_ = nullptr;
  PFN_cuGetErrorString_v6000 get_error_string_ = nullptr;
};

template <typename Fn>
absl::Status CudaDriver::Get(const char* symbol, int version, Fn* slot, bool optional) {
  void* fn = nullptr;
  CUresult r;
  CUdriverProcAddressQueryResult found = CU_GET_PROC_ADDRESS_SUCCESS;
  if (get_proc_v2_ != nullptr) {
    r = get_proc_v2_(symbol, &fn, version, CU_GET_PROC_ADDRESS_DEFAULT, &found);
  } else {
    r = get_proc_v1_(symbol, &fn, version, CU_GET_PROC_ADDRESS_DEFAULT);
  }
  if (r == CUDA_SUCCESS && found == CU_GET_PROC_ADDRESS_SUCCESS && fn != nullptr) {
    *slot = reinterpret_cast<Fn>(fn);
    return absl::OkStatus();
  }
  *slot = nullptr;
  if (optional) return absl::OkStatus();
  const char* why = found == CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT
                        ? "the driver is older than this entry point"
                        : "the driver does not export it";
  return absl::FailedPreconditionError(absl::StrCat(
      "driver: entry point ", symbol, " (CUDA ", version / 1000, ".",
      (version % 1000) / 10, " ABI) is missing: ", why, " (cuGetProcAddress returned ",
      static_cast<int>(r), ", driver version ", driver_version_,
      "); update the NVIDIA driver"));
}

absl::Status CudaDriver::Resolve(const std::string& library) {
  // cuGetProcAddress is the one symbol taken from the dynamic symbol table; every other
  // entry point comes through it, with an explicit ABI version.
  get_proc_v2_ = reinterpret_cast<PFN_cuGetProcAddress_v12000>(
      dlsym(handle_, "cuGetProcAddress_v2"));
  if (get_proc_v2_ == nullptr) {
    get_proc_v1_ = reinterpret_cast<PFN_cuGetProcAddress_v11030>(
        dlsym(handle_, "cuGetProcAddress"));
  }
  if (get_proc_v2_ == nullptr && get_proc_v1_ == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "driver: ", library,
        " exports neither cuGetProcAddress_v2 nor cuGetProcAddress (driver older than "
        "CUDA 11.3?); update the NVIDIA driver"));
  }
  CUBIST_RETURN_IF_ERROR(Get("cuDriverGetVersion", 2020, &driver_get_version_));
  if (driver_get_version_(&driver_version_) != CUDA_SUCCESS) driver_version_ = 0;

  CUBIST_RETURN_IF_ERROR(Get("cuInit", 2000, &init_));
  CUBIST_RETURN_IF_ERROR(Get("cuDeviceGet", 2000, &device_get_));
  CUBIST_RETURN_IF_ERROR(Get("cuDeviceGetCount", 2000, &device_get_count_));
  CUBIST_RETURN_IF_ERROR(Get("cuDeviceGetName", 2000, &device_get_name_));
  CUBIST_RETURN_IF_ERROR(Get("cuDeviceGetAttribute", 2000, &device_get_attribute_));
  CUBIST_RETURN_IF_ERROR(Get("cuDeviceTotalMem", 3020, &device_total_mem_));
  CUBIST_RETURN_IF_ERROR(Get("cuDeviceGetPCIBusId", 4010, &device_get_pci_bus_id_));
  CUBIST_RETURN_IF_ERROR(Get("cuDevicePrimaryCtxRetain", 7000, &primary_ctx_retain_));
  CUBIST_RETURN_IF_ERROR(Get("cuDevicePrimaryCtxRelease", 11000, &primary_ctx_release_));
  CUBIST_RETURN_IF_ERROR(Get("cuCtxSetCurrent", 4000, &ctx_set_current_));
  CUBIST_RETURN_IF_ERROR(Get("cuCtxGetCurrent", 4000, &ctx_get_current_));
  CUBIST_RETURN_IF_ERROR(Get("cuCtxGetDevice", 2000, &ctx_get_device_));
  CUBIST_RETURN_IF_ERROR(Get("cuCtxSynchronize", 2000, &ctx_synchronize_));
  CUBIST_RETURN_IF_ERROR(Get("cuMemAlloc", 3020, &mem_alloc_));
  CUBIST_RETURN_IF_ERROR(Get("cuMemFree", 3020, &mem_free_));
  CUBIST_RETURN_IF_ERROR(Get("cuMemGetInfo", 3020, &mem_get_info_));
  CUBIST_RETURN_IF_ERROR(Get("cuMemcpyHtoD", 3020, &memcpy_htod_));
  CUBIST_RETURN_IF_ERROR(Get("cuMemcpyDtoH", 3020, &memcpy_dtoh_));
  CUBIST_RETURN_IF_ERROR(Get("cuMemcpyDtoD", 3020, &memcpy_dtod_));
  CUBIST_RETURN_IF_ERROR(Get("cuMemsetD8", 3020, &memset_d8_));
  CUBIST_RETURN_IF_ERROR(Get("cuMemcpyHtoDAsync", 3020, &memcpy_htod_async_));
  CUBIST_RETURN_IF_ERROR(Get("cuMemcpyDtoHAsync", 3020, &memcpy_dtoh_async_));
  CUBIST_RETURN_IF_ERROR(Get("cuMemcpyDtoDAsync", 3020, &memcpy_dtod_async_));
  CUBIST_RETURN_IF_ERROR(Get("cuMemsetD8Async", 3020, &memset_d8_async_));
  CUBIST_RETURN_IF_ERROR(Get("cuStreamCreate", 2000, &stream_create_));
  CUBIST_RETURN_IF_ERROR(Get("cuStreamDestroy", 4000, &stream_destroy_));
  CUBIST_RETURN_IF_ERROR(Get("cuStreamSynchronize", 2000, &stream_synchronize_));
  CUBIST_RETURN_IF_ERROR(Get("cuStreamWaitEvent", 3020, &stream_wait_event_));
  CUBIST_RETURN_IF_ERROR(Get("cuEventCreate", 2000, &event_create_));
  CUBIST_RETURN_IF_ERROR(Get("cuEventRecord", 2000, &event_record_));
  CUBIST_RETURN_IF_ERROR(Get("cuEventSynchronize", 2000, &event_synchronize_));
  // cuEventElapsedTime_v2 (12.8) has the v1 signature; take it where the driver has it.
  CUBIST_RETURN_IF_ERROR(
      Get("cuEventElapsedTime", 12080, &event_elapsed_time_, /*optional=*/true));
  if (event_elapsed_time_ == nullptr) {
    CUBIST_RETURN_IF_ERROR(Get("cuEventElapsedTime", 2000, &event_elapsed_time_));
  }
  CUBIST_RETURN_IF_ERROR(Get("cuEventDestroy", 4000, &event_destroy_));
  CUBIST_RETURN_IF_ERROR(Get("cuLaunchKernel", 4000, &launch_kernel_));
  CUBIST_RETURN_IF_ERROR(Get("cuLaunchKernelEx", 11060, &launch_kernel_ex_));
  CUBIST_RETURN_IF_ERROR(Get("cuFuncSetAttribute", 9000, &func_set_attribute_));
  CUBIST_RETURN_IF_ERROR(Get("cuFuncGetAttribute", 2020, &func_get_attribute_));
  CUBIST_RETURN_IF_ERROR(
      Get("cuOccupancyMaxActiveBlocksPerMultiprocessor", 6050, &occupancy_));
  CUBIST_RETURN_IF_ERROR(Get("cuModuleLoadData", 2000, &module_load_data_));
  CUBIST_RETURN_IF_ERROR(Get("cuModuleUnload", 2000, &module_unload_));
  CUBIST_RETURN_IF_ERROR(Get("cuModuleGetFunction", 2000, &module_get_function_));
  CUBIST_RETURN_IF_ERROR(Get("cuGetErrorName", 6000, &get_error_name_));
  CUBIST_RETURN_IF_ERROR(Get("cuGetErrorString", 6000, &get_error_string_));
  // Optional (CUDA 12.0): without it the TMA kernels (moe_gemm ABI 2) cannot be launched,
  // and the dispatcher says so.
  CUBIST_RETURN_IF_ERROR(
      Get("cuTensorMapEncodeTiled", 12000, &tensor_map_encode_tiled_, /*optional=*/true));
  // The library API (CUDA 12.0) is optional: without it the module cache falls back to
  // cuModuleLoadData.
  CUBIST_RETURN_IF_ERROR(Get("cuLibraryLoadData", 12000, &library_load_data_, true));
  CUBIST_RETURN_IF_ERROR(Get("cuLibraryUnload", 12000, &library_unload_, true));
  CUBIST_RETURN_IF_ERROR(Get("cuLibraryGetKernel", 12000, &library_get_kernel_, true));
  CUBIST_RETURN_IF_ERROR(Get("cuKernelGetFunction", 12000, &kernel_get_function_, true));
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<CudaDriver>> Open(const std::string& library) {
  dlerror();
  void* handle = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* err = dlerror();
    return absl::FailedPreconditionError(absl::StrCat(
        "no driver: dlopen ", library, ": ", err != nullptr ? err : "unknown error",
        "; install the NVIDIA driver (it provides libcuda.so.1) or run on a machine "
        "with a GPU"));
  }
  auto driver = std::make_unique<CudaDriver>(handle);
  absl::Status s = driver->Resolve(library);
  if (!s.ok()) {
    driver->set_close_on_destroy(true);
    return s;
  }
  return driver;
}

std::string DefaultLibrary() {
  const char* env = std::getenv("CUBIST_LIBCUDA");
  return env != nullptr && *env != '\0' ? env : kDefaultLibrary;
}

}  // namespace

absl::StatusOr<std::unique_ptr<DriverApi>> OpenDriverLibrary(const std::string& library) {
  CUBIST_ASSIGN_OR_RETURN(std::unique_ptr<CudaDriver> driver, Open(library));
  driver->set_close_on_destroy(true);
  return std::unique_ptr<DriverApi>(std::move(driver));
}

absl::StatusOr<DriverApi*> LoadDriver() {
  // Leaked on purpose: the table must outlive every static that might use it.
  static const absl::StatusOr<DriverApi*>* const loaded = [] {
    auto opened = Open(DefaultLibrary());
    if (!opened.ok()) return new absl::StatusOr<DriverApi*>(opened.status());
    return new absl::StatusOr<DriverApi*>(opened->release());
  }();
  return *loaded;
}

absl::StatusOr<DriverApi*> GetDriver() {
  static const absl::StatusOr<DriverApi*>* const initialised = [] {
    absl::StatusOr<DriverApi*> driver = LoadDriver();
    if (!driver.ok()) return new absl::StatusOr<DriverApi*>(driver.status());
    CUresult r = (*driver)->Init(0);
    if (r != CUDA_SUCCESS) {
      absl::Status s = CuCheck(**driver, r, "no GPU: cuInit");
      return new absl::StatusOr<DriverApi*>(absl::FailedPreconditionError(absl::StrCat(
          s.message(), "; check nvidia-smi, CUDA_VISIBLE_DEVICES and /dev/nvidia*")));
    }
    return new absl::StatusOr<DriverApi*>(*driver);
  }();
  return *initialised;
}

}  // namespace cubist
