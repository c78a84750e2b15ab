// The moe_gemm kernel family for sm_90a: one templated source, one kernel per cubin.
// scripts/build-artifacts compiles it once per configuration with
//   -DMOE_WFMT=kMxfp4 -DMOE_AFMT=kBf16 -DMOE_ACT=kSwiglu -DMOE_TM=64 -DMOE_TN=128
//   -DMOE_TK=128 -DMOE_STAGES=5 -DMOE_NAME=moe_gemm_mxfp4_bf16_swiglu_m64n128k128
// and -gencode=arch=compute_90a,code=sm_90a. The contract (parameters, grid, shapes,
// alignment) is kernels/moe_gemm_abi.h; the shared-memory map is
// kernels/moe_gemm_layout.h; docs/kernels.md explains the design.
//
// One CTA computes a tile_m x tile_n block of C for one expert: tile_m/64 warpgroups,
// each owning 64 rows and all tile_n columns in registers (wgmma m64nNk16 / k32).
// Operands flow global -> shared memory through a cp.async pipeline `stages` deep;
// fp4 and mxfp8 operands are decoded in registers into bf16 panels on the way.
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <stdint.h>

#include "kernels/moe_gemm_abi.h"
#include "kernels/moe_gemm_device.cuh"
#include "kernels/moe_gemm_layout.h"
#include "kernels/wgmma_ops.cuh"

#if !defined(MOE_WFMT) || !defined(MOE_AFMT) || !defined(MOE_ACT) || !defined(MOE_TM) || \
    !defined(MOE_TN) || !defined(MOE_TK) || !defined(MOE_STAGES) || !defined(MOE_NAME)
#error "define MOE_WFMT MOE_AFMT MOE_ACT MOE_TM MOE_TN MOE_TK MOE_STAGES MOE_NAME"
#endif

namespace cubist::moe {
namespace {

// ---------------------------------------------------------------------------------

template <MoeFormat WF, MoeFormat AF, MoeActivation ACT, int TM, int TN, int TK, int ST>
struct MoeGemm {
  static constexpr MoeGemmLayout L = MakeLayout(WF, AF, TM, TN, TK, ST);
  static_assert(L.error == nullptr, "invalid moe_gemm configuration (moe_gemm_layout.h)");
  static constexpr int kThreads = L.threads;
  // Warpgroups that own accumulators (64 rows each); decoded kernels with tile_m 64 add
  // one warpgroup that only loads and decodes.
  static constexpr int kMmaWgs = TM / 64;
  static constexpr bool kFp8 = L.fp8_mma;
  static constexpr bool kGated = IsGated(ACT);
  static constexpr bool kDecodeA = !L.a.direct;
  static constexpr bool kDecodeB = !L.b.direct;
  static constexpr bool kDecode = kDecodeA || kDecodeB;
  using Mma = Wgmma<kFp8 ? WgmmaKind::kE4m3 : WgmmaKind::kBf16, TN>;
  static constexpr int kRegs = Mma::kRegs;
  static constexpr int kKSteps = TK * (kFp8 ? 1 : 2) / 32;  // 32-byte steps per row

  struct Tile {
    int e;          // expert
    int row_begin;  // first row of A/out
    int row_end;    // one past the expert's last row (<= T)
    int n_tile;
  };

  // B row (within expert) that local tile row r reads; *valid = inside N.
  __device__ static int BRow(const MoeGemmParams& p, int n_tile, int r, bool* valid) {
    if constexpr (kGated) {
      const int half = p.n / 2;
      const int c = n_tile * (TN / 2) + (r % (TN / 2));
      *valid = c < half;
      return r < TN / 2 ? c : half + c;
    } else {
      const int c = n_tile * TN + r;
      *valid = c < p.n;
      return c;
    }
  }

  // Copies k-tile `kt` of one operand into pipeline stage memory at `stage`.
  //   rows: tile rows; row0/row_end: for A absolute rows of A (masked at row_end);
  //   for B the tile maps through BRow. base: tensor; row_bytes: bytes per full row.
  template <bool kIsA>
  __device__ static void LoadOperand(const MoeGemmParams& p, const Tile& t, uint8_t* stage,
                                     int kt) {
    constexpr OperandLayout O = kIsA ? L.a : L.b;
    constexpr MoeFormat F = kIsA ? AF : WF;
    constexpr int kRows = O.rows;
    constexpr int kBits = FormatBits(F);
    constexpr int kChunks = O.raw_row_bytes / 16;  // per row per k-tile
    constexpr int kElemsPerChunk = 128 / kBits;
    const uint8_t* base = static_cast<const uint8_t*>(kIsA ? p.a : p.b);
    const int64_t row_bytes = static_cast<int64_t>(p.k) * kBits / 8;
    const uint32_t stage_addr = SmemAddr(stage);
#pragma unroll 4
    for (int i = threadIdx.x; i < kRows * kChunks; i += kThreads) {
      const int r = i / kChunks;
      const int ch = i % kChunks;
      bool valid;
      int64_t grow;  // row index into the tensor viewed as [rows_total, K]
      if constexpr (kIsA) {
        grow = t.row_begin + r;
        valid = grow < t.row_end;
      } else {
        grow = static_cast<int64_t>(t.e) * p.n + BRow(p, t.n_tile, r, &valid);
      }
      valid = valid && (kt * TK + ch * kElemsPerChunk) < p.k;
      const uint8_t* src =
          valid ? base + grow * row_bytes + static_cast<int64_t>(kt) * (TK * kBits / 8) + ch * 16
                : base;
      const uint32_t dst = O.direct ? stage_addr + SwizzledChunk(kRows, r, ch)
                                    : stage_addr + r * O.raw_row_bytes + ch * 16;
      CpAsync16(dst, src, valid);
    }
    if constexpr (!O.direct) {
      // Block-scale bytes of this k-tile, as whole aligned 32-bit words; the decoder
      // skips the (row start & 3) leading bytes.
      const uint8_t* sbase = static_cast<const uint8_t*>(kIsA ? p.a_scale : p.b_scale);
      const int64_t srow = p.k / FormatScaleBlock(F);
      const int64_t total = (kIsA ? static_cast<int64_t>(p.num_tokens)
                                  : static_cast<int64_t>(p.num_experts) * p.n) * srow;
      const uint32_t sdst = stage_addr + kRows * O.raw_row_bytes;
#pragma unroll 2
      for (int i = threadIdx.x; i < kRows * O.scale_words; i += kThreads) {
        const int r = i / O.scale_words;
        const int w = i % O.scale_words;
        bool valid;
        int64_t grow;
        if constexpr (kIsA) {
          grow = t.row_begin + r;
          valid = grow < t.row_end;
        } else {
          grow = static_cast<int64_t>(t.e) * p.n + BRow(p, t.n_tile, r, &valid);
        }
        const int64_t off = grow * srow + static_cast<int64_t>(kt) * O.scale_bytes;
        const int64_t word = (off & ~int64_t{3}) + 4 * w;
        valid = valid && word < total;
        CpAsync4(sdst + (r * O.scale_words + w) * 4, valid ? sbase + word : sbase, valid);
      }
    }
  }

  // Decodes raw k-tile `kt` of one operand (staged at `stage`) into bf16 panels at `dec`.
  template <bool kIsA>
  __device__ static void DecodeOperand(const MoeGemmParams& p, const Tile& t,
                                       const uint8_t* stage, uint8_t* dec, int kt) {
    constexpr OperandLayout O = kIsA ? L.a : L.b;
    constexpr MoeFormat F = kIsA ? AF : WF;
    constexpr int kRows = O.rows;
    constexpr bool kFp4 = FormatBits(F) == 4;
    constexpr int kUnits = O.raw_row_bytes / 16;   // 16 raw bytes per unit
    constexpr int kElems = kFp4 ? 32 : 16;          // elements per unit
    constexpr int kBlock = FormatScaleBlock(F);
    const int64_t srow = p.k / kBlock;
    const uint8_t* scales = stage + kRows * O.raw_row_bytes;
#pragma unroll 2
    for (int i = threadIdx.x; i < kRows * kUnits; i += kThreads) {
      const int r = i / kUnits;
      const int u = i % kUnits;
      const int e0 = u * kElems;  // first element of the unit within the k-tile
      uint4 out[kElems / 8];
      if (kt * TK + e0 >= p.k) {
        // Past K: zeros, whatever the (unrelated) scale bytes there say.
#pragma unroll
        for (int c = 0; c < kElems / 8; ++c) out[c] = make_uint4(0, 0, 0, 0);
      } else {
        int64_t grow;
        if constexpr (kIsA) {
          grow = t.row_begin + r;
        } else {
          bool valid;
          grow = static_cast<int64_t>(t.e) * p.n + BRow(p, t.n_tile, r, &valid);
        }
        const int shift =
            static_cast<int>((grow * srow + static_cast<int64_t>(kt) * O.scale_bytes) & 3);
        const uint8_t* sc = scales + r * O.scale_words * 4 + shift + e0 / kBlock;
        const uint4 raw = *reinterpret_cast<const uint4*>(stage + r * O.raw_row_bytes + u * 16);
        if constexpr (F == kMxfp4) {
          const __nv_bfloat162 s = Ue8m0ToBf16x2(sc[0]);
          out[0] = DecodeE2m1x8(raw.x, s);
          out[1] = DecodeE2m1x8(raw.y, s);
          out[2] = DecodeE2m1x8(raw.z, s);
          out[3] = DecodeE2m1x8(raw.w, s);
        } else if constexpr (F == kNvfp4) {
          const __nv_bfloat162 s0 = E4m3ToBf16x2(sc[0]);
          const __nv_bfloat162 s1 = E4m3ToBf16x2(sc[1]);
          out[0] = DecodeE2m1x8(raw.x, s0);
          out[1] = DecodeE2m1x8(raw.y, s0);
          out[2] = DecodeE2m1x8(raw.z, s1);
          out[3] = DecodeE2m1x8(raw.w, s1);
        } else {  // kMxfp8
          const __nv_bfloat162 s = Ue8m0ToBf16x2(sc[0]);
          out[0] = DecodeE4m3x8(raw.x, raw.y, s);
          out[1] = DecodeE4m3x8(raw.z, raw.w, s);
        }
      }
#pragma unroll
      for (int c = 0; c < kElems / 8; ++c) {
        *reinterpret_cast<uint4*>(dec + SwizzledChunk(kRows, r, e0 / 8 + c)) = out[c];
      }
    }
  }

  __device__ static void LoadStage(const MoeGemmParams& p, const Tile& t, uint8_t* smem,
                                   int kt) {
    uint8_t* stage = smem + (kt % ST) * L.stage_bytes;
    LoadOperand<true>(p, t, stage, kt);
    LoadOperand<false>(p, t, stage + L.a.stage_bytes, kt);
  }

  // Finds this CTA's tile; returns false when it has no work.
  __device__ static bool FindTile(const MoeGemmParams& p, uint8_t* smem, Tile* t) {
    int* hdr = reinterpret_cast<int*>(smem + L.header_offset);
    const int64_t mt = MoeGemmMaxMTiles(p.num_tokens, p.num_experts, TM);
    const int64_t nt = MoeGemmNTiles(p.n, ACT, TN);
    const int64_t bid = blockIdx.x;
    if (bid >= mt * nt) return false;
    const int64_t per_group = kMoeGemmGroupM * nt;
    const int64_t first_m = bid / per_group * kMoeGemmGroupM;
    const int64_t gsize = mt - first_m < kMoeGemmGroupM ? mt - first_m : kMoeGemmGroupM;
    const int64_t in_group = bid % per_group;
    const int m_idx = static_cast<int>(first_m + in_group % gsize);
    t->n_tile = static_cast<int>(in_group / gsize);
    if (threadIdx.x < 32) {
      // Warp 0 scans offsets: lane l owns a contiguous range of experts, counts their M
      // tiles, and a warp prefix sum says which lane (then which expert) holds m_idx.
      const int lane = threadIdx.x;
      const int E = p.num_experts;
      const int T = p.num_tokens;
      const int per = (E + 31) / 32;
      const int lo = min(lane * per, E);
      const int hi = min(lo + per, E);
      auto off = [&](int e) { return min(max(__ldg(p.offsets + e), 0), T); };
      auto tiles = [](int c) { return c > 0 ? (c + TM - 1) / TM : 0; };
      int cnt = 0;
#pragma unroll 4
      for (int e = lo; e < hi; ++e) cnt += tiles(off(e + 1) - off(e));
      int incl = cnt;
#pragma unroll
      for (int d = 1; d < 32; d *= 2) {
        const int v = __shfl_up_sync(0xFFFFFFFFu, incl, d);
        if (lane >= d) incl += v;
      }
      const int excl = incl - cnt;
      const bool mine = m_idx >= excl && m_idx < incl;
      const unsigned ballot = __ballot_sync(0xFFFFFFFFu, mine);
      if (mine) {
        int local = m_idx - excl;
        for (int e = lo; e < hi; ++e) {
          const int b = off(e), c = tiles(off(e + 1) - b);
          if (local < c) {
            hdr[0] = e;
            hdr[1] = b + local * TM;
            hdr[2] = off(e + 1);
            break;
          }
          local -= c;
        }
      }
      if (ballot == 0 && lane == 0) hdr[0] = -1;
    }
    __syncthreads();
    t->e = hdr[0];
    t->row_begin = hdr[1];
    t->row_end = hdr[2];
    return t->e >= 0;
  }

  __device__ static void Run(const MoeGemmParams& p) {
    extern __shared__ uint8_t smem_raw[];
    uint8_t* smem = reinterpret_cast<uint8_t*>(
        (reinterpret_cast<uintptr_t>(smem_raw) + kSmemAlign - 1) & ~uintptr_t{kSmemAlign - 1});
    Tile t;
    if (!FindTile(p, smem, &t)) return;

    const int wg = threadIdx.x / 128;
    float acc[kRegs];
#pragma unroll
    for (int i = 0; i < kRegs; ++i) acc[i] = 0.0f;
    float tmp[kFp8 ? kRegs : 1];

    const int num_kt = (p.k + TK - 1) / TK;
#pragma unroll
    for (int s = 0; s < ST - 2; ++s) {
      if (s < num_kt) LoadStage(p, t, smem, s);
      CpAsyncCommit();
    }

    uint8_t* dec_base = smem + L.dec_offset;
    for (int kt = 0; kt < num_kt; ++kt) {
      uint8_t* stage = smem + (kt % ST) * L.stage_bytes;
      uint8_t* dec = dec_base + (kt & 1) * (L.a.dec_bytes + L.b.dec_bytes);
      CpAsyncWait<ST - 3>();
      if constexpr (kDecode) {
        __syncthreads();  // every thread's raw bytes of tile kt have landed
        if constexpr (kDecodeA) DecodeOperand<true>(p, t, stage, dec, kt);
        if constexpr (kDecodeB) {
          DecodeOperand<false>(p, t, stage + L.a.stage_bytes, dec + L.a.dec_bytes, kt);
        }
      }
      FenceProxyAsync();
      // Tile kt is complete in shared memory; every warpgroup has retired its wgmma of
      // tile kt-2 (WgmmaWait<1> below), so stage (kt-2) % ST and decoded buffer kt & 1
      // may be refilled after this point.
      __syncthreads();

      const uint32_t a_addr =
          SmemAddr(kDecodeA ? dec : stage) + wg * 64 * 128;
      const uint32_t b_addr =
          kDecodeB ? SmemAddr(dec + L.a.dec_bytes) : SmemAddr(stage + L.a.stage_bytes);
      constexpr int kAPanel = TM * 128;
      constexpr int kBPanel = TN * 128;
      if (wg < kMmaWgs) {
      WgmmaFence();
#pragma unroll
      for (int s = 0; s < kKSteps; ++s) {
        const uint64_t da = Desc(a_addr + (s >> 2) * kAPanel + (s & 3) * 32);
        const uint64_t db = Desc(b_addr + (s >> 2) * kBPanel + (s & 3) * 32);
        if constexpr (kFp8) {
          Mma::Mma(tmp, da, db, s > 0 ? 1 : 0);
        } else {
          Mma::Mma(acc, da, db, 1);
        }
      }
      WgmmaCommit();
      }

      const int next = kt + ST - 2;
      if (next < num_kt) LoadStage(p, t, smem, next);
      CpAsyncCommit();

      if (wg >= kMmaWgs) continue;
      if constexpr (kFp8) {
        // Two-level accumulation: each 128-deep k-tile's partial sum is promoted into
        // the fp32 accumulator (tensor-core fp8 accumulation keeps fewer bits), with
        // DeepSeek's block scales for fp8-block.
        float sa[2] = {1.0f, 1.0f};
        float sb[TN / 8];
#pragma unroll
        for (int g = 0; g < TN / 8; ++g) sb[g] = 1.0f;
        if constexpr (WF == kFp8Block) {
          const int kb = (p.k + 127) / 128;
          const int nb = (p.n + 127) / 128;
          const float* as = static_cast<const float*>(p.a_scale);
          const float* bs = static_cast<const float*>(p.b_scale);
          const int lane = threadIdx.x % 32, warp = (threadIdx.x % 128) / 32;
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int row = t.row_begin + wg * 64 + warp * 16 + lane / 4 + 8 * h;
            sa[h] = row < t.row_end ? __ldg(as + static_cast<int64_t>(row) * kb + kt) : 0.0f;
          }
#pragma unroll
          for (int g = 0; g < TN / 8; ++g) {
            bool valid;
            int brow = BRow(p, t.n_tile, g * 8, &valid);
            brow = min(brow, p.n - 1);
            sb[g] = __ldg(bs + (static_cast<int64_t>(t.e) * nb + brow / 128) * kb + kt);
          }
        }
        WgmmaWait<0>();
        FenceRegs(tmp);
#pragma unroll
        for (int i = 0; i < kRegs; ++i) {
          acc[i] += tmp[i] * (sa[(i >> 1) & 1] * sb[i >> 2]);
        }
      } else {
        WgmmaWait<1>();
        FenceRegs(acc);
      }
    }
    if (wg >= kMmaWgs) return;
    WgmmaWait<0>();
    FenceRegs(acc);
    Epilogue(p, t, acc);
  }

  __device__ static void Epilogue(const MoeGemmParams& p, const Tile& t, float (&acc)[kRegs]) {
    StoreTile<WF, ACT, TN>(p, t.e, t.row_begin + (threadIdx.x / 128) * 64, t.row_end, t.n_tile,
                           acc);
  }
};

}  // namespace
}  // namespace cubist::moe

using MoeKernel = cubist::moe::MoeGemm<cubist::moe::MOE_WFMT, cubist::moe::MOE_AFMT,
                                       cubist::moe::MOE_ACT, MOE_TM, MOE_TN, MOE_TK,
                                       MOE_STAGES>;

extern "C" __global__ void __launch_bounds__(MoeKernel::kThreads, 1)
    MOE_NAME(const __grid_constant__ cubist::moe::MoeGemmParams p) {
  MoeKernel::Run(p);
}
