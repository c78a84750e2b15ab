// libFuzzer target: InspectCubin on arbitrary bytes must never crash or read out of
// bounds, and must answer only OK or InvalidArgument. What it accepts must be coherent:
// image ranges inside the input, kernels named, compatibility answers that agree with
// each other for every device SM. Any violation aborts (a finding).
//   clang++-14 -std=c++20 -g -O1 -fsanitize=fuzzer,address -I. -I/usr/local/cuda/include \
//     tests/fuzz/cubin_fuzz.cc loader/cubin.cc loader/compat.cc base/unique_fd.cc \
//     -labsl_str_format_internal -labsl_strings -labsl_status -labsl_statusor ... -o cubin_fuzz
//   ./cubin_fuzz tests/fuzz/corpus/cubin
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "loader/compat.h"
#include "loader/cubin.h"

namespace {

[[noreturn]] void Fail(const char* what, const std::string& detail) {
  std::fprintf(stderr, "cubin_fuzz: %s\n%s\n", what, detail.c_str());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace cubist;
  const std::string_view input(reinterpret_cast<const char*>(data), size);

  // SM names: whatever parses prints back to itself.
  if (size <= 16) {
    absl::StatusOr<SmTarget> sm = SmTarget::Parse(input);
    if (sm.ok()) {
      absl::StatusOr<SmTarget> again = SmTarget::Parse(sm->ToString());
      if (!again.ok() || !(*again == *sm)) Fail("SmTarget round trip", sm->ToString());
    } else if (sm.status().code() != absl::StatusCode::kInvalidArgument) {
      Fail("SmTarget::Parse code", std::string(sm.status().message()));
    }
  }

  absl::StatusOr<CubinInfo> info = InspectCubin(input);
  if (!info.ok()) {
    if (info.status().code() != absl::StatusCode::kInvalidArgument) {
      Fail("error other than InvalidArgument", std::string(info.status().message()));
    }
    return 0;
  }
  if (info->container == CubinInfo::Container::kCubin && info->images.size() != 1) {
    Fail("cubin without exactly one image", "");
  }
  for (const ImageInfo& img : info->images) {
    if (img.offset > size || img.size > size - img.offset) {
      Fail("image range outside the input", std::to_string(img.offset) + "+" +
                                                std::to_string(img.size));
    }
    for (const KernelInfo& k : img.kernels) {
      if (k.name.empty()) Fail("unnamed kernel", "");
      if (k.static_shared_bytes < 0 || k.code_bytes < 0) Fail("negative size", k.name);
    }
  }
  for (DeviceSm device : {DeviceSm{7, 5}, DeviceSm{8, 0}, DeviceSm{8, 6}, DeviceSm{9, 0},
                          DeviceSm{10, 0}, DeviceSm{10, 3}, DeviceSm{12, 0}}) {
    bool ok = CheckCompatible(*info, device).ok();
    bool best = BestImageFor(*info, device) != nullptr;
    if (ok != best) Fail("CheckCompatible and BestImageFor disagree", device.ToString());
  }
  return 0;
}
