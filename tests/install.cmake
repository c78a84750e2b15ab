# install_package: installs this build into a fresh prefix and builds and runs
# examples/ from there as a separate CMake project with find_package(cubist), the way
# an engine consumes the package. tests/install_package/check.cmake has the checks.
add_test(NAME install_package
  COMMAND ${CMAKE_COMMAND}
    -DBUILD_DIR=${PROJECT_BINARY_DIR}
    -DSOURCE_DIR=${PROJECT_SOURCE_DIR}
    -DWORK_DIR=${PROJECT_BINARY_DIR}/install_package_test
    -DGENERATOR=${CMAKE_GENERATOR}
    -DCXX_COMPILER=${CMAKE_CXX_COMPILER}
    -DSANITIZE=${CUBIST_SANITIZE}
    -DMANIFEST=${PROJECT_SOURCE_DIR}/examples/prebuilt/manifest.json
    -P ${CMAKE_CURRENT_SOURCE_DIR}/install_package/check.cmake)
set_tests_properties(install_package PROPERTIES TIMEOUT 600)
