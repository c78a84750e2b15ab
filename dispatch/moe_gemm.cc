#include "dispatch/moe_gemm.h"

#include <algorithm>
#include <limits>
#include <cstring>
#include <random>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "base/strings.h"
#include "dispatch/selector.h"
#include "kernels/moe_gemm_check.h"
#include "dispatch/operand_fill.h"
#include "loader/device_memory.h"

namespace cubist {
namespace {

constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();

bool HasBlockScales(DataFormat f) {
  return f == DataFormat::kFp8Block || f == DataFormat::kMxfp8 || f == DataFormat::kMxfp4 ||
         f == DataFormat::kNvfp4;
}

// The checks Run repeats on every call; branch-only, so it stays on the hot path.
// Alignment (kernels/moe_gemm_check.h): 16 bytes for a, b and out, which the kernels
// load 16 bytes at a time; 4 for int32/fp32 arrays (fp8-block scales included); none
// for byte scales.
inline CUdeviceptr ScaleAlignMask(DataFormat f) { return f == DataFormat::kFp8Block ? 3 : 0; }

inline bool PointersLookValid(const MoeGemmArgs& a) {
  const CUdeviceptr wide = a.a | a.b | a.out;
  const CUdeviceptr words =
      a.a_global_scale | a.b_global_scale | a.offsets | a.alpha | a.beta | a.limit | a.bias;
  const bool fp8_out = a.output_format == DataFormat::kFp8;
  return (wide & 15) == 0 && ((words | a.out_scale | a.a_row_map) & 3) == 0 &&
         (a.a_row_map == 0 || (a.a_row_divisor >= 1 && a.a_row_divisor <= kInt32Max &&
                               a.a_rows >= 1 && a.a_rows <= kInt32Max)) &&
         (fp8_out ? a.out_scale != 0 || a.tokens == 0
                  : a.out_scale == 0 && a.output_format == DataFormat::kBf16) &&
         (a.a_scale & ScaleAlignMask(a.activation_format)) == 0 &&
         (a.b_scale & ScaleAlignMask(a.weight_format)) == 0 && a.b != 0 && a.offsets != 0 &&
         (a.tokens == 0 || (a.a != 0 && a.out != 0)) &&
         (a.tokens == 0 || !HasBlockScales(a.activation_format) || a.a_scale != 0) &&
         (!HasBlockScales(a.weight_format) || a.b_scale != 0) &&
         ((a.a_global_scale | a.b_global_scale) == 0 ||
          moe::MoeGemmReadsGlobalScales(a.weight_format));
}

// The kernel's parameter struct for these arguments (kernels/moe_gemm_abi.h).
inline moe::MoeGemmParams ParamsOf(const MoeGemmArgs& args) {
  moe::MoeGemmParams p = moe::MoeGemmParamsInit();
  p.num_experts = static_cast<int32_t>(args.experts);
  p.num_tokens = static_cast<int32_t>(args.tokens);
  p.n = static_cast<int32_t>(args.n);
  p.k = static_cast<int32_t>(args.k);
  p.a = reinterpret_cast<const void*>(args.a);
  p.b = reinterpret_cast<const void*>(args.b);
  p.a_scale = reinterpret_cast<const void*>(args.a_scale);
  p.b_scale = reinterpret_cast<const void*>(args.b_scale);
  p.a_global_scale = reinterpret_cast<const float*>(args.a_global_scale);
  p.b_global_scale = reinterpret_cast<const float*>(args.b_global_scale);
  p.offsets = reinterpret_cast<const int32_t*>(args.offsets);
  p.alpha = reinterpret_cast<const float*>(args.alpha);
  p.beta = reinterpret_cast<const float*>(args.beta);
  p.limit = reinterpret_cast<const float*>(args.limit);
  p.out = reinterpret_cast<void*>(args.out);
  p.bias = reinterpret_cast<const float*>(args.bias);
  p.out_scale = reinterpret_cast<const float*>(args.out_scale);
  if (args.settled_inputs) p.flags |= moe::kMoeGemmFlagSettledInputs;
  if (args.a_row_map != 0) {
    p.a_row_map = reinterpret_cast<const int32_t*>(args.a_row_map);
    p.a_row_divisor = static_cast<int32_t>(args.a_row_divisor);
    p.a_rows = static_cast<int32_t>(args.a_rows);
  }
  return p;
}

// ParamsOf for a launch: the rows bounded by routed_rows where the caller gave a tighter
// bound than tokens (the grid and the kernel's clamp of offsets follow it).
moe::MoeGemmParams LaunchParamsOf(const MoeGemmArgs& args) {
  moe::MoeGemmParams p = ParamsOf(args);
  if (args.routed_rows > 0 && args.routed_rows < args.tokens) {
    p.num_tokens = static_cast<int32_t>(args.routed_rows);
  }
  return p;
}

}  // namespace

absl::Status ValidateMoeGemmArgs(const MoeGemmArgs& a) {
  auto bad = [](std::string what) {
    return absl::InvalidArgumentError(absl::StrCat("moe_gemm arguments: ", what));
  };
  if (a.experts < 1 || a.experts > kInt32Max) {
    return bad(absl::StrCat("experts=", a.experts, " is outside 1..", kInt32Max));
  }
  if (a.tokens < 0 || a.tokens > kInt32Max) {
    return bad(absl::StrCat("tokens=", a.tokens, " is outside 0..", kInt32Max));
  }
  if (a.n < 1 || a.n > kInt32Max) return bad(absl::StrCat("n=", a.n, " is outside 1..", kInt32Max));
  if (a.k < 1 || a.k > kInt32Max) return bad(absl::StrCat("k=", a.k, " is outside 1..", kInt32Max));
  const bool fp8_out = a.output_format == DataFormat::kFp8;
  if (!fp8_out && a.output_format != DataFormat::kBf16) {
    return bad(absl::StrCat("output_format ", Sv(DataFormatName(a.output_format)),
                            " is not one the moe_gemm kernels write; use bf16 or fp8"));
  }
  if (fp8_out && a.tokens > 0 && a.out_scale == 0) {
    return bad("out_scale is null but output_format is fp8 (the kernel multiplies by its "
               "reciprocal); pass the fp32 [1] dequantization scale of out");
  }
  if (!fp8_out && a.out_scale != 0) {
    return bad("out_scale is set but output_format is bf16 (bf16 output has no scale); "
               "leave out_scale 0, or ask for output_format fp8");
  }
  if ((a.a_global_scale != 0 || a.b_global_scale != 0) &&
      !moe::MoeGemmReadsGlobalScales(a.weight_format)) {
    return bad(absl::StrCat(a.a_global_scale != 0 ? "a_global_scale" : "b_global_scale",
                            " is set, but ", Sv(DataFormatName(a.weight_format)), " x ",
                            Sv(DataFormatName(a.activation_format)),
                            " kernels read global scales only with fp8 or nvfp4 weights and "
                            "would ignore it; leave it 0"));
  }
  if (a.a_row_map != 0 && (a.a_row_divisor < 1 || a.a_row_divisor > kInt32Max)) {
    return bad(absl::StrCat("a_row_divisor=", a.a_row_divisor, " is outside 1..", kInt32Max,
                            " (row r reads a's row a_row_map[r] / a_row_divisor)"));
  }
  if (a.a_row_map != 0 && (a.a_rows < 1 || a.a_rows > kInt32Max)) {
    return bad(absl::StrCat("a_rows=", a.a_rows, " is outside 1..", kInt32Max,
                            " with a_row_map (the rows of a that the map indexes)"));
  }
  struct Ptr {
    const char* name;
    CUdeviceptr value;
    bool required;
    CUdeviceptr align;
  };
  const Ptr ptrs[] = {
      {"a", a.a, a.tokens > 0, 16},
      {"b", a.b, true, 16},
      // An empty batch reads no activations, so neither a nor its scales are needed
      // (torch gives empty tensors a null data pointer).
      {"a_scale", a.a_scale, a.tokens > 0 && HasBlockScales(a.activation_format),
       ScaleAlignMask(a.activation_format) + 1},
      {"b_scale", a.b_scale, HasBlockScales(a.weight_format),
       ScaleAlignMask(a.weight_format) + 1},
      {"a_global_scale", a.a_global_scale, false, 4},
      {"b_global_scale", a.b_global_scale, false, 4},
      {"offsets", a.offsets, true, 4},
      {"alpha", a.alpha, false, 4},
      {"beta", a.beta, false, 4},
      {"limit", a.limit, false, 4},
      {"out", a.out, a.tokens > 0, 16},
      {"bias", a.bias, false, 4},
      {"out_scale", a.out_scale, false, 4},  // required with fp8 output: above
      {"a_row_map", a.a_row_map, false, 4},
  };
  for (const Ptr& p : ptrs) {
    if (p.required && p.value == 0) {
      return bad(absl::StrCat(p.name, " is null but required for ",
                              Sv(DataFormatName(a.weight_format)), " x ",
                              Sv(DataFormatName(a.activation_format)), "; pass the device pointer"));
    }
    if (p.value % p.align != 0) {
      return bad(absl::StrCat(p.name, " = 0x", absl::Hex(p.value), " is not ", p.align,
                              "-byte aligned; ",
                              p.align == 16 ? "the kernels load 16 bytes at a time"
                                            : "it is an array of 4-byte values"));
    }
  }
  return absl::OkStatus();
}

MoeGemm::MoeGemm(Runtime& runtime, MoeGemmOptions options)
    : runtime_(&runtime),
      options_(std::move(options)),
      cache_(options_.decision_cache_capacity) {}

MoeGemm::~MoeGemm() {
  // Device memory is freed with the runtime's context current.
  absl::MutexLock lock(&timing_mu_);
  if (timing_ != nullptr) {
    auto scope = ScopedContext::Enter(runtime_->driver(), runtime_->context());
    timing_.reset();
  }
}

absl::StatusOr<std::unique_ptr<MoeGemm>> MoeGemm::Create(Runtime& runtime,
                                                         MoeGemmOptions options) {
  if (options.routed_top_k < 0 || options.routed_experts < 0 ||
      (options.routed_experts > 0 && options.routed_top_k == 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "MoeGemmOptions: routed_top_k=", options.routed_top_k, " routed_experts=",
        options.routed_experts, ": give the router's top-k (>= 1) and optionally the experts it "
        "picks from, or leave both 0 for rows spread evenly"));
  }
  std::unique_ptr<MoeGemm> op(new MoeGemm(runtime, std::move(options)));
  if (!op->options_.pinned_kernel.empty() &&
      runtime.registry().Find(op->options_.pinned_kernel) == nullptr) {
    return absl::NotFoundError(absl::StrCat("pinned kernel '", op->options_.pinned_kernel,
                                            "' is not in ",
                                            runtime.registry().manifest_source(),
                                            "; check the name with `cubist list`"));
  }
  return op;
}

MoeGemmArgs MoeGemmArgsFor(const MoeProblem& p) {
  MoeGemmArgs a;
  CopyGemmShape(p, &a);
  a.tokens = p.tokens;
  a.output_format = p.output_format.value_or(DataFormat::kBf16);
  a.routed_top_k = p.routed_top_k;
  a.routed_experts = p.routed_experts;
  return a;
}

MoeProblem MoeGemm::ProblemOf(const MoeGemmArgs& a) const {
  MoeProblem p;
  p.op = Op::kMoeGemm;
  CopyGemmShape(a, &p);
  p.tokens = a.tokens;
  p.sm = runtime_->sm();
  p.sm_count = runtime_->device_info().sm_count;
  p.bias = a.bias != 0;
  p.gather_a = a.a_row_map != 0;
  p.routed_top_k = a.routed_top_k != 0 ? a.routed_top_k : options_.routed_top_k;
  p.routed_experts = a.routed_top_k != 0 ? a.routed_experts : options_.routed_experts;
  // bf16 output stays unset: every moe_gemm kernel without an output_format writes it
  // (the selector reads unset as bf16 for moe_gemm), and a bf16 problem keeps its key.
  if (a.output_format != DataFormat::kBf16) p.output_format = a.output_format;
  return p;
}

absl::StatusOr<MoeGemmDecision> MoeGemm::DecisionFor(const KernelEntry& kernel,
                                                     bool from_tuning) {
  CUBIST_ASSIGN_OR_RETURN(CUfunction f, runtime_->Function(kernel));
  MoeGemmDecision d;
  d.kernel = &kernel;
  d.function = f;
  d.block = static_cast<unsigned>(kernel.spec.threads);
  d.shared_mem_bytes = static_cast<unsigned>(kernel.spec.shared_mem_bytes);
  for (int i = 0; i < 3; ++i) d.cluster[i] = static_cast<unsigned>(kernel.spec.cluster[i]);
  d.tile_m = kernel.spec.tile_m;
  d.tile_n = kernel.spec.tile_n;
  d.activation = kernel.activation;
  CUBIST_ASSIGN_OR_RETURN(d.info, MoeGemmKernelInfoOf(kernel.spec));
  d.from_tuning = from_tuning;
  if (d.info.ctas_per_sm > 1) {
    // One byte over half the SM's shared memory: two such CTAs never fit on one SM. A
    // device that cannot grant it (the raise fails) launches as before.
    const unsigned spread = std::max(
        d.shared_mem_bytes,
        static_cast<unsigned>(runtime_->device_info().shared_mem_per_sm / 2 + 1));
    DriverApi& driver = runtime_->driver();
    if (driver.FuncSetAttribute(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                static_cast<int>(spread)) == CUDA_SUCCESS) {
      d.spread_shared_mem_bytes = spread;
    }
  }
  return d;
}

absl::StatusOr<MoeGemmDecision> MoeGemm::Decide(const MoeProblem& problem) {
  const Registry& reg = runtime_->registry();
  SelectOptions so;
  so.abi = moe::kMoeGemmAbi;
  so.pinned = options_.pinned_kernel;
  so.allow_inexact = options_.allow_inexact;
  if (so.pinned.empty()) {
    // A tuned winner for the problem's bucket is used when it can serve this exact
    // problem; a stale name (kernel gone or unfit) falls back to the cost model.
    std::shared_ptr<const TuningTable> tuning = runtime_->tuning();
    if (const TuningTable::Entry* e = tuning->Find(problem.op, BucketOf(problem))) {
      const KernelEntry* k = reg.Find(e->kernel);
      if (k != nullptr && CheckKernel(*k, problem, so).empty()) return DecisionFor(*k, true);
    }
  }
  CUBIST_ASSIGN_OR_RETURN(Candidate best, SelectKernel(reg, problem, so));
  return DecisionFor(*best.kernel, false);
}

absl::StatusOr<const MoeGemmDecision*> MoeGemm::KernelFor(const MoeGemmArgs& args) {
  const MoeProblem problem = ProblemOf(args);
  if (const MoeGemmDecision* d = cache_.Find(problem)) return d;
  CUBIST_ASSIGN_OR_RETURN(MoeGemmDecision d, Decide(problem));
  const MoeGemmDecision* stored = cache_.Insert(problem, d);
  if (stored == nullptr) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "moe_gemm decision cache is full (", cache_.capacity(),
        " problems); raise MoeGemmOptions::decision_cache_capacity"));
  }
  return stored;
}

absl::Status MoeGemm::CanImplement(const MoeGemmArgs& args) {
  CUBIST_RETURN_IF_ERROR(ValidateMoeGemmArgs(args));
  MoeGemmDecision uncached;
  const MoeGemmDecision* d = nullptr;
  absl::StatusOr<const MoeGemmDecision*> cached = KernelFor(args);
  if (cached.ok()) {
    d = *cached;
  } else if (absl::IsResourceExhausted(cached.status())) {
    // Run decides uncached then; the problem itself may be servable.
    CUBIST_ASSIGN_OR_RETURN(uncached, Decide(ProblemOf(args)));
    d = &uncached;
  } else {
    return cached.status();
  }
  // The kernel family's own host-side check of the exact launch (alignment, sizes, the
  // grid limit), in case a manifest entry under-states the kernel's requirements.
  moe::MoeGemmKernelDesc desc;
  desc.weight_format = d->kernel->weight_format;
  desc.activation_format = d->kernel->activation_format;
  desc.activation = d->activation;
  desc.tile_m = d->tile_m;
  desc.tile_n = d->tile_n;
  desc.abi = d->info.abi;
  desc.output_format = d->info.output_format;
  desc.a_gather = d->info.a_gather;
  moe::MoeGemmParams params = ParamsOf(args);
  if (args.tokens == 0) {
    // Run launches nothing for an empty batch: only the shape checks apply, so stand in
    // for the activation-side pointers it may leave null (any 16-byte aligned value).
    const void* placeholder = reinterpret_cast<const void*>(uintptr_t{16});
    if (params.a == nullptr) params.a = placeholder;
    if (params.a_scale == nullptr) params.a_scale = placeholder;
    if (params.out == nullptr) params.out = const_cast<void*>(placeholder);
    if (params.out_scale == nullptr && d->info.output_format == moe::kFp8) {
      params.out_scale = static_cast<const float*>(placeholder);
    }
  }
  // Each launch Run makes (one per group of experts when E exceeds what one schedules).
  return ForEachExpertGroup(
      params, d->info, [&](const moe::MoeGemmParams& p, int32_t first) -> absl::Status {
        const std::string problem = moe::MoeGemmCheck(p, desc);
        if (problem.empty()) return absl::OkStatus();
        return absl::InvalidArgumentError(absl::StrCat(
            problem, " (kernel ", d->kernel->name(),
            p.num_experts < params.num_experts
                ? absl::StrCat(", experts ", first, "..", first + p.num_experts - 1)
                : "",
            ")"));
      });
}

absl::StatusOr<MoeGemm::Grid> MoeGemm::GridOf(const MoeGemmArgs& args) {
  CUBIST_ASSIGN_OR_RETURN(const MoeGemmDecision* d, KernelFor(args));
  const moe::MoeGemmParams p = MoeGemmExpertGroup(
      LaunchParamsOf(args), d->info, 0,
      static_cast<int32_t>(std::min<int64_t>(args.experts, MoeGemmExpertsPerLaunch(d->info))));
  Grid g;
  g.tiles = moe::MoeGemmMaxMTiles(p.num_tokens, p.num_experts, d->tile_m) *
            moe::MoeGemmNTiles(p.n, d->activation, d->tile_n);
  g.ctas = MoeGemmLaunchGrid(d->info, p, runtime_->device_info().sm_count).x;
  return g;
}

absl::Status MoeGemm::Launch(const MoeGemmDecision& d, const MoeGemmArgs& args,
                             CUstream stream) {
  // More experts than one launch schedules: one launch per group of experts, in order
  // (they write disjoint rows of out).
  return ForEachExpertGroup(
      LaunchParamsOf(args), d.info, [&](const moe::MoeGemmParams& p, int32_t) -> absl::Status {
        MoeGemmLaunch launch;  // the launch reads its parameters through a void*
        const int sm_count = runtime_->device_info().sm_count;
        CUBIST_RETURN_IF_ERROR(
            PrepareMoeGemmLaunch(runtime_->driver(), d.info, p, sm_count, &launch));
        // A grid of no more CTAs than SMs gets an SM per CTA (MoeGemmDecision's
        // spread_shared_mem_bytes says why); a larger one keeps two per SM.
        const bool spread = d.spread_shared_mem_bytes != 0 &&
                            launch.grid.x <= static_cast<uint32_t>(sm_count);
        // Only a kernel that waits for the previous grid may start before it ends.
        const CUlaunchConfig config = launch.Config(
            d.block, spread ? d.spread_shared_mem_bytes : d.shared_mem_bytes, d.cluster,
            options_.programmatic_dependent_launch && d.info.pdl && !args.stream_order,
            stream);
        DriverApi& driver = runtime_->driver();
        const CUresult r =
            driver.LaunchKernelEx(&config, d.function, launch.kernel_params(), nullptr);
        if (r == CUDA_SUCCESS) return absl::OkStatus();
        return CuCheck(driver, r, absl::StrCat("launch ", d.kernel->name()));
      });
}

absl::Status MoeGemm::Run(const MoeGemmArgs& args, CUstream stream) {
  if (!PointersLookValid(args)) return ValidateMoeGemmArgs(args);
  // An empty batch (an expert-parallel rank that received no tokens) is a no-op: nothing
  // to select, load or launch.
  if (args.tokens == 0) return absl::OkStatus();
  const MoeProblem problem = ProblemOf(args);
  const MoeGemmDecision* d = cache_.Find(problem);
  if (d == nullptr) {
    // Slow path, once per new problem (or every call once the cache is full).
    CUBIST_RETURN_IF_ERROR(ValidateMoeGemmArgs(args));
    CUBIST_ASSIGN_OR_RETURN(MoeGemmDecision decided, Decide(problem));
    d = cache_.Insert(problem, decided);
    if (d == nullptr) return Launch(decided, args, stream);
  }
  return Launch(*d, args, stream);
}

}  // namespace cubist
