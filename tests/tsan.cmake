# CUBIST_SANITIZE=thread builds only: link tests/tsan_absl_mutex.cc (ThreadSanitizer
# annotations for Debian's uninstrumented absl::Mutex; the file says why) into every
# executable that links cubist, the `cubist` command included, so that processes the
# tests start are checked the same way.
if(CUBIST_SANITIZE MATCHES "thread")
  add_library(cubist_tsan_absl_mutex OBJECT ${CMAKE_CURRENT_SOURCE_DIR}/tsan_absl_mutex.cc)
  target_link_libraries(cubist_tsan_absl_mutex PRIVATE absl::synchronization)
  target_link_libraries(cubist INTERFACE
    $<BUILD_INTERFACE:$<TARGET_OBJECTS:cubist_tsan_absl_mutex>> $<BUILD_INTERFACE:${CMAKE_DL_LIBS}>)
  add_dependencies(cubist cubist_tsan_absl_mutex)
endif()
