// PENDING: replaced by the real subcommand before commit.
#include "cli/command.h"
namespace cubist::cli {
void RegisterRun(CLI::App& app, Globals& g) {
  app.add_subcommand("run", "(pending)");
}
}  // namespace cubist::cli
