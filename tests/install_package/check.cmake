# Run by CTest as `cmake -P` (tests/install_package/CMakeLists.txt). Fails with a message that names
# what is wrong with the installed package.
file(REMOVE_RECURSE ${WORK_DIR})
set(_prefix ${WORK_DIR}/prefix)

function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE _rc OUTPUT_VARIABLE _out
                  ERROR_VARIABLE _out)
  if(NOT _rc EQUAL 0)
    message(FATAL_ERROR "failed (${_rc}): ${ARGN}\n${_out}")
  endif()
endfunction()

# 1. Install.
run(${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${_prefix})

# 2. The package: config and version files, public headers only.
file(GLOB_RECURSE _configs ${_prefix}/cubistConfig.cmake)
if(NOT _configs)
  message(FATAL_ERROR "no cubistConfig.cmake under ${_prefix}")
endif()
list(GET _configs 0 _config)
get_filename_component(_cmake_dir ${_config} DIRECTORY)
if(NOT EXISTS ${_cmake_dir}/cubistConfigVersion.cmake)
  message(FATAL_ERROR "no cubistConfigVersion.cmake beside ${_config}")
endif()
foreach(_private manifest/json_reader.h artifacts/curl_handles.h artifacts/curl_options.h
                 artifacts/curl_library.h artifacts/curl_transport.h artifacts/oci_client.h)
  if(EXISTS ${_prefix}/include/cubist/${_private})
    message(FATAL_ERROR "installed a private header: include/cubist/${_private}")
  endif()
endforeach()
# Whatever the list above misses: no installed header may need libcurl's or
# nlohmann_json's headers, which the package does not promise.
file(GLOB_RECURSE _installed ${_prefix}/include/cubist/*.h)
foreach(_h ${_installed})
  file(STRINGS ${_h} _hits REGEX "^#include <(curl|nlohmann)/")
  if(_hits)
    message(FATAL_ERROR "installed header ${_h} includes a private dependency: ${_hits}")
  endif()
endforeach()
if(NOT EXISTS ${_prefix}/include/cubist/dispatch/runtime.h)
  message(FATAL_ERROR "public header dispatch/runtime.h not installed")
endif()

# 3. Nothing in the exported interface names this machine's build or source tree.
file(GLOB _exported ${_cmake_dir}/*.cmake)
foreach(_f ${_exported})
  file(READ ${_f} _text)
  foreach(_dir ${BUILD_DIR} ${SOURCE_DIR})
    string(FIND "${_text}" "${_dir}" _at)
    if(NOT _at EQUAL -1)
      message(FATAL_ERROR "${_f} names the build machine's path ${_dir}")
    endif()
  endforeach()
endforeach()

# 4. examples/ as a separate project against the installed package.
# The same compiler; a sanitizer build's library needs its runtime at link time (the
# flags are the build's choice, not part of the package's interface).
set(_flags)
if(SANITIZE)
  set(_flags -DCMAKE_CXX_FLAGS=-fsanitize=${SANITIZE}
             -DCMAKE_EXE_LINKER_FLAGS=-fsanitize=${SANITIZE})
endif()
run(${CMAKE_COMMAND} -S ${SOURCE_DIR}/examples -B ${WORK_DIR}/examples -G ${GENERATOR}
    -DCMAKE_PREFIX_PATH=${_prefix} -DCMAKE_BUILD_TYPE=Release
    -DCMAKE_CXX_COMPILER=${CXX_COMPILER} ${_flags})
run(${CMAKE_COMMAND} --build ${WORK_DIR}/examples)

# 5. Run it. With a GPU it runs the layer; without one it must get as far as the
#    driver and say so (exit 1, "no driver" or "no GPU"), not crash or misread the set.
execute_process(
  COMMAND ${CMAKE_COMMAND} -E env CUBIST_CACHE_DIR=${WORK_DIR}/cache
          ${WORK_DIR}/examples/cubist_example_moe_engine ${MANIFEST}
          --experts 4 --tokens-per-expert 8 --n 256 --k 256
  RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _err)
if(_rc EQUAL 0)
  message(STATUS "example ran on a GPU:\n${_out}")
elseif(_rc EQUAL 1 AND _err MATCHES "no driver|no GPU")
  message(STATUS "example ran without a GPU: ${_err}")
else()
  message(FATAL_ERROR "example failed (${_rc}):\n${_out}\n${_err}")
endif()
