// The manifest: what an artifact set contains (files with their hashes and sizes) and
// which kernels live in which file. This header holds the data model only; parsing and
// writing live in manifest_parser.h / manifest_writer.h, checksums.txt in checksums.h.
//
// JSON form ("schema": "cubist.manifest/1"):
//   {
//     "schema": "cubist.manifest/1",
//     "name": "moe-gemm-sm90a",          // identifies the artifact set
//     "version": 7,                      // integer >= 1 that only grows
//     "expires": "2027-01-01T00:00:00Z", // optional, RFC 3339
//     "base_urls": ["https://m1/x/"],    // optional mirrors, tried in order
//     "artifacts": [{"path": "cubins/sm_90a/k.cubin", "sha256": "<64 hex>",
//                    "size": 123}],
//     "kernels": [{"name": "...", "artifact": "cubins/sm_90a/k.cubin",
//                  "function": "moe_gemm_...", "arch": "sm_90a", "op": "moe_gemm",
//                  "abi": 1, "weight_format": "mxfp4", "activation_format": "bf16",
//                  "activation": "swiglu", "tile_m": 64, "tile_n": 128, "tile_k": 64,
//                  "cluster": [1, 1, 1], "stages": 4, "threads": 256,
//                  "shared_mem_bytes": 98304, ...free-form extras...}]
//   }
// Unknown fields are kept (as raw JSON text) and written back, never interpreted.
#ifndef CUBIST_MANIFEST_MANIFEST_H_
#define CUBIST_MANIFEST_MANIFEST_H_

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/time/time.h"

namespace cubist {

inline constexpr char kManifestSchema[] = "cubist.manifest/1";

// Raw JSON text of fields that cubist does not interpret, keyed by field name.
// std::map keeps the writer's output stable.
using ExtraFields = std::map<std::string, std::string>;

// One file of the artifact set.
struct Artifact {
  std::string path;    // relative, normalised, '/'-separated
  std::string sha256;  // 64 lowercase hex characters
  // Bytes. Always present in a JSON manifest; absent for a FlashInfer checksums.txt,
  // where the fetcher then caps the download at FetchOptions::max_unknown_size.
  std::optional<uint64_t> size;
  ExtraFields extras;

  bool operator==(const Artifact&) const = default;
};

// Metadata of one kernel inside an artifact (a cubin).
struct KernelSpec {
  std::string name;       // unique within the manifest
  std::string artifact;   // path of the artifact that holds the kernel
  std::string function;   // the mangled or extern "C" symbol in the cubin
  std::string arch;       // "sm_90a", "sm_90", "sm_100f", ...
  std::string op;         // "moe_gemm"
  int abi = 0;            // version of the op's parameter struct (kernels/)
  std::string weight_format;      // bf16, fp8, fp8-block, mxfp4, mxfp8, nvfp4
  std::string activation_format;  // the A operand's format, same vocabulary
  std::string activation;         // identity, relu2, swiglu, geglu, situ
  int tile_m = 0;
  int tile_n = 0;
  int tile_k = 0;
  std::array<int, 3> cluster = {1, 1, 1};
  int stages = 0;
  int threads = 0;
  int shared_mem_bytes = 0;  // dynamic shared memory the launch must request
  ExtraFields extras;

  bool operator==(const KernelSpec&) const = default;
};

struct Manifest {
  std::string schema = kManifestSchema;
  std::string name;
  int64_t version = 0;
  std::optional<absl::Time> expires;
  std::vector<std::string> base_urls;
  std::vector<Artifact> artifacts;
  std::vector<KernelSpec> kernels;
  ExtraFields extras;  // unknown top-level fields

  // Where the manifest was read from (URL, path or "<memory>"); used as the default
  // base for artifact URLs and in error messages. Not serialised.
  std::string source;
  // SHA-256 (hex) of the exact bytes the manifest was parsed from; identifies the
  // artifact set. Empty for a manifest built in memory. Not serialised.
  std::string digest;

  // Returns the artifact with this path, or nullptr.
  const Artifact* FindArtifact(std::string_view path) const;
  // Returns the kernel with this name, or nullptr.
  const KernelSpec* FindKernel(std::string_view name) const;

  // Compares every field, source and digest included (see SameContent).
  bool operator==(const Manifest&) const = default;
};

// True when `a` and `b` hold the same serialised content: every field except source and
// digest. ParseManifest(WriteManifest(m)) is SameContent as m.
bool SameContent(const Manifest& a, const Manifest& b);

}  // namespace cubist

#endif  // CUBIST_MANIFEST_MANIFEST_H_
