#include "loader/cubin.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/file_util.h"
#include "base/status_macros.h"
#include "base/strings.h"
#include "base/unique_fd.h"

namespace cubist {
namespace {

// ELF constants (from the System V ABI; not every <elf.h> has EM_CUDA, and we want no
// dependency on the host's header anyway).
constexpr size_t kElf64HeaderSize = 64;
constexpr size_t kElf64SectionHeaderSize = 64;
constexpr size_t kElf64SymbolSize = 24;
constexpr uint8_t kElfClass64 = 2;
constexpr uint8_t kElfData2Lsb = 1;
constexpr uint32_t kShtSymtab = 2;
constexpr uint32_t kShtNote = 7;
constexpr uint32_t kShtNobits = 8;
constexpr uint8_t kSttFunc = 2;
constexpr uint8_t kStoCudaEntry = 0x10;  // st_other bit nvcc sets on __global__ symbols
constexpr uint16_t kShnXindex = 0xffff;

// e_flags. ABI version 7 and older keep the SM in the low byte; version 8 (CUDA 12.8+,
// everything nvcc 13 writes, sm_80 included) moved it to bits 8-15. Checked against
// nvcc 13.0.88: sm_80 0x06005004, sm_90 and sm_90a 0x06005a04, sm_100/100a/100f
// 0x06006402, sm_120 0x06007802.
constexpr int kFirstAbiV2 = 8;
constexpr uint32_t kEfV1SmMask = 0xff;
constexpr uint32_t kEfV1Accelerators = 0x800;  // `a` target, old ABI
constexpr uint32_t kEfV1VirtualSmShift = 16;
constexpr uint32_t kEfV2SmShift = 8;
constexpr uint32_t kEfV2Accelerators = 0x8;    // `a` per LLVM; nvcc 13.0 leaves it clear

// .nv.info / .nv.compat records: {format u8, attribute u8, payload}, 4-byte aligned.
constexpr uint8_t kEifmtNval = 1;  // no value (2 bytes of padding)
constexpr uint8_t kEifmtBval = 2;  // 1-byte value + 1 byte padding
constexpr uint8_t kEifmtHval = 3;  // 2-byte value
constexpr uint8_t kEifmtSval = 4;  // u16 size, then `size` bytes
constexpr uint8_t kEiattrMaxThreads = 0x05;
constexpr uint8_t kEiattrReqntid = 0x10;
constexpr uint8_t kEiattrFrameSize = 0x11;
constexpr uint8_t kEiattrKparamInfo = 0x17;
constexpr uint8_t kEiattrCbankParamSize = 0x19;
constexpr uint8_t kEiattrRegcount = 0x2f;
// .nv.compat attribute 9: 1 on every `a` target nvcc 13.0 wrote (sm_90a, sm_100a,
// sm_103a, sm_120a), 0 on plain and `f` targets. Not documented by NVIDIA; observed.
constexpr uint8_t kCompatArchSpecific = 0x09;

// Fatbin container.
constexpr uint32_t kFatbinMagic = 0xBA55ED50;
constexpr size_t kFatbinHeaderSize = 16;
constexpr size_t kFatbinEntryMinHeader = 64;
constexpr uint16_t kFatbinKindPtx = 1;
constexpr uint16_t kFatbinKindElf = 2;
constexpr uint64_t kFatbinFlagLz4 = 0x2000;
constexpr uint64_t kFatbinFlagZstd = 0x8000;
constexpr uint64_t kFatbinFlagArchSpecific = 0x100000;  // sm_90a, compute_100a
constexpr uint64_t kFatbinFlagFamily = 0x200000;        // sm_100f, compute_120f

// Bounds-checked little-endian reads over one buffer. Every accessor checks
// `offset + size <= size()` without overflow; callers turn a false into an error that
// says what was being read.
class Bytes {
 public:
  explicit Bytes(std::string_view data) : data_(data) {}
  size_t size() const { return data_.size(); }
  bool Has(uint64_t offset, uint64_t length) const {
    return offset <= data_.size() && length <= data_.size() - offset;
  }
  template <typename T>
  bool Read(uint64_t offset, T* out) const {
    if (!Has(offset, sizeof(T))) return false;
    std::memcpy(out, data_.data() + offset, sizeof(T));
    return true;
  }
  std::string_view Slice(uint64_t offset, uint64_t length) const {
    return data_.substr(offset, length);  // callers check Has() first
  }
  // The NUL-terminated string at `offset` inside [0, size()); false when it runs off
  // the end unterminated.
  bool CString(uint64_t offset, std::string_view* out) const {
    if (offset >= data_.size()) return false;
    size_t end = data_.find('\0', offset);
    if (end == std::string_view::npos) return false;
    *out = data_.substr(offset, end - offset);
    return true;
  }

 private:
  std::string_view data_;
};

struct Section {
  std::string_view name;
  uint32_t type = 0;
  uint64_t offset = 0;
  uint64_t size = 0;
  uint32_t link = 0;
  uint32_t info = 0;
  uint64_t entsize = 0;
  std::string_view data;  // empty for SHT_NOBITS
};

absl::Status Malformed(std::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("cubin: ", Sv(what)));
}

int ClampToInt(uint64_t v) {
  return v > static_cast<uint64_t>(std::numeric_limits<int>::max())
             ? std::numeric_limits<int>::max()
             : static_cast<int>(v);
}

// One .nv.info-style record.
struct Record {
  uint8_t format = 0;
  uint8_t attribute = 0;
  uint32_t small_value = 0;   // BVAL/HVAL
  std::string_view payload;   // SVAL
};

// Splits a record section; InvalidArgument names the section and the offset of the bad
// record.
absl::Status ParseRecords(const Section& section, std::vector<Record>* out) {
  Bytes b(section.data);
  uint64_t i = 0;
  while (i < b.size()) {
    // Trailing zero padding (fewer than 4 bytes) is tolerated; anything else must be a
    // whole record.
    if (!b.Has(i, 4)) {
      return Malformed(absl::StrFormat(
          "section %s: record at offset %d is truncated (%d bytes left, a record "
          "header needs 4)",
          Sv(section.name), i, b.size() - i));
    }
    Record r;
    b.Read(i, &r.format);
    b.Read(i + 1, &r.attribute);
    switch (r.format) {
      case kEifmtNval:
        i += 4;
        break;
      case kEifmtBval: {
        uint8_t v = 0;
        b.Read(i + 2, &v);
        r.small_value = v;
        i += 4;
        break;
      }
      case kEifmtHval: {
        uint16_t v = 0;
        b.Read(i + 2, &v);
        r.small_value = v;
        i += 4;
        break;
      }
      case kEifmtSval: {
        uint16_t len = 0;
        b.Read(i + 2, &len);
        if (!b.Has(i + 4, len)) {
          return Malformed(absl::StrFormat(
              "section %s: record at offset %d (attribute 0x%02x) has length %d, past "
              "the end of the section (%d bytes)",
              Sv(section.name), i, r.attribute, len, b.size()));
        }
        r.payload = b.Slice(i + 4, len);
        i += 4 + ((static_cast<uint64_t>(len) + 3) & ~uint64_t{3});
        break;
      }
      default:
        return Malformed(absl::StrFormat(
            "section %s: record at offset %d has unknown format %d (expected 1-4)",
            Sv(section.name), i, r.format));
    }
    out->push_back(r);
  }
  return absl::OkStatus();
}

uint32_t U32At(std::string_view payload, size_t index) {
  uint32_t v = 0;
  Bytes(payload).Read(index * 4, &v);
  return v;
}

// Product of up to three u32 dimensions in an SVAL payload, or nullopt when short.
std::optional<int> Dim3Product(std::string_view payload) {
  if (payload.size() < 12) return std::nullopt;
  uint64_t x = U32At(payload, 0), y = U32At(payload, 1), z = U32At(payload, 2);
  // Launch bounds are at most 1024 per dimension; anything bigger is nonsense that we
  // report clamped rather than trusting.
  if (x > (1u << 16) || y > (1u << 16) || z > (1u << 16)) {
    return std::numeric_limits<int>::max();
  }
  return ClampToInt(x * y * z);
}

// The description of the first note in a SHT_NOTE section.
bool NoteDesc(std::string_view data, uint32_t* type, std::string_view* desc) {
  Bytes b(data);
  uint32_t namesz = 0, descsz = 0;
  if (!b.Read(0, &namesz) || !b.Read(4, &descsz) || !b.Read(8, type)) return false;
  uint64_t desc_off = 12 + ((static_cast<uint64_t>(namesz) + 3) & ~uint64_t{3});
  if (!b.Has(desc_off, descsz)) return false;
  *desc = b.Slice(desc_off, descsz);
  return true;
}

// The `-arch sm_XY[a|f]` ptxas was given, from .note.nv.tkinfo's option string.
std::optional<SmTarget> ArchFromOptions(std::string_view options) {
  size_t pos = options.find("-arch ");
  if (pos == std::string_view::npos) pos = options.find("-arch=");
  if (pos == std::string_view::npos) return std::nullopt;
  std::string_view rest = options.substr(pos + 6);
  size_t end = rest.find_first_of(" \t");
  absl::StatusOr<SmTarget> sm = SmTarget::Parse(rest.substr(0, end));
  if (!sm.ok()) return std::nullopt;
  return *sm;
}

absl::Status UnsupportedClass(uint8_t ei_class) {
  return Malformed(
      absl::StrFormat("ELF class %d is not supported (expected 2, 64-bit)", ei_class));
}

// The ELF header fields the rest of the parse reads the file with.
struct ElfHeader {
  uint8_t abi_version = 0;
  uint32_t flags = 0;
  uint64_t shoff = 0;
  uint16_t shentsize = 0;
  uint16_t shnum = 0;
  uint16_t shstrndx = 0;
};

// The identification and the 64-bit header; InvalidArgument for anything but a
// little-endian 64-bit EM_CUDA ELF.
absl::StatusOr<ElfHeader> ReadElfHeader(std::string_view data) {
  Bytes b(data);
  if (data.size() < 4 || std::memcmp(data.data(), "\x7f" "ELF", 4) != 0) {
    return Malformed("not an ELF file (bad magic)");
  }
  if (data.size() < kElf64HeaderSize) {
    // Class first: a 32-bit header is shorter, and "bad class" is the better message.
    if (data.size() > 4 && static_cast<uint8_t>(data[4]) != kElfClass64) {
      return UnsupportedClass(static_cast<uint8_t>(data[4]));
    }
    return Malformed(absl::StrFormat(
        "truncated ELF header: %d bytes, a 64-bit header needs %d", data.size(),
        kElf64HeaderSize));
  }
  uint8_t ei_class = 0, ei_data = 0;
  ElfHeader h;
  b.Read(4, &ei_class);
  b.Read(5, &ei_data);
  b.Read(8, &h.abi_version);
  if (ei_class != kElfClass64) return UnsupportedClass(ei_class);
  if (ei_data != kElfData2Lsb) {
    return Malformed(absl::StrFormat(
        "ELF data encoding %d is not supported (expected 1, little-endian)", ei_data));
  }
  uint16_t e_machine = 0;
  b.Read(18, &e_machine);
  b.Read(40, &h.shoff);
  b.Read(48, &h.flags);
  b.Read(58, &h.shentsize);
  b.Read(60, &h.shnum);
  b.Read(62, &h.shstrndx);
  if (e_machine != kEmCuda) {
    return Malformed(absl::StrFormat(
        "ELF machine %d is not EM_CUDA (190): this is not a cubin", e_machine));
  }
  return h;
}

// The SM from e_flags, where it sits by ABI version; the old ABI also names the
// virtual SM there.
absl::Status ReadSmFromFlags(const ElfHeader& h, ImageInfo* image) {
  int sm_number;
  bool arch_specific;
  if (h.abi_version < kFirstAbiV2) {
    sm_number = static_cast<int>(h.flags & kEfV1SmMask);
    arch_specific = (h.flags & kEfV1Accelerators) != 0;
    int virt = static_cast<int>((h.flags >> kEfV1VirtualSmShift) & 0xff);
    if (virt != 0) image->virtual_sm = SmTarget{virt / 10, virt % 10};
  } else {
    sm_number = static_cast<int>((h.flags >> kEfV2SmShift) & 0xff);
    arch_specific = (h.flags & kEfV2Accelerators) != 0;
  }
  if (sm_number < 10) {
    return Malformed(absl::StrFormat(
        "e_flags 0x%08x (ABI version %d) names no SM (%d)", h.flags, h.abi_version,
        sm_number));
  }
  image->sm = SmTarget{sm_number / 10, sm_number % 10,
                       arch_specific ? SmTarget::Variant::kArch
                                     : SmTarget::Variant::kPlain};
  return absl::OkStatus();
}

// Where the section table lies, with ELF's extended numbering resolved.
struct SectionTable {
  uint64_t offset = 0;
  uint64_t count = 0;
  uint32_t name_index = 0;  // of the section name table
};

// The table of a file that has one (e_shoff != 0), known to lie inside the file.
absl::StatusOr<SectionTable> LocateSectionTable(const Bytes& b, const ElfHeader& h) {
  SectionTable t{h.shoff, h.shnum, h.shstrndx};
  if (h.shentsize != kElf64SectionHeaderSize) {
    return Malformed(absl::StrFormat("section header size %d (expected %d)", h.shentsize,
                                     kElf64SectionHeaderSize));
  }
  if (!b.Has(t.offset, kElf64SectionHeaderSize)) {
    return Malformed(absl::StrFormat(
        "section table at offset %d is past the end of the file (%d bytes)", t.offset,
        b.size()));
  }
  if (t.count == 0 || t.name_index == kShnXindex) {
    // Extended numbering: the real values live in section 0.
    uint64_t size0 = 0;
    uint32_t link0 = 0;
    b.Read(t.offset + 32, &size0);
    b.Read(t.offset + 40, &link0);
    if (t.count == 0) t.count = size0;
    if (t.name_index == kShnXindex) t.name_index = link0;
  }
  if (t.count > (b.size() - t.offset) / kElf64SectionHeaderSize) {
    return Malformed(absl::StrFormat(
        "section table (%d entries at offset %d) extends past the end of the file "
        "(%d bytes)",
        t.count, t.offset, b.size()));
  }
  return t;
}

// Every section header, each section's bytes checked to lie inside the file, then the
// names, once the name table is known to be in bounds.
absl::StatusOr<std::vector<Section>> ReadSections(const Bytes& b, const SectionTable& t) {
  std::vector<Section> sections(t.count);
  for (uint64_t i = 0; i < t.count; ++i) {
    uint64_t h = t.offset + i * kElf64SectionHeaderSize;
    Section& s = sections[i];
    b.Read(h + 4, &s.type);
    b.Read(h + 24, &s.offset);
    b.Read(h + 32, &s.size);
    b.Read(h + 40, &s.link);
    b.Read(h + 44, &s.info);
    b.Read(h + 56, &s.entsize);
    if (s.type != kShtNobits && i != 0) {
      if (!b.Has(s.offset, s.size)) {
        return Malformed(absl::StrFormat(
            "section %d extends past the end of the file: offset %d + size %d > %d", i,
            s.offset, s.size, b.size()));
      }
      s.data = b.Slice(s.offset, s.size);
    }
  }
  if (t.name_index >= t.count) {
    return Malformed(absl::StrFormat("section name table index %d out of range (%d sections)",
                                     t.name_index, t.count));
  }
  Bytes shstrtab(sections[t.name_index].data);
  for (uint64_t i = 1; i < t.count; ++i) {
    uint32_t name_off = 0;
    b.Read(t.offset + i * kElf64SectionHeaderSize, &name_off);
    if (!shstrtab.CString(name_off, &sections[i].name)) {
      return Malformed(absl::StrFormat(
          "section %d: name offset %d is outside the section name table (%d bytes)", i,
          name_off, shstrtab.size()));
    }
  }
  return sections;
}

// The image's kernels: function symbols marked as CUDA entry points. .nv.info names a
// kernel by its symbol index, the per-kernel sections by name (".text.<kernel>").
class KernelTable {
 public:
  explicit KernelTable(std::vector<KernelInfo>* kernels) : kernels_(*kernels) {}

  absl::Status AddEntryPoints(const std::vector<Section>& sections) {
    for (uint64_t i = 1; i < sections.size(); ++i) {
      if (sections[i].type != kShtSymtab) continue;
      CUBIST_RETURN_IF_ERROR(AddSymbolTable(sections, i));
    }
    // Only now: kernels_ no longer grows, so views of its names stay valid.
    for (size_t k = 0; k < kernels_.size(); ++k) by_name_[kernels_[k].name] = k;
    return absl::OkStatus();
  }

  KernelInfo* BySymbol(uint32_t symbol) {
    auto it = by_symbol_.find(symbol);
    return it == by_symbol_.end() ? nullptr : &kernels_[it->second];
  }

  // The kernel a section named "<prefix><kernel>" belongs to, or null.
  KernelInfo* ForSection(std::string_view section_name, std::string_view prefix) {
    if (section_name.size() <= prefix.size() ||
        section_name.substr(0, prefix.size()) != prefix) {
      return nullptr;
    }
    auto it = by_name_.find(section_name.substr(prefix.size()));
    return it == by_name_.end() ? nullptr : &kernels_[it->second];
  }

 private:
  absl::Status AddSymbolTable(const std::vector<Section>& sections, uint64_t i) {
    const Section& s = sections[i];
    if (s.entsize != kElf64SymbolSize) {
      return Malformed(absl::StrFormat("section %d (%s): symbol size %d (expected %d)", i,
                                       Sv(s.name), s.entsize, kElf64SymbolSize));
    }
    if (s.link >= sections.size()) {
      return Malformed(absl::StrFormat("section %d (%s): string table index %d out of range",
                                       i, Sv(s.name), s.link));
    }
    Bytes syms(s.data);
    Bytes strtab(sections[s.link].data);
    uint64_t count = s.size / kElf64SymbolSize;
    for (uint64_t k = 1; k < count; ++k) {
      uint64_t o = k * kElf64SymbolSize;
      uint32_t st_name = 0;
      uint8_t st_info = 0, st_other = 0;
      syms.Read(o + 0, &st_name);
      syms.Read(o + 4, &st_info);
      syms.Read(o + 5, &st_other);
      if ((st_info & 0xf) != kSttFunc || (st_other & kStoCudaEntry) == 0) continue;
      std::string_view name;
      if (!strtab.CString(st_name, &name)) {
        return Malformed(absl::StrFormat(
            "symbol %d: name offset %d is outside the string table (%d bytes)", k, st_name,
            strtab.size()));
      }
      if (name.empty()) continue;
      by_symbol_[k] = kernels_.size();
      KernelInfo info;
      info.name = std::string(name);
      kernels_.push_back(std::move(info));
    }
    return absl::OkStatus();
  }

  std::vector<KernelInfo>& kernels_;
  std::map<uint64_t, size_t> by_symbol_;  // symbol index -> kernels_ index
  std::map<std::string_view, size_t> by_name_;
};

// .nv.info: per-kernel records keyed by symbol index (registers, stack frame).
absl::Status ReadNvInfo(const Section& s, KernelTable& kernels) {
  std::vector<Record> records;
  CUBIST_RETURN_IF_ERROR(ParseRecords(s, &records));
  for (const Record& r : records) {
    if (r.format != kEifmtSval || r.payload.size() < 8) continue;
    KernelInfo* k = kernels.BySymbol(U32At(r.payload, 0));
    if (k == nullptr) continue;
    if (r.attribute == kEiattrRegcount) k->registers = ClampToInt(U32At(r.payload, 1));
    if (r.attribute == kEiattrFrameSize) k->frame_bytes = ClampToInt(U32At(r.payload, 1));
  }
  return absl::OkStatus();
}

// .nv.info.<kernel>: launch bounds and the parameter block.
absl::Status ReadKernelNvInfo(const Section& s, KernelInfo* k) {
  std::vector<Record> records;
  CUBIST_RETURN_IF_ERROR(ParseRecords(s, &records));
  int params = 0;
  for (const Record& r : records) {
    switch (r.attribute) {
      case kEiattrMaxThreads:
        if (r.format == kEifmtSval) k->max_threads = Dim3Product(r.payload);
        break;
      case kEiattrReqntid:
        if (r.format == kEifmtSval) k->required_threads = Dim3Product(r.payload);
        break;
      case kEiattrCbankParamSize:
        if (r.format == kEifmtHval) k->param_bytes = static_cast<int>(r.small_value);
        break;
      case kEiattrKparamInfo:
        ++params;
        break;
      default:
        break;
    }
  }
  k->param_count = params;
  return absl::OkStatus();
}

// .nv.compat: whether the image is for an `a` target.
absl::Status ReadNvCompat(const Section& s, ImageInfo* image) {
  std::vector<Record> records;
  CUBIST_RETURN_IF_ERROR(ParseRecords(s, &records));
  for (const Record& r : records) {
    if (r.attribute == kCompatArchSpecific && r.format == kEifmtBval &&
        r.small_value == 1) {
      image->sm.variant = SmTarget::Variant::kArch;
    }
  }
  return absl::OkStatus();
}

// .note.nv.cuinfo: the virtual SM and the toolkit version. A short note says nothing.
void ReadCuinfoNote(const Section& s, ImageInfo* image) {
  uint32_t type = 0;
  std::string_view desc;
  if (!NoteDesc(s.data, &type, &desc) || desc.size() < 8) return;
  Bytes d(desc);
  uint16_t virt = 0;
  uint32_t toolkit = 0;
  d.Read(2, &virt);
  d.Read(4, &toolkit);
  if (virt >= 10) image->virtual_sm = SmTarget{virt / 10, virt % 10};
  image->toolkit_version = ClampToInt(toolkit);
}

// .note.nv.tkinfo: the producer, and the variant ptxas was asked for. A short note says
// nothing.
void ReadTkinfoNote(const Section& s, ImageInfo* image) {
  uint32_t type = 0;
  std::string_view desc;
  if (!NoteDesc(s.data, &type, &desc) || desc.size() < 24) return;
  // Six u32 (version, reserved, then offsets of tool name, tool version, build
  // and command-line options into the string blob that follows).
  Bytes blob(desc.substr(24));
  std::string_view tool, version, options;
  if (blob.CString(U32At(desc, 2), &tool) && blob.CString(U32At(desc, 3), &version)) {
    image->producer = absl::StrCat(Sv(tool), " ", Sv(version));
  }
  if (blob.CString(U32At(desc, 5), &options)) {
    std::optional<SmTarget> arch = ArchFromOptions(options);
    // Trust the command line for the variant only when it names the same SM.
    if (arch && arch->number() == image->sm.number() &&
        arch->variant != SmTarget::Variant::kPlain) {
      image->sm.variant = arch->variant;
    }
  }
}

// What one section says about the image or one of its kernels; others are skipped.
absl::Status ReadSection(const Section& s, KernelTable& kernels, ImageInfo* image) {
  if (KernelInfo* k = kernels.ForSection(s.name, ".nv.shared.")) {
    k->static_shared_bytes = ClampToInt(s.size);
  } else if (KernelInfo* k2 = kernels.ForSection(s.name, ".text.")) {
    k2->code_bytes = ClampToInt(s.size);
  } else if (s.name == ".nv.info") {
    return ReadNvInfo(s, kernels);
  } else if (KernelInfo* k3 = kernels.ForSection(s.name, ".nv.info.")) {
    return ReadKernelNvInfo(s, k3);
  } else if (s.name == ".nv.compat") {
    return ReadNvCompat(s, image);
  } else if (s.type == kShtNote && s.name == ".note.nv.cuinfo") {
    ReadCuinfoNote(s, image);
  } else if (s.type == kShtNote && s.name == ".note.nv.tkinfo") {
    ReadTkinfoNote(s, image);
  }
  return absl::OkStatus();
}

absl::Status ParseElf(std::string_view data, ImageInfo* image) {
  CUBIST_ASSIGN_OR_RETURN(const ElfHeader header, ReadElfHeader(data));
  image->kind = ImageInfo::Kind::kCubin;
  image->elf_class = 64;
  image->abi_version = header.abi_version;
  image->e_flags = header.flags;
  CUBIST_RETURN_IF_ERROR(ReadSmFromFlags(header, image));

  if (header.shoff == 0) {
    if (header.shnum != 0) return Malformed("section count without a section table");
    return absl::OkStatus();  // no sections: nothing more to learn
  }
  const Bytes b(data);
  CUBIST_ASSIGN_OR_RETURN(const SectionTable table, LocateSectionTable(b, header));
  CUBIST_ASSIGN_OR_RETURN(const std::vector<Section> sections, ReadSections(b, table));
  KernelTable kernels(&image->kernels);
  CUBIST_RETURN_IF_ERROR(kernels.AddEntryPoints(sections));
  for (uint64_t i = 1; i < sections.size(); ++i) {
    CUBIST_RETURN_IF_ERROR(ReadSection(sections[i], kernels, image));
  }
  std::sort(image->kernels.begin(), image->kernels.end(),
            [](const KernelInfo& a, const KernelInfo& b) { return a.name < b.name; });
  return absl::OkStatus();
}

// The byte range of a fatbin's entries, known to lie inside the buffer.
struct FatbinEntries {
  uint64_t begin = 0;
  uint64_t end = 0;
};

absl::StatusOr<FatbinEntries> ReadFatbinHeader(const Bytes& b) {
  if (!b.Has(0, kFatbinHeaderSize)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "fatbin: truncated header: %d bytes, the header needs %d", b.size(),
        kFatbinHeaderSize));
  }
  uint16_t header_size = 0;
  uint64_t fat_size = 0;
  b.Read(6, &header_size);
  b.Read(8, &fat_size);
  if (header_size < kFatbinHeaderSize || !b.Has(header_size, fat_size)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "fatbin: header (size %d) declares %d bytes of entries, but the file has %d "
        "bytes in all",
        header_size, fat_size, b.size()));
  }
  return FatbinEntries{header_size, header_size + fat_size};
}

// An uncompressed cubin entry: the ELF's own description, which must name the SM the
// entry declares.
absl::Status ReadFatbinCubin(const Bytes& b, int index, uint64_t off, uint32_t arch,
                             SmTarget::Variant variant, ImageInfo* image) {
  absl::Status s = ParseElf(b.Slice(image->offset, image->size), image);
  if (!s.ok()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "fatbin: entry %d at offset %d: %s", index, off, Sv(s.message())));
  }
  if (image->sm.number() != static_cast<int>(arch)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "fatbin: entry %d at offset %d declares sm_%d but holds a cubin for %s",
        index, off, arch, image->sm.ToString()));
  }
  // The container's flags are the authority on the variant: a standalone ABI-8
  // cubin may not say `f` anywhere but in the ptxas command line.
  if (variant != SmTarget::Variant::kPlain) image->sm.variant = variant;
  return absl::OkStatus();
}

// The entry at `off` (at least an entry header's bytes before `end`), its header and
// payload checked to end by `end`.
absl::StatusOr<ImageInfo> ReadFatbinEntry(const Bytes& b, uint64_t off, uint64_t end,
                                          int index) {
  uint16_t kind = 0;
  uint32_t entry_header_size = 0, arch = 0;
  uint64_t payload_size = 0, flags = 0;
  b.Read(off + 0, &kind);
  b.Read(off + 4, &entry_header_size);
  b.Read(off + 8, &payload_size);
  b.Read(off + 28, &arch);
  b.Read(off + 40, &flags);
  if (entry_header_size < kFatbinEntryMinHeader ||
      entry_header_size > end - off ||
      payload_size > end - off - entry_header_size) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "fatbin: entry %d at offset %d: header size %d + payload size %d runs past the "
        "end of the entries (offset %d)",
        index, off, entry_header_size, payload_size, end));
  }
  ImageInfo image;
  image.fatbin_kind = kind;
  image.fatbin_flags = flags;
  image.offset = off + entry_header_size;
  image.size = payload_size;
  image.compressed = (flags & (kFatbinFlagLz4 | kFatbinFlagZstd)) != 0;
  SmTarget::Variant variant = (flags & kFatbinFlagArchSpecific) ? SmTarget::Variant::kArch
                              : (flags & kFatbinFlagFamily) ? SmTarget::Variant::kFamily
                                                            : SmTarget::Variant::kPlain;
  if (arch > 0xffff) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "fatbin: entry %d at offset %d: architecture %d is out of range", index, off,
        arch));
  }
  image.sm = SmTarget{static_cast<int>(arch) / 10, static_cast<int>(arch) % 10, variant};
  if (kind == kFatbinKindElf) {
    image.kind = ImageInfo::Kind::kCubin;
    if (!image.compressed) {
      CUBIST_RETURN_IF_ERROR(ReadFatbinCubin(b, index, off, arch, variant, &image));
    }
  } else if (kind == kFatbinKindPtx) {
    image.kind = ImageInfo::Kind::kPtx;
  } else {
    image.kind = ImageInfo::Kind::kOther;
  }
  return image;
}

absl::Status ParseFatbin(std::string_view data, CubinInfo* info) {
  const Bytes b(data);
  CUBIST_ASSIGN_OR_RETURN(const FatbinEntries entries, ReadFatbinHeader(b));
  info->container = CubinInfo::Container::kFatbin;
  const uint64_t end = entries.end;
  uint64_t off = entries.begin;
  int index = 0;
  while (off < end) {
    if (end - off < kFatbinEntryMinHeader) {
      // Some writers pad the end with zeros.
      bool zeros = std::all_of(data.begin() + off, data.begin() + end,
                               [](char c) { return c == 0; });
      if (zeros) break;
      return absl::InvalidArgumentError(absl::StrFormat(
          "fatbin: entry %d at offset %d is truncated (%d bytes left, an entry header "
          "needs %d)",
          index, off, end - off, kFatbinEntryMinHeader));
    }
    CUBIST_ASSIGN_OR_RETURN(ImageInfo image, ReadFatbinEntry(b, off, end, index));
    off = image.offset + image.size;  // past this entry's header and payload
    info->images.push_back(std::move(image));
    ++index;
  }
  return absl::OkStatus();
}

}  // namespace

std::string SmTarget::ToString() const {
  const char* suffix = variant == Variant::kArch     ? "a"
                       : variant == Variant::kFamily ? "f"
                                                     : "";
  return absl::StrCat("sm_", number(), suffix);
}

absl::StatusOr<SmTarget> SmTarget::Parse(std::string_view text) {
  std::string_view t = text;
  if (t.substr(0, 3) == "sm_") {
    t.remove_prefix(3);
  } else if (t.substr(0, 8) == "compute_") {
    t.remove_prefix(8);
  }
  SmTarget out;
  if (!t.empty() && (t.back() == 'a' || t.back() == 'f')) {
    out.variant = t.back() == 'a' ? Variant::kArch : Variant::kFamily;
    t.remove_suffix(1);
  }
  if (t.size() < 2 || t.size() > 3 ||
      !std::all_of(t.begin(), t.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return absl::InvalidArgumentError(absl::StrCat(
        "SM target '", Sv(text), "': expected sm_<major><minor>[a|f], e.g. sm_90a"));
  }
  int n = 0;
  for (char c : t) n = n * 10 + (c - '0');
  out.major = n / 10;
  out.minor = n % 10;
  if (out.major == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "SM target '", Sv(text), "': expected sm_<major><minor>[a|f], e.g. sm_90a"));
  }
  return out;
}

bool CubinInfo::HasPtx() const {
  return std::any_of(images.begin(), images.end(), [](const ImageInfo& i) {
    return i.kind == ImageInfo::Kind::kPtx;
  });
}

std::vector<const ImageInfo*> CubinInfo::Cubins() const {
  std::vector<const ImageInfo*> out;
  for (const ImageInfo& i : images) {
    if (i.kind == ImageInfo::Kind::kCubin) out.push_back(&i);
  }
  return out;
}

absl::StatusOr<CubinInfo> InspectCubin(std::string_view bytes) {
  CubinInfo info;
  if (bytes.empty()) return absl::InvalidArgumentError("cubin: empty input");
  uint32_t magic = 0;
  if (bytes.size() >= 4) std::memcpy(&magic, bytes.data(), 4);
  if (bytes.size() >= 4 && std::memcmp(bytes.data(), "\x7f" "ELF", 4) == 0) {
    ImageInfo image;
    image.size = bytes.size();
    CUBIST_RETURN_IF_ERROR(ParseElf(bytes, &image));
    info.container = CubinInfo::Container::kCubin;
    info.images.push_back(std::move(image));
    return info;
  }
  if (magic == kFatbinMagic) {
    CUBIST_RETURN_IF_ERROR(ParseFatbin(bytes, &info));
    return info;
  }
  std::string head;
  for (size_t i = 0; i < std::min<size_t>(bytes.size(), 4); ++i) {
    absl::StrAppendFormat(&head, "%s%02x", i ? " " : "", static_cast<uint8_t>(bytes[i]));
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "not a cubin or fatbin: starts with bytes ", head,
      " (a cubin starts with 7f 45 4c 46, \\x7fELF; a fatbin with 50 ed 55 ba)"));
}

absl::StatusOr<CubinInfo> InspectCubinFile(const std::string& path) {
  absl::StatusOr<std::string> bytes = ReadFileToString(path);
  if (!bytes.ok()) return Annotate(bytes.status(), "inspect");
  absl::StatusOr<CubinInfo> info = InspectCubin(*bytes);
  if (!info.ok()) return Annotate(info.status(), path);
  return info;
}

}  // namespace cubist
