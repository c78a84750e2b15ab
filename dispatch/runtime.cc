#include "dispatch/runtime.h"

#include <algorithm>
#include <set>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "artifacts/cache_dir.h"
#include "artifacts/fetcher.h"
#include "artifacts/manifest_source.h"
#include "base/status_macros.h"
#include "base/strings.h"

namespace cubist {
namespace {

// What the device says about itself: its name, the driver's version, and the SM count
// and shared memory per SM the cost model needs (a table's defaults for its SM where
// the driver does not say).
struct DeviceFacts {
  std::string name;
  int driver_version = 0;
  DeviceInfo info;
};

absl::StatusOr<DeviceFacts> QueryDevice(DriverApi& d, const PrimaryContext& context) {
  DeviceFacts out;
  char name[256] = {};
  CUBIST_RETURN_IF_ERROR(CuCheck(d, d.DeviceGetName(name, sizeof(name) - 1, context.device()),
                                 "cuDeviceGetName"));
  out.name = name;
  CUBIST_RETURN_IF_ERROR(
      CuCheck(d, d.DriverGetVersion(&out.driver_version), "cuDriverGetVersion"));
  out.info = DeviceInfo::ForSm(context.sm());
  int sms = 0;
  CUBIST_RETURN_IF_ERROR(CuCheck(
      d, d.DeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, context.device()),
      "cuDeviceGetAttribute(MULTIPROCESSOR_COUNT)"));
  if (sms > 0) out.info.sm_count = sms;
  int smem_per_sm = 0;
  if (d.DeviceGetAttribute(&smem_per_sm,
                           CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR,
                           context.device()) == CUDA_SUCCESS &&
      smem_per_sm > 0) {
    out.info.shared_mem_per_sm = smem_per_sm;
  }
  return out;
}

// Registers every kernel the device `sm` can run with `modules`, each image once: cheap
// (no file read, no driver call), and it turns each later lookup into an index. Returns
// the function per registry index, invalid for kernels that do not run on `sm`.
absl::StatusOr<std::vector<FunctionId>> RegisterKernels(const Registry& reg,
                                                        const Manifest& manifest,
                                                        const Store& store, DeviceSm sm,
                                                        bool skip_load_hash,
                                                        ModuleCache& modules) {
  std::vector<FunctionId> functions(reg.size(), FunctionId{});
  absl::flat_hash_map<std::string, ImageId> images;
  for (const KernelEntry& k : reg.kernels()) {
    if (!SassRunsOn(k.arch, sm)) continue;
    const Artifact* a = manifest.FindArtifact(k.spec.artifact);
    ImageId image;
    if (auto it = images.find(a->path); it != images.end()) {
      image = it->second;
    } else {
      ImageOptions io;
      io.expected_sha256 = a->sha256;  // hashed as read to load: see skip_load_hash
      io.skip_hash_check = skip_load_hash;
      CUBIST_ASSIGN_OR_RETURN(image, modules.AddImageFile(store.ObjectPath(a->sha256), io));
      images.emplace(a->path, image);
    }
    CUBIST_ASSIGN_OR_RETURN(functions[k.index],
                            modules.AddFunction(image, k.spec.function,
                                                k.spec.shared_mem_bytes));
  }
  return functions;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Runtime>> Runtime::Open(const RuntimeOptions& options) {
  std::unique_ptr<Runtime> rt(new Runtime());
  rt->options_ = options;
  CUBIST_ASSIGN_OR_RETURN(std::string root, ResolveCacheDir(options.cache_dir));
  CUBIST_ASSIGN_OR_RETURN(Store store, Store::Open(root, /*create=*/true));
  rt->store_.emplace(std::move(store));

  OpenManifestOptions mo;
  mo.offline = options.offline;
  mo.trust = options.trust;
  mo.store = &*rt->store_;
  CUBIST_ASSIGN_OR_RETURN(OpenedManifest opened, OpenManifest(options.manifest, mo));
  rt->manifest_ = std::move(opened.manifest);
  CUBIST_ASSIGN_OR_RETURN(rt->lease_, RootLease::Take(*rt->store_, rt->manifest_, opened.bytes));
  CUBIST_ASSIGN_OR_RETURN(Registry registry, Registry::Create(rt->manifest_));
  rt->registry_.emplace(std::move(registry));

  if (options.driver != nullptr) {
    rt->driver_ = options.driver;
  } else {
    CUBIST_ASSIGN_OR_RETURN(rt->driver_, GetDriver());
  }
  DriverApi& d = *rt->driver_;
  CUBIST_ASSIGN_OR_RETURN(rt->context_, PrimaryContext::Retain(d, options.device));
  CUBIST_ASSIGN_OR_RETURN(rt->modules_, ModuleCache::Create(d, rt->context_.get()));

  CUBIST_ASSIGN_OR_RETURN(DeviceFacts device, QueryDevice(d, rt->context_));
  rt->device_name_ = std::move(device.name);
  rt->driver_version_ = device.driver_version;
  rt->device_info_ = device.info;
  CUBIST_ASSIGN_OR_RETURN(rt->functions_,
                          RegisterKernels(*rt->registry_, rt->manifest_, *rt->store_, rt->sm(),
                                          options.skip_load_hash, *rt->modules_));

  if (options.tuning_file != "none") {
    rt->tuning_path_ = options.tuning_file.empty() ? DefaultTuningPath(root)
                                                   : options.tuning_file;
  }
  CUBIST_RETURN_IF_ERROR(rt->ReloadTuning());
  if (options.prefetch || options.preload) CUBIST_RETURN_IF_ERROR(rt->Prefetch());
  if (options.preload) CUBIST_RETURN_IF_ERROR(rt->Preload());
  return rt;
}

Runtime::~Runtime() {
  // The module cache unloads its images with the context current; it must go first.
  modules_.reset();
}

TuningContext Runtime::tuning_context() const {
  return TuningContext{device_name_, driver_version_, manifest_.digest};
}

absl::Status Runtime::FetchArtifacts(const std::vector<std::string>& paths) {
  std::set<std::string> wanted(paths.begin(), paths.end());
  std::vector<FetchItem> items;
  for (FetchItem& item : PlanFetch(manifest_, options_.mirrors, {})) {
    if (wanted.count(item.artifact.path) &&
        store_->Probe(item.artifact.sha256, item.artifact.size) != ObjectState::kPresent) {
      items.push_back(std::move(item));
    }
  }
  if (items.empty()) return absl::OkStatus();
  FetchOptions fo;
  fo.offline = options_.offline;
  FetchReport report = ::cubist::FetchArtifacts(*store_, items, fo);
  return Annotate(report.status, absl::StrCat("fetch kernels of ", manifest_.source));
}

absl::Status Runtime::Prefetch() {
  std::vector<std::string> paths;
  for (const KernelEntry& k : registry_->kernels()) {
    if (functions_[k.index].valid()) paths.push_back(k.spec.artifact);
  }
  return FetchArtifacts(paths);
}

absl::Status Runtime::Preload() {
  CUBIST_RETURN_IF_ERROR(Prefetch());
  std::vector<FunctionId> ids;
  for (const FunctionId& id : functions_) {
    if (id.valid()) ids.push_back(id);
  }
  return LoadFailed(modules_->Preload(ids));
}

absl::Status Runtime::LoadFailed(const absl::Status& status) const {
  if (status.code() != absl::StatusCode::kDataLoss) return status;
  // The loader's message names the object's path, which holds its hash.
  for (const Artifact& a : manifest_.artifacts) {
    if (status.message().find(a.sha256) == std::string_view::npos) continue;
    absl::Status removed = store_->Remove(a.sha256);
    return absl::DataLossError(absl::StrCat(
        "kernel artifact ", a.path, " of ", manifest_.source, ": ", status.message(), "; ",
        removed.ok() ? "removed from the cache: the next fetch (or this call again, "
                       "online) downloads it again"
                     : absl::StrCat("could not remove it (", removed.message(),
                                    "): run 'cubist verify --deep'")));
  }
  return status;
}

absl::StatusOr<CUfunction> Runtime::Function(const KernelEntry& kernel) {
  if (kernel.index >= functions_.size() || !functions_[kernel.index].valid()) {
    return absl::FailedPreconditionError(
        absl::StrCat("kernel ", kernel.name(), " (", kernel.spec.arch,
                     ") does not run on this SM ", sm().number(), " device (", device_name_,
                     "); select a kernel built for it"));
  }
  const Artifact* a = manifest_.FindArtifact(kernel.spec.artifact);
  if (store_->Probe(a->sha256, a->size) != ObjectState::kPresent) {
    // Fetched on first need when Open did not prefetch. Another thread or process
    // fetching the same object waits on its lock and then finds it present.
    CUBIST_RETURN_IF_ERROR(FetchArtifacts({a->path}));
  }
  absl::StatusOr<CUfunction> fn = modules_->GetFunction(functions_[kernel.index]);
  if (!fn.ok()) return LoadFailed(fn.status());
  return fn;
}

std::shared_ptr<const TuningTable> Runtime::tuning() const {
  absl::MutexLock lock(&mu_);
  return tuning_;
}

absl::Status Runtime::ReloadTuning() {
  auto table = std::make_shared<TuningTable>();
  if (!tuning_path_.empty()) {
    CUBIST_ASSIGN_OR_RETURN(*table, LoadTuningFile(tuning_path_, tuning_context()));
  }
  absl::MutexLock lock(&mu_);
  tuning_ = std::move(table);
  return absl::OkStatus();
}

}  // namespace cubist
