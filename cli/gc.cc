// PENDING: replaced by the real subcommand before commit.
#include "cli/command.h"
namespace cubist::cli {
void RegisterGc(CLI::App& app, Globals& g) {
  app.add_subcommand("gc", "(pending)");
}
}  // namespace cubist::cli
