// `cubist`: thin front end. Parses options and hands each subcommand to one function
// (cli/<name>.cc). Exit codes: cli/exit_codes.h.
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "absl/strings/str_cat.h"
#include "base/version.h"
#include "cli/command.h"
#include "cli/exit_codes.h"

namespace cubist::cli {
namespace {

// The subcommand table. Add a line here and a file cli/<name>.cc.
constexpr CommandEntry kCommands[] = {
    {"fetch", RegisterFetch},       {"verify", RegisterVerify},
    {"list", RegisterList},         {"path", RegisterPath},
    {"gc", RegisterGc},             {"manifest", RegisterManifest},
    {"inspect", RegisterInspect},   {"doctor", RegisterDoctor},
    {"select", RegisterSelect},     {"run", RegisterRun},
    {"tune", RegisterTune},         {"keygen", RegisterKeygen},
    {"sign", RegisterSign},         {"push", RegisterPush},
    {"export", RegisterExport},     {"bundle", RegisterBundle},
};

size_t EditDistance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t prev = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t cur = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, prev + (a[i - 1] != b[j - 1])});
      prev = cur;
    }
  }
  return row[b.size()];
}

}  // namespace

int PrintError(const absl::Status& status) {
  std::fprintf(stderr, "cubist: error: %s\n", std::string(status.message()).c_str());
  return ExitCodeFor(status);
}

int Main(int argc, char** argv) {
  CLI::App app{
      "cubist: fetch, verify, load and dispatch prebuilt GPU kernels (cubins)",
      "cubist"};
  app.require_subcommand(1);
  app.set_version_flag("--version", absl::StrCat("cubist ", Version()));
  Globals globals;
  for (const CommandEntry& c : kCommands) c.reg(app, globals);

  // An unknown first word gets a "did you mean" before CLI11's generic message.
  if (argc > 1 && argv[1][0] != '-') {
    std::string_view word = argv[1];
    bool known = std::any_of(std::begin(kCommands), std::end(kCommands),
                             [&](const CommandEntry& c) { return word == c.name; });
    if (!known) {
      std::string best;
      size_t best_d = 3;
      for (const CommandEntry& c : kCommands) {
        size_t d = EditDistance(word, c.name);
        if (d < best_d) best_d = d, best = c.name;
      }
      std::fprintf(stderr, "cubist: error: unknown command '%s'%s; see 'cubist --help'\n",
                   argv[1], best.empty() ? "" : absl::StrCat(", did you mean '", best, "'?").c_str());
      return kExitUsage;
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "cubist: error: %s; see 'cubist %s --help'\n", e.what(),
                 argc > 1 ? argv[1] : "");
    return kExitUsage;
  }
  return globals.exit_code;
}

}  // namespace cubist::cli

int main(int argc, char** argv) { return cubist::cli::Main(argc, argv); }
