#include "manifest/manifest_binary.h"

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "base/sha256.h"
#include "base/status_macros.h"
#include "base/strings.h"

namespace cubist {
namespace {

constexpr std::string_view kMagic = "cubist.manifest.bin/1\n";
constexpr size_t kChecksumSize = 32;

// The layout below lists every field of these structs. Their sizes (with libstdc++ on
// a 64-bit target, where the tests run) change when a field is added or removed: then
// write the new field, read it back, and bump the version in kMagic.
#if defined(__GLIBCXX__) && defined(__LP64__)
static_assert(sizeof(Artifact) == 128, "Artifact changed: update manifest_binary.cc");
static_assert(sizeof(KernelSpec) == 352, "KernelSpec changed: update manifest_binary.cc");
static_assert(sizeof(Manifest) == 280, "Manifest changed: update manifest_binary.cc");
#endif

// A quarter nanosecond, absl::Time's resolution: expiry times round-trip exactly.
const absl::Duration kTick = absl::Nanoseconds(1) / 4;

// Appends to a string it does not own: an entry, or a section of packed artifacts.
class Writer {
 public:
  explicit Writer(std::string* out) : out_(*out) {}
  void U8(uint8_t v) { out_.push_back(static_cast<char>(v)); }
  void U32(uint32_t v) { Raw(&v, sizeof(v)); }
  void I64(int64_t v) { Raw(&v, sizeof(v)); }
  void Str(std::string_view s) {
    U32(static_cast<uint32_t>(s.size()));
    out_.append(s.data(), s.size());
  }
  void Extras(const ExtraFields& extras) {
    U32(static_cast<uint32_t>(extras.size()));
    for (const auto& [key, value] : extras) {
      Str(key);
      Str(value);
    }
  }
  std::string& out() { return out_; }

 private:
  // Little-endian hosts only (x86-64, aarch64): the bytes never leave the machine.
  void Raw(const void* p, size_t n) { out_.append(static_cast<const char*>(p), n); }
  std::string& out_;
};

class Reader {
 public:
  explicit Reader(std::string_view in) : in_(in) {}
  bool U8(uint8_t* v) { return Raw(v, sizeof(*v)); }
  bool U32(uint32_t* v) { return Raw(v, sizeof(*v)); }
  bool I64(int64_t* v) { return Raw(v, sizeof(*v)); }
  bool Int(int* v) {
    int64_t x;
    if (!I64(&x) || x < INT32_MIN || x > INT32_MAX) return false;
    *v = static_cast<int>(x);
    return true;
  }
  bool Str(std::string* s) {
    std::string_view v;
    if (!View(&v)) return false;
    s->assign(v.data(), v.size());
    return true;
  }
  // A string where it lies: no copy.
  bool View(std::string_view* s) {
    uint32_t n;
    if (!U32(&n) || n > in_.size() - pos_) return false;
    *s = in_.substr(pos_, n);
    pos_ += n;
    return true;
  }
  // A count of elements that take at least `min_bytes` each: more than the bytes left
  // could hold is corruption, and refusing it bounds what a reserve() allocates.
  bool Count(uint32_t* n, size_t min_bytes) {
    return U32(n) && *n <= (in_.size() - pos_) / min_bytes;
  }
  // Into `extras`; or, when it is null, only checked and stepped over. Either way a
  // repeated key is corruption: the packed decode, which steps over artifacts' extras,
  // must refuse exactly what the full one refuses (the fuzzer found an entry it did not).
  bool Extras(ExtraFields* extras) {
    uint32_t n;
    if (!Count(&n, 8)) return false;
    absl::flat_hash_set<std::string_view> seen;  // allocates only for two keys or more
    for (uint32_t i = 0; i < n; ++i) {
      std::string_view key, value;
      if (!View(&key) || !View(&value)) return false;
      if (extras != nullptr) {
        if (!extras->emplace(std::string(key), std::string(value)).second) return false;
      } else if (n > 1 && !seen.insert(key).second) {
        return false;
      }
    }
    return true;
  }
  bool Skip(size_t n) {
    if (n > in_.size() - pos_) return false;
    pos_ += n;
    return true;
  }
  bool done() const { return pos_ == in_.size(); }
  size_t pos() const { return pos_; }

 private:
  bool Raw(void* p, size_t n) {
    if (n > in_.size() - pos_) return false;
    std::memcpy(p, in_.data() + pos_, n);
    pos_ += n;
    return true;
  }
  std::string_view in_;
  size_t pos_ = 0;
};

void WriteKernel(Writer& w, const KernelSpec& k) {
  for (const std::string* s : {&k.name, &k.artifact, &k.function, &k.arch, &k.op}) w.Str(*s);
  w.I64(k.abi);
  for (const std::string* s : {&k.weight_format, &k.activation_format, &k.activation}) {
    w.Str(*s);
  }
  for (int v : {k.tile_m, k.tile_n, k.tile_k, k.cluster[0], k.cluster[1], k.cluster[2],
                k.stages, k.threads, k.shared_mem_bytes}) {
    w.I64(v);
  }
  w.Extras(k.extras);
}

bool ReadKernel(Reader& r, KernelSpec* k) {
  for (std::string* s : {&k->name, &k->artifact, &k->function, &k->arch, &k->op}) {
    if (!r.Str(s)) return false;
  }
  if (!r.Int(&k->abi)) return false;
  for (std::string* s : {&k->weight_format, &k->activation_format, &k->activation}) {
    if (!r.Str(s)) return false;
  }
  for (int* v : {&k->tile_m, &k->tile_n, &k->tile_k, &k->cluster[0], &k->cluster[1],
                 &k->cluster[2], &k->stages, &k->threads, &k->shared_mem_bytes}) {
    if (!r.Int(v)) return false;
  }
  return r.Extras(&k->extras);
}

void WriteArtifact(Writer& w, const Artifact& a) {
  w.Str(a.path);
  w.Str(a.sha256);
  w.U8(a.size.has_value() ? 1 : 0);
  if (a.size.has_value()) w.I64(static_cast<int64_t>(*a.size));
  w.Extras(a.extras);
}

// One artifact's fields, as views; its extras into `extras`, or stepped over when null.
bool ReadArtifact(Reader& r, ArtifactRef* a, ExtraFields* extras) {
  uint8_t flag;
  if (!r.View(&a->path) || !r.View(&a->sha256) || !r.U8(&flag) || flag > 1) return false;
  a->size.reset();
  if (flag == 1) {
    int64_t size;
    if (!r.I64(&size) || size < 0) return false;
    a->size = static_cast<uint64_t>(size);
  }
  return r.Extras(extras);
}

// Where the artifacts lie in the bytes a Reader reads, when they are left packed.
struct ArtifactsSection {
  size_t begin = 0;
  size_t end = 0;
  uint32_t count = 0;
};

// Every field of the manifest; the artifacts into m->artifacts, or, with `packed`, only
// checked and located there.
bool ReadFields(Reader& r, Manifest* m, ArtifactsSection* packed) {
  uint8_t flag;
  if (!r.Str(&m->digest) || !r.Str(&m->schema) || !r.Str(&m->name) || !r.I64(&m->version) ||
      !r.U8(&flag) || flag > 1) {
    return false;
  }
  if (flag == 1) {
    int64_t seconds, ticks;
    if (!r.I64(&seconds) || !r.I64(&ticks) || ticks < 0 || ticks >= 4'000'000'000) {
      return false;
    }
    m->expires = absl::FromUnixSeconds(seconds) + ticks * kTick;
  }
  uint32_t n;
  if (!r.Count(&n, 4)) return false;
  m->base_urls.resize(n);
  for (std::string& url : m->base_urls) {
    if (!r.Str(&url)) return false;
  }
  if (!r.Count(&n, 4 + 4 + 1 + 4)) return false;
  ArtifactRef ref;
  if (packed != nullptr) {
    packed->begin = r.pos();
    packed->count = n;
    for (uint32_t i = 0; i < n; ++i) {
      if (!ReadArtifact(r, &ref, nullptr)) return false;
    }
    packed->end = r.pos();
  } else {
    m->artifacts.resize(n);
    for (Artifact& a : m->artifacts) {
      if (!ReadArtifact(r, &ref, &a.extras)) return false;
      a.path.assign(ref.path.data(), ref.path.size());
      a.sha256.assign(ref.sha256.data(), ref.sha256.size());
      a.size = ref.size;
    }
  }
  if (!r.Count(&n, 8 * 4 + 10 * 8 + 4)) return false;
  m->kernels.resize(n);
  for (KernelSpec& k : m->kernels) {
    if (!ReadKernel(r, &k)) return false;
  }
  return r.Extras(&m->extras) && r.done();
}

}  // namespace

namespace {

// The fields of `m` before its artifacts, into `w`.
void WriteHead(Writer& w, const Manifest& m) {
  w.out().append(kMagic);
  w.Str(m.digest);
  w.Str(m.schema);
  w.Str(m.name);
  w.I64(m.version);
  w.U8(m.expires.has_value() ? 1 : 0);
  if (m.expires.has_value()) {
    const int64_t seconds = absl::ToUnixSeconds(*m.expires);
    w.I64(seconds);
    absl::Duration rest;  // zero: the tick is absl::Time's resolution
    w.I64(absl::IDivDuration(*m.expires - absl::FromUnixSeconds(seconds), kTick, &rest));
  }
  w.U32(static_cast<uint32_t>(m.base_urls.size()));
  for (const std::string& url : m.base_urls) w.Str(url);
}

// The fields of `m` after its artifacts, into `w`.
void WriteTail(Writer& w, const Manifest& m) {
  w.U32(static_cast<uint32_t>(m.kernels.size()));
  for (const KernelSpec& k : m.kernels) WriteKernel(w, k);
  w.Extras(m.extras);
}

void AppendChecksum(std::string* out, const Sha256Digest& sum) {
  out->append(reinterpret_cast<const char*>(sum.data()), sum.size());
}

}  // namespace

std::string EncodeManifestBinary(const Manifest& m) {
  std::string out;
  Writer w(&out);
  w.out().reserve(256 + m.artifacts.size() * 160 + m.kernels.size() * 400);
  WriteHead(w, m);
  w.U32(static_cast<uint32_t>(m.artifacts.size()));
  for (const Artifact& a : m.artifacts) WriteArtifact(w, a);
  WriteTail(w, m);
  Sha256 hasher;
  hasher.Update(out);
  AppendChecksum(&out, hasher.Finish());
  return out;
}

EncodedPieces EncodeManifestBinaryPieces(const Manifest& m, const PackedArtifacts& artifacts) {
  // Both at once would be two lists: a caller's mistake, never an entry.
  if (!m.artifacts.empty()) std::abort();
  EncodedPieces pieces;
  Writer head(&pieces.head);
  WriteHead(head, m);
  head.U32(static_cast<uint32_t>(artifacts.size()));
  pieces.artifacts = artifacts.section_;
  Writer tail(&pieces.tail);
  WriteTail(tail, m);
  Sha256 hasher;
  hasher.Update(pieces.head);
  hasher.Update(pieces.artifacts);
  hasher.Update(pieces.tail);
  AppendChecksum(&pieces.tail, hasher.Finish());
  return pieces;
}

namespace {

// The fields of an intact entry: its checksum checked, then every field read (the
// artifacts only located, with `packed`). DataLoss otherwise.
absl::StatusOr<Manifest> Decode(std::string_view bytes, ArtifactsSection* packed) {
  auto corrupt = [](std::string_view why) { return absl::DataLossError(Sv(why)); };
  if (bytes.size() < kMagic.size() + kChecksumSize ||
      bytes.substr(0, kMagic.size()) != kMagic) {
    return corrupt("not a parsed manifest of this cubist version");
  }
  const std::string_view body = bytes.substr(0, bytes.size() - kChecksumSize);
  Sha256 hasher;
  hasher.Update(body);
  const Sha256Digest sum = hasher.Finish();
  if (std::memcmp(sum.data(), bytes.data() + body.size(), kChecksumSize) != 0) {
    return corrupt("checksum mismatch (a torn or damaged entry)");
  }
  Manifest m;
  m.schema.clear();
  // Offsets in `packed` count from the start of `bytes`.
  Reader r(body);
  if (!r.Skip(kMagic.size()) || !ReadFields(r, &m, packed)) return corrupt("malformed entry");
  return m;
}

}  // namespace

absl::StatusOr<Manifest> DecodeManifestBinary(std::string_view bytes) {
  return Decode(bytes, nullptr);
}

absl::StatusOr<Manifest> DecodeManifestBinaryPacked(std::string entry,
                                                    PackedArtifacts* artifacts) {
  ArtifactsSection section;
  CUBIST_ASSIGN_OR_RETURN(Manifest m, Decode(entry, &section));
  auto shared = std::make_shared<const std::string>(std::move(entry));
  artifacts->section_ =
      std::string_view(*shared).substr(section.begin, section.end - section.begin);
  artifacts->count_ = section.count;
  artifacts->entry_ = std::move(shared);
  return m;
}

size_t PackedArtifactsBuilder::Add(const Artifact& a) {
  const size_t offset = section_.size();
  Writer w(&section_);
  WriteArtifact(w, a);
  ++count_;
  return offset;
}

std::string_view PackedArtifactsBuilder::PathAt(size_t offset) const {
  Reader r(std::string_view(section_).substr(offset));
  std::string_view path;
  if (!r.View(&path)) std::abort();  // not an offset Add returned
  return path;
}

PackedArtifacts PackedArtifactsBuilder::Finish() && {
  PackedArtifacts out;
  auto shared = std::make_shared<const std::string>(std::move(section_));
  out.section_ = *shared;
  out.count_ = count_;
  out.entry_ = std::move(shared);
  section_.clear();
  count_ = 0;
  return out;
}

bool PackedArtifacts::ForEach(absl::FunctionRef<bool(const ArtifactRef&)> fn) const {
  Reader r(section_);
  ArtifactRef ref;
  for (size_t i = 0; i < count_; ++i) {
    // Checked when the entry was decoded: a failure here is a bug, not corruption.
    if (!ReadArtifact(r, &ref, nullptr)) std::abort();
    if (!fn(ref)) return false;
  }
  return true;
}

std::vector<Artifact> PackedArtifacts::Unpack() const {
  std::vector<Artifact> out(count_);
  Reader r(section_);
  ArtifactRef ref;
  for (Artifact& a : out) {
    if (!ReadArtifact(r, &ref, &a.extras)) std::abort();  // as in ForEach
    a.path.assign(ref.path.data(), ref.path.size());
    a.sha256.assign(ref.sha256.data(), ref.sha256.size());
    a.size = ref.size;
  }
  return out;
}

}  // namespace cubist
