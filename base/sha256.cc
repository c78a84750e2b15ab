#include "base/sha256.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

// OpenSSL's one-shot SHA-256 functions, not EVP: the first EVP digest of a process loads
// OpenSSL's configuration and its default provider and fetches the algorithm, 2-3 ms
// (measured here: more than hashing FlashInfer's 2.2 MB checksums.txt), which a warm
// fetch would pay on every run. These run the same assembly (SHA-NI where the CPU has
// it) without that. OpenSSL 3 marks them deprecated, not removed.
#define OPENSSL_SUPPRESS_DEPRECATED
#include <openssl/sha.h>

#include "absl/strings/str_cat.h"
#include "base/strings.h"
#include "base/unique_fd.h"

namespace cubist {

struct Sha256::Ctx {
  SHA256_CTX sha;
};

Sha256::Sha256() : ctx_(std::make_unique<Ctx>()) { SHA256_Init(&ctx_->sha); }
Sha256::~Sha256() = default;
Sha256::Sha256(Sha256&&) noexcept = default;
Sha256& Sha256::operator=(Sha256&&) noexcept = default;

void Sha256::Update(const void* data, size_t size) {
  if (size > 0) SHA256_Update(&ctx_->sha, data, size);
}

Sha256Digest Sha256::Finish() {
  Sha256Digest out{};
  SHA256_Final(out.data(), &ctx_->sha);
  SHA256_Init(&ctx_->sha);
  return out;
}

std::string ToHex(const Sha256Digest& digest) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out(64, '0');
  for (size_t i = 0; i < digest.size(); ++i) {
    out[2 * i] = kHex[digest[i] >> 4];
    out[2 * i + 1] = kHex[digest[i] & 0xf];
  }
  return out;
}

bool IsSha256Hex(std::string_view hex) {
  if (hex.size() != 64) return false;
  for (char c : hex) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

absl::StatusOr<Sha256Digest> ParseSha256Hex(std::string_view hex) {
  if (!IsSha256Hex(hex)) {
    return absl::InvalidArgumentError(
        absl::StrCat("expected 64 lowercase hex characters, got '", Sv(hex), "'"));
  }
  Sha256Digest out{};
  auto nibble = [](char c) { return c <= '9' ? c - '0' : c - 'a' + 10; };
  for (size_t i = 0; i < 32; ++i) {
    out[i] = static_cast<uint8_t>(nibble(hex[2 * i]) << 4 | nibble(hex[2 * i + 1]));
  }
  return out;
}

std::string Sha256Hex(std::string_view data) {
  Sha256 h;
  h.Update(data);
  return ToHex(h.Finish());
}

absl::StatusOr<std::string> Sha256File(const std::string& path, uint64_t* size_out) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) {
    return ErrnoToStatus(errno, absl::StrCat(path, ": cannot open"));
  }
  Sha256 h;
  std::vector<char> buf(1 << 20);
  uint64_t total = 0;
  for (;;) {
    ssize_t n = ::read(fd.get(), buf.data(), buf.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoToStatus(errno, absl::StrCat(path, ": read failed"));
    }
    if (n == 0) break;
    h.Update(buf.data(), static_cast<size_t>(n));
    total += static_cast<uint64_t>(n);
  }
  if (size_out != nullptr) *size_out = total;
  return ToHex(h.Finish());
}

}  // namespace cubist
