// The run-time driver table: dlopen failures, missing entry points named, error mapping.
#include "loader/driver_api.h"

#include <cstdlib>

#include "tests/testlib/loader_fixtures.h"
#include "tests/testlib/status_matchers.h"
#include "tests/testlib/temp_files.h"

namespace cubist {
namespace {

using ::cubist::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

#ifndef CUBIST_FAKE_LIBCUDA
#define CUBIST_FAKE_LIBCUDA ""
#endif

bool HaveFake() { return ::cubist::testing::FileExists(CUBIST_FAKE_LIBCUDA); }

TEST(LoaderDriver, MissingLibraryIsFailedPrecondition) {
  EXPECT_THAT(OpenDriverLibrary("/nonexistent/libcuda.so.1"),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("no driver: dlopen /nonexistent/libcuda.so.1"),
                             HasSubstr("install the NVIDIA driver"))));
}

TEST(LoaderDriver, NotADriverLibrary) {
  // libc has no cuGetProcAddress.
  EXPECT_THAT(OpenDriverLibrary("libc.so.6"),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("exports neither cuGetProcAddress_v2 nor cuGetProcAddress")));
}

TEST(LoaderDriver, ResolvesEverythingFromAFakeLibcuda) {
  if (!HaveFake()) GTEST_SKIP() << "fake libcuda not built";
  unsetenv("FAKE_LIBCUDA_MISSING");
  absl::StatusOr<std::unique_ptr<DriverApi>> driver = OpenDriverLibrary(CUBIST_FAKE_LIBCUDA);
  CUBIST_ASSERT_OK(driver);
  int version = 0;
  EXPECT_EQ((*driver)->DriverGetVersion(&version), CUDA_SUCCESS);
  EXPECT_EQ(version, 13000);
  EXPECT_TRUE((*driver)->HasLibraryApi());
  EXPECT_THAT(CuCheck(**driver, (*driver)->Init(0), "cuInit"),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("cuInit: CUDA_ERROR_NO_DEVICE (no CUDA-capable device is "
                                 "detected)")));
}

TEST(LoaderDriver, MissingEntryPointIsNamed) {
  if (!HaveFake()) GTEST_SKIP() << "fake libcuda not built";
  setenv("FAKE_LIBCUDA_MISSING", "cuLaunchKernelEx", 1);
  EXPECT_THAT(OpenDriverLibrary(CUBIST_FAKE_LIBCUDA),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("entry point cuLaunchKernelEx (CUDA 11.6 ABI) is "
                                       "missing"),
                             HasSubstr("update the NVIDIA driver"))));
  // The library API is optional: without it the table still opens.
  setenv("FAKE_LIBCUDA_MISSING", "cuLibraryLoadData,cuKernelGetFunction", 1);
  absl::StatusOr<std::unique_ptr<DriverApi>> driver = OpenDriverLibrary(CUBIST_FAKE_LIBCUDA);
  CUBIST_ASSERT_OK(driver);
  EXPECT_FALSE((*driver)->HasLibraryApi());
  unsetenv("FAKE_LIBCUDA_MISSING");
}

TEST(LoaderDriver, ProcessDriverIsConsistent) {
  // Whatever this machine has, LoadDriver and GetDriver agree and say why they fail.
  absl::StatusOr<DriverApi*> loaded = LoadDriver();
  absl::StatusOr<DriverApi*> got = GetDriver();
  if (!loaded.ok()) {
    EXPECT_THAT(loaded, StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("no driver")));
    EXPECT_EQ(got.status(), loaded.status());
  } else if (!got.ok()) {
    EXPECT_THAT(got, StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("no GPU: cuInit")));
  } else {
    EXPECT_EQ(*got, *loaded);
  }
  EXPECT_EQ(LoadDriver().status(), loaded.status());  // cached
}

TEST(LoaderDriver, ErrorMapping) {
  DriverApi fake;  // defaults: names for common codes, no descriptions
  EXPECT_THAT(CuCheck(fake, CUDA_ERROR_OUT_OF_MEMORY, "cuMemAlloc(8 bytes)"),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       "cuMemAlloc(8 bytes): CUDA_ERROR_OUT_OF_MEMORY"));
  EXPECT_THAT(CuCheck(fake, CUDA_ERROR_NO_BINARY_FOR_GPU, "load"),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("NO_BINARY_FOR_GPU")));
  EXPECT_THAT(CuCheck(fake, CUDA_ERROR_NOT_FOUND, "x"),
              StatusIs(absl::StatusCode::kNotFound, ::testing::_));
  EXPECT_THAT(CuCheck(fake, CUDA_ERROR_INVALID_IMAGE, "x"),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::_));
  EXPECT_THAT(CuCheck(fake, static_cast<CUresult>(1000), "x"),
              StatusIs(absl::StatusCode::kInternal, "x: CUresult 1000"));
  CUBIST_EXPECT_OK(CuCheck(fake, CUDA_SUCCESS, "x"));
  int v = 0;
  EXPECT_EQ(fake.DriverGetVersion(&v), CUDA_ERROR_NOT_SUPPORTED);
  EXPECT_FALSE(fake.HasLibraryApi());
}

}  // namespace
}  // namespace cubist
