// A fake CUDA driver (tests/testlib/fake_driver.h) that records every cuLaunchKernelEx:
// the kernel's name, its launch configuration and attributes, and a copy of its parameter
// struct, so that a test checks what would have run without a GPU.
//
// Thread safety: as FakeDriver's; launches() and Clear() may race with launches.
#ifndef CUBIST_TESTS_TESTLIB_LAUNCH_RECORDING_DRIVER_H_
#define CUBIST_TESTS_TESTLIB_LAUNCH_RECORDING_DRIVER_H_

#include <algorithm>
#include <cstring>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"
#include "kernels/moe_gemm_abi.h"
#include "tests/testlib/fake_driver.h"

namespace cubist::testing {

class LaunchRecordingDriver : public FakeDriver {
 public:
  struct Launch {
    std::string name;  // the name the function was looked up by
    CUfunction function = nullptr;
    CUlaunchConfig config = {};
    std::vector<CUlaunchAttribute> attrs;
    std::string params;  // the parameter struct's bytes
    // The parameters as T (a test failure when the recorded size differs).
    template <typename T>
    T As() const {
      T t{};
      EXPECT_EQ(params.size(), sizeof(T)) << name;
      std::memcpy(&t, params.data(), std::min(params.size(), sizeof(T)));
      return t;
    }
    // A moe_gemm launch's parameters (MoeGemmParamsV2's first member).
    moe::MoeGemmParams gemm() const { return As<moe::MoeGemmParamsV2>().g; }
  };
  // How many bytes of a kernel's parameter struct to copy, by the kernel's name; the
  // default is sizeof(moe::MoeGemmParamsV2), what every moe_gemm kernel takes.
  using ParamBytes = std::function<size_t(std::string_view name)>;

  explicit LaunchRecordingDriver(ParamBytes param_bytes = nullptr)
      : param_bytes_(std::move(param_bytes)) {}

  CUresult LaunchKernelEx(const CUlaunchConfig* config, CUfunction f, void** params,
                          void** extra) override {
    if (extra != nullptr || params == nullptr) return CUDA_ERROR_INVALID_VALUE;
    Launch l;
    l.name = FunctionName(f);
    l.function = f;
    l.config = *config;
    l.attrs.assign(config->attrs, config->attrs + config->numAttrs);
    const size_t bytes = param_bytes_ ? param_bytes_(l.name) : sizeof(moe::MoeGemmParamsV2);
    l.params.assign(static_cast<const char*>(params[0]), bytes);
    absl::MutexLock lock(&mu_);
    launches_.push_back(std::move(l));
    return CUDA_SUCCESS;
  }
  std::vector<Launch> launches() const {
    absl::MutexLock lock(&mu_);
    return launches_;
  }
  void Clear() {
    absl::MutexLock lock(&mu_);
    launches_.clear();
  }

 private:
  ParamBytes param_bytes_;
  mutable absl::Mutex mu_;
  std::vector<Launch> launches_;
};

}  // namespace cubist::testing

#endif  // CUBIST_TESTS_TESTLIB_LAUNCH_RECORDING_DRIVER_H_
