// moe_gemm_bench: times every kernel of a moe_gemm artifact directory on the five MoE
// shapes of docs/kernels.md, through the loader (ModuleCache, DeviceBuffer, Event), and
// prints, per shape and format pair, the fastest tile with its median time, TFLOP/s and
// TB/s (the bytes each operand must move once: A, B, their scales and the output).
//
//   moe_gemm_bench DIR [--act identity,swiglu] [--reps 20] [--warmup 3]
//                      [--shapes qwen3,gptoss,dsv3,mixtral,decode] [--csv FILE]
//                      [--pairs bf16xbf16,...]
//
// Inputs are random valid codes in each format (never zeros: NaN codes and extreme
// scales excluded), generated as a 16 MiB host block and tiled over each device buffer.
// Every kernel gets `warmup` launches, then `reps` launches timed one by one with events;
// the median is reported.
#include <cuda.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "base/file_util.h"
#include "base/status_macros.h"
#include "kernels/moe_gemm_abi.h"
#include "kernels/moe_gemm_check.h"
#include "dispatch/moe_gemm_launch.h"
#include "dispatch/moe_types.h"
#include "loader/context.h"
#include "loader/device_memory.h"
#include "loader/driver_api.h"
#include "loader/module_cache.h"
#include "manifest/manifest_parser.h"

namespace cubist::bench {
namespace {

using namespace cubist::moe;

struct Shape {
  const char* name;
  const char* what;
  int experts, tokens_per_expert, n, k;
};
constexpr Shape kShapes[] = {
    {"qwen3", "Qwen3-30B-A3B FC1", 128, 64, 1536, 2048},
    {"gptoss", "gpt-oss-120b FC1", 128, 128, 5760, 2880},
    {"dsv3", "DeepSeek-V3 FC1", 256, 128, 4096, 7168},
    {"mixtral", "Mixtral-8x7B FC1", 8, 2048, 28672, 4096},
    {"decode", "gpt-oss-120b decode", 128, 8, 5760, 2880},
};

// The kernels' formats and activations by manifest name (dispatch/moe_types.h parses;
// names-only entries of the vocabulary have no moe_gemm kernels).
std::optional<MoeFormat> ParseFormat(const std::string& s) {
  auto f = ParseDataFormat(s);
  if (!f.ok() || !MoeGemmEncodes(*f)) return std::nullopt;
  return *f;
}
std::optional<MoeActivation> ParseAct(const std::string& s) {
  auto a = ParseActivation(s);
  if (!a.ok() || !MoeGemmEncodes(*a)) return std::nullopt;
  return *a;
}

enum class Fill { kBf16, kE4m3, kE2m1, kUe8m0, kE4m3Scale, kF32Scale };

// A random host block of valid codes, tiled over the whole device buffer.
absl::Status FillRandom(DriverApi& d, DeviceBuffer& buf, Fill kind, uint64_t seed) {
  if (buf.size() == 0) return absl::OkStatus();
  const size_t block = std::min<size_t>(buf.size(), size_t{16} << 20);
  std::vector<uint8_t> h(block);
  std::mt19937_64 rng(seed);
  for (size_t i = 0; i < block; ++i) {
    const uint32_t r = static_cast<uint32_t>(rng());
    switch (kind) {
      case Fill::kBf16:  // |x| in [2^-8, 2): exponent 119..127, random sign and mantissa
        h[i] = (i % 2 == 0) ? static_cast<uint8_t>(r)
                            : static_cast<uint8_t>((r & 0x80) | (0x3B + (r >> 8) % 5));
        break;
      case Fill::kE4m3: {
        uint8_t b = static_cast<uint8_t>(r);
        if ((b & 0x7F) == 0x7F) b ^= 0x01;  // never NaN
        h[i] = b;
        break;
      }
      case Fill::kE2m1: h[i] = static_cast<uint8_t>(r); break;
      case Fill::kUe8m0: h[i] = static_cast<uint8_t>(120 + r % 8); break;
      case Fill::kE4m3Scale: h[i] = static_cast<uint8_t>(((1 + r % 14) << 3) | ((r >> 8) & 7)); break;
      case Fill::kF32Scale: {
        const float v = 0.01f + (r % 1000) / 1000.0f;
        if (i % 4 == 0 && i + 3 < block) std::memcpy(&h[i], &v, 4), i += 3;
        break;
      }
    }
  }
  CUBIST_RETURN_IF_ERROR(buf.CopyFromHost(h.data(), block));
  for (size_t off = block; off < buf.size(); off += block) {
    const size_t n = std::min(block, buf.size() - off);
    CUBIST_RETURN_IF_ERROR(CuCheck(d, d.MemcpyDtoD(buf.get() + off, buf.get(), n), "tile fill"));
  }
  return absl::OkStatus();
}

Fill ElemFill(MoeFormat f) {
  return f == kBf16 ? Fill::kBf16 : (f == kMxfp4 || f == kNvfp4) ? Fill::kE2m1 : Fill::kE4m3;
}
Fill ScaleFill(MoeFormat f) {
  return f == kNvfp4 ? Fill::kE4m3Scale : f == kFp8Block ? Fill::kF32Scale : Fill::kUe8m0;
}

struct Inputs {
  DeviceBuffer a, b, a_scale, b_scale, a_gs, b_gs, offsets, out;
};

absl::StatusOr<Inputs> MakeInputs(DriverApi& d, const Shape& s, MoeFormat w, MoeFormat a,
                                  uint64_t seed) {
  Inputs in;
  const int64_t t = int64_t{s.experts} * s.tokens_per_expert;
  // Activation only matters for the output's size, which is allocated elsewhere.
  const MoeGemmBytes bytes = MoeGemmBytesFor(w, a, kIdentity, s.experts, t, s.n, s.k);
  CUBIST_ASSIGN_OR_RETURN(in.a, DeviceBuffer::Allocate(d, bytes.a));
  CUBIST_ASSIGN_OR_RETURN(in.b, DeviceBuffer::Allocate(d, bytes.b));
  CUBIST_ASSIGN_OR_RETURN(in.a_scale, DeviceBuffer::Allocate(d, bytes.a_scale));
  CUBIST_ASSIGN_OR_RETURN(in.b_scale, DeviceBuffer::Allocate(d, bytes.b_scale));
  CUBIST_RETURN_IF_ERROR(FillRandom(d, in.a, ElemFill(a), seed));
  CUBIST_RETURN_IF_ERROR(FillRandom(d, in.b, ElemFill(w), seed + 1));
  CUBIST_RETURN_IF_ERROR(FillRandom(d, in.a_scale, ScaleFill(a), seed + 2));
  CUBIST_RETURN_IF_ERROR(FillRandom(d, in.b_scale, ScaleFill(w), seed + 3));
  std::vector<float> gs(s.experts, 0.5f);
  CUBIST_ASSIGN_OR_RETURN(in.a_gs, DeviceBuffer::Allocate(d, 4));
  CUBIST_ASSIGN_OR_RETURN(in.b_gs, DeviceBuffer::Allocate(d, 4 * s.experts));
  CUBIST_RETURN_IF_ERROR(in.a_gs.CopyFromHost(gs.data(), 4));
  CUBIST_RETURN_IF_ERROR(in.b_gs.CopyFromHost(gs.data(), 4 * s.experts));
  std::vector<int32_t> off(s.experts + 1);
  for (int e = 0; e <= s.experts; ++e) off[e] = e * s.tokens_per_expert;
  CUBIST_ASSIGN_OR_RETURN(in.offsets, DeviceBuffer::Allocate(d, 4 * off.size()));
  CUBIST_RETURN_IF_ERROR(in.offsets.CopyFromHost(off.data(), 4 * off.size()));
  CUBIST_ASSIGN_OR_RETURN(in.out, DeviceBuffer::Allocate(d, t * s.n * 2));
  return in;
}

struct Result {
  std::string shape, pair, act, kernel;
  double us = 0, tflops = 0, tbps = 0;
};

int Main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: moe_gemm_bench DIR [--act a,b] [--reps N] [--warmup N] "
                         "[--shapes s,..] [--pairs p,..] [--csv FILE]\n");
    return 2;
  }
  const std::string dir = argv[1];
  std::vector<std::string> acts = {"identity", "swiglu"}, shapes, pairs;
  int reps = 20, warmup = 3;
  std::string csv;
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string f = argv[i], v = argv[i + 1];
    if (f == "--act") acts = absl::StrSplit(v, ',');
    else if (f == "--reps") reps = std::stoi(v);
    else if (f == "--warmup") warmup = std::stoi(v);
    else if (f == "--shapes") shapes = absl::StrSplit(v, ',');
    else if (f == "--pairs") pairs = absl::StrSplit(v, ',');
    else if (f == "--csv") csv = v;
    else {
      std::fprintf(stderr, "moe_gemm_bench: unknown flag %s\n", f.c_str());
      return 2;
    }
  }
  auto fail = [](const absl::Status& s) {
    std::fprintf(stderr, "moe_gemm_bench: %s\n", std::string(s.message()).c_str());
    return 1;
  };
  auto manifest_bytes = ReadFileToString(dir + "/manifest.json");
  if (!manifest_bytes.ok()) return fail(manifest_bytes.status());
  auto manifest = ParseManifest(*manifest_bytes, dir + "/manifest.json");
  if (!manifest.ok()) return fail(manifest.status());
  auto driver = GetDriver();
  if (!driver.ok()) return fail(driver.status());
  DriverApi& d = **driver;
  auto ctx = PrimaryContext::Retain(d, 0);
  if (!ctx.ok()) return fail(ctx.status());
  if (auto s = ctx->MakeCurrent(); !s.ok()) return fail(s);
  int sm_count = 0;
  {
    CUdevice dev = 0;
    if (d.DeviceGet(&dev, 0) != CUDA_SUCCESS ||
        d.DeviceGetAttribute(&sm_count, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev) !=
            CUDA_SUCCESS) {
      return fail(absl::InternalError("cannot read the multiprocessor count of GPU 0"));
    }
  }
  auto cache = ModuleCache::Create(d, ctx->get());
  auto stream = Stream::Create(d);
  if (!cache.ok() || !stream.ok()) return fail(cache.ok() ? stream.status() : cache.status());

  std::map<std::pair<MoeFormat, MoeFormat>, std::vector<const KernelSpec*>> by_pair;
  for (const KernelSpec& k : manifest->kernels) {
    auto w = ParseFormat(k.weight_format), a = ParseFormat(k.activation_format);
    const std::string pair = k.weight_format + "x" + k.activation_format;
    if (!w || !a || std::find(acts.begin(), acts.end(), k.activation) == acts.end()) continue;
    if (!pairs.empty() && std::find(pairs.begin(), pairs.end(), pair) == pairs.end()) continue;
    by_pair[{*w, *a}].push_back(&k);
  }

  std::vector<Result> all, best;
  uint64_t seed = 1;
  for (const Shape& s : kShapes) {
    if (!shapes.empty() && std::find(shapes.begin(), shapes.end(), s.name) == shapes.end()) continue;
    for (const auto& [pair, kernels] : by_pair) {
      auto in = MakeInputs(d, s, pair.first, pair.second, seed += 10);
      if (!in.ok()) return fail(in.status());
      const int64_t t = int64_t{s.experts} * s.tokens_per_expert;
      const double flops = 2.0 * t * s.n * s.k;
      std::map<std::string, Result> best_by_act;
      for (const KernelSpec* k : kernels) {
        const MoeActivation act = *ParseAct(k->activation);
        MoeGemmParams p = MoeGemmParamsInit();
        p.num_experts = s.experts;
        p.num_tokens = static_cast<int32_t>(t);
        p.n = s.n;
        p.k = s.k;
        auto ptr = [](const DeviceBuffer& b) { return b.size() ? reinterpret_cast<void*>(b.get()) : nullptr; };
        p.a = ptr(in->a);
        p.b = ptr(in->b);
        p.a_scale = ptr(in->a_scale);
        p.b_scale = ptr(in->b_scale);
        p.a_global_scale = static_cast<const float*>(ptr(in->a_gs));
        p.b_global_scale = static_cast<const float*>(ptr(in->b_gs));
        p.offsets = static_cast<const int32_t*>(ptr(in->offsets));
        p.out = ptr(in->out);
        auto info = MoeGemmKernelInfoOf(*k);
        if (!info.ok()) return fail(info.status());
        // e4m3-output kernels (version 4) scale their output by A's per-tensor scale
        // (any fp32 serves for timing); out, sized for bf16, holds their bytes too.
        const bool fp8_out = info->output_format == kFp8;
        if (fp8_out) p.out_scale = p.a_global_scale;
        const std::string err = MoeGemmCheck(p, {pair.first, pair.second, act, k->tile_m,
                                                 k->tile_n, info->abi, info->output_format});
        if (!err.empty()) {
          std::printf("skip %s on %s: %s\n", k->name.c_str(), s.name, err.c_str());
          continue;
        }
        const Artifact* art = manifest->FindArtifact(k->artifact);
        auto img = (*cache)->AddImageFile(dir + "/" + k->artifact, {.expected_sha256 = art->sha256});
        if (!img.ok()) return fail(img.status());
        auto fid = (*cache)->AddFunction(*img, k->function, k->shared_mem_bytes);
        if (!fid.ok()) return fail(fid.status());
        auto fn = (*cache)->GetFunction(*fid);
        if (!fn.ok()) return fail(fn.status());
        MoeGemmLaunch prepared;
        if (auto st = PrepareMoeGemmLaunch(d, *info, p, sm_count, &prepared); !st.ok()) {
          return fail(st);
        }
        const MoeGemmGrid g = prepared.grid;
        auto launch = [&] {
          return CuCheck(d, d.LaunchKernel(*fn, g.x, g.y, g.z, k->threads, 1, 1,
                                           k->shared_mem_bytes, stream->get(),
                                           prepared.kernel_params(), nullptr),
                         "launch " + k->name);
        };
        for (int i = 0; i < warmup; ++i) {
          if (auto st = launch(); !st.ok()) return fail(st);
        }
        std::vector<float> ms;
        for (int i = 0; i < reps; ++i) {
          auto e0 = Event::Create(d), e1 = Event::Create(d);
          if (!e0.ok() || !e1.ok()) return fail(e0.ok() ? e1.status() : e0.status());
          if (auto st = e0->Record(stream->get()); !st.ok()) return fail(st);
          if (auto st = launch(); !st.ok()) return fail(st);
          if (auto st = e1->Record(stream->get()); !st.ok()) return fail(st);
          if (auto st = e1->Synchronize(); !st.ok()) return fail(st);
          auto el = Event::ElapsedMs(*e0, *e1);
          if (!el.ok()) return fail(el.status());
          ms.push_back(*el);
        }
        std::sort(ms.begin(), ms.end());
        const double us = 1000.0 * ms[ms.size() / 2];
        const MoeGemmBytes sizes =
            MoeGemmBytesFor(pair.first, pair.second, act, s.experts, t, s.n, s.k);
        const double bytes = static_cast<double>(sizes.inputs() + sizes.out);
        Result r{s.name, FormatName(pair.first) + std::string("x") + FormatName(pair.second),
                 k->activation, k->name, us, flops / us * 1e-6, bytes / us * 1e-6};
        all.push_back(r);
        if (fp8_out) continue;  // another output than the rest: listed, not ranked
        auto& b = best_by_act[k->activation];
        if (b.kernel.empty() || r.us < b.us) b = r;
      }
      for (auto& [a, r] : best_by_act) best.push_back(r);
    }
  }
  if (!csv.empty()) {
    std::ofstream out(csv);
    out << "shape,pair,activation,kernel,us,tflops,tbps\n";
    for (const Result& r : all) {
      out << absl::StrFormat("%s,%s,%s,%s,%.1f,%.1f,%.3f\n", r.shape, r.pair, r.act,
                             r.kernel, r.us, r.tflops, r.tbps);
    }
  }
  std::printf("| shape | pair | activation | best kernel | median us | TFLOP/s | TB/s |\n");
  std::printf("| --- | --- | --- | --- | ---: | ---: | ---: |\n");
  for (const Result& r : best) {
    std::printf("| %s | %s | %s | %s | %.1f | %.1f | %.2f |\n", r.shape.c_str(),
                r.pair.c_str(), r.act.c_str(), r.kernel.c_str(), r.us, r.tflops, r.tbps);
  }
  return 0;
}

}  // namespace
}  // namespace cubist::bench

int main(int argc, char** argv) { return cubist::bench::Main(argc, argv); }
