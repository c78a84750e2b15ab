#include "manifest/manifest_parser.h"

#include <climits>
#include <exception>
#include <string>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/hash/hash.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "base/sha256.h"
#include "base/status_macros.h"
#include "base/strings.h"
#include "manifest/json_reader.h"
#include "manifest/manifest_binary.h"
#include "manifest/message_text.h"
#include "manifest/path_rules.h"

namespace cubist {
namespace {

using json_internal::Json;
using json_internal::JsonField;
using json_internal::ReadInteger;
using json_internal::ReadNonNegativeInt;
using json_internal::ReadPositiveInt;
using json_internal::ReadString;
using json_internal::ReadToken;

// Where artifacts go as they are parsed, one at a time: built into a list, or packed.
class ArtifactSink {
 public:
  virtual ~ArtifactSink() = default;
  virtual void Add(Artifact&& a) = 0;
  virtual size_t size() const = 0;
  // The path of the artifact added `index`-th.
  virtual std::string_view PathOf(size_t index) const = 0;
};

class BuiltArtifacts : public ArtifactSink {
 public:
  explicit BuiltArtifacts(std::vector<Artifact>* out) : out_(out) {}
  void Add(Artifact&& a) override { out_->push_back(std::move(a)); }
  size_t size() const override { return out_->size(); }
  std::string_view PathOf(size_t index) const override { return (*out_)[index].path; }

 private:
  std::vector<Artifact>* out_;
};

class PackingArtifacts : public ArtifactSink {
 public:
  explicit PackingArtifacts(PackedArtifactsBuilder* out) : out_(out) {}
  void Add(Artifact&& a) override { offsets_.push_back(out_->Add(a)); }
  size_t size() const override { return offsets_.size(); }
  std::string_view PathOf(size_t index) const override {
    return out_->PathAt(offsets_[index]);
  }

 private:
  PackedArtifactsBuilder* out_;
  std::vector<size_t> offsets_;
};

// The paths of a sink's artifacts, for the duplicate, directory and kernel checks: each
// an index into the sink, 4 bytes where a set of strings held a second copy of every path.
class ArtifactPaths {
 public:
  explicit ArtifactPaths(const ArtifactSink* sink) : set_(0, Hash{sink}, Eq{sink}) {}

  // The index of the artifact with this path, if one was inserted.
  std::optional<size_t> Find(std::string_view path) const {
    auto it = set_.find(path);
    if (it == set_.end()) return std::nullopt;
    return *it;
  }
  bool contains(std::string_view path) const { return set_.contains(path); }
  // The sink's artifact at `index`, whose path is not in the set yet.
  void Insert(size_t index) { set_.insert(static_cast<uint32_t>(index)); }

 private:
  // Indices and paths alike hash and compare as the path they stand for.
  struct Hash {
    using is_transparent = void;
    const ArtifactSink* sink;
    size_t operator()(uint32_t index) const { return absl::HashOf(sink->PathOf(index)); }
    size_t operator()(std::string_view path) const { return absl::HashOf(path); }
  };
  struct Eq {
    using is_transparent = void;
    const ArtifactSink* sink;
    std::string_view View(uint32_t index) const { return sink->PathOf(index); }
    std::string_view View(std::string_view path) const { return path; }
    template <typename A, typename B>
    bool operator()(const A& a, const B& b) const {
      return View(a) == View(b);
    }
  };
  // A 64 MiB manifest holds under a million artifacts: their indices fit.
  absl::flat_hash_set<uint32_t, Hash, Eq> set_;
};

constexpr char kIntegerFrom1[] = "an integer from 1 to 9007199254740992";
constexpr char kIntegerFrom0[] = "an integer from 0 to 9007199254740992";
constexpr char kHexExpected[] = "64 lowercase hex characters";

const Json* Find(const Json& object, std::string_view key) {
  auto it = object.find(std::string(key));
  return it == object.end() ? nullptr : &*it;
}

// The value at `key`, or an error naming the missing field and what it should hold.
absl::StatusOr<const Json*> Required(const Json& object, const JsonField& field,
                                     std::string_view key, std::string_view expected) {
  const Json* v = Find(object, key);
  if (v == nullptr) return field.Key(key).Missing(expected);
  return v;
}

// Every key of `object` that is not in `known`, as compact JSON text.
template <size_t N>
ExtraFields CollectExtras(const Json& object, const char* const (&known)[N]) {
  ExtraFields extras;
  for (const auto& [key, value] : object.items()) {
    bool is_known = false;
    for (const char* k : known) is_known = is_known || key == k;
    if (!is_known) extras.emplace(key, value.dump());
  }
  return extras;
}

bool IsDigit(char c) { return c >= '0' && c <= '9'; }

// absl::ParseTime alone is lenient (surrounding spaces, one-digit months, five-digit
// years, "infinite-future"), so the RFC 3339 shape is checked first:
//   YYYY-MM-DD[Tt]hh:mm:ss[.f+]([Zz]|[+-]hh:mm)
bool HasRfc3339Shape(std::string_view s) {
  auto digits = [&](size_t pos, size_t n) {
    if (pos + n > s.size()) return false;
    for (size_t i = pos; i < pos + n; ++i) {
      if (!IsDigit(s[i])) return false;
    }
    return true;
  };
  auto at = [&](size_t pos, char c) { return pos < s.size() && s[pos] == c; };
  if (!digits(0, 4) || !at(4, '-') || !digits(5, 2) || !at(7, '-') || !digits(8, 2) ||
      !(at(10, 'T') || at(10, 't')) || !digits(11, 2) || !at(13, ':') || !digits(14, 2) ||
      !at(16, ':') || !digits(17, 2)) {
    return false;
  }
  size_t pos = 19;
  if (at(pos, '.')) {
    ++pos;
    const size_t start = pos;
    while (pos < s.size() && IsDigit(s[pos])) ++pos;
    if (pos == start) return false;
  }
  if (at(pos, 'Z') || at(pos, 'z')) return pos + 1 == s.size();
  if (!(at(pos, '+') || at(pos, '-'))) return false;
  return digits(pos + 1, 2) && at(pos + 3, ':') && digits(pos + 4, 2) && pos + 6 == s.size();
}

absl::StatusOr<absl::Time> ReadTime(const Json& value, const JsonField& field) {
  constexpr char kExpected[] = "an RFC 3339 time such as \"2027-01-01T00:00:00Z\"";
  if (!value.is_string()) return field.Expected(kExpected, value);
  const std::string& s = value.get_ref<const std::string&>();
  absl::Time t;
  std::string err;
  if (!HasRfc3339Shape(s) || !absl::ParseTime(absl::RFC3339_full, s, &t, &err)) {
    return field.Expected(kExpected, value);
  }
  // The writer prints UTC with a four-digit year; an offset can push "0000-01-01" or
  // "9999-12-31" across that range, and the time could then not be written back.
  const int64_t year = absl::ToCivilYear(t, absl::UTCTimeZone()).year();
  if (year < 0 || year > 9999) {
    return field.Expected("an RFC 3339 time within years 0000 to 9999 in UTC", value);
  }
  return t;
}

absl::StatusOr<std::string> ReadBaseUrl(const Json& value, const JsonField& field) {
  constexpr char kExpected[] = "a URL starting with http://, https:// or file://";
  if (!value.is_string()) return field.Expected(kExpected, value);
  const std::string& s = value.get_ref<const std::string&>();
  bool scheme_ok = false;
  for (std::string_view scheme : {"http://", "https://", "file://"}) {
    scheme_ok = scheme_ok || (s.size() > scheme.size() && s.compare(0, scheme.size(), scheme) == 0);
  }
  if (!scheme_ok) return field.Expected(kExpected, value);
  for (unsigned char c : s) {
    // A space or control character would be a second URL, a header, or a curl error.
    if (c <= 0x20 || c == 0x7F) {
      return field.Expected(
          "a URL without spaces or control characters (percent-encode them)", value);
    }
  }
  return s;
}

absl::StatusOr<Artifact> ParseArtifact(const Json& value, const JsonField& field,
                                       const ManifestParseOptions& options) {
  if (!value.is_object()) return field.Expected("an artifact object", value);
  Artifact a;
  CUBIST_ASSIGN_OR_RETURN(const Json* path,
                          Required(value, field, "path", "a relative path string"));
  CUBIST_ASSIGN_OR_RETURN(a.path,
                          ReadString(*path, field.Key("path"), "a relative path string"));
  if (absl::Status s = ValidateArtifactPath(a.path); !s.ok()) {
    return field.Key("path").Error(Sv(s.message()));
  }
  CUBIST_ASSIGN_OR_RETURN(const Json* sha, Required(value, field, "sha256", kHexExpected));
  if (!sha->is_string()) {
    return field.Key("sha256").Expected("a string of 64 lowercase hex characters", *sha);
  }
  a.sha256 = sha->get<std::string>();
  if (a.sha256.size() != 64) {
    return field.Key("sha256").Error(
        absl::StrCat("expected ", kHexExpected, ", got ", a.sha256.size()));
  }
  if (!IsSha256Hex(a.sha256)) {
    return field.Key("sha256").Error(
        absl::StrCat("expected ", kHexExpected, ", got ", QuoteForMessage(a.sha256, 64)));
  }
  if (const Json* size = Find(value, "size"); size != nullptr) {
    CUBIST_ASSIGN_OR_RETURN(int64_t n, ReadInteger(*size, field.Key("size"), 0,
                                                   kMaxManifestInteger, kIntegerFrom0));
    a.size = static_cast<uint64_t>(n);
  } else if (options.require_artifact_size) {
    return field.Key("size").Missing(
        absl::StrCat("the file's size in bytes, ", kIntegerFrom0));
  }
  static constexpr const char* kKnown[] = {"path", "sha256", "size"};
  a.extras = CollectExtras(value, kKnown);
  return a;
}

// `artifacts` is null when the caller checks the artifact references itself.
absl::StatusOr<KernelSpec> ParseKernel(const Json& value, const JsonField& field,
                                       const ArtifactPaths* artifacts) {
  if (!value.is_object()) return field.Expected("a kernel object", value);
  KernelSpec k;
  constexpr char kStr[] = "a non-empty string";
  constexpr char kPos[] = "a positive integer";
  auto token = [&](std::string_view key, std::string* out) -> absl::Status {
    CUBIST_ASSIGN_OR_RETURN(const Json* v, Required(value, field, key, kStr));
    CUBIST_ASSIGN_OR_RETURN(*out, ReadToken(*v, field.Key(key)));
    return absl::OkStatus();
  };
  auto positive = [&](std::string_view key, int* out) -> absl::Status {
    CUBIST_ASSIGN_OR_RETURN(const Json* v, Required(value, field, key, kPos));
    CUBIST_ASSIGN_OR_RETURN(*out, ReadPositiveInt(*v, field.Key(key)));
    return absl::OkStatus();
  };
  CUBIST_RETURN_IF_ERROR(token("name", &k.name));
  CUBIST_RETURN_IF_ERROR(token("artifact", &k.artifact));
  if (artifacts != nullptr && !artifacts->contains(k.artifact)) {
    return field.Key("artifact").Error(absl::StrCat(
        QuoteForMessage(k.artifact), " is not one of the artifacts' paths; list it in "
        "\"artifacts\" or fix the kernel's \"artifact\""));
  }
  CUBIST_RETURN_IF_ERROR(token("function", &k.function));
  CUBIST_RETURN_IF_ERROR(token("arch", &k.arch));
  if (!ValidateArch(k.arch).ok()) {
    return field.Key("arch").Expected(
        "an architecture such as \"sm_90a\", \"sm_100f\" or \"sm_120\"", *Find(value, "arch"));
  }
  CUBIST_RETURN_IF_ERROR(token("op", &k.op));
  CUBIST_RETURN_IF_ERROR(positive("abi", &k.abi));
  CUBIST_RETURN_IF_ERROR(token("weight_format", &k.weight_format));
  CUBIST_RETURN_IF_ERROR(token("activation_format", &k.activation_format));
  CUBIST_RETURN_IF_ERROR(token("activation", &k.activation));
  CUBIST_RETURN_IF_ERROR(positive("tile_m", &k.tile_m));
  CUBIST_RETURN_IF_ERROR(positive("tile_n", &k.tile_n));
  CUBIST_RETURN_IF_ERROR(positive("tile_k", &k.tile_k));
  if (const Json* cluster = Find(value, "cluster"); cluster != nullptr) {
    const JsonField cf = field.Key("cluster");
    constexpr char kCluster[] = "[x, y, z] of positive integers";
    if (!cluster->is_array() || cluster->size() != 3) return cf.Expected(kCluster, *cluster);
    for (size_t i = 0; i < 3; ++i) {
      CUBIST_ASSIGN_OR_RETURN(k.cluster[i], ReadPositiveInt((*cluster)[i], cf.Index(i)));
    }
  }
  CUBIST_RETURN_IF_ERROR(positive("stages", &k.stages));
  CUBIST_RETURN_IF_ERROR(positive("threads", &k.threads));
  CUBIST_ASSIGN_OR_RETURN(const Json* smem,
                          Required(value, field, "shared_mem_bytes", "an integer >= 0"));
  CUBIST_ASSIGN_OR_RETURN(k.shared_mem_bytes,
                          ReadNonNegativeInt(*smem, field.Key("shared_mem_bytes")));
  static constexpr const char* kKnown[] = {
      "name",   "artifact", "function", "arch",   "op",      "abi",
      "weight_format", "activation_format", "activation", "tile_m", "tile_n",
      "tile_k", "cluster",  "stages",   "threads", "shared_mem_bytes"};
  k.extras = CollectExtras(value, kKnown);
  return k;
}

// Parses an array of kernels at `field`, checking that names are unique.
absl::StatusOr<std::vector<KernelSpec>> ParseKernelArray(const Json& value,
                                                         const JsonField& field,
                                                         const ArtifactPaths* artifacts) {
  if (!value.is_array()) return field.Expected("an array of kernel objects", value);
  std::vector<KernelSpec> kernels;
  kernels.reserve(value.size());
  absl::flat_hash_map<std::string, size_t> names;
  for (size_t i = 0; i < value.size(); ++i) {
    CUBIST_ASSIGN_OR_RETURN(KernelSpec k, ParseKernel(value[i], field.Index(i), artifacts));
    auto [it, inserted] = names.emplace(k.name, i);
    if (!inserted) {
      return field.Index(i).Key("name").Error(
          absl::StrCat("duplicate ", QuoteForMessage(k.name), " (also ",
                       field.Index(it->second).path(), "); kernel names must be unique"));
    }
    kernels.push_back(std::move(k));
  }
  return kernels;
}

// Takes the elements of "artifacts" as the JSON reader hands them over (json_reader.h,
// StreamedArray), so that the list is never a document: each is checked (ParseArtifact,
// then against the paths before it) and goes to the sink, until the first error. That
// error waits in status() for ParseManifestJson, which returns it where its order of
// checks puts it (after a syntax error anywhere, after schema, name, version, ...), as
// when the whole document was built first.
class ArtifactListReader {
 public:
  ArtifactListReader(std::string_view source, const ManifestParseOptions& options,
                     ArtifactSink* sink)
      : field_(source, "artifacts"), options_(options), sink_(sink), paths_(sink) {}

  void OnElement(size_t index, Json&& element) {
    if (!status_.ok()) return;
    try {
      status_ = Take(index, element);
    } catch (const std::exception& e) {
      // std::bad_alloc: never thrown through the JSON reader.
      status_ = field_.Index(index).Error(absl::StrCat("cannot read: ", e.what()));
    }
  }

  const absl::Status& status() const { return status_; }
  const ArtifactPaths& paths() const { return paths_; }

  // With every artifact taken: none may lie under another (path_rules.h).
  absl::Status CheckNoFileIsADirectory() const {
    for (size_t i = 0; i < sink_->size(); ++i) {
      const std::string_view path = sink_->PathOf(i);
      std::string_view parent =
          ListedParentOf(path, [&](std::string_view p) { return paths_.contains(p); });
      if (!parent.empty()) {
        return field_.Index(i).Key("path").Error(absl::StrCat(
            QuoteForMessage(path), " lies under ", QuoteForMessage(parent), " (",
            field_.Index(*paths_.Find(parent)).path(), "), which is listed as a file; a "
            "path cannot be both a file and a directory"));
      }
    }
    return absl::OkStatus();
  }

 private:
  absl::Status Take(size_t index, const Json& element) {
    const JsonField field = field_.Index(index);
    CUBIST_ASSIGN_OR_RETURN(Artifact a, ParseArtifact(element, field, options_));
    if (std::optional<size_t> earlier = paths_.Find(a.path); earlier.has_value()) {
      return field.Key("path").Error(
          absl::StrCat("duplicate ", QuoteForMessage(a.path), " (also ",
                       field_.Index(*earlier).path(), "); each file may be listed once"));
    }
    sink_->Add(std::move(a));
    paths_.Insert(sink_->size() - 1);
    return absl::OkStatus();
  }

  const JsonField field_;
  const ManifestParseOptions& options_;
  ArtifactSink* sink_;
  ArtifactPaths paths_;
  absl::Status status_;
};

// Everything but the artifacts, which `artifacts_read` took while the document was read.
absl::StatusOr<Manifest> ParseManifestJson(const Json& doc, std::string_view source,
                                           const ArtifactListReader& artifacts_read) {
  const JsonField root(source, "");
  if (!doc.is_object()) return root.Expected("a JSON object at the top level", doc);
  Manifest m;

  CUBIST_ASSIGN_OR_RETURN(const Json* schema,
                          Required(doc, root, "schema", "\"cubist.manifest/1\""));
  if (!schema->is_string()) return root.Key("schema").Expected("\"cubist.manifest/1\"", *schema);
  if (schema->get_ref<const std::string&>() != kManifestSchema) {
    return root.Key("schema").Error(absl::StrCat(
        "this cubist reads \"", kManifestSchema, "\", got ", json_internal::DescribeValue(*schema),
        "; use a cubist that reads that schema or ask the publisher for a ", kManifestSchema,
        " manifest"));
  }

  constexpr char kNameExpected[] = "1 to 128 characters from [A-Za-z0-9._-]";
  CUBIST_ASSIGN_OR_RETURN(const Json* name, Required(doc, root, "name", kNameExpected));
  if (!name->is_string() || !ValidateManifestName(name->get_ref<const std::string&>()).ok()) {
    return root.Key("name").Expected(kNameExpected, *name);
  }
  m.name = name->get<std::string>();

  CUBIST_ASSIGN_OR_RETURN(const Json* version, Required(doc, root, "version", kIntegerFrom1));
  CUBIST_ASSIGN_OR_RETURN(m.version, ReadInteger(*version, root.Key("version"), 1,
                                                 kMaxManifestInteger, kIntegerFrom1));

  if (const Json* expires = Find(doc, "expires"); expires != nullptr) {
    CUBIST_ASSIGN_OR_RETURN(m.expires, ReadTime(*expires, root.Key("expires")));
  }

  if (const Json* urls = Find(doc, "base_urls"); urls != nullptr) {
    const JsonField f = root.Key("base_urls");
    if (!urls->is_array()) return f.Expected("an array of URL strings", *urls);
    for (size_t i = 0; i < urls->size(); ++i) {
      CUBIST_ASSIGN_OR_RETURN(std::string url, ReadBaseUrl((*urls)[i], f.Index(i)));
      m.base_urls.push_back(std::move(url));
    }
  }

  CUBIST_ASSIGN_OR_RETURN(const Json* artifacts,
                          Required(doc, root, "artifacts", "an array of artifact objects"));
  if (!artifacts->is_array()) {
    return root.Key("artifacts").Expected("an array of artifact objects", *artifacts);
  }
  // The elements went to `artifacts_read` as they were read; here is where their checks
  // come in order.
  CUBIST_RETURN_IF_ERROR(artifacts_read.status());
  CUBIST_RETURN_IF_ERROR(artifacts_read.CheckNoFileIsADirectory());

  if (const Json* kernels = Find(doc, "kernels"); kernels != nullptr) {
    CUBIST_ASSIGN_OR_RETURN(m.kernels, ParseKernelArray(*kernels, root.Key("kernels"),
                                                        &artifacts_read.paths()));
  }

  static constexpr const char* kKnown[] = {"schema",    "name",      "version", "expires",
                                           "base_urls", "artifacts", "kernels"};
  m.extras = CollectExtras(doc, kKnown);
  return m;
}

}  // namespace

absl::Status ValidateManifestName(std::string_view name) {
  bool ok = !name.empty() && name.size() <= 128;
  for (char c : name) {
    ok = ok && ((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || IsDigit(c) || c == '.' ||
                c == '_' || c == '-');
  }
  if (ok) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "expected 1 to 128 characters from [A-Za-z0-9._-], got ", QuoteForMessage(name)));
}

absl::Status ValidateArch(std::string_view arch) {
  bool ok = arch.size() >= 5 && arch.substr(0, 3) == "sm_";
  std::string_view rest = ok ? arch.substr(3) : std::string_view();
  if (!rest.empty() && (rest.back() == 'a' || rest.back() == 'f')) rest.remove_suffix(1);
  ok = ok && (rest.size() == 2 || rest.size() == 3) && rest[0] != '0';
  for (char c : rest) ok = ok && IsDigit(c);
  if (ok) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "expected an architecture such as \"sm_90a\", \"sm_100f\" or \"sm_120\", got ",
      QuoteForMessage(arch)));
}

namespace {

// ParseManifest, its artifacts into `sink`.
absl::StatusOr<Manifest> ParseManifestInto(std::string_view bytes, std::string_view source,
                                           const ManifestParseOptions& options,
                                           ArtifactSink* sink) {
  const json_internal::JsonLimits limits{options.max_bytes, options.max_depth};
  try {
    ArtifactListReader artifacts_read(source, options, sink);
    auto on_artifact = [&](size_t index, Json&& element) {
      artifacts_read.OnElement(index, std::move(element));
    };
    const json_internal::StreamedArray streamed{"artifacts", on_artifact};
    CUBIST_ASSIGN_OR_RETURN(Json doc,
                            json_internal::ParseStrictJson(bytes, source, limits, &streamed));
    CUBIST_ASSIGN_OR_RETURN(Manifest m, ParseManifestJson(doc, source, artifacts_read));
    m.source = std::string(source);
    m.digest = Sha256Hex(bytes);
    return m;
  } catch (const std::exception& e) {
    // nlohmann's accessors are guarded above; this is the boundary for anything else
    // (std::bad_alloc on a huge document).
    return absl::InvalidArgumentError(
        absl::StrCat(Sv(source), ": cannot read manifest: ", e.what()));
  }
}

}  // namespace

absl::StatusOr<Manifest> ParseManifest(std::string_view bytes, std::string_view source,
                                       const ManifestParseOptions& options) {
  std::vector<Artifact> artifacts;
  BuiltArtifacts sink(&artifacts);
  CUBIST_ASSIGN_OR_RETURN(Manifest m, ParseManifestInto(bytes, source, options, &sink));
  m.artifacts = std::move(artifacts);
  return m;
}

absl::StatusOr<Manifest> ParseManifestPacked(std::string_view bytes, std::string_view source,
                                             const ManifestParseOptions& options,
                                             PackedArtifacts* artifacts) {
  PackedArtifactsBuilder builder;
  // Packed artifacts seldom take more room than their JSON (manifest_binary.h): the
  // input's size is room enough, and what stays unwritten costs no memory.
  builder.Reserve(bytes.size());
  PackingArtifacts sink(&builder);
  CUBIST_ASSIGN_OR_RETURN(Manifest m, ParseManifestInto(bytes, source, options, &sink));
  *artifacts = std::move(builder).Finish();
  return m;
}

absl::StatusOr<std::vector<KernelSpec>> ParseKernelList(std::string_view bytes,
                                                        std::string_view source,
                                                        const ManifestParseOptions& options) {
  const json_internal::JsonLimits limits{options.max_bytes, options.max_depth};
  try {
    CUBIST_ASSIGN_OR_RETURN(Json doc, json_internal::ParseStrictJson(bytes, source, limits));
    const JsonField root(source, "");
    if (doc.is_array()) return ParseKernelArray(doc, root, nullptr);
    if (doc.is_object()) {
      CUBIST_ASSIGN_OR_RETURN(const Json* kernels,
                              Required(doc, root, "kernels", "an array of kernel objects"));
      return ParseKernelArray(*kernels, root.Key("kernels"), nullptr);
    }
    return root.Expected("an array of kernel objects or an object with \"kernels\"", doc);
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(Sv(source), ": cannot read kernels: ", e.what()));
  }
}

}  // namespace cubist
