#include "loader/compat.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/strings.h"

namespace cubist {

std::string DeviceSm::ToString() const { return absl::StrCat("sm_", number()); }

bool SassRunsOn(const SmTarget& image, DeviceSm device) {
  switch (image.variant) {
    case SmTarget::Variant::kArch:
      return image.major == device.major && image.minor == device.minor;
    case SmTarget::Variant::kFamily:
    case SmTarget::Variant::kPlain:
      // The family of sm_100f is sm_100 and sm_103 (and sm_120f: sm_120, sm_121): the
      // same major with a minor at least as high, which is also the plain SASS rule.
      return image.major == device.major && device.minor >= image.minor;
  }
  return false;
}

bool PtxRunsOn(const SmTarget& image, DeviceSm device) {
  switch (image.variant) {
    case SmTarget::Variant::kArch:
      return image.major == device.major && image.minor == device.minor;
    case SmTarget::Variant::kFamily:
      return image.major == device.major && device.minor >= image.minor;
    case SmTarget::Variant::kPlain:
      return device.number() >= image.number();
  }
  return false;
}

namespace {

bool ImageRunsOn(const ImageInfo& image, DeviceSm device) {
  switch (image.kind) {
    case ImageInfo::Kind::kCubin: return SassRunsOn(image.sm, device);
    case ImageInfo::Kind::kPtx: return PtxRunsOn(image.sm, device);
    case ImageInfo::Kind::kOther: return false;
  }
  return false;
}

std::string Why(const ImageInfo& image, DeviceSm device) {
  if (image.kind == ImageInfo::Kind::kPtx) {
    if (image.sm.variant == SmTarget::Variant::kArch) {
      return absl::StrCat("arch-specific PTX compiles only for sm_", image.sm.number());
    }
    if (image.sm.variant == SmTarget::Variant::kFamily) {
      return absl::StrCat("family PTX compiles only for sm_", image.sm.major, "x devices with minor >= ",
                          image.sm.minor);
    }
    return absl::StrCat("PTX for compute_", image.sm.number(),
                        " needs a device of at least that SM");
  }
  if (image.sm.variant == SmTarget::Variant::kArch) {
    return absl::StrCat("an arch-specific (", image.sm.ToString(), ") cubin runs only on sm_",
                        image.sm.number(), " itself");
  }
  if (image.sm.major != device.major) {
    return absl::StrCat("SASS runs only on devices of the same major version (sm_",
                        image.sm.major, "x)");
  }
  return absl::StrCat("SASS for ", image.sm.ToString(),
                      " needs a device of the same major with minor >= ", image.sm.minor);
}

std::string Describe(const ImageInfo& image) {
  if (image.kind == ImageInfo::Kind::kPtx) {
    std::string s = image.sm.ToString();
    return absl::StrCat("PTX ", "compute_", s.substr(3));
  }
  if (image.kind == ImageInfo::Kind::kOther) return "non-SASS/PTX entry";
  return image.sm.ToString();
}

}  // namespace

absl::Status CheckCompatible(const CubinInfo& info, DeviceSm device, std::string_view what) {
  for (const ImageInfo& image : info.images) {
    if (ImageRunsOn(image, device)) return absl::OkStatus();
  }
  std::string prefix = what.empty() ? std::string() : absl::StrCat(Sv(what), ": ");
  if (info.images.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        prefix, "fatbin holds no image, so nothing can run on this ", device.ToString(),
        " device; rebuild it"));
  }
  if (info.container == CubinInfo::Container::kCubin) {
    const ImageInfo& image = info.images.front();
    return absl::FailedPreconditionError(absl::StrCat(
        prefix, "cubin for ", image.sm.ToString(), " cannot run on this ",
        device.ToString(), " device: ", Why(image, device), "; use a cubin built for ",
        device.ToString(), " (or ", device.ToString(), "a)"));
  }
  std::vector<std::string> has;
  for (const ImageInfo& image : info.images) has.push_back(Describe(image));
  return absl::FailedPreconditionError(absl::StrCat(
      prefix, "fatbin has no image for this ", device.ToString(), " device (it holds ",
      absl::StrJoin(has, ", "), "): ", Why(info.images.front(), device),
      "; rebuild it with -gencode arch=compute_", device.number(), ",code=",
      device.ToString()));
}

const ImageInfo* BestImageFor(const CubinInfo& info, DeviceSm device) {
  const ImageInfo* best = nullptr;
  auto rank = [&](const ImageInfo& i) {
    // SASS beats PTX; an exact `a` match beats family and plain; higher SM beats lower.
    int r = i.kind == ImageInfo::Kind::kCubin ? 1000 : 0;
    if (i.sm.variant == SmTarget::Variant::kArch) r += 500;
    return r + i.sm.number();
  };
  for (const ImageInfo& image : info.images) {
    if (!ImageRunsOn(image, device)) continue;
    if (best == nullptr || rank(image) > rank(*best)) best = &image;
  }
  return best;
}

}  // namespace cubist
