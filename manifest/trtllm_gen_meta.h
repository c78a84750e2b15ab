// The kernel list of a FlashInfer trtllm-gen cubin pin: `include/flashinferMetaInfo.h`.
//
// FlashInfer ships, next to the cubins of a batched-GEMM pin, a generated C++ header that
// its launcher compiles in. It holds one aggregate initializer per kernel:
//
//   static constexpr size_t tllmGenBatchedGemmListLen = 2108;
//   static const batchedGemm::BatchedGemmConfig tllmGenBatchedGemmList[] = {
//   #ifndef EXCLUDE_SM_100
//   {nullptr, 0, 214144, "bmm_E4m3_..._sm100f", 256, "<64 hex of the cubin>", "",
//    nullptr, nullptr, nullptr, 0, { /* mAllReduceAlgo */ gemm::AllReduceAlgo(0)
//   , /* mDtypeA */ trtllm::gen::Dtype(1050629)
//   , ... one labelled value per option ...
//    }, gemm::SmVersion::Sm100f},
//   #endif
//   };
//
// The positional members are (data, size, shared memory bytes, function name, threads
// per CTA, sha256, ...) and the last is the SM version; the options are the one nested
// initializer, each value preceded by a comment that names it. This parser reads exactly
// that shape, not C++: it tokenizes strings, numbers, identifiers (with ::), the
// punctuation of initializers, and comments; preprocessor lines are skipped (the header
// guards entries with #ifndef EXCLUDE_SM_100, and cubist wants every entry).
//
// Bounded: at most `max_bytes` of input, `max_entries` entries, `max_values` values per
// initializer and `max_depth` nested braces; a string or comment may not run past the end
// of its line (strings) or the file (comments). Everything else is InvalidArgument that
// names the line: "flashinferMetaInfo.h:45: entry 3: expected a string (the function
// name) at position 3, got 214144".
//
// Thread-safe (pure function).
#ifndef CUBIST_MANIFEST_TRTLLM_GEN_META_H_
#define CUBIST_MANIFEST_TRTLLM_GEN_META_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace cubist {

// One option value as written: `trtllm::gen::Dtype(1050629)`, `-1`, `{}`, `{...}`.
struct MetaValue {
  std::string text;  // tokens joined by nothing ("trtllm::gen::Dtype(1050629)")
  bool list = false; // a brace initializer ("{}" or "{batchedGemm::RouteImpl(0)}")

  // The integer of `-1`, `512` or of an enum cast `gemm::SplitK(0)`; nullopt otherwise.
  std::optional<int64_t> Int() const;

  bool operator==(const MetaValue&) const = default;
};

struct TrtllmGenKernelMeta {
  size_t line = 0;           // 1-based line of the entry's opening brace
  std::string function;      // "bmm_E4m3_E4m3E4m3_Fp32_..._sm100f"
  int64_t shared_mem_bytes = 0;
  int64_t threads = 0;
  std::string sha256;        // of the cubin; 64 lowercase hex
  std::string sm_version;    // the enumerator: "Sm100f", "Sm103a"
  // Labelled options in header order ("mDtypeA" -> Dtype(1050629)).
  std::vector<std::pair<std::string, MetaValue>> options;

  // The option's value, or nullptr.
  const MetaValue* Find(std::string_view name) const;
};

struct TrtllmGenMetaInfo {
  std::string list_name;     // "tllmGenBatchedGemmList"
  std::string export_version;  // TLLM_GEN_EXPORT_VERSION, "" when absent
  std::vector<TrtllmGenKernelMeta> kernels;
};

struct TrtllmGenMetaLimits {
  uint64_t max_bytes = uint64_t{128} << 20;
  size_t max_entries = 200000;
  size_t max_values = 4096;
  size_t max_depth = 8;
};

// Parses a flashinferMetaInfo.h (format above). `source` names the file in errors. The
// declared length (`...ListLen = N`), when present, must equal the entries read.
[[nodiscard]] absl::StatusOr<TrtllmGenMetaInfo> ParseTrtllmGenMetaInfo(
    std::string_view bytes, std::string_view source, const TrtllmGenMetaLimits& limits = {});

}  // namespace cubist

#endif  // CUBIST_MANIFEST_TRTLLM_GEN_META_H_
