// Quoting of untrusted text inside error messages. A manifest, a checksums.txt line or a
// file name can hold anything (control characters, invalid UTF-8, megabytes of text);
// messages must stay one readable line of bounded length whatever the input.
//
// Thread-safe (pure functions).
#ifndef CUBIST_MANIFEST_MESSAGE_TEXT_H_
#define CUBIST_MANIFEST_MESSAGE_TEXT_H_

#include <cstddef>
#include <string>
#include <string_view>

namespace cubist {

// Returns `text` in double quotes with JSON-like escapes: \" \\ \n \r \t, other control
// bytes and bytes that are not part of valid UTF-8 as \xNN. Valid non-ASCII UTF-8 is kept.
// Text longer than `max_bytes` is cut at a character boundary and ends with "...".
std::string QuoteForMessage(std::string_view text, size_t max_bytes = 80);

// Like QuoteForMessage without the quotes and without escaping '"' and '\\': only
// control bytes and invalid UTF-8 become \xNN. For text that is already a message.
std::string EscapeForMessage(std::string_view text, size_t max_bytes = 200);

// Length in bytes of the valid UTF-8 sequence starting at text[pos], or 0 when the bytes
// there are not valid UTF-8 (overlong forms, surrogates and code points above U+10FFFF
// are invalid). `code_point`, when given, receives the decoded value.
size_t Utf8SequenceLength(std::string_view text, size_t pos, char32_t* code_point = nullptr);

}  // namespace cubist

#endif  // CUBIST_MANIFEST_MESSAGE_TEXT_H_
