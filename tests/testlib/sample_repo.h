// Builds artifact repositories on disk for tests: random files and a manifest.json
// that names them (written with nlohmann::json here, so that fetch tests do not depend
// on the manifest writer under test elsewhere).
#ifndef CUBIST_TESTS_TESTLIB_SAMPLE_REPO_H_
#define CUBIST_TESTS_TESTLIB_SAMPLE_REPO_H_

#include <cstdint>
#include <string>
#include <vector>

#include "manifest/manifest.h"

namespace cubist::testing {

struct SampleFile {
  std::string path;
  std::string data;
};

// `count` files "cubins/sm_90a/k<i>.cubin" of sizes min_size..max_size (seeded).
std::vector<SampleFile> MakeSampleFiles(int count, size_t min_size, size_t max_size,
                                        uint64_t seed);

// Writes the files under `dir` and `dir`/manifest.json (name, version, base_urls) and
// returns the manifest as written.
Manifest WriteSampleRepo(const std::string& dir, const std::vector<SampleFile>& files,
                         const std::string& name = "sample", int64_t version = 1,
                         const std::vector<std::string>& base_urls = {});

}  // namespace cubist::testing

#endif  // CUBIST_TESTS_TESTLIB_SAMPLE_REPO_H_
