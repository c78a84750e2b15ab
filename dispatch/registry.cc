#include "dispatch/registry.h"

#include <algorithm>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "base/strings.h"
#include "kernels/moe_gemm_layout.h"

namespace cubist {
namespace {

// The largest dynamic shared memory any current GPU grants one block (sm_90, sm_100:
// 227 KiB). A manifest asking for more describes a kernel that cannot launch anywhere.
constexpr int kMaxSharedMemBytes = moe::kMaxDynamicSmem;
constexpr int kMaxClusterCtas = 16;

class EntryErrors {
 public:
  EntryErrors(const Manifest& m, size_t i) : source_(m.source), index_(i) {
    if (source_.empty()) source_ = "<memory>";
  }
  absl::Status Error(std::string_view field, std::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat(source_, ": kernels[", index_,
                                                   "].", Sv(field), ": ", Sv(what)));
  }

 private:
  std::string source_;
  size_t index_;
};

// Reads an optional positive integer constraint from the kernel's extras (raw JSON).
absl::Status ReadConstraint(const KernelSpec& spec, const EntryErrors& err,
                            const char* key, int64_t* out) {
  auto it = spec.extras.find(key);
  if (it == spec.extras.end()) return absl::OkStatus();
  int64_t v = 0;
  if (!absl::SimpleAtoi(it->second, &v) || v < 1) {
    return err.Error(key, absl::StrCat("expected a positive integer, got ", it->second));
  }
  *out = v;
  return absl::OkStatus();
}

// Reads an optional boolean (JSON true or false) from the kernel's extras; *present says
// whether the key was there.
absl::Status ReadBool(const KernelSpec& spec, const EntryErrors& err, const char* key,
                      bool* out, bool* present = nullptr) {
  auto it = spec.extras.find(key);
  if (present != nullptr) *present = it != spec.extras.end();
  if (it == spec.extras.end()) return absl::OkStatus();
  if (it->second != "true" && it->second != "false") {
    return err.Error(key, absl::StrCat("expected true or false, got ", it->second));
  }
  *out = it->second == "true";
  return absl::OkStatus();
}

// Reads an optional number in (0, 1] from the kernel's extras.
absl::Status ReadFraction(const KernelSpec& spec, const EntryErrors& err, const char* key,
                          double* out) {
  auto it = spec.extras.find(key);
  if (it == spec.extras.end()) return absl::OkStatus();
  double v = 0;
  if (!absl::SimpleAtod(it->second, &v) || !(v > 0 && v <= 1)) {
    return err.Error(key, absl::StrCat("expected a number in (0, 1], got ", it->second));
  }
  *out = v;
  return absl::OkStatus();
}

// The formats and the activation, each parsed and one the op has kernels for.
absl::Status ReadFormats(KernelEntry& e, const EntryErrors& err) {
  const KernelSpec& s = e.spec;
  {
    auto f = ParseDataFormat(s.weight_format);
    if (!f.ok()) return err.Error("weight_format", Sv(f.status().message()));
    e.weight_format = *f;
  }
  {
    auto f = ParseDataFormat(s.activation_format);
    if (!f.ok()) return err.Error("activation_format", Sv(f.status().message()));
    e.activation_format = *f;
  }
  {
    auto a = ParseActivation(s.activation);
    if (!a.ok()) return err.Error("activation", Sv(a.status().message()));
    e.activation = *a;
  }
  const Op op = *e.op;
  for (auto [field, format] : {std::pair{"weight_format", e.weight_format},
                               std::pair{"activation_format", e.activation_format}}) {
    if (!OpSupports(op, format)) {
      return err.Error(field, absl::StrCat("op ", Sv(OpName(op)), " has no ",
                                           Sv(DataFormatName(format)), " kernels"));
    }
  }
  if (!OpSupports(op, e.activation)) {
    return err.Error("activation", absl::StrCat("op ", Sv(OpName(op)), " has no ",
                                                Sv(ActivationName(e.activation)), " epilogue"));
  }
  return absl::OkStatus();
}

// Tile, threads, shared memory and cluster: a launch some GPU can make.
absl::Status CheckLaunchShape(const KernelSpec& s, const EntryErrors& err) {
  if (s.tile_m < 1) return err.Error("tile_m", absl::StrCat("must be positive, got ", s.tile_m));
  if (s.tile_n < 1) return err.Error("tile_n", absl::StrCat("must be positive, got ", s.tile_n));
  if (s.tile_k < 1) return err.Error("tile_k", absl::StrCat("must be positive, got ", s.tile_k));
  if (s.threads < 32 || s.threads > 1024 || s.threads % 32 != 0) {
    return err.Error("threads", absl::StrCat("must be a multiple of 32 in 32..1024, got ",
                                             s.threads));
  }
  if (s.shared_mem_bytes < 0 || s.shared_mem_bytes > kMaxSharedMemBytes) {
    return err.Error("shared_mem_bytes",
                     absl::StrCat(s.shared_mem_bytes, " is outside 0..", kMaxSharedMemBytes,
                                  " (227 KiB, the most any GPU grants one block)"));
  }
  int64_t cluster_ctas = 1;
  for (int d : s.cluster) {
    if (d < 1) {
      return err.Error("cluster", absl::StrCat("each dimension must be at least 1, got [",
                                               s.cluster[0], ",", s.cluster[1], ",",
                                               s.cluster[2], "]"));
    }
    cluster_ctas *= d;
  }
  if (cluster_ctas > kMaxClusterCtas) {
    return err.Error("cluster", absl::StrCat(cluster_ctas, " CTAs per cluster; at most ",
                                             kMaxClusterCtas, " are possible"));
  }
  return absl::OkStatus();
}

// A gated activation needs an even tile_n, and an entry's "gated" must agree with it.
absl::Status CheckGated(const KernelEntry& e, const EntryErrors& err) {
  const KernelSpec& s = e.spec;
  bool gated = IsGated(e.activation);
  if (gated && s.tile_n % 2 != 0) {
    return err.Error("tile_n", absl::StrCat("a gated activation (", s.activation,
                                            ") needs an even tile_n, got ", s.tile_n));
  }
  bool says_gated = false, has_gated = false;
  CUBIST_RETURN_IF_ERROR(ReadBool(s, err, "gated", &says_gated, &has_gated));
  if (has_gated && says_gated != gated) {
    return err.Error("gated", absl::StrCat("says ", says_gated ? "true" : "false",
                                           " but activation '", s.activation, "' is ",
                                           gated ? "gated" : "element-wise",
                                           "; the entry is inconsistent"));
  }
  return absl::OkStatus();
}

// The optional extras: shape constraints, the cost model's efficiencies, exactness.
absl::Status ReadEntryExtras(KernelEntry& e, const EntryErrors& err) {
  const KernelSpec& s = e.spec;
  ShapeConstraints& c = e.constraints;
  CUBIST_RETURN_IF_ERROR(ReadConstraint(s, err, "k_multiple", &c.k_multiple));
  int64_t k_align = 1;
  CUBIST_RETURN_IF_ERROR(ReadConstraint(s, err, "k_align", &k_align));
  c.k_multiple = std::max(c.k_multiple, k_align);
  CUBIST_RETURN_IF_ERROR(ReadConstraint(s, err, "n_align", &c.out_n_multiple));
  CUBIST_RETURN_IF_ERROR(ReadConstraint(s, err, "n_multiple", &c.n_multiple));
  CUBIST_RETURN_IF_ERROR(ReadConstraint(s, err, "max_k", &c.max_k));
  CUBIST_RETURN_IF_ERROR(ReadConstraint(s, err, "max_n", &c.max_n));
  CUBIST_RETURN_IF_ERROR(ReadConstraint(s, err, "max_tokens", &c.max_tokens));
  CUBIST_RETURN_IF_ERROR(ReadConstraint(s, err, "max_experts", &c.max_experts));
  CUBIST_RETURN_IF_ERROR(ReadFraction(s, err, "mma_efficiency", &e.mma_efficiency));
  CUBIST_RETURN_IF_ERROR(ReadFraction(s, err, "memory_efficiency", &e.memory_efficiency));
  CUBIST_RETURN_IF_ERROR(ReadBool(s, err, "exact", &e.exact));
  int64_t row_step = std::max(1, s.tile_m);
  CUBIST_RETURN_IF_ERROR(ReadConstraint(s, err, "row_step", &row_step));
  if (s.tile_m > 0 && (row_step > s.tile_m || s.tile_m % row_step != 0)) {
    return err.Error("row_step", absl::StrCat(row_step, " does not divide tile_m ", s.tile_m,
                                              "; a tile computes its rows in whole steps"));
  }
  e.row_step = static_cast<int>(row_step);
  return absl::OkStatus();
}

absl::Status ValidateKnownOp(KernelEntry& e, const EntryErrors& err) {
  CUBIST_RETURN_IF_ERROR(ReadFormats(e, err));
  CUBIST_RETURN_IF_ERROR(CheckLaunchShape(e.spec, err));
  CUBIST_RETURN_IF_ERROR(CheckGated(e, err));
  return ReadEntryExtras(e, err);
}

// The first metadata field in which two entries for one function differ, or "".
std::string FirstDifference(const KernelSpec& a, const KernelSpec& b) {
  auto str = [](const char* field, const std::string& x, const std::string& y) {
    return x == y ? std::string() : absl::StrCat(field, " '", x, "' vs '", y, "'");
  };
  auto num = [](const char* field, int x, int y) {
    return x == y ? std::string() : absl::StrCat(field, " ", x, " vs ", y);
  };
  for (std::string d :
       {str("arch", a.arch, b.arch), str("op", a.op, b.op), num("abi", a.abi, b.abi),
        str("weight_format", a.weight_format, b.weight_format),
        str("activation_format", a.activation_format, b.activation_format),
        str("activation", a.activation, b.activation), num("tile_m", a.tile_m, b.tile_m),
        num("tile_n", a.tile_n, b.tile_n), num("tile_k", a.tile_k, b.tile_k),
        num("cluster.x", a.cluster[0], b.cluster[0]),
        num("cluster.y", a.cluster[1], b.cluster[1]),
        num("cluster.z", a.cluster[2], b.cluster[2]), num("stages", a.stages, b.stages),
        num("threads", a.threads, b.threads),
        num("shared_mem_bytes", a.shared_mem_bytes, b.shared_mem_bytes)}) {
    if (!d.empty()) return d;
  }
  return "";
}

}  // namespace

std::string_view KernelOutputFormat(const KernelSpec& spec) {
  auto it = spec.extras.find("output_format");
  if (it == spec.extras.end()) return "bf16";
  std::string_view v = it->second;
  if (v.size() >= 2 && v.front() == '"' && v.back() == '"') v = v.substr(1, v.size() - 2);
  return v;
}

bool KernelGathersA(const KernelSpec& spec) {
  auto it = spec.extras.find("a_gather");
  return it != spec.extras.end() && it->second == "true";
}

absl::StatusOr<Registry> Registry::Create(const Manifest& manifest) {
  Registry r;
  r.manifest_name_ = manifest.name;
  r.manifest_source_ = manifest.source.empty() ? "<memory>" : manifest.source;
  r.manifest_digest_ = manifest.digest;
  r.kernels_.reserve(manifest.kernels.size());
  // (artifact, function) -> first kernel index, to catch one function described twice.
  absl::flat_hash_map<std::pair<std::string, std::string>, size_t> by_function;
  for (size_t i = 0; i < manifest.kernels.size(); ++i) {
    const KernelSpec& s = manifest.kernels[i];
    EntryErrors err(manifest, i);
    if (s.name.empty()) return err.Error("name", "must not be empty");
    if (auto it = r.by_name_.find(s.name); it != r.by_name_.end()) {
      return err.Error("name", absl::StrCat("duplicate kernel name '", s.name,
                                            "' (first at kernels[", it->second,
                                            "]); kernel names must be unique"));
    }
    if (manifest.FindArtifact(s.artifact) == nullptr) {
      return err.Error("artifact", absl::StrCat("'", s.artifact,
                                                "' is not one of the manifest's artifacts"));
    }
    if (s.function.empty()) return err.Error("function", "must not be empty");
    KernelEntry e;
    e.index = i;
    e.spec = s;
    {
      auto arch = SmTarget::Parse(s.arch);
      if (!arch.ok()) return err.Error("arch", Sv(arch.status().message()));
      e.arch = *arch;
    }
    if (auto op = ParseOp(s.op); op.ok()) {
      e.op = *op;
      CUBIST_RETURN_IF_ERROR(ValidateKnownOp(e, err));
    }
    auto [fit, inserted] = by_function.try_emplace(std::make_pair(s.artifact, s.function), i);
    if (!inserted) {
      const KernelSpec& first = manifest.kernels[fit->second];
      std::string diff = FirstDifference(first, s);
      if (!diff.empty()) {
        return err.Error(
            "function",
            absl::StrCat("'", s.function, "' in '", s.artifact, "' is also kernels[",
                         fit->second, "] ('", first.name, "') with different metadata (",
                         diff, "); one function has one description"));
      }
    }
    r.by_name_.emplace(s.name, i);
    r.kernels_.push_back(std::move(e));
  }
  return r;
}

const KernelEntry* Registry::Find(std::string_view name) const {
  auto it = by_name_.find(Sv(name));
  return it == by_name_.end() ? nullptr : &kernels_[it->second];
}

}  // namespace cubist
