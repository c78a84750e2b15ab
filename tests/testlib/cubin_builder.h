// Synthetic cubins and fatbins for tests that must run without nvcc: a minimal but
// well-formed EM_CUDA ELF with the sections cubist's inspector reads (symbol table with
// CUDA entry symbols, .nv.info, .nv.info.<kernel>, .text.<kernel>, .nv.shared.<kernel>,
// .nv.compat, .note.nv.cuinfo, .note.nv.tkinfo), laid out the way nvcc 13 lays them out.
#ifndef CUBIST_TESTS_TESTLIB_CUBIN_BUILDER_H_
#define CUBIST_TESTS_TESTLIB_CUBIN_BUILDER_H_

#include <cstdint>
#include <string>
#include <vector>

namespace cubist::testing {

struct FakeKernel {
  std::string name;
  int registers = 32;
  int max_threads = 0;       // 0: no EIATTR_MAX_THREADS record
  int param_bytes = 16;
  int param_count = 2;
  int static_shared_bytes = 0;
  int code_bytes = 128;
};

struct FakeCubinSpec {
  int sm = 90;               // 90 for sm_90
  char variant = 0;          // 0, 'a' or 'f'
  int abi_version = 8;       // 7: old e_flags layout (SM in bits 0-7)
  std::vector<FakeKernel> kernels = {FakeKernel{"kernel_a"}};
  bool with_notes = true;    // .note.nv.cuinfo and .note.nv.tkinfo
};

// A cubin for `spec`. Section headers come last; their offset is at byte 40 (e_shoff).
std::string BuildCubin(const FakeCubinSpec& spec);

struct FakeFatbinEntry {
  uint16_t kind = 2;         // 1 PTX, 2 ELF
  uint32_t arch = 90;
  uint64_t flags = 0x11;     // 64-bit | linux; | 0x100000 for `a`, 0x200000 for `f`
  std::string payload;
};

std::string BuildFatbin(const std::vector<FakeFatbinEntry>& entries);

}  // namespace cubist::testing

#endif  // CUBIST_TESTS_TESTLIB_CUBIN_BUILDER_H_
