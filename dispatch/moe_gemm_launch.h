// One launch of a moe_gemm kernel, for every parameter-struct version this build fills
// (kernels/moe_gemm_abi.h, kMoeGemmAbiOldest to kMoeGemmAbi): the dispatcher
// (MoeGemm::Run), the GPU tests and the benchmarks all launch through
// PrepareMoeGemmLaunch, so a kernel's launch is written once.
//
//   versions 2 to 5: the kernel takes MoeGemmParamsV2, whose TMA tensor maps of A and B
//              are encoded here (cuTensorMapEncodeTiled); persistent grid
//              MoeGemmPersistentGridFor(sm_count, ctas_per_sm). Kernels that gather A
//              read it without its map: theirs is one row at A, the same for any batch.
//   version 1 (generation 1) is retired: MoeGemmKernelInfoOf refuses its entries.
//
// Cost: encoding a tensor map is a host call of about a microsecond; the maps of recent
// launches are kept in a small per-thread cache keyed by pointer, shape and box, so an
// engine that reuses its weight and activation buffers pays it once per buffer, and the
// hot path compares keys and copies 256 bytes (docs/kernels.md has the measured cost).
//
// Thread safety: PrepareMoeGemmLaunch may be called from any number of threads (the cache
// is thread-local); a MoeGemmLaunch belongs to the thread that filled it.
#ifndef CUBIST_DISPATCH_MOE_GEMM_LAUNCH_H_
#define CUBIST_DISPATCH_MOE_GEMM_LAUNCH_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/moe_gemm_abi.h"
#include "loader/driver_api.h"
#include "manifest/manifest.h"

namespace cubist {

// What launching a moe_gemm kernel needs to know about it, from its manifest entry.
struct MoeGemmKernelInfo {
  int abi = moe::kMoeGemmAbi;
  moe::MoeFormat weight_format = moe::kBf16;
  moe::MoeFormat activation_format = moe::kBf16;
  moe::MoeActivation activation = moe::kIdentity;
  int32_t tile_m = 0;
  int32_t tile_n = 0;
  int32_t ctas_per_sm = 1;  // extras "ctas_per_sm" (default 1)
  // CTAs per cluster along x; the grid is a whole number of them (1, or 2 for kernels
  // that multicast B to two adjacent M tiles, whose B box is tile_n / 2 rows).
  int32_t cluster = 1;
  // Experts one launch schedules (MoeGemmExpertsPerLaunch): the kernels keep each
  // expert's offsets in shared memory (kMoeGemmTmaMaxExperts, or the entry's smaller
  // extras "max_experts").
  int32_t max_experts = moe::kMoeGemmTmaMaxExperts;
  // extras "pdl": the kernel waits for the previous grid (griddepcontrol.wait) before its
  // first global read, so it may be launched with programmatic stream serialization.
  // Kernels built before they waited lack it and are launched in plain stream order.
  bool pdl = false;
  // extras "output_format" (default bf16): what the kernel writes, bf16 or fp8 (version
  // 4 or newer only: it reads out_scale).
  moe::MoeFormat output_format = moe::kBf16;
  // extras "a_gather": true (version 5 or newer only): the kernel reads A's rows through
  // a_row_map (kernels/moe_gemm_abi.h) and needs it.
  bool a_gather = false;
};

// InvalidArgument naming the field when the entry is not a moe_gemm kernel this build can
// launch (unknown format or activation, abi outside kMoeGemmAbiOldest..kMoeGemmAbi, a
// retired version 1 saying how to rebuild, bad ctas_per_sm, cluster, max_experts, pdl,
// output_format or a_gather, an fp8 output_format below version 4, or a_gather below 5).
[[nodiscard]] absl::StatusOr<MoeGemmKernelInfo> MoeGemmKernelInfoOf(const KernelSpec& spec);

// The parameter block and grid of one launch. Pass kernel_params() as cuLaunchKernel's
// kernelParams; it points into this object, which must outlive the launch call (not the
// kernel: the driver copies parameters at launch).
struct MoeGemmLaunch {
  moe::MoeGemmParamsV2 params = moe::MoeGemmParamsV2Init();
  moe::MoeGemmGrid grid;
  void* arg = nullptr;
  CUlaunchAttribute attrs[2] = {};  // what Config's attributes point at
  void** kernel_params() {
    arg = &params;
    return &arg;
  }
  // cuLaunchKernelEx's configuration of this launch: its grid, `block` threads and
  // `shared_mem_bytes` of dynamic shared memory on `stream`; a cluster dimension
  // attribute when `cluster` has more than one CTA (PrepareMoeGemmLaunch made the grid a
  // whole number of clusters), and programmatic stream serialization when
  // `programmatic_dependent_launch`. It points into this object.
  CUlaunchConfig Config(unsigned block, unsigned shared_mem_bytes, const unsigned (&cluster)[3],
                        bool programmatic_dependent_launch, CUstream stream);
};

// Experts one launch of kernel `k` schedules: its max_experts (INT32_MAX if not positive).
int32_t MoeGemmExpertsPerLaunch(const MoeGemmKernelInfo& k);

// The parameters of the launch over experts [first, first + count) of `p`, for problems
// with more experts than one launch schedules (MoeGemmExpertsPerLaunch): the per-expert
// arrays (offsets, B, B's block and global scales, alpha, beta, limit, bias) start at
// expert `first`; A, its scales and out stay where they are, since offsets are absolute
// rows of A and out. Each group is a problem of its own for MoeGemmCheck.
moe::MoeGemmParams MoeGemmExpertGroup(const moe::MoeGemmParams& p, const MoeGemmKernelInfo& k,
                                      int32_t first, int32_t count);

// Calls f(params, first_expert) for each launch of `p` on kernel `k`, in order: `p` itself
// when one launch schedules all its experts (the common case: no copy), else the
// MoeGemmExpertGroup of each group of MoeGemmExpertsPerLaunch(k) experts. Stops at f's
// first error and returns it.
template <typename F>
absl::Status ForEachExpertGroup(const moe::MoeGemmParams& p, const MoeGemmKernelInfo& k,
                                F&& f) {
  const int32_t per_launch = MoeGemmExpertsPerLaunch(k);
  if (p.num_experts <= per_launch) return f(p, 0);
  for (int32_t first = 0; first < p.num_experts; first += per_launch) {
    const int32_t count = per_launch < p.num_experts - first ? per_launch : p.num_experts - first;
    absl::Status s = f(MoeGemmExpertGroup(p, k, first, count), first);
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

// The grid of launching kernel `k` on `p` (one expert group): the persistent grid
// (MoeGemmPersistentGridFor) rounded up to a whole number of clusters along x (CTAs past
// the last tile, or tile pair, exit). PrepareMoeGemmLaunch and MoeGemm::GridOf use it.
moe::MoeGemmGrid MoeGemmLaunchGrid(const MoeGemmKernelInfo& k, const moe::MoeGemmParams& p,
                                   int sm_count);

// Fills `out` for launching kernel `k` on `p` (a struct from MoeGemmParamsInit; call
// MoeGemmCheck first). sm_count is the device's multiprocessor count (the persistent
// grid). Errors: FailedPrecondition when the driver cannot encode tensor maps (driver
// older than CUDA 12.0), InvalidArgument when the driver refuses a map (the message
// names the operand, its shape and the driver's error).
[[nodiscard]] absl::Status PrepareMoeGemmLaunch(DriverApi& driver, const MoeGemmKernelInfo& k,
                                                const moe::MoeGemmParams& p, int sm_count,
                                                MoeGemmLaunch* out);

}  // namespace cubist

#endif  // CUBIST_DISPATCH_MOE_GEMM_LAUNCH_H_
