#include "dispatch/moe_gemm_launch.h"

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "base/strings.h"
#include "dispatch/moe_types.h"
#include "dispatch/registry.h"
#include "loader/device_memory.h"

namespace cubist {
namespace {

// The maps are copied bytewise into MoeTensorMap, which has the 64-byte alignment TMA
// requires (CUDA 13's header over-aligns CUtensorMap to 128).
static_assert(sizeof(CUtensorMap) == sizeof(moe::MoeTensorMap) &&
                  alignof(moe::MoeTensorMap) >= 64,
              "MoeTensorMap must stand for CUtensorMap");

// A 2-D tensor map: `rows` rows of `row_bytes` bytes (K elements; bf16 as bf16, every
// narrower format as bytes: fp4 packs two elements in one), box of 128 bytes x box_rows.
struct MapKey {
  uint64_t address = 0;
  uint64_t rows = 0;
  uint64_t row_bytes = 0;
  uint32_t elem_bytes = 0;
  uint32_t box_rows = 0;
  bool operator==(const MapKey&) const = default;
};

// Per-thread cache of recently encoded maps (weights of a few layers and their activation
// buffers). Replacement is round-robin; a hit costs a few compares.
class MapCache {
 public:
  const moe::MoeTensorMap* Find(const MapKey& key) const {
    for (int i = 0; i < kSize; ++i) {
      if (used_[i] && keys_[i] == key) return &maps_[i];
    }
    return nullptr;
  }
  void Insert(const MapKey& key, const moe::MoeTensorMap& map) {
    keys_[next_] = key;
    maps_[next_] = map;
    used_[next_] = true;
    next_ = (next_ + 1) % kSize;
  }

 private:
  static constexpr int kSize = 16;
  MapKey keys_[kSize];
  moe::MoeTensorMap maps_[kSize];
  bool used_[kSize] = {};
  int next_ = 0;
};

thread_local MapCache t_maps;

absl::Status EncodeMap(DriverApi& d, const MapKey& key, const char* operand,
                       moe::MoeTensorMap* out) {
  if (const moe::MoeTensorMap* hit = t_maps.Find(key)) {
    *out = *hit;
    return absl::OkStatus();
  }
  const cuuint64_t dims[2] = {key.row_bytes / key.elem_bytes, key.rows};
  const cuuint64_t strides[1] = {key.row_bytes};
  const cuuint32_t box[2] = {static_cast<cuuint32_t>(moe::kMoeGemmTmaBoxBytes / key.elem_bytes),
                             key.box_rows};
  const cuuint32_t elem_strides[2] = {1, 1};
  CUtensorMap map;
  const CUresult r = d.TensorMapEncodeTiled(
      &map, key.elem_bytes == 2 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_UINT8,
      2, reinterpret_cast<void*>(key.address), dims, strides, box, elem_strides,
      CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
      CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r == CUDA_ERROR_NOT_SUPPORTED) {
    return absl::FailedPreconditionError(
        "moe_gemm: this driver cannot encode TMA tensor maps (cuTensorMapEncodeTiled needs "
        "CUDA 12.0); update the NVIDIA driver");
  }
  if (r != CUDA_SUCCESS) {
    return CuCheck(d, r,
                   absl::StrCat("moe_gemm: tensor map of ", operand, " [", key.rows, " x ",
                                dims[0], "] at 0x", absl::Hex(key.address), ", box ",
                                box[1], " x ", box[0]));
  }
  std::memcpy(out, &map, sizeof(map));
  t_maps.Insert(key, *out);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<MoeGemmKernelInfo> MoeGemmKernelInfoOf(const KernelSpec& spec) {
  auto bad = [&](const char* field, absl::string_view what) {
    return absl::InvalidArgumentError(
        absl::StrCat("kernel ", spec.name, ": ", field, ": ", what));
  };
  MoeGemmKernelInfo k;
  if (spec.abi == moe::kMoeGemmAbiRetiredV1) {
    return bad("abi", moe::kMoeGemmAbiRetiredFix);
  }
  if (spec.abi < moe::kMoeGemmAbiOldest || spec.abi > moe::kMoeGemmAbi) {
    return bad("abi", absl::StrCat("parameter struct version ", spec.abi,
                                   "; this build fills versions ", moe::kMoeGemmAbiOldest,
                                   " to ", moe::kMoeGemmAbi, " (a newer cubist launches it)"));
  }
  k.abi = spec.abi;
  auto w = ParseDataFormat(spec.weight_format);
  if (!w.ok()) return bad("weight_format", w.status().message());
  auto a = ParseDataFormat(spec.activation_format);
  if (!a.ok()) return bad("activation_format", a.status().message());
  auto act = ParseActivation(spec.activation);
  if (!act.ok()) return bad("activation", act.status().message());
  if (!OpSupports(Op::kMoeGemm, *w) || !OpSupports(Op::kMoeGemm, *a)) {
    return bad("weight_format", "not a moe_gemm format");
  }
  if (!OpSupports(Op::kMoeGemm, *act)) return bad("activation", "not a moe_gemm activation");
  k.weight_format = *w;
  k.activation_format = *a;
  k.activation = *act;
  k.tile_m = spec.tile_m;
  k.tile_n = spec.tile_n;
  // The kernels split B between the CTAs of a cluster along x (their B box is
  // tile_n / cluster rows).
  if (spec.cluster[1] != 1 || spec.cluster[2] != 1 ||
      (spec.cluster[0] != 1 && spec.cluster[0] != 2)) {
    return bad("cluster", absl::StrCat("[", spec.cluster[0], ", ", spec.cluster[1], ", ",
                                       spec.cluster[2],
                                       "]; moe_gemm kernels take [1, 1, 1] or [2, 1, 1]"));
  }
  k.cluster = spec.cluster[0];
  if (auto it = spec.extras.find("ctas_per_sm"); it != spec.extras.end()) {
    int v = 0;
    if (!absl::SimpleAtoi(it->second, &v) || v < 1 || v > 32) {
      return bad("ctas_per_sm", absl::StrCat("expected an integer in 1..32, got ", it->second));
    }
    k.ctas_per_sm = v;
  }
  if (auto it = spec.extras.find("max_experts"); it != spec.extras.end()) {
    int v = 0;
    if (!absl::SimpleAtoi(it->second, &v) || v < 1) {
      return bad("max_experts", absl::StrCat("expected a positive integer, got ", it->second));
    }
    k.max_experts = std::min(k.max_experts, v);
  }
  if (auto it = spec.extras.find("pdl"); it != spec.extras.end()) {
    if (it->second != "true" && it->second != "false") {
      return bad("pdl", absl::StrCat("expected true or false, got ", it->second));
    }
    k.pdl = it->second == "true";
  }
  const std::string_view out = KernelOutputFormat(spec);
  if (out == "fp8") {
    if (spec.abi < moe::kMoeGemmAbiV4) {
      return bad("output_format", absl::StrCat("fp8 needs parameter struct version ",
                                               moe::kMoeGemmAbiV4, " (out_scale), the entry "
                                               "says ", spec.abi, "; rebuild the kernel with "
                                               "scripts/build-artifacts"));
    }
    k.output_format = moe::kFp8;
  } else if (out != "bf16") {
    return bad("output_format", absl::StrCat("moe_gemm kernels write bf16 or fp8, got ", Sv(out)));
  }
  if (auto it = spec.extras.find("a_gather"); it != spec.extras.end()) {
    if (it->second != "true" && it->second != "false") {
      return bad("a_gather", absl::StrCat("expected true or false, got ", it->second));
    }
    k.a_gather = it->second == "true";
    if (k.a_gather && spec.abi < moe::kMoeGemmAbiV5) {
      return bad("a_gather", absl::StrCat("gathering A needs parameter struct version ",
                                          moe::kMoeGemmAbiV5, " (a_row_map), the entry says ",
                                          spec.abi, "; rebuild the kernel with "
                                          "scripts/build-artifacts"));
    }
  }
  return k;
}

int32_t MoeGemmExpertsPerLaunch(const MoeGemmKernelInfo& k) {
  return k.max_experts > 0 ? k.max_experts : 0x7FFFFFFF;
}

moe::MoeGemmParams MoeGemmExpertGroup(const moe::MoeGemmParams& p, const MoeGemmKernelInfo& k,
                                      int32_t first, int32_t count) {
  // One expert's bytes of each per-expert array, as the ABI lays them out.
  const moe::MoeGemmBytes one = moe::MoeGemmBytesFor(
      k.weight_format, k.activation_format, k.activation, 1, 0, p.n, p.k);
  auto at = [first](const auto* base, int64_t bytes_per_expert) {
    using T = std::remove_pointer_t<decltype(base)>;
    return base == nullptr ? nullptr
                           : reinterpret_cast<T*>(reinterpret_cast<uintptr_t>(base) +
                                                  bytes_per_expert * first);
  };
  moe::MoeGemmParams g = p;
  g.num_experts = count;
  g.offsets = at(p.offsets, 4);
  g.b = at(p.b, one.b);
  g.b_scale = at(p.b_scale, one.b_scale);
  g.b_global_scale = at(p.b_global_scale, 4);
  g.alpha = at(p.alpha, 4);
  g.beta = at(p.beta, 4);
  g.limit = at(p.limit, 4);
  g.bias = at(p.bias, 4 * int64_t{p.n});
  return g;
}

absl::Status PrepareMoeGemmLaunch(DriverApi& driver, const MoeGemmKernelInfo& k,
                                  const moe::MoeGemmParams& p, int sm_count,
                                  MoeGemmLaunch* out) {
  out->params.g = p;
  out->params.g.abi = k.abi;  // 2 to 5: the same struct
  if (!k.a_gather) {
    // Versions 2-4 had padding where the gather fields are: keep it zero.
    out->params.g.a_row_map = nullptr;
    out->params.g.a_row_divisor = 0;
    out->params.g.a_rows = 0;
  }
  // A gathering kernel reads A's rows without the map (cp.async through a_row_map): it
  // gets a one-row map at A, valid and the same whatever the batch, so that a batch of
  // another size hits the cache instead of encoding a map nothing reads (MoeLayer passes
  // the pass's token count as a_rows).
  const int64_t a_rows = k.a_gather ? 1 : p.num_tokens;
  auto row_bytes = [&](moe::MoeFormat f) {
    return static_cast<uint64_t>(p.k) * moe::FormatBits(f) / 8;
  };
  auto elem_bytes = [](moe::MoeFormat f) { return f == moe::kBf16 ? 2u : 1u; };
  // T = 0 launches read no row of A, but a map needs at least one row.
  const MapKey a_key{reinterpret_cast<uint64_t>(p.a),
                     static_cast<uint64_t>(a_rows > 0 ? a_rows : 1),
                     row_bytes(k.activation_format), elem_bytes(k.activation_format),
                     static_cast<uint32_t>(k.tile_m)};
  const MapKey b_key{reinterpret_cast<uint64_t>(p.b),
                     static_cast<uint64_t>(p.num_experts) * static_cast<uint64_t>(p.n),
                     row_bytes(k.weight_format), elem_bytes(k.weight_format),
                     static_cast<uint32_t>(moe::MoeGemmTmaBRows(k.tile_n, k.activation) /
                                           k.cluster)};
  CUBIST_RETURN_IF_ERROR(EncodeMap(driver, a_key, "a", &out->params.a_map));
  CUBIST_RETURN_IF_ERROR(EncodeMap(driver, b_key, "b", &out->params.b_map));
  out->grid = MoeGemmLaunchGrid(k, p, sm_count);
  return absl::OkStatus();
}

moe::MoeGemmGrid MoeGemmLaunchGrid(const MoeGemmKernelInfo& k, const moe::MoeGemmParams& p,
                                   int sm_count) {
  moe::MoeGemmGrid g = moe::MoeGemmPersistentGridFor(p, k.activation, k.tile_m, k.tile_n,
                                                     sm_count, k.ctas_per_sm);
  g.x = (g.x + k.cluster - 1) / k.cluster * k.cluster;
  return g;
}

CUlaunchConfig MoeGemmLaunch::Config(unsigned block, unsigned shared_mem_bytes,
                                     const unsigned (&cluster)[3],
                                     bool programmatic_dependent_launch, CUstream stream) {
  CUlaunchConfig config = {};
  config.gridDimX = grid.x;
  config.gridDimY = grid.y;
  config.gridDimZ = grid.z;
  config.blockDimX = block;
  config.blockDimY = 1;
  config.blockDimZ = 1;
  config.sharedMemBytes = shared_mem_bytes;
  config.hStream = stream;
  unsigned num_attrs = 0;
  if (cluster[0] * cluster[1] * cluster[2] > 1) {
    attrs[num_attrs].id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
    attrs[num_attrs].value.clusterDim.x = cluster[0];
    attrs[num_attrs].value.clusterDim.y = cluster[1];
    attrs[num_attrs].value.clusterDim.z = cluster[2];
    ++num_attrs;
  }
  if (programmatic_dependent_launch) {
    attrs[num_attrs].id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    attrs[num_attrs].value.programmaticStreamSerializationAllowed = 1;
    ++num_attrs;
  }
  config.attrs = num_attrs > 0 ? attrs : nullptr;
  config.numAttrs = num_attrs;
  return config;
}

}  // namespace cubist
