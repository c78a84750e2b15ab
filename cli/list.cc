// PENDING: replaced by the real subcommand before commit.
#include "cli/command.h"
namespace cubist::cli {
void RegisterList(CLI::App& app, Globals& g) {
  app.add_subcommand("list", "(pending)");
}
}  // namespace cubist::cli
