// moe_gemm_meta: prints the launch metadata of moe_gemm configurations as JSON lines,
// from the same constexpr layout code the kernels are compiled with
// (kernels/moe_gemm_layout.h), so the manifest's threads and shared_mem_bytes always
// match the cubin. scripts/build-artifacts builds it with the host compiler.
//
// Input, one configuration per line on stdin:  WFMT AFMT ACT TILE_M TILE_N TILE_K STAGES
//   (names as in the manifest: mxfp4 bf16 swiglu 64 128 256 0; STAGES 0 = the deepest
//   pipeline that fits, as each kernel kind below chooses it). bf16 and fp8 operands:
//   kernels/moe_gemm_tma.cu, whose tile_k must be 128 bytes of K; fp4 weights:
//   kernels/moe_gemm_fp4.cu, or for mxfp4 x mxfp8 with 128 tokens and tile_k 128
//   kernels/moe_gemm_fp4_fp8.cu.
// Output, one line each: {"ok":true,"stages":5,"threads":128,"shared_mem_bytes":...,
//   "k_align":32,"n_align":8,"gated":true,"mma":"wgmma.bf16","decode_a":false,
//   "decode_b":true,"ctas_per_sm":2,"max_experts":1024} or {"ok":false,"error":"..."}.
//   No kernel of this family rounds an operand on purpose, so none says "exact":false (a
//   manifest may still carry such kernels from elsewhere: dispatch/registry.h
//   KernelEntry::exact). Exit status 0 unless input is garbled.
#include <cstdio>
#include <cstring>
#include <iostream>
#include <sstream>
#include <string>

#include "kernels/moe_gemm_abi.h"
#include "kernels/moe_gemm_layout.h"

namespace {

using namespace cubist::moe;

bool ParseFormat(const std::string& s, MoeFormat* f) {
  for (MoeFormat c : {kBf16, kFp8, kFp8Block, kMxfp8, kMxfp4, kNvfp4}) {
    if (s == FormatName(c)) {
      *f = c;
      return true;
    }
  }
  return false;
}

bool ParseActivation(const std::string& s, MoeActivation* a) {
  for (MoeActivation c : {kIdentity, kRelu2, kSwiglu, kGeglu, kSitu}) {
    if (s == ActivationName(c)) {
      *a = c;
      return true;
    }
  }
  return false;
}

// One output line.
struct Meta {
  int stages = 0, threads = 0, smem_bytes = 0;
  const char* mma = "";
  bool decode_a = false, decode_b = false;
  int ctas_per_sm = 0;
  const char* extra = "";  // more JSON members, each starting with a comma
};
void PrintOk(MoeFormat wf, MoeFormat af, MoeActivation ac, const Meta& m) {
  const bool gated = IsGated(ac);
  std::printf(
      "{\"ok\":true,\"stages\":%d,\"threads\":%d,\"shared_mem_bytes\":%d,"
      "\"k_align\":%d,\"n_align\":%d,\"gated\":%s,\"mma\":\"%s\","
      "\"decode_a\":%s,\"decode_b\":%s",
      m.stages, m.threads, m.smem_bytes, MoeGemmKAlign(wf, af),
      gated ? 2 * kMoeGemmOutColsAlign : kMoeGemmOutColsAlign, gated ? "true" : "false", m.mma,
      m.decode_a ? "true" : "false", m.decode_b ? "true" : "false");
  std::printf(",\"ctas_per_sm\":%d,\"max_experts\":%d%s}\n", m.ctas_per_sm,
              kMoeGemmTmaMaxExperts, m.extra);
}
void PrintError(const char* error) { std::printf("{\"ok\":false,\"error\":\"%s\"}\n", error); }

// An fp4-weight generation-2 configuration (kernels/moe_gemm_fp4.cu): tile_k 256;
// stages 0 = the deepest pipeline (at most 8) that still fits two CTAs per SM with at
// least 3 stages (decoding wants warps), else the deepest that fits.
void PrintFp4(MoeFormat wf, MoeFormat af, MoeActivation ac, int tm, int tn, int tk,
              int stages) {
  MoeGemmFp4Layout l;
  if (tk != kMoeGemmFp4KTile) {
    return PrintError("fp4 TMA kernels take tile_k 256");
  }
  if (stages != 0) {
    l = MakeFp4Layout(wf, af, tm, tn, stages);
  } else {
    for (int s = 8; s >= 3; --s) {
      l = MakeFp4Layout(wf, af, tm, tn, s);
      if (l.error == nullptr && l.ctas_per_sm == 2) break;
      l.error = "no two-per-SM fit";
    }
    for (int s = 8; s >= 2 && l.error != nullptr; --s) l = MakeFp4Layout(wf, af, tm, tn, s);
  }
  if (l.error != nullptr) return PrintError(l.error);
  PrintOk(wf, af, ac,
          {l.stages, l.threads, l.smem_bytes, "wgmma.bf16 (A in registers)", af != kBf16, true,
           l.ctas_per_sm, ",\"fp4\":true"});
}

// An mxfp4 x mxfp8 configuration on fp8 wgmma (kernels/moe_gemm_fp4_fp8.cu): tile_k 128;
// stages 0 = the deepest pipeline (at most 6) that fits.
void PrintFp4Fp8(MoeFormat wf, MoeFormat af, MoeActivation ac, int tm, int tn, int tk,
                 int stages) {
  MoeGemmFp4Fp8Layout l;
  if (tk != 128) return PrintError("mxfp4 x mxfp8 fp8-MMA kernels take tile_k 128");
  if (stages != 0) {
    l = MakeFp4Fp8Layout(tm, tn, stages);
  } else {
    for (int s = 6; s >= 2; --s) {
      l = MakeFp4Fp8Layout(tm, tn, s);
      if (l.error == nullptr) break;
    }
  }
  if (l.error != nullptr) return PrintError(l.error);
  PrintOk(wf, af, ac,
          {l.stages, l.threads, l.smem_bytes, "wgmma.e4m3 (weights decoded to e4m3)", false,
           true, l.ctas_per_sm, ",\"fp4_fp8\":true"});
}

// A bf16 or fp8 configuration (kernels/moe_gemm_tma.cu), or one of the fp4 kinds above.
// Stages 0: one-consumer tiles take 4 stages when that leaves room for two CTAs per SM;
// otherwise the deepest pipeline (at most 8) that fits.
void PrintConfig(MoeFormat wf, MoeFormat af, MoeActivation ac, int tm, int tn, int tk,
                 int stages) {
  if (wf == kMxfp4 && af == kMxfp8 && tm >= 128 && tk == 128) {
    PrintFp4Fp8(wf, af, ac, tm, tn, tk, stages);
    return;
  }
  if (wf == kMxfp4 || wf == kNvfp4) {
    PrintFp4(wf, af, ac, tm, tn, tk, stages);
    return;
  }
  const int box_k = kMoeGemmTmaBoxBytes * 8 / FormatBits(af);
  MoeGemmTmaLayout l;
  if (tk != box_k) {
    std::printf("{\"ok\":false,\"error\":\"TMA kernels take tile_k %d (128 bytes of K) for %s\"}\n",
                box_k, FormatName(af));
    return;
  }
  if (stages == 0) {
    l = MakeTmaLayout(wf, af, tm, tn, 4);
    if (!(tm == 64 && l.error == nullptr && l.ctas_per_sm == 2)) {
      for (int s = 8; s >= 2; --s) {
        l = MakeTmaLayout(wf, af, tm, tn, s);
        if (l.error == nullptr) break;
      }
    }
  } else {
    l = MakeTmaLayout(wf, af, tm, tn, stages);
  }
  if (l.error != nullptr) return PrintError(l.error);
  PrintOk(wf, af, ac,
          {l.stages, l.threads, l.smem_bytes, l.fp8_mma ? "wgmma.e4m3" : "wgmma.bf16", false,
           false, l.ctas_per_sm});
}

}  // namespace

int main() {
  std::string line;
  while (std::getline(std::cin, line)) {
    if (line.empty()) continue;
    std::istringstream in(line);
    std::string w, a, act;
    int tm = 0, tn = 0, tk = 0, stages = 0;
    MoeFormat wf, af;
    MoeActivation ac;
    if (!(in >> w >> a >> act >> tm >> tn >> tk >> stages) || !ParseFormat(w, &wf) ||
        !ParseFormat(a, &af) || !ParseActivation(act, &ac)) {
      std::fprintf(stderr, "moe_gemm_meta: cannot parse line: %s\n", line.c_str());
      return 2;
    }
    PrintConfig(wf, af, ac, tm, tn, tk, stages);
  }
  return 0;
}
