# The dispatcher's test fixture: a cubin of do-nothing kernels that take the moe_gemm
# parameter struct (tests/fixtures/dispatch/moe_stub.cu), compiled with nvcc into
# ${CMAKE_BINARY_DIR}/tests/dispatch. Without nvcc the tests that need it skip.
find_program(CUBIST_DISPATCH_NVCC nvcc HINTS ${CUDAToolkit_BIN_DIR} /usr/local/cuda/bin)
if(NOT CUBIST_DISPATCH_NVCC)
  message(STATUS "cubist: nvcc not found; runtime tests that need the stub cubin will skip")
  return()
endif()
set(_dispatch_out ${CMAKE_BINARY_DIR}/tests/dispatch/moe_stub_sm_90a.cubin)
add_custom_command(
  OUTPUT ${_dispatch_out}
  COMMAND ${CMAKE_COMMAND} -E make_directory ${CMAKE_BINARY_DIR}/tests/dispatch
  COMMAND ${CUBIST_DISPATCH_NVCC} -cubin -arch=sm_90a -I${PROJECT_SOURCE_DIR}
          -o ${_dispatch_out} ${CMAKE_CURRENT_SOURCE_DIR}/fixtures/dispatch/moe_stub.cu
  DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/fixtures/dispatch/moe_stub.cu
          ${PROJECT_SOURCE_DIR}/kernels/moe_gemm_abi.h
          ${PROJECT_SOURCE_DIR}/kernels/moe_layer_abi.h
  COMMENT "nvcc moe_stub_sm_90a.cubin"
  VERBATIM)
add_custom_target(cubist_dispatch_cubins ALL DEPENDS ${_dispatch_out})
foreach(_t runtime_fake_driver_test moe_layer_fake_driver_test)
  if(TARGET ${_t})
    add_dependencies(${_t} cubist_dispatch_cubins)
    target_compile_definitions(${_t} PRIVATE CUBIST_DISPATCH_STUB_CUBIN="${_dispatch_out}")
  endif()
endforeach()
