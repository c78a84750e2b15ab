// A fake CUDA driver table (loader/driver_api.h) for unit tests: devices with a chosen
// SM, primary contexts, a per-thread current context, and library/module loading that
// understands real cubins (the kernels it offers are the ones InspectCubin finds in the
// loaded bytes). It counts every call that the module cache's contract is about, and can
// be told to fail or to slow down loads (to widen race windows).
//
// Thread safety: every method may be called from any thread.
#ifndef CUBIST_TESTS_TESTLIB_FAKE_DRIVER_H_
#define CUBIST_TESTS_TESTLIB_FAKE_DRIVER_H_

#include <atomic>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include <mutex>
#include "absl/time/time.h"
#include "loader/driver_api.h"

namespace cubist::testing {

struct FakeDevice {
  int major = 9;
  int minor = 0;
  std::string name = "Fake H200";
  size_t total_mem = size_t{141} << 30;
};

class FakeDriver : public DriverApi {
 public:
  using Device = FakeDevice;

  FakeDriver() : FakeDriver(std::vector<Device>{Device{}}) {}
  explicit FakeDriver(std::vector<Device> devices, bool library_api = true);
  ~FakeDriver() override;

  // --- knobs ---------------------------------------------------------------------
  // The next library/module load returns this error (once).
  void FailNextLoad(CUresult r) { fail_next_load_.store(r); }
  // Every load sleeps this long inside the driver call.
  void SetLoadDelay(absl::Duration d) { load_delay_ = d; }
  // cuFuncSetAttribute returns this error.
  void FailSetAttribute(CUresult r) { fail_set_attribute_.store(r); }

  // --- counters --------------------------------------------------------------------
  int loads() const { return loads_.load(); }            // successful Library/ModuleLoadData
  int load_calls() const { return load_calls_.load(); }  // including failures
  int library_loads() const { return library_loads_.load(); }
  int module_loads() const { return module_loads_.load(); }
  int unloads() const { return unloads_.load(); }
  int lookups() const { return lookups_.load(); }  // GetKernel/ModuleGetFunction calls
  int set_attribute_calls() const { return set_attribute_calls_.load(); }
  int live_images() const;                            // loaded and not unloaded
  // The value cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES) last set for `f`, or -1.
  int dynamic_shared_limit(CUfunction f) const;
  // The kernel name `f` was looked up by, or "" for a handle this driver did not hand out.
  std::string FunctionName(CUfunction f) const;
  // The context handle of device `ordinal`'s primary context.
  CUcontext context_of(int ordinal) const;
  int primary_retains() const { return retains_.load(); }
  int primary_releases() const { return releases_.load(); }

  // --- DriverApi -------------------------------------------------------------------
  CUresult Init(unsigned int) override { return CUDA_SUCCESS; }
  CUresult DriverGetVersion(int* v) override { *v = 13000; return CUDA_SUCCESS; }
  CUresult DeviceGet(CUdevice* d, int ordinal) override;
  CUresult DeviceGetCount(int* n) override;
  CUresult DeviceGetName(char* name, int len, CUdevice d) override;
  CUresult DeviceGetAttribute(int* v, CUdevice_attribute a, CUdevice d) override;
  CUresult DeviceTotalMem(size_t* bytes, CUdevice d) override;
  CUresult DevicePrimaryCtxRetain(CUcontext* c, CUdevice d) override;
  CUresult DevicePrimaryCtxRelease(CUdevice d) override;
  CUresult CtxSetCurrent(CUcontext c) override;
  CUresult CtxGetCurrent(CUcontext* c) override;
  CUresult CtxGetDevice(CUdevice* d) override;
  CUresult LibraryLoadData(CUlibrary* lib, const void* code, CUjit_option*, void**,
                           unsigned int, CUlibraryOption*, void**, unsigned int) override;
  CUresult LibraryUnload(CUlibrary lib) override;
  CUresult LibraryGetKernel(CUkernel* k, CUlibrary lib, const char* name) override;
  CUresult KernelGetFunction(CUfunction* f, CUkernel k) override;
  CUresult ModuleLoadData(CUmodule* m, const void* image) override;
  CUresult ModuleUnload(CUmodule m) override;
  CUresult ModuleGetFunction(CUfunction* f, CUmodule m, const char* name) override;
  CUresult FuncSetAttribute(CUfunction f, CUfunction_attribute a, int v) override;
  bool HasLibraryApi() const override { return library_api_; }
  // Fills the map with zeros and records what it was asked to describe (tensor_maps()).
  CUresult TensorMapEncodeTiled(CUtensorMap* map, CUtensorMapDataType type, cuuint32_t rank,
                                void* global_address, const cuuint64_t* global_dim,
                                const cuuint64_t* global_strides, const cuuint32_t* box_dim,
                                const cuuint32_t* element_strides,
                                CUtensorMapInterleave interleave, CUtensorMapSwizzle swizzle,
                                CUtensorMapL2promotion l2_promotion,
                                CUtensorMapFloatOOBfill oob_fill) override;

  // A 2-D tensor map the driver encoded: its base address, rows and row bytes.
  struct TensorMap {
    uintptr_t address = 0;
    uint64_t rows = 0;
    uint64_t row_bytes = 0;
    bool operator==(const TensorMap&) const = default;
  };
  std::vector<TensorMap> tensor_maps() const;

 private:
  struct Image {
    std::set<std::string> kernels;
    CUcontext context = nullptr;  // for modules: the context current at load
    bool unloaded = false;
  };
  CUresult Load(void** handle, const void* code);
  CUresult Lookup(CUfunction* f, void* handle, const char* name);

  std::vector<Device> devices_;
  bool library_api_;
  std::vector<std::unique_ptr<char>> contexts_;  // one fake handle per device

  mutable std::mutex mu_;  // std::mutex: TSan-visible (see loader/module_cache.cc)
  std::map<void*, std::unique_ptr<Image>> images_;
  std::map<std::pair<void*, std::string>, std::unique_ptr<char>> functions_
     ;
  std::map<CUfunction, int> smem_limit_;
  std::vector<TensorMap> tensor_maps_;

  absl::Duration load_delay_ = absl::ZeroDuration();
  std::atomic<CUresult> fail_next_load_{CUDA_SUCCESS};
  std::atomic<CUresult> fail_set_attribute_{CUDA_SUCCESS};
  std::atomic<int> loads_{0}, load_calls_{0}, library_loads_{0}, module_loads_{0};
  std::atomic<int> unloads_{0}, lookups_{0}, set_attribute_calls_{0};
  std::atomic<int> retains_{0}, releases_{0};
};

}  // namespace cubist::testing

#endif  // CUBIST_TESTS_TESTLIB_FAKE_DRIVER_H_
