#include "report/reports.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "artifacts/keep.h"
#include "artifacts/oci_manifest_source.h"
#include "base/status_macros.h"
#include "artifacts/cache_dir.h"
#include "report/open_request.h"

namespace cubist::report {
namespace {

nlohmann::json ProblemJson(const MoeProblem& p) {
  nlohmann::json j = {{"op", OpName(p.op)},
          {"weights", DataFormatName(p.weight_format)},
          {"activations", DataFormatName(p.activation_format)},
          {"activation", ActivationName(p.activation)},
          {"experts", p.experts},
          {"tokens", p.tokens},
          {"tokens_per_expert", p.tokens_per_expert()},
          {"n", p.n},
          {"k", p.k},
          {"sm", p.sm.number()},
          {"sm_count", DeviceForProblem(p).sm_count}};
  if (p.routed_top_k > 0) {  // rows from a top-k router (the cost model prices their spread)
    j["routed_top_k"] = p.routed_top_k;
    j["routed_experts"] = p.routed_load().routed_experts;
  }
  return j;
}

nlohmann::json CostJson(const CostEstimate& c) {
  return {{"time_us", c.time_us},       {"compute_us", c.compute_us},
          {"memory_us", c.memory_us},   {"ctas", c.ctas},
          {"ctas_per_sm", c.ctas_per_sm}, {"waves", c.waves},
          {"efficiency_m", c.efficiency_m}, {"efficiency_n", c.efficiency_n},
          {"efficiency_k", c.efficiency_k}};
}

nlohmann::json VerdictsJson(const std::vector<Verdict>& verdicts) {
  nlohmann::json out = nlohmann::json::array();
  for (const Verdict& v : verdicts) {
    nlohmann::json j = {{"kernel", v.kernel->name()}, {"rank", v.rank}};
    if (v.cost) j["estimate"] = CostJson(*v.cost);
    nlohmann::json rejections = nlohmann::json::array();
    for (const Rejection& r : v.rejections) {
      rejections.push_back({{"reason", RejectReasonName(r.reason)}, {"detail", r.detail}});
    }
    j["rejections"] = std::move(rejections);
    out.push_back(std::move(j));
  }
  return out;
}

absl::Status NoMatchError(const FetchRequest& f) {
  return absl::NotFoundError(absl::StrCat("fetch: no artifact of ", f.manifest,
                                          " matches --filter ", f.filters[0],
                                          "; see 'cubist list'"));
}

// The warm path's report: every selected artifact cached, an entry each when asked.
FetchReport CachedReport(const Manifest& m, const FetchRequest& f, size_t selected) {
  FetchReport report;
  report.cached = static_cast<int>(selected);
  if (!f.artifact_entries) return report;
  report.results.reserve(selected);
  for (const Artifact& a : m.artifacts) {
    if (!SelectedByFilters(a.path, f.filters)) continue;
    ArtifactResult& r = report.results.emplace_back();
    r.path = a.path;
    r.sha256 = a.sha256;
    r.outcome = FetchOutcome::kCached;
  }
  return report;
}

absl::StatusOr<FetchOptions> FetchOptionsFor(const FetchRequest& f, const Manifest& m) {
  FetchOptions options;
  options.manifest = f.manifest;
  options.jobs = f.jobs;
  options.offline = f.offline;
  options.attempts_per_source = f.retries;
  options.low_speed_time = absl::Seconds(f.stall_seconds);
  options.durable = !f.no_fsync;
  if (IsOciReference(m.source)) {
    CUBIST_ASSIGN_OR_RETURN(OciReference ref, ParseOciReference(m.source));
    options.authorization = MakeOciAuthorizer(ref);
  }
  return options;
}

// After a fetch in which nothing failed: the manifest is kept for gc only once
// everything it names is present (the root lets go after). A manifest that cannot be
// kept is a failed fetch (exit 9 on a full disk): the next gc would delete what this one
// reports fetched. Never success for objects gone at exit (a gc of an older cubist,
// which knows no roots, or an operator's rm): one more stat each, only after downloads.
absl::Status KeepFetched(Store& store, const OpenedManifest& opened, const FetchRequest& f,
                         bool was_warm) {
  CUBIST_RETURN_IF_ERROR(store.KeepManifest(opened.manifest, opened.bytes));
  if (!was_warm && !CheckAllCached(store, opened.manifest, f.filters).all_present) {
    return absl::UnavailableError(absl::StrCat(
        "fetch ", f.manifest, ": objects were removed from cache ", store.root(),
        " while this fetch ran (a 'cubist gc' of a version without pending roots?); "
        "fetch again"));
  }
  return absl::OkStatus();
}

nlohmann::json FetchJson(const FetchRequest& f, const Manifest& m, const Store& store,
                         const FetchReport& report) {
  nlohmann::json j;
  j["manifest"] = f.manifest;
  j["name"] = m.name;
  j["version"] = m.version;
  j["digest"] = m.digest;
  j["cache"] = store.root();
  j["seconds"] = absl::ToDoubleSeconds(report.elapsed);
  j["bytes_received"] = report.bytes_received;
  j["counts"] = {{"cached", report.cached}, {"downloaded", report.downloaded},
                 {"reused", report.reused}, {"failed", report.failed}};
  if (f.artifact_entries) {
    nlohmann::json arts = nlohmann::json::array();
    for (const ArtifactResult& r : report.results) {
      nlohmann::json a = {{"path", r.path}, {"sha256", r.sha256},
                          {"outcome", FetchOutcomeName(r.outcome)},
                          {"attempts", r.attempts}, {"bytes_received", r.bytes_received}};
      if (!r.url.empty()) a["url"] = r.url;
      if (!r.status.ok()) {
        a["error"] = std::string(r.status.message());
        a["code"] = absl::StatusCodeToString(r.status.code());
      }
      arts.push_back(std::move(a));
    }
    j["artifacts"] = std::move(arts);
  }
  j["ok"] = report.failed == 0;
  return j;
}

}  // namespace

absl::StatusOr<CommandReport> RunFetchReport(const FetchRequest& f, FetchProgress* progress,
                                             const FetchStartHook& on_start,
                                             FetchReport* report_out) {
  CUBIST_ASSIGN_OR_RETURN(Store store, OpenStore(f.cache, /*create=*/true));
  // The warm path (issue 12): when every selected artifact is present with its size
  // (the same check FetchArtifacts makes first), nothing per artifact is built beyond
  // the report entries asked for, not even the manifest's Artifacts when its parse comes
  // from the cache (they are looked at where they lie). Else the full plan, which
  // probes again.
  CUBIST_ASSIGN_OR_RETURN(OpenedManifest opened,
                          OpenManifestForRequest(f.manifest, f.trust, &store, f.offline,
                                                 /*record_version=*/true,
                                                 /*pack_artifacts=*/!f.artifact_entries,
                                                 absl::Seconds(f.stall_seconds)));
  const Manifest& m = opened.manifest;
  CommandReport out;
  out.notices = opened.notices;
  // Until the manifest is kept, a root in use (keep.h) holds its objects against a gc
  // running meanwhile; taken before the first object lands. A kept one needs none.
  std::optional<RootLease> lease;
  if (!store.IsKept(m, opened.bytes)) {
    CUBIST_ASSIGN_OR_RETURN(lease, RootLease::Take(store, m, opened.bytes));
  }
  FetchReport report;
  const absl::Time start = absl::Now();
  const CacheCheck warm = opened.packed_artifacts.has_value()
                              ? CheckAllCached(store, *opened.packed_artifacts, f.filters)
                              : CheckAllCached(store, m, f.filters);
  if (warm.all_present) {
    if (warm.selected == 0 && !f.filters.empty()) return NoMatchError(f);
    report = CachedReport(m, f, warm.selected);
    if (on_start) on_start(store, {});
    report.elapsed = absl::Now() - start;
  } else {
    opened.UnpackArtifacts();  // the plan needs them built
    std::vector<FetchItem> items = PlanFetch(m, f.mirrors, f.filters);
    if (items.empty() && !f.filters.empty()) return NoMatchError(f);
    CUBIST_ASSIGN_OR_RETURN(FetchOptions options, FetchOptionsFor(f, m));
    if (on_start) on_start(store, items);
    FetchProgress local_progress;
    report = FetchArtifacts(store, items, options,
                            progress != nullptr ? progress : &local_progress);
  }
  if (report.failed == 0) {
    CUBIST_RETURN_IF_ERROR(KeepFetched(store, opened, f, warm.all_present));
  }
  out.json = FetchJson(f, m, store, report);
  out.status = report.status;
  if (report_out != nullptr) *report_out = std::move(report);
  return out;
}

absl::StatusOr<CommandReport> RunVerifyReport(const VerifyRequest& f, VerifyReport* report_out) {
  CUBIST_ASSIGN_OR_RETURN(Store store, OpenStore(f.cache, /*create=*/false));
  CUBIST_ASSIGN_OR_RETURN(OpenedManifest opened,
                          OpenManifestForRequest(f.manifest, f.trust, &store, f.offline,
                                                 /*record_version=*/false));
  VerifyOptions options;
  options.manifest = f.manifest;
  options.deep = f.deep;
  options.threads = f.threads;
  VerifyReport report = VerifyArtifacts(store, opened.manifest.artifacts, options);
  CommandReport out;
  out.notices = opened.notices;
  nlohmann::json& j = out.json;
  j["manifest"] = f.manifest;
  j["digest"] = opened.manifest.digest;
  j["cache"] = store.root();
  j["deep"] = f.deep;
  j["seconds"] = absl::ToDoubleSeconds(report.elapsed);
  j["bytes_hashed"] = report.bytes_hashed;
  j["counts"] = {{"ok", report.ok}, {"missing", report.missing}, {"corrupt", report.corrupt}};
  nlohmann::json bad = nlohmann::json::array();
  for (const VerifyEntry& e : report.entries) {
    if (e.state == VerifyState::kOk) continue;
    nlohmann::json b = {{"path", e.path}, {"state", VerifyStateName(e.state)},
                        {"expected_sha256", e.expected_sha256},
                        {"actual_size", e.actual_size}, {"removed", e.removed},
                        {"message", e.message}};
    if (e.expected_size) b["expected_size"] = *e.expected_size;
    if (!e.actual_sha256.empty()) b["actual_sha256"] = e.actual_sha256;
    bad.push_back(std::move(b));
  }
  j["bad"] = std::move(bad);
  j["ok"] = report.status.ok();
  out.status = report.status;
  if (report_out != nullptr) *report_out = std::move(report);
  return out;
}

absl::StatusOr<std::unique_ptr<Selection>> Select(const SelectRequest& f) {
  // The cache only helps with URL manifests read offline; select never creates it.
  std::optional<Store> store;
  if (auto root = ResolveCacheDir(f.cache); root.ok()) {
    if (auto s = Store::Open(*root, /*create=*/false); s.ok()) store.emplace(std::move(*s));
  }
  CUBIST_ASSIGN_OR_RETURN(OpenedManifest opened,
                          OpenManifestForRequest(f.manifest, f.trust,
                                                 store ? &*store : nullptr, f.offline,
                                                 /*record_version=*/false));
  CUBIST_ASSIGN_OR_RETURN(Registry registry, Registry::Create(opened.manifest));
  auto s = std::make_unique<Selection>(std::move(registry));
  s->problem = f.problem;
  SelectOptions options;
  options.pinned = f.pin;
  options.allow_inexact = f.allow_inexact;
  s->ranked = RankCandidates(s->registry, s->problem, options);
  if (f.explain) s->verdicts = Explain(s->registry, s->problem, options);
  return s;
}

CommandReport SelectReport(const Selection& s, bool explain) {
  CommandReport out;
  nlohmann::json& j = out.json;
  j = {{"manifest", s.registry.manifest_source()}, {"problem", ProblemJson(s.problem)}};
  if (s.ranked.ok()) {
    const Candidate& best = s.ranked->front();
    const KernelSpec& k = best.kernel->spec;
    j["kernel"] = k.name;
    j["artifact"] = k.artifact;
    j["function"] = k.function;
    j["arch"] = k.arch;
    j["tile"] = {k.tile_m, k.tile_n, k.tile_k};
    j["cluster"] = k.cluster;
    j["threads"] = k.threads;
    j["shared_mem_bytes"] = k.shared_mem_bytes;
    j["estimate"] = CostJson(best.cost);
    nlohmann::json cands = nlohmann::json::array();
    for (const Candidate& c : *s.ranked) {
      cands.push_back({{"kernel", c.kernel->name()}, {"rank", c.rank},
                       {"time_us", c.cost.time_us}});
    }
    j["candidates"] = std::move(cands);
  } else {
    j["kernel"] = nullptr;
    j["error"] = std::string(s.ranked.status().message());
    out.status = s.ranked.status();
  }
  if (explain) j["verdicts"] = VerdictsJson(s.verdicts);
  return out;
}

}  // namespace cubist::report
