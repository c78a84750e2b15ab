#include "manifest/json_reader.h"

#include <climits>
#include <string>
#include <optional>
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

// Builds the document through nlohmann's SAX interface, refusing a repeated key the
// moment it is read. nlohmann's own callback parser (parse with a callback) would do
// the same job, but it rescans the enclosing container at the end of every object,
// which is quadratic: 100k artifacts took 12 s instead of 0.2 s, and a hostile
// "[{},{},...]" far longer. With a StreamedArray, that member's elements leave the
// document as each one closes.
class StrictDomBuilder : public nlohmann::json_sax<Json> {
 public:
  StrictDomBuilder(Json* root, const StreamedArray* streamed)
      : root_(root), streamed_(streamed) {}

  bool null() override { return Add(Json(nullptr)); }
  bool boolean(bool v) override { return Add(Json(v)); }
  bool number_integer(number_integer_t v) override { return Add(Json(v)); }
  bool number_unsigned(number_unsigned_t v) override { return Add(Json(v)); }
  bool number_float(number_float_t v, const string_t& /*text*/) override {
    return Add(Json(v));
  }
  bool string(string_t& v) override { return Add(Json(std::move(v))); }
  bool binary(binary_t& v) override { return Add(Json::binary(std::move(v))); }

  bool start_object(std::size_t /*len*/) override { return Open(Json::object()); }
  bool start_array(std::size_t /*len*/) override { return Open(Json::array()); }
  bool end_object() override { return Close(); }
  bool end_array() override { return Close(); }

  bool key(string_t& k) override {
    Frame& f = stack_.back();
    if (f.value->contains(k)) {
      duplicate_key_ = std::move(k);
      duplicate_path_ = PathOf(stack_.size());
      return false;  // stops the parse; sax_parse returns false
    }
    pending_key_ = std::move(k);
    return true;
  }

  bool parse_error(std::size_t position, const std::string& /*last_token*/,
                   const nlohmann::detail::exception& ex) override {
    error_position_ = position;
    error_what_ = ex.what();
    error_is_syntax_ = ex.id >= 100 && ex.id < 200;  // parse_error ids; 406 is overflow
    return false;
  }

  bool has_duplicate() const { return duplicate_key_.has_value(); }
  const std::string& duplicate_key() const { return *duplicate_key_; }
  const std::string& duplicate_path() const { return duplicate_path_; }
  bool has_parse_error() const { return !error_what_.empty(); }
  size_t error_position() const { return error_position_; }
  const std::string& error_what() const { return error_what_; }
  bool error_is_syntax() const { return error_is_syntax_; }

 private:
  struct Frame {
    Json* value;
    // How this container is reached from its parent: a key, or an index when
    // `in_array`. Kept for messages only.
    std::string key;
    size_t index = 0;
    bool in_array = false;
    // Elements added so far (a streamed array's leave it, so its size() does not count).
    size_t count = 0;
    bool streamed = false;  // the StreamedArray's member
  };

  // Places `v` in the innermost open container (or as the root), or hands it over when
  // that container is streamed and `v` is not a container of its own (a container is
  // handed over when it closes). Returns where it lies, null when handed over; the
  // pointer stays valid while `v` is open: its parent gains no element until it closes.
  // `index` receives its position in a parent array.
  Json* Place(Json&& v, size_t* index) {
    if (stack_.empty()) {
      *root_ = std::move(v);
      return root_;
    }
    Frame& parent = stack_.back();
    *index = parent.count++;
    if (parent.value->is_array()) {
      if (parent.streamed && !v.is_structured()) {
        streamed_->on_element(*index, std::move(v));
        return nullptr;
      }
      parent.value->push_back(std::move(v));
      return &parent.value->back();
    }
    auto [it, inserted] =
        parent.value->get_ref<Json::object_t&>().emplace(std::move(pending_key_), std::move(v));
    return &it->second;
  }

  bool Add(Json&& v) {
    size_t index = 0;
    Place(std::move(v), &index);
    return true;
  }

  bool Open(Json&& v) {
    Frame f;
    if (!stack_.empty()) {
      f.in_array = stack_.back().value->is_array();
      if (!f.in_array) f.key = pending_key_;
      f.streamed = streamed_ != nullptr && stack_.size() == 1 && !f.in_array &&
                   v.is_array() && f.key == streamed_->key;
    }
    f.value = Place(std::move(v), &f.index);
    stack_.push_back(std::move(f));
    return true;
  }

  bool Close() {
    const size_t index = stack_.back().index;
    stack_.pop_back();
    if (!stack_.empty() && stack_.back().streamed) {
      // The element that just closed is the array's last: hand it over, whole.
      Json::array_t& array = stack_.back().value->get_ref<Json::array_t&>();
      Json element = std::move(array.back());
      array.pop_back();
      streamed_->on_element(index, std::move(element));
    }
    return true;
  }

  // JSON path of stack_[depth - 1] ("" for the root).
  std::string PathOf(size_t depth) const {
    std::string path;
    for (size_t i = 1; i < depth; ++i) {
      const Frame& f = stack_[i];
      path = f.in_array ? absl::StrCat(path, "[", f.index, "]") : AppendKey(path, f.key);
    }
    return path;
  }

  Json* root_;
  const StreamedArray* streamed_;
  std::vector<Frame> stack_;
  std::string pending_key_;
  std::optional<std::string> duplicate_key_;
  std::string duplicate_path_;
  size_t error_position_ = 0;
  std::string error_what_;
  bool error_is_syntax_ = false;
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
                                     const JsonLimits& limits, const StreamedArray* streamed) {
  if (bytes.size() > limits.max_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        Sv(source), ": ", bytes.size(), " bytes is over the limit of ", limits.max_bytes,
        " bytes; is this the right file? (raise ManifestParseOptions::max_bytes if so)"));
  }
  if (absl::Status s = PreScan(bytes, source, limits.max_depth); !s.ok()) return s;
  try {
    Json doc;
    StrictDomBuilder builder(&doc, streamed);
    const bool ok = Json::sax_parse(bytes.data(), bytes.data() + bytes.size(), &builder,
                                    Json::input_format_t::json, /*strict=*/true,
                                    /*ignore_comments=*/false);
    if (builder.has_duplicate()) {
      const std::string& path = builder.duplicate_path();
      return absl::InvalidArgumentError(absl::StrCat(
          Sv(source), ": ", path.empty() ? "" : absl::StrCat(path, ": "), "duplicate key ",
          QuoteForMessage(builder.duplicate_key()),
          "; JSON readers disagree on which one wins, so a manifest may have each key once"));
    }
    if (builder.has_parse_error() && builder.error_is_syntax()) {
      const size_t pos = builder.error_position();
      return PositionError(source, bytes, pos > 0 ? pos - 1 : 0,
                           absl::StrCat("syntax error: ", ParseErrorDetail(builder.error_what())));
    }
    if (builder.has_parse_error()) {
      // out_of_range.406 ("number overflow parsing '1e400'") and friends.
      return absl::InvalidArgumentError(absl::StrCat(
          Sv(source), ": invalid JSON: ", ParseErrorDetail(builder.error_what())));
    }
    if (!ok) {
      return absl::InvalidArgumentError(absl::StrCat(Sv(source), ": invalid JSON"));
    }
    return doc;
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
