// The CUDA driver, reached at run time.
//
// cubist has no link-time dependency on libcuda or libcudart: LoadDriver() dlopens
// "libcuda.so.1" and resolves every entry point below through cuGetProcAddress with the
// CUDA version whose signature matches the <cuda.h> type used here, checking each one.
// A missing library or entry point is a FailedPrecondition that names it.
//
// Everything that talks to the driver goes through the DriverApi interface, so that
// unit tests can hand the loader a fake (tests/testlib/fake_driver.h): each method has
// a default body that returns CUDA_ERROR_NOT_SUPPORTED, and a fake overrides only what
// it needs. Method names are the driver's without the "cu" prefix and take exactly the
// driver's arguments; the real table forwards them unchanged.
//
// Thread safety: the real table is immutable after LoadDriver() returns and may be used
// from any thread (the driver itself is thread-safe). Fakes document their own rules.
#ifndef CUBIST_LOADER_DRIVER_API_H_
#define CUBIST_LOADER_DRIVER_API_H_

#include <cuda.h>

#include <memory>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace cubist {

class DriverApi {
 public:
  virtual ~DriverApi() = default;

  // Initialisation and versions.
  virtual CUresult Init(unsigned int flags);
  virtual CUresult DriverGetVersion(int* version);

  // Devices.
  virtual CUresult DeviceGet(CUdevice* device, int ordinal);
  virtual CUresult DeviceGetCount(int* count);
  virtual CUresult DeviceGetName(char* name, int len, CUdevice device);
  virtual CUresult DeviceGetAttribute(int* value, CUdevice_attribute attrib,
                                      CUdevice device);
  virtual CUresult DeviceTotalMem(size_t* bytes, CUdevice device);
  virtual CUresult DeviceGetPCIBusId(char* pci_bus_id, int len, CUdevice device);

  // Contexts.
  virtual CUresult DevicePrimaryCtxRetain(CUcontext* ctx, CUdevice device);
  virtual CUresult DevicePrimaryCtxRelease(CUdevice device);
  virtual CUresult CtxSetCurrent(CUcontext ctx);
  virtual CUresult CtxGetCurrent(CUcontext* ctx);
  virtual CUresult CtxGetDevice(CUdevice* device);  // of the current context
  virtual CUresult CtxSynchronize();                // the current context

  // Memory.
  virtual CUresult MemAlloc(CUdeviceptr* dptr, size_t bytes);
  virtual CUresult MemFree(CUdeviceptr dptr);
  virtual CUresult MemGetInfo(size_t* free_bytes, size_t* total_bytes);
  virtual CUresult MemcpyHtoD(CUdeviceptr dst, const void* src, size_t bytes);
  virtual CUresult MemcpyDtoH(void* dst, CUdeviceptr src, size_t bytes);
  virtual CUresult MemcpyDtoD(CUdeviceptr dst, CUdeviceptr src, size_t bytes);
  virtual CUresult MemsetD8(CUdeviceptr dst, unsigned char value, size_t count);
  virtual CUresult MemcpyHtoDAsync(CUdeviceptr dst, const void* src, size_t bytes,
                                   CUstream stream);
  virtual CUresult MemcpyDtoHAsync(void* dst, CUdeviceptr src, size_t bytes,
                                   CUstream stream);
  virtual CUresult MemcpyDtoDAsync(CUdeviceptr dst, CUdeviceptr src, size_t bytes,
                                   CUstream stream);
  virtual CUresult MemsetD8Async(CUdeviceptr dst, unsigned char value, size_t count,
                                 CUstream stream);

  // Streams and events.
  virtual CUresult StreamCreate(CUstream* stream, unsigned int flags);
  virtual CUresult StreamDestroy(CUstream stream);
  virtual CUresult StreamSynchronize(CUstream stream);
  virtual CUresult StreamWaitEvent(CUstream stream, CUevent event, unsigned int flags);
  virtual CUresult EventCreate(CUevent* event, unsigned int flags);
  virtual CUresult EventRecord(CUevent event, CUstream stream);
  virtual CUresult EventSynchronize(CUevent event);
  virtual CUresult EventElapsedTime(float* ms, CUevent start, CUevent end);
  virtual CUresult EventDestroy(CUevent event);

  // Launch.
  virtual CUresult LaunchKernel(CUfunction f, unsigned int grid_x, unsigned int grid_y,
                                unsigned int grid_z, unsigned int block_x,
                                unsigned int block_y, unsigned int block_z,
                                unsigned int shared_mem_bytes, CUstream stream,
                                void** kernel_params, void** extra);
  virtual CUresult LaunchKernelEx(const CUlaunchConfig* config, CUfunction f,
                                  void** kernel_params, void** extra);
  virtual CUresult FuncSetAttribute(CUfunction f, CUfunction_attribute attrib, int value);
  virtual CUresult FuncGetAttribute(int* value, CUfunction_attribute attrib, CUfunction f);
  virtual CUresult OccupancyMaxActiveBlocksPerMultiprocessor(int* num_blocks, CUfunction f,
                                                             int block_size,
                                                             size_t dynamic_smem_bytes);

  // Tensor maps for the bulk tensor copy engine (TMA; CUDA 12.0+, a pure host call).
  virtual CUresult TensorMapEncodeTiled(CUtensorMap* map, CUtensorMapDataType type,
                                        cuuint32_t rank, void* global_address,
                                        const cuuint64_t* global_dim,
                                        const cuuint64_t* global_strides,
                                        const cuuint32_t* box_dim,
                                        const cuuint32_t* element_strides,
                                        CUtensorMapInterleave interleave,
                                        CUtensorMapSwizzle swizzle,
                                        CUtensorMapL2promotion l2_promotion,
                                        CUtensorMapFloatOOBfill oob_fill);

  // Libraries (context independent, CUDA 12.0+) and modules.
  virtual CUresult LibraryLoadData(CUlibrary* library, const void* code,
                                   CUjit_option* jit_options, void** jit_option_values,
                                   unsigned int num_jit_options,
                                   CUlibraryOption* library_options,
                                   void** library_option_values,
                                   unsigned int num_library_options);
  virtual CUresult LibraryUnload(CUlibrary library);
  virtual CUresult LibraryGetKernel(CUkernel* kernel, CUlibrary library, const char* name);
  virtual CUresult KernelGetFunction(CUfunction* f, CUkernel kernel);  // current context
  virtual CUresult ModuleLoadData(CUmodule* module, const void* image);
  virtual CUresult ModuleUnload(CUmodule module);
  virtual CUresult ModuleGetFunction(CUfunction* f, CUmodule module, const char* name);

  // Errors. Fakes need not override these: the defaults answer "CUDA_ERROR_<n>".
  virtual CUresult GetErrorName(CUresult error, const char** name);
  virtual CUresult GetErrorString(CUresult error, const char** text);

  // True when LibraryLoadData and friends are available (driver >= 12.0). The module
  // cache then prefers them; otherwise it uses ModuleLoadData.
  virtual bool HasLibraryApi() const { return false; }
};

// Loads libcuda.so.1 and resolves the whole table, once per process (later calls return
// the same table or the same error). Does not call cuInit, so that `cubist doctor` can
// report the driver version even where no device is usable.
// Errors: FailedPrecondition "no driver: dlopen libcuda.so.1: <dlerror>; ..." when the
// library is absent, FailedPrecondition naming the entry point when one is missing.
// The environment variable CUBIST_LIBCUDA, when set, names the library to open instead:
// a supported override (README, "Environment") for drivers installed outside the
// loader's search path, such as a compat libcuda in a container; the tests use it to
// load a fake driver.
[[nodiscard]] absl::StatusOr<DriverApi*> LoadDriver();

// LoadDriver() plus a successful cuInit(0), once per process. The entry point for
// everything that needs a GPU. Errors: as LoadDriver(), and FailedPrecondition
// "no GPU: cuInit: CUDA_ERROR_NO_DEVICE (...)" when the driver sees no device.
[[nodiscard]] absl::StatusOr<DriverApi*> GetDriver();

// Opens a driver table from an explicit library path without caching it (tests, and
// callers that want a second table). The table keeps the library open until destroyed.
[[nodiscard]] absl::StatusOr<std::unique_ptr<DriverApi>> OpenDriverLibrary(
    const std::string& library);

// "CUDA_ERROR_OUT_OF_MEMORY (out of memory)" for `result`, through `driver`'s
// GetErrorName/GetErrorString, falling back to the number.
std::string CuResultToString(DriverApi& driver, CUresult result);

// OK for CUDA_SUCCESS; otherwise a status whose message is
// "<context>: CUDA_ERROR_X (text)" and whose code says what the caller should do:
// NO_DEVICE, NOT_INITIALIZED, DEINITIALIZED, SYSTEM_DRIVER_MISMATCH, NO_BINARY_FOR_GPU,
// UNSUPPORTED_PTX_VERSION -> FailedPrecondition; OUT_OF_MEMORY -> ResourceExhausted;
// NOT_FOUND -> NotFound; INVALID_IMAGE, INVALID_PTX, INVALID_VALUE -> InvalidArgument;
// NOT_SUPPORTED -> Unimplemented; everything else -> Internal.
[[nodiscard]] absl::Status CuCheck(DriverApi& driver, CUresult result,
                                   std::string_view context);

}  // namespace cubist

#endif  // CUBIST_LOADER_DRIVER_API_H_
