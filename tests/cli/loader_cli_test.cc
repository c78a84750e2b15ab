// `cubist inspect` and `cubist doctor`, run as a user would run them.
#include <sys/stat.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testlib/build_paths.h"
#include "tests/testlib/child_process.h"
#include "tests/testlib/cubin_builder.h"
#include "tests/testlib/loader_fixtures.h"
#include "tests/testlib/temp_files.h"

namespace cubist {
namespace {

using ::cubist::testing::BuildCubin;
using ::cubist::testing::CliPath;
using ::cubist::testing::CubinPath;
using ::cubist::testing::FakeCubinSpec;
using ::cubist::testing::FakeKernel;
using ::cubist::testing::RunCommand;
using ::cubist::testing::TempDir;
using ::cubist::testing::WriteFileOrDie;
using ::testing::HasSubstr;
using ::testing::Not;

#ifndef CUBIST_FAKE_LIBCUDA
#define CUBIST_FAKE_LIBCUDA ""
#endif

std::string Cli(const std::string& args) { return CliPath() + " " + args; }

TEST(InspectCli, SyntheticCubinText) {
  TempDir dir;
  FakeCubinSpec spec;
  spec.sm = 90;
  spec.variant = 'a';
  spec.kernels = {FakeKernel{"moe_gemm_bf16", 168, 384, 512, 1, 4096, 2048}};
  WriteFileOrDie(dir.Join("k.cubin"), BuildCubin(spec));
  std::string out;
  EXPECT_EQ(RunCommand(Cli("inspect " + dir.Join("k.cubin")), &out), 0) << out;
  EXPECT_THAT(out, HasSubstr(dir.Join("k.cubin") + ": cubin for sm_90a"));
  EXPECT_THAT(out, HasSubstr("ELF64, ABI version 8, e_flags 0x06005a04"));
  EXPECT_THAT(out, HasSubstr("moe_gemm_bf16   168         384        1 (512)        4096"));
}

TEST(InspectCli, JsonAndCompatibility) {
  TempDir dir;
  FakeCubinSpec spec;
  spec.sm = 80;
  spec.kernels = {FakeKernel{"k", 20, 256, 24, 3, 0, 128}};
  WriteFileOrDie(dir.Join("old.cubin"), BuildCubin(spec));
  std::string out;
  int rc = RunCommand(Cli("inspect --json --sm sm_90 " + dir.Join("old.cubin") + " 2>/dev/null"),
                      &out);
  EXPECT_EQ(rc, 6) << out;  // kExitPrecondition: it cannot run on sm_90
  nlohmann::json j = nlohmann::json::parse(out);
  ASSERT_EQ(j.size(), 1u);
  EXPECT_EQ(j[0]["container"], "cubin");
  EXPECT_EQ(j[0]["has_ptx"], false);
  EXPECT_EQ(j[0]["images"][0]["target"], "sm_80");
  EXPECT_EQ(j[0]["images"][0]["e_flags"], "0x06005004");
  EXPECT_EQ(j[0]["images"][0]["kernels"][0]["name"], "k");
  EXPECT_EQ(j[0]["images"][0]["kernels"][0]["registers"], 20);
  EXPECT_EQ(j[0]["images"][0]["kernels"][0]["max_threads"], 256);
  EXPECT_EQ(j[0]["images"][0]["kernels"][0]["param_bytes"], 24);
  EXPECT_EQ(j[0]["runs_on"]["ok"], false);
  EXPECT_THAT(j[0]["runs_on"]["reason"].get<std::string>(),
              HasSubstr("cubin for sm_80 cannot run on this sm_90 device"));

  EXPECT_EQ(RunCommand(Cli("inspect --sm sm_86 " + dir.Join("old.cubin")), &out), 0);
  EXPECT_THAT(out, HasSubstr("runs on sm_86: yes (cubin sm_80)"));
  EXPECT_EQ(RunCommand(Cli("inspect --sm sm_90a " + dir.Join("old.cubin")), &out), 2);
  EXPECT_THAT(out, HasSubstr("expected a device SM such as sm_90"));
}

TEST(InspectCli, BadFilesAndExitCodes) {
  TempDir dir;
  WriteFileOrDie(dir.Join("junk.cubin"), "not a cubin at all");
  std::string good_path = dir.Join("good.cubin");
  WriteFileOrDie(good_path, BuildCubin(FakeCubinSpec{}));
  std::string out;
  // Every file is reported; the exit code says something was malformed (8).
  EXPECT_EQ(RunCommand(Cli("inspect " + dir.Join("junk.cubin") + " " + good_path), &out), 8);
  EXPECT_THAT(out, HasSubstr("cubist: error: " + dir.Join("junk.cubin") +
                             ": not a cubin or fatbin: starts with bytes 6e 6f 74 20"));
  EXPECT_THAT(out, HasSubstr(good_path + ": cubin for sm_90"));
  EXPECT_EQ(RunCommand(Cli("inspect " + dir.Join("missing.cubin")), &out), 5);
  EXPECT_EQ(RunCommand(Cli("inspect --json " + dir.Join("junk.cubin") + " 2>/dev/null"), &out), 8);
  nlohmann::json j = nlohmann::json::parse(out);
  EXPECT_EQ(j[0]["code"], "INVALID_ARGUMENT");
  EXPECT_EQ(RunCommand(Cli("inspect"), &out), 2);  // a file is required
}

TEST(InspectCli, NvccFatbin) {
  if (!::cubist::testing::FileExists(CubinPath("kernels.fatbin"))) GTEST_SKIP() << "no nvcc";
  std::string out;
  EXPECT_EQ(RunCommand(Cli("inspect --sm sm_90 " + CubinPath("kernels.fatbin")), &out), 0) << out;
  EXPECT_THAT(out, HasSubstr("fatbin, 3 image(s), PTX embedded: yes"));
  EXPECT_THAT(out, HasSubstr("runs on sm_90: yes (cubin sm_90a)"));
  EXPECT_EQ(RunCommand(Cli("inspect --sm sm_100 " + CubinPath("kernels.fatbin")), &out), 0);
  EXPECT_THAT(out, HasSubstr("runs on sm_100: yes (ptx compute_90)"));
}

TEST(DoctorCli, NoDriverIsHonestAndExitsZero) {
  TempDir dir;
  std::string out;
  EXPECT_EQ(RunCommand("CUBIST_LIBCUDA=/nonexistent/libcuda.so.1 " +
                           Cli("doctor --cache " + dir.Join("cache")),
                       &out),
            0)
      << out;
  EXPECT_THAT(out, HasSubstr("no driver: dlopen /nonexistent/libcuda.so.1"));
  EXPECT_THAT(out, HasSubstr("devices: none usable"));
  EXPECT_THAT(out, HasSubstr("cache: " + dir.Join("cache") +
                             " (from --cache): missing; created by the first 'cubist fetch'"));
}

TEST(DoctorCli, DriverWithoutDevice) {
  if (!::cubist::testing::FileExists(CUBIST_FAKE_LIBCUDA)) GTEST_SKIP() << "no fake libcuda";
  TempDir dir;
  std::string out;
  EXPECT_EQ(RunCommand(std::string("CUBIST_LIBCUDA=") + CUBIST_FAKE_LIBCUDA + " " +
                           Cli("doctor --cache " + dir.path()),
                       &out),
            0)
      << out;
  EXPECT_THAT(out, HasSubstr("driver: CUDA 13.0 (cuDriverGetVersion 13000), library API yes"));
  EXPECT_THAT(out, HasSubstr("no GPU: cuInit: CUDA_ERROR_NO_DEVICE"));
  EXPECT_THAT(out, Not(HasSubstr("no driver")));
}

TEST(DoctorCli, CacheContentsAndJson) {
  TempDir dir;
  std::string hex(64, 'a');
  WriteFileOrDie(dir.Join("cache/objects/sha256/aa/" + hex), std::string(1000, 'x'));
  WriteFileOrDie(dir.Join("cache/objects/sha256/bb/" + std::string(64, 'b')), "yz");
  WriteFileOrDie(dir.Join("cache/tmp/partial.1234"), std::string(10, 'p'));
  std::string out;
  EXPECT_EQ(RunCommand("CUBIST_LIBCUDA=/nonexistent/libcuda.so.1 CUBIST_CACHE_DIR=" +
                           dir.Join("cache") + " " + Cli("doctor --json 2>/dev/null"),
                       &out),
            0);
  nlohmann::json j = nlohmann::json::parse(out);
  EXPECT_EQ(j["driver"]["loaded"], false);
  EXPECT_THAT(j["driver"]["error"].get<std::string>(), HasSubstr("no driver"));
  EXPECT_TRUE(j["devices"].empty());
  EXPECT_EQ(j["cache"]["root"], dir.Join("cache"));
  EXPECT_EQ(j["cache"]["origin"], "CUBIST_CACHE_DIR");
  EXPECT_EQ(j["cache"]["state"], "ok");
  EXPECT_EQ(j["cache"]["objects"], 2);
  EXPECT_EQ(j["cache"]["object_bytes"], 1002);
  EXPECT_EQ(j["cache"]["partial_files"], 1);

  WriteFileOrDie(dir.Join("file"), "x");
  EXPECT_EQ(RunCommand("CUBIST_LIBCUDA=/nonexistent " + Cli("doctor --cache " + dir.Join("file")),
                       &out),
            0);
  EXPECT_THAT(out, HasSubstr("not a directory"));
  if (geteuid() != 0) {
    ASSERT_EQ(chmod(dir.Join("cache").c_str(), 0500), 0);
    EXPECT_EQ(RunCommand("CUBIST_LIBCUDA=/nonexistent " + Cli("doctor --cache " + dir.Join("cache")),
                         &out),
              0);
    EXPECT_THAT(out, HasSubstr("not writable"));
    chmod(dir.Join("cache").c_str(), 0700);
  }
}

}  // namespace
}  // namespace cubist
