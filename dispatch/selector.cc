#include "dispatch/selector.h"

#include <algorithm>
#include <map>
#include <tuple>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "base/strings.h"

namespace cubist {
namespace {

// How far a rejection puts a kernel from the problem, for the "nearest" list of a
// miss: a kernel off only by shape is closer than one with another format, which is
// closer than one for another GPU or another op.
int Distance(RejectReason reason) {
  switch (reason) {
    case RejectReason::kShape: return 1;
    case RejectReason::kInexact: return 1;
    case RejectReason::kActivation: return 2;
    case RejectReason::kOutputFormat: return 2;
    case RejectReason::kGatherA: return 2;
    case RejectReason::kAbi: return 2;
    case RejectReason::kActivationFormat: return 3;
    case RejectReason::kWeightFormat: return 3;
    case RejectReason::kArch: return 4;
    case RejectReason::kOp: return 10;
  }
  return 10;
}

void CheckShape(const KernelEntry& kernel, const MoeProblem& p,
                std::vector<Rejection>& out) {
  auto reject = [&](std::string detail) {
    out.push_back({RejectReason::kShape, std::move(detail)});
  };
  for (DataFormat f : {kernel.weight_format, kernel.activation_format}) {
    // 0: no block scales. fp8-block scales cover ceil(K/128) blocks, the last one partial
    // (kernels/moe_gemm_abi.h), so any K its k_align allows is whole.
    const int block = f == DataFormat::kFp8Block ? 0 : moe::FormatScaleBlock(f);
    if (block > 1 && p.k % block != 0) {
      reject(absl::StrCat("K=", p.k, " is not a multiple of ", block, " (the ",
                          Sv(DataFormatName(f)), " scale block)"));
      break;
    }
  }
  const ShapeConstraints& c = kernel.constraints;
  if (p.k % c.k_multiple != 0) {
    reject(absl::StrCat("K=", p.k, " is not a multiple of ", c.k_multiple,
                        " (the kernel's k_align)"));
  }
  if (p.n % c.n_multiple != 0) {
    reject(absl::StrCat("N=", p.n, " is not a multiple of ", c.n_multiple,
                        " (the kernel's n_multiple)"));
  }
  if (p.output_n() % c.out_n_multiple != 0) {
    reject(absl::StrCat("output width ", p.output_n(), IsGated(p.activation) ? " (N/2)" : "",
                        " is not a multiple of ", c.out_n_multiple, " (the kernel's n_align)"));
  }
  if (c.max_k > 0 && p.k > c.max_k) {
    reject(absl::StrCat("K=", p.k, " exceeds the kernel's max_k ", c.max_k));
  }
  if (c.max_n > 0 && p.n > c.max_n) {
    reject(absl::StrCat("N=", p.n, " exceeds the kernel's max_n ", c.max_n));
  }
  if (c.max_tokens > 0 && p.tokens > c.max_tokens) {
    reject(absl::StrCat("tokens=", p.tokens, " exceeds the kernel's max_tokens ",
                        c.max_tokens));
  }
}

// "sm_90a kernel does not run on SM 100: an 'a' target runs only on SM 90".
std::string WhyNotRunsOn(const SmTarget& arch, DeviceSm sm) {
  std::string head = absl::StrCat(arch.ToString(), " kernel does not run on SM ",
                                  sm.number(), ": ");
  if (arch.major != sm.major) {
    return absl::StrCat(head, "machine code runs only within its major version (",
                        arch.major, ".x)");
  }
  if (arch.variant == SmTarget::Variant::kArch) {
    return absl::StrCat(head, "an 'a' target runs only on SM ", arch.number());
  }
  return absl::StrCat(head, "it needs SM ", arch.number(), " or a later ", arch.major,
                      ".x");
}

std::string FormatRejection(const Rejection& r) {
  return absl::StrCat(Sv(RejectReasonName(r.reason)), ": ", r.detail);
}

absl::Status NotFoundFor(const Registry& registry, const MoeProblem& problem,
                         const std::vector<Verdict>& verdicts) {
  std::vector<const Verdict*> nearest;
  for (const Verdict& v : verdicts) nearest.push_back(&v);
  auto score = [](const Verdict* v) {
    int s = 0;
    for (const Rejection& r : v->rejections) s += Distance(r.reason);
    return s;
  };
  std::stable_sort(nearest.begin(), nearest.end(), [&](const Verdict* a, const Verdict* b) {
    return std::make_tuple(score(a), a->kernel->name()) <
           std::make_tuple(score(b), b->kernel->name());
  });
  constexpr size_t kShown = 3;
  std::vector<std::string> shown;
  for (size_t i = 0; i < nearest.size() && i < kShown; ++i) {
    std::vector<std::string> why;
    for (const Rejection& r : nearest[i]->rejections) why.push_back(FormatRejection(r));
    shown.push_back(absl::StrCat(nearest[i]->kernel->name(), " (",
                                 absl::StrJoin(why, "; "), ")"));
  }
  std::string msg = absl::StrCat("no kernel for ", ToString(problem), " in ",
                                 registry.manifest_source(), " (", registry.size(),
                                 " kernels)");
  if (shown.empty()) {
    absl::StrAppend(&msg, ": the manifest lists no kernels");
  } else {
    absl::StrAppend(&msg, ": nearest: ", absl::StrJoin(shown, ", "));
  }
  // When the op's kernels are all for other GPUs, say which: the fix is another GPU or
  // another artifact set, not another problem.
  std::map<std::string, int> archs;
  bool any_runs = false;
  for (const KernelEntry& k : registry.kernels()) {
    if (!k.op.has_value() || *k.op != problem.op) continue;
    ++archs[k.arch.ToString()];
    any_runs = any_runs || SassRunsOn(k.arch, problem.sm);
  }
  if (!archs.empty() && !any_runs) {
    std::vector<std::string> names;
    for (const auto& [arch, count] : archs) names.push_back(absl::StrCat(arch, " (", count, ")"));
    absl::StrAppend(&msg, "; its ", Sv(OpName(problem.op)), " kernels are for ",
                    absl::StrJoin(names, ", "), " and none runs on SM ", problem.sm.number(),
                    ": run on one of those GPUs or use a set built for this one");
    return absl::NotFoundError(msg);
  }
  absl::StrAppend(&msg,
                  "; use a manifest with a kernel for this problem, or see --explain for "
                  "every kernel's verdict");
  return absl::NotFoundError(msg);
}

}  // namespace

std::string_view RejectReasonName(RejectReason reason) {
  switch (reason) {
    case RejectReason::kOp: return "op";
    case RejectReason::kAbi: return "abi";
    case RejectReason::kWeightFormat: return "weight format";
    case RejectReason::kActivationFormat: return "activation format";
    case RejectReason::kActivation: return "activation";
    case RejectReason::kOutputFormat: return "output format";
    case RejectReason::kGatherA: return "gather of A";
    case RejectReason::kArch: return "arch";
    case RejectReason::kShape: return "shape";
    case RejectReason::kInexact: return "inexact";
  }
  return "?";
}

std::vector<Rejection> CheckKernel(const KernelEntry& kernel, const MoeProblem& p,
                                   const SelectOptions& options) {
  std::vector<Rejection> out;
  if (!kernel.op.has_value() || *kernel.op != p.op) {
    out.push_back({RejectReason::kOp, absl::StrCat("kernel implements '", kernel.spec.op,
                                                   "', problem is ", Sv(OpName(p.op)))});
  }
  const bool moe_gemm = kernel.op == Op::kMoeGemm;
  if (moe_gemm && kernel.spec.abi == moe::kMoeGemmAbiRetiredV1) {
    // Retired whatever the caller launches: selecting it would name a kernel nothing runs.
    out.push_back({RejectReason::kAbi, moe::kMoeGemmAbiRetiredFix});
  } else if (options.abi != 0 &&
             (kernel.spec.abi < (moe_gemm ? moe::kMoeGemmAbiOldest : 1) ||
              kernel.spec.abi > options.abi)) {
    out.push_back({RejectReason::kAbi,
                   absl::StrCat("kernel takes parameter struct version ", kernel.spec.abi,
                                ", this build fills versions ",
                                moe_gemm ? moe::kMoeGemmAbiOldest : 1, " to ", options.abi)});
  }
  if (p.bias && p.op == Op::kMoeGemm && kernel.spec.abi < moe::kMoeGemmAbiV3) {
    out.push_back({RejectReason::kAbi,
                   absl::StrCat("kernel takes parameter struct version ", kernel.spec.abi,
                                ", which has no bias (version 3 adds it)")});
  }
  if (kernel.op.has_value()) {
    if (kernel.weight_format != p.weight_format) {
      out.push_back({RejectReason::kWeightFormat,
                     absl::StrCat("kernel takes ", Sv(DataFormatName(kernel.weight_format)),
                                  ", problem has ", Sv(DataFormatName(p.weight_format)))});
    }
    if (kernel.activation_format != p.activation_format) {
      out.push_back(
          {RejectReason::kActivationFormat,
           absl::StrCat("kernel takes ", Sv(DataFormatName(kernel.activation_format)),
                        ", problem has ", Sv(DataFormatName(p.activation_format)))});
    }
    if (kernel.activation != p.activation) {
      out.push_back({RejectReason::kActivation,
                     absl::StrCat("kernel applies ", Sv(ActivationName(kernel.activation)),
                                  ", problem wants ", Sv(ActivationName(p.activation)))});
    }
  }
  // A moe_gemm problem without an output format wants bf16, what its callers read: an
  // fp8-output kernel (version 4) is chosen only when asked for. Other ops' problems
  // without one accept any.
  if (p.output_format.has_value() || (moe_gemm && p.op == Op::kMoeGemm)) {
    const std::string_view wants = DataFormatName(p.output_format.value_or(DataFormat::kBf16));
    const std::string_view writes = KernelOutputFormat(kernel.spec);
    if (writes != wants) {
      out.push_back({RejectReason::kOutputFormat,
                     absl::StrCat("kernel writes ", Sv(writes), ", problem wants ", Sv(wants))});
    }
  }
  // Rows through a map and rows in order are different problems: a gathering kernel
  // needs the map, and one reading in order would compute on the wrong rows.
  if (moe_gemm && KernelGathersA(kernel.spec) != p.gather_a) {
    out.push_back({RejectReason::kGatherA,
                   p.gather_a ? "kernel reads A's rows in order, problem gathers them "
                                "through a_row_map"
                              : "kernel gathers A's rows through a_row_map, problem has "
                                "them in order"});
  }
  if (!SassRunsOn(kernel.arch, p.sm)) {
    out.push_back({RejectReason::kArch, WhyNotRunsOn(kernel.arch, p.sm)});
  }
  if (kernel.op.has_value()) CheckShape(kernel, p, out);
  if (!kernel.exact && !options.allow_inexact && options.pinned != kernel.name()) {
    out.push_back({RejectReason::kInexact,
                   "the kernel rounds an operand on purpose (manifest \"exact\": false); "
                   "allow inexact kernels or pin it by name to use it"});
  }
  return out;
}

std::vector<Verdict> Explain(const Registry& registry, const MoeProblem& problem,
                             const SelectOptions& options) {
  std::vector<Verdict> verdicts;
  verdicts.reserve(registry.size());
  const DeviceInfo device = DeviceForProblem(problem);
  for (const KernelEntry& k : registry.kernels()) {
    Verdict v;
    v.kernel = &k;
    v.rejections = CheckKernel(k, problem, options);
    if (v.candidate()) v.cost = EstimateCost(k, problem, device);
    verdicts.push_back(std::move(v));
  }
  std::vector<Verdict*> ranked;
  for (Verdict& v : verdicts) {
    if (v.candidate()) ranked.push_back(&v);
  }
  std::stable_sort(ranked.begin(), ranked.end(), [](const Verdict* a, const Verdict* b) {
    // Equal times happen when every candidate is memory-bound; the one that wastes
    // less compute then leaves the most headroom.
    return std::make_tuple(a->cost->time_us, a->cost->compute_us, a->kernel->name()) <
           std::make_tuple(b->cost->time_us, b->cost->compute_us, b->kernel->name());
  });
  for (size_t i = 0; i < ranked.size(); ++i) ranked[i]->rank = static_cast<int>(i) + 1;
  return verdicts;
}

absl::StatusOr<std::vector<Candidate>> RankCandidates(const Registry& registry,
                                                      const MoeProblem& problem,
                                                      const SelectOptions& options) {
  CUBIST_RETURN_IF_ERROR(ValidateProblem(problem));
  if (!options.pinned.empty()) {
    const KernelEntry* k = registry.Find(options.pinned);
    if (k == nullptr) {
      return absl::NotFoundError(absl::StrCat("pinned kernel '", options.pinned,
                                              "' is not in ", registry.manifest_source(),
                                              "; check the name with `cubist list`"));
    }
    std::vector<Rejection> why = CheckKernel(*k, problem, options);
    if (!why.empty()) {
      std::vector<std::string> parts;
      for (const Rejection& r : why) parts.push_back(FormatRejection(r));
      return absl::FailedPreconditionError(
          absl::StrCat("pinned kernel '", options.pinned, "' cannot solve ",
                       ToString(problem), ": ", absl::StrJoin(parts, "; "),
                       "; unpin it or pin a kernel that fits"));
    }
    return std::vector<Candidate>{
        Candidate{k, EstimateCost(*k, problem, DeviceForProblem(problem)), 1}};
  }
  std::vector<Verdict> verdicts = Explain(registry, problem, options);
  std::vector<Candidate> out;
  for (const Verdict& v : verdicts) {
    if (v.candidate()) out.push_back({v.kernel, *v.cost, v.rank});
  }
  if (out.empty()) return NotFoundFor(registry, problem, verdicts);
  std::sort(out.begin(), out.end(),
            [](const Candidate& a, const Candidate& b) { return a.rank < b.rank; });
  return out;
}

absl::StatusOr<Candidate> SelectKernel(const Registry& registry, const MoeProblem& problem,
                                       const SelectOptions& options) {
  CUBIST_ASSIGN_OR_RETURN(std::vector<Candidate> ranked,
                          RankCandidates(registry, problem, options));
  return ranked.front();
}

std::string FormatExplain(const MoeProblem& problem, const std::vector<Verdict>& verdicts) {
  std::string out = absl::StrCat("problem: ", ToString(problem), "\n");
  std::vector<const Verdict*> ranked;
  for (const Verdict& v : verdicts) {
    if (v.candidate()) ranked.push_back(&v);
  }
  std::sort(ranked.begin(), ranked.end(),
            [](const Verdict* a, const Verdict* b) { return a->rank < b->rank; });
  for (const Verdict* v : ranked) {
    absl::StrAppend(&out, "#", v->rank, " ", v->kernel->name(), ": ", v->cost->ToString(),
                    "\n");
  }
  for (const Verdict& v : verdicts) {
    if (v.candidate()) continue;
    std::vector<std::string> parts;
    for (const Rejection& r : v.rejections) parts.push_back(FormatRejection(r));
    absl::StrAppend(&out, "rejected ", v.kernel->name(), ": ", absl::StrJoin(parts, "; "),
                    "\n");
  }
  if (ranked.empty()) absl::StrAppend(&out, "no candidate\n");
  return out;
}

}  // namespace cubist
