#include "loader/context.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace cubist {

absl::StatusOr<DeviceSm> GetDeviceSm(DriverApi& driver, CUdevice device) {
  DeviceSm sm;
  CUBIST_RETURN_IF_ERROR(CuCheck(
      driver,
      driver.DeviceGetAttribute(&sm.major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
                                device),
      "cuDeviceGetAttribute(COMPUTE_CAPABILITY_MAJOR)"));
  CUBIST_RETURN_IF_ERROR(CuCheck(
      driver,
      driver.DeviceGetAttribute(&sm.minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
                                device),
      "cuDeviceGetAttribute(COMPUTE_CAPABILITY_MINOR)"));
  return sm;
}

absl::StatusOr<PrimaryContext> PrimaryContext::Retain(DriverApi& driver, int ordinal) {
  int count = 0;
  CUBIST_RETURN_IF_ERROR(CuCheck(driver, driver.DeviceGetCount(&count), "cuDeviceGetCount"));
  if (ordinal < 0 || ordinal >= count) {
    return absl::FailedPreconditionError(absl::StrCat(
        "device ", ordinal, ": out of range, the driver sees ", count,
        " device(s); check CUDA_VISIBLE_DEVICES"));
  }
  PrimaryContext ctx;
  ctx.driver_ = &driver;
  ctx.ordinal_ = ordinal;
  CUBIST_RETURN_IF_ERROR(CuCheck(driver, driver.DeviceGet(&ctx.device_, ordinal),
                                 absl::StrCat("cuDeviceGet(", ordinal, ")")));
  CUBIST_ASSIGN_OR_RETURN(ctx.sm_, GetDeviceSm(driver, ctx.device_));
  CUcontext raw = nullptr;
  CUBIST_RETURN_IF_ERROR(CuCheck(driver, driver.DevicePrimaryCtxRetain(&raw, ctx.device_),
                                 absl::StrCat("cuDevicePrimaryCtxRetain(device ", ordinal,
                                              ")")));
  ctx.context_ = raw;
  return ctx;
}

PrimaryContext::~PrimaryContext() { Reset(); }

PrimaryContext::PrimaryContext(PrimaryContext&& other) noexcept
    : driver_(other.driver_),
      context_(std::exchange(other.context_, nullptr)),
      device_(other.device_),
      ordinal_(other.ordinal_),
      sm_(other.sm_) {}

PrimaryContext& PrimaryContext::operator=(PrimaryContext&& other) noexcept {
  if (this != &other) {
    Reset();
    driver_ = other.driver_;
    context_ = std::exchange(other.context_, nullptr);
    device_ = other.device_;
    ordinal_ = other.ordinal_;
    sm_ = other.sm_;
  }
  return *this;
}

void PrimaryContext::Reset() {
  if (context_ != nullptr && driver_ != nullptr) {
    (void)driver_->DevicePrimaryCtxRelease(device_);
  }
  context_ = nullptr;
}

absl::Status PrimaryContext::MakeCurrent() const {
  if (!valid()) return absl::FailedPreconditionError("primary context: not retained");
  return CuCheck(*driver_, driver_->CtxSetCurrent(context_), "cuCtxSetCurrent");
}

absl::StatusOr<ScopedContext> ScopedContext::Enter(DriverApi& driver, CUcontext context) {
  CUcontext previous = nullptr;
  CUBIST_RETURN_IF_ERROR(CuCheck(driver, driver.CtxGetCurrent(&previous), "cuCtxGetCurrent"));
  if (previous == context) return ScopedContext(&driver, previous, /*restore=*/false);
  CUBIST_RETURN_IF_ERROR(CuCheck(driver, driver.CtxSetCurrent(context), "cuCtxSetCurrent"));
  return ScopedContext(&driver, previous, /*restore=*/true);
}

ScopedContext::ScopedContext(ScopedContext&& other) noexcept
    : driver_(other.driver_),
      previous_(other.previous_),
      restore_(std::exchange(other.restore_, false)) {}

ScopedContext::~ScopedContext() {
  if (restore_) (void)driver_->CtxSetCurrent(previous_);
}

}  // namespace cubist
