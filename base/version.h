// The version of cubist, from the one place that states it: project(VERSION) in the
// top-level CMakeLists.txt. The CLI's --version, the HTTP user agent and the installed
// package's cubistConfigVersion.cmake all read it from there.
#ifndef CUBIST_BASE_VERSION_H_
#define CUBIST_BASE_VERSION_H_

namespace cubist {

// "MAJOR.MINOR.PATCH", such as "1.2.3".
const char* Version();

}  // namespace cubist

#endif  // CUBIST_BASE_VERSION_H_
