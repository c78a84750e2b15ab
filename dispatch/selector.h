// Selection: which kernels of a registry can solve a problem, and in what order.
//
// A kernel is a candidate when its op, ABI, weight and activation formats and
// activation equal the problem's exactly, its arch runs on the problem's SM
// (loader/compat.h, SassRunsOn), and the problem's shape meets its constraints
// (registry.h's ShapeConstraints plus the formats' scale blocks). Candidates are ranked
// by the cost model (cost_model.h): estimated time, then estimated compute time
// (memory-bound problems tie on time), then name, so that the order is deterministic.
//
// Functions here are pure and thread-safe; the registry must outlive the results,
// which point into it.
#ifndef CUBIST_DISPATCH_SELECTOR_H_
#define CUBIST_DISPATCH_SELECTOR_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "dispatch/cost_model.h"
#include "dispatch/problem.h"
#include "dispatch/registry.h"

namespace cubist {

// Why a kernel cannot solve a problem, in filter order.
enum class RejectReason {
  kOp,
  kAbi,
  kWeightFormat,
  kActivationFormat,
  kActivation,
  kOutputFormat,
  kGatherA,
  kArch,
  kShape,
  kInexact,
};
std::string_view RejectReasonName(RejectReason reason);  // "op", "weight format", ...

struct Rejection {
  RejectReason reason;
  std::string detail;  // "kernel takes mxfp4, problem has bf16"
};

struct Candidate {
  const KernelEntry* kernel = nullptr;
  CostEstimate cost;
  int rank = 0;  // 1 = best
};

// One kernel's verdict for a problem: rejected (with every reason) or ranked.
struct Verdict {
  const KernelEntry* kernel = nullptr;
  std::vector<Rejection> rejections;  // empty: a candidate
  std::optional<CostEstimate> cost;   // set for candidates
  int rank = 0;                       // candidates: 1 = best; rejected: 0

  bool candidate() const { return rejections.empty(); }
};

struct SelectOptions {
  // The newest parameter-struct version this build's launcher fills
  // (kernels/moe_gemm_abi.h): kernels of versions 1..abi (moe_gemm: kMoeGemmAbiOldest..abi)
  // are accepted, others rejected; 0 accepts any (selection without launching, e.g.
  // `cubist select`). A moe_gemm kernel of the retired version 1 is rejected either way,
  // with the fix (kMoeGemmAbiRetiredFix).
  int abi = 0;
  // When set, the only kernel considered (debugging): NotFound when no kernel has the
  // name, FailedPrecondition listing its rejections when it cannot solve the problem.
  std::string pinned;
  // Also consider kernels whose manifest entry says "exact": false (KernelEntry::exact):
  // they round an operand on purpose, so neither untuned selection nor autotuning picks
  // one unless the caller accepts that. A pinned kernel is accepted either way: naming it
  // is the consent.
  bool allow_inexact = false;
};

// Every reason `kernel` cannot solve `problem` (empty when it can).
std::vector<Rejection> CheckKernel(const KernelEntry& kernel, const MoeProblem& problem,
                                   const SelectOptions& options);

// A verdict for every kernel of the registry, in registry order.
std::vector<Verdict> Explain(const Registry& registry, const MoeProblem& problem,
                             const SelectOptions& options = {});

// The candidates, best first. An invalid problem is InvalidArgument (ValidateProblem).
// No candidate: NotFound "no kernel for <problem> in <manifest>: nearest: <name>
// (<reason>: <detail>), ...; <fix>". The pinned kernel: see SelectOptions.
[[nodiscard]] absl::StatusOr<std::vector<Candidate>> RankCandidates(
    const Registry& registry, const MoeProblem& problem, const SelectOptions& options = {});

// The best candidate (RankCandidates()[0]).
[[nodiscard]] absl::StatusOr<Candidate> SelectKernel(const Registry& registry,
                                                     const MoeProblem& problem,
                                                     const SelectOptions& options = {});

// Human-readable explain output, one line per kernel, candidates first by rank:
//   problem: moe_gemm{...}
//   #1 bf16_m128n128k64: 12.3 us (compute ...), ...
//   rejected bf16_relu2: activation: kernel applies relu2, problem wants swiglu
std::string FormatExplain(const MoeProblem& problem, const std::vector<Verdict>& verdicts);

}  // namespace cubist

#endif  // CUBIST_DISPATCH_SELECTOR_H_
