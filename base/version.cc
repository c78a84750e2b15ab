#include "base/version.h"

namespace cubist {

// CUBIST_VERSION is defined for this file only (base/CMakeLists.txt), so that a new
// version recompiles one file.
const char* Version() { return CUBIST_VERSION; }

}  // namespace cubist
