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

}  // namespace cubist
