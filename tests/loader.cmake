# Test cubins for the loader, compiled with nvcc from tests/fixtures/cubins/*.cu into
# ${CMAKE_BINARY_DIR}/tests/cubins. Without nvcc nothing is built and the tests that need
# these files skip (they look for them at run time; CUBIST_TEST_CUBIN_DIR overrides the
# directory, e.g. on a GPU machine that runs bundled test binaries).

# A stand-in libcuda (no GPU behind it) for the driver-table and doctor tests.
add_library(cubist_fake_libcuda SHARED ${CMAKE_CURRENT_SOURCE_DIR}/fixtures/fake_libcuda/fake_libcuda.cc)
set_target_properties(cubist_fake_libcuda PROPERTIES OUTPUT_NAME fake_cuda)
foreach(_t loader_driver_test loader_cli_test)
  if(TARGET ${_t})
    add_dependencies(${_t} cubist_fake_libcuda)
    target_compile_definitions(${_t} PRIVATE
      CUBIST_FAKE_LIBCUDA="$<TARGET_FILE:cubist_fake_libcuda>")
  endif()
endforeach()

find_program(CUBIST_NVCC nvcc HINTS ${CUDAToolkit_BIN_DIR} /usr/local/cuda/bin)
set(_cubin_dir ${CMAKE_BINARY_DIR}/tests/cubins)
set(_cubin_src ${CMAKE_CURRENT_SOURCE_DIR}/fixtures/cubins)
if(NOT CUBIST_NVCC)
  message(STATUS "cubist: nvcc not found; loader tests that need compiled cubins will skip")
  return()
endif()

set(_cubin_outputs)
# cubist_cubin(<output name> <source> <nvcc arguments...>)
function(cubist_cubin out src)
  add_custom_command(
    OUTPUT ${_cubin_dir}/${out}
    COMMAND ${CMAKE_COMMAND} -E make_directory ${_cubin_dir}
    COMMAND ${CUBIST_NVCC} ${ARGN} -o ${_cubin_dir}/${out} ${_cubin_src}/${src}
    DEPENDS ${_cubin_src}/${src}
    COMMENT "nvcc ${out}"
    VERBATIM)
  set(_cubin_outputs ${_cubin_outputs} ${_cubin_dir}/${out} PARENT_SCOPE)
endfunction()

foreach(_arch sm_80 sm_90 sm_90a sm_100a)
  cubist_cubin(kernels_${_arch}.cubin kernels.cu -cubin -arch=${_arch})
endforeach()
# Family targets (sm_100f) need nvcc 12.9 or newer.
execute_process(COMMAND ${CUBIST_NVCC} --version OUTPUT_VARIABLE _nvcc_version ERROR_QUIET)
if(_nvcc_version MATCHES "release ([0-9]+)\\.([0-9]+)")
  if(CMAKE_MATCH_1 GREATER 12 OR (CMAKE_MATCH_1 EQUAL 12 AND CMAKE_MATCH_2 GREATER_EQUAL 9))
    cubist_cubin(kernels_sm_100f.cubin kernels.cu -cubin -arch=sm_100f)
  endif()
endif()
cubist_cubin(kernels.fatbin kernels.cu -fatbin
  -gencode arch=compute_80,code=sm_80
  -gencode arch=compute_90a,code=sm_90a
  -gencode arch=compute_90,code=compute_90)
# About 1 MB; -Xptxas -O0 keeps its build to seconds (it is timed, never run).
cubist_cubin(large_sm_90a.cubin large.cu -cubin -arch=sm_90a -Xptxas -O0)

add_custom_target(cubist_loader_cubins ALL DEPENDS ${_cubin_outputs})
foreach(_t loader_gpu_test loader_bench)
  if(TARGET ${_t})
    add_dependencies(${_t} cubist_loader_cubins)
  endif()
endforeach()
file(GLOB _loader_tests CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/cubin_*_test.cc
     ${CMAKE_CURRENT_SOURCE_DIR}/loader_*_test.cc)
foreach(_src ${_loader_tests})
  get_filename_component(_name ${_src} NAME_WE)
  if(TARGET ${_name})
    add_dependencies(${_name} cubist_loader_cubins)
  endif()
endforeach()
