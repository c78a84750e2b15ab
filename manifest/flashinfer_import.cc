#include "manifest/flashinfer_import.h"

#include <cctype>
#include <optional>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/sha256.h"
#include "base/status_macros.h"
#include "base/strings.h"
#include "manifest/message_text.h"

namespace cubist {
namespace {

// trtllm-gen's Dtype is a bit field: (block << 24) | (signed << 20) | (integer << 16) |
// (bits << 8) | uid (trtllm/gen/DtypeDecl.h of the pin). Only the codes a GEMM operand
// or output can have are listed; `format` is the dispatcher's name, "" when it has none.
struct DtypeInfo {
  int64_t code;
  std::string_view trtllm;
  std::string_view format;
};
constexpr DtypeInfo kDtypes[] = {
    {0x100000 | (16 << 8) | 0, "Bfloat16", "bf16"},
    {0x1000000 | 0x100000 | (4 << 8) | 2, "E2m1", "nvfp4"},  // 16-element e4m3 scales
    {0x100000 | (8 << 8) | 5, "E4m3", "fp8"},  // "fp8-block" with mUseDeepSeekFp8
    {0x100000 | (8 << 8) | 6, "E5m2", ""},
    {0x100000 | (16 << 8) | 7, "Fp16", "fp16"},
    {0x100000 | (32 << 8) | 8, "Fp32", ""},
    {0x1000000 | 0x100000 | (4 << 8) | 12, "MxE2m1", "mxfp4"},
    {0x1000000 | 0x100000 | (8 << 8) | 13, "MxE4m3", "mxfp8"},
    {0x1000000 | 0x100000 | 0x10000 | (4 << 8) | 14, "MxInt4", "mxint4"},
};

const DtypeInfo* FindDtype(int64_t code) {
  for (const DtypeInfo& d : kDtypes) {
    if (d.code == code) return &d;
  }
  return nullptr;
}

// gemm::EltwiseActType (Enums.h) and gemmGatedAct::ActType (GemmGatedActOptions.h); the
// gated one applies only when mFusedAct is set.
constexpr std::string_view kEltwise[] = {"identity", "gelu", "relu2", "silu"};
constexpr std::string_view kGated[] = {"swiglu", "geglu"};
// gemm::MatrixLayout.
constexpr std::string_view kLayouts[] = {"MajorK", "MajorMn", "BlockMajorK"};

std::string JsonString(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

class EntryReader {
 public:
  EntryReader(const TrtllmGenKernelMeta& m, std::string_view source) : m_(m), source_(source) {}

  absl::Status Error(std::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat(Sv(source_), ":", m_.line, ": kernel ",
                                                   m_.function, ": ", Sv(what)));
  }

  absl::StatusOr<int64_t> Int(std::string_view option) const {
    const MetaValue* v = m_.Find(option);
    if (v == nullptr) return Error(absl::StrCat("option ", Sv(option), " is missing"));
    std::optional<int64_t> i = v->Int();
    if (!i.has_value()) {
      return Error(absl::StrCat("option ", Sv(option), ": expected an integer, got ",
                                QuoteForMessage(v->text)));
    }
    return *i;
  }
  // For options that older or newer generators may leave out.
  int64_t IntOr(std::string_view option, int64_t fallback) const {
    const MetaValue* v = m_.Find(option);
    if (v == nullptr) return fallback;
    return v->Int().value_or(fallback);
  }
  absl::StatusOr<int> Dim(std::string_view option, int max) const {
    CUBIST_ASSIGN_OR_RETURN(int64_t v, Int(option));
    if (v < 1 || v > max) {
      return Error(absl::StrCat("option ", Sv(option), ": expected 1..", max, ", got ", v));
    }
    return static_cast<int>(v);
  }
  absl::StatusOr<const DtypeInfo*> Dtype(std::string_view option) const {
    CUBIST_ASSIGN_OR_RETURN(int64_t code, Int(option));
    const DtypeInfo* d = FindDtype(code);
    if (d == nullptr) {
      return Error(absl::StrCat("option ", Sv(option), ": unknown trtllm-gen dtype code ",
                                code, "; this cubist predates the pin's generator"));
    }
    return d;
  }

 private:
  const TrtllmGenKernelMeta& m_;
  std::string_view source_;
};

// The operands' dtypes, as trtllm-gen names them; with mTransposeMmaOutput, A holds the
// weights and B the tokens.
struct TrtllmGenDtypes {
  const DtypeInfo* a = nullptr;
  const DtypeInfo* b = nullptr;
  const DtypeInfo* c = nullptr;
  bool transposed = false;
  bool deepseek = false;  // mUseDeepSeekFp8: fp8 with 128-element block scales
  const DtypeInfo* weights() const { return transposed ? a : b; }
  const DtypeInfo* tokens() const { return transposed ? b : a; }
};

absl::StatusOr<TrtllmGenDtypes> ReadDtypes(const EntryReader& r) {
  TrtllmGenDtypes d;
  CUBIST_ASSIGN_OR_RETURN(d.a, r.Dtype("mDtypeA"));
  CUBIST_ASSIGN_OR_RETURN(d.b, r.Dtype("mDtypeB"));
  CUBIST_ASSIGN_OR_RETURN(d.c, r.Dtype("mDtypeC"));
  d.transposed = r.IntOr("mTransposeMmaOutput", 0) != 0;
  d.deepseek = r.IntOr("mUseDeepSeekFp8", 0) != 0;
  return d;
}

// The dispatcher's format name of one operand's dtype.
absl::StatusOr<std::string> OperandFormat(const EntryReader& r, const TrtllmGenDtypes& d,
                                          const DtypeInfo* dtype, std::string_view operand) {
  if (dtype->format.empty()) {
    return r.Error(absl::StrCat(Sv(operand), " dtype ", Sv(dtype->trtllm),
                                " has no cubist format name"));
  }
  if (dtype->format == "fp8" && d.deepseek) return std::string("fp8-block");
  return std::string(dtype->format);
}

// The epilogue: a gated activation when mFusedAct is set, else the element-wise one.
absl::StatusOr<std::string> ReadActivation(const EntryReader& r, bool fused) {
  if (fused) {
    CUBIST_ASSIGN_OR_RETURN(int64_t act, r.Int("mActType"));
    if (act < 0 || act >= static_cast<int64_t>(std::size(kGated))) {
      return r.Error(absl::StrCat("option mActType: unknown gated activation ", act,
                                  " (known: 0 SwiGlu, 1 GeGlu)"));
    }
    return std::string(kGated[act]);
  }
  const int64_t act = r.IntOr("mEltwiseActType", 0);
  if (act < 0 || act >= static_cast<int64_t>(std::size(kEltwise))) {
    return r.Error(absl::StrCat("option mEltwiseActType: unknown activation ", act,
                                " (known: 0 None, 1 Gelu, 2 Relu2, 3 Silu)"));
  }
  return std::string(kEltwise[act]);
}

// trtllm-gen's tile in its own M/N/K order (M along weight rows when transposed).
struct TrtllmGenTile {
  int m = 0;
  int n = 0;
  int k = 0;
};

// Tile, cluster, stages and the launch shape; the tile in the dispatcher's order (M
// along tokens).
absl::StatusOr<TrtllmGenTile> ReadLaunchShape(const EntryReader& r, const TrtllmGenKernelMeta& m,
                                              bool transposed, KernelSpec* k) {
  constexpr int kMaxTile = 1 << 16;
  TrtllmGenTile t;
  CUBIST_ASSIGN_OR_RETURN(t.m, r.Dim("mTileM", kMaxTile));
  CUBIST_ASSIGN_OR_RETURN(t.n, r.Dim("mTileN", kMaxTile));
  CUBIST_ASSIGN_OR_RETURN(t.k, r.Dim("mTileK", kMaxTile));
  k->tile_m = transposed ? t.n : t.m;  // along tokens
  k->tile_n = transposed ? t.m : t.n;  // along weight rows
  k->tile_k = t.k;
  CUBIST_ASSIGN_OR_RETURN(k->cluster[0], r.Dim("mClusterDimX", 16));
  CUBIST_ASSIGN_OR_RETURN(k->cluster[1], r.Dim("mClusterDimY", 16));
  CUBIST_ASSIGN_OR_RETURN(k->cluster[2], r.Dim("mClusterDimZ", 16));
  const MetaValue* stages = m.Find("mNumStages");
  if (stages == nullptr) stages = m.Find("mNumStagesA");
  k->stages = static_cast<int>(stages != nullptr ? stages->Int().value_or(1) : 1);
  if (k->stages < 1 || k->stages > 1024) return r.Error("stages outside 1..1024");
  k->threads = static_cast<int>(m.threads);
  k->shared_mem_bytes = static_cast<int>(m.shared_mem_bytes);
  return t;
}

// What FlashInfer's launcher matches on besides formats and tiles, so that a
// trtllm-gen launcher can be added without re-importing.
ExtraFields TrtllmGenExtras(const EntryReader& r, const TrtllmGenKernelMeta& m,
                            const TrtllmGenDtypes& d, bool fused, const TrtllmGenTile& t) {
  ExtraFields x;
  x["gated"] = fused ? "true" : "false";
  x["dtype_a"] = JsonString(d.a->trtllm);
  x["dtype_b"] = JsonString(d.b->trtllm);
  x["dtype_c"] = JsonString(d.c->trtllm);
  if (!d.c->format.empty()) x["output_format"] = JsonString(d.c->format);
  if (const DtypeInfo* acc = FindDtype(r.IntOr("mDtypeAcc", -1))) {
    x["dtype_acc"] = JsonString(acc->trtllm);
  }
  x["transpose_mma_output"] = d.transposed ? "true" : "false";
  x["deepseek_fp8"] = d.deepseek ? "true" : "false";
  x["shuffled_matrix"] = r.IntOr("mUseShuffledMatrix", 0) != 0 ? "true" : "false";
  x["trtllm_tile"] = absl::StrCat("[", t.m, ",", t.n, ",", t.k, "]");
  x["mma"] = absl::StrCat("[", r.IntOr("mMmaM", 0), ",", r.IntOr("mMmaN", 0), ",",
                          r.IntOr("mMmaK", 0), "]");
  x["epilogue_tile"] = absl::StrCat("[", r.IntOr("mEpilogueTileM", 0), ",",
                                    r.IntOr("mEpilogueTileN", 0), "]");
  for (const char* layout : {"mLayoutA", "mLayoutB"}) {
    const int64_t l = r.IntOr(layout, 0);
    const std::string key = layout[7] == 'A' ? "layout_a" : "layout_b";
    x[key] = l >= 0 && l < static_cast<int64_t>(std::size(kLayouts))
                 ? JsonString(kLayouts[l])
                 : absl::StrCat(l);
  }
  x["sm_version"] = JsonString(m.sm_version);
  return x;
}

}  // namespace

std::string TrtllmGenCubinName(std::string_view function) {
  std::string name(function);
  if (!name.empty()) name[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(name[0])));
  return name + ".cubin";
}

std::string FlashinferPinFromLocation(std::string_view location) {
  std::string_view s = location;
  if (const size_t q = s.find_first_of("?#"); q != std::string_view::npos &&
                                              s.find("://") != std::string_view::npos) {
    s = s.substr(0, q);
  }
  const size_t file = s.rfind('/');
  if (file == std::string_view::npos) return "";
  s = s.substr(0, file);  // the pin directory
  const size_t name = s.rfind('/');
  if (name == std::string_view::npos) return "";
  const size_t commit = s.rfind('/', name - 1);
  std::string_view hex = s.substr(commit == std::string_view::npos ? 0 : commit + 1,
                                  name - (commit == std::string_view::npos ? 0 : commit + 1));
  if (hex.size() != 40) return "";
  for (char c : hex) {
    if (!std::isxdigit(static_cast<unsigned char>(c))) return "";
  }
  return absl::StrCat(Sv(hex), "/", Sv(s.substr(name + 1)));
}

absl::StatusOr<KernelSpec> TrtllmGenKernelSpec(const TrtllmGenKernelMeta& m,
                                               std::string_view source) {
  EntryReader r(m, source);
  KernelSpec k;
  k.name = m.function;
  k.function = m.function;
  k.artifact = TrtllmGenCubinName(m.function);
  k.op = kTrtllmBmmOp;
  k.abi = 1;
  // "Sm100f" -> "sm_100f".
  if (m.sm_version.size() < 4 || m.sm_version.substr(0, 2) != "Sm") {
    return r.Error(absl::StrCat("SM version ", QuoteForMessage(m.sm_version),
                                " is not SmNN[a|f]"));
  }
  k.arch = absl::StrCat("sm_", m.sm_version.substr(2));
  CUBIST_ASSIGN_OR_RETURN(const TrtllmGenDtypes dtypes, ReadDtypes(r));
  CUBIST_ASSIGN_OR_RETURN(k.weight_format, OperandFormat(r, dtypes, dtypes.weights(), "weight"));
  CUBIST_ASSIGN_OR_RETURN(k.activation_format,
                          OperandFormat(r, dtypes, dtypes.tokens(), "activation"));
  const bool fused = r.IntOr("mFusedAct", 0) != 0;
  CUBIST_ASSIGN_OR_RETURN(k.activation, ReadActivation(r, fused));
  CUBIST_ASSIGN_OR_RETURN(const TrtllmGenTile tile, ReadLaunchShape(r, m, dtypes.transposed, &k));
  k.extras = TrtllmGenExtras(r, m, dtypes, fused, tile);
  return k;
}

absl::StatusOr<Manifest> ImportFlashinferPin(const Manifest& checksums,
                                             std::string_view header,
                                             std::string_view header_source,
                                             const FlashinferImportOptions& options) {
  if (const Artifact* h = checksums.FindArtifact(options.header_path); h != nullptr) {
    const std::string actual = Sha256Hex(header);
    if (actual != h->sha256) {
      return absl::DataLossError(absl::StrCat(
          Sv(header_source), ": sha256 ", actual, " but ", checksums.source,
          " lists ", h->sha256, " for ", options.header_path,
          "; the header belongs to another pin or is corrupt: fetch it again"));
    }
  }
  CUBIST_ASSIGN_OR_RETURN(TrtllmGenMetaInfo info, ParseTrtllmGenMetaInfo(header, header_source));
  Manifest m;
  m.name = options.name.empty() ? checksums.name : options.name;
  m.version = options.version;
  m.base_urls = options.base_urls;
  m.artifacts = checksums.artifacts;
  // FlashInfer reads checksums.txt from the pin directory (and checks its hash against
  // the one compiled into it), so the file is part of what a node needs.
  if (!checksums.digest.empty() && checksums.FindArtifact(kFlashinferChecksumsPath) == nullptr) {
    Artifact sums;
    sums.path = kFlashinferChecksumsPath;
    sums.sha256 = checksums.digest;
    m.artifacts.push_back(std::move(sums));
  }
  if (!options.pin.empty()) m.extras[kFlashinferPinExtra] = JsonString(options.pin);
  if (!info.export_version.empty()) {
    m.extras["trtllm_gen_export_version"] = JsonString(info.export_version);
  }
  absl::flat_hash_map<std::string, const Artifact*> by_hash;
  for (const Artifact& a : checksums.artifacts) by_hash.emplace(a.sha256, &a);
  m.kernels.reserve(info.kernels.size());
  for (const TrtllmGenKernelMeta& meta : info.kernels) {
    CUBIST_ASSIGN_OR_RETURN(KernelSpec k, TrtllmGenKernelSpec(meta, header_source));
    const Artifact* a = checksums.FindArtifact(k.artifact);
    if (a == nullptr) {
      // A renamed file still counts when its bytes are the ones the header names.
      auto it = by_hash.find(meta.sha256);
      if (it == by_hash.end()) {
        return absl::NotFoundError(absl::StrCat(
            Sv(header_source), ":", meta.line, ": kernel ", meta.function, ": its cubin ",
            k.artifact, " (sha256 ", meta.sha256, ") is not in ", checksums.source,
            "; the header and checksums.txt come from different pins"));
      }
      a = it->second;
      k.artifact = a->path;
    }
    if (a->sha256 != meta.sha256) {
      return absl::DataLossError(absl::StrCat(
          Sv(header_source), ":", meta.line, ": kernel ", meta.function, ": the header's sha256 ",
          meta.sha256, " for ", a->path, " differs from ", checksums.source, "'s ",
          a->sha256, "; the pin contradicts itself: fetch both files again"));
    }
    m.kernels.push_back(std::move(k));
  }
  return m;
}

}  // namespace cubist
