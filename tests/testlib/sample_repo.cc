#include "tests/testlib/sample_repo.h"

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "base/sha256.h"
#include "tests/testlib/temp_files.h"

namespace cubist::testing {

std::vector<SampleFile> MakeSampleFiles(int count, size_t min_size, size_t max_size,
                                        uint64_t seed) {
  std::vector<SampleFile> out;
  for (int i = 0; i < count; ++i) {
    size_t size = min_size + (max_size > min_size ? (seed * 7919 + i * 104729) % (max_size - min_size + 1) : 0);
    out.push_back({absl::StrCat("cubins/sm_90a/k", i, ".cubin"), RandomBytes(size, seed + i)});
  }
  return out;
}

Manifest WriteSampleRepo(const std::string& dir, const std::vector<SampleFile>& files,
                         const std::string& name, int64_t version,
                         const std::vector<std::string>& base_urls) {
  Manifest m;
  m.name = name;
  m.version = version;
  m.base_urls = base_urls;
  nlohmann::json j;
  j["schema"] = kManifestSchema;
  j["name"] = name;
  j["version"] = version;
  if (!base_urls.empty()) j["base_urls"] = base_urls;
  j["artifacts"] = nlohmann::json::array();
  for (const SampleFile& f : files) {
    WriteFileOrDie(dir + "/" + f.path, f.data);
    Artifact a{f.path, Sha256Hex(f.data), f.data.size(), {}};
    j["artifacts"].push_back({{"path", a.path}, {"sha256", a.sha256}, {"size", *a.size}});
    m.artifacts.push_back(std::move(a));
  }
  j["kernels"] = nlohmann::json::array();
  WriteFileOrDie(dir + "/manifest.json", j.dump(2));
  m.source = dir + "/manifest.json";
  return m;
}

}  // namespace cubist::testing
