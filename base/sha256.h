// SHA-256 through OpenSSL (SHA-NI where the CPU has it).
#ifndef CUBIST_BASE_SHA256_H_
#define CUBIST_BASE_SHA256_H_

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace cubist {

using Sha256Digest = std::array<uint8_t, 32>;

// Incremental hasher. Move-only; owns its OpenSSL context. Not thread-safe.
class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(Sha256&&) noexcept;
  Sha256& operator=(Sha256&&) noexcept;
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;

  void Update(const void* data, size_t size);
  void Update(std::string_view data) { Update(data.data(), data.size()); }
  // Returns the digest and resets the hasher for reuse.
  Sha256Digest Finish();

 private:
  struct Ctx;
  std::unique_ptr<Ctx> ctx_;
};

// Lowercase hex of a digest (64 characters).
std::string ToHex(const Sha256Digest& digest);
// Parses 64 lowercase hex characters; anything else is InvalidArgument.
absl::StatusOr<Sha256Digest> ParseSha256Hex(std::string_view hex);
// True when `hex` is exactly 64 lowercase hex characters.
bool IsSha256Hex(std::string_view hex);

std::string Sha256Hex(std::string_view data);

// Hashes a whole file by streaming it (never all in memory). Returns the lowercase
// hex digest; `size_out`, when given, receives the number of bytes read.
absl::StatusOr<std::string> Sha256File(const std::string& path,
                                       uint64_t* size_out = nullptr);

}  // namespace cubist

#endif  // CUBIST_BASE_SHA256_H_
