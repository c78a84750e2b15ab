#include "tests/testlib/cubin_builder.h"

#include <cstring>

namespace cubist::testing {
namespace {

template <typename T>
void Put(std::string* out, T v) {
  out->append(reinterpret_cast<const char*>(&v), sizeof(T));
}
template <typename T>
void PutAt(std::string* out, size_t offset, T v) {
  std::memcpy(out->data() + offset, &v, sizeof(T));
}
void Align(std::string* out, size_t a) {
  while (out->size() % a) out->push_back('\0');
}

// Record helpers for .nv.info-style sections.
void Sval(std::string* s, uint8_t attr, const std::vector<uint32_t>& words) {
  s->push_back(4);
  s->push_back(static_cast<char>(attr));
  Put<uint16_t>(s, static_cast<uint16_t>(words.size() * 4));
  for (uint32_t w : words) Put(s, w);
}
void Hval(std::string* s, uint8_t attr, uint16_t v) {
  s->push_back(3);
  s->push_back(static_cast<char>(attr));
  Put(s, v);
}
void Bval(std::string* s, uint8_t attr, uint8_t v) {
  s->push_back(2);
  s->push_back(static_cast<char>(attr));
  s->push_back(static_cast<char>(v));
  s->push_back(0);
}

std::string Note(uint32_t type, const std::string& desc) {
  std::string n;
  Put<uint32_t>(&n, 12);
  Put<uint32_t>(&n, static_cast<uint32_t>(desc.size()));
  Put<uint32_t>(&n, type);
  n.append("NVIDIA Corp\0", 12);
  n += desc;
  Align(&n, 4);
  return n;
}

struct Sec {
  std::string name;
  uint32_t type = 0;
  std::string data;
  uint64_t nobits_size = 0;
  uint32_t link = 0;
  uint32_t info = 0;
  uint64_t entsize = 0;
  uint64_t flags = 0;
};

}  // namespace

std::string BuildCubin(const FakeCubinSpec& spec) {
  std::vector<Sec> secs(1);  // [0] is the null section
  auto add = [&](Sec s) {
    secs.push_back(std::move(s));
    return static_cast<uint32_t>(secs.size() - 1);
  };
  uint32_t shstrtab = add({".shstrtab", 3});
  uint32_t strtab = add({".strtab", 3});
  uint32_t symtab = add({".symtab", 2});
  secs[symtab].link = strtab;
  secs[symtab].entsize = 24;
  std::string arch = "sm_" + std::to_string(spec.sm) + (spec.variant ? std::string(1, spec.variant) : "");
  if (spec.with_notes) {
    std::string blob("\0ptxas\0Cuda compilation tools, release 13.0, V13.0.88\0", 54);
    uint32_t build_off = static_cast<uint32_t>(blob.size());
    blob += std::string("Build test") + '\0';
    uint32_t opts_off = static_cast<uint32_t>(blob.size());
    blob += "-arch " + arch + " -m 64 " + '\0';
    std::string desc;
    for (uint32_t w : {2u, 0u, 1u, 7u, build_off, opts_off}) Put(&desc, w);
    desc += blob;
    add({".note.nv.tkinfo", 7, Note(2000, desc)});
    std::string cu;
    Put<uint16_t>(&cu, 2);
    Put<uint16_t>(&cu, static_cast<uint16_t>(spec.sm));
    Put<uint32_t>(&cu, 130);
    add({".note.nv.cuinfo", 7, Note(1000, cu)});
  }
  uint32_t info = add({".nv.info", 0x70000000});
  secs[info].link = symtab;
  std::string compat;
  Bval(&compat, 0x09, spec.variant == 'a' ? 1 : 0);
  Bval(&compat, 0x02, 1);
  add({".nv.compat", 0x70000086, compat});

  std::string strs(1, '\0');
  std::string syms(24, '\0');
  for (size_t k = 0; k < spec.kernels.size(); ++k) {
    const FakeKernel& kern = spec.kernels[k];
    uint32_t sym_index = static_cast<uint32_t>(k + 1);
    std::string per;
    Sval(&per, 0x37, {0x82});
    for (int p = 0; p < kern.param_count; ++p) Sval(&per, 0x17, {0, static_cast<uint32_t>(p) << 16 | 8, 0x0011f000});
    Hval(&per, 0x19, static_cast<uint16_t>(kern.param_bytes));
    if (kern.max_threads > 0) Sval(&per, 0x05, {static_cast<uint32_t>(kern.max_threads), 1, 1});
    add({".nv.info." + kern.name, 0x70000000, per, 0, symtab});
    uint32_t text = add({".text." + kern.name, 1, std::string(kern.code_bytes, '\x42')});
    secs[text].flags = 6;
    if (kern.static_shared_bytes > 0) {
      add({".nv.shared." + kern.name, 8, "", static_cast<uint64_t>(kern.static_shared_bytes)});
    }
    Sval(&secs[info].data, 0x2f, {sym_index, static_cast<uint32_t>(kern.registers)});
    Sval(&secs[info].data, 0x11, {sym_index, 0});
    // Symbol: name, info (GLOBAL FUNC), other (CUDA entry), shndx, value, size.
    uint32_t name_off = static_cast<uint32_t>(strs.size());
    strs += kern.name + '\0';
    Put<uint32_t>(&syms, name_off);
    syms.push_back(static_cast<char>((1 << 4) | 2));
    syms.push_back(0x10);
    Put<uint16_t>(&syms, static_cast<uint16_t>(text));
    Put<uint64_t>(&syms, 0);
    Put<uint64_t>(&syms, static_cast<uint64_t>(kern.code_bytes));
  }
  secs[strtab].data = strs;
  secs[symtab].data = syms;
  secs[symtab].info = 1;
  std::string shstr(1, '\0');
  std::vector<uint32_t> name_offs(secs.size(), 0);
  for (size_t i = 1; i < secs.size(); ++i) {
    name_offs[i] = static_cast<uint32_t>(shstr.size());
    shstr += secs[i].name + '\0';
  }
  secs[shstrtab].data = shstr;

  std::string out(64, '\0');
  std::vector<uint64_t> offsets(secs.size(), 0);
  for (size_t i = 1; i < secs.size(); ++i) {
    Align(&out, 8);
    offsets[i] = out.size();
    out += secs[i].data;
  }
  Align(&out, 8);
  uint64_t shoff = out.size();
  for (size_t i = 0; i < secs.size(); ++i) {
    const Sec& s = secs[i];
    Put<uint32_t>(&out, name_offs[i]);
    Put<uint32_t>(&out, s.type);
    Put<uint64_t>(&out, s.flags);
    Put<uint64_t>(&out, 0);  // addr
    Put<uint64_t>(&out, offsets[i]);
    Put<uint64_t>(&out, s.type == 8 ? s.nobits_size : s.data.size());
    Put<uint32_t>(&out, s.link);
    Put<uint32_t>(&out, s.info);
    Put<uint64_t>(&out, 4);  // addralign
    Put<uint64_t>(&out, s.entsize);
  }
  // ELF header.
  std::memcpy(out.data(), "\x7f" "ELF", 4);
  out[4] = 2;     // ELFCLASS64
  out[5] = 1;     // little-endian
  out[6] = 1;     // EV_CURRENT
  out[7] = 0x41;  // OS ABI as nvcc 13 writes it
  out[8] = static_cast<char>(spec.abi_version);
  uint32_t flags;
  if (spec.abi_version >= 8) {
    flags = 0x06000000u | (static_cast<uint32_t>(spec.sm) << 8) | (spec.sm >= 100 ? 2u : 4u);
  } else {
    flags = static_cast<uint32_t>(spec.sm) | 0x400u | (spec.variant == 'a' ? 0x800u : 0u) |
            (static_cast<uint32_t>(spec.sm) << 16);
  }
  PutAt<uint16_t>(&out, 16, 2);    // ET_EXEC
  PutAt<uint16_t>(&out, 18, 190);  // EM_CUDA
  PutAt<uint32_t>(&out, 20, 0x80);
  PutAt<uint64_t>(&out, 40, shoff);
  PutAt<uint32_t>(&out, 48, flags);
  PutAt<uint16_t>(&out, 52, 64);
  PutAt<uint16_t>(&out, 54, 56);
  PutAt<uint16_t>(&out, 58, 64);
  PutAt<uint16_t>(&out, 60, static_cast<uint16_t>(secs.size()));
  PutAt<uint16_t>(&out, 62, static_cast<uint16_t>(shstrtab));
  return out;
}

std::string BuildFatbin(const std::vector<FakeFatbinEntry>& entries) {
  std::string body;
  for (const FakeFatbinEntry& e : entries) {
    std::string h;
    Put<uint16_t>(&h, e.kind);
    Put<uint16_t>(&h, 0x0101);
    Put<uint32_t>(&h, 64);                        // header size
    Put<uint64_t>(&h, e.payload.size());          // payload size
    Put<uint32_t>(&h, 0);                         // compressed size
    Put<uint32_t>(&h, 0);
    Put<uint16_t>(&h, e.kind == 1 ? 0 : 8);       // minor
    Put<uint16_t>(&h, e.kind == 1 ? 9 : 1);       // major
    Put<uint32_t>(&h, e.arch);
    Put<uint32_t>(&h, 0);
    Put<uint32_t>(&h, 0);
    Put<uint64_t>(&h, e.flags);
    Put<uint64_t>(&h, 0);
    Put<uint64_t>(&h, 0);                         // decompressed size
    body += h;
    body += e.payload;
  }
  std::string out;
  Put<uint32_t>(&out, 0xBA55ED50);
  Put<uint16_t>(&out, 1);
  Put<uint16_t>(&out, 16);
  Put<uint64_t>(&out, body.size());
  return out + body;
}

}  // namespace cubist::testing
