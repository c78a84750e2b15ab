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
      a.a_global_scale | a.b_global_scale | a.offsets | a.alpha | a.beta | a.limit;
  return (wide & 15) == 0 && (words & 3) == 0 &&
         (a.a_scale & ScaleAlignMask(a.activation_format)) == 0 &&
         (a.b_scale & ScaleAlignMask(a.weight_format)) == 0 && a.b != 0 && a.offsets != 0 &&
         (a.tokens == 0 || (a.a != 0 && a.out != 0)) &&
         (a.tokens == 0 || !HasBlockScales(a.activation_format) || a.a_scale != 0) &&
         (!HasBlockScales(a.weight_format) || a.b_scale != 0);
}

struct ByteSizes {
  size_t a = 0, b = 0, a_scale = 0, b_scale = 0, a_global = 0, b_global = 0, out = 0;
  size_t inputs() const { return a + b + a_scale + b_scale; }
};

ByteSizes SizesOf(const MoeProblem& p) {
  auto elems = [](DataFormat f, int64_t count) {
    return static_cast<size_t>((count * moe::FormatBits(ToAbi(f)) + 7) / 8);
  };
  auto scales = [](DataFormat f, int64_t rows, int64_t k, int64_t n_blocks_rows) -> size_t {
    switch (f) {
      case DataFormat::kMxfp4:
      case DataFormat::kMxfp8: return static_cast<size_t>(rows * (k / 32));
      case DataFormat::kNvfp4: return static_cast<size_t>(rows * (k / 16));
      case DataFormat::kFp8Block: return static_cast<size_t>(n_blocks_rows * ((k + 127) / 128) * 4);
      default: return 0;
    }
  };
  ByteSizes s;
  s.a = elems(p.activation_format, p.tokens * p.k);
  s.b = elems(p.weight_format, p.experts * p.n * p.k);
  s.a_scale = scales(p.activation_format, p.tokens, p.k, p.tokens);
  s.b_scale = scales(p.weight_format, p.experts * p.n, p.k, p.experts * ((p.n + 127) / 128));
  auto global = [](DataFormat f) {
    return f == DataFormat::kFp8 || f == DataFormat::kNvfp4;
  };
  s.a_global = global(p.activation_format) ? 4 : 0;
  s.b_global = global(p.weight_format) ? static_cast<size_t>(4 * p.experts) : 0;
  s.out = static_cast<size_t>(p.tokens * p.output_n() * 2);
  return s;
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
  return p;
}

class OpTimer : public CandidateTimer {
 public:
  OpTimer(MoeGemm& op, const MoeGemmTuneOptions& o) : op_(op), o_(o) {}
  absl::StatusOr<double> TimeUs(const KernelEntry& kernel, const MoeProblem& problem) override {
    return op_.TimeKernel(kernel, problem, o_);
  }

 private:
  MoeGemm& op_;
  const MoeGemmTuneOptions& o_;
};

}  // namespace

moe::MoeFormat ToAbi(DataFormat f) {
  switch (f) {
    case DataFormat::kBf16: return moe::kBf16;
    case DataFormat::kFp8: return moe::kFp8;
    case DataFormat::kFp8Block: return moe::kFp8Block;
    case DataFormat::kMxfp4: return moe::kMxfp4;
    case DataFormat::kMxfp8: return moe::kMxfp8;
    case DataFormat::kNvfp4: return moe::kNvfp4;
    case DataFormat::kFp16:
    case DataFormat::kMxint4: break;  // not in the moe_gemm ABI (OpSupports refuses them)
  }
  return moe::kBf16;
}

moe::MoeActivation ToAbi(Activation a) {
  switch (a) {
    case Activation::kIdentity: return moe::kIdentity;
    case Activation::kRelu2: return moe::kRelu2;
    case Activation::kSwiglu: return moe::kSwiglu;
    case Activation::kGeglu: return moe::kGeglu;
    case Activation::kSitu: return moe::kSitu;
    case Activation::kGelu:
    case Activation::kSilu: break;  // not in the moe_gemm ABI (OpSupports refuses them)
  }
  return moe::kIdentity;
}

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

MoeProblem MoeGemm::ProblemOf(const MoeGemmArgs& a) const {
  MoeProblem p;
  p.op = Op::kMoeGemm;
  p.weight_format = a.weight_format;
  p.activation_format = a.activation_format;
  p.activation = a.activation;
  p.experts = a.experts;
  p.tokens = a.tokens;
  p.n = a.n;
  p.k = a.k;
  p.sm = runtime_->sm();
  p.sm_count = runtime_->device_info().sm_count;
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
  d.activation = ToAbi(kernel.activation);
  CUBIST_ASSIGN_OR_RETURN(d.info, MoeGemmKernelInfoOf(kernel.spec));
  d.from_tuning = from_tuning;
  return d;
}

absl::StatusOr<MoeGemmDecision> MoeGemm::Decide(const MoeProblem& problem) {
  const Registry& reg = runtime_->registry();
  SelectOptions so;
  so.abi = moe::kMoeGemmAbi;
  so.pinned = options_.pinned_kernel;
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
  desc.weight_format = ToAbi(d->kernel->weight_format);
  desc.activation_format = ToAbi(d->kernel->activation_format);
  desc.activation = d->activation;
  desc.tile_m = d->tile_m;
  desc.tile_n = d->tile_n;
  desc.abi = d->info.abi;
  moe::MoeGemmParams params = ParamsOf(args);
  if (args.tokens == 0) {
    // Run launches nothing for an empty batch: only the shape checks apply, so stand in
    // for the activation-side pointers it may leave null (any 16-byte aligned value).
    const void* placeholder = reinterpret_cast<const void*>(uintptr_t{16});
    if (params.a == nullptr) params.a = placeholder;
    if (params.a_scale == nullptr) params.a_scale = placeholder;
    if (params.out == nullptr) params.out = const_cast<void*>(placeholder);
  }
  std::string problem = moe::MoeGemmCheck(params, desc);
  if (!problem.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(problem, " (kernel ", d->kernel->name(), ")"));
  }
  return absl::OkStatus();
}

absl::Status MoeGemm::Launch(const MoeGemmDecision& d, const MoeGemmArgs& args,
                             CUstream stream) {
  MoeGemmLaunch launch;  // the launch reads its parameters through a void*
  CUBIST_RETURN_IF_ERROR(PrepareMoeGemmLaunch(runtime_->driver(), d.info, ParamsOf(args),
                                              runtime_->device_info().sm_count, &launch));
  const moe::MoeGemmGrid grid = launch.grid;

  CUlaunchConfig config = {};
  config.gridDimX = grid.x;
  config.gridDimY = grid.y;
  config.gridDimZ = grid.z;
  config.blockDimX = d.block;
  config.blockDimY = 1;
  config.blockDimZ = 1;
  config.sharedMemBytes = d.shared_mem_bytes;
  config.hStream = stream;
  CUlaunchAttribute attrs[2];
  unsigned num_attrs = 0;
  if (d.cluster[0] * d.cluster[1] * d.cluster[2] > 1) {
    // The grid must be a whole number of clusters; CTAs past the last tile exit.
    config.gridDimX = (config.gridDimX + d.cluster[0] - 1) / d.cluster[0] * d.cluster[0];
    attrs[num_attrs].id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
    attrs[num_attrs].value.clusterDim.x = d.cluster[0];
    attrs[num_attrs].value.clusterDim.y = d.cluster[1];
    attrs[num_attrs].value.clusterDim.z = d.cluster[2];
    ++num_attrs;
  }
  if (options_.programmatic_dependent_launch) {
    attrs[num_attrs].id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    attrs[num_attrs].value.programmaticStreamSerializationAllowed = 1;
    ++num_attrs;
  }
  config.attrs = num_attrs > 0 ? attrs : nullptr;
  config.numAttrs = num_attrs;
  DriverApi& driver = runtime_->driver();
  const CUresult r = driver.LaunchKernelEx(&config, d.function, launch.kernel_params(), nullptr);
  if (r != CUDA_SUCCESS) {
    return CuCheck(driver, r, absl::StrCat("launch ", d.kernel->name()));
  }
  return absl::OkStatus();
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

// Random operands for timing one problem, kept across the candidates of one Tune.
struct MoeGemm::TimingBuffers {
  struct Set {
    DeviceBuffer a, b, a_scale, b_scale;
  };
  MoeProblem problem;
  std::vector<Set> sets;
  DeviceBuffer a_global, b_global, offsets, out;
};

absl::Status MoeGemm::PrepareTimingBuffers(const MoeProblem& problem,
                                           const MoeGemmTuneOptions& o) {
  if (timing_ != nullptr && timing_->problem == problem) return absl::OkStatus();
  timing_.reset();  // free the previous problem's memory first
  DriverApi& driver = runtime_->driver();
  const ByteSizes sizes = SizesOf(problem);
  size_t free_bytes = 0, total_bytes = 0;
  CUBIST_RETURN_IF_ERROR(CuCheck(driver, driver.MemGetInfo(&free_bytes, &total_bytes),
                                 "cuMemGetInfo"));
  if (sizes.inputs() + sizes.out > free_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "time ", ToString(problem), ": needs ", sizes.inputs() + sizes.out,
        " bytes of device memory, ", free_bytes, " are free; time a smaller problem"));
  }
  // Enough sets that one pass over them is several times the 50 MB L2, within a
  // quarter of the free memory.
  const size_t target = size_t{256} << 20;
  const size_t one = std::max<size_t>(1, sizes.inputs());
  size_t sets = std::clamp<size_t>((target + one - 1) / one, 1, std::max(1, o.max_rotating_sets));
  while (sets > 1 && sets * one > free_bytes / 4) --sets;

  auto t = std::make_unique<TimingBuffers>();
  t->problem = problem;
  t->sets.resize(sets);
  for (size_t i = 0; i < sets; ++i) {
    TimingBuffers::Set& s = t->sets[i];
    CUBIST_ASSIGN_OR_RETURN(s.a, DeviceBuffer::Allocate(driver, sizes.a));
    CUBIST_ASSIGN_OR_RETURN(s.b, DeviceBuffer::Allocate(driver, sizes.b));
    CUBIST_ASSIGN_OR_RETURN(s.a_scale, DeviceBuffer::Allocate(driver, sizes.a_scale));
    CUBIST_ASSIGN_OR_RETURN(s.b_scale, DeviceBuffer::Allocate(driver, sizes.b_scale));
    const DataFormat af = problem.activation_format, wf = problem.weight_format;
    CUBIST_RETURN_IF_ERROR(OperandPattern(af, OperandKind::kElements, 11 + i).Fill(driver, s.a));
    CUBIST_RETURN_IF_ERROR(OperandPattern(wf, OperandKind::kElements, 23 + i).Fill(driver, s.b));
    CUBIST_RETURN_IF_ERROR(
        OperandPattern(af, OperandKind::kBlockScales, 37 + i).Fill(driver, s.a_scale));
    CUBIST_RETURN_IF_ERROR(
        OperandPattern(wf, OperandKind::kBlockScales, 41 + i).Fill(driver, s.b_scale));
  }
  CUBIST_ASSIGN_OR_RETURN(t->a_global, DeviceBuffer::Allocate(driver, sizes.a_global));
  CUBIST_ASSIGN_OR_RETURN(t->b_global, DeviceBuffer::Allocate(driver, sizes.b_global));
  CUBIST_RETURN_IF_ERROR(OperandPattern(problem.activation_format, OperandKind::kGlobalScale, 5)
                             .Fill(driver, t->a_global));
  CUBIST_RETURN_IF_ERROR(OperandPattern(problem.weight_format, OperandKind::kGlobalScale, 7)
                             .Fill(driver, t->b_global));
  CUBIST_ASSIGN_OR_RETURN(t->out, DeviceBuffer::Allocate(driver, sizes.out));
  // Tokens spread evenly over the experts, as the cost model assumes.
  std::vector<int32_t> offsets(problem.experts + 1);
  for (int64_t e = 0; e <= problem.experts; ++e) {
    offsets[e] = static_cast<int32_t>(e * problem.tokens / problem.experts);
  }
  CUBIST_ASSIGN_OR_RETURN(t->offsets,
                          DeviceBuffer::Allocate(driver, offsets.size() * sizeof(int32_t)));
  CUBIST_RETURN_IF_ERROR(
      t->offsets.CopyFromHost(offsets.data(), offsets.size() * sizeof(int32_t)));
  timing_ = std::move(t);
  return absl::OkStatus();
}

absl::StatusOr<double> MoeGemm::TimeKernel(const KernelEntry& kernel, const MoeProblem& problem,
                                           const MoeGemmTuneOptions& o) {
  DriverApi& driver = runtime_->driver();
  CUBIST_ASSIGN_OR_RETURN(ScopedContext scope, ScopedContext::Enter(driver, runtime_->context()));
  CUBIST_ASSIGN_OR_RETURN(MoeGemmDecision d, DecisionFor(kernel, false));
  if (problem.tokens == 0) return 0.0;
  absl::MutexLock lock(&timing_mu_);
  CUBIST_RETURN_IF_ERROR(PrepareTimingBuffers(problem, o));
  const TimingBuffers& t = *timing_;
  auto args_for = [&](size_t i) {
    MoeGemmArgs a;
    a.weight_format = problem.weight_format;
    a.activation_format = problem.activation_format;
    a.activation = problem.activation;
    a.experts = problem.experts;
    a.tokens = problem.tokens;
    a.n = problem.n;
    a.k = problem.k;
    const TimingBuffers::Set& s = t.sets[i % t.sets.size()];
    a.a = s.a.get();
    a.b = s.b.get();
    a.a_scale = s.a_scale.get();
    a.b_scale = s.b_scale.get();
    a.a_global_scale = t.a_global.get();
    a.b_global_scale = t.b_global.get();
    a.offsets = t.offsets.get();
    a.out = t.out.get();
    return a;
  };

  CUBIST_ASSIGN_OR_RETURN(Stream stream, Stream::Create(driver));
  const int warmup = std::max(1, o.warmup);
  for (int i = 0; i < warmup; ++i) {
    CUBIST_RETURN_IF_ERROR(Launch(d, args_for(i), stream.get()));
  }
  const int iters = std::max(1, o.iterations);
  std::vector<Event> events;
  for (int i = 0; i <= iters; ++i) {
    CUBIST_ASSIGN_OR_RETURN(Event e, Event::Create(driver));
    events.push_back(std::move(e));
  }
  // Back-to-back launches between consecutive events: each interval is one kernel.
  CUBIST_RETURN_IF_ERROR(events[0].Record(stream.get()));
  for (int i = 0; i < iters; ++i) {
    CUBIST_RETURN_IF_ERROR(Launch(d, args_for(warmup + i), stream.get()));
    CUBIST_RETURN_IF_ERROR(events[i + 1].Record(stream.get()));
  }
  CUBIST_RETURN_IF_ERROR(events[iters].Synchronize());
  std::vector<double> us;
  for (int i = 0; i < iters; ++i) {
    CUBIST_ASSIGN_OR_RETURN(float ms, Event::ElapsedMs(events[i], events[i + 1]));
    us.push_back(ms * 1000.0);
  }
  std::nth_element(us.begin(), us.begin() + us.size() / 2, us.end());
  return us[us.size() / 2];
}

absl::StatusOr<AutotuneResult> MoeGemm::Tune(const MoeProblem& problem_in,
                                            const MoeGemmTuneOptions& options) {
  MoeProblem problem = problem_in;
  problem.sm = runtime_->sm();
  problem.sm_count = runtime_->device_info().sm_count;
  OpTimer timer(*this, options);
  SelectOptions so;
  so.abi = moe::kMoeGemmAbi;
  CUBIST_ASSIGN_OR_RETURN(
      AutotuneResult result,
      Autotune(runtime_->registry(), problem, timer, options.autotune, so));
  if (options.record && !runtime_->tuning_path().empty()) {
    TuningRecord r;
    r.context = runtime_->tuning_context();
    r.op = std::string(OpName(problem.op));
    r.bucket = BucketOf(problem).ToString();
    r.kernel = result.winner->name();
    r.time_us = result.winner_us;
    r.candidates = static_cast<int>(result.timings.size());
    CUBIST_RETURN_IF_ERROR(RecordTuning(runtime_->tuning_path(), r));
    CUBIST_RETURN_IF_ERROR(runtime_->ReloadTuning());
  }
  {
    // The operands can be gigabytes; an engine tunes at startup and keeps running.
    absl::MutexLock lock(&timing_mu_);
    auto scope = ScopedContext::Enter(runtime_->driver(), runtime_->context());
    timing_.reset();
  }
  if (options_.pinned_kernel.empty()) {
    CUBIST_ASSIGN_OR_RETURN(MoeGemmDecision d, DecisionFor(*result.winner, true));
    cache_.Replace(problem, d);
  }
  return result;
}

}  // namespace cubist
