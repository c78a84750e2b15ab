// Internal to manifest/: strict JSON reading shared by the manifest parser and the
// kernels-file reader of the builder. Not installed as part of the public API (it
// exposes nlohmann::json, which cubist links privately).
//
// ParseStrictJson refuses, before building any value: input over a size limit, invalid
// UTF-8 anywhere, nesting deeper than a limit; while parsing: syntax errors (with line
// and column) and duplicate object keys (which different JSON readers resolve
// differently, so a signed manifest could mean two things). Every nlohmann exception is
// caught here and turned into InvalidArgument.
//
// JsonField names one place in a document for messages: "<source>: <json path>: ...".
//
// Thread-safe (no shared state).
#ifndef CUBIST_MANIFEST_JSON_READER_H_
#define CUBIST_MANIFEST_JSON_READER_H_

#include <cstdint>
#include <limits>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace cubist::json_internal {

using Json = nlohmann::json;

struct JsonLimits {
  uint64_t max_bytes = uint64_t{64} << 20;
  int max_depth = 64;
};

// One array member of the top-level object whose elements are handed over one at a time,
// each as soon as it is whole, instead of being kept in the document, which then holds
// that member as an empty array. A manifest's "artifacts": as a document, 500k small
// objects cost about 700 bytes each, several times what each holds once converted.
// Elements arrive in order, numbered from 0; the callback must not throw.
struct StreamedArray {
  std::string_view key;
  absl::FunctionRef<void(size_t index, Json&& element)> on_element;
};

// Parses `bytes` (named `source` in messages). Errors (all InvalidArgument):
//   "<source>: 70000000 bytes is over the limit of 67108864 bytes; ..."
//   "<source>:3:14: invalid UTF-8 (byte 0xff); ..."
//   "<source>:1:65: nesting deeper than 64 levels; ..."
//   "<source>:3:14: syntax error: while parsing value - invalid literal; last read: ..."
//   "<source>: kernels[2]: duplicate key \"tile_m\"; ..."
// With `streamed`, that member's elements go to its callback (above); a document that
// fails to parse may have handed over some of them first.
[[nodiscard]] absl::StatusOr<Json> ParseStrictJson(std::string_view bytes,
                                                   std::string_view source,
                                                   const JsonLimits& limits,
                                                   const StreamedArray* streamed = nullptr);

// A short description of a value for "got ..." in messages: strings quoted and escaped,
// numbers and literals as written by dump(), "an object" / "an array" for containers.
std::string DescribeValue(const Json& value);

// One place in a document: the source name and a JSON path ("kernels[3].tile_m"; empty
// for the document itself).
class JsonField {
 public:
  JsonField(std::string_view source, std::string path)
      : source_(source), path_(std::move(path)) {}

  JsonField Key(std::string_view key) const;
  JsonField Index(size_t i) const;
  const std::string& path() const { return path_; }

  // InvalidArgument "<source>: <path>: <what>".
  absl::Status Error(std::string_view what) const;
  // "<source>: <path>: expected <expected>, got <DescribeValue(value)>".
  absl::Status Expected(std::string_view expected, const Json& value) const;
  // "<source>: <path>: missing; expected <expected>".
  absl::Status Missing(std::string_view expected) const;

 private:
  std::string_view source_;
  std::string path_;
};

// Typed readers. Each returns the value or an error naming the field and what was
// expected; floats ("64.0", "1e2") are never integers.
[[nodiscard]] absl::StatusOr<int64_t> ReadInteger(const Json& value, const JsonField& field,
                                                  int64_t min, int64_t max,
                                                  std::string_view expected);
[[nodiscard]] absl::StatusOr<int> ReadPositiveInt(const Json& value, const JsonField& field);
[[nodiscard]] absl::StatusOr<int> ReadNonNegativeInt(const Json& value,
                                                     const JsonField& field);
// A non-empty string without control characters (it ends up in C strings and messages).
[[nodiscard]] absl::StatusOr<std::string> ReadToken(const Json& value, const JsonField& field);
[[nodiscard]] absl::StatusOr<std::string> ReadString(const Json& value, const JsonField& field,
                                                     std::string_view expected);

}  // namespace cubist::json_internal

#endif  // CUBIST_MANIFEST_JSON_READER_H_
