// libFuzzer target: ParseTrtllmGenMetaInfo on arbitrary bytes must never crash and fail
// only with InvalidArgument; what it accepts must hold non-empty C-identifier function
// names and lowercase hex hashes, and every entry TrtllmGenKernelSpec accepts must make
// a kernel the registry's vocabulary knows.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "base/sha256.h"
#include "dispatch/moe_types.h"
#include "manifest/flashinfer_import.h"
#include "manifest/trtllm_gen_meta.h"

namespace {

[[noreturn]] void Fail(const char* what, const std::string& detail) {
  std::fprintf(stderr, "trtllm_gen_meta_fuzz: %s\n%s\n", what, detail.c_str());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace cubist;
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  TrtllmGenMetaLimits limits;
  limits.max_entries = 64;
  limits.max_values = 256;
  absl::StatusOr<TrtllmGenMetaInfo> info = ParseTrtllmGenMetaInfo(input, "m.h", limits);
  if (!info.ok()) {
    if (info.status().code() != absl::StatusCode::kInvalidArgument) {
      Fail("error other than InvalidArgument", std::string(info.status().message()));
    }
    return 0;
  }
  if (info->kernels.empty()) Fail("accepted a list without entries", std::string(input));
  for (const TrtllmGenKernelMeta& k : info->kernels) {
    if (k.function.empty()) Fail("accepted an empty function name", std::string(input));
    if (!IsSha256Hex(k.sha256)) Fail("accepted a bad hash", k.sha256);
    if (k.options.size() > limits.max_values) Fail("more options than the limit", k.function);
    absl::StatusOr<KernelSpec> spec = TrtllmGenKernelSpec(k, "m.h");
    if (!spec.ok()) {
      if (spec.status().code() != absl::StatusCode::kInvalidArgument) {
        Fail("spec error other than InvalidArgument", std::string(spec.status().message()));
      }
      continue;
    }
    if (!ParseDataFormat(spec->weight_format).ok() ||
        !ParseDataFormat(spec->activation_format).ok() ||
        !ParseActivation(spec->activation).ok()) {
      Fail("made a kernel outside the vocabulary", spec->name);
    }
    if (spec->tile_m < 1 || spec->tile_n < 1 || spec->tile_k < 1) Fail("bad tile", spec->name);
  }
  return 0;
}
