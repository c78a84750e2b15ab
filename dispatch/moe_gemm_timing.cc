// The timing harness of MoeGemm (dispatch/moe_gemm.h: TimeKernel, Tune): rotating
// sets of device buffers sized for a problem, filled with valid codes of each format,
// and CUDA-event timing of one kernel on them. Kept apart from the op itself
// (moe_gemm.cc), whose per-call path never touches any of this.
#include <algorithm>
#include <cstring>
#include <limits>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "base/strings.h"
#include "dispatch/moe_gemm.h"
#include "dispatch/operand_fill.h"
#include "dispatch/routed_load.h"
#include "dispatch/selector.h"
#include "kernels/moe_gemm_abi.h"
#include "loader/device_memory.h"

namespace cubist {
namespace {

// The draw routed problems are timed on: one fixed draw, so that every candidate runs on
// the same offsets. (A draw's tiles average out to the expectation the cost model prices
// over hundreds of experts; over Mixtral-8x7B's eight they may differ by a tile or so.)
constexpr uint64_t kRoutedOffsetsSeed = 0x5EED;

moe::MoeGemmBytes SizesOf(const MoeProblem& p) {
  return moe::MoeGemmBytesFor(p.weight_format, p.activation_format, p.activation, p.experts,
                              p.tokens, p.n, p.k);
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

std::vector<int32_t> TimingOffsets(const MoeProblem& problem) {
  if (problem.routed_top_k > 0) {
    RoutedLoad load = problem.routed_load();
    load.tokens = problem.tokens / problem.routed_top_k;  // whole tokens: at most `tokens` rows
    return SampleRoutedOffsets(load, problem.experts, kRoutedOffsetsSeed);
  }
  std::vector<int32_t> offsets(problem.experts + 1);
  for (int64_t e = 0; e <= problem.experts; ++e) {
    offsets[e] = static_cast<int32_t>(e * problem.tokens / problem.experts);
  }
  return offsets;
}

// Random operands for timing one problem, kept across the candidates of one Tune.
struct MoeGemm::TimingBuffers {
  struct Set {
    DeviceBuffer a, b, a_scale, b_scale;
  };
  MoeProblem problem;
  std::vector<Set> sets;
  DeviceBuffer a_global, b_global, offsets, out;
  DeviceBuffer out_scale;  // fp32 [1], fp8-output problems only
  DeviceBuffer row_map;    // int32 [T], problems that gather A: row r reads A's row r
};

void MoeGemm::TimingBuffersDeleter::operator()(TimingBuffers* t) const { delete t; }

absl::Status MoeGemm::PrepareTimingBuffers(const MoeProblem& problem,
                                           const MoeGemmTuneOptions& o) {
  if (timing_ != nullptr && timing_->problem == problem) return absl::OkStatus();
  timing_.reset();  // free the previous problem's memory first
  DriverApi& driver = runtime_->driver();
  const moe::MoeGemmBytes sizes = SizesOf(problem);
  size_t free_bytes = 0, total_bytes = 0;
  CUBIST_RETURN_IF_ERROR(CuCheck(driver, driver.MemGetInfo(&free_bytes, &total_bytes),
                                 "cuMemGetInfo"));
  if (static_cast<size_t>(sizes.inputs() + sizes.out) > free_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "time ", ToString(problem), ": needs ", sizes.inputs() + sizes.out,
        " bytes of device memory, ", free_bytes, " are free; time a smaller problem"));
  }
  // Enough sets that one pass over them is several times the 50 MB L2, within a
  // quarter of the free memory.
  const size_t target = size_t{256} << 20;
  const size_t one = std::max<size_t>(1, static_cast<size_t>(sizes.inputs()));
  size_t sets = std::clamp<size_t>((target + one - 1) / one, 1, std::max(1, o.max_rotating_sets));
  while (sets > 1 && sets * one > free_bytes / 4) --sets;

  std::unique_ptr<TimingBuffers, TimingBuffersDeleter> t(new TimingBuffers);
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
  CUBIST_ASSIGN_OR_RETURN(t->a_global, DeviceBuffer::Allocate(driver, sizes.a_global_scale));
  CUBIST_ASSIGN_OR_RETURN(t->b_global, DeviceBuffer::Allocate(driver, sizes.b_global_scale));
  CUBIST_RETURN_IF_ERROR(OperandPattern(problem.activation_format, OperandKind::kGlobalScale, 5)
                             .Fill(driver, t->a_global));
  CUBIST_RETURN_IF_ERROR(OperandPattern(problem.weight_format, OperandKind::kGlobalScale, 7)
                             .Fill(driver, t->b_global));
  CUBIST_ASSIGN_OR_RETURN(t->out, DeviceBuffer::Allocate(driver, sizes.out));
  if (problem.output_format == DataFormat::kFp8) {  // e4m3 output: half of sizes.out
    CUBIST_ASSIGN_OR_RETURN(t->out_scale, DeviceBuffer::Allocate(driver, sizeof(float)));
    CUBIST_RETURN_IF_ERROR(OperandPattern(DataFormat::kFp8, OperandKind::kGlobalScale, 9)
                               .Fill(driver, t->out_scale));
  }
  const std::vector<int32_t> offsets = TimingOffsets(problem);
  CUBIST_ASSIGN_OR_RETURN(t->offsets,
                          DeviceBuffer::Allocate(driver, offsets.size() * sizeof(int32_t)));
  CUBIST_RETURN_IF_ERROR(
      t->offsets.CopyFromHost(offsets.data(), offsets.size() * sizeof(int32_t)));
  if (problem.gather_a && problem.tokens > 0) {
    // The identity map: each row reads its own row of A, as a gathered copy would hold.
    std::vector<int32_t> rows(problem.tokens);
    for (int64_t r = 0; r < problem.tokens; ++r) rows[r] = static_cast<int32_t>(r);
    CUBIST_ASSIGN_OR_RETURN(t->row_map,
                            DeviceBuffer::Allocate(driver, rows.size() * sizeof(int32_t)));
    CUBIST_RETURN_IF_ERROR(t->row_map.CopyFromHost(rows.data(), rows.size() * sizeof(int32_t)));
  }
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
    MoeGemmArgs a = MoeGemmArgsFor(problem);
    const TimingBuffers::Set& s = t.sets[i % t.sets.size()];
    a.a = s.a.get();
    a.b = s.b.get();
    a.a_scale = s.a_scale.get();
    a.b_scale = s.b_scale.get();
    a.a_global_scale = t.a_global.get();
    a.b_global_scale = t.b_global.get();
    a.offsets = t.offsets.get();
    a.out = t.out.get();
    a.out_scale = t.out_scale.get();
    if (problem.gather_a) {
      a.a_row_map = t.row_map.get();
      a.a_row_divisor = 1;
      a.a_rows = problem.tokens;
    }
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
  so.allow_inexact = options_.allow_inexact;
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
