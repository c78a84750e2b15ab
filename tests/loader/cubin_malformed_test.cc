// Malformed and truncated input: every case must be InvalidArgument with a message that
// says what was wrong, never a crash or an out-of-bounds read (run under ASan in the
// sanitizer build; tests/fuzz/cubin_fuzz.cc explores further).
#include <cstring>
#include <random>

#include "loader/cubin.h"
#include "tests/testlib/cubin_builder.h"
#include "tests/testlib/loader_fixtures.h"
#include "tests/testlib/status_matchers.h"

namespace cubist {
namespace {

using ::cubist::testing::BuildCubin;
using ::cubist::testing::BuildFatbin;
using ::cubist::testing::FakeCubinSpec;
using ::cubist::testing::FakeFatbinEntry;
using ::cubist::testing::FakeKernel;
using ::cubist::testing::StatusIs;
using ::testing::HasSubstr;

constexpr auto kInvalid = absl::StatusCode::kInvalidArgument;

template <typename T>
T Get(const std::string& s, size_t off) {
  T v;
  std::memcpy(&v, s.data() + off, sizeof(T));
  return v;
}
template <typename T>
void Set(std::string& s, size_t off, T v) {
  std::memcpy(s.data() + off, &v, sizeof(T));
}

// Offset of the section header named `name`, found the simple way (the input is ours).
size_t SectionHeader(const std::string& elf, const std::string& name) {
  uint64_t shoff = Get<uint64_t>(elf, 40);
  uint16_t shnum = Get<uint16_t>(elf, 60);
  uint16_t shstrndx = Get<uint16_t>(elf, 62);
  uint64_t strs = Get<uint64_t>(elf, shoff + shstrndx * 64 + 24);
  for (uint16_t i = 0; i < shnum; ++i) {
    size_t h = shoff + i * 64;
    if (std::strcmp(elf.c_str() + strs + Get<uint32_t>(elf, h), name.c_str()) == 0) return h;
  }
  ADD_FAILURE() << "no section " << name;
  return 0;
}

std::string Good() {
  FakeCubinSpec spec;
  spec.kernels = {FakeKernel{"alpha", 16, 128}, FakeKernel{"beta", 24, 0, 32, 3, 4096}};
  return BuildCubin(spec);
}

TEST(CubinMalformed, GoodInputParses) { CUBIST_EXPECT_OK(InspectCubin(Good())); }

TEST(CubinMalformed, EmptyAndGarbage) {
  EXPECT_THAT(InspectCubin(""), StatusIs(kInvalid, HasSubstr("empty")));
  EXPECT_THAT(InspectCubin("\x7f" "EL"), StatusIs(kInvalid, HasSubstr("not a cubin or fatbin")));
  EXPECT_THAT(InspectCubin(std::string("MZ\x90\x00 this is a PE file", 22)),
              StatusIs(kInvalid, HasSubstr("starts with bytes 4d 5a 90 00")));
  EXPECT_THAT(InspectCubin(".version 8.0\n.target sm_90\n"),
              StatusIs(kInvalid, HasSubstr("not a cubin or fatbin")));
}

TEST(CubinMalformed, EveryTruncationIsInvalidArgument) {
  const std::string good = Good();
  // The builder puts the section table last, so every proper prefix lacks part of it.
  for (size_t n = 1; n < good.size(); ++n) {
    absl::StatusOr<CubinInfo> info = InspectCubin(good.substr(0, n));
    ASSERT_FALSE(info.ok()) << "prefix of " << n << " bytes parsed";
    ASSERT_EQ(info.status().code(), kInvalid) << n << ": " << info.status();
  }
}

TEST(CubinMalformed, TruncationsOfTheHeaderRegionName) {
  const std::string good = Good();
  EXPECT_THAT(InspectCubin(good.substr(0, 63)),
              StatusIs(kInvalid, HasSubstr("truncated ELF header: 63 bytes")));
  EXPECT_THAT(InspectCubin(good.substr(0, 64)),
              StatusIs(kInvalid, HasSubstr("section table at offset")));
}

TEST(CubinMalformed, NvccFixtureTruncationsNeverCrash) {
  CUBIST_FIXTURE_OR_SKIP(bytes, "kernels_sm_90a.cubin");
  // Every prefix up to the end of the section table is an error; later prefixes may
  // parse (nvcc places program headers and code after it) but must not crash.
  uint64_t table_end = Get<uint64_t>(bytes, 40) + Get<uint16_t>(bytes, 60) * 64;
  for (size_t n = 1; n < bytes.size(); ++n) {
    absl::StatusOr<CubinInfo> info = InspectCubin(bytes.substr(0, n));
    if (n < table_end) {
      ASSERT_THAT(info, StatusIs(kInvalid, ::testing::_)) << n;
    } else if (!info.ok()) {
      ASSERT_EQ(info.status().code(), kInvalid) << n;
    }
  }
}

TEST(CubinMalformed, BadMagicClassDataMachine) {
  std::string s = Good();
  s[1] = 'X';
  EXPECT_THAT(InspectCubin(s), StatusIs(kInvalid, HasSubstr("not a cubin or fatbin")));

  s = Good();
  s[4] = 1;  // ELFCLASS32
  EXPECT_THAT(InspectCubin(s), StatusIs(kInvalid, HasSubstr("ELF class 1 is not supported")));
  EXPECT_THAT(InspectCubin(s.substr(0, 20)),
              StatusIs(kInvalid, HasSubstr("ELF class 1 is not supported")));

  s = Good();
  s[5] = 2;  // big-endian
  EXPECT_THAT(InspectCubin(s), StatusIs(kInvalid, HasSubstr("data encoding 2")));

  s = Good();
  Set<uint16_t>(s, 18, 62);  // EM_X86_64
  EXPECT_THAT(InspectCubin(s),
              StatusIs(kInvalid, HasSubstr("ELF machine 62 is not EM_CUDA (190)")));
}

TEST(CubinMalformed, NoSmInFlags) {
  std::string s = Good();
  Set<uint32_t>(s, 48, 0x06000004);
  EXPECT_THAT(InspectCubin(s), StatusIs(kInvalid, HasSubstr("names no SM")));
}

TEST(CubinMalformed, SectionTableOutOfBounds) {
  std::string s = Good();
  Set<uint64_t>(s, 40, s.size() - 10);
  EXPECT_THAT(InspectCubin(s), StatusIs(kInvalid, HasSubstr("past the end of the file")));

  s = Good();
  Set<uint64_t>(s, 40, ~uint64_t{0} - 8);  // offset + size overflows
  EXPECT_THAT(InspectCubin(s), StatusIs(kInvalid, HasSubstr("section table at offset")));

  s = Good();
  Set<uint16_t>(s, 60, 0xfff0);  // more entries than the file holds
  EXPECT_THAT(InspectCubin(s),
              StatusIs(kInvalid, HasSubstr("extends past the end of the file")));

  s = Good();
  Set<uint16_t>(s, 58, 40);  // wrong section header size
  EXPECT_THAT(InspectCubin(s), StatusIs(kInvalid, HasSubstr("section header size 40")));

  s = Good();
  Set<uint16_t>(s, 62, 200);
  EXPECT_THAT(InspectCubin(s), StatusIs(kInvalid, HasSubstr("name table index 200")));
}

TEST(CubinMalformed, SectionDataOutOfBounds) {
  std::string s = Good();
  size_t h = SectionHeader(s, ".nv.info");
  Set<uint64_t>(s, h + 32, s.size());  // size larger than what follows the offset
  EXPECT_THAT(InspectCubin(s),
              StatusIs(kInvalid, HasSubstr("extends past the end of the file: offset")));

  s = Good();
  h = SectionHeader(s, ".strtab");
  Set<uint64_t>(s, h + 24, ~uint64_t{0} - 2);  // offset + size wraps around
  EXPECT_THAT(InspectCubin(s), StatusIs(kInvalid, HasSubstr("extends past the end")));
}

TEST(CubinMalformed, SectionNameOutsideTable) {
  std::string s = Good();
  size_t h = SectionHeader(s, ".nv.info");
  Set<uint32_t>(s, h, 1u << 30);
  EXPECT_THAT(InspectCubin(s), StatusIs(kInvalid, HasSubstr("outside the section name table")));
}

TEST(CubinMalformed, SymbolTableProblems) {
  std::string s = Good();
  size_t h = SectionHeader(s, ".symtab");
  Set<uint64_t>(s, h + 56, 16);  // entsize
  EXPECT_THAT(InspectCubin(s), StatusIs(kInvalid, HasSubstr("symbol size 16")));

  s = Good();
  h = SectionHeader(s, ".symtab");
  Set<uint32_t>(s, h + 40, 999);  // link to a string table that does not exist
  EXPECT_THAT(InspectCubin(s), StatusIs(kInvalid, HasSubstr("string table index 999")));

  s = Good();
  h = SectionHeader(s, ".symtab");
  uint64_t syms = Get<uint64_t>(s, h + 24);
  Set<uint32_t>(s, syms + 24, 0x7fffffff);  // symbol 1's name offset
  EXPECT_THAT(InspectCubin(s), StatusIs(kInvalid, HasSubstr("outside the string table")));

  // A string table without its terminating NUL: the name would run off the end.
  s = Good();
  h = SectionHeader(s, ".strtab");
  uint64_t off = Get<uint64_t>(s, h + 24);
  uint64_t size = Get<uint64_t>(s, h + 32);
  s[off + size - 1] = 'x';
  EXPECT_THAT(InspectCubin(s), StatusIs(kInvalid, HasSubstr("outside the string table")));
}

TEST(CubinMalformed, NvInfoRecordLengthPastTheEnd) {
  std::string s = Good();
  size_t h = SectionHeader(s, ".nv.info");
  uint64_t off = Get<uint64_t>(s, h + 24);
  ASSERT_EQ(s[off], 4);  // first record is an SVAL
  Set<uint16_t>(s, off + 2, 0xffff);
  EXPECT_THAT(InspectCubin(s),
              StatusIs(kInvalid, HasSubstr("section .nv.info: record at offset 0 (attribute "
                                           "0x2f) has length 65535, past the end")));

  // The same in a per-kernel section, on its last record.
  s = Good();
  h = SectionHeader(s, ".nv.info.alpha");
  off = Get<uint64_t>(s, h + 24);
  uint64_t size = Get<uint64_t>(s, h + 32);
  // The last record is EIATTR_MAX_THREADS (SVAL, 12 bytes of payload).
  ASSERT_EQ(s[off + size - 16], 4);
  Set<uint16_t>(s, off + size - 16 + 2, 13);
  EXPECT_THAT(InspectCubin(s), StatusIs(kInvalid, HasSubstr("has length 13, past the end")));
}

TEST(CubinMalformed, NvInfoUnknownFormatAndTruncatedRecord) {
  std::string s = Good();
  size_t h = SectionHeader(s, ".nv.info");
  uint64_t off = Get<uint64_t>(s, h + 24);
  s[off] = 9;
  EXPECT_THAT(InspectCubin(s), StatusIs(kInvalid, HasSubstr("unknown format 9")));

  s = Good();
  h = SectionHeader(s, ".nv.info");
  Set<uint64_t>(s, h + 32, Get<uint64_t>(s, h + 32) - 10);  // 2 bytes of the last record left
  EXPECT_THAT(InspectCubin(s), StatusIs(kInvalid, HasSubstr("truncated")));
}

TEST(CubinMalformed, FatbinProblems) {
  FakeCubinSpec spec;
  std::string elf = BuildCubin(spec);
  std::string fat = BuildFatbin({FakeFatbinEntry{2, 90, 0x11, elf}});
  CUBIST_EXPECT_OK(InspectCubin(fat));

  for (size_t n = 4; n < 16 + 64; ++n) {
    ASSERT_THAT(InspectCubin(fat.substr(0, n)), StatusIs(kInvalid, HasSubstr("fatbin")))
        << n;
  }
  std::string s = fat;
  Set<uint64_t>(s, 8, ~uint64_t{0});  // declared size wraps
  EXPECT_THAT(InspectCubin(s), StatusIs(kInvalid, HasSubstr("declares")));

  s = fat;
  Set<uint64_t>(s, 16 + 8, elf.size() + 1);  // entry payload one byte too long
  EXPECT_THAT(InspectCubin(s),
              StatusIs(kInvalid, HasSubstr("fatbin: entry 0 at offset 16: header size 64")));

  s = fat;
  Set<uint32_t>(s, 16 + 4, 8);  // entry header too small to be one
  EXPECT_THAT(InspectCubin(s), StatusIs(kInvalid, HasSubstr("header size 8")));

  s = fat;
  s[16 + 64 + 4] = 1;  // the ELF inside says 32-bit
  EXPECT_THAT(InspectCubin(s),
              StatusIs(kInvalid, HasSubstr("fatbin: entry 0 at offset 16: cubin: ELF class 1")));
}

TEST(CubinMalformed, RandomMutationsNeverCrash) {
  // A cheap in-tree cousin of the fuzzer: flip bytes and splice lengths at random.
  std::vector<std::string> seeds = {Good(), BuildFatbin({FakeFatbinEntry{2, 90, 0x11, Good()}})};
  if (auto nvcc = ::cubist::testing::ReadCubinFixture("kernels.fatbin")) seeds.push_back(*nvcc);
  std::mt19937_64 rng(42);
  int ok = 0, invalid = 0;
  for (const std::string& seed : seeds) {
    for (int iter = 0; iter < 3000; ++iter) {
      std::string s = seed;
      int flips = 1 + static_cast<int>(rng() % 8);
      for (int f = 0; f < flips; ++f) s[rng() % s.size()] = static_cast<char>(rng());
      if (rng() % 4 == 0) s.resize(rng() % s.size());
      absl::StatusOr<CubinInfo> info = InspectCubin(s);
      if (info.ok()) {
        ++ok;
      } else {
        ASSERT_EQ(info.status().code(), kInvalid) << info.status();
        ++invalid;
      }
    }
  }
  EXPECT_GT(invalid, 0);
  EXPECT_GT(ok + invalid, 0);
}

}  // namespace
}  // namespace cubist
