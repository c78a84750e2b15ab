# Adjustments for the sanitizer builds of scripts/test-sanitizers (CUBIST_SANITIZE set).
#
# thread: link tests/tsan_absl_mutex.cc (ThreadSanitizer annotations for Debian's
# uninstrumented absl::Mutex; the file says why) into every executable that links cubist,
# the `cubist` command included, so that processes the tests start are checked the same
# way.
if(CUBIST_SANITIZE MATCHES "thread")
  add_library(cubist_tsan_absl_mutex OBJECT ${CMAKE_CURRENT_SOURCE_DIR}/tsan_absl_mutex.cc)
  target_link_libraries(cubist_tsan_absl_mutex PRIVATE absl::synchronization)
  target_link_libraries(cubist INTERFACE
    $<BUILD_INTERFACE:$<TARGET_OBJECTS:cubist_tsan_absl_mutex>> $<BUILD_INTERFACE:${CMAKE_DL_LIBS}>)
  add_dependencies(cubist cubist_tsan_absl_mutex)
endif()

# undefined (clang): -fsanitize=function checks that a function called through a pointer
# has the C++ type of the pointer. The real libcuda is C and carries no such type, so the
# check can only ever fire on the test stand-in, whose entry points are declared with
# plain ints instead of the CUDA enums; it would test the fake's spelling, not cubist.
if(CUBIST_SANITIZE MATCHES "undefined" AND CMAKE_CXX_COMPILER_ID MATCHES "Clang"
   AND TARGET cubist_fake_libcuda)
  target_compile_options(cubist_fake_libcuda PRIVATE -fno-sanitize=function)
endif()
