// cubist inspect FILE... [--json] [--sm SM]: what a cubin or fatbin holds, read from the
// bytes alone (no GPU, no driver): the SM and its variant, ELF header facts, each kernel's
// registers, launch bounds, parameter bytes and static shared memory, and whether PTX is
// embedded. With --sm it also says whether the file can run on that device.
#include <cstdio>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/str_format.h"
#include "cli/command.h"
#include "cli/exit_codes.h"
#include "loader/compat.h"
#include "loader/cubin.h"

namespace cubist::cli {
namespace {

struct InspectFlags {
  std::vector<std::string> files;
  bool json = false;
  std::string sm;  // "sm_90": also check compatibility
};

const char* KindName(ImageInfo::Kind k) {
  switch (k) {
    case ImageInfo::Kind::kCubin: return "cubin";
    case ImageInfo::Kind::kPtx: return "ptx";
    case ImageInfo::Kind::kOther: return "other";
  }
  return "other";
}

std::string TargetName(const ImageInfo& img) {
  if (img.kind == ImageInfo::Kind::kPtx) return "compute_" + img.sm.ToString().substr(3);
  return img.sm.ToString();
}

template <typename T>
nlohmann::json Opt(const std::optional<T>& v) {
  return v ? nlohmann::json(*v) : nlohmann::json(nullptr);
}

nlohmann::json ImageJson(const ImageInfo& img) {
  nlohmann::json j = {{"kind", KindName(img.kind)},
                      {"target", TargetName(img)},
                      {"sm", img.sm.number()},
                      {"variant", img.sm.variant == SmTarget::Variant::kArch     ? "a"
                                  : img.sm.variant == SmTarget::Variant::kFamily ? "f"
                                                                                 : ""},
                      {"compressed", img.compressed},
                      {"offset", img.offset},
                      {"size", img.size}};
  if (img.fatbin_kind != 0) {
    j["fatbin_kind"] = img.fatbin_kind;
    j["fatbin_flags"] = absl::StrFormat("0x%x", img.fatbin_flags);
  }
  if (img.kind == ImageInfo::Kind::kCubin && !img.compressed) {
    j["elf_class"] = img.elf_class;
    j["abi_version"] = img.abi_version;
    j["e_flags"] = absl::StrFormat("0x%08x", img.e_flags);
    j["virtual_sm"] = img.virtual_sm ? nlohmann::json(img.virtual_sm->ToString()) : nullptr;
    j["toolkit_version"] = Opt(img.toolkit_version);
    j["producer"] = img.producer;
    nlohmann::json kernels = nlohmann::json::array();
    for (const KernelInfo& k : img.kernels) {
      kernels.push_back({{"name", k.name},
                         {"registers", Opt(k.registers)},
                         {"max_threads", Opt(k.max_threads)},
                         {"required_threads", Opt(k.required_threads)},
                         {"param_bytes", Opt(k.param_bytes)},
                         {"param_count", Opt(k.param_count)},
                         {"frame_bytes", Opt(k.frame_bytes)},
                         {"static_shared_bytes", k.static_shared_bytes},
                         {"code_bytes", k.code_bytes}});
    }
    j["kernels"] = std::move(kernels);
  }
  return j;
}

template <typename T>
std::string Cell(const std::optional<T>& v) {
  return v ? absl::StrFormat("%d", *v) : "-";
}

void PrintImage(const ImageInfo& img, const std::string& indent) {
  if (img.kind != ImageInfo::Kind::kCubin || img.compressed) return;
  std::string toolkit =
      img.toolkit_version ? absl::StrFormat(", CUDA %d.%d", *img.toolkit_version / 10,
                                            *img.toolkit_version % 10)
                          : "";
  std::printf("%sELF%d, ABI version %d, e_flags 0x%08x%s%s%s\n", indent.c_str(),
              img.elf_class, img.abi_version, img.e_flags,
              img.virtual_sm ? (", from compute_" + img.virtual_sm->ToString().substr(3)).c_str()
                             : "",
              toolkit.c_str(), img.producer.empty() ? "" : (", " + img.producer).c_str());
  size_t width = 6;
  for (const KernelInfo& k : img.kernels) width = std::max(width, k.name.size());
  std::printf("%s%-*s %5s %11s %14s %11s %9s\n", indent.c_str(), static_cast<int>(width),
              "kernel", "regs", "max threads", "params (bytes)", "static smem", "code");
  for (const KernelInfo& k : img.kernels) {
    std::string params = absl::StrFormat("%s (%s)", Cell(k.param_count), Cell(k.param_bytes));
    std::printf("%s%-*s %5s %11s %14s %11d %9d\n", indent.c_str(), static_cast<int>(width),
                k.name.c_str(), Cell(k.registers).c_str(), Cell(k.max_threads).c_str(),
                params.c_str(), k.static_shared_bytes, k.code_bytes);
  }
  if (img.kernels.empty()) std::printf("%s(no kernels)\n", indent.c_str());
}

void PrintInfo(const std::string& path, const CubinInfo& info) {
  if (info.container == CubinInfo::Container::kCubin) {
    const ImageInfo& img = info.images.front();
    std::printf("%s: cubin for %s, %llu bytes\n", path.c_str(), img.sm.ToString().c_str(),
                static_cast<unsigned long long>(img.size));
    PrintImage(img, "  ");
    return;
  }
  std::printf("%s: fatbin, %zu image(s), PTX embedded: %s\n", path.c_str(), info.images.size(),
              info.HasPtx() ? "yes" : "no");
  for (size_t i = 0; i < info.images.size(); ++i) {
    const ImageInfo& img = info.images[i];
    std::printf("  [%zu] %s %s%s at offset %llu, %llu bytes\n", i, KindName(img.kind),
                TargetName(img).c_str(), img.compressed ? " (compressed)" : "",
                static_cast<unsigned long long>(img.offset),
                static_cast<unsigned long long>(img.size));
    PrintImage(img, "      ");
  }
}

int RunInspect(const InspectFlags& f) {
  std::optional<DeviceSm> device;
  if (!f.sm.empty()) {
    absl::StatusOr<SmTarget> sm = SmTarget::Parse(f.sm);
    if (!sm.ok() || sm->variant != SmTarget::Variant::kPlain) {
      PrintError(absl::InvalidArgumentError(absl::StrFormat(
          "--sm %s: expected a device SM such as sm_90 (no a/f suffix)", f.sm)));
      return kExitUsage;
    }
    device = DeviceSm{sm->major, sm->minor};
  }
  int exit_code = kExitOk;
  nlohmann::json all = nlohmann::json::array();
  for (const std::string& path : f.files) {
    absl::StatusOr<CubinInfo> info = InspectCubinFile(path);
    nlohmann::json entry = {{"path", path}};
    if (!info.ok()) {
      exit_code = ExitCodeFor(info.status());
      if (f.json) {
        entry["error"] = std::string(info.status().message());
        entry["code"] = absl::StatusCodeToString(info.status().code());
        all.push_back(std::move(entry));
      } else {
        PrintError(info.status());
      }
      continue;
    }
    absl::Status compat = absl::OkStatus();
    if (device) compat = CheckCompatible(*info, *device, path);
    if (f.json) {
      entry["container"] = info->container == CubinInfo::Container::kCubin ? "cubin" : "fatbin";
      entry["has_ptx"] = info->HasPtx();
      nlohmann::json images = nlohmann::json::array();
      for (const ImageInfo& img : info->images) images.push_back(ImageJson(img));
      entry["images"] = std::move(images);
      if (device) {
        entry["runs_on"] = {{"sm", device->ToString()}, {"ok", compat.ok()}};
        if (!compat.ok()) entry["runs_on"]["reason"] = std::string(compat.message());
      }
      all.push_back(std::move(entry));
    } else {
      PrintInfo(path, *info);
      if (device) {
        if (compat.ok()) {
          const ImageInfo* best = BestImageFor(*info, *device);
          std::printf("  runs on %s: yes (%s %s)\n", device->ToString().c_str(),
                      KindName(best->kind), TargetName(*best).c_str());
        } else {
          std::printf("  runs on %s: no: %s\n", device->ToString().c_str(),
                      std::string(compat.message()).c_str());
        }
      }
    }
    if (!compat.ok() && exit_code == kExitOk) exit_code = ExitCodeFor(compat);
  }
  if (f.json) std::cout << all.dump(2) << "\n";
  return exit_code;
}

}  // namespace

void RegisterInspect(CLI::App& app, Globals& g) {
  auto f = std::make_shared<InspectFlags>();
  CLI::App* cmd = app.add_subcommand(
      "inspect", "Show what a cubin or fatbin holds (SM, kernels, registers, shared memory); no GPU needed");
  cmd->add_option("files", f->files, "Cubin or fatbin files")->required()->type_name("FILE");
  cmd->add_flag("--json", f->json, "Print JSON (an array, one entry per file)");
  cmd->add_option("--sm", f->sm, "Also say whether each file runs on this device SM (sm_90)")
      ->type_name("SM");
  cmd->callback([f, &g] { g.exit_code = RunInspect(*f); });
}

}  // namespace cubist::cli
