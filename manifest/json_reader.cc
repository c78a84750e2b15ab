#include "manifest/json_reader.h"

#include <climits>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/strings.h"
#include "manifest/message_text.h"

namespace cubist::json_internal {
namespace {

bool IsIdentifier(std::string_view s) {
  if (s.empty()) return false;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    const bool alpha = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || c == '_';
    if (!alpha && !(i > 0 && c >= '0' && c <= '9')) return false;
  }
  return true;
}

std::string AppendKey(const std::string& path, std::string_view key) {
  if (IsIdentifier(key)) return path.empty() ? std::string(key) : absl::StrCat(path, ".", Sv(key));
  return absl::StrCat(path, "[", QuoteForMessage(key), "]");
}

// 1-based line and column (in bytes) of bytes[offset], as nlohmann counts them.
std::pair<size_t, size_t> LineColumn(std::string_view bytes, size_t offset) {
  size_t line = 1;
  size_t line_start = 0;
  const size_t end = std::min(offset, bytes.size());
  for (size_t i = 0; i < end; ++i) {
    if (bytes[i] == '\n') ++line, line_start = i + 1;
  }
  return {line, offset - line_start + 1};
}

absl::Status PositionError(std::string_view source, std::string_view bytes, size_t offset,
                           std::string_view what) {
  const auto [line, column] = LineColumn(bytes, offset);
  return absl::InvalidArgumentError(
      absl::StrCat(Sv(source), ":", line, ":", column, ": ", Sv(what)));
}

// One pass over the raw bytes before nlohmann sees them: checks UTF-8 everywhere (so
// the message can point at the byte instead of nlohmann's generic "ill-formed UTF-8")
// and bounds the nesting depth, which bounds the parser's stack and the work per byte.
absl::Status PreScan(std::string_view bytes, std::string_view source, int max_depth) {
  bool in_string = false;
  bool escaped = false;
  int depth = 0;
  for (size_t i = 0; i < bytes.size();) {
    const unsigned char c = static_cast<unsigned char>(bytes[i]);
    if (c >= 0x80) {
      const size_t len = Utf8SequenceLength(bytes, i);
      if (len == 0) {
        return PositionError(source, bytes, i,
                             absl::StrFormat("invalid UTF-8 (byte 0x%02x); a manifest must "
                                             "be UTF-8 text",
                                             c));
      }
      i += len;
      escaped = false;
      continue;
    }
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      if (++depth > max_depth) {
        return PositionError(source, bytes, i,
                             absl::StrCat("nesting deeper than ", max_depth,
                                          " levels; a manifest never nests that deep"));
      }
    } else if (c == '}' || c == ']') {
      --depth;
    }
    ++i;
  }
  return absl::OkStatus();
}

// Thrown from the parse callback, caught in ParseStrictJson: nlohmann offers no other
// way to stop a callback parse with an error of our own.
struct DuplicateKey {
  std::string path;
  std::string key;
};

// Tracks the JSON path of the value being parsed and the keys seen in each open object.
class DuplicateKeyChecker {
 public:
  bool operator()(int /*depth*/, Json::parse_event_t event, Json& parsed) {
    switch (event) {
      case Json::parse_event_t::object_start:
      case Json::parse_event_t::array_start:
        {
          Frame f;
          f.path = ChildPath();
          f.is_array = event == Json::parse_event_t::array_start;
          frames_.push_back(std::move(f));
        }
        break;
      case Json::parse_event_t::object_end:
      case Json::parse_event_t::array_end:
        frames_.pop_back();
        break;
      case Json::parse_event_t::key: {
        Frame& f = frames_.back();
        f.key = parsed.get<std::string>();
        if (!f.keys.insert(f.key).second) throw DuplicateKey{f.path, f.key};
        break;
      }
      case Json::parse_event_t::value:
        if (!frames_.empty() && frames_.back().is_array) ++frames_.back().next_index;
        break;
    }
    return true;
  }

 private:
  struct Frame {
    std::string path;
    bool is_array = false;
    size_t next_index = 0;
    std::string key;
    std::unordered_set<std::string> keys;
  };

  // Path of a container that starts now, as a child of the innermost open one.
  std::string ChildPath() {
    if (frames_.empty()) return "";
    Frame& f = frames_.back();
    if (f.is_array) return absl::StrCat(f.path, "[", f.next_index++, "]");
    return AppendKey(f.path, f.key);
  }

  std::vector<Frame> frames_;
};

// nlohmann's what() reads "[json.exception.parse_error.101] parse error at line 3,
// column 14: syntax error while parsing value - ...". Keep the part after the position.
std::string ParseErrorDetail(const std::string& what) {
  std::string_view s = what;
  if (!s.empty() && s.front() == '[') {
    const size_t close = s.find("] ");
    if (close != std::string_view::npos) s = s.substr(close + 2);
  }
  const size_t col = s.find("column ");
  if (col != std::string_view::npos) {
    const size_t colon = s.find(": ", col);
    if (colon != std::string_view::npos) s = s.substr(colon + 2);
  }
  if (s.substr(0, 13) == "syntax error ") s = s.substr(13);
  // "last read" may hold control characters or stray bytes of the input.
  return EscapeForMessage(s, 200);
}

}  // namespace

absl::StatusOr<Json> ParseStrictJson(std::string_view bytes, std::string_view source,
                                     const JsonLimits& limits) {
  if (bytes.size() > limits.max_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        Sv(source), ": ", bytes.size(), " bytes is over the limit of ", limits.max_bytes,
        " bytes; is this the right file? (raise ManifestParseOptions::max_bytes if so)"));
  }
  if (absl::Status s = PreScan(bytes, source, limits.max_depth); !s.ok()) return s;
  try {
    DuplicateKeyChecker checker;
    return Json::parse(bytes.data(), bytes.data() + bytes.size(), std::ref(checker),
                       /*allow_exceptions=*/true, /*ignore_comments=*/false);
  } catch (const DuplicateKey& d) {
    return absl::InvalidArgumentError(absl::StrCat(
        Sv(source), ": ", d.path.empty() ? "" : absl::StrCat(d.path, ": "),
        "duplicate key ", QuoteForMessage(d.key),
        "; JSON readers disagree on which one wins, so a manifest may have each key once"));
  } catch (const Json::parse_error& e) {
    const size_t offset = e.byte > 0 ? e.byte - 1 : 0;
    return PositionError(source, bytes, offset,
                         absl::StrCat("syntax error: ", ParseErrorDetail(e.what())));
  } catch (const Json::exception& e) {
    // out_of_range.406 ("number overflow parsing '1e400'") and friends.
    return absl::InvalidArgumentError(
        absl::StrCat(Sv(source), ": invalid JSON: ", ParseErrorDetail(e.what())));
  } catch (const std::exception& e) {
    // std::bad_alloc and anything else from the standard library.
    return absl::InvalidArgumentError(
        absl::StrCat(Sv(source), ": cannot parse: ", e.what()));
  }
}

std::string DescribeValue(const Json& value) {
  switch (value.type()) {
    case Json::value_t::string:
      return QuoteForMessage(value.get_ref<const std::string&>(), 60);
    case Json::value_t::object:
      return "an object";
    case Json::value_t::array:
      return "an array";
    default:
      return value.dump();
  }
}

JsonField JsonField::Key(std::string_view key) const {
  return JsonField(source_, AppendKey(path_, key));
}

JsonField JsonField::Index(size_t i) const {
  return JsonField(source_, absl::StrCat(path_, "[", i, "]"));
}

absl::Status JsonField::Error(std::string_view what) const {
  if (path_.empty()) return absl::InvalidArgumentError(absl::StrCat(Sv(source_), ": ", Sv(what)));
  return absl::InvalidArgumentError(absl::StrCat(Sv(source_), ": ", path_, ": ", Sv(what)));
}

absl::Status JsonField::Expected(std::string_view expected, const Json& value) const {
  return Error(absl::StrCat("expected ", Sv(expected), ", got ", DescribeValue(value)));
}

absl::Status JsonField::Missing(std::string_view expected) const {
  return Error(absl::StrCat("missing; expected ", Sv(expected)));
}

absl::StatusOr<int64_t> ReadInteger(const Json& value, const JsonField& field, int64_t min,
                                    int64_t max, std::string_view expected) {
  // nlohmann keeps non-negative integers as unsigned and negative ones as signed;
  // anything written with a fraction or exponent is a float and is refused.
  if (value.is_number_unsigned()) {
    const uint64_t u = value.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ||
        static_cast<int64_t>(u) < min || static_cast<int64_t>(u) > max) {
      return field.Expected(expected, value);
    }
    return static_cast<int64_t>(u);
  }
  if (value.is_number_integer()) {
    const int64_t i = value.get<int64_t>();
    if (i < min || i > max) return field.Expected(expected, value);
    return i;
  }
  return field.Expected(expected, value);
}

absl::StatusOr<int> ReadPositiveInt(const Json& value, const JsonField& field) {
  if (value.is_number_unsigned() && value.get<uint64_t>() > INT_MAX) {
    return field.Expected("a positive integer no larger than 2147483647", value);
  }
  auto v = ReadInteger(value, field, 1, INT_MAX, "a positive integer");
  if (!v.ok()) return v.status();
  return static_cast<int>(*v);
}

absl::StatusOr<int> ReadNonNegativeInt(const Json& value, const JsonField& field) {
  if (value.is_number_unsigned() && value.get<uint64_t>() > INT_MAX) {
    return field.Expected("an integer from 0 to 2147483647", value);
  }
  auto v = ReadInteger(value, field, 0, INT_MAX, "an integer >= 0");
  if (!v.ok()) return v.status();
  return static_cast<int>(*v);
}

absl::StatusOr<std::string> ReadString(const Json& value, const JsonField& field,
                                       std::string_view expected) {
  if (!value.is_string()) return field.Expected(expected, value);
  return value.get<std::string>();
}

absl::StatusOr<std::string> ReadToken(const Json& value, const JsonField& field) {
  if (!value.is_string()) return field.Expected("a non-empty string", value);
  const std::string& s = value.get_ref<const std::string&>();
  if (s.empty()) return field.Expected("a non-empty string", value);
  for (unsigned char c : s) {
    if (c < 0x20 || c == 0x7F) {
      return field.Expected("a string without control characters", value);
    }
  }
  return s;
}

}  // namespace cubist::json_internal
