// Which 128-row block scale each 8-column group of an fp8-block tile multiplies by
// (DeepSeek's 1x128 x 128x128 block scales, kernels/moe_gemm_abi.h): the rule
// kernels/moe_gemm_tma.cu's 192-column main loop (StagedScaleLoop) promotes with, in plain
// constexpr C++ so that host tests check it. Header-only, no CUDA headers.
//
// A tile's B rows are one half (MoeGemmTmaBRows rows from n_tile times that) or, gated,
// two (the gate half N/2 further down). 8-column group g of a half takes the scale of the
// block holding the half's row first + 8g, clamped to N - 1 (rows past N are computed,
// never stored): MoeGemmScaleBlockOfGroup. A half spans at most two blocks, its first (lo)
// and its last (hi), and its groups take lo then hi: groups [0, split) lo, [split, groups)
// hi (MoeGemmHalfSplit). So a promotion needs the products of a thread's two A scales with
// lo and hi, not one product per group; where the splits fall on whole units of groups
// (MoeGemmSplitsOnUnits) it picks lo or hi once per unit (MoeGemmUnitTakesLo).
#ifndef CUBIST_KERNELS_MOE_GEMM_BLOCK_SPLIT_H_
#define CUBIST_KERNELS_MOE_GEMM_BLOCK_SPLIT_H_

#include <stdint.h>

#include "kernels/moe_gemm_abi.h"

namespace cubist::moe {

inline constexpr int32_t kMoeGemmScaleBlockRows = 128;  // B rows per fp8-block scale

// The first B row of half h (0: x0 or the only half, 1: x1, gated only) of N tile n_tile;
// below N, so int32 as the kernels compute it.
CUBIST_HD constexpr int32_t MoeGemmHalfFirstRow(int32_t n, MoeActivation act, int32_t tile_n,
                                                int32_t n_tile, int h) {
  return n_tile * MoeGemmTmaBRows(tile_n, act) + (h == 1 ? n / 2 : 0);
}

// 8-column groups per half.
CUBIST_HD constexpr int MoeGemmHalfGroups(int32_t tile_n, MoeActivation act) {
  return MoeGemmTmaBRows(tile_n, act) / 8;
}

// The specification: the scale block (row / 128 of the expert's B) of 8-column group g of
// the tile (0 .. tile_n / 8 - 1, the gate half's groups after the linear half's).
CUBIST_HD constexpr int32_t MoeGemmScaleBlockOfGroup(int32_t n, MoeActivation act,
                                                     int32_t tile_n, int32_t n_tile, int g) {
  const int groups = MoeGemmHalfGroups(tile_n, act);
  const int h = IsGated(act) && g >= groups ? 1 : 0;
  const int32_t row = MoeGemmHalfFirstRow(n, act, tile_n, n_tile, h) + 8 * (g % groups);
  return (row < n - 1 ? row : n - 1) / kMoeGemmScaleBlockRows;
}

// The blocks of half h's first and last groups (equal when the half lies in one block).
CUBIST_HD constexpr int32_t MoeGemmHalfLoBlock(int32_t n, MoeActivation act, int32_t tile_n,
                                               int32_t n_tile, int h) {
  return MoeGemmScaleBlockOfGroup(n, act, tile_n, n_tile, h * MoeGemmHalfGroups(tile_n, act));
}
CUBIST_HD constexpr int32_t MoeGemmHalfHiBlock(int32_t n, MoeActivation act, int32_t tile_n,
                                               int32_t n_tile, int h) {
  return MoeGemmScaleBlockOfGroup(n, act, tile_n, n_tile,
                                  (h + 1) * MoeGemmHalfGroups(tile_n, act) - 1);
}

// The groups of half h that take lo: those whose first row lies in the half's first
// block, ignoring the clamp to N - 1 (a clamped group past the first block lands in the
// block holding row N - 1, which is then hi, or, where N - 1 lies in the first block,
// hi == lo). 1 .. groups; groups where the half does not cross a block boundary. It
// depends only on the half's first row modulo 128. Halves of at most 136 rows, and
// identity tiles of 192 (which start at row 0 or 64 of a block), span at most two blocks:
// every fp8-block tile the family builds.
CUBIST_HD constexpr int MoeGemmHalfSplit(int32_t n, MoeActivation act, int32_t tile_n,
                                         int32_t n_tile, int h) {
  const int groups = MoeGemmHalfGroups(tile_n, act);
  const int32_t first = MoeGemmHalfFirstRow(n, act, tile_n, n_tile, h);
  const int32_t to_next = kMoeGemmScaleBlockRows - first % kMoeGemmScaleBlockRows;
  const int lo_groups = (to_next + 7) / 8;
  return lo_groups < groups ? lo_groups : groups;
}

// The units of groups a half's split falls on when the halves' first rows are multiples
// of gcd(B rows per half, 128) (always for identity tiles, which start at n_tile * tile_n;
// gated ones when N/2 is such a multiple too): 4 groups (32 rows) at gated 192-column
// tiles, 8 (64 rows) at identity ones.
CUBIST_HD constexpr int MoeGemmSplitUnitGroups(int32_t tile_n, MoeActivation act) {
  const int32_t rows = MoeGemmTmaBRows(tile_n, act);
  return (rows % 128 == 0 ? 128 : rows % 64 == 0 ? 64 : rows % 32 == 0 ? 32 : 8) / 8;
}

// Whether both halves of the tile split on whole units: the kernel then decides lo or hi
// per unit (MoeGemmUnitTakesLo) from the lo and hi scales of each half; otherwise it
// stores and multiplies one B scale per group.
CUBIST_HD constexpr bool MoeGemmSplitsOnUnits(int32_t n, MoeActivation act, int32_t tile_n,
                                              int32_t n_tile) {
  const int unit = MoeGemmSplitUnitGroups(tile_n, act);
  return MoeGemmHalfSplit(n, act, tile_n, n_tile, 0) % unit == 0 &&
         (!IsGated(act) || MoeGemmHalfSplit(n, act, tile_n, n_tile, 1) % unit == 0);
}

// Whether group gi (of its half) takes lo, for a split that is a multiple of unit_groups:
// decided by the unit's first group, so that the groups of a unit share one select. The
// first unit always (a split is at least one group), units from row 128 of the half never
// (a split is at most 16 groups), the others by the split.
CUBIST_HD constexpr bool MoeGemmUnitTakesLo(int gi, int unit_groups, int split) {
  const int u0 = gi / unit_groups * unit_groups;
  return u0 == 0 || (u0 < kMoeGemmScaleBlockRows / 8 && u0 < split);
}

}  // namespace cubist::moe

#endif  // CUBIST_KERNELS_MOE_GEMM_BLOCK_SPLIT_H_
