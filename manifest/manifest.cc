#include "manifest/manifest.h"

namespace cubist {

const Artifact* Manifest::FindArtifact(std::string_view path) const {
  for (const Artifact& a : artifacts) {
    if (a.path == path) return &a;
  }
  return nullptr;
}

const KernelSpec* Manifest::FindKernel(std::string_view name) const {
  for (const KernelSpec& k : kernels) {
    if (k.name == name) return &k;
  }
  return nullptr;
}

bool SameContent(const Manifest& a, const Manifest& b) {
  return a.schema == b.schema && a.name == b.name && a.version == b.version &&
         a.expires == b.expires && a.base_urls == b.base_urls && a.artifacts == b.artifacts &&
         a.kernels == b.kernels && a.extras == b.extras;
}

}  // namespace cubist
