// OpenManifest (declared in manifest_source.h): the one place that knows both kinds of
// manifest source, so that neither calls the other's entry point. The OCI source opens
// what it fetched through OpenUrlOrPathManifest; the URL-or-path source knows nothing
// of registries.
#include "artifacts/manifest_source.h"
#include "artifacts/oci_manifest_source.h"
#include "artifacts/oci_reference.h"

namespace cubist {

absl::StatusOr<OpenedManifest> OpenManifest(std::string_view location,
                                            const OpenManifestOptions& options) {
  if (IsOciReference(location)) return OpenOciManifest(location, options);
  return OpenUrlOrPathManifest(location, options);
}

}  // namespace cubist
