// cubist run: runs one MoE GEMM problem on the GPU through the engine API (Runtime +
// MoeGemm) on random operands, checks a sample of output rows against the CPU reference
// (dispatch/operand_reference.h over dispatch/reference.h) and prints the median time
// and TFLOP/s.
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <random>

#include <nlohmann/json.hpp>

#include "absl/strings/str_format.h"
#include "base/status_macros.h"
#include "cli/command.h"
#include "cli/common.h"
#include "cli/exit_codes.h"
#include "cli/moe_problem_flags.h"
#include "cli/run_moe_layer.h"
#include "cli/trust_flags.h"
#include "dispatch/moe_gemm.h"
#include "dispatch/operand_fill.h"
#include "dispatch/operand_reference.h"
#include "dispatch/reference.h"
#include "dispatch/runtime.h"
#include "loader/device_memory.h"

namespace cubist::cli {
namespace {

struct RunFlags {
  std::string manifest;
  std::string cache;
  report::ProblemSpec problem;
  std::string pin;
  int device = 0;
  int iterations = 20;
  int warmup = 3;
  int check_rows = 32;
  uint64_t seed = 1;
  bool json = false;
  bool offline = false;
  bool allow_inexact = false;
  report::TrustSpec trust;
  MoeLayerRunFlags layer;  // --op moe
};

struct CheckResult {
  bool ok = false;
  int rows = 0;
  std::string summary;
};

// The problem on the device: operands filled from their patterns, experts owning equal
// shares of the tokens, the output poisoned with NaN so that an unwritten row shows.
struct DeviceProblem {
  std::vector<int32_t> offsets;  // a copy on the host, for sampling
  DeviceBuffer a, b, a_scale, b_scale, a_global, b_global, offsets_buffer, out;

  MoeGemmArgs Args(const MoeProblem& p) const {
    MoeGemmArgs args = MoeGemmArgsFor(p);
    args.a = a.get();
    args.b = b.get();
    args.a_scale = a_scale.get();
    args.b_scale = b_scale.get();
    args.a_global_scale = a_global.get();
    args.b_global_scale = b_global.get();
    args.offsets = offsets_buffer.get();
    args.out = out.get();
    return args;
  }
};

absl::StatusOr<DeviceBuffer> AllocateFilled(DriverApi& d, int64_t size,
                                            const OperandPattern& pattern) {
  CUBIST_ASSIGN_OR_RETURN(DeviceBuffer b, DeviceBuffer::Allocate(d, static_cast<size_t>(size)));
  CUBIST_RETURN_IF_ERROR(pattern.Fill(d, b));
  return b;
}

absl::StatusOr<DeviceProblem> Upload(DriverApi& d, const MoeProblem& p,
                                     const PatternOperand& av, const PatternOperand& bv) {
  const moe::MoeGemmBytes bytes = moe::MoeGemmBytesFor(
      p.weight_format, p.activation_format, p.activation, p.experts, p.tokens, p.n, p.k);
  DeviceProblem dp;
  CUBIST_ASSIGN_OR_RETURN(dp.a, AllocateFilled(d, bytes.a, av.elements));
  CUBIST_ASSIGN_OR_RETURN(dp.b, AllocateFilled(d, bytes.b, bv.elements));
  CUBIST_ASSIGN_OR_RETURN(dp.a_scale, AllocateFilled(d, bytes.a_scale, av.scales));
  CUBIST_ASSIGN_OR_RETURN(dp.b_scale, AllocateFilled(d, bytes.b_scale, bv.scales));
  CUBIST_ASSIGN_OR_RETURN(dp.a_global, AllocateFilled(d, bytes.a_global_scale, av.global));
  CUBIST_ASSIGN_OR_RETURN(dp.b_global, AllocateFilled(d, bytes.b_global_scale, bv.global));
  dp.offsets = TimingOffsets(p);  // the offsets TimeKernel times on too
  CUBIST_ASSIGN_OR_RETURN(dp.offsets_buffer, DeviceBuffer::Allocate(d, dp.offsets.size() * 4));
  CUBIST_RETURN_IF_ERROR(dp.offsets_buffer.CopyFromHost(dp.offsets.data(), dp.offsets.size() * 4));
  CUBIST_ASSIGN_OR_RETURN(dp.out, DeviceBuffer::Allocate(d, static_cast<size_t>(bytes.out)));
  CUBIST_RETURN_IF_ERROR(dp.out.Fill(0xFF));  // poison: NaN bf16 everywhere unwritten
  return dp;
}

// Rows to check: spread over at most 8 experts so that decoding their weights stays
// cheap, first and last rows of each included (tile edges); grouped by expert.
std::vector<SampledRow> SampleRows(const std::vector<int32_t>& offsets, int check_rows,
                                   uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int64_t> experts;
  for (size_t e = 0; e + 1 < offsets.size(); ++e) {
    if (offsets[e + 1] > offsets[e]) experts.push_back(static_cast<int64_t>(e));
  }
  std::shuffle(experts.begin(), experts.end(), rng);
  // About four sampled rows per decoded expert: decoding an expert's weights (N x K)
  // is what the check costs.
  experts.resize(std::min<size_t>(experts.size(), std::clamp(check_rows / 4, 1, 8)));
  std::vector<SampledRow> rows;
  const int per_expert = std::max<int>(1, check_rows / static_cast<int>(experts.size()));
  for (int64_t e : experts) {
    const int64_t lo = offsets[e], hi = offsets[e + 1];
    std::vector<int64_t> picks = {lo, hi - 1};
    for (int i = 2; i < per_expert; ++i) picks.push_back(lo + static_cast<int64_t>(rng() % (hi - lo)));
    std::sort(picks.begin(), picks.end());
    picks.erase(std::unique(picks.begin(), picks.end()), picks.end());
    for (int64_t t : picks) rows.push_back({t, e});
  }
  return rows;
}

// Runs the kernel once on pattern operands and checks sampled rows of its output
// against the CPU reference (dispatch/operand_reference.h).
absl::StatusOr<CheckResult> RunAndCheck(const RunFlags& f, Runtime& rt, MoeGemm& gemm,
                                        const MoeProblem& p) {
  DriverApi& d = rt.driver();
  const PatternOperand av(p.activation_format, f.seed * 4 + 100);
  const PatternOperand bv(p.weight_format, f.seed * 4 + 200);
  CUBIST_ASSIGN_OR_RETURN(DeviceProblem dp, Upload(d, p, av, bv));
  const MoeGemmArgs args = dp.Args(p);
  CUBIST_RETURN_IF_ERROR(gemm.CanImplement(args));
  CUBIST_ASSIGN_OR_RETURN(Stream stream, Stream::Create(d));
  CUBIST_RETURN_IF_ERROR(gemm.Run(args, stream.get()));
  CUBIST_RETURN_IF_ERROR(stream.Synchronize());

  CheckResult result;
  if (p.tokens == 0) {
    result.ok = true;
    result.summary = "no tokens: nothing to check";
    return result;
  }
  const std::vector<SampledRow> rows = SampleRows(dp.offsets, f.check_rows, f.seed);
  const int64_t cols = p.output_n();
  std::vector<uint16_t> got(rows.size() * cols);
  for (size_t i = 0; i < rows.size(); ++i) {
    CUBIST_RETURN_IF_ERROR(dp.out.CopyToHost(&got[i * cols], cols * 2,
                                             static_cast<size_t>(rows[i].row * cols * 2)));
  }
  const reference::Comparison cmp = reference::CompareBf16(
      got, ReferenceRows(p, av, bv, rows),
      reference::ToleranceFor(p.weight_format, p.activation_format));
  result.ok = cmp.ok;
  result.rows = static_cast<int>(rows.size());
  result.summary = cmp.summary;
  return result;
}

// The runtime the command runs on, current on this thread.
absl::StatusOr<std::unique_ptr<Runtime>> OpenRuntime(const RunFlags& f) {
  CUBIST_ASSIGN_OR_RETURN(RuntimeOptions ro, RuntimeOptionsForCommand(f.manifest, f.cache,
                                                                      f.device, f.offline,
                                                                      f.trust));
  CUBIST_ASSIGN_OR_RETURN(std::unique_ptr<Runtime> rt, Runtime::Open(ro));
  CUBIST_RETURN_IF_ERROR(rt->MakeCurrent());
  return rt;
}

int RunLayerCommand(const RunFlags& f) {
  MoeLayerRunFlags l = f.layer;
  l.weights = f.problem.weights;
  l.activations = f.problem.activations;
  l.activation = f.problem.activation;
  l.experts = static_cast<int>(f.problem.experts);
  l.tokens = static_cast<int>(f.problem.tokens);
  l.iterations = f.iterations;
  l.warmup = f.warmup;
  l.seed = f.seed;
  l.json = f.json;
  absl::StatusOr<MoeLayerOptions> options = MoeLayerOptionsFromFlags(l);
  if (!options.ok()) {
    PrintError(options.status());
    return absl::IsInvalidArgument(options.status()) ? kExitUsage : ExitCodeFor(options.status());
  }
  absl::StatusOr<std::unique_ptr<Runtime>> rt = OpenRuntime(f);
  if (!rt.ok()) return PrintError(rt.status());
  return RunMoeLayer(l, *options, **rt);
}

int RunRun(const RunFlags& f) {
  if (f.problem.op == "moe") return RunLayerCommand(f);
  if (f.problem.op != "moe_gemm") {
    PrintError(absl::InvalidArgumentError(absl::StrCat(
        "--op: '", f.problem.op, "' is not moe_gemm (one GEMM) or moe (the routed layer)")));
    return kExitUsage;
  }
  if (f.problem.n <= 0 || f.problem.k <= 0) {
    PrintError(absl::InvalidArgumentError(
        "--n and --k are required for --op moe_gemm (the GEMM's shape)"));
    return kExitUsage;
  }
  absl::StatusOr<MoeProblem> problem = f.problem.ToProblem();
  if (!problem.ok()) {
    PrintError(problem.status());
    return kExitUsage;
  }
  absl::StatusOr<std::unique_ptr<Runtime>> rt = OpenRuntime(f);
  if (!rt.ok()) return PrintError(rt.status());
  MoeGemmOptions mo;
  mo.pinned_kernel = f.pin;
  mo.allow_inexact = f.allow_inexact;
  auto gemm = MoeGemm::Create(**rt, mo);
  if (!gemm.ok()) return PrintError(gemm.status());

  MoeProblem p = *problem;
  if (!f.problem.sm.empty() && p.sm != (*rt)->sm()) {
    return PrintError(absl::FailedPreconditionError(absl::StrFormat(
        "--sm %s: this device is SM %d; drop --sm to use it", f.problem.sm, (*rt)->sm().number())));
  }
  p.sm = (*rt)->sm();
  p.sm_count = (*rt)->device_info().sm_count;

  auto decision = (*gemm)->KernelFor(MoeGemmArgsFor(p));
  if (!decision.ok()) return PrintError(decision.status());
  const KernelEntry& kernel = *(*decision)->kernel;

  auto check = RunAndCheck(f, **rt, **gemm, p);
  if (!check.ok()) return PrintError(check.status());
  MoeGemmTuneOptions to;
  to.iterations = f.iterations;
  to.warmup = f.warmup;
  auto us = (*gemm)->TimeKernel(kernel, p, to);
  if (!us.ok()) return PrintError(us.status());
  // The rows the offsets hold: tokens, or fewer where a routed problem's experts are a
  // rank's share of the router's.
  MoeProblem ran = p;
  ran.tokens = TimingOffsets(p).back();
  const double tflops = *us > 0 ? ran.flops() / (*us * 1e-6) / 1e12 : 0;
  // Elements of A and B and the output: what must move at least once.
  const moe::MoeGemmBytes sizes = moe::MoeGemmBytesFor(
      p.weight_format, p.activation_format, p.activation, p.experts, ran.tokens, p.n, p.k);
  const double bytes = static_cast<double>(sizes.a + sizes.b + sizes.out);
  const double tbps = *us > 0 ? bytes / (*us * 1e-6) / 1e12 : 0;
  if (f.json) {
    nlohmann::json j = {{"device", (*rt)->device_name()},
                        {"kernel", kernel.name()},
                        {"from_tuning", (*decision)->from_tuning},
                        {"problem", ToString(p)},
                        {"check", {{"ok", check->ok}, {"rows", check->rows}, {"summary", check->summary}}},
                        {"time_us", *us},
                        {"tflops", tflops},
                        {"tbps", tbps}};
    std::cout << j.dump(2) << "\n";
  } else {
    std::cout << absl::StrFormat(
        "device: %s\nproblem: %s\nkernel: %s%s\ncheck: %d rows vs CPU reference: %s: %s\n"
        "time: %.1f us (median of %d), %.1f TFLOP/s, %.2f TB/s\n",
        (*rt)->device_name(), ToString(p), kernel.name(),
        (*decision)->from_tuning ? " (tuned)" : "", check->rows, check->summary,
        check->ok ? "PASS" : "FAIL", *us, f.iterations, tflops, tbps);
  }
  if (!check->ok) {
    PrintError(absl::InternalError(absl::StrCat(
        "run: ", kernel.name(), " disagrees with the CPU reference (", check->summary,
        "); report it with this command line")));
    return kExitFailure;
  }
  return kExitOk;
}

}  // namespace

void RegisterRun(CLI::App& app, Globals& g) {
  auto f = std::make_shared<RunFlags>();
  CLI::App* cmd = app.add_subcommand(
      "run", "Run a MoE GEMM problem on the GPU: random inputs, checked against the CPU "
             "reference on a sample, timed (median) in TFLOP/s");
  cmd->add_option("--manifest", f->manifest, "Manifest URL or path")->required()->type_name("URL|PATH");
  AddProblemFlags(cmd, &f->problem, /*sm_required=*/false, /*shape_required=*/false);
  cmd->add_option("--op", f->problem.op,
                  "moe_gemm (default): one grouped GEMM; moe: the routed MoE layer "
                  "(routing, sort, gather, both GEMMs, finalize)")
      ->type_name("OP");
  cmd->add_option("--top-k", f->layer.top_k, "moe: experts per token")->type_name("K");
  cmd->add_option("--hidden", f->layer.hidden, "moe: hidden size H")->type_name("H");
  cmd->add_option("--intermediate", f->layer.intermediate,
                  "moe: intermediate size I (GEMM1 has 2I rows when gated)")
      ->type_name("I");
  cmd->add_option("--routing", f->layer.routing,
                  "moe: default, renormalize (default), renormalize_naive, deepseek_v3, "
                  "llama4, topk, sigmoid, sigmoid_renorm")
      ->type_name("METHOD");
  cmd->add_option("--n-group", f->layer.n_group, "moe: deepseek_v3 expert groups");
  cmd->add_option("--topk-group", f->layer.topk_group, "moe: deepseek_v3 groups kept");
  cmd->add_option("--routed-scaling-factor", f->layer.routed_scaling_factor,
                  "moe: deepseek_v3 weight scale");
  cmd->add_option("--max-chunk-tokens", f->layer.max_chunk_tokens,
                  "moe: tokens per pass (bounds the workspace; 0: one pass)");
  cmd->add_option("--input-layout", f->layer.input_layout,
                  "moe: token_major (default), or expert_major_masked: [E, max_m, H] rows "
                  "with per-expert counts, as low-latency all-to-all libraries deliver them")
      ->type_name("LAYOUT");
  cmd->add_option("--max-m", f->layer.max_m,
                  "moe: expert_major_masked rows per expert (T = E x max_m; no --tokens)")
      ->type_name("N");
  cmd->add_option("--fuse-intermediate-quantization", f->layer.fuse_intermediate_quantization,
                  "moe, fp8 x fp8: auto (default: fused where the manifest has the kernel), "
                  "on (GEMM1's epilogue writes GEMM2's fp8 input) or off (a quantize kernel)")
      ->type_name("MODE");
  cmd->add_option("--nvfp4-gemm-inputs", f->layer.nvfp4_gemm_inputs,
                  "moe, nvfp4 x nvfp4: auto (default: decoded where the cost model prices it "
                  "faster), packed (the GEMMs read nvfp4's bytes) or decoded (bf16 values "
                  "written once by the quantize kernels)")
      ->type_name("MODE");
  cmd->add_option("--fuse-gather", f->layer.fuse_gather,
                  "moe, bf16 x bf16: auto (default: fused where the manifest has the kernel), "
                  "on (GEMM1 reads the token rows through the row map) or off (a gather "
                  "kernel copies them first)")
      ->type_name("MODE");
  cmd->add_option("--pdl", f->layer.pdl,
                  "moe: on (default: each kernel launched to overlap the previous one's tail, "
                  "programmatic dependent launch) or off (plain stream order)")
      ->type_name("on|off");
  cmd->add_option("--check-tokens", f->layer.check_tokens,
                  "moe: tokens checked against the CPU reference (default 16)");
  cmd->add_option("--kernel", f->pin, "Use this kernel (debugging)")->type_name("NAME");
  cmd->add_option("--device", f->device, "CUDA device ordinal (default 0)");
  cmd->add_option("--iterations", f->iterations, "Timed launches (default 20)");
  cmd->add_option("--warmup", f->warmup, "Launches before timing (default 3)");
  cmd->add_option("--check-rows", f->check_rows, "Output rows checked (default 32)");
  cmd->add_option("--seed", f->seed, "Seed of the random inputs");
  cmd->add_flag("--allow-inexact", f->allow_inexact,
                "Also consider kernels that round an operand on purpose (manifest "
                "\"exact\": false)");
  cmd->add_flag("--json", f->json, "Print the result as JSON");
  cmd->add_flag("--offline", f->offline, "No network: the manifest and kernels must be cached");
  cmd->add_option("--cache", f->cache, "Cache directory")->type_name("DIR");
  AddTrustFlags(cmd, &f->trust);
  cmd->callback([f, &g] { g.exit_code = RunRun(*f); });
}

}  // namespace cubist::cli
