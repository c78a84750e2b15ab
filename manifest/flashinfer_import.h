// A FlashInfer trtllm-gen cubin pin as a cubist manifest with kernel metadata.
//
// A pin is a directory such as `<40 hex>/batched_gemm-91e0ba0-896b90b/` holding
// checksums.txt, the cubins and include/flashinferMetaInfo.h (trtllm_gen_meta.h). The
// checksums say which bytes each file must have; the header says which kernel each cubin
// holds and how it was built. ImportFlashinferPin joins the two:
//
//   - every artifact of checksums.txt (sizes when the caller knows them), and
//     checksums.txt itself, which FlashInfer reads from the pin directory;
//   - one kernel per header entry, op "trtllm_bmm" (kTrtllmBmmOp), abi 1, named after its
//     function; its artifact is the function name with the first letter upper-cased plus
//     ".cubin" (how FlashInfer names the files), and the header's sha256 of it must equal
//     the checksums' (DataLoss otherwise: the pin contradicts itself);
//   - the header itself, when checksums.txt lists it, must hash to its entry (DataLoss);
//   - formats and activation in the dispatcher's vocabulary (dispatch/moe_types.h), with
//     the trtllm-gen enums translated below, and the rest of the options a selector or a
//     launcher needs in extras (see kTrtllmExtras in the .cc).
//
// The weights are the MMA's A operand when the kernel transposes its output (every
// kernel FlashInfer ships for MoE does) and B otherwise; tile_m is the tile along tokens
// and tile_n along the weight rows, so cubist's cost model reads them as for moe_gemm.
//
// Errors: InvalidArgument (an entry cubist cannot describe, e.g. an unknown dtype code,
// naming the entry and the header line), DataLoss (hash contradictions), NotFound (a
// kernel whose cubin checksums.txt does not list).
#ifndef CUBIST_MANIFEST_FLASHINFER_IMPORT_H_
#define CUBIST_MANIFEST_FLASHINFER_IMPORT_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "manifest/manifest.h"
#include "manifest/trtllm_gen_meta.h"

namespace cubist {

inline constexpr char kTrtllmBmmOp[] = "trtllm_bmm";
// The pin's list of files; an artifact of the imported manifest (its hash is the parsed
// checksums manifest's digest).
inline constexpr char kFlashinferChecksumsPath[] = "checksums.txt";
// Where the kernel list lives inside a pin: the GEMM pins' name, and the attention
// (FMHA) pin's, with a capital I.
inline constexpr char kFlashinferMetaInfoPath[] = "include/flashinferMetaInfo.h";
inline constexpr char kFlashinferFmhaMetaInfoPath[] = "include/flashInferMetaInfo.h";
inline constexpr const char* kFlashinferMetaInfoPaths[] = {kFlashinferMetaInfoPath,
                                                           kFlashinferFmhaMetaInfoPath};
// The manifest extra that records the pin's directory relative to FLASHINFER_CUBIN_DIR
// ("<40 hex>/batched_gemm-91e0ba0-896b90b"); `cubist export --layout flashinfer` reads it.
inline constexpr char kFlashinferPinExtra[] = "flashinfer_pin";

struct FlashinferImportOptions {
  std::string name;   // manifest name; empty: the checksums manifest's
  int64_t version = 1;
  std::string pin;    // recorded as kFlashinferPinExtra when not empty
  std::vector<std::string> base_urls;
  // The header's path inside the pin (one of kFlashinferMetaInfoPaths), whose hash
  // checksums.txt lists.
  std::string header_path = kFlashinferMetaInfoPath;
};

// `checksums` is the parsed checksums.txt of the pin (ParseChecksums), `header` the bytes
// of its include/flashinferMetaInfo.h, `header_source` their name in messages.
[[nodiscard]] absl::StatusOr<Manifest> ImportFlashinferPin(
    const Manifest& checksums, std::string_view header, std::string_view header_source,
    const FlashinferImportOptions& options = {});

// The kernel description of one header entry (no artifact checks): what
// ImportFlashinferPin puts in the manifest. Exposed for tests and the fuzzer.
[[nodiscard]] absl::StatusOr<KernelSpec> TrtllmGenKernelSpec(const TrtllmGenKernelMeta& meta,
                                                             std::string_view source);

// "bmm_E4m3_..." -> "Bmm_E4m3_....cubin".
std::string TrtllmGenCubinName(std::string_view function);

// The pin directory of a checksums.txt location: its last two directories when the
// first is 40 hex characters (FlashInfer's artifact commit), else "".
//   ".../d2c5.../batched_gemm-91e0ba0-896b90b/checksums.txt" -> "d2c5.../batched_gemm-..."
std::string FlashinferPinFromLocation(std::string_view checksums_location);

}  // namespace cubist

#endif  // CUBIST_MANIFEST_FLASHINFER_IMPORT_H_
