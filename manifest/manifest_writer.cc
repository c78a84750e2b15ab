#include "manifest/manifest_writer.h"

#include <initializer_list>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "absl/time/time.h"
#include "base/file_util.h"

namespace cubist {
namespace {

// ordered_json keeps insertion order, which is the point: the order is ours, not
// std::map's.
using OJson = nlohmann::ordered_json;

std::string DumpScalar(const OJson& v) {
  // `replace` makes invalid UTF-8 (possible only in a manifest built in memory) U+FFFD
  // instead of throwing: the writer always returns valid JSON.
  return v.dump(-1, ' ', false, OJson::error_handler_t::replace);
}

void Emit(const OJson& v, int indent, std::string* out) {
  const std::string pad(static_cast<size_t>(indent) + 2, ' ');
  if (v.is_object()) {
    if (v.empty()) {
      *out += "{}";
      return;
    }
    *out += "{\n";
    bool first = true;
    for (auto it = v.begin(); it != v.end(); ++it) {
      if (!first) *out += ",\n";
      first = false;
      *out += pad;
      *out += DumpScalar(OJson(it.key()));
      *out += ": ";
      Emit(it.value(), indent + 2, out);
    }
    *out += "\n" + std::string(static_cast<size_t>(indent), ' ') + "}";
  } else if (v.is_array()) {
    if (v.empty()) {
      *out += "[]";
      return;
    }
    bool all_numbers = true;
    for (const OJson& e : v) all_numbers = all_numbers && e.is_number();
    if (all_numbers) {
      *out += "[";
      for (size_t i = 0; i < v.size(); ++i) {
        if (i > 0) *out += ", ";
        *out += DumpScalar(v[i]);
      }
      *out += "]";
      return;
    }
    *out += "[\n";
    for (size_t i = 0; i < v.size(); ++i) {
      if (i > 0) *out += ",\n";
      *out += pad;
      Emit(v[i], indent + 2, out);
    }
    *out += "\n" + std::string(static_cast<size_t>(indent), ' ') + "]";
  } else {
    *out += DumpScalar(v);
  }
}

OJson ExtraValue(const std::string& raw) {
  try {
    OJson v = OJson::parse(raw, nullptr, /*allow_exceptions=*/false);
    if (!v.is_discarded()) return v;
  } catch (const std::exception&) {
    // Falls through: keep the text, as a string.
  }
  return OJson(raw);
}

void AddExtras(const ExtraFields& extras, std::initializer_list<std::string_view> known,
               OJson* object) {
  for (const auto& [key, raw] : extras) {
    bool is_known = false;
    for (std::string_view k : known) is_known = is_known || key == k;
    if (!is_known) (*object)[key] = ExtraValue(raw);
  }
}

std::string FormatExpires(absl::Time t) {
  return absl::FormatTime("%E4Y-%m-%dT%H:%M:%E*SZ", t, absl::UTCTimeZone());
}

}  // namespace

std::string WriteManifest(const Manifest& m) {
  OJson doc = OJson::object();
  doc["schema"] = m.schema;
  doc["name"] = m.name;
  doc["version"] = m.version;
  if (m.expires.has_value()) doc["expires"] = FormatExpires(*m.expires);
  if (!m.base_urls.empty()) doc["base_urls"] = m.base_urls;
  OJson artifacts = OJson::array();
  for (const Artifact& a : m.artifacts) {
    OJson o = OJson::object();
    o["path"] = a.path;
    o["sha256"] = a.sha256;
    if (a.size.has_value()) o["size"] = *a.size;
    AddExtras(a.extras, {"path", "sha256", "size"}, &o);
    artifacts.push_back(std::move(o));
  }
  doc["artifacts"] = std::move(artifacts);
  OJson kernels = OJson::array();
  for (const KernelSpec& k : m.kernels) {
    OJson o = OJson::object();
    o["name"] = k.name;
    o["artifact"] = k.artifact;
    o["function"] = k.function;
    o["arch"] = k.arch;
    o["op"] = k.op;
    o["abi"] = k.abi;
    o["weight_format"] = k.weight_format;
    o["activation_format"] = k.activation_format;
    o["activation"] = k.activation;
    o["tile_m"] = k.tile_m;
    o["tile_n"] = k.tile_n;
    o["tile_k"] = k.tile_k;
    o["cluster"] = {k.cluster[0], k.cluster[1], k.cluster[2]};
    o["stages"] = k.stages;
    o["threads"] = k.threads;
    o["shared_mem_bytes"] = k.shared_mem_bytes;
    AddExtras(k.extras,
              {"name", "artifact", "function", "arch", "op", "abi", "weight_format",
               "activation_format", "activation", "tile_m", "tile_n", "tile_k", "cluster",
               "stages", "threads", "shared_mem_bytes"},
              &o);
    kernels.push_back(std::move(o));
  }
  doc["kernels"] = std::move(kernels);
  AddExtras(m.extras,
            {"schema", "name", "version", "expires", "base_urls", "artifacts", "kernels"},
            &doc);
  std::string out;
  Emit(doc, 0, &out);
  out += '\n';
  return out;
}

absl::Status WriteManifestFile(const Manifest& manifest, const std::string& path) {
  return WriteFileAtomically(path, WriteManifest(manifest), 0644);
}

}  // namespace cubist
