// Inspection of cubins and fatbins without a GPU.
//
// InspectCubin() reads the bytes the loader is about to hand to the driver and says what
// they are: an ELF cubin (EM_CUDA) for one SM, or a fatbin holding several images (SASS
// and PTX). For a cubin it reports the ELF header facts (class, ABI version, e_flags),
// the SM and its variant (plain sm_90, arch-specific sm_90a, family sm_100f), the kernels
// (symbols marked as CUDA entry points) and, per kernel, what the compiler recorded in
// .nv.info: registers, maximum threads (launch bounds), parameter bytes, static shared
// memory (.nv.shared.<kernel>), and local-memory frame size.
//
// Where the SM lives in e_flags (checked against nvcc 13.0 output, see cubin.cc):
//   EI_ABIVERSION 7 (CUDA <= 12): SM in bits 0-7, 0x800 marks an `a` target.
//   EI_ABIVERSION 8 (CUDA 12.8+/13): SM in bits 8-15, 0x8 marks an `a` target per LLVM;
//   nvcc 13.0 leaves that bit clear and instead records the variant in .nv.compat
//   (attribute 9 = 1 for `a`) and in the ptxas command line of .note.nv.tkinfo
//   ("-arch sm_100f"), which is the only place an `f` target is visible.
//
// Safety: every offset and length read from the input is bounds-checked. Malformed or
// truncated input of any kind yields InvalidArgument with "<what>: <where>", never a
// crash, an out-of-bounds read or an unbounded allocation (tests/fuzz/cubin_fuzz.cc).
// Compressed fatbin entries are reported (arch, kind) but their contents are not
// decompressed, so their kernels are unknown (`compressed` is true, `kernels` empty).
//
// Thread safety: pure functions over the input bytes.
#ifndef CUBIST_LOADER_CUBIN_H_
#define CUBIST_LOADER_CUBIN_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace cubist {

inline constexpr uint16_t kEmCuda = 190;  // EM_CUDA

// A compilation target: sm_<major><minor>[a|f].
struct SmTarget {
  enum class Variant : uint8_t {
    kPlain,   // sm_90: runs on the same major, minor >= this one
    kArch,    // sm_90a: runs only on exactly this SM
    kFamily,  // sm_100f: runs on this family (same major, minor >= this one)
  };
  int major = 0;
  int minor = 0;
  Variant variant = Variant::kPlain;

  // 90 for sm_90a.
  int number() const { return major * 10 + minor; }
  // "sm_90a". For PTX targets the caller prints "compute_90a" itself.
  std::string ToString() const;
  // Parses "sm_90", "sm_90a", "sm_100f", "compute_90" (and bare "90a"). Anything else
  // is InvalidArgument.
  static absl::StatusOr<SmTarget> Parse(std::string_view text);

  bool operator==(const SmTarget&) const = default;
};

// What the compiler recorded about one kernel. Fields are absent when the cubin does
// not say (older toolchains, stripped info).
struct KernelInfo {
  std::string name;                     // symbol name, as cuModuleGetFunction wants it
  std::optional<int> registers;         // EIATTR_REGCOUNT
  std::optional<int> max_threads;       // EIATTR_MAX_THREADS x*y*z (__launch_bounds__)
  std::optional<int> required_threads;  // EIATTR_REQNTID x*y*z
  std::optional<int> param_bytes;       // EIATTR_CBANK_PARAM_SIZE
  std::optional<int> param_count;       // number of EIATTR_KPARAM_INFO records
  std::optional<int> frame_bytes;       // EIATTR_FRAME_SIZE (local memory per thread)
  // Size of .nv.shared.<name> (static __shared__ data; on sm_90+ it includes the 1 KiB
  // the toolchain reserves for the system). 0 when the kernel has none.
  int static_shared_bytes = 0;
  int code_bytes = 0;                   // size of .text.<name>

  bool operator==(const KernelInfo&) const = default;
};

// One image: an ELF cubin, or a PTX text, possibly inside a fatbin.
struct ImageInfo {
  enum class Kind : uint8_t { kCubin, kPtx, kOther /* e.g. LTO IR */ };
  Kind kind = Kind::kCubin;
  SmTarget sm;              // for PTX: the virtual architecture (compute_XY)
  bool compressed = false;  // fatbin entry stored compressed (contents not inspected)
  uint32_t fatbin_kind = 0; // the fatbin entry's kind field (1 PTX, 2 ELF), 0 for a cubin
  uint64_t fatbin_flags = 0;  // the fatbin entry's flags (0x100000 `a`, 0x200000 `f`)
  uint64_t offset = 0;      // of the image's bytes within the inspected buffer
  uint64_t size = 0;        // bytes of the image as stored

  // ELF facts (kCubin, not compressed).
  int elf_class = 0;        // 64 for ELFCLASS64
  int abi_version = 0;      // EI_ABIVERSION: 7 (CUDA <= 12) or 8 (CUDA 12.8+)
  uint32_t e_flags = 0;
  std::optional<SmTarget> virtual_sm;  // the PTX target it was compiled from
  std::optional<int> toolkit_version;  // 130 for CUDA 13.0 (.note.nv.cuinfo)
  std::string producer;                // "ptxas Cuda compilation tools, release 13.0, ..."
  std::vector<KernelInfo> kernels;     // sorted by name
};

struct CubinInfo {
  enum class Container : uint8_t { kCubin, kFatbin };
  Container container = Container::kCubin;
  // For a cubin: exactly one kCubin image. For a fatbin: every entry, in file order.
  std::vector<ImageInfo> images;

  bool HasPtx() const;
  // The images of kind kCubin.
  std::vector<const ImageInfo*> Cubins() const;
};

// Inspects a cubin (ELF, EM_CUDA) or a fatbin (magic 0xBA55ED50). Errors:
// InvalidArgument for anything else, including truncated or inconsistent input; the
// message names what was wrong and where ("cubin: section 7 (.nv.info) extends past the
// end of the file: offset 1716 + size 72 > 1700").
[[nodiscard]] absl::StatusOr<CubinInfo> InspectCubin(std::string_view bytes);

// Reads and inspects a file. NotFound / PermissionDenied from the filesystem, else as
// InspectCubin, with the path in front of the message.
[[nodiscard]] absl::StatusOr<CubinInfo> InspectCubinFile(const std::string& path);

}  // namespace cubist

#endif  // CUBIST_LOADER_CUBIN_H_
