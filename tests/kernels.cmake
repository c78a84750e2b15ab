# Build rules of the moe_gemm kernel family's tests and benchmark (owner: kernels).
# The GoogleTest files (moe_reference_test, moe_artifacts_test, moe_gemm_gpu_test) are
# picked up by the tests/*_test.cc glob; moe_artifacts_test runs
# scripts/build-artifacts --small into <build>/moe-artifacts-small (skipped without nvcc).
#
# moe_gemm_bench (bench/moe_gemm_bench.cc) times every kernel of an artifact directory on
# the MoE shapes of docs/kernels.md through the loader; it needs a GPU only when run.
set(_moe_bench ${PROJECT_SOURCE_DIR}/bench/moe_gemm_bench.cc)
if(CUBIST_BUILD_BENCH AND EXISTS ${_moe_bench})
  add_executable(moe_gemm_bench ${_moe_bench})
  target_link_libraries(moe_gemm_bench PRIVATE cubist::cubist)
endif()
