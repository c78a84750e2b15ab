// Hand-written manifests for the dispatcher's tests (registry, selection, CLI, runtime):
// kernels described by a few fields, rendered as the JSON a publisher would write.
#ifndef CUBIST_TESTS_TESTLIB_DISPATCH_MANIFESTS_H_
#define CUBIST_TESTS_TESTLIB_DISPATCH_MANIFESTS_H_

#include <array>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/moe_gemm_abi.h"
#include "manifest/manifest.h"

namespace cubist::testing {

struct TestKernel {
  std::string name;
  std::string weight_format = "bf16";
  std::string activation_format = "bf16";
  std::string activation = "swiglu";
  int tile_m = 64;
  int tile_n = 128;
  int tile_k = 64;
  std::string arch = "sm_90a";
  std::string op = "moe_gemm";
  int abi = moe::kMoeGemmAbi;
  int threads = 256;
  int shared_mem_bytes = 160 * 1024;  // one CTA per SM: ranking by tiles alone
  std::array<int, 3> cluster = {1, 1, 1};
  std::string extras;    // extra JSON members, e.g. "\"k_multiple\": 128"
  std::string artifact;  // default: cubins/sm_90a/<name>.cubin
  std::string function;  // default: <name>
};

// {"name": ..., "artifact": ..., ...}
std::string KernelJson(const TestKernel& k);
// A whole manifest (name "dispatch-test", version 1) with one artifact per distinct
// kernel artifact path (made-up hashes and sizes).
std::string ManifestJson(const std::vector<TestKernel>& kernels);
// ParseManifest(ManifestJson(kernels), "test-manifest.json").
absl::StatusOr<Manifest> ParseTestManifest(const std::vector<TestKernel>& kernels);

// The kernel set the selection tests share: three bf16 x bf16 swiglu tiles (decode
// m64n64, m64n128, prefill m128n128), a bf16 relu2 kernel, an mxfp4 x bf16 swiglu
// kernel with k_align 128 and n_align 8, an fp8 x fp8 swiglu kernel and an sm_100a bf16 swiglu one.
std::vector<TestKernel> SelectionKernels();

// A copy of the kernel named `of` in `kernels`, renamed `name` (its own artifact and
// function), whose manifest entry says "exact": false; nullopt when `of` is not there.
std::optional<TestKernel> InexactCopy(const std::vector<TestKernel>& kernels,
                                      std::string_view of, std::string name);

}  // namespace cubist::testing

#endif  // CUBIST_TESTS_TESTLIB_DISPATCH_MANIFESTS_H_
