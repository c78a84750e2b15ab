// Where an artifact can be fetched from: the mirrors the user named (--mirror), then
// the manifest's base_urls, then the directory the manifest itself came from. Each
// base is an http(s):// or file:// URL or a local directory path.
#ifndef CUBIST_ARTIFACTS_SOURCES_H_
#define CUBIST_ARTIFACTS_SOURCES_H_

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"

namespace cubist {

struct Manifest;

// True for http://, https:// and file:// locations.
bool IsUrl(std::string_view location);
bool IsNetworkUrl(std::string_view location);  // http:// or https://

// The directory part of a manifest location, as a base for relative artifact paths:
// "https://h/a/manifest.json" -> "https://h/a/", "/srv/repo/manifest.json" ->
// "file:///srv/repo/".
std::string LocationBase(std::string_view manifest_location);

// Turns a local directory path into a file:// URL base ending in '/'; URLs are returned
// with a trailing '/' added when missing.
std::string NormalizeBase(std::string_view base);

// base + the artifact's path with each segment percent-encoded (RFC 3986 unreserved
// characters kept).
std::string JoinUrl(std::string_view base, std::string_view relative_path);

// For a file:// URL: the local file it names must be a regular file (or not exist: the
// read then reports it missing). A FIFO would block the reader forever, a directory or
// device is no artifact: InvalidArgument naming the path. Other URLs: OK.
[[nodiscard]] absl::Status CheckFileUrlIsRegular(std::string_view url);

// A manifest read over the network (http(s)://, oci://) names only http(s) sources in
// base_urls: it must not make cubist read local files. InvalidArgument naming the entry;
// the user's own --mirror file://... is not the manifest's, and stays allowed.
[[nodiscard]] absl::Status CheckRemoteManifestSources(const Manifest& manifest,
                                                      std::string_view location);

// The ordered, de-duplicated list of bases for a manifest.
std::vector<std::string> ArtifactBases(const Manifest& manifest,
                                       const std::vector<std::string>& mirrors);

}  // namespace cubist

#endif  // CUBIST_ARTIFACTS_SOURCES_H_
