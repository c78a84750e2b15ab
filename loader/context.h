// CUDA contexts as RAII values: a retained primary context per device, and a guard that
// makes a context current on this thread and restores the previous one.
//
// Several GPUs in one process: retain one PrimaryContext per device and create one
// ModuleCache per context. One process per GPU works the same way with ordinal 0 under
// CUDA_VISIBLE_DEVICES.
//
// Thread safety: a PrimaryContext may be shared read-only between threads (the driver's
// primary context is process-wide). A ScopedContext belongs to the thread that made it.
#ifndef CUBIST_LOADER_CONTEXT_H_
#define CUBIST_LOADER_CONTEXT_H_

#include <cuda.h>

#include <string>

#include "absl/status/statusor.h"
#include "loader/compat.h"
#include "loader/driver_api.h"

namespace cubist {

// Owns one reference to a device's primary context (cuDevicePrimaryCtxRetain /
// cuDevicePrimaryCtxRelease). Move-only. `driver` must outlive it.
class PrimaryContext {
 public:
  // Errors: FailedPrecondition when the ordinal is out of range or the device is
  // unusable; the driver's code mapped by CuCheck otherwise.
  [[nodiscard]] static absl::StatusOr<PrimaryContext> Retain(DriverApi& driver,
                                                             int ordinal);

  PrimaryContext() = default;
  ~PrimaryContext();
  PrimaryContext(PrimaryContext&& other) noexcept;
  PrimaryContext& operator=(PrimaryContext&& other) noexcept;
  PrimaryContext(const PrimaryContext&) = delete;
  PrimaryContext& operator=(const PrimaryContext&) = delete;

  CUcontext get() const { return context_; }
  CUdevice device() const { return device_; }
  int ordinal() const { return ordinal_; }
  DeviceSm sm() const { return sm_; }
  DriverApi* driver() const { return driver_; }
  bool valid() const { return context_ != nullptr; }

  // Makes this context current on the calling thread (cuCtxSetCurrent).
  [[nodiscard]] absl::Status MakeCurrent() const;

 private:
  void Reset();

  DriverApi* driver_ = nullptr;
  CUcontext context_ = nullptr;
  CUdevice device_ = 0;
  int ordinal_ = -1;
  DeviceSm sm_;
};

// Makes `context` current on this thread for the guard's lifetime and restores the
// context that was current before. Does nothing (and costs one cuCtxGetCurrent) when
// `context` is already current. Move-only.
class ScopedContext {
 public:
  [[nodiscard]] static absl::StatusOr<ScopedContext> Enter(DriverApi& driver,
                                                           CUcontext context);
  ScopedContext(ScopedContext&& other) noexcept;
  ScopedContext& operator=(ScopedContext&&) = delete;
  ScopedContext(const ScopedContext&) = delete;
  ScopedContext& operator=(const ScopedContext&) = delete;
  ~ScopedContext();

 private:
  ScopedContext(DriverApi* driver, CUcontext previous, bool restore)
      : driver_(driver), previous_(previous), restore_(restore) {}
  DriverApi* driver_;
  CUcontext previous_;
  bool restore_;
};

// The compute capability of `device` (two cuDeviceGetAttribute calls).
[[nodiscard]] absl::StatusOr<DeviceSm> GetDeviceSm(DriverApi& driver, CUdevice device);

}  // namespace cubist

#endif  // CUBIST_LOADER_CONTEXT_H_
