// PENDING: replaced by the real subcommand before commit.
#include "cli/command.h"
namespace cubist::cli {
void RegisterManifest(CLI::App& app, Globals& g) {
  app.add_subcommand("manifest", "(pending)");
}
}  // namespace cubist::cli
