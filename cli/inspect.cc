// PENDING: replaced by the real subcommand before commit.
#include "cli/command.h"
namespace cubist::cli {
void RegisterInspect(CLI::App& app, Globals& g) {
  app.add_subcommand("inspect", "(pending)");
}
}  // namespace cubist::cli
