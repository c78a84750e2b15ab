// FlashInfer users end to end: `cubist manifest import flashinfer`, `select --op
// trtllm_bmm`, `fetch` and `export --layout flashinfer` (cli/manifest.cc, cli/export.cc).
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testlib/build_paths.h"
#include "tests/testlib/child_process.h"
#include "tests/testlib/flashinfer_pin.h"
#include "tests/testlib/nginx_server.h"
#include "tests/testlib/temp_files.h"

namespace cubist {
namespace {

using ::cubist::testing::CliPath;
using ::cubist::testing::DefaultPinKernels;
using ::cubist::testing::FileExists;
using ::cubist::testing::ReadFileOrDie;
using ::cubist::testing::RunCommand;
using ::cubist::testing::TempDir;
using ::cubist::testing::WriteFileOrDie;
using ::cubist::testing::WritePin;
using ::cubist::testing::NginxServer;
using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr char kPin[] = "d2c5915bf45ae64308a947824c14966c2718a292/batched_gemm-91e0ba0-896b90b";
constexpr char kCubin[] =
    "Bmm_Bfloat16_MxE2m1Bfloat16_Fp32_t128x8x256_s4_et128x8_m128x8x32_c1x1x1_rM_TN_transOut_"
    "swiGlu_sm100f.cubin";

class FlashinferCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    pin_dir_ = dir_.Join(absl::StrCat("wheel/", kPin));
    hashes_ = WritePin(pin_dir_, DefaultPinKernels());
    manifest_ = dir_.Join("trtllm.json");
  }
  int Cubist(const std::string& args, std::string* out) {
    return RunCommand(absl::StrCat("CUBIST_CACHE_DIR=", dir_.Join("cache"), " ", CliPath(), " ",
                                   args, " 2>&1"),
                      out);
  }
  int Import(std::string* out) {
    return Cubist(absl::StrCat("manifest import flashinfer ", pin_dir_, " -o ", manifest_), out);
  }
  TempDir dir_;
  std::string pin_dir_;
  std::string manifest_;
  std::vector<std::string> hashes_;
};

constexpr char kProblem[] =
    "--op trtllm_bmm --weights mxfp4 --activations bf16 --activation swiglu --experts 8 "
    "--tokens-per-expert 4 --n 4096 --k 2048";

TEST_F(FlashinferCliTest, ImportThenSelect) {
  std::string out;
  ASSERT_EQ(Import(&out), 0) << out;
  EXPECT_THAT(out, StartsWith(absl::StrCat("wrote ", manifest_,
                                           ": batched_gemm-91e0ba0-896b90b version 1: 5 "
                                           "artifacts, ")));
  EXPECT_THAT(out, HasSubstr("3 kernels, digest "));
  EXPECT_THAT(out, HasSubstr("(trtllm_bmm: sm_100f 2, sm_103a 1)"));

  ASSERT_EQ(Cubist(absl::StrCat("select --manifest ", manifest_, " ", kProblem, " --sm 100f"),
                   &out),
            0)
      << out;
  EXPECT_THAT(out, StartsWith("bmm_Bfloat16_MxE2m1Bfloat16_Fp32_t128x8x256_"));
  EXPECT_THAT(out, HasSubstr("rank 1 of 2 candidates on SM 100"));

  ASSERT_EQ(Cubist(absl::StrCat("select --manifest ", manifest_, " ", kProblem,
                                " --sm 100f --explain"),
                   &out),
            0)
      << out;
  EXPECT_THAT(out, HasSubstr("rejected bmm_E4m3_E4m3E4m3_Fp32_t128x16x128_s3_et128x16_m128x16x32_"
                             "c1x1x1_rM_TN_transOut_relu2_sm103a: weight format: kernel takes "
                             "fp8, problem has mxfp4; activation format: kernel takes fp8, "
                             "problem has bf16; activation: kernel applies relu2, problem "
                             "wants swiglu; arch: sm_103a kernel does not run on SM 100: an "
                             "'a' target runs only on SM 103"));

  EXPECT_EQ(Cubist(absl::StrCat("select --manifest ", manifest_, " ", kProblem, " --sm 90"),
                   &out),
            5)
      << out;
  EXPECT_THAT(out, HasSubstr("its trtllm_bmm kernels are for sm_100f (2), sm_103a (1) and none "
                             "runs on SM 90"));
}

TEST_F(FlashinferCliTest, ImportRefusesAPinWithoutKernelList) {
  ASSERT_EQ(::unlink((pin_dir_ + "/include/flashinferMetaInfo.h").c_str()), 0);
  std::string out;
  EXPECT_EQ(Import(&out), 5) << out;
  EXPECT_THAT(out, HasSubstr(absl::StrCat("manifest import: the pin's kernel list: ", pin_dir_,
                                          " has neither include/flashinferMetaInfo.h nor "
                                          "include/flashInferMetaInfo.h")));
}

// The attention (FMHA) pin's header is include/flashInferMetaInfo.h, capital I.
TEST_F(FlashinferCliTest, ImportFindsTheAttentionPinsCapitalIHeader) {
  const std::string fmha = dir_.Join("fmha/e2b0f1c4a6d83b5f7e9a0c1d2b3a4f5e6d7c8b9a/fmha");
  WritePin(fmha, DefaultPinKernels(), "include/flashInferMetaInfo.h");
  std::string out;
  ASSERT_EQ(Cubist(absl::StrCat("manifest import flashinfer ", fmha, " -o ", dir_.Join("f.json")),
                   &out),
            0)
      << out;
  EXPECT_THAT(out, HasSubstr("3 kernels, digest "));
  ::unlink((fmha + "/include/flashInferMetaInfo.h").c_str());
  EXPECT_EQ(Cubist(absl::StrCat("manifest import flashinfer ", fmha, " -o ", dir_.Join("f.json")),
                   &out),
            5)
      << out;
  EXPECT_THAT(out, HasSubstr("has neither include/flashinferMetaInfo.h nor "
                             "include/flashInferMetaInfo.h"));
}

// The pin served by a real nginx, as FlashInfer's artifactory serves it: import by URL needs
// the sizes that a checksums.txt lacks (its own is known: import just read it), so it asks
// for a fetch first and names the command; after that fetch it writes a manifest whose
// artifacts stay at the URL and keeps the checksums.txt it read in the cache, so the
// manifest fetches offline (the checksums.txt is one of its artifacts) and selects.
TEST_F(FlashinferCliTest, ImportByUrlFromNginx) {
  if (NginxServer::BinaryPath().empty()) GTEST_SKIP() << "nginx not installed";
  NginxServer::Options o;
  o.root = dir_.Join("wheel");
  o.workdir = dir_.Join("nginx");
  auto server = NginxServer::Start(o);
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string url = (*server)->BaseUrl() + kPin;

  std::string out;
  EXPECT_EQ(Cubist(absl::StrCat("manifest import flashinfer ", url, " -o ", manifest_), &out), 6)
      << out;
  EXPECT_THAT(out, HasSubstr("manifest import: 4 of 5 artifacts have no known size (first: Bmm_"));
  EXPECT_THAT(out, HasSubstr(absl::StrCat("run `cubist fetch --manifest ", url,
                                          "/checksums.txt` first, then import again")));
  EXPECT_FALSE(FileExists(manifest_));

  ASSERT_EQ(Cubist(absl::StrCat("fetch -q --manifest ", url, "/checksums.txt"), &out), 0) << out;
  // The location may name the checksums.txt itself.
  ASSERT_EQ(Cubist(absl::StrCat("manifest import flashinfer ", url, "/checksums.txt -o ",
                                manifest_),
                   &out),
            0)
      << out;
  EXPECT_THAT(out, StartsWith(absl::StrCat("wrote ", manifest_,
                                           ": batched_gemm-91e0ba0-896b90b version 1: 5 "
                                           "artifacts, ")));
  EXPECT_THAT(ReadFileOrDie(manifest_), HasSubstr(absl::StrCat("\"", url, "/\"")));

  (*server)->Stop();
  ASSERT_EQ(Cubist(absl::StrCat("fetch --offline --manifest ", manifest_), &out), 0) << out;
  EXPECT_THAT(out, HasSubstr("0 downloaded"));
  EXPECT_THAT(out, HasSubstr("5 already cached"));
  ASSERT_EQ(Cubist(absl::StrCat("select --manifest ", manifest_, " ", kProblem, " --sm 100f"),
                   &out),
            0)
      << out;
  EXPECT_THAT(out, StartsWith("bmm_Bfloat16_MxE2m1Bfloat16_Fp32_t128x8x256_"));
}

TEST_F(FlashinferCliTest, FetchThenExportMaterializesThePinByHardLink) {
  std::string out;
  ASSERT_EQ(Import(&out), 0) << out;
  ASSERT_EQ(Cubist(absl::StrCat("fetch --manifest ", manifest_, " -q"), &out), 0) << out;
  const std::string root = dir_.Join("fi");
  ASSERT_EQ(Cubist(absl::StrCat("export --layout flashinfer --manifest ", manifest_, " ", root),
                   &out),
            0)
      << out;
  EXPECT_THAT(out, StartsWith(absl::StrCat("exported 5 files (5 hard links, 0 copies, ")));
  EXPECT_THAT(out, HasSubstr(absl::StrCat("for FlashInfer: export FLASHINFER_CUBIN_DIR=", root)));
  for (const char* rel : {"checksums.txt", "include/flashinferMetaInfo.h"}) {
    const std::string path = absl::StrCat(root, "/", kPin, "/", rel);
    EXPECT_EQ(ReadFileOrDie(path), ReadFileOrDie(absl::StrCat(pin_dir_, "/", rel)));
  }
  const std::string cubin =
      absl::StrCat(root, "/", kPin, "/Bmm_Bfloat16_MxE2m1Bfloat16_Fp32_t128x8x256_s4_et128x8_",
                   "m128x8x32_c1x1x1_rM_TN_transOut_swiGlu_sm100f.cubin");
  struct stat st;
  ASSERT_EQ(::stat(cubin.c_str(), &st), 0);
  EXPECT_EQ(st.st_nlink, 2u);  // the cache object and the export
  EXPECT_EQ(ReadFileOrDie(cubin).size(), 1000u);

  // Again, copying: the earlier tree is swapped out whole, nothing is left beside it.
  ASSERT_EQ(Cubist(absl::StrCat("export --copy --manifest ", manifest_, " ", root), &out), 0)
      << out;
  EXPECT_THAT(out, HasSubstr("(0 hard links, 5 copies, "));
  EXPECT_THAT(out, HasSubstr("(replacing the previous tree)"));
  ASSERT_EQ(::stat(cubin.c_str(), &st), 0);
  EXPECT_EQ(st.st_nlink, 1u);
  std::string listing;
  RunCommand(absl::StrCat("ls -A ", root, "/d2c5915bf45ae64308a947824c14966c2718a292"), &listing);
  EXPECT_EQ(listing, "batched_gemm-91e0ba0-896b90b\n");
}

TEST_F(FlashinferCliTest, ExportRefusesASymlinkInTheWayAndMissingObjects) {
  std::string out;
  ASSERT_EQ(Import(&out), 0) << out;
  const std::string root = dir_.Join("fi");
  // Nothing fetched yet: no cache at all, then a cache without one object.
  EXPECT_EQ(Cubist(absl::StrCat("export --manifest ", manifest_, " ", root), &out), 5) << out;
  EXPECT_THAT(out, HasSubstr("does not exist; run 'cubist fetch' first"));
  ASSERT_EQ(Cubist(absl::StrCat("fetch --manifest ", manifest_, " -q"), &out), 0) << out;
  const std::string object = dir_.Join(absl::StrCat("cache/objects/sha256/", hashes_[1].substr(0, 2),
                                                    "/", hashes_[1]));
  ASSERT_EQ(::unlink(object.c_str()), 0);
  EXPECT_EQ(Cubist(absl::StrCat("export --manifest ", manifest_, " ", root), &out), 5) << out;
  EXPECT_THAT(out, HasSubstr(absl::StrCat("export: 1 of 5 artifacts of ", manifest_,
                                          " are not in the cache at ")));
  EXPECT_THAT(out, HasSubstr("run `cubist fetch` with the same manifest and cache first"));
  EXPECT_FALSE(FileExists(root + "/d2c5915bf45ae64308a947824c14966c2718a292"));

  ASSERT_EQ(Cubist(absl::StrCat("fetch --manifest ", manifest_, " -q"), &out), 0) << out;
  ASSERT_EQ(::mkdir(root.c_str(), 0755), 0);
  const std::string elsewhere = dir_.Join("elsewhere");
  ASSERT_EQ(::mkdir(elsewhere.c_str(), 0755), 0);
  ASSERT_EQ(::symlink(elsewhere.c_str(),
                      (root + "/d2c5915bf45ae64308a947824c14966c2718a292").c_str()),
            0);
  EXPECT_EQ(Cubist(absl::StrCat("export --manifest ", manifest_, " ", root), &out), 6) << out;
  EXPECT_THAT(out, HasSubstr("/fi/d2c5915bf45ae64308a947824c14966c2718a292 is a symlink; "
                             "refusing to write through it"));
  std::string listing;
  RunCommand("ls -A " + elsewhere, &listing);
  EXPECT_EQ(listing, "");
}

// Export replaces only what an export made: a foreign directory's files stay, and the
// refusal names the directory and --replace.
TEST_F(FlashinferCliTest, ExportRefusesToReplaceADirectoryItDidNotMake) {
  std::string out;
  ASSERT_EQ(Import(&out), 0) << out;
  ASSERT_EQ(Cubist(absl::StrCat("fetch --manifest ", manifest_, " -q"), &out), 0) << out;
  const std::string d = dir_.Join("d");
  WriteFileOrDie(d + "/keep", "x\n");
  EXPECT_EQ(Cubist(absl::StrCat("export --layout plain --manifest ", manifest_, " ", d), &out), 6)
      << out;
  EXPECT_THAT(out, HasSubstr(absl::StrCat("export: ", d, " is not empty and was not made by "
                                          "cubist export (no .cubist-export file, and keep is "
                                          "not a hard link to a cache object)")));
  EXPECT_THAT(out, HasSubstr("or pass --replace to replace it anyway"));
  EXPECT_EQ(ReadFileOrDie(d + "/keep"), "x\n");
  EXPECT_FALSE(FileExists(d + "/" + kCubin));

  // Asked for by name, it is replaced; the tree now carries the marker, so the next
  // export replaces it without being asked.
  ASSERT_EQ(Cubist(absl::StrCat("export --layout plain --replace --manifest ", manifest_, " ", d),
                   &out),
            0)
      << out;
  EXPECT_FALSE(FileExists(d + "/keep"));
  EXPECT_THAT(ReadFileOrDie(d + "/.cubist-export"), StartsWith("Made by cubist export from "));
  ASSERT_EQ(Cubist(absl::StrCat("export --layout plain --manifest ", manifest_, " ", d), &out), 0)
      << out;
  EXPECT_THAT(out, HasSubstr("(replacing the previous tree)"));
}

// A tree exported before the marker existed holds only hard links to cache objects: it
// is replaced; one file of someone else's in it and it is not.
TEST_F(FlashinferCliTest, ExportAcceptsAnUnmarkedTreeOfHardLinksOnly) {
  std::string out;
  ASSERT_EQ(Import(&out), 0) << out;
  ASSERT_EQ(Cubist(absl::StrCat("fetch --manifest ", manifest_, " -q"), &out), 0) << out;
  const std::string root = dir_.Join("fi");
  const std::string pin = absl::StrCat(root, "/", kPin);
  ASSERT_EQ(Cubist(absl::StrCat("export --manifest ", manifest_, " ", root), &out), 0) << out;
  ASSERT_EQ(::unlink((pin + "/.cubist-export").c_str()), 0);
  ASSERT_EQ(Cubist(absl::StrCat("export --manifest ", manifest_, " ", root), &out), 0) << out;
  EXPECT_THAT(out, HasSubstr("(replacing the previous tree)"));

  ASSERT_EQ(::unlink((pin + "/.cubist-export").c_str()), 0);
  WriteFileOrDie(pin + "/notes.txt", "mine\n");
  EXPECT_EQ(Cubist(absl::StrCat("export --manifest ", manifest_, " ", root), &out), 6) << out;
  EXPECT_THAT(out, HasSubstr(absl::StrCat("export: ", pin, " is not empty and was not made by "
                                          "cubist export (no .cubist-export file, and "
                                          "notes.txt is not a hard link to a cache object)")));
  EXPECT_EQ(ReadFileOrDie(pin + "/notes.txt"), "mine\n");
}

// Pointed at the cache, into it, or at a directory holding it, export refuses (exit 6)
// and the cache stays whole.
TEST_F(FlashinferCliTest, ExportRefusesTheCacheAndADirectoryHoldingIt) {
  std::string out;
  ASSERT_EQ(Import(&out), 0) << out;
  ASSERT_EQ(Cubist(absl::StrCat("fetch --manifest ", manifest_, " -q"), &out), 0) << out;
  const std::string cache = dir_.Join("cache");
  for (const std::string& target : {cache, cache + "/objects/sha256", cache + "/x"}) {
    EXPECT_EQ(Cubist(absl::StrCat("export --layout plain --replace --manifest ", manifest_, " ",
                                  target),
                     &out),
              6)
        << out;
    EXPECT_THAT(out, HasSubstr(absl::StrCat("export: ", target, " is inside the cache ", cache,
                                            "; refusing to write there")));
  }
  EXPECT_EQ(Cubist(absl::StrCat("export --layout plain --replace --manifest ", manifest_, " ",
                                dir_.path()),
                   &out),
            6)
      << out;
  EXPECT_THAT(out, HasSubstr(absl::StrCat("export: ", dir_.path(), " holds the cache ", cache,
                                          "; replacing it would delete the cache")));
  EXPECT_EQ(Cubist(absl::StrCat("verify --manifest ", manifest_), &out), 0) << out;
  EXPECT_TRUE(FileExists(pin_dir_ + "/checksums.txt"));
}

// `--pin a` after `--pin a/b/c`: the export at a/b/c is not deleted.
TEST_F(FlashinferCliTest, ExportNeverDeletesAnotherExportInsideItsTarget) {
  std::string out;
  ASSERT_EQ(Import(&out), 0) << out;
  ASSERT_EQ(Cubist(absl::StrCat("fetch --manifest ", manifest_, " -q"), &out), 0) << out;
  const std::string root = dir_.Join("fi");
  ASSERT_EQ(Cubist(absl::StrCat("export --pin a/b/c --manifest ", manifest_, " ", root), &out), 0)
      << out;
  for (const char* flags : {"", "--replace "}) {
    EXPECT_EQ(Cubist(absl::StrCat("export --pin a ", flags, "--manifest ", manifest_, " ", root),
                     &out),
              6)
        << out;
    EXPECT_THAT(out, HasSubstr(absl::StrCat("export: replacing ", root,
                                            "/a would delete the export at ", root,
                                            "/a/b/c inside it")));
  }
  EXPECT_TRUE(FileExists(absl::StrCat(root, "/a/b/c/", kCubin)));
}

// A killed export leaves its temporary tree beside the target; the next export removes
// it, but not the one a live export holds (its flock).
TEST_F(FlashinferCliTest, ExportRemovesTheTemporaryTreesOfKilledExports) {
  std::string out;
  ASSERT_EQ(Import(&out), 0) << out;
  ASSERT_EQ(Cubist(absl::StrCat("fetch --manifest ", manifest_, " -q"), &out), 0) << out;
  const std::string root = dir_.Join("fi");
  const std::string parent = absl::StrCat(root, "/d2c5915bf45ae64308a947824c14966c2718a292");
  const std::string stale = parent + "/.batched_gemm-91e0ba0-896b90b.cubist-export-Ab12Cd";
  const std::string live = parent + "/.other.cubist-export-Xy34Zw";
  WriteFileOrDie(stale + "/half/written.cubin", std::string(4096, 'k'));
  WriteFileOrDie(live + "/being/built.cubin", "k");
  int held = ::open(live.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  ASSERT_GE(held, 0);
  ASSERT_EQ(::flock(held, LOCK_EX | LOCK_NB), 0);

  ASSERT_EQ(Cubist(absl::StrCat("export --manifest ", manifest_, " ", root), &out), 0) << out;
  EXPECT_FALSE(FileExists(stale));
  EXPECT_EQ(ReadFileOrDie(live + "/being/built.cubin"), "k");
  EXPECT_TRUE(FileExists(absl::StrCat(root, "/", kPin, "/", kCubin)));
  ::close(held);
}

}  // namespace
}  // namespace cubist
