#include "dispatch/tuning_file.h"

#include <bit>
#include <exception>
#include <optional>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "artifacts/file_lock.h"
#include "base/file_util.h"
#include "base/status_macros.h"
#include "base/strings.h"

namespace cubist {
namespace {

constexpr uint64_t kMaxTuningFileBytes = uint64_t{64} << 20;

std::string TableKey(std::string_view op, std::string_view bucket) {
  return absl::StrCat(Sv(op), "|", Sv(bucket));
}

// Typed field reads that never throw: a field of the wrong type reads as absent.
std::optional<std::string> Str(const nlohmann::json& e, const char* key) {
  auto it = e.find(key);
  if (it == e.end() || !it->is_string()) return std::nullopt;
  return it->get<std::string>();
}
std::optional<int64_t> Int(const nlohmann::json& e, const char* key) {
  auto it = e.find(key);
  if (it == e.end() || !it->is_number_integer()) return std::nullopt;
  return it->get<int64_t>();
}
std::optional<double> Num(const nlohmann::json& e, const char* key) {
  auto it = e.find(key);
  if (it == e.end() || !it->is_number()) return std::nullopt;
  return it->get<double>();
}

// The file's entries as JSON, or an empty array for a missing file.
absl::StatusOr<nlohmann::json> ReadEntries(const std::string& path) {
  absl::StatusOr<std::string> bytes = ReadFileToString(path, kMaxTuningFileBytes);
  if (absl::IsNotFound(bytes.status())) return nlohmann::json::array();
  if (!bytes.ok()) return Annotate(bytes.status(), absl::StrCat("tuning file ", path));
  auto bad = [&](std::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat("tuning file ", path, ": ", Sv(what),
                                                   "; delete it to start over"));
  };
  nlohmann::json doc = nlohmann::json::parse(*bytes, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) return bad("not valid JSON");
  if (!doc.is_object() || Str(doc, "schema") != kTuningSchema) {
    return bad(absl::StrCat("expected \"schema\": \"", kTuningSchema, "\""));
  }
  if (!doc.contains("entries") || !doc["entries"].is_array()) {
    return bad("expected an \"entries\" array");
  }
  return std::move(doc["entries"]);
}

bool SameContext(const nlohmann::json& e, const TuningContext& c) {
  return e.is_object() && Str(e, "gpu") == c.gpu && Int(e, "driver") == c.driver &&
         Str(e, "manifest") == c.manifest;
}

bool SameKey(const nlohmann::json& e, const TuningRecord& r) {
  return SameContext(e, r.context) && Str(e, "op") == r.op && Str(e, "bucket") == r.bucket;
}

}  // namespace

std::string ShapeBucket::ToString() const {
  std::string s = absl::StrCat(Sv(DataFormatName(weight_format)), "/",
                               Sv(DataFormatName(activation_format)), "/",
                               Sv(ActivationName(activation)), "/e", experts, "/n", n, "/k", k,
                               "/m", tokens_per_expert);
  if (routed_top_k > 0) {
    absl::StrAppend(&s, "/top", routed_top_k, "of",
                    routed_experts > 0 ? routed_experts : experts);
  }
  return s;
}

std::ostream& operator<<(std::ostream& os, const ShapeBucket& bucket) {
  return os << OpName(bucket.op) << ":" << bucket.ToString();
}

ShapeBucket BucketOf(const MoeProblem& p) {
  ShapeBucket b;
  b.op = p.op;
  CopyGemmShape(p, &b);
  const int64_t tpe = p.tokens_per_expert();
  b.tokens_per_expert = tpe <= 0 ? 0 : static_cast<int64_t>(std::bit_ceil(uint64_t(tpe)));
  b.routed_top_k = p.routed_top_k;
  b.routed_experts = p.routed_experts;
  return b;
}

MoeProblem RepresentativeProblem(const ShapeBucket& b, DeviceSm sm, int sm_count) {
  MoeProblem p;
  p.op = b.op;
  CopyGemmShape(b, &p);
  p.tokens = b.experts * b.tokens_per_expert;
  p.routed_top_k = b.routed_top_k;
  p.routed_experts = b.routed_experts;
  p.sm = sm;
  p.sm_count = sm_count;
  return p;
}

const TuningTable::Entry* TuningTable::Find(Op op, const ShapeBucket& bucket) const {
  auto it = entries_.find(TableKey(OpName(op), bucket.ToString()));
  return it == entries_.end() ? nullptr : &it->second;
}

absl::StatusOr<TuningTable> LoadTuningFile(const std::string& path,
                                           const TuningContext& context) {
  CUBIST_ASSIGN_OR_RETURN(nlohmann::json entries, ReadEntries(path));
  TuningTable table;
  for (const nlohmann::json& e : entries) {
    // Anything not written by RecordTuning for this context is skipped, never trusted:
    // timings from another GPU, driver or artifact set say nothing about this one.
    std::optional<std::string> op = SameContext(e, context) ? Str(e, "op") : std::nullopt;
    std::optional<std::string> bucket = Str(e, "bucket");
    std::optional<std::string> kernel = Str(e, "kernel");
    std::optional<double> time_us = Num(e, "time_us");
    if (!op || !bucket || !kernel || !time_us) {
      ++table.ignored_;
      continue;
    }
    table.entries_[TableKey(*op, *bucket)] = TuningTable::Entry{*kernel, *time_us};
  }
  return table;
}

absl::Status RecordTuning(const std::string& path, const TuningRecord& record) {
  CUBIST_RETURN_IF_ERROR(MakeDirs(DirName(path)));
  CUBIST_ASSIGN_OR_RETURN(FileLock lock,
                          FileLock::Acquire(path + ".lock", absl::Seconds(30)));
  CUBIST_ASSIGN_OR_RETURN(nlohmann::json entries, ReadEntries(path));
  nlohmann::json merged = nlohmann::json::array();
  for (nlohmann::json& e : entries) {
    if (!SameKey(e, record)) merged.push_back(std::move(e));
  }
  merged.push_back({{"gpu", record.context.gpu},
                    {"driver", record.context.driver},
                    {"manifest", record.context.manifest},
                    {"op", record.op},
                    {"bucket", record.bucket},
                    {"kernel", record.kernel},
                    {"time_us", record.time_us},
                    {"candidates", record.candidates}});
  nlohmann::json doc = {{"schema", kTuningSchema}, {"entries", std::move(merged)}};
  std::string text;
  try {
    text = doc.dump(1) + "\n";
  } catch (const std::exception& e) {  // invalid UTF-8 in a name
    return absl::InvalidArgumentError(
        absl::StrCat("tuning file ", path, ": cannot encode entry: ", e.what()));
  }
  return Annotate(WriteFileAtomically(path, text), absl::StrCat("tuning file ", path));
}

std::string DefaultTuningPath(const std::string& cache_dir) {
  return cache_dir + "/tuning.json";
}

}  // namespace cubist
