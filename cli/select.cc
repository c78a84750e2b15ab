// PENDING: replaced by the real subcommand before commit.
#include "cli/command.h"
namespace cubist::cli {
void RegisterSelect(CLI::App& app, Globals& g) {
  app.add_subcommand("select", "(pending)");
}
}  // namespace cubist::cli
