#include "dispatch/cost_model.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_format.h"
#include "kernels/moe_gemm_layout.h"

namespace cubist {
namespace {

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

DeviceInfo DeviceInfo::ForSm(DeviceSm sm) {
  DeviceInfo d;
  d.sm = sm;
  if (sm.major == 10) {
    d.sm_count = 148;
    d.bf16_tflops = 2250;
    d.fp8_tflops = 4500;
    d.memory_tbps = 7.7;
  } else if (sm.major == 12) {
    d.sm_count = 84;
    d.shared_mem_per_sm = 100 * 1024;
    d.max_threads_per_sm = 1536;
    d.bf16_tflops = 210;
    d.fp8_tflops = 420;
    d.memory_tbps = 1.8;
  }
  return d;
}

DeviceInfo DeviceForProblem(const MoeProblem& problem) {
  DeviceInfo d = DeviceInfo::ForSm(problem.sm);
  if (problem.sm_count > 0) d.sm_count = problem.sm_count;
  return d;
}

CostEstimate EstimateCost(const KernelEntry& kernel, const MoeProblem& p,
                          const DeviceInfo& device) {
  const KernelSpec& s = kernel.spec;
  const int64_t tm = std::max(1, s.tile_m);
  const int64_t tn = std::max(1, s.tile_n);
  const int64_t tk = std::max(1, s.tile_k);
  CostEstimate c;

  // The experts with rows (`active`), the mean rows of each, and the m tiles of all of
  // them. Balanced (routed_top_k 0): every expert with rows gets the average; the tail
  // expert's rounding is ignored since it is the same for every candidate. Fewer rows
  // than experts (a decode step: one token of Mixtral-8x7B is 2 rows over 8 experts)
  // touch at most one expert per row: counting every expert's tiles there had the grid
  // look full when a quarter of it ran (and kept the narrower tiles that fill it from
  // winning). Routed: each expert's rows are binomial (dispatch/routed_load.h), so the
  // tiles are their expectation - an expert whose rows just pass a tile's run a second,
  // nearly empty one, which a tile twice as tall would not.
  // `rows`: the rows read and written, the offsets' total - which, routed over a rank's
  // share of the experts, is that share of tokens.
  // `m_work`: the tiles' worth of rows the tensor cores compute - m_tiles, less the steps
  // of each expert's last tile that hold no row, for kernels computing rows in steps
  // (KernelEntry::row_step).
  const int64_t step = kernel.row_step > 0 && kernel.row_step < tm ? kernel.row_step : tm;
  const double step_share = static_cast<double>(step) / static_cast<double>(tm);
  double active = 0, rows = 0, m_tiles = 0, m_work = 0;
  if (p.routed_top_k > 0) {
    const RoutedLoad load = p.routed_load();
    active = static_cast<double>(p.experts) * load.TouchedChance();
    rows = static_cast<double>(p.experts) * load.MeanRowsPerExpert();
    auto tiles_of = [&](int64_t size) {  // all experts' tiles of `size` rows
      return static_cast<double>(p.experts) * load.ExpectedTilesPerExpert(size);
    };
    m_tiles = tiles_of(tm);
    m_work = step == tm ? m_tiles : tiles_of(step) * step_share;
  } else {
    const int64_t touched = std::max<int64_t>(1, std::min(p.experts, p.tokens));
    const double m = p.experts > 0 ? static_cast<double>(p.tokens) / touched : 0;
    active = static_cast<double>(touched);
    rows = static_cast<double>(p.tokens);
    auto tiles_of = [&](int64_t size) {
      return static_cast<double>(touched * static_cast<int64_t>(std::ceil(m / size)));
    };
    m_tiles = tiles_of(tm);
    m_work = step == tm ? m_tiles : tiles_of(step) * step_share;
  }
  const int64_t n_tiles = CeilDiv(p.n, tn);
  const int64_t k_iters = CeilDiv(p.k, tk);
  int64_t cluster = int64_t{s.cluster[0]} * s.cluster[1] * s.cluster[2];
  cluster = std::max<int64_t>(cluster, 1);
  // (Routed: the expected count over all of them, then whole CTAs.)
  const int64_t tiles =
      static_cast<int64_t>(std::ceil(m_tiles * static_cast<double>(n_tiles) - 1e-6));
  c.ctas = CeilDiv(tiles, cluster) * cluster;

  c.efficiency_m = m_work > 0 ? rows / (m_work * tm) : 1.0;
  c.efficiency_n = static_cast<double>(p.n) / (n_tiles * tn);
  c.efficiency_k = static_cast<double>(p.k) / (k_iters * tk);

  // About 1 KiB of each SM's shared memory is reserved per resident block.
  int by_threads = device.max_threads_per_sm / std::max(32, s.threads);
  int by_smem = s.shared_mem_bytes > 0
                    ? device.shared_mem_per_sm / (s.shared_mem_bytes + 1024)
                    : 32;
  c.ctas_per_sm = std::clamp(std::min(by_threads, by_smem), 1, 32);
  const int64_t slots = int64_t{device.sm_count} * c.ctas_per_sm;
  c.waves = c.ctas > 0 ? static_cast<double>(CeilDiv(c.ctas, slots)) : 0.0;

  const bool fp8 = moe::UsesFp8Mma(kernel.weight_format, kernel.activation_format);
  const double peak_per_sm =
      (fp8 ? device.fp8_tflops : device.bf16_tflops) * 1e12 / device.sm_count;
  const double x = static_cast<double>(tm * tn) / static_cast<double>(tm + tn);
  const double tile_factor = x / (x + 16.0);
  const double cta_flops = 2.0 * tm * tn * k_iters * tk;
  // The CTAs the busiest SM runs, one after another at the SM's rate: whole waves hold
  // ctas_per_sm per SM each; a grid of at most one wave spreads over the SMs first, so its
  // busiest SM holds ceil(ctas / SMs). (Counting a full wave there made 64 CTAs on 132
  // SMs cost as much as 264, and a tile that halves them look no faster.)
  const int64_t per_sm = c.ctas > slots ? static_cast<int64_t>(c.waves) * c.ctas_per_sm
                                        : CeilDiv(c.ctas, device.sm_count);
  // (Tiles with empty steps take their share of the busiest SM's time: m_work / m_tiles.)
  const double work_share = m_tiles > 0 ? m_work / m_tiles : 1.0;
  c.compute_us = static_cast<double>(per_sm) * work_share * cta_flops /
                 (peak_per_sm * tile_factor * kernel.mma_efficiency) * 1e6;

  const double bytes =
      active * static_cast<double>(p.n) * p.k * BitsPerElement(p.weight_format) / 8 +
      rows * p.k * BitsPerElement(p.activation_format) / 8 + rows * p.output_n() * 2.0;
  const double busy = std::min(1.0, static_cast<double>(c.ctas) / device.sm_count);
  c.memory_us = c.ctas > 0 ? bytes / (device.memory_tbps * 1e12 * busy *
                                       kernel.memory_efficiency) * 1e6
                           : 0.0;
  c.time_us = std::max(c.compute_us, c.memory_us);
  // More experts than one launch schedules: MoeGemm launches once per group of experts;
  // each further launch adds its start and its last wave's tail (an estimate, not fitted).
  const int64_t per_launch = kernel.constraints.max_experts;
  if (per_launch > 0 && p.experts > per_launch) {
    c.launches = static_cast<int>(CeilDiv(p.experts, per_launch));
    c.time_us += (c.launches - 1) * kExtraLaunchUs;
  }
  return c;
}

std::string CostEstimate::ToString() const {
  return absl::StrFormat(
      "%.1f us (compute %.1f, memory %.1f), %d CTAs, %.0f waves of %d/SM, efficiency "
      "m %.2f n %.2f k %.2f%s",
      time_us, compute_us, memory_us, ctas, waves, ctas_per_sm, efficiency_m,
      efficiency_n, efficiency_k,
      launches > 1 ? absl::StrFormat(", %d launches", launches) : "");
}

}  // namespace cubist
