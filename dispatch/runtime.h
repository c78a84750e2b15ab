// The engine's entry point: one artifact set on one GPU.
//
//   RuntimeOptions o;
//   o.manifest = "https://kernels.example/moe/manifest.json";
//   o.preload = true;                       // before CUDA-graph capture
//   CUBIST_ASSIGN_OR_RETURN(std::unique_ptr<Runtime> rt, Runtime::Open(o));
//   CUBIST_ASSIGN_OR_RETURN(std::unique_ptr<MoeGemm> gemm, MoeGemm::Create(*rt));
//
// Open() reads and checks the manifest through the store's rules (signature, expiry,
// rollback: artifacts/manifest_source.h), builds the registry (dispatch/registry.h),
// retains the device's primary context (the one cudart and PyTorch use), and registers
// every kernel whose arch runs on the device with a per-context module cache
// (loader/module_cache.h). With `prefetch` it fetches those kernels' artifacts into the
// content-addressed store at once (one download per node however many ranks start);
// otherwise an artifact is fetched when a problem first needs it. With `preload` it also
// loads every such kernel, so nothing touches the disk or the module loader later.
//
// For as long as it lives, the Runtime holds a root in use on its manifest
// (artifacts/keep.h): `cubist gc` never takes the kernels of a serving engine, even
// those it has not fetched or loaded yet.
//
// Errors from Open: the manifest's (NotFound, Unavailable, InvalidArgument,
// PermissionDenied, FailedPrecondition), FailedPrecondition without a driver or GPU
// ("no driver: ...", "no GPU: ..."), DataLoss or Unavailable from prefetching, and the
// loader's from preloading.
//
// Thread safety: every method may be called from any thread at once. The Runtime must
// outlive the ops created from it.
#ifndef CUBIST_DISPATCH_RUNTIME_H_
#define CUBIST_DISPATCH_RUNTIME_H_

#include <cuda.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "artifacts/keep.h"
#include "artifacts/store.h"
#include "dispatch/cost_model.h"
#include "dispatch/registry.h"
#include "dispatch/tuning_file.h"
#include "loader/context.h"
#include "loader/driver_api.h"
#include "loader/module_cache.h"
#include "manifest/manifest.h"
#include "manifest/trust.h"

namespace cubist {

struct RuntimeOptions {
  std::string manifest;   // URL (http, https, file) or local path
  std::string cache_dir;  // empty: $CUBIST_CACHE_DIR, $XDG_CACHE_HOME/cubist, ~/.cache/cubist
  int device = 0;         // CUDA device ordinal
  bool offline = false;   // no network: the manifest and artifacts must be cached
  std::vector<std::string> mirrors;  // tried before the manifest's base_urls
  TrustPolicy trust;
  bool prefetch = true;   // fetch this device's artifacts during Open
  bool preload = false;   // load this device's kernels during Open
  // Tuning results (tuning_file.h). Empty: <cache dir>/tuning.json. "none": not used.
  std::string tuning_file;
  // The driver table; null: the real driver (loader/driver_api.h GetDriver()).
  DriverApi* driver = nullptr;
  // Each cubin's bytes are hashed as they are read to load, and a mismatch is refused
  // (DataLoss naming the artifact; the object is removed so that a fetch repairs it):
  // anything that changed an object after it was verified (a write through an exported
  // hard link, a disk fault) never reaches the driver. About 0.1 ms for a 200 KB cubin
  // (docs/benchmarks.md). true skips that hash; for those who measured that it matters.
  bool skip_load_hash = false;
};

class Runtime {
 public:
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<Runtime>> Open(
      const RuntimeOptions& options);
  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  const Manifest& manifest() const { return manifest_; }
  const Registry& registry() const { return *registry_; }
  const Store& store() const { return *store_; }
  DriverApi& driver() const { return *driver_; }
  ModuleCache& modules() const { return *modules_; }
  CUcontext context() const { return context_.get(); }
  DeviceSm sm() const { return context_.sm(); }
  // The cost model's view of this device (its real SM count).
  const DeviceInfo& device_info() const { return device_info_; }
  const std::string& device_name() const { return device_name_; }
  int driver_version() const { return driver_version_; }
  // What tuning records made on this runtime are keyed by.
  TuningContext tuning_context() const;
  const std::string& tuning_path() const { return tuning_path_; }  // "" when disabled

  // Makes this runtime's context current on the calling thread. Launches need it (any
  // thread that used cudart or PyTorch on this device already has it).
  [[nodiscard]] absl::Status MakeCurrent() const { return context_.MakeCurrent(); }

  // Fetches the artifacts of every kernel that runs on this device (Open does this
  // when `prefetch` is set). Errors: the fetch report's status.
  [[nodiscard]] absl::Status Prefetch();
  // Fetches and loads every kernel that runs on this device.
  [[nodiscard]] absl::Status Preload();

  // The launchable function of a registry kernel: fetches its artifact if needed, loads
  // its image once, resolves it once. The slow path of selection; a repeated call costs
  // one module-cache lookup. Errors: FailedPrecondition for a kernel that does not run
  // on this device, the fetcher's and the loader's.
  [[nodiscard]] absl::StatusOr<CUfunction> Function(const KernelEntry& kernel);

  // The tuning table as last loaded (empty when disabled); Reload after RecordTuning.
  std::shared_ptr<const TuningTable> tuning() const;
  [[nodiscard]] absl::Status ReloadTuning();

 private:
  Runtime() = default;
  [[nodiscard]] absl::Status FetchArtifacts(const std::vector<std::string>& paths);
  // A load that failed: when its bytes did not hash to the artifact's name (DataLoss),
  // removes the object so that the next fetch repairs it and names the artifact.
  absl::Status LoadFailed(const absl::Status& status) const;

  RuntimeOptions options_;
  Manifest manifest_;
  std::optional<Registry> registry_;  // set by Open
  std::optional<Store> store_;        // set by Open
  RootLease lease_;                   // keeps the manifest's objects from gc; set by Open
  DriverApi* driver_ = nullptr;
  PrimaryContext context_;
  std::unique_ptr<ModuleCache> modules_;  // destroyed before context_
  DeviceInfo device_info_;
  std::string device_name_;
  int driver_version_ = 0;
  std::string tuning_path_;
  // Per registry index: the function registered with modules_, or invalid when the
  // kernel does not run on this device.
  std::vector<FunctionId> functions_;

  mutable absl::Mutex mu_;
  std::shared_ptr<const TuningTable> tuning_ ABSL_GUARDED_BY(mu_);
};

}  // namespace cubist

#endif  // CUBIST_DISPATCH_RUNTIME_H_
