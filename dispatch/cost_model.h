// The analytic cost model that ranks the kernels able to solve a problem.
//
// For a kernel with tile (tm, tn, tk) and a problem of E experts, T tokens (m = T/E on
// average, assumed even), N and K:
//   m tiles   = E * ceil(m / tm)          n tiles = ceil(N / tn)
//               (a routed problem, MoeProblem::routed_top_k: E * E[ceil(X / tm)] with X
//               each expert's binomial rows, dispatch/routed_load.h; the weights read
//               are those of the E * P(X >= 1) experts expected to have rows)
//   CTAs      = m tiles * n tiles, rounded up to whole clusters
//   CTAs/SM   = min(threads limit, shared memory limit, 32), at least 1
//   waves     = ceil(CTAs / (SMs * CTAs/SM))
//   efficiency in M, N, K = useful / padded extent (m / (ceil(m/tm) * tm), ...)
//   compute   = waves * CTAs/SM * 2*tm*tn*ceil(K/tk)*tk /
//               (peak per SM * tile factor * mma_efficiency),
//               tile factor = x / (x + 16), x = tm*tn / (tm + tn) (operand reuse)
//   memory    = (unique bytes of A, B, scales and output) /
//               (bandwidth * min(1, CTAs/SMs) * memory_efficiency)
// mma_efficiency and memory_efficiency are the kernel's calibration (manifest extras,
// measured on the H200 and written by scripts/build-artifacts; 1 when absent).
//   time      = max(compute, memory)
// It captures wave quantisation, padding waste in each dimension, operand reuse of big
// tiles and the bandwidth a too-small grid leaves unused; it is a ranking, not a
// prediction. Autotuning (autotuner.h) replaces it with measurements on request.
//
// Pure functions; thread-safe.
#ifndef CUBIST_DISPATCH_COST_MODEL_H_
#define CUBIST_DISPATCH_COST_MODEL_H_

#include <cstdint>
#include <string>

#include "dispatch/problem.h"
#include "dispatch/registry.h"

namespace cubist {

// What the model needs to know about the device.
struct DeviceInfo {
  DeviceSm sm;
  int sm_count = 132;
  int shared_mem_per_sm = 228 * 1024;  // bytes usable by resident blocks
  int max_threads_per_sm = 2048;
  // Dense matrix rates of an H200, round figures (docs/benchmarks.md measured 782 and 1440).
  double bf16_tflops = 800;
  double fp8_tflops = 1270;
  double memory_tbps = 4.3;  // device copy bandwidth, bytes read + written

  // Defaults for a compute capability: 9.0 is an H100/H200 (132 SMs); 10.0 a B200
  // (148); others get Hopper's figures with their SM count left at 132 unless known.
  static DeviceInfo ForSm(DeviceSm sm);
};

// The device a problem describes: DeviceInfo::ForSm(problem.sm) with problem.sm_count
// when it is set.
DeviceInfo DeviceForProblem(const MoeProblem& problem);

// What one more launch of a problem split by experts costs (its start and its last
// wave's tail): an estimate, not fitted.
inline constexpr double kExtraLaunchUs = 3.0;

struct CostEstimate {
  int64_t ctas = 0;
  int ctas_per_sm = 1;
  double waves = 0;  // ceil'd: the number of rounds the grid needs
  double efficiency_m = 1;
  double efficiency_n = 1;
  double efficiency_k = 1;
  double compute_us = 0;
  double memory_us = 0;
  double time_us = 0;  // the ranking key
  int launches = 1;    // one per group of max_experts experts

  // "12.3 us (compute 12.3, memory 4.1), 1280 CTAs, 5 waves of 132x2, efficiency
  // m 0.50 n 1.00 k 1.00"
  std::string ToString() const;
};

// The estimate for `kernel` (which must have passed the filters) on `problem`.
CostEstimate EstimateCost(const KernelEntry& kernel, const MoeProblem& problem,
                          const DeviceInfo& device);

}  // namespace cubist

#endif  // CUBIST_DISPATCH_COST_MODEL_H_
