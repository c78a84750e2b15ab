// Persistent autotuning results: which kernel won, measured, for a shape bucket on one
// kind of GPU, driver and artifact set.
//
// File format (JSON, written whole each time):
//   {"schema": "cubist.tuning/1",
//    "entries": [{"gpu": "NVIDIA H200", "driver": 13000, "manifest": "<sha256 hex>",
//                 "op": "moe_gemm", "bucket": "bf16/bf16/swiglu/e128/n5760/k2880/m8",
//                 "kernel": "moe_gemm_bf16_...", "time_us": 123.4, "candidates": 4}]}
// An entry is keyed by (gpu, driver, manifest, op, bucket). Load() keeps only entries
// for the current GPU, driver and manifest digest: stale (another driver or manifest)
// and foreign (another GPU) entries are ignored, not deleted, so one file can serve a
// mixed fleet. Unknown fields are ignored.
//
// Concurrent writers are safe: Record() takes an exclusive lock (<path>.lock, flock),
// re-reads the file, merges its entry, writes a temporary file in the same directory,
// fsyncs it and renames it over the file. Readers never see a partial file.
//
// Thread safety: TuningTable is immutable after Load; the free functions are
// thread-safe (serialised across processes by the lock).
#ifndef CUBIST_DISPATCH_TUNING_FILE_H_
#define CUBIST_DISPATCH_TUNING_FILE_H_

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "dispatch/problem.h"

namespace cubist {

inline constexpr char kTuningSchema[] = "cubist.tuning/1";

// Problems that share a tuned decision: the same op, formats, activation, experts, N
// and K, with tokens per expert rounded up to a power of two (0 stays 0).
struct ShapeBucket {
  Op op = Op::kMoeGemm;
  DataFormat weight_format = DataFormat::kBf16;
  DataFormat activation_format = DataFormat::kBf16;
  Activation activation = Activation::kIdentity;
  int64_t experts = 0;
  int64_t n = 0;
  int64_t k = 0;
  int64_t tokens_per_expert = 0;  // the bucket's upper end
  // Routed rows (MoeProblem::routed_top_k, routed_experts as given): timed on routed
  // offsets, kept apart from the balanced bucket of the same shape.
  int64_t routed_top_k = 0;
  int64_t routed_experts = 0;

  bool operator==(const ShapeBucket&) const = default;
  template <typename H>
  friend H AbslHashValue(H h, const ShapeBucket& b) {
    return H::combine(std::move(h), b.op, b.weight_format, b.activation_format,
                      b.activation, b.experts, b.n, b.k, b.tokens_per_expert, b.routed_top_k,
                      b.routed_experts);
  }
  // "bf16/bf16/swiglu/e128/n5760/k2880/m8" (the op is keyed separately), routed ones
  // with "/top8of128" after it.
  std::string ToString() const;
};
std::ostream& operator<<(std::ostream& os, const ShapeBucket& bucket);

ShapeBucket BucketOf(const MoeProblem& problem);
// The problem a bucket is tuned on: its upper end of tokens per expert, on `sm`.
MoeProblem RepresentativeProblem(const ShapeBucket& bucket, DeviceSm sm, int sm_count);

// Which GPU, driver and artifact set the timings belong to.
struct TuningContext {
  std::string gpu;       // device name, e.g. "NVIDIA H200"
  int driver = 0;        // cuDriverGetVersion, e.g. 13000
  std::string manifest;  // Registry::manifest_digest()
};

struct TuningRecord {
  TuningContext context;
  std::string op;      // "moe_gemm"
  std::string bucket;  // ShapeBucket::ToString()
  std::string kernel;
  double time_us = 0;
  int candidates = 0;  // how many kernels were timed
};

// The entries of a file that apply to one context.
class TuningTable {
 public:
  struct Entry {
    std::string kernel;
    double time_us = 0;
  };

  // The winner recorded for (op, bucket), or nullptr.
  const Entry* Find(Op op, const ShapeBucket& bucket) const;
  size_t size() const { return entries_.size(); }
  size_t ignored() const { return ignored_; }  // stale or foreign entries skipped

 private:
  friend absl::StatusOr<TuningTable> LoadTuningFile(const std::string&,
                                                    const TuningContext&);
  absl::flat_hash_map<std::string, Entry> entries_;  // "op|bucket"
  size_t ignored_ = 0;
};

// Reads `path` and keeps the entries for `context`. A missing file is an empty table.
// Errors: InvalidArgument for a file that is not a tuning file (bad JSON, another
// schema), naming the path; "; delete it to start over" as the fix.
[[nodiscard]] absl::StatusOr<TuningTable> LoadTuningFile(const std::string& path,
                                                         const TuningContext& context);

// Adds or replaces `record`'s entry (lock, re-read, merge, temp + rename). Creates the
// directory when needed. Errors: from the lock and the filesystem (PermissionDenied,
// ResourceExhausted, DeadlineExceeded after 30 s of waiting for the lock), and
// InvalidArgument for an existing file that is not a tuning file.
[[nodiscard]] absl::Status RecordTuning(const std::string& path, const TuningRecord& record);

// The default tuning file: <cache dir>/tuning.json.
std::string DefaultTuningPath(const std::string& cache_dir);

}  // namespace cubist

#endif  // CUBIST_DISPATCH_TUNING_FILE_H_
