# libFuzzer targets: every tests/fuzz/<name>_fuzz.cc defines LLVMFuzzerTestOneInput and
# has a committed seed corpus in tests/fuzz/corpus/<name>/.
#
# CUBIST_BUILD_FUZZERS=ON (clang only; scripts/test-sanitizers configures it with
# ASan+UBSan): each target becomes the libFuzzer binary <name>_fuzz, and the ctest
# "fuzz.<name>" (label "fuzz") fuzzes it for CUBIST_FUZZ_SECONDS. New inputs go to a
# scratch corpus in the build tree, never into the committed one; a crash leaves its
# input in <build>/tests/fuzz-work/<name>/artifacts/ and fails the test.
#
# Otherwise (every ordinary build, gcc included): each target is linked with
# tests/fuzz_replay_main.cc into <name>_fuzz_replay, and the ctest "fuzz_replay.<name>"
# runs every committed corpus file through it once: a cheap regression test that the
# ASan and TSan builds of the suite also run.
file(GLOB _cubist_fuzz_srcs CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/fuzz/*_fuzz.cc)
set(CUBIST_FUZZ_SECONDS 60 CACHE STRING "Seconds each fuzz.<name> test fuzzes for")

if(CUBIST_BUILD_FUZZERS)
  if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    message(FATAL_ERROR "CUBIST_BUILD_FUZZERS needs clang (libFuzzer): configure with "
                        "CC=clang CXX=clang++, as scripts/test-sanitizers fuzz does")
  endif()
  # Coverage instrumentation for the code under test; the fuzzer binaries add the driver.
  target_compile_options(cubist PRIVATE -fsanitize=fuzzer-no-link)
endif()

foreach(_src ${_cubist_fuzz_srcs})
  get_filename_component(_fname ${_src} NAME_WE)  # manifest_fuzz
  string(REGEX REPLACE "_fuzz$" "" _name ${_fname})  # manifest
  set(_corpus ${CMAKE_CURRENT_SOURCE_DIR}/fuzz/corpus/${_name})
  if(CUBIST_BUILD_FUZZERS)
    add_executable(${_fname} ${_src})
    target_compile_options(${_fname} PRIVATE -fsanitize=fuzzer)
    target_link_options(${_fname} PRIVATE -fsanitize=fuzzer)
    target_link_libraries(${_fname} PRIVATE cubist::cubist nlohmann_json::nlohmann_json)
    set(_work ${CMAKE_CURRENT_BINARY_DIR}/fuzz-work/${_name})
    file(MAKE_DIRECTORY ${_work}/corpus ${_work}/artifacts)
    set(_dirs ${_work}/corpus)
    if(EXISTS ${_corpus})
      list(APPEND _dirs ${_corpus})
    endif()
    add_test(NAME fuzz.${_name}
             COMMAND ${_fname} -max_total_time=${CUBIST_FUZZ_SECONDS} -timeout=10
                     -rss_limit_mb=2048 -malloc_limit_mb=2048 -print_final_stats=1
                     -artifact_prefix=${_work}/artifacts/ ${_dirs})
    math(EXPR _limit "${CUBIST_FUZZ_SECONDS} + 120")
    set_tests_properties(fuzz.${_name} PROPERTIES LABELS fuzz TIMEOUT ${_limit})
  elseif(NOT EXISTS ${_corpus})
    message(WARNING "cubist: ${_src} has no corpus in ${_corpus}; not replayed")
  else()
    add_executable(${_fname}_replay ${_src} ${CMAKE_CURRENT_SOURCE_DIR}/fuzz_replay_main.cc)
    target_link_libraries(${_fname}_replay PRIVATE cubist::cubist nlohmann_json::nlohmann_json)
    add_test(NAME fuzz_replay.${_name} COMMAND ${_fname}_replay ${_corpus})
    set_tests_properties(fuzz_replay.${_name} PROPERTIES LABELS fuzz_replay TIMEOUT 300)
  endif()
endforeach()
