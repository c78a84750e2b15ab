// The mxfp4 x bf16 moe_gemm kernels of ABI version 2 for sm_90a: packed weights decoded
// straight into wgmma's A registers. One kernel per cubin, built by scripts/build-artifacts
// with
//   -DMOE_ACT=kSwiglu -DMOE_TM=8 -DMOE_TN=128 -DMOE_STAGES=6
//   -DMOE_NAME=moe_gemm_tma_mxfp4_bf16_swiglu_m8n128k256
// and -gencode=arch=compute_90a,code=sm_90a. Contract: kernels/moe_gemm_abi.h (version 2);
// shared memory: MakeFp4Layout in kernels/moe_gemm_layout.h; docs/kernels.md explains it.
//
// Operands are swapped against the problem: the weight rows (N) are the MMA's M, 64 per
// consumer warpgroup, and the tokens of the tile (tile_m, 8 to 64) its N. That makes a
// decode step with 8 tokens per expert a full-width MMA instead of 1/8 of one, and it lets
// each consumer thread decode exactly the weight elements its A fragment holds:
//   - the producer (one thread) copies each k-tile's packed weights (128 bytes of K per row)
//     and the tile's activations (four 64-element panels) with TMA, 128-byte swizzled;
//   - a consumer thread reads, per 32-element scale block, the 16 bytes of its two rows
//     (one shared-memory load each, shared by the four threads of a quad), gathers its
//     byte of each word (prmt), decodes 8 e2m1 times the ue8m0 scale into four bf16 pairs
//     (exact), and issues two wgmma m64nTTk16 with those registers as A and the activation
//     panel in shared memory as B;
//   - the ue8m0 scale bytes of its two rows come from global memory, one k-tile ahead;
//   - the epilogue goes through shared memory to put x0 next to x1 (gated) and to store
//     16 bytes of a token's row at a time.
// Scheduling is generation 2's persistent one (kernels/moe_gemm_tma_common.cuh) over
// (token tile, weight-row tile).
#include <cuda_bf16.h>
#include <stdint.h>

#include "kernels/moe_gemm_abi.h"
#include "kernels/moe_gemm_device.cuh"
#include "kernels/moe_gemm_layout.h"
#include "kernels/moe_gemm_tma_common.cuh"
#include "kernels/wgmma_ops.cuh"

#if !defined(MOE_ACT) || !defined(MOE_TM) || !defined(MOE_TN) || !defined(MOE_STAGES) || \
    !defined(MOE_NAME)
#error "define MOE_ACT MOE_TM MOE_TN MOE_STAGES MOE_NAME"
#endif

namespace cubist::moe {
namespace {

// Byte c (0..3) of each word of q, as one word: [x.c, y.c, z.c, w.c].
__device__ __forceinline__ uint32_t GatherByte(uint4 q, uint32_t sel) {
  return Prmt(Prmt(q.x, q.y, sel), Prmt(q.z, q.w, sel), 0x5410);
}
__device__ __forceinline__ uint4 LdShared128(uint32_t addr) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(addr));
  return v;
}
__device__ __forceinline__ void PinRegs(uint32_t (&a)[4], uint32_t (&b)[4], uint64_t& d0,
                                        uint64_t& d1) {
  asm volatile("" : "+r"(a[0]), "+r"(a[1]), "+r"(a[2]), "+r"(a[3]), "+r"(b[0]), "+r"(b[1]),
                    "+r"(b[2]), "+r"(b[3]), "+l"(d0), "+l"(d1)::"memory");
}
// Synchronises the consumer warpgroups (not the producer): named barrier 1.
template <int kThreads>
__device__ __forceinline__ void ConsumerSync() {
  asm volatile("bar.sync 1, %0;\n" ::"n"(kThreads) : "memory");
}

template <MoeActivation ACT, int TT, int W, int ST>
struct MoeGemmFp4 {
  static constexpr MoeGemmFp4Layout L = MakeFp4Layout(kMxfp4, kBf16, TT, W, ST);
  static_assert(L.error == nullptr, "invalid moe_gemm_fp4 configuration (moe_gemm_layout.h)");
  static constexpr int kThreads = L.threads;
  static constexpr int kConsumers = L.consumers;
  static constexpr int kConsumerThreads = 128 * kConsumers;
  static constexpr bool kGated = IsGated(ACT);
  static constexpr int kWRows = MoeGemmTmaBRows(W, ACT);  // weight rows per TMA box
  using Mma = WgmmaRs<TT>;
  static constexpr int kEpTokens = L.epilogue_tokens;
  static constexpr int kRegs = Mma::kRegs;

  __device__ static void Run(const MoeGemmParamsV2& pv) {
    const MoeGemmParams& p = pv.g;
    extern __shared__ uint8_t smem_raw[];
    uint8_t* smem = reinterpret_cast<uint8_t*>(
        (reinterpret_cast<uintptr_t>(smem_raw) + kSmemAlign - 1) & ~uintptr_t{kSmemAlign - 1});
    const uint32_t smem_base = SmemAddr(smem);
    const uint32_t full_bar = smem_base + L.barrier_offset;
    const uint32_t empty_bar = full_bar + 8 * ST;
    int* off = reinterpret_cast<int*>(smem + L.sched_offset);
    int* pre = off + kMoeGemmTmaMaxExperts + 1;
    const int E = p.num_experts;
    if (E < 1 || E > kMoeGemmTmaMaxExperts) return;

    const int64_t m_tiles =
        PipelinePrologue<ST>(pv, full_bar, empty_bar, kConsumers, TT, off, pre);
    const int64_t n_tiles = MoeGemmNTiles(p.n, ACT, W);
    const int64_t tiles = m_tiles * n_tiles;
    const int num_kt = (p.k + kMoeGemmFp4KTile - 1) / kMoeGemmFp4KTile;
    const int wg = threadIdx.x / 128;

    if (wg == 0) {
      if (threadIdx.x != 0) return;
      StageRing<ST> ring;
      for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
        const MoeTile t = TileAt(tile, m_tiles, n_tiles, E, TT, off, pre);
        const int w_row = t.e * p.n + t.n_tile * kWRows;
        for (int kt = 0; kt < num_kt; ++kt) {
          MbarWait(empty_bar + 8 * ring.s, ring.phase ^ 1);
          const uint32_t full = full_bar + 8 * ring.s;
          const uint32_t w_dst = smem_base + ring.s * L.stage_bytes;
          const uint32_t a_dst = w_dst + L.w_stage_bytes;
          // Activation panels wholly past K are not copied (the consumers skip them).
          const int panels = min(4, (p.k - kt * kMoeGemmFp4KTile + 63) / 64);
          MbarArriveExpectTx(full, L.w_stage_bytes + panels * TT * kMoeGemmTmaBoxBytes);
          // Weights: 128 bytes (256 elements) of K per row; the gate half N/2 rows down.
          TmaLoad2d(w_dst, &pv.b_map, kt * kMoeGemmTmaBoxBytes, w_row, full);
          if constexpr (kGated) {
            TmaLoad2d(w_dst + kWRows * kMoeGemmTmaBoxBytes, &pv.b_map,
                      kt * kMoeGemmTmaBoxBytes, w_row + p.n / 2, full);
          }
#pragma unroll
          for (int panel = 0; panel < 4; ++panel) {
            if (panel >= panels) break;
            TmaLoad2d(a_dst + panel * TT * kMoeGemmTmaBoxBytes, &pv.a_map,
                      kt * kMoeGemmFp4KTile + panel * 64, t.row_begin, full);
          }
          ring.Advance();
        }
      }
      return;
    }

    const int ci = wg - 1;
    const int lane = threadIdx.x % 32, warp = (threadIdx.x % 128) / 32;
    const bool signals = threadIdx.x % 128 == 0;
    // This thread's two weight rows within the tile (the A fragment's rows g and g+8).
    const int r_a = ci * 64 + warp * 16 + lane / 4;
    const int r_b = r_a + 8;
    const uint32_t sel = (lane % 4) | ((4 + lane % 4) << 4);
    const int kb = p.k / 32;  // scale bytes per weight row
    float* ep = reinterpret_cast<float*>(smem + L.epilogue_offset);
    const uint8_t* b_scale = static_cast<const uint8_t*>(p.b_scale);
    const int64_t weight_rows = static_cast<int64_t>(p.num_experts) * p.n;
    StageRing<ST> ring;
    float acc[kRegs];
    for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
      const MoeTile t = TileAt(tile, m_tiles, n_tiles, E, TT, off, pre);
      // This thread's two weight rows in B and their ue8m0 scale rows (rows past the
      // last expert are clamped: their outputs are never stored).
      auto scale_row = [&](int r) {
        const int half = kGated && r >= kWRows ? 1 : 0;
        int64_t g = static_cast<int64_t>(t.e) * p.n + t.n_tile * kWRows + (r - half * kWRows) +
                    (half ? p.n / 2 : 0);
        g = g < weight_rows ? g : weight_rows - 1;
        return b_scale + g * kb;
      };
      const uint8_t* sc_a = scale_row(r_a);
      const uint8_t* sc_b = scale_row(r_b);
      // The scale bytes of k-tile 0, then each k-tile loads the next one's.
      uint32_t sa[8], sb[8];
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        sa[j] = j < kb ? __ldg(sc_a + j) : 0u;
        sb[j] = j < kb ? __ldg(sc_b + j) : 0u;
      }

#pragma unroll
      for (int i = 0; i < kRegs; ++i) acc[i] = 0.0f;
      int prev = -1;
      for (int kt = 0; kt < num_kt; ++kt) {
        uint32_t na[8], nb[8];
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          const int blk = (kt + 1) * 8 + j;
          na[j] = blk < kb ? __ldg(sc_a + blk) : 0u;
          nb[j] = blk < kb ? __ldg(sc_b + blk) : 0u;
        }
        MbarWait(full_bar + 8 * ring.s, ring.phase);
        const uint32_t w_base = smem_base + ring.s * L.stage_bytes;
        const uint32_t a_base = w_base + L.w_stage_bytes;
#pragma unroll
        for (int j = 0; j < 8; ++j) {  // 32-element scale blocks
          // Blocks past K are skipped whole (the producer copied no activations there).
          if (kt * 8 + j >= kb) break;
          const __nv_bfloat162 s_a = Ue8m0ToBf16x2(sa[j]);
          const __nv_bfloat162 s_b = Ue8m0ToBf16x2(sb[j]);
          const uint4 q_a = LdShared128(w_base + r_a * 128 + ((j ^ (r_a & 7)) << 4));
          const uint4 q_b = LdShared128(w_base + r_b * 128 + ((j ^ (r_b & 7)) << 4));
          const uint4 d_a = DecodeE2m1x8(GatherByte(q_a, sel), s_a);
          const uint4 d_b = DecodeE2m1x8(GatherByte(q_b, sel), s_b);
          // k16 steps 2j and 2j+1 of the k-tile: elements 2c.., 8+2c.. of each half.
          uint32_t f0[4] = {d_a.x, d_b.x, d_a.y, d_b.y};
          uint32_t f1[4] = {d_a.z, d_b.z, d_a.w, d_b.w};
          const uint32_t b_addr = a_base + (j / 2) * TT * kMoeGemmTmaBoxBytes + (j % 2) * 64;
          uint64_t desc0 = Desc(b_addr), desc1 = Desc(b_addr + 32);
          PinRegs(f0, f1, desc0, desc1);
          WgmmaFence();
          Mma::Mma(acc, f0, desc0, 1);
          Mma::Mma(acc, f1, desc1, 1);
          WgmmaCommit();
          // One group in flight: the previous block's A registers are free again, and
          // after block 0 every wgmma of the previous k-tile has read its stage.
          WgmmaWait<1>();
          if (j == 0 && prev >= 0 && signals) MbarArrive(empty_bar + 8 * prev);
        }
        prev = ring.s;
        ring.Advance();
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          sa[j] = na[j];
          sb[j] = nb[j];
        }
      }
      WgmmaWait<0>();
      FenceRegs(acc);
      if (prev >= 0 && signals) MbarArrive(empty_bar + 8 * prev);

      // 3. Epilogue: accumulators (weight rows x tokens) into shared memory as
      //    [token][tile row], at most 64 tokens at a time, then each consumer thread
      //    writes 8 output columns of a token.
#pragma unroll
      for (int part = 0; part < TT / kEpTokens; ++part) {
#pragma unroll
        for (int g = 0; g < TT / 8; ++g) {
          if (g / (kEpTokens / 8) != part) continue;  // resolved at compile time
          const int tok = g * 8 + (lane % 4) * 2 - part * kEpTokens;
          ep[tok * W + r_a] = acc[g * 4 + 0];
          ep[(tok + 1) * W + r_a] = acc[g * 4 + 1];
          ep[tok * W + r_b] = acc[g * 4 + 2];
          ep[(tok + 1) * W + r_b] = acc[g * 4 + 3];
        }
        ConsumerSync<kConsumerThreads>();
        StoreFromShared(p, t, ep, part * kEpTokens);
        // ep is written again only after every thread has read it.
        ConsumerSync<kConsumerThreads>();
      }
    }
  }

  // Tokens first_tok .. first_tok + kEpTokens - 1 of the tile, staged in ep.
  __device__ static void StoreFromShared(const MoeGemmParams& p, const MoeTile& t,
                                         const float* ep, int first_tok) {
    ActParams q{1.0f, ACT == kSitu ? 1.0f : 0.0f, __int_as_float(0x7f800000)};
    if constexpr (kGated) {
      if (p.alpha != nullptr) q.alpha = __ldg(p.alpha + t.e);
      if (p.beta != nullptr) q.beta = __ldg(p.beta + t.e);
      if (p.limit != nullptr) q.limit = __ldg(p.limit + t.e);
    }
    constexpr int kOutCols = kGated ? W / 2 : W;
    constexpr int kGroups = kOutCols / 8;
    const int n_out = MoeGemmOutCols(p.n, ACT);
    __nv_bfloat16* out = static_cast<__nv_bfloat16*>(p.out);
    for (int item = threadIdx.x - 128; item < kEpTokens * kGroups; item += kConsumerThreads) {
      const int tok = item / kGroups, grp = item % kGroups;
      const int row = t.row_begin + first_tok + tok;
      const int col = t.n_tile * kOutCols + grp * 8;
      if (row >= t.row_end || col >= n_out) continue;
      const float* x0 = ep + tok * W + grp * 8;
      uint32_t packed[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        float v0, v1;
        if constexpr (kGated) {
          v0 = Act<ACT>(x0[2 * i], x0[kOutCols + 2 * i], q);
          v1 = Act<ACT>(x0[2 * i + 1], x0[kOutCols + 2 * i + 1], q);
        } else {
          v0 = Act<ACT>(x0[2 * i], 0.0f, q);
          v1 = Act<ACT>(x0[2 * i + 1], 0.0f, q);
        }
        packed[i] = Bits(__floats2bfloat162_rn(v0, v1));
      }
      *reinterpret_cast<uint4*>(out + static_cast<int64_t>(row) * n_out + col) =
          make_uint4(packed[0], packed[1], packed[2], packed[3]);
    }
  }
};

}  // namespace
}  // namespace cubist::moe

using MoeFp4Kernel = cubist::moe::MoeGemmFp4<cubist::moe::MOE_ACT, MOE_TM, MOE_TN, MOE_STAGES>;

extern "C" __global__ void __launch_bounds__(MoeFp4Kernel::kThreads,
                                             MoeFp4Kernel::L.ctas_per_sm)
    MOE_NAME(const __grid_constant__ cubist::moe::MoeGemmParamsV2 p) {
  MoeFp4Kernel::Run(p);
}
