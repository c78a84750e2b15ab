// cubist fetch: brings a manifest's artifacts into the cache, verified.
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <iostream>
#include <thread>

#include "absl/strings/str_format.h"
#include "artifacts/fetcher.h"
#include "cli/command.h"
#include "cli/common.h"
#include "cli/exit_codes.h"
#include "cli/progress_line.h"
#include "cli/trust_flags.h"
#include "report/reports.h"

namespace cubist::cli {
namespace {

struct FetchFlags : report::FetchRequest {
  bool json = false;
  bool quiet = false;
};

// Redraws one status line on stderr while the fetch runs (only on a terminal). It draws
// nothing while there is nothing to download: the fetcher sets files_total to the
// artifacts it did not find cached, so a warm fetch never shows a bar and the command
// needs no look at the cache of its own (one stat per object, the fetcher's).
class ProgressBar {
 public:
  explicit ProgressBar(const FetchProgress& p) : p_(p), thread_([this] { Loop(); }) {}
  ~ProgressBar() {
    stop_ = true;
    thread_.join();
    if (drawn_) std::fprintf(stderr, "\r\033[K");
  }

 private:
  void Loop() {
    auto start = std::chrono::steady_clock::now();
    while (!stop_) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      ProgressCounts c;
      c.files_total = p_.files_total.load();
      if (c.files_total == 0) continue;
      drawn_ = true;
      c.bytes = p_.bytes_received.load();
      c.files_done = p_.files_done.load() + p_.files_failed.load();
      c.bytes_total = p_.bytes_total.load();
      c.files_unsized = p_.files_unsized.load();
      c.seconds = secs;
      std::fprintf(stderr, "\r\033[K%s", FormatProgressLine(c).c_str());
      std::fflush(stderr);
    }
  }
  const FetchProgress& p_;
  std::atomic<bool> stop_{false};
  bool drawn_ = false;  // written by the thread, read after join
  std::thread thread_;
};

int RunFetch(const FetchFlags& f) {
  FetchProgress progress;
  FetchReport report;
  std::optional<ProgressBar> bar;
  auto start = [&](const Store&, const std::vector<FetchItem>&) {
    if (::isatty(STDERR_FILENO) && !f.quiet && !f.json) bar.emplace(progress);
  };
  absl::StatusOr<report::CommandReport> r = report::RunFetchReport(f, &progress, start, &report);
  bar.reset();
  if (!r.ok()) return PrintError(r.status());
  for (const std::string& note : r->notices) {
    std::fprintf(stderr, "cubist: note: %s\n", note.c_str());
  }
  if (f.json) {
    std::cout << r->json.dump(2) << "\n";
  } else {
    for (const ArtifactResult& a : report.results) {
      if (!a.status.ok()) {
        std::fprintf(stderr, "cubist: error: %s\n", std::string(a.status.message()).c_str());
      }
    }
    if (!f.quiet || report.failed > 0) {
      const std::string name = r->json["name"];
      const std::string cache = r->json["cache"];
      std::printf(
          "%s %zu artifacts of %s v%lld (%s received) in %.2f s: %d downloaded, %d reused "
          "from another process, %d already cached, %d failed; cache %s\n",
          report.failed == 0 ? "fetched" : "FAILED to fetch",
          static_cast<size_t>(report.cached + report.downloaded + report.reused +
                              report.failed),
          name.empty() ? f.manifest.c_str() : name.c_str(),
          static_cast<long long>(r->json["version"].get<int64_t>()),
          HumanBytes(report.bytes_received).c_str(), absl::ToDoubleSeconds(report.elapsed),
          report.downloaded, report.reused, report.cached, report.failed, cache.c_str());
    }
  }
  return ExitCodeFor(report.status);
}

}  // namespace

void RegisterFetch(CLI::App& app, Globals& g) {
  auto flags = std::make_shared<FetchFlags>();
  CLI::App* cmd = app.add_subcommand(
      "fetch", "Download a manifest's artifacts into the cache, verifying every byte");
  cmd->add_option("--manifest,-m", flags->manifest, "Manifest URL or path (JSON or checksums.txt), or an OCI artifact set: "
                  "oci://HOST[:PORT]/REPO:TAG or oci://HOST[:PORT]/REPO@sha256:DIGEST")
      ->required();
  cmd->add_option("--cache", flags->cache,
                  "Cache directory (default: $CUBIST_CACHE_DIR, $XDG_CACHE_HOME/cubist, "
                  "~/.cache/cubist)");
  cmd->add_option("-j,--jobs", flags->jobs, "Concurrent transfers")
      ->check(CLI::Range(1, 256))
      ->capture_default_str();
  cmd->add_flag("--offline", flags->offline,
                "No network: fail, listing them, if artifacts are not cached");
  cmd->add_option("--mirror", flags->mirrors,
                  "Base URL or directory to try before the manifest's own (for an oci:// "
                  "set: a registry mirror or caching proxy, http://HOST:PORT); repeatable");
  cmd->add_option("--filter", flags->filters,
                  "Only artifacts whose path matches this glob; repeatable");
  cmd->add_option("--retries", flags->retries, "Attempts per source for transient failures")
      ->check(CLI::Range(1, 20))
      ->capture_default_str();
  cmd->add_option("--stall-seconds", flags->stall_seconds,
                  "A transfer slower than 1 KiB/s for this long is abandoned as stalled "
                  "(retried, then the next source)")
      ->check(CLI::Range(1, 3600))
      ->capture_default_str();
  cmd->add_flag("--no-fsync", flags->no_fsync,
                "Skip flushing objects to disk before publishing them (throwaway caches and "
                "benchmarks: a power loss may then leave a truncated object that only "
                "'verify --deep' finds)");
  cmd->add_flag("--json", flags->json, "Print a JSON report on stdout");
  cmd->add_flag("-q,--quiet", flags->quiet, "No progress bar and no summary unless failed");
  AddTrustFlags(cmd, &flags->trust);
  cmd->callback([flags, &g] {
    flags->artifact_entries = flags->json;
    g.exit_code = RunFetch(*flags);
  });
}

}  // namespace cubist::cli
