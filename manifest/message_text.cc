#include "manifest/message_text.h"

#include <cstdio>

namespace cubist {

size_t Utf8SequenceLength(std::string_view text, size_t pos, char32_t* code_point) {
  const auto byte = [&](size_t i) { return static_cast<unsigned char>(text[i]); };
  const unsigned char b0 = byte(pos);
  if (b0 < 0x80) {
    if (code_point != nullptr) *code_point = b0;
    return 1;
  }
  size_t len;
  char32_t cp;
  char32_t min;
  if ((b0 & 0xE0) == 0xC0) {
    len = 2, cp = b0 & 0x1F, min = 0x80;
  } else if ((b0 & 0xF0) == 0xE0) {
    len = 3, cp = b0 & 0x0F, min = 0x800;
  } else if ((b0 & 0xF8) == 0xF0) {
    len = 4, cp = b0 & 0x07, min = 0x10000;
  } else {
    return 0;  // continuation byte or 0xF8..0xFF as a lead byte
  }
  if (pos + len > text.size()) return 0;
  for (size_t i = 1; i < len; ++i) {
    const unsigned char b = byte(pos + i);
    if ((b & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (b & 0x3F);
  }
  // Overlong encodings would let two byte strings name the same path; surrogates and
  // values past U+10FFFF are not characters.
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
  if (code_point != nullptr) *code_point = cp;
  return len;
}

namespace {

std::string Escape(std::string_view text, size_t max_bytes, bool quote) {
  std::string out = quote ? "\"" : "";
  size_t pos = 0;
  while (pos < text.size()) {
    if (pos >= max_bytes) {
      out += "...";
      break;
    }
    const unsigned char c = static_cast<unsigned char>(text[pos]);
    if (quote && (c == '"' || c == '\\')) {
      out += '\\';
      out += static_cast<char>(c);
      ++pos;
      continue;
    }
    switch (c) {
      case '\n': out += "\\n"; ++pos; continue;
      case '\r': out += "\\r"; ++pos; continue;
      case '\t': out += "\\t"; ++pos; continue;
      default: break;
    }
    const size_t len = Utf8SequenceLength(text, pos);
    if (c < 0x20 || c == 0x7F || len == 0) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", c);
      out += buf;
      ++pos;
      continue;
    }
    out.append(text.substr(pos, len));
    pos += len;
  }
  if (quote) out += '"';
  return out;
}

}  // namespace

std::string QuoteForMessage(std::string_view text, size_t max_bytes) {
  return Escape(text, max_bytes, /*quote=*/true);
}

std::string EscapeForMessage(std::string_view text, size_t max_bytes) {
  return Escape(text, max_bytes, /*quote=*/false);
}

}  // namespace cubist
