// libcurl reached at run time (artifacts/curl_library.h): the loader's errors name the
// library and the fix, and the `cubist` command loads libcurl only when a transfer is
// about to start (a warm fetch, and --offline, run without it).
#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "artifacts/curl_library.h"
#include "base/shared_library.h"
#include "tests/testlib/build_paths.h"
#include "tests/testlib/child_process.h"
#include "tests/testlib/sample_repo.h"
#include "tests/testlib/status_matchers.h"
#include "tests/testlib/temp_files.h"

namespace cubist {
namespace {

using ::cubist::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kNoSuchLibrary[] = "libcubist-test-no-such-curl.so.4";

TEST(SharedLibraryTest, AMissingLibraryIsAPreconditionNamingIt) {
  EXPECT_THAT(SharedLibrary::Open(kNoSuchLibrary),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr(absl::StrCat("dlopen ", kNoSuchLibrary, ": "))));
}

TEST(SharedLibraryTest, ResolvesSymbolsAndMovesItsHandle) {
  absl::StatusOr<SharedLibrary> libm = SharedLibrary::Open("libm.so.6");
  CUBIST_ASSERT_OK(libm);
  EXPECT_NE(libm->Symbol("cos"), nullptr);
  EXPECT_EQ(libm->Symbol("cubist_no_such_symbol"), nullptr);
  SharedLibrary moved = *std::move(libm);
  EXPECT_TRUE(moved.loaded());
  EXPECT_FALSE(libm->loaded());  // NOLINT(bugprone-use-after-move): moved-from is empty
  EXPECT_EQ(libm->Symbol("cos"), nullptr);
}

TEST(CurlLibraryTest, AMissingLibcurlNamesItAndTheFix) {
  EXPECT_THAT(CurlLibrary::Open(kNoSuchLibrary),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("libcurl is needed to download"),
                             HasSubstr(kNoSuchLibrary), HasSubstr("apt-get install libcurl4"),
                             HasSubstr("dnf install libcurl)"), HasSubstr("CUBIST_LIBCURL"))));
}

TEST(CurlLibraryTest, ALibraryWithoutCurlsFunctionsIsRefusedNamingTheFirstMissing) {
  EXPECT_THAT(CurlLibrary::Open("libm.so.6"),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("cannot use libm.so.6 as libcurl"),
                             HasSubstr("no curl_global_init"),
                             HasSubstr("apt-get install libcurl4"))));
}

TEST(CurlLibraryTest, TheSystemLibcurlHasEveryFunctionAndIsNewEnough) {
  absl::StatusOr<CurlLibrary> lib = CurlLibrary::Open(kDefaultLibcurl);
  CUBIST_ASSERT_OK(lib);
  const CurlApi& api = lib->api();
  for (const void* fn :
       {reinterpret_cast<const void*>(api.global_init),
        reinterpret_cast<const void*>(api.easy_setopt),
        reinterpret_cast<const void*>(api.multi_poll),
        reinterpret_cast<const void*>(api.multi_cleanup)}) {
    EXPECT_NE(fn, nullptr);
  }
  EXPECT_GE(api.version_info(CURLVERSION_NOW)->version_num, kMinLibcurlVersion);
  EXPECT_STREQ(api.easy_strerror(CURLE_OK), "No error");
}

TEST(CurlLibraryTest, LoadCurlLoadsOnceForTheProcess) {
  if (const char* env = std::getenv("CUBIST_LIBCURL"); env != nullptr && *env != '\0') {
    GTEST_SKIP() << "CUBIST_LIBCURL is set";
  }
  absl::StatusOr<const CurlApi*> first = LoadCurl();
  CUBIST_ASSERT_OK(first);
  absl::StatusOr<const CurlApi*> second = LoadCurl();
  CUBIST_ASSERT_OK(second);
  EXPECT_EQ(*first, *second);
}

// The command, with CUBIST_LIBCURL naming a library that does not exist: whatever needs
// a transfer fails with the loader's error (exit 6, precondition), and nothing else
// notices, because nothing else loads libcurl.
class FetchWithoutLibcurlTest : public ::testing::Test {
 protected:
  void SetUp() override {
    repo_ = tmp_.Join("repo");
    cache_ = tmp_.Join("cache");
    files_ = testing::MakeSampleFiles(5, 100, 2000, 11);
    testing::WriteSampleRepo(repo_, files_, "no-curl", 1);
    manifest_ = repo_ + "/manifest.json";
  }

  int Cubist(const std::string& args, std::string* out, bool with_libcurl = false) {
    return testing::RunCommand(
        absl::StrCat(with_libcurl ? "" : absl::StrCat("CUBIST_LIBCURL=", kNoSuchLibrary, " "),
                     testing::CliPath(), " ", args),
        out);
  }

  testing::TempDir tmp_;
  std::string repo_, cache_, manifest_;
  std::vector<testing::SampleFile> files_;
};

TEST_F(FetchWithoutLibcurlTest, ADownloadFailsNamingTheLibraryAndTheFix) {
  std::string out;
  EXPECT_EQ(Cubist(absl::StrCat("fetch -q --manifest ", manifest_, " --cache ", cache_), &out),
            6)
      << out;
  EXPECT_THAT(out, AllOf(HasSubstr("libcurl is needed to download"),
                         HasSubstr(absl::StrCat("dlopen ", kNoSuchLibrary)),
                         HasSubstr("apt-get install libcurl4")));
  EXPECT_THAT(out, HasSubstr("5 failed"));
}

TEST_F(FetchWithoutLibcurlTest, AWarmFetchAndAnOfflineOneNeverLoadIt) {
  std::string out;
  // Filled with the real libcurl (file:// transfers from the manifest's directory).
  ASSERT_EQ(Cubist(absl::StrCat("fetch -q --manifest ", manifest_, " --cache ", cache_), &out,
                   /*with_libcurl=*/true),
            0)
      << out;
  EXPECT_EQ(Cubist(absl::StrCat("fetch --manifest ", manifest_, " --cache ", cache_), &out), 0)
      << out;
  EXPECT_THAT(out, HasSubstr("5 already cached"));
  EXPECT_EQ(Cubist(absl::StrCat("verify --manifest ", manifest_, " --cache ", cache_), &out), 0)
      << out;
  // --offline into an empty cache: "not cached" (exit 5), not a libcurl error.
  const std::string other = tmp_.Join("other-cache");
  EXPECT_EQ(Cubist(absl::StrCat("fetch -q --offline --manifest ", manifest_, " --cache ", other),
                   &out),
            5)
      << out;
  EXPECT_THAT(out, AllOf(HasSubstr("--offline forbids the network"), Not(HasSubstr("libcurl"))));
}

TEST_F(FetchWithoutLibcurlTest, AManifestUrlNeedsItAndSaysSo) {
  std::string out;
  // Never connected to: the library is missing before any socket is opened.
  EXPECT_EQ(Cubist(absl::StrCat("fetch -q --manifest http://127.0.0.1:9/manifest.json --cache ",
                                cache_),
                   &out),
            6)
      << out;
  EXPECT_THAT(out, AllOf(HasSubstr("http://127.0.0.1:9/manifest.json: libcurl is needed"),
                         HasSubstr(kNoSuchLibrary), HasSubstr("apt-get install libcurl4")));
}

}  // namespace
}  // namespace cubist
