// The fp4-weight moe_gemm kernels of ABI version 2 for sm_90a (mxfp4 x bf16, mxfp4 x mxfp8
// up to 64 tokens, nvfp4 x bf16, nvfp4 x nvfp4): packed weights decoded straight into wgmma's A
// registers (mxfp4 x mxfp8 tiles of 128 tokens: kernels/moe_gemm_fp4_fp8.cu). One kernel
// per cubin, built by scripts/build-artifacts with
//   -DMOE_WFMT=kMxfp4 -DMOE_AFMT=kBf16 -DMOE_ACT=kSwiglu -DMOE_TM=8 -DMOE_TN=128
//   -DMOE_STAGES=6 -DMOE_NAME=moe_gemm_tma_mxfp4_bf16_swiglu_m8n128k256
// and -gencode=arch=compute_90a,code=sm_90a. Contract: kernels/moe_gemm_abi.h (version 2);
// shared memory: MakeFp4Layout in kernels/moe_gemm_layout.h; docs/kernels.md explains it.
//
// Operands are swapped against the problem: the weight rows (N) are the MMA's M, 64 per
// consumer warpgroup, and the tokens of the tile (tile_m, 8 to 128) its N. That makes a
// decode step with 8 tokens per expert a full-width MMA instead of 1/8 of one, and it lets
// each consumer thread decode exactly the weight elements its A fragment holds:
//   - the producer (one thread) copies each k-tile's packed weights (128 bytes of K per row)
//     and the tile's activations (bf16: four 64-element panels; mxfp8 / nvfp4: their raw
//     bytes, two or one 128-byte boxes per row) with TMA, 128-byte swizzled;
//   - raw activations (mxfp8, nvfp4, and bf16 in 8-token tiles) are decoded (element x
//     block scale, exact in bf16) by converter warps (the producer warpgroup's other
//     three, plus a warpgroup of their own in large tiles) into bf16 panels in a permuted
//     k order, off the consumers' path; they signal a third barrier per stage;
//   - a consumer thread decodes, per 32-element k block, the 8 e2m1 of each of its two
//     rows that its A fragment holds, times the block scale (ue8m0 per 32, or e4m3 per
//     16), into four bf16 pairs (exact), and issues two wgmma m64nTTk16 with those
//     registers as A and the activation panel in shared memory as B. With permuted
//     activations the 8 elements are one word of the row (DecodeE2m1PairsOneMul: 17
//     instructions for the 8, one multiply by the scale times 2^126 per pair; mxfp4
//     stages whose scales exceed 2^0 take DecodeE2m1Pairs' two multiplies, 21, flagged
//     per stage by the converters); with TMA-copied bf16 they are byte lane % 4 of each
//     of the block's four words (a 16-byte load, three prmt, DecodeE2m1x8: about 3; nvfp4
//     weights take each 16-element half's scale, both exact in bf16);
//   - the scale bytes of its two rows: where converters run, staged by them in shared
//     memory with the stage (one load per row and k-tile); else from global memory as
//     words, one k-tile ahead;
//   - the epilogue goes through shared memory to put x0 next to x1 (gated) and to store
//     16 bytes of a token's row at a time; nvfp4's global scales are applied there.
// Scheduling is generation 2's persistent one (kernels/moe_gemm_tma_common.cuh) over
// (token tile, weight-row tile).
#include <cuda_bf16.h>
#include <stdint.h>

#include "kernels/moe_gemm_abi.h"
#include "kernels/moe_gemm_device.cuh"
#include "kernels/moe_gemm_layout.h"
#include "kernels/moe_gemm_tma_common.cuh"
#include "kernels/wgmma_ops.cuh"

#if !defined(MOE_WFMT) || !defined(MOE_AFMT) || !defined(MOE_ACT) || !defined(MOE_TM) || \
    !defined(MOE_TN) || !defined(MOE_STAGES) || !defined(MOE_NAME)
#error "define MOE_WFMT MOE_AFMT MOE_ACT MOE_TM MOE_TN MOE_STAGES MOE_NAME"
#endif

namespace cubist::moe {
namespace {

// Byte c (0..3) of each word of q, as one word: [x.c, y.c, z.c, w.c].
__device__ __forceinline__ uint32_t GatherByte(uint4 q, uint32_t sel) {
  return Prmt(Prmt(q.x, q.y, sel), Prmt(q.z, q.w, sel), 0x5410);
}
__device__ __forceinline__ void PinRegs(uint32_t (&a)[4], uint32_t (&b)[4], uint64_t& d0,
                                        uint64_t& d1) {
  asm volatile("" : "+r"(a[0]), "+r"(a[1]), "+r"(a[2]), "+r"(a[3]), "+r"(b[0]), "+r"(b[1]),
                    "+r"(b[2]), "+r"(b[3]), "+l"(d0), "+l"(d1)::"memory");
}
__device__ __forceinline__ void StShared8(uint32_t addr, uint32_t v) {
  asm volatile("st.shared.u8 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
}
// A row's k-tile of weight scale words as the converters staged them (kWords 2 or 4; the
// 16-byte case is LdShared128 / StShared128).
template <int kWords>
__device__ __forceinline__ void LdSharedWords(uint32_t addr, uint32_t (&out)[kWords]) {
  static_assert(kWords == 2 || kWords == 4, "8 or 16 bytes");
  if constexpr (kWords == 2) {
    asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];\n" : "=r"(out[0]), "=r"(out[1]) : "r"(addr));
  } else {
    const uint4 v = LdShared128(addr);
    out[0] = v.x, out[1] = v.y, out[2] = v.z, out[3] = v.w;
  }
}
template <int kWords>
__device__ __forceinline__ void StSharedWords(uint32_t addr, const uint32_t (&v)[kWords]) {
  static_assert(kWords == 2 || kWords == 4, "8 or 16 bytes");
  if constexpr (kWords == 2) {
    asm volatile("st.shared.v2.u32 [%0], {%1, %2};\n" ::"r"(addr), "r"(v[0]), "r"(v[1])
                 : "memory");
  } else {
    StShared128(addr, make_uint4(v[0], v[1], v[2], v[3]));
  }
}
__device__ __forceinline__ uint32_t LdShared32(uint32_t addr) {
  uint32_t v;
  asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(v) : "r"(addr));
  return v;
}
// The 4 kWords scale bytes row[first ..] as kWords words, read as kWords + 1 aligned
// words (scale rows need no alignment). Words that start at or past the row's end (kb
// bytes) are not read (their bytes are 0): a read never goes more than 3 bytes past the
// row. Bytes past the row inside a word that is read are whatever follows it.
// In two halves, so that a caller can issue the loads a k-tile before it aligns them
// (the alignment's shifts wait for the loads): ScaleWordsLoad then ScaleWordsAlign.
template <int kWords>
struct ScaleWords {
  uint32_t w[kWords + 1];
  uint32_t sh;  // bit offset of the first byte in w[0]
};
template <int kWords>
__device__ __forceinline__ ScaleWords<kWords> ScaleWordsLoad(const uint8_t* row, int first,
                                                             int kb) {
  const uintptr_t addr = reinterpret_cast<uintptr_t>(row + first);
  const uint32_t* wp = reinterpret_cast<const uint32_t*>(addr & ~uintptr_t{3});
  const int lead = static_cast<int>(addr & 3);
  const int avail = kb - first + lead;  // bytes of the row from wp on
  ScaleWords<kWords> r;
#pragma unroll
  for (int i = 0; i <= kWords; ++i) r.w[i] = 4 * i < avail ? __ldg(wp + i) : 0u;
  r.sh = 8u * lead;
  return r;
}
template <int kWords>
__device__ __forceinline__ void ScaleWordsAlign(const ScaleWords<kWords>& r,
                                                uint32_t (&out)[kWords]) {
#pragma unroll
  for (int i = 0; i < kWords; ++i) out[i] = __funnelshift_r(r.w[i], r.w[i + 1], r.sh);
}
template <int kWords>
__device__ __forceinline__ void LoadScaleWords(const uint8_t* row, int first, int kb,
                                               uint32_t (&out)[kWords]) {
  ScaleWordsAlign(ScaleWordsLoad<kWords>(row, first, kb), out);
}
// ue8m0 scale bytes as bf16 exponents, Ue8m0ToBf16x2's values two at a time: e[0] holds
// bytes 0 and 2 of raw[0] in its low and high half, e[1] bytes 1 and 3, e[2] and e[3] the
// same of raw[1]; block j's scale in both halves is then one prmt (Ue8m0Pair). Shifting a
// word moves four bytes at once, so a k-tile's 8 scales cost about 18 instructions instead
// of 8 multiplies and 8 special-value tests and selects, without a branch.
__device__ __forceinline__ void Ue8m0Exps(const uint32_t (&raw)[2], uint32_t (&e)[4]) {
  constexpr uint32_t kExp = 0x7F807F80u;  // bf16 exponent field of both halves
  constexpr uint32_t kLow7 = 0x7F7F7F7Fu, kBit6 = 0x00400040u;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const uint32_t r = raw[i];
    // Bit 7 of each byte: set iff the byte is neither 0 nor 0xFF (adding 0x7F to the low 7
    // bits carries into bit 7 iff they are not all 0; no carry crosses a byte).
    const uint32_t ok = (((r & kLow7) + kLow7) | r) & (((~r & kLow7) + kLow7) | ~r);
    // s << 7 in each half; the special bytes also take bit 6: 0 -> 0x0040 (2^-127),
    // 0xFF -> 0x7FC0 (NaN), as Ue8m0ToBf16x2.
    e[2 * i] = ((r << 7) & kExp) | ((~ok >> 1) & kBit6);
    e[2 * i + 1] = ((r >> 1) & kExp) | ((~ok >> 9) & kBit6);
  }
}
// Ue8m0Exps's words for DecodeE2m1PairsOneMul: the bf16 of 2^(s - 1) = 2^(s - 127) x 2^126
// per byte s. Valid when every byte is below 128 (scales up to 2^0, no special value):
// s + 126 then fits the byte and the exponent field, so one add serves four scales.
__device__ __forceinline__ void Ue8m0ExpsTimes2p126(const uint32_t (&raw)[2], uint32_t (&e)[4]) {
  constexpr uint32_t kExp = 0x7F807F80u;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const uint32_t r = raw[i] + 0x7E7E7E7Eu;
    e[2 * i] = (r << 7) & kExp;
    e[2 * i + 1] = (r >> 1) & kExp;
  }
}
// Block j's (0..7) scale of Ue8m0Exps's words, in both halves.
// (A half broadcast, which ptxas folds into the multiply that uses it as an operand
// selector instead of spending a prmt.)
__device__ __forceinline__ __nv_bfloat162 Ue8m0Pair(const uint32_t (&e)[4], int j) {
  const __nv_bfloat162 v = Bits2(e[2 * (j / 4) + j % 2]);
  return (j / 2) % 2 ? __high2bfloat162(v) : __low2bfloat162(v);
}
// The B descriptor at byte offset `off` (a multiple of 16) from the one whose low word is
// base_lo (Desc(addr)'s): the start address field is the low bits, and no shared address
// reaches its carry, so one add instead of rebuilding the descriptor.
__device__ __forceinline__ uint64_t DescPlus(uint32_t base_lo, uint32_t off) {
  const uint32_t hi = static_cast<uint32_t>(Desc(0) >> 32);  // constant
  return (static_cast<uint64_t>(hi) << 32) | (base_lo + (off >> 4));
}
// Synchronises the consumer warpgroups (not the producer): named barrier 1.
template <int kThreads>
__device__ __forceinline__ void ConsumerSync() {
  asm volatile("bar.sync 1, %0;\n" ::"n"(kThreads) : "memory");
}

template <MoeFormat WF, MoeFormat AF, MoeActivation ACT, int TT, int W, int ST>
struct MoeGemmFp4 {
  static constexpr MoeGemmFp4Layout L = MakeFp4Layout(WF, AF, TT, W, ST);
  static_assert(L.error == nullptr, "invalid moe_gemm_fp4 configuration (moe_gemm_layout.h)");
  static constexpr int kThreads = L.threads;
  static constexpr int kConsumers = L.consumers;
  static constexpr int kConsumerThreads = 128 * kConsumers;
  static constexpr bool kGated = IsGated(ACT);
  static constexpr int kWRows = MoeGemmTmaBRows(W, ACT);  // weight rows per TMA box
  using Mma = WgmmaRs<TT>;
  static constexpr int kEpTokens = L.epilogue_tokens;
  static constexpr int kRegs = Mma::kRegs;
  static constexpr bool kNv = WF == kNvfp4;
  // Scale bytes per row and k-tile, as words: mxfp4 8 ue8m0 (one per 32 elements), nvfp4
  // 16 e4m3 (one per 16).
  static constexpr int kScaleWords = kNv ? 4 : 2;
  // Raw activations (mxfp8, nvfp4): boxes per row and k-tile, 16-byte chunks per row, and
  // the converter's threads (warps 1-3 of the producer warpgroup).
  static constexpr int kRawBoxes = Fp4RawBoxes(AF, TT);
  static constexpr int kConverters = L.converters;
  // One converter item is a (token row, 32-element k block): 8 per row and k-tile.
  static constexpr int kConvItems = (TT * 8 + kConverters - 1) / kConverters;
  // Converted activations are written in the permuted k order of DecodeE2m1Pairs: the
  // consumer thread with lane % 4 == c then decodes one whole word (elements 8c..8c+7) of
  // each row's block instead of gathering a byte from each of four words. bf16
  // activations of larger tiles arrive by TMA in natural order and keep the gather.
  static constexpr bool kPermuted = kRawBoxes > 0;
  // Permuted weights decode with one multiply per bf16 pair (DecodeE2m1PairsOneMul): the
  // multiplier is the block scale times 2^126. nvfp4's e4m3 scales times 2^118 always
  // fit bf16 (kNvUnscale undoes the 2^-8); mxfp4's ue8m0 scales times 2^126 fit up to
  // 2^0, so the converters flag every stage whose weight scales hold a larger byte
  // (kScaleFlags), and the consumers decode those stages with two multiplies as before.
  static constexpr bool kScaleFlags = kPermuted && !kNv;
  // The converters stage each k-tile's weight scale words in shared memory (MakeFp4Layout),
  // and the consumers read them there instead of from global memory.
  static constexpr bool kStageScales = L.wscale_stage_bytes > 0;
  static_assert(!kStageScales || (kPermuted && L.wscale_row_bytes == 4 * kScaleWords),
                "staged scales: a row's k-tile of scale words per converter store");
  // Registers moved from the producer warpgroup to the consumers (MakeFp4Layout).
  static constexpr bool kShiftRegs = L.consumer_regs > 0;
  // nvfp4's one-multiply decodes (permuted tiles) give the weights and nvfp4 activations
  // 2^-8 of their value each; the table decode of natural-order bf16 tiles gives the
  // weights their own value. The fp32 accumulators hold the product times the inverse.
  static constexpr float kNvUnscale = (kPermuted ? 256.0f : 1.0f) * (AF == kNvfp4 ? 256.0f : 1.0f);

  // What every role of a CTA shares: shared memory, the pipeline's barriers (at + 8 *
  // stage; conv_bar only with raw activations), the scheduler's offsets and the tile
  // space (PipelinePrologue).
  struct Cta {
    const MoeGemmParamsV2& pv;
    uint8_t* smem;
    uint32_t smem_base, full_bar, empty_bar, conv_bar;
    const int* off;
    const int* pre;
    int experts;
    int64_t m_tiles, n_tiles, tiles;
    int num_kt;
  };

  // Setup, the prologue, then each thread's role: warp 0's thread 0 produces, the other
  // warps of warpgroup 0 and the extra warpgroup (if any) convert, warpgroups 1 ..
  // kConsumers consume.
  __device__ static void Run(const MoeGemmParamsV2& pv) {
    const MoeGemmParams& p = pv.g;
    extern __shared__ uint8_t smem_raw[];
    uint8_t* smem = reinterpret_cast<uint8_t*>(
        (reinterpret_cast<uintptr_t>(smem_raw) + kSmemAlign - 1) & ~uintptr_t{kSmemAlign - 1});
    const uint32_t smem_base = SmemAddr(smem);
    const uint32_t full_bar = smem_base + L.barrier_offset;
    const uint32_t empty_bar = full_bar + 8 * ST;
    const uint32_t conv_bar = empty_bar + 8 * ST;  // raw activations only
    int* off = reinterpret_cast<int*>(smem + L.sched_offset);
    int* pre = off + kMoeGemmTmaMaxExperts + 1;
    const int E = p.num_experts;
    if (E < 1 || E > kMoeGemmTmaMaxExperts) return;

    if constexpr (kRawBoxes > 0) {
      // Initialised before the prologue's fence and barrier, by the same thread.
      if (threadIdx.x == 0) {
        for (int s = 0; s < ST; ++s) {
          MbarInit(conv_bar + 8 * s, kConverters);
          // Bytes of converter warps that check no rows stay 0.
          reinterpret_cast<uint32_t*>(smem + L.flag_offset)[s] = 0;
        }
      }
    }
    // Settled inputs: the first tile's weights for the first stages go out before the
    // wait for the previous kernel (PipelinePrologue); Produce then adds the activations.
    auto pre_wait = [&](int64_t m_tiles) {
      PreIssueWeights(pv, m_tiles, off, pre, full_bar, smem_base);
    };
    const int64_t m_tiles =
        PipelinePrologue<ST>(pv, full_bar, empty_bar, kConsumers, TT, off, pre, 1, pre_wait);
    const int64_t n_tiles = MoeGemmNTiles(p.n, ACT, W);
    const Cta c{pv, smem, smem_base, full_bar, empty_bar, conv_bar, off, pre, E, m_tiles, n_tiles,
                m_tiles * n_tiles, (p.k + kMoeGemmFp4KTile - 1) / kMoeGemmFp4KTile};
    const int wg = threadIdx.x / 128;
    if (wg == 0 || wg > kConsumers) {
      if constexpr (kShiftRegs) SetMaxRegsDec<L.producer_regs>();
      if (threadIdx.x >= 32) {
        // Converters: warps 1-3 of warpgroup 0, then the extra warpgroup if any.
        const int ct = wg == 0 ? threadIdx.x - 32 : threadIdx.x - 128 * kConsumers - 32;
        if constexpr (kRawBoxes > 0) Convert(c, ct);
        return;
      }
      if (threadIdx.x == 0) Produce(c);
      return;
    }
    if constexpr (kShiftRegs) SetMaxRegsInc<L.consumer_regs>();
    Consume(c, wg - 1);
  }

  // The producer (thread 0): per stage, waits for `empty` (the consumers released it) and
  // issues its TMA copies (IssueStage), which complete on `full`. With settled inputs the
  // first tile's first stages have their weights in flight already (Run's pre_wait).
  __device__ __forceinline__ static void Produce(const Cta& c) {
    const MoeGemmParams& p = c.pv.g;
    const bool settled = SettledInputs(p);
    StageRing<ST> ring;
    for (int64_t tile = blockIdx.x; tile < c.tiles; tile += gridDim.x) {
      const MoeTile t = TileAt(tile, c.m_tiles, c.n_tiles, c.experts, TT, c.off, c.pre);
      PrefetchBiasL2<ACT, W>(p, t.e, t.n_tile);
      const int w_row = t.e * p.n + t.n_tile * kWRows;
      for (int kt = 0; kt < c.num_kt; ++kt) {
        MbarWait(c.empty_bar + 8 * ring.s, ring.phase ^ 1);
        IssueStage(c.pv, t, w_row, kt, c.full_bar + 8 * ring.s,
                   c.smem_base + ring.s * L.stage_bytes,
                   settled && tile == blockIdx.x && kt < ST);
        ring.Advance();
      }
    }
  }

  // A consumer thread's place in the A fragment: its two weight rows within the tile (the
  // fragment's rows g and g + 8) and its lane's share of each 32-element block.
  struct Rows {
    int r_a, r_b;
    uint32_t sel;  // GatherByte's selector: byte lane % 4 of each word
    int quad;      // lane % 4
    // nvfp4: prmt selectors of row r_a's and r_b's scale bytes of blocks 2i and 2i + 1 (i
    // = 0..3) of the k-tile, from the words ea[i] and eb[i]: byte quad / 2 (even blocks)
    // or 2 + quad / 2 (odd) of each.
    uint32_t nv_sel[2];
    // Permuted: row r_a's word `quad` of block 0 in a stage's 128-byte-swizzled weights,
    // relative to the stage (r_a x 128 + (r_a % 8) x 16 + 4 quad). Stages are 1024-byte
    // aligned, so block j's is one xor away (PackedWords), and row r_b's 1024 bytes on.
    uint32_t word_off;
  };

  // Consumer warpgroup ci (weight rows ci*64 .. ci*64+63 of each tile): per tile, the main
  // loop into fp32 accumulators (waits on `full`, and `conv` with raw activations; arrives
  // on `empty`), then the epilogue (named barrier 1 among the consumers).
  __device__ __forceinline__ static void Consume(const Cta& c, int ci) {
    const MoeGemmParams& p = c.pv.g;
    const int lane = threadIdx.x % 32, warp = (threadIdx.x % 128) / 32;
    const bool signals = threadIdx.x % 128 == 0;
    Rows w;
    w.r_a = ci * 64 + warp * 16 + lane / 4;
    w.r_b = w.r_a + 8;
    w.sel = (lane % 4) | ((4 + lane % 4) << 4);
    w.quad = lane % 4;
    w.nv_sel[0] = (w.quad / 2) | ((4 + w.quad / 2) << 4);
    w.nv_sel[1] = (2 + w.quad / 2) | ((6 + w.quad / 2) << 4);
    w.word_off = w.r_a * 128 + (w.r_a % 8) * 16 + 4 * w.quad;
    const int kb = p.k / 32;  // 32-element k blocks (mxfp4: scale bytes) per weight row
    const int kb16 = p.k / 16;  // nvfp4: scale bytes per weight row
    float* ep = reinterpret_cast<float*>(c.smem + L.epilogue_offset);
    const uint8_t* b_scale = static_cast<const uint8_t*>(p.b_scale);
    const int64_t weight_rows = static_cast<int64_t>(p.num_experts) * p.n;
    StageRing<ST> ring;
    float acc[kRegs];
    // The number of M tiles (the tile prefix's last entry) is read from shared memory
    // every tile, and the tile count derived from it and N: kept in registers, ptxas
    // spilled them, and the reload at each tile's start missed L1 (3% of the consumers'
    // stall samples on gpt-oss-120b decode).
    const uint32_t m_tiles_addr = SmemAddr(c.pre + c.experts);
    for (int64_t tile = blockIdx.x;; tile += gridDim.x) {
      const int64_t m_tiles = static_cast<int>(LdShared32(m_tiles_addr));
      const int64_t n_tiles = MoeGemmNTiles(p.n, ACT, W);
      if (tile >= m_tiles * n_tiles) break;
      const MoeTile t = TileAt(tile, m_tiles, n_tiles, c.experts, TT, c.off, c.pre);
      // This thread's two weight rows in B and their scale rows (rows past the last
      // expert are clamped: their outputs are never stored).
      auto scale_row = [&](int r) {
        return WeightScaleRow(p, t, r, b_scale, kNv ? kb16 : kb, weight_rows);
      };
      const uint8_t* sc_a = scale_row(w.r_a);
      const uint8_t* sc_b = scale_row(w.r_b);
      // Without converters, the scale bytes of k-tile 0 (as words), then each k-tile loads
      // the next one's.
      const int row_bytes = kNv ? kb16 : kb;
      uint32_t sa[kScaleWords], sb[kScaleWords];
      if constexpr (!kStageScales) {
        LoadScaleWords(sc_a, 0, row_bytes, sa);
        LoadScaleWords(sc_b, 0, row_bytes, sb);
      }
      MainLoop(c, w, sc_a, sc_b, kb, row_bytes, signals, sa, sb, ring, acc);
      Epilogue(p, t, ep, acc, lane, w);
    }
  }

  // One tile's k-tiles into acc; sa, sb hold k-tile 0's scale bytes of the rows sc_a, sc_b
  // (row_bytes each). Per k-tile: the next k-tile's scale bytes are loaded,
  // then the stage's `full` (and `conv`) barriers are waited on; the stage is released on
  // `empty` once the next k-tile's first wgmma group has retired (KTile), the tile's last
  // stage at the end, when no wgmma is in flight.
  __device__ __forceinline__ static void MainLoop(const Cta& c, const Rows& w,
                                                  const uint8_t* sc_a, const uint8_t* sc_b,
                                                  int kb, int row_bytes, bool signals,
                                                  uint32_t (&sa)[kScaleWords],
                                                  uint32_t (&sb)[kScaleWords],
                                                  StageRing<ST>& ring, float (&acc)[kRegs]) {
#pragma unroll
    for (int i = 0; i < kRegs; ++i) acc[i] = 0.0f;
    int prev = -1;
    for (int kt = 0; kt < c.num_kt; ++kt) {
      // Past the last k-tile nothing is read (the row has ended). Aligned after this
      // k-tile's wgmma, by when the loads have landed.
      ScaleWords<kScaleWords> na{}, nb{};
      if constexpr (!kStageScales) {
        na = ScaleWordsLoad<kScaleWords>(sc_a, (kt + 1) * 4 * kScaleWords, row_bytes);
        nb = ScaleWordsLoad<kScaleWords>(sc_b, (kt + 1) * 4 * kScaleWords, row_bytes);
      }
      MbarWait(c.full_bar + 8 * ring.s, ring.phase);
      if constexpr (kRawBoxes > 0) MbarWait(c.conv_bar + 8 * ring.s, ring.phase);
      if constexpr (kStageScales) {
        // This k-tile's scale words of the two rows, staged by the converters (`conv`).
        const uint32_t ws = c.smem_base + L.wscale_offset + ring.s * L.wscale_stage_bytes;
        LdSharedWords<kScaleWords>(ws + w.r_a * L.wscale_row_bytes, sa);
        LdSharedWords<kScaleWords>(ws + w.r_b * L.wscale_row_bytes, sb);
      }
      // The stage's flag is the same word for every consumer thread, so both KTile bodies
      // (each with its own wgmma) are taken by whole warpgroups.
      const int blocks = kb - kt * 8;
      if constexpr (kScaleFlags) {
        if (LdShared32(c.smem_base + L.flag_offset + 4 * ring.s) == 0) {
          KTile<true>(c, w, blocks, sa, sb, ring.s, prev, signals, acc);
        } else {
          KTile<false>(c, w, blocks, sa, sb, ring.s, prev, signals, acc);
        }
      } else {
        KTile<kPermuted>(c, w, blocks, sa, sb, ring.s, prev, signals, acc);
      }
      // No wgmma in flight across the loop's back edge: with the last block's group left
      // running into the next k-tile, whose first decode writes A registers, ptxas
      // serialized every wgmma of the kernel (C7513, a wait after each; docs/kernels.md
      // "fp8 per tensor"). Within the k-tile one group stays in flight.
      WgmmaWait<0>();
      prev = ring.s;
      ring.Advance();
      if constexpr (!kStageScales) {
        ScaleWordsAlign(na, sa);
        ScaleWordsAlign(nb, sb);
      }
    }
    WgmmaWait<0>();
    FenceRegs(acc);
    if (prev >= 0 && signals) MbarArrive(c.empty_bar + 8 * prev);
  }

  // The wgmma of a k-tile (in stage `stage`, whose barriers have been waited on; `blocks`:
  // its 32-element blocks inside K, 8 but in the last): per block this thread's A
  // registers decoded (DecodeBlock), then two wgmma m64nTTk16 as one commit group, one
  // group left in flight. Once block 0's group has retired, every wgmma of the previous
  // k-tile has read its stage `prev`: released on `empty`.
  // sa, sb: the k-tile's scale bytes of the two rows. kOneMul: decode with one multiply
  // (permuted kernels whose stage is not flagged).
  template <bool kOneMul>
  __device__ __forceinline__ static void KTile(const Cta& c, const Rows& w, int blocks,
                                               const uint32_t (&sa)[kScaleWords],
                                               const uint32_t (&sb)[kScaleWords], int stage,
                                               int prev, bool signals, float (&acc)[kRegs]) {
    const uint32_t w_base = c.smem_base + stage * L.stage_bytes;
    // The activation panels' descriptors differ from the stage's first only in the start
    // address: one add per wgmma (DescPlus). Broadcast from lane 0, ptxas keeps it in a
    // uniform register and adds there (one instruction less per block).
    const uint32_t desc_lo =
        __shfl_sync(0xFFFFFFFFu, static_cast<uint32_t>(Desc(w_base + L.w_stage_bytes)), 0);
    // mxfp4: the 8 scales as bf16 exponents once per k-tile; nvfp4: the raw bytes.
    uint32_t ea[4], eb[4];
    if constexpr (kNv) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        ea[i] = sa[i];
        eb[i] = sb[i];
      }
    } else if constexpr (kOneMul) {
      Ue8m0ExpsTimes2p126(sa, ea);
      Ue8m0ExpsTimes2p126(sb, eb);
    } else {
      Ue8m0Exps(sa, ea);
      Ue8m0Exps(sb, eb);
    }
    // Permuted tiles of up to 64 tokens load the packed words of block j + 1 before block
    // j's wgmma, so that the shared-memory latency is not in the next decode's chain (a
    // block past K reads stale words, never used): 0.94-0.96x the time at 8 tokens
    // (mxfp4 x bf16), but 1.11x at 128 (nvfp4, DeepSeek-V3 prefill), whose accumulators
    // leave the registers tight; those load each block's words in the block.
    constexpr bool kAhead = kPermuted && TT < 128;
    const uint32_t word0 = w_base + w.word_off;
    uint32_t wa = 0, wb = 0;
    if constexpr (kAhead) PackedWords(word0, 0, wa, wb);
#pragma unroll
    for (int j = 0; j < 8; ++j) {  // 32-element k blocks
      // Blocks past K are skipped whole (the producer copied no activations there).
      if (j >= blocks) break;
      uint4 d_a, d_b;  // the A fragment's rows g and g + 8, decoded
      if constexpr (kPermuted && !kAhead) PackedWords(word0, j, wa, wb);
      DecodeBlock<kOneMul>(w, w_base, j, ea, eb, wa, wb, d_a, d_b);
      if constexpr (kAhead) {
        if (j + 1 < 8) PackedWords(word0, j + 1, wa, wb);
      }
      // k16 steps 2j and 2j+1 of the k-tile: elements 2c.., 8+2c.. of each half.
      uint32_t f0[4] = {d_a.x, d_b.x, d_a.y, d_b.y};
      uint32_t f1[4] = {d_a.z, d_b.z, d_a.w, d_b.w};
      const uint32_t off = (j / 2) * TT * kMoeGemmTmaBoxBytes + (j % 2) * 64;
      uint64_t desc0 = DescPlus(desc_lo, off), desc1 = DescPlus(desc_lo, off + 32);
      PinRegs(f0, f1, desc0, desc1);
      WgmmaFence();
      Mma::Mma(acc, f0, desc0, 1);
      Mma::Mma(acc, f1, desc1, 1);
      WgmmaCommit();
      // One group in flight: the previous block's A registers are free again, and
      // after block 0 every wgmma of the previous k-tile has read its stage.
      WgmmaWait<1>();
      if (j == 0 && prev >= 0 && signals) MbarArrive(c.empty_bar + 8 * prev);
    }
  }

  // Block j of this thread's two weight rows (the A fragment's rows g and g + 8) of the
  // stage's packed weights at w_base, times their block scales, as bf16 pairs (exact).
  // ea, eb: the k-tile's scales of the two rows (mxfp4: Ue8m0Exps's words; nvfp4: the
  // raw e4m3 bytes). kOneMul: DecodeE2m1PairsOneMul, ea and eb then Ue8m0ExpsTimes2p126's
  // words (mxfp4). wa, wb: permuted kernels' packed words of the block (PackedWords),
  // loaded by the caller a block ahead; the gather kernels load their own.
  template <bool kOneMul>
  __device__ __forceinline__ static void DecodeBlock(const Rows& w, uint32_t w_base, int j,
                                                     const uint32_t (&ea)[4],
                                                     const uint32_t (&eb)[4], uint32_t wa,
                                                     uint32_t wb, uint4& d_a, uint4& d_b) {
    if constexpr (kOneMul) {
      __nv_bfloat162 m_a, m_b;
      if constexpr (kNv) {
        // Both rows' bytes of block j in one word, converted together, times 2^118.
        const uint32_t two = Prmt(ea[j / 2], eb[j / 2], w.nv_sel[j % 2]);
        const __nv_bfloat162 m = __hmul2(E4m3x2ToBf16x2(two), Bits2(0x7A80'7A80u));
        m_a = __low2bfloat162(m);  // broadcasts folded into the multiplies' operands
        m_b = __high2bfloat162(m);
      } else {
        m_a = Ue8m0Pair(ea, j);
        m_b = Ue8m0Pair(eb, j);
      }
      d_a = DecodeE2m1PairsOneMul(wa, m_a);
      d_b = DecodeE2m1PairsOneMul(wb, m_b);
    } else if constexpr (kNv) {
      // nvfp4 x bf16 in natural order (16 tokens and more): the table decode, the first
      // two pairs of the gathered word in block 2j's 16 elements, the last two in 2j + 1's.
      // The e4m3 scales are exact in bf16, as are their products with e2m1.
      static_assert(!kPermuted);
      const int sh = 16 * (j % 2);
      const __nv_bfloat162 s_a = E4m3x2ToBf16x2(ea[j / 2] >> sh);
      const __nv_bfloat162 s_b = E4m3x2ToBf16x2(eb[j / 2] >> sh);
      const int r_a = w.r_a, r_b = w.r_b;
      const uint4 q_a = LdShared128(w_base + r_a * 128 + ((j ^ (r_a & 7)) << 4));
      const uint4 q_b = LdShared128(w_base + r_b * 128 + ((j ^ (r_b & 7)) << 4));
      d_a = DecodeE2m1x8(GatherByte(q_a, w.sel), __low2bfloat162(s_a), __high2bfloat162(s_a));
      d_b = DecodeE2m1x8(GatherByte(q_b, w.sel), __low2bfloat162(s_b), __high2bfloat162(s_b));
    } else {
      // mxfp4 with two multiplies (flagged permuted stages) or the table decode.
      const __nv_bfloat162 s_a = Ue8m0Pair(ea, j), s_b = Ue8m0Pair(eb, j);
      if constexpr (kPermuted) {
        d_a = DecodeE2m1Pairs(wa, s_a);
        d_b = DecodeE2m1Pairs(wb, s_b);
      } else {
        const int r_a = w.r_a, r_b = w.r_b;
        const uint4 q_a = LdShared128(w_base + r_a * 128 + ((j ^ (r_a & 7)) << 4));
        const uint4 q_b = LdShared128(w_base + r_b * 128 + ((j ^ (r_b & 7)) << 4));
        // The gathered word holds elements 2c, 2c+1 of words 0-3 of the block.
        d_a = DecodeE2m1x8(GatherByte(q_a, w.sel), s_a);
        d_b = DecodeE2m1x8(GatherByte(q_b, w.sel), s_b);
      }
    }
  }

  // The epilogue: accumulators (weight rows x tokens) into shared memory (ep) as
  // [token][tile row], at most 64 tokens at a time, then each consumer thread writes 8
  // output columns of a token (StoreFromShared). Named barrier 1 (the consumers only)
  // separates the writes to ep from the reads, and the reads from the next writes.
  __device__ __forceinline__ static void Epilogue(const MoeGemmParams& p, const MoeTile& t,
                                                  float* ep, const float (&acc)[kRegs],
                                                  int lane, const Rows& w) {
    const int r_a = w.r_a, r_b = w.r_b;
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

  // The block-scale row of tile row r's weight row (the gate half N/2 rows down; rows past
  // the last expert clamped: their outputs are never stored).
  // scales: p.b_scale; row_bytes: scale bytes per weight row (mxfp4 K / 32, nvfp4 K / 16);
  // weight_rows: E x N.
  __device__ __forceinline__ static const uint8_t* WeightScaleRow(const MoeGemmParams& p,
                                                                  const MoeTile& t, int r,
                                                                  const uint8_t* scales,
                                                                  int row_bytes,
                                                                  int64_t weight_rows) {
    const int half = kGated && r >= kWRows ? 1 : 0;
    int64_t g = static_cast<int64_t>(t.e) * p.n + t.n_tile * kWRows + (r - half * kWRows) +
                (half ? p.n / 2 : 0);
    g = g < weight_rows ? g : weight_rows - 1;
    return scales + g * row_bytes;
  }
  // Word `quad` of 32-element block j of this thread's packed weight rows r_a and r_b
  // (128-byte swizzled): the 8 elements 8 quad .. 8 quad + 7 of the block. word0: the
  // stage's address plus Rows::word_off.
  __device__ __forceinline__ static void PackedWords(uint32_t word0, int j, uint32_t& wa,
                                                     uint32_t& wb) {
    const uint32_t addr = word0 ^ (static_cast<uint32_t>(j) << 4);
    wa = LdShared32(addr);
    wb = LdShared32(addr + 1024);
  }

  // Settled inputs (PipelinePrologue's pre_wait, thread 0): the weights of the first
  // tile's first stages, their bytes expected without an arrival. Not inlined, so that
  // its registers do not weigh on the rest of the kernel (moe_gemm_tma.cu's PreIssueB).
  __device__ __noinline__ static void PreIssueWeights(const MoeGemmParamsV2& pv,
                                                      int64_t m_tiles, const int* off,
                                                      const int* pre, uint32_t full_bar,
                                                      uint32_t smem_base) {
    const MoeGemmParams& p = pv.g;
    PreIssueFirstTile<ST>(p, m_tiles, MoeGemmNTiles(p.n, ACT, W), TT, off, pre,
                          (p.k + kMoeGemmFp4KTile - 1) / kMoeGemmFp4KTile, full_bar,
                          L.w_stage_bytes, [&](const MoeTile& t, int kt, uint32_t full) {
                            IssueWeights(pv, t.e * p.n + t.n_tile * kWRows, kt, full,
                                         smem_base + kt * L.stage_bytes);
                          });
  }

  // Weights: 128 bytes (256 elements) of K per row; the gate half N/2 rows down.
  __device__ __forceinline__ static void IssueWeights(const MoeGemmParamsV2& pv, int w_row,
                                                      int kt, uint32_t full, uint32_t w_dst) {
    TmaLoad2d(w_dst, &pv.b_map, kt * kMoeGemmTmaBoxBytes, w_row, full);
    if constexpr (kGated) {
      TmaLoad2d(w_dst + kWRows * kMoeGemmTmaBoxBytes, &pv.b_map, kt * kMoeGemmTmaBoxBytes,
                w_row + pv.g.n / 2, full);
    }
  }

  // The producer's copies of one stage: expect its bytes on `full`, then the weights
  // (IssueWeights) and the activations. w_row: the tile's first weight row (t.e * N +
  // t.n_tile * kWRows). weights_issued: the stage's weights are in flight already (Run's
  // pre_wait, their bytes expected): only the activations are issued, with the arrival.
  __device__ __forceinline__ static void IssueStage(const MoeGemmParamsV2& pv, const MoeTile& t,
                                                    int w_row, int kt, uint32_t full,
                                                    uint32_t w_dst, bool weights_issued) {
    const MoeGemmParams& p = pv.g;
    const uint32_t a_dst = w_dst + L.w_stage_bytes;
    const int k_rem = p.k - kt * kMoeGemmFp4KTile;
    // Activation boxes wholly past K are not copied (the consumers skip them).
    int boxes;
    if constexpr (kRawBoxes == 0) {
      boxes = min(4, (k_rem + 63) / 64);
    } else {
      // Raw boxes of 128 bytes: 64 (bf16), 128 (mxfp8) or 256 (nvfp4) elements.
      constexpr int kElems = kMoeGemmFp4KTile / kRawBoxes;
      boxes = min(kRawBoxes, (k_rem + kElems - 1) / kElems);
    }
    const uint32_t a_bytes = boxes * TT * kMoeGemmTmaBoxBytes;
    if (weights_issued) {
      MbarArriveExpectTx(full, a_bytes);
    } else {
      MbarArriveExpectTx(full, L.w_stage_bytes + a_bytes);
      IssueWeights(pv, w_row, kt, full, w_dst);
    }
    if constexpr (kRawBoxes == 0) {
#pragma unroll
      for (int panel = 0; panel < 4; ++panel) {
        if (panel >= boxes) break;
        TmaLoad2d(a_dst + panel * TT * kMoeGemmTmaBoxBytes, &pv.a_map,
                  kt * kMoeGemmFp4KTile + panel * 64, t.row_begin, full);
      }
    } else {
      // Raw rows of the k-tile: 512 bytes (bf16), 256 (mxfp8) or 128 (nvfp4), in
      // 128-byte boxes (the bf16 map counts elements, the others bytes).
      const uint32_t raw_dst = a_dst + L.a_stage_bytes;
      constexpr int kBoxElems = AF == kBf16 ? 64 : kMoeGemmTmaBoxBytes;
#pragma unroll
      for (int box = 0; box < kRawBoxes; ++box) {
        if (box >= boxes) break;
        TmaLoad2d(raw_dst + box * TT * kMoeGemmTmaBoxBytes, &pv.a_map,
                  (kt * kRawBoxes + box) * kBoxElems, t.row_begin, full);
      }
    }
  }

  // The tile rows whose weight scales converter ct stages: row ct in the first pass and,
  // where the converters are fewer than the rows (96 of 128), the rest in a second pass
  // by the last warps, which have the fewest activation items (none at 8 tokens: 64
  // items, one per thread from the first). -1: none.
  static constexpr int kScaleRows = kConverters > 0 ? (W + kConverters - 1) / kConverters : 1;
  static_assert(kScaleRows <= 2, "two passes of converters cover a tile's weight rows");
  __device__ __forceinline__ static int ScaleRow(int pass, int ct) {
    if (pass == 0) return ct < W ? ct : -1;
    const int r = ct + W - kConverters;  // rows kConverters .. W - 1 for the last threads
    return r >= kConverters ? r : -1;
  }
  // The converters (warps 1-3 of the producer warpgroup, plus a warpgroup of their own in
  // large one-per-SM tiles; ct = 0 .. kConverters - 1): for every stage the producer
  // fills, decode the raw activations (mxfp8: e4m3 x ue8m0 per 32; nvfp4: e2m1 x e4m3 per
  // 16) into the bf16 panels the consumers' wgmma reads, in the permuted k order
  // (kPermuted): within each 32-element block, 8-element chunk m (m = 0..3) holds the
  // pairs (element 8c + m, element 8c + m + 4) for c = 0..3. Each thread owns fixed (row,
  // block) items of the tile; the scale bytes are loaded before waiting for the stage.
  // Rows past T read the last row's scales (their outputs are never stored); blocks past
  // K are not decoded (the consumers skip them). Per stage: waits on `full` (the
  // producer's copies have landed), arrives on `conv` once the panels and the weight
  // scale slots (ScaleRow) are written and fenced for wgmma.
  __device__ __forceinline__ static void Convert(const Cta& c, int ct) {
    const MoeGemmParams& p = c.pv.g;
    constexpr int kScaleBlock = AF == kMxfp8 ? 32 : 16;
    const int sk = p.k / kScaleBlock;  // scale bytes per token row
    const uint8_t* a_scale = static_cast<const uint8_t*>(p.a_scale);
    const uint8_t* b_scale = static_cast<const uint8_t*>(p.b_scale);
    const int64_t weight_rows = static_cast<int64_t>(p.num_experts) * p.n;
    StageRing<ST> ring;
    for (int64_t tile = blockIdx.x; tile < c.tiles; tile += gridDim.x) {
      const MoeTile t = TileAt(tile, c.m_tiles, c.n_tiles, p.num_experts, TT, c.off, c.pre);
      for (int kt = 0; kt < c.num_kt; ++kt) {
        const int k_rem = p.k - kt * kMoeGemmFp4KTile;
        // The words holding the k-tile's weight scale bytes of this thread's tile rows
        // (ScaleRow), loaded before the wait below, aligned and stored after it for the
        // consumers. mxfp4: a byte of 128 or more among the k-tile's (a scale above 2^0,
        // or NaN) flags the stage. The rows' addresses are recomputed each k-tile: kept
        // across the k-tile loop, the two pointers spilled the converters (64 registers
        // at 8 and 16 tokens).
        const int row_bytes = kNv ? p.k / 16 : p.k / 32;
        ScaleWords<kScaleWords> sw[kScaleRows];
#pragma unroll
        for (int i = 0; i < kScaleRows; ++i) {
          const int r = ScaleRow(i, ct);
          sw[i] = r >= 0 ? ScaleWordsLoad<kScaleWords>(
                              WeightScaleRow(p, t, r, b_scale, row_bytes, weight_rows),
                              kt * 4 * kScaleWords, row_bytes)
                        : ScaleWords<kScaleWords>{};
        }
        uint32_t sc[kConvItems];
#pragma unroll
        for (int q = 0; q < kConvItems; ++q) {
          const int item = ct + q * kConverters;
          const int r = item / 8, jb = item % 8;
          sc[q] = 0;
          if (AF != kBf16 && item < TT * 8 && jb * 32 < k_rem) {
            const int row = min(t.row_begin + r, p.num_tokens - 1);
            const uint8_t* srow = a_scale + static_cast<int64_t>(row) * sk +
                                  (kt * kMoeGemmFp4KTile + jb * 32) / kScaleBlock;
            sc[q] = kRawBoxes == 2 ? __ldg(srow) : __ldg(srow) | (__ldg(srow + 1) << 8);
          }
        }
        MbarWait(c.full_bar + 8 * ring.s, ring.phase);
        // The stage's scale slots (and its flag) were last read by the consumers before
        // they released the stage, which was before the producer refilled it: writing
        // after `full` is safe, and `conv` publishes them.
        const uint32_t ws = c.smem_base + L.wscale_offset + ring.s * L.wscale_stage_bytes;
        uint32_t wide = 0;  // mxfp4: the k-tile's scale bytes of this thread's rows, OR-ed
#pragma unroll
        for (int i = 0; i < kScaleRows; ++i) {
          const int r = ScaleRow(i, ct);
          if (r >= 0) {
            uint32_t aligned[kScaleWords];
            ScaleWordsAlign(sw[i], aligned);
            if constexpr (kScaleFlags) wide |= aligned[0] | aligned[1];
            StSharedWords<kScaleWords>(ws + r * L.wscale_row_bytes, aligned);
          }
        }
        if constexpr (kScaleFlags) {
          // One byte per checking warp.
          const bool flagged = __any_sync(0xFFFFFFFFu, (wide & 0x80808080u) != 0);
          if (ct < W && ct % 32 == 0) {
            StShared8(c.smem_base + L.flag_offset + 4 * ring.s + ct / 32, flagged ? 1u : 0u);
          }
        }
        const uint32_t a_base = c.smem_base + ring.s * L.stage_bytes + L.w_stage_bytes;
        const uint32_t raw_base = a_base + L.a_stage_bytes;
#pragma unroll
        for (int q = 0; q < kConvItems; ++q) {
          const int item = ct + q * kConverters;
          const int r = item / 8, jb = item % 8;
          if (item >= TT * 8 || jb * 32 >= k_rem) continue;
          uint32_t out[4][4];  // [chunk m][pair c]
          ConvertItem(raw_base, r, jb, sc[q], out);
          // Block jb is 64 bytes of bf16 panel jb / 2, from chunk 4 * (jb % 2).
          const uint32_t dst = a_base + (jb / 2) * TT * kMoeGemmTmaBoxBytes + r * 128;
#pragma unroll
          for (int m = 0; m < 4; ++m) {
            StShared128(dst + (((4 * (jb % 2) + m) ^ (r & 7)) << 4),
                        make_uint4(out[m][0], out[m][1], out[m][2], out[m][3]));
          }
        }
        // The panels are read next by wgmma (the async proxy).
        FenceProxyAsync();
        MbarArrive(c.conv_bar + 8 * ring.s);
        ring.Advance();
      }
    }
  }

  // One converter item: raw activation row r's 32-element block jb of the stage (raw rows
  // at raw_base; sc its scale byte or bytes) as bf16 pairs in the permuted k order,
  // out[chunk m][pair c].
  __device__ __forceinline__ static void ConvertItem(uint32_t raw_base, int r, int jb,
                                                     uint32_t sc, uint32_t (&out)[4][4]) {
    if constexpr (AF == kBf16) {
      // 32 bf16 = four 16-byte chunks of box jb / 2: words w = elements 2w, 2w+1.
      const uint32_t box = raw_base + (jb / 2) * TT * kMoeGemmTmaBoxBytes + r * 128;
      uint32_t w[16];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const uint4 v = LdShared128(box + (((4 * (jb % 2) + i) ^ (r & 7)) << 4));
        w[4 * i] = v.x;
        w[4 * i + 1] = v.y;
        w[4 * i + 2] = v.z;
        w[4 * i + 3] = v.w;
      }
#pragma unroll
      for (int m = 0; m < 4; ++m) {
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          // Element 8c + m: word 4c + m / 2; element 8c + m + 4: two words on.
          out[m][c] = Prmt(w[4 * c + m / 2], w[4 * c + 2 + m / 2],
                           m % 2 ? 0x7632u : 0x5410u);
        }
      }
    } else if constexpr (kRawBoxes == 2) {
      // 32 e4m3 = two 16-byte chunks of box jb / 4: words w = elements 4w..4w+3.
      const uint32_t box = raw_base + (jb / 4) * TT * kMoeGemmTmaBoxBytes + r * 128;
      const int c0 = 2 * (jb % 4);
      const uint4 lo = LdShared128(box + ((c0 ^ (r & 7)) << 4));
      const uint4 hi = LdShared128(box + (((c0 + 1) ^ (r & 7)) << 4));
      const uint32_t w[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
      const __nv_bfloat162 s = Ue8m0ToBf16x2(sc);
#pragma unroll
      for (int m = 0; m < 4; ++m) {
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          // Byte m of words 2c and 2c + 1: elements 8c + m and 8c + m + 4.
          const uint32_t two = Prmt(w[2 * c], w[2 * c + 1], m | ((4 + m) << 4));
          out[m][c] = Bits(__hmul2(E4m3x2ToBf16x2(two), s));
        }
      }
    } else {
      // 32 e2m1 = one 16-byte chunk; words 0-1 take the first 16-element block's
      // scale, words 2-3 the second's. One multiply per pair, as the weights': the
      // scales times 2^118, so the panel holds 2^-8 of each value (the epilogue's
      // kNvUnscale undoes it with the weights' 2^-8).
      const uint4 raw = LdShared128(raw_base + r * 128 + ((jb ^ (r & 7)) << 4));
      const __nv_bfloat162 m = __hmul2(E4m3x2ToBf16x2(sc), Bits2(0x7A80'7A80u));
      const __nv_bfloat162 s0 = __low2bfloat162(m), s1 = __high2bfloat162(m);
      const uint4 d[4] = {DecodeE2m1PairsOneMul(raw.x, s0), DecodeE2m1PairsOneMul(raw.y, s0),
                          DecodeE2m1PairsOneMul(raw.z, s1), DecodeE2m1PairsOneMul(raw.w, s1)};
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        out[0][c] = d[c].x;
        out[1][c] = d[c].y;
        out[2][c] = d[c].z;
        out[3][c] = d[c].w;
      }
    }
  }

  // Tokens first_tok .. first_tok + kEpTokens - 1 of the tile, staged in ep.
  __device__ static void StoreFromShared(const MoeGemmParams& p, const MoeTile& t,
                                         const float* ep, int first_tok) {
    ActParams q = MoeActDefaults(ACT);
    if constexpr (kGated) {
      if (p.alpha != nullptr) q.alpha = __ldg(p.alpha + t.e);
      if (p.beta != nullptr) q.beta = __ldg(p.beta + t.e);
      if (p.limit != nullptr) q.limit = __ldg(p.limit + t.e);
    }
    // nvfp4's global scales (null = 1); mxfp4 has none.
    float gs = 1.0f;
    if constexpr (kNv) {
      if (p.a_global_scale != nullptr) gs *= __ldg(p.a_global_scale);
      if (p.b_global_scale != nullptr) gs *= __ldg(p.b_global_scale + t.e);
      // x 2^16 is exact: the same product as scaling the accumulator first.
      gs *= kNvUnscale;
    }
    // The expert's bias row (version 3), or null: B row n adds bias[n] before the activation.
    const float* bias = p.bias != nullptr ? p.bias + static_cast<int64_t>(t.e) * p.n : nullptr;
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
      float b0[8] = {}, b1[8] = {};  // bias of the 8 columns (x0) and of their gate (x1)
      if (bias != nullptr) {
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          b0[i] = __ldg(bias + col + i);
          if constexpr (kGated) b1[i] = __ldg(bias + p.n / 2 + col + i);
        }
      }
      uint32_t packed[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        float v0, v1;
        if constexpr (kGated) {
          v0 = Act<ACT>(x0[2 * i] * gs + b0[2 * i], x0[kOutCols + 2 * i] * gs + b1[2 * i], q);
          v1 = Act<ACT>(x0[2 * i + 1] * gs + b0[2 * i + 1],
                        x0[kOutCols + 2 * i + 1] * gs + b1[2 * i + 1], q);
        } else {
          v0 = Act<ACT>(x0[2 * i] * gs + b0[2 * i], 0.0f, q);
          v1 = Act<ACT>(x0[2 * i + 1] * gs + b0[2 * i + 1], 0.0f, q);
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

using MoeFp4Kernel = cubist::moe::MoeGemmFp4<cubist::moe::MOE_WFMT, cubist::moe::MOE_AFMT,
                                             cubist::moe::MOE_ACT, MOE_TM, MOE_TN, MOE_STAGES>;

extern "C" __global__ void __launch_bounds__(MoeFp4Kernel::kThreads,
                                             MoeFp4Kernel::L.ctas_per_sm)
    MOE_NAME(const __grid_constant__ cubist::moe::MoeGemmParamsV2 p) {
  MoeFp4Kernel::Run(p);
}
