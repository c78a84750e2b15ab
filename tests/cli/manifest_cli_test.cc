// `cubist manifest build` and `cubist manifest check`, run as a user would.
#include <string>

#include <nlohmann/json.hpp>

#include "base/sha256.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "manifest/manifest_parser.h"
#include "tests/testlib/build_paths.h"
#include "tests/testlib/child_process.h"
#include "tests/testlib/temp_files.h"

namespace cubist {
namespace {

using ::cubist::testing::CliPath;
using ::cubist::testing::FileExists;
using ::cubist::testing::ReadFileOrDie;
using ::cubist::testing::RunCommand;
using ::cubist::testing::TempDir;
using ::cubist::testing::WriteFileOrDie;
using ::testing::HasSubstr;
using ::testing::StartsWith;

std::string Q(const std::string& s) { return "'" + s + "'"; }

int Cubist(const std::string& args, std::string* out) {
  return RunCommand(Q(CliPath()) + " " + args, out);
}

class ManifestCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    WriteFileOrDie(dir_.Join("cubins/sm_90a/a.cubin"), "aaaa");
    WriteFileOrDie(dir_.Join("cubins/sm_90a/b.cubin"), "bbbbbbbb");
  }
  TempDir dir_;
  TempDir other_;
};

TEST_F(ManifestCliTest, BuildToStdoutThenCheck) {
  std::string out;
  ASSERT_EQ(Cubist("manifest build " + Q(dir_.path()) + " --name moe --version 4 2>/dev/null",
                   &out), 0) << out;
  absl::StatusOr<Manifest> m = ParseManifest(out, "stdout");
  ASSERT_TRUE(m.ok()) << m.status() << "\n" << out;
  EXPECT_EQ(m->name, "moe");
  EXPECT_EQ(m->version, 4);
  ASSERT_EQ(m->artifacts.size(), 2u);
  EXPECT_EQ(m->artifacts[0].path, "cubins/sm_90a/a.cubin");
  EXPECT_EQ(m->artifacts[0].sha256, Sha256Hex("aaaa"));
  EXPECT_EQ(m->artifacts[1].size, 8u);

  const std::string file = other_.Join("m.json");
  WriteFileOrDie(file, out);
  ASSERT_EQ(Cubist("manifest check " + Q(file), &out), 0) << out;
  EXPECT_EQ(out, file + ": moe version 4: 2 artifacts, 12 bytes, 0 kernels, digest " +
                     Sha256Hex(ReadFileOrDie(file)) + "\n");
}

TEST_F(ManifestCliTest, BuildIntoTheDirectoryLeavesTheManifestOut) {
  const std::string file = dir_.Join("manifest.json");
  std::string out;
  // Twice: the second run must not list the first run's manifest.
  for (int i = 0; i < 2; ++i) {
    ASSERT_EQ(Cubist("manifest build " + Q(dir_.path()) + " -o " + Q(file) + " --name x", &out),
              0) << out;
  }
  const std::string text = ReadFileOrDie(file);
  EXPECT_THAT(out, StartsWith("wrote " + file + ": x version 1: 2 artifacts, 12 bytes, 0 "
                              "kernels, digest " + Sha256Hex(text)));
  absl::StatusOr<Manifest> m = ParseManifest(text, file);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->artifacts.size(), 2u);
  EXPECT_EQ(m->FindArtifact("manifest.json"), nullptr);
}

TEST_F(ManifestCliTest, BuildWithKernels) {
  nlohmann::json k = {{"name", "k"},          {"artifact", "cubins/sm_90a/a.cubin"},
                      {"function", "f"},      {"arch", "sm_90a"},
                      {"op", "moe_gemm"},     {"abi", 1},
                      {"weight_format", "bf16"}, {"activation_format", "bf16"},
                      {"activation", "relu2"}, {"tile_m", 64}, {"tile_n", 64}, {"tile_k", 64},
                      {"stages", 3},          {"threads", 128}, {"shared_mem_bytes", 1024}};
  WriteFileOrDie(other_.Join("kernels.json"), nlohmann::json{{"kernels", {k}}}.dump());
  const std::string file = other_.Join("m.json");
  std::string out;
  ASSERT_EQ(Cubist("manifest build " + Q(dir_.path()) + " --name x --kernels " +
                       Q(other_.Join("kernels.json")) + " -o " + Q(file), &out), 0) << out;
  EXPECT_THAT(out, HasSubstr("2 artifacts, 12 bytes, 1 kernels"));
  ASSERT_EQ(Cubist("manifest check --json " + Q(file), &out), 0) << out;
  nlohmann::json j = nlohmann::json::parse(out);
  EXPECT_EQ(j["kernels"], 1);
  EXPECT_EQ(j["bytes"], 12);
  EXPECT_EQ(j["digest"], Sha256Hex(ReadFileOrDie(file)));

  k["artifact"] = "cubins/missing.cubin";
  WriteFileOrDie(other_.Join("kernels.json"), nlohmann::json::array({k}).dump());
  EXPECT_EQ(Cubist("manifest build " + Q(dir_.path()) + " --name x --kernels " +
                       Q(other_.Join("kernels.json")), &out), 8);
  EXPECT_THAT(out, HasSubstr("cubist: error: " + other_.Join("kernels.json") +
                             ": kernel \"k\": artifact \"cubins/missing.cubin\" is not a file"));
}

TEST_F(ManifestCliTest, CheckRejectsInvalidManifestWithExitCode8) {
  const std::string file = other_.Join("manifest.json");
  WriteFileOrDie(file, R"({"schema": "cubist.manifest/1", "name": "n", "version": 1,
  "artifacts": [{"path": "a", "sha256": ")" + std::string(63, 'a') + R"(", "size": 1}]})");
  std::string out;
  EXPECT_EQ(Cubist("manifest check " + Q(file), &out), 8);
  EXPECT_EQ(out, "cubist: error: " + file +
                     ": artifacts[0].sha256: expected 64 lowercase hex characters, got 63\n");
  WriteFileOrDie(file, "{\n  \"schema\": }");
  EXPECT_EQ(Cubist("manifest check " + Q(file), &out), 8);
  EXPECT_THAT(out, StartsWith("cubist: error: " + file + ":2:13: syntax error: "));
}

// "x" and "x/y" cannot both be files: check (and every parse, so fetch too) refuses
// the set naming both paths, in a JSON manifest and in a checksums.txt.
TEST_F(ManifestCliTest, CheckRefusesAPathThatIsAlsoAnotherPathsDirectory) {
  const std::string file = other_.Join("manifest.json");
  const std::string art = R"(", "sha256": ")" + std::string(64, 'a') + R"(", "size": 1})";
  WriteFileOrDie(file, R"({"schema": "cubist.manifest/1", "name": "n", "version": 1,
  "artifacts": [{"path": "x)" + art + R"(, {"path": "k)" + art + R"(, {"path": "x/y/z)" + art +
                           "]}");
  std::string out;
  EXPECT_EQ(Cubist("manifest check " + Q(file), &out), 8);
  EXPECT_EQ(out, "cubist: error: " + file +
                     ": artifacts[2].path: \"x/y/z\" lies under \"x\" (artifacts[0]), which is "
                     "listed as a file; a path cannot be both a file and a directory\n");
  EXPECT_EQ(Cubist("fetch --offline --cache " + Q(other_.Join("cache")) + " --manifest " +
                       Q(file),
                   &out),
            8);
  EXPECT_THAT(out, HasSubstr("\"x/y/z\" lies under \"x\""));

  const std::string sums = other_.Join("abc/checksums.txt");
  WriteFileOrDie(sums, std::string(64, 'a') + " a/b.cubin\n" + std::string(64, 'b') + " a\n");
  EXPECT_EQ(Cubist("manifest check " + Q(sums), &out), 8);
  EXPECT_THAT(out, HasSubstr(":1: \"a/b.cubin\" lies under \"a\" (line 2), which is listed as "
                             "a file"));
}

TEST_F(ManifestCliTest, CheckAcceptsChecksumsTxt) {
  const std::string file = other_.Join("abc/checksums.txt");
  WriteFileOrDie(file, std::string(64, 'a') + " x.cubin\r\n" + std::string(64, 'b') + "  y.cubin\r\n");
  std::string out;
  ASSERT_EQ(Cubist("manifest check " + Q(file), &out), 0) << out;
  EXPECT_THAT(out, HasSubstr(": abc version 1: 2 artifacts, 0 bytes (2 artifacts without a "
                             "size), 0 kernels, digest "));
}

TEST_F(ManifestCliTest, BuildErrors) {
  std::string out;
  EXPECT_EQ(Cubist("manifest build " + Q(other_.Join("nope")) + " --name x", &out), 5) << out;
  EXPECT_THAT(out, HasSubstr("cubist: error: " + other_.Join("nope") + ": cannot open directory"));
  EXPECT_EQ(Cubist("manifest build " + Q(dir_.path()) + " --name 'bad name'", &out), 8) << out;
  EXPECT_THAT(out, HasSubstr("cubist: error: manifest build: name: expected 1 to 128"));
  EXPECT_EQ(Cubist("manifest build " + Q(dir_.path()) + " --version 0 --name x", &out), 8);
  EXPECT_THAT(out, HasSubstr("manifest version: expected an integer from 1"));
  // Output into a missing directory: an error and no file.
  EXPECT_NE(Cubist("manifest build " + Q(dir_.path()) + " --name x -o " +
                       Q(other_.Join("no/such/m.json")), &out), 0);
  EXPECT_THAT(out, HasSubstr("cubist: error: "));
  EXPECT_FALSE(FileExists(other_.Join("no/such/m.json")));
  EXPECT_EQ(Cubist("manifest build", &out), 2);
  EXPECT_EQ(Cubist("manifest check " + Q(other_.Join("missing.json")), &out), 5);
}

}  // namespace
}  // namespace cubist
