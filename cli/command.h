// The subcommand table of the `cubist` command. Each subcommand lives in its own file
// (cli/<name>.cc) and exposes one Register function that adds a CLI11 subcommand with
// its options and a callback; main.cc holds the table. A callback stores its exit code
// in Globals::exit_code and prints errors through PrintError.
#ifndef CUBIST_CLI_COMMAND_H_
#define CUBIST_CLI_COMMAND_H_

#include <CLI/CLI.hpp>

#include "absl/status/status.h"

namespace cubist::cli {

// What every subcommand's callback shares with main: its exit code, and the -q of the
// subcommands that offer it (keygen, sign).
struct Globals {
  bool quiet = false;  // -q
  int exit_code = 0;
};

// Prints "cubist: error: <message>" to stderr and returns the exit code for `status`.
int PrintError(const absl::Status& status);

using RegisterFn = void (*)(CLI::App& app, Globals& globals);

struct CommandEntry {
  const char* name;
  RegisterFn reg;
};

// Each cli/<name>.cc defines one of these.
void RegisterFetch(CLI::App& app, Globals& g);
void RegisterVerify(CLI::App& app, Globals& g);
void RegisterList(CLI::App& app, Globals& g);
void RegisterPath(CLI::App& app, Globals& g);
void RegisterGc(CLI::App& app, Globals& g);
void RegisterExport(CLI::App& app, Globals& g);
void RegisterBundle(CLI::App& app, Globals& g);
void RegisterManifest(CLI::App& app, Globals& g);
void RegisterInspect(CLI::App& app, Globals& g);   // loader
void RegisterDoctor(CLI::App& app, Globals& g);    // loader
void RegisterSelect(CLI::App& app, Globals& g);    // dispatch
void RegisterRun(CLI::App& app, Globals& g);       // dispatch
void RegisterTune(CLI::App& app, Globals& g);      // dispatch
void RegisterKeygen(CLI::App& app, Globals& g);    // trust
void RegisterSign(CLI::App& app, Globals& g);      // trust
void RegisterPush(CLI::App& app, Globals& g);      // OCI registries

}  // namespace cubist::cli

#endif  // CUBIST_CLI_COMMAND_H_
