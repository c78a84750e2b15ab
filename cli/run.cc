// cubist run: runs one MoE GEMM problem on the GPU through the engine API (Runtime +
// MoeGemm) on random operands, checks a sample of output rows against the CPU reference
// (dispatch/reference.h decoders, double accumulation) and prints the median
// time and TFLOP/s.
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <map>
#include <random>

#include <nlohmann/json.hpp>

#include "absl/strings/str_format.h"
#include "base/status_macros.h"
#include "cli/command.h"
#include "cli/common.h"
#include "cli/exit_codes.h"
#include "cli/moe_problem_flags.h"
#include "cli/run_moe_layer.h"
#include "dispatch/moe_gemm.h"
#include "dispatch/operand_fill.h"
#include "dispatch/reference.h"
#include "dispatch/runtime.h"
#include "loader/device_memory.h"

namespace cubist::cli {
namespace {

struct RunFlags {
  std::string manifest;
  std::string cache;
  ProblemFlags problem;
  std::string pin;
  int device = 0;
  int iterations = 20;
  int warmup = 3;
  int check_rows = 32;
  uint64_t seed = 1;
  bool json = false;
  bool offline = false;
  bool allow_inexact = false;
  TrustFlags trust;
  MoeLayerRunFlags layer;  // --op moe
};

// One operand as the kernel sees it, readable element by element on the host.
struct HostView {
  DataFormat format;
  OperandPattern elements, scales, global;
  HostView(DataFormat f, uint64_t seed)
      : format(f),
        elements(f, OperandKind::kElements, seed),
        scales(f, OperandKind::kBlockScales, seed + 1),
        global(f, OperandKind::kGlobalScale, seed + 2) {}

  float F32(const OperandPattern& p, size_t index) const {
    uint8_t b[4] = {p.Byte(index * 4), p.Byte(index * 4 + 1), p.Byte(index * 4 + 2),
                    p.Byte(index * 4 + 3)};
    float f;
    std::memcpy(&f, b, 4);
    return f;
  }

  // Element (row, col) of a [rows, k] matrix stored from row `row_base` on, with the
  // block-scale row `scale_row` (fp8-block B: 128x128 blocks) and global scale index.
  double Value(int64_t row, int64_t col, int64_t k, int64_t scale_row, int64_t global_index,
               int64_t block_rows_k) const {
    using namespace ::cubist::reference;
    const int64_t idx = row * k + col;
    switch (format) {
      case DataFormat::kBf16:
        return Bf16ToFloat(static_cast<uint16_t>(elements.Byte(idx * 2) |
                                                 (elements.Byte(idx * 2 + 1) << 8)));
      case DataFormat::kFp8:
        return E4m3ToFloat(elements.Byte(idx)) * F32(global, global_index);
      case DataFormat::kFp8Block:
        return E4m3ToFloat(elements.Byte(idx)) *
               F32(scales, scale_row * block_rows_k + col / 128);
      case DataFormat::kMxfp8:
        return E4m3ToFloat(elements.Byte(idx)) *
               Ue8m0ToFloat(scales.Byte(row * (k / 32) + col / 32));
      case DataFormat::kMxfp4: {
        const uint8_t byte = elements.Byte(idx / 2);
        return E2m1ToFloat(idx % 2 == 0 ? byte & 0xF : byte >> 4) *
               Ue8m0ToFloat(scales.Byte(row * (k / 32) + col / 32));
      }
      case DataFormat::kNvfp4: {
        const uint8_t byte = elements.Byte(idx / 2);
        return E2m1ToFloat(idx % 2 == 0 ? byte & 0xF : byte >> 4) *
               E4m3ToFloat(scales.Byte(row * (k / 16) + col / 16)) * F32(global, global_index);
      }
    }
    return 0;
  }
};

struct CheckResult {
  bool ok = false;
  int rows = 0;
  std::string summary;
};

absl::StatusOr<CheckResult> RunAndCheck(const RunFlags& f, Runtime& rt, MoeGemm& gemm,
                                        const MoeProblem& p) {
  DriverApi& d = rt.driver();
  const HostView av(p.activation_format, f.seed * 4 + 100);
  const HostView bv(p.weight_format, f.seed * 4 + 200);
  const int64_t nb = (p.n + 127) / 128, kb = (p.k + 127) / 128;
  const moe::MoeGemmBytes bytes = moe::MoeGemmBytesFor(
      p.weight_format, p.activation_format, p.activation, p.experts, p.tokens, p.n, p.k);
  auto alloc_fill = [&](int64_t size, const OperandPattern& pat) -> absl::StatusOr<DeviceBuffer> {
    CUBIST_ASSIGN_OR_RETURN(DeviceBuffer b, DeviceBuffer::Allocate(d, static_cast<size_t>(size)));
    CUBIST_RETURN_IF_ERROR(pat.Fill(d, b));
    return b;
  };
  CUBIST_ASSIGN_OR_RETURN(DeviceBuffer a, alloc_fill(bytes.a, av.elements));
  CUBIST_ASSIGN_OR_RETURN(DeviceBuffer b, alloc_fill(bytes.b, bv.elements));
  CUBIST_ASSIGN_OR_RETURN(DeviceBuffer as, alloc_fill(bytes.a_scale, av.scales));
  CUBIST_ASSIGN_OR_RETURN(DeviceBuffer bs, alloc_fill(bytes.b_scale, bv.scales));
  CUBIST_ASSIGN_OR_RETURN(DeviceBuffer ag, alloc_fill(bytes.a_global_scale, av.global));
  CUBIST_ASSIGN_OR_RETURN(DeviceBuffer bg, alloc_fill(bytes.b_global_scale, bv.global));
  std::vector<int32_t> offsets(p.experts + 1);
  for (int64_t e = 0; e <= p.experts; ++e) offsets[e] = static_cast<int32_t>(e * p.tokens / p.experts);
  CUBIST_ASSIGN_OR_RETURN(DeviceBuffer off, DeviceBuffer::Allocate(d, offsets.size() * 4));
  CUBIST_RETURN_IF_ERROR(off.CopyFromHost(offsets.data(), offsets.size() * 4));
  const int64_t cols = p.output_n();
  CUBIST_ASSIGN_OR_RETURN(DeviceBuffer out,
                          DeviceBuffer::Allocate(d, static_cast<size_t>(bytes.out)));
  CUBIST_RETURN_IF_ERROR(out.Fill(0xFF));  // poison: NaN bf16 everywhere unwritten

  MoeGemmArgs args = MoeGemmArgsFor(p);
  args.a = a.get();
  args.b = b.get();
  args.a_scale = as.get();
  args.b_scale = bs.get();
  args.a_global_scale = ag.get();
  args.b_global_scale = bg.get();
  args.offsets = off.get();
  args.out = out.get();
  CUBIST_RETURN_IF_ERROR(gemm.CanImplement(args));
  CUBIST_ASSIGN_OR_RETURN(Stream stream, Stream::Create(d));
  CUBIST_RETURN_IF_ERROR(gemm.Run(args, stream.get()));
  CUBIST_RETURN_IF_ERROR(stream.Synchronize());

  // Sample rows: spread over at most 8 experts so that decoding their weights stays
  // cheap, first and last rows of each included (tile edges).
  CheckResult result;
  if (p.tokens == 0) {
    result.ok = true;
    result.summary = "no tokens: nothing to check";
    return result;
  }
  std::mt19937_64 rng(f.seed);
  std::vector<int64_t> experts;
  for (int64_t e = 0; e < p.experts; ++e) {
    if (offsets[e + 1] > offsets[e]) experts.push_back(e);
  }
  std::shuffle(experts.begin(), experts.end(), rng);
  // About four sampled rows per decoded expert: decoding an expert's weights (N x K)
  // is what the check costs.
  experts.resize(std::min<size_t>(experts.size(), std::clamp(f.check_rows / 4, 1, 8)));
  std::vector<std::pair<int64_t, int64_t>> rows;  // (row, expert)
  const int per_expert = std::max<int>(1, f.check_rows / static_cast<int>(experts.size()));
  for (int64_t e : experts) {
    const int64_t lo = offsets[e], hi = offsets[e + 1];
    std::vector<int64_t> picks = {lo, hi - 1};
    for (int i = 2; i < per_expert; ++i) picks.push_back(lo + static_cast<int64_t>(rng() % (hi - lo)));
    std::sort(picks.begin(), picks.end());
    picks.erase(std::unique(picks.begin(), picks.end()), picks.end());
    for (int64_t t : picks) rows.emplace_back(t, e);
  }
  std::vector<uint16_t> got;
  std::vector<double> ref;
  std::vector<double> arow(p.k);
  std::map<int64_t, std::vector<float>> bcache;
  for (auto [t, e] : rows) {
    std::vector<float>& be = bcache[e];
    if (be.empty()) {
      be.resize(static_cast<size_t>(p.n * p.k));
      for (int64_t n = 0; n < p.n; ++n) {
        for (int64_t kk = 0; kk < p.k; ++kk) {
          be[n * p.k + kk] = static_cast<float>(
              bv.Value(e * p.n + n, kk, p.k, e * nb + n / 128, e, kb));
        }
      }
    }
    for (int64_t kk = 0; kk < p.k; ++kk) arow[kk] = av.Value(t, kk, p.k, t, 0, kb);
    std::vector<double> c(p.n);
    for (int64_t n = 0; n < p.n; ++n) {
      double s = 0;
      const float* bp = &be[n * p.k];
      for (int64_t kk = 0; kk < p.k; ++kk) s += arow[kk] * bp[kk];
      c[n] = s;
    }
    const double beta = p.activation == Activation::kSitu ? 1.0 : 0.0;
    for (int64_t j = 0; j < cols; ++j) {
      const double x0 = c[j];
      const double x1 = IsGated(p.activation) ? c[cols + j] : 0.0;
      ref.push_back(::cubist::reference::ActivationValue(
          p.activation, x0, x1, 1.0, beta, std::numeric_limits<double>::infinity()));
    }
    std::vector<uint16_t> row(cols);
    CUBIST_RETURN_IF_ERROR(out.CopyToHost(row.data(), cols * 2, static_cast<size_t>(t * cols * 2)));
    got.insert(got.end(), row.begin(), row.end());
  }
  ::cubist::reference::Comparison cmp = ::cubist::reference::CompareBf16(
      got, ref, ::cubist::reference::ToleranceFor(p.weight_format, p.activation_format));
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
  const double tflops = *us > 0 ? p.flops() / (*us * 1e-6) / 1e12 : 0;
  // Elements of A and B and the output: what must move at least once.
  const moe::MoeGemmBytes sizes = moe::MoeGemmBytesFor(
      p.weight_format, p.activation_format, p.activation, p.experts, p.tokens, p.n, p.k);
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
