#include "artifacts/sources.h"

#include <cstdlib>

#include "artifacts/cache_dir.h"
#include "manifest/manifest.h"
#include "tests/testlib/status_matchers.h"

namespace cubist {
namespace {

TEST(SourcesTest, LocationBaseOfUrlsAndPaths) {
  EXPECT_EQ(LocationBase("https://h.example/a/b/manifest.json?x=1"), "https://h.example/a/b/");
  EXPECT_EQ(LocationBase("http://h:8080/manifest.json"), "http://h:8080/");
  EXPECT_EQ(LocationBase("http://h"), "http://h/");
  EXPECT_EQ(LocationBase("/srv/repo/manifest.json"), "file:///srv/repo/");
  EXPECT_EQ(LocationBase("file:///srv/r/checksums.txt"), "file:///srv/r/");
}

TEST(SourcesTest, JoinUrlEncodesEachSegment) {
  EXPECT_EQ(JoinUrl("http://h/x", "cubins/sm_90a/k 1#.cubin"),
            "http://h/x/cubins/sm_90a/k%201%23.cubin");
  EXPECT_EQ(NormalizeBase("/a b"), "file:///a%20b/");
}

TEST(SourcesTest, MirrorsFirstThenBaseUrlsThenTheManifestsOwnDirectory) {
  Manifest m;
  m.base_urls = {"https://cdn/x", "https://m2/y/"};
  m.source = "https://origin/r/manifest.json";
  EXPECT_EQ(ArtifactBases(m, {"http://local/", "https://cdn/x/"}),
            (std::vector<std::string>{"http://local/", "https://cdn/x/", "https://m2/y/",
                                      "https://origin/r/"}));
}

TEST(CacheDirTest, FlagThenEnvironmentThenXdgThenHome) {
  ::setenv("CUBIST_CACHE_DIR", "/env/c", 1);
  ::setenv("XDG_CACHE_HOME", "/xdg", 1);
  ::setenv("HOME", "/home/u", 1);
  EXPECT_EQ(*ResolveCacheDir("/flag"), "/flag");
  EXPECT_EQ(*ResolveCacheDir(""), "/env/c");
  EXPECT_EQ(CacheDirOrigin(""), "CUBIST_CACHE_DIR");
  ::unsetenv("CUBIST_CACHE_DIR");
  EXPECT_EQ(*ResolveCacheDir(""), "/xdg/cubist");
  ::setenv("XDG_CACHE_HOME", "relative", 1);  // invalid per the XDG spec: ignored
  EXPECT_EQ(*ResolveCacheDir(""), "/home/u/.cache/cubist");
  ::unsetenv("XDG_CACHE_HOME");
  ::unsetenv("HOME");
  EXPECT_THAT(ResolveCacheDir(""), testing::StatusIs(absl::StatusCode::kInvalidArgument,
                                                     ::testing::HasSubstr("pass --cache DIR")));
}

}  // namespace
}  // namespace cubist
