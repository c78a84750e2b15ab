// Names of artifact sets stored in OCI registries:
//   oci://HOST[:PORT]/REPO[:TAG]          (tag "latest" when none is given)
//   oci://HOST[:PORT]/REPO@sha256:DIGEST  (pinned: the whole set named by one digest)
//   oci://HOST[:PORT]/REPO:TAG@sha256:DIGEST (the tag is informative; the digest wins)
// REPO is one or more lowercase path components as the distribution spec allows.
//
// Registries on loopback (localhost, 127.0.0.0/8, [::1]) are spoken to over plain
// HTTP, as docker and ORAS do, unless listed in CUBIST_REGISTRY_HTTPS (comma-separated
// HOST[:PORT]) for a TLS front on the node itself; every other host over HTTPS, unless
// it is listed in CUBIST_REGISTRY_PLAIN_HTTP (the same form) for a site registry
// without TLS.
#ifndef CUBIST_ARTIFACTS_OCI_REFERENCE_H_
#define CUBIST_ARTIFACTS_OCI_REFERENCE_H_

#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace cubist {

// The artifactType of a cubist set and the media types of its layers. Registries and
// tools (oras discover, Harbor's UI) show the artifactType; the layers' titles let
// `oras pull` recreate the directory the set was published from.
inline constexpr char kOciArtifactType[] = "application/vnd.cubist.artifact-set.v1";
inline constexpr char kOciManifestLayerType[] = "application/vnd.cubist.manifest.v1+json";
inline constexpr char kOciSignatureLayerType[] = "application/vnd.cubist.manifest.signature.v1";
inline constexpr char kOciArtifactLayerType[] = "application/vnd.cubist.artifact.v1";
inline constexpr char kOciImageManifestType[] = "application/vnd.oci.image.manifest.v1+json";
// The empty JSON object "{}" that ORAS uses as config for non-image artifacts.
inline constexpr char kOciEmptyConfigType[] = "application/vnd.oci.empty.v1+json";
inline constexpr char kOciEmptyConfigSha256[] =
    "44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a";
inline constexpr char kOciTitleAnnotation[] = "org.opencontainers.image.title";

struct OciReference {
  std::string host;        // "registry.example:5000" (with the port when given)
  std::string repository;  // "team/cubins"
  std::string tag;         // "v3"; "latest" when neither tag nor digest was given
  std::string digest;      // "sha256:<64 hex>" when pinned, else ""
  bool plain_http = false;

  // "http(s)://HOST/v2/REPO/" - the base of every request about this repository.
  std::string RepositoryUrl() const;
  // The tag, or the digest when pinned: what /manifests/ is asked for.
  std::string ManifestRef() const { return digest.empty() ? tag : digest; }
  // The canonical oci:// form.
  std::string ToString() const;
};

// True when `location` starts with "oci://" (case-insensitive).
bool IsOciReference(std::string_view location);

// Parses an oci:// reference. InvalidArgument naming the bad part.
[[nodiscard]] absl::StatusOr<OciReference> ParseOciReference(std::string_view location);

// "http(s)://HOST/v2/REPO/" for a mirror given as a registry base URL
// ("http://mirror:5000" or "http://mirror:5000/"): a registry mirror or pull-through
// cache serves the same repository paths as the origin.
std::string MirrorRepositoryUrl(std::string_view mirror_base, const OciReference& ref);

}  // namespace cubist

#endif  // CUBIST_ARTIFACTS_OCI_REFERENCE_H_
