#include "artifacts/tar_stream.h"

#include <algorithm>
#include <array>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "base/strings.h"
#include "manifest/message_text.h"
#include "manifest/path_rules.h"

namespace cubist {
namespace {

// ustar header field offsets and widths.
constexpr size_t kName = 0, kNameLen = 100;
constexpr size_t kMode = 100, kUid = 108, kGid = 116, kSize = 124, kMtime = 136;
constexpr size_t kChksum = 148, kType = 156, kMagic = 257, kVersion = 263;
constexpr size_t kPrefix = 345, kPrefixLen = 155;
constexpr uint64_t kMaxSize = (uint64_t{1} << 33) - 1;  // 11 octal digits

void PutOctal(char* field, size_t width, uint64_t value) {
  // width - 1 digits and a NUL.
  for (size_t i = width - 1; i-- > 0;) {
    field[i] = static_cast<char>('0' + (value & 7));
    value >>= 3;
  }
  field[width - 1] = '\0';
}

uint64_t HeaderSum(const char* h) {
  uint64_t sum = 0;
  for (size_t i = 0; i < kTarBlock; ++i) {
    const bool in_chksum = i >= kChksum && i < kChksum + 8;
    sum += in_chksum ? ' ' : static_cast<unsigned char>(h[i]);
  }
  return sum;
}

// Octal digits, optionally space- or NUL-padded on either side.
bool ParseOctal(const char* field, size_t width, uint64_t* out) {
  size_t i = 0;
  while (i < width && field[i] == ' ') ++i;
  uint64_t v = 0;
  size_t digits = 0;
  for (; i < width && field[i] >= '0' && field[i] <= '7'; ++i, ++digits) {
    if (v > (kMaxSize >> 3)) return false;
    v = v * 8 + static_cast<uint64_t>(field[i] - '0');
  }
  for (; i < width; ++i) {
    if (field[i] != ' ' && field[i] != '\0') return false;
  }
  if (digits == 0) return false;
  *out = v;
  return true;
}

std::string_view Field(const char* h, size_t off, size_t width) {
  const char* end = static_cast<const char*>(std::memchr(h + off, '\0', width));
  return std::string_view(h + off, end == nullptr ? width : static_cast<size_t>(end - (h + off)));
}

std::string_view TypeName(char type) {
  switch (type) {
    case '1': return "a hard link";
    case '2': return "a symlink";
    case '3': return "a character device";
    case '4': return "a block device";
    case '5': return "a directory";
    case '6': return "a FIFO";
    case 'x': case 'g': return "a pax extended header";
    case 'L': case 'K': return "a GNU long-name header";
    default: return "of an unknown type";
  }
}

}  // namespace

absl::Status TarWriter::BeginMember(std::string_view name, uint64_t size) {
  if (remaining_ != 0) return absl::InternalError("tar: previous member not complete");
  std::array<char, kTarBlock> h{};
  std::string_view prefix;
  std::string_view base = name;
  if (name.size() > kNameLen) {
    const size_t slash = name.rfind('/', kPrefixLen);
    if (slash == std::string_view::npos || name.size() - slash - 1 > kNameLen || slash == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tar: member name ", QuoteForMessage(name), " does not fit a ustar header"));
    }
    prefix = name.substr(0, slash);
    base = name.substr(slash + 1);
  }
  if (size > kMaxSize) {
    return absl::InvalidArgumentError(absl::StrCat("tar: member ", Sv(name), " is ", size,
                                                   " bytes; ustar holds at most ", kMaxSize));
  }
  // An empty view may hold a null pointer, which memcpy must not get even for 0 bytes.
  if (!base.empty()) std::memcpy(h.data() + kName, base.data(), base.size());
  if (!prefix.empty()) std::memcpy(h.data() + kPrefix, prefix.data(), prefix.size());
  PutOctal(h.data() + kMode, 8, 0644);
  PutOctal(h.data() + kUid, 8, 0);
  PutOctal(h.data() + kGid, 8, 0);
  PutOctal(h.data() + kSize, 12, size);
  PutOctal(h.data() + kMtime, 12, 0);
  h[kType] = '0';
  std::memcpy(h.data() + kMagic, "ustar", 6);
  std::memcpy(h.data() + kVersion, "00", 2);
  PutOctal(h.data() + kChksum, 7, HeaderSum(h.data()));
  h[kChksum + 7] = ' ';
  remaining_ = size;
  member_size_ = size;
  return sink_(std::string_view(h.data(), h.size()));
}

absl::Status TarWriter::Data(std::string_view bytes) {
  if (bytes.size() > remaining_) return absl::InternalError("tar: more data than declared");
  remaining_ -= bytes.size();
  return sink_(bytes);
}

absl::Status TarWriter::EndMember() {
  if (remaining_ != 0) return absl::InternalError("tar: less data than declared");
  const size_t pad = (kTarBlock - member_size_ % kTarBlock) % kTarBlock;
  static const std::array<char, kTarBlock> kZeros{};
  return sink_(std::string_view(kZeros.data(), pad));
}

absl::Status TarWriter::Finish() {
  static const std::array<char, 2 * kTarBlock> kZeros{};
  return sink_(std::string_view(kZeros.data(), kZeros.size()));
}

TarReader::TarReader(ByteSource source, std::string source_name, uint64_t max_member_size)
    : source_(std::move(source)),
      source_name_(std::move(source_name)),
      max_member_size_(max_member_size) {}

absl::Status TarReader::ReadExactly(char* buffer, size_t size, std::string_view what) {
  size_t done = 0;
  while (done < size) {
    CUBIST_ASSIGN_OR_RETURN(size_t n, source_(buffer + done, size - done));
    if (n == 0) {
      return absl::DataLossError(absl::StrCat(
          source_name_, ": truncated at byte ", offset_ + done, " (in ", Sv(what),
          "); the bundle is incomplete: copy it again"));
    }
    done += n;
  }
  offset_ += size;
  return absl::OkStatus();
}

absl::Status TarReader::Skip(uint64_t size) {
  std::array<char, 16384> buf;
  while (size > 0) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(size, buf.size()));
    CUBIST_RETURN_IF_ERROR(ReadExactly(buf.data(), n, absl::StrCat("member ", current_)));
    size -= n;
  }
  return absl::OkStatus();
}

absl::Status TarReader::Next(TarMember* member, bool* more) {
  CUBIST_RETURN_IF_ERROR(Skip(remaining_ + padding_));
  remaining_ = padding_ = 0;
  std::array<char, kTarBlock> h;
  const uint64_t at = offset_;
  CUBIST_RETURN_IF_ERROR(ReadExactly(h.data(), h.size(), "a member header"));
  if (std::all_of(h.begin(), h.end(), [](char c) { return c == '\0'; })) {
    CUBIST_RETURN_IF_ERROR(ReadExactly(h.data(), h.size(), "the end-of-archive marker"));
    if (!std::all_of(h.begin(), h.end(), [](char c) { return c == '\0'; })) {
      return absl::InvalidArgumentError(absl::StrCat(
          source_name_, ": a lone zero block at byte ", at, "; not a well-formed tar"));
    }
    *more = false;
    return absl::OkStatus();
  }
  uint64_t sum = 0;
  if (Field(h.data(), kMagic, 6) != "ustar" || !ParseOctal(h.data() + kChksum, 8, &sum) ||
      sum != HeaderSum(h.data())) {
    return absl::InvalidArgumentError(absl::StrCat(
        source_name_, ": no valid ustar header at byte ", at,
        " (magic or checksum wrong); not a cubist bundle, or corrupt"));
  }
  std::string name(Field(h.data(), kName, kNameLen));
  const std::string_view prefix = Field(h.data(), kPrefix, kPrefixLen);
  if (!prefix.empty()) name = absl::StrCat(Sv(prefix), "/", name);
  current_ = name;
  const char type = h[kType];
  if (type != '0' && type != '\0') {
    return absl::InvalidArgumentError(absl::StrCat(
        source_name_, ": member ", QuoteForMessage(name), " at byte ", at, " is ",
        Sv(TypeName(type)), "; bundles hold regular files only, so it is refused"));
  }
  if (absl::Status s = ValidateArtifactPath(name); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(source_name_, ": member at byte ", at,
                                                   " refused: ", s.message()));
  }
  uint64_t size = 0;
  if (!ParseOctal(h.data() + kSize, 12, &size)) {
    return absl::InvalidArgumentError(absl::StrCat(source_name_, ": member ", name,
                                                   ": unreadable size field"));
  }
  if (size > max_member_size_) {
    return absl::InvalidArgumentError(absl::StrCat(source_name_, ": member ", name, " is ",
                                                   size, " bytes, over the limit of ",
                                                   max_member_size_));
  }
  member->name = std::move(name);
  member->size = size;
  member->offset = at;
  remaining_ = size;
  padding_ = (kTarBlock - size % kTarBlock) % kTarBlock;
  *more = true;
  return absl::OkStatus();
}

absl::StatusOr<size_t> TarReader::Read(char* buffer, size_t size) {
  const size_t n = static_cast<size_t>(std::min<uint64_t>(size, remaining_));
  if (n == 0) return 0;
  CUBIST_RETURN_IF_ERROR(ReadExactly(buffer, n, absl::StrCat("member ", current_)));
  remaining_ -= n;
  return n;
}

}  // namespace cubist
