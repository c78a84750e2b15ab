// Artifact sets in OCI registries, on the fetch side: `--manifest oci://HOST/REPO:TAG`
// or `oci://HOST/REPO@sha256:DIGEST` everywhere a manifest location is accepted.
//
// Opening one reads the image manifest (checking its digest when pinned: a mismatch is
// DataLoss and nothing is used), then the cubist manifest and signature blobs (each
// checked against its descriptor's digest and size), and hands them as files to
// OpenUrlOrPathManifest (manifest_source.h): signature, schema, expiry and rollback are
// checked by exactly the code that checks every other manifest. The verified copy stays
// in the cache (manifests/by-oci/<sha256 of the reference>/), which is what --offline
// reads, with the digest the tag named; a tag that names another digest than at the
// last fetch is reported in OpenedManifest::notices.
//
// The artifacts are blobs of the same repository, fetched by the ordinary fetcher from
// "<registry>/v2/REPO/blobs/sha256:<hex>" (PlanFetch does this for a manifest whose
// source is oci://); a --mirror is then a registry mirror or pull-through cache that
// serves the same paths, tried before the registry.
#ifndef CUBIST_ARTIFACTS_OCI_MANIFEST_SOURCE_H_
#define CUBIST_ARTIFACTS_OCI_MANIFEST_SOURCE_H_

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "artifacts/manifest_source.h"
#include "artifacts/oci_reference.h"

namespace cubist {

// OpenManifest for an oci:// location (open_manifest.cc calls this). Errors as
// OpenManifest's, plus DataLoss (pinned digest or blob mismatch), PermissionDenied
// (registry login), InvalidArgument (not a cubist artifact set).
[[nodiscard]] absl::StatusOr<OpenedManifest> OpenOciManifest(std::string_view location,
                                                             const OpenManifestOptions& options);

// "<repository URL>/blobs/" for each mirror (as a registry base), then the registry.
std::vector<std::string> OciBlobBases(const OciReference& ref,
                                      const std::vector<std::string>& mirrors);

// The Authorization header the fetcher sends with blob requests to `ref`'s registry
// (none to mirrors). The login happens at the first call, from whichever fetch thread
// makes it, so a fetch whose artifacts are all cached never touches the network.
// Thread-safe. A login that fails yields no header, and the registry's 401 then fails
// the artifacts with the registry's answer.
std::function<std::string(std::string_view url)> MakeOciAuthorizer(const OciReference& ref);

}  // namespace cubist

#endif  // CUBIST_ARTIFACTS_OCI_MANIFEST_SOURCE_H_
