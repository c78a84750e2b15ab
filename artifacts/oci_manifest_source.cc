#include "artifacts/oci_manifest_source.h"

#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <cerrno>
#include <cstring>

#include <nlohmann/json.hpp>

#include "absl/base/thread_annotations.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "artifacts/oci_client.h"
#include "artifacts/staging.h"
#include "base/file_util.h"
#include "base/sha256.h"
#include "base/status_macros.h"
#include "base/strings.h"

namespace cubist {
namespace {

constexpr uint64_t kMaxImageManifest = uint64_t{16} << 20;

struct Layer {
  std::string sha256;  // hex
  uint64_t size = 0;
};

// The cubist layers of an image manifest: the manifest blob and the optional
// signature blob. InvalidArgument when this is not a cubist artifact set.
absl::Status FindCubistLayers(const std::string& body, const std::string& where,
                              Layer* manifest, std::optional<Layer>* signature) {
  nlohmann::json j = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": the image manifest is not JSON"));
  }
  std::string artifact_type = j.value("artifactType", "");
  std::string config_type;
  if (j.contains("config") && j["config"].is_object()) {
    config_type = j["config"].value("mediaType", "");
  }
  if (artifact_type != kOciArtifactType && config_type != kOciArtifactType) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": not a cubist artifact set (artifactType '", artifact_type,
        "', config mediaType '", config_type, "'; expected ", kOciArtifactType,
        "); publish sets with 'cubist push'"));
  }
  if (!j.contains("layers") || !j["layers"].is_array()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": the image manifest has no layers"));
  }
  bool found = false;
  for (size_t i = 0; i < j["layers"].size(); ++i) {
    const nlohmann::json& l = j["layers"][i];
    if (!l.is_object()) continue;
    std::string type = l.value("mediaType", "");
    if (type != kOciManifestLayerType && type != kOciSignatureLayerType) continue;
    std::string digest = l.value("digest", "");
    if (!absl::StartsWith(digest, "sha256:") || !IsSha256Hex(digest.substr(7)) ||
        !l.contains("size") || !l["size"].is_number_unsigned()) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": layers[", i, "]: a sha256 digest and a size are required"));
    }
    Layer layer{digest.substr(7), l["size"].get<uint64_t>()};
    if (type == kOciManifestLayerType) {
      if (found) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, ": layers[", i, "]: a second layer of type ", kOciManifestLayerType));
      }
      found = true;
      *manifest = layer;
    } else {
      *signature = layer;
    }
  }
  if (!found) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": no layer of type ", kOciManifestLayerType, " (the cubist manifest)"));
  }
  return absl::OkStatus();
}

// Reads a small blob whole and checks it against its descriptor.
absl::StatusOr<std::string> ReadBlob(RegistryClient& client, const Layer& layer,
                                     std::string_view what, const std::string& where,
                                     uint64_t max_bytes) {
  if (layer.size > max_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": ", Sv(what), " is ", layer.size, " bytes, over the limit of ", max_bytes));
  }
  CUBIST_ASSIGN_OR_RETURN(HttpResponse r,
                          client.Send("GET", absl::StrCat("blobs/sha256:", layer.sha256), {}, {},
                                      max_bytes + 1));
  if (r.status != 200) return RegistryError(r, absl::StrCat(where, ": read ", Sv(what)));
  std::string got = Sha256Hex(r.body);
  if (r.body.size() != layer.size || got != layer.sha256) {
    return absl::DataLossError(absl::StrCat(
        where, ": ", Sv(what), " blob mismatch: expected sha256 ", layer.sha256, " (",
        layer.size, " bytes), got ", got, " (", r.body.size(),
        " bytes); the registry's storage is corrupt or a proxy altered it; nothing was "
        "used; report it to the registry's operator"));
  }
  return std::move(r.body);
}

// A directory made in `parent`, removed with its contents when the result goes out of
// scope.
absl::StatusOr<RemoveOnExit> MakeScratchDir(const std::string& parent) {
  CUBIST_RETURN_IF_ERROR(MakeDirs(parent));
  std::string tmpl = parent + "/.staging-XXXXXX";
  if (::mkdtemp(tmpl.data()) == nullptr) {
    return absl::InternalError(
        absl::StrCat("create a directory in ", parent, ": ", std::strerror(errno)));
  }
  return RemoveOnExit(std::move(tmpl));
}

std::string OciCopyDir(const Store& store, const OciReference& ref) {
  return absl::StrCat(store.ManifestsDir(), "/by-oci/", Sha256Hex(ref.ToString()));
}

// With --offline, the set is the copy of its cubist manifest a fetch left in the cache.
absl::StatusOr<OpenedManifest> OpenOfflineCopy(const OciReference& ref,
                                               const OpenManifestOptions& options) {
  const std::string where = ref.ToString();
  if (options.store == nullptr) {
    return absl::NotFoundError(absl::StrCat(
        where, ": --offline and the manifest is in a registry, but there is no cache to "
        "read a copy from"));
  }
  std::string copy = OciCopyDir(*options.store, ref) + "/manifest.json";
  if (::access(copy.c_str(), F_OK) != 0) {
    return absl::NotFoundError(absl::StrCat(
        where, ": --offline, and the cache holds no copy of this artifact set; fetch it "
        "once with the network, or copy a cache that has it"));
  }
  CUBIST_ASSIGN_OR_RETURN(OpenedManifest opened, OpenUrlOrPathManifest(copy, options));
  opened.manifest.source = where;
  opened.from_offline_copy = true;
  return opened;
}

// The image manifest the reference names, and its digest ("sha256:<hex>"), which must
// be the pinned one when the reference pins one.
struct ImageManifest {
  std::string body;
  std::string digest;
};

absl::StatusOr<ImageManifest> ReadImageManifest(RegistryClient& client, const OciReference& ref,
                                                const OpenManifestOptions& options) {
  const std::string where = ref.ToString();
  CUBIST_ASSIGN_OR_RETURN(
      HttpResponse r,
      client.Send("GET", absl::StrCat("manifests/", ref.ManifestRef()),
                  {absl::StrCat("Accept: ", kOciImageManifestType)}, {}, kMaxImageManifest,
                  options.attempts));
  if (r.status == 404) {
    return absl::NotFoundError(absl::StrCat(
        where, ": the registry has no such ", ref.digest.empty() ? "tag" : "manifest",
        " (HTTP 404); check the name, or publish it with 'cubist push'"));
  }
  if (r.status != 200) return RegistryError(r, absl::StrCat("read ", where));
  std::string digest = absl::StrCat("sha256:", Sha256Hex(r.body));
  if (!ref.digest.empty() && digest != ref.digest) {
    return absl::DataLossError(absl::StrCat(
        where, ": the registry served an image manifest whose digest is ", digest,
        ", not the pinned ", ref.digest, "; refused: the registry or a proxy in between "
        "serves other content than was pinned"));
  }
  return ImageManifest{std::move(r.body), std::move(digest)};
}

// The cubist manifest's bytes and its signature's, read from the blobs the image
// manifest names and checked against their descriptors.
struct SetBlobs {
  std::string bytes;
  std::optional<std::string> signature;
};

absl::StatusOr<SetBlobs> ReadSetBlobs(RegistryClient& client, const std::string& image,
                                      const std::string& where,
                                      const OpenManifestOptions& options) {
  Layer mlayer;
  std::optional<Layer> slayer;
  CUBIST_RETURN_IF_ERROR(FindCubistLayers(image, where, &mlayer, &slayer));
  SetBlobs out;
  CUBIST_ASSIGN_OR_RETURN(out.bytes, ReadBlob(client, mlayer, "the cubist manifest", where,
                                              options.max_bytes));
  if (slayer.has_value()) {
    CUBIST_ASSIGN_OR_RETURN(out.signature, ReadBlob(client, *slayer, "the manifest's signature",
                                                    where, 64 << 10));
  }
  return out;
}

// Writes the blobs as manifest.json (and manifest.json.sig) in a scratch directory made
// in `copy_dir` (the cache's copy of the set, so that a rename makes them the copy) or,
// without a cache, in TMPDIR.
absl::StatusOr<RemoveOnExit> StageSetFiles(const std::string& copy_dir, const SetBlobs& blobs) {
  std::string parent = copy_dir;
  if (parent.empty()) {
    const char* tmp = std::getenv("TMPDIR");
    parent = tmp != nullptr && *tmp ? tmp : "/tmp";
  }
  CUBIST_ASSIGN_OR_RETURN(RemoveOnExit scratch, MakeScratchDir(parent));
  const std::string staged = scratch.path() + "/manifest.json";
  CUBIST_RETURN_IF_ERROR(WriteFileAtomically(staged, blobs.bytes));
  if (blobs.signature.has_value()) {
    CUBIST_RETURN_IF_ERROR(WriteFileAtomically(staged + ".sig", *blobs.signature));
  }
  return scratch;
}

// Makes the staged files the cache's copy of the set in `copy_dir`, with the image
// manifest's digest beside them; a moved tag is noted in *notices.
void KeepOfflineCopy(const std::string& copy_dir, const std::string& staged, bool signed_set,
                     const std::string& digest, const OciReference& ref,
                     std::vector<std::string>* notices) {
  std::string digest_file = copy_dir + "/digest";
  auto previous = ReadFileToString(digest_file, 1024);
  if (previous.ok() && !previous->empty() && *previous != digest && ref.digest.empty()) {
    notices->push_back(absl::StrCat(
        ref.ToString(), ": the tag moved from ", *previous, " to ", digest,
        " since the last fetch into this cache"));
  }
  // Best effort, as for URL manifests: the offline copy must not fail a good fetch.
  std::string final_manifest = copy_dir + "/manifest.json";
  if (signed_set) {
    (void)std::rename((staged + ".sig").c_str(), (final_manifest + ".sig").c_str());
  } else {
    ::unlink((final_manifest + ".sig").c_str());
  }
  (void)std::rename(staged.c_str(), final_manifest.c_str());
  (void)WriteFileAtomically(digest_file, digest);
}

}  // namespace

absl::StatusOr<OpenedManifest> OpenOciManifest(std::string_view location,
                                               const OpenManifestOptions& options) {
  CUBIST_ASSIGN_OR_RETURN(OciReference ref, ParseOciReference(location));
  if (options.offline) return OpenOfflineCopy(ref, options);
  const std::string where = ref.ToString();
  CUBIST_ASSIGN_OR_RETURN(RegistryCredentials creds, LookUpRegistryCredentials(ref.host));
  auto auth = std::make_shared<RegistryAuth>(ref, std::move(creds),
                                             absl::StrCat("repository:", ref.repository, ":pull"));
  RegistryClient client(auth, options.timeout);
  CUBIST_ASSIGN_OR_RETURN(ImageManifest image, ReadImageManifest(client, ref, options));
  CUBIST_ASSIGN_OR_RETURN(SetBlobs blobs, ReadSetBlobs(client, image.body, where, options));

  // Hand the verified bytes to OpenUrlOrPathManifest as files, so that every check is
  // the one every manifest gets. In the cache, the files then become the offline copy.
  const std::string copy_dir = options.store != nullptr ? OciCopyDir(*options.store, ref) : "";
  CUBIST_ASSIGN_OR_RETURN(RemoveOnExit scratch, StageSetFiles(copy_dir, blobs));
  const std::string staged = scratch.path() + "/manifest.json";
  CUBIST_ASSIGN_OR_RETURN(OpenedManifest opened, OpenUrlOrPathManifest(staged, options));
  opened.manifest.source = where;
  if (options.store != nullptr && options.record_version) {
    KeepOfflineCopy(copy_dir, staged, blobs.signature.has_value(), image.digest, ref,
                 &opened.notices);
  }
  return opened;
}

std::vector<std::string> OciBlobBases(const OciReference& ref,
                                      const std::vector<std::string>& mirrors) {
  std::vector<std::string> out;
  for (const std::string& m : mirrors) out.push_back(MirrorRepositoryUrl(m, ref) + "blobs/");
  out.push_back(ref.RepositoryUrl() + "blobs/");
  return out;
}

namespace {

class OciAuthorizer {
 public:
  explicit OciAuthorizer(OciReference ref) : ref_(std::move(ref)) {}
  std::string HeaderFor(std::string_view url) {
    if (!absl::StartsWith(Sv(url), ref_.RepositoryUrl())) return "";
    absl::MutexLock lock(&mu_);
    if (auth_ == nullptr) {
      auto creds = LookUpRegistryCredentials(ref_.host);
      auth_ = std::make_shared<RegistryAuth>(
          ref_, creds.ok() ? *creds : RegistryCredentials{},
          absl::StrCat("repository:", ref_.repository, ":pull"));
      RegistryClient client(auth_, absl::Seconds(60));
      (void)client.Ping();  // failures surface as the blobs' own 401s
    }
    return auth_->HeaderFor(url);
  }

 private:
  const OciReference ref_;
  absl::Mutex mu_;
  std::shared_ptr<RegistryAuth> auth_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

std::function<std::string(std::string_view url)> MakeOciAuthorizer(const OciReference& ref) {
  auto a = std::make_shared<OciAuthorizer>(ref);
  return [a](std::string_view url) { return a->HeaderFor(url); };
}

}  // namespace cubist
