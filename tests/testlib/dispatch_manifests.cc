#include "tests/testlib/dispatch_manifests.h"

#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "manifest/manifest_parser.h"

namespace cubist::testing {
namespace {

std::string ArtifactOf(const TestKernel& k) {
  return k.artifact.empty() ? absl::StrCat("cubins/sm_90a/", k.name, ".cubin") : k.artifact;
}

}  // namespace

std::string KernelJson(const TestKernel& k) {
  std::string s = absl::StrCat(
      "{\"name\": \"", k.name, "\", \"artifact\": \"", ArtifactOf(k), "\", \"function\": \"",
      k.function.empty() ? k.name : k.function, "\", \"arch\": \"", k.arch,
      "\", \"op\": \"", k.op, "\", \"abi\": ", k.abi, ", \"weight_format\": \"",
      k.weight_format, "\", \"activation_format\": \"", k.activation_format,
      "\", \"activation\": \"", k.activation, "\", \"tile_m\": ", k.tile_m,
      ", \"tile_n\": ", k.tile_n, ", \"tile_k\": ", k.tile_k, ", \"cluster\": [",
      k.cluster[0], ", ", k.cluster[1], ", ", k.cluster[2], "], \"stages\": 4",
      ", \"threads\": ", k.threads, ", \"shared_mem_bytes\": ", k.shared_mem_bytes);
  if (!k.extras.empty()) absl::StrAppend(&s, ", ", k.extras);
  s += "}";
  return s;
}

std::string ManifestJson(const std::vector<TestKernel>& kernels) {
  std::set<std::string> paths;
  for (const TestKernel& k : kernels) paths.insert(ArtifactOf(k));
  std::vector<std::string> artifacts;
  int i = 0;
  for (const std::string& p : paths) {
    // Distinct made-up hashes: hex digits of the index repeated.
    std::string hex(64, "0123456789abcdef"[i++ % 16]);
    artifacts.push_back(
        absl::StrCat("{\"path\": \"", p, "\", \"sha256\": \"", hex, "\", \"size\": 1000}"));
  }
  std::vector<std::string> ks;
  for (const TestKernel& k : kernels) ks.push_back(KernelJson(k));
  return absl::StrCat(
      "{\"schema\": \"cubist.manifest/1\", \"name\": \"dispatch-test\", \"version\": 1,\n"
      " \"artifacts\": [\n  ",
      absl::StrJoin(artifacts, ",\n  "), "],\n \"kernels\": [\n  ",
      absl::StrJoin(ks, ",\n  "), "]}\n");
}

absl::StatusOr<Manifest> ParseTestManifest(const std::vector<TestKernel>& kernels) {
  return ParseManifest(ManifestJson(kernels), "test-manifest.json");
}

std::vector<TestKernel> SelectionKernels() {
  std::vector<TestKernel> v;
  auto add = [&](std::string name) -> TestKernel& {
    v.push_back(TestKernel{.name = std::move(name)});
    return v.back();
  };
  add("bf16_swiglu_m64n64k64").tile_n = 64;
  add("bf16_swiglu_m64n128k64");
  {
    TestKernel& k = add("bf16_swiglu_m128n128k64");
    k.tile_m = 128;
    k.threads = 384;
  }
  {
    TestKernel& k = add("bf16_relu2_m128n128k64");
    k.activation = "relu2";
    k.tile_m = 128;
    k.threads = 384;
  }
  {
    TestKernel& k = add("mxfp4_bf16_swiglu_m64n128k128");
    k.weight_format = "mxfp4";
    k.tile_k = 128;
    k.extras = "\"k_align\": 128, \"n_align\": 8, \"gated\": true";
  }
  {
    TestKernel& k = add("fp8_fp8_swiglu_m128n128k128");
    k.weight_format = "fp8";
    k.activation_format = "fp8";
    k.tile_m = 128;
    k.tile_k = 128;
    k.threads = 384;
  }
  {
    TestKernel& k = add("bf16_swiglu_sm100a_m128n256k64");
    k.arch = "sm_100a";
    k.tile_m = 128;
    k.tile_n = 256;
    k.artifact = "cubins/sm_100a/bf16_swiglu_sm100a_m128n256k64.cubin";
  }
  return v;
}

std::optional<TestKernel> InexactCopy(const std::vector<TestKernel>& kernels,
                                      std::string_view of, std::string name) {
  for (const TestKernel& k : kernels) {
    if (k.name != of) continue;
    TestKernel copy = k;
    copy.name = std::move(name);
    copy.artifact = "";
    copy.function = "";
    copy.extras = "\"exact\": false";
    return copy;
  }
  return std::nullopt;
}

}  // namespace cubist::testing
