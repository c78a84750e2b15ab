// The MoE batched-GEMM op an inference engine calls (kernels/moe_gemm_abi.h has the
// operation, layouts and scale formats).
//
//   MoeGemmArgs args;
//   args.weight_format = DataFormat::kMxfp4;  args.activation_format = DataFormat::kBf16;
//   args.activation = Activation::kSwiglu;
//   args.experts = 128;  args.tokens = T;  args.n = 5760;  args.k = 2880;
//   args.a = a_ptr;  args.b = b_ptr;  args.b_scale = b_scale_ptr;
//   args.offsets = offsets_ptr;  args.out = out_ptr;
//   CUBIST_RETURN_IF_ERROR(gemm->CanImplement(args));   // once per shape, off the hot path
//   CUBIST_RETURN_IF_ERROR(gemm->Run(args, stream));     // every step
//
// CanImplement says whether Run can serve the arguments: shapes, formats, the pointers
// each format needs, their alignment, a kernel in the manifest, and the kernel family's
// own launch check (kernels/moe_gemm_check.h) (InvalidArgument, NotFound naming the
// problem and the nearest kernels, FailedPrecondition). It selects
// (and may fetch and load) the kernel, so calling it once per shape before CUDA-graph
// capture keeps capture free of loading.
//
// Run launches through cuLaunchKernelEx: the persistent grid from the problem (the ABI's
// MoeGemmPersistentGridFor, which never reads device memory; one launch per group of
// at most max_experts experts), TMA tensor maps of A and B, block = the kernel's threads,
// dynamic shared memory, cluster dimensions and, if asked, programmatic dependent
// launch. A problem seen before costs one lock-free decision-cache lookup (a hash and a
// compare); no allocation and no lock on that path. A new problem takes the slow path
// once: select (tuned winner for its shape bucket if one is recorded, else the cost
// model; or the pinned kernel), fetch/load, cache. Run re-checks pointers (cheap) but
// not the kernel's presence; an error is returned, never a crash. An empty batch
// (tokens = 0) is a successful no-op that selects and launches nothing; a, out and the
// activation scales may then be null (torch gives empty tensors a null data pointer).
//
// Thread safety: CanImplement, Run, KernelFor and Tune may be called from any number of
// threads at once. The calling thread's current CUDA context must be the runtime's
// (Runtime::MakeCurrent; engines using cudart on that device already have it).
#ifndef CUBIST_DISPATCH_MOE_GEMM_H_
#define CUBIST_DISPATCH_MOE_GEMM_H_

#include <cuda.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "dispatch/autotuner.h"
#include "dispatch/decision_cache.h"
#include "dispatch/moe_gemm_launch.h"
#include "dispatch/problem.h"
#include "dispatch/runtime.h"
#include "kernels/moe_gemm_abi.h"

namespace cubist {

struct MoeGemmArgs {
  DataFormat weight_format = DataFormat::kBf16;
  DataFormat activation_format = DataFormat::kBf16;
  Activation activation = Activation::kIdentity;
  int64_t experts = 0;  // E
  int64_t tokens = 0;   // T = offsets[E], rows of a and out
  // Where tokens is a bucket larger than the batch (MoeLayer: its row bucket), the rows
  // actually routed, offsets[E] <= routed_rows <= tokens: the launch sizes its grid by
  // them and bounds the kernel's rows with them, while the kernel is chosen (and cached)
  // for tokens. -1 (or anything outside 1..tokens): tokens.
  int64_t routed_rows = -1;
  // How the offsets spread the rows over the experts, for the cost model's choice of
  // tiles (MoeProblem::routed_top_k, dispatch/routed_load.h): 0 - about evenly; k >= 1 -
  // as a top-k router sends ceil(tokens / k) tokens to k of routed_experts experts each
  // (0: experts), so each expert's rows vary and its last tile is partly empty.
  // MoeLayer's GEMMs say so; the kernels read neither.
  int64_t routed_top_k = 0;
  int64_t routed_experts = 0;
  // Launch in plain stream order even where programmatic_dependent_launch is on: for a
  // caller that knows an early launch would crowd this grid's CTAs onto the SMs the
  // previous kernel frees first (MoeLayer's GEMM2 after a ragged GEMM1).
  bool stream_order = false;
  // The offsets and every weight-side input (b, b_scale, b_global_scale, alpha, beta,
  // limit, bias) were complete before the kernel launched just before this one returned
  // from its grid-dependency wait (kernels/moe_gemm_abi.h, kMoeGemmFlagSettledInputs):
  // the kernel may read them before its own wait, and only A waits for that kernel.
  // MoeLayer's GEMMs say so where it holds; a caller that cannot vouch for it leaves it
  // false (a wrong true may read offsets or weights before their writer has finished).
  bool settled_inputs = false;
  int64_t n = 0;        // B rows per expert (both halves when gated)
  int64_t k = 0;
  // Device pointers (0 = absent), as kernels/moe_gemm_abi.h's MoeGemmParams.
  CUdeviceptr a = 0, b = 0, a_scale = 0, b_scale = 0;
  CUdeviceptr a_global_scale = 0, b_global_scale = 0;
  CUdeviceptr offsets = 0;  // int32 [E+1]
  CUdeviceptr alpha = 0, beta = 0, limit = 0;
  CUdeviceptr out = 0;  // bf16 [T, N] or [T, N/2]
  // fp32 [E, N]: added to each expert's B row n before the activation (both halves when
  // gated), or 0. Served by kernels of parameter struct version 3.
  CUdeviceptr bias = 0;
  // What out holds: kBf16 (every kernel), or kFp8 - e4m3 [T, N] or [T, N/2], the
  // saturating round-to-nearest-even of the bf16 result times 1 / out_scale[0]
  // (kernels/moe_gemm_abi.h, version 4) - served only by kernels whose entry says
  // "output_format": "fp8" and only when asked: a bf16 call never selects one.
  DataFormat output_format = DataFormat::kBf16;
  // fp32 [1]: the fp8 output's dequantization scale s (out ~ e4m3 x s). Required with
  // output_format kFp8, refused (must be 0) with kBf16.
  CUdeviceptr out_scale = 0;
  // The gather of A (kernels/moe_gemm_abi.h, version 5): with a_row_map (int32 [tokens]),
  // row r reads a's row a_row_map[r] / a_row_divisor, and a is [a_rows, k]; a quotient
  // outside 0..a_rows-1 reads zeros. Served only by kernels whose entry says "a_gather"
  // (bf16 x bf16 in the family): the MoE layer's GEMM1 reads its token rows this way.
  // 0: a is [tokens, k], read in order.
  CUdeviceptr a_row_map = 0;
  int64_t a_row_divisor = 1;
  int64_t a_rows = 0;
};

// The offsets [experts + 1] Tune, TimeKernel and `cubist run` run a problem on: tokens
// spread evenly, or for a routed problem (routed_top_k >= 1) one fixed draw of its
// routing, tokens / routed_top_k whole tokens (the same draw on every run and machine).
std::vector<int32_t> TimingOffsets(const MoeProblem& problem);

struct MoeGemmOptions {
  // Always use this kernel (debugging); CanImplement fails when it cannot serve.
  std::string pinned_kernel;
  // Launch with programmatic stream serialization allowed, so the kernel's prologue
  // may overlap the previous kernel's tail on the stream. Applies to kernels whose entry
  // says "pdl": true (they wait for the previous grid before reading memory, and let the
  // next kernel launch early, so a next kernel launched with the attribute must wait
  // too); others are launched in plain stream order.
  bool programmatic_dependent_launch = false;
  // Distinct problems remembered; beyond it problems are decided on every call.
  size_t decision_cache_capacity = 4096;
  // Let selection and Tune consider kernels that round an operand on purpose (manifest
  // "exact": false; SelectOptions::allow_inexact). Off: results are exact whatever the
  // cost model or the timings say.
  bool allow_inexact = false;
  // The routing every call's offsets come from, for calls whose args leave theirs 0
  // (MoeGemmArgs::routed_top_k, routed_experts): an engine running a MoE layer's GEMMs
  // itself on a top-k router's offsets says so once, and the tiles are priced for that
  // spread of rows. 0: rows spread evenly.
  int64_t routed_top_k = 0;
  int64_t routed_experts = 0;
};

// What Run launches for one problem. Plain data, immutable once cached.
struct MoeGemmDecision {
  const KernelEntry* kernel = nullptr;
  CUfunction function = nullptr;
  unsigned block = 0;
  unsigned shared_mem_bytes = 0;
  // For kernels that fit two CTAs per SM (info.ctas_per_sm > 1): the dynamic shared memory
  // a launch of at most one CTA per SM requests instead - more than half of what an SM
  // holds, so no two CTAs of the grid share an SM (0: not raised; shared_mem_bytes then).
  // The hardware otherwise pairs a small grid's CTAs on half as many SMs, and under
  // programmatic dependent launch it fills each SM the previous grid frees with two:
  // Mixtral's one-token GEMM2 (64 CTAs) ran 137 us instead of 94 in the layer.
  unsigned spread_shared_mem_bytes = 0;
  unsigned cluster[3] = {1, 1, 1};
  int32_t tile_m = 0;
  int32_t tile_n = 0;
  moe::MoeActivation activation = moe::kIdentity;
  MoeGemmKernelInfo info;  // ABI version, formats, tiles, persistent CTAs per SM
  bool from_tuning = false;  // the tuning file chose it
};

struct MoeGemmTuneOptions {
  AutotuneOptions autotune;
  int warmup = 3;       // launches before timing
  int iterations = 20;  // timed launches; the median is kept
  // Input sets rotated between launches so that the L2 cache (50 MB) holds none of
  // them; fewer when one set is already large.
  int max_rotating_sets = 8;
  bool record = true;   // write the winner to the runtime's tuning file
};

class MoeGemm {
 public:
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<MoeGemm>> Create(
      Runtime& runtime, MoeGemmOptions options = {});
  ~MoeGemm();

  [[nodiscard]] absl::Status CanImplement(const MoeGemmArgs& args);
  [[nodiscard]] absl::Status Run(const MoeGemmArgs& args, CUstream stream);

  // The decision for these arguments' problem (selecting it if new).
  [[nodiscard]] absl::StatusOr<const MoeGemmDecision*> KernelFor(const MoeGemmArgs& args);

  // The grid Run launches for these arguments (its first launch, when E exceeds what one
  // schedules): `ctas` CTAs walking at most `tiles` tiles (the ABI's bound over the
  // routed rows, read from no device memory). MoeLayer reads it to decide how GEMM2
  // follows GEMM1.
  struct Grid {
    int64_t ctas = 0;
    int64_t tiles = 0;
  };
  [[nodiscard]] absl::StatusOr<Grid> GridOf(const MoeGemmArgs& args);

  // Times the cost model's top candidates for `problem` on this device (on inputs it
  // allocates and fills with random values, rotated), records the winner for the
  // problem's shape bucket in the tuning file, and makes it this op's decision.
  [[nodiscard]] absl::StatusOr<AutotuneResult> Tune(const MoeProblem& problem,
                                                    const MoeGemmTuneOptions& options = {});

  // The problem these arguments pose on this runtime's device.
  MoeProblem ProblemOf(const MoeGemmArgs& args) const;
  Runtime& runtime() const { return *runtime_; }

  // Median time in microseconds of `iterations` launches of `kernel` on `problem`
  // (random inputs, rotated), after `warmup` launches: CUDA events around each launch.
  // The operands are kept until another problem is timed or the op is destroyed.
  [[nodiscard]] absl::StatusOr<double> TimeKernel(const KernelEntry& kernel,
                                                  const MoeProblem& problem,
                                                  const MoeGemmTuneOptions& options);

 private:
  MoeGemm(Runtime& runtime, MoeGemmOptions options);
  absl::StatusOr<MoeGemmDecision> Decide(const MoeProblem& problem);
  absl::StatusOr<MoeGemmDecision> DecisionFor(const KernelEntry& kernel, bool from_tuning);
  absl::Status Launch(const MoeGemmDecision& d, const MoeGemmArgs& args, CUstream stream);

  // The timing harness (moe_gemm_timing.cc) owns the definition; the deleter keeps the
  // op's own file free of it.
  struct TimingBuffers;
  struct TimingBuffersDeleter {
    void operator()(TimingBuffers* t) const;
  };
  absl::Status PrepareTimingBuffers(const MoeProblem& problem, const MoeGemmTuneOptions& o)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(timing_mu_);

  Runtime* runtime_;
  MoeGemmOptions options_;
  DecisionCache<MoeProblem, MoeGemmDecision> cache_;
  // Operands of the problem last timed (Tune and TimeKernel only, never Run).
  absl::Mutex timing_mu_;
  std::unique_ptr<TimingBuffers, TimingBuffersDeleter> timing_ ABSL_GUARDED_BY(timing_mu_);
};

// The checks CanImplement makes on the arguments alone (no kernel lookup): sizes within
// the ABI's int32 fields, required pointers present, alignment (16 bytes for a, b and
// out; 4 for offsets, fp32 scales, alpha, beta and limit).
[[nodiscard]] absl::Status ValidateMoeGemmArgs(const MoeGemmArgs& args);

// The arguments of `problem`'s shape, formats and activation, with every pointer null:
// enough for KernelFor; a caller fills the buffers in before Run.
MoeGemmArgs MoeGemmArgsFor(const MoeProblem& problem);

}  // namespace cubist

#endif  // CUBIST_DISPATCH_MOE_GEMM_H_
