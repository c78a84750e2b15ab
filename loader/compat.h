// Can this image run on that device? Decided from the bytes alone, before any driver
// call, so that an incompatible image is an error that names both SMs rather than a
// driver failure ("no kernel image is available") or a crash.
//
// Rules (CUDA binary compatibility):
//   SASS sm_XY       runs on a device of the same major with minor >= Y.
//   SASS sm_XYa      runs only on exactly sm_XY.
//   SASS sm_XYf      runs on its family: the same major with minor >= Y.
//   PTX compute_XY   is JIT-compiled for any device >= XY (major.minor ordering);
//   PTX compute_XYa  only for exactly XY; compute_XYf for its family.
// A fatbin is compatible when at least one of its images is.
//
// Thread safety: pure functions.
#ifndef CUBIST_LOADER_COMPAT_H_
#define CUBIST_LOADER_COMPAT_H_

#include "absl/status/status.h"
#include "loader/cubin.h"

namespace cubist {

// A device's compute capability (CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR/MINOR).
struct DeviceSm {
  int major = 0;
  int minor = 0;
  int number() const { return major * 10 + minor; }
  std::string ToString() const;  // "sm_90"
  bool operator==(const DeviceSm&) const = default;
};

// True when SASS compiled for `image` runs on `device`.
bool SassRunsOn(const SmTarget& image, DeviceSm device);
// True when PTX for `image` (compute_XY[a|f]) can be JIT-compiled for `device`.
bool PtxRunsOn(const SmTarget& image, DeviceSm device);

// OK when some image in `info` runs on `device`. Otherwise FailedPrecondition naming
// both, e.g. "cubin for sm_80 cannot run on this sm_90 device: SASS runs only on
// devices of the same major version (sm_8x); use a cubin built for sm_90 or sm_90a".
// `what` prefixes the message (an artifact path or kernel name); may be empty.
[[nodiscard]] absl::Status CheckCompatible(const CubinInfo& info, DeviceSm device,
                                           std::string_view what = {});

// The image of `info` the driver would pick for `device`: the compatible SASS with the
// highest SM (an exact `a` match first), else compatible PTX; nullptr when none.
const ImageInfo* BestImageFor(const CubinInfo& info, DeviceSm device);

}  // namespace cubist

#endif  // CUBIST_LOADER_COMPAT_H_
