// The registry: every kernel a manifest names, validated and indexed by name, with its
// metadata parsed into the dispatcher's types. Built once when a manifest is opened;
// immutable afterwards, so any number of threads may read it without locking.
//
// Create() rejects a manifest whose kernel list cannot be dispatched safely
// (InvalidArgument, "<source>: kernels[i].<field>: <what>; <fix>"):
//   - a duplicate kernel name;
//   - a kernel whose artifact is not one of the manifest's artifacts;
//   - an empty name or function, an unparseable arch;
//   - for a known op: an unknown format or activation, non-positive tiles, threads not a
//     multiple of 32 in 32..1024, shared memory over 227 KiB, a cluster dimension < 1 or
//     more than 16 CTAs, an odd tile_n with a gated activation;
//   - inconsistent entries: the same function of the same artifact listed twice with
//     different metadata, or an extras "gated" flag that contradicts the activation;
//   - malformed shape constraints in extras (see ShapeConstraints), or an "exact" flag
//     that is not true or false.
// A kernel with an op this build does not know is kept (listed and explained) but is
// never selected; so is a moe_gemm kernel of a retired parameter-struct version (1,
// generation 1): the selector and the launcher refuse it with the fix (rebuild the family,
// kernels/moe_gemm_abi.h kMoeGemmAbiRetiredFix), and the manifest's other kernels serve.
#ifndef CUBIST_DISPATCH_REGISTRY_H_
#define CUBIST_DISPATCH_REGISTRY_H_

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "dispatch/moe_types.h"
#include "loader/cubin.h"
#include "manifest/manifest.h"

namespace cubist {

// Shape constraints a kernel declares in its manifest extras, each a positive integer:
//   "k_align" or "k_multiple": K % k_multiple == 0 (the larger when both are given)
//   "n_multiple": N % n_multiple == 0
//   "n_align": the output width (N, or N/2 for gated activations) % n_align == 0
//   "max_k": K <= max_k                    "max_n": N <= max_n
//   "max_tokens": tokens (offsets[E]) <= max_tokens
//   "max_experts": experts one launch schedules; MoeGemm runs a larger E as launches
//   over groups of max_experts experts (the cost model counts them), so it filters nothing
// (k_align and n_align are what scripts/build-artifacts writes, from
// kernels/moe_gemm_abi.h's MoeGemmKAlign and kMoeGemmOutColsAlign.)
// The dispatcher adds the constraints the formats impose (K a multiple of the scale
// block: 32 for MX formats, 16 for NVFP4, 128 for fp8-block) and, for gated
// activations, an even N.
struct ShapeConstraints {
  int64_t k_multiple = 1;
  int64_t n_multiple = 1;
  int64_t out_n_multiple = 1;  // "n_align"
  int64_t max_k = 0;       // 0: no limit
  int64_t max_n = 0;       // 0: no limit
  int64_t max_tokens = 0;  // 0: no limit
  int64_t max_experts = 0;  // 0: no limit; experts per launch, not a filter

  bool operator==(const ShapeConstraints&) const = default;
};

struct KernelEntry {
  size_t index = 0;  // position in the registry (and in manifest.kernels)
  KernelSpec spec;
  std::optional<Op> op;  // nullopt: an op this build does not dispatch
  // Valid when `op` is set.
  DataFormat weight_format = DataFormat::kBf16;
  DataFormat activation_format = DataFormat::kBf16;
  Activation activation = Activation::kIdentity;
  SmTarget arch;  // parsed spec.arch
  ShapeConstraints constraints;
  // Calibration the cost model reads from extras (cost_model.h): the fraction of the
  // device's dense matrix rate the kernel's main loop reaches on full tiles, and the
  // fraction of copy bandwidth it streams operands at. 1 when absent.
  double mma_efficiency = 1.0;
  double memory_efficiency = 1.0;
  // Whether the kernel multiplies exactly the decoded operands (extras "exact", true when
  // absent). A kernel that rounds an operand on purpose (none of our family: docs/kernels.md
  // "Numerics and exactness"; a manifest may carry one from elsewhere) says "exact": false,
  // and the selector leaves it out unless asked (SelectOptions::allow_inexact, or the
  // kernel pinned by name).
  bool exact = true;
  // The rows a tile computes in one step (extras "row_step", a divisor of tile_m; tile_m
  // when absent): a kernel whose tile holding fewer rows computes only the steps that
  // hold any (say, a 128-row tile of two 64-row consumer warpgroups, one of which issues
  // no MMA when it owns no row) says so, and the cost model prices an expert's last tile
  // by its steps. The family's kernels compute whole tiles and carry none.
  int row_step = 0;

  const std::string& name() const { return spec.name; }
};

// What a kernel writes: its manifest extras "output_format" (a JSON string: the format's
// name, without the quotes), or "bf16" when the entry has none - what every moe_gemm kernel
// without one writes. moe_gemm kernels write bf16 or, entries of parameter struct version
// 4 saying "fp8", e4m3 (kernels/moe_gemm_abi.h); MoeGemmKernelInfoOf refuses others.
std::string_view KernelOutputFormat(const KernelSpec& spec);

// Whether a kernel reads A's rows through a row map: its manifest extras "a_gather"
// (moe_gemm kernels of parameter struct version 5, kernels/moe_gemm_abi.h); false when the
// entry has none.
bool KernelGathersA(const KernelSpec& spec);

class Registry {
 public:
  // Validates and indexes `manifest.kernels` (see the file comment for the errors).
  [[nodiscard]] static absl::StatusOr<Registry> Create(const Manifest& manifest);

  Registry(Registry&&) = default;
  Registry& operator=(Registry&&) = default;
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  absl::Span<const KernelEntry> kernels() const { return kernels_; }
  size_t size() const { return kernels_.size(); }
  // nullptr when no kernel has this name.
  const KernelEntry* Find(std::string_view name) const;

  const std::string& manifest_name() const { return manifest_name_; }
  const std::string& manifest_source() const { return manifest_source_; }
  // SHA-256 of the manifest's bytes ("" for a manifest built in memory). Tuning
  // records are keyed by it, so a new artifact set never reuses stale timings.
  const std::string& manifest_digest() const { return manifest_digest_; }

 private:
  Registry() = default;

  std::vector<KernelEntry> kernels_;
  absl::flat_hash_map<std::string, size_t> by_name_;
  std::string manifest_name_;
  std::string manifest_source_;
  std::string manifest_digest_;
};

}  // namespace cubist

#endif  // CUBIST_DISPATCH_REGISTRY_H_
