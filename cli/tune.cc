// PENDING: replaced by the real subcommand before commit.
#include "cli/command.h"
namespace cubist::cli {
void RegisterTune(CLI::App& app, Globals& g) {
  app.add_subcommand("tune", "(pending)");
}
}  // namespace cubist::cli
