// cubist doctor: what this machine offers cubist. The driver (loaded at run time; its
// version), each device (name, SM, memory), and the cache (where, chosen by which rule,
// whether it is usable, what it holds). Makes no network calls and never writes. Without
// a driver or a GPU it says so on "no driver: ..." / "no GPU: ..." lines and still exits 0:
// that is a fact about the machine, not a failure of the command.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>
#include <system_error>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/str_format.h"
#include "artifacts/cache_dir.h"
#include "cli/command.h"
#include "cli/exit_codes.h"
#include "loader/context.h"
#include "loader/driver_api.h"

namespace cubist::cli {
namespace {

namespace fs = std::filesystem;

struct DoctorFlags {
  std::string cache;
  bool json = false;
};

struct DeviceReport {
  int ordinal = 0;
  std::string name;
  std::string sm;
  size_t total_bytes = 0;
  int multiprocessors = 0;
  std::string pci_bus_id;
  std::string error;  // set when a query failed
};

struct DriverReport {
  bool loaded = false;
  int version = 0;            // cuDriverGetVersion: 13000 for CUDA 13.0
  bool library_api = false;   // cuLibraryLoadData available
  std::string error;          // "no driver: ..." or "no GPU: ..."
  std::vector<DeviceReport> devices;
};

struct CacheReport {
  std::string root;
  std::string origin;
  std::string state;  // "ok", "missing", "not writable", "not a directory", "unresolved"
  std::string detail;
  uint64_t objects = 0;
  uint64_t object_bytes = 0;
  uint64_t partial_files = 0;  // tmp/ leftovers from interrupted downloads
  uint64_t partial_bytes = 0;
};

DriverReport ProbeDriver() {
  DriverReport r;
  absl::StatusOr<DriverApi*> loaded = LoadDriver();
  if (!loaded.ok()) {
    r.error = std::string(loaded.status().message());
    return r;
  }
  DriverApi& d = **loaded;
  r.loaded = true;
  r.library_api = d.HasLibraryApi();
  (void)d.DriverGetVersion(&r.version);
  absl::StatusOr<DriverApi*> ready = GetDriver();
  if (!ready.ok()) {
    r.error = std::string(ready.status().message());
    return r;
  }
  int count = 0;
  if (absl::Status s = CuCheck(d, d.DeviceGetCount(&count), "cuDeviceGetCount"); !s.ok()) {
    r.error = absl::StrFormat("no GPU: %s", s.message());
    return r;
  }
  for (int i = 0; i < count; ++i) {
    DeviceReport dev;
    dev.ordinal = i;
    CUdevice handle = 0;
    if (absl::Status s = CuCheck(d, d.DeviceGet(&handle, i), "cuDeviceGet"); !s.ok()) {
      dev.error = std::string(s.message());
      r.devices.push_back(dev);
      continue;
    }
    char name[256] = {};
    if (d.DeviceGetName(name, sizeof(name), handle) == CUDA_SUCCESS) dev.name = name;
    absl::StatusOr<DeviceSm> sm = GetDeviceSm(d, handle);
    dev.sm = sm.ok() ? sm->ToString() : "?";
    if (!sm.ok()) dev.error = std::string(sm.status().message());
    (void)d.DeviceTotalMem(&dev.total_bytes, handle);
    (void)d.DeviceGetAttribute(&dev.multiprocessors, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
                               handle);
    char bus[64] = {};
    if (d.DeviceGetPCIBusId(bus, sizeof(bus), handle) == CUDA_SUCCESS) dev.pci_bus_id = bus;
    r.devices.push_back(dev);
  }
  if (count == 0) r.error = "no GPU: the driver sees no device; check CUDA_VISIBLE_DEVICES";
  return r;
}

CacheReport ProbeCache(const std::string& flag) {
  CacheReport c;
  absl::StatusOr<std::string> root = ResolveCacheDir(flag);
  if (!root.ok()) {
    c.state = "unresolved";
    c.detail = std::string(root.status().message());
    return c;
  }
  c.root = *root;
  c.origin = CacheDirOrigin(flag);
  std::error_code ec;
  fs::file_status st = fs::status(c.root, ec);
  if (!fs::exists(st)) {
    c.state = "missing";
    c.detail = "created by the first 'cubist fetch'";
    return c;
  }
  if (!fs::is_directory(st)) {
    c.state = "not a directory";
    c.detail = "remove it or point --cache / CUBIST_CACHE_DIR elsewhere";
    return c;
  }
  if (::access(c.root.c_str(), W_OK | X_OK) != 0) {
    c.state = "not writable";
    c.detail = "fetch cannot store here; use --cache or CUBIST_CACHE_DIR to pick a writable "
               "directory (reading and verifying still work)";
  } else {
    c.state = "ok";
  }
  // Counting is read-only and tolerant: a file vanishing mid-walk (gc) is not an error.
  auto walk = [&](const fs::path& dir, uint64_t* files, uint64_t* bytes) {
    fs::recursive_directory_iterator it(dir, fs::directory_options::skip_permission_denied, ec);
    for (; !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
      std::error_code e2;
      if (it->is_regular_file(e2)) {
        ++*files;
        uint64_t size = it->file_size(e2);
        if (!e2) *bytes += size;
      }
    }
    ec.clear();
  };
  if (fs::exists(fs::path(c.root) / "objects", ec)) {
    walk(fs::path(c.root) / "objects", &c.objects, &c.object_bytes);
  }
  if (fs::exists(fs::path(c.root) / "tmp", ec)) {
    walk(fs::path(c.root) / "tmp", &c.partial_files, &c.partial_bytes);
  }
  return c;
}

std::string Gib(size_t bytes) { return absl::StrFormat("%.1f GiB", bytes / double(1ull << 30)); }

int RunDoctor(const DoctorFlags& f) {
  DriverReport drv = ProbeDriver();
  CacheReport cache = ProbeCache(f.cache);
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  const char* lazy = std::getenv("CUDA_MODULE_LOADING");
  if (f.json) {
    nlohmann::json devices = nlohmann::json::array();
    for (const DeviceReport& d : drv.devices) {
      nlohmann::json j = {{"ordinal", d.ordinal},
                          {"name", d.name},
                          {"sm", d.sm},
                          {"total_bytes", d.total_bytes},
                          {"multiprocessors", d.multiprocessors},
                          {"pci_bus_id", d.pci_bus_id}};
      if (!d.error.empty()) j["error"] = d.error;
      devices.push_back(std::move(j));
    }
    nlohmann::json out = {
        {"driver",
         {{"loaded", drv.loaded},
          {"version", drv.loaded ? nlohmann::json(drv.version) : nlohmann::json(nullptr)},
          {"library_api", drv.library_api},
          {"error", drv.error.empty() ? nlohmann::json(nullptr) : nlohmann::json(drv.error)}}},
        {"devices", std::move(devices)},
        {"environment",
         {{"CUDA_VISIBLE_DEVICES", visible ? nlohmann::json(visible) : nlohmann::json(nullptr)},
          {"CUDA_MODULE_LOADING", lazy ? nlohmann::json(lazy) : nlohmann::json(nullptr)}}},
        {"cache",
         {{"root", cache.root},
          {"origin", cache.origin},
          {"state", cache.state},
          {"detail", cache.detail},
          {"objects", cache.objects},
          {"object_bytes", cache.object_bytes},
          {"partial_files", cache.partial_files},
          {"partial_bytes", cache.partial_bytes}}}};
    std::cout << out.dump(2) << "\n";
    return kExitOk;
  }
  if (drv.loaded) {
    std::printf("driver: CUDA %d.%d (cuDriverGetVersion %d), library API %s\n",
                drv.version / 1000, (drv.version % 1000) / 10, drv.version,
                drv.library_api ? "yes (cuLibraryLoadData)" : "no (cuModuleLoadData only)");
  }
  if (!drv.error.empty()) std::printf("%s\n", drv.error.c_str());
  if (drv.loaded && drv.error.empty()) {
    std::printf("devices: %zu\n", drv.devices.size());
    for (const DeviceReport& d : drv.devices) {
      std::printf("  %d: %s, %s, %s, %d SMs%s%s%s\n", d.ordinal, d.name.c_str(), d.sm.c_str(),
                  Gib(d.total_bytes).c_str(), d.multiprocessors,
                  d.pci_bus_id.empty() ? "" : ", PCI ", d.pci_bus_id.c_str(),
                  d.error.empty() ? "" : ("; " + d.error).c_str());
    }
  } else {
    std::printf("devices: none usable; inspect, verify, fetch, list and select work without "
                "one\n");
  }
  if (visible != nullptr) std::printf("CUDA_VISIBLE_DEVICES=%s\n", visible);
  if (lazy != nullptr) std::printf("CUDA_MODULE_LOADING=%s\n", lazy);
  if (cache.state == "unresolved") {
    std::printf("cache: unresolved: %s\n", cache.detail.c_str());
  } else {
    std::printf("cache: %s (from %s): %s%s%s\n", cache.root.c_str(), cache.origin.c_str(),
                cache.state.c_str(), cache.detail.empty() ? "" : "; ", cache.detail.c_str());
    if (cache.state == "ok" || cache.state == "not writable") {
      std::printf("  %llu object(s), %s; %llu partial download(s) in tmp/ (%s)\n",
                  static_cast<unsigned long long>(cache.objects),
                  Gib(cache.object_bytes).c_str(),
                  static_cast<unsigned long long>(cache.partial_files),
                  Gib(cache.partial_bytes).c_str());
    }
  }
  return kExitOk;
}

}  // namespace

void RegisterDoctor(CLI::App& app, Globals& g) {
  auto f = std::make_shared<DoctorFlags>();
  CLI::App* cmd = app.add_subcommand(
      "doctor", "Report the driver, the devices and the cache; works (and exits 0) without a GPU");
  cmd->add_option("--cache", f->cache, "Cache directory (default: $CUBIST_CACHE_DIR, "
                                       "$XDG_CACHE_HOME/cubist, ~/.cache/cubist)")
      ->type_name("DIR");
  cmd->add_flag("--json", f->json, "Print JSON");
  cmd->callback([f, &g] { g.exit_code = RunDoctor(*f); });
}

}  // namespace cubist::cli
