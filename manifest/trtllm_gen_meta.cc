#include "manifest/trtllm_gen_meta.h"

#include <cctype>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "base/sha256.h"
#include "base/status_macros.h"
#include "base/strings.h"
#include "manifest/message_text.h"

namespace cubist {
namespace {

enum class Tok { kEnd, kPunct, kString, kNumber, kIdent, kLabel };

struct Token {
  Tok kind = Tok::kEnd;
  std::string text;  // punctuation char, unescaped string, number, identifier, label
  size_t line = 0;
};

bool IsIdentStart(char c) { return std::isalpha(static_cast<unsigned char>(c)) || c == '_'; }
bool IsIdentChar(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

std::string_view Trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

// Splits the header into tokens on demand. Preprocessor lines are skipped (the export
// version is remembered); comments become kLabel tokens that the parser uses only where
// an option label may stand.
class Lexer {
 public:
  Lexer(std::string_view in, std::string_view source) : in_(in), source_(source) {}

  absl::Status Next(Token* t) {
    for (;;) {
      while (pos_ < in_.size()) {
        char c = in_[pos_];
        if (c == '\n') {
          ++line_;
          line_start_ = true;
          ++pos_;
        } else if (c == ' ' || c == '\t' || c == '\r' || c == '\f' || c == '\v') {
          ++pos_;
        } else {
          break;
        }
      }
      t->line = line_;
      if (pos_ >= in_.size()) {
        t->kind = Tok::kEnd;
        t->text.clear();
        return absl::OkStatus();
      }
      const char c = in_[pos_];
      if (c == '#' && line_start_) {
        SkipDirective();
        continue;
      }
      line_start_ = false;
      if (in_.substr(pos_, 2) == "//") {
        while (pos_ < in_.size() && in_[pos_] != '\n') ++pos_;
        continue;
      }
      if (in_.substr(pos_, 2) == "/*") {
        const size_t end = in_.find("*/", pos_ + 2);
        if (end == std::string_view::npos) return Error(line_, "unterminated /* comment");
        std::string_view body = in_.substr(pos_ + 2, end - pos_ - 2);
        for (char b : body) line_ += b == '\n';
        pos_ = end + 2;
        t->kind = Tok::kLabel;
        t->text = std::string(Trim(body));
        return absl::OkStatus();
      }
      if (c == '"') return ReadString(t);
      if (std::isdigit(static_cast<unsigned char>(c)) ||
          ((c == '-' || c == '+') && pos_ + 1 < in_.size() &&
           std::isdigit(static_cast<unsigned char>(in_[pos_ + 1])))) {
        const size_t start = pos_++;
        while (pos_ < in_.size() && (IsIdentChar(in_[pos_]) || in_[pos_] == '.')) ++pos_;
        t->kind = Tok::kNumber;
        t->text = std::string(in_.substr(start, pos_ - start));
        return absl::OkStatus();
      }
      if (IsIdentStart(c)) {
        const size_t start = pos_;
        for (;;) {
          while (pos_ < in_.size() && IsIdentChar(in_[pos_])) ++pos_;
          if (in_.substr(pos_, 2) == "::" && pos_ + 2 < in_.size() && IsIdentStart(in_[pos_ + 2])) {
            pos_ += 2;
            continue;
          }
          break;
        }
        t->kind = Tok::kIdent;
        t->text = std::string(in_.substr(start, pos_ - start));
        return absl::OkStatus();
      }
      static constexpr std::string_view kPunct = "{}(),;=[]<>*&:";
      if (kPunct.find(c) != std::string_view::npos) {
        ++pos_;
        t->kind = Tok::kPunct;
        t->text = std::string(1, c);
        return absl::OkStatus();
      }
      return Error(line_, absl::StrCat("unexpected character ",
                                       QuoteForMessage(in_.substr(pos_, 1))));
    }
  }

  absl::Status Error(size_t line, std::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat(Sv(source_), ":", line, ": ", Sv(what)));
  }

  const std::string& export_version() const { return export_version_; }

 private:
  absl::Status ReadString(Token* t) {
    std::string out;
    ++pos_;
    while (pos_ < in_.size()) {
      char c = in_[pos_++];
      if (c == '"') {
        t->kind = Tok::kString;
        t->text = std::move(out);
        return absl::OkStatus();
      }
      if (c == '\n') break;
      if (c == '\\') {
        if (pos_ >= in_.size() || in_[pos_] == '\n') break;
        c = in_[pos_++];
      }
      out += c;
    }
    return Error(t->line, "unterminated string literal (strings end on their line)");
  }

  // A directive runs to the end of the line, or further after a backslash.
  void SkipDirective() {
    const size_t start = pos_;
    while (pos_ < in_.size() && in_[pos_] != '\n') {
      if (in_[pos_] == '\\' && pos_ + 1 < in_.size() && in_[pos_ + 1] == '\n') {
        ++line_;
        pos_ += 2;
        continue;
      }
      ++pos_;
    }
    std::string_view d = in_.substr(start, pos_ - start);
    static constexpr std::string_view kVersion = "#define TLLM_GEN_EXPORT_VERSION";
    if (d.substr(0, kVersion.size()) == kVersion) {
      std::string_view rest = Trim(d.substr(kVersion.size()));
      if (rest.size() >= 2 && rest.front() == '"' && rest.back() == '"') {
        export_version_ = std::string(rest.substr(1, rest.size() - 2));
      }
    }
  }

  std::string_view in_;
  std::string_view source_;
  size_t pos_ = 0;
  size_t line_ = 1;
  bool line_start_ = true;
  std::string export_version_;
};

struct Item {
  std::string label;
  MetaValue value;
  bool quoted = false;  // a string literal
  size_t line = 0;
  std::vector<Item> children;  // for lists
};

class Parser {
 public:
  Parser(Lexer& lex, const TrtllmGenMetaLimits& limits) : lex_(lex), limits_(limits) {}

  absl::Status Advance() {
    do {
      CUBIST_RETURN_IF_ERROR(lex_.Next(&tok_));
    } while (tok_.kind == Tok::kLabel && !keep_labels_);
    return absl::OkStatus();
  }
  const Token& tok() const { return tok_; }
  bool IsPunct(char c) const { return tok_.kind == Tok::kPunct && tok_.text[0] == c; }

  // Parses the items of a brace list whose '{' is the current token; ends after its '}'.
  absl::Status ParseList(size_t depth, std::vector<Item>* out) {
    if (depth > limits_.max_depth) {
      return lex_.Error(tok_.line, absl::StrCat("initializers nest deeper than ",
                                                limits_.max_depth, " levels"));
    }
    keep_labels_ = true;
    CUBIST_RETURN_IF_ERROR(Advance());
    for (;;) {
      std::string label;
      while (tok_.kind == Tok::kLabel) {
        label = tok_.text;
        CUBIST_RETURN_IF_ERROR(Advance());
      }
      if (IsPunct('}')) break;  // empty list or trailing comma
      if (out->size() >= limits_.max_values) {
        return lex_.Error(tok_.line, absl::StrCat("more than ", limits_.max_values,
                                                  " values in one initializer"));
      }
      Item item;
      item.label = std::move(label);
      item.line = tok_.line;
      if (IsPunct('{')) {
        item.value.list = true;
        CUBIST_RETURN_IF_ERROR(ParseList(depth + 1, &item.children));
        item.value.text = "{";
        for (size_t i = 0; i < item.children.size(); ++i) {
          if (i > 0) item.value.text += ",";
          item.value.text += item.children[i].value.text;
        }
        item.value.text += "}";
        keep_labels_ = true;
        CUBIST_RETURN_IF_ERROR(Advance());
      } else {
        int parens = 0;
        bool any = false;
        while (!(parens == 0 && (IsPunct(',') || IsPunct('}')))) {
          if (tok_.kind == Tok::kEnd) {
            return lex_.Error(item.line, "initializer not closed before the end of the file");
          }
          if (IsPunct('{') || IsPunct(';')) {
            return lex_.Error(tok_.line, absl::StrCat("unexpected '", tok_.text,
                                                      "' inside a value"));
          }
          if (tok_.kind == Tok::kLabel) {  // a comment inside a value says nothing
            CUBIST_RETURN_IF_ERROR(Advance());
            continue;
          }
          if (IsPunct('(')) ++parens;
          if (IsPunct(')') && --parens < 0) return lex_.Error(tok_.line, "unbalanced ')'");
          if (tok_.kind == Tok::kString) {
            if (any) return lex_.Error(tok_.line, "a string literal inside an expression");
            item.quoted = true;
          } else if (item.quoted) {
            return lex_.Error(tok_.line, "a string literal inside an expression");
          }
          item.value.text += tok_.text;
          any = true;
          CUBIST_RETURN_IF_ERROR(Advance());
        }
        if (!any) return lex_.Error(tok_.line, "empty value");
      }
      out->push_back(std::move(item));
      if (IsPunct(',')) {
        CUBIST_RETURN_IF_ERROR(Advance());
        continue;
      }
      break;  // '}'
    }
    if (!IsPunct('}')) {
      return lex_.Error(tok_.line, absl::StrCat("expected ',' or '}', got ",
                                                QuoteForMessage(tok_.text)));
    }
    keep_labels_ = false;
    return absl::OkStatus();
  }

  void set_keep_labels(bool keep) { keep_labels_ = keep; }

 private:
  Lexer& lex_;
  const TrtllmGenMetaLimits& limits_;
  Token tok_;
  bool keep_labels_ = false;
};

absl::StatusOr<TrtllmGenKernelMeta> ToKernel(const std::vector<Item>& items, size_t line,
                                             size_t index, const Lexer& lex) {
  auto err = [&](std::string_view what) {
    return lex.Error(line, absl::StrCat("entry ", index, ": ", Sv(what)));
  };
  // Positions of BatchedGemmConfig's leading members, as the generator writes them.
  constexpr size_t kSmem = 2, kFunction = 3, kThreads = 4, kHash = 5;
  if (items.size() < kHash + 3) {
    return err(absl::StrCat("expected at least ", kHash + 3, " members, got ", items.size()));
  }
  TrtllmGenKernelMeta k;
  k.line = line;
  auto integer = [&](size_t i, std::string_view what) -> absl::StatusOr<int64_t> {
    std::optional<int64_t> v = items[i].quoted ? std::nullopt : items[i].value.Int();
    if (!v.has_value() || *v < 0 || *v > (int64_t{1} << 31)) {
      return err(absl::StrCat("expected a non-negative integer (", Sv(what), ") at position ",
                              i, ", got ", QuoteForMessage(items[i].value.text)));
    }
    return *v;
  };
  auto string = [&](size_t i, std::string_view what) -> absl::StatusOr<std::string> {
    if (!items[i].quoted) {
      return err(absl::StrCat("expected a string (", Sv(what), ") at position ", i, ", got ",
                              QuoteForMessage(items[i].value.text)));
    }
    return items[i].value.text;
  };
  CUBIST_ASSIGN_OR_RETURN(k.shared_mem_bytes, integer(kSmem, "shared memory bytes"));
  CUBIST_ASSIGN_OR_RETURN(k.function, string(kFunction, "the function name"));
  CUBIST_ASSIGN_OR_RETURN(k.threads, integer(kThreads, "threads per CTA"));
  CUBIST_ASSIGN_OR_RETURN(k.sha256, string(kHash, "the cubin's sha256"));
  if (k.function.empty()) return err("empty function name");
  for (char c : k.function) {
    if (!IsIdentChar(c)) {
      return err(absl::StrCat("function name ", QuoteForMessage(k.function),
                              " is not a C identifier"));
    }
  }
  if (!IsSha256Hex(k.sha256)) {
    return err(absl::StrCat("sha256 ", QuoteForMessage(k.sha256),
                            " is not 64 lowercase hex characters"));
  }
  const Item& last = items.back();
  const size_t colon = last.value.text.rfind("::");
  if (last.quoted || last.value.list ||
      last.value.text.find("SmVersion::") == std::string::npos) {
    return err(absl::StrCat("expected the SM version (gemm::SmVersion::...) last, got ",
                            QuoteForMessage(last.value.text)));
  }
  k.sm_version = last.value.text.substr(colon + 2);
  const Item* options = nullptr;
  for (size_t i = kHash + 1; i + 1 < items.size(); ++i) {
    if (items[i].value.list) {
      options = &items[i];
      break;
    }
  }
  if (options == nullptr) return err("no options initializer ({ /* mName */ value, ... })");
  for (const Item& o : options->children) {
    if (o.label.empty()) {
      return err(absl::StrCat("option value ", QuoteForMessage(o.value.text), " (line ",
                              o.line, ") has no /* mName */ label"));
    }
    k.options.emplace_back(o.label, o.value);
  }
  return k;
}

// `<name>ListLen = N` as the header declares it, checked against the entries at the end.
struct DeclaredLength {
  std::optional<int64_t> value;
  size_t line = 0;
};

// Top level: skips to `<name>List[] = {`, noting `<name>ListLen = N` on the way; returns
// the list's name with the parser on its '{'.
absl::StatusOr<std::string> FindKernelList(Parser& p, const Lexer& lex, std::string_view source,
                                           DeclaredLength* declared) {
  CUBIST_RETURN_IF_ERROR(p.Advance());
  for (;;) {
    const Token& t = p.tok();
    if (t.kind == Tok::kEnd) {
      return absl::InvalidArgumentError(absl::StrCat(
          Sv(source), ": no kernel list (`static const ... tllmGenBatchedGemmList[] = {`); "
                      "is this a trtllm-gen flashinferMetaInfo.h?"));
    }
    if (t.kind != Tok::kIdent) {
      CUBIST_RETURN_IF_ERROR(p.Advance());
      continue;
    }
    const std::string ident = t.text;
    const size_t line = t.line;
    CUBIST_RETURN_IF_ERROR(p.Advance());
    if (ident.size() > 7 && ident.compare(ident.size() - 7, 7, "ListLen") == 0 &&
        p.IsPunct('=')) {
      CUBIST_RETURN_IF_ERROR(p.Advance());
      MetaValue v{p.tok().text, false};
      if (p.tok().kind != Tok::kNumber || !v.Int().has_value()) {
        return lex.Error(line, absl::StrCat(ident, ": expected a number, got ",
                                            QuoteForMessage(p.tok().text)));
      }
      declared->value = v.Int();
      declared->line = line;
      continue;
    }
    if (ident.size() > 4 && ident.compare(ident.size() - 4, 4, "List") == 0 &&
        p.IsPunct('[')) {
      CUBIST_RETURN_IF_ERROR(p.Advance());
      if (!p.IsPunct(']')) return lex.Error(line, absl::StrCat(ident, ": expected '[]'"));
      CUBIST_RETURN_IF_ERROR(p.Advance());
      if (!p.IsPunct('=')) return lex.Error(line, absl::StrCat(ident, "[]: expected '='"));
      CUBIST_RETURN_IF_ERROR(p.Advance());
      if (!p.IsPunct('{')) return lex.Error(line, absl::StrCat(ident, "[] = : expected '{'"));
      return ident;
    }
  }
}

// The array after its '{': entries `{...}` separated by commas, closed by '}'; leaves
// the parser on the '}'.
absl::Status ParseKernelEntries(Parser& p, const Lexer& lex, const TrtllmGenMetaLimits& limits,
                                std::vector<TrtllmGenKernelMeta>* kernels) {
  CUBIST_RETURN_IF_ERROR(p.Advance());
  for (;;) {
    if (p.IsPunct('}')) return absl::OkStatus();
    if (!p.IsPunct('{')) {
      return lex.Error(p.tok().line, absl::StrCat("expected '{' (a kernel entry) or '}', got ",
                                                  QuoteForMessage(p.tok().text)));
    }
    if (kernels->size() >= limits.max_entries) {
      return lex.Error(p.tok().line,
                       absl::StrCat("more than ", limits.max_entries, " kernel entries"));
    }
    const size_t line = p.tok().line;
    std::vector<Item> items;
    CUBIST_RETURN_IF_ERROR(p.ParseList(1, &items));
    CUBIST_ASSIGN_OR_RETURN(TrtllmGenKernelMeta k, ToKernel(items, line, kernels->size(), lex));
    kernels->push_back(std::move(k));
    CUBIST_RETURN_IF_ERROR(p.Advance());
    if (p.IsPunct(',')) {
      CUBIST_RETURN_IF_ERROR(p.Advance());
      continue;
    }
    if (!p.IsPunct('}')) {
      return lex.Error(p.tok().line, absl::StrCat("expected ',' or '}' after an entry, got ",
                                                  QuoteForMessage(p.tok().text)));
    }
  }
}

}  // namespace

std::optional<int64_t> MetaValue::Int() const {
  if (list) return std::nullopt;
  std::string_view s = text;
  if (!s.empty() && s.back() == ')') {
    const size_t open = s.find('(');
    if (open == std::string_view::npos || open == 0) return std::nullopt;
    s = s.substr(open + 1, s.size() - open - 2);
  }
  int64_t v = 0;
  if (!absl::SimpleAtoi(Sv(s), &v)) return std::nullopt;
  return v;
}

const MetaValue* TrtllmGenKernelMeta::Find(std::string_view name) const {
  for (const auto& [key, value] : options) {
    if (key == name) return &value;
  }
  return nullptr;
}

absl::StatusOr<TrtllmGenMetaInfo> ParseTrtllmGenMetaInfo(std::string_view bytes,
                                                         std::string_view source,
                                                         const TrtllmGenMetaLimits& limits) {
  if (bytes.size() > limits.max_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        Sv(source), ": ", bytes.size(), " bytes is over the limit of ", limits.max_bytes,
        " bytes for a kernel list; is this a flashinferMetaInfo.h?"));
  }
  Lexer lex(bytes, source);
  Parser p(lex, limits);
  TrtllmGenMetaInfo info;
  DeclaredLength declared;
  CUBIST_ASSIGN_OR_RETURN(info.list_name, FindKernelList(p, lex, source, &declared));
  CUBIST_RETURN_IF_ERROR(ParseKernelEntries(p, lex, limits, &info.kernels));
  if (info.kernels.empty()) {
    return lex.Error(p.tok().line, absl::StrCat(info.list_name, " lists no kernels"));
  }
  if (declared.value.has_value() &&
      *declared.value != static_cast<int64_t>(info.kernels.size())) {
    return lex.Error(declared.line,
                     absl::StrCat("the list declares ", *declared.value, " kernels but holds ",
                                  info.kernels.size(), "; the header is truncated or edited"));
  }
  info.export_version = lex.export_version();
  return info;
}

}  // namespace cubist
