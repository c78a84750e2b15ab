// PENDING: replaced by the real subcommand before commit.
#include "cli/command.h"
namespace cubist::cli {
void RegisterPath(CLI::App& app, Globals& g) {
  app.add_subcommand("path", "(pending)");
}
}  // namespace cubist::cli
