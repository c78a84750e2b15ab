#include "artifacts/oci_push.h"

#include <fcntl.h>
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <memory>
#include <set>
#include <thread>

#include <nlohmann/json.hpp>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "artifacts/oci_client.h"
#include "base/sha256.h"
#include "base/status_macros.h"
#include "base/strings.h"
#include "base/unique_fd.h"

namespace cubist {
namespace {

// One blob to upload: bytes in memory (the manifest, the signature, the empty
// config) or a file on disk (an artifact).
struct Blob {
  std::string sha256;  // hex
  uint64_t size = 0;
  std::string data;    // when path is empty
  std::string path;    // the artifact's file
  std::string what;    // for messages: the artifact path or "the manifest"
};

nlohmann::json Descriptor(std::string_view media_type, std::string_view sha256, uint64_t size) {
  return {{"mediaType", std::string(media_type)},
          {"digest", absl::StrCat("sha256:", Sv(sha256))},
          {"size", size}};
}

std::string WithQuery(const std::string& location, std::string_view query) {
  return absl::StrCat(location, location.find('?') == std::string::npos ? "?" : "&", Sv(query));
}

class Uploader {
 public:
  Uploader(std::shared_ptr<RegistryAuth> auth, const PushOptions& options)
      : client_(std::move(auth)), options_(options) {}

  RegistryClient& client() { return client_; }

  // HEAD, then upload when missing. *uploaded says which happened.
  absl::Status Push(const Blob& b, bool* uploaded) {
    *uploaded = false;
    std::string digest = absl::StrCat("sha256:", b.sha256);
    CUBIST_ASSIGN_OR_RETURN(HttpResponse head, client_.Send("HEAD", "blobs/" + digest));
    if (head.status == 200) return absl::OkStatus();
    if (head.status != 404) return RegistryError(head, absl::StrCat("HEAD blob of ", b.what));
    UniqueFd fd;
    if (!b.path.empty()) {
      fd.Reset(::open(b.path.c_str(), O_RDONLY | O_CLOEXEC));
      if (!fd.valid()) return ErrnoToStatus(errno, absl::StrCat("push ", b.what, ": open ", b.path));
    }
    auto body = [&](uint64_t off, uint64_t len) {
      HttpBody hb;
      if (fd.valid()) {
        hb.fd = fd.get();
        hb.offset = off;
        hb.length = len;
      } else {
        hb.data = std::string_view(b.data).substr(off, len);
      }
      return hb;
    };
    absl::Status st = absl::OkStatus();
    if (b.size <= options_.monolithic_max) {
      CUBIST_ASSIGN_OR_RETURN(std::string location, StartUpload(b));
      CUBIST_ASSIGN_OR_RETURN(
          HttpResponse put,
          client_.Send("PUT", WithQuery(location, "digest=" + digest),
                       {"Content-Type: application/octet-stream"}, body(0, b.size)));
      if (put.status == 201) {
        *uploaded = true;
        return absl::OkStatus();
      }
      if (put.status != 413) return UploadError(put, b);
      // Too large for one request (a proxy's body limit): the same blob in chunks.
    }
    CUBIST_ASSIGN_OR_RETURN(std::string location, StartUpload(b));
    uint64_t chunk = std::max<uint64_t>(options_.chunk_size, min_chunk_);
    for (uint64_t off = 0; off < b.size; off += chunk) {
      uint64_t len = std::min(chunk, b.size - off);
      CUBIST_ASSIGN_OR_RETURN(
          HttpResponse patch,
          client_.Send("PATCH", location,
                       {"Content-Type: application/octet-stream",
                        absl::StrCat("Content-Range: ", off, "-", off + len - 1)},
                       body(off, len)));
      if (patch.status != 202) return UploadError(patch, b);
      std::string next = patch.Header("location");
      if (!next.empty()) location = next;
    }
    CUBIST_ASSIGN_OR_RETURN(HttpResponse put,
                            client_.Send("PUT", WithQuery(location, "digest=" + digest),
                                         {"Content-Type: application/octet-stream"}, body(0, 0)));
    if (put.status != 201) return UploadError(put, b);
    *uploaded = true;
    return absl::OkStatus();
  }

 private:
  absl::StatusOr<std::string> StartUpload(const Blob& b) {
    CUBIST_ASSIGN_OR_RETURN(HttpResponse post, client_.Send("POST", "blobs/uploads/"));
    if (post.status != 202) {
      return RegistryError(post, absl::StrCat("start the upload of ", b.what));
    }
    std::string location = post.Header("location");
    if (location.empty()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "start the upload of ", b.what, ": the registry answered 202 without a Location"));
    }
    uint64_t min_chunk = 0;
    if (absl::SimpleAtoi(post.Header("oci-chunk-min-length"), &min_chunk)) min_chunk_ = min_chunk;
    return location;
  }

  static absl::Status UploadError(const HttpResponse& r, const Blob& b) {
    if (r.status == 400 && absl::StrContains(r.body, "DIGEST_INVALID")) {
      return absl::DataLossError(absl::StrCat(
          "push ", b.what, ": the registry computed another sha256 than the manifest's ",
          b.sha256, "; the file changed after the manifest was built: rebuild the "
          "manifest (cubist manifest build) or restore the file"));
    }
    return RegistryError(r, absl::StrCat("upload ", b.what));
  }

  RegistryClient client_;
  const PushOptions& options_;
  uint64_t min_chunk_ = 0;
};

}  // namespace

std::string BuildOciImageManifest(const PushSource& source, const std::vector<uint64_t>& sizes) {
  nlohmann::json layers = nlohmann::json::array();
  nlohmann::json mlayer = Descriptor(kOciManifestLayerType, Sha256Hex(source.manifest_bytes),
                                     source.manifest_bytes.size());
  mlayer["annotations"] = {{kOciTitleAnnotation, "manifest.json"}};
  layers.push_back(std::move(mlayer));
  if (source.signature.has_value()) {
    nlohmann::json slayer = Descriptor(kOciSignatureLayerType, Sha256Hex(*source.signature),
                                       source.signature->size());
    slayer["annotations"] = {{kOciTitleAnnotation, "manifest.json.sig"}};
    layers.push_back(std::move(slayer));
  }
  const std::vector<Artifact>& arts = source.manifest.artifacts;
  for (size_t i = 0; i < arts.size(); ++i) {
    nlohmann::json l = Descriptor(kOciArtifactLayerType, arts[i].sha256, sizes[i]);
    l["annotations"] = {{kOciTitleAnnotation, arts[i].path}};
    layers.push_back(std::move(l));
  }
  nlohmann::json config = Descriptor(kOciEmptyConfigType, kOciEmptyConfigSha256, 2);
  config["data"] = "e30=";  // "{}" inline, as ORAS writes it
  nlohmann::json m = {{"schemaVersion", 2},
                      {"mediaType", kOciImageManifestType},
                      {"artifactType", kOciArtifactType},
                      {"config", std::move(config)},
                      {"layers", std::move(layers)}};
  if (!source.manifest.name.empty()) {
    m["annotations"] = {{"org.cubist.manifest.name", source.manifest.name},
                        {"org.cubist.manifest.version", std::to_string(source.manifest.version)}};
  }
  return m.dump();
}

namespace {

// An artifact's bytes on disk: the file beside the manifest, else the cache's object.
struct ArtifactFile {
  std::string path;
  uint64_t size = 0;
};

absl::StatusOr<ArtifactFile> LocateArtifact(const PushSource& source, const Artifact& a) {
  std::string path =
      source.artifact_dir.empty() ? "" : absl::StrCat(source.artifact_dir, "/", a.path);
  struct stat st;
  const bool beside = !path.empty() && ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
  bool cached = false;
  if (!beside && source.cache != nullptr) {
    // Verified when it was published; one written since is hashed again first.
    absl::StatusOr<ObjectState> state = source.cache->ProbeConfirmed(a.sha256, a.size);
    if (!state.ok()) return Annotate(state.status(), absl::StrCat("push ", a.path));
    cached = *state == ObjectState::kPresent &&
             ::stat(source.cache->ObjectPath(a.sha256).c_str(), &st) == 0;
  }
  if (cached) {
    path = source.cache->ObjectPath(a.sha256);
  } else if (!beside) {
    return absl::NotFoundError(absl::StrCat(
        "push ", a.path, ": ", path.empty() ? "" : absl::StrCat("no file at ", path, ", and "),
        source.cache == nullptr ? "no cache to take it from"
                                : absl::StrCat("not in the cache at ", source.cache->root()),
        "; push reads the artifacts beside the manifest, as 'manifest build' wrote it, or "
        "from the cache a 'cubist fetch' of the set filled"));
  }
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (a.size.has_value() && *a.size != size) {
    return absl::DataLossError(absl::StrCat(
        "push ", a.path, ": the file has ", size, " bytes, the manifest says ", *a.size,
        "; rebuild the manifest (cubist manifest build) or restore the file"));
  }
  return ArtifactFile{std::move(path), size};
}

// What a push uploads: every blob, each digest once, and the artifacts' sizes (for the
// image manifest).
struct PushPlan {
  std::vector<Blob> blobs;
  std::vector<uint64_t> sizes;  // per artifact, in the manifest's order
};

// Artifact sizes come from the files (checksums.txt manifests declare none; a declared
// size that differs is refused here, before any byte is sent).
absl::StatusOr<PushPlan> PlanPush(const PushSource& source) {
  PushPlan plan;
  std::set<std::string> seen;
  auto add = [&](Blob b) {
    if (seen.insert(b.sha256).second) plan.blobs.push_back(std::move(b));
  };
  add(Blob{kOciEmptyConfigSha256, 2, "{}", "", "the empty config"});
  add(Blob{Sha256Hex(source.manifest_bytes), source.manifest_bytes.size(),
           source.manifest_bytes, "", "the cubist manifest"});
  if (source.signature.has_value()) {
    add(Blob{Sha256Hex(*source.signature), source.signature->size(), *source.signature, "",
             "the manifest's signature"});
  }
  for (const Artifact& a : source.manifest.artifacts) {
    CUBIST_ASSIGN_OR_RETURN(ArtifactFile file, LocateArtifact(source, a));
    plan.sizes.push_back(file.size);
    add(Blob{a.sha256, file.size, "", std::move(file.path), a.path});
  }
  return plan;
}

// Uploads the blobs that the registry lacks on up to options.jobs threads, each blob
// once; the first failure stops the others from starting another.
absl::Status UploadBlobs(const std::shared_ptr<RegistryAuth>& auth,
                         const std::vector<Blob>& blobs, const PushOptions& options,
                         PushReport* report) {
  std::atomic<size_t> next{0};
  std::atomic<int> uploaded{0}, present{0};
  std::atomic<uint64_t> bytes{0};
  absl::Mutex mu;
  absl::Status first_error;
  std::atomic<bool> failed{false};
  int threads = std::clamp<int>(options.jobs, 1, 64);
  threads = std::min<int>(threads, static_cast<int>(blobs.size()));
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&] {
      Uploader up(auth, options);
      for (;;) {
        if (failed.load()) return;
        size_t i = next.fetch_add(1);
        if (i >= blobs.size()) return;
        bool did = false;
        absl::Status st = up.Push(blobs[i], &did);
        if (!st.ok()) {
          absl::MutexLock lock(&mu);
          if (first_error.ok()) first_error = Annotate(st, absl::StrCat("push ", blobs[i].what));
          failed = true;
          return;
        }
        if (did) {
          uploaded++;
          bytes += blobs[i].size;
        } else {
          present++;
        }
      }
    });
  }
  for (std::thread& t : pool) t.join();
  report->blobs_uploaded = uploaded.load();
  report->blobs_present = present.load();
  report->bytes_uploaded = bytes.load();
  if (!first_error.ok()) {
    return Annotate(first_error,
                    absl::StrCat(report->blobs_uploaded, " blobs uploaded before the failure; "
                                 "run the same push again to finish"));
  }
  return absl::OkStatus();
}

// PUTs the image manifest under the tag; its digest into report->digest, checked
// against the one the registry says it stored.
absl::Status PutImageManifest(const std::shared_ptr<RegistryAuth>& auth,
                              const OciReference& ref, const std::string& image,
                              PushReport* report) {
  RegistryClient client(auth);
  CUBIST_ASSIGN_OR_RETURN(
      HttpResponse put,
      client.Send("PUT", absl::StrCat("manifests/", ref.tag),
                  {absl::StrCat("Content-Type: ", kOciImageManifestType)}, HttpBody{image}));
  if (put.status != 201) {
    return RegistryError(put, absl::StrCat("push the image manifest to ", ref.ToString()));
  }
  report->digest = absl::StrCat("sha256:", Sha256Hex(image));
  std::string answered = put.Header("docker-content-digest");
  if (!answered.empty() && answered != report->digest) {
    return absl::DataLossError(absl::StrCat(
        "push to ", ref.ToString(), ": the registry stored the image manifest as ", answered,
        " but its bytes hash to ", report->digest, "; a proxy in between rewrote it"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<PushReport> PushArtifactSet(const OciReference& ref, const PushSource& source,
                                           const PushOptions& options) {
  absl::Time start = absl::Now();
  if (!ref.digest.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "push to ", ref.ToString(), ": a push names a tag, not a digest (the digest is the "
        "result); use oci://", ref.host, "/", ref.repository, ":TAG"));
  }
  CUBIST_ASSIGN_OR_RETURN(PushPlan plan, PlanPush(source));

  CUBIST_ASSIGN_OR_RETURN(RegistryCredentials creds, LookUpRegistryCredentials(ref.host));
  auto auth = std::make_shared<RegistryAuth>(
      ref, std::move(creds), absl::StrCat("repository:", ref.repository, ":pull,push"));
  // Learn the authentication once, before the workers start.
  {
    RegistryClient ping(auth);
    CUBIST_RETURN_IF_ERROR(Annotate(ping.Ping(), absl::StrCat("push to ", ref.ToString())));
  }

  PushReport report;
  CUBIST_RETURN_IF_ERROR(UploadBlobs(auth, plan.blobs, options, &report));
  // The image manifest last: a registry refuses one that names a blob it lacks.
  CUBIST_RETURN_IF_ERROR(
      PutImageManifest(auth, ref, BuildOciImageManifest(source, plan.sizes), &report));
  report.elapsed = absl::Now() - start;
  return report;
}

}  // namespace cubist
